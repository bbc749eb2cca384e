// The `rackstep` command: dispatches to the registered subcommands.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <nlohmann/json.hpp>

#include "models/check.h"
#include "sim/cli/command.h"

namespace rackstep::cli {

std::vector<CommandInfo>& registry() {
  static std::vector<CommandInfo> commands;
  return commands;
}

bool stdout_is_terminal() { return isatty(STDOUT_FILENO) != 0; }

}  // namespace rackstep::cli

int main(int argc, char** argv) {
  using namespace rackstep;
  CLI::App app{
      "rackstep: which model can we train on these racks, with which parallelism layout,\n"
      "and will it finish before the deadline? Predicts step time, MFU, memory and EP\n"
      "token drops, and runs the same layer graph for real.",
      "rackstep"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "Show help for every subcommand");

  auto& commands = cli::registry();
  std::sort(commands.begin(), commands.end(),
            [](const auto& a, const auto& b) { return a.name < b.name; });
  std::vector<std::pair<CLI::App*, cli::Runner>> runners;
  for (auto& c : commands) {
    CLI::App* sub = app.add_subcommand(c.name, c.help);
    runners.emplace_back(sub, c.setup(*sub));
  }

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  try {
    for (auto& [sub, run] : runners) {
      if (sub->parsed()) return run();
    }
  } catch (const UserError& e) {
    std::fprintf(stderr, "rackstep: %s\n", e.what());
    return 2;
  } catch (const nlohmann::json::exception& e) {
    std::fprintf(stderr, "rackstep: %s\n", e.what());
    return 2;
  }
  return 1;
}
