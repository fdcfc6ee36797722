// Each `hp` subcommand registers itself on the CLI11 app in its own file.
#pragma once

namespace CLI {
class App;
}

namespace hp::plan {
struct ModelDesc;
struct ClusterSpec;
struct Strategy;
}  // namespace hp::plan

namespace hp::cli {

void add_version_command(CLI::App& app);
void add_schedule_command(CLI::App& app);
void add_plan_commands(CLI::App& app);  // dryrun, plan
void add_plot_command(CLI::App& app);   // the metrics file of hp train
void add_monitor_commands(CLI::App& app);  // monitor plot, diff: the monitor file of hp train
void add_trace_command(CLI::App& app);     // the timelines HP_TRACE writes
void add_train_command(CLI::App& app);    // only when built with LibTorch
void add_convert_command(CLI::App& app);  // only when built with LibTorch

// `hp dryrun --real`: the trainer's step as rank `rank` of the resolved strategy `s`, on a
// fake world and meta tensors, beside the estimator (only when built with LibTorch).
void run_real_dryrun(const plan::ModelDesc& m, const plan::ClusterSpec& c, plan::Strategy s, int64_t devices, int rank,
                     int64_t steps, bool json);

}  // namespace hp::cli
