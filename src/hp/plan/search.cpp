#include "hp/plan/search.h"

#include <algorithm>
#include <chrono>

#include "hp/base/error.h"

namespace hp::plan {

namespace {

std::vector<int64_t> divisors(int64_t n) {
  std::vector<int64_t> d;
  for (int64_t i = 1; i * i <= n; ++i)
    if (n % i == 0) {
      d.push_back(i);
      if (i != n / i) d.push_back(n / i);
    }
  std::sort(d.begin(), d.end());
  return d;
}

bool faster(const Estimate& a, const Estimate& b) {
  if (a.time.total != b.time.total) return a.time.total < b.time.total;
  return to_string(a.strategy) < to_string(b.strategy);  // deterministic ties
}

struct Variant {
  std::string schedule;
  int64_t vpp;
};

}  // namespace

SearchResult search(Estimator& est, const SearchOptions& o) {
  const auto start = std::chrono::steady_clock::now();
  const ModelDesc& m = est.model();
  const int64_t n = o.devices > 0 ? o.devices : est.cluster().num_devices();
  HP_CHECK(n <= est.cluster().num_devices()) << "search: " << n << " devices requested, topology '"
                                             << est.cluster().name << "' has " << est.cluster().num_devices();
  HP_CHECK(o.global_batch >= 1 && o.top >= 1) << "search: expected global_batch >= 1 and top >= 1, found "
                                              << o.global_batch << " and " << o.top;
  const double usable = est.usable_memory();
  SearchResult res;
  std::vector<Estimate>& best = res.best;  // a max-heap on time, at most `top` entries
  auto heap_less = [](const Estimate& a, const Estimate& b) { return faster(a, b); };
  // full_chunked where there are dense MLPs to chunk: it fits where full does not, for a
  // little more time.
  std::vector<Recompute> recomputes{Recompute::None, Recompute::Selective, Recompute::Full};
  if (!m.is_moe() || m.dense_layers > 0) recomputes.push_back(Recompute::FullChunked);

  for (int64_t tp : divisors(n)) {
    if (m.heads % tp || m.ffn % tp || (m.kv_heads % tp && tp % m.kv_heads)) continue;
    if (m.is_moe() && m.moe_ffn % tp) continue;
    for (int64_t cp : divisors(n / tp)) {
      if (m.seq_len % cp || (m.seq_len / cp) % tp) continue;
      for (int64_t ep : divisors(n / tp / cp)) {
        if (m.is_moe() ? m.experts % ep != 0 : ep != 1) continue;
        for (int64_t pp : divisors(n / tp / cp / ep)) {
          if (pp > m.layers) continue;
          const int64_t dp = n / tp / cp / ep / pp;
          if (o.global_batch % (dp * ep)) continue;
          const int64_t per_replica = o.global_batch / (dp * ep);
          res.meshes++;

          Strategy base;
          base.dp = dp, base.tp = tp, base.pp = pp, base.cp = cp, base.ep = ep;
          base.global_batch = o.global_batch;
          // Lower bound: fully sharded states alone, no activations.
          {
            Strategy lb = base;
            lb.zero = 3, lb.micro_batch = 1, lb.microbatches = per_replica, lb.recompute = Recompute::Full;
            MemoryBreakdown mem = est.memory(lb);
            if (mem.params + mem.grads + mem.optimizer > usable) continue;
          }
          std::vector<Variant> variants;
          if (pp == 1) {
            variants.push_back({"1f1b", 1});
          } else {
            for (const auto& sch : o.schedules) {
              if (sch == "interleaved-1f1b") {
                for (int64_t v : o.interleave)
                  if (pp * v <= m.layers) variants.push_back({sch, v});
              } else if (uses_v_placement(sch)) {
                if (pp * 2 <= m.layers) variants.push_back({sch, 2});
              } else {
                variants.push_back({sch, 1});
              }
            }
          }
          for (int64_t zero : o.zero_stages)
            for (const Variant& var : variants)
              for (int64_t mbs : o.micro_batch_sizes) {
                if (per_replica % mbs) continue;
                const int64_t mb = per_replica / mbs;
                if (pp > 1 && var.schedule == "interleaved-1f1b" && mb % pp) continue;
                if (pp > 1 && var.schedule == "zb-h1" && mb < pp) continue;
                if (pp > 1 && uses_v_placement(var.schedule) && mb < 2 * pp) continue;
                for (Recompute rc : recomputes) {
                  Strategy s = base;
                  s.zero = zero;
                  s.schedule = var.schedule;
                  s.virtual_stages = var.vpp;
                  s.micro_batch = mbs;
                  s.microbatches = mb;
                  s.recompute = rc;
                  try {
                    s = resolve_strategy(s, m, n);
                  } catch (const Error&) {
                    break;  // the checks above mirror resolve_strategy; anything left is invalid for all rc
                  }
                  res.candidates++;
                  if (est.memory(s).total() > usable) continue;
                  res.fitting++;
                  Estimate e = est.estimate(s);
                  // The cp attention mode changes the time, not the memory: keep the fastest.
                  for (const std::string& mode : o.cp_modes) {
                    if (cp == 1 || mode == s.cp_mode || (mode == "ulysses" && (m.heads / tp) % cp)) continue;
                    Strategy alt = s;
                    alt.cp_mode = mode;
                    Estimate f = est.estimate(alt);
                    if (faster(f, e)) e = std::move(f);
                  }
                  if (int(best.size()) < o.top) {
                    best.push_back(std::move(e));
                    std::push_heap(best.begin(), best.end(), heap_less);
                  } else if (faster(e, best.front())) {
                    std::pop_heap(best.begin(), best.end(), heap_less);
                    best.back() = std::move(e);
                    std::push_heap(best.begin(), best.end(), heap_less);
                  }
                  break;  // heavier recompute only adds time
                }
              }
        }
      }
    }
  }
  std::sort(best.begin(), best.end(), faster);
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return res;
}

}  // namespace hp::plan
