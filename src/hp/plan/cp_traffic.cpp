#include "hp/plan/cp_traffic.h"

#include <algorithm>

#include "hp/base/error.h"
#include "hp/base/strings.h"

namespace hp::plan {
namespace {

// The all-to-alls of Ulysses over `ranks`, each rank holding `tokens` of the sequence.
void add_ulysses(std::vector<CpCall>& out, const CpAttentionShape& s, int64_t ranks, double tokens, bool inner) {
  const double per_head = tokens * double(s.head_dim) * s.element_bytes;
  const int64_t kv = s.kv_heads * cp_kv_head_repeats(s.heads, s.kv_heads, ranks);
  out.push_back({"ulysses all_to_all q, out", Collective::AllToAll, inner, double(s.heads) * per_head, 2, 2, false});
  out.push_back({"ulysses all_to_all k, v", Collective::AllToAll, inner, double(kv) * per_head, 2, 2, false});
}

// The ring over `ranks`, each holding `tokens` of the sequence and `kv_heads` K/V heads.
void add_ring(std::vector<CpCall>& out, const CpAttentionShape& s, int64_t ranks, double tokens, double kv_heads) {
  const double kv_block = 2 * kv_heads * tokens * double(s.head_dim) * s.element_bytes;
  const double hops = double(ranks - 1);
  out.push_back({"ring send k, v", Collective::SendRecv, false, kv_block, hops, hops, true});
  out.push_back({"ring send dk, dv", Collective::SendRecv, false, kv_block, 0, double(ranks), true});
}

}  // namespace

const std::vector<std::string>& cp_modes() {
  static const std::vector<std::string> modes = {"ulysses", "ring", "allgather_kv", "hybrid"};
  return modes;
}

int64_t cp_kv_head_repeats(int64_t heads, int64_t kv_heads, int64_t ranks) {
  HP_CHECK(kv_heads > 0 && heads % kv_heads == 0 && heads % ranks == 0)
      << "Ulysses over " << ranks << " ranks needs the " << heads << " query heads divisible by them and by the "
      << kv_heads << " K/V heads";
  const int64_t group = heads / kv_heads;
  int64_t repeat = 1;
  while ((kv_heads * repeat) % ranks != 0 || group % repeat != 0) ++repeat;
  return repeat;
}

std::vector<CpCall> cp_attention_calls(const std::string& mode, const CpAttentionShape& s) {
  HP_CHECK(std::find(cp_modes().begin(), cp_modes().end(), mode) != cp_modes().end())
      << "context parallelism: unknown mode '" << mode << "' (expected " << to_string_list(cp_modes()) << ")";
  std::vector<CpCall> out;
  if (s.cp <= 1) return out;
  const double mine = s.tokens / double(s.cp);
  if (mode == "ulysses") {
    add_ulysses(out, s, s.cp, mine, false);
  } else if (mode == "ring") {
    add_ring(out, s, s.cp, mine, double(s.kv_heads));
  } else if (mode == "allgather_kv") {
    const double kv_block = 2 * double(s.kv_heads) * mine * double(s.head_dim) * s.element_bytes;
    out.push_back({"all_gather k, v", Collective::AllGather, false, kv_block, 1, 1, true});
    out.push_back({"reduce_scatter dk, dv", Collective::ReduceScatter, false, kv_block * double(s.cp), 0, 1, true});
  } else {
    const int64_t u = s.ulysses, ring = s.cp / std::max<int64_t>(u, 1);
    HP_CHECK(u > 1 && s.cp % u == 0)
        << "hybrid context parallelism: Ulysses over " << u << " of the " << s.cp << " cp ranks does not split them";
    add_ulysses(out, s, u, mine, true);
    // After the all-to-all a ring rank holds its whole share and 1/u of the (repeated) K/V heads.
    const double kv = double(s.kv_heads * cp_kv_head_repeats(s.heads, s.kv_heads, u)) / double(u);
    add_ring(out, s, ring, s.tokens / double(ring), kv);
  }
  return out;
}

double cp_bytes_per_rank(const std::vector<CpCall>& calls) {
  double bytes = 0;
  for (const CpCall& c : calls) bytes += c.bytes * (c.forward + c.backward);
  return bytes;
}

}  // namespace hp::plan
