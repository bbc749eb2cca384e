// Op micro-benchmarks of an execution backend: what `rackstep calibrate`
// measures before it fits the predictor (sim/fit.h).
//
// A backend runs the layer graph's ops; the calibration measures them over a
// deterministic grid of shapes taken from the layer graphs of the models of
// interest, in this order (each line one kind of measurement):
//   gemm        dense GEMMs (linear forward / backward) at the models' linear
//               shapes and square sizes 64..1024 (the peak)
//   stream      a large copy-and-add (the memory bandwidth the roofline uses)
//   profile     one model at one (batch, seq): a forward + backward with every
//               layer-graph op timed (grouped expert GEMM by rows per expert,
//               attention fwd / bwd by window and sequence, every memory-bound
//               class as the engine runs it), then the optimizer step
//   collective  (scripts/cli/cli_calibrate.cpp, under mpirun) all-reduce and
//               all-to-all at several sizes and rank counts
// The measurements JSON ("rackstep.calibration_measurements/1") holds raw
// seconds (best of the repetitions) and the shapes; sim/fit.h turns it into
// calibration and topology files.
//
// A backend plugs in behind OpBackend (CPU today; CUDA adds its own subclass):
//   std::unique_ptr<OpBackend> b = make_op_backend("cpu", threads);  // UserError for "cuda" when not built
//   MicrobenchPlan plan = make_plan({"models/zoo/tiny-moe.json"}, budget_s);
//   nlohmann::json m = run_microbenchmarks(*b, plan, progress);
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/layer_graph.h"

namespace rackstep::exec {

// Every time below is de-loaded: min(wall, process CPU time / threads), an
// estimate of the time on an idle machine (exact for one thread); cpu_share
// keeps that over the wall time (1 = nothing else ran).
//
// Seconds of one forward and one backward (the fastest repetition, as every
// time here: on a shared machine noise only adds time).
struct PassSeconds {
  double fwd_s = 0, bwd_s = 0;
  double cpu_share = 1;
};

// One layer-graph op timed inside a real forward + backward.
struct OpSample {
  size_t index = 0;        // into LayerGraph::ops
  double fwd_s = 0, bwd_s = 0;
};

struct ModelProfile {
  std::vector<OpSample> ops;
  double forward_s = 0, backward_s = 0;   // whole passes (ops plus what runs between them)
  double optimizer_s = 0;                 // one optimizer step over every parameter
  double rss_bytes = 0;                   // peak resident set during the profile (VmHWM; process)
  double model_bytes = 0;                 // parameters, gradients, optimizer state, activations
  double activation_bytes = 0;            // the engine's activation arena (values and their gradients, fp32)
  double cpu_share = 1;                   // median share of runnable time spent running
};

class OpBackend {
 public:
  virtual ~OpBackend() = default;
  virtual std::string name() const = 0;
  virtual int threads() const = 0;
  // y(m, n) = x(m, k)·W(k, n), and its backward (dgrad + wgrad).
  virtual PassSeconds gemm(int64_t m, int64_t n, int64_t k, int reps) = 0;
  // Bytes per second of y = a + b over `bytes` per buffer (read 2, write 1).
  virtual double stream_bytes_per_s(double bytes, int reps) = 0;
  // Every op of `graph` timed in `reps` forward + backward passes at (batch, seq).
  virtual ModelProfile profile(const models::LayerGraph& graph, int64_t batch, int64_t seq, int reps) = 0;
  // False while the backend has no model driver to profile (the CUDA one today):
  // the calibration then measures GEMMs and bandwidth only.
  virtual bool can_profile() const { return true; }
};

// "cpu" (OpenBLAS + OpenMP kernels of exec/); "cuda": exec/cuda/microbench.h
// (this one throws UserError for it: the CUDA library is linked only into the
// command). threads = 0 keeps the OpenMP default.
std::unique_ptr<OpBackend> make_op_backend(const std::string& name, int threads);
// The batch an op backend's profile() runs: `tokens` (batch * seq + 1) uniform
// random ids of the model's vocabulary, `doc` (batch * seq) document ids of
// packed documents of 64..512 tokens, as training sequences have. Seeded:
// every backend profiles the same batch.
void make_profile_batch(const models::LayerGraph& graph, int64_t batch, int64_t seq, std::vector<int32_t>& tokens,
                        std::vector<int32_t>& doc);
// A plugin (exec/backend.h, load_backend_plugin) registers its op backend
// here; its factory returns nullptr where the machine lacks the device.
void register_op_backend(const std::string& name, std::function<std::unique_ptr<OpBackend>()> make);

struct GemmShape {
  int64_t m = 0, n = 0, k = 0;
  std::string source;      // "square" or "<model> <op name> batch B seq T"
};
struct ProfilePoint {
  std::string model_path;
  int64_t batch = 1, seq = 1;
};

// The deterministic grid: shapes in a fixed order, smallest first, so a budget
// cut keeps a spread of sizes.
struct MicrobenchPlan {
  std::vector<GemmShape> gemms;
  std::vector<ProfilePoint> profiles;
  double budget_s = 60;
};
MicrobenchPlan make_plan(const std::vector<std::string>& model_paths, double budget_s);

// Progress: (what, done, total).
using Progress = std::function<void(const std::string&, size_t, size_t)>;
nlohmann::json run_microbenchmarks(OpBackend& backend, const MicrobenchPlan& plan, const Progress& progress);

// Resident set of this process now and at its peak (Linux /proc/self/status), bytes.
double current_rss_bytes();
double peak_rss_bytes();

// "load1 load5 load15" of /proc/loadavg, and this process's CPU seconds (user + system).
nlohmann::json machine_load();
double process_cpu_seconds();

}  // namespace rackstep::exec
