#include "hp/checkpoint/format.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "hp/base/error.h"
#include "hp/checkpoint/validate.h"

namespace hp::checkpoint {

using json = nlohmann::json;

namespace {

struct DtypeSize {
  const char* name;
  int64_t size;
};
constexpr DtypeSize kDtypes[] = {{"F32", 4}, {"F64", 8}, {"F16", 2}, {"BF16", 2}, {"I64", 8},
                                 {"I32", 4}, {"I16", 2}, {"I8", 1},  {"U8", 1},   {"BOOL", 1}};

}  // namespace

int64_t dtype_size(const std::string& name) {
  for (const auto& d : kDtypes)
    if (name == d.name) return d.size;
  HP_FAIL() << "checkpoint: unknown dtype " << name << " (known: F32, F64, F16, BF16, I64, I32, I16, I8, U8, BOOL)";
  return 0;
}

std::string hex(uint64_t x) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(x));
  return buf;
}

// checksum_avx2.cpp, checksum_avx512.cpp: the same functions built for wider vectors.
uint64_t checksum_avx2(const void* data, size_t n);
void checksum_update_avx2(void* state, const void* data, size_t n);
uint64_t checksum_avx512(const void* data, size_t n);
void checksum_update_avx512(void* state, const void* data, size_t n);

namespace {
enum class Simd { none, avx2, avx512 };
Simd simd() {
#if defined(__x86_64__) && defined(HP_CHECKSUM_SIMD)
  static const Simd best = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") ? Simd::avx512
                           : __builtin_cpu_supports("avx2")                                        ? Simd::avx2
                                                                                                   : Simd::none;
  return best;
#else
  return Simd::none;
#endif
}
}  // namespace

uint64_t checksum(const void* data, size_t n) {
  switch (simd()) {
    case Simd::avx512: return checksum_avx512(data, n);
    case Simd::avx2: return checksum_avx2(data, n);
    default: return XXH3_64bits(data, n);
  }
}

StreamingChecksum::StreamingChecksum() : state_(XXH3_createState()) {
  HP_CHECK(state_ != nullptr) << "checkpoint: out of memory for a checksum state";
  reset();
}
StreamingChecksum::~StreamingChecksum() { XXH3_freeState(static_cast<XXH3_state_t*>(state_)); }
void StreamingChecksum::reset() { XXH3_64bits_reset(static_cast<XXH3_state_t*>(state_)); }
// The state's layout is the library's in every build; only the update loop differs.
void StreamingChecksum::update(const void* data, size_t n) {
  switch (simd()) {
    case Simd::avx512: return checksum_update_avx512(state_, data, n);
    case Simd::avx2: return checksum_update_avx2(state_, data, n);
    default: XXH3_64bits_update(static_cast<XXH3_state_t*>(state_), data, n);
  }
}
uint64_t StreamingChecksum::digest() const { return XXH3_64bits_digest(static_cast<XXH3_state_t*>(state_)); }

namespace {

constexpr int kVersion = 2;  // 1 had no metadata or header checksums

// The checksum of a metadata document is over its compact dump without the checksum
// field; nlohmann keeps object keys sorted, so a parse and a dump give the same bytes.
uint64_t document_checksum(json j) {
  j.erase("xxh3_64");
  const std::string text = j.dump();
  return checksum(text.data(), text.size());
}

uint64_t parse_hex(const json& v, const std::string& what) {
  const std::string s = v.get<std::string>();
  HP_CHECK(s.size() == 16 && s.find_first_not_of("0123456789abcdef") == std::string::npos)
      << what << " is not a 16-digit hex checksum: '" << s << "'";
  return std::stoull(s, nullptr, 16);
}

}  // namespace

std::string to_json(const Metadata& m) {
  json tensors = json::object();
  for (const auto& [name, t] : m.tensors) {
    json chunks = json::array();
    for (const auto& c : t.chunks) {
      json sums = json::array();
      for (auto s : c.checksums) sums.push_back(hex(s));
      chunks.push_back({{"offsets", c.offsets}, {"sizes", c.sizes}, {"file", c.file}, {"begin", c.begin},
                        {"end", c.end}, {"xxh3_64", sums}});
    }
    tensors[name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"chunks", chunks}};
  }
  json files = json::object();
  for (const auto& [name, f] : m.files) files[name] = {{"bytes", f.bytes}, {"header_xxh3_64", hex(f.header_checksum)}};
  json j = {{"format", "hp-checkpoint"}, {"version", kVersion}, {"step", m.step},    {"block_bytes", kBlockBytes},
            {"scalars", m.scalars},     {"files", files},      {"tensors", tensors}};
  j["xxh3_64"] = hex(document_checksum(j));
  return j.dump(1);
}

Metadata metadata_from_json(const std::string& text, const std::string& source, bool part) {
  Metadata m;
  try {
    json j = json::parse(text);
    HP_CHECK(j.at("format") == "hp-checkpoint")
        << source << ": not an hp checkpoint (format " << j.at("format") << ")";
    HP_CHECK(j.at("version") == kVersion)
        << source << ": hp checkpoint version " << j.at("version") << ", this build reads version " << kVersion
        << (j.at("version") == 1 ? " (version 1 had no metadata checksum: re-save it with the build that wrote it "
                                   "and convert, or resume from a newer checkpoint)"
                                 : "");
    HP_CHECK(j.contains("xxh3_64")) << source << ": no metadata checksum (xxh3_64)";
    const uint64_t stored = parse_hex(j.at("xxh3_64"), source + ": xxh3_64"), actual = document_checksum(j);
    HP_CHECK(stored == actual) << source << " is corrupt: its contents have checksum " << hex(actual)
                               << ", the file records " << hex(stored)
                               << " (was it edited? step, positions and offsets are covered)";
    HP_CHECK(j.at("block_bytes") == kBlockBytes)
        << source << ": checksum blocks of " << j.at("block_bytes") << " bytes, this build uses " << kBlockBytes;
    m.step = j.at("step").get<int64_t>();
    m.scalars = j.at("scalars").get<std::map<std::string, int64_t>>();
    for (const auto& [name, f] : j.at("files").items())
      m.files[name] = FileMeta{f.at("bytes").get<int64_t>(), parse_hex(f.at("header_xxh3_64"), source + ": file " + name)};
    for (const auto& [name, t] : j.at("tensors").items()) {
      TensorMeta tm;
      tm.dtype = t.at("dtype").get<std::string>();
      tm.shape = t.at("shape").get<std::vector<int64_t>>();
      for (const auto& c : t.at("chunks")) {
        Chunk ch;
        ch.offsets = c.at("offsets").get<std::vector<int64_t>>();
        ch.sizes = c.at("sizes").get<std::vector<int64_t>>();
        ch.file = c.at("file").get<std::string>();
        ch.begin = c.at("begin").get<int64_t>();
        ch.end = c.at("end").get<int64_t>();
        for (const auto& s : c.at("xxh3_64")) ch.checksums.push_back(parse_hex(s, source + ": tensor " + name));
        tm.chunks.push_back(std::move(ch));
      }
      m.tensors.emplace(name, std::move(tm));
    }
  } catch (const json::exception& e) {
    HP_FAIL() << source << ": malformed checkpoint metadata: " << e.what();
  }
  validate_metadata(m, source, /*whole=*/!part);
  return m;
}

void merge_into(Metadata& all, const Metadata& part) {
  for (const auto& [name, t] : part.tensors) {
    auto [it, fresh] = all.tensors.emplace(name, TensorMeta{t.dtype, t.shape, {}});
    HP_CHECK(it->second.dtype == t.dtype && it->second.shape == t.shape)
        << "checkpoint: ranks disagree on tensor " << name << ": " << it->second.dtype << " "
        << nlohmann::json(it->second.shape).dump() << " against " << t.dtype << " " << nlohmann::json(t.shape).dump();
    it->second.chunks.insert(it->second.chunks.end(), t.chunks.begin(), t.chunks.end());
  }
  for (const auto& [f, meta] : part.files) all.files[f] = meta;
}

Metadata read_metadata(const std::string& dir) {
  const std::string path = dir + "/metadata.json";
  return metadata_from_json(read_file(path), path);
}

int64_t safetensors_header_bytes(int fd, int64_t file_bytes, const std::string& path) {
  uint8_t prefix[8];
  HP_CHECK(file_bytes >= 8 && ::pread(fd, prefix, 8, 0) == 8)
      << "checkpoint file " << path << " is truncated: no safetensors header (" << file_bytes << " bytes)";
  uint64_t n = 0;
  for (int k = 7; k >= 0; --k) n = (n << 8) | prefix[k];
  HP_CHECK(n <= static_cast<uint64_t>(file_bytes - 8))
      << "checkpoint file " << path << " is corrupt: its header claims " << n << " bytes, the file has " << file_bytes;
  return 8 + static_cast<int64_t>(n);
}

void verify_file(int fd, const std::string& path, const FileMeta& meta) {
  struct stat st {};
  HP_CHECK(::fstat(fd, &st) == 0) << "checkpoint: cannot stat " << path << ": " << std::strerror(errno);
  HP_CHECK(st.st_size == meta.bytes) << "checkpoint file " << path
                                     << (st.st_size < meta.bytes ? " is truncated: " : " has grown: ") << st.st_size
                                     << " bytes, its metadata records " << meta.bytes;
  std::string header(static_cast<size_t>(safetensors_header_bytes(fd, st.st_size, path)), '\0');
  HP_CHECK(::pread(fd, header.data(), header.size(), 0) == static_cast<ssize_t>(header.size()))
      << "checkpoint: cannot read the header of " << path << ": " << std::strerror(errno);
  const uint64_t sum = checksum(header.data(), header.size());
  HP_CHECK(sum == meta.header_checksum) << "checkpoint file " << path << " has a corrupt safetensors header: checksum "
                                        << hex(sum) << ", expected " << hex(meta.header_checksum);
}

void verify_file(const std::string& path, const FileMeta& meta) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  HP_CHECK(fd >= 0) << "checkpoint: cannot open " << path << ": " << std::strerror(errno);
  try {
    verify_file(fd, path, meta);
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
}

std::vector<SafetensorsEntry> parse_safetensors_header(const std::string& json_text, int64_t header_bytes,
                                                       int64_t file_bytes, const std::string& path) {
  std::vector<SafetensorsEntry> out;
  try {
    const json h = json::parse(json_text);
    HP_CHECK(h.is_object()) << path << ": the safetensors header is not a JSON object";
    for (const auto& [key, t] : h.items()) {
      if (key == "__metadata__") continue;
      SafetensorsEntry e{key, t.at("dtype").get<std::string>(), t.at("shape").get<std::vector<int64_t>>(), 0, 0};
      const auto off = t.at("data_offsets").get<std::vector<int64_t>>();
      HP_CHECK(off.size() == 2) << path << ": tensor " << key << " has " << off.size() << " data offsets, not 2";
      int64_t numel = dtype_size(e.dtype);
      for (int64_t d : e.shape) {
        HP_CHECK(d >= 0 && (d == 0 || numel <= std::numeric_limits<int64_t>::max() / d))
            << path << ": tensor " << key << " has shape " << json(e.shape).dump();
        numel *= d;
      }
      HP_CHECK(0 <= off[0] && off[0] <= off[1] && off[1] <= file_bytes - header_bytes)
          << path << ": tensor " << key << " has data offsets [" << off[0] << ", " << off[1] << ") outside the "
          << file_bytes - header_bytes << " data bytes of the file";
      HP_CHECK(off[1] - off[0] == numel)
          << path << ": tensor " << key << " has " << off[1] - off[0] << " bytes, its shape and dtype need " << numel;
      e.begin = header_bytes + off[0];
      e.end = header_bytes + off[1];
      out.push_back(std::move(e));
    }
  } catch (const json::exception& e) {
    HP_FAIL() << path << ": malformed safetensors header: " << e.what();
  }
  return out;
}

std::string safetensors_header(const std::vector<std::string>& keys, const std::vector<std::string>& dtypes,
                               const std::vector<std::vector<int64_t>>& shapes, const std::vector<int64_t>& bytes) {
  json h = json::object();
  h["__metadata__"] = {{"format", "pt"}};
  int64_t at = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    h[keys[i]] = {{"dtype", dtypes[i]}, {"shape", shapes[i]}, {"data_offsets", {at, at + bytes[i]}}};
    at += bytes[i];
  }
  std::string text = h.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // data starts 8-byte aligned
  std::string out(8, '\0');
  uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + text;
}

void write_all(int fd, const void* data, size_t n, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    HP_CHECK(w > 0) << "checkpoint: cannot write " << path << ": " << std::strerror(errno);
    p += w;
    n -= static_cast<size_t>(w);
  }
}

void write_file_synced(const std::string& path, const std::string& content) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  HP_CHECK(fd >= 0) << "checkpoint: cannot create " << path << ": " << std::strerror(errno);
  write_all(fd, content.data(), content.size(), path);
  const bool synced = ::fsync(fd) == 0;
  ::close(fd);
  HP_CHECK(synced) << "checkpoint: cannot fsync " << path << ": " << std::strerror(errno);
}

void fsync_dir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  HP_CHECK(fd >= 0) << "checkpoint: cannot open directory " << dir << ": " << std::strerror(errno);
  ::fsync(fd);  // some file systems refuse fsync on directories; the rename still orders
  ::close(fd);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  HP_CHECK(in) << "checkpoint: cannot open " << path;
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace hp::checkpoint
