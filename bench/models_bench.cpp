// Layer-graph construction and counting for the hero: the predictor builds a
// graph per candidate, so this sits on the sizing path.
//   ./build/bench/models_bench
#include <benchmark/benchmark.h>

#include "models/layer_graph.h"
#include "sim/base/source_dir.h"

using namespace rackstep::models;

static const ModelConfig& hero() {
  static const ModelConfig m =
      load_model(std::string(rackstep::source_dir()) + "/models/zoo/marin-535b-a23b.json");
  return m;
}

static void BM_LoadHeroJson(benchmark::State& state) {
  for (auto _ : state) {
    benchmark::DoNotOptimize(load_model(std::string(rackstep::source_dir()) + "/models/zoo/marin-535b-a23b.json"));
  }
}
BENCHMARK(BM_LoadHeroJson);

static void BM_BuildHeroGraph(benchmark::State& state) {
  const ModelConfig& m = hero();
  for (auto _ : state) {
    LayerGraph g = build_layer_graph(m);
    benchmark::DoNotOptimize(g.ops.data());
  }
  state.counters["ops"] = static_cast<double>(build_layer_graph(m).ops.size());
}
BENCHMARK(BM_BuildHeroGraph);

static void BM_CountHero(benchmark::State& state) {
  const LayerGraph g = build_layer_graph(hero());
  for (auto _ : state) {
    ParamCounts p = count_params(g);
    FlopCounts f = count_flops(g, 4096, FlopConvention::kMarin);
    benchmark::DoNotOptimize(p.total + f.forward);
  }
}
BENCHMARK(BM_CountHero);

BENCHMARK_MAIN();
