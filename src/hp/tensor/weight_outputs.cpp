#include "hp/tensor/weight_outputs.h"

namespace hp {
namespace {

thread_local WeightOutputRecorder* active = nullptr;

}  // namespace

WeightOutputRecorder::WeightOutputRecorder() : previous_(active) { active = this; }

WeightOutputRecorder::~WeightOutputRecorder() { active = previous_; }

bool WeightOutputRecorder::recording() { return active != nullptr; }

void WeightOutputRecorder::record(const at::Tensor& output, std::vector<at::Tensor> params) {
  if (!active || !output.defined() || !output.requires_grad() || params.empty()) return;
  active->recorded_.push_back({output, std::move(params)});
}

}  // namespace hp
