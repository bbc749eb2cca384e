// Predictor speed: single-layout predictions per second on one core (the hero on
// 11 racks; target >= 100,000/s), and a full sweep of the hero on 12 racks.
//
//   build-predict/bench/predict_bench --benchmark_filter=Predict
#include <benchmark/benchmark.h>

#include <string>

#include "sim/predict.h"
#include "sim/base/source_dir.h"
#include "sim/sweep.h"

namespace {

std::string src(const std::string& p) { return std::string(rackstep::source_dir()) + "/" + p; }

const rackstep::models::LayerGraph& hero_graph() {
  static const auto g = rackstep::models::build_layer_graph(rackstep::models::load_model(src("models/zoo/marin-535b-a23b.json")));
  return g;
}

void BM_PredictHero(benchmark::State& state) {
  const rackstep::sim::Predictor p(hero_graph(), rackstep::topologies::load_cluster(src("topologies/zoo/gb200-11-racks.json")));
  rackstep::sim::Layout l = rackstep::sim::load_layout(src("sim/layouts/hero-ragged.json"));
  rackstep::sim::Reason r{};
  for (auto _ : state) {
    auto pr = p.predict_fast(l, &r);
    benchmark::DoNotOptimize(pr.step_time_s);
  }
  state.counters["predictions_per_s"] = benchmark::Counter(static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_PredictHero);

void BM_PredictHeroFullChecks(benchmark::State& state) {
  const rackstep::sim::Predictor p(hero_graph(), rackstep::topologies::load_cluster(src("topologies/zoo/gb200-11-racks.json")));
  rackstep::sim::Layout l = rackstep::sim::load_layout(src("sim/layouts/hero-ragged.json"));
  for (auto _ : state) {
    auto pr = p.predict(l);
    benchmark::DoNotOptimize(pr.step_time_s);
  }
  state.counters["predictions_per_s"] = benchmark::Counter(static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_PredictHeroFullChecks);

void BM_SweepHero12Racks(benchmark::State& state) {
  const rackstep::sim::Predictor p(hero_graph(), rackstep::topologies::load_cluster(src("topologies/zoo/gb200-12-racks.json")));
  int64_t layouts = 0;
  for (auto _ : state) {
    auto r = rackstep::sim::sweep(p, {.top = 10, .threads = static_cast<int>(state.range(0))});
    layouts = r.enumerated;
    benchmark::DoNotOptimize(r.valid);
  }
  state.counters["layouts"] = static_cast<double>(layouts);
}
BENCHMARK(BM_SweepHero12Racks)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->Iterations(1);

}  // namespace

BENCHMARK_MAIN();
