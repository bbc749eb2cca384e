// Step simulation speed: one hero step on 704 GPUs with the production layout
// (build the task graph + simulate; target < 3 s on one core, issue 4), and a
// pipelined step (PP 6 x 24 micro-batches, DualPipeV) with every collective as
// byte flows over shared links.
//
//   build-step/bench/step_graph_bench
#include <benchmark/benchmark.h>

#include <string>

#include "sim/predict.h"
#include "models/source_dir.h"
#include "sim/step_graph.h"

namespace {

std::string src(const std::string& p) { return std::string(rackstep::source_dir()) + "/" + p; }

const rackstep::models::LayerGraph& hero_graph() {
  static const auto g =
      rackstep::models::build_layer_graph(rackstep::models::load_model(src("models/zoo/marin-535b-a23b.json")));
  return g;
}

void run_step(benchmark::State& state, const std::string& cluster, rackstep::sim::Layout l) {
  const rackstep::sim::Predictor p(hero_graph(), rackstep::topologies::load_cluster(src(cluster)));
  uint64_t events = 0;
  for (auto _ : state) {
    rackstep::sim::StepGraph sg = rackstep::sim::build_step_graph(p, l, {});
    rackstep::sim::RunResult r = sg.engine.run();
    events += r.events;
    benchmark::DoNotOptimize(r.makespan_s);
  }
  state.counters["steps_per_s"] = benchmark::Counter(static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
  state.counters["events_per_step"] = static_cast<double>(events) / static_cast<double>(state.iterations());
}

// The pricing the step graph starts from: Predictor::price of the hero layout
// (prediction, per-layer and per-op timings, every collective with its bytes).
void BM_PriceHero(benchmark::State& state) {
  const rackstep::sim::Predictor p(hero_graph(), rackstep::topologies::load_cluster(src("topologies/zoo/gb200-11-racks.json")));
  const rackstep::sim::Layout l = rackstep::sim::load_layout(src("sim/layouts/hero-ragged.json"));
  for (auto _ : state) {
    rackstep::sim::StepPrice price = p.price(l);
    benchmark::DoNotOptimize(price.prediction.step_time_s);
  }
  state.counters["prices_per_s"] = benchmark::Counter(static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_PriceHero);

void BM_HeroStep(benchmark::State& state) {
  run_step(state, "topologies/zoo/gb200-11-racks.json", rackstep::sim::load_layout(src("sim/layouts/hero-ragged.json")));
}
BENCHMARK(BM_HeroStep)->Unit(benchmark::kMillisecond);

void BM_HeroPooledStep(benchmark::State& state) {
  run_step(state, "topologies/zoo/gb200-11-racks.json", rackstep::sim::load_layout(src("sim/layouts/hero-pooled.json")));
}
BENCHMARK(BM_HeroPooledStep)->Unit(benchmark::kMillisecond);

void BM_DualPipeVStep(benchmark::State& state) {
  rackstep::sim::Layout l = rackstep::sim::load_layout(src("sim/layouts/gb200-pp6.json"));
  l.schedule = rackstep::sim::PpSchedule::kDualPipeV;
  run_step(state, "topologies/zoo/gb200-12-racks.json", l);
}
BENCHMARK(BM_DualPipeVStep)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
