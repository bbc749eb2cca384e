// Training throughput of the CPU engine on the tiny model (exec/model.h +
// exec/optim.h): tokens/s of whole steps (forward, backward, optimizer), the
// share of step time spent in GEMM-class ops (profiler, exec/profiler.h), and
// the GFLOP/s those GEMM ops achieve against the machine's measured sgemm peak.
//
//   build-train/bench/train_bench                                   # recipe batch (8 x 256)
//   OMP_NUM_THREADS=2 build-train/bench/train_bench --benchmark_filter=Step
//
// Counters: tokens_per_s; gemm_share (GEMM + grouped-GEMM op seconds / all op
// and optimizer seconds); gemm_gflop_s (their fp32 FLOPs per models::op_cost /
// their seconds); sgemm_peak_gflop_s (1024^3 sgemm, best of 3); gemm_vs_peak;
// tokens_per_cpu_s (tokens over the process's user + system CPU seconds, all
// threads: steadier than wall time on a shared machine).
// The same model in PyTorch: bench/torch_train_bench.py; both side by side with
// their ratio: scripts/bench_train_vs_torch.sh.
#include <benchmark/benchmark.h>
#include <sys/resource.h>

#include <chrono>
#include <string>
#include <vector>

#include "exec/kernels.h"
#include "sim/base/source_dir.h"
#include "exec/model.h"
#include "exec/optim.h"
#include "exec/profiler.h"
#include "exec/train.h"
#include "models/layer_graph.h"

namespace {

using namespace rackstep;

// User + system CPU seconds of the whole process (every thread).
double process_cpu_s() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}
using namespace rackstep::exec;

void BM_TrainStep(benchmark::State& state) {
  const models::LayerGraph g =
      models::build_layer_graph(models::load_model(std::string(rackstep::source_dir()) + "/models/zoo/tiny-moe.json"));
  const int64_t B = state.range(0), T = state.range(1);
  CpuModel m(g, B, T);
  m.init_params(1);
  std::vector<int32_t> in(static_cast<size_t>(B * T)), tgt(in.size()), doc(in.size());
  uint64_t s = 1;
  for (size_t i = 0; i < in.size(); ++i) {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    in[i] = static_cast<int32_t>((s >> 33) % 257);
    tgt[i] = static_cast<int32_t>((s >> 13) % 257);
    doc[i] = static_cast<int32_t>(i / 100);
  }
  Optimizer opt(default_optimizer_config(1000, g.model.d_model, B * T));
  OptimizerState st = init_optimizer_state(m.params());
  Profiler prof(g, B, T, current_threads());
  prof.attach(m);
  const double cpu0_s = process_cpu_s();
  for (auto _ : state) {
    prof.begin_step(st.step);
    m.zero_grads();
    benchmark::DoNotOptimize(m.forward(in.data(), tgt.data(), doc.data()).loss);
    m.backward();
    prof.begin_optimizer();
    opt.step(m.params(), m.grads(), st);
    prof.end_optimizer();
    m.update_balancing();
    prof.end_step();
  }
  const double cpu_s = process_cpu_s() - cpu0_s;
  const auto by_class = prof.seconds_by_class();
  double gemm_s = 0;
  for (const char* c : {"gemm", "grouped_gemm"}) {
    auto it = by_class.find(c);
    if (it != by_class.end()) gemm_s += it->second;
  }
  const double peak = measure_sgemm_flops_per_s(1024, 0.2);
  state.SetItemsProcessed(state.iterations() * B * T);
  state.counters["tokens_per_s"] = benchmark::Counter(static_cast<double>(B * T), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["gemm_share"] = gemm_s / prof.total_seconds();
  state.counters["gemm_gflop_s"] = prof.gemm_flops() / gemm_s / 1e9;
  state.counters["sgemm_peak_gflop_s"] = peak / 1e9;
  state.counters["gemm_vs_peak"] = prof.gemm_flops() / gemm_s / peak;
  state.counters["tokens_per_cpu_s"] = static_cast<double>(state.iterations() * B * T) / cpu_s;
  state.counters["threads"] = current_threads();
}
BENCHMARK(BM_TrainStep)->Args({8, 256})->Args({2, 256})->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
