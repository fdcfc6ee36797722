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
    case CpMode::hybrid: return "hybrid";
  }
  return "?";
}

CpMode cp_mode_from_string(const std::string& name) {
  for (CpMode m : {CpMode::ulysses, CpMode::ring, CpMode::allgather_kv, CpMode::hybrid})
    if (name == to_string(m)) return m;
  HP_FAIL() << "unknown context-parallel mode '" << name << "' (expected ulysses, ring, allgather_kv or hybrid)";
  return CpMode::ring;
}

namespace {

// The mesh dims sharding tensor dim `tensor_dim` of `x` must be `cp_dims`, in that order.
void check_sequence_sharded(const DTensor& x, int tensor_dim, const std::vector<int>& cp_dims, const char* what) {
  const std::vector<int> dims = x.spec().mesh_dims_sharding(tensor_dim);
  std::string names;
  for (int d : cp_dims) names += (names.empty() ? "'" : ", '") + x.device_mesh().dim_names()[d] + "'";
  HP_CHECK(dims == cp_dims) << "context parallelism: " << what << " " << x.spec().to_string()
                            << " must have its sequence dim " << tensor_dim << " sharded over the cp mesh dims "
                            << names << " and no other";
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
    HP_CHECK(o_.mode != CpMode::hybrid || !o_.ulysses_dim.empty())
        << "ContextParallel(hybrid) needs options.ulysses_dim, the mesh dim of its all-to-all";
    if (o_.mode == CpMode::hybrid) {
      const int inner = params_mesh.shape().dim_index(o_.ulysses_dim);
      HP_CHECK(inner > dim) << "ContextParallel(hybrid): the ring's mesh dim '" << params_mesh.dim_names()[dim]
                            << "' must come before the Ulysses dim '" << o_.ulysses_dim << "' (outer: across hosts)";
      HP_CHECK(heads % params_mesh.size(inner) == 0)
          << "ContextParallel(hybrid) splits the " << heads << " attention heads over the " << params_mesh.size(inner)
          << " ranks of mesh dim '" << o_.ulysses_dim << "', which does not divide them";
    }
    const ContextParallelOptions o = o_;
    attn->set_core([dim, o](const nn::AttentionCoreInputs& in) { return context_parallel_attention(in, dim, o); });
  }

 private:
  ContextParallelOptions o_;
};

}  // namespace

Style ContextParallel(ContextParallelOptions options) { return std::make_shared<ContextParallelStyle>(options); }

DTensor context_parallel_attention(const nn::AttentionCoreInputs& in, int cp_dim, const ContextParallelOptions& o) {
  const DeviceMesh& mesh = in.q.device_mesh();
  std::vector<int> dims{cp_dim};
  if (o.mode == CpMode::hybrid) dims.push_back(mesh.shape().dim_index(o.ulysses_dim));
  check_sequence_sharded(in.q, 2, dims, "q");
  check_sequence_sharded(in.k, 2, dims, "k");
  check_sequence_sharded(in.v, 2, dims, "v");
  const int64_t seq = in.q.size(2);
  // Every rank of the cp dims, numbered with the outer dim major.
  std::vector<int64_t> sizes;
  int rank = 0;
  for (int d : dims) sizes.push_back(mesh.size(d)), rank = rank * static_cast<int>(mesh.size(d)) + static_cast<int>(mesh.local_rank(d));
  const std::vector<int64_t> lengths = nested_sequence_lengths(seq, sizes);
  const int cp = static_cast<int>(lengths.size());
  HP_CHECK(in.k.size(2) == seq && in.v.size(2) == seq)
      << "context parallelism: q has " << seq << " positions but k " << in.k.size(2) << " and v " << in.v.size(2);

  cp::AttentionArgs a;
  a.group = &mesh.group(cp_dim);
  for (int r = 0; r < cp; ++r) a.runs.push_back(sequence_runs(lengths, r, o.load_balance));
  a.lengths = lengths;
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
    case CpMode::hybrid: out = cp::hybrid_attention(a, mesh.group(dims[1])); break;
  }
  return DTensor(out, mesh, in.q.spec());
}

DTensor shard_sequence(const at::Tensor& full, const DeviceMesh& mesh, std::vector<Placement> placements,
                       const std::string& cp_dim, bool load_balance) {
  return shard_sequence(full, mesh, std::move(placements), std::vector<std::string>{cp_dim}, load_balance);
}

DTensor shard_sequence(const at::Tensor& full, const DeviceMesh& mesh, std::vector<Placement> placements,
                       const std::vector<std::string>& cp_dims, bool load_balance) {
  HP_CHECK(full.dim() >= 2) << "shard_sequence expects [B, S, ...], got " << to_string_list(full.sizes().vec());
  HP_CHECK(static_cast<int>(placements.size()) == mesh.ndim())
      << "shard_sequence: " << placements.size() << " placements for the " << mesh.ndim() << " dims of "
      << mesh.to_string();
  std::vector<int64_t> sizes;
  int previous = -1;
  for (const std::string& name : cp_dims) {
    const int dim = mesh.shape().dim_index(name);
    HP_CHECK(dim > previous) << "shard_sequence: the cp dims " << to_string_list(cp_dims)
                             << " must be given in mesh order";
    previous = dim;
    sizes.push_back(mesh.size(dim));
    placements[dim] = Shard(1);
  }
  const std::vector<int64_t> order = sequence_order(nested_sequence_lengths(full.size(1), sizes), load_balance);
  at::Tensor index = at::tensor(order, at::kLong).to(full.device());
  return distribute_tensor(full.index_select(1, index), mesh, placements);
}

at::Tensor unshard_sequence(const DTensor& x, bool load_balance) {
  std::vector<int64_t> sizes;
  for (int d : x.spec().mesh_dims_sharding(1)) sizes.push_back(x.device_mesh().size(d));
  at::Tensor full = x.full_tensor();
  const std::vector<int64_t> order = sequence_order(nested_sequence_lengths(full.size(1), sizes), load_balance);
  at::Tensor index = at::tensor(order, at::kLong).to(full.device());
  return at::empty_like(full).index_copy(1, index, full);
}

}  // namespace hp
