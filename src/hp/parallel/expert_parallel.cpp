#include "hp/parallel/expert_parallel.h"

#include <memory>
#include <optional>

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

// The sequence-sharded activations of sequence parallelism ([b, s, d], rows split over the
// batch dims, the sequence over others) read as the MoE's own tokens: the local [b', s', d]
// become rows [b' s', d] split over every one of those dims, and the output goes back to
// the input's layout. Only this rank's tokens are routed (routing is per token, and the
// auxiliary loss and expert loads sum over the split dims), so nothing is gathered.
class SequenceShardedTokens : public ParallelStyle {
 public:
  void apply(nn::Module& m, const DeviceMesh&, int) const override {
    as_moe(m, "MoESequenceParallel");
    auto input = std::make_shared<std::optional<ShardSpec>>();
    m.register_forward_pre_hook([input](nn::Module&, const DTensor& x) {
      *input = x.spec();
      const DeviceMesh& mesh = x.device_mesh();
      std::vector<Placement> rows(mesh.ndim(), Replicate());
      for (int k = 0; k < mesh.ndim(); ++k)
        if (x.placements()[k].is_shard()) {
          HP_CHECK(x.placements()[k].dim() < x.dim() - 1)
              << "MoESequenceParallel: the MoE's input " << x.spec().to_string() << " splits its hidden dim";
          rows[k] = Shard(0);
        }
      const int64_t d = x.size(x.dim() - 1);
      const at::Tensor local = x.to_local().reshape({-1, d});
      ShardSpec spec = make_spec({x.spec().numel() / d, d}, x.scalar_type(), mesh, rows);
      HP_CHECK(spec.local_shape_of_rank(mesh.rank())[0] == local.size(0))
          << "MoESequenceParallel: the tokens of " << x.spec().to_string()
          << " do not split evenly over its sharded dims (batch and sequence must divide)";
      return DTensor(local, mesh, std::move(spec));
    });
    m.register_forward_hook([input](nn::Module&, const DTensor&, const DTensor& y) {
      const ShardSpec& spec = input->value();
      return DTensor(y.to_local().reshape(spec.local_shape_of_rank(y.device_mesh().rank())), y.device_mesh(),
                     make_spec(spec.shape(), y.scalar_type(), y.device_mesh(), spec.placements()));
    });
  }
};

}  // namespace

Style MoESequenceParallel() { return std::make_shared<SequenceShardedTokens>(); }
Style ExpertParallel() { return std::make_shared<ExpertSharded>(); }
Style ExpertTensorParallel() { return std::make_shared<ExpertHiddenSharded>(); }

}  // namespace hp
