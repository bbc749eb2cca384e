// Records routing traces (sim/base/routing_trace.h) from the CPU engine: after each
// forward, every token's chosen experts and router combine weights of every MoE
// layer, with the token's step, sequence, position and document.
//
// The trainer holds two recorders: one for training steps (`--routing-trace F`,
// every `--routing-trace-every` steps) and one for evaluation
// (`--routing-trace-eval F`, the last evaluation's batches, whose windows are
// consecutive in the token stream so documents come out whole).
//
//   RoutingTraceRecorder rec(graph, seq, /*eval=*/true, "runs/t/trace-eval.rsrt", max_tokens);
//   model.forward(b.inputs.data(), b.targets.data(), b.doc_ids.data());
//   rec.record(model, b, step);
//   rec.write();
#pragma once

#include <cstdint>
#include <string>

#include "exec/data.h"
#include "exec/model.h"
#include "models/layer_graph.h"
#include "sim/base/routing_trace.h"

namespace rackstep::exec {

class RoutingTraceRecorder {
 public:
  // UserError for a model without routed experts. max_tokens bounds the memory
  // the trace may take (records past it are a UserError, not a silent cut).
  RoutingTraceRecorder(const models::LayerGraph& graph, int64_t seq, bool eval, std::string path,
                       int64_t max_tokens);

  void clear();  // forget what was recorded (a new evaluation)
  // The routing of the forward the model just ran on batch b (b.batch rows of seq tokens).
  void record(const CpuModel& model, const Batch& b, int64_t step);
  void write() const;  // atomic; a trace with no tokens is not written
  const sim::RoutingTrace& trace() const { return trace_; }

 private:
  std::string path_;
  int64_t max_tokens_ = 0;
  std::vector<size_t> topk_ops_;  // (layers) graph op index of each MoE layer's top-k
  sim::RoutingTrace trace_;
  uint32_t next_sequence_ = 0;
};

}  // namespace rackstep::exec
