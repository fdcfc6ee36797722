#include "hp/pipeline/runtime.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <set>
#include <sstream>

#include "hp/base/error.h"
#include "hp/comm/collectives.h"
#include "hp/comm/trace.h"
#include "hp/pipeline/wire.h"
#include "hp/schedule/lower.h"
#include "hp/schedule/validate.h"

namespace hp::pipeline {
namespace {

using schedule::Action;
using schedule::ActionType;
using detail::Message;
using Key = std::pair<int, int>;  // (stage, microbatch)

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string list_str(const std::vector<int>& v) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  os << "]";
  return os.str();
}

template <typename Map>
typename Map::mapped_type take(Map& m, const Key& k) {
  auto it = m.find(k);
  auto v = std::move(it->second);
  m.erase(it);
  return v;
}

// The state of one step on one rank: what each (stage, microbatch) holds between
// actions, what is in flight, and where tensors go next.
class StepRun {
 public:
  StepRun(const std::map<int, const PipelineStage*>& stages, const schedule::Schedule& s,
          const comm::Group& g, const std::vector<std::vector<int>>& members, int rank,
          const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& targets,
          const ActivationBufferFn& activation_buffer)
      : stages_(stages), s_(s), g_(g), members_(members), rank_(rank),
        leader_(members.at(rank).front() == g.rank()), inputs_(inputs), targets_(targets),
        activation_buffer_(activation_buffer) {
    pieces_ = !stages.empty() && stages.begin()->second->pieces;
    const auto& mine = members.at(rank);
    place_ = static_cast<int>(std::find(mine.begin(), mine.end(), g.rank()) - mine.begin());
  }

  // Returns the sum of this rank's scaled microbatch losses (0 without the last stage).
  double run(StepStats& stats) {
    const auto& list = s_.actions.at(rank_);
    for (size_t i = 0; i < list.size(); ++i)
      if (list[i].type == ActionType::B || list[i].type == ActionType::W) last_backward_[list[i].stage] = i;
    for (const Action& a : list)
      if (a.type == ActionType::I) split_.insert({a.stage, a.microbatch});
    // Activation headers are tiny and their order is known: post them all now (with static
    // shapes, the data receives themselves).
    for (const Action& a : list) {
      if (a.type != ActionType::RECV_F) continue;
      const int data_tag = tag(Message::kAct, a.stage - 1, a.microbatch);
      act_recv_.emplace(Key{a.stage, a.microbatch},
                        activation_buffer_
                            ? detail::ActivationRecv(g_, sender(a.peer), data_tag,
                                                     activation_buffer_(a.stage - 1, a.microbatch))
                            : detail::ActivationRecv(g_, sender(a.peer),
                                                     tag(Message::kActHeader, a.stage - 1, a.microbatch), data_tag));
    }
    for (size_t i = 0; i < list.size(); ++i) {
      try {
        for (auto& [k, r] : act_recv_) r.progress(/*wait=*/false);
        action_ = i;
        execute(list[i], stats);
      } catch (const std::exception& e) {
        HP_FAIL() << "pipeline rank " << rank_ << ", action #" << i << " " << schedule::to_string(list[i])
                  << " (stage " << list[i].stage << ", microbatch " << list[i].microbatch << "): " << e.what();
      }
    }
    for (auto& p : sends_) p.wait();
    for (auto& [k, ps] : activation_sends_)
      for (auto& p : ps) p.wait();
    activation_sends_.clear();
    HP_CHECK(work_.empty() && local_act_.empty() && act_recv_.empty() && local_grad_.empty() &&
             grad_recv_.empty() && grad_to_send_.empty())
        << "pipeline rank " << rank_ << ": step ended with work left (" << work_.size() << " stage states, "
        << act_recv_.size() + grad_recv_.size() << " receives, " << grad_to_send_.size()
        << " grads unsent): the schedule does not consume what it produces";
    return loss_sum_;
  }

 private:
  template <typename Wait>
  at::Tensor timed_wait(Wait&& wait) {
    const double t0 = now_s();
    at::Tensor t = wait();
    waited_ += now_s() - t0;
    return t;
  }

  int tag(Message kind, int stage, int mb) const { return detail::message_tag(kind, stage, mb, s_.num_microbatches); }
  bool local(int stage) const { return s_.rank_of(stage) == rank_; }
  int leader(int schedule_rank) const { return members_.at(schedule_rank).front(); }
  // Who sends this rank what schedule rank `r` hands on: its mesh's first rank (whole
  // tensors), or the rank at this rank's place (pieces).
  int sender(int r) const { return pieces_ ? members_.at(r).at(place_) : leader(r); }
  // Whom this rank sends what it hands on to schedule rank `r`.
  std::vector<int> receivers(int r) const {
    if (pieces_) return {members_.at(r).at(place_)};
    return leader_ ? members_.at(r) : std::vector<int>{};  // the other ranks hold the same whole tensor
  }

  void execute(const Action& a, StepStats& stats) {
    Key k{a.stage, a.microbatch};
    trace::Span span("compute", trace::enabled() ? to_string(a) : std::string());
    double t0 = now_s();
    waited_ = 0;
    switch (a.type) {
      case ActionType::F: forward(k); break;
      case ActionType::B:
      case ActionType::I: backward(k, a.type == ActionType::B); break;
      case ActionType::W: {
        HP_CHECK(work_.count(k)) << "W before I";
        detail::run_backward_weight(*stages_.at(a.stage), work_.at(k), last_backward_.at(a.stage) == action_);
        work_.erase(k);
        break;
      }
      case ActionType::SEND_F: {
        HP_CHECK(work_.count(k)) << "SEND_F before its F";
        for (int peer : receivers(a.peer))
          for (auto& p : detail::send_activation(work_.at(k).output, g_, peer, tag(Message::kActHeader, a.stage, a.microbatch),
                                                 tag(Message::kAct, a.stage, a.microbatch), !activation_buffer_))
            activation_sends_[k].push_back(std::move(p));
        return;
      }
      case ActionType::SEND_B: {
        HP_CHECK(grad_to_send_.count(k)) << "SEND_B before its B or I";
        at::Tensor g = take(grad_to_send_, k);
        for (int peer : receivers(a.peer))
          sends_.push_back(comm::send_async(g, g_, peer, tag(Message::kGrad, a.stage - 1, a.microbatch)));
        return;
      }
      case ActionType::RECV_F:
        act_recv_.at(k).progress(/*wait=*/true);  // the data itself is waited for by F
        return;
      case ActionType::RECV_B:
        HP_CHECK(grad_recv_.count(k)) << "RECV_B before the F whose output it is the grad of";
        return;
      case ActionType::UNSHARD:
      case ActionType::RESHARD:
        return;  // parameters are whole here
    }
    // Waiting for an activation or a gradient inside F or B is idle time, not compute.
    double dt = now_s() - t0 - waited_;
    stats.compute += dt;
    PhaseTime& ph = a.type == ActionType::F   ? stats.f
                    : a.type == ActionType::B ? stats.b
                    : a.type == ActionType::I ? stats.i
                                              : stats.w;
    ph.seconds += dt;
    ph.count += 1;
  }

  void forward(const Key& k) {
    auto [s, mb] = k;
    const PipelineStage& st = *stages_.at(s);
    at::Tensor in;
    if (st.is_first()) {
      in = inputs_.at(mb);
    } else if (local_act_.count(k)) {
      in = take(local_act_, k);
    } else {
      HP_CHECK(act_recv_.count(k)) << "F with no input: neither received nor handed over by stage " << s - 1;
      in = timed_wait([&] { return take(act_recv_, k).wait(); });
    }
    at::Tensor target = st.is_last() ? targets_.at(mb) : at::Tensor();
    detail::StageWork w = detail::run_forward(st, in, target, 1.0 / s_.num_microbatches, split_.count(k) > 0);
    if (st.is_last() && !w.loss.is_meta()) loss_sum_ += w.loss.detach().item<double>();  // a dry-run's hold none
    if (!st.is_last()) {
      if (local(s + 1)) {
        local_act_[{s + 1, mb}] = w.output.detach();
      } else {  // the grad of this output will come back with the output's shape
        at::Tensor buf = at::empty(w.output.sizes(), w.output.options().requires_grad(false));
        grad_recv_.emplace(k, comm::recv_async(buf, g_, sender(s_.rank_of(s + 1)), tag(Message::kGrad, s, mb)));
      }
    }
    work_[k] = std::move(w);
  }

  void backward(const Key& k, bool full) {
    auto [s, mb] = k;
    const PipelineStage& st = *stages_.at(s);
    HP_CHECK(work_.count(k)) << (full ? "B" : "I") << " before its F";
    detail::StageWork& w = work_.at(k);
    if (!st.is_last()) {
      if (local_grad_.count(k)) {
        w.grad_output = take(local_grad_, k);
      } else {
        HP_CHECK(grad_recv_.count(k)) << "no output grad: neither received nor handed over by stage " << s + 1;
        w.grad_output = timed_wait([&] { return take(grad_recv_, k).wait(); });
      }
    }
    // Its gradient is back, so the next stage has long received the output: the send is
    // over, and waiting on it lets go of the output when this backward does.
    if (activation_sends_.count(k))
      for (auto& p : take(activation_sends_, k)) p.wait();
    if (full && st.set_requires_gradient_sync) st.set_requires_gradient_sync(last_backward_.at(s) == action_);
    if (full) {
      detail::run_backward(st, w);
    } else {
      detail::run_backward_input(st, w);
    }
    if (!st.is_first()) {
      at::Tensor g = std::move(w.input_grad);
      if (local(s - 1)) {
        local_grad_[{s - 1, mb}] = g;
      } else {
        grad_to_send_[k] = g;
      }
    }
    if (full) work_.erase(k);
  }

  const std::map<int, const PipelineStage*>& stages_;
  const schedule::Schedule& s_;
  const comm::Group& g_;
  const std::vector<std::vector<int>>& members_;
  int rank_;     // schedule rank
  bool leader_;  // the first rank of this schedule rank's mesh: it sends whole tensors for all of them
  bool pieces_ = false;  // PipelineStage::pieces
  int place_ = 0;        // this rank's place in its mesh's list of ranks
  const std::vector<at::Tensor>& inputs_;
  const std::vector<at::Tensor>& targets_;
  const ActivationBufferFn& activation_buffer_;

  std::map<Key, detail::StageWork> work_;         // between F and B (or W)
  std::map<Key, at::Tensor> local_act_;           // F(s) -> F(s+1) on this rank
  std::map<Key, detail::ActivationRecv> act_recv_;
  std::map<Key, at::Tensor> local_grad_;          // B|I(s+1) -> B|I(s) on this rank
  std::map<Key, comm::Pending> grad_recv_;
  std::map<Key, at::Tensor> grad_to_send_;
  std::vector<comm::Pending> sends_;  // gradients, waited at the end of the step
  std::map<Key, std::vector<comm::Pending>> activation_sends_;  // waited at their backward
  std::map<int, size_t> last_backward_;  // stage -> index of its last B or W in the list
  std::set<Key> split_;                  // (stage, microbatch) whose backward is I then W
  size_t action_ = 0;
  double waited_ = 0;  // inside the current action, for a message
  double loss_sum_ = 0;
};

}  // namespace

PipelineRuntime::PipelineRuntime(std::vector<PipelineStage> stages, schedule::Schedule sched)
    : PipelineRuntime(std::move(stages), std::move(sched), {}) {}

PipelineRuntime::PipelineRuntime(std::vector<PipelineStage> stages, schedule::Schedule sched,
                                 std::vector<MeshShape> rank_meshes)
    : stages_(std::move(stages)), schedule_(std::move(sched)) {
  HP_CHECK(!stages_.empty()) << "pipeline runtime: no stages given";
  group_ = stages_[0].group;
  for (const auto& st : stages_) {
    st.check();
    HP_CHECK(st.group == group_ || (st.group->ranks() == group_->ranks()))
        << "pipeline stages " << stages_[0].stage_index << " and " << st.stage_index
        << " use different process groups: " << group_->describe() << " vs " << st.group->describe();
    HP_CHECK(st.num_stages == schedule_.num_stages)
        << "pipeline stage " << st.stage_index << " says " << st.num_stages << " stages but schedule '"
        << schedule_.name << "' has " << schedule_.num_stages;
  }
  if (rank_meshes.empty()) {  // one rank per schedule rank, in group order
    HP_CHECK(schedule_.num_ranks == group_->size())
        << "schedule '" << schedule_.name << "' is for " << schedule_.num_ranks << " ranks but the pipeline "
        << group_->describe() << " has " << group_->size();
    for (int r = 0; r < group_->size(); ++r) members_.push_back({r});
  } else {
    HP_CHECK(static_cast<int>(rank_meshes.size()) == schedule_.num_ranks)
        << "schedule '" << schedule_.name << "' is for " << schedule_.num_ranks << " ranks but "
        << rank_meshes.size() << " stage meshes were given";
    std::vector<int> seen(group_->size(), -1);
    for (int r = 0; r < schedule_.num_ranks; ++r) {
      std::vector<int> m;
      for (int global : rank_meshes[r].ranks()) {
        int gr = group_->group_rank_of(global);
        HP_CHECK(seen[gr] < 0) << "rank " << global << " is in the meshes of both schedule ranks " << seen[gr]
                               << " and " << r << " (" << rank_meshes[seen[gr]].to_string() << ", "
                               << rank_meshes[r].to_string() << ")";
        seen[gr] = r;
        m.push_back(gr);
      }
      members_.push_back(m);
    }
    for (int gr = 0; gr < group_->size(); ++gr)
      HP_CHECK(seen[gr] >= 0) << "rank " << group_->global_rank(gr) << " of the pipeline " << group_->describe()
                              << " is in no stage mesh";
  }
  for (int r = 0; r < static_cast<int>(members_.size()); ++r)
    for (int gr : members_[r])
      if (gr == group_->rank()) rank_ = r;
  for (const auto& st : stages_) {
    if (!st.mesh) continue;
    HP_CHECK(!rank_meshes.empty() && *st.mesh == rank_meshes[rank_])
        << "pipeline stage " << st.stage_index << " runs on " << st.mesh->to_string() << " but schedule rank "
        << rank_ << " is given "
        << (rank_meshes.empty() ? std::string("no stage mesh") : rank_meshes[rank_].to_string());
  }
  for (const auto& st : stages_)
    HP_CHECK(st.pieces == stages_[0].pieces)
        << "pipeline stages " << stages_[0].stage_index << " and " << st.stage_index
        << " disagree on whether activations travel as pieces";
  if (stages_[0].pieces) {
    for (const auto& m : members_)
      HP_CHECK(m.size() == members_[0].size())
          << "pipeline: activations travel as pieces between ranks at the same place of meshes of one shape, "
          << "but schedule ranks' meshes hold " << members_[0].size() << " and " << m.size() << " ranks";
  }
  if (!schedule_.has_comm()) schedule_ = schedule::lower_communication(schedule_);
  schedule::validate(schedule_);

  std::vector<int> mine;
  for (const auto& st : stages_) mine.push_back(st.stage_index);
  std::sort(mine.begin(), mine.end());
  std::vector<int> want = schedule_.stages_of(rank_);
  for (const auto& st : stages_) {
    if (!st.set_requires_gradient_sync || st.sync_in_weight_backward) continue;
    for (const Action& a : schedule_.actions[rank_])
      HP_CHECK(a.type != ActionType::I && a.type != ActionType::W)
          << "pipeline stage " << st.stage_index << " holds a data-parallel wrapper, which needs full backwards, "
          << "but schedule '" << schedule_.name << "' splits them (" << schedule::to_string(a) << ")";
  }
  HP_CHECK(mine == want) << "pipeline rank " << rank_ << " was given stages " << list_str(mine) << " but schedule '"
                         << schedule_.name << "' puts stages " << list_str(want) << " on it";
}

at::Tensor PipelineRuntime::step(const at::Tensor& inputs, const at::Tensor& targets) {
  const int m = num_microbatches();
  auto split = [&](const at::Tensor& t, const char* what) {
    HP_CHECK(t.defined() && t.dim() >= 1) << "pipeline rank " << rank_ << ": step needs " << what
                                          << " with a batch dim";
    HP_CHECK(t.size(0) % m == 0) << "pipeline rank " << rank_ << ": " << what << " batch of " << t.size(0)
                                 << " does not split into " << m << " equal microbatches";
    return t.split(t.size(0) / m);
  };
  std::vector<at::Tensor> in, tg;
  for (const auto& st : stages_) {
    if (st.is_first()) in = split(inputs, "inputs");
    if (st.is_last()) tg = split(targets, "targets");
  }
  return step(in, tg);
}

at::Tensor PipelineRuntime::step(const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& targets) {
  const int m = num_microbatches();
  std::map<int, const PipelineStage*> by_index;
  for (const auto& st : stages_) {
    by_index[st.stage_index] = &st;
    if (st.is_first()) {
      HP_CHECK(static_cast<int>(inputs.size()) == m) << "pipeline rank " << rank_ << " (first stage): "
                                                     << inputs.size() << " input microbatches, schedule has " << m;
    }
    if (st.is_last()) {
      HP_CHECK(static_cast<int>(targets.size()) == m) << "pipeline rank " << rank_ << " (last stage): "
                                                      << targets.size() << " target microbatches, schedule has " << m;
    }
  }
  stats_ = StepStats{};
  double t0 = now_s();
  double loss = StepRun(by_index, schedule_, *group_, members_, rank_, inputs, targets, activation_buffer_).run(stats_);
  // Every pipeline rank gets the loss, so that each can log it.
  at::Tensor l = at::full({1}, loss, at::kDouble);
  if (group_->size() > 1) comm::broadcast_(l, *group_, members_.at(schedule_.rank_of(schedule_.num_stages - 1)).front());
  stats_.wall = now_s() - t0;
  return l.reshape({});
}

}  // namespace hp::pipeline
