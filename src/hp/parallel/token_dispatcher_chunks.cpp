// Expert parallelism's exchange in chunks, overlapped with the experts.
//
// The rows bound for this rank's own experts need no exchange: half of them are the first
// chunk, whose experts run at once while the first remote chunk's rows travel, and half
// the last, which runs while the last remote chunk's results travel back. The others' rows
// go in num_chunks chunks by token. Forward: every remote chunk's dispatch all-to-all is
// posted at once (the progress engine runs them in order); the first local chunk's experts
// run, then chunk c's when it lands, while chunks c+1.. move, and its combine all-to-all is
// posted at once, moving behind chunk c+1's experts; the shared experts (behind_exchange)
// run behind the last one. Backward, in one graph node, the same order: every remote
// chunk's combine gradient is posted at once, and chunk c's dispatch gradient goes back
// behind chunk c+1's expert backward.
//
// Each chunk's experts record their own graph, on leaves standing for the chunk's tokens
// and the expert weights; the node's backward runs them one by one (as activation
// checkpointing's node does) and sums the weights' gradients over the chunks in chunk
// order. Tokens and routing are those of one unchunked dispatch (capacity is applied
// before chunking), so the experts see row subsets of the same products: the forward is
// bitwise the unchunked one where the matrix kernels treat rows alike; the weight
// gradients are sums of C + 2 partial products, equal up to float rounding.
#include <ATen/ATen.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <chrono>
#include <string>

#include "hp/base/error.h"
#include "hp/comm/collectives.h"
#include "hp/comm/trace.h"
#include "hp/layout/shard_spec.h"
#include "hp/parallel/token_dispatcher_chunks.h"
#include "hp/tensor/op_observer.h"
#include "hp/tensor/weight_outputs.h"

namespace hp {
namespace {

using torch::autograd::variable_list;

// "experts chunk 1: 24 rows", "experts chunk 0: 12 local rows".
std::string span_name(const char* what, size_t chunk, int64_t rows, bool local) {
  if (!trace::enabled()) return {};
  return std::string(what) + " chunk " + std::to_string(chunk) + ": " + std::to_string(rows) + (local ? " local" : "") +
         " rows";
}

// Arrived rows [N, D] (by source, then expert) in expert order; `order` undefined: already.
at::Tensor in_expert_order(const at::Tensor& rows, const at::Tensor& order) {
  return order.defined() ? nn::select_rows(rows, order) : rows;
}

// The inverse: rows in expert order put back by source.
at::Tensor by_source(const at::Tensor& rows, const at::Tensor& order) {
  return order.defined() ? nn::place_rows(rows, order, rows.size(0)) : rows;
}

struct ChunkedExperts {
  using Plan = AllToAllTokenDispatcher::ChunkPlan;
  const comm::Group* group;
  std::shared_ptr<const Plan> plan;
  std::shared_ptr<double> seconds;  // time spent waiting on the exchanges
  int64_t dim = 0;
  at::ScalarType dtype = at::kFloat;
  at::TensorOptions options;
  bool tokens_need_grad = false;
  std::vector<at::Tensor> weights;  // leaves standing for the experts' weights
  // Per chunk, the experts' graph ends: the input rows (a leaf the graph keeps anyway), and
  // the output's edge into the graph rather than the output, whose rows the graph does not
  // keep and the combine has already sent.
  std::vector<at::Tensor> inputs;
  torch::autograd::edge_list outputs;

  // Chunk c's rows to the ranks of their experts (back: from them); the local chunks' stay.
  comm::Pending exchange(const at::Tensor& rows, size_t c, bool back) const {
    const Plan& p = *plan;
    if (p.stays(c)) return comm::Pending::done(rows);
    return back ? comm::all_to_all_async(rows, *group, 0, 0, p.recv[c], p.send[c])
                : comm::all_to_all_async(rows, *group, 0, 0, p.send[c], p.recv[c]);
  }

  at::Tensor wait(comm::Pending& p) const {
    const auto t0 = std::chrono::steady_clock::now();
    at::Tensor out = p.wait();
    *seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return out;
  }

  at::Tensor forward(const at::Tensor& sorted, const nn::ExpertFunction& experts,
                     const std::function<void()>& behind_exchange, bool record) {
    const Plan& p = *plan;
    const size_t chunks = p.rows.size();
    std::vector<comm::Pending> out(chunks), back(chunks);
    for (size_t c = 0; c < chunks; ++c) out[c] = exchange(sorted.index_select(0, p.rows[c]), c, /*back=*/false);
    for (size_t c = 0; c < chunks; ++c) {
      at::Tensor x = in_expert_order(wait(out[c]), p.by_expert[c]);
      at::Tensor y;
      {
        trace::Span span("compute", span_name("experts", c, x.size(0), p.stays(c)));
        at::AutoGradMode grad(record);
        if (record) x.requires_grad_(tokens_need_grad);
        y = experts.run(x, p.per_expert[c], record ? weights : experts.weights);
      }
      if (record) inputs.push_back(x), outputs.push_back(torch::autograd::impl::gradient_edge(y));
      back[c] = exchange(by_source(y.detach(), p.by_expert[c]), c, /*back=*/true);
      if (c + 1 == chunks && behind_exchange) behind_exchange();
    }
    at::Tensor result = at::empty({p.kept, dim}, options);
    for (size_t c = 0; c < chunks; ++c) result.index_copy_(0, p.rows[c], wait(back[c]));
    return result;
  }

  variable_list backward(at::Tensor grad) {
    const Plan& p = *plan;
    const size_t chunks = p.rows.size();
    // Every rank runs every exchange, whether or not a gradient reached it.
    if (!grad.defined()) grad = at::zeros({p.kept, dim}, options);
    std::vector<comm::Pending> out(chunks), back(chunks);
    for (size_t c = 0; c < chunks; ++c) out[c] = exchange(grad.index_select(0, p.rows[c]), c, /*back=*/false);
    variable_list weight_grads(weights.size());
    for (size_t c = 0; c < chunks; ++c) {
      at::Tensor grad_y = in_expert_order(wait(out[c]), p.by_expert[c]);
      at::Tensor grad_x;
      {
        trace::Span span("compute", span_name("experts backward", c, grad_y.size(0), p.stays(c)));
        std::vector<at::Tensor> wrt;
        if (inputs[c].requires_grad()) wrt.push_back(inputs[c]);
        for (const at::Tensor& w : weights)
          if (w.requires_grad()) wrt.push_back(w);
        variable_list got;
        if (outputs[c].is_valid() && !wrt.empty()) {
          // torch::autograd::grad from the output's edge: the gradients of `wrt`, unused ones undefined.
          torch::autograd::edge_list ends;
          for (const at::Tensor& t : wrt) ends.push_back(torch::autograd::impl::gradient_edge(t));
          got = torch::autograd::Engine::get_default_engine().execute({outputs[c]}, {grad_y}, /*keep_graph=*/false,
                                                                      /*create_graph=*/false,
                                                                      /*accumulate_grad=*/false, ends);
        }
        size_t k = 0;
        if (inputs[c].requires_grad() && !got.empty()) grad_x = got[k++];
        for (size_t i = 0; i < weights.size(); ++i) {
          if (!weights[i].requires_grad() || got.empty()) continue;
          const at::Tensor& g = got[k++];
          if (g.defined()) weight_grads[i] = weight_grads[i].defined() ? weight_grads[i] + g : g;
        }
      }
      if (!grad_x.defined()) grad_x = at::zeros({inputs[c].size(0), dim}, options);
      back[c] = exchange(by_source(grad_x, p.by_expert[c]), c, /*back=*/true);
      inputs[c] = at::Tensor(), outputs[c] = torch::autograd::Edge();  // the chunk's graph is spent
    }
    at::Tensor grad_sorted = at::zeros({p.kept, dim}, options);
    for (size_t c = 0; c < chunks; ++c) grad_sorted.index_copy_(0, p.rows[c], wait(back[c]));
    variable_list grads{tokens_need_grad ? grad_sorted : at::Tensor()};
    grads.insert(grads.end(), weight_grads.begin(), weight_grads.end());
    return grads;
  }
};

struct ChunkedExpertsBackward : torch::autograd::Node {
  std::shared_ptr<ChunkedExperts> state;
  variable_list apply(variable_list&& grads) override { return state->backward(grads.at(0)); }
  std::string name() const override { return "ChunkedExpertsBackward"; }
  void release_variables() override { state.reset(); }
};

}  // namespace

AllToAllTokenDispatcher::ChunkPlan AllToAllTokenDispatcher::plan_chunks(int64_t chunks) {
  const int p = group_.size(), me = group_.rank();
  const std::vector<int64_t>& per_expert = sorted_per_expert();
  const auto experts = static_cast<int64_t>(per_expert.size());
  const ChunkRange mine = chunk_range(experts, p, me);
  // torch.chunk pieces of the tokens: ceil(T / C) each, the last ones short or empty.
  const int64_t step = std::max<int64_t>(1, (num_tokens() + chunks - 1) / chunks);
  const at::Tensor token_ids = sorted_token_ids();
  const at::Tensor tokens = token_ids.cpu().contiguous();
  const int64_t* token = tokens.data_ptr<int64_t>();

  ChunkPlan plan;
  plan.kept = tokens.size(0);
  std::vector<int64_t> local_rows, local_per_expert;  // the rows of this rank's experts
  std::vector<std::vector<int64_t>> rows(chunks);
  std::vector<int64_t> counts(chunks * experts, 0);  // [chunk][expert], the other ranks' experts
  int64_t row = 0;
  for (int64_t e = 0; e < experts; ++e) {
    const bool local = e >= mine.offset && e < mine.offset + mine.size;
    if (local) local_per_expert.push_back(per_expert[e]);
    for (int64_t i = 0; i < per_expert[e]; ++i, ++row) {
      if (local) {
        local_rows.push_back(row);
        continue;
      }
      const int64_t c = token[row] / step;
      rows[c].push_back(row);
      ++counts[c * experts + e];
    }
  }
  const at::Device device = token_ids.device();
  // The local rows, in expert order, as two chunks of half of them: the first and the last.
  const auto local_count = static_cast<int64_t>(local_rows.size()), head = local_count / 2;
  auto add_local = [&](int64_t begin, int64_t end) {  // local rows [begin, end)
    std::vector<int64_t> per_local_expert;
    for (int64_t e = 0, first = 0; e < mine.size; first += local_per_expert[e++]) {
      const int64_t last = first + local_per_expert[e];
      per_local_expert.push_back(std::max<int64_t>(0, std::min(end, last) - std::max(begin, first)));
    }
    const std::vector<int64_t> chunk_rows(local_rows.begin() + begin, local_rows.begin() + end);
    plan.rows.push_back(at::tensor(chunk_rows, at::kLong).to(device));
    plan.by_expert.emplace_back();
    plan.per_expert.push_back(std::move(per_local_expert));
    plan.send.emplace_back(p, 0);
    plan.recv.emplace_back(p, 0);
    plan.send.back()[me] = plan.recv.back()[me] = end - begin;
  };
  add_local(0, head);
  sent_ = received_ = local_ = local_count;

  // Counts first, every chunk's in one all-to-all: rank r gets [chunk][its experts].
  std::vector<int64_t> outgoing, count_splits(p), count_arrivals(p, chunks * mine.size);
  for (int r = 0; r < p; ++r) {
    const ChunkRange theirs = chunk_range(experts, p, r);
    count_splits[r] = chunks * theirs.size;
    for (int64_t c = 0; c < chunks; ++c)
      for (int64_t e = theirs.offset; e < theirs.offset + theirs.size; ++e) outgoing.push_back(counts[c * experts + e]);
  }
  const auto t0 = std::chrono::steady_clock::now();
  at::Tensor arrived =
      comm::all_to_all(at::tensor(outgoing, at::kLong), group_, 0, 0, count_splits, count_arrivals).contiguous();
  *seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const int64_t* a = arrived.data_ptr<int64_t>();  // [source][chunk][my expert]

  for (int64_t c = 0; c < chunks; ++c) {
    std::vector<int64_t> send(p, 0), recv(p, 0), this_chunk(p * mine.size);
    for (int r = 0; r < p; ++r) {
      const ChunkRange theirs = chunk_range(experts, p, r);
      for (int64_t e = theirs.offset; e < theirs.offset + theirs.size; ++e) send[r] += counts[c * experts + e];
      for (int64_t e = 0; e < mine.size; ++e) {
        this_chunk[r * mine.size + e] = a[(r * chunks + c) * mine.size + e];
        recv[r] += this_chunk[r * mine.size + e];
      }
      sent_ += send[r], received_ += recv[r];
    }
    std::vector<int64_t> local_counts;
    plan.by_expert.push_back(expert_major_order(this_chunk.data(), p, mine.size, &local_counts).to(device));
    plan.per_expert.push_back(std::move(local_counts));
    plan.rows.push_back(at::tensor(rows[c], at::kLong).to(device));
    plan.send.push_back(std::move(send));
    plan.recv.push_back(std::move(recv));
  }
  add_local(head, local_count);
  return plan;
}

at::Tensor AllToAllTokenDispatcher::run_experts(const at::Tensor& sorted, const nn::ExpertFunction& experts,
                                                const std::function<void()>& behind_exchange) {
  if (!pipelines() || sorted.is_meta()) return TokenDispatcher::run_experts(sorted, experts, behind_exchange);
  HP_CHECK(!WeightOutputRecorder::recording())
      << "MoE num_chunks " << options().num_chunks << ": a split backward (zero-bubble schedules' I and W) cannot "
      << "run through the chunked experts, whose one backward node computes both; use num_chunks = 1 or a schedule "
      << "without split backwards (1f1b, gpipe, interleaved-1f1b)";
  // One observed collective for the whole exchange and the experts inside it: a selective
  // checkpoint's recompute hands back its result instead of exchanging again.
  return observe_collective("chunked token all_to_all", sorted,
                            [&] { return run_chunked(sorted, experts, behind_exchange); });
}

at::Tensor AllToAllTokenDispatcher::run_chunked(const at::Tensor& sorted, const nn::ExpertFunction& experts,
                                                const std::function<void()>& behind_exchange) {
  auto state = std::make_shared<ChunkedExperts>();
  state->group = &group_;
  state->plan = std::make_shared<const ChunkPlan>(plan_chunks(options().num_chunks));
  state->seconds = seconds_;
  state->dim = sorted.size(1);
  state->options = sorted.options();
  const bool record = at::GradMode::is_enabled() &&
                      (sorted.requires_grad() || std::any_of(experts.weights.begin(), experts.weights.end(),
                                                             [](const at::Tensor& w) { return w.requires_grad(); }));
  state->tokens_need_grad = record && sorted.requires_grad();
  if (record)
    for (const at::Tensor& w : experts.weights) state->weights.push_back(w.detach().requires_grad_(w.requires_grad()));
  at::Tensor out = state->forward(sorted.detach(), experts, behind_exchange, record);
  if (!record) return out;
  std::vector<at::Tensor> inputs{sorted};
  inputs.insert(inputs.end(), experts.weights.begin(), experts.weights.end());
  auto node = std::shared_ptr<ChunkedExpertsBackward>(new ChunkedExpertsBackward(), torch::autograd::deleteNode);
  node->state = std::move(state);
  node->set_next_edges(torch::autograd::collect_next_edges(inputs));
  torch::autograd::set_history(out, node);
  return out;
}

}  // namespace hp
