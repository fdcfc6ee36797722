// Which layers each pipeline rank holds.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hp/plan/model_desc.h"
#include "hp/plan/stage_split.h"

namespace hp::plan {

struct StageContents {
  int64_t dense_layers = 0;
  int64_t moe_layers = 0;
  int64_t chunks = 0;          // model chunks (virtual stages) on this rank
  int64_t max_chunk_layers = 0;
  bool embedding = false;      // holds the input embedding
  bool head = false;           // holds the output projection and the loss
  int64_t layers() const { return dense_layers + moe_layers; }
};

// Places the pp*vpp chunks of `split` on pipeline ranks: chunk c goes to rank c % pp,
// except zbv and dualpipev whose V places chunks c and 2p-1-c on rank c.
std::vector<StageContents> place_chunks(const ModelDesc& m, const StageSplit& split, int64_t pp, int64_t vpp,
                                        const std::string& schedule);

// Splits the layers into pp*vpp chunks of balanced forward FLOPs (balance_stages,
// stage_split.h: the last chunk also runs the head, so it tends to hold fewer layers)
// and places them.
std::vector<StageContents> split_stages(const ModelDesc& m, int64_t pp, int64_t vpp, const std::string& schedule);

}  // namespace hp::plan
