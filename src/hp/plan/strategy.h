// A parallel strategy: how a model is split over devices and how a step is run.
// Written as "dp=8,tp=8,pp=6,mb=16,zero=3,recompute=full,schedule=1f1b".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hp/plan/model_desc.h"

namespace hp::plan {

// full_chunked: full, and each dense layer's MLP a region inside its layer, recomputed and
// differentiated kRecomputeTokenChunks token chunks at a time (CheckpointOptions::token_chunks).
enum class Recompute { None, Selective, Full, FullChunked };
const char* to_string(Recompute r);
inline bool recomputes_whole_layers(Recompute r) { return r == Recompute::Full || r == Recompute::FullChunked; }
constexpr int64_t kRecomputeTokenChunks = 4;

struct Strategy {
  // Mesh dims. Rank order, outermost to innermost: pp, dp, ep, cp, tp — tp innermost so
  // that its group lands on the fastest links, pp outermost since it sends the least.
  // ep is its own dim: dense weights are replicated over dp·ep and experts split over ep,
  // so dp·ep ranks consume distinct data.
  int64_t dp = 0;  // 0: whatever the device count leaves
  int64_t tp = 1;
  int64_t pp = 1;
  int64_t cp = 1;
  int64_t ep = 1;
  // How attention crosses cp (plan/cp_traffic.h): ulysses, ring, allgather_kv or hybrid,
  // whose Ulysses runs over the inner cp_ulysses ranks of cp and the ring over the rest.
  std::string cp_mode = "ring";
  int64_t cp_ulysses = 1;
  // How the data ranks share the training state, as ZeRO's stages: 0 replicates it (DDP);
  // 1 shards optimizer states; 2 also gradients; 3 also parameters (fsdp, gathered again for
  // every microbatch). 1 and 2 gather parameters once per step and keep them through its
  // microbatches; 1 reduces gradients once per step, 2 after every microbatch.
  int64_t zero = 0;
  int64_t microbatches = 0;  // per step per pipeline; 0: derived
  int64_t micro_batch = 0;   // sequences per microbatch; 0: derived
  int64_t global_batch = 0;  // sequences per step; 0: derived
  std::string schedule = "1f1b";  // gpipe, 1f1b, interleaved-1f1b, zb-h1, zbv, dualpipev
  int64_t virtual_stages = 1;     // model chunks per pipeline rank
  Recompute recompute = Recompute::None;

  int64_t devices() const { return dp * tp * pp * cp * ep; }
  int64_t data_replicas() const { return dp * ep; }  // ranks that see different sequences
  bool fsdp() const { return zero == 3; }
};

// Whether `hp train` runs `s` with sequence parallelism, as the estimator assumes: tp > 1 in a
// dense model without cp (MoE models run without, and cp shards the sequence itself).
inline bool runs_sequence_parallel(const Strategy& s, bool moe_model) { return s.tp > 1 && s.cp <= 1 && !moe_model; }

std::vector<std::string> schedule_names();
// zbv and dualpipev: two chunks per rank on the V, chunks c and 2p-1-c on rank c.
bool uses_v_placement(const std::string& schedule);

// Parses "key=value,..."; keys: dp tp pp cp ep zero mb mbs gbs schedule vpp recompute
// cp_mode cp_ulysses, and fsdp=1 for zero=3.
// Errors name the bad key or value.
Strategy parse_strategy(const std::string& text);
// Fills derived fields (dp, batch sizes) and checks the strategy against the model and
// the device count; throws saying what was expected and what was found.
Strategy resolve_strategy(Strategy s, const ModelDesc& model, int64_t devices);
// Canonical text form; parse_strategy(to_string(s)) gives s back.
std::string to_string(const Strategy& s);

}  // namespace hp::plan
