// Memory per GPU (HBM) and per GPU's share of host memory for one layout.
//
// Lines (bytes, the most loaded pipeline stage):
//   master weights     dense params / (fsdp·tp) + experts / (max(ep, fsdp)·tp), at the
//                      master dtype (fp32 = 4 B); a replicated embedding is whole.
//                      Sharded at every ZeRO stage >= 1; a bf16 master under ZeRO 0-2
//                      is the replicated bf16 weights themselves
//   gradients          same sharding (ZeRO 2, 3), at Layout::grad_dtype (the master
//                      dtype unless set: Megatron's grad_reduce_in_fp32 = False keeps
//                      bf16 buffers); ZeRO 0-1 and kept gathered weights: the
//                      stage's whole unsharded gradients
//   optimizer states   Adam m, v (8 B/param), Muon momentum (4 B/param); on host
//                      when optimizer_state = host
//   working weights    bf16 copies: ZeRO-3, two gathered layers (current + prefetch) and
//                      one layer's local experts; one layer's unsharded gradient
//                      before its reduce-scatter (DeepSpeed's coordinator, with
//                      cal.grad_reduce_bucket_params: a module, its prefetch and two
//                      gradient buckets). ZeRO 0-2 (fp32 master) and kept
//                      gathered weights: the whole stage in bf16
//   activations        per layer per micro-batch from the layer graph's saved
//                      activations: none = all of them for every layer in flight;
//                      selective = those of GEMM / attention ops; full = the residual
//                      carry per layer (on host when offloaded, two layers in flight)
//                      plus one layer's activations during its backward; an unfused
//                      attention (cal.attention_score_bytes) adds its score matrices
//   backward workspace activation gradients of one layer
//   EP buffers         pooled: sender pools (sender_cf·A) + receiver buffers
//                      (receiver_cf·A) for dispatch and combine; ragged: the receiver
//                      gate (receiver_cf·A) for both; A = tokens × k routed rows
//   CP buffers         context parallel, one attention layer at a time: ring = the KV
//                      block being sent and the one being received (fwd; their
//                      gradients too in the bwd); all-gather KV = the whole
//                      sequence's K and V (and in the bwd their gradients)
//   loss workspace     one block of logits: bf16 logits, fp32 softmax, bf16 grad
//   runtime reserve    CUDA context, NCCL, cuBLAS workspaces (calibration)
//   fragmentation      allocator slack, a share of the live bytes (calibration)
// The device total sums the lines, each at its own peak, unless the calibration says
// the framework frees buffers at their last use (cal.peak_by_phase, the PyTorch
// stacks): then it is the largest set live at one moment (the loss, after the last
// layer's forward, or one moment of a layer's backward, op by op) and the lines
// are what is live at that moment (a line not live then is 0).
// Uneven stages (Layout::uneven_stages): the most loaded stage holds ceil(layers/pp).
// In-flight micro-batches per pipeline schedule: 1F1B / zero-bubble (H1) keep
// min(M, pp) on the first stage; interleaved adds (pp-1)/(pp·v); DualPipeV pp+1.
//
//   LayoutShape s = layout_shape(table, cluster, layout, cal);
//   MemoryBreakdown m = estimate_memory(table, cluster, layout, cal, s);
//   if (!m.fits_device) ...
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "sim/calibration.h"
#include "sim/cost.h"
#include "sim/layout.h"
#include "topologies/topology.h"

namespace rackstep::sim {

// Per-GPU quantities of a layout, shared by the memory and time models.
struct LayoutShape {
  int64_t seq = 0;
  double batch_seqs = 0;             // global
  double tokens_per_step = 0;
  double micro_batches = 1;          // per data rank per step
  double tokens_mb = 0;              // tokens per micro-batch on one GPU (after CP)
  double routed_rows_mb = 0;         // A = tokens_mb × k (expected, balanced)
  // Tokens per micro-batch each EP rank dispatches, and the routed rows its experts
  // compute (ep_tokens_mb × k): tokens_mb × etp / tp. Each TP rank holds 1/tp of the
  // sequence (sequence parallel) and the expert TP group gathers etp of those shares,
  // so an unfolded layout (etp = tp) keeps tokens_mb, a folded etp 1 sends its 1/tp.
  double ep_tokens_mb = 0;
  double expert_rows_mb = 0;
  double local_experts = 1;
  // GPUs of one tp rank that one copy of the sharded (ZeRO) state spans: fsdp, or
  // fsdp × cp when the trainer's shard group spans the context-parallel ranks
  // (cal.zero_shards_over_cp, layout.h).
  int64_t shard_ranks = 1;
  bool shards_over_cp = false;
  double dense_shard = 1;            // shard_ranks × tp
  double expert_shard = 1;           // max(ep, fsdp) × tp (× cp when shards_over_cp)
  double expert_zero = 1;            // extra expert sharding beyond EP (fsdp / ep when > 1)
  double layers_per_stage = 0;
  double stage_scale = 1;            // layers_per_stage / (layers / pp): > 1 on uneven stages
  double in_flight = 1;              // micro-batches with live activations
  double master_bytes = 4;
  double grad_bytes = 4;
  // Parameters on the most loaded stage (per stage, before sharding).
  double dense_stage_params = 0;     // block dense params of one stage
  double expert_stage_params = 0;
  double muon_dense_stage_params = 0;
  double edge_params = 0;            // embedding or LM head (the larger), sharded like dense
  // Per GPU after sharding (the most loaded stage).
  double params_local = 0;
  double muon_dense_local = 0, muon_expert_local = 0, adam_local = 0;
  double replicated_params = 0;      // whole on every GPU (a replicated embedding)
  double weights_whole_local = 0;    // the stage's weights not sharded by fsdp: / tp, experts / (ep·tp)
  double grads_local = 0;            // gradients held: params_local (ZeRO 2, 3) or weights_whole_local
  bool gathers_per_layer = false;    // ZeRO-3: weights all-gathered layer by layer
};

LayoutShape layout_shape(const OpTable& t, const topologies::Cluster& c, const Layout& l, const Calibration& cal);

struct MemoryBreakdown {
  double master_weights = 0, gradients = 0, optimizer_states = 0, working_weights = 0,
         activations = 0, backward_workspace = 0, ep_buffers = 0, cp_buffers = 0, loss_workspace = 0,
         runtime_reserve = 0, fragmentation = 0;
  double device_total = 0;
  double host_optimizer = 0, host_activations = 0;
  double host_total = 0;
  double device_capacity = 0, host_capacity = 0;
  bool fits_device = true, fits_host = true;
  // (name, bytes) in print order, device lines then host lines.
  std::vector<std::pair<std::string, double>> lines() const;
};

MemoryBreakdown estimate_memory(const OpTable& t, const topologies::Cluster& c, const Layout& l,
                                const Calibration& cal, const LayoutShape& s);

}  // namespace rackstep::sim
