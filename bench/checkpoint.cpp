// Checkpoint throughput against plain file I/O of the same bytes, same run, alternating: each rank
// writes its shards (write + fsync, one file per rank) and reads them back (pread), then
// saves and loads them as a checkpoint. And the training stall of an asynchronous save
// (the snapshot) against the time of a synchronous save, with the snapshot taken in save()
// and deferred to the writer thread beside training. Reads are timed from the page
// cache (warm: the files were just written) and after each rank drops its files from it
// (cold).
// Run: hprun --nproc-per-node 4 build/bin/bench_checkpoint [MiB per rank, default 64] [dir]
#include <ATen/ATen.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "hp/checkpoint.h"
#include "hp/tensor.h"
#include "slowest_rank.h"

using namespace hp;
namespace fs = std::filesystem;

namespace {

double seconds_since(std::chrono::steady_clock::time_point s) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - s).count();
}

// Seconds of each op on the slowest rank, each iteration started together; `reset` runs
// untimed before each (removes what the last one wrote). The ops alternate, so baseline
// and candidate see the same machine. Median over iterations.
std::vector<double> timed_alternating(const comm::Group& g, int iters, const std::vector<std::function<void()>>& ops,
                                      const std::vector<std::function<void()>>& resets) {
  const size_t k = ops.size();
  std::vector<double> t;
  for (int i = 0; i < iters; ++i) {
    for (size_t j = 0; j < k; ++j) {
      resets[j]();
      comm::barrier(g);
      auto s = std::chrono::steady_clock::now();
      ops[j]();
      t.push_back(seconds_since(s));
    }
  }
  return slowest_rank_medians(g, t, iters, k);
}

double timed(const comm::Group& g, int iters, const std::function<void()>& op, const std::function<void()>& reset) {
  return timed_alternating(g, iters, {op}, {reset})[0];
}

void plain_write(const std::string& path, const std::vector<DTensor>& ts) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  HP_CHECK(fd >= 0) << "cannot create " << path;
  for (const auto& t : ts) checkpoint::write_all(fd, t.to_local().data_ptr(), t.to_local().nbytes(), path);
  HP_CHECK(::fsync(fd) == 0) << "cannot fsync " << path;
  ::close(fd);
}

void plain_read(const std::string& path, std::vector<DTensor>& ts) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  HP_CHECK(fd >= 0) << "cannot open " << path;
  off_t at = 0;
  for (auto& t : ts) {
    auto* p = static_cast<char*>(t.to_local().data_ptr());
    size_t n = t.to_local().nbytes(), done = 0;
    while (done < n) {
      ssize_t r = ::pread(fd, p + done, n - done, at + static_cast<off_t>(done));
      HP_CHECK(r > 0) << "cannot read " << path;
      done += static_cast<size_t>(r);
    }
    at += static_cast<off_t>(n);
  }
  ::close(fd);
}

void drop_cache(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  HP_CHECK(fd >= 0) << "cannot open " << path;
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

}  // namespace

int main(int argc, char** argv) {
  init_distributed();
  const int64_t mib = argc > 1 ? std::stoll(argv[1]) : 64;
  const std::string root = argc > 2 ? argv[2] : "/tmp/hp_bench_checkpoint";
  auto world = comm::current_world();
  const int n = world->size(), rank = world->rank();
  DeviceMesh mesh = init_device_mesh("cpu", {n}, {"dp"});
  const auto& g = mesh.group(0);
  const bool lead = rank == 0;
  if (lead) {
    fs::remove_all(root);
    fs::create_directories(root);
  }
  comm::barrier(g);

  // 16 float tensors of [rows, 1024], rows sharded: each rank owns `mib` MiB.
  const int64_t tensors = 16, rows = mib * (1 << 20) / 4 / 1024 / tensors * n;
  std::vector<DTensor> ts;
  checkpoint::State state;
  for (int64_t k = 0; k < tensors; ++k) {
    ts.push_back(hp::randn({rows, 1024}, mesh, {Shard(0)}));
    state.add("layer" + std::to_string(k), ts.back());
  }
  const double total = double(rows) * 1024 * 4 * tensors;  // bytes over all ranks
  const std::string plain = root + "/plain-" + std::to_string(rank) + ".bin";
  const int iters = 7;
  auto clear_plain = [&] { fs::remove(plain); };
  auto clear_ckpt = [&] {
    comm::barrier(g);
    if (lead)
      for (auto s : checkpoint::list_steps(root)) fs::remove_all(checkpoint::step_dir(root, s));
    comm::barrier(g);
  };
  auto nothing = [] {};

  checkpoint::Checkpointer sync({root, 0, false});
  int64_t step = 0;
  const auto w = timed_alternating(g, iters, {[&] { plain_write(plain, ts); }, [&] { sync.save(++step, state); }},
                                   {clear_plain, clear_ckpt});
  const double w_plain = w[0], w_ckpt = w[1];
  sync.save(++step, state);
  plain_write(plain, ts);
  auto load = [&] { checkpoint::load(checkpoint::step_dir(root, step), state); };
  const auto r = timed_alternating(g, iters, {[&] { plain_read(plain, ts); }, load}, {nothing, nothing});
  const double r_plain = r[0], r_ckpt = r[1];
  // Cold: each rank drops its files from the page cache first (clean after fsync).
  const std::string mine = checkpoint::step_dir(root, step) + "/rank-" + std::string(5 - std::to_string(rank).size(), '0') +
                           std::to_string(rank) + ".safetensors";
  const auto c = timed_alternating(g, iters, {[&] { plain_read(plain, ts); }, load},
                                   {[&] { drop_cache(plain); }, [&] { drop_cache(mine); }});
  const double c_plain = c[0], c_ckpt = c[1];

  // Asynchronous: how long save() holds training (the snapshot), and the whole write.
  checkpoint::Checkpointer async({root, 0, true});
  const double stall = timed(g, iters, [&] { async.save(++step, state); }, [&] {
    async.wait();
    clear_ckpt();
  });
  const double async_total = timed(g, iters, [&] {
    async.save(++step, state);
    async.wait();
  }, [&] {
    async.wait();
    clear_ckpt();
  });
  // Deferred: the snapshot is copied beside a training step's forward and backward (here
  // matmuls that only read the state, for about as long as a synchronous save), and the
  // optimizer step waits for it. The stall: how much longer such a step takes.
  checkpoint::Checkpointer deferred({root, 0, true, /*defer_snapshot=*/true});
  at::Tensor x = at::randn({256, 256}), y = at::empty({256, 256});
  int64_t matmuls = 0;  // fixed work, so that what the writer takes from it shows as time
  comm::barrier(g);
  for (auto s = std::chrono::steady_clock::now(); seconds_since(s) < w_ckpt; ++matmuls) at::mm_out(y, x, x);
  auto forward_backward = [&] {
    for (int64_t i = 0; i < matmuls; ++i) at::mm_out(y, x, x);
  };
  auto update = [&] {
    for (auto& t : ts) t.to_local().mul_(1.0f);  // in place, as the optimizer
  };
  const double step_alone = timed(g, iters, [&] {
    forward_backward();
    update();
  }, nothing);
  const double step_saving = timed(g, iters, [&] {
    deferred.save(++step, state);
    forward_backward();
    deferred.wait_for_snapshot();
    update();
  }, [&] {
    deferred.wait();
    clear_ckpt();
  });
  const double deferred_call = timed(g, iters, [&] { deferred.save(++step, state); }, [&] {
    deferred.wait();
    clear_ckpt();
  });
  deferred.wait();
  const double step_saving_eager = timed(g, iters, [&] {
    async.save(++step, state);
    forward_backward();
    update();
  }, [&] {
    async.wait();
    clear_ckpt();
  });
  async.wait();
  deferred.wait();
  clear_ckpt();
  if (lead) {
    std::printf("checkpoint bench: %d ranks, %.0f MiB per rank, %s\n", n, total / n / (1 << 20), root.c_str());
    std::printf("save  plain %7.0f MiB/s  checkpoint %7.0f MiB/s  ratio %.2f\n", total / w_plain / (1 << 20),
                total / w_ckpt / (1 << 20), w_plain / w_ckpt);
    std::printf("load  plain %7.0f MiB/s  checkpoint %7.0f MiB/s  ratio %.2f\n", total / r_plain / (1 << 20),
                total / r_ckpt / (1 << 20), r_plain / r_ckpt);
    std::printf("load (cold page cache)  plain %7.0f MiB/s  checkpoint %7.0f MiB/s  ratio %.2f\n",
                total / c_plain / (1 << 20), total / c_ckpt / (1 << 20), c_plain / c_ckpt);
    std::printf("async save stall %.1f ms, sync save %.1f ms: ratio %.3f (async write in the background %.1f ms)\n",
                stall * 1e3, w_ckpt * 1e3, stall / w_ckpt, async_total * 1e3);
    std::printf("deferred snapshot: save() returns in %.2f ms: ratio %.3f\n", deferred_call * 1e3,
                deferred_call / w_ckpt);
    const double deferred_stall = std::max(0.0, step_saving - step_alone);
    const double eager_stall = std::max(0.0, step_saving_eager - step_alone);
    std::printf("a training step of %.1f ms with an async save: snapshot in save() %.1f ms (stall ratio %.3f), "
                "deferred %.1f ms (stall ratio %.3f)\n",
                step_alone * 1e3, step_saving_eager * 1e3, eager_stall / w_ckpt, step_saving * 1e3,
                deferred_stall / w_ckpt);
  }
  comm::barrier(g);
  if (lead) fs::remove_all(root);
  return 0;
}
