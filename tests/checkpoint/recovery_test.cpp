// Recovery end to end: `hp train` as 4 processes under hprun --max-restarts 1, one rank
// killed with SIGKILL mid-run (its asynchronous save may be in flight). The group restarts,
// resumes from the latest checkpoint, and ends with bitwise the same parameters and
// optimizer state as an uninterrupted run.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <ATen/ATen.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <thread>
#include <filesystem>
#include <string>

#include "hp/checkpoint.h"

namespace fs = std::filesystem;
using namespace hp::checkpoint;

namespace {

struct Result {
  int code;
  std::string output;
};

Result run(const std::string& cmd) {
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  std::string out;
  std::array<char, 4096> buf;
  while (size_t n = std::fread(buf.data(), 1, buf.size(), p)) out.append(buf.data(), n);
  int status = ::pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

std::string write_config(const std::string& dir) {
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string path = dir + "/run.toml";
  FILE* f = std::fopen(path.c_str(), "w");
  std::fprintf(f,
               "[mesh]\nshape = [2, 2]\nnames = [\"dp\", \"tp\"]\n"
               "[model]\ndim = 32\nlayers = 1\nheads = 2\nkv_heads = 2\nffn_dim = 64\nmax_seq = 16\n"
               "[train]\nsteps = 8\nbatch = 4\nseq = 16\nlr = 1e-2\nwarmup = 2\nlog_every = 1\n"
               "deterministic = true\n"
               "[checkpoint]\ndir = \"%s/ckpt\"\nevery = 3\nkeep = 2\nasync = true\n",
               dir.c_str());
  std::fclose(f);
  return path;
}

void expect_same_final_state(const std::string& root_a, const std::string& root_b) {
  const auto final_a = step_dir(root_a, 8), final_b = step_dir(root_b, 8);
  const Metadata ma = read_metadata(final_a), mb = read_metadata(final_b);
  EXPECT_EQ(ma.scalars, mb.scalars);
  ASSERT_EQ(ma.tensors.size(), 36u);  // 12 parameters, each with exp_avg and exp_avg_sq
  ASSERT_EQ(mb.tensors.size(), ma.tensors.size());
  for (const auto& [name, _] : ma.tensors)
    EXPECT_TRUE(at::equal(read_tensor(final_a, name), read_tensor(final_b, name))) << name;
}

const std::string kHprun = HP_BIN_DIR "/hprun --nproc-per-node 4 ", kTrain = HP_BIN_DIR "/hp train --config ";

}  // namespace

TEST(Recovery, RankKilledMidRunResumesBitwiseEqualToAnUninterruptedRun) {
  const std::string base = ::testing::TempDir() + "hp_recovery_" + std::to_string(::getpid());
  const std::string clean = base + "/clean", killed = base + "/killed";
  const std::string& hprun = kHprun;
  const std::string& train = kTrain;

  Result a = run(hprun + train + write_config(clean));
  ASSERT_EQ(a.code, 0) << a.output;

  // Rank 2 dies after step index 5, just after the asynchronous save of step 6 began: the
  // group resumes at 6 if that save was published, else at 3.
  Result b = run("HP_FAULT_KILL=2:5 " + hprun + "--max-restarts 1 " + train + write_config(killed));
  ASSERT_EQ(b.code, 0) << b.output;
  EXPECT_NE(b.output.find("signal 9"), std::string::npos) << b.output;
  EXPECT_TRUE(b.output.find("(resumed at step 6)") != std::string::npos ||
              b.output.find("(resumed at step 3)") != std::string::npos)
      << b.output;

  expect_same_final_state(clean + "/ckpt", killed + "/ckpt");
  fs::remove_all(base);
}

// The whole job (launcher and ranks) is SIGKILLed from outside while the save of step 6
// has written its metadata but not yet published it. That save is not resumed from; the
// next run resumes at step 3 and ends bitwise equal to an uninterrupted run.
TEST(Recovery, JobKilledBetweenMetadataAndPublishResumesFromTheLastPublished) {
  const std::string base = ::testing::TempDir() + "hp_recovery_publish_" + std::to_string(::getpid());
  const std::string clean = base + "/clean", killed = base + "/killed", pause = base + "/paused";
  Result a = run(kHprun + kTrain + write_config(clean));
  ASSERT_EQ(a.code, 0) << a.output;

  const std::string config = write_config(killed);
  const pid_t job = ::fork();
  ASSERT_GE(job, 0);
  if (job == 0) {
    ::setsid();  // a session of its own: the kill below reaches every process of the job
    ::setenv("HP_CHECKPOINT_PAUSE", ("6:" + pause).c_str(), 1);
    const std::string cmd = kHprun + kTrain + config + " > " + base + "/killed.log 2>&1";
    ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(300);
  while (!fs::exists(pause) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  const bool paused = fs::exists(pause);
  run("pkill -KILL -s " + std::to_string(job));
  ::waitpid(job, nullptr, 0);
  ASSERT_TRUE(paused) << "the save of step 6 never reached its pause";
  EXPECT_EQ(list_steps(killed + "/ckpt"), (std::vector<int64_t>{3}));
  EXPECT_TRUE(fs::exists(killed + "/ckpt/.tmp-step-00000006/metadata.json"));

  Result b = run(kHprun + kTrain + config);
  ASSERT_EQ(b.code, 0) << b.output;
  EXPECT_NE(b.output.find("(resumed at step 3)"), std::string::npos) << b.output;
  expect_same_final_state(clean + "/ckpt", killed + "/ckpt");
  fs::remove_all(base);
}
