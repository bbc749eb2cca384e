// `rackstep calibrate`: measure the backend's ops on this machine and fit the
// predictor to them (exec/microbench.h measures, sim/fit.h fits).
//
//   export OMP_WAIT_POLICY=passive OPENBLAS_THREAD_TIMEOUT=4   # idle threads sleep, not spin
//   rackstep calibrate --backend cpu --out cal [--model M ...] [--budget-s 60] [--threads 2] [--ranks 2,4]
//   rackstep predict --model M --cluster cal/topology.json --calibration cal/calibration.json --layout L
//   rackstep calibrate --from-run runs/p --out cal2 [--topology cal/topology.json --calibration cal/calibration.json]
//     (a GPU run's profile names its device: its zoo topology is the base, topologies/cuda_devices.json)
//   rackstep calibrate --from-measurements cal/measurements.json --out cal3   # refit, no measuring
//
// Writes DIR/measurements.json (raw seconds), DIR/calibration.json,
// DIR/topology.json (one process), DIR/topology-npP.json (P processes sharing
// the host) and DIR/fit.json (the fitted values and residuals). MPI
// collectives are measured by re-launching this binary under mpirun
// (`rackstep calibrate-collectives`, hidden) when mpirun exists.
#include <sched.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "exec/dist.h"
#include "exec/kernels.h"
#include "exec/microbench.h"
#include "exec/train.h"
#include "sim/base/check.h"
#include "sim/base/json_io.h"
#include "sim/base/source_dir.h"
#include "models/layer_graph.h"
#include "models/model.h"
#include "sim/calibration.h"
#include "scripts/cli/command.h"
#include "scripts/cli/flags.h"
#include "sim/fit.h"

namespace rackstep::exec {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

struct CalibrateArgs {
  std::string backend = "cpu";
  std::string out_dir;
  std::vector<std::string> models;
  double budget_s = 60;
  int threads = 0;
  std::vector<int> ranks = {2, 4};
  std::string from_run;
  std::string from_measurements;
  std::string topology, calibration;
  bool no_collectives = false;
  bool quiet = false;
  bool json = false;
};

std::string self_exe() {
  std::error_code ec;
  const fs::path p = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string("rackstep") : p.string();
}

bool have_mpirun() { return std::system("command -v mpirun >/dev/null 2>&1") == 0; }

// Per rank count: all-reduce timings and the concurrent GEMM rate, measured by
// this binary re-launched under mpirun.
void measure_collectives(const CalibrateArgs& a, nlohmann::json& m, double gemm_alone_flops_per_s, bool progress,
                         int64_t grad_floats) {
  m["collectives"] = nlohmann::json::array();
  m["concurrency"] = nlohmann::json::array();
  if (!mpi_available()) {
    std::fprintf(stderr, "calibrate: MPI is not compiled into this binary; collectives skipped\n");
    m["collectives_skipped"] = "MPI not compiled in";
    return;
  }
  if (!have_mpirun()) {
    std::fprintf(stderr, "calibrate: mpirun not found; collectives skipped (install openmpi-bin)\n");
    m["collectives_skipped"] = "mpirun not found";
    return;
  }
  for (int p : a.ranks) {
    if (progress) std::fprintf(stderr, "calibrate: MPI collectives on %d processes\n", p);
    const std::string file = (fs::path(a.out_dir) / ("collectives-np" + std::to_string(p) + ".json")).string();
    // Under a real-time policy (chrt, for clean 2-thread timings) the ranks go
    // back to the ordinary one: more ranks than cores, busy-polling for
    // messages, would hold a core for a whole real-time quantum each.
    const int policy = sched_getscheduler(0);
    const std::string ordinary = policy == SCHED_RR || policy == SCHED_FIFO ? "chrt -o 0 " : "";
    const std::string cmd = ordinary + "mpirun --oversubscribe --allow-run-as-root --bind-to none -np " + std::to_string(p) + " '" +
                            self_exe() + "' calibrate-collectives --threads 1 --grad-floats " + std::to_string(grad_floats) +
                            " --out-file '" + file + "' >/dev/null";
    if (std::system(cmd.c_str()) != 0 || !fs::exists(file)) {
      std::fprintf(stderr, "calibrate: mpirun -np %d failed; collectives at %d processes skipped\n", p, p);
      continue;
    }
    const nlohmann::json r = load_json_file(file);
    for (const auto& c : r["collectives"]) m["collectives"].push_back(c);
    m["concurrency"].push_back({{"ranks", p},
                                {"gemm_flops_per_s_per_rank", r["gemm_flops_per_s_per_rank"]},
                                {"gemm_flops_per_s_alone", gemm_alone_flops_per_s},
                                {"rss_after_mpi_init_bytes", r.value("rss_after_mpi_init_bytes", 0.0)},
                                {"rss_peak_after_collectives_bytes", r.value("rss_peak_after_collectives_bytes", 0.0)},
                                {"gemm", "512x512x512 forward, every rank at once, 1 thread each, CPU time (de-loaded)"}});
  }
}

int run_calibrate(const CalibrateArgs& a) {
  if (a.out_dir.empty()) throw UserError("calibrate: expected --out DIR, found none");
  std::error_code ec;
  fs::create_directories(a.out_dir, ec);
  if (ec) throw UserError(a.out_dir, "", "a directory for the calibration", ec.message());
  const bool progress = !a.quiet;
  nlohmann::json m;
  // The base whose unfitted values (capacity, links) the fitted topology keeps:
  // this host for the CPU, the project's GPU node for CUDA (--topology for another).
  const std::string zoo_topo = a.backend == "cuda" ? "/topologies/zoo/hgx-h200.json" : "/topologies/zoo/cpu-host.json";
  std::string base_topo = a.topology.empty() ? std::string(rackstep::source_dir()) + zoo_topo : a.topology;
  std::string base_cal = a.calibration.empty() ? sim::default_calibration_path() : a.calibration;
  if (!a.from_run.empty() && !a.from_measurements.empty()) {
    throw UserError("calibrate: expected one of --from-run and --from-measurements, found both");
  }
  if (!a.from_run.empty()) {
    m = sim::measurements_from_run(a.from_run);
    // A GPU run (its profile names the device) fits onto that GPU's zoo topology.
    const std::string device = m.value("backend", std::string("cpu"));
    if (device != "cpu" && a.topology.empty()) {
      base_topo = sim::topology_for_device(device, (fs::path(a.from_run) / "op_measurements.json").string());
    }
  } else if (!a.from_measurements.empty()) {
    m = load_json_file(a.from_measurements);
    if (m.value("format", "") != "rackstep.calibration_measurements/1") {
      throw UserError(a.from_measurements, "/format", "\"rackstep.calibration_measurements/1\"",
                      m.contains("format") ? m["format"].dump() : "no format");
    }
  } else {
    // "cuda": the op backend of the CUDA plugin (exec/cuda/microbench.h), opened
    // only here, so no other rackstep process maps cuBLAS.
    std::unique_ptr<OpBackend> backend =
        rackstep::cli::flag_names({{"backend", "--backend"}}, [&] { return make_op_backend(a.backend, a.threads); });
    if (backend->threads() > 1 && (!std::getenv("OPENBLAS_THREAD_TIMEOUT") || !std::getenv("OMP_WAIT_POLICY"))) {
      // Spinning idle threads burn CPU time the de-loading counts as work.
      std::fprintf(stderr, "calibrate: note: set OMP_WAIT_POLICY=passive OPENBLAS_THREAD_TIMEOUT=4 so idle threads "
                           "sleep (and train the same way); on a shared machine spinning threads skew the timings\n");
    }
    std::vector<std::string> models = a.models;
    if (models.empty()) models.push_back(std::string(rackstep::source_dir()) + "/models/zoo/tiny-moe.json");
    const MicrobenchPlan plan = make_plan(models, a.budget_s);
    const auto t0 = Clock::now();
    m = run_microbenchmarks(*backend, plan, [&](const std::string& what, size_t done, size_t total) {
      if (!progress) return;
      const double el = std::chrono::duration<double>(Clock::now() - t0).count();
      std::fprintf(stderr, "calibrate: [%zu/%zu] %.0fs %s\n", done, total, el, what.c_str());
    });
    double alone = 0;
    for (const auto& g : m["gemm"]) {
      if (g["m"] == 512 && g["n"] == 512 && g["k"] == 512) alone = 2.0 * 512 * 512 * 512 / g["fwd_s"].get<double>();
    }
    if (backend->threads() != 1) {
      // The per-process share is relative to one process at one thread (MPI runs use --threads 1).
      alone = 2.0 * 512 * 512 * 512 / make_op_backend(a.backend, 1)->gemm(512, 512, 512, 3).fwd_s;
      set_threads(backend->threads());
    }
    if (a.no_collectives) {
      m["collectives_skipped"] = "--no-collectives";
    } else if (backend->name() != "cpu") {
      m["collectives_skipped"] = "the MPI probe times CPU ranks; NCCL collectives are not measured yet";
    } else {
      int64_t grad_floats = 0;  // the largest model's parameters: the engine's step exchange
      for (const auto& path : models) {
        grad_floats = std::max(grad_floats, static_cast<int64_t>(
                                                rackstep::models::count_params(
                                                    rackstep::models::build_layer_graph(rackstep::models::load_model(path)))
                                                    .total));
      }
      measure_collectives(a, m, alone, progress, grad_floats);
    }
  }
  m["machine"] = {{"hostname", [] {
                     char h[256] = {0};
                     gethostname(h, sizeof h - 1);
                     return std::string(h);
                   }()},
                  {"cores", sysconf(_SC_NPROCESSORS_ONLN)}};
  const std::string meas_path = (fs::path(a.out_dir) / "measurements.json").string();
  write_json_file_atomic(meas_path, m);
  if (progress) std::fprintf(stderr, "calibrate: fitting\n");
  const sim::FitResult r = sim::fit_measurements(m, base_topo, base_cal, meas_path);
  const std::string cal_path = (fs::path(a.out_dir) / "calibration.json").string();
  write_json_file_atomic(cal_path, r.calibration);
  nlohmann::json files = {{"measurements", meas_path}, {"calibration", cal_path}};
  for (const auto& [name, doc] : r.calibrations) {
    const std::string path = (fs::path(a.out_dir) / name).string();
    write_json_file_atomic(path, doc);
    files[name] = path;
  }
  for (const auto& [name, doc] : r.topologies) {
    const std::string path = (fs::path(a.out_dir) / name).string();
    write_json_file_atomic(path, doc);
    files[name] = path;
  }
  nlohmann::json summary = r.summary;
  summary["files"] = files;
  summary["backend"] = m.value("backend", a.backend);
  summary["threads"] = m.value("threads", 0);
  if (m.contains("load_start")) summary["load"] = {{"start", m["load_start"]}, {"end", m["load_end"]}};
  if (m.contains("elapsed_s")) summary["elapsed_s"] = m["elapsed_s"];
  if (m.contains("cpu_s")) summary["cpu_s"] = m["cpu_s"];
  write_json_file_atomic((fs::path(a.out_dir) / "fit.json").string(), summary);
  if (a.json) {
    std::printf("%s\n", summary.dump(2).c_str());
    return 0;
  }
  const auto& e = summary["efficiencies"];
  std::printf("calibrated %s, %d threads: peak %.2f GFLOP/s (best GEMM %.2f), memory %.2f GB/s, GEMM half_dim %.0f\n",
              summary["backend"].get<std::string>().c_str(), summary["threads"].get<int>(),
              summary["peak_flops_per_s"].get<double>() / 1e9, summary["best_gemm_flops_per_s"].get<double>() / 1e9,
              summary["hbm_bw_bytes_per_s"].get<double>() / 1e9, summary["gemm_half_dim"].get<double>());
  for (auto it = e.begin(); it != e.end(); ++it) std::printf("  %-20s %.4g\n", it.key().c_str(), it.value().get<double>());
  std::printf("  %-20s %.4g\n", "optimizer", summary["optimizer_efficiency"].get<double>());
  std::printf("  fit relative RMS %.3f over %zu profiles\n", summary["fit_relative_rms"].get<double>(),
              summary["profiles"].get<size_t>());
  std::printf("wrote %s, %s and topology files in %s\n", meas_path.c_str(), cal_path.c_str(), a.out_dir.c_str());
  return 0;
}

// Under mpirun: all-reduce at several sizes, then every rank's GEMM rate at once.
int run_collectives(const std::string& out_file, int threads, int64_t grad_floats) {
  set_threads(threads);
  Comm world = Comm::world();
  // The resident set of a rank once MPI is up: what an MPI process holds beyond a lone one.
  double rss_base = current_rss_bytes();
  world.allreduce_max(&rss_base, 1);
  nlohmann::json coll = nlohmann::json::array();
  for (double bytes : {8e3, 64e3, 512e3, 4e6}) {
    std::vector<double> buf(static_cast<size_t>(bytes / sizeof(double)), 1.0);
    const int n = static_cast<int>(buf.size());
    std::vector<double> times;
    for (int r = 0; r < 8; ++r) {
      world.barrier();
      const auto t0 = Clock::now();
      world.allreduce_sum(buf.data(), n);
      double t = std::chrono::duration<double>(Clock::now() - t0).count();
      world.allreduce_max(&t, 1);
      if (r > 0) times.push_back(t);
    }
    // The fastest repetition: on a shared machine a slow one measures a descheduled rank, not the transport.
    std::sort(times.begin(), times.end());
    coll.push_back({{"op", "all_reduce"}, {"ranks", world.size()}, {"bytes", bytes}, {"seconds", times.front()},
                    {"seconds_median", times[times.size() / 2]}, {"dtype", "f64"}});
  }
  std::vector<float> x(512 * 512, 0.5f), w(512 * 512, 0.25f), y(512 * 512);
  linear_forward(y.data(), x.data(), w.data(), nullptr, 512, 512, 512);
  world.barrier();
  // CPU time of this process (one thread): the work, not the wait for a core, as every calibrate timing.
  const auto cpu_now = [] {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
  };
  double best = 1e30;
  for (int r = 0; r < 3; ++r) {
    const double c0 = cpu_now();
    const auto t0 = Clock::now();
    linear_forward(y.data(), x.data(), w.data(), nullptr, 512, 512, 512);
    const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
    best = std::min(best, std::min(wall, cpu_now() - c0));
  }
  // The engine's step exchange at the model's size: reduce-scatter the whole
  // gradient into a shard, all-gather the parameters (exec/train.cpp). The MPI
  // library's own buffers for these sizes stay resident in a run.
  const int P = world.size();
  const int64_t per_rank = std::max<int64_t>(1, grad_floats / P);
  std::vector<int> counts(static_cast<size_t>(P), static_cast<int>(per_rank));
  std::vector<float> whole(static_cast<size_t>(per_rank * P), 1.0f), shard(static_cast<size_t>(per_rank)),
      gathered(whole.size());
  for (int r = 0; r < 2; ++r) {
    world.reduce_scatter_sum(whole.data(), shard.data(), counts);
    world.allgatherv(shard.data(), gathered.data(), counts);
  }
  // What the rank holds at its peak once MPI has moved data (shared-memory
  // segments touched, the library's collective buffers), less this probe's own
  // buffers (the largest all-reduce buffer, the three GEMM matrices, the step
  // exchange's whole, shard and gathered arrays).
  const double own = std::max(4e6, static_cast<double>(2 * whole.size() + shard.size()) * sizeof(float)) +
                     3.0 * 512 * 512 * sizeof(float);
  double hwm = peak_rss_bytes() - own;
  world.allreduce_max(&hwm, 1);
  double rate = 2.0 * 512 * 512 * 512 / best;
  world.allreduce_sum(&rate, 1);
  rate /= world.size();
  if (world.root()) {
    write_json_file_atomic(out_file, {{"collectives", coll},
                                      {"gemm_flops_per_s_per_rank", rate},
                                      {"rss_after_mpi_init_bytes", rss_base},
                                      {"rss_peak_after_collectives_bytes", hwm},
                                      {"ranks", world.size()}});
  }
  world.barrier();
  return 0;
}

rackstep::cli::Registration reg{
    "calibrate",
    "Measure the backend's ops on this machine (or a profiled run) and fit calibration + topology files for predict",
    [](CLI::App& app) {
      auto a = std::make_shared<CalibrateArgs>();
      app.add_option("--backend", a->backend, "execution backend to measure: cpu (cuda: its op backend is built, "
                                              "exec/cuda/microbench.h, and plugs in with the CUDA engine)")
          ->check(CLI::IsMember({"cpu", "cuda"}));
      app.add_option("--out", a->out_dir, "directory for measurements.json, calibration.json, topology*.json, fit.json")
          ->required();
      app.add_option("--model", a->models, "model JSON whose layer-graph shapes make the grid (repeatable; default "
                                           "models/zoo/tiny-moe.json, the zoo's small model)");
      app.add_option("--budget-s", a->budget_s, "time budget of the op measurements in seconds (the grid is cut, "
                                                "smallest shapes kept)")
          ->check(CLI::PositiveNumber);
      app.add_option("--threads", a->threads, "OpenMP / OpenBLAS threads (0: the default); the fitted topology is for "
                                              "this count")
          ->check(CLI::NonNegativeNumber);
      app.add_option("--ranks", a->ranks, "MPI process counts for the collectives (needs mpirun)")
          ->delimiter(',')
          ->check(CLI::Range(2, 64));
      app.add_option("--from-run", a->from_run, "refit from a profiled run (rackstep train --profile --out RUN) "
                                                "instead of measuring");
      app.add_option("--from-measurements", a->from_measurements,
                     "refit from a measurements.json an earlier calibrate wrote (no measuring: the same numbers, "
                     "another base topology or calibration, or a newer fit)");
      app.add_option("--topology", a->topology, "base topology JSON (default topologies/zoo/cpu-host.json; cuda: hgx-h200.json)");
      app.add_option("--calibration", a->calibration, "base calibration JSON (default sim/calibration.json)");
      app.add_flag("--no-collectives", a->no_collectives, "skip the MPI collectives (no topology-npP.json)");
      app.add_flag("--quiet", a->quiet, "no progress lines on stderr");
      app.add_flag("--json", a->json, "print the fit summary as JSON (progress stays on stderr)");
      return [a] { return run_calibrate(*a); };
    }};

rackstep::cli::Registration reg_collectives{
    "calibrate-collectives", "",  // hidden: run by `calibrate` under mpirun
    [](CLI::App& app) {
      auto out = std::make_shared<std::string>();
      auto threads = std::make_shared<int>(1);
      app.group("");
      app.add_option("--out-file", *out, "result JSON (rank 0)")->required();
      app.add_option("--threads", *threads, "threads per process");
      auto floats = std::make_shared<int64_t>(0);
      app.add_option("--grad-floats", *floats, "the largest model's parameter count (the step exchange's size)");
      return [out, threads, floats] { return run_collectives(*out, *threads, *floats); };
    }};

}  // namespace
}  // namespace rackstep::exec
