// EP drop prediction speed.
//
//   HeroMonteCarlo   the target: a hero-scale estimate (704 GPUs = 11 EP
//                    groups of 64, 65,536 tokens/GPU = 46.1M tokens per step, k 8,
//                    384 experts, pooled waves) to +-0.1 percentage point (95% CI),
//                    in under 2 s. Counters: drop_pct, ci95_pp.
//   HeroAnalytic     the predictor's path (generator built once, as predict_drops caches it).
//   ExactDispatch    the executor's path: per-assignment keep mask for one layer of
//                    an EP-64 group at 8,192 tokens/GPU (4.2M assignments).
//
//   build-x/bench/drops_bench --benchmark_filter=Hero
#include <benchmark/benchmark.h>

#include <numeric>
#include <random>

#include "sim/base/dispatch.h"
#include "sim/drops.h"
#include "sim/routing.h"

using namespace rackstep::sim;

namespace {

DropScenario hero_step() {
  DropScenario s;  // pooled, sender cf 1.10, receiver cf 1.15, W 3, EP 64, 65,536 tokens/GPU, 4k
  s.gpus = 704;
  return s;
}

void HeroMonteCarlo(benchmark::State& state) {
  const DropCalibration cal = load_drop_calibration();
  const DropScenario s = hero_step();
  const int samples = static_cast<int>(state.range(0));
  DropEstimate e;
  for (auto _ : state) {
    RoutingGenerator gen(cal.model, s.routing_shape());
    e = estimate_drops_mc(s, gen, {.samples = samples, .seed = 7});
    benchmark::DoNotOptimize(e);
  }
  state.counters["drop_pct"] = 100 * e.mean.total();
  state.counters["ci95_pp"] = 100 * e.total_ci95;
  state.counters["tokens"] = double(s.step_gpus() * s.tokens_per_gpu);
}
BENCHMARK(HeroMonteCarlo)->Arg(4)->Arg(8)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(2);

void HeroAnalytic(benchmark::State& state) {
  const DropCalibration cal = load_drop_calibration();
  const DropScenario s = hero_step();
  RoutingGenerator gen(cal.model, s.routing_shape());
  DropEstimate e;
  for (auto _ : state) {
    e = estimate_drops_analytic(s, gen);
    benchmark::DoNotOptimize(e);
  }
  state.counters["drop_pct"] = 100 * e.mean.total();
}
BENCHMARK(HeroAnalytic)->Unit(benchmark::kMicrosecond);

void ExactDispatch(benchmark::State& state) {
  DispatchConfig cfg;  // 384 experts, k 8, pooled 1.10 / 1.15, W 3
  cfg.transport = static_cast<Transport>(state.range(0));
  const int64_t S = 64, T = 8192;
  std::mt19937_64 rng(3);
  std::vector<GpuAssignments> gpus(S);
  std::vector<int32_t> ids(cfg.n_experts);
  for (auto& g : gpus) {
    g.experts.resize(T * cfg.top_k);
    for (int64_t t = 0; t < T; ++t) {
      std::iota(ids.begin(), ids.end(), 0);
      for (int j = 0; j < cfg.top_k; ++j) {  // k distinct experts, uniformly
        std::uniform_int_distribution<int> pick(j, int(cfg.n_experts) - 1);
        std::swap(ids[j], ids[pick(rng)]);
        g.experts[t * cfg.top_k + j] = ids[j];
      }
    }
  }
  DispatchResult r;
  for (auto _ : state) {
    r = dispatch(cfg, gpus);
    benchmark::DoNotOptimize(r);
  }
  state.counters["assignments"] = double(r.counts.assignments);
  state.counters["drop_pct"] = 100 * r.counts.fraction();
}
BENCHMARK(ExactDispatch)->Arg(0)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
