// Shared by the checkpoint tests: fresh directories and tensors with known values.
#pragma once

#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

namespace hp::testing {

// An empty directory unique to this test process and call.
inline std::string fresh_dir(const std::string& tag) {
  static std::atomic<int> n{0};
  auto dir = std::filesystem::path(::testing::TempDir()) /
             ("hp_ckpt_" + tag + "_" + std::to_string(::getpid()) + "_" + std::to_string(n++));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

// A global tensor whose every element differs: base + its row-major index.
inline at::Tensor numbered(std::vector<int64_t> shape, double base, at::ScalarType dtype = at::kFloat) {
  int64_t n = 1;
  for (auto s : shape) n *= s;
  return (at::arange(n, at::kDouble) + base).reshape(shape).to(dtype);
}

// Changes one bit of the byte at `at` of the file at `path`.
inline void flip_byte(const std::string& path, int64_t at) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(at);
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x10);
  f.seekp(at);
  f.write(&c, 1);
}

// Rank 0's tensors, after checking that every rank's are the same, bitwise (a replicated
// tensor that differs on one rank would not show in rank 0's gathered copies).
inline std::map<std::string, at::Tensor> same_on_every_rank(const std::vector<std::map<std::string, at::Tensor>>& per_rank) {
  for (size_t r = 1; r < per_rank.size(); ++r) {
    EXPECT_EQ(per_rank[r].size(), per_rank[0].size()) << "rank " << r;
    for (const auto& [name, t] : per_rank[0])
      EXPECT_TRUE(per_rank[r].count(name) && at::equal(per_rank[r].at(name), t)) << "rank " << r << ": " << name;
  }
  return per_rank.at(0);
}

}  // namespace hp::testing
