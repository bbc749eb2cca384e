// Subcommand registry for the `rackstep` binary.
//
// Every command is one file in scripts/cli/ (cli_params.cpp, cli_predict.cpp,
// cli_train.cpp), apart from the libraries it drives, and registers itself with
// a static object, so adding a command never touches main:
//
//   static rackstep::cli::Registration reg{
//       "params", "Count parameters and FLOPs of a model",
//       [](CLI::App& app) {
//         auto args = std::make_shared<ParamsArgs>();
//         app.add_option("model", args->model_path, "model JSON")->required();
//         return [args] { return run_params(*args); };  // returns the exit status
//       }};
//
// main() catches rackstep::UserError (and every other std::exception: a
// filesystem error, bad_alloc, system_error) from a command and prints one
// line with exit status 2; an exception of no known kind is an internal error,
// exit 1. A failed write to stdout is an error too (exit 2).
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <string>
#include <vector>

namespace rackstep::cli {

using Runner = std::function<int()>;
using Setup = std::function<Runner(CLI::App&)>;

struct CommandInfo {
  std::string name;
  std::string help;
  Setup setup;
};

std::vector<CommandInfo>& registry();

struct Registration {
  Registration(std::string name, std::string help, Setup setup) {
    registry().push_back({std::move(name), std::move(help), std::move(setup)});
  }
};

// True when stdout is a terminal (progress bars and colour only then).
bool stdout_is_terminal();

}  // namespace rackstep::cli
