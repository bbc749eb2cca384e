#include "sim/fit.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <sstream>

#include "sim/base/check.h"
#include "sim/base/json_io.h"
#include "sim/base/source_dir.h"
#include "models/model.h"
#include "sim/calibration.h"
#include "sim/predict.h"
#include "topologies/topology.h"

namespace rackstep::sim {

namespace {

using models::OpClass;

// Unknowns of the op fit: 1/efficiency per class (GEMM: 1/peak efficiency),
// and the per-kernel launch / framework overhead in seconds.
// The isolated GEMM micro-benchmarks have their own efficiency and per-call
// overhead and share only the shape curve (half_dim) with the model's ops: a
// lone GEMM runs with warm caches and no per-op framework cost, so tying it
// to the in-model GEMMs fitted those ~20% too fast and pinned the launch
// overhead at 0 (a small lone GEMM takes microseconds; an op of the engine at
// 2 threads pays tens of microseconds waking its threads).
enum Unknown { kGemm, kGrouped, kAttnFwd, kAttnBwd, kElementwise, kNorm, kRouting, kLoss, kLookup, kLaunch,
               kGemmBench, kLaunchBench, kUnknowns };
const std::array<const char*, kUnknowns> kUnknownName = {"gemm",  "grouped_gemm", "attention_fwd", "attention_bwd",
                                                         "elementwise", "norm", "routing", "loss", "lookup",
                                                         "launch_overhead_s", "gemm_isolated", "launch_isolated_s"};

Unknown unknown_of(OpClass c, bool backward) {
  switch (c) {
    case OpClass::kGemm: return kGemm;
    case OpClass::kGroupedGemm: return kGrouped;
    case OpClass::kAttention: return backward ? kAttnBwd : kAttnFwd;
    case OpClass::kNorm: return kNorm;
    case OpClass::kRouting: return kRouting;
    case OpClass::kLoss: return kLoss;
    case OpClass::kLookup: return kLookup;
    default: return kElementwise;  // sim/cost.cpp prices every other class at the elementwise efficiency
  }
}

struct Row {
  std::array<double, kUnknowns> x{};
  double y = 0, w = 1;
};

// Weighted least squares with box bounds: solve, pin what leaves its box to
// the bound, solve again (a few rounds; the problem is small and well posed).
std::array<double, kUnknowns> solve_bounded(const std::vector<Row>& rows, const std::array<double, kUnknowns>& prior,
                                            const std::array<double, kUnknowns>& lo,
                                            const std::array<double, kUnknowns>& hi) {
  std::array<bool, kUnknowns> fixed{};
  std::array<double, kUnknowns> u = prior;
  for (int round = 0; round < kUnknowns + 1; ++round) {  // at most one pin per unknown
    std::array<std::array<double, kUnknowns + 1>, kUnknowns> a{};
    for (const Row& r : rows) {
      double y = r.y;
      for (int j = 0; j < kUnknowns; ++j) {
        if (fixed[j]) y -= r.x[j] * u[j];
      }
      for (int i = 0; i < kUnknowns; ++i) {
        if (fixed[i]) continue;
        for (int j = 0; j < kUnknowns; ++j) {
          if (!fixed[j]) a[i][j] += r.w * r.w * r.x[i] * r.x[j];
        }
        a[i][kUnknowns] += r.w * r.w * r.x[i] * y;
      }
    }
    // A small ridge toward the prior keeps unknowns without data (a class the
    // models lack) where they were instead of making the system singular. It is
    // relative to each unknown's own diagonal: the columns differ by twelve
    // orders of magnitude (kernel counts for the launch overhead, seconds for
    // the classes), and a ridge scaled by the largest held every small class at
    // its prior (a closed loop fitted norm 0.6 for a true 0.12).
    for (int i = 0; i < kUnknowns; ++i) {
      if (fixed[i]) continue;
      const double ridge = a[i][i] > 0 ? 1e-9 * a[i][i] : 1.0;
      a[i][i] += ridge;
      a[i][kUnknowns] += ridge * prior[i];
    }
    for (int i = 0; i < kUnknowns; ++i) {
      if (fixed[i]) {
        a[i] = {};
        a[i][i] = 1;
        a[i][kUnknowns] = u[i];
      }
    }
    // Gaussian elimination with partial pivoting.
    for (int c = 0; c < kUnknowns; ++c) {
      int p = c;
      for (int r = c + 1; r < kUnknowns; ++r) {
        if (std::fabs(a[r][c]) > std::fabs(a[p][c])) p = r;
      }
      std::swap(a[c], a[p]);
      RS_CHECK(a[c][c] != 0, "the ridge keeps the normal equations nonsingular");
      for (int r = 0; r < kUnknowns; ++r) {
        if (r == c) continue;
        const double f = a[r][c] / a[c][c];
        for (int k = c; k <= kUnknowns; ++k) a[r][k] -= f * a[c][k];
      }
    }
    bool moved = false;
    for (int i = 0; i < kUnknowns; ++i) {
      u[i] = a[i][kUnknowns] / a[i][i];
      if (fixed[i]) continue;
      if (u[i] < lo[i] || u[i] > hi[i]) {
        u[i] = std::clamp(u[i], lo[i], hi[i]);
        fixed[i] = true;
        moved = true;
      }
    }
    if (!moved) break;
  }
  return u;
}

double rel_rms(const std::vector<Row>& rows, const std::array<double, kUnknowns>& u) {
  double s = 0, n = 0;
  for (const Row& r : rows) {
    double p = 0;
    for (int j = 0; j < kUnknowns; ++j) p += r.x[j] * u[j];
    s += r.w * r.w * (p - r.y) * (p - r.y);
    n += 1;
  }
  return n > 0 ? std::sqrt(s / n) : 0.0;
}

// {"value": x, "source": s}
nlohmann::json sourced(double value, const std::string& source) { return {{"value", value}, {"source", source}}; }

std::string fmt(const char* f, double x) {
  char buf[96];
  std::snprintf(buf, sizeof buf, f, x);
  return buf;
}

// Every efficiency 1, the GEMM curve at half_dim h, launch overhead `launch`:
// the predictor's op times are then the "work" terms of the linear fit.
Calibration unit_calibration(const Calibration& base, const std::string& gpu, double h, double launch) {
  Calibration c = base;
  c.gemm_peak_eff[gpu] = 1.0;
  c.gemm_sustained_ratio.erase(gpu);  // a profiled run's op times are sustained rates already
  c.gemm_half_dim = h;
  c.grouped_factor = 1.0;
  c.attention_fwd_eff = c.attention_bwd_eff = 1.0;
  c.attention_eff_by_gpu.erase(gpu);  // the fit solves for the stack-wide efficiencies on this GPU
  c.mem_eff_elementwise = c.mem_eff_norm = c.mem_eff_routing = c.mem_eff_loss = c.mem_eff_lookup = 1.0;
  c.launch_overhead_s = launch;
  c.gc_pause_s = 0.0;
  return c;
}

void apply(Calibration& c, const std::string& gpu, double h, const std::array<double, kUnknowns>& u) {
  c.gemm_half_dim = h;
  c.gemm_peak_eff[gpu] = 1.0 / u[kGemm];
  c.gemm_sustained_ratio.erase(gpu);
  c.grouped_factor = std::min(1.0, u[kGemm] / u[kGrouped]);
  c.attention_fwd_eff = 1.0 / u[kAttnFwd];
  c.attention_bwd_eff = 1.0 / u[kAttnBwd];
  c.attention_eff_by_gpu.erase(gpu);
  c.mem_eff_elementwise = 1.0 / u[kElementwise];
  c.mem_eff_norm = 1.0 / u[kNorm];
  c.mem_eff_routing = 1.0 / u[kRouting];
  c.mem_eff_loss = 1.0 / u[kLoss];
  c.mem_eff_lookup = 1.0 / u[kLookup];
  c.launch_overhead_s = u[kLaunch];
  c.gc_pause_s = 0.0;
}

struct Profile {
  models::LayerGraph graph;
  int64_t batch = 0, seq = 0;
  double forward_s = 0, backward_s = 0, optimizer_s = 0, rss_bytes = 0;
  double activation_bytes = 0;  // the engine's activation arena (0: not measured)
  std::vector<std::array<double, 3>> ops;  // (graph index, fwd_s, bwd_s)
};

double shape_factor(double x, double h) { return x / (x + h); }

}  // namespace

std::string topology_for_device(const std::string& device, const std::string& file) {
  const std::string table = std::string(rackstep::source_dir()) + "/topologies/cuda_devices.json";
  const nlohmann::json t = load_json_file(table);
  std::string names;
  for (const auto& d : t.at("devices")) {
    const std::string name = d.at("cuda_name").get<std::string>();
    if (name == device) return std::string(rackstep::source_dir()) + "/" + d.at("topology").get<std::string>();
    names += (names.empty() ? "" : ", ") + name;
  }
  throw UserError(file, "/device",
                  "a GPU with a zoo topology (" + names + "; topologies/cuda_devices.json), or --topology FILE",
                  "\"" + device + "\"");
}

Layout cpu_run_layout(int64_t processes, int64_t ep, int64_t batch, int64_t seq, const std::string& transport) {
  Layout l;
  l.name = "cpu-run";
  l.data = processes;
  l.fsdp = processes;  // the engine shards optimizer state (whole tensors) over every rank, ZeRO style
  // ZeRO-1 in memory: every rank keeps the whole parameters (all-gathered after
  // the step) and the whole gradient buffer it reduce-scatters from; the fp32
  // shard it steps and its optimizer state are sharded. (Stage 3, the default,
  // predicted sharded weights and gradients: 2- and 4-process runs 9-21% over.)
  l.zero_stage = 1;
  l.ep = ep;
  l.micro_batch_seqs = batch / processes;
  l.tokens_per_step = batch * seq;
  l.seq_len = seq;
  l.recompute = models::Recompute::kNone;
  l.optimizer_state = StatePlacement::kDevice;
  l.master_dtype = MasterDtype::kFp32;
  l.ep_transport = transport == "pooled" ? Transport::pooled : Transport::ragged;
  return l;
}

FitResult fit_measurements(const nlohmann::json& m, const std::string& base_topology_path,
                           const std::string& base_calibration_path, const std::string& measurements_file) {
  FitResult out;
  const nlohmann::json base_topo = load_json_file(base_topology_path);
  const nlohmann::json base_cal_doc = load_json_file(base_calibration_path);
  const Calibration base_cal = parse_calibration(base_cal_doc, base_calibration_path);
  const std::string backend = m.value("backend", "cpu");
  const int threads = m.value("threads", 1);
  const std::string src = measurements_file;

  // Peak: the best GEMM rate measured.
  double best_rate = 0;
  std::string best_shape = "none";
  for (const auto& g : m.value("gemm", nlohmann::json::array())) {
    const double flops = 2.0 * g["m"].get<double>() * g["n"].get<double>() * g["k"].get<double>();
    for (const auto& [t, mult] : {std::pair{g["fwd_s"].get<double>(), 1.0}, std::pair{g["bwd_s"].get<double>(), 2.0}}) {
      if (t <= 0 || mult * flops / t <= best_rate) continue;
      best_rate = mult * flops / t;
      best_shape = std::to_string(g["m"].get<int64_t>()) + "x" + std::to_string(g["n"].get<int64_t>()) + "x" +
                   std::to_string(g["k"].get<int64_t>()) + (mult > 1 ? " backward" : " forward");
    }
  }
  const nlohmann::json topo_in = base_topo;
  double peak = topo_in["gpu"]["peak_flops_per_s"]["bf16"]["value"].get<double>();
  std::string peak_src = "base topology " + base_topology_path;
  if (best_rate > 0) {
    peak = best_rate / 0.9;
    peak_src = "[F] best measured GEMM " + fmt("%.2f", best_rate / 1e9) + " GFLOP/s (" + best_shape + ", " +
               std::to_string(threads) + " threads, " + src + ") / 0.9: the shape curve caps efficiency at 0.95";
  }
  double bw = topo_in["gpu"]["hbm_bw_bytes_per_s"]["value"].get<double>();
  std::string bw_src = "base topology " + base_topology_path;
  if (m.contains("stream")) {
    bw = m["stream"]["bytes_per_s"].get<double>();
    bw_src = "[M] " + fmt("%.2f", bw / 1e9) + " GB/s, residual_forward over 3 x 64 MB (" + src + ")";
  }
  // The CPU engine is a one-"GPU" system of `threads` threads; a GPU run names its device.
  const bool on_cpu = backend == "cpu";
  const std::string gpu_name =
      on_cpu ? backend + " (" + std::to_string(threads) + " threads, calibrated)" : backend + " (calibrated)";

  nlohmann::json topo = topo_in;
  topo["name"] = topo_in.value("name", std::string("host")) + "-calibrated";
  topo["comment"] = "Fitted by `rackstep calibrate` from " + src +
                    (on_cpu ? ": one process of the CPU engine as a one-'GPU' system." : ": one GPU (" + backend + ").") +
                    " [M] measured, [F] fitted.";
  topo["gpu"]["name"] = gpu_name;
  topo["gpu"]["peak_flops_per_s"]["bf16"] = sourced(peak, peak_src + "; the CPU engine computes in fp32");
  topo["gpu"]["peak_flops_per_s"]["fp32"] = sourced(peak, peak_src);
  if (best_rate > 0) {
    topo["gpu"]["mfu_peak_flops_per_s"] =
        sourced(best_rate, "[M] best measured GEMM rate (MFU on CPU is quoted against the measured sgemm peak)");
  }
  topo["gpu"]["hbm_bw_bytes_per_s"] = sourced(bw, bw_src);
  topo["gpu"]["hbm_bw_measured_bytes_per_s"] = sourced(bw, bw_src);
  if (backend == "cpu") topo["host"]["h2d_bw_bytes_per_s"] = sourced(bw, bw_src + " (host and device memory are the same)");

  // Collectives: ring all-reduce, t = 2(P-1)·alpha + 2(P-1)/P·bytes/bw.
  double alpha = topo["domain"]["latency_s"]["value"].get<double>();
  double link_bw = topo["domain"]["link_bw_bytes_per_s"]["value"].get<double>();
  std::string coll_src;
  std::vector<std::array<double, 3>> ar;  // P, bytes, seconds
  for (const auto& c : m.value("collectives", nlohmann::json::array())) {
    if (c.value("op", "") == "all_reduce") ar.push_back({c["ranks"].get<double>(), c["bytes"].get<double>(), c["seconds"].get<double>()});
  }
  if (ar.size() >= 2) {
    double a11 = 0, a12 = 0, a22 = 0, b1 = 0, b2 = 0;
    for (const auto& [p, bytes, t] : ar) {
      const double x1 = 2.0 * (p - 1.0), x2 = 2.0 * (p - 1.0) / p * bytes, w = 1.0 / (t * t);
      a11 += w * x1 * x1; a12 += w * x1 * x2; a22 += w * x2 * x2; b1 += w * x1 * t; b2 += w * x2 * t;
    }
    const double det = a11 * a22 - a12 * a12;
    if (det > 0) {
      const double al = (b1 * a22 - b2 * a12) / det, inv_bw = (a11 * b2 - a12 * b1) / det;
      if (al >= 0 && inv_bw > 0) {
        alpha = al;
        link_bw = 1.0 / inv_bw;
        coll_src = "[F] ring all-reduce 2(P-1)a + 2(P-1)/P bytes/bw, weighted least squares over " +
                   std::to_string(ar.size()) + " MPI all-reduce points (" + src + ", collectives)";
        topo["domain"]["latency_s"] = sourced(alpha, coll_src);
        topo["domain"]["link_bw_bytes_per_s"] = sourced(link_bw, coll_src);
        topo["domain"]["link_bw_measured_bytes_per_s"] = sourced(link_bw, coll_src);
      }
    }
  }

  // The op profiles.
  std::vector<Profile> profiles;
  for (const auto& p : m.value("profiles", nlohmann::json::array())) {
    Profile pr;
    pr.graph = models::build_layer_graph(models::load_model(p["model"].get<std::string>()));
    pr.batch = p["batch"].get<int64_t>();
    pr.seq = p["seq"].get<int64_t>();
    pr.forward_s = p.value("forward_s", 0.0);
    pr.backward_s = p.value("backward_s", 0.0);
    pr.optimizer_s = p.value("optimizer_s", 0.0);
    pr.rss_bytes = p.value("rss_bytes", 0.0);
    pr.activation_bytes = p.value("activation_bytes", 0.0);
    for (const auto& o : p["ops"]) {
      pr.ops.push_back({o["index"].get<double>(), o["fwd_s"].get<double>(), o["bwd_s"].get<double>()});
    }
    profiles.push_back(std::move(pr));
  }

  const topologies::SystemSpec sys = topologies::parse_system(topo, "fitted topology");
  const topologies::Cluster one = topologies::make_cluster(sys, 1);
  std::array<double, kUnknowns> prior{}, lo{}, hi{};
  prior[kGemm] = 1.0 / gemm_peak_efficiency(base_cal, sys.gpu);
  prior[kGrouped] = prior[kGemm] / base_cal.grouped_factor;
  prior[kAttnFwd] = 1.0 / attention_efficiency(base_cal, sys.gpu).fwd;
  prior[kAttnBwd] = 1.0 / attention_efficiency(base_cal, sys.gpu).bwd;
  prior[kElementwise] = 1.0 / base_cal.mem_eff_elementwise;
  prior[kNorm] = 1.0 / base_cal.mem_eff_norm;
  prior[kRouting] = 1.0 / base_cal.mem_eff_routing;
  prior[kLoss] = 1.0 / base_cal.mem_eff_loss;
  prior[kLookup] = 1.0 / base_cal.mem_eff_lookup;
  prior[kLaunch] = base_cal.launch_overhead_s;
  for (int i = 0; i < kUnknowns; ++i) {
    lo[i] = 1.0;     // efficiency at most 1
    hi[i] = 1e4;
  }
  prior[kGemmBench] = prior[kGemm];
  prior[kLaunchBench] = prior[kLaunch];
  lo[kLaunch] = lo[kLaunchBench] = 0.0;
  hi[kLaunch] = hi[kLaunchBench] = 1e-2;

  // The predictor prices an op as max(compute, memory) (sim/cost.cpp): GEMM,
  // grouped GEMM and attention are compute-bound unless their bytes at the
  // elementwise efficiency take longer. The fit is linear in 1/efficiency only
  // per branch, so each op's work is split into its compute-only part (memory
  // made free) and memory-only part (compute made free), and the branch the
  // current estimate makes active carries the op: its compute work to the
  // class's unknown, its memory work to the elementwise one. A few rounds to a
  // fixed point. (Pricing both at efficiency 1 and taking the max assigned the
  // small GEMMs of a d = 128 model to the wrong branch: a closed loop of
  // profiles priced at GEMM efficiency 0.6 fitted 0.82.)
  topologies::SystemSpec free_mem = sys, free_compute = sys;
  free_mem.gpu.hbm_bw_bytes_per_s *= 1e12;
  free_mem.gpu.hbm_bw_measured_bytes_per_s *= 1e12;
  for (double* f : {&free_compute.gpu.peak_bf16_flops_per_s, &free_compute.gpu.peak_fp32_flops_per_s,
                    &free_compute.gpu.peak_tf32_flops_per_s, &free_compute.gpu.peak_fp8_flops_per_s}) {
    *f *= 1e12;
  }
  const topologies::Cluster one_free_mem = topologies::make_cluster(free_mem, 1);
  const topologies::Cluster one_free_compute = topologies::make_cluster(free_compute, 1);
  const auto rows_at = [&](double h, const std::array<double, kUnknowns>& u) {
    std::vector<Row> rows;
    for (const auto& g : m.value("gemm", nlohmann::json::array())) {
      const double mm = g["m"].get<double>(), n = g["n"].get<double>(), k = g["k"].get<double>();
      const double ref = shape_factor(8192.0, h);
      const double f = std::min(0.95, shape_factor(mm, h) * shape_factor(n, h) * shape_factor(k, h) / (ref * ref * ref));
      const double work = 2.0 * mm * n * k / (peak * f);
      Row fw, bw_row;
      fw.x[kGemmBench] = work;
      fw.x[kLaunchBench] = 1.0;
      fw.y = g["fwd_s"].get<double>();
      fw.w = 0.3 / fw.y;
      bw_row.x[kGemmBench] = 2.0 * work;
      bw_row.x[kLaunchBench] = 2.0;
      bw_row.y = g["bwd_s"].get<double>();
      bw_row.w = 0.3 / bw_row.y;
      rows.push_back(fw);
      rows.push_back(bw_row);
    }
    for (const Profile& p : profiles) {
      const Layout l = cpu_run_layout(1, 1, p.batch, p.seq, "ragged");
      const Calibration c0 = unit_calibration(base_cal, gpu_name, h, 0.0);
      const Calibration c1 = unit_calibration(base_cal, gpu_name, h, 1e-3);
      const std::vector<OpTiming> t0 = Predictor(p.graph, one, c0).op_timings(l);
      const std::vector<OpTiming> t1 = Predictor(p.graph, one, c1).op_timings(l);
      const std::vector<OpTiming> tc = Predictor(p.graph, one_free_mem, c0).op_timings(l);
      const std::vector<OpTiming> tm = Predictor(p.graph, one_free_compute, c0).op_timings(l);
      const double total = p.forward_s + p.backward_s;
      // One row per op class (fit unknown) of the profile: the class's summed
      // predicted work and kernels against its summed measured time. Weighted by
      // 1/sqrt(class time x total): a relative error, scaled by the square root
      // of the class's share, so every class is fitted to its own measurement
      // (per-op rows weighted by the total let the GEMM rows and the sum decide
      // and left the small classes' split free: in-sample class errors of +-100%)
      // while a class of 1% of the step cannot pull the shared launch overhead.
      std::array<Row, kUnknowns> by_class{};
      Row sum;
      for (const auto& [idx, fwd_s, bwd_s] : p.ops) {
        const auto i = static_cast<size_t>(idx);
        const OpClass cls = p.graph.ops[i].op_class;
        const bool two_branches =
            cls == OpClass::kGemm || cls == OpClass::kGroupedGemm || cls == OpClass::kAttention;
        for (int phase = 0; phase < 2; ++phase) {
          const double work = phase == 0 ? t0[i].fwd_s : t0[i].bwd_s;
          const double kernels = ((phase == 0 ? t1[i].fwd_s : t1[i].bwd_s) - work) / 1e-3;
          const Unknown k = unknown_of(cls, phase == 1);
          Row& r = by_class[k];
          Unknown active = k;
          double active_work = work;
          if (two_branches) {
            const double compute = phase == 0 ? tc[i].fwd_s : tc[i].bwd_s;
            const double memory = phase == 0 ? tm[i].fwd_s : tm[i].bwd_s;
            const bool memory_bound = memory * u[kElementwise] > compute * u[k];
            active = memory_bound ? kElementwise : k;
            active_work = memory_bound ? memory : compute;
          }
          r.x[active] += active_work;
          r.x[kLaunch] += kernels;
          r.y += phase == 0 ? fwd_s : bwd_s;
          sum.x[active] += active_work;
          sum.x[kLaunch] += kernels;
        }
      }
      for (Row& r : by_class) {
        if (r.y <= 0) continue;
        r.w = 1.0 / std::sqrt(r.y * total);
        rows.push_back(r);
      }
      // The whole forward + backward: what runs between ops lands in the per-kernel overhead.
      sum.y = total;
      sum.w = 3.0 / total;
      rows.push_back(sum);
    }
    return rows;
  };

  double best_h = base_cal.gemm_half_dim, best_err = 1e300;
  std::array<double, kUnknowns> best_u = prior;
  if (!profiles.empty() || m.contains("gemm")) {
    for (double h : {1.0, 2.0, 4.0, 8.0, 16.0, 24.0, 32.0, 48.0, 64.0, 96.0, 128.0, 192.0, 256.0, 512.0}) {
      std::array<double, kUnknowns> u = prior;
      std::vector<Row> rows;
      for (int round = 0; round < 4; ++round) {  // the active branches settle in two or three
        rows = rows_at(h, u);
        if (rows.empty()) break;
        u = solve_bounded(rows, prior, lo, hi);
      }
      if (rows.empty()) break;
      const double err = rel_rms(rows, u);
      if (err < best_err) {
        best_err = err;
        best_h = h;
        best_u = u;
      }
    }
  }
  Calibration cal = base_cal;
  apply(cal, gpu_name, best_h, best_u);

  // Optimizer: t = A/eff + B (A: streamed bytes at eff 1; B: Newton–Schulz at the fitted GEMM curve).
  double opt_eff = base_cal.mem_eff_optimizer;
  std::string opt_src;
  {
    double num = 0, den = 0;
    int n = 0;
    for (const Profile& p : profiles) {
      if (p.optimizer_s <= 0) continue;
      const Layout l = cpu_run_layout(1, 1, p.batch, p.seq, "ragged");
      Calibration c1 = cal, c2 = cal;
      c1.mem_eff_optimizer = 1.0;
      c2.mem_eff_optimizer = 0.5;
      const double t1 = Predictor(p.graph, one, c1).predict(l).breakdown.optimizer_compute_s;
      const double t2 = Predictor(p.graph, one, c2).predict(l).breakdown.optimizer_compute_s;
      const double a = t2 - t1, b = t1 - a;
      const double y = p.optimizer_s - b, w = 1.0 / (p.optimizer_s * p.optimizer_s);
      num += w * a * y;
      den += w * a * a;
      ++n;
    }
    if (n > 0 && den > 0) {
      const double inv = std::clamp(num / den, 1.0, 1e4);
      opt_eff = 1.0 / inv;
      opt_src = "[F] measured optimizer steps of " + std::to_string(n) + " profiles (" + src +
                "): streamed bytes / (bw x eff) + Newton-Schulz at the fitted GEMM curve, least squares";
    }
  }
  cal.mem_eff_optimizer = opt_eff;

  // In sample: the fitted predictor (itself, not the linear model of the fit:
  // it takes max(compute, memory) per op) against every profile it was fitted
  // to, per profile and per op class. A class far off here cannot be right out
  // of sample.
  nlohmann::json in_sample = {{"profiles", nlohmann::json::array()}, {"by_class", nlohmann::json::object()}};
  {
    std::map<std::string, std::pair<double, double>> cls;  // class -> (predicted, measured)
    for (const Profile& p : profiles) {
      const Layout l = cpu_run_layout(1, 1, p.batch, p.seq, "ragged");
      const Predictor pr(p.graph, one, cal);
      const std::vector<OpTiming> t = pr.op_timings(l);
      double pred = 0, meas = 0;
      for (const auto& [idx, fwd_s, bwd_s] : p.ops) {
        const auto i = static_cast<size_t>(idx);
        auto& c = cls[models::to_string(p.graph.ops[i].op_class)];
        c.first += t[i].fwd_s + t[i].bwd_s;
        c.second += fwd_s + bwd_s;
        pred += t[i].fwd_s + t[i].bwd_s;
        meas += fwd_s + bwd_s;
      }
      const double opt_pred = pr.predict(l).breakdown.optimizer_compute_s;
      cls["optimizer"].first += opt_pred;
      cls["optimizer"].second += p.optimizer_s;
      in_sample["profiles"].push_back({{"model", p.graph.model.name},
                                       {"batch", p.batch},
                                       {"seq", p.seq},
                                       {"predicted_ops_s", pred},
                                       {"measured_ops_s", meas},
                                       {"predicted_optimizer_s", opt_pred},
                                       {"measured_optimizer_s", p.optimizer_s},
                                       {"error", meas > 0 ? pred / meas - 1.0 : 0.0}});
    }
    for (const auto& [c, v] : cls) {
      if (v.second <= 0) continue;
      in_sample["by_class"][c] = v.first / v.second - 1.0;
      in_sample["measured_by_class_s"][c] = v.second;  // summed over the profiles: thread scaling per class
    }
  }

  // Activation bytes: the engine's measured activation arena over the memory
  // model's bf16 saved activations (what it keeps per element: fp32 values and
  // their gradients). A per-layer term: fitting it into the per-process
  // constant or the one-layer workspace under-predicted a 6-layer model by 22%.
  double act_factor = base_cal.activation_bytes_factor;
  std::string act_src;
  {
    std::vector<double> ratios;
    for (const Profile& p : profiles) {
      if (p.activation_bytes <= 0) continue;
      Calibration c1 = cal;
      c1.activation_bytes_factor = 1.0;
      const double predicted = Predictor(p.graph, one, c1).predict(cpu_run_layout(1, 1, p.batch, p.seq, "ragged")).memory.activations;
      if (predicted > 0) ratios.push_back(p.activation_bytes / predicted);
    }
    if (!ratios.empty()) {
      std::sort(ratios.begin(), ratios.end());
      act_factor = ratios[ratios.size() / 2];
      act_src = "[M] the engine's activation arena (CpuModel::activation_bytes: values and gradients, fp32) over the "
                "memory model's bf16 saved activations, median of " + std::to_string(ratios.size()) + " profiles (" +
                src + ": " + fmt("%.3f", ratios.front()) + ".." + fmt("%.3f", ratios.back()) + ")";
    }
  }
  cal.activation_bytes_factor = act_factor;

  // Memory: rss = reserved + predicted live bytes (backward workspace factor b): linear in (reserved, b).
  double reserved = base_cal.runtime_reserved_bytes, bwf = base_cal.backward_workspace_factor;
  std::string mem_src;
  {
    std::vector<std::array<double, 3>> pts;  // at b = 0, slope per unit b, measured
    for (const Profile& p : profiles) {
      if (p.rss_bytes <= 0) continue;
      const Layout l = cpu_run_layout(1, 1, p.batch, p.seq, "ragged");
      Calibration c0 = cal, c1 = cal;
      c0.runtime_reserved_bytes = c1.runtime_reserved_bytes = 0;
      c0.allocator_fragmentation = c1.allocator_fragmentation = 0;
      c0.backward_workspace_factor = 0;
      c1.backward_workspace_factor = 1;
      const double m0 = Predictor(p.graph, one, c0).predict(l).memory.device_total;
      const double m1 = Predictor(p.graph, one, c1).predict(l).memory.device_total;
      pts.push_back({m0, m1 - m0, p.rss_bytes});
    }
    if (pts.size() >= 2) {
      double a11 = 0, a12 = 0, a22 = 0, b1 = 0, b2 = 0;
      for (const auto& [m0, slope, y] : pts) {
        const double w = 1.0 / (y * y), t = y - m0;
        a11 += w; a12 += w * slope; a22 += w * slope * slope; b1 += w * t; b2 += w * slope * t;
      }
      const double det = a11 * a22 - a12 * a12;
      if (det > 0) {
        reserved = std::max(0.0, (b1 * a22 - b2 * a12) / det);
        bwf = std::max(0.0, (a11 * b2 - a12 * b1) / det);
        mem_src = "[F] peak resident set (VmHWM) of forward + backward + optimizer of " + std::to_string(pts.size()) +
                  " profiles (" + src + ") vs the predicted breakdown, least squares (reserved bytes, workspace factor)";
      }
    } else if (pts.size() == 1) {
      reserved = std::max(0.0, pts[0][2] - pts[0][0] - bwf * pts[0][1]);
      mem_src = "[F] one measured resident set (" + src + ") minus the predicted breakdown";
    }
  }
  cal.runtime_reserved_bytes = reserved;
  cal.backward_workspace_factor = bwf;
  cal.allocator_fragmentation = 0.0;

  // The calibration file: the base with every fitted value replaced.
  nlohmann::json cj = base_cal_doc;
  cj["comment"] = "Fitted by `rackstep calibrate` (" + backend + ", " + std::to_string(threads) + " threads) from " + src +
                  "; values not fitted keep the base file's (" + base_calibration_path + ") sources. [M] measured, [F] fitted.";
  const std::string op_src = "[F] " + std::to_string(profiles.size()) + " model profiles (every layer-graph op, forward and backward) and " +
                             std::to_string(m.value("gemm", nlohmann::json::array()).size()) + " GEMM shapes (" + src +
                             "): weighted least squares of the predictor's op times; relative RMS residual " +
                             fmt("%.3f", best_err);
  const bool fitted = best_err < 1e300;
  if (fitted) {
    cj["gemm"]["peak_efficiency"][gpu_name] = sourced(cal.gemm_peak_eff[gpu_name], op_src);
    if (cj["gemm"].contains("sustained_ratio")) cj["gemm"]["sustained_ratio"].erase(gpu_name);  // the fit is sustained
    cj["gemm"]["half_dim"] = sourced(best_h, "[F] grid search over half_dim, " + op_src);
    // The grouped factor is derived from the anchor at load; express the fitted
    // factor as an anchor on this device: iteration time at that factor.
    {
      Calibration probe = cal;
      topologies::GpuSpec anchor_gpu;
      anchor_gpu.name = "GB200";
      const double rows_per_expert = probe.grouped_anchor_rows / probe.grouped_anchor_local_experts;
      const double dense = gemm_efficiency(probe, anchor_gpu, rows_per_expert, probe.grouped_anchor_n, probe.grouped_anchor_k);
      const double anchor_flops = probe.grouped_anchor_flop_multiple * 2.0 * probe.grouped_anchor_rows *
                                  probe.grouped_anchor_k * probe.grouped_anchor_n * 3.0;
      const double iter = anchor_flops / (cal.grouped_factor * dense * probe.grouped_anchor_peak_flops_per_s);
      cj["grouped_gemm"]["anchor_iteration_s"] =
          sourced(iter, "[F] the anchor time at which the derived grouped factor equals the fitted " +
                            fmt("%.3f", cal.grouped_factor) + " (grouped expert GEMM efficiency over the dense curve), " + op_src);
    }
    cj["attention"]["fwd_efficiency"] = sourced(cal.attention_fwd_eff, op_src);
    cj["attention"]["bwd_efficiency"] = sourced(cal.attention_bwd_eff, op_src);
    cj["memory_bound"]["elementwise"] = sourced(cal.mem_eff_elementwise, op_src + " (every class without its own efficiency)");
    cj["memory_bound"]["norm"] = sourced(cal.mem_eff_norm, op_src);
    cj["memory_bound"]["routing"] = sourced(cal.mem_eff_routing, op_src);
    cj["memory_bound"]["loss"] = sourced(cal.mem_eff_loss, op_src);
    cj["memory_bound"]["lookup"] = sourced(cal.mem_eff_lookup, op_src);
    cj["launch_overhead_s"] = sourced(cal.launch_overhead_s, op_src + " (per kernel, with what runs between ops)");
  }
  if (!opt_src.empty()) cj["memory_bound"]["optimizer"] = sourced(opt_eff, opt_src);
  cj["host"]["gc_pause_s"] = sourced(0.0, "[M] the C++ engine has no garbage collector");
  if (!act_src.empty()) cj["memory"]["activation_bytes_factor"] = sourced(act_factor, act_src);
  if (!mem_src.empty()) {
    cj["memory"]["runtime_reserved_bytes"] = sourced(reserved, mem_src);
    cj["memory"]["backward_workspace_factor"] = sourced(bwf, mem_src);
    cj["memory"]["allocator_fragmentation"] = sourced(0.0, "[M] the CPU engine allocates its arenas once per run");
  }
  parse_calibration(cj, "fitted calibration");  // what we write must load
  out.calibration = cj;
  out.topologies["topology.json"] = topo;

  // Per rank count: the share of the host's compute one of P concurrent processes gets.
  nlohmann::json shares = nlohmann::json::object();
  for (const auto& c : m.value("concurrency", nlohmann::json::array())) {
    const int64_t p = c["ranks"].get<int64_t>();
    const double share = std::clamp(c["gemm_flops_per_s_per_rank"].get<double>() / c["gemm_flops_per_s_alone"].get<double>(), 0.01, 1.0);
    shares[std::to_string(p)] = share;
    nlohmann::json t = topo;
    const std::string why = "; x " + fmt("%.3f", share) + ": [M] per-process GEMM rate with " + std::to_string(p) +
                            " processes running at once over the rate alone (" + src + ", concurrency)";
    t["name"] = topo["name"].get<std::string>() + "-np" + std::to_string(p);
    t["domain"]["size"] = sourced(static_cast<double>(p), "[M] " + std::to_string(p) + " MPI processes on this host");
    for (const char* k : {"bf16", "fp32"}) {
      auto& v = t["gpu"]["peak_flops_per_s"][k];
      v = sourced(v["value"].get<double>() * share, v["source"].get<std::string>() + why);
    }
    for (const char* k : {"hbm_bw_bytes_per_s", "hbm_bw_measured_bytes_per_s"}) {
      auto& v = t["gpu"][k];
      v = sourced(v["value"].get<double>() * share, v["source"].get<std::string>() + why);
    }
    if (t["gpu"].contains("mfu_peak_flops_per_s")) {
      auto& v = t["gpu"]["mfu_peak_flops_per_s"];
      v = sourced(v["value"].get<double>() * share, v["source"].get<std::string>() + why);
    }
    out.topologies["topology-np" + std::to_string(p) + ".json"] = t;
    // Preferably the rank's peak after collectives (MPI's shared-memory segments
    // and buffers are touched only once data moves: after MPI_Init alone the
    // 2- and 4-process runs measured 15-21% above the prediction).
    const double peak_rss = c.value("rss_peak_after_collectives_bytes", 0.0);
    const double mpi_rss = peak_rss > 0 ? peak_rss : c.value("rss_after_mpi_init_bytes", 0.0);
    const double lone_rss = m.value("rss_start_bytes", 0.0);
    if (mpi_rss > 0 && lone_rss > 0) {
      nlohmann::json cp = cj;
      const double extra = std::max(0.0, mpi_rss - lone_rss);
      const auto& rr = cj["memory"]["runtime_reserved_bytes"];
      const std::string what = peak_rss > 0 ? "peak resident set after all-reduces up to 4 MB (less the probe's own buffers)"
                                            : "resident set after MPI_Init";
      cp["memory"]["runtime_reserved_bytes"] = sourced(
          rr["value"].get<double>() + extra,
          rr["source"].get<std::string>() + "; + [M] " + fmt("%.1f", extra / 1048576.0) + " MiB: an MPI rank's " + what +
              " with " + std::to_string(p) + " processes over a lone process's at start (" + src + ")");
      parse_calibration(cp, "fitted calibration");
      out.calibrations["calibration-np" + std::to_string(p) + ".json"] = cp;
    }
  }

  nlohmann::json eff = nlohmann::json::object();
  for (int i = 0; i < kUnknowns; ++i) eff[kUnknownName[i]] = i == kLaunch || i == kLaunchBench ? best_u[i] : 1.0 / best_u[i];
  eff["grouped_gemm"] = cal.grouped_factor;  // over the dense curve
  out.summary = {{"peak_flops_per_s", peak},
                 {"best_gemm_flops_per_s", best_rate},
                 {"hbm_bw_bytes_per_s", bw},
                 {"gemm_half_dim", best_h},
                 {"efficiencies", eff},
                 {"optimizer_efficiency", opt_eff},
                 {"fit_relative_rms", fitted ? best_err : 0.0},
                 {"profiles", profiles.size()},
                 {"collective_latency_s", alpha},
                 {"collective_bw_bytes_per_s", link_bw},
                 {"compute_share_by_processes", shares},
                 {"runtime_reserved_bytes", reserved},
                 {"backward_workspace_factor", bwf},
                 {"activation_bytes_factor", act_factor},
                 {"in_sample", in_sample}};
  return out;
}

nlohmann::json measurements_from_run(const std::string& run_dir) {
  namespace fs = std::filesystem;
  const std::string ops_path = (fs::path(run_dir) / "op_measurements.json").string();
  const std::string run_path = (fs::path(run_dir) / "run.json").string();
  if (!fs::exists(ops_path)) {
    throw UserError(ops_path, "", "a profile of the run (rackstep train --profile --out RUN)", "no such file");
  }
  const nlohmann::json ops = load_json_file(ops_path);
  const nlohmann::json run = load_json_file(run_path);
  const std::string model_path = run.at("model").get<std::string>();
  const models::LayerGraph g = models::build_layer_graph(models::load_model(model_path));
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < g.ops.size(); ++i) index[g.ops[i].name] = i;
  // De-load like every calibrate timing: the profiled steps' CPU / (threads x wall).
  // A device's clock (CUDA events) measured the device's own time: nothing to de-load.
  const bool device_clock = ops.value("op_clock", std::string("host")) != "host";
  double factor = 1.0;
  if (!device_clock) {
    const double threads = std::max(1.0, ops.value("threads", 1.0));
    const std::vector<double> walls = ops.value("step_wall_s", std::vector<double>{});
    const std::vector<double> cpus = ops.value("step_cpu_s", std::vector<double>{});
    std::vector<double> f;
    for (size_t i = 0; i < std::min(walls.size(), cpus.size()); ++i) {
      if (walls[i] > 0) f.push_back(std::clamp(cpus[i] / threads / walls[i], 0.01, 1.0));
    }
    if (!f.empty()) {
      std::sort(f.begin(), f.end());
      factor = f[f.size() / 2];
    }
  }
  std::map<size_t, std::array<double, 2>> by_op;
  double optimizer_s = 0, total = 0;
  for (const auto& o : ops.at("ops")) {
    const std::string name = o.at("op").get<std::string>();
    const double s = o.at("seconds").get<double>() * factor;
    if (name == "optimizer") {
      optimizer_s = s;
      continue;
    }
    const auto it = index.find(name);
    if (it == index.end()) throw UserError(ops_path, "/ops", "ops of " + model_path, "an op named " + name);
    by_op[it->second][o.at("phase").get<std::string>() == "forward" ? 0 : 1] = s;
    total += s;
  }
  nlohmann::json list = nlohmann::json::array();
  for (const auto& [i, t] : by_op) list.push_back({{"index", i}, {"op", g.ops[i].name}, {"fwd_s", t[0]}, {"bwd_s", t[1]}});
  // Per-pass wall times are not in the profile: the op sums stand for them.
  double fwd = 0, bwd = 0;
  for (const auto& [i, t] : by_op) {
    fwd += t[0];
    bwd += t[1];
  }
  nlohmann::json prof = {{"model", model_path},
                         {"model_name", g.model.name},
                         {"batch", ops.at("batch")},
                         {"seq", ops.at("seq")},
                         {"forward_s", fwd},
                         {"backward_s", bwd},
                         {"optimizer_s", optimizer_s},
                         {"ops", list}};
  if (ops.contains("peak_rss_bytes")) prof["rss_bytes"] = ops["peak_rss_bytes"];
  // On a GPU the memory the predictor budgets is the device's: what it held at the
  // allocator's peak (context and pools included, like the CPU's resident set), else the peak itself.
  if (ops.contains("peak_device_bytes")) {
    prof["rss_bytes"] = ops.value("device_used_at_peak_bytes", ops["peak_device_bytes"].get<double>());
    prof["peak_device_bytes"] = ops["peak_device_bytes"];
  }
  return {{"format", "rackstep.calibration_measurements/1"},
          {"backend", ops.value("device", "cpu")},
          {"threads", ops.value("threads", 1)},
          {"from_run", run_dir},
          {"deload_factor", factor},
          {"profiles", nlohmann::json::array({prof})}};
}

}  // namespace rackstep::sim
