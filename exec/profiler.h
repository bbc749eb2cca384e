// Profiler of the CPU training engine: what each op of the layer graph cost,
// measured, in the formats the predictor uses.
//
// Three outputs, written by write(dir):
//   trace.json            Chrome trace events (sim/trace.h, the simulator's
//                         writer): process "cpu0", thread "compute", one slice
//                         per op per phase named by sim::slice_name
//                         ("layers.3.attn.core.fwd"), category "forward" /
//                         "backward" / "optimizer", args {step, op, op_class,
//                         kind}. Opens beside `rackstep timeline` output;
//                         `rackstep compare` puts it next to the prediction.
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
//   routing-layerL-{sequence,document}.json
//                         per MoE layer, expert counts per sequence and per
//                         document fragment (a document's tokens inside one
//                         sequence) of every profiled step, in the
//                         "rackstep.routing_histogram/1" format sim/routing.h reads.
//
//   Profiler prof(graph, batch, seq, threads);
//   prof.attach(model);                       // model calls back per op
//   prof.begin_step(step); ...forward/backward...; prof.record_optimizer(t0, t1);
//   prof.record_routing(model, batch.doc_ids.data());
//   prof.end_step();
//   prof.write("run/");
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "exec/model.h"
#include "models/layer_graph.h"
#include "sim/routing.h"

namespace rackstep::exec {

class Profiler {
 public:
  using Clock = std::chrono::steady_clock;

  Profiler(const models::LayerGraph& graph, int64_t batch, int64_t seq, int threads);

  void attach(Model& model);
  void begin_step(int64_t step);
  void end_step();
  void record_optimizer(Clock::time_point start, Clock::time_point end);
  // Expert counts of this step's routing, per sequence and per document fragment.
  void record_routing(const Model& model, const int32_t* doc_ids);  // doc_ids: (batch, seq) or nullptr

  int64_t steps() const { return steps_; }
  // Seconds summed over profiled steps per op class ("gemm", "attention", ...,
  // plus "optimizer"), and the GEMM FLOPs those steps ran (fwd + bwd of the
  // gemm / grouped_gemm classes, fp32 hardware count).
  std::map<std::string, double> seconds_by_class() const;
  double gemm_flops() const;
  double total_seconds() const;

  void write(const std::string& dir) const;

 private:
  void on_op(size_t op, int phase, Clock::time_point start, Clock::time_point end);
  double since_origin(Clock::time_point t) const { return std::chrono::duration<double>(t - origin_).count(); }

  const models::LayerGraph* graph_;
  int64_t batch_, seq_;
  int threads_;
  Clock::time_point origin_;
  int64_t step_ = 0;
  int64_t steps_ = 0;
  Clock::time_point step_wall0_;
  double step_cpu0_ = 0;
  std::vector<double> step_wall_s_, step_cpu_s_;
  struct Slice {
    size_t op;
    int phase;  // 0 forward, 1 backward, 2 optimizer
    int64_t step;
    double start_s, duration_s;
  };
  std::vector<Slice> slices_;
  // Per MoE layer: histograms by sequence and by document fragment.
  std::map<int, sim::RoutingHistogram> by_sequence_, by_document_;
};

}  // namespace rackstep::exec
