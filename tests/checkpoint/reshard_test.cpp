// Save on one layout, load on another (threads as ranks, real Gloo): every rank's loaded
// piece must equal its slice of the global tensor the saving ranks held pieces of.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <filesystem>

#include "hp/checkpoint.h"
#include "hp/tensor.h"
#include "fixtures.h"

using namespace hp;
using namespace hp::checkpoint;
using hp::testing::fresh_dir;
using hp::testing::numbered;

namespace {

struct Case {
  std::string name;
  std::vector<int64_t> shape;
  at::ScalarType dtype;
};

// Uneven shapes (7 rows over 2 or 4 ranks) and several dtypes.
const std::vector<Case> kCases = {
    {"w.colrow", {8, 6}, at::kFloat}, {"w.uneven", {7, 5}, at::kFloat}, {"b.vec", {9}, at::kDouble},
    {"h.half", {4, 4}, at::kBFloat16}, {"i.ids", {6, 3}, at::kLong},   {"s.scalar", {}, at::kFloat},
};

at::Tensor reference(size_t i) { return numbered(kCases[i].shape, 1000.0 * i, kCases[i].dtype); }

// Placements per case on a 2-dim mesh; `variant` picks another layout.
std::vector<Placement> layout2(size_t i, int variant) {
  const auto nd = kCases[i].shape.size();
  if (nd == 0) return {Replicate(), Replicate()};
  if (variant == 0) return nd > 1 ? std::vector<Placement>{Shard(0), Shard(1)} : std::vector<Placement>{Shard(0), Replicate()};
  return nd > 1 ? std::vector<Placement>{Replicate(), Shard(0)} : std::vector<Placement>{Replicate(), Shard(0)};
}

void save_on_2x2(const std::string& root, int64_t step) {
  comm::run_local_ranks(4, [&](int) {
    DeviceMesh mesh = init_device_mesh("cpu", {2, 2}, {"dp", "tp"});
    std::vector<DTensor> ts;
    for (size_t i = 0; i < kCases.size(); ++i) ts.push_back(distribute_tensor(reference(i), mesh, layout2(i, 0)));
    State s;
    for (size_t i = 0; i < kCases.size(); ++i) s.add(kCases[i].name, ts[i]);
    s.scalars = {{"step", step}, {"rng.offset", -5}};
    Checkpointer(CheckpointOptions{root, 0, false}).save(step, s);
  });
}

// Loads into zeros laid out as `placements(i)` on `mesh_shape` and compares with the reference.
void load_and_check(const std::string& root, int n, std::vector<int64_t> mesh_shape,
                    const std::function<std::vector<Placement>(size_t)>& placements) {
  comm::run_local_ranks(n, [&](int) {
    DeviceMesh mesh = init_device_mesh("cpu", mesh_shape);
    std::vector<DTensor> ts;
    State s;
    for (size_t i = 0; i < kCases.size(); ++i)
      ts.push_back(distribute_tensor(at::zeros(kCases[i].shape, kCases[i].dtype), mesh, placements(i)));
    for (size_t i = 0; i < kCases.size(); ++i) s.add(kCases[i].name, ts[i]);
    auto step = Checkpointer(CheckpointOptions{root}).load_latest(s);
    ASSERT_TRUE(step.has_value());
    EXPECT_EQ(s.scalars.at("step"), *step);
    EXPECT_EQ(s.scalars.at("rng.offset"), -5);
    for (size_t i = 0; i < kCases.size(); ++i) {
      // Every rank checks its own piece: the slice of the reference at its offset.
      const auto coord = mesh.coordinate();
      at::Tensor expected = reference(i);
      const auto off = ts[i].spec().global_offset(coord), size = ts[i].spec().local_shape(coord);
      for (size_t d = 0; d < off.size(); ++d) expected = expected.narrow(d, off[d], size[d]);
      EXPECT_TRUE(at::equal(ts[i].to_local(), expected)) << kCases[i].name << " on " << ts[i].spec().to_string();
    }
  });
}

}  // namespace

TEST(CheckpointReshard, DpTpToTp4ToOneRankAndToTwoRanksTransposed) {
  const auto root = fresh_dir("reshard");
  save_on_2x2(root, 3);
  load_and_check(root, 4, {4}, [](size_t i) {
    return std::vector<Placement>{kCases[i].shape.empty() ? Replicate() : Shard(kCases[i].shape.size() - 1)};
  });
  load_and_check(root, 1, {1}, [](size_t) { return std::vector<Placement>{Replicate()}; });
  load_and_check(root, 4, {2, 2}, [](size_t i) { return layout2(i, 1); });
  load_and_check(root, 2, {2}, [](size_t i) {
    return std::vector<Placement>{kCases[i].shape.empty() ? Replicate() : Shard(0)};
  });
  // One process, no mesh: the whole tensors.
  for (size_t i = 0; i < kCases.size(); ++i)
    EXPECT_TRUE(at::equal(read_tensor(step_dir(root, 3), kCases[i].name), reference(i))) << kCases[i].name;
}

TEST(CheckpointReshard, EachElementIsWrittenOnceAndFilesAreSafetensors) {
  const auto root = fresh_dir("once");
  save_on_2x2(root, 1);
  const auto dir = step_dir(root, 1);
  Metadata m = read_metadata(dir);
  int64_t global_bytes = 0, chunk_bytes = 0;
  for (size_t i = 0; i < kCases.size(); ++i) {
    const auto& t = m.tensors.at(kCases[i].name);
    global_bytes += reference(i).numel() * reference(i).element_size();
    for (const auto& c : t.chunks) chunk_bytes += c.end - c.begin;
  }
  EXPECT_EQ(chunk_bytes, global_bytes);
  // Each file: 8-byte little-endian header length, a JSON header, then exactly the data.
  int64_t data_bytes = 0;
  for (const auto& [file, meta] : m.files) {
    const std::string bytes = read_file(dir + "/" + file);
    ASSERT_EQ(static_cast<int64_t>(bytes.size()), meta.bytes) << file;
    uint64_t n = 0;
    for (int k = 7; k >= 0; --k) n = (n << 8) | static_cast<uint8_t>(bytes[k]);
    ASSERT_LE(8 + n, bytes.size()) << file;
    EXPECT_EQ(bytes[8], '{') << file;
    EXPECT_NE(bytes.substr(8, n).find("\"data_offsets\""), std::string::npos) << file;
    data_bytes += static_cast<int64_t>(bytes.size() - 8 - n);
  }
  EXPECT_EQ(data_bytes, global_bytes);
}
