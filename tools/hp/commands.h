// Each `hp` subcommand registers itself on the CLI11 app in its own file.
#pragma once

namespace CLI {
class App;
}

namespace hp::cli {

void add_version_command(CLI::App& app);
void add_schedule_command(CLI::App& app);
void add_plan_commands(CLI::App& app);  // dryrun, plan
void add_train_command(CLI::App& app);  // only when built with LibTorch

}  // namespace hp::cli
