#include "hp/checkpoint/validate.h"

#include <algorithm>
#include <limits>
#include <vector>

#include "hp/base/error.h"
#include "hp/base/strings.h"

namespace hp::checkpoint {
namespace {

// Whether the boxes share an element (an empty box shares none).
bool boxes_overlap(const Chunk& a, const Chunk& b) {
  for (size_t d = 0; d < a.offsets.size(); ++d)
    if (std::max(a.offsets[d], b.offsets[d]) >= std::min(a.offsets[d] + a.sizes[d], b.offsets[d] + b.sizes[d]))
      return false;
  return true;
}

// a * b for non-negative a, b; an error naming `what` where it would overflow.
int64_t times(int64_t a, int64_t b, const std::string& what) {
  HP_CHECK(b == 0 || a <= std::numeric_limits<int64_t>::max() / b) << what << " has more elements than fit in 64 bits";
  return a * b;
}

std::string describe(const std::string& name, const Chunk& c) {
  return "tensor " + name + ", chunk at " + to_string_list(c.offsets) + " of size " + to_string_list(c.sizes);
}

// Returns the chunk's element count.
int64_t check_chunk(const Metadata& m, const std::string& name, const TensorMeta& t, const Chunk& c,
                    const std::string& source) {
  const size_t nd = t.shape.size();
  HP_CHECK(c.offsets.size() == nd && c.sizes.size() == nd)
      << source << ": " << describe(name, c) << " has " << c.offsets.size() << " offsets and " << c.sizes.size()
      << " sizes for a tensor of " << nd << " dims";
  int64_t numel = 1;
  for (size_t d = 0; d < nd; ++d) {
    HP_CHECK(c.offsets[d] >= 0 && c.sizes[d] >= 0 && c.offsets[d] <= t.shape[d] &&
             c.sizes[d] <= t.shape[d] - c.offsets[d])
        << source << ": " << describe(name, c) << " lies outside the tensor's shape " << to_string_list(t.shape);
    numel *= c.sizes[d];  // at most the tensor's numel, which fits
  }
  HP_CHECK(is_plain_file_name(c.file)) << source << ": " << describe(name, c) << " names file '" << c.file
                                       << "', which is not a plain name inside the checkpoint directory";
  auto f = m.files.find(c.file);
  HP_CHECK(f != m.files.end()) << source << ": " << describe(name, c) << " lies in " << c.file
                               << ", which the metadata does not list";
  HP_CHECK(8 <= c.begin && c.begin <= c.end && c.end <= f->second.bytes)
      << source << ": " << describe(name, c) << " has bytes [" << c.begin << ", " << c.end << ") of " << c.file
      << ", which has " << f->second.bytes;
  const int64_t bytes = c.end - c.begin, need = numel * dtype_size(t.dtype);  // at most the tensor's bytes, checked to fit
  HP_CHECK(bytes == need) << source << ": " << describe(name, c) << " has " << bytes << " bytes, its sizes need " << need;
  const int64_t blocks = bytes / kBlockBytes + (bytes % kBlockBytes != 0);
  HP_CHECK(static_cast<int64_t>(c.checksums.size()) == blocks)
      << source << ": " << describe(name, c) << " has " << c.checksums.size() << " checksums for " << blocks
      << " blocks";
  return numel;
}

}  // namespace

bool is_plain_file_name(const std::string& file) {
  return !file.empty() && file != "." && file != ".." && file.find('/') == std::string::npos &&
         file.find('\0') == std::string::npos;
}

void validate_metadata(const Metadata& m, const std::string& source, bool whole) {
  for (const auto& [file, _] : m.files)
    HP_CHECK(is_plain_file_name(file)) << source << ": file '" << file
                                       << "' is not a plain name inside the checkpoint directory";
  for (const auto& [name, t] : m.tensors) {
    const std::string what = source + ": tensor " + name;
    int64_t numel = 1;
    for (int64_t e : t.shape) {
      HP_CHECK(e >= 0) << what << " has shape " << to_string_list(t.shape);
      numel = times(numel, e, what);
    }
    times(numel, dtype_size(t.dtype), what);  // its bytes fit too, so every chunk's do
    int64_t covered = 0;
    for (const Chunk& c : t.chunks) covered += check_chunk(m, name, t, c, source);
    // Sorted by first offset, a chunk can only overlap those that start before it ends
    // along dim 0: near-linear for the usual row and block shardings.
    std::vector<const Chunk*> order;
    for (const Chunk& c : t.chunks) order.push_back(&c);
    const bool scalar = t.shape.empty();
    auto start = [scalar](const Chunk* c) { return scalar ? 0 : c->offsets[0]; };
    std::sort(order.begin(), order.end(), [&](const Chunk* a, const Chunk* b) { return start(a) < start(b); });
    for (size_t i = 0; i < order.size(); ++i)
      for (size_t k = i + 1; k < order.size() && (scalar || start(order[k]) < start(order[i]) + order[i]->sizes[0]); ++k)
        HP_CHECK(!boxes_overlap(*order[i], *order[k]))
            << source << ": " << describe(name, *order[k]) << " overlaps the " << describe(name, *order[i]);
    HP_CHECK(!whole || covered == numel) << source << ": the chunks of tensor " << name << " cover " << covered << " of its "
                               << numel << " elements";
  }
}

}  // namespace hp::checkpoint
