// The task graph of training steps, for the event engine (sim/des.h).
//
// Built from one Predictor::price of the layout: its per-layer and per-op
// timings, every collective call with its latency and bytes per network tier,
// and the per-step lines of its breakdown. This file only schedules them, so
// the DES and the analytic model share every cost and differ only in how the
// pieces overlap, wait and share links:
//   - per micro-batch and layer: forward, (full or selective) recompute,
//     backward on the compute stream, split around the routed experts;
//   - FSDP parameter all-gathers on their own stream, prefetched one layer
//     ahead (a gather waits for the compute two layers back: a memory window),
//     per micro-batch and pass, or once per step in the first micro-batch's
//     forward with keep_gathered_weights (as the predictor prices it);
//     gradient reduce-scatters on another stream after each layer's backward
//     (after its weight-gradient pass under zero-bubble schedules);
//   - EP dispatch / expert GEMMs / combine per wave: ragged is one wave
//     (exposed); pooled runs W waves, wave i's transfers overlapping wave i±1's
//     expert GEMMs, with the SM share the transfers take (calibration's
//     ep_wave_overlap_efficiency) charged to the overlapped GEMMs;
//   - TP passes as predict prices them (LayerCollectives::tp_*_exposed_s): the share
//     an overlap hides (tp_comm_overlap, userbuffers) beside the pass's compute, the
//     rest after it; CP ring passes beside each layer's compute;
//   - pipeline stages with real dependencies: 1F1B, interleaved 1F1B (model
//     chunk q on stage q mod p), zero-bubble ZB-H1 (backward split into
//     input-gradient B and weight-gradient W; W deferred into the cool-down
//     bubbles, Qi et al. 2024) and DualPipeV (V-shaped placement: stage s holds
//     chunks s and 2p-1-s; DeepSeek's DualPipe "cut-in-half" step order);
//   - gradient all-reduce across replicas in buckets of calibration's
//     grad_sync_bucket_layers layers as the step's last micro-batch releases
//     them (0: one bucket after the backward, as the Marin trainer), the LM
//     head's first and a replicated embedding's last, on one stream: what runs
//     past the backward is exposed (sim/predict.cpp's exposed_grad_sync);
//   - an eager trainer (calibration host.op_issue_s > 0, a stack's): a host
//     thread per GPU issues every op in program order, each kernel waits for its
//     issue, and a sync per MoE layer forward (host.moe_syncs_per_layer) holds
//     the host until the device has run the layer up to its dispatch;
//   - Megatron-Core's merged-1F1B EP overlap (Layout::ep_a2a_overlap): one more
//     warm-up forward, then each steady-state forward merged with the backward
//     after it, MoE layer by MoE layer in four phases (each all-to-all beside the
//     other pass's compute, which runs stretched by the SMs the call holds);
//   - layers over pipeline chunks as predict splits them (uneven stages, the
//     embedding and loss counted as layers);
//   - per step: a GC stall on one staggered rank (host CPU) once its GPU work
//     is drained, which holds up the next sync point; the optimizer: Muon's
//     gather of sharded matrices, Newton–Schulz and element-wise updates,
//     redistribution, host state streaming; a checkpoint save on checkpoint steps.
//
// Communication is bytes over links, not durations: every collective is a
// fixed latency followed by byte flows over the GPU's NVLink port and (for
// traffic leaving the NVLink domain) its NIC and the shared scale-out fabric,
// and for traffic between scalable units the spine (GPUs x NIC bandwidth /
// the topology's spine_oversubscription, shared by every such flow).
// Each flow carries the real per-GPU bytes of the algorithm (ring: (n-1)/n of
// the buffer per tier; all-to-all: the share to peers in / out of the domain),
// at a per-flow rate cap chosen so that, alone on its links, the collective
// takes exactly the predictor's time (the latency is the predictor's time for
// a 1-byte message). Concurrent collectives then share a link's bandwidth
// max-min fairly (EP all-to-all beside an FSDP gather, several replicas'
// gradient rings on an oversubscribed fabric): contention is simulated.
// Per-tier ring phases are aggregated into one flow per tier (they stream
// concurrently in NCCL's pipelined rings).
//
// Symmetry: one process per (stage, representative rank) stands for
// gpus / (pp x ranks_per_stage) GPUs, so a 704-GPU step is a few thousand tasks.
//
//   Predictor pred(graph, cluster);
//   StepGraph sg = build_step_graph(pred, layout, {});
//   RunResult r = sg.engine.run();   // r.makespan_s vs sg.prediction.step_time_s
#pragma once

#include <cstdint>
#include <vector>

#include "sim/des.h"
#include "sim/layout.h"
#include "sim/pipeline_schedule.h"
#include "sim/predict.h"

namespace rackstep::sim {

struct StepGraphOptions {
  int64_t steps = 1;
  int64_t ranks_per_stage = 1;  // explicit data ranks per stage (the rest by multiplicity)
  bool gc_stalls = true;
  // true: a GPU's collectives share its NVLink port and NIC (and the fabric);
  // false: every comm stream has links of its own (the analytic model's view).
  bool contention = true;
  // The scale-out fabric carries (GPUs x NIC bandwidth) / this; 1 = non-blocking.
  double fabric_oversubscription = 1.0;
  // Steps k (1-based) with k % checkpoint_every == 0 end with a checkpoint save
  // (0 = none); cost from sim/goodput_defaults.json (bytes per parameter,
  // storage write bandwidth shared by every GPU, blocking fraction).
  int64_t checkpoint_every = 0;
  // What-if questions that change the graph (the run-time ones, a slow GPU or
  // a degraded link, are RunOptions):
  // Routed-expert load per rank: rank r of a stage runs its expert GEMMs
  // expert_load[r mod size] times as long (1 = balanced; an overloaded EP
  // rank > 1). Empty: balanced.
  std::vector<double> expert_load;
  // Ranks (stage-major: stage s, rank r is s x ranks_per_stage + r) whose NIC
  // has failed: their scale-out traffic crosses their NVLink port to the next
  // rank of the stage and leaves through that rank's NIC, which both share.
  std::vector<int64_t> failed_nics;
};

struct StepGraph {
  Engine engine;
  Prediction prediction;          // the analytic model on the same layout
  int64_t micro_batches = 0;
  int64_t stages = 0;
  int64_t layers_per_stage = 0;
  std::vector<TaskId> step_end;   // last task of each step
  double checkpoint_bytes = 0;    // whole-model bytes of one save (when any step saves)
};

// Throws UserError for an invalid layout (with the predictor's reasons) or a
// pipeline schedule that cannot run with these micro-batches / layers.
StepGraph build_step_graph(const Predictor& p, const Layout& l, const StepGraphOptions& o);

}  // namespace rackstep::sim
