#include "exec/microbench.h"

#include <sched.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <sstream>

#include "exec/backend.h"
#include "exec/kernels.h"
#include "exec/model.h"
#include "exec/optim.h"
#include "exec/train.h"
#include "sim/base/check.h"
#include "sim/base/value_error.h"
#include "models/model.h"

namespace rackstep::exec {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

void fill_random(std::vector<float>& v, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (auto& x : v) x = u(rng);
}

double status_kib(const char* key) {
  std::ifstream f("/proc/self/status");
  std::string line;
  const std::string k = std::string(key) + ":";
  while (std::getline(f, line)) {
    if (line.rfind(k, 0) != 0) continue;
    std::istringstream in(line.substr(k.size()));
    double kib = 0;
    in >> kib;
    return kib;
  }
  return 0.0;
}

double process_cpu_now() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// A wall-clock interval and its de-loaded length. On a shared machine the
// threads wait while other processes run, so wall time measures the load as
// much as the work; the process's CPU time over the threads it uses does not
// (exact for one thread; for T threads it assumes the work spread over all T,
// the same estimator validate-local applies to training runs). That estimate
// fails for T > 1 on a loaded machine: a thread waiting for a descheduled peer
// burns CPU (OpenBLAS's pthread pool yields in a loop), measured at 1.3-3x a
// 2-thread step on this 2-core host at load 2-5. Under a real-time policy
// (`chrt -r 10 rackstep calibrate ...`: no ordinary process preempts ours) the
// wall time is the idle-machine time and is taken as it is.
bool realtime_policy() {
  const int p = sched_getscheduler(0);
  return p == SCHED_RR || p == SCHED_FIFO;
}

class LoadedTimer {
 public:
  explicit LoadedTimer(int threads) : threads_(threads), c0_(process_cpu_now()), t0_(Clock::now()) {}
  // (wall seconds, de-loaded seconds / wall seconds).
  std::pair<double, double> stop() const {
    const double wall = seconds_since(t0_);
    if (realtime_) return {wall, 1.0};
    const double cpu = (process_cpu_now() - c0_) / threads_;
    return {wall, wall > 0 ? std::clamp(cpu / wall, 0.01, 1.0) : 1.0};
  }

 private:
  int threads_;
  double c0_;
  Clock::time_point t0_;
  bool realtime_ = realtime_policy();
};

// The CPU backend: exec/kernels.h GEMMs and the CpuModel's own forward /
// backward with its per-op timer (the ops exactly as `rackstep train` runs them).
class CpuOpBackend final : public OpBackend {
 public:
  explicit CpuOpBackend(int threads) {
    set_threads(threads);
    threads_ = current_threads();
  }
  std::string name() const override { return "cpu"; }
  int threads() const override { return threads_; }

  PassSeconds gemm(int64_t m, int64_t n, int64_t k, int reps) override {
    std::vector<float> x(static_cast<size_t>(m * k)), w(static_cast<size_t>(k * n)), y(static_cast<size_t>(m * n));
    std::vector<float> dx(x.size()), dw(w.size());
    fill_random(x, 1);
    fill_random(w, 2);
    const int M = static_cast<int>(m), N = static_cast<int>(n), K = static_cast<int>(k);
    std::vector<double> f, b, share;
    for (int r = 0; r <= reps; ++r) {  // the first run warms caches and thread pools
      const LoadedTimer tf(threads_);
      linear_forward(y.data(), x.data(), w.data(), nullptr, M, K, N);
      const auto [wf, sf] = tf.stop();
      const LoadedTimer tb(threads_);
      linear_backward(dx.data(), dw.data(), nullptr, y.data(), x.data(), w.data(), M, K, N);
      const auto [wb, sb] = tb.stop();
      if (r == 0) continue;
      f.push_back(wf * sf);
      b.push_back(wb * sb);
      share.push_back(std::min(sf, sb));
    }
    return {*std::min_element(f.begin(), f.end()), *std::min_element(b.begin(), b.end()), median(share)};
  }

  double stream_bytes_per_s(double bytes, int reps) override {
    const size_t n = static_cast<size_t>(bytes / sizeof(float));
    std::vector<float> a(n, 1.f), b(n, 2.f), y(n);
    double best = 1e30;
    for (int r = 0; r <= reps; ++r) {
      const LoadedTimer timer(threads_);
      residual_forward(y.data(), a.data(), b.data(), n);
      const auto [wall, share] = timer.stop();
      if (r > 0) best = std::min(best, wall * share);
    }
    return 3.0 * static_cast<double>(n) * sizeof(float) / best;
  }

  ModelProfile profile(const models::LayerGraph& graph, int64_t batch, int64_t seq, int reps) override {
    // The peak resident set of this profile, as a run's is its VmHWM: Linux
    // resets the high-water mark on "5" > /proc/self/clear_refs. (The resident
    // set after the step missed the backward's transient peak.)
    const bool hwm_reset = static_cast<bool>(std::ofstream("/proc/self/clear_refs") << "5");
    CpuModel model(graph, batch, seq);
    model.init_params(1);
    const int64_t N = batch * seq;
    std::vector<int32_t> tokens, doc;
    make_profile_batch(graph, batch, seq, tokens, doc);
    const OptimizerConfig cfg = default_optimizer_config(1000, graph.model.d_model, N);
    Optimizer opt(cfg);
    // The step as the trainer runs it in one process (exec/train.cpp,
    // reduce_and_step): gradients into a shard buffer, the parameters' fp32
    // shard stepped, copied back. Both buffers are resident in a run (11 MiB of
    // tiny-moe's peak the profile lacked) and the copies take time.
    Arena shard_params(model.params().layout_ptr()), shard_grads(model.params().layout_ptr());
    std::copy_n(model.params().data(), shard_params.total_floats(), shard_params.data());
    OptimizerState state = init_optimizer_state(shard_params);

    // samples[(op, phase)][r - 1]: the op's seconds in repetition r, summed over
    // its calls, each de-loaded by its own CPU time (CPU since the previous op
    // ended, over the threads; wall time under a real-time policy). De-loading
    // the ops by their pass's share instead shrank every op of a pass with a
    // stall outside the ops (a 50 ms real-time throttle, a preemption between
    // ops), and the per-op minimum fell to half the pass (8x256 forward: ops
    // 31 ms of a 56 ms pass).
    std::map<std::pair<size_t, int>, std::vector<double>> samples;
    int recording = 0;  // the repetition being recorded (1..reps); 0 = warm-up
    const bool realtime = realtime_policy();
    double last_cpu = 0;
    model.set_op_timer([&](size_t op, int phase, Clock::time_point s, Clock::time_point e) {
      const double cpu = process_cpu_now();
      double secs = std::chrono::duration<double>(e - s).count();
      if (!realtime) secs = std::min(secs, (cpu - last_cpu) / threads_);
      last_cpu = cpu;
      if (recording == 0) return;
      std::vector<double>& v = samples[{op, phase}];
      v.resize(static_cast<size_t>(recording), 0.0);
      v.back() += secs;
    });
    std::vector<double> fwd, bwd, optim, shares;
    for (int r = 0; r <= reps; ++r) {
      recording = r;
      model.zero_grads();
      last_cpu = process_cpu_now();
      const LoadedTimer tf(threads_);
      model.forward(tokens.data(), tokens.data() + 1, doc.data());
      const auto [wf, sf] = tf.stop();
      last_cpu = process_cpu_now();
      const LoadedTimer tb(threads_);
      model.backward();
      const auto [wb, sb] = tb.stop();
      const LoadedTimer to(threads_);
      std::copy_n(model.grads().data(), shard_grads.total_floats(), shard_grads.data());
      std::copy_n(model.params().data(), shard_params.total_floats(), shard_params.data());
      opt.step(shard_params, shard_grads, state);
      std::copy_n(shard_params.data(), shard_params.total_floats(), model.params().data());
      const auto [wo, so] = to.stop();
      if (recording == 0) continue;
      fwd.push_back(wf * sf);
      bwd.push_back(wb * sb);
      optim.push_back(wo * so);
      shares.push_back((wf * sf + wb * sb) / (wf + wb));
    }
    model.set_op_timer(nullptr);
    ModelProfile p;
    // The fastest repetition: on a shared machine noise only adds time (validate-local
    // takes a run's fastest step the same way).
    p.forward_s = *std::min_element(fwd.begin(), fwd.end());
    p.backward_s = *std::min_element(bwd.begin(), bwd.end());
    p.optimizer_s = *std::min_element(optim.begin(), optim.end());
    p.cpu_share = median(shares);
    p.rss_bytes = hwm_reset ? peak_rss_bytes() : current_rss_bytes();
    p.activation_bytes = static_cast<double>(model.activation_bytes());
    p.model_bytes = static_cast<double>(2 * model.params().bytes() + 2 * model.grads().bytes() + model.activation_bytes() +
                                        state.momentum.bytes() + state.second_moment.bytes());
    std::map<size_t, OpSample> by_op;
    for (const auto& [key, secs] : samples) {
      OpSample& s = by_op[key.first];
      s.index = key.first;
      (key.second == 0 ? s.fwd_s : s.bwd_s) = *std::min_element(secs.begin(), secs.end());
    }
    for (const auto& [i, s] : by_op) p.ops.push_back(s);
    return p;
  }

 private:
  int threads_ = 1;
};

}  // namespace

void make_profile_batch(const models::LayerGraph& graph, int64_t batch, int64_t seq, std::vector<int32_t>& tokens,
                        std::vector<int32_t>& doc) {
  const int64_t N = batch * seq;
  tokens.assign(static_cast<size_t>(N + 1), 0);
  doc.assign(static_cast<size_t>(N), 0);
  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(graph.model.vocab - 1));
  for (auto& t : tokens) t = tok(rng);
  std::uniform_int_distribution<int> doc_len(64, 512);
  for (int64_t b = 0; b < batch; ++b) {
    int32_t id = 0;
    for (int64_t t = 0, left = doc_len(rng); t < seq; ++t, --left) {
      if (left == 0) {
        ++id;
        left = doc_len(rng);
      }
      doc[static_cast<size_t>(b * seq + t)] = id;
    }
  }
}

namespace {
std::mutex op_backends_mu;
std::map<std::string, std::function<std::unique_ptr<OpBackend>()>>& op_backends() {
  static std::map<std::string, std::function<std::unique_ptr<OpBackend>()>> m;
  return m;
}
}  // namespace

void register_op_backend(const std::string& name, std::function<std::unique_ptr<OpBackend>()> make) {
  std::lock_guard<std::mutex> lock(op_backends_mu);
  op_backends()[name] = std::move(make);
}

std::unique_ptr<OpBackend> make_op_backend(const std::string& name, int threads) {
  if (name == "cpu") return std::make_unique<CpuOpBackend>(threads);
  if (name != "cuda") throw ValueError("calibrate", "backend", "cpu or cuda", name);
  // The CUDA op backend lives in the CUDA plugin (exec/cuda/plugin/plugin.cpp).
  if (const std::string why = load_backend_plugin(name); !why.empty()) {
    throw ValueError("calibrate", "backend",
                     "cpu, or cuda with the CUDA backend plugin (librackstep_cuda.so, built where nvcc was found)",
                     "cuda without it: " + why);
  }
  std::function<std::unique_ptr<OpBackend>()> make;
  {
    std::lock_guard<std::mutex> lock(op_backends_mu);
    if (auto it = op_backends().find(name); it != op_backends().end()) make = it->second;
  }
  std::unique_ptr<OpBackend> b = make ? make() : nullptr;
  if (!b) throw ValueError("calibrate", "backend", "cpu, or cuda on a machine with a CUDA device", "cuda without a device");
  return b;
}

MicrobenchPlan make_plan(const std::vector<std::string>& model_paths, double budget_s) {
  MicrobenchPlan plan;
  plan.budget_s = budget_s;
  for (int64_t s : {64, 128, 256, 512, 1024}) plan.gemms.push_back({s, s, s, "square"});
  // (batch, seq) per model, smallest first: attention spans below, at and above
  // a local window; rows per expert from a few to hundreds.
  const std::vector<std::pair<int64_t, int64_t>> points = {{1, 128}, {2, 64}, {2, 256}, {4, 128},
                                                           {1, 512}, {4, 256}, {8, 128}, {8, 256}};
  for (const auto& path : model_paths) {
    const models::LayerGraph g = models::build_layer_graph(models::load_model(path));
    std::map<std::tuple<int64_t, int64_t, int64_t>, std::string> shapes;
    for (const auto& [batch, seq] : points) {
      plan.profiles.push_back({path, batch, seq});
      for (const auto& op : g.ops) {
        if (op.op_class != models::OpClass::kGemm) continue;
        const auto m = static_cast<int64_t>(static_cast<double>(batch * seq) * op.gemm_rows_per_token);
        shapes.emplace(std::make_tuple(m, op.gemm_n, op.gemm_k),
                       g.model.name + " " + op.name + " batch " + std::to_string(batch) + " seq " + std::to_string(seq));
      }
    }
    for (const auto& [s, src] : shapes) plan.gemms.push_back({std::get<0>(s), std::get<1>(s), std::get<2>(s), src});
  }
  std::stable_sort(plan.profiles.begin(), plan.profiles.end(), [](const auto& a, const auto& b) {
    return a.batch * a.seq < b.batch * b.seq;
  });
  return plan;
}

nlohmann::json run_microbenchmarks(OpBackend& backend, const MicrobenchPlan& plan, const Progress& progress) {
  const auto t0 = Clock::now();
  const double cpu0 = process_cpu_seconds();
  nlohmann::json doc = {{"format", "rackstep.calibration_measurements/1"},
                        {"backend", backend.name()},
                        {"threads", backend.threads()},
                        {"budget_s", plan.budget_s},
                        {"load_start", machine_load()},
                        {"rss_start_bytes", current_rss_bytes()},
                        {"timing", realtime_policy()
                                       ? "wall seconds under a real-time scheduling policy (no other process preempts)"
                                       : "seconds de-loaded: min(wall, process CPU time / threads); cpu_share = that over wall"},
                        {"realtime", realtime_policy()}};
  // A third of the budget for GEMMs and bandwidth, the rest for model profiles.
  const double gemm_budget_s = plan.budget_s / 3.0;
  nlohmann::json gemms = nlohmann::json::array();
  const size_t total = plan.gemms.size() + 1 + plan.profiles.size();
  size_t done = 0, skipped = 0;
  for (const auto& s : plan.gemms) {
    if (seconds_since(t0) > gemm_budget_s && s.source != "square") {
      ++skipped;
      continue;
    }
    progress("gemm " + std::to_string(s.m) + "x" + std::to_string(s.n) + "x" + std::to_string(s.k), done++, total);
    const PassSeconds p = backend.gemm(s.m, s.n, s.k, 3);
    gemms.push_back({{"m", s.m}, {"n", s.n}, {"k", s.k}, {"fwd_s", p.fwd_s}, {"bwd_s", p.bwd_s},
                     {"cpu_share", p.cpu_share}, {"source", s.source}});
  }
  doc["gemm"] = gemms;
  progress("stream", done++, total);
  const double bytes = 64e6;
  doc["stream"] = {{"bytes_per_buffer", bytes}, {"bytes_per_s", backend.stream_bytes_per_s(bytes, 5)},
                   {"kernel", "residual_forward y = a + b (reads 2, writes 1)"}};
  // Rounds over the profiles while the budget lasts, each profile keeping its
  // fastest forward, backward, optimizer and op times over the rounds: a slow
  // period of the shared machine lasts seconds, longer than one profile's
  // repetitions (measured at 2 threads: the optimizer step, the same work in
  // every profile, 28 ms in some profiles and 38 ms in the next ones).
  std::vector<std::pair<const ProfilePoint*, ModelProfile>> measured;
  std::vector<models::LayerGraph> graphs;
  if (!backend.can_profile()) doc["profiles_skipped"] = backend.name() + " has no model driver to profile yet";
  for (const auto& p : plan.profiles) {
    if (!backend.can_profile()) break;
    if (seconds_since(t0) > plan.budget_s && !measured.empty()) {
      ++skipped;
      continue;
    }
    progress("profile " + p.model_path + " batch " + std::to_string(p.batch) + " seq " + std::to_string(p.seq), done++,
             total);
    graphs.push_back(models::build_layer_graph(models::load_model(p.model_path)));
    measured.emplace_back(&p, backend.profile(graphs.back(), p.batch, p.seq, 5));
  }
  int rounds = 1;
  for (double round_s = seconds_since(t0); rounds < 8 && !measured.empty(); ++rounds) {
    const double start_s = seconds_since(t0);
    if (start_s + round_s > plan.budget_s) break;
    progress("profiles again (round " + std::to_string(rounds + 1) + ")", done, total);
    for (size_t i = 0; i < measured.size(); ++i) {
      const ProfilePoint& p = *measured[i].first;
      ModelProfile& best = measured[i].second;
      const ModelProfile mp = backend.profile(graphs[i], p.batch, p.seq, 5);
      best.forward_s = std::min(best.forward_s, mp.forward_s);
      best.backward_s = std::min(best.backward_s, mp.backward_s);
      best.optimizer_s = std::min(best.optimizer_s, mp.optimizer_s);
      for (size_t k = 0; k < best.ops.size() && k < mp.ops.size(); ++k) {
        best.ops[k].fwd_s = std::min(best.ops[k].fwd_s, mp.ops[k].fwd_s);
        best.ops[k].bwd_s = std::min(best.ops[k].bwd_s, mp.ops[k].bwd_s);
      }
    }
    round_s = seconds_since(t0) - start_s;
  }
  nlohmann::json profiles = nlohmann::json::array();
  for (size_t i = 0; i < measured.size(); ++i) {
    const ProfilePoint& p = *measured[i].first;
    const ModelProfile& mp = measured[i].second;
    const models::LayerGraph& g = graphs[i];
    nlohmann::json ops = nlohmann::json::array();
    for (const auto& o : mp.ops) {
      ops.push_back({{"index", o.index}, {"op", g.ops[o.index].name}, {"fwd_s", o.fwd_s}, {"bwd_s", o.bwd_s}});
    }
    profiles.push_back({{"model", p.model_path},
                        {"model_name", g.model.name},
                        {"batch", p.batch},
                        {"seq", p.seq},
                        {"forward_s", mp.forward_s},
                        {"backward_s", mp.backward_s},
                        {"optimizer_s", mp.optimizer_s},
                        {"cpu_share", mp.cpu_share},
                        {"rss_bytes", mp.rss_bytes},
                        {"model_bytes", mp.model_bytes},
                        {"activation_bytes", mp.activation_bytes},
                        {"ops", ops}});
  }
  doc["profile_rounds"] = rounds;
  doc["profiles"] = profiles;
  doc["skipped_for_budget"] = skipped;
  doc["elapsed_s"] = seconds_since(t0);
  doc["cpu_s"] = process_cpu_seconds() - cpu0;
  doc["load_end"] = machine_load();
  progress("done", total, total);
  return doc;
}

double current_rss_bytes() { return status_kib("VmRSS") * 1024.0; }
double peak_rss_bytes() { return status_kib("VmHWM") * 1024.0; }

nlohmann::json machine_load() {
  std::ifstream f("/proc/loadavg");
  double l1 = 0, l5 = 0, l15 = 0;
  f >> l1 >> l5 >> l15;
  return {{"load1", l1}, {"load5", l5}, {"load15", l15}};
}

double process_cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

}  // namespace rackstep::exec
