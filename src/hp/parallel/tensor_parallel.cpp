#include "hp/parallel/tensor_parallel.h"

#include "hp/base/error.h"
#include "hp/base/strings.h"
#include "hp/nn/layers.h"
#include "hp/parallel/async_tp.h"

namespace hp {
namespace {

constexpr int kSequenceDim = 1;  // of [batch, seq, hidden] activations

void reshard_parameter(DTensor& p, int dim, Placement placement) {
  p = nn::make_parameter(p.redistribute(with_placement(p.placements(), dim, placement)));
}

// Shard(-1) means the last dim of whatever tensor it meets.
Placement resolve(Placement p, int64_t ndim) {
  return p.is_shard() && p.dim() < 0 ? Shard(static_cast<int>(p.dim() + ndim)) : p;
}

nn::Module::PreHook input_to(int dim, Placement p) {
  return [dim, p](nn::Module&, const DTensor& x) {
    return x.redistribute(with_placement(x.placements(), dim, resolve(p, x.dim())));
  };
}

nn::Module::PostHook output_to(int dim, Placement p) {
  return [dim, p](nn::Module&, const DTensor&, const DTensor& y) {
    return y.redistribute(with_placement(y.placements(), dim, resolve(p, y.dim())));
  };
}

// async_tp: the product gathers a sequence-sharded input itself, so the input hook lets
// Shard(seq) through and lays out anything else as usual; so it does everything once a
// product set later (FP8) has replaced the async one.
nn::Module::PreHook input_to_or_sequence_sharded(int dim, Placement p) {
  return [dim, p](nn::Module& m, const DTensor& x) {
    if (x.placements().at(dim).is_shard(kSequenceDim) &&
        is_async_tp_product(static_cast<nn::Linear&>(m).product()))
      return x;
    return x.redistribute(with_placement(x.placements(), dim, resolve(p, x.dim())));
  };
}

// A Linear product set from outside already (low precision) cannot be decomposed too.
void set_async_product(nn::Linear& lin, nn::Linear::Product product, const char* style) {
  HP_CHECK(!lin.product()) << style << " with async_tp: the Linear already has its own product (FP8?); "
                           << "apply async_tp before apply_low_precision, which then replaces it";
  lin.set_product(std::move(product));
}

class Colwise : public ParallelStyle {
 public:
  Colwise(Placement in, Placement out, bool async_tp) : in_(in), out_(out), async_tp_(async_tp) {}
  void apply(nn::Module& m, const DeviceMesh&, int dim) const override {
    auto* lin = dynamic_cast<nn::Linear*>(&m);
    if (lin) {
      reshard_parameter(lin->weight(), dim, Shard(0));
      if (lin->bias()) reshard_parameter(*lin->bias(), dim, Shard(0));
    } else if (auto* emb = dynamic_cast<nn::Embedding*>(&m)) {
      HP_CHECK(!async_tp_) << "ColwiseParallel with async_tp applies to Linear modules, not Embedding";
      reshard_parameter(emb->weight(), dim, Shard(1));
    } else {
      HP_FAIL() << "ColwiseParallel applies to Linear and Embedding modules";
    }
    if (async_tp_) {
      set_async_product(*lin, all_gather_linear(dim, kSequenceDim), "ColwiseParallel");
      m.register_forward_pre_hook(input_to_or_sequence_sharded(dim, in_));
    } else {
      m.register_forward_pre_hook(input_to(dim, in_));
    }
    m.register_forward_hook(output_to(dim, out_));
  }

 private:
  Placement in_, out_;
  bool async_tp_;
};

class Rowwise : public ParallelStyle {
 public:
  Rowwise(std::optional<Placement> in, Placement out, bool async_tp) : in_(in), out_(out), async_tp_(async_tp) {}
  void apply(nn::Module& m, const DeviceMesh&, int dim) const override {
    HP_CHECK(!async_tp_ || out_.is_shard(kSequenceDim))
        << "RowwiseParallel with async_tp decomposes a reduce-scatter: its output must be Shard(" << kSequenceDim
        << "), got " << out_.to_string();
    if (auto* lin = dynamic_cast<nn::Linear*>(&m)) {
      reshard_parameter(lin->weight(), dim, Shard(1));
      m.register_forward_pre_hook(input_to(dim, in_.value_or(Shard(-1))));
      if (async_tp_) {
        HP_CHECK(!lin->bias()) << "RowwiseParallel with async_tp: a Linear with a bias is not supported";
        set_async_product(*lin, linear_reduce_scatter(dim, kSequenceDim), "RowwiseParallel");
      }
    } else if (auto* emb = dynamic_cast<nn::Embedding*>(&m)) {
      HP_CHECK(!async_tp_) << "RowwiseParallel with async_tp applies to Linear modules, not Embedding";
      reshard_parameter(emb->weight(), dim, Shard(0));
      m.register_forward_pre_hook(input_to(dim, in_.value_or(Replicate())));
    } else {
      HP_FAIL() << "RowwiseParallel applies to Linear and Embedding modules";
    }
    m.register_forward_hook(output_to(dim, out_));
  }

 private:
  std::optional<Placement> in_;
  Placement out_;
  bool async_tp_;
};

class SequenceSharded : public ParallelStyle {
 public:
  explicit SequenceSharded(int seq_dim) : seq_dim_(seq_dim) {}
  void apply(nn::Module& m, const DeviceMesh&, int dim) const override {
    m.register_forward_pre_hook(input_to(dim, Shard(seq_dim_)));
    m.register_forward_hook(output_to(dim, Shard(seq_dim_)));
  }

 private:
  int seq_dim_;
};

class PrepareInput : public ParallelStyle {
 public:
  explicit PrepareInput(Placement p) : p_(p) {}
  void apply(nn::Module& m, const DeviceMesh&, int dim) const override {
    m.register_forward_pre_hook(input_to(dim, p_));
  }

 private:
  Placement p_;
};

class PrepareOutput : public ParallelStyle {
 public:
  explicit PrepareOutput(Placement p) : p_(p) {}
  void apply(nn::Module& m, const DeviceMesh&, int dim) const override {
    m.register_forward_hook(output_to(dim, p_));
  }

 private:
  Placement p_;
};

// The mesh all parameters live on; they must agree.
DeviceMesh params_mesh(nn::Module& module) {
  auto params = module.parameters();
  HP_CHECK(!params.empty()) << "the module has no parameters to parallelize";
  const DeviceMesh& mesh = params.front()->device_mesh();
  for (DTensor* p : params)
    HP_CHECK(p->device_mesh() == mesh) << "parameters live on different meshes: " << mesh.to_string() << " and "
                                       << p->device_mesh().to_string();
  return mesh;
}

}  // namespace

std::vector<Placement> with_placement(std::vector<Placement> placements, int dim, Placement p) {
  placements.at(dim) = p;
  return placements;
}

bool name_matches(const std::string& pattern, const std::string& name) {
  auto ps = split(pattern, '.'), ns = split(name, '.');
  if (ps.size() != ns.size()) return false;
  for (size_t i = 0; i < ps.size(); ++i)
    if (ps[i] != "*" && ps[i] != ns[i]) return false;
  return true;
}

Style ColwiseParallel(Placement input, Placement output, bool async_tp) {
  return std::make_shared<Colwise>(input, output, async_tp);
}
Style RowwiseParallel(std::optional<Placement> input, Placement output, bool async_tp) {
  return std::make_shared<Rowwise>(input, output, async_tp);
}
Style SequenceParallel(int seq_dim) { return std::make_shared<SequenceSharded>(seq_dim); }
Style PrepareModuleInput(Placement layout) { return std::make_shared<PrepareInput>(layout); }
Style PrepareModuleOutput(Placement layout) { return std::make_shared<PrepareOutput>(layout); }

void parallelize_module(nn::Module& module, const DeviceMesh& tp_mesh, const ParallelPlan& plan) {
  HP_CHECK(tp_mesh.ndim() == 1) << "parallelize_module needs a one-dim mesh, got " << tp_mesh.to_string();
  DeviceMesh mesh = params_mesh(module);
  const int dim = mesh.shape().dim_index(tp_mesh.dim_names()[0]);
  HP_CHECK(mesh.size(dim) == tp_mesh.size())
      << "mesh dim '" << tp_mesh.dim_names()[0] << "' has " << mesh.size(dim) << " ranks in the parameters' mesh but "
      << tp_mesh.size() << " in " << tp_mesh.to_string();
  auto modules = module.named_modules();
  for (const auto& [pattern, style] : plan) {
    int matched = 0;
    for (auto& [name, m] : modules)
      if (name_matches(pattern, name)) {
        style->apply(*m, mesh, dim);
        ++matched;
      }
    HP_CHECK(matched > 0) << "parallelize_module: pattern '" << pattern << "' matches no module";
  }
}

void shard_module(nn::Module& module, const DeviceMesh& mesh, const ShardingPlan& plan) {
  for (const auto& [pattern, placements] : plan.plan) {
    int matched = 0;
    for (auto& [name, p] : module.named_parameters())
      if (name_matches(pattern, name)) {
        HP_CHECK(p->device_mesh() == mesh) << "parameter " << name << " lives on " << p->device_mesh().to_string()
                                           << ", not on " << mesh.to_string();
        *p = nn::make_parameter(p->redistribute(placements));
        ++matched;
      }
    HP_CHECK(matched > 0) << "shard_module: pattern '" << pattern << "' matches no parameter";
  }
  if (plan.input_plan)
    module.register_forward_pre_hook(
        [p = *plan.input_plan](nn::Module&, const DTensor& x) { return x.redistribute(p); });
  if (plan.output_plan)
    module.register_forward_hook(
        [p = *plan.output_plan](nn::Module&, const DTensor&, const DTensor& y) { return y.redistribute(p); });
}

}  // namespace hp
