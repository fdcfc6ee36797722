// Between the planner's descriptions (plan::ModelDesc, plan::Strategy) and the trainer's
// config, both ways: the trainer balances its pipeline stages and counts its FLOPs with
// the planner's model, and `hp plan --emit-config` / `hp dryrun --real` turn a strategy
// into a config the trainer runs. Torch-free.
#pragma once

#include "hp/plan/model_desc.h"
#include "hp/plan/strategy.h"
#include "hp/train/config.h"

namespace hp::train {

// The config's Llama (with its experts under [moe]) as the planner describes it, over train.seq tokens.
plan::ModelDesc model_desc_of(const TrainConfig& c);

// A config that trains model `m` with the resolved strategy `s` (apply_strategy on the
// defaults, with m's shape and sequence length; MoE models get [moe]). Throws naming what
// the trainer does not run (recomputation).
TrainConfig config_of(const plan::ModelDesc& m, const plan::Strategy& s);

// Sets `cfg`'s layout to the resolved strategy `s`: mesh dims pp, dp, tp (in the planner's
// rank order, size-1 dims left out), cp's attention mode (and hybrid's Ulysses degree),
// ddp or fully_shard at s's ZeRO stage over dp, the
// schedule, microbatches and chunks per rank, and the global batch.
void apply_strategy(TrainConfig& cfg, const plan::Strategy& s);

}  // namespace hp::train
