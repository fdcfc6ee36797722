// The files of a checkpoint directory:
//   rank-NNNNN.safetensors  the chunks one rank owns (8-byte little-endian header length,
//                           JSON header, raw row-major data: any safetensors reader opens it)
//   metadata.json           global shape and dtype of every tensor, where each chunk lies
//                           (file, byte range) with a checksum per block, the scalars, each
//                           file's size and header checksum, and a checksum of all of that
// Checksums are XXH3-64 over blocks of kBlockBytes of a chunk, so a rank that reads part of
// a chunk verifies what it reads without reading the rest. Parsing metadata.json verifies
// its own checksum and validates every chunk (validate.h), so a changed step, position or
// offset is an error, never a silent resume at the wrong place.
// Torch-free (dtypes by their safetensors names; dtype.h maps them to LibTorch's), so the
// parsers build alone for the fuzz targets.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace hp::checkpoint {

constexpr int64_t kBlockBytes = 1 << 20;

struct Chunk {
  std::vector<int64_t> offsets;  // where the chunk starts in the global tensor
  std::vector<int64_t> sizes;
  std::string file;              // relative to the checkpoint directory
  int64_t begin = 0, end = 0;    // byte range in the file
  std::vector<uint64_t> checksums;  // one per kBlockBytes block of [begin, end)
};

struct TensorMeta {
  std::string dtype;  // safetensors names: "F32", "BF16", ...
  std::vector<int64_t> shape;
  std::vector<Chunk> chunks;
};

struct FileMeta {
  int64_t bytes = 0;             // the file's size
  uint64_t header_checksum = 0;  // of its safetensors header, length prefix included
};

struct Metadata {
  int64_t step = 0;
  std::map<std::string, int64_t> scalars;
  std::map<std::string, TensorMeta> tensors;
  std::map<std::string, FileMeta> files;  // by name, relative to the checkpoint directory
};

int64_t dtype_size(const std::string& name);  // bytes per element; error if unknown

std::string to_json(const Metadata& m);
// Verifies the checksum and validates (validate_metadata); errors name `source`. One
// rank's part of a save (`part`) need not cover its tensors.
Metadata metadata_from_json(const std::string& text, const std::string& source, bool part = false);
// The part of a Metadata one rank knows (its tensors and chunks), merged by rank 0.
void merge_into(Metadata& all, const Metadata& part);

Metadata read_metadata(const std::string& dir);  // dir/metadata.json

// Bytes of the safetensors header at the start of `file` (8 + the length its prefix
// gives), checked against the file's size; errors name `path`.
int64_t safetensors_header_bytes(int fd, int64_t file_bytes, const std::string& path);
// Errors unless the open file `fd` has meta's size and header checksum; names `path`.
void verify_file(int fd, const std::string& path, const FileMeta& meta);
void verify_file(const std::string& path, const FileMeta& meta);

// One tensor of a safetensors file: bytes [begin, end) of the file (counted from its start).
struct SafetensorsEntry {
  std::string name, dtype;
  std::vector<int64_t> shape;
  int64_t begin = 0, end = 0;
};
// The tensors of a safetensors header (the JSON after the 8-byte length prefix, of
// `header_bytes` in all with the prefix) of a file of `file_bytes`. Errors, naming `path`
// and the tensor, unless it is a JSON object of tensors with known dtypes, non-negative
// shapes and data offsets inside the file that hold exactly their elements.
std::vector<SafetensorsEntry> parse_safetensors_header(const std::string& json_text, int64_t header_bytes,
                                                       int64_t file_bytes, const std::string& path);

// The safetensors header (with its 8-byte length prefix, padded to 8 bytes) for tensors
// named keys[i] with dtypes, shapes and data sizes; data follows in that order.
std::string safetensors_header(const std::vector<std::string>& keys, const std::vector<std::string>& dtypes,
                               const std::vector<std::vector<int64_t>>& shapes, const std::vector<int64_t>& bytes);

uint64_t checksum(const void* data, size_t n);
std::string hex(uint64_t x);

// checksum() of bytes fed in pieces (equal to checksum() of them back to back), so that a
// reader can hash each piece right after reading it, while it is in the core's own cache.
class StreamingChecksum {
 public:
  StreamingChecksum();
  ~StreamingChecksum();
  StreamingChecksum(const StreamingChecksum&) = delete;
  StreamingChecksum& operator=(const StreamingChecksum&) = delete;
  void reset();
  void update(const void* data, size_t n);
  uint64_t digest() const;

 private:
  void* state_;  // an XXH3 state
};

// POSIX file helpers that name the path in their errors.
void write_all(int fd, const void* data, size_t n, const std::string& path);
void write_file_synced(const std::string& path, const std::string& content);
void fsync_dir(const std::string& dir);
std::string read_file(const std::string& path);

}  // namespace hp::checkpoint
