// `rackstep goodput`: wall-clock days to train a token budget, with
// interruptions, restarts, checkpoints and GC stalls, as a Monte Carlo
// distribution (percentiles, P(finish by deadline), histogram).
//
//   rackstep goodput --step-time-s 17.15 --tokens-per-step 46137344 --tokens 18e12
//                    --gpus 704 --params 535.48e9 --deadline-days 80 [--runs 1000] [--seed 0] [--config FILE] [--json]
#include <cstdio>
#include <memory>
#include <string>

#include "sim/base/check.h"
#include "scripts/cli/command.h"
#include "scripts/cli/flags.h"
#include "scripts/cli/progress.h"
#include "sim/goodput.h"

namespace rackstep::sim {
namespace {

struct GoodputArgs {
  GoodputRequest req;
  std::string config;
  double checkpoint_interval_s = 0;  // 0 = not given: from the config (the flag itself must be > 0)
  bool json = false;
};

int run_goodput(const GoodputArgs& a) {
  GoodputConfig cfg = a.config.empty() ? default_goodput_config() : load_goodput_config(a.config);
  if (a.checkpoint_interval_s > 0) cfg.checkpoint_interval_s = a.checkpoint_interval_s;
  GoodputRequest req = a.req;
  rackstep::cli::Progress progress("goodput", "runs over both passes");  // silent unless it takes seconds
  req.progress = progress.callback();
  // The library names the request's fields; this command's user typed flags.
  const GoodputResult r = cli::flag_names({{"step_time_s", "--step-time-s"},
                                           {"tokens_per_step", "--tokens-per-step"},
                                           {"tokens", "--tokens"},
                                           {"gpus", "--gpus"},
                                           {"total_params", "--params"},
                                           {"deadline_days", "--deadline-days"},
                                           {"runs", "--runs"},
                                           {"bins", "--bins"}},
                                          [&] { return simulate_goodput(req, cfg); });
  if (a.json) {
    nlohmann::json j = goodput_result_json(a.req, r);
    j["config"] = goodput_config_json(cfg);
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::fputs(format_goodput(a.req, r).c_str(), stdout);
  return 0;
}

rackstep::cli::Registration reg{
    "goodput", "Days to train a token budget with interruptions, restarts and checkpoints (Monte Carlo)",
    [](CLI::App& app) {
      auto a = std::make_shared<GoodputArgs>();
      // Bounds: a step of 1 us to 1e6 s (11.6 days), at most 1e12 steps (also checked in sim/goodput.cpp).
      app.add_option("--step-time-s", a->req.step_time_s, "seconds per training step (without GC stalls)")
          ->required()
          ->check(cli::number(1e-6, 1e6));
      app.add_option("--tokens-per-step", a->req.tokens_per_step, "tokens per step (global batch x sequence)")
          ->required()
          ->check(cli::number(1, 1e12));
      app.add_option("--tokens", a->req.tokens, "token budget, e.g. 18e12")->required()->check(cli::positive(1e18));
      app.add_option("--gpus", a->req.gpus, "GPUs in the job")->required()->check(cli::count(1, 100000000));
      app.add_option("--params", a->req.total_params, "model parameters, e.g. 535.48e9 (checkpoint size scales with them)")
          ->required()
          ->check(cli::positive(1e16));
      app.add_option("--deadline-days", a->req.deadline_days, "report P(finish within this many days)")
          ->check(cli::number(0, 1e6));
      app.add_option("--runs", a->req.runs, "Monte Carlo runs (default 1000)")->check(cli::count(1, 10000000));
      app.add_option("--seed", a->req.seed, "random seed (default 0)");
      app.add_option("--bins", a->req.bins, "histogram bins (default 20)")->check(cli::count(1, 1000));
      app.add_option("--config", a->config, "JSON overriding sim/goodput_defaults.json (same shape, keys optional)");
      app.add_option("--checkpoint-interval-s", a->checkpoint_interval_s, "running seconds between checkpoints (> 0)")
          ->check(cli::positive(1e9));
      app.add_flag("--json", a->json, "print JSON (with histogram bins) instead of text");
      return [a] { return run_goodput(*a); };
    }};

}  // namespace
}  // namespace rackstep::sim
