// Profiler of the training engine: what each op of the layer graph cost,
// measured, in the formats the predictor uses, on any backend.
//
// Times come from the backend's clock (exec/backend.h OpTiming): on the CPU
// the host's steady_clock around each op after a synchronize; on CUDA a pair of
// events per op and phase on the backend's stream, read once per profiled
// step, so an op's time is its device time and the queue is never drained per
// op. A step's slices sit at the host time the step began plus each
// interval's offset from the step's first mark.
//
// Three outputs, written by write(dir):
//   trace.json            Chrome trace events (sim/base/trace.h, the simulator's
//                         writer): process "cpu0" ("gpu0" on a device), thread
//                         "compute", one slice per op per phase named by
//                         sim::slice_name ("layers.3.attn.core.fwd"), category
//                         "forward" / "backward" / "optimizer", args {step, op,
//                         op_class, kind}. Collectives a backend queues on a
//                         queue of its own (exec/cuda: NCCL's data-parallel
//                         reduce-scatter ranges and all-gather) are slices of
//                         thread "collectives", category "communication",
//                         named by the collective, args {step}; they stay
//                         out of op_measurements.json. Opens beside `rackstep timeline`
//                         output; `rackstep compare` puts it next to the prediction.
//   op_measurements.json  {"format": "rackstep.op_measurements/1", "device",
//                         "threads", "batch", "seq", "model", "steps",
//                         "peak_rss_bytes" (the process's resident peak),
//                         "step_wall_s" / "step_cpu_s" (per profiled step,
//                         begin_step to end_step: wall and process CPU time,
//                         so a run on a shared machine can be de-loaded),
//                         "ops": [{"op", "kind", "class", "layer", "phase",
//                         "in_shape", "out_shape", "param_shapes", "flops",
//                         "bytes", "seconds" (median over profiled steps),
//                         "seconds_min", "samples", "gflop_per_s"}]}.
//                         FLOPs and bytes come from models::op_cost at fp32
//                         (the predictor's own count), so a calibration fit
//                         compares like with like.
//                         A backend with device memory (exec/cuda) adds fields
//                         only: "device" is the GPU's name ("NVIDIA H200"),
//                         "dtype" the GEMMs' precision (set_dtype), "op_clock"
//                         ("cuda_events": device times, nothing to de-load),
//                         "step_device_s" (per step, its first event to the
//                         end of its last interval), "peak_device_bytes" (the
//                         backend's allocation high-water mark),
//                         "device_used_at_peak_bytes" (cudaMemGetInfo's used
//                         bytes when that mark was set: context and pools
//                         included), "device_total_bytes". The CPU backend's
//                         file has none of them.
//   routing-layerL-{sequence,document}.json
//                         per MoE layer, expert counts per sequence and per
//                         document fragment (a document's tokens inside one
//                         sequence) of every profiled step, in the
//                         "rackstep.routing_histogram/1" format sim/routing.h reads.
//
//   Profiler prof(graph, batch, seq, threads);
//   prof.attach(model);                       // model brackets each op; the backend's clock
//   prof.begin_step(step); ...forward/backward...;
//   prof.begin_optimizer(); ...optimizer...; prof.end_optimizer();
//   prof.record_routing(model, batch.doc_ids.data());
//   prof.end_step();                          // resolves the step's times (waits for the device)
//   prof.write("run/");
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "exec/backend.h"
#include "exec/model.h"
#include "models/layer_graph.h"
#include "sim/routing.h"

namespace rackstep::exec {

class Profiler final : public OpBrackets, public CollectiveBrackets {
 public:
  using Clock = std::chrono::steady_clock;

  Profiler(const models::LayerGraph& graph, int64_t batch, int64_t seq, int threads);

  // Brackets the model's ops; the first attach takes the model's backend's
  // clock (Backend::make_op_timing) unless set_timing gave one. The model's
  // backend must outlive the profiler's steps and write().
  void attach(Model& model);
  void set_timing(std::unique_ptr<OpTiming> timing) { timing_ = std::move(timing); }
  // The GEMMs' precision written as "dtype" on a device ("f32" on the CPU, its only one).
  void set_dtype(std::string dtype) { dtype_ = std::move(dtype); }
  void begin_step(int64_t step);
  void end_step();
  // Brackets the optimizer's work (and, on a device, what the step queues after it).
  void begin_optimizer();
  void end_optimizer();
  // Expert counts of this step's routing, per sequence and per document fragment.
  void record_routing(const Model& model, const int32_t* doc_ids);  // doc_ids: (batch, seq) or nullptr

  int64_t steps() const { return steps_; }
  // Seconds summed over profiled steps per op class ("gemm", "attention", ...,
  // plus "optimizer"), and the GEMM FLOPs those steps ran (fwd + bwd of the
  // gemm / grouped_gemm classes, fp32 hardware count).
  std::map<std::string, double> seconds_by_class() const;
  double gemm_flops() const;
  double total_seconds() const;

  // The op_measurements.json document write() writes.
  nlohmann::json measurements() const;
  void write(const std::string& dir) const;

  void begin_op(size_t op, int phase) override;
  void end_op(size_t op, int phase) override;
  // BackendCollectives::set_brackets: the collectives' lane.
  void begin_collective(const char* name, void* queue) override;
  void end_collective(void* queue) override;

 private:
  double since_origin(Clock::time_point t) const { return std::chrono::duration<double>(t - origin_).count(); }

  const models::LayerGraph* graph_;
  int64_t batch_, seq_;
  int threads_;
  Clock::time_point origin_;
  const Backend* backend_ = nullptr;
  std::unique_ptr<OpTiming> timing_;
  std::string dtype_ = "f32";
  int64_t step_ = 0;
  int64_t steps_ = 0;
  Clock::time_point step_wall0_;
  double step_cpu0_ = 0;
  std::vector<double> step_wall_s_, step_cpu_s_, step_device_s_;
  // This step's intervals: (op, phase), in begin order; a collective's is
  // (its index in collective_names_, kCollective).
  std::vector<std::pair<size_t, int>> pending_;
  static constexpr int kCollective = 3;
  struct Slice {
    size_t op;
    int phase;  // 0 forward, 1 backward, 2 optimizer
    int64_t step;
    double start_s, duration_s;
  };
  std::vector<Slice> slices_;
  std::vector<Slice> collective_slices_;  // op: the index in collective_names_
  std::vector<std::string> collective_names_;
  // Per MoE layer: histograms by sequence and by document fragment.
  std::map<int, sim::RoutingHistogram> by_sequence_, by_document_;
};

}  // namespace rackstep::exec
