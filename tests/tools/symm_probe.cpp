// A program for the shared-memory tests under hprun (ranks as processes, one host):
//   symm_probe collectives   every shared-memory collective over 1 MiB or more, with buffers
//                            private on every rank, in the heap on every rank, and mixed
//                            (in the heap on even ranks only), inputs and outputs, checked
//                            against a reference; prints "symm ok: <n> checks"
//   symm_probe mismatch      the last rank passes other sizes, then another root: every rank
//                            prints "mismatch: <error>" for each, then "in step" once a
//                            matching call works again
//   symm_probe kill R L      rank R is killed (SIGKILL) while it waits in a shared-memory
//                            barrier for rank L, which comes late; the others print
//                            "error: <error>" and wait to be stopped (SIGTERM is blocked, so
//                            that they outlive the launcher's first stop and find out alone)
#include <signal.h>
#include <unistd.h>

#include <ATen/ATen.h>

#include <chrono>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <numeric>
#include <string>
#include <thread>

#include "comm/rank_data.h"
#include "hp/base/error.h"
#include "hp/comm.h"
#include "hp/comm/symm/collectives.h"
#include "hp/comm/symm/symm.h"

using namespace hp;
using namespace hp::comm;

namespace {

constexpr int64_t kNumel = 300001;  // 1.2 MB of float32: many steps, uneven slices

enum class Where { Private, Heap, Mixed };
const char* name(Where w) { return w == Where::Private ? "private" : w == Where::Heap ? "heap" : "mixed"; }

// `t` where `w` puts it on this rank: in g's symmetric heap where every rank has the same
// size, else in this rank's local region of it, or private memory.
at::Tensor place(const at::Tensor& t, Where w, const Group& g, bool same_size_everywhere) {
  if (w == Where::Private || (w == Where::Mixed && g.rank() % 2 == 1)) return t.clone();
  at::Tensor s = w == Where::Heap && same_size_everywhere ? symm::empty(t.sizes(), t.scalar_type(), g)
                                                          : symm::try_local_empty(t.numel(), t.scalar_type(), g);
  HP_CHECK(s.defined()) << "no room in the heap for " << t.numel() << " elements";
  return s.view(t.sizes()).copy_(t);
}

int checks = 0;
void expect(bool ok, const std::string& what) {
  HP_CHECK(ok) << what << ": wrong result";
  ++checks;
}

void collectives(const Group& g) {
  const int n = g.size(), rank = g.rank();
  at::Tensor sum = at::zeros({kNumel}, at::kDouble);
  for (int r = 0; r < n; ++r) sum += rank_input(r, {kNumel}, at::kFloat).to(at::kDouble);
  const at::Tensor want_sum = sum.to(at::kFloat);
  symm::Heap& h = *symm::group_heap(g);
  for (Where w : {Where::Private, Where::Heap, Where::Mixed}) {
    const std::string where = std::string(", ") + name(w);
    const at::Tensor x = rank_input(rank, {kNumel}, at::kFloat);
    for (const char* staging : {"0", "1"}) {  // private tensors through the windows, or staged
      ::setenv("HP_SHM_STAGING", staging, 1);
      at::Tensor t = place(x, w, g, true);
      all_reduce_(t, g);
      expect(at::equal(t, want_sum), std::string("all_reduce, staging ") + staging + where);
    }
    ::unsetenv("HP_SHM_STAGING");

    const auto parts = chunk_sizes(kNumel, n);
    const int64_t mine_at = std::accumulate(parts.begin(), parts.begin() + rank, int64_t{0});
    expect(at::equal(reduce_scatter(place(x, w, g, true), g), want_sum.narrow(0, mine_at, parts[rank])),
           "reduce_scatter" + where);

    // all_gather, uneven, into hp's output and into an output placed like the input.
    std::vector<int64_t> sizes(n);
    std::vector<size_t> bytes(n);
    for (int r = 0; r < n; ++r) sizes[r] = kNumel / n - 16 * r, bytes[r] = sizes[r] * sizeof(float);
    std::vector<at::Tensor> want_parts;
    for (int r = 0; r < n; ++r) want_parts.push_back(rank_input(r, {sizes[r]}, at::kFloat));
    const at::Tensor want_gathered = at::cat(want_parts);
    at::Tensor part = place(rank_input(rank, {sizes[rank]}, at::kFloat), w, g, false);
    expect(at::equal(all_gather(part, g, 0, sizes), want_gathered), "all_gather" + where);
    at::Tensor out = place(at::zeros({want_gathered.numel()}), w, g, true);
    symm::all_gather(h, part.data_ptr(), bytes, out.data_ptr());
    expect(at::equal(out, want_gathered), "all_gather into a placed output" + where);

    // all_to_all, uneven: rank r sends (r + s + 1) * 40000 elements to rank s.
    std::vector<int64_t> send(n), recv(n);
    for (int s = 0; s < n; ++s) send[s] = (rank + s + 1) * 40000, recv[s] = (s + rank + 1) * 40000;
    const int64_t sent = std::accumulate(send.begin(), send.end(), int64_t{0});
    const int64_t got = std::accumulate(recv.begin(), recv.end(), int64_t{0});
    std::vector<at::Tensor> want_pieces;
    for (int s = 0; s < n; ++s) {
      int64_t from = 0;  // where rank s's piece for this rank starts in its input
      for (int d = 0; d < rank; ++d) from += (s + d + 1) * 40000;
      want_pieces.push_back(rank_input(s, {from + recv[s]}, at::kFloat).narrow(0, from, recv[s]));
    }
    at::Tensor a2a_in = place(rank_input(rank, {sent}, at::kFloat), w, g, false);
    at::Tensor a2a_out = place(at::zeros({got}), w, g, false);
    all_to_all_single_async(a2a_out, a2a_in, g, recv, send).wait();
    expect(at::equal(a2a_out, at::cat(want_pieces)), "all_to_all" + where);

    for (int root = 0; root < n; ++root) {
      at::Tensor b = place(x, w, g, true);
      broadcast_(b, g, root);
      expect(at::equal(b, rank_input(root, {kNumel}, at::kFloat)), "broadcast from " + std::to_string(root) + where);
    }
  }
  std::cout << "symm ok: " << checks << " checks, single copy " << (h.single_copy() ? "on" : "off") << std::endl;
}

// Every rank reports the error each mismatch gives it; then a matching call works.
void mismatch(const Group& g) {
  const int n = g.size(), rank = g.rank();
  const bool odd = rank == n - 1;
  auto report = [&](const std::function<void()>& call) {
    try {
      call();
      std::cout << "no error" << std::endl;
    } catch (const hp::Error& e) {
      std::cout << "mismatch: " << e.what() << std::endl;
    }
  };
  std::vector<int64_t> sizes = chunk_sizes(kNumel, n);
  if (odd) sizes[0] += 16, sizes[n - 1] -= 16;
  report([&] { reduce_scatter(at::ones({kNumel}), g, 0, ReduceOp::Sum, sizes); });
  report([&] { broadcast_(at::ones({1000}), g, odd ? 1 : 0); });
  at::Tensor t = at::ones({kNumel});
  all_reduce_(t, g);
  HP_CHECK(at::equal(t, at::full({kNumel}, float(n)))) << "the all_reduce after the mismatches";
  std::cout << "in step" << std::endl;
}

void kill_in_barrier(const Group& g, int victim, int late) {
  all_reduce_(at::ones({kNumel}), g);  // the heap is up on every rank
  if (g.rank() == victim)
    std::thread([] {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      ::raise(SIGKILL);
    }).detach();
  if (g.rank() == late) std::this_thread::sleep_for(std::chrono::milliseconds(1000));
  try {
    symm::barrier(g);  // the victim dies in here; the others find out here or in the next call
    at::Tensor t = at::ones({kNumel});
    all_reduce_(t, g);
    std::cout << "no error" << std::endl;
  } catch (const hp::Error& e) {
    std::cout << "error: " << e.what() << std::endl;
  }
  for (;;) ::pause();  // until the launcher kills us: a peer must not find this rank gone
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "collectives";
  if (mode == "kill") {  // before any thread starts, so that all inherit it
    sigset_t term;
    sigemptyset(&term);
    sigaddset(&term, SIGTERM);
    ::pthread_sigmask(SIG_BLOCK, &term, nullptr);
  }
  try {
    auto world = init_distributed();
    auto g = world->world_group();
    HP_CHECK(symm::shm_collectives_enabled(*g)) << "shared-memory collectives are off for " << g->describe();
    if (mode == "collectives") collectives(*g);
    else if (mode == "mismatch") mismatch(*g);
    else if (mode == "kill" && argc > 3) kill_in_barrier(*g, std::atoi(argv[2]), std::atoi(argv[3]));
    else HP_FAIL() << "unknown mode " << mode;
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << std::endl;
    return 1;
  }
}
