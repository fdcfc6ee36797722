// hp: the HyperParallel command line (schedule, dryrun, plan, train, plot, monitor, diff, trace, convert).
#include <CLI/CLI.hpp>
#include <iostream>

#include "commands.h"
#include "hp/base/error.h"

namespace hp::cli {

void add_version_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("version", "print the version");
  cmd->callback([] { std::cout << "hp 0.2.0\n"; });
}

}  // namespace hp::cli

int main(int argc, char** argv) {
  CLI::App app{"HyperParallel: distributed training made simple"};
  app.require_subcommand(1);
  hp::cli::add_version_command(app);
  hp::cli::add_schedule_command(app);
  hp::cli::add_plan_commands(app);
  hp::cli::add_plot_command(app);
  hp::cli::add_monitor_commands(app);
  hp::cli::add_trace_command(app);
#ifdef HP_WITH_TRAIN
  hp::cli::add_train_command(app);
  hp::cli::add_convert_command(app);
#endif
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {  // hp::Error, and c10::Error from LibTorch
    std::cerr << "hp: error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
