// The symmetric heap (put/get/signal/barrier) and the shared-memory collectives beyond
// what collectives_test covers: messages split over many chunks, the large all-reduce
// path, bit-exact determinism, contention, and a peer that never arrives.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <dirent.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <sys/uio.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <thread>

#include "hp/base/error.h"
#include "hp/comm.h"
#include "hp/comm/symm/collectives.h"
#include "hp/comm/symm/stream_copy.h"
#include "hp/comm/symm/symm.h"
#include "rank_data.h"
#include "scoped_env.h"

using namespace hp;
using namespace hp::comm;

namespace {

// Whether this process may read memory by process_vm_readv (a seccomp profile may forbid
// it): then the ranks, threads of this process, must take the single-copy path when asked.
bool cross_memory_reads_work() {
  int64_t word = 42, got = 0;
  iovec local{&got, sizeof got}, remote{&word, sizeof word};
  return ::process_vm_readv(::getpid(), &local, 1, &remote, 1, 0) == static_cast<ssize_t>(sizeof got) && got == 42;
}

// This process's segments (tests that run alongside use other prefixes).
std::string test_prefix() { return "/hp-" + std::to_string(::getuid()) + "-test" + std::to_string(::getpid()); }

// A copy of `t` in g's heap where only some ranks make one, or of sizes that differ: in
// this rank's local region (hp::symm::empty is collective, every rank the same size).
at::Tensor local_copy(const at::Tensor& t, const Group& g) {
  at::Tensor s = symm::try_local_empty(t.numel(), t.scalar_type(), g);
  HP_CHECK(s.defined()) << "no room in the local region for " << t.numel() << " elements";
  return s.view(t.sizes()).copy_(t);
}

// The error every rank gets when ranks' calls differ.
constexpr const char* kCallsDiffer = "the ranks' calls differ";

std::vector<std::string> our_segments() {
  const std::string prefix = test_prefix().substr(1) + "-";
  std::vector<std::string> found;
  if (DIR* d = ::opendir("/dev/shm")) {
    while (dirent* e = ::readdir(d))
      if (std::string(e->d_name).rfind(prefix, 0) == 0) found.push_back(e->d_name);
    ::closedir(d);
  }
  return found;
}

TEST(SymmHeap, PutSignalGetOneToFourRanks) {
  for (int world : {1, 2, 3, 4}) {
    run_local_ranks(world, [&](int rank) {
      auto g = current_world()->world_group();
      constexpr int64_t K = 1000;
      at::Tensor box = symm::empty({world, K}, at::kFloat, *g);
      EXPECT_TRUE(symm::is_symmetric(box));
      box.fill_(-1);
      symm::barrier(*g);  // nobody writes into a box before its owner has cleared it
      for (int round = 1; round <= 3; ++round) {
        at::Tensor mine = rank_input(rank, {K}, at::kFloat, round);
        for (int peer = 0; peer < world; ++peer) {
          symm::put(box, mine, peer, rank * K);
          symm::signal(*g, peer, /*slot=*/0, 1, symm::SignalOp::Add);
        }
        // Every rank's add arrives (the same word, from all ranks at once), and with it its data.
        symm::wait_signal(*g, 0, static_cast<uint64_t>(round * world));
        for (int r = 0; r < world; ++r)
          ASSERT_TRUE(at::equal(box[r], rank_input(r, {K}, at::kFloat, round))) << "round " << round << " from " << r;
        symm::barrier(*g);  // all have read before anyone writes the next round
      }
      // get: the next rank's box, a range of it.
      const int next = (rank + 1) % world;
      at::Tensor got = at::empty({K / 2}, at::kFloat);
      symm::get(got, box, next, 7);
      at::Tensor want = symm::peer_view(box, next).view({-1}).narrow(0, 7, K / 2);
      EXPECT_TRUE(at::equal(got, want));
    });
  }
}

TEST(SymmHeap, ContendedAddsAndSetsAreNeverLost) {
  run_local_ranks(4, [&](int rank) {
    auto g = current_world()->world_group();
    constexpr int kAdds = 2000;
    for (int i = 0; i < kAdds; ++i) symm::signal(*g, 0, /*slot=*/1, 1, symm::SignalOp::Add);
    if (rank == 0) EXPECT_EQ(symm::wait_signal(*g, 1, 4 * kAdds), uint64_t{4 * kAdds});
    // Set hands a value over: a ping-pong of increasing values around the ring.
    const int n = g->size(), next = (rank + 1) % n;
    for (uint64_t v = 1; v <= 50; ++v) {
      if (rank == 0) symm::signal(*g, next, 2, v);
      EXPECT_GE(symm::wait_signal(*g, 2, v), v);
      if (rank != 0) symm::signal(*g, next, 2, v);
    }
    symm::barrier(*g);
  });
}

TEST(SymmHeap, AllocationsAreSymmetricAndFreed) {
  run_local_ranks(2, [&](int rank) {
    auto g = current_world()->world_group();
    auto h = symm::group_heap(*g);
    std::vector<size_t> offsets;
    {
      at::Tensor a = symm::empty({100}, at::kDouble, *g);
      at::Tensor b = symm::empty({3, 5}, at::kHalf, *g);
      offsets = {size_t(static_cast<char*>(a.data_ptr()) - h->user(rank)),
                 size_t(static_cast<char*>(b.data_ptr()) - h->user(rank))};
    }
    // Both freed: the next allocation starts where the first did.
    at::Tensor c = symm::empty({10}, at::kFloat, *g);
    EXPECT_EQ(size_t(static_cast<char*>(c.data_ptr()) - h->user(rank)), offsets[0]);
    EXPECT_THROW(symm::empty({int64_t(h->user_bytes())}, at::kFloat, *g), hp::Error);
    EXPECT_THROW(symm::put(c, at::ones({11}), 0), hp::Error);          // past the end
    EXPECT_THROW(symm::put(at::ones({4}), at::ones({4}), 0), hp::Error);  // not symmetric
    EXPECT_THROW(symm::signal(*g, 5, 0, 1), hp::Error);
  });
}

// try_empty: where one rank has no room, every rank gets nothing (and keeps nothing);
// with room everywhere, a symmetric tensor whose pages are already backed.
TEST(SymmHeap, TryEmptyAgreesWhenOneRankHasNoRoom) {
  ScopedEnv small("HP_SYMM_HEAP_MIB", "2");
  run_local_ranks(2, [&](int rank) {
    auto g = current_world()->world_group();
    auto h = symm::group_heap(*g);
    const size_t hog = rank == 1 ? h->allocate(size_t(3) << 19) : 0;  // 1.5 MiB on rank 1 only
    EXPECT_FALSE(symm::try_empty({1 << 18}, at::kFloat, *g).defined()) << "rank " << rank;
    if (rank == 1) h->release(hog);
    at::Tensor t = symm::try_empty({1 << 18}, at::kFloat, *g);
    ASSERT_TRUE(t.defined()) << "rank " << rank;
    EXPECT_TRUE(symm::is_symmetric(t));
    t.fill_(float(rank + 1));
    all_reduce_(t, *g);
    EXPECT_TRUE(at::equal(t, at::full({1 << 18}, 3.0f)));
  });
}

// Every collective over messages that take many steps (256 KiB each).
// Large copies write with non-temporal stores: every byte lands, whatever the alignment
// of either end, and nothing around the destination is touched.
TEST(SymmCopy, LargeCopiesAreExactAtEveryAlignment) {
  const size_t big = symm::kStreamBytes;
  std::vector<unsigned char> src(big + 256), dst(big + 256);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(i * 131 + i / 4096);
  for (size_t bytes : {big - 1, big, big + 1, big + 63, big + 100})
    for (size_t from : {0, 1, 17, 64})
      for (size_t to : {0, 3, 32, 63}) {
        std::fill(dst.begin(), dst.end(), 0xEE);
        symm::copy_large(dst.data() + to, src.data() + from, bytes);
        ASSERT_EQ(std::memcmp(dst.data() + to, src.data() + from, bytes), 0) << bytes << " bytes, " << from << " -> " << to;
        for (size_t i = 0; i < to; ++i) ASSERT_EQ(dst[i], 0xEE) << "before the destination";
        for (size_t i = to + bytes; i < dst.size(); ++i) ASSERT_EQ(dst[i], 0xEE) << "after the destination";
      }
}

TEST(ShmCollectives, ManyChunksAllDtypes) {
  ScopedEnv small("HP_SHM_STEP_KIB", "256");
  for (int world : {2, 3, 4}) {
    run_local_ranks(world, [&](int rank) {
      auto g = current_world()->world_group();
      for (auto dtype : {at::kFloat, at::kBFloat16, at::kInt}) {
        const int64_t rows = 320 * 1024 / 3 + 1;  // ~1.3 MiB of float32, uneven over ranks
        at::Tensor x = rank_input(rank, {rows, 3}, dtype);
        at::Tensor want = at::zeros({rows, 3}, at::kDouble);
        for (int r = 0; r < world; ++r) want += rank_input(r, {rows, 3}, dtype).to(at::kDouble);
        at::Tensor sum = all_reduce(x, *g);
        ASSERT_TRUE(at::equal(sum, want.to(dtype))) << "all_reduce " << dtype;

        auto sizes = chunk_sizes(rows, world);
        int64_t off = 0;
        for (int r = 0; r < rank; ++r) off += sizes[r];
        at::Tensor rs = reduce_scatter(x, *g);
        ASSERT_TRUE(at::equal(rs, want.to(dtype).narrow(0, off, sizes[rank]))) << "reduce_scatter " << dtype;

        at::Tensor gathered = all_gather(rs, *g, 0, sizes);
        ASSERT_TRUE(at::equal(gathered, want.to(dtype))) << "all_gather " << dtype;

        at::Tensor b = x.clone();
        broadcast_(b, *g, world - 1);
        ASSERT_TRUE(at::equal(b, rank_input(world - 1, {rows, 3}, dtype))) << "broadcast " << dtype;

        // Uneven all-to-all: rank r sends (r + s + 1) * 20000 rows to rank s.
        std::vector<int64_t> send(world), recv(world);
        for (int s = 0; s < world; ++s) send[s] = (rank + s + 1) * 20000, recv[s] = (s + rank + 1) * 20000;
        int64_t total = 0;
        for (auto v : send) total += v;
        at::Tensor in = rank_input(rank, {total}, dtype);
        at::Tensor out = at::empty({std::accumulate(recv.begin(), recv.end(), int64_t{0})}, in.options());
        all_to_all_single_async(out, in, *g, recv, send).wait();
        int64_t at_out = 0;
        for (int s = 0; s < world; ++s) {
          int64_t from = 0;
          for (int d = 0; d < rank; ++d) from += (s + d + 1) * 20000;
          ASSERT_TRUE(at::equal(out.narrow(0, at_out, recv[s]),
                                rank_input(s, {from + recv[s]}, dtype).narrow(0, from, recv[s])))
              << "all_to_all from " << s << " " << dtype;
          at_out += recv[s];
        }
      }
    });
  }
}

// All-to-all reads pieces of 64 KiB and more once, straight from the sender's buffer, where
// the kernel lets ranks read each other (cross_memory.h), else through the windows: both
// give every rank its pieces, and HP_SHM_SINGLE_COPY=0 chooses the windows.
TEST(ShmCollectives, AllToAllSingleCopyAndWindowsAgree) {
  const int world = 3;
  for (const bool single : {true, false}) {
    ScopedEnv env("HP_SHM_SINGLE_COPY", single ? "1" : "0");
    std::vector<int> used(world, -1);
    run_local_ranks(world, [&](int rank) {
      auto g = current_world()->world_group();
      for (const int64_t unit : {int64_t{10}, int64_t{30000}}) {  // below and above 64 KiB a piece
        std::vector<int64_t> send(world), recv(world);
        for (int s = 0; s < world; ++s) send[s] = (rank + s + 1) * unit, recv[s] = (s + rank + 1) * unit;
        at::Tensor in = rank_input(rank, {std::accumulate(send.begin(), send.end(), int64_t{0})}, at::kFloat);
        at::Tensor out = at::empty({std::accumulate(recv.begin(), recv.end(), int64_t{0})}, in.options());
        all_to_all_single_async(out, in, *g, recv, send).wait();
        int64_t at_out = 0;
        for (int s = 0; s < world; ++s) {
          int64_t from = 0;
          for (int d = 0; d < rank; ++d) from += (s + d + 1) * unit;
          ASSERT_TRUE(at::equal(out.narrow(0, at_out, recv[s]),
                                rank_input(s, {from + recv[s]}, at::kFloat).narrow(0, from, recv[s])))
              << "from " << s << ", pieces of " << unit << " floats, single copy " << single;
          at_out += recv[s];
        }
      }
      used[rank] = symm::group_heap(*g)->single_copy();
    });
    for (int r = 0; r < world; ++r) EXPECT_EQ(used[r], used[0]) << "ranks disagree on the path";
    if (!single) EXPECT_EQ(used[0], 0) << "HP_SHM_SINGLE_COPY=0 must keep to the windows";
    if (single) EXPECT_EQ(used[0], int(cross_memory_reads_work())) << "single copy asked for and possible, not taken";
    std::printf("HP_SHM_SINGLE_COPY=%d: single copy %s\n", int(single), used[0] ? "used" : "not used");
  }
}

// Same bits whatever the timing: the sum of random floats equals the fold in rank order,
// on the one-shot and the sliced paths, for float32 and bfloat16 (folded in float32).
TEST(ShmCollectives, ReductionOrderIsFixed) {
  ScopedEnv small("HP_SHM_STEP_KIB", "256");
  const int world = 4;
  for (int64_t numel : {int64_t{1000}, int64_t{300000}}) {
    for (auto dtype : {at::kFloat, at::kBFloat16}) {
      std::vector<at::Tensor> inputs;
      for (int r = 0; r < world; ++r) inputs.push_back(at::randn({numel}, at::kFloat).mul_(1e3).to(dtype));
      at::Tensor fold = inputs[0].to(at::kFloat);
      for (int r = 1; r < world; ++r) fold = fold + inputs[r].to(at::kFloat);
      at::Tensor want = fold.to(dtype);
      for (int trial = 0; trial < 2; ++trial) {
        run_local_ranks(world, [&](int rank) {
          auto g = current_world()->world_group();
          if (rank == trial) std::this_thread::sleep_for(std::chrono::milliseconds(20));  // skew the timing
          at::Tensor got = all_reduce(inputs[rank], *g);
          ASSERT_TRUE(at::equal(got, want)) << numel << " " << dtype << " rank " << rank;
        });
      }
    }
  }
}

// Avg is the rank-order sum divided by the world size, bit for bit: a power-of-two world
// multiplies by the exact inverse instead, which must not change a bit.
TEST(ShmCollectives, AverageIsTheSumDividedByTheWorld) {
  ScopedEnv small("HP_SHM_STEP_KIB", "256");
  for (int world : {3, 4}) {
    for (auto dtype : {at::kFloat, at::kDouble}) {
      std::vector<at::Tensor> inputs;
      for (int r = 0; r < world; ++r) inputs.push_back(at::randn({200003}, dtype).mul_(1e3));
      at::Tensor sum = inputs[0].clone();
      for (int r = 1; r < world; ++r) sum = sum + inputs[r];
      at::Tensor want = sum / static_cast<double>(world);
      run_local_ranks(world, [&](int rank) {
        auto g = current_world()->world_group();
        for (int64_t numel : {int64_t{1000}, int64_t{200003}}) {  // one-shot and sliced
          at::Tensor got = inputs[rank].narrow(0, 0, numel).clone();
          all_reduce_(got, *g, ReduceOp::Avg);
          ASSERT_TRUE(at::equal(got, want.narrow(0, 0, numel))) << world << " ranks, " << dtype << ", " << numel;
          at::Tensor rs = reduce_scatter(inputs[rank].narrow(0, 0, numel), *g, 0, ReduceOp::Avg);
          const auto sizes = chunk_sizes(numel, world);
          int64_t off = 0;
          for (int r = 0; r < rank; ++r) off += sizes[r];
          ASSERT_TRUE(at::equal(rs, want.narrow(0, off, sizes[rank]))) << "reduce_scatter, " << world << " ranks";
        }
      });
    }
  }
}

// A tensor in the symmetric heap on every rank is all-reduced without staging (peers read
// it in place): the same bits as a private tensor on the windows. A tensor in the heap on
// some ranks only goes through the windows, with the same bits; one of another size on
// one rank is an error on every rank, not a hang.
TEST(ShmCollectives, SymmetricTensorsReduceInPlace) {
  ScopedEnv small("HP_SHM_STEP_KIB", "256");
  for (int world : {2, 3, 4}) {
    run_local_ranks(world, [&](int rank) {
      auto g = current_world()->world_group();
      for (auto dtype : {at::kFloat, at::kBFloat16}) {
        for (auto op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max}) {
          const int64_t numel = 300001;  // above the one-shot size, several steps, uneven slices
          at::Tensor want = rank_input(rank, {numel}, dtype);
          at::Tensor sym = symm::empty({numel}, dtype, *g);
          at::Tensor mixed = rank == 1 ? local_copy(want, *g) : want.clone();
          sym.copy_(want);
          mixed.copy_(want);
          all_reduce_(want, *g, op);
          all_reduce_(sym, *g, op);
          all_reduce_(mixed, *g, op);
          ASSERT_TRUE(at::equal(sym, want)) << world << " ranks, " << dtype << ", op " << int(op);
          ASSERT_TRUE(at::equal(mixed, want)) << "in the heap on rank 1 only, " << world << " ranks, " << dtype;
        }
      }
    });
  }
  run_local_ranks(2, [&](int rank) {
    auto g = current_world()->world_group();
    for (const bool in_heap : {false, true}) {
      at::Tensor uneven = in_heap ? symm::empty({100001}, at::kFloat, *g).narrow(0, 0, 100000 + rank)
                                  : at::zeros({1000 + rank});
      try {
        all_reduce_(uneven, *g);
        ADD_FAILURE() << "tensors of different sizes must fail";
      } catch (const hp::Error& e) {
        EXPECT_NE(std::string(e.what()).find(kCallsDiffer), std::string::npos) << e.what();
      }
    }
  });
}

// From 4 steps, a private tensor's all-reduce stages the slices its peers fold in the
// heap (HP_SHM_STAGING=1), or takes the windows (0), or whichever rank 0 has timed faster
// (unset: the choice switches now and then); a rank without room sends every rank
// through the windows. All give the rank-order fold, bit for bit, at 2-4 ranks.
TEST(ShmCollectives, LargePrivateTensorsAreStagedInTheHeap) {
  ScopedEnv small("HP_SHM_STEP_KIB", "4");  // may be staged from 16 KiB
  const int64_t numel = 300001;
  for (const char* staging : {"1", "0", ""}) {
    for (int world : {2, 3, 4}) {
      for (const int crowded : {-1, 1}) {  // the rank whose local region is full (-1: none)
        if (*staging) ::setenv("HP_SHM_STAGING", staging, 1);
        else ::unsetenv("HP_SHM_STAGING");
        run_local_ranks(world, [&](int rank) {
          auto g = current_world()->world_group();
          symm::Heap& h = *symm::group_heap(*g);
          at::Tensor hog;
          if (rank == crowded) hog = symm::try_local_empty(int64_t(h.local_bytes()) - (64 << 10), at::kByte, *g);
          const std::string where = std::to_string(world) + " ranks, HP_SHM_STAGING '" + staging + "'" +
                                    (crowded < 0 ? "" : ", rank 1 without room");
          for (auto dtype : {at::kFloat, at::kBFloat16}) {
            at::Tensor sum = rank_input(0, {numel}, dtype).to(at::kFloat), most = sum.clone();
            for (int r = 1; r < world; ++r) {
              at::Tensor x = rank_input(r, {numel}, dtype).to(at::kFloat);
              sum = sum + x;
              most = at::maximum(most, x);
            }
            const std::pair<ReduceOp, at::Tensor> cases[] = {{ReduceOp::Sum, sum.to(dtype)},
                                                             {ReduceOp::Avg, (sum / world).to(dtype)},
                                                             {ReduceOp::Max, most.to(dtype)}};
            for (const auto& [op, want] : cases)
              ASSERT_TRUE(at::equal(all_reduce(rank_input(rank, {numel}, dtype), *g, op), want))
                  << "all_reduce, " << dtype << ", op " << int(op) << ", " << where;
          }
          at::Tensor mine = rank_input(rank, {numel}, at::kFloat), want = rank_input(0, {numel}, at::kFloat);
          for (int r = 1; r < world; ++r) want = want + rank_input(r, {numel}, at::kFloat);
          for (int i = 0; i < 36; ++i) {  // two sizes in turn, each past its 16th call (a switch)
            const int64_t m = i % 2 ? numel : 70001;
            ASSERT_TRUE(at::equal(all_reduce(mine.narrow(0, 0, m), *g), want.narrow(0, 0, m)))
                << "call " << i << ", " << where;
          }
        });
      }
    }
  }
  ::unsetenv("HP_SHM_STAGING");
}

// Buffers in the heap on every rank are read in place (broadcast's copying spread over all
// ranks): the same results as private buffers, for every collective, with uneven and
// empty pieces, at 2-4 ranks, with and without single-copy reads of private memory. A
// buffer private on one rank only falls back to the windows; sizes that disagree are an
// error on every rank.
TEST(ShmCollectives, SymmetricBuffersAreReadInPlace) {
  // Float values unique to each rank and element (exact below 2^24): a piece read from the
  // wrong place shows.
  auto distinct = [](int rank, int64_t numel) { return at::arange(numel, at::kFloat) + 1e6 * (rank + 1); };
  auto in_heap = [](const at::Tensor& t, const Group& g) {
    at::Tensor s = symm::empty(t.sizes(), t.scalar_type(), g);
    return s.copy_(t);
  };
  for (const char* single : {"1", "0"}) {
    ScopedEnv env("HP_SHM_SINGLE_COPY", single);
    for (int world : {2, 3, 4}) {
      run_local_ranks(world, [&](int rank) {
        auto g = current_world()->world_group();
        const int64_t numel = 700001;  // 2.8 MB: uneven shares, streamed copies at 2 ranks
        for (const bool everywhere : {true, false}) {  // false: rank 1's buffers are private
          auto place = [&](const at::Tensor& t) {
            return everywhere ? in_heap(t, *g) : rank != 1 ? local_copy(t, *g) : t.clone();
          };
          const std::string where = std::to_string(world) + " ranks, single copy " + single +
                                    (everywhere ? ", all in the heap" : ", private on rank 1");

          // all_gather, uneven: rank 1 contributes no rows.
          std::vector<int64_t> sizes(world);
          for (int r = 0; r < world; ++r) sizes[r] = r == 1 ? 0 : numel / world + r;
          at::Tensor part = place(distinct(rank, numel)).narrow(0, 0, sizes[rank]);
          std::vector<at::Tensor> want_parts;
          for (int r = 0; r < world; ++r) want_parts.push_back(distinct(r, numel).narrow(0, 0, sizes[r]));
          ASSERT_TRUE(at::equal(all_gather(part, *g, 0, sizes), at::cat(want_parts))) << "all_gather, " << where;

          // reduce_scatter, float32 and bfloat16: the bits of the private path.
          for (auto dtype : {at::kFloat, at::kBFloat16}) {
            at::Tensor x = rank_input(rank, {numel}, dtype);
            ASSERT_TRUE(at::equal(reduce_scatter(place(x), *g), reduce_scatter(x.clone(), *g)))
                << "reduce_scatter, " << dtype << ", " << where;
          }

          // all_to_all with uneven splits, one of them empty.
          std::vector<int64_t> send(world), recv(world);
          for (int s = 0; s < world; ++s)
            send[s] = s == rank ? 0 : (rank + s + 1) * 20000, recv[s] = s == rank ? 0 : (s + rank + 1) * 20000;
          const int64_t sent = std::accumulate(send.begin(), send.end(), int64_t{0});
          at::Tensor out = at::empty({std::accumulate(recv.begin(), recv.end(), int64_t{0})});
          at::Tensor mine = distinct(rank, sent);
          all_to_all_single_async(out, everywhere || rank != 1 ? local_copy(mine, *g) : mine, *g, recv, send).wait();
          for (int s = 0, at_out = 0; s < world; at_out += recv[s], ++s) {
            int64_t from = 0;
            for (int d = 0; d < rank; ++d) from += d == s ? 0 : (s + d + 1) * 20000;
            ASSERT_TRUE(at::equal(out.narrow(0, at_out, recv[s]), distinct(s, from + recv[s]).narrow(0, from, recv[s])))
                << "all_to_all from " << s << ", " << where;
          }

          // broadcast from every root.
          for (int root = 0; root < world; ++root) {
            at::Tensor b = place(distinct(rank, numel));
            broadcast_(b, *g, root);
            ASSERT_TRUE(at::equal(b, distinct(root, numel))) << "broadcast from " << root << ", " << where;
          }
        }
      });
    }
  }
  run_local_ranks(3, [&](int rank) {
    auto g = current_world()->world_group();
    at::Tensor b = symm::empty({100032}, at::kFloat, *g).narrow(0, 0, 100000 + 16 * rank);
    try {
      broadcast_(b, *g, 0);
      ADD_FAILURE() << "tensors of different sizes must fail";
    } catch (const hp::Error& e) {
      EXPECT_NE(std::string(e.what()).find(kCallsDiffer), std::string::npos) << e.what();
    }
  });
  run_local_ranks(3, [&](int rank) {  // rank 2 expects more rows of rank 0 than it has
    auto g = current_world()->world_group();
    at::Tensor part = symm::empty({100000}, at::kFloat, *g);
    std::vector<int64_t> sizes{rank == 2 ? 100016 : 100000, 100000, 100000};
    try {
      all_gather(part, *g, 0, sizes);
      ADD_FAILURE() << "ranks that disagree on the sizes must fail";
    } catch (const hp::Error& e) {
      EXPECT_NE(std::string(e.what()).find(kCallsDiffer), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("group rank 2 made"), std::string::npos) << e.what();
    }
  });
}

// A broadcast whose tensors are not in the heap on every rank moves each byte once: every
// receiver reads the root's tensor (in the heap, or by a cross-memory read) but for one
// share that the root writes into it. Private tensors, the root's only in the heap, and
// the receivers' only, at 2-4 ranks from every root, single copy on and off; sizes that
// are no multiple of a cache line; sizes that differ fail on every rank.
TEST(ShmCollectives, BroadcastSharesTheCopyingWithTheRoot) {
  for (const char* single : {"1", "0"}) {
    ScopedEnv env("HP_SHM_SINGLE_COPY", single);
    for (int world : {2, 3, 4}) {
      run_local_ranks(world, [&](int rank) {
        auto g = current_world()->world_group();
        for (const char* placement : {"private", "root in heap", "receivers in heap"}) {
          for (auto dtype : {at::kFloat, at::kBFloat16}) {
            for (int root = 0; root < world; ++root) {
              const int64_t numel = dtype == at::kFloat ? 700001 : 140001;  // 2.8 MB, 280,002 bytes
              const std::string where = placement;
              const bool in_heap = (where == "root in heap" && rank == root) ||
                                   (where == "receivers in heap" && rank != root);
              at::Tensor b = rank_input(rank, {numel}, dtype);
              if (in_heap) b = local_copy(b, *g);
              broadcast_(b, *g, root);
              ASSERT_TRUE(at::equal(b, rank_input(root, {numel}, dtype)))
                  << "broadcast from " << root << ", " << placement << ", " << dtype << ", " << world
                  << " ranks, single copy " << single;
            }
          }
        }
        at::Tensor b = at::zeros({100000 + 16 * rank});
        try {
          broadcast_(b, *g, 0);
          ADD_FAILURE() << "tensors of different sizes must fail";
        } catch (const hp::Error& e) {
          EXPECT_NE(std::string(e.what()).find(kCallsDiffer), std::string::npos) << e.what();
        }
      });
    }
  }
}

// hp::comm's all-gather and all-to-all return outputs in the heap's local region, and a
// sender writes each piece of a private input straight into its receivers' outputs: the
// right pieces at 2-4 ranks, uneven, with single copy on and off. A rank whose local
// region is full gets a private output, and the pieces bound for it take another path:
// with single copy off, the windows, whose first step the other ranks (outputs in the
// heap) left unstaged and stage after the first barrier.
TEST(ShmCollectives, OutputsInTheHeapAreWrittenBySenders) {
  auto distinct = [](int rank, int64_t numel) { return at::arange(numel, at::kFloat) + 1e6 * (rank + 1); };
  for (const char* single : {"1", "0"}) {
    ScopedEnv env("HP_SHM_SINGLE_COPY", single);
    for (int world : {2, 3, 4}) {
      for (const int crowded : {-1, 1}) {  // the rank whose local region is full (-1: none)
        run_local_ranks(world, [&](int rank) {
          auto g = current_world()->world_group();
          symm::Heap& h = *symm::group_heap(*g);
          at::Tensor hog;
          if (rank == crowded) hog = symm::try_local_empty(int64_t(h.local_bytes()) - (64 << 10), at::kByte, *g);
          const std::string where = std::to_string(world) + " ranks, single copy " + single +
                                    (crowded < 0 ? "" : ", rank 1's local region full");
          auto in_local_region = [&](const at::Tensor& t) {
            return h.holds(t.data_ptr(), t.nbytes()) && !symm::is_symmetric(t);
          };

          std::vector<int64_t> sizes(world);
          std::vector<at::Tensor> parts;
          for (int r = 0; r < world; ++r) {
            sizes[r] = 100000 + 16 * r;
            parts.push_back(distinct(r, sizes[r]));
          }
          at::Tensor gathered = all_gather(parts[rank], *g, 0, sizes);
          ASSERT_TRUE(at::equal(gathered, at::cat(parts))) << "all_gather, " << where;
          EXPECT_EQ(in_local_region(gathered), rank != crowded) << "all_gather's output, " << where;

          std::vector<int64_t> send(world), recv(world);
          for (int s = 0; s < world; ++s) send[s] = (rank + s + 1) * 40000, recv[s] = (s + rank + 1) * 40000;
          const int64_t sent = std::accumulate(send.begin(), send.end(), int64_t{0});
          at::Tensor out = all_to_all(distinct(rank, sent), *g, 0, 0, send, recv);
          EXPECT_EQ(in_local_region(out), rank != crowded) << "all_to_all's output, " << where;
          for (int s = 0, at_out = 0; s < world; at_out += recv[s], ++s) {
            int64_t from = 0;
            for (int d = 0; d < rank; ++d) from += (s + d + 1) * 40000;
            ASSERT_TRUE(at::equal(out.narrow(0, at_out, recv[s]), distinct(s, from + recv[s]).narrow(0, from, recv[s])))
                << "all_to_all from " << s << ", " << where;
          }
        });
      }
    }
  }
}

TEST(ShmCollectives, AbsentPeerIsNamedAfterTheTimeout) {
  try {
    run_local_ranks(
        3,
        [&](int rank) {
          auto g = current_world()->world_group();
          all_reduce_(at::ones({4}), *g);  // the heap exists: the next wait is on the peers
          if (rank != 2) all_reduce_(at::ones({4}), *g);
        },
        std::chrono::milliseconds(1500));
    FAIL() << "no error";
  } catch (const hp::Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("all_reduce on group [0, 1, 2]"), std::string::npos) << m;
    EXPECT_NE(m.find("ranks [2] did not arrive"), std::string::npos) << m;
  }
}

TEST(ShmCollectives, SwitchedOffAndSpanningHostsUseGloo) {
  run_local_ranks(2, [&](int rank) {
    auto g = current_world()->world_group();
    EXPECT_TRUE(symm::shm_collectives_enabled(*g));
  });
  // Two nodes of one rank each: a group of both spans hosts.
  World spanning(0, 2, c10::make_intrusive<c10d::HashStore>(), std::chrono::seconds(5), /*loopback=*/false,
                 DistEnv{0, 2, 0, 1, 0});
  EXPECT_FALSE(spanning.on_one_host({0, 1}));
  EXPECT_TRUE(spanning.on_one_host({1}));
}

TEST(ShmCollectives, NoSegmentOutlivesTheGroup) {
  ScopedEnv prefix("HP_SHM_PREFIX", test_prefix().c_str());
  run_local_ranks(3, [&](int rank) {
    auto g = current_world()->world_group();
    auto h = symm::group_heap(*g);
    EXPECT_EQ(h->what(), g->describe());
    all_reduce_(at::ones({4}), *g);
    // Names go as soon as every rank has mapped every segment.
    EXPECT_TRUE(our_segments().empty()) << our_segments().front();
  });
}

}  // namespace
