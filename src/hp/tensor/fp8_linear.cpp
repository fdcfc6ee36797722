#include "hp/tensor/fp8_linear.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <utility>

#include "hp/base/error.h"
#include "hp/tensor/fp8_matmul.h"
#include "hp/tensor/fp8_operand.h"
#include "hp/tensor/ops.h"

namespace hp {
namespace {

// Where this call's local x [tokens, in], W [out, in] and y [tokens, out] lie.
struct CallLayout {
  ShardSpec x, w, y;
  std::vector<int64_t> coord;
  DeviceMesh mesh;

  int last(const ShardSpec& s) const { return s.ndim() - 1; }
  Fp8Operand x_along_in(const at::Tensor& x2) const {
    return {x2, fp8_leading_axis(x, coord, last(x)), fp8_axis(x, coord, last(x))};
  }
  Fp8Operand x_along_tokens(const at::Tensor& x2) const {
    return {x2.t(), fp8_axis(x, coord, last(x)), fp8_leading_axis(x, coord, last(x))};
  }
  Fp8Operand w_along_in(const at::Tensor& w2) const { return {w2, fp8_axis(w, coord, 0), fp8_axis(w, coord, 1)}; }
  Fp8Operand w_along_out(const at::Tensor& w2) const {
    return {w2.t(), fp8_axis(w, coord, 1), fp8_axis(w, coord, 0)};
  }
  Fp8Operand dy_along_out(const at::Tensor& dy2) const {
    return {dy2, fp8_leading_axis(y, coord, last(y)), fp8_axis(y, coord, last(y))};
  }
  Fp8Operand dy_along_tokens(const at::Tensor& dy2) const {
    return {dy2.t(), fp8_axis(y, coord, last(y)), fp8_leading_axis(y, coord, last(y))};
  }
};

// The gradient node of one call: dX and dW from the quantized operands, each only when
// autograd asks for it (a split backward asks for them in separate passes).
struct Fp8LinearBackward : torch::autograd::Node {
  CallLayout layout;
  Fp8LinearOptions options;
  Fp8Linear::Histories histories;
  at::Tensor x2, w;      // float32, quantized per product (rowwise, mx_block)
  Fp8Tensor xq, wq;      // tensorwise: the forward's, reused
  std::vector<int64_t> x_sizes;
  at::ScalarType x_dtype = at::kFloat, w_dtype = at::kFloat;

  Fp8LinearBackward(CallLayout l, Fp8LinearOptions o, Fp8Linear::Histories h)
      : layout(std::move(l)), options(o), histories(std::move(h)) {}

  Fp8Tensor quantize(const Fp8Operand& op, Fp8Format f, AmaxHistory* history = nullptr) const {
    return fp8_quantize(op, f, options.scaling, layout.mesh, history);
  }

  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor()};
    const at::Tensor dy2 = grads[0].reshape({-1, grads[0].size(-1)}).to(at::kFloat);
    const Fp8Scaling s = options.scaling;
    const bool tensorwise = s == Fp8Scaling::Tensorwise;
    const Fp8Tensor dy_q =
        tensorwise ? quantize(layout.dy_along_out(dy2), Fp8Format::E5M2, histories.grad_output.get()) : Fp8Tensor();
    at::Tensor dx, dw;
    if (should_compute_output(0)) {  // dY [tokens, out] . W [out, in], reducing out
      Fp8Tensor g = tensorwise ? dy_q : quantize(layout.dy_along_out(dy2), Fp8Format::E5M2);
      Fp8Tensor wt = tensorwise ? wq.t() : quantize(layout.w_along_out(w), Fp8Format::E4M3);
      dx = fp8_mm(g, wt, s).reshape(x_sizes).to(x_dtype);
    }
    if (should_compute_output(1)) {  // dY^T [out, tokens] . X [tokens, in], reducing tokens
      Fp8Tensor gt = tensorwise ? dy_q.t() : quantize(layout.dy_along_tokens(dy2), Fp8Format::E5M2);
      Fp8Tensor xt = tensorwise ? xq.t() : quantize(layout.x_along_tokens(x2), Fp8Format::E4M3);
      dw = fp8_mm(gt, xt, s).to(w_dtype);
    }
    return {dx, dw};
  }
  std::string name() const override { return "Fp8LinearBackward"; }
};

// Partial terms summed; any other input passes as it is, keeping what rides on the
// DTensor (fully_shard's deferred gradient reduction: a redistributed copy would lose it,
// and the weight's gradient would be all-reduced here and reduce-scattered again).
DTensor settled(const DTensor& t) {
  if (!t.spec().has_partial()) return t;
  std::vector<Placement> p = t.placements();
  for (auto& q : p)
    if (q.is_partial()) q = Replicate();
  return t.redistribute(p);
}

}  // namespace

Fp8Linear::Fp8Linear(Fp8LinearOptions options) : options_(options) {
  HP_CHECK(!options.delayed || options.scaling == Fp8Scaling::Tensorwise)
      << "delayed FP8 scaling keeps one amax per tensor: it needs tensorwise scaling, not "
      << to_string(options.scaling);
  HP_CHECK(!options.enable_fsdp_float8_all_gather || options.scaling == Fp8Scaling::Tensorwise)
      << "FP8 all-gather in fully_shard needs tensorwise scaling, not " << to_string(options.scaling)
      << ": one gathered FP8 weight serves both of its products only when one scale covers the whole "
         "weight (the forward quantizes W along in-features, dX along out-features)";
  if (options.delayed)
    histories_ = {std::make_shared<AmaxHistory>(options.history_len), std::make_shared<AmaxHistory>(options.history_len),
                  std::make_shared<AmaxHistory>(options.history_len)};
}

DTensor Fp8Linear::operator()(const DTensor& x_in, const DTensor& weight_in) const {
  auto supported = [](at::ScalarType t) { return t == at::kFloat || t == at::kBFloat16; };
  HP_CHECK(supported(x_in.scalar_type()) && supported(weight_in.scalar_type()))
      << "the FP8 linear takes float32 or bfloat16 inputs and weights, got " << x_in.scalar_type() << " and "
      << weight_in.scalar_type();
  DTensor x = settled(x_in), weight = settled(weight_in);
  const DeviceMesh mesh = x.device_mesh();
  const Fp8LinearOptions options = options_;
  const Histories histories = histories_;
  const Fp8PrecastWeight precast = *precast_;
  return dispatch(Op::linear().named("fp8_linear"), {x, weight}, [mesh, options, histories, precast](const auto& t,
                                                                                 const LocalContext& ctx) {
    HP_CHECK(!ctx.inputs[0].has_partial() && !ctx.inputs[1].has_partial())
        << "the FP8 linear quantizes whole values, not partial terms; got " << ctx.inputs[0].to_string() << " and "
        << ctx.inputs[1].to_string();
    CallLayout layout{ctx.inputs[0], ctx.inputs[1], ctx.output, ctx.coord, mesh};
    const at::Tensor& x = t[0];
    const at::Tensor& w = t[1];
    // Scales from float32 values (bfloat16 ones are exact in float32); y in x's dtype.
    const at::Tensor x2 = x.detach().reshape({-1, x.size(-1)}).to(at::kFloat);
    const at::Tensor w2 = w.detach().to(at::kFloat);
    const Fp8Scaling s = options.scaling;
    Fp8Tensor xq = fp8_quantize(layout.x_along_in(x2), Fp8Format::E4M3, s, mesh, histories.input.get());
    // A weight fully_shard gathered as FP8 holds deq(q(W)) at the scale it was cast with;
    // cast again at that scale it is q(W) exactly (a scale recomputed from it might not be).
    const bool cast = precast.storage && w.has_storage() &&
                      w.storage().unsafeGetStorageImpl() == precast.storage.unsafeGetStorageImpl();
    Fp8Tensor wq = cast ? fp8_cast(w2, precast.scale, Fp8Format::E4M3)
                        : fp8_quantize(layout.w_along_in(w2), Fp8Format::E4M3, s, mesh, histories.weight.get());
    std::vector<int64_t> y_sizes = x.sizes().vec();
    y_sizes.back() = w.size(0);
    at::Tensor y = fp8_mm(xq, wq, s).reshape(y_sizes).to(x.scalar_type());
    if (!at::GradMode::is_enabled() || !(x.requires_grad() || w.requires_grad())) return y;

    auto node = std::shared_ptr<Fp8LinearBackward>(new Fp8LinearBackward(layout, options, histories),
                                                   torch::autograd::deleteNode);
    if (s == Fp8Scaling::Tensorwise)
      node->xq = xq, node->wq = wq;
    else
      node->x2 = x2, node->w = w2;
    node->x_sizes = x.sizes().vec();
    node->x_dtype = x.scalar_type(), node->w_dtype = w.scalar_type();
    node->set_next_edges(torch::autograd::collect_next_edges(x, w));
    torch::autograd::set_history(y, node);
    return y;
  });
}

}  // namespace hp
