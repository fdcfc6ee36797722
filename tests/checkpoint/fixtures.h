// Shared by the checkpoint tests: fresh directories and tensors with known values.
#pragma once

#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <string>

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

}  // namespace hp::testing
