// The files of a checkpoint: publication only when complete, the last K kept, asynchronous
// snapshots, and errors for corrupt, truncated or mismatched checkpoints.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include <xxhash.h>

#include "hp/checkpoint.h"
#include "hp/tensor.h"
#include "fixtures.h"

using namespace hp;
using namespace hp::checkpoint;
using hp::testing::flip_byte;
using hp::testing::fresh_dir;
using hp::testing::numbered;
namespace fs = std::filesystem;

namespace {

// 600 x 1000 floats: 2.4 MB, three checksum blocks.
at::Tensor big() { return numbered({600, 1000}, 0.5); }

void save_big(const std::string& root, int64_t step, int n = 2, bool async = false, int64_t keep = 0) {
  comm::run_local_ranks(n, [&](int) {
    DeviceMesh mesh = init_device_mesh("cpu", {n});
    DTensor t = distribute_tensor(big(), mesh, {Shard(0)});
    State s;
    s.add("big", t);
    Checkpointer c(CheckpointOptions{root, keep, async});
    c.save(step, s);
    if (async) t.to_local().add_(1.0);  // training goes on: the snapshot must not see this
    c.wait();
  });
}

// Loads "big" as row shards over n ranks; rank r's error message, "" when it loaded the right rows.
std::vector<std::string> load_big(const std::string& dir, int n) {
  std::vector<std::string> errors(n);
  comm::run_local_ranks(n, [&](int rank) {
    DeviceMesh mesh = init_device_mesh("cpu", {n});
    DTensor t = distribute_tensor(at::zeros({600, 1000}), mesh, {Shard(0)});
    State s;
    s.add("big", t);
    try {
      load(dir, s);
      auto off = t.spec().global_offset(mesh.coordinate())[0];
      if (!at::equal(t.to_local(), big().narrow(0, off, t.to_local().size(0)))) errors[rank] = "wrong values";
    } catch (const Error& e) {
      errors[rank] = e.what();
    }
  });
  return errors;
}

std::string only_file(const std::string& dir, const std::string& name) { return dir + "/" + name; }

}  // namespace

TEST(CheckpointFiles, CorruptBlockIsNamedAndOnlyItsReadersFail) {
  const auto root = fresh_dir("corrupt");
  save_big(root, 7, /*n=*/1);
  const auto dir = step_dir(root, 7);
  const Chunk c = read_metadata(dir).tensors.at("big").chunks.at(0);
  flip_byte(only_file(dir, c.file), c.end - 100);  // in the last block
  auto errors = load_big(dir, 2);
  // Rank 0's rows (bytes [0, 1.2 MB)) lie in blocks 0 and 1: it never reads the last one.
  EXPECT_EQ(errors[0], "");
  EXPECT_NE(errors[1].find("is corrupt"), std::string::npos) << errors[1];
  EXPECT_NE(errors[1].find(dir + "/" + c.file), std::string::npos) << errors[1];
  EXPECT_NE(errors[1].find("tensor big"), std::string::npos) << errors[1];
  EXPECT_NE(errors[1].find("block 2"), std::string::npos) << errors[1];
}

TEST(CheckpointFiles, TruncatedFileIsNamedWithTheTensor) {
  const auto root = fresh_dir("truncated");
  save_big(root, 2, /*n=*/1);
  const auto dir = step_dir(root, 2);
  const Chunk c = read_metadata(dir).tensors.at("big").chunks.at(0);
  fs::resize_file(only_file(dir, c.file), static_cast<uintmax_t>(c.end - 5000));
  auto errors = load_big(dir, 1);
  EXPECT_NE(errors[0].find("is truncated"), std::string::npos) << errors[0];
  EXPECT_NE(errors[0].find(dir + "/" + c.file), std::string::npos) << errors[0];
  EXPECT_NE(errors[0].find("tensor big"), std::string::npos) << errors[0];
}

TEST(CheckpointFiles, AsyncSaveWritesTheSnapshotAndKeepsTheLastK) {
  const auto root = fresh_dir("async");
  for (int64_t step : {1, 2, 3, 4}) save_big(root, step, 2, /*async=*/true, /*keep=*/2);
  EXPECT_EQ(list_steps(root), (std::vector<int64_t>{3, 4}));
  for (const auto& e : fs::directory_iterator(root))
    EXPECT_EQ(e.path().filename().string().rfind("step-", 0), 0u) << e.path();
  auto errors = load_big(step_dir(root, 4), 2);
  EXPECT_EQ(errors, (std::vector<std::string>{"", ""}));
}

TEST(CheckpointFiles, AFailedSaveLeavesThePreviousOneAndErrsOnEveryRank) {
  const auto root = fresh_dir("failed");
  save_big(root, 1);
  // Rank 1 cannot create its file (a directory is in the way), as if its disk were full.
  fs::create_directories(root + "/.tmp-step-00000002/rank-00001.safetensors");
  std::vector<std::string> errors(2);
  comm::run_local_ranks(2, [&](int rank) {
    DeviceMesh mesh = init_device_mesh("cpu", {2});
    DTensor t = distribute_tensor(big(), mesh, {Shard(0)});
    State s;
    s.add("big", t);
    try {
      Checkpointer(CheckpointOptions{root}).save(2, s);
    } catch (const Error& e) {
      errors[rank] = e.what();
    }
  });
  EXPECT_NE(errors[0].find("rank 1 failed to write"), std::string::npos) << errors[0];
  EXPECT_NE(errors[1].find("cannot create"), std::string::npos) << errors[1];
  EXPECT_EQ(list_steps(root), (std::vector<int64_t>{1}));
  EXPECT_EQ(load_big(step_dir(root, 1), 2), (std::vector<std::string>{"", ""}));

  // The next save succeeds and clears what the failed one left.
  fs::remove_all(root + "/.tmp-step-00000002/rank-00001.safetensors");
  save_big(root, 3);
  EXPECT_EQ(list_steps(root), (std::vector<int64_t>{1, 3}));
  EXPECT_FALSE(fs::exists(root + "/.tmp-step-00000002"));
}

TEST(CheckpointFiles, MissingTensorsAndOtherShapesAreNamed) {
  const auto root = fresh_dir("mismatch");
  save_big(root, 1, 1);
  comm::run_local_ranks(1, [&](int) {
    DeviceMesh mesh = init_device_mesh("cpu", {1});
    DTensor other = distribute_tensor(at::zeros({600, 999}), mesh, {Replicate()});
    State s;
    s.add("big", other);
    try {
      load(step_dir(root, 1), s);
      ADD_FAILURE() << "a [600, 999] tensor loaded from a [600, 1000] one";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("tensor big is F32 [600, 1000] there, but F32 [600, 999] here"),
                std::string::npos) << e.what();
    }
    State missing;
    missing.add("absent", other);
    try {
      load(step_dir(root, 1), missing);
      ADD_FAILURE() << "a tensor absent from the checkpoint loaded";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("has no tensor absent"), std::string::npos) << e.what();
    }
  });
  EXPECT_FALSE(Checkpointer(CheckpointOptions{fresh_dir("empty")}).latest_step().has_value());
}

// Loading hashes each checksum block piece by piece as it reads; the result must be the
// one-shot hash the saver wrote, for any split of the block.
TEST(CheckpointFiles, StreamingChecksumEqualsOneShot) {
  std::vector<uint8_t> bytes(3 * kBlockBytes + 12345);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>((i * 2654435761u) >> 13);
  const uint64_t whole = checksum(bytes.data(), bytes.size());
  // The vector builds give the library's portable bits: other tools can check the files.
  EXPECT_EQ(whole, XXH3_64bits(bytes.data(), bytes.size()));
  StreamingChecksum hash;
  for (size_t piece : {size_t(1), size_t(63), size_t(4096), size_t(256 << 10), size_t(kBlockBytes), bytes.size()}) {
    hash.reset();
    for (size_t p = 0; p < bytes.size(); p += piece) hash.update(bytes.data() + p, std::min(piece, bytes.size() - p));
    EXPECT_EQ(hash.digest(), whole) << "pieces of " << piece << " bytes";
  }
  bytes[bytes.size() / 2] ^= 1;  // and it still sees a flipped bit
  hash.reset();
  hash.update(bytes.data(), bytes.size());
  EXPECT_NE(hash.digest(), whole);
}

TEST(CheckpointFiles, DeferredSnapshotIsTakenBeforeTheStateMayChange) {
  const auto root = fresh_dir("deferred");
  comm::run_local_ranks(2, [&](int) {
    DeviceMesh mesh = init_device_mesh("cpu", {2});
    DTensor t = distribute_tensor(big(), mesh, {Shard(0)});
    State s;
    s.add("big", t);
    Checkpointer c(CheckpointOptions{root, 0, /*async=*/true, /*defer_snapshot=*/true});
    c.save(1, s);
    at::Tensor read = t.to_local().sum();  // forward and backward only read the state
    c.wait_for_snapshot();
    t.to_local().add_(1.0);  // the optimizer step
    c.wait();
    c.wait_for_snapshot();  // nothing pending: returns at once
  });
  EXPECT_EQ(load_big(step_dir(root, 1), 2), (std::vector<std::string>{"", ""}));
}

// Without wait_for_snapshot() the change races the copy: either the copy came first (the
// checkpoint holds the old values) or the save fails naming the tensor and the previous
// checkpoint stays the latest. Never a checkpoint with the new values.
TEST(CheckpointFiles, AChangeDuringADeferredSnapshotNeverPublishesIt) {
  const auto root = fresh_dir("deferred-race");
  save_big(root, 1);
  int failed = 0;
  for (int64_t step = 2; step < 6; ++step) {
    std::vector<std::string> errors(2);
    comm::run_local_ranks(2, [&](int rank) {
      DeviceMesh mesh = init_device_mesh("cpu", {2});
      DTensor t = distribute_tensor(big(), mesh, {Shard(0)});
      State s;
      s.add("big", t);
      Checkpointer c(CheckpointOptions{root, 0, /*async=*/true, /*defer_snapshot=*/true});
      c.save(step, s);
      t.to_local().add_(1.0);
      try {
        c.wait();
      } catch (const Error& e) {
        errors[rank] = e.what();
      }
    });
    const std::vector<int64_t> steps = list_steps(root);
    const bool published = std::count(steps.begin(), steps.end(), step) == 1;
    for (const auto& e : errors)
      if (!e.empty()) EXPECT_NE(e.find("tensor 'big' changed while its snapshot was taken"), std::string::npos) << e;
    if (published) {
      EXPECT_EQ(load_big(step_dir(root, step), 2), (std::vector<std::string>{"", ""})) << "step " << step;
    } else {
      ++failed;
      EXPECT_FALSE(errors[0].empty() && errors[1].empty()) << "step " << step << " vanished without an error";
    }
  }
  EXPECT_EQ(load_big(step_dir(root, 1), 2), (std::vector<std::string>{"", ""}));
  std::printf("deferred snapshots that caught the change: %d of 4\n", failed);
}
