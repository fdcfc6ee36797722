// The real dry-run: the trainer's own setup and steps, as rank `rank` of the config's
// mesh, on a fake world (collectives complete at once, nothing moves) and meta tensors
// (shapes without data). Reports the meta storage high-water mark and every collective
// the rank issued, so one machine checks a large job's memory and communication.
#pragma once

#include <cstdint>
#include <vector>

#include "hp/comm/collective_log.h"
#include "hp/train/config.h"

namespace hp::train {

struct DryRunResult {
  int rank = 0;
  int64_t world = 1;
  int64_t steps = 0;
  int64_t setup_bytes = 0;  // meta storage alive after setup: parameters, optimizer states, buffers
  int64_t peak_bytes = 0;   // high-water mark over the steps (setup_bytes included)
  std::vector<comm::CollectiveRecord> collectives;  // setup and steps, in issue order
  int64_t setup_collectives = 0;                    // how many of them setup issued
  double seconds = 0;                               // wall time of setup and steps
};

// Checks the config (validate: the mesh names only pp, dp and tp) and the rank against the
// mesh (0 <= rank < product of cfg.mesh.shape).
DryRunResult dry_run(const TrainConfig& cfg, int rank, int64_t steps = 1);

}  // namespace hp::train
