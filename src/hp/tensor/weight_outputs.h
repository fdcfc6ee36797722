// What a split backward (I, then W) needs to compute weight gradients alone. While a
// WeightOutputRecorder is alive on a thread, every op that owns parameters (each module
// with its own parameters, or any code that calls record) reports its output and those
// parameters. I then asks autograd for the gradients of the stage input and of these
// outputs in one pass, which runs every activation-gradient product once and no
// weight-gradient product; W runs, per recorded output, the backward from it to its own
// parameters only: the weight-gradient products, nothing twice.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

namespace hp {

struct WeightOutput {
  at::Tensor output;               // produced from `params` (and activations) in one op or module
  std::vector<at::Tensor> params;  // leaves that require grad
};

class WeightOutputRecorder {
 public:
  WeightOutputRecorder();  // records on this thread until destroyed (the previous one resumes)
  ~WeightOutputRecorder();
  WeightOutputRecorder(const WeightOutputRecorder&) = delete;
  WeightOutputRecorder& operator=(const WeightOutputRecorder&) = delete;

  std::vector<WeightOutput> take() { return std::move(recorded_); }

  // Whether a recorder is alive on this thread.
  static bool recording();
  // Reports an output and the parameters it was computed from, if a recorder is alive on
  // this thread and the output needs a gradient; otherwise does nothing.
  static void record(const at::Tensor& output, std::vector<at::Tensor> params);

 private:
  std::vector<WeightOutput> recorded_;
  WeightOutputRecorder* previous_;
};

}  // namespace hp
