#include "hp/checkpoint/load.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <memory>

#include "hp/base/error.h"
#include "hp/base/strings.h"
#include "hp/checkpoint/dtype.h"
#include "hp/checkpoint/format.h"
#include "hp/checkpoint/validate.h"

namespace hp::checkpoint {
namespace {

// Each file is opened once; one the metadata lists is verified (size, header) on opening.
class OpenFiles {
 public:
  OpenFiles(std::string dir, const std::map<std::string, FileMeta>& listed) : dir_(std::move(dir)), listed_(listed) {}
  ~OpenFiles() {
    for (auto& [_, fd] : fds_) ::close(fd);
  }
  // Reads [begin, end) of `file` for tensor `tensor`.
  void read(const std::string& file, int64_t begin, int64_t end, uint8_t* out, const std::string& tensor) {
    const std::string path = dir_ + "/" + file;
    int fd = open(file, path, tensor);
    int64_t done = 0;
    while (begin + done < end) {
      ssize_t n = ::pread(fd, out + done, static_cast<size_t>(end - begin - done), begin + done);
      if (n < 0 && errno == EINTR) continue;
      HP_CHECK(n >= 0) << "checkpoint: cannot read " << path << " (tensor " << tensor << "): " << std::strerror(errno);
      HP_CHECK(n > 0) << "checkpoint file " << path << " is truncated: tensor " << tensor << " needs bytes ["
                      << begin << ", " << end << ") but the file ends at " << begin + done;
      done += n;
    }
  }

 private:
  int open(const std::string& file, const std::string& path, const std::string& tensor) {
    auto it = fds_.find(file);
    if (it != fds_.end()) return it->second;
    HP_CHECK(is_plain_file_name(file)) << "checkpoint " << dir_ << ": file '" << file
                                        << "' is not a plain name inside the checkpoint directory";
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    HP_CHECK(fd >= 0) << "checkpoint: cannot open " << path << ": " << std::strerror(errno);
    fds_[file] = fd;
    if (auto it = listed_.find(file); it != listed_.end()) {
      try {
        verify_file(fd, path, it->second);
      } catch (const Error& e) {
        HP_FAIL() << e.what() << " (while reading tensor " << tensor << ")";
      }
    }
    return fd;
  }

  std::string dir_;
  const std::map<std::string, FileMeta>& listed_;
  std::map<std::string, int> fds_;
};

// Bytes read at a time inside a checksum block: small enough to be hashed from the core's
// L2 cache right after the read put them there (a whole 1 MiB block would be hashed from
// L3 or memory).
constexpr int64_t kReadPieceBytes = 256 << 10;

// Reads bytes [lo, hi) of `chunk` (counted from its start) into `out`, verifying each
// checksum block that [lo, hi) touches, hashed piece by piece as it is read. A block that
// [lo, hi) covers only in part is read into `scratch` and its part copied.
void read_checked(OpenFiles& files, const std::string& dir, const std::string& name, const Chunk& chunk, int64_t lo,
                  int64_t hi, uint8_t* out, std::vector<uint8_t>& scratch) {
  const int64_t chunk_bytes = chunk.end - chunk.begin;
  if (chunk.checksums.empty()) {  // a file from elsewhere (Hugging Face): nothing to verify
    files.read(chunk.file, chunk.begin + lo, chunk.begin + hi, out, name);
    return;
  }
  StreamingChecksum hash;
  for (int64_t k = lo / kBlockBytes; k * kBlockBytes < hi; ++k) {
    const int64_t bs = k * kBlockBytes, be = std::min(chunk_bytes, bs + kBlockBytes);
    const bool whole = lo <= bs && be <= hi;
    if (!whole && scratch.size() < static_cast<size_t>(kBlockBytes)) scratch.resize(kBlockBytes);
    uint8_t* dst = whole ? out + (bs - lo) : scratch.data();
    hash.reset();
    for (int64_t p = bs; p < be; p += kReadPieceBytes) {
      const int64_t pe = std::min(be, p + kReadPieceBytes);
      files.read(chunk.file, chunk.begin + p, chunk.begin + pe, dst + (p - bs), name);
      hash.update(dst + (p - bs), static_cast<size_t>(pe - p));
    }
    const uint64_t sum = hash.digest();
    HP_CHECK(sum == chunk.checksums[k]) << "checkpoint file " << dir << "/" << chunk.file
                                        << " is corrupt: tensor " << name << " (chunk at "
                                        << to_string_list(chunk.offsets) << "), block " << k << " has checksum "
                                        << hex(sum) << ", expected " << hex(chunk.checksums[k]);
    if (!whole) {
      const int64_t from = std::max(bs, lo), to = std::min(be, hi);
      std::memcpy(out + (from - lo), scratch.data() + (from - bs), static_cast<size_t>(to - from));
    }
  }
}

// Copies the part of `chunk` inside the box [lo, lo + size) into `dst` (the box's tensor).
// Returns the number of elements copied.
int64_t copy_overlap(OpenFiles& files, const std::string& dir, const std::string& name, const TensorMeta& meta,
                     const Chunk& chunk, const std::vector<int64_t>& lo, const std::vector<int64_t>& size,
                     at::Tensor& dst, std::vector<uint8_t>& scratch) {
  const int nd = static_cast<int>(lo.size());
  std::vector<int64_t> a(nd), b(nd), strides(nd);
  int64_t count = 1;
  for (int d = 0; d < nd; ++d) {
    a[d] = std::max(lo[d], chunk.offsets[d]);
    b[d] = std::min(lo[d] + size[d], chunk.offsets[d] + chunk.sizes[d]);
    if (b[d] <= a[d]) return 0;
    count *= b[d] - a[d];
  }
  int64_t stride = 1;
  for (int d = nd - 1; d >= 0; --d) {
    strides[d] = stride;
    stride *= chunk.sizes[d];
  }
  // Elements first..last (row-major in the chunk) hold the overlap.
  int64_t first = 0, last = 0;
  for (int d = 0; d < nd; ++d) {
    first += (a[d] - chunk.offsets[d]) * strides[d];
    last += (b[d] - 1 - chunk.offsets[d]) * strides[d];
  }
  const int64_t esize = dtype_size(meta.dtype), chunk_bytes = chunk.end - chunk.begin;
  HP_CHECK(chunk_bytes == stride * esize &&
           (chunk.checksums.empty() ||
            static_cast<int64_t>(chunk.checksums.size()) == (chunk_bytes + kBlockBytes - 1) / kBlockBytes))
      << dir << "/metadata.json: chunk of tensor " << name << " in " << chunk.file << " has " << chunk_bytes
      << " bytes and " << chunk.checksums.size() << " checksums for sizes " << to_string_list(chunk.sizes);
  at::Tensor target = dst;
  for (int d = 0; d < nd; ++d) target = target.narrow(d, a[d] - lo[d], b[d] - a[d]);
  const int64_t from = first * esize, to = (last + 1) * esize;
  if (last - first + 1 == count && target.is_contiguous()) {
    // The overlap is one run of bytes in the chunk and in the piece: read it in place.
    read_checked(files, dir, name, chunk, from, to, static_cast<uint8_t*>(target.data_ptr()), scratch);
    return count;
  }
  std::unique_ptr<uint8_t[]> buffer(new uint8_t[static_cast<size_t>(to - from)]);
  read_checked(files, dir, name, chunk, from, to, buffer.get(), scratch);
  std::vector<int64_t> sizes(nd);
  for (int d = 0; d < nd; ++d) sizes[d] = b[d] - a[d];
  target.copy_(at::from_blob(buffer.get(), sizes, strides, at::TensorOptions().dtype(dtype_from_name(meta.dtype))));
  return count;
}

// Fills `dst`, the box [lo, lo + size) of tensor `name`. `scratch` holds blocks read only
// in part; it is sized on first need (loads that read whole blocks never touch it).
void fill(OpenFiles& files, const std::string& dir, const std::string& name, const TensorMeta& meta,
          const std::vector<int64_t>& lo, const std::vector<int64_t>& size, at::Tensor& dst,
          std::vector<uint8_t>& scratch) {
  int64_t covered = 0;
  for (const auto& c : meta.chunks) covered += copy_overlap(files, dir, name, meta, c, lo, size, dst, scratch);
  HP_CHECK(covered == dst.numel()) << "checkpoint " << dir << ": the chunks of tensor " << name << " cover "
                                   << covered << " of the " << dst.numel() << " elements of the piece at "
                                   << to_string_list(lo) << " of size " << to_string_list(size);
}

}  // namespace

void load_from(const Metadata& m, const std::string& dir, State& state, bool convert) {
  OpenFiles files(dir, m.files);
  std::vector<uint8_t> scratch;
  at::NoGradGuard no_grad;
  for (auto& e : state.tensors) {
    auto it = m.tensors.find(e.name);
    HP_CHECK(it != m.tensors.end()) << "checkpoint " << dir << " has no tensor " << e.name << " ("
                                    << m.tensors.size() << " tensors, the first "
                                    << (m.tensors.empty() ? std::string("none") : m.tensors.begin()->first) << ")";
    const TensorMeta& meta = it->second;
    const at::ScalarType stored = dtype_from_name(meta.dtype);
    HP_CHECK(meta.shape == e.spec.shape() && (convert || stored == e.local.scalar_type()))
        << "checkpoint " << dir << ": tensor " << e.name << " is " << meta.dtype << " " << to_string_list(meta.shape)
        << " there, but " << dtype_name(e.local.scalar_type()) << " " << to_string_list(e.spec.shape()) << " here";
    if (e.local.numel() == 0) continue;
    const auto lo = e.spec.global_offset(e.coord);
    if (stored == e.local.scalar_type()) {
      fill(files, dir, e.name, meta, lo, e.local.sizes().vec(), e.local, scratch);
    } else {
      at::Tensor piece = at::empty(e.local.sizes(), at::TensorOptions().dtype(stored));
      fill(files, dir, e.name, meta, lo, e.local.sizes().vec(), piece, scratch);
      e.local.copy_(piece);
    }
  }
}

void load(const std::string& dir, State& state) {
  const Metadata m = read_metadata(dir);
  load_from(m, dir, state, /*convert=*/false);
  state.scalars = m.scalars;
}

at::Tensor read_tensor(const std::string& dir, const std::string& name) {
  const Metadata m = read_metadata(dir);
  auto it = m.tensors.find(name);
  HP_CHECK(it != m.tensors.end()) << "checkpoint " << dir << " has no tensor " << name;
  OpenFiles files(dir, m.files);
  std::vector<uint8_t> scratch;
  at::Tensor out = at::empty(it->second.shape, at::TensorOptions().dtype(dtype_from_name(it->second.dtype)));
  if (out.numel() > 0)
    fill(files, dir, name, it->second, std::vector<int64_t>(out.dim(), 0), out.sizes().vec(), out, scratch);
  return out;
}

}  // namespace hp::checkpoint
