// Predict one training step: time, throughput, MFU, memory, for a model on a
// cluster under a layout.
//
// Public API (everything else in sim/cost.h, collectives.h, memory.h is detail):
//
//   Predictor p(graph, cluster, cal);              // precomputes the op table (once)
//   Prediction r = p.predict(layout);              // ~microseconds; thread-safe
//   r.valid, r.issues                              // why not, when invalid
//   r.step_time_s, r.tokens_per_s, r.mfu, r.hfu    // MFU: Marin convention
//   r.breakdown                                    // lines sum to step_time_s
//   r.memory                                       // sim/memory.h lines, fits_device
//   Prediction r = predict(graph, cluster, layout);   // one-off convenience
//   StepPrice all = p.price(layout);               // + timings per layer / op, every collective
//
// For the discrete-event simulator: Predictor::price(layout) prices the step
// once and returns the prediction with everything it was built from: each
// layer's forward / backward / recompute compute time and its communication by
// kind, for one micro-batch on one GPU (layers); the same per layer-graph op
// (ops, index into LayerGraph::ops); and every collective call as a latency
// plus per-GPU bytes per network tier (collectives), which sim/step_graph.h
// schedules without re-deriving them. layer_timings / op_timings are views of it.
//
// The step (per data rank; the most loaded pipeline stage):
//   per micro-batch  compute fwd + recompute + bwd of the stage's layers (sim/cost.h
//                    roofline per op) + exposed communication:
//                      FSDP all-gather of layer l+1 overlaps layer l's compute; the
//                      gradient reduce-scatter overlaps the next layer's backward;
//                      EP dispatch/combine (fwd, recompute, bwd): ragged is exposed
//                      (plus a size exchange), pooled waves hide part of it behind
//                      other waves' expert GEMMs but send full pools and compute on
//                      full receiver buffers; TP (sequence-parallel AG/RS) exposed;
//                      CP ring KV passing overlaps the attention kernel; offloading
//                      the residual carry overlaps the layer's compute.
//   pipeline bubble  1F1B (p-1)(F+B); interleaved /v; zero-bubble (H1) /3;
//                    DualPipeV (p/2-1)(F+B/2); plus stage-boundary sends.
//   per step         gradient sync across replicas (hierarchical all-reduce in
//                    buckets of calibration grad_sync_bucket_layers layers, released
//                    as the last micro-batch's backward reaches them and queued on
//                    the network; what runs past the end of the backward is exposed),
//                    optimizer (Adam: streaming,
//                    memory-bound; Muon/MuonH: momentum, then Newton–Schulz on whole
//                    matrices: the gather of sharded matrices to owner GPUs, 5
//                    iterations of 4m²n+2m³ FLOPs, redistribution; state streamed
//                    from host when placed there), host stalls (GC pauses on
//                    staggered processes: pause × P(any process pauses this step)).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/layer_graph.h"
#include "sim/calibration.h"
#include "sim/collectives.h"
#include "sim/cost.h"
#include "sim/layout.h"
#include "sim/memory.h"
#include "topologies/topology.h"

namespace rackstep::sim {

class StepModel;   // the layout's shape and pricing context (sim/predict.cpp)
struct ClassCost;  // one layer class's costs for one micro-batch (sim/predict.cpp)

// Seconds per step by cause; the fields sum to the step time.
struct StepBreakdown {
  double compute_fwd_s = 0;
  double compute_recompute_s = 0;
  double compute_bwd_s = 0;
  double ep_comm_s = 0;          // exposed dispatch/combine (incl. ragged size exchange)
  double fsdp_comm_s = 0;        // exposed parameter all-gathers and gradient reduce-scatters
  double tp_comm_s = 0;
  double cp_comm_s = 0;
  double offload_s = 0;          // exposed residual-carry transfers to/from host
  double pp_bubble_s = 0;
  double grad_sync_s = 0;        // exposed cross-replica gradient reduction
  double optimizer_compute_s = 0;
  double optimizer_comm_s = 0;   // Newton–Schulz gather + redistribution
  double optimizer_host_s = 0;   // optimizer state streamed host <-> device
  double host_stall_s = 0;       // GC pauses
  double host_issue_s = 0;       // device idle while an eager trainer's host issues kernels (after MoE syncs)

  double total() const;
  std::vector<std::pair<std::string, double>> lines() const;
};

struct Prediction {
  bool valid = false;
  std::vector<LayoutIssue> issues;   // invalid layouts: every reason
  std::vector<std::string> warnings; // what was priced without calibration (a GPU with no GEMM entry)
  double step_time_s = 0;
  double tokens_per_s = 0;
  double mfu = 0;                    // Marin convention, vs gpu.mfu_peak_flops_per_s
  double hfu = 0;                    // hardware FLOPs (recompute, padding) vs peak bf16
  double model_flops_per_token = 0;  // training (3 × forward), Marin convention
  double hardware_flops_per_gpu = 0; // per step
  double drop_fraction = 0;          // EP drops used for the expert work
  const char* drop_source = "none"; // "sim/drops", "fallback" (calibration ep_drops) or "none" (no EP)
  double micro_batches = 0;
  double tokens_per_step = 0;
  StepBreakdown breakdown;
  MemoryBreakdown memory;
};

// One layer of one micro-batch on one GPU (seconds).
struct LayerTiming {
  int32_t layer = 0;
  double fwd_s = 0, bwd_s = 0, recompute_s = 0;
  double ep_dispatch_s = 0, ep_combine_s = 0;  // one call each (per pass)
  double fsdp_gather_s = 0, grad_reduce_scatter_s = 0;
  double tp_comm_s = 0, cp_comm_s = 0;          // per pass
};

struct OpTiming {
  size_t graph_index = 0;            // into LayerGraph::ops
  int32_t layer = -1;
  double fwd_s = 0, bwd_s = 0;
  double fwd_flops = 0, bwd_flops = 0;  // hardware FLOPs on this GPU per micro-batch (trace slices)
  double fwd_host_s = 0, bwd_host_s = 0;  // host time to issue it (OpTime; 0 for a compiled step)
  // A host sync inside the op (the experts' activation, sim/cost.h expert_activation_syncs):
  // the device and host seconds of its forward before the sync (0 without one), and
  // whether its backward waits for one first (the activation's replay).
  double fwd_before_sync_s = 0, fwd_host_before_sync_s = 0;
  bool bwd_after_sync = false;
  double comm_s = 0;                 // dispatch / combine all-to-all (per pass)
};

// The collectives of one layer, for one micro-batch on one GPU, as calls
// (sim/collectives.h CommCost: latency_s + bw_s is the time in LayerTiming).
struct LayerCollectives {
  CommCost fsdp_gather;           // ZeRO-3 weight all-gather (dense + expert-data shards)
  CommCost grad_reduce_scatter;   // ZeRO-3 gradient reduce-scatter (per micro-batch; none when weights are kept)
  CommCost ep_dispatch, ep_combine;  // one call each (per pass)
  CommCost tp;                    // the sequence-parallel all-gathers / reduce-scatters of one pass
  CommCost tp_replay;             // the two all-gathers a torchtitan op-SAC replay reruns (backward)
  // Seconds of `tp` a forward (or full-recompute replay) and a backward pass leave on the
  // critical path, and of `tp_replay` its replay leaves: the time predict charges them. The
  // rest runs beside the pass's GEMMs (Layout::tp_comm_overlap, or the stack's
  // collectives.tp_overlap, hides a share; Layout::tp_userbuffers prices each GEMM's
  // overlap, whose exposed time may exceed the calls' own by the GEMMs' slowdown).
  double tp_fwd_exposed_s = 0, tp_bwd_exposed_s = 0, tp_replay_exposed_s = 0;
  CommCost cp;                    // KV ring passes (or gather) of one forward pass
  CommCost grad_sync_dense, grad_sync_expert;  // the layer's gradients across replicas, once per step
};

// The per-step collectives.
struct StepCollectives {
  CommCost pp_send;               // one micro-batch's activations (or gradients) across a stage boundary
  CommCost edge_grad_sync;        // LM head (or embedding) gradients across replicas
  CommCost replicated_grad_sync;  // a replicated embedding's gradients over every data rank
  CommCost muon_gather, muon_redistribute;  // Newton–Schulz: shards to matrix owners and back
};

// One priced step (Predictor::price): the prediction and what it was built from.
struct StepPrice {
  Prediction prediction;
  std::vector<LayerTiming> layers;               // one per layer
  std::vector<OpTiming> ops;                     // one per LayerGraph::ops entry
  std::vector<LayerCollectives> collectives;     // one per layer
  StepCollectives step_collectives;
};

class Predictor {
 public:
  Predictor(const models::LayerGraph& g, const topologies::Cluster& c, const Calibration& cal = default_calibration());

  // How much of the step price() returns: the prediction alone (predict(); what
  // a ranking needs, ~microseconds) or everything the step graph schedules.
  enum class PriceDetail { kPrediction, kFull };

  Prediction predict(const Layout& l) const { return price(l, PriceDetail::kPrediction).prediction; }
  // Fast path for sweeps: no issue strings; `reason` set when invalid.
  Prediction predict_fast(const Layout& l, Reason* reason) const;

  // The prediction, per-layer and per-op timings and every collective, from one
  // pricing of the layout. With kFull, timings and collectives are filled for
  // invalid layouts too (prediction.issues says why they cannot run).
  StepPrice price(const Layout& l, PriceDetail detail = PriceDetail::kFull) const;
  std::vector<LayerTiming> layer_timings(const Layout& l) const { return price(l).layers; }
  std::vector<OpTiming> op_timings(const Layout& l) const { return price(l).ops; }

  const OpTable& table() const { return table_; }
  const models::LayerGraph& graph() const { return graph_; }
  const topologies::Cluster& cluster() const { return cluster_; }
  const Calibration& calibration() const { return cal_; }
  const Network& network() const { return net_; }

 private:
  Prediction run(const StepModel& sm, const std::vector<ClassCost>& costs) const;
  void add_memory_issues(Prediction& p) const;

  models::LayerGraph graph_;
  topologies::Cluster cluster_;
  Calibration cal_;
  OpTable table_;
  Network net_;
  std::vector<std::string> warnings_;  // copied into every prediction
};

Prediction predict(const models::LayerGraph& g, const topologies::Cluster& c, const Layout& l,
                   const Calibration& cal = default_calibration());

// {"valid", "issues", "step_time_s", ..., "breakdown_s": {...}, "memory_bytes": {...}}
nlohmann::json prediction_to_json(const Prediction& p);
// Human-readable table (step, throughput, MFU, breakdown with shares, memory in GiB).
std::string format_prediction(const Prediction& p);

}  // namespace rackstep::sim
