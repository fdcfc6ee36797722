#include "hp/parallel/expert_parallel.h"

#include <memory>

#include "hp/base/error.h"
#include "hp/parallel/token_dispatcher.h"

namespace hp {
namespace {

void reshard_parameter(DTensor& p, int dim, Placement placement) {
  p = nn::make_parameter(p.redistribute(with_placement(p.placements(), dim, placement)));
}

nn::MoE& as_moe(nn::Module& m, const char* style) {
  auto* moe = dynamic_cast<nn::MoE*>(&m);
  HP_CHECK(moe) << style << " applies to MoE modules";
  return *moe;
}

class ExpertSharded : public ParallelStyle {
 public:
  void apply(nn::Module& m, const DeviceMesh& mesh, int dim) const override {
    nn::MoE& moe = as_moe(m, "ExpertParallel");
    const int64_t experts = moe.options().num_experts, ranks = mesh.size(dim);
    HP_CHECK(experts >= ranks) << "ExpertParallel: " << experts << " experts cannot be spread over the " << ranks
                               << " ranks of mesh dim '" << mesh.dim_names()[dim] << "' (fewer experts than ranks)";
    for (DTensor* w : {&moe.experts().w1(), &moe.experts().w2(), &moe.experts().w3()})
      reshard_parameter(*w, dim, Shard(0));
    moe.set_token_dispatcher(
        std::make_shared<AllToAllTokenDispatcher>(mesh.group(dim), moe.token_dispatcher().options()));
  }
};

class ExpertHiddenSharded : public ParallelStyle {
 public:
  void apply(nn::Module& m, const DeviceMesh&, int dim) const override {
    nn::MoE& moe = as_moe(m, "ExpertTensorParallel");
    reshard_parameter(moe.experts().w1(), dim, Shard(1));
    reshard_parameter(moe.experts().w3(), dim, Shard(1));
    reshard_parameter(moe.experts().w2(), dim, Shard(2));
    auto whole = [dim](const DTensor& x) { return x.redistribute(with_placement(x.placements(), dim, Replicate())); };
    m.register_forward_pre_hook([whole](nn::Module&, const DTensor& x) { return whole(x); });
    m.register_forward_hook([whole](nn::Module&, const DTensor&, const DTensor& y) { return whole(y); });
  }
};

}  // namespace

Style ExpertParallel() { return std::make_shared<ExpertSharded>(); }
Style ExpertTensorParallel() { return std::make_shared<ExpertHiddenSharded>(); }

}  // namespace hp
