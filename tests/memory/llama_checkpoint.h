// The tiny Llama of tests/parallel/llama_run.h with checkpointed regions, on a few layouts,
// compared bitwise with the same layout without checkpointing.
#pragma once

#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include "hp/memory.h"
#include "hp/tensor/memory_stats.h"
#include "parallel/llama_run.h"

namespace hp::testing {

enum class Layout { Single, Tp2, Fsdp3, Fsdp2Tp2 };

// `checkpointed` empty: no checkpointing.
inline LlamaRunSpec checkpointed_llama(Layout layout, std::vector<std::string> checkpointed,
                                       CheckpointOptions options = {}) {
  LlamaRunSpec spec;
  spec.batch = 6;  // rows split over 1, 2 or 3 dp ranks
  switch (layout) {
    case Layout::Single: break;
    case Layout::Tp2: spec.mesh_shape = {1, 2}, spec.mesh_names = {"dp", "tp"}; break;
    case Layout::Fsdp3: spec.mesh_shape = {3}; break;
    case Layout::Fsdp2Tp2: spec.mesh_shape = {2, 2}, spec.mesh_names = {"dp", "tp"}; break;
  }
  spec.parallelize = [layout, checkpointed, options](nn::Llama& model, const DeviceMesh& mesh) {
    std::function<void(bool)> sync;
    if (layout == Layout::Tp2 || layout == Layout::Fsdp2Tp2)
      parallelize_llama(model, mesh["tp"], {/*sequence_parallel=*/true, /*loss_parallel=*/true});
    if (!checkpointed.empty()) checkpoint_wrapper(model, checkpointed, options);
    if (layout == Layout::Fsdp3 || layout == Layout::Fsdp2Tp2) {
      FSDPModule root = fully_shard_llama(model, mesh["dp"]);
      sync = [root](bool on) mutable { root.set_requires_gradient_sync(on); };
    }
    return sync;
  };
  return spec;
}

inline void expect_identical(const LlamaRun& run, const LlamaRun& ref) {
  EXPECT_EQ(run.losses, ref.losses);
  EXPECT_LT(ref.losses.back(), ref.losses.front());  // training happened
  for (auto which : {&LlamaRun::first_grads, &LlamaRun::final_params})
    for (auto& [name, t] : ref.*which) {
      ASSERT_TRUE((run.*which).count(name)) << name;
      EXPECT_TRUE(at::equal((run.*which).at(name), t))
          << name << ": max abs diff " << ((run.*which).at(name) - t).abs().max().item<double>();
    }
}

inline void expect_same_as_without(Layout layout, std::vector<std::string> checkpointed,
                                   CheckpointOptions options = {}) {
  LlamaRun ref = train_llama(checkpointed_llama(layout, {}));
  expect_identical(train_llama(checkpointed_llama(layout, checkpointed, options)), ref);
}

// Bytes of CPU storage a forward of a 4-layer Llama leaves alive for its backward (once its
// swap writes, if any, have ended).
inline int64_t kept_after_forward(std::vector<std::string> checkpointed, CheckpointOptions options = {}) {
  int64_t kept = 0;
  comm::run_local_ranks(1, [&](int) {
    DeviceMesh mesh = init_device_mesh("cpu", {1}, {"dp"});
    manual_seed(3);
    nn::LlamaConfig c = tiny_llama();
    c.layers = 4, c.dim = 32, c.ffn_dim = 96, c.max_seq = 64;
    nn::Llama model(c, mesh);
    if (!checkpointed.empty()) checkpoint_wrapper(model, checkpointed, options);
    DTensor ids = distribute_tensor((rand({4, 64}, at::kDouble) * c.vocab).floor().to(at::kLong), mesh, {Replicate()});
    track_cpu_memory();
    const int64_t before = cpu_memory_allocated();
    DTensor logits = model(ids);
    memory::wait_for_swap_writes();  // swapped outputs leave memory once written
    kept = cpu_memory_allocated() - before;
    logits.to_local().sum().backward();
  });
  return kept;
}

}  // namespace hp::testing
