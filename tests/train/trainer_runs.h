// What the trainer's layout tests share: a fresh directory per run, a run on every rank
// as threads (losses equal across ranks, bitwise), and the comparison of a run with its
// reference: losses step by step, and every model parameter of the two runs' checkpoints.
#pragma once

#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "hp/checkpoint.h"
#include "hp/comm/collective_log.h"
#include "hp/comm/local_ranks.h"
#include "hp/comm/world.h"
#include "hp/train/trainer.h"

namespace hp::testing {

inline std::string fresh_dir(const std::string& prefix, const std::string& tag) {
  auto dir = std::filesystem::path(::testing::TempDir()) / (prefix + "_" + tag + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  return dir.string();
}

// Rank 0's result, after checking that every rank saw the same losses.
inline train::TrainResult run_on_all_ranks(const train::TrainConfig& c) {
  std::vector<train::TrainResult> results(c.world_size());
  comm::run_local_ranks(static_cast<int>(c.world_size()), [&](int rank) { results[rank] = train::run_training(c); });
  for (size_t r = 1; r < results.size(); ++r) EXPECT_EQ(results[r].losses, results[0].losses) << "rank " << r;
  return results[0];
}

// Rank 0's collectives during step `step` of a run of `c` on every rank (as threads).
inline std::vector<comm::CollectiveRecord> collectives_of_step(const train::TrainConfig& c, int64_t step) {
  std::vector<comm::CollectiveRecord> out;
  comm::run_local_ranks(static_cast<int>(c.world_size()), [&](int rank) {
    train::TrainHooks hooks;
    hooks.before_step = [&, rank](train::Training&, int64_t s) {
      if (rank != 0) return;
      auto& log = comm::current_world()->collective_log();
      if (s == step) log.clear(), log.enable();
      if (s != step + 1) return;
      log.enable(false);
      out = log.records();
    };
    train::run_training(c, hooks);
  });
  return out;
}

// A finished run and the directory of its checkpoints.
struct Reference {
  train::TrainResult result;
  std::string dir;
};

// The run of config(dir) for `key`, made once per test binary and shared by every layout
// that compares with it; its directory is fresh(prefix + "_" + a running number).
inline const Reference& cached_reference(const std::string& key, const std::string& prefix,
                                         const std::function<std::string(const std::string&)>& fresh,
                                         const std::function<train::TrainConfig(const std::string&)>& config) {
  static std::map<std::string, Reference> cache;
  auto it = cache.find(prefix + " " + key);
  if (it != cache.end()) return it->second;
  Reference r;
  r.dir = fresh(prefix + "_" + std::to_string(cache.size()));
  r.result = run_on_all_ranks(config(r.dir));
  return cache.emplace(prefix + " " + key, std::move(r)).first->second;
}

// got[k] against want[offset + k], relative `rtol`.
inline void expect_close_losses(const std::vector<double>& got, const std::vector<double>& want, double rtol,
                                const std::string& where, size_t offset = 0) {
  ASSERT_EQ(got.size() + offset, want.size()) << where;
  for (size_t k = 0; k < got.size(); ++k)
    EXPECT_NEAR(got[k], want[offset + k], rtol * std::abs(want[offset + k])) << where << ", step " << offset + k;
}

// Every model parameter of checkpoint `a` against `b`; returns how many were compared.
inline int expect_close_params(const std::string& a, const std::string& b, double rtol, double atol,
                               const std::string& where) {
  int n = 0;
  const auto mb = checkpoint::read_metadata(b);
  for (const auto& [name, _] : checkpoint::read_metadata(a).tensors) {
    if (name.rfind("model.", 0) != 0) continue;
    EXPECT_TRUE(mb.tensors.count(name)) << where << ": " << name << " missing";
    if (!mb.tensors.count(name)) continue;
    at::Tensor x = checkpoint::read_tensor(a, name), y = checkpoint::read_tensor(b, name);
    EXPECT_TRUE(at::allclose(x, y, rtol, atol)) << where << ": " << name << " differs by "
                                                << (x - y).abs().max().item<double>();
    ++n;
  }
  return n;
}

}  // namespace hp::testing
