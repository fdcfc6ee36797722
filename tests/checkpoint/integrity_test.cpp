// Checkpoint integrity: metadata edited by hand, damaged headers, chunks that lie outside
// their tensor or file, names that leave the directory; resume falling back past a
// checkpoint that fails on any rank; re-saves and retention that never lose the last good
// checkpoint, including when a save stops between writing metadata and publishing.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <thread>

#include "comm/scoped_env.h"
#include "fixtures.h"
#include "hp/checkpoint.h"
#include "hp/checkpoint/validate.h"
#include "hp/tensor.h"

using namespace hp;
using namespace hp::checkpoint;
using hp::testing::flip_byte;
using hp::testing::fresh_dir;
using hp::testing::numbered;
namespace fs = std::filesystem;

namespace {

// 600 x 1000 floats as row shards, plus the scalars a trainer saves.
at::Tensor big(int64_t step) { return numbered({600, 1000}, double(step)); }

void save_big(const std::string& root, int64_t step, int n = 2, int64_t keep = 0) {
  comm::run_local_ranks(n, [&](int) {
    DeviceMesh mesh = init_device_mesh("cpu", {n});
    State s;
    s.add("big", distribute_tensor(big(step), mesh, {Shard(0)}));
    s.scalars = {{"step", step}, {"data.position", 100 * step}};
    Checkpointer(CheckpointOptions{root, keep}).save(step, s);
  });
}

struct Loaded {
  std::optional<int64_t> step;
  std::string error;
  bool values_match = false;
};

// load_latest on n ranks; each rank's outcome.
std::vector<Loaded> load_latest_big(const std::string& root, int n) {
  std::vector<Loaded> out(n);
  comm::run_local_ranks(n, [&](int rank) {
    DeviceMesh mesh = init_device_mesh("cpu", {n});
    DTensor t = distribute_tensor(at::zeros({600, 1000}), mesh, {Shard(0)});
    State s;
    s.add("big", t);
    try {
      out[rank].step = Checkpointer(CheckpointOptions{root}).load_latest(s);
      const int64_t off = t.spec().global_offset(mesh.coordinate())[0];
      out[rank].values_match =
          out[rank].step && s.scalars.at("step") == *out[rank].step &&
          at::equal(t.to_local(), big(*out[rank].step).narrow(0, off, t.to_local().size(0)));
    } catch (const Error& e) {
      out[rank].error = e.what();
    }
  });
  return out;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

void spit(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

// The error metadata_from_json gives for `m` (written with a valid checksum), "" if none.
std::string refusal(const Metadata& m) {
  try {
    metadata_from_json(to_json(m), "meta");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// A valid two-chunk tensor of 4 x 3 floats in two files.
Metadata two_chunks() {
  Metadata m;
  m.files = {{"rank-00000.safetensors", {8 + 24 + 100, 1}}, {"rank-00001.safetensors", {8 + 24 + 100, 2}}};
  TensorMeta t{"F32", {4, 3}, {}};
  t.chunks.push_back({{0, 0}, {2, 3}, "rank-00000.safetensors", 108, 132, {7}});
  t.chunks.push_back({{2, 0}, {2, 3}, "rank-00001.safetensors", 108, 132, {8}});
  m.tensors["w"] = t;
  return m;
}

}  // namespace

TEST(CheckpointIntegrity, EditedStepOrPositionIsRefusedNotResumed) {
  for (const std::string field : {"step", "data.position"}) {
    const auto root = fresh_dir("edited");
    save_big(root, 3);
    const std::string path = step_dir(root, 3) + "/metadata.json";
    const std::string text = slurp(path);
    const std::regex value("\"" + std::regex_replace(field, std::regex("\\."), "\\.") + "\": (\\d+)");
    std::smatch found;
    ASSERT_TRUE(std::regex_search(text, found, value)) << field;
    spit(path, std::regex_replace(text, value, "\"" + field + "\": 7", std::regex_constants::format_first_only));
    try {
      read_metadata(step_dir(root, 3));
      ADD_FAILURE() << "an edited " << field << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("is corrupt"), std::string::npos) << e.what();
    }
  }
}

TEST(CheckpointIntegrity, DamagedSafetensorsHeaderIsNamed) {
  const auto root = fresh_dir("header");
  save_big(root, 1, 1);
  const auto dir = step_dir(root, 1);
  flip_byte(dir + "/rank-00000.safetensors", 20);  // inside the JSON header, not the data
  auto got = load_latest_big(root, 1);
  EXPECT_NE(got[0].error.find("corrupt safetensors header"), std::string::npos) << got[0].error;
}

TEST(CheckpointIntegrity, EveryChunkIsValidatedWhenMetadataIsParsed) {
  EXPECT_EQ(refusal(two_chunks()), "");
  struct Case {
    const char* expect;
    std::function<void(Metadata&)> damage;
  };
  const std::vector<Case> cases = {
      {"lies outside the tensor", [](Metadata& m) { m.tensors["w"].chunks[1].offsets[0] = 3; }},
      {"lies outside the tensor", [](Metadata& m) { m.tensors["w"].chunks[0].offsets[1] = -1; }},
      {"dims", [](Metadata& m) { m.tensors["w"].chunks[0].sizes.push_back(1); }},
      {"overlaps", [](Metadata& m) {
         m.tensors["w"].chunks[1].offsets[0] = 1;
         m.tensors["w"].chunks[1].sizes[0] = 3;
         m.tensors["w"].chunks[1].end = 108 + 36;
         m.files["rank-00001.safetensors"].bytes = 200;
       }},
      {"cover 6 of its 12", [](Metadata& m) { m.tensors["w"].chunks.pop_back(); }},
      {"has bytes [108, 140)", [](Metadata& m) { m.tensors["w"].chunks[0].end = 140; }},
      {"has bytes [132, 108)", [](Metadata& m) { m.tensors["w"].chunks[0].begin = 132, m.tensors["w"].chunks[0].end = 108; }},
      {"has bytes [108, 132) of rank-00000.safetensors, which has 120",
       [](Metadata& m) { m.files["rank-00000.safetensors"].bytes = 120; }},
      {"0 checksums for 1 blocks", [](Metadata& m) { m.tensors["w"].chunks[0].checksums.clear(); }},
      {"not a plain name", [](Metadata& m) {
         m.files["../escape"] = m.files["rank-00000.safetensors"];
         m.tensors["w"].chunks[0].file = "../escape";
       }},
      {"not a plain name", [](Metadata& m) { m.files["/etc/passwd"] = {1, 1}; }},
      {"does not list", [](Metadata& m) { m.tensors["w"].chunks[0].file = "other.safetensors"; }},
      {"unknown dtype", [](Metadata& m) { m.tensors["w"].dtype = "F8"; }},
  };
  for (const Case& c : cases) {
    Metadata m = two_chunks();
    c.damage(m);
    const std::string why = refusal(m);
    EXPECT_NE(why.find(c.expect), std::string::npos) << "expected '" << c.expect << "', got '" << why << "'";
  }
  EXPECT_TRUE(is_plain_file_name("rank-00003.safetensors"));
  for (const char* bad : {"", ".", "..", "a/b", "/abs"}) EXPECT_FALSE(is_plain_file_name(bad)) << bad;
}

// Rank 1 alone reads the damaged block (the last rows); both ranks fall back together.
TEST(CheckpointIntegrity, ResumeFallsBackWhenAnyRankFindsDamage) {
  const auto root = fresh_dir("fallback");
  for (int64_t step : {1, 2, 3}) save_big(root, step);
  const auto dir = step_dir(root, 3);
  const Chunk c = read_metadata(dir).tensors.at("big").chunks.at(1);
  flip_byte(dir + "/" + c.file, c.end - 10);
  ::testing::internal::CaptureStderr();
  auto got = load_latest_big(root, 2);
  const std::string said = ::testing::internal::GetCapturedStderr();
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(got[r].error, "") << "rank " << r;
    EXPECT_EQ(got[r].step, 2) << "rank " << r;
    EXPECT_TRUE(got[r].values_match) << "rank " << r;
  }
  EXPECT_NE(said.find("failed verification"), std::string::npos) << said;
  EXPECT_NE(said.find("rank 1"), std::string::npos) << said;
  EXPECT_NE(said.find("falling back to step 2"), std::string::npos) << said;

  // Nothing intact at all: an error naming every checkpoint, not a fresh start.
  for (int64_t step : {1, 2}) fs::remove(step_dir(root, step) + "/rank-00000.safetensors");
  got = load_latest_big(root, 2);
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(got[r].error.find("none of the 3 checkpoints"), std::string::npos) << got[r].error;
    EXPECT_NE(got[r].error.find("step-00000001"), std::string::npos) << got[r].error;
  }
}

TEST(CheckpointIntegrity, SavingAStepAgainSwapsItWhole) {
  const auto root = fresh_dir("resave");
  save_big(root, 4);
  comm::run_local_ranks(2, [&](int) {  // other values, same step
    DeviceMesh mesh = init_device_mesh("cpu", {2});
    State s;
    s.add("big", distribute_tensor(big(5), mesh, {Shard(0)}));
    s.scalars = {{"step", 4}};
    Checkpointer(CheckpointOptions{root}).save(4, s);
  });
  EXPECT_TRUE(at::equal(read_tensor(step_dir(root, 4), "big"), big(5)));
  for (const auto& e : fs::directory_iterator(root)) EXPECT_EQ(e.path().filename(), "step-00000004");
}

// A re-save stopped between its two renames (where the file system cannot swap) left the
// old checkpoint at .old-step-N and no step-N: it is still found and loaded.
TEST(CheckpointIntegrity, AnOldCheckpointMovedAsideIsStillFound) {
  const auto root = fresh_dir("moved");
  save_big(root, 2);
  save_big(root, 6);
  fs::rename(step_dir(root, 6), root + "/.old-step-00000006");
  EXPECT_EQ(list_steps(root), (std::vector<int64_t>{2, 6}));
  auto got = load_latest_big(root, 2);
  for (int r = 0; r < 2; ++r) EXPECT_TRUE(got[r].values_match && got[r].step == 6) << got[r].error;
  // The next save puts it back where it belongs, and publishes.
  save_big(root, 7);
  EXPECT_EQ(list_steps(root), (std::vector<int64_t>{2, 6, 7}));
  EXPECT_TRUE(fs::exists(step_dir(root, 6) + "/metadata.json"));
}

// The save of step 3 stops between metadata and publishing; while it waits, its rank file
// is truncated from outside. It must not be published, and the older ones it would retire
// (keep = 1) must stay.
TEST(CheckpointIntegrity, RetentionWaitsForTheNewCheckpointToVerify) {
  const auto root = fresh_dir("retention");
  save_big(root, 1, 2, /*keep=*/1);
  save_big(root, 2, 2, /*keep=*/1);
  const std::string pause = root + "/pause";
  std::string error;
  std::thread saver([&] {
    ScopedEnv env("HP_CHECKPOINT_PAUSE", ("3:" + pause).c_str());
    try {
      save_big(root, 3, 2, /*keep=*/1);
    } catch (const Error& e) {
      error = e.what();
    }
  });
  while (!fs::exists(pause)) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  fs::resize_file(root + "/.tmp-step-00000003/rank-00001.safetensors", 1000);
  fs::remove(pause);
  saver.join();
  EXPECT_NE(error.find("is truncated"), std::string::npos) << error;
  EXPECT_EQ(list_steps(root), (std::vector<int64_t>{2}));
  auto got = load_latest_big(root, 2);
  for (int r = 0; r < 2; ++r) EXPECT_TRUE(got[r].values_match && got[r].step == 2) << got[r].error;
}
