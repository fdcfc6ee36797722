#include "hp/parallel/context_parallel.h"

#include <ATen/ATen.h>

#include <cmath>

#include "hp/base/error.h"
#include "hp/base/strings.h"
#include "hp/parallel/context_parallel_kernels.h"

namespace hp {
namespace cp {

at::Tensor positions_of(const std::vector<SequenceRun>& runs) {
  std::vector<at::Tensor> parts;
  for (const SequenceRun& r : runs) parts.push_back(at::arange(r.first, r.first + r.size, at::kLong));
  return parts.empty() ? at::empty({0}, at::kLong) : at::cat(parts);
}

at::Tensor positions_of_all(const std::vector<std::vector<SequenceRun>>& runs) {
  std::vector<at::Tensor> parts;
  for (const auto& r : runs) parts.push_back(positions_of(r));
  return at::cat(parts);
}

}  // namespace cp

const char* to_string(CpMode mode) {
  switch (mode) {
    case CpMode::ulysses: return "ulysses";
    case CpMode::ring: return "ring";
    case CpMode::allgather_kv: return "allgather_kv";
  }
  return "?";
}

CpMode cp_mode_from_string(const std::string& name) {
  for (CpMode m : {CpMode::ulysses, CpMode::ring, CpMode::allgather_kv})
    if (name == to_string(m)) return m;
  HP_FAIL() << "unknown context-parallel mode '" << name << "' (expected ulysses, ring or allgather_kv)";
  return CpMode::ring;
}

namespace {

// The one mesh dim sharding tensor dim `tensor_dim` of `x`, which must be `cp_dim`.
void check_sequence_sharded(const DTensor& x, int tensor_dim, int cp_dim, const char* what) {
  const std::vector<int> dims = x.spec().mesh_dims_sharding(tensor_dim);
  HP_CHECK(dims == std::vector<int>{cp_dim})
      << "context parallelism: " << what << " " << x.spec().to_string() << " must have its sequence dim "
      << tensor_dim << " sharded over the cp mesh dim " << cp_dim << " ('"
      << x.device_mesh().dim_names()[cp_dim] << "') and no other";
}

class ContextParallelStyle : public ParallelStyle {
 public:
  explicit ContextParallelStyle(ContextParallelOptions o) : o_(o) {}
  void apply(nn::Module& module, const DeviceMesh& params_mesh, int dim) const override {
    auto* attn = dynamic_cast<nn::Attention*>(&module);
    HP_CHECK(attn) << "ContextParallel applies to attention modules (nn::Attention)";
    const int64_t cp = params_mesh.size(dim), heads = attn->config().heads;
    HP_CHECK(o_.mode != CpMode::ulysses || heads % cp == 0)
        << "ContextParallel(ulysses) splits the " << heads << " attention heads over the " << cp
        << " ranks of mesh dim '" << params_mesh.dim_names()[dim] << "', which does not divide them; choose a cp "
        << "degree that divides the heads, or the ring or allgather_kv mode";
    const ContextParallelOptions o = o_;
    attn->set_core([dim, o](const nn::AttentionCoreInputs& in) { return context_parallel_attention(in, dim, o); });
  }

 private:
  ContextParallelOptions o_;
};

}  // namespace

Style ContextParallel(ContextParallelOptions options) { return std::make_shared<ContextParallelStyle>(options); }

DTensor context_parallel_attention(const nn::AttentionCoreInputs& in, int cp_dim, const ContextParallelOptions& o) {
  check_sequence_sharded(in.q, 2, cp_dim, "q");
  check_sequence_sharded(in.k, 2, cp_dim, "k");
  check_sequence_sharded(in.v, 2, cp_dim, "v");
  const DeviceMesh& mesh = in.q.device_mesh();
  const int64_t seq = in.q.size(2);
  const int cp = static_cast<int>(mesh.size(cp_dim)), rank = static_cast<int>(mesh.local_rank(cp_dim));
  HP_CHECK(in.k.size(2) == seq && in.v.size(2) == seq)
      << "context parallelism: q has " << seq << " positions but k " << in.k.size(2) << " and v " << in.v.size(2);

  cp::AttentionArgs a;
  a.group = &mesh.group(cp_dim);
  for (int r = 0; r < cp; ++r) a.runs.push_back(sequence_runs(seq, cp, r, o.load_balance));
  a.lengths = sequence_lengths(seq, cp);
  a.causal = in.causal;
  a.scale = 1.0 / std::sqrt(static_cast<double>(in.q.size(3)));
  const at::Tensor pos = cp::positions_of(a.runs[rank]).to(in.q.to_local().device());
  a.q = in.rotary.apply(in.q.to_local(), pos);
  a.k = in.rotary.apply(in.k.to_local(), pos);
  a.v = in.v.to_local();
  at::Tensor out;
  switch (o.mode) {
    case CpMode::ulysses: out = cp::ulysses_attention(a); break;
    case CpMode::ring: out = cp::ring_attention(a); break;
    case CpMode::allgather_kv: out = cp::allgather_kv_attention(a); break;
  }
  return DTensor(out, mesh, in.q.spec());
}

DTensor shard_sequence(const at::Tensor& full, const DeviceMesh& mesh, std::vector<Placement> placements,
                       const std::string& cp_dim, bool load_balance) {
  HP_CHECK(full.dim() >= 2) << "shard_sequence expects [B, S, ...], got " << to_string_list(full.sizes().vec());
  HP_CHECK(static_cast<int>(placements.size()) == mesh.ndim())
      << "shard_sequence: " << placements.size() << " placements for the " << mesh.ndim() << " dims of "
      << mesh.to_string();
  const int dim = mesh.shape().dim_index(cp_dim);
  const int cp = static_cast<int>(mesh.size(dim));
  const std::vector<int64_t> order = sequence_order(full.size(1), cp, load_balance);
  at::Tensor index = at::tensor(order, at::kLong).to(full.device());
  placements[dim] = Shard(1);
  return distribute_tensor(full.index_select(1, index), mesh, placements);
}

at::Tensor unshard_sequence(const DTensor& x, bool load_balance) {
  const std::vector<int> dims = x.spec().mesh_dims_sharding(1);
  HP_CHECK(dims.size() <= 1) << "unshard_sequence: the sequence of " << x.spec().to_string()
                             << " is sharded over several mesh dims";
  const int cp = dims.empty() ? 1 : static_cast<int>(x.device_mesh().size(dims[0]));
  at::Tensor full = x.full_tensor();
  at::Tensor index = at::tensor(sequence_order(full.size(1), cp, load_balance), at::kLong).to(full.device());
  return at::empty_like(full).index_copy(1, index, full);
}

}  // namespace hp
