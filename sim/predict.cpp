#include "sim/predict.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <exception>
#include <string>
#include <string_view>

#include "sim/base/check.h"
#include "sim/drops.h"

namespace rackstep::sim {

double StepBreakdown::total() const {
  return compute_fwd_s + compute_recompute_s + compute_bwd_s + ep_comm_s + fsdp_comm_s + tp_comm_s + cp_comm_s +
         offload_s + pp_bubble_s + grad_sync_s + optimizer_compute_s + optimizer_comm_s + optimizer_host_s +
         host_stall_s + host_issue_s;
}

std::vector<std::pair<std::string, double>> StepBreakdown::lines() const {
  return {{"compute_fwd", compute_fwd_s},
          {"compute_recompute", compute_recompute_s},
          {"compute_bwd", compute_bwd_s},
          {"ep_comm", ep_comm_s},
          {"fsdp_comm", fsdp_comm_s},
          {"tp_comm", tp_comm_s},
          {"cp_comm", cp_comm_s},
          {"offload", offload_s},
          {"pp_bubble", pp_bubble_s},
          {"grad_sync", grad_sync_s},
          {"optimizer_compute", optimizer_compute_s},
          {"optimizer_comm", optimizer_comm_s},
          {"optimizer_host", optimizer_host_s},
          {"host_stall", host_stall_s},
          {"host_issue", host_issue_s}};
}

namespace {

using models::OpClass;
using models::OpKind;

// Drop fraction of the routed assignments at this layout's dispatch settings.
// Settings sim/drops cannot price fall back to the drop model's fit target (or the calibration's
// ep_drops.fallback_fraction override)
// (source "fallback"; the prediction carries a warning).
double fallback_drop(const Calibration& cal) {
  return cal.fallback_drop_fraction > 0 ? cal.fallback_drop_fraction : default_drop_target();
}

double drop_fraction_for(const OpTable& t, const Layout& l, const LayoutShape& s, const Calibration& cal,
                         const char** source) {
  if (t.experts == 0 || l.ep <= 1) {
    *source = "none";
    return 0.0;
  }
  // sim/drops caches behind one global mutex; sweeps on several threads repeat the
  // same few settings, so each thread keeps its own small cache in front of it.
  struct Entry {
    int64_t experts, k, ep, tokens, seq, waves, chunks;
    Transport tr;
    double scf, rcf, value;
    bool ok;
  };
  thread_local std::vector<Entry> cache;
  const int64_t tokens = static_cast<int64_t>(s.ep_tokens_mb);  // what each EP rank routes
  for (const Entry& e : cache) {
    if (e.experts == t.experts && e.k == t.top_k && e.ep == l.ep && e.tokens == tokens && e.seq == s.seq &&
        e.waves == l.waves && e.chunks == l.ragged_chunks && e.tr == l.ep_transport && e.scf == l.sender_cf &&
        e.rcf == l.receiver_cf) {
      *source = e.ok ? "sim/drops" : "fallback";
      return e.ok ? e.value : fallback_drop(cal);
    }
  }
  Entry e{t.experts, t.top_k, l.ep, tokens, s.seq, l.waves, l.ragged_chunks, l.ep_transport,
          l.sender_cf, l.receiver_cf, 0.0, false};
  try {
    e.value = predict_drops(t.experts, static_cast<int>(t.top_k), l.ep, tokens, s.seq, l.ep_transport, l.sender_cf,
                            l.receiver_cf, static_cast<int>(l.waves), static_cast<int>(l.ragged_chunks))
                  .total();
    e.ok = true;
  } catch (const std::exception&) {
    // Settings the drop model cannot price: the calibrated fallback.
  }
  if (cache.size() >= 64) cache.erase(cache.begin());
  cache.push_back(e);
  *source = e.ok ? "sim/drops" : "fallback";
  return e.ok ? e.value : fallback_drop(cal);
}

// Newton–Schulz FLOPs of one (m x n) matrix: per iteration A = X X^T (2 m^2 n),
// B = bA + cA^2 (2 m^3), X' = aX + BX (2 m^2 n), with m <= n (Muon, Jordan et al. 2024).
double newton_schulz_flops(double m, double n, int64_t steps) {
  const double a = std::min(m, n), b = std::max(m, n);
  return static_cast<double>(steps) * (4.0 * a * a * b + 2.0 * a * a * a);
}

// Cross-replica gradient all-reduce, and how much of it the backward hides.
// Dense shards reduce over the data/fsdp replicas, expert shards over
// data/max(ep, fsdp), a replicated embedding over every data rank. The last
// micro-batch's backward releases the gradients layer by layer (last layer
// first); they leave in buckets of cal.grad_sync_bucket_layers layers (0: one
// bucket when the backward has ended, as a trainer that reduces the stacked
// gradients after its layer loop does). Buckets queue on the network one at a
// time; whatever still runs when the backward ends is exposed.
// The replicas a layer's gradients are reduced across once per step, and the
// share of a layer's parameters each GPU holds gradients for.
struct GradSyncGroups {
  Group dense, expert, replicated;
  double dense_shard = 1, expert_shard = 1;
};

GradSyncGroups grad_sync_groups(const Network& net, const Layout& l, const LayoutShape& s) {
  const int64_t tp = l.tp, cp = l.cp;
  // ZeRO-3 reduce-scatters inside each layer's backward; what is left per step is
  // the all-reduce of the shards across the data/fsdp replicas. ZeRO 0-2 (and kept
  // gathered weights) hold whole gradients: they reduce over every data rank (a
  // reduce-scatter, then the updated shards all-gathered back: the bytes of one
  // all-reduce, Rajbhandari et al. 2020, section 7).
  // A shard group that spans the context-parallel ranks (s.shards_over_cp) leaves
  // only the data/fsdp replicas to reduce across.
  const bool whole = !s.gathers_per_layer;
  const int64_t shard_cp = s.shards_over_cp ? cp : 1;
  const int64_t expert_split = whole ? l.ep : std::max(l.ep, l.fsdp);
  const int64_t dense_split = whole ? 1 : l.fsdp;
  const int64_t split_cp = whole ? 1 : shard_cp;
  GradSyncGroups g;
  g.dense_shard = static_cast<double>(dense_split * split_cp * tp);
  g.expert_shard = static_cast<double>(expert_split * split_cp * tp);
  g.dense = group_of(net, l.data / dense_split * cp / split_cp, tp * dense_split * split_cp);
  g.expert = group_of(net, l.data / expert_split * cp / split_cp, tp * expert_split * split_cp);
  g.replicated = group_of(net, l.data * cp, tp);
  if (l.folded()) {
    // Expert-DP replicas of the folded mesh (layout.h): each GPU holds 1/(ep·etp) of a
    // stage's experts (and 1/expert_zero of that under ZeRO-3); the replicas are the
    // stage's GPUs at that stride.
    const int64_t shard = whole ? l.ep * l.expert_tp() : static_cast<int64_t>(s.expert_shard);
    g.expert_shard = static_cast<double>(shard);
    g.expert = group_of(net, std::max<int64_t>(1, tp * cp * l.data / shard), shard);
  }
  return g;
}

double exposed_grad_sync(const OpTable& t, const Network& net, const Calibration& cal, const Layout& l,
                         const LayoutShape& s, const std::vector<double>& bwd_wall) {
  const GradSyncGroups gs = grad_sync_groups(net, l, s);
  const double dense_shard = gs.dense_shard;
  const double expert_shard = gs.expert_shard;
  const Group& dense_g = gs.dense;
  const Group& expert_g = gs.expert;
  const double edge_s = all_reduce_s(net, dense_g, s.edge_params / dense_shard * s.grad_bytes);
  const double replicated_s =
      s.replicated_params > 0 ? all_reduce_s(net, gs.replicated, s.replicated_params * s.grad_bytes) : 0.0;
  if (cal.grad_sync_bucket_layers <= 0) {
    const double dense_s = all_reduce_s(net, dense_g, s.dense_stage_params / dense_shard * s.grad_bytes);
    const double expert_s = s.expert_stage_params > 0
                                ? all_reduce_s(net, expert_g, s.expert_stage_params / expert_shard * s.grad_bytes)
                                : 0.0;
    return dense_s + edge_s + expert_s + replicated_s;
  }
  // One layer's gradient all-reduce per class.
  std::vector<double> layer_s(t.classes.size(), 0.0);
  for (size_t ci = 0; ci < t.classes.size(); ++ci) {
    const LayerClass& lc = t.classes[ci];
    layer_s[ci] = all_reduce_s(net, dense_g, lc.dense_params / dense_shard * s.grad_bytes) +
                  (lc.expert_params > 0 ? all_reduce_s(net, expert_g, lc.expert_params / expert_shard * s.grad_bytes)
                                        : 0.0);
  }
  const auto stage_layers = static_cast<int64_t>(s.layers_per_stage);
  double now = 0.0;             // backward progress of the last micro-batch
  double net_free = edge_s;     // the LM head's gradients are ready first
  double pending = 0.0;
  int64_t in_bucket = 0;
  for (int64_t i = stage_layers - 1; i >= 0; --i) {
    const auto ci = static_cast<size_t>(t.layer_class[static_cast<size_t>(i)]);
    now += bwd_wall[ci];
    pending += layer_s[ci];
    if (++in_bucket < cal.grad_sync_bucket_layers && i > 0) continue;
    net_free = std::max(now, net_free) + pending;
    pending = 0.0;
    in_bucket = 0;
  }
  net_free = std::max(now, net_free) + replicated_s;  // the embedding's gradients come last
  return std::max(0.0, net_free - now);
}

}  // namespace

// Per-class results for one micro-batch on one GPU.
struct ClassCost {
  BlockTime compute;
  double ep_dispatch_s = 0, ep_combine_s = 0;   // one call each
  double fsdp_gather_s = 0, grad_rs_s = 0;
  double fsdp_bwd_gather_s = 0;                 // the backward's re-gather (modules kept from the recompute left out)
  double fsdp_copy_fwd_s = 0, fsdp_copy_bwd_s = 0;  // the trainer's HBM passes over gathered weights and grads
  double tp_pass_s = 0;                          // TP collectives of one pass
  double tp_fwd_s = 0, tp_bwd_s = 0;             // exposed TP time of a forward / backward pass
  double tp_recompute_s = 0;                     // exposed TP all-gathers a selective replay reruns (torchtitan_op_sac)
  double cp_pass_s = 0;                          // CP KV traffic of one forward pass
  double attention_fwd_s = 0, attention_bwd_s = 0;
  double carry_xfer_s = 0;                       // residual carry to/from host
};

namespace {
struct Groups {
  Group fsdp, ezero, ep, tp, cp;
  Group etp;  // expert tensor parallel (consecutive ranks), when a folded layout gathers over it
};
// Share of the measured NVLink rate an EP dispatch (or combine) reaches: HybridEP's
// kernels under the flex dispatcher with that backend, else the all-to-all / DeepEP
// figures (sim/calibration.json collectives.ep_hybridep_nvlink, ep_nvlink).
double ep_link_eff(const Calibration& cal, const Layout& l, bool dispatch) {
  if (l.ep_dispatcher == EpDispatcher::kFlex && l.ep_flex_backend == FlexBackend::kHybridEp) {
    return dispatch ? ep_hybridep_dispatch_eff(cal, l.ep) : ep_hybridep_combine_eff(cal, l.ep);
  }
  return dispatch ? ep_dispatch_eff(cal, l.ep) : ep_combine_eff(cal, l.ep);
}

// Transformer Engine userbuffers overlaps (transformer_engine/pytorch/module/base.py
// initialize_ub; csrc comm_gemm_overlap), each pricing a TP collective of comm_s with the
// GEMM it feeds or follows (gemm_s whole, split_s as the overlap runs it in chunks): the
// time the pair takes beyond gemm_s, the collective's exposed cost.
//
// Ring exchange (the all-gather before a column-parallel GEMM, the forward's and the
// backward's): the GEMM runs in `chunks` (tp) pieces, one per rank's shard; each piece
// is computed while the next shard moves on the copy engines (use_ce, no SMs), so the
// transfers hide behind all pieces but the last.
double ring_exchange_exposed_s(double comm_s, double gemm_s, double split_s, double chunks) {
  return (split_s - gemm_s) + std::max(0.0, comm_s - split_s * (chunks - 1.0) / chunks);
}
// Pipeline (the reduce-scatter after a row-parallel GEMM): the GEMM runs in `chunks`
// pieces on the SMs the comm kernels leave (set_sm_margin), piece i's reduce-scatter
// beside piece i+1; the last piece's is exposed.
double pipeline_exposed_s(double comm_s, double gemm_s, double split_s, double chunks, double slow) {
  const double run_s = split_s * slow;
  return (run_s - gemm_s) + comm_s / chunks + (chunks - 1.0) / chunks * std::max(0.0, comm_s - run_s);
}
// Bulk (the backward's reduce-scatter of a data gradient beside the weight-gradient
// GEMM): the collective and the whole GEMM start together, the GEMM on the SMs the comm
// kernels leave (set_sm_margin, TE's default for it).
double bulk_exposed_s(double comm_s, double gemm_s, double slow) {
  const double run_s = gemm_s * slow;
  return (run_s - gemm_s) + std::max(0.0, comm_s - run_s);
}
}  // namespace

class StepModel {
 public:
  StepModel(const OpTable& t, const topologies::Cluster& c, const Calibration& cal, const Network& net, const Layout& l)
      : t_(t), c_(c), cal_(cal), net_(net), l_(l), s_(layout_shape(t, c, l, cal)) {
    const auto& gpu = c.system.gpu;
    ctx_ = device_price_context(gpu, cal);
    ctx_.tokens = s_.tokens_mb;
    ctx_.seq = static_cast<double>(s_.seq);
    ctx_.tp = static_cast<double>(l.tp);
    ctx_.etp = static_cast<double>(l.expert_tp());
    ctx_.local_experts = s_.local_experts;
    ctx_.fp8_recipe = l.fp8_recipe;
    ctx_.fp8_linear = l.fp8 == Fp8Gemms::kLinear;
    ctx_.fp8_params = l.fp8_params;
    ctx_.fp8_experts = l.fp8 == Fp8Gemms::kExperts;
    ctx_.torchtitan_op_sac = l.torchtitan_op_sac;
    ctx_.cp_ring = l.cp_kind == CpKind::kRing ? static_cast<double>(l.cp) : 1.0;
    ctx_.op_issue_s = host_op_issue_s(cal, gpu);
    // Megatron-Core's all-to-all dispatcher (token_dispatcher.py): sort_chunks_by_idxs with
    // more than one local expert; TEGroupedMLP's Fp8Padding for FP8 experts whose rows
    // arrive unaligned: the all-to-all's and DeepEP's (the flex dispatcher's HybridEP pads
    // inside its dispatch kernel, so TEGroupedMLP finds them aligned).
    const bool a2a_dispatch = l.ep_transport == Transport::ragged && l.ep_dispatcher == EpDispatcher::kAllToAll;
    const bool deepep_dispatch = l.ep_transport == Transport::ragged && l.ep_dispatcher == EpDispatcher::kFlex &&
                                 l.ep_flex_backend == FlexBackend::kDeepEp;
    ctx_.moe_sort_rows = cal.moe_sort_rows_by_local_expert && a2a_dispatch && s_.local_experts > 1.0;
    ctx_.moe_fp8_pad_rows = cal.moe_fp8_pad_expert_rows && (a2a_dispatch || deepep_dispatch) && l.fp8 != Fp8Gemms::kNone;
    ctx_.merged_1f1b = l.ep > 1 && l.ep_a2a_overlap;
    ctx_.moe_permute_unfused = a2a_dispatch && !l.moe_permute_fusion && t.experts > 0;
    ctx_.experts = static_cast<double>(t.experts);
    drop_ = drop_fraction_for(t, l, s_, cal, &drop_source_);
    // Pooled waves run the expert GEMMs over whole receiver buffers (fixed shapes);
    // ragged runs the kept rows only.
    const double a = s_.expert_rows_mb;
    ctx_.expert_rows = l.ep > 1 && l.ep_transport == Transport::pooled ? l.receiver_cf * a : a * (1.0 - drop_);
    const int64_t tp = l.tp, cp = l.cp;
    // The shard group: fsdp data ranks at stride tp·cp, or (spanning the CP ranks)
    // fsdp × cp consecutive ranks at stride tp: torchtitan flattens its (dp_shard, cp)
    // mesh dims, Megatron-Core orders its ranks tp-cp-ep-dp.
    g_.fsdp = s_.shards_over_cp ? group_of(net, s_.shard_ranks, tp) : group_of(net, l.fsdp, tp * cp);
    // EP groups: `ep` ranks at the layout's stride (tp·cp over data ranks; etp when folded).
    g_.ezero = group_of(net, static_cast<int64_t>(s_.expert_zero), l.ep_stride() * l.ep);
    g_.ep = group_of(net, l.ep, l.ep_stride());
    g_.etp = group_of(net, l.expert_tp(), 1);
    g_.tp = group_of(net, tp, 1);
    g_.cp = group_of(net, cp, tp);
  }

  const LayoutShape& shape() const { return s_; }
  const PriceContext& ctx() const { return ctx_; }
  const Layout& layout() const { return l_; }
  double drop() const { return drop_; }
  const char* drop_source() const { return drop_source_; }

  std::vector<ClassCost> class_costs() const {
    std::vector<ClassCost> out;
    out.reserve(t_.classes.size());
    for (const auto& lc : t_.classes) out.push_back(class_cost(lc));
    return out;
  }

  ClassCost class_cost(const LayerClass& lc) const {
    ClassCost k;
    k.compute = price_ops(lc.ops, ctx_);
    const double tp = static_cast<double>(l_.tp);
    // ZeRO-3 gathers each layer's weights (per micro-batch, or once per step when
    // kept) and reduce-scatters its gradient per micro-batch; ZeRO 0-2 do neither.
    const bool zero3 = l_.zero_stage >= 3;
    if (s_.shard_ranks > 1 && zero3) {
      k.fsdp_gather_s = dense_gather_s(lc);
      k.fsdp_bwd_gather_s = k.fsdp_gather_s - kept_from_recompute_s(lc);
      if (s_.gathers_per_layer) k.grad_rs_s = dense_reduce_scatter_s(lc);
    }
    if (s_.expert_zero > 1.0 && zero3) {
      const double local = lc.expert_params / static_cast<double>(l_.ep * l_.expert_tp());
      k.fsdp_gather_s += all_gather_s(net_, g_.ezero, local * 2.0);
      k.fsdp_bwd_gather_s += all_gather_s(net_, g_.ezero, local * 2.0);
      if (s_.gathers_per_layer) k.grad_rs_s += reduce_scatter_s(net_, g_.ezero, local * s_.grad_bytes);
    }
    if (zero3 && s_.gathers_per_layer) price_fsdp_copies(lc, &k);
    if (lc.moe && l_.ep > 1) {
      const bool pooled = l_.ep_transport == Transport::pooled;
      const double bytes = ep_bytes();
      const double fixed = cal_.ep_a2a_latency_s + (pooled ? 0.0 : cal_.ep_ragged_sync_s);
      const double calls = pooled ? static_cast<double>(l_.waves) : 1.0;
      const A2aTiers tiers = ep_tiers(bytes);
      k.ep_dispatch_s = all_to_all_tiers_s(net_, g_.ep, tiers, ep_link_eff(cal_, l_, true)) + calls * fixed;
      k.ep_combine_s = all_to_all_tiers_s(net_, g_.ep, tiers, ep_link_eff(cal_, l_, false)) + calls * fixed;
    }
    if (lc.moe && etp_gathers()) {
      k.ep_dispatch_s += all_gather_s(net_, g_.etp, etp_gathered_bytes());
      k.ep_combine_s += reduce_scatter_s(net_, g_.etp, etp_gathered_bytes());
    }
    if (l_.tp > 1) {
      // Sequence parallel: AG before and RS after attention and MLP.
      const double act = s_.tokens_mb * static_cast<double>(t_.d_model) * 2.0;
      const double ag = all_gather_s(net_, g_.tp, act), rs = reduce_scatter_s(net_, g_.tp, act);
      k.tp_pass_s = 2.0 * (ag + rs);
      if (l_.tp_userbuffers) {
        tp_userbuffers_exposed(lc, ag, rs, k);
      } else {
        const double hidden = l_.tp_comm_overlap >= 0 ? l_.tp_comm_overlap : cal_.tp_overlap;
        k.tp_fwd_s = k.tp_bwd_s = k.tp_pass_s * (1.0 - hidden);
        // torchtitan's op policy saves reduce_scatter_tensor outputs but not all_gather_into_tensor
        // ones (_save_list): its replay gathers the attention and MLP inputs again.
        if (l_.torchtitan_op_sac) k.tp_recompute_s = 2.0 * ag * (1.0 - hidden);
      }
    }
    for (const auto& e : lc.ops) {
      if (e.kind != OpKind::kAttention) continue;
      const OpTime at = price_op(e, ctx_);
      k.attention_fwd_s += at.fwd_s;
      k.attention_bwd_s += at.bwd_s;
      if (l_.cp > 1) k.cp_pass_s += cp_kv_s(e);
    }
    if (l_.offload_residual && l_.recompute == models::Recompute::kFull) {
      k.carry_xfer_s = s_.tokens_mb / tp * static_cast<double>(t_.d_model) * 2.0 / net_.h2d_bw_bytes_per_s;
    }
    return k;
  }

  // Device time of the HBM passes the trainer makes, besides its collectives, over the
  // layer's gathered parameters (one gather in the forward, one in the backward) and
  // their unsharded gradient (once in the backward), per micro-batch: the stack's pass
  // counts (Calibration::fsdp_gather_copy_passes ...) at the gathered bytes (bf16, FP8
  // weights gathered as FP8: zero3_gathered_bytes_per_elem), the param dtype (2 B) and the
  // reduce dtype (grad_bytes), at HBM bandwidth and the elementwise
  // memory efficiency. Copies on the trainer's side streams are charged too: they are
  // memory-bound kernels beside compute-bound GEMMs that hold every SM [A], so they
  // take their time from the critical path rather than hide.
  void price_fsdp_copies(const LayerClass& lc, ClassCost* k) const {
    double elems = 0.0, gathered_bytes = 0.0;  // what this GPU gathers of the layer
    if (l_.fsdp > 1) {
      elems += lc.dense_params / static_cast<double>(l_.tp);
      gathered_bytes += dense_gather_bytes(lc);
    }
    if (s_.expert_zero > 1.0) {
      const double local = lc.expert_params / static_cast<double>(l_.ep * l_.expert_tp());
      elems += local;
      gathered_bytes += local * 2.0;
    }
    const double hbm_bytes_per_s = ctx_.hbm_bw_bytes_per_s * cal_.mem_eff_elementwise;
    const double gather_bytes = cal_.fsdp_gather_copy_passes * gathered_bytes;
    const bool copy = cal_.fsdp_grad_copy == Calibration::FsdpGradCopy::kAlways ||
                      (cal_.fsdp_grad_copy == Calibration::FsdpGradCopy::kWhenCast && s_.grad_bytes != 2.0);
    const double grad_bytes = cal_.fsdp_grad_view_passes * 2.0 + (copy ? 2.0 + s_.grad_bytes : 0.0) +
                              cal_.fsdp_grad_reduce_dtype_passes * s_.grad_bytes;
    k->fsdp_copy_fwd_s = gather_bytes / hbm_bytes_per_s;
    k->fsdp_copy_bwd_s = (gather_bytes + elems * grad_bytes) / hbm_bytes_per_s;
  }

  // Exposed TP time of one forward and one backward pass of a layer under Transformer
  // Engine's userbuffers overlap (Layout::tp_userbuffers), all-gather ag_s and
  // reduce-scatter rs_s each (sequence parallel). Per block (attention: the QKV
  // projections before the attention and the output projection after it; MLP: fc1, the
  // gated pair, and fc2) TE's default methods (base.py initialize_ub):
  //   forward   all-gather  -> QKV / fc1 fprop       ring exchange
  //             proj / fc2 fprop -> reduce-scatter   pipeline (tp_ub_pipeline_splits chunks)
  //   backward  all-gather  -> proj / fc2 dgrad      ring exchange
  //             reduce-scatter of the QKV / fc1 dgrad beside their wgrad GEMM   bulk
  // A GEMM's backward is taken as half data, half weight gradient. A block without the
  // GEMM (none of that kind in the layer) leaves its collective exposed.
  void tp_userbuffers_exposed(const LayerClass& lc, double ag_s, double rs_s, ClassCost& k) const {
    const double sms = static_cast<double>(c_.system.gpu.sms);
    const double splits = cal_.tp_ub_pipeline_splits;
    RS_CHECK(splits >= 1 && sms > cal_.tp_ub_pipeline_sms && sms > cal_.tp_ub_bulk_sms,
             "tp_userbuffers needs collectives.tp_userbuffers_* in the calibration, with fewer comm SMs than the GPU's");
    const double tp = static_cast<double>(l_.tp);
    // The block's GEMMs priced whole and run in `chunks` pieces of tokens / chunks rows each.
    struct Gemms {
      OpTime whole, split;
    };
    const auto price = [&](const std::vector<const OpEntry*>& ops, double share, double chunks) {
      PriceContext piece = ctx_;
      piece.tokens = ctx_.tokens / chunks;
      Gemms g;
      for (const OpEntry* e : ops) {
        const OpTime w = price_op(*e, ctx_), p = price_op(*e, piece);
        g.whole.fwd_s += share * w.fwd_s;
        g.whole.bwd_s += share * w.bwd_s;
        g.split.fwd_s += share * chunks * p.fwd_s;
        g.split.bwd_s += share * chunks * p.bwd_s;
      }
      return g;
    };
    // The column-parallel projections before the attention, the row-parallel ones after
    // it, and the dense MLP (its gemm_count GEMMs: the last is fc2, the rest fc1).
    std::vector<const OpEntry*> qkv, proj, mlp;
    bool after_attention = false;
    for (const OpEntry& e : lc.ops) {
      if (e.kind == OpKind::kAttention) after_attention = true;
      if (e.cls != OpClass::kGemm) continue;
      if (e.kind == OpKind::kSharedMlp) mlp.push_back(&e);
      if (e.kind == OpKind::kLinear) (after_attention ? proj : qkv).push_back(&e);
    }
    RS_CHECK(mlp.size() <= 1, "a layer with more than one dense MLP");
    const double fc2_share = mlp.empty() ? 0.0 : 1.0 / mlp[0]->gemm_count;
    const Gemms qkv_ring = price(qkv, 1.0, tp), proj_ring = price(proj, 1.0, tp), proj_pipe = price(proj, 1.0, splits);
    const Gemms fc1_ring = price(mlp, 1.0 - fc2_share, tp), fc2_ring = price(mlp, fc2_share, tp);
    const Gemms fc2_pipe = price(mlp, fc2_share, splits);
    const double pipe_slow = sms / (sms - cal_.tp_ub_pipeline_sms), bulk_slow = sms / (sms - cal_.tp_ub_bulk_sms);
    k.tp_fwd_s = ring_exchange_exposed_s(ag_s, qkv_ring.whole.fwd_s, qkv_ring.split.fwd_s, tp) +
                 pipeline_exposed_s(rs_s, proj_pipe.whole.fwd_s, proj_pipe.split.fwd_s, splits, pipe_slow) +
                 ring_exchange_exposed_s(ag_s, fc1_ring.whole.fwd_s, fc1_ring.split.fwd_s, tp) +
                 pipeline_exposed_s(rs_s, fc2_pipe.whole.fwd_s, fc2_pipe.split.fwd_s, splits, pipe_slow);
    k.tp_bwd_s = ring_exchange_exposed_s(ag_s, 0.5 * proj_ring.whole.bwd_s, 0.5 * proj_ring.split.bwd_s, tp) +
                 bulk_exposed_s(rs_s, 0.5 * qkv_ring.whole.bwd_s, bulk_slow) +
                 ring_exchange_exposed_s(ag_s, 0.5 * fc2_ring.whole.bwd_s, 0.5 * fc2_ring.split.bwd_s, tp) +
                 bulk_exposed_s(rs_s, 0.5 * fc1_ring.whole.bwd_s, bulk_slow);
  }

  // Bytes of a layer's dense weights one ZeRO-3 gather brings to this GPU (its 1/tp
  // share; FP8 weights at one byte, zero3_gathered_bytes_per_elem).
  double dense_gather_bytes(const LayerClass& lc) const {
    return zero3_gathered_dense_bytes(lc, l_) / static_cast<double>(l_.tp);
  }

  // The same for one parameter-holding module (fsdp_modules: its ops are of one kind).
  double module_gather_bytes(const LayerClass& lc, const FsdpModule& m) const {
    return m.param_elems / static_cast<double>(l_.tp) * zero3_gathered_bytes_per_elem(lc.ops[m.first_op], l_);
  }

  // One pass of ZeRO-3 gathers of a layer's dense weights: one call per layer, or one
  // per parameter-holding module (fsdp_modules), each at its own bytes and ring latency.
  double dense_gather_s(const LayerClass& lc) const {
    if (!cal_.fsdp_gather_per_module) return all_gather_s(net_, g_.fsdp, dense_gather_bytes(lc));
    double t = 0.0;
    for (const FsdpModule& m : fsdp_modules(lc, cal_)) {
      if (gathered_module(m)) t += all_gather_s(net_, g_.fsdp, module_gather_bytes(lc, m));
    }
    return t;
  }

  // One pass of ZeRO-3 reduce-scatters of a layer's dense gradients: one call per
  // layer, or, with per-module gathers, one per parameter-holding module, persistent ones
  // included (DeepSpeed hooks every parameter's gradient and _reduce_scatter_gradients
  // issues one torch.distributed.reduce_scatter per parameter: stage3.py
  // create_reduce_and_remove_grad_hooks, partition_parameters.py).
  double dense_reduce_scatter_s(const LayerClass& lc) const {
    const double tp = static_cast<double>(l_.tp);
    if (!cal_.fsdp_gather_per_module) return reduce_scatter_s(net_, g_.fsdp, lc.dense_params / tp * s_.grad_bytes);
    double t = 0.0;
    for (const FsdpModule& m : fsdp_modules(lc, cal_)) t += module_reduce_scatter_s(m);
    return t;
  }

  // A module's gradient reduce-scatters: one call per parameter tensor (stage3.py hooks
  // each parameter's gradient; partition_parameters.py _reduce_scatter_gradients loops
  // over the parameters, one _reduce_scatter_gradient each): the weight at its bytes, a
  // bias (under 1e-4 of them) at the ring's latency.
  double module_reduce_scatter_s(const FsdpModule& m) const {
    const double tp = static_cast<double>(l_.tp);
    return reduce_scatter_s(net_, g_.fsdp, m.param_elems / tp * s_.grad_bytes) +
           std::max(0.0, m.param_tensors - 1.0) * ring_pass_latency_s(net_, g_.fsdp);
  }

  // Gathers the backward skips under full recompute with a re-gathering trainer: the
  // layer's last modules, used again by the backward within
  // fsdp_max_reuse_distance_params elements of the recompute, stay gathered
  // (DeepSpeed's release_sub_module / _keep_for_later).
  double kept_from_recompute_s(const LayerClass& lc) const {
    if (cal_.fsdp_max_reuse_distance_params <= 0 || !cal_.fsdp_gather_per_module) return 0.0;
    const double tp = static_cast<double>(l_.tp);
    const std::vector<FsdpModule> modules = fsdp_modules(lc, cal_);
    double later = 0.0, kept = 0.0;  // elements of the modules after this one
    for (auto it = modules.rbegin(); it != modules.rend(); ++it) {
      if (!kept_for_backward(later)) break;
      if (gathered_module(*it)) kept += all_gather_s(net_, g_.fsdp, module_gather_bytes(lc, *it));
      later += it->param_elems / tp;
    }
    return kept;
  }

  // Whether a module the recompute forward gathered stays gathered for its backward,
  // given the elements per GPU of the layer's modules after it (`later_elems`, persistent
  // ones included). DeepSpeed's release_sub_module keeps it when _keep_for_later finds
  // its reuse distance under stage3_max_reuse_distance (stage3.py, v0.3.13 to v0.5.x):
  // PrefetchCoordinator._distance_in_numel sums the parameters (recurse=False) of every
  // module in the recorded trace between the release and the next use, and between a
  // module's recompute forward and its backward the trace holds each later module twice:
  // its recompute forward, then its backward (pre_sub_module_forward_function and
  // pre_sub_module_backward_function both record_trace).
  bool kept_for_backward(double later_elems) const {
    return l_.recompute == models::Recompute::kFull && 2.0 * later_elems < cal_.fsdp_max_reuse_distance_params;
  }

  // A module whose weights ZeRO-3 gathers: at or above the persistence threshold
  // (smaller ones stay whole on every GPU).
  bool gathered_module(const FsdpModule& m) const {
    return m.param_elems / static_cast<double>(l_.tp) >= cal_.fsdp_persistence_threshold_params;
  }

  // DeepSpeed ZeRO-3's coordinator, module by module (stage3.py and
  // partition_parameters.py of v0.3.13-0.3.16, 2021; cal.fsdp_max_live_params > 0;
  // the modules of fsdp_modules, the memory walk's):
  //  - no gather overlaps compute: every _allgather_param first calls
  //    torch.cuda.synchronize(), so the "async" prefetch is not (DeepSpeed PR #1188,
  //    June 2021, which made fetch_sub_module synchronous for that reason), and the
  //    default stream's kernels wait for the gathers (the profile in issue #1069);
  //  - the host's per-rank list work (cal.fsdp_list_ops_per_rank ops per rank, each
  //    launch_overhead_s) runs after that synchronisation with the GPU idle: exposed,
  //    for gathers and reduce-scatters alike;
  //  - each gather's output buffer is zero-filled first (torch.zeros before the
  //    synchronisation; cal.fsdp_gather_zero_fill): its bytes at HBM bandwidth, exposed;
  //  - full recompute: the recompute forward gathers again; the backward re-uses the
  //    modules kept from it (kept_from_recompute_s);
  //  - one reduce-scatter per module, beside the next module's backward on the
  //    reduction stream (overlap_comm); the next gather's synchronisation waits for
  //    it, so what it takes beyond that backward is exposed; where that backward
  //    outlasts it, the SMs the call holds slow the backward (sm_share_stretch).
  struct Zero3Exposed {
    double fwd_s = 0, recompute_s = 0, bwd_s = 0;
  };
  Zero3Exposed deepspeed_zero3_exposed(const LayerClass& lc) const {
    const double tp = static_cast<double>(l_.tp);
    const double host_s = cal_.fsdp_list_ops_per_rank * static_cast<double>(g_.fsdp.size) * cal_.launch_overhead_s;
    const std::vector<FsdpModule> modules = fsdp_modules(lc, cal_);
    const double slow = sm_share_stretch(static_cast<double>(c_.system.gpu.sms), cal_.fsdp_collective_sms);
    Zero3Exposed z;
    double bwd_s = 0.0;  // backward compute of the ops after the last reduce-scatter's module
    double later = 0.0;  // elements of the layer's modules after this one, persistent ones included
    size_t next_op = lc.ops.size();  // ops [next_op, end) walked
    for (auto it = modules.rbegin(); it != modules.rend(); ++it) {
      const FsdpModule& m = *it;
      for (size_t op = m.last_op + 1; op < next_op; ++op) bwd_s += price_op(lc.ops[op], ctx_).bwd_s;
      next_op = std::min(next_op, m.first_op);
      double own_bwd_s = 0.0;
      for (size_t op = m.first_op; op <= m.last_op; ++op) own_bwd_s += m.op_share * price_op(lc.ops[op], ctx_).bwd_s;
      const double elems = m.param_elems / tp;
      const double rs_call_s = module_reduce_scatter_s(m);
      const double rs = rs_call_s + std::max(1.0, m.param_tensors) * host_s;
      // The call (not the host's list work) holds fsdp_collective_sms SMs beside that backward.
      z.bwd_s += std::max(rs - bwd_s, beside_compute_exposed_s(rs_call_s, bwd_s, slow));
      bwd_s = own_bwd_s;
      const bool kept = kept_for_backward(later);
      later += elems;
      if (!gathered_module(m)) continue;
      const double bytes = module_gather_bytes(lc, m);
      const double fill_s = cal_.fsdp_gather_zero_fill ? bytes / ctx_.hbm_bw_bytes_per_s : 0.0;
      const double gather = all_gather_s(net_, g_.fsdp, bytes) + host_s + fill_s;
      z.fwd_s += gather;
      if (!kept) z.bwd_s += gather;
    }
    z.recompute_s = l_.recompute == models::Recompute::kFull ? z.fwd_s : 0.0;
    return z;
  }

  // KV traffic of one attention op in the forward pass.
  double cp_kv_s(const OpEntry& e) const {
    const double kv_bytes = s_.tokens_mb * e.kv_heads * (e.qk_head_dim + e.head_dim) * 2.0 / static_cast<double>(l_.tp);
    const bool cross = g_.cp.domains > 1;
    if (l_.cp_kind == CpKind::kAllGatherKv) return all_gather_s(net_, g_.cp, kv_bytes * static_cast<double>(l_.cp));
    const double chunk = static_cast<double>(s_.seq) / static_cast<double>(l_.cp);
    double steps = static_cast<double>(l_.cp - 1);
    if (e.window > 0) steps = std::min(steps, std::ceil(static_cast<double>(e.window) / chunk));
    return steps * send_recv_s(net_, cross, kv_bytes);
  }

  // The calls behind a class's communication times (k), with their bytes per tier.
  LayerCollectives collectives(const LayerClass& lc, const ClassCost& k) const {
    LayerCollectives c;
    const double tp = static_cast<double>(l_.tp);
    Traffic gather, rs;
    if (s_.shard_ranks > 1) {
      gather += all_gather_traffic(net_, g_.fsdp, dense_gather_bytes(lc));
      rs += reduce_scatter_traffic(net_, g_.fsdp, lc.dense_params / tp * s_.grad_bytes);
    }
    if (s_.expert_zero > 1.0) {
      const double local = lc.expert_params / static_cast<double>(l_.ep * l_.expert_tp());
      gather += all_gather_traffic(net_, g_.ezero, local * 2.0);
      rs += reduce_scatter_traffic(net_, g_.ezero, local * s_.grad_bytes);
    }
    c.fsdp_gather = comm_cost(k.fsdp_gather_s, gather);
    c.grad_reduce_scatter = comm_cost(k.grad_rs_s, rs);
    if (lc.moe && (l_.ep > 1 || etp_gathers())) {
      Traffic dispatch, combine;
      if (l_.ep > 1) {
        const double bytes = ep_bytes();
        if (l_.ep_dispatcher == EpDispatcher::kFlex) {
          dispatch = all_to_all_tiers_traffic(net_, g_.ep, ep_tiers(bytes), ep_link_eff(cal_, l_, true));
          combine = all_to_all_tiers_traffic(net_, g_.ep, ep_tiers(bytes), ep_link_eff(cal_, l_, false));
        } else {
          dispatch = all_to_all_traffic(net_, g_.ep, bytes, ep_link_eff(cal_, l_, true));
          combine = all_to_all_traffic(net_, g_.ep, bytes, ep_link_eff(cal_, l_, false));
        }
      }
      if (etp_gathers()) {
        dispatch += all_gather_traffic(net_, g_.etp, etp_gathered_bytes());
        combine += reduce_scatter_traffic(net_, g_.etp, etp_gathered_bytes());
      }
      c.ep_dispatch = comm_cost(k.ep_dispatch_s, dispatch);
      c.ep_combine = comm_cost(k.ep_combine_s, combine);
    }
    if (l_.tp > 1) {
      const double act = s_.tokens_mb * static_cast<double>(t_.d_model) * 2.0;
      Traffic t = all_gather_traffic(net_, g_.tp, act);
      t += reduce_scatter_traffic(net_, g_.tp, act);
      t += t;
      c.tp = comm_cost(k.tp_pass_s, t);
      c.tp_fwd_exposed_s = k.tp_fwd_s;
      c.tp_bwd_exposed_s = k.tp_bwd_s;
      c.tp_replay_exposed_s = k.tp_recompute_s;
      if (l_.torchtitan_op_sac) {
        // The attention and MLP input gathers again (tp_recompute_s), on the same convention as c.tp.
        Traffic ag = all_gather_traffic(net_, g_.tp, act);
        ag += ag;
        c.tp_replay = comm_cost(2.0 * all_gather_s(net_, g_.tp, act), ag);
      }
    }
    if (l_.cp > 1) c.cp = comm_cost(k.cp_pass_s, cp_traffic(lc));
    const GradSyncGroups gs = grad_sync_groups(net_, l_, s_);
    c.grad_sync_dense = all_reduce_cost(gs.dense, lc.dense_params / gs.dense_shard * s_.grad_bytes);
    c.grad_sync_expert = all_reduce_cost(gs.expert, lc.expert_params / gs.expert_shard * s_.grad_bytes);
    return c;
  }

  // The per-step calls: stage-boundary sends, the edge and replicated gradient
  // all-reduces, Muon's gather to the matrix owners and redistribution.
  StepCollectives step_collectives() const {
    StepCollectives c;
    if (l_.pp > 1) {
      const double act = pp_send_bytes();
      const bool cross = pp_send_cross();
      c.pp_send = comm_cost(send_recv_s(net_, cross, act), send_recv_traffic(net_, cross, act));
    }
    const GradSyncGroups gs = grad_sync_groups(net_, l_, s_);
    c.edge_grad_sync = all_reduce_cost(gs.dense, s_.edge_params / gs.dense_shard * s_.grad_bytes);
    c.replicated_grad_sync = all_reduce_cost(gs.replicated, s_.replicated_params * s_.grad_bytes);
    Traffic one;
    double t_one = 0;
    for (const MuonCall& m : muon_calls()) {
      one += all_to_all_traffic(net_, m.group, m.bytes);
      t_one += all_to_all_s(net_, m.group, m.bytes);
    }
    c.muon_gather = c.muon_redistribute = comm_cost(t_one, one);
    return c;
  }

  // EP all-to-all bytes per GPU of one call: pooled sends whole pools
  // (sender_cf · A rows), ragged the rows it has; bf16 rows of the expert input width.
  // bf16 under FP8 recipes too: Megatron-Core's dispatchers move the bf16 hidden states
  // and Transformer Engine quantizes after the all-to-all (fused_a2a.py hybrid_ep_dispatch
  // passes scaling_factor None); FP8 dispatch is DeepEP's option, not these recipes'.
  // A folded layout sends its sequence-parallel share (expert_rows_mb / etp: tokens_mb /
  // tp × k), as Megatron's alltoall dispatcher does, and all-gathers the received rows
  // over the expert TP group when etp > 1 (etp_gathered_bytes). An unfolded layout
  // (etp = tp) is priced as before folding existed: one all-to-all of the rows the TP
  // group computes (tokens_mb × k), no separate gather.
  double ep_bytes() const {
    const bool pooled = l_.ep_transport == Transport::pooled;
    const double sent = etp_gathers() ? s_.expert_rows_mb / static_cast<double>(l_.expert_tp()) : s_.expert_rows_mb;
    const double rows = pooled ? l_.sender_cf * sent : sent;
    return rows * static_cast<double>(t_.moe_width) * 2.0;
  }

  // Per-tier bytes of one EP all-to-all call of `bytes` (ep_bytes): spread evenly
  // over the peers by the all-to-all dispatcher, de-duplicated per destination GPU
  // and domain by the flex one (sim/collectives.h flex_dispatch_tiers; its rows are
  // the tokens before the top_k expansion). The combine returns the same rows.
  A2aTiers ep_tiers(double bytes) const {
    if (l_.ep_dispatcher != EpDispatcher::kFlex) return even_a2a_tiers(g_.ep, bytes);
    const double row_bytes = static_cast<double>(t_.moe_width) * 2.0;
    const double tokens = bytes / row_bytes / static_cast<double>(std::max<int64_t>(1, t_.top_k));
    return flex_dispatch_tiers(g_.ep, tokens, t_.experts, t_.top_k, row_bytes);
  }

  // Folded with etp > 1: the rows each GPU's experts compute are gathered over the
  // expert TP group after the all-to-all, and the combine reduce-scatters them back
  // (Megatron-Core's MoEAlltoAllTokenDispatcher over its tp group = the expert TP group).
  bool etp_gathers() const { return l_.folded() && l_.expert_tp() > 1; }
  double etp_gathered_bytes() const { return s_.expert_rows_mb * static_cast<double>(t_.moe_width) * 2.0; }

  // One micro-batch of activations in bf16 across a stage boundary.
  double pp_send_bytes() const { return s_.tokens_mb * static_cast<double>(t_.d_model) * 2.0 / static_cast<double>(l_.tp); }
  bool pp_send_cross() const { return l_.data * l_.tp * l_.cp >= net_.gpus_per_domain; }

  // Muon's all-to-alls (each way) that bring the shards of each matrix to its owner.
  struct MuonCall {
    Group group;
    double bytes;
  };
  std::vector<MuonCall> muon_calls() const {
    std::vector<MuonCall> out;
    const int64_t tp = l_.tp, cp = l_.cp;
    if (s_.dense_shard > 1.0) {
      const Group owners = s_.shards_over_cp ? group_of(net_, s_.shard_ranks * tp, 1) : group_of(net_, l_.fsdp * tp, cp);
      out.push_back({owners, s_.muon_dense_local * 2.0});
    }
    if (s_.expert_zero > 1.0) {
      const Group ezero = group_of(net_, static_cast<int64_t>(s_.expert_zero), l_.ep_stride() * l_.ep);
      out.push_back({ezero, s_.muon_expert_local * 2.0});
    }
    return out;
  }

 private:
  CommCost all_reduce_cost(const Group& g, double bytes) const {
    if (g.size <= 1 || bytes <= 0) return {};
    return comm_cost(all_reduce_s(net_, g, bytes), all_reduce_traffic(net_, g, bytes));
  }

  // KV blocks of a class's attention ops passed round the CP ring (or gathered), one forward pass.
  Traffic cp_traffic(const LayerClass& lc) const {
    const double tp = static_cast<double>(l_.tp);
    const bool cross = g_.cp.domains > 1;
    Traffic t;
    for (const OpEntry& e : lc.ops) {
      if (e.kind != OpKind::kAttention) continue;
      const double kv = s_.tokens_mb * e.kv_heads * (e.qk_head_dim + e.head_dim) * 2.0 / tp;
      if (l_.cp_kind == CpKind::kAllGatherKv) {
        t += all_gather_traffic(net_, g_.cp, kv * static_cast<double>(l_.cp));
        continue;
      }
      const double chunk = static_cast<double>(s_.seq) / static_cast<double>(l_.cp);
      double steps = static_cast<double>(l_.cp - 1);
      if (e.window > 0) steps = std::min(steps, std::ceil(static_cast<double>(e.window) / chunk));
      const Traffic one = send_recv_traffic(net_, cross, kv);
      t.nvlink_bytes += steps * one.nvlink_bytes;
      t.nic_bytes += steps * one.nic_bytes;
      t.bw_s += steps * one.bw_s;
    }
    return t;
  }

  const OpTable& t_;
  const topologies::Cluster& c_;
  const Calibration& cal_;
  const Network& net_;
  const Layout& l_;
  LayoutShape s_;
  PriceContext ctx_;
  Groups g_;
  double drop_ = 0;
  const char* drop_source_ = "none";
};

namespace {

// Exposed EP time of one pass (dispatch + combine) given the expert compute it can hide behind.
double ep_exposed(const Layout& l, const Calibration& cal, double comm_s, double expert_s) {
  if (comm_s <= 0) return 0.0;
  if (l.ep_transport == Transport::ragged) return comm_s * (1.0 - std::max(0.0, l.ep_comm_overlap));
  const double w = static_cast<double>(l.waves);
  const double ovl = cal.ep_wave_overlap_eff * std::min(1.0, expert_s / comm_s);
  return comm_s * (1.0 / w + (w - 1.0) / w * (1.0 - ovl));
}

// What the layout's recompute_modules replay of one op in one layer's backward
// (recompute "selective" with modules): the forward of an op a listed module covers; for
// moe_act only the experts' activation, an elementwise pass over the fc1 output
// (2 x width per routed row read, width written). module_recompute: the layer's.
BlockTime op_module_recompute(const OpEntry& e, const Layout& l, const PriceContext& ctx) {
  BlockTime b;
  if (l.recompute != models::Recompute::kSelective || l.recompute_modules == 0) return b;
  const uint32_t act = models::recompute_module_bit(models::RecomputeModule::kMoeAct);
  const uint32_t hit = e.recompute_modules & l.recompute_modules;
  if (hit == 0) return b;
  OpEntry replay = e;
  if (hit == act) {
    replay = OpEntry{};
    replay.kind = e.kind;
    replay.cls = OpClass::kElementwise;
    replay.in_elems = 2.0 * e.rows_per_token * e.gemm_n;
    replay.out_elems = e.rows_per_token * e.gemm_n;
    // A clamped SwiGLU replays its clamps too (the stack's bytes per fc1 element, as 2-byte reads).
    if (e.swiglu_limit > 0) replay.in_elems += ctx.cal->expert_clamp_fwd_bytes / 2.0 * 2.0 * e.rows_per_token * e.gemm_n;
    replay.ew_flops_per_token = e.ew_flops_per_token;
  }
  const OpTime t = price_op(replay, ctx);
  b.fwd_s += t.fwd_s;
  b.fwd_flops += t.fwd_flops;
  // layernorm and moe_act run under Megatron-Core's CheckpointWithoutOutput
  // (transformer_layer.py, moe/experts.py): the forward frees the module's output
  // (discard_output_and_register_recompute) and the recompute hook copies the
  // recomputed output back into that storage, untyped_storage().copy_ in _recompute
  // (megatron/core/tensor_parallel/random.py, core_v0.15.0 and core_v0.16.0), for the
  // autograd nodes that saved it: a read and a write of the output.
  const uint32_t discards = act | models::recompute_module_bit(models::RecomputeModule::kLayernorm);
  if (ctx.cal->recompute_restores_output && (hit & discards) != 0) {
    OpEntry copy{};
    copy.kind = e.kind;
    copy.cls = OpClass::kElementwise;
    copy.in_elems = replay.out_elems;
    copy.out_elems = replay.out_elems;
    b.fwd_s += price_op(copy, ctx).fwd_s;
  }
  return b;
}

BlockTime module_recompute(const LayerClass& c, const Layout& l, const PriceContext& ctx) {
  BlockTime b;
  for (const OpEntry& e : c.ops) {
    const BlockTime t = op_module_recompute(e, l, ctx);
    b.fwd_s += t.fwd_s;
    b.fwd_flops += t.fwd_flops;
  }
  return b;
}

// Whether the layout's recompute replays the MoE layer's dispatch and combine.
bool replays_ep(const Layout& l) {
  return l.recompute == models::Recompute::kFull ||
         (l.recompute == models::Recompute::kSelective &&
          (l.recompute_modules & models::recompute_module_bit(models::RecomputeModule::kMoe)));
}

// Exposed EP time of one layer under Megatron-Core's merged 1F1B EP overlap
// (Layout::ep_a2a_overlap). The forward of one micro-batch and the backward of another
// run as one merged step, layer by layer, all-to-alls on a communication stream
// (Megatron-Core models/common/model_chunk_schedule_plan.py,
// TransformerLayerSchedulePlan.run), in four phases, each exposed only by what its
// all-to-all outlasts the compute beside it:
//   backward combine      beside the forward's attention block (all but the experts)
//   forward dispatch      beside the backward's expert data-gradient GEMMs
//   backward dispatch     beside the expert weight-gradient and the forward's expert GEMMs
//   forward combine       beside the backward's attention block
// The expert GEMMs' backward is taken as twice their forward (data and weight
// gradients), as ep_exposed does. Steps without a partner are the first stage's
// warm-up forwards and the matching cool-down backwards (Megatron's interleaved
// schedule: 2(p-1) + (v-1)p warm-up chunks of m·v, plus the one extra warm-up forward
// pipeline_parallel/schedules.py adds when this overlap is on; 1F1B: p-1 (+1) of m; no
// pipeline: the first forward of the m), exposed whole, as is a full-recompute replay's.
//
// The all-to-all's kernels hold comm_sms of the GPU's sms SMs while they run, so the
// compute beside them runs at (sms - comm_sms) / sms of its speed until the call ends.
double ep_exposed_merged_1f1b(const Layout& l, double micro_batches, double dispatch_s, double combine_s,
                              const BlockTime& bt, bool full, double sms, double comm_sms) {
  const double pass_s = dispatch_s + combine_s;
  if (pass_s <= 0) return 0.0;
  const double slow = sm_share_stretch(sms, comm_sms);
  // One phase: the call (comm_s) beside compute_s; what the pair takes beyond compute_s.
  const auto phase = [slow](double comm_s, double compute_s) {
    return beside_compute_exposed_s(comm_s, compute_s, slow);
  };
  const double expert_f = bt.expert_fwd_s;
  const double attn_f = std::max(0.0, bt.fwd_s - expert_f), attn_b = std::max(0.0, bt.bwd_s - 2.0 * expert_f);
  const double merged = phase(combine_s, attn_f) + phase(dispatch_s, expert_f) + phase(dispatch_s, 2.0 * expert_f) +
                        phase(combine_s, attn_b);
  const double p = static_cast<double>(l.pp);
  const bool interleaved = l.pp > 1 && l.schedule == PpSchedule::kInterleaved1F1B;
  const double v = interleaved ? static_cast<double>(l.pp_virtual) : 1.0;
  const double chunks = std::max(1.0, micro_batches * v);
  const double warmup =
      std::min(chunks, l.pp <= 1 ? 1.0 : (interleaved ? 2.0 * (p - 1.0) + (v - 1.0) * p : p - 1.0) + 1.0);
  const double merged_share = (chunks - warmup) / chunks;
  return merged_share * merged + (1.0 - merged_share) * 2.0 * pass_s + (full ? pass_s : 0.0);
}

// Device time the host's kernel issue adds to `gpu_s` of device work issued in
// `host_s` when the host can queue ahead over all of it: it paces the device only when
// slower than all of it. Without syncs that is the whole pass (summed by the caller);
// a MoE layer's backward (no sync) alike. A forward with a sync is synced_forward_s.
double host_issue_wait(double host_s, double gpu_s) { return std::max(0.0, host_s - gpu_s); }

// Where an op syncs the host inside it (sim/cost.h expert_activation_syncs): its
// forward, at the activation, where the host issues it (`fwd_host_s` > 0: not captured
// in a CUDA graph); its backward, before the op's own, where the layout recomputes
// moe_act (the hook on fc2's output replays the activation, sync included).
struct OpSync {
  bool fwd = false, bwd = false;
};
OpSync op_host_sync(const OpEntry& e, const Layout& l, const Calibration& cal, double fwd_host_s) {
  OpSync x;
  if (fwd_host_s <= 0 || !expert_activation_syncs(e, cal)) return x;
  x.fwd = true;
  x.bwd = l.recompute == models::Recompute::kSelective &&
          (e.recompute_modules & l.recompute_modules & models::recompute_module_bit(models::RecomputeModule::kMoeAct)) != 0;
  return x;
}

// One op as the host issues it to the device (in_order_issue_s), and whether the host
// waits for the device to drain before issuing it (a device-to-host sync just before it).
struct IssuedOp {
  double host_s = 0, device_s = 0;
  bool sync_before = false;
};

// Wall time of a cycle of issued ops that holds at least one sync: from each sync the
// host and the device start idle, and the ops up to the next sync run in order
// (sim/cost.h in_order_issue_s); the cycle wraps (the next layer's ops after the last).
// `cycle` without a sync: max(host, device), the host running ahead.
double synced_cycle_s(const std::vector<IssuedOp>& cycle) {
  size_t first = cycle.size();
  for (size_t i = 0; i < cycle.size() && first == cycle.size(); ++i) {
    if (cycle[i].sync_before) first = i;
  }
  double host_s = 0, device_s = 0;
  for (const IssuedOp& o : cycle) {
    host_s += o.host_s;
    device_s += o.device_s;
  }
  if (first == cycle.size()) return std::max(host_s, device_s);
  double wall_s = 0;
  std::vector<double> seg_host, seg_device;  // (ops up to the next sync)
  for (size_t i = 0; i <= cycle.size(); ++i) {
    const size_t j = (first + i) % cycle.size();
    if (i == cycle.size() || (i > 0 && cycle[j].sync_before)) {
      wall_s += in_order_issue_s(seg_host, seg_device);
      seg_host.clear();
      seg_device.clear();
      if (i == cycle.size()) break;
    }
    seg_host.push_back(cycle[j].host_s);
    seg_device.push_back(cycle[j].device_s);
  }
  return wall_s;
}

// One forward pass of a MoE layer whose host syncs with the device (the dropless
// dispatcher reads its token counts before the dispatch, `dispatcher_syncs`; the
// experts' quick-GEGLU copies its offset to the device after fc1, sim/cost.h
// expert_activation_syncs), priced by synced_cycle_s around the layer's cycle, the
// experts op split at a syncing activation (expert_activation_split). Per op: the host
// time layer_host_issue charges it, and its priced device time; the forward's exposed
// EP time (`ep_fwd_s`) sits on the dispatch and combine ops (the all-to-alls run on the
// device between them), the rest of its exposed communication (gpu_f - fwd_s -
// ep_fwd_s) spread over the ops in proportion to their device time.
double synced_forward_s(const LayerClass& lc, const PriceContext& ctx, const LayerHostIssue& host, const ClassCost& k,
                        double fwd_s, double gpu_f, double ep_fwd_s, bool dispatcher_syncs) {
  using models::OpKind;
  const double other_scale = fwd_s > 0 ? 1.0 + std::max(0.0, gpu_f - fwd_s - ep_fwd_s) / fwd_s : 1.0;
  const double ep_calls_s = k.ep_dispatch_s + k.ep_combine_s;
  if (host.op_fwd_s.empty()) return std::max(host.fwd_s, gpu_f);  // nothing issued by the host
  std::vector<IssuedOp> cycle;  // the layer's ops in order, a syncing experts op in two
  cycle.reserve(lc.ops.size() + 1);
  for (size_t j = 0; j < lc.ops.size(); ++j) {
    const OpEntry& e = lc.ops[j];
    double dev_s = price_op(e, ctx).fwd_s * other_scale;
    if (ep_calls_s > 0 && e.kind == OpKind::kDispatch) dev_s += ep_fwd_s * k.ep_dispatch_s / ep_calls_s;
    if (ep_calls_s > 0 && e.kind == OpKind::kCombine) dev_s += ep_fwd_s * k.ep_combine_s / ep_calls_s;
    const double host_s = host.op_fwd_s[j];
    if (host_s > 0 && expert_activation_syncs(e, *ctx.cal)) {
      const ExpertActivationSplit x = expert_activation_split(e, ctx);
      cycle.push_back({.host_s = host_s * x.host_before_share, .device_s = x.device_before_s * other_scale});
      cycle.push_back({.host_s = host_s * (1.0 - x.host_before_share),
                       .device_s = dev_s - x.device_before_s * other_scale,
                       .sync_before = true});
      continue;
    }
    cycle.push_back({.host_s = host_s, .device_s = dev_s, .sync_before = dispatcher_syncs && e.kind == OpKind::kDispatch});
  }
  return synced_cycle_s(cycle);
}

// One backward pass of a MoE layer whose experts' activation syncs the host and is
// recomputed (moe_act): Megatron-Core's CheckpointWithoutOutput replays the activation
// from a hook on fc2's output, before fc2's backward, so the host stops once per layer
// backward there. The layer's ops in reverse from its experts op (each op's backward
// and its module recompute, `rec` of them in all, on the device; its backward host issue),
// the exposed communication of the pass (gpu_b - bwd_s - rec) spread over them in
// proportion to their device time, through synced_cycle_s. The experts op's whole
// backward counts after the sync [A: what its autograd runs before the hook, the output
// bias's gradient and the replayed clamps, is a small part of it].
double synced_backward_s(const LayerClass& lc, const Layout& l, const PriceContext& ctx, const LayerHostIssue& host,
                         double gpu_b) {
  if (host.op_bwd_s.empty()) return std::max(host.bwd_s, gpu_b);  // nothing issued by the host
  std::vector<IssuedOp> cycle;  // (lc.ops.size()), in backward order
  cycle.reserve(lc.ops.size());
  double device_s = 0;
  for (size_t i = lc.ops.size(); i-- > 0;) {
    const OpEntry& e = lc.ops[i];
    const double dev_s = price_op(e, ctx).bwd_s + op_module_recompute(e, l, ctx).fwd_s;
    device_s += dev_s;
    cycle.push_back({.host_s = host.op_bwd_s[i],
                     .device_s = dev_s,
                     .sync_before = op_host_sync(e, l, *ctx.cal, host.op_fwd_s[i]).bwd});
  }
  const double scale = device_s > 0 ? gpu_b / device_s : 1.0;
  for (IssuedOp& o : cycle) o.device_s *= scale;
  return synced_cycle_s(cycle);
}

double pipeline_bubble(const Layout& l, double f, double b) {
  if (l.pp <= 1) return 0.0;
  const double p = static_cast<double>(l.pp);
  switch (l.schedule) {
    case PpSchedule::k1F1B: return (p - 1.0) * (f + b);
    case PpSchedule::kInterleaved1F1B: return (p - 1.0) * (f + b) / static_cast<double>(l.pp_virtual);
    case PpSchedule::kZeroBubble: return (p - 1.0) * (f + b) / 3.0;  // ZB-H1 (Qi et al. 2024)
    case PpSchedule::kDualPipeV: return std::max(0.0, p / 2.0 - 1.0) * (f + 0.5 * b);  // DeepSeek-V3 report
  }
  return (p - 1.0) * (f + b);
}

}  // namespace

Predictor::Predictor(const models::LayerGraph& g, const topologies::Cluster& c, const Calibration& cal)
    : graph_(g), cluster_(c), cal_(cal), table_(build_op_table(g)), net_(make_network(c, cal)) {
  // Host offloads divide by it (topologies/topology.cpp reads it as a positive, sourced number).
  RS_CHECK(net_.h2d_bw_bytes_per_s > 0, "a cluster without a host-to-device bandwidth");
  const std::string& gpu = c.system.gpu.name;
  if (!cal.gemm_peak_eff.contains(gpu)) {
    warnings_.push_back("no GEMM calibration for GPU '" + gpu + "' in " + cal.file +
                        ": priced at gemm.default_peak_efficiency " + std::to_string(cal.gemm_peak_eff_default) +
                        " (an assumption); add a measured entry to gemm.peak_efficiency");
  } else if (!cal.gemm_sustained_ratio.contains(gpu)) {
    warnings_.push_back("no sustained-load share for GPU '" + gpu + "' in " + cal.file +
                        " gemm.sustained_ratio: its GEMMs are priced at the burst rate of gemm.peak_efficiency, an "
                        "upper bound over a step's seconds of tensor-core load");
  }
}

void Predictor::add_memory_issues(Prediction& p) const {
  if (!p.memory.fits_device) {
    p.issues.push_back({Reason::kDeviceMemory, "needs " + std::to_string(p.memory.device_total / (1u << 30)) +
                                                   " GiB per GPU, HBM holds " +
                                                   std::to_string(p.memory.device_capacity / (1u << 30)) + " GiB"});
  }
  if (!p.memory.fits_host) {
    p.issues.push_back({Reason::kHostMemory, "needs " + std::to_string(p.memory.host_total / (1u << 30)) +
                                                 " GiB of host memory per GPU, has " +
                                                 std::to_string(p.memory.host_capacity / (1u << 30)) + " GiB"});
  }
}

Prediction Predictor::predict_fast(const Layout& l, Reason* reason) const {
  if (first_issue(l, graph_, cluster_, reason)) return Prediction{};
  const StepModel sm(table_, cluster_, cal_, net_, l);
  Prediction p = run(sm, sm.class_costs());
  if (!p.memory.fits_device) {
    *reason = Reason::kDeviceMemory;
    p.valid = false;
  } else if (!p.memory.fits_host) {
    *reason = Reason::kHostMemory;
    p.valid = false;
  }
  return p;
}

Prediction Predictor::run(const StepModel& sm, const std::vector<ClassCost>& costs) const {
  const Layout& l = sm.layout();
  const LayoutShape& s = sm.shape();
  const PriceContext& ctx = sm.ctx();
  const double pp = static_cast<double>(l.pp);
  const bool full = l.recompute == models::Recompute::kFull;
  const bool selective = l.recompute == models::Recompute::kSelective;

  // One micro-batch on the most loaded stage.
  double f = 0, r = 0, b = 0;                      // compute
  double ep = 0, fsdp = 0, tpc = 0, cpc = 0, off = 0;  // exposed communication
  double hw_flops = 0;
  // Host issue (eager trainers): the wait behind MoE syncs, and the sync-free work's
  // host and device time per pass (a host slower than a whole pass paces it).
  double host_wait = 0, free_host_f = 0, free_host_b = 0, free_gpu_f = 0, free_gpu_b = 0;
  // Backward wall time of one layer of each class (recompute + backward + the
  // exposed communication that falls in them): the schedule gradient buckets
  // are released on.
  std::vector<double> bwd_wall(table_.classes.size(), 0.0);
  for (size_t ci = 0; ci < table_.classes.size(); ++ci) {
    const LayerClass& lc = table_.classes[ci];
    const ClassCost& k = costs[ci];
    const double n = static_cast<double>(lc.count) / pp * s.stage_scale;
    const BlockTime& bt = k.compute;
    const BlockTime modules = module_recompute(lc, l, ctx);
    const bool by_modules = selective && l.recompute_modules != 0;
    const double rec = full ? bt.fwd_s : by_modules ? modules.fwd_s : selective ? bt.recompute_selective_s : 0.0;
    const double rec_flops = full         ? bt.fwd_flops
                             : by_modules ? modules.fwd_flops
                             : selective  ? bt.recompute_selective_flops
                                          : 0.0;
    // The trainer's copies of gathered weights and gradients run on the device beside the passes' kernels.
    const double fwd_s = bt.fwd_s + k.fsdp_copy_fwd_s, bwd_s = bt.bwd_s + k.fsdp_copy_bwd_s;
    f += n * fwd_s;
    r += n * rec;
    b += n * bwd_s;
    hw_flops += n * (bt.fwd_flops + bt.bwd_flops + rec_flops);
    // EP: forward, the full-recompute replay, and backward (grads of combine and dispatch).
    const double pass = k.ep_dispatch_s + k.ep_combine_s;
    const double ep_sms = l.ep_dispatcher == EpDispatcher::kFlex ? cal_.ep_flex_sms : cal_.ep_all_to_all_sms;
    const double ep_layer = l.ep_a2a_overlap
                                ? ep_exposed_merged_1f1b(l, s.micro_batches, k.ep_dispatch_s, k.ep_combine_s, bt, replays_ep(l),
                                                         static_cast<double>(cluster_.system.gpu.sms), ep_sms)
                                : ep_exposed(l, cal_, pass, bt.expert_fwd_s) * (replays_ep(l) ? 2.0 : 1.0) +
                                      ep_exposed(l, cal_, pass, 2.0 * bt.expert_fwd_s);
    // FSDP: gather for fwd and for bwd (the recompute reuses it), reduce-scatter in bwd.
    // Kept gathered weights: one gather per step, in the first micro-batch's forward
    // (spread over the step's micro-batches here).
    // A prefetch bounded to fsdp_prefetch_bucket_params hides that share of the
    // layer's largest module gather at most.
    double ovl_fsdp = cal_.fsdp_prefetch_overlap;
    if (cal_.fsdp_prefetch_bucket_params > 0) {
      double largest = 0.0;
      for (const FsdpModule& m : fsdp_modules(lc, cal_)) largest = std::max(largest, m.param_elems / static_cast<double>(l.tp));
      if (largest > 0) ovl_fsdp *= std::min(1.0, cal_.fsdp_prefetch_bucket_params / largest);
    }
    // A trainer that releases weights after every forward gathers again for the
    // recompute and once more for the backward (cal.fsdp_regather_for_recompute).
    const bool deepspeed = cal_.fsdp_max_live_params > 0 && s.gathers_per_layer && s.shard_ranks > 1 &&
                           l.zero_stage >= 3 && (table_.experts == 0 || s.expert_zero <= 1.0);
    const bool regather = cal_.fsdp_regather_for_recompute && full;
    // Each gather and reduce-scatter holds fsdp_collective_sms SMs while it runs beside
    // the compute it hides behind (sm_share_stretch).
    const double fsdp_slow = sm_share_stretch(static_cast<double>(cluster_.system.gpu.sms), cal_.fsdp_collective_sms);
    const auto beside = [fsdp_slow](double comm_s, double compute_s) {
      return beside_compute_exposed_s(comm_s, compute_s, fsdp_slow);
    };
    const double bwd_gathers =
        regather ? beside(k.fsdp_gather_s, ovl_fsdp * rec) + beside(k.fsdp_bwd_gather_s, ovl_fsdp * bt.bwd_s)
                 : beside(k.fsdp_gather_s, ovl_fsdp * (bt.bwd_s + rec));
    StepModel::Zero3Exposed z3;
    if (deepspeed) z3 = sm.deepspeed_zero3_exposed(lc);
    const double fsdp_layer =
        deepspeed ? z3.fwd_s + z3.recompute_s + z3.bwd_s
        : s.gathers_per_layer
            ? beside(k.fsdp_gather_s, ovl_fsdp * bt.fwd_s) + bwd_gathers + beside(k.grad_rs_s, ovl_fsdp * bt.bwd_s)
            : beside(k.fsdp_gather_s, ovl_fsdp * bt.fwd_s) / std::max(1.0, s.micro_batches);
    const double tp_layer = k.tp_fwd_s * (full ? 2.0 : 1.0) + k.tp_bwd_s + k.tp_recompute_s;
    const double cp_layer = std::max(0.0, k.cp_pass_s - cal_.cp_ring_overlap * k.attention_fwd_s) * (full ? 2.0 : 1.0) +
                            std::max(0.0, 2.0 * k.cp_pass_s - cal_.cp_ring_overlap * k.attention_bwd_s);
    const double off_layer = std::max(0.0, k.carry_xfer_s - bt.fwd_s) + std::max(0.0, k.carry_xfer_s - bt.bwd_s - rec);
    const double comm_layer = ep_layer + fsdp_layer + tp_layer + cp_layer + off_layer;
    const double busy = fwd_s + rec + bwd_s;
    bwd_wall[ci] = rec + bwd_s + (busy > 0 ? comm_layer * (rec + bwd_s) / busy : 0.0);
    // The device's time per pass of this layer, its exposed communication included.
    const double gpu_f = fwd_s + (busy > 0 ? comm_layer * fwd_s / busy : 0.0);
    const double gpu_b = bwd_wall[ci];
    // The layer's host issue under the layout's CUDA graphs (sim/cost.h layer_host_issue).
    const LayerHostIssue host = layer_host_issue(lc, ctx, l.cuda_graphs);
    const double host_b = host.bwd_s + (full ? host.fwd_s : 0.0);
    // Only a dropless (ragged) dispatcher reads its token counts on the host; fixed-capacity
    // experts have static shapes (Megatron-Core's drop-and-pad path returns before any sync point).
    const bool dispatcher_syncs = lc.moe && cal_.moe_host_syncs_per_layer > 0 && l.ep_transport != Transport::pooled;
    OpSync op_syncs;  // any op's (the experts' activation)
    for (size_t j = 0; j < lc.ops.size() && !host.op_fwd_s.empty(); ++j) {
      const OpSync x = op_host_sync(lc.ops[j], l, cal_, host.op_fwd_s[j]);
      op_syncs.fwd = op_syncs.fwd || x.fwd;
      op_syncs.bwd = op_syncs.bwd || x.bwd;
    }
    if (dispatcher_syncs || op_syncs.fwd) {
      // The forward (and a full recompute's replay, which runs the dispatcher again) is
      // issued in order from each sync: the device idles while the host issues the ops
      // after it, so a pass is the in-order recursion over the layer's cycle, not
      // max(host, device). The backward reuses the forward's splits: its host runs ahead
      // and paces it only when slower than all of it, unless it replays a syncing activation.
      const double sync_pass_s = synced_forward_s(lc, ctx, host, k, bt.fwd_s, gpu_f,
                                                  busy > 0 ? ep_layer * bt.fwd_s / busy : 0.0, dispatcher_syncs);
      const double fwd_wait = std::max(0.0, sync_pass_s - gpu_f);
      const double rec_wall = full && busy > 0 ? rec + comm_layer * rec / busy : 0.0;
      const double bwd_wait = op_syncs.bwd ? std::max(0.0, synced_backward_s(lc, l, ctx, host, gpu_b) - gpu_b)
                                             : host_issue_wait(host.bwd_s, gpu_b - rec_wall);
      host_wait += n * ((full ? 2.0 : 1.0) * fwd_wait + bwd_wait);
    } else {
      free_host_f += n * host.fwd_s;
      free_host_b += n * host_b;
      free_gpu_f += n * gpu_f;
      free_gpu_b += n * gpu_b;
    }
    ep += n * ep_layer;
    fsdp += n * fsdp_layer;
    tpc += n * tp_layer;
    cpc += n * cp_layer;
    off += n * off_layer;
  }
  // Embedding on the first stage, the head on the last: the slower bounds the pipeline.
  const BlockTime pre = price_ops(table_.pre, ctx);
  const BlockTime head = price_ops(table_.head, ctx);
  if (l.pp > 1) {
    const BlockTime& edge = head.fwd_s + head.bwd_s > pre.fwd_s + pre.bwd_s ? head : pre;
    const double layers = s.layers_per_stage;
    if (l.edges_in_pipeline_split && layers > 1.0) {
      // The sums above are a middle stage's (sim/memory.cpp split_chunk_layers). The
      // embedding and the loss each take a layer's slot (Megatron-Core's
      // account_for_embedding/loss_in_pipeline_split): an edge stage runs one layer
      // fewer beside its edge, and bounds the pipeline only when the edge outweighs
      // that layer (its compute and exposed communication, host issue included).
      const double layer_s = (f + r + b + ep + fsdp + tpc + cpc + off + host_wait +
                              host_issue_wait(free_host_f, free_gpu_f) + host_issue_wait(free_host_b, free_gpu_b)) /
                             layers;
      if (edge.fwd_s + edge.bwd_s > layer_s) {
        const double keep = (layers - 1.0) / layers;
        for (double* x : {&f, &r, &b, &ep, &fsdp, &tpc, &cpc, &off, &hw_flops, &host_wait, &free_host_f, &free_host_b,
                          &free_gpu_f, &free_gpu_b}) {
          *x *= keep;
        }
        f += edge.fwd_s;
        b += edge.bwd_s;
        hw_flops += edge.fwd_flops + edge.bwd_flops;
      }
    } else {
      f += edge.fwd_s;
      b += edge.bwd_s;
      hw_flops += edge.fwd_flops + edge.bwd_flops;
    }
  } else {
    f += pre.fwd_s + head.fwd_s;
    b += pre.bwd_s + head.bwd_s;
    hw_flops += pre.fwd_flops + pre.bwd_flops + head.fwd_flops + head.bwd_flops;
  }

  host_wait += host_issue_wait(free_host_f, free_gpu_f) + host_issue_wait(free_host_b, free_gpu_b);

  const double m = s.micro_batches;
  Prediction p;
  p.valid = true;
  p.micro_batches = m;
  p.tokens_per_step = s.tokens_per_step;
  p.drop_fraction = sm.drop();
  p.drop_source = sm.drop_source();
  StepBreakdown& bd = p.breakdown;
  bd.compute_fwd_s = m * f;
  bd.compute_recompute_s = m * r;
  bd.compute_bwd_s = m * b;
  bd.ep_comm_s = m * ep;
  bd.fsdp_comm_s = m * fsdp;
  bd.tp_comm_s = m * tpc;
  bd.cp_comm_s = m * cpc;
  bd.offload_s = m * off;
  bd.host_issue_s = m * host_wait;
  const double mb_fwd = f + (ep + fsdp + tpc + cpc + off + host_wait) * 0.5;
  const double mb_bwd = r + b + (ep + fsdp + tpc + cpc + off + host_wait) * 0.5;
  if (l.pp > 1) {
    bd.pp_bubble_s = pipeline_bubble(l, mb_fwd, mb_bwd) +
                     2.0 * (pp - 1.0) * send_recv_s(net_, sm.pp_send_cross(), sm.pp_send_bytes());
  }

  bd.grad_sync_s = exposed_grad_sync(table_, net_, cal_, l, s, bwd_wall);

  // Optimizer. Device update: Adam reads p, g, m, v and writes p, m, v (fp32); Muon
  // reads p, g, momentum and writes p, momentum. States on host stream over the link.
  const double hbm = ctx.hbm_bw_bytes_per_s * cal_.mem_eff_optimizer;
  const bool host = l.optimizer_state == StatePlacement::kHost;
  const double muon_local = s.muon_dense_local + s.muon_expert_local;
  const double param_rw = s.master_bytes * 2.0 + s.grad_bytes;
  double dev_bytes = s.adam_local * param_rw + muon_local * param_rw;
  double h2d = 0.0;
  if (host) {
    h2d = s.adam_local * 8.0 + muon_local * 4.0;
  } else {
    dev_bytes += s.adam_local * 16.0 + muon_local * 8.0;
  }
  double opt_compute = dev_bytes / hbm;
  // Newton–Schulz: each GPU orthogonalises its share of whole matrices (dense ones
  // spread over the FSDP group, experts over their owners); never less than the
  // largest single matrix.
  double ns_time[2] = {0, 0}, ns_fl[2] = {0, 0}, ns_max_time[2] = {0, 0}, ns_max_fl[2] = {0, 0};
  for (const auto& lc : table_.classes) {
    const double per_stage = static_cast<double>(lc.count) / pp * s.stage_scale;
    for (const auto& mtx : lc.muon_matrices) {
      const int i = mtx.expert ? 1 : 0;
      const double fl = newton_schulz_flops(mtx.m, mtx.n, table_.ns_steps);
      const double a = std::min(mtx.m, mtx.n), bb = std::max(mtx.m, mtx.n);
      const double one = fl / (ctx.peak_flops_per_s * gemm_efficiency_at(cal_, ctx.gemm_peak_eff, ctx.gemm_shape, a, a, bb));
      ns_time[i] += per_stage * mtx.count * one;
      ns_fl[i] += per_stage * mtx.count * fl;
      if (one > ns_max_time[i]) {
        ns_max_time[i] = one;
        ns_max_fl[i] = fl;
      }
    }
  }
  const double owners[2] = {s.dense_shard, s.expert_shard};
  double ns_s = 0.0, ns_flops = 0.0;
  for (int i = 0; i < 2; ++i) {
    if (ns_time[i] <= 0) continue;
    const bool at_floor = ns_time[i] / owners[i] < ns_max_time[i];
    ns_s += at_floor ? ns_max_time[i] : ns_time[i] / owners[i];
    ns_flops += at_floor ? ns_max_fl[i] : ns_fl[i] / owners[i];
  }
  opt_compute += ns_s;
  // Gather the shards of each matrix to its owner and send the result back.
  double opt_comm = 0.0;
  for (const StepModel::MuonCall& c : sm.muon_calls()) opt_comm += 2.0 * all_to_all_s(net_, c.group, c.bytes);
  const double host_s = (h2d + (1.0 - cal_.host_link_duplex) * h2d) / net_.h2d_bw_bytes_per_s;  // same bytes back (d2h)
  bd.optimizer_compute_s = opt_compute;
  bd.optimizer_comm_s = opt_comm;
  bd.optimizer_host_s = std::max(0.0, host_s - opt_compute);
  hw_flops = m * hw_flops + ns_flops;

  // GC pauses on staggered host processes stall everyone at the next sync point.
  const double procs = static_cast<double>(std::max<int64_t>(1, cluster_.gpus() / cal_.gpus_per_host_process));
  const double p_pause = 1.0 - std::pow(1.0 - 1.0 / cal_.gc_interval_steps, procs);
  // Coordinated: automatic collection off, every rank collects together at the
  // same completed steps, so one pause per interval instead of one per process.
  bd.host_stall_s = l.coordinated_gc ? cal_.gc_pause_s / cal_.coordinated_gc_interval_steps : cal_.gc_pause_s * p_pause;

  p.step_time_s = bd.total();
  p.tokens_per_s = s.tokens_per_step / p.step_time_s;
  p.model_flops_per_token = model_flops_per_token(table_, s.seq);
  const double gpus = static_cast<double>(cluster_.gpus());
  const auto& gpu = cluster_.system.gpu;
  const double mfu_peak = gpu.mfu_peak_flops_per_s > 0 ? gpu.mfu_peak_flops_per_s : gpu.peak_bf16_flops_per_s;
  p.mfu = p.model_flops_per_token * s.tokens_per_step / (p.step_time_s * gpus * mfu_peak);
  p.hardware_flops_per_gpu = hw_flops;
  p.hfu = hw_flops / (p.step_time_s * gpu.peak_bf16_flops_per_s);
  p.memory = estimate_memory(table_, cluster_, l, cal_, s);
  p.warnings = warnings_;
  // FP8 without a measurement on this GPU: dense GEMMs (fp8 linear) want a
  // gemm.fp8_dense_relative_efficiency entry, grouped ones (any fp8 on an MoE) fp8_measured_gpus.
  const auto& measured = cal_.fp8_gemm_measured_gpus;
  bool dense_measured = false;
  fp8_dense_relative_efficiency(cal_, gpu, &dense_measured);
  // A stack running its experts as per-expert dense GEMMs prices FP8 ones with the dense factor.
  const bool experts_dense = table_.experts > 0 && cal_.grouped_per_expert_dense_relative_eff > 0;
  const bool grouped_unmeasured = table_.experts > 0 && !experts_dense &&
                                  std::find(measured.begin(), measured.end(), gpu.name) == measured.end();
  if ((l.fp8 == Fp8Gemms::kLinear || (l.fp8 != Fp8Gemms::kNone && experts_dense)) && !dense_measured) {
    p.warnings.push_back("dense FP8 GEMMs on '" + gpu.name + "' priced at gemm.fp8_relative_efficiency " +
                         std::to_string(cal_.fp8_gemm_relative_eff) + " of " + cal_.file +
                         ", measured on another GPU (an assumption here); add this GPU to gemm.fp8_dense_relative_efficiency with a measurement");
  }
  if (l.fp8 != Fp8Gemms::kNone && grouped_unmeasured) {
    p.warnings.push_back("FP8 grouped GEMMs on '" + gpu.name + "' priced at gemm.fp8_relative_efficiency " +
                         std::to_string(cal_.fp8_gemm_relative_eff) + " of " + cal_.file +
                         ", measured on another GPU (an assumption here); add this GPU to gemm.fp8_measured_gpus with a measurement");
  }
  if (std::string_view(p.drop_source) == "fallback") {
    p.warnings.push_back("sim/drops cannot price these EP dispatch settings: drop fraction " +
                         std::to_string(p.drop_fraction) + " from the drop model's fit target (sim/drop_calibration.json /fit/target_drop)");
  }
  return p;
}

StepPrice Predictor::price(const Layout& l, PriceDetail detail) const {
  StepPrice out;
  out.prediction.issues = check_layout(l, graph_, cluster_);
  const bool full = detail == PriceDetail::kFull;
  if (!full && !out.prediction.issues.empty()) return out;
  const StepModel sm(table_, cluster_, cal_, net_, l);
  const std::vector<ClassCost> costs = sm.class_costs();
  if (out.prediction.issues.empty()) {
    out.prediction = run(sm, costs);
    add_memory_issues(out.prediction);
  }
  if (!full) return out;
  const models::Recompute rc = l.recompute;
  for (size_t i = 0; i < table_.layer_class.size(); ++i) {
    const size_t ci = static_cast<size_t>(table_.layer_class[i]);
    const ClassCost& k = costs[ci];
    LayerTiming t;
    t.layer = static_cast<int32_t>(i);
    t.fwd_s = k.compute.fwd_s + k.fsdp_copy_fwd_s;
    t.bwd_s = k.compute.bwd_s + k.fsdp_copy_bwd_s;
    t.recompute_s = rc == models::Recompute::kFull ? k.compute.fwd_s
                    : rc == models::Recompute::kSelective
                        ? (l.recompute_modules != 0 ? module_recompute(table_.classes[ci], l, sm.ctx()).fwd_s
                                                    : k.compute.recompute_selective_s)
                        : 0.0;
    t.ep_dispatch_s = k.ep_dispatch_s;
    t.ep_combine_s = k.ep_combine_s;
    t.fsdp_gather_s = k.fsdp_gather_s;
    t.grad_reduce_scatter_s = k.grad_rs_s;
    t.tp_comm_s = k.tp_pass_s;
    t.cp_comm_s = k.cp_pass_s;
    out.layers.push_back(t);
  }
  out.ops.resize(graph_.ops.size());
  // Every layer of a class runs the same ops: price them once per class.
  const auto times = [&](const std::vector<OpEntry>& ops) {
    std::vector<OpTime> t;
    t.reserve(ops.size());
    for (const OpEntry& e : ops) t.push_back(price_op(e, sm.ctx()));
    return t;
  };
  std::vector<std::vector<OpTime>> class_times;
  std::vector<LayerHostIssue> class_host;  // host issue per op, as run() charges it
  for (const LayerClass& lc : table_.classes) {
    class_times.push_back(times(lc.ops));
    // Host issue as predict charges it: the layout's CUDA graphs replace captured ops' calls.
    class_host.push_back(layer_host_issue(lc, sm.ctx(), l.cuda_graphs));
  }
  // The embedding's and the head's host issue (none under a full-iteration graph).
  const bool edges_issued = (l.cuda_graphs & cuda_graph_bit(CudaGraphScope::kFullIteration)) == 0;
  const auto edge_host = [&](const std::vector<OpEntry>& ops) {
    LayerHostIssue h;
    if (!edges_issued || sm.ctx().op_issue_s <= 0) return h;
    for (const OpEntry& e : ops) {
      h.op_fwd_s.push_back(op_host_issue_s(e, sm.ctx()));
      h.op_bwd_s.push_back(2.0 * h.op_fwd_s.back());
    }
    return h;
  };
  const auto fill = [&](const std::vector<OpEntry>& ops, const std::vector<OpTime>& op_times, const LayerHostIssue& host,
                        size_t first, int32_t layer, const ClassCost* k) {
    for (size_t j = 0; j < ops.size(); ++j) {
      const OpTime& t = op_times[j];
      OpTiming& o = out.ops[first + j];
      o.graph_index = first + j;
      o.layer = layer;
      o.fwd_s = t.fwd_s;
      o.bwd_s = t.bwd_s;
      o.fwd_flops = t.fwd_flops;
      o.bwd_flops = t.bwd_flops;
      o.fwd_host_s = host.op_fwd_s.empty() ? 0.0 : host.op_fwd_s[j];
      o.bwd_host_s = host.op_bwd_s.empty() ? 0.0 : host.op_bwd_s[j];
      const OpSync sync = op_host_sync(ops[j], l, cal_, o.fwd_host_s);
      if (sync.fwd) {
        const ExpertActivationSplit x = expert_activation_split(ops[j], sm.ctx());
        o.fwd_before_sync_s = x.device_before_s;
        o.fwd_host_before_sync_s = o.fwd_host_s * x.host_before_share;
      }
      o.bwd_after_sync = sync.bwd;
      if (k && ops[j].kind == OpKind::kDispatch) o.comm_s = k->ep_dispatch_s;
      if (k && ops[j].kind == OpKind::kCombine) o.comm_s = k->ep_combine_s;
    }
  };
  fill(table_.pre, times(table_.pre), edge_host(table_.pre), 0, -1, nullptr);
  for (size_t i = 0; i < table_.layer_class.size(); ++i) {
    const size_t ci = static_cast<size_t>(table_.layer_class[i]);
    fill(table_.classes[ci].ops, class_times[ci], class_host[ci], graph_.block_begin[i], static_cast<int32_t>(i), &costs[ci]);
  }
  fill(table_.head, times(table_.head), edge_host(table_.head), graph_.head_begin, -1, nullptr);
  std::vector<LayerCollectives> per_class;
  for (size_t ci = 0; ci < table_.classes.size(); ++ci) per_class.push_back(sm.collectives(table_.classes[ci], costs[ci]));
  for (int32_t ci : table_.layer_class) out.collectives.push_back(per_class[static_cast<size_t>(ci)]);
  out.step_collectives = sm.step_collectives();
  return out;
}

Prediction predict(const models::LayerGraph& g, const topologies::Cluster& c, const Layout& l, const Calibration& cal) {
  return Predictor(g, c, cal).predict(l);
}

nlohmann::json prediction_to_json(const Prediction& p) {
  nlohmann::json j;
  j["valid"] = p.valid && p.issues.empty();
  nlohmann::json issues = nlohmann::json::array();
  for (const auto& i : p.issues) issues.push_back({{"reason", to_string(i.reason)}, {"detail", i.detail}});
  j["issues"] = issues;
  if (!p.valid) return j;
  j["step_time_s"] = p.step_time_s;
  j["tokens_per_s"] = p.tokens_per_s;
  j["tokens_per_step"] = p.tokens_per_step;
  j["mfu_marin"] = p.mfu;
  j["hfu"] = p.hfu;
  j["model_flops_per_token"] = p.model_flops_per_token;
  j["hardware_flops_per_gpu"] = p.hardware_flops_per_gpu;
  j["micro_batches"] = p.micro_batches;
  j["ep_drop_fraction"] = p.drop_fraction;
  j["ep_drop_source"] = p.drop_source;
  nlohmann::json bd;
  for (const auto& [name, v] : p.breakdown.lines()) bd[name] = v;
  j["breakdown_s"] = bd;
  nlohmann::json mem;
  for (const auto& [name, v] : p.memory.lines()) mem[name] = v;
  mem["device_total"] = p.memory.device_total;
  mem["device_capacity"] = p.memory.device_capacity;
  mem["host_total"] = p.memory.host_total;
  mem["host_capacity"] = p.memory.host_capacity;
  j["memory_bytes"] = mem;
  j["fits_device"] = p.memory.fits_device;
  j["fits_host"] = p.memory.fits_host;
  j["warnings"] = p.warnings;
  return j;
}

std::string format_prediction(const Prediction& p) {
  std::string out;
  char buf[256];
  const auto line = [&](const char* fmt, auto... args) {
    std::snprintf(buf, sizeof buf, fmt, args...);
    out += buf;
  };
  if (!p.valid) {
    out += "invalid layout:\n";
    for (const auto& i : p.issues) line("  %-20s %s\n", to_string(i.reason), i.detail.c_str());
    return out;
  }
  const double gib = 1024.0 * 1024.0 * 1024.0;
  line("step time            %10.3f s\n", p.step_time_s);
  line("throughput           %10.0f tokens/s  (%.0f tokens/step, %.0f micro-batches)\n", p.tokens_per_s,
       p.tokens_per_step, p.micro_batches);
  line("MFU (Marin)          %10.2f %%\n", 100.0 * p.mfu);
  line("HFU (hardware)       %10.2f %%\n", 100.0 * p.hfu);
  if (p.drop_fraction > 0) line("EP drop fraction     %10.2f %%  (%s)\n", 100.0 * p.drop_fraction, p.drop_source);
  out += "breakdown (sums to the step time):\n";
  for (const auto& [name, v] : p.breakdown.lines()) {
    if (v <= 0) continue;
    line("  %-20s %10.3f s  %5.1f %%\n", name.c_str(), v, 100.0 * v / p.step_time_s);
  }
  out += "memory per GPU:\n";
  for (const auto& [name, v] : p.memory.lines()) {
    if (v <= 0) continue;
    line("  %-20s %10.2f GiB\n", name.c_str(), v / gib);
  }
  line("  %-20s %10.2f GiB of %.2f GiB HBM%s\n", "device total", p.memory.device_total / gib,
       p.memory.device_capacity / gib, p.memory.fits_device ? "" : "  DOES NOT FIT");
  line("  %-20s %10.2f GiB of %.2f GiB host%s\n", "host total", p.memory.host_total / gib,
       p.memory.host_capacity / gib, p.memory.fits_host ? "" : "  DOES NOT FIT");
  for (const auto& i : p.issues) line("  not runnable: %s (%s)\n", to_string(i.reason), i.detail.c_str());
  for (const auto& w : p.warnings) out += "warning: " + w + "\n";
  return out;
}

}  // namespace rackstep::sim
