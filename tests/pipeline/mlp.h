// A small MLP as plain tensors (Linear + tanh blocks, double precision), split into
// pipeline stages, with a single-process reference on the same numbers.
#pragma once

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <vector>

#include "hp/pipeline.h"

struct Mlp {
  std::vector<at::Tensor> weights, biases;  // one per block, never trained in place

  Mlp(int blocks, int dim, uint64_t seed) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
    for (int k = 0; k < blocks; ++k) {
      weights.push_back(at::randn({dim, dim}, gen, at::kDouble) / std::sqrt(double(dim)));
      biases.push_back(at::randn({dim}, gen, at::kDouble) * 0.1);
    }
  }
  int blocks() const { return static_cast<int>(weights.size()); }

  // Fresh leaves for blocks [begin, end): W, b, W, b, ...
  std::vector<at::Tensor> params(int begin, int end) const {
    std::vector<at::Tensor> p;
    for (int k = begin; k < end; ++k) {
      p.push_back(weights[k].clone().requires_grad_(true));
      p.push_back(biases[k].clone().requires_grad_(true));
    }
    return p;
  }
};

// Runs the blocks whose weights are in `p` (pairs W, b); works on [..., dim] inputs. Each
// linear reports its output for a split backward's W (weight_outputs.h).
inline at::Tensor run_blocks(const std::vector<at::Tensor>& p, at::Tensor x) {
  for (size_t i = 0; i < p.size(); i += 2) {
    at::Tensor y = at::linear(x, p[i], p[i + 1]);
    hp::WeightOutputRecorder::record(y, {p[i], p[i + 1]});
    x = at::tanh(y);
  }
  return x;
}

inline at::Tensor mse(const at::Tensor& out, const at::Tensor& target) { return (out - target).pow(2).mean(); }

// Stage s of `num_stages` owns an equal, contiguous share of the blocks.
inline hp::pipeline::PipelineStage mlp_stage(const Mlp& m, int s, int num_stages,
                                             std::shared_ptr<const hp::comm::Group> group) {
  int per = m.blocks() / num_stages;
  hp::pipeline::PipelineStage st;
  st.stage_index = s;
  st.num_stages = num_stages;
  st.parameters = m.params(s * per, (s + 1) * per);
  st.forward = [p = st.parameters](const at::Tensor& x) { return run_blocks(p, x); };
  if (st.is_last()) st.loss = mse;
  st.group = std::move(group);
  return st;
}

// This rank's stages for `sched`.
inline std::vector<hp::pipeline::PipelineStage> mlp_stages(const Mlp& m, const hp::schedule::Schedule& sched,
                                                           int rank,
                                                           std::shared_ptr<const hp::comm::Group> group) {
  std::vector<hp::pipeline::PipelineStage> out;
  for (int s : sched.stages_of(rank)) out.push_back(mlp_stage(m, s, sched.num_stages, group));
  return out;
}

// The reference: loss = mean over microbatches of the microbatch loss, in one process.
struct Reference {
  double loss = 0;
  std::vector<at::Tensor> grads;  // W0, b0, W1, b1, ...
};

inline Reference reference(const Mlp& m, const std::vector<at::Tensor>& xs, const std::vector<at::Tensor>& ys) {
  auto p = m.params(0, m.blocks());
  at::Tensor loss = at::zeros({}, at::kDouble);
  for (size_t i = 0; i < xs.size(); ++i) loss = loss + mse(run_blocks(p, xs[i]), ys[i]);
  loss = loss / double(xs.size());
  loss.backward();
  Reference r{loss.item<double>(), {}};
  for (auto& t : p) r.grads.push_back(t.grad());
  return r;
}

// |got - want| <= tol * max|want| elementwise in the max norm.
inline bool close_rel(const at::Tensor& got, const at::Tensor& want, double tol) {
  if (!got.defined() || got.sizes() != want.sizes()) return false;
  double scale = std::max(want.abs().max().item<double>(), 1e-300);
  return (got - want).abs().max().item<double>() <= tol * scale;
}
