// Goodput Monte Carlo speed (issue 4 target: 1,000 runs of the hero's 390k
// steps in under 5 s).
//
//   build-des/bench/goodput_bench
//
// One iteration = the whole `rackstep goodput` computation with the default
// rates: 1,000 runs plus the re-run at Daly's interval.
#include <benchmark/benchmark.h>

#include "sim/goodput.h"

using namespace rackstep::sim;

static void BM_HeroGoodput1000Runs(benchmark::State& state) {
  const GoodputConfig cfg = default_goodput_config();
  GoodputRequest req;
  req.step_time_s = 17.15;
  req.tokens_per_step = 46137344;
  req.tokens = 18e12;  // 390,140 steps
  req.gpus = 704;
  req.total_params = 535.48e9;
  req.runs = 1000;
  double interruptions = 0;
  for (auto _ : state) {
    GoodputResult r = simulate_goodput(req, cfg);
    interruptions = r.gpu_failures + r.link_failures + r.hangs + r.checkpoint_failures;
    benchmark::DoNotOptimize(r.mean_days);
  }
  state.counters["interruptions/run"] = interruptions;
}
BENCHMARK(BM_HeroGoodput1000Runs)->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
