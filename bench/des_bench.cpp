// Event-engine throughput (issue 4 target: >= 5 million events/s on one core)
// and the hero step (issue 4 target: one 704-GPU step with the production
// layout simulated in < 3 s).
//
//   build-des/bench/des_bench --benchmark_counters_tabular=true
//   build-des/bench/des_bench --benchmark_filter=Hero
//
// "events/s" counts heap events popped (task completions, latency ends and
// flow reschedules) per second of Engine::run(); graph building is excluded.
// BM_ExplicitStep (issue 15 targets: the 704-GPU hero step with every GPU
// explicit and jitter 0.05 built + simulated in < 3 s and < 1 GB; 8,192
// explicit GPUs in < 60 s and < 8 GB) builds the hero layout on 1, 11 and 128
// GB200 racks (64, 704 and 8,192 GPUs; the batch grows with the GPUs so each
// rank runs the hero's micro-batches) with one process per GPU, runs it with
// jitter and reports build and run seconds, events/s of the run, tasks, and
// the process's peak resident memory (getrusage ru_maxrss: run the sizes in
// ascending order, as registered, or one per process with --benchmark_filter).
//
//   build/bench/des_bench --benchmark_filter=Explicit
//
// BM_HeroStep times what `rackstep timeline` does after loading its inputs:
// building the step's task graph, running it and summarising it (critical path
// included). Its argument is --ranks-per-stage: 1 is the production run (one
// representative per symmetric group); larger values simulate more ranks
// explicitly, to show how the cost grows.
#include <benchmark/benchmark.h>
#include <sys/resource.h>

#include <chrono>

#include <string>
#include <vector>

#include "models/layer_graph.h"
#include "sim/base/source_dir.h"
#include "sim/calibration.h"
#include "sim/des.h"
#include "sim/layout.h"
#include "sim/predict.h"
#include "sim/step_graph.h"
#include "topologies/topology.h"

using namespace rackstep::sim;

namespace {

double pseudo_duration(uint64_t i) {
  // Deterministic spread of kernel lengths, 50-150 us, so events rarely tie.
  uint64_t x = i * 0x9e3779b97f4a7c15ULL;
  x ^= x >> 29;
  return 50e-6 + 100e-6 * static_cast<double>(x % 1000) / 1000.0;
}

// A pipeline-like compute graph: `gpus` ranks x `per_gpu` kernels on a
// compute stream; every 8th kernel waits for the same kernel on the previous
// rank (a send/recv edge).
Engine compute_graph(int gpus, int per_gpu) {
  Engine e;
  std::vector<ResourceId> stream;
  for (int g = 0; g < gpus; ++g) {
    int p = e.add_process("gpu" + std::to_string(g));
    stream.push_back(e.add_resource(p, "compute", ResourceKind::kComputeStream));
  }
  std::vector<TaskId> prev_rank(per_gpu);
  for (int g = 0; g < gpus; ++g) {
    for (int i = 0; i < per_gpu; ++i) {
      TaskId t = e.add_compute(stream[g], "k", "forward", pseudo_duration(g * per_gpu + i));
      if (g > 0 && i % 8 == 0) e.add_dependency(prev_rank[i], t);
      prev_rank[i] = t;
    }
  }
  return e;
}

// Compute plus communication: each rank alternates kernels with transfers
// over its NIC and one of 4 shared fabric links, so flows contend.
Engine mixed_graph(int gpus, int per_gpu) {
  Engine e;
  int fab = e.add_process("fabric");
  std::vector<ResourceId> uplinks;
  for (int i = 0; i < 4; ++i) {
    uplinks.push_back(e.add_resource(fab, "uplink" + std::to_string(i), ResourceKind::kFabricLink, 200e9));
  }
  for (int g = 0; g < gpus; ++g) {
    int p = e.add_process("gpu" + std::to_string(g));
    ResourceId compute = e.add_resource(p, "compute", ResourceKind::kComputeStream);
    ResourceId comm = e.add_resource(p, "comm", ResourceKind::kCommStream);
    ResourceId nic = e.add_resource(p, "nic", ResourceKind::kNic, 50e9);
    TaskId last_comm;
    for (int i = 0; i < per_gpu; ++i) {
      TaskId k = e.add_compute(compute, "k", "forward", pseudo_duration(g * per_gpu + i));
      if (i % 4 != 0) continue;
      TaskId c = e.add_transfer("x", "ep_dispatch", {nic, uplinks[g % 4]}, 2e6, comm, 5e-6);
      e.add_dependency(k, c);
      if (last_comm.valid()) e.add_dependency(last_comm, k);
      last_comm = c;
    }
  }
  return e;
}

void run_bench(benchmark::State& state, const Engine& e) {
  uint64_t events = 0;
  for (auto _ : state) {
    RunResult r = e.run();
    events += r.events;
    benchmark::DoNotOptimize(r.makespan_s);
  }
  state.counters["events/s"] = benchmark::Counter(static_cast<double>(events), benchmark::Counter::kIsRate);
  state.counters["tasks"] = static_cast<double>(e.num_tasks());
}

void BM_ComputeGraph(benchmark::State& state) {
  Engine e = compute_graph(static_cast<int>(state.range(0)), static_cast<int>(state.range(1)));
  run_bench(state, e);
}
BENCHMARK(BM_ComputeGraph)->Args({64, 4096})->Args({704, 1024})->Unit(benchmark::kMillisecond);

void BM_MixedGraph(benchmark::State& state) {
  Engine e = mixed_graph(static_cast<int>(state.range(0)), static_cast<int>(state.range(1)));
  run_bench(state, e);
}
BENCHMARK(BM_MixedGraph)->Args({64, 4096})->Unit(benchmark::kMillisecond);

std::string src(const std::string& p) { return std::string(rackstep::source_dir()) + "/" + p; }

void BM_HeroStep(benchmark::State& state) {
  static const rackstep::models::LayerGraph g =
      rackstep::models::build_layer_graph(rackstep::models::load_model(src("models/zoo/marin-535b-a23b.json")));
  const Predictor p(g, rackstep::topologies::load_cluster(src("topologies/zoo/gb200-11-racks.json")),
                    load_calibration());
  const Layout l = load_layout(src("sim/layouts/hero-ragged.json"));
  StepGraphOptions o;
  o.ranks_per_stage = state.range(0);
  int64_t tasks = 0;
  uint64_t events = 0;
  for (auto _ : state) {
    StepGraph sg = build_step_graph(p, l, o);
    RunResult r = sg.engine.run();
    StepSummary s = summarize(sg.engine, r);
    tasks = sg.engine.num_tasks();
    events = r.events;
    benchmark::DoNotOptimize(s.makespan_s);
  }
  state.counters["tasks"] = static_cast<double>(tasks);
  state.counters["events"] = static_cast<double>(events);
}
BENCHMARK(BM_HeroStep)->Arg(1)->Arg(8)->Arg(64)->Unit(benchmark::kMillisecond);

double peak_rss_bytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) * 1024.0;  // Linux: kilobytes
}

void BM_ExplicitStep(benchmark::State& state) {
  static const rackstep::models::LayerGraph g =
      rackstep::models::build_layer_graph(rackstep::models::load_model(src("models/zoo/marin-535b-a23b.json")));
  const int64_t racks = state.range(0);
  const rackstep::topologies::Cluster c = rackstep::topologies::load_cluster(src("topologies/zoo/gb200-11-racks.json"), racks);
  const Predictor p(g, c, load_calibration());
  Layout l = load_layout(src("sim/layouts/hero-ragged.json"));
  const int64_t hero_gpus = l.data;
  l.tokens_per_step = g.model.tokens_per_step() * c.gpus() / hero_gpus;
  l.data = c.gpus();
  StepGraphOptions o;
  o.ranks_per_stage = c.gpus();
  RunOptions ro;
  ro.jitter_sigma = 0.05;
  ro.seed = 1;
  using clock = std::chrono::steady_clock;
  double build_s = 0, run_s = 0, tasks = 0, events = 0;
  for (auto _ : state) {
    const auto t0 = clock::now();
    StepGraph sg = build_step_graph(p, l, o);
    const auto t1 = clock::now();
    RunResult r = sg.engine.run(ro);
    const auto t2 = clock::now();
    build_s += std::chrono::duration<double>(t1 - t0).count();
    run_s += std::chrono::duration<double>(t2 - t1).count();
    tasks = static_cast<double>(sg.engine.num_tasks());
    events += static_cast<double>(r.events);
    benchmark::DoNotOptimize(r.makespan_s);
  }
  const double n = static_cast<double>(state.iterations());
  state.counters["gpus"] = static_cast<double>(c.gpus());
  state.counters["tasks"] = tasks;
  state.counters["build_s"] = build_s / n;
  state.counters["run_s"] = run_s / n;
  state.counters["events/s"] = events / run_s;
  state.counters["peak_rss_GB"] = peak_rss_bytes() / 1e9;
  state.counters["bytes/task"] = peak_rss_bytes() / tasks;
}
BENCHMARK(BM_ExplicitStep)->Arg(1)->Arg(11)->Arg(128)->Iterations(1)->Unit(benchmark::kSecond);

}  // namespace

BENCHMARK_MAIN();
