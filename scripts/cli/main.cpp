// The `rackstep` command: dispatches to the registered subcommands.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <new>
#include <stdexcept>
#include <string>
#include <system_error>
#include <nlohmann/json.hpp>

#include "sim/base/check.h"
#include "scripts/cli/command.h"

namespace rackstep::cli {

std::vector<CommandInfo>& registry() {
  static std::vector<CommandInfo> commands;
  return commands;
}

bool stdout_is_terminal() { return isatty(STDOUT_FILENO) != 0; }

}  // namespace rackstep::cli

namespace {

int fail(const std::string& line) {
  std::fprintf(stderr, "rackstep: %s\n", line.c_str());
  return 2;
}

}  // namespace

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
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // One line, like every other error: the flag, what was expected, what was found.
    return fail(std::string(e.what()) + " (see --help)");
  }
  // Exit status: 0 success; 2 for anything the user or the machine can cause
  // (a bad file or flag, a missing path, a full disk, out of memory, a thread
  // that cannot start), printed as one line; 1 for an internal error (a bug).
  int rc = 1;
  try {
    for (auto& [sub, run] : runners) {
      if (sub->parsed()) {
        rc = run();
        break;
      }
    }
  } catch (const UserError& e) {
    return fail(e.what());
  } catch (const nlohmann::json::exception& e) {
    return fail(e.what());
  } catch (const std::filesystem::filesystem_error& e) {
    return fail(e.what());
  } catch (const std::bad_alloc&) {
    return fail("out of memory (the request needs more memory than this machine gives the process)");
  } catch (const std::length_error& e) {
    return fail(std::string("out of memory (a size beyond what can be allocated: ") + e.what() + ")");
  } catch (const std::system_error& e) {
    return fail(std::string("system error: ") + e.what());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rackstep: internal error: %s\n", e.what());
    return 1;
  }
  // Tables and JSON go to stdout: a full disk or closed pipe there is an error too.
  if (std::fflush(stdout) != 0 || std::ferror(stdout)) {
    return fail(std::string("standard output: write failed: ") + std::strerror(errno));
  }
  return rc;
}
