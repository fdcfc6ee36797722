#include "hp/plan/pipeline_stages.h"

#include <algorithm>

#include "hp/base/error.h"
#include "hp/plan/strategy.h"

namespace hp::plan {

namespace {

void check_chunk_count(const ModelDesc& m, int64_t pp, int64_t vpp) {
  HP_CHECK(pp >= 1 && vpp >= 1 && pp * vpp <= m.layers)
      << "split_stages: expected 1 <= pp*vpp <= layers, found pp " << pp << ", vpp " << vpp << ", layers "
      << m.layers;
}

}  // namespace

std::vector<StageContents> place_chunks(const ModelDesc& m, const StageSplit& split, int64_t pp, int64_t vpp,
                                        const std::string& schedule) {
  check_chunk_count(m, pp, vpp);
  const int64_t chunks = pp * vpp;
  const std::vector<int64_t> first = split.first_layer();
  const int64_t total = split.layers.empty() ? 0 : first.back() + split.layers.back();
  HP_CHECK(int64_t(split.layers.size()) == chunks && total == m.layers)
      << "place_chunks: expected " << m.layers << " layers in pp*vpp = " << chunks << " chunks, found "
      << total << " in " << split.layers.size();
  std::vector<StageContents> stages(pp);
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t n = split.layers[c];
    int64_t rank = c % pp;
    if (uses_v_placement(schedule) && vpp == 2) rank = c < pp ? c : 2 * pp - 1 - c;
    StageContents& s = stages[rank];
    for (int64_t l = first[c]; l < first[c] + n; ++l) (m.layer_is_moe(l) ? s.moe_layers : s.dense_layers)++;
    s.chunks++;
    s.max_chunk_layers = std::max(s.max_chunk_layers, n);
    if (c == 0) s.embedding = true;
    if (c == chunks - 1) s.head = true;
  }
  return stages;
}

std::vector<StageContents> split_stages(const ModelDesc& m, int64_t pp, int64_t vpp, const std::string& schedule) {
  check_chunk_count(m, pp, vpp);
  return place_chunks(m, balance_stages(m, pp * vpp), pp, vpp, schedule);
}

}  // namespace hp::plan
