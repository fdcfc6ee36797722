#include <gtest/gtest.h>

#include "hp/base/error.h"
#include "hp/plan/memory.h"
#include "hp/plan/pipeline_profile.h"

using namespace hp::plan;

// The tiny model: h = 128, q = 128, kv = 64, 4 heads, ffn 384, vocab 256, seq 128.
TEST(Memory, ActivationBytesPerTokenByHand) {
  ModelDesc m = model_preset("tiny");
  // none: attention 2h + 2h + 2(q + 2kv) + 2q + 4*heads = 256 + 256 + 512 + 256 + 16 = 1296,
  // norm2 in/out 512, SwiGLU 6f = 2304.
  EXPECT_DOUBLE_EQ(layer_activation_bytes_per_token(m, false, Recompute::None), 4112);
  // selective drops both norm outputs (4h = 512) and act*up (2f = 768).
  EXPECT_DOUBLE_EQ(layer_activation_bytes_per_token(m, false, Recompute::Selective), 2832);
  EXPECT_DOUBLE_EQ(layer_activation_bytes_per_token(m, false, Recompute::Full), 256);
}

TEST(Memory, StageMemoryByHand) {
  ModelDesc m = model_preset("tiny");
  Strategy s = resolve_strategy(parse_strategy("dp=1,tp=2,pp=2,mbs=2,mb=4"), m, 4);
  auto stages = split_stages(m, 2, 1, "1f1b");

  // Rank of stage 0: 2 layers + embedding, split over tp = 2.
  //   attention: 2*128*128/2 (q, o) + 2*128*64/2 (k, v) + 256 (norms) = 24832
  //   mlp: 3*128*384/2 = 73728; embedding 256*128/2 = 16384
  const double p0 = 2 * (24832 + 73728) + 16384;
  const std::vector<double> inflight = inflight_microbatches({"1f1b", 2, 4, 1});  // 2 on rank 0, 1 on rank 1
  MemoryBreakdown m0 = stage_memory(m, s, stages[0], 0, inflight[0]);
  EXPECT_DOUBLE_EQ(m0.params, 2 * p0);
  EXPECT_DOUBLE_EQ(m0.grads, 4 * p0);
  EXPECT_DOUBLE_EQ(m0.optimizer, 12 * p0);
  // 2 sequences * 128 tokens, 2 layers * 4112 B/token, / tp 2, times 2 microbatches in flight (1F1B, p=2).
  EXPECT_DOUBLE_EQ(m0.activations, 2 * (256 * 2 * 4112 / 2.0));
  EXPECT_DOUBLE_EQ(m0.logits, 0);
  EXPECT_DOUBLE_EQ(m0.zero_buffers, 0);

  // Last stage: one microbatch in flight, head 256*128/2 + final norm 128, logits 6 B per
  // entry; the inputs of the 3 other microbatches, received into buffers posted at the
  // step's start (256 tokens * 128 / 2, bf16).
  MemoryBreakdown m1 = stage_memory(m, s, stages[1], 1, inflight[1]);
  const double p1 = 2 * (24832 + 73728) + 16384 + 128;
  EXPECT_DOUBLE_EQ(m1.params, 2 * p1);
  EXPECT_DOUBLE_EQ(m1.activations, 256 * 2 * 4112 / 2.0);
  EXPECT_DOUBLE_EQ(m1.stage_inputs, 3 * 256 * 128 / 2.0 * 2);
  // The first stage reads its own data; it keeps the outputs of its 2 microbatches in
  // flight and the buffers posted for their gradients.
  EXPECT_DOUBLE_EQ(m0.stage_inputs, 2 * 2 * 256 * 128 / 2.0 * 2);
  EXPECT_DOUBLE_EQ(m1.logits, 256 * 256 / 2.0 * 6);
}

TEST(Memory, FsdpShardsStatesAndAddsUnitBuffers) {
  ModelDesc m = model_preset("tiny");
  Strategy plain = resolve_strategy(parse_strategy("dp=4"), m, 4);
  Strategy sharded = resolve_strategy(parse_strategy("dp=4,fsdp=1"), m, 4);
  auto st = split_stages(m, 1, 1, "1f1b");
  MemoryBreakdown a = stage_memory(m, plain, st[0], 0, 1), b = stage_memory(m, sharded, st[0], 0, 1);
  EXPECT_DOUBLE_EQ(b.params * 4, a.params);
  EXPECT_DOUBLE_EQ(b.optimizer * 4, a.optimizer);
  // Largest unit is a layer (196864 params): two gathered bf16 copies and one fp32 gradient,
  // and the send buffers: its bf16 shard (a quarter) and its fp32 gradient to reduce.
  EXPECT_DOUBLE_EQ(b.zero_buffers, 196864.0 * (2 * 2 + 4) + 196864.0 * (2 / 4.0 + 4));
}

// ZeRO-1 and -2 keep every parameter gathered through a step of 8 microbatches: the bf16
// copy of the whole model plus the reducing unit's gradient and the send buffers (its
// gradient, 2 x 196864 x 4 bytes, and its bf16 shard, 196864 / 4 x 2). ZeRO-1 accumulates
// the whole fp32 gradient unsharded as well.
TEST(Memory, ZeroStagesTradeMemoryForGathers) {
  ModelDesc m = model_preset("tiny");
  auto st = split_stages(m, 1, 1, "1f1b");
  MemoryBreakdown plain = stage_memory(m, resolve_strategy(parse_strategy("dp=4,mb=8"), m, 4), st[0], 0, 1);
  std::vector<MemoryBreakdown> z;
  for (int stage = 1; stage <= 3; ++stage)
    z.push_back(stage_memory(m, resolve_strategy(parse_strategy("dp=4,mb=8,zero=" + std::to_string(stage)), m, 4),
                             st[0], 0, 1));
  const double whole = plain.params / 2;  // bf16 parameters
  for (const MemoryBreakdown& b : z) {
    EXPECT_DOUBLE_EQ(b.optimizer * 4, plain.optimizer);
    EXPECT_DOUBLE_EQ(b.params * 4, plain.params);
  }
  EXPECT_DOUBLE_EQ(z[0].zero_buffers, whole * 2 + 2 * 196864.0 * 4 + 196864.0 / 4 * 2);
  EXPECT_DOUBLE_EQ(z[1].zero_buffers, z[0].zero_buffers);
  EXPECT_DOUBLE_EQ(z[0].grads, plain.grads + plain.grads / 4);
  EXPECT_DOUBLE_EQ(z[1].grads, plain.grads / 4);
  EXPECT_GT(z[0].total(), z[1].total());
  EXPECT_GT(z[1].total(), z[2].total());
  // One microbatch: ZeRO-1 reduces at once, as ZeRO-2.
  MemoryBreakdown one = stage_memory(m, resolve_strategy(parse_strategy("dp=4,mb=1,zero=1"), m, 4), st[0], 0, 1);
  EXPECT_DOUBLE_EQ(one.grads, z[1].grads);
}

TEST(Memory, ExpertsSplitOverEp) {
  ModelDesc m = model_preset("deepseek-v3-like");
  auto st = split_stages(m, 1, 1, "1f1b");
  Strategy e1 = resolve_strategy(parse_strategy("dp=8,ep=1"), m, 8);
  Strategy e8 = resolve_strategy(parse_strategy("dp=1,ep=8"), m, 8);
  StageParams a = stage_params(m, e1, st[0]), b = stage_params(m, e8, st[0]);
  EXPECT_DOUBLE_EQ(a.expert, 8 * b.expert);
  EXPECT_DOUBLE_EQ(a.dense, b.dense);
}

// The bench_3m model (h 256, 8 heads, 4 kv heads, ffn 688, vocab 256) at seq 256.
ModelDesc bench_3m() {
  ModelDesc m;
  m.name = "bench_3m";
  m.layers = 4, m.hidden = 256, m.heads = 8, m.kv_heads = 4, m.ffn = 688, m.vocab = 256, m.seq_len = 256;
  return m;
}

// hp::nn's eager layer, counted by hand for the bench_3m model (h 256, 8 heads of 32,
// 4 kv heads, ffn 688) at seq 256.
TEST(Memory, EagerActivationsByHand) {
  ModelDesc m = bench_3m();
  // Norms 2 x (input 256 + 1/rms + output 256); attention 2 x 256 (rotated q, the output,
  // which o_proj reads as a view) + 2 x 128 (rotated k, v) + 8 heads' log-sum-exp; SwiGLU
  // 3 x 688 (gate, up, their product).
  EXPECT_DOUBLE_EQ(eager_layer_activation_elements(m, 1), 1026 + 776 + 2064);
  // t = 2 with sequence parallelism: each norm h/2 + 1/2 + the gathered h = 384.5;
  // attention 2 x 128 + 2 x 64 + 4 = 388; SwiGLU 3 x 344 = 1032.
  EXPECT_DOUBLE_EQ(eager_layer_activation_elements(m, 2), 769 + 388 + 1032);
  EXPECT_THROW(eager_layer_activation_elements(m, 1, /*moe_layer=*/true), hp::Error);
  // A MoE layer: the same norms and attention; router 2E + k, then per routed copy 2h + 3F.
  m.experts = 8, m.top_k = 2, m.moe_ffn = 64;
  EXPECT_DOUBLE_EQ(eager_layer_activation_elements(m, 1, true), 1026 + 776 + 16 + 2 + 2 * (512 + 192));
}

// Selective checkpointing of the same layer keeps the input x, q and k, v, the attention
// output and 8 log-sum-exps, the reduce-scattered o_proj output, gate and up; with
// sequence parallelism each norm's all-gathered output (a collective's) too.
TEST(Memory, EagerSelectiveActivationsByHand) {
  ModelDesc m = bench_3m();
  EXPECT_DOUBLE_EQ(eager_selective_layer_activation_elements(m, 1), 256 + 256 + 256 + 256 + 256 + 8 + 2 * 688);
  EXPECT_DOUBLE_EQ(eager_selective_layer_activation_elements(m, 2), 128 + 128 + 512 + 128 + 128 + 128 + 4 + 688);
  // A MoE layer drops what the attention half drops, the norms' outputs (2 x 256) and
  // 1/rms (2), and keeps all its MoE half keeps.
  ModelDesc moe = m;
  moe.experts = 8, moe.top_k = 2, moe.moe_ffn = 64;
  EXPECT_DOUBLE_EQ(eager_selective_layer_activation_elements(moe, 1, true),
                   eager_layer_activation_elements(moe, 1, true) - 2 * 256 - 2);
  Strategy s;
  s.dp = 1, s.global_batch = 1, s.micro_batch = 1, s.microbatches = 1;
  StageContents all;
  all.dense_layers = 4, all.embedding = true, all.head = true;
  const Numerics eager = numerics_preset("fp32-eager");
  const double none = stage_memory(m, s, all, 0, 1, eager).activations;
  s.recompute = Recompute::Selective;
  // Four layers kept selectively, and one layer's dropped tensors back during its backward;
  // the backward's working set (the gradient of SwiGLU's output, 688 per token) is under
  // the head's logits term (1281) in both, and adds nothing.
  EXPECT_DOUBLE_EQ(stage_memory(m, s, all, 0, 1, eager).activations,
                   none * (4 * 2664.0 + (3866 - 2664)) / (4 * 3866.0));
}

// A layer's backward holds the gradient of SwiGLU's output (688 per token) beside the saved
// activations (SwiGLU writes its own gradients over gate and up); on the stage with the head
// the two peaks come at different times and the larger counts: its logits' term (1281 per
// token), or what the working set exceeds it by.
TEST(Memory, EagerBackwardWorkingSet) {
  ModelDesc m = bench_3m();
  Strategy s;
  s.dp = 1, s.global_batch = 1, s.micro_batch = 1, s.microbatches = 1;
  StageContents body;
  body.dense_layers = 2;
  const Numerics eager = numerics_preset("fp32-eager");
  EXPECT_DOUBLE_EQ(stage_memory(m, s, body, 0, 1, eager).activations, 256 * 4 * (2 * 3866.0 + 688));
  body.head = true;
  const MemoryBreakdown with_head = stage_memory(m, s, body, 0, 1, eager);
  EXPECT_DOUBLE_EQ(with_head.activations, 256 * 4 * 2 * 3866.0);
  EXPECT_DOUBLE_EQ(with_head.logits, 256 * 4 * 1281.0);
  // Recomputed, each layer keeps its input (256) and the one whose backward runs has all
  // of its activations back, and the gradient of SwiGLU's output (688) beside them; SwiGLU
  // writes its two gradients over gate and up. With the head, that comes after the head's
  // backward: the larger counts.
  s.recompute = Recompute::Full;
  EXPECT_DOUBLE_EQ(stage_memory(m, s, body, 0, 1, eager).activations, 256 * 4 * (2 * 256 + 3866.0 + 688 - 1281));
  body.head = false;
  EXPECT_DOUBLE_EQ(stage_memory(m, s, body, 0, 1, eager).activations, 256 * 4 * (2 * 256 + 3866.0 + 688));
}

// full_chunked: the layer whose backward runs has its attention half back (3866 less the
// SwiGLU's 3 x 688), one of 4 token chunks of the MLP's SwiGLU and its output's gradient
// (4 x 688 / 4), and the MLP input's gradient (256). Under sequence parallelism the chunks
// are whole sequences: with one sequence a microbatch, one chunk, full's count.
TEST(Memory, EagerFullChunkedHoldsOneChunkOfTheMlp) {
  ModelDesc m = bench_3m();
  Strategy s;
  s.dp = 1, s.global_batch = 1, s.micro_batch = 1, s.microbatches = 1, s.recompute = Recompute::FullChunked;
  StageContents body;
  body.dense_layers = 2;
  const Numerics eager = numerics_preset("fp32-eager");
  EXPECT_DOUBLE_EQ(stage_memory(m, s, body, 0, 1, eager).activations,
                   256 * 4 * (2 * 256 + 3866.0 - 3 * 688 + 4 * 688 / 4.0 + 256));
  EXPECT_DOUBLE_EQ(layer_activation_bytes_per_token(m, false, Recompute::FullChunked),
                   layer_activation_bytes_per_token(m, false, Recompute::Full));  // the layer's input
  s.tp = 2;
  Strategy full = s;
  full.recompute = Recompute::Full;
  EXPECT_DOUBLE_EQ(stage_memory(m, s, body, 0, 1, eager).activations,
                   stage_memory(m, full, body, 0, 1, eager).activations);
}

TEST(Memory, Fp32EagerNumericsCountBytesAndBuckets) {
  ModelDesc m = model_preset("tiny");
  auto st = split_stages(m, 1, 1, "1f1b");
  const Numerics n = numerics_preset("fp32-eager");
  Strategy ddp = resolve_strategy(parse_strategy("dp=2"), m, 2);
  MemoryBreakdown b = stage_memory(m, ddp, st[0], 0, 1, n);
  EXPECT_DOUBLE_EQ(b.params, b.grads);
  EXPECT_DOUBLE_EQ(b.optimizer, 2 * b.params);  // m and v, no master copy
  EXPECT_DOUBLE_EQ(b.ddp_buckets, b.grads);
  Strategy single = resolve_strategy(parse_strategy("dp=1"), m, 1);
  EXPECT_DOUBLE_EQ(stage_memory(m, single, st[0], 0, 1, n).ddp_buckets, 0);
  EXPECT_THROW(numerics_preset("fp8"), hp::Error);
}

// The optimizer step frees the gradients, and the backward brings them back as it frees
// each layer's activations: with one microbatch per step the peak is at one end of the
// backward (every activation beside the head's gradient, or every gradient beside the first
// layer's activations and what its backward rematerializes); with several, the first
// microbatches' gradients wait beside the later ones' activations.
TEST(Memory, GradientsMeetActivationsOnlyAcrossMicrobatches) {
  ModelDesc m = model_preset("tiny");
  auto st = split_stages(m, 1, 1, "1f1b");
  const Numerics n = numerics_preset("fp32-eager");
  Strategy one = resolve_strategy(parse_strategy("dp=2,mb=1"), m, 2);
  Strategy two = resolve_strategy(parse_strategy("dp=2,mb=2"), m, 2);
  MemoryBreakdown a = stage_memory(m, one, st[0], 0, 1, n), b = stage_memory(m, two, st[0], 0, 1, n);
  const StageParams p = stage_params(m, one, st[0]);
  const double head_share = double(m.vocab) * m.hidden / (p.dense + p.expert);
  EXPECT_NEAR(a.grads_at_activation_peak, a.grads * head_share, 1e-6 * a.grads);
  EXPECT_GT(a.activations_at_gradient_peak, 0);
  EXPECT_LT(a.activations_at_gradient_peak, a.activations / 2);
  const double fixed = a.params + a.optimizer + a.ddp_buckets;
  EXPECT_DOUBLE_EQ(a.total(), fixed + std::max(a.grads_at_activation_peak + a.activations + a.logits,
                                               a.grads + a.activations_at_gradient_peak));
  EXPECT_DOUBLE_EQ(b.total(), b.params + b.optimizer + b.ddp_buckets + b.grads + b.activations + b.logits);
  // A short sequence: the gradients outweigh the activations; the peak is the backward's end.
  ModelDesc short_seq = m;
  short_seq.seq_len = 8;
  Strategy lean = resolve_strategy(parse_strategy("dp=2,mb=1,mbs=1"), short_seq, 2);
  MemoryBreakdown c = stage_memory(short_seq, lean, st[0], 0, 1, n);
  ASSERT_GT(c.grads, c.activations + c.logits);
  EXPECT_DOUBLE_EQ(c.total(), c.params + c.optimizer + c.ddp_buckets + c.grads + c.activations_at_gradient_peak);
  // Recompute rematerializes a layer at the backward's end too: more than the saved share.
  Strategy recompute = resolve_strategy(parse_strategy("dp=2,mb=1,recompute=full"), m, 2);
  MemoryBreakdown f = stage_memory(m, recompute, st[0], 0, 1, n);
  EXPECT_GT(f.activations_at_gradient_peak, f.activations / 2);
  EXPECT_LT(f.grads_at_activation_peak, f.grads);
}
