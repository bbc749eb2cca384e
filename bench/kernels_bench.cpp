// Throughput of the CPU kernels (exec/kernels.h): sgemm GFLOP/s, the
// machine's measured peak that CPU MFU is computed against, and attention
// forward/backward.
//
//   build-kernels/bench/kernels_bench                        # everything
//   build-kernels/bench/kernels_bench --benchmark_filter=Sgemm
//
// FLOP/s counters: sgemm 2·M·N·K; attention forward 4·hd per visible
// (query, key) pair per head (q·k and p·v), backward 8·hd per pair (dv, dp,
// dq, dk; the recomputed q·k adds 2·hd more, counted as hardware work, not here).
#include <benchmark/benchmark.h>

#include <cmath>
#include <random>
#include <vector>

#include "exec/kernels.h"

namespace {

using namespace rackstep::exec;

std::vector<float> random_floats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// y (M, N) = x (M, K) · W (K, N) through linear_forward, i.e. cblas_sgemm.
void BM_Sgemm(benchmark::State& state) {
  const int M = static_cast<int>(state.range(0));
  const int K = static_cast<int>(state.range(1));
  const int N = static_cast<int>(state.range(2));
  auto x = random_floats(static_cast<size_t>(M) * K, 1);
  auto w = random_floats(static_cast<size_t>(K) * N, 2);
  std::vector<float> y(static_cast<size_t>(M) * N);
  for (auto _ : state) {
    linear_forward(y.data(), x.data(), w.data(), nullptr, M, K, N);
    benchmark::DoNotOptimize(y.data());
  }
  const double flops = 2.0 * M * N * K;
  state.counters["FLOP/s"] = benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_Sgemm)
    ->Args({512, 512, 512})
    ->Args({1024, 1024, 1024})
    ->Args({2048, 2048, 2048})
    ->Args({4096, 512, 1536})  // a tiny model's token block through an MLP projection
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

struct AttnBuffers {
  int T, H, kv, hd, window;
  std::vector<float> q, k, v, o, lse, dout, dq, dk, dv;
  AttnBuffers(int T_, int H_, int kv_, int hd_, int window_)
      : T(T_), H(H_), kv(kv_), hd(hd_), window(window_),
        q(random_floats(static_cast<size_t>(T) * H * hd, 3)),
        k(random_floats(static_cast<size_t>(T) * kv * hd, 4)),
        v(random_floats(static_cast<size_t>(T) * kv * hd, 5)),
        o(q.size()), lse(static_cast<size_t>(H) * T),
        dout(random_floats(q.size(), 6)), dq(q.size()), dk(k.size()), dv(v.size()) {}
  // Visible (query, key) pairs per head for causal attention with the window.
  double pairs() const {
    double p = 0.0;
    for (int i = 0; i < T; ++i) p += window > 0 ? std::min(i + 1, window) : i + 1;
    return p * H;
  }
  float scale() const { return 1.0f / std::sqrt(static_cast<float>(hd)); }
  void forward() {
    attention_forward(o.data(), lse.data(), q.data(), k.data(), v.data(), nullptr, 1, T, H, kv, kv,
                      hd, window, scale());
  }
  void backward() {
    attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(), v.data(),
                       o.data(), lse.data(), nullptr, 1, T, H, kv, kv, hd, window, scale());
  }
};

// Args: T, window (0 = full causal); 8 heads, 2 kv heads, head dim 64.
void BM_AttentionForward(benchmark::State& state) {
  AttnBuffers a(static_cast<int>(state.range(0)), 8, 2, 64, static_cast<int>(state.range(1)));
  for (auto _ : state) {
    a.forward();
    benchmark::DoNotOptimize(a.o.data());
  }
  state.counters["FLOP/s"] = benchmark::Counter(4.0 * a.hd * a.pairs(), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["tokens/s"] = benchmark::Counter(a.T, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_AttentionForward)->Args({1024, 0})->Args({1024, 256})->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_AttentionBackward(benchmark::State& state) {
  AttnBuffers a(static_cast<int>(state.range(0)), 8, 2, 64, static_cast<int>(state.range(1)));
  a.forward();
  for (auto _ : state) {
    a.backward();
    benchmark::DoNotOptimize(a.dq.data());
  }
  state.counters["FLOP/s"] = benchmark::Counter(8.0 * a.hd * a.pairs(), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["tokens/s"] = benchmark::Counter(a.T, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_AttentionBackward)->Args({1024, 0})->Args({1024, 256})->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
