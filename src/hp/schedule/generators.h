// Schedule generators. Each returns the compute actions only (F, B or I+W) in
// the order every rank runs them; lower_communication() then adds SEND/RECV.
// make_schedule() does both and is what callers normally want.
//
// Every generator but dualpipev accepts any num_microbatches >= 1, including
// fewer microbatches than stages (the pipeline then simply never fills).
#pragma once

#include <string>
#include <vector>

#include "hp/schedule/action.h"

namespace hp::schedule {

// All forwards, then all backwards. Peak in-flight = num_microbatches.
Schedule gpipe(int num_ranks, int num_microbatches);

// One-forward-one-backward: rank r runs p-1-r warm-up forwards, then
// alternates F and B, then drains. Peak in-flight <= p.
Schedule one_f_one_b(int num_ranks, int num_microbatches);

// Interleaved 1F1B (Megatron): v stages per rank, stage s on rank s % p.
// Microbatches go in rounds of p through each local stage in turn.
Schedule interleaved_1f1b(int num_ranks, int num_microbatches, int stages_per_rank);

// ZB-H1: 1F1B with the backward split into I (input grad, on the critical
// path) and W (weight grad, deferred into what would be bubbles). Rank r defers
// up to r weight grads, so every rank holds at most p microbatches in flight.
Schedule zb_h1(int num_ranks, int num_microbatches);

// ZB-V: two stages per rank on the V map (v_stage_map), split backward.
// Ordered by a greedy list scheduler on unit costs (F = I = W): input grads
// first, then forwards (the deeper stage first) while at most 2p stage
// activations are live on the rank, then weight grads to fill the gaps.
Schedule zbv(int num_ranks, int num_microbatches);

// DualPipeV (DeepSeek's DualPipe cut in half): two stages per rank on the V map.
// Rank r runs fixed phases whose counts are formulas in r: first-chunk warm-up
// forwards, forwards of both chunks, then a steady phase where every forward of
// one chunk is followed by a backward of the other (F and B one for one), and a
// cool-down of backwards in which split backwards (I now, W later) fill the
// waits. Needs num_ranks >= 2 and num_microbatches >= 2 * num_ranks.
Schedule dualpipev(int num_ranks, int num_microbatches);

// Known kinds: "gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zbv", "dualpipev".
std::vector<std::string> schedule_kinds();

// Generates `kind` and lowers it. `stages_per_rank` is used by
// interleaved-1f1b only (0 = its default, 2); other kinds reject a value > 1
// except zbv and dualpipev, which always have 2.
Schedule make_schedule(const std::string& kind, int num_ranks, int num_microbatches,
                       int stages_per_rank = 0);

}  // namespace hp::schedule
