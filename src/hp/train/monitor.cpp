#include "hp/train/monitor.h"

#include <ATen/ATen.h>

#include <cmath>
#include <cstdio>
#include <limits>

#include "hp/base/error.h"
#include "hp/comm/collectives.h"
#include "hp/train/replica_check.h"

namespace hp::train {

Monitor::Monitor(Training& t, const TrainConfig& cfg, bool append)
    : t_(t),
      cfg_(cfg.monitor),
      grad_norm_known_(cfg.train.grad_clip > 0),
      lead_(t.mesh.rank() == 0),
      loss_spikes_(cfg.monitor.spike_factor),
      grad_norm_spikes_(cfg.monitor.spike_factor) {
  if (cfg_.every > 0) norms_.emplace(*t.model, t.stage_mesh, StageNorms{t.other_stages, t.chunk_of});
  if (lead_ && !cfg_.file.empty()) out_.emplace(cfg_.file, append);
}

void Monitor::begin_step(int64_t step) {
  step_ = step;
  monitored_ = norms_ && step % cfg_.every == 0;
  if (monitored_) norms_->arm(true);
}

void Monitor::after_backward() {
  if (monitored_) last_norms_ = norms_->collect(step_);
}

void Monitor::end_step(double loss, double grad_norm) {
  if (!grad_norm_known_) grad_norm = std::numeric_limits<double>::quiet_NaN();
  if (cfg_.spike_factor > 0 && lead_) {
    struct Watched {
      const char* name;
      double value;
      SpikeDetector& detector;
    };
    const Watched watched[] = {{"loss", loss, loss_spikes_}, {"grad_norm", grad_norm, grad_norm_spikes_}};
    for (const Watched& w : watched) {
      const std::optional<double> median = w.detector.observe(w.value);
      if (!median) continue;
      std::fprintf(stderr, "hp: warning: %s spike at step %lld: %g is above %g times the median %g of the last steps\n",
                   w.name, static_cast<long long>(step_), w.value, cfg_.spike_factor, *median);
      MonitorRecord r;
      r.step = step_, r.event = std::string(w.name) + "_spike", r.value = w.value, r.median = *median;
      if (out_) out_->write(r);
    }
  }
  if (monitored_ && out_) {  // before the replica check, which may stop the run
    std::vector<MonitorRecord> lines;
    for (const ModuleNorm& n : last_norms_) {
      MonitorRecord r;
      r.step = step_, r.module = n.module, r.act_norm = n.act_norm, r.grad_norm = n.grad_norm;
      lines.push_back(r);
    }
    MonitorRecord r;
    r.step = step_, r.loss = loss, r.grad_norm = grad_norm;
    lines.push_back(r);
    out_->write(lines);
  }
  if (cfg_.replica_check_every > 0 && (step_ + 1) % cfg_.replica_check_every == 0) check_replicas();
}

void Monitor::check_replicas() {
  bring_in_offloaded(t_);  // the shards it reads may be in files
  const std::string mismatch = find_replica_mismatch(t_.model->named_parameters(), step_);
  // Pipeline stages stop together: one left running would wait on the others forever.
  if (t_.other_stages && t_.other_stages->size() > 1) {
    constexpr int64_t kNone = std::numeric_limits<int64_t>::max();
    const int64_t mine = mismatch.empty() ? kNone : int64_t(t_.mesh.rank());
    at::Tensor finder = at::full({}, mine, tensor_options(t_.mesh, at::kLong));
    comm::all_reduce_(finder, *t_.other_stages, ReduceOp::Min);
    const int64_t rank = finder.item<int64_t>();
    HP_CHECK(!mismatch.empty() || rank == kNone)
        << "replica mismatch at step " << step_ << " on another pipeline stage (rank " << rank << " found it)";
  }
  HP_CHECK(mismatch.empty()) << mismatch;
}

}  // namespace hp::train
