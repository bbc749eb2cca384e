// Optimizer and checkpoint speed (wall-clock rates: OpenBLAS runs its own threads):
// Newton–Schulz GFLOP/s (cblas_sgemm inside),
// Adam and MuonH steps per parameter, checkpoint save/load bandwidth.
//
//   build-data/bench/optim_bench --benchmark_filter=NewtonSchulz
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <filesystem>
#include <random>

#include "exec/arena.h"
#include "exec/checkpoint.h"
#include "exec/optim.h"

using namespace rackstep::exec;

namespace {

void fill(float* x, int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 0.02f);
  for (int64_t i = 0; i < n; ++i) x[i] = d(rng);
}

void fill(Arena& a, uint32_t seed) { fill(a.data(), a.total_floats(), seed); }

// FLOPs of one quintic iteration on (r, c), r <= c: X X^T, A A, B X.
double ns_flops(int64_t rows, int64_t cols, int steps) {
  const double r = static_cast<double>(std::min(rows, cols)), c = static_cast<double>(std::max(rows, cols));
  return steps * (2 * r * r * c + 2 * r * r * r + 2 * r * r * c);
}

void BM_NewtonSchulz(benchmark::State& state) {
  const int64_t rows = state.range(0), cols = state.range(1);
  std::vector<float> g(static_cast<size_t>(rows * cols)), out(g.size()), work;
  fill(g.data(), rows * cols, 1);
  for (auto _ : state) {
    newton_schulz(g.data(), rows, cols, 5, out.data(), work);
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["GFLOP/s"] =
      benchmark::Counter(ns_flops(rows, cols, 5) * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_NewtonSchulz)->Args({256, 256})->Args({512, 1536})->Args({1536, 512})->Args({1024, 1024})
    ->UseRealTime()->Unit(benchmark::kMillisecond);

// One optimizer step of a single group over n parameters.
void BM_OptimizerStep(benchmark::State& state, OptGroup group, std::vector<int64_t> shape) {
  auto layout = std::make_shared<ArenaLayout>(std::vector<TensorSpec>{{"w", shape, group}});
  Arena params(layout), grads(layout);
  fill(params, 1);
  fill(grads, 2);
  OptimizerState st = init_optimizer_state(params);
  OptimizerConfig cfg;
  cfg.adam_lr = 1e-3;
  cfg.muonh_lr = 4e-3;
  cfg.total_steps = 1 << 30;
  Optimizer opt(cfg);
  for (auto _ : state) opt.step(params, grads, st);
  state.counters["params/s"] = benchmark::Counter(static_cast<double>(layout->param_count()),
                                                  benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK_CAPTURE(BM_OptimizerStep, adam_4M, OptGroup::kAdam, std::vector<int64_t>{4096, 1024})
    ->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_OptimizerStep, adamh_4M, OptGroup::kAdamH, std::vector<int64_t>{1024, 4096})
    ->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_OptimizerStep, muonh_512x1536, OptGroup::kMuonH, std::vector<int64_t>{512, 1536})
    ->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_OptimizerStep, muonh_experts_16x256x256, OptGroup::kMuonH, std::vector<int64_t>{16, 256, 256})
    ->UseRealTime()->Unit(benchmark::kMillisecond);

void BM_Checkpoint(benchmark::State& state) {
  const bool load = state.range(1) != 0;
  auto layout = std::make_shared<ArenaLayout>(std::vector<TensorSpec>{
      {"embed", {state.range(0), 1024}, OptGroup::kAdam}, {"w", {1024, 1024}, OptGroup::kMuonH}});
  Arena params(layout);
  fill(params, 3);
  OptimizerState st = init_optimizer_state(params);
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("rackstep-bench-" + std::to_string(::getpid()) + ".rsck")).string();
  CheckpointMeta meta;
  save_checkpoint(path, params, st, meta);
  const double bytes = static_cast<double>(std::filesystem::file_size(path));
  for (auto _ : state) {
    if (load) load_checkpoint(path, params, st, meta);
    else save_checkpoint(path, params, st, meta);
  }
  std::filesystem::remove(path);
  state.counters["bytes/s"] = benchmark::Counter(bytes, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_Checkpoint)->Args({4096, 0})->Args({4096, 1})->UseRealTime()->Unit(benchmark::kMillisecond);

void BM_Checksum(benchmark::State& state) {
  std::vector<float> x(static_cast<size_t>(state.range(0)));
  fill(x.data(), state.range(0), 4);
  for (auto _ : state) benchmark::DoNotOptimize(checksum64(x.data(), x.size() * sizeof(float)));
  state.counters["bytes/s"] = benchmark::Counter(static_cast<double>(x.size() * sizeof(float)),
                                                 benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_Checksum)->Arg(1 << 22)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
