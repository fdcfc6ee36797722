// What scripts/gpu_check runs on a machine with a GPU (built with HP_CUDA): DTensor ops and
// a tensor-parallel Llama step on the GPU against the same on the CPU, the NCCL process
// group with world size 1, a bf16 training step, activations swapped to pinned host memory
// through a copy stream (memory::HostTier), a memory budget's left-out products there too,
// blocks recomputed (the down projections' products left out) and with their MLPs in token
// chunks (stand-ins on the device), fully_shard with CPUOffloadPolicy, and the FP8 Linear
// (through _scaled_mm) against the CPU's emulated one. Prints one line per check and
// `RESULT gpu_check pass|fail` last.
#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>

#include <cmath>
#include <iostream>
#include <string>

#include "hp/hp.h"
#include "hp/tensor/fp8_linear.h"
#include "hp/tensor/fp8_matmul.h"

using namespace hp;

namespace {

int failures = 0;

void check(bool ok, const std::string& what) {
  std::cout << (ok ? "ok    " : "FAIL  ") << what << std::endl;
  if (!ok) ++failures;
}

bool close(const at::Tensor& gpu, const at::Tensor& cpu, double rtol, double atol) {
  return gpu.sizes() == cpu.sizes() && at::allclose(gpu.cpu().to(at::kFloat), cpu.to(at::kFloat), rtol, atol);
}

nn::LlamaConfig tiny() {
  nn::LlamaConfig c;
  c.vocab = 64, c.dim = 64, c.layers = 2, c.heads = 4, c.kv_heads = 2, c.ffn_dim = 128, c.max_seq = 32;
  return c;
}

void ops(const DeviceMesh& cpu, const DeviceMesh& gpu) {
  manual_seed(0);
  at::Tensor x = hp::randn({8, 16}), w = hp::randn({32, 16}), n = hp::randn({16});
  at::Tensor q = hp::randn({2, 4, 9, 8}), k = hp::randn({2, 2, 9, 8}), v = hp::randn({2, 2, 9, 8});
  auto on = [](const at::Tensor& t, const DeviceMesh& m) {
    return distribute_tensor(m.device_type() == "cuda" ? t.cuda() : t, m, {Replicate()});
  };
  auto both = [&](const std::string& name, const std::function<DTensor(const DeviceMesh&)>& f) {
    at::Tensor want = f(cpu).full_tensor(), got = f(gpu).full_tensor();
    check(got.is_cuda() && close(got, want, 1e-4, 1e-5), "DTensor " + name + " on cuda equals cpu");
  };
  both("linear", [&](const DeviceMesh& m) { return linear(on(x, m), on(w, m)); });
  both("softmax", [&](const DeviceMesh& m) { return softmax(on(x, m), -1); });
  both("rms_norm", [&](const DeviceMesh& m) { return rms_norm(on(x, m), on(n, m)); });
  both("attention (causal, gqa)",
       [&](const DeviceMesh& m) { return scaled_dot_product_attention(on(q, m), on(k, m), on(v, m), true); });
}

// One step of the tiny Llama, tensor parallel over a mesh of one, from the same weights.
struct Step {
  double loss;
  std::map<std::string, at::Tensor> grads, params;
};

// `memory`: swaps or recomputes activations (nothing when empty).
Step llama_step(const DeviceMesh& mesh, const std::map<std::string, at::Tensor>& init, bool bf16,
                const std::function<void(nn::Llama&)>& memory = {}) {
  nn::Llama model(tiny(), mesh);
  parallelize_llama(model, mesh["tp"]);
  if (memory) memory(model);
  for (auto& [name, p] : model.named_parameters()) {
    at::NoGradGuard no_grad;
    p->to_local().copy_(init.at(name));
  }
  optim::AdamWOptions adamw;
  adamw.lr = 1e-2;
  optim::AdamW opt(model.parameters(), adamw);
  manual_seed(3);
  at::Tensor tokens = (hp::rand({4, 33}, at::kDouble) * 64).floor().to(at::kLong);
  if (mesh.device_type() == "cuda") tokens = tokens.cuda();
  DTensor ids = distribute_tensor(tokens.narrow(1, 0, 32).contiguous(), mesh, {Replicate(), Replicate()});
  DTensor targets = distribute_tensor(tokens.narrow(1, 1, 32).contiguous(), mesh, {Replicate(), Replicate()});
  if (bf16) {
    at::autocast::set_autocast_enabled(at::kCUDA, true);
    at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16);
  }
  DTensor loss = model.loss(ids, targets);
  if (bf16) {
    at::autocast::set_autocast_enabled(at::kCUDA, false);
    at::autocast::clear_cache();
  }
  loss.to_local().backward();
  Step s{loss.full_tensor().item<double>(), {}, {}};
  for (auto& [name, p] : model.named_parameters()) s.grads[name] = p->grad()->full_tensor().cpu();
  opt.step();
  for (auto& [name, p] : model.named_parameters()) s.params[name] = p->full_tensor().cpu();
  return s;
}

void llama(const DeviceMesh& cpu, const DeviceMesh& gpu) {
  manual_seed(1);
  std::map<std::string, at::Tensor> init;
  {
    nn::Llama model(tiny(), cpu);
    for (auto& [name, p] : model.named_parameters()) init[name] = p->full_tensor().clone();
  }
  Step want = llama_step(cpu, init, false), got = llama_step(gpu, init, false);
  check(std::abs(got.loss - want.loss) < 1e-4 * want.loss, "TP Llama loss on cuda " + std::to_string(got.loss) +
                                                               " equals cpu " + std::to_string(want.loss));
  bool grads = true, params = true;
  for (auto& [name, g] : want.grads) grads = grads && close(got.grads.at(name), g, 1e-3, 1e-5);
  for (auto& [name, p] : want.params) params = params && close(got.params.at(name), p, 1e-4, 1e-5);
  check(grads, "TP Llama gradients on cuda equal cpu");
  check(params, "TP Llama parameters after an AdamW step on cuda equal cpu");
  auto same_step = [&](const Step& s, double rtol) {
    bool same = std::abs(s.loss - got.loss) <= rtol * std::abs(got.loss);
    for (auto& [name, g] : got.grads) same = same && close(s.grads.at(name), g, rtol, 1e-7);
    for (auto& [name, p] : got.params) same = same && close(s.params.at(name), p, rtol, 1e-7);
    return same;
  };
  Step swapped = llama_step(gpu, init, false, [](nn::Llama& m) {
    swap_wrapper(m, {"layers.*"}, std::make_shared<memory::HostTier>());
  });
  check(same_step(swapped, 1e-6),
        "activations swapped to pinned host memory (HostTier, copy stream): the step's numbers unchanged");
  Step budget_swapped = llama_step(gpu, init, false, [](nn::Llama& m) {
    CheckpointOptions o;
    o.memory_budget = 0.4;
    o.swap_tier = std::make_shared<memory::HostTier>();
    checkpoint_wrapper(m, {"layers.*"}, o);
  });
  check(same_step(budget_swapped, 1e-6),
        "memory budget 0.4 with the products it leaves out in pinned host memory: the step's numbers unchanged");
  const int64_t left_out = memory::products_left_out();
  Step blocks = llama_step(gpu, init, false, [](nn::Llama& m) { checkpoint_wrapper(m, {"layers.*"}); });
  check(same_step(blocks, 1e-6) && memory::products_left_out() > left_out,
        "blocks recomputed on cuda, the down projections' products left out of the recompute: the step's numbers "
        "(rtol 1e-6)");
  Step chunked = llama_step(gpu, init, false, [](nn::Llama& m) {
    checkpoint_wrapper(m, {"layers.*"});
    CheckpointOptions o;
    o.token_chunks = 4;
    checkpoint_wrapper(m, {"layers.*.mlp"}, o);
  });
  check(same_step(chunked, 1e-5),
        "blocks recomputed with their MLPs as regions in 4 token chunks on cuda: the step's numbers (rtol 1e-5)");
  Step half = llama_step(gpu, init, true);
  check(std::isfinite(half.loss) && std::abs(half.loss - want.loss) < 0.02 * want.loss,
        "bf16 (autocast) Llama step: loss " + std::to_string(half.loss) + " near float32 " +
            std::to_string(want.loss));
}

// A device tensor through the host tier: pinned, copied on the copy stream, back in order.
void host_tier() {
  memory::HostTier tier;
  at::Tensor t = at::randn({1 << 20}, at::TensorOptions().device(at::kCUDA));
  const at::Tensor want = t.cpu();
  tier.write("t", t * 1);  // a temporary: the allocator must keep it until the copy ends
  at::Tensor back = at::empty_like(t);
  tier.read("t", back);
  check(at::equal(back.cpu(), want) && tier.resident_bytes() == 4 << 20,
        "HostTier: a CUDA tensor to pinned host memory and back");
}

// fully_shard with CPUOffloadPolicy on cuda: shards and gradient shards in pinned host
// memory between uses, brought back for AdamW; the same numbers as without offload.
void fsdp_offload() {
  DeviceMesh mesh = init_device_mesh("cuda", {1}, {"dp"});
  auto step = [&](bool offload) {
    manual_seed(5);
    nn::Llama model(tiny(), mesh);
    FullyShardOptions o;
    if (offload) o.offload_policy = CPUOffloadPolicy{};
    FSDPModule root = fully_shard_llama(model, mesh["dp"], o);
    const at::Tensor tokens = (hp::rand({2, 9}, at::kDouble) * tiny().vocab).floor().to(at::kLong).cuda();
    DTensor ids = distribute_tensor(tokens.narrow(1, 0, 8).contiguous(), mesh, {Replicate()});
    DTensor targets = distribute_tensor(tokens.narrow(1, 1, 8).contiguous(), mesh, {Replicate()});
    optim::AdamW opt(model.parameters());
    Step s;
    DTensor loss = model.loss(ids, targets);
    s.loss = loss.to_local().item<double>();
    loss.to_local().backward();
    root.bring_in_offloaded();  // a no-op without offload
    for (auto& [name, p] : model.named_parameters()) s.grads[name] = p->grad()->full_tensor().cpu();
    opt.step();
    for (auto& [name, p] : model.named_parameters()) s.params[name] = p->full_tensor().cpu();
    return s;
  };
  const Step plain = step(false), offloaded = step(true);
  bool same = offloaded.loss == plain.loss;
  for (auto& [name, g] : plain.grads) same = same && at::equal(offloaded.grads.at(name), g);
  for (auto& [name, p] : plain.params) same = same && at::equal(offloaded.params.at(name), p);
  check(same, "fully_shard with CPUOffloadPolicy on cuda: loss, gradients and an AdamW step equal without offload");
}

// The FP8 Linear's forward and backward on cuda (at::_scaled_mm for tensorwise and rowwise
// where the device and LibTorch take them; mx_block emulated) against the CPU's emulated
// path on the same values. The quantized operands are the same on both (exact amaxes, the
// same scale arithmetic and rounding); only the float32 products differ, in their order of
// accumulation and in multiplying by 1 / scale instead of dividing: relative 1e-3 of the
// largest entry. Each line says which path each product took.
void fp8(const DeviceMesh& cpu, const DeviceMesh& gpu) {
  manual_seed(4);
  at::Tensor x = hp::randn({64, 128}), w = hp::randn({96, 128}) / std::sqrt(128.0), dy = hp::randn({64, 96}) * 1e-2;
  struct Out {
    at::Tensor y, dx, dw;
  };
  auto run = [&](const DeviceMesh& m, Fp8Scaling s) {
    auto on = [&](const at::Tensor& t) { return m.device_type() == "cuda" ? t.cuda() : t; };
    DTensor dx = distribute_tensor(on(x), m, {Replicate()}), dw = distribute_tensor(on(w), m, {Replicate()});
    dx.requires_grad_(true);
    dw.requires_grad_(true);
    Fp8LinearOptions o;
    o.scaling = s;
    DTensor y = Fp8Linear(o)(dx, dw);
    (y.to_local() * on(dy)).sum().backward();
    return Out{y.full_tensor().cpu(), dx.grad()->full_tensor().cpu(), dw.grad()->full_tensor().cpu()};
  };
  auto near = [](const at::Tensor& got, const at::Tensor& want) {
    return close(got, want, 1e-3, 1e-3 * want.abs().max().item<double>());
  };
  for (Fp8Scaling s : {Fp8Scaling::Tensorwise, Fp8Scaling::Rowwise, Fp8Scaling::MxBlock}) {
    const Out want = run(cpu, s), got = run(gpu, s);
    // The path of each product: the formats and shapes of forward, dX and dW on cuda.
    auto q = [](int64_t rows, int64_t k, Fp8Format f) {
      return fp8_cast(at::ones({rows, k}, at::TensorOptions().device(at::kCUDA)),
                      at::ones({rows, 1}, at::TensorOptions().device(at::kCUDA)), f);
    };
    auto path = [&](const Fp8Tensor& a, const Fp8Tensor& b) {
      const std::string why = fp8_mm_fallback(a, b, s);
      return why.empty() ? std::string("_scaled_mm") : "emulated (" + why + ")";
    };
    const std::string paths = "y: " + path(q(64, 128, Fp8Format::E4M3), q(96, 128, Fp8Format::E4M3)) +
                              "; dX: " + path(q(64, 96, Fp8Format::E5M2), q(128, 96, Fp8Format::E4M3)) +
                              "; dW: " + path(q(96, 64, Fp8Format::E5M2), q(128, 64, Fp8Format::E4M3));
    check(near(got.y, want.y) && near(got.dx, want.dx) && near(got.dw, want.dw),
          std::string("FP8 Linear ") + to_string(s) + " forward/backward on cuda equals the cpu's emulated path [" +
              paths + "]");
  }
}

void nccl() {
  auto group = comm::current_world()->world_group("cuda");
  std::vector<at::Tensor> t{at::full({1024}, 3.0, at::TensorOptions().device(at::kCUDA))};
  c10d::AllreduceOptions opts;
  auto work = group->backend().allreduce(t, opts);
  work->wait();
  check(group->backend().getBackendName() == "nccl" && at::equal(t[0].cpu(), at::full({1024}, 3.0)),
        "NCCL process group (" + group->backend().getBackendName() + "), world size 1: all-reduce");
}

}  // namespace

int main() {
  try {
    check(at::hasCUDA(), "LibTorch sees CUDA");
    if (at::hasCUDA()) {
      comm::run_local_ranks(1, [](int) {
        DeviceMesh cpu = init_device_mesh("cpu", {1, 1}, {"dp", "tp"});
        DeviceMesh gpu = init_device_mesh("cuda", {1, 1}, {"dp", "tp"});
        ops(cpu["tp"], gpu["tp"]);
        llama(cpu, gpu);
        host_tier();
        fsdp_offload();
        fp8(cpu["tp"], gpu["tp"]);
        nccl();
      });
    }
  } catch (const std::exception& e) {
    check(false, std::string("no exception: ") + e.what());
  }
  std::cout << "RESULT gpu_check " << (failures == 0 ? "pass" : "fail") << std::endl;
  return failures == 0 ? 0 : 1;
}
