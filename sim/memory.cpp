#include "sim/memory.h"

#include <algorithm>
#include <cmath>

namespace rackstep::sim {

namespace {

using models::OpClass;

// Micro-batches whose activations are live on the first stage (see header).
double in_flight_micro_batches(const Layout& l, double m) {
  if (l.pp <= 1) return 1.0;
  const double p = static_cast<double>(l.pp);
  switch (l.schedule) {
    case PpSchedule::k1F1B:
    case PpSchedule::kZeroBubble: return std::min(m, p);
    case PpSchedule::kInterleaved1F1B: return std::min(m, p + (p - 1.0) / static_cast<double>(l.pp_virtual));
    case PpSchedule::kDualPipeV: return std::min(m, p + 1.0);
  }
  return std::min(m, p);
}

// Layers per virtual pipeline chunk when the embedding and the loss take a layer's
// slot each: (layers + 2) over pp x v chunks (Megatron-Core's
// account_for_embedding/loss_in_pipeline_split; it asserts the division is exact).
double split_chunk_layers(const Layout& l, int64_t layers) {
  const double chunks = static_cast<double>(l.pp * l.pp_virtual);
  return std::ceil((static_cast<double>(layers) + 2.0) / chunks);
}

// In-flight micro-batches (in units of a middle stage's layers) of the heaviest
// rank when the first chunk holds the embedding and one layer fewer. Megatron-Core's
// interleaved schedule (pipeline_parallel/schedules.py) runs rank r's warm-up of
// 2 (pp - r - 1) + (v - 1) pp chunk forwards, in groups of pp micro-batches per
// chunk, so at its peak rank r holds warm-up + 1 chunks: rank 0 keeps 2 pp - 1 of
// them on its (c - 1)-layer first chunk, rank 1 is the first rank with full chunks.
// 1F1B (v = 1): rank r holds pp - r micro-batches.
double edge_split_in_flight(const Layout& l, int64_t layers, double m) {
  const double p = static_cast<double>(l.pp), v = static_cast<double>(l.pp_virtual);
  const double c = split_chunk_layers(l, layers);
  const double stage = v * c;
  double live = 0.0;  // layer x micro-batch activations of the heaviest rank
  if (l.schedule == PpSchedule::kInterleaved1F1B && l.pp_virtual > 1) {
    const double rank0 = c * (v * p + p - 1.0) - (2.0 * p - 1.0);
    const double rank1 = c * (v * p + p - 3.0);
    live = std::max(rank0, rank1);
  } else if (l.schedule == PpSchedule::k1F1B) {
    live = std::max(p * (c - 1.0), (p - 1.0) * c);
  } else {
    return in_flight_micro_batches(l, m);
  }
  return std::min(m, live / stage);
}

// Saved GEMM inputs held as FP8 casts (1 byte, not bf16's 2): with FP8 GEMMs,
// Transformer Engine saves the FP8 copy of each input that the weight gradient
// reads (te.Linear / GroupedLinear save the quantized input), not the bf16 one.
double fp8_saved_elems(const LayerClass& c, const Layout& l) {
  switch (l.fp8) {
    case Fp8Gemms::kNone: return 0.0;
    case Fp8Gemms::kExperts: return c.saved_grouped_gemm_elems_per_token;
    case Fp8Gemms::kLinear: return c.saved_dense_gemm_elems_per_token + c.saved_grouped_gemm_elems_per_token;
  }
  return 0.0;
}

bool fp8_saved(const OpEntry& e, const Layout& l) {
  if (e.cls == OpClass::kGemm) return l.fp8 == Fp8Gemms::kLinear;
  if (e.cls == OpClass::kGroupedGemm) return l.fp8 != Fp8Gemms::kNone;
  return false;
}

bool recomputes(const Layout& l, const OpEntry& e, models::RecomputeModule m) {
  return l.recompute == models::Recompute::kSelective && (l.recompute_modules & models::recompute_module_bit(m)) &&
         (e.recompute_modules & models::recompute_module_bit(m));
}

// Activations one layer of class c keeps per token for its backward (bf16
// elements; an FP8 cast counts half) when nothing is recomputed or only the
// layout's recompute_modules are (Megatron-Core, megatron/core/transformer/):
//   moe, mlp, shared_experts  normal checkpoints: only the module's input is kept
//   core_attn                 the attention kernel keeps q, k, v, not its output
//   mla_up_proj               multi_latent_attention.py: q, k, v are freed after the
//                             attention forward (discard_output_and_register_recompute);
//                             the up-projection's inputs (q and kv latents, RoPE key) are kept
//   moe_act                   experts.py: the activation's output (fc2's input) is discarded
//   layernorm                 the pre-norm outputs the next GEMMs save are discarded
// and the combine keeps the k expert outputs only where the trainer weights them
// there (cal.combine_saves_expert_outputs). Per op of the class, what each op's
// autograd node holds until its backward runs; a checkpoint's inputs (the MLA
// up-projection's, the MoE module's) count with the op that keeps them.
std::vector<double> kept_saved_op_elems(const LayerClass& c, const Layout& l, const Calibration& cal, double d_model) {
  using models::RecomputeModule;
  std::vector<double> kept(c.ops.size(), 0.0);
  bool moe_checkpoint = false;
  bool mla_up = false;      // the layer has MLA up-projections and the layout recomputes them
  for (const OpEntry& e : c.ops) mla_up = mla_up || recomputes(l, e, RecomputeModule::kMlaUpProj);
  for (size_t i = 0; i < c.ops.size(); ++i) {
    const OpEntry& e = c.ops[i];
    double checkpoint_inputs = 0.0;  // the up-projection or MoE checkpoint's inputs kept here
    const double fp8_share = fp8_saved(e, l) ? 0.5 : 1.0;
    double saved = e.saved_elems - (fp8_saved(e, l) ? 0.5 * saved_gemm_input_elems(e) : 0.0);
    if (e.kind == models::OpKind::kCombine) saved *= cal.combine_saves_expert_outputs;
    if (recomputes(l, e, RecomputeModule::kMlaUpProj)) {
      if (e.kind == models::OpKind::kRmsNorm) checkpoint_inputs += e.in_elems;
      saved = 0.0;
    }
    if (e.kind == models::OpKind::kAttention) {
      const double qkv = e.heads * e.qk_head_dim + e.kv_heads * (e.qk_head_dim + e.head_dim);
      const bool up = mla_up;
      if (up) {
        checkpoint_inputs += e.qk_head_dim - e.head_dim;  // the RoPE key
        saved -= qkv;
      }
      if (recomputes(l, e, RecomputeModule::kCoreAttn)) saved = up ? 0.0 : qkv;
    }
    if (recomputes(l, e, RecomputeModule::kMoe)) {
      if (!moe_checkpoint) checkpoint_inputs += d_model;  // the checkpoint's input, once a layer
      moe_checkpoint = true;
      saved = 0.0;
    } else if (recomputes(l, e, RecomputeModule::kMlp) || recomputes(l, e, RecomputeModule::kSharedExperts)) {
      saved = e.gemm_k;  // the checkpoint's input x
    }
    if (recomputes(l, e, RecomputeModule::kMoeAct)) saved -= e.rows_per_token * e.gemm_n * fp8_share;
    if (e.saves_norm_output && l.recompute == models::Recompute::kSelective &&
        (l.recompute_modules & models::recompute_module_bit(RecomputeModule::kLayernorm)) && !fp8_saved(e, l)) {
      saved -= std::min(saved, e.gemm_k);
    }
    kept[i] = std::max(0.0, saved) + checkpoint_inputs;
  }
  return kept;
}

// Activations one layer of class c keeps per token under torchtitan's per-op policy
// (Layout::torchtitan_op_sac): the outputs of the ops in its _save_list (parallelize_llama.py
// at 9dec370, 820504e, e7c0cae), nothing else of the block, plus the checkpoint's input.
//   aten.mm                 every odd-numbered mm of the block, in forward order (the count
//                           price_ops keeps, FP8 linears included); an op's GEMMs but its last
//                           write gemm_n wide (a fused SwiGLU's w1, w3), its last its bf16 output
//   SDPA                    the attention output and its fp32 logsumexp (2 elements a head)
//   reduce_scatter_tensor   under sequence parallelism, the d_model-wide reduce-scatter
//                           before each residual add; the mm before it wrote a partial sum
//                           over the whole sequence (tp times the sharded share)
// Per op, as kept_saved_op_elems; the block input counts with the first op.
std::vector<double> op_sac_saved_op_elems(const LayerClass& c, const Layout& l, double d_model) {
  const double tp = static_cast<double>(l.tp);
  std::vector<double> kept(c.ops.size(), 0.0);
  if (!kept.empty()) kept[0] = d_model;
  int64_t mm_count = 0;
  size_t last_gemm = kept.size();  // the GEMM op before the next residual add
  double last_output_kept = 0.0;   // its last GEMM's output, where saved
  for (size_t i = 0; i < c.ops.size(); ++i) {
    const OpEntry& e = c.ops[i];
    if (e.cls == OpClass::kAttention) kept[i] += e.out_elems + 2.0 * e.heads;
    if (e.kind == models::OpKind::kResidualAdd && tp > 1.0 && last_gemm < kept.size()) {
      kept[i] += d_model;
      kept[last_gemm] += (tp - 1.0) * last_output_kept;
      last_gemm = kept.size();
    }
    if (e.cls != OpClass::kGemm) continue;
    last_gemm = i;
    last_output_kept = 0.0;
    const int64_t gemms = static_cast<int64_t>(e.gemm_count);
    for (int64_t g = 0; g < gemms; ++g) {
      const double out = g + 1 < gemms ? e.rows_per_token * e.gemm_n : e.out_elems;
      const bool saved = ++mm_count % 2 == 1;
      if (saved) kept[i] += out;
      if (g + 1 == gemms && saved) last_output_kept = out;
    }
  }
  return kept;
}

double kept_saved_elems(const LayerClass& c, const Layout& l, const Calibration& cal, double d_model) {
  double kept = 0.0;
  for (double k : kept_saved_op_elems(c, l, cal, d_model)) kept += k;
  return kept;
}

// Attention scores one layer of class c keeps per token for its backward, in bf16
// element equivalents, when the trainer's attention is not fused
// (cal.attention_score_bytes > 0): every head materialises its query x key score
// matrix, and the backward reads what the forward kept of it (Korthikanti et al.
// 2022, 'Reducing Activation Recomputation in Large Transformer Models', section
// 4.1: softmax output 2 B, dropout mask 1 B and dropout output 2 B per score, the
// 5as^2b of their per-layer count). Per token a head holds one row of seq keys;
// the heads split over tp as the tokens do under sequence parallelism, so the
// count per token of tokens_mb / tp is heads x seq. Recomputing the core attention
// (selective core_attn) keeps none.
// Per op of the class: the attention ops hold them.
std::vector<double> unfused_score_op_elems(const LayerClass& c, const Layout& l, const Calibration& cal, double seq) {
  std::vector<double> elems(c.ops.size(), 0.0);
  if (cal.attention_score_bytes <= 0) return elems;
  for (size_t i = 0; i < c.ops.size(); ++i) {
    const OpEntry& e = c.ops[i];
    if (e.kind != models::OpKind::kAttention || recomputes(l, e, models::RecomputeModule::kCoreAttn)) continue;
    elems[i] = e.heads * seq * cal.attention_score_bytes / 2.0;
  }
  return elems;
}

double unfused_score_elems(const LayerClass& c, const Layout& l, const Calibration& cal, double seq) {
  double elems = 0.0;
  for (double e : unfused_score_op_elems(c, l, cal, seq)) elems += e;
  return elems;
}

// Bytes the FP8 GEMM weights of the stage save when kept as FP8 tensors
// (Layout::fp8_params) instead of bf16: one byte per element where the GPU runs
// FP8 GEMMs in any operand layout (cal.fp8_non_tn_gpus), none elsewhere (the FP8
// data plus its FP8 transpose are two bytes). The FP8 GEMMs' weights are the
// block parameters (fp8 linear; norms and router, a negligible share, counted
// with them) and the routed experts (linear or experts).
double fp8_weight_savings(const OpTable& t, const topologies::Cluster& c, const Layout& l, const Calibration& cal,
                          const LayoutShape& s) {
  const auto& gpus = cal.fp8_non_tn_gpus;
  if (std::find(gpus.begin(), gpus.end(), c.system.gpu.name) == gpus.end()) return 0.0;
  const double tp = static_cast<double>(l.tp);
  const double dense = l.fp8 == Fp8Gemms::kLinear ? s.dense_stage_params / tp : 0.0;
  const double experts = t.experts > 0 ? s.expert_stage_params / static_cast<double>(l.ep * l.expert_tp()) : 0.0;
  return (dense + experts) * 1.0;  // 2 bytes -> 1 byte per element
}

double muon_expert_params(const LayerClass& c) {
  double n = 0.0;
  for (const auto& mtx : c.muon_matrices) {
    if (mtx.expert) n += mtx.m * mtx.n * mtx.count;
  }
  return n;
}

// One moment of a layer's backward (its recompute forward included) for the peak
// by phase: the ops of the layer whose saved activations are still held (ops
// [0, live_ops): autograd frees a node's saved tensors once its backward has run,
// torch/csrc/autograd/engine.cpp, Engine::evaluate_function -> fn.release_variables()),
// whether the unfused attention's score gradients are live (only inside the
// attention op's own backward), and the gathered weights and unreduced gradients
// then (elements of the 2-byte working dtype).
struct LayerMoment {
  size_t live_ops = 0;
  bool score_grads = false;
  double working_elems = 0;
  double freed_elems = 0;  // of op live_ops - 1's saved activations, freed by its modules done (per token)
};

// DeepSpeed ZeRO-3's gathered weights and unreduced gradients through one layer of
// class lc, moment by moment, under the coordinator's rules (stage3.py of the 2021
// releases; cal.fsdp_max_live_params > 0), over the modules of fsdp_modules (the
// time walk's, sim/predict.cpp deepspeed_zero3_exposed):
//  - a module holds its own weights and, when they are under fsdp_max_live_params,
//    the next whole parameters it prefetches (at least fsdp_prefetch_bucket_params);
//    the tensor-list all-gather stages the prefetched parameter once more (PyTorch's
//    flat output, copied out per rank) while it is in flight; release_sub_module
//    frees the module after its backward, so the ops between two modules (the
//    attention core, the norms) see only what was prefetched;
//  - gradients wait in a bucket until the next one would pass grad_reduce_bucket_params;
//    the bucket reduced before stays live until the next reduction (overlap_comm
//    partitions it then), and the tensor-list reduce-scatter stages its largest
//    parameter's gradient once more.
// Walked through the backward of two layers (the bucket carries over) and, under full
// recompute, the recompute forward of the layer below between them. Each module's
// backward has two moments: before its gradient joins the bucket (its saved inputs
// still held) and after (freed: the ops from its first on, or, while other modules
// of its op still run, the activations it frees).
std::vector<LayerMoment> deepspeed_zero3_moments(const LayerClass& lc, const Layout& l, const Calibration& cal,
                                                 const std::vector<bool>& scored) {
  const double tp = static_cast<double>(l.tp);
  const bool staged = cal.fsdp_list_ops_per_rank > 0;
  const std::vector<FsdpModule> all = fsdp_modules(lc, cal);  // forward order
  const auto is_gathered = [&](const FsdpModule& m) { return m.param_elems / tp >= cal.fsdp_persistence_threshold_params; };
  std::vector<double> p;   // the gathered modules' elements per GPU, forward order
  for (const FsdpModule& m : all) {
    if (is_gathered(m)) p.push_back(m.param_elems / tp);
  }
  std::vector<LayerMoment> moments;
  if (p.empty()) return moments;
  const size_t n = p.size();
  // The module the trace reaches i steps after module j (the coordinator prefetches
  // along the recorded trace): in the backward (step -1) the modules before j, then the
  // layer below's recompute forward (full recompute) or its backward; in the recompute
  // forward (+1) the modules after j, then the layer's backward from its next-to-last
  // module (the last one stays gathered for it, fsdp_max_reuse_distance_params).
  const bool full = l.recompute == models::Recompute::kFull;
  const auto upcoming = [&](size_t j, int step, size_t i) {
    const auto wrap = [&](long k) { return p[static_cast<size_t>(((k % static_cast<long>(n)) + static_cast<long>(n)) %
                                                                 static_cast<long>(n))]; };
    if (step < 0) {
      if (i <= j) return p[j - i];
      const long below = static_cast<long>(i - j - 1);  // steps into the layer below
      return full ? wrap(below) : wrap(static_cast<long>(n) - 1 - below);
    }
    if (j + i < n) return p[j + i];
    return wrap(static_cast<long>(n) - 2 - static_cast<long>(j + i - n));
  };
  // Weights live at module j: its own, the prefetch and the prefetch's staging copy
  // while under the live cap.
  struct Gathered { double own = 0, prefetched = 0, staging = 0; };
  const auto weights = [&](size_t j, int step) {
    Gathered g{p[j], 0.0, 0.0};
    if (p[j] >= cal.fsdp_max_live_params || cal.fsdp_prefetch_bucket_params <= 0) return g;
    double largest = 0.0;
    for (size_t i = 1; i < n && g.prefetched < cal.fsdp_prefetch_bucket_params; ++i) {
      const double q = upcoming(j, step, i);
      g.prefetched += q;
      largest = std::max(largest, q);
    }
    g.staging = staged ? largest : 0.0;
    return g;
  };
  double bucket = 0.0, bucket_largest = 0.0, previous = 0.0, rs_staging = 0.0;
  const auto unreduced = [&] { return bucket + previous + rs_staging; };
  // A parameter's gradient arrives (stage3.py create_reduce_and_remove_grad_hooks hooks
  // every parameter, persistent ones too; reduce_independent_p_g_buckets_and_remove_grads
  // reduces the bucket first when the gradient would pass reduce_bucket_size, and the
  // reduction partitions the bucket reduced before, partition_previous_reduced_grads).
  const auto join = [&](double elems) {
    if (bucket + elems > cal.grad_reduce_bucket_params) {
      previous = bucket;  // reduced now, freed at the next reduction
      rs_staging = staged ? bucket_largest : 0.0;
      bucket = bucket_largest = 0.0;
    }
    bucket += elems;
    bucket_largest = std::max(bucket_largest, elems);
  };
  const auto add = [&](size_t live_ops, bool score_grads, double working, double freed = 0.0) {
    moments.push_back({live_ops, score_grads, working, freed});
  };
  for (int layer = 0; layer < 2; ++layer) {
    double prefetched = 0.0;  // gathered ahead by the module done last
    size_t mi = all.size();   // modules [mi, end) done
    size_t jj = n;            // gathered modules [jj, n) done
    for (size_t op = lc.ops.size(); op-- > 0;) {
      if (mi == 0 || all[mi - 1].last_op < op) {
        // Inside the span of the module done last (its other projections) its moments stand for the op.
        const bool inside = mi < all.size() && all[mi].first_op <= op;
        if (!inside) add(op + 1, scored[op], prefetched + unreduced());
        continue;
      }
      double freed = 0.0;  // of this op's saved activations, freed by its modules done
      while (mi > 0 && all[mi - 1].last_op == op) {
        const FsdpModule& m = all[--mi];
        const bool more_of_op = mi > 0 && all[mi - 1].last_op == op;
        if (!is_gathered(m)) {  // whole on every GPU (a norm's gain): only its gradient joins the bucket
          add(op + 1, scored[op], prefetched + unreduced(), freed);
          join(m.param_elems / tp);
          continue;
        }
        const Gathered g = weights(--jj, -1);
        const double w = g.own + g.prefetched + g.staging;
        add(op + 1, false, w + unreduced(), freed);
        // Megatron's Linears return their bias to the fused op after them (skip_bias_add:
        // bias_gelu after dense_h_to_4h, bias_dropout_add after dense and dense_4h_to_h,
        // megatron/model/transformer.py), whose backward runs first: a bias's gradient
        // arrives before its weight's and, over a full bucket, reduces it.
        if (m.param_tensors > 1) join(0.0);
        join(p[jj]);
        freed += m.freed_saved_elems;
        if (more_of_op) {
          add(op + 1, false, w + unreduced(), freed);
        } else {
          add(m.first_op, false, w + unreduced());
        }
        prefetched = g.prefetched;
      }
    }
    if (!full) continue;
    size_t j = 0;
    for (const FsdpModule& m : all) {
      if (!is_gathered(m)) continue;
      const Gathered g = weights(j++, +1);
      add(m.last_op + 1, false, g.own + g.prefetched + g.staging + unreduced());
    }
  }
  return moments;
}

// The largest working set of those moments over the layer classes (elements).
double deepspeed_zero3_working_elems(const OpTable& t, const Layout& l, const Calibration& cal) {
  double peak = 0.0;
  for (const LayerClass& lc : t.classes) {
    for (const LayerMoment& mo : deepspeed_zero3_moments(lc, l, cal, std::vector<bool>(lc.ops.size(), false))) {
      peak = std::max(peak, mo.working_elems);
    }
  }
  return peak;
}

// The lines live together at the step's memory peak (cal.peak_by_phase): a
// framework that frees each buffer after its last use never holds the loss's
// logits beside a layer's backward, nor every op's transients at once. The peak
// is the larger of two phases (per stage under pipelining: the first stage holds
// the most micro-batches, the last one the loss):
//  - the loss: the activations held for the backward (under full recompute only
//    the layer inputs the checkpoints keep: Megatron-LM's CheckpointFunction saves
//    its inputs and runs the layers under no_grad, megatron/mpu/random.py) and
//    the logits block, computed after the last layer's forward and freed by the
//    loss's own backward before any layer's backward starts; the working set then
//    is the LM head's weight (gathered, under DeepSpeed's walk);
//  - one layer's backward, moment by moment (ops in reverse order): the activations
//    held for the other layers, this layer's saved activations of the ops whose
//    backward has not yet run (and, while the attention op's backward runs, the
//    score gradients), the activation-gradient workspace, the working set at that
//    moment (DeepSpeed's walk, or the fixed set of the other rules) and the EP and
//    CP buffers.
// `summed` carries the lines as each alone peaks (working set, EP, CP, loss).
MemoryBreakdown peak_by_phase(const OpTable& t, const Layout& l, const Calibration& cal, const LayoutShape& s,
                              const MemoryBreakdown& summed, bool deepspeed_walk) {
  const double tp = static_cast<double>(l.tp);
  const double tok = s.tokens_mb / tp;
  const double act_bytes = 2.0 * cal.activation_bytes_factor;
  const double elem_bytes = tok * act_bytes;  // one saved element per token, this micro-batch
  const double carry_bytes = static_cast<double>(t.d_model) * elem_bytes;
  const bool gemm_only = l.recompute == models::Recompute::kSelective && l.recompute_modules == 0 && !l.torchtitan_op_sac;

  // Per class: each op's saved elements (scores apart) in the layer being back-propagated.
  struct ClassOps { std::vector<double> saved, scores; double own = 0, workspace = 0, score_grads = 0; };
  std::vector<ClassOps> classes;
  double worst_own = 0.0;
  for (const LayerClass& lc : t.classes) {
    ClassOps co;
    const size_t n = lc.ops.size();
    // A policy that saves the GEMMs' or _save_list's outputs replays the attention's scores.
    co.scores = gemm_only || l.torchtitan_op_sac ? std::vector<double>(n, 0.0) : unfused_score_op_elems(lc, l, cal, static_cast<double>(s.seq));
    if (l.recompute == models::Recompute::kFull || gemm_only) {
      co.saved.assign(n, 0.0);
      for (size_t i = 0; i < n; ++i) {
        const OpEntry& e = lc.ops[i];
        const bool gemm = e.cls == OpClass::kGemm || e.cls == OpClass::kGroupedGemm || e.cls == OpClass::kAttention;
        if (gemm_only && !gemm) continue;
        co.saved[i] = e.saved_elems - (fp8_saved(e, l) ? 0.5 * saved_gemm_input_elems(e) : 0.0);
      }
    } else if (l.torchtitan_op_sac) {
      co.saved = op_sac_saved_op_elems(lc, l, static_cast<double>(t.d_model));
    } else {
      co.saved = kept_saved_op_elems(lc, l, cal, static_cast<double>(t.d_model));
    }
    double score_total = 0.0;
    for (size_t i = 0; i < n; ++i) {
      co.own += co.saved[i] + co.scores[i];
      score_total += co.scores[i];
    }
    co.workspace = cal.backward_workspace_factor * (lc.saved_elems_per_token - 0.5 * fp8_saved_elems(lc, l)) * elem_bytes;
    co.score_grads = cal.attention_score_bytes > 0 ? score_total * 2.0 / cal.attention_score_bytes * elem_bytes : 0.0;
    worst_own = std::max(worst_own, co.own);
    classes.push_back(std::move(co));
  }

  // The LM head's weight, gathered for the loss under DeepSpeed's walk (tied: the embedding's).
  double head_elems = 0.0;
  for (const OpEntry& e : t.head) head_elems = std::max(head_elems, e.param_elems);
  if (head_elems <= 0 && !l.replicate_embedding) head_elems = t.embedding_params;
  head_elems /= tp;
  const double loss_working = !deepspeed_walk                                        ? summed.working_weights
                              : head_elems >= cal.fsdp_persistence_threshold_params ? head_elems * 2.0
                                                                                     : 0.0;

  MemoryBreakdown best;
  double best_sum = -1.0;
  const auto consider = [&](double activations, double workspace, double working, double ep, double cp, double loss) {
    const double sum = activations + workspace + working + ep + cp + loss;
    if (sum <= best_sum) return;
    best_sum = sum;
    best.activations = activations;
    best.backward_workspace = workspace;
    best.working_weights = working;
    best.ep_buffers = ep;
    best.cp_buffers = cp;
    best.loss_workspace = loss;
  };
  // live_layers: layers x micro-batches whose activations the stage holds.
  const auto phases = [&](double live_layers, bool with_loss) {
    const double carries = l.offload_residual ? 2.0 * carry_bytes : live_layers * carry_bytes;
    const bool full = l.recompute == models::Recompute::kFull;
    if (with_loss) {
      consider(full ? carries : live_layers * worst_own * elem_bytes, 0.0, loss_working, 0.0, 0.0,
               summed.loss_workspace);
    }
    for (size_t c = 0; c < classes.size(); ++c) {
      const ClassOps& co = classes[c];
      const LayerClass& lc = t.classes[c];
      const double others = full ? carries : std::max(0.0, live_layers * worst_own - co.own) * elem_bytes;
      std::vector<bool> scored(lc.ops.size());
      for (size_t i = 0; i < scored.size(); ++i) scored[i] = co.scores[i] > 0;
      std::vector<LayerMoment> moments;
      if (deepspeed_walk) {
        moments = deepspeed_zero3_moments(lc, l, cal, scored);
      } else {
        for (size_t op = lc.ops.size(); op-- > 0;) moments.push_back({op + 1, scored[op], 0.0, 0.0});
      }
      for (const LayerMoment& mo : moments) {
        double held = 0.0;
        for (size_t i = 0; i < mo.live_ops; ++i) held += co.saved[i] + co.scores[i];
        if (mo.live_ops > 0) held -= std::min(mo.freed_elems, co.saved[mo.live_ops - 1]);
        const double working = deepspeed_walk ? mo.working_elems * 2.0 : summed.working_weights;
        consider(others + held * elem_bytes, co.workspace + (mo.score_grads ? co.score_grads : 0.0), working,
                 summed.ep_buffers, summed.cp_buffers, 0.0);
      }
    }
  };
  const double live_layers = s.layers_per_stage * s.in_flight;
  if (l.pp > 1) {
    phases(live_layers, false);          // the first stage
    phases(s.layers_per_stage, true);    // the last stage: one micro-batch, the loss
  } else {
    phases(live_layers, true);
  }
  return best;
}

}  // namespace

LayoutShape layout_shape(const OpTable& t, const topologies::Cluster& c, const Layout& l, const Calibration& cal) {
  LayoutShape s;
  s.seq = l.seq_len > 0 ? l.seq_len : t.seq_len;
  const double seq = static_cast<double>(s.seq);
  s.batch_seqs = l.tokens_per_step > 0 ? static_cast<double>(l.tokens_per_step) / seq
                 : l.seq_len > 0       ? static_cast<double>(t.batch_seqs * t.seq_len) / seq
                                       : static_cast<double>(t.batch_seqs);
  s.tokens_per_step = s.batch_seqs * seq;
  const double per_rank = s.batch_seqs / static_cast<double>(l.data);
  s.micro_batches = std::max(1.0, per_rank / static_cast<double>(l.micro_batch_seqs));
  s.tokens_mb = static_cast<double>(l.micro_batch_seqs) * seq / static_cast<double>(l.cp);
  s.routed_rows_mb = s.tokens_mb * static_cast<double>(t.top_k);
  const double tp = static_cast<double>(l.tp);
  const double etp = static_cast<double>(l.expert_tp());
  s.ep_tokens_mb = l.folded() ? s.tokens_mb * etp / tp : s.tokens_mb;
  s.expert_rows_mb = s.ep_tokens_mb * static_cast<double>(t.top_k);
  s.local_experts = t.experts > 0 ? static_cast<double>(t.experts) / static_cast<double>(l.ep) : 1.0;
  // Context-parallel ranks hold the same parameters: a trainer whose shard group
  // spans them (torchtitan's dp_shard_cp, Megatron-Core's data-parallel group with
  // CP) splits every sharded state over data x cp, not only over the fsdp ranks.
  s.shards_over_cp = cal.zero_shards_over_cp > 0 && l.cp > 1 && l.zero_stage >= 1;
  const int64_t shard_cp = s.shards_over_cp ? l.cp : 1;
  s.shard_ranks = l.fsdp * shard_cp;
  s.dense_shard = static_cast<double>(s.shard_ranks) * tp;
  const double expert_split = static_cast<double>(std::max(l.ep, l.fsdp));
  s.expert_zero = expert_split / static_cast<double>(l.ep);
  s.expert_shard = expert_split * tp * static_cast<double>(shard_cp);
  if (l.folded()) {
    // The fsdp data ranks × their tp × cp GPUs hold one copy of the state; inside that
    // block the experts are split ep × etp ways and ZeRO-sharded over what is left
    // (Megatron's distributed optimizer shards expert state over the expert-DP group).
    const double block = static_cast<double>(l.fsdp * l.tp * l.cp), mesh = static_cast<double>(l.ep) * etp;
    s.expert_zero = std::max(1.0, block / mesh);
    s.expert_shard = mesh * s.expert_zero;
  }
  const double pp = static_cast<double>(l.pp);
  s.layers_per_stage = l.stage_layers(t.layers);
  if (l.edges_in_pipeline_split && l.pp > 1) {
    s.layers_per_stage = static_cast<double>(l.pp_virtual) * split_chunk_layers(l, t.layers);
  }
  s.stage_scale = t.layers > 0 ? s.layers_per_stage * pp / static_cast<double>(t.layers) : 1.0;
  s.in_flight = l.edges_in_pipeline_split && l.pp > 1 ? edge_split_in_flight(l, t.layers, s.micro_batches)
                                                     : in_flight_micro_batches(l, s.micro_batches);
  s.master_bytes = l.master_dtype == MasterDtype::kFp32 ? 4.0 : 2.0;
  s.grad_bytes = l.grad_dtype == GradDtype::kAsMaster ? s.master_bytes : l.grad_dtype == GradDtype::kFp32 ? 4.0 : 2.0;
  for (const auto& lc : t.classes) {
    const double share = static_cast<double>(lc.count) / pp * s.stage_scale;
    s.dense_stage_params += lc.dense_params * share;
    s.expert_stage_params += lc.expert_params * share;
    s.muon_dense_stage_params += lc.muon_dense_params * share;
  }
  const bool replicate = l.replicate_embedding;
  const double emb_sharded = replicate ? 0.0 : t.embedding_params;
  s.edge_params = l.pp > 1 ? std::max(emb_sharded, t.head_params) : emb_sharded + t.head_params;
  if (l.edges_in_pipeline_split && l.pp > 1) {
    // The edge stages hold one layer fewer than a middle stage: the heaviest stage
    // carries the edge only by what it outweighs a layer (parameters before sharding).
    const double layer_params = (s.dense_stage_params + s.expert_stage_params) / std::max(1.0, s.layers_per_stage);
    s.edge_params = std::max(0.0, s.edge_params - layer_params);
  }
  s.replicated_params = replicate ? t.embedding_params : 0.0;
  double muon_expert = 0.0;
  for (const auto& lc : t.classes) {
    muon_expert += muon_expert_params(lc) * static_cast<double>(lc.count) / pp * s.stage_scale;
  }
  const double dense_local = (s.dense_stage_params + s.edge_params) / s.dense_shard + s.replicated_params;
  s.params_local = dense_local + s.expert_stage_params / s.expert_shard;
  s.muon_dense_local = s.muon_dense_stage_params / s.dense_shard;
  s.muon_expert_local = muon_expert / s.expert_shard;
  s.adam_local = std::max(0.0, s.params_local - s.muon_dense_local - s.muon_expert_local);
  s.weights_whole_local = (s.dense_stage_params + s.edge_params) / tp + s.replicated_params +
                          s.expert_stage_params / (static_cast<double>(l.ep) * etp);
  s.gathers_per_layer = l.zero_stage >= 3 && !l.keep_gathered_weights;
  s.grads_local = l.zero_stage >= 2 && !l.keep_gathered_weights ? s.params_local : s.weights_whole_local;
  (void)c;
  return s;
}

MemoryBreakdown estimate_memory(const OpTable& t, const topologies::Cluster& c, const Layout& l,
                                const Calibration& cal, const LayoutShape& s) {
  MemoryBreakdown m;
  const double tp = static_cast<double>(l.tp);
  // A bf16 master with whole weights on every GPU is those weights (no separate copy).
  const bool whole_weights = l.zero_stage < 3 || l.keep_gathered_weights;
  const bool bf16_master = l.master_dtype == MasterDtype::kBf16;
  m.master_weights = whole_weights && bf16_master && l.zero_stage < 3 ? s.weights_whole_local * 2.0
                                                                       : s.params_local * s.master_bytes;
  m.gradients = s.grads_local * s.grad_bytes;
  const double muon_local = s.muon_dense_local + s.muon_expert_local;
  const double states = s.adam_local * 8.0 + muon_local * 4.0;  // fp32 m, v / momentum
  if (l.optimizer_state == StatePlacement::kHost) {
    m.host_optimizer = states;
  } else {
    m.optimizer_states = states;
  }

  // Working bf16 copies: two gathered dense layers (FP8 GEMM weights gathered as FP8 at
  // one byte: zero3_gathered_bytes_per_elem), one layer's local experts, and one layer's
  // unsharded gradient before its reduce-scatter.
  const double layers = std::max(1.0, s.layers_per_stage);
  const double dense_layer = s.dense_stage_params / layers / tp;
  double gathered_bytes = 0.0, gathered_elems = 0.0;  // over the layer classes, per dense element
  for (const LayerClass& lc : t.classes) {
    gathered_bytes += static_cast<double>(lc.count) * zero3_gathered_dense_bytes(lc, l);
    gathered_elems += static_cast<double>(lc.count) * lc.dense_params;
  }
  const double dense_gathered_bytes = gathered_elems > 0 ? gathered_bytes / gathered_elems : 2.0;
  const double expert_mesh = static_cast<double>(l.ep * l.expert_tp());  // ep × etp
  const double expert_layer_local = s.expert_stage_params / layers / expert_mesh;
  const bool gathered = s.shard_ranks > 1 || l.master_dtype == MasterDtype::kFp32;
  const bool deepspeed_walk = !whole_weights && cal.fsdp_max_live_params > 0 && cal.grad_reduce_bucket_params > 0 &&
                              s.shard_ranks > 1 && (t.experts == 0 || s.expert_zero <= 1.0);
  if (whole_weights) {
    m.working_weights = bf16_master && l.zero_stage < 3 ? 0.0 : s.weights_whole_local * 2.0;
    if (m.working_weights > 0 && l.fp8_params) m.working_weights -= fp8_weight_savings(t, c, l, cal, s);
  } else if (deepspeed_walk) {
    m.working_weights = deepspeed_zero3_working_elems(t, l, cal) * 2.0;
  } else {
    m.working_weights = (gathered ? 2.0 * dense_layer * dense_gathered_bytes : 0.0) +
                        (s.expert_zero > 1.0 || l.master_dtype == MasterDtype::kFp32 ? expert_layer_local * 2.0 : 0.0) +
                        (s.shard_ranks > 1 ? dense_layer * s.grad_bytes : 0.0);
  }

  // Activations of one layer for one micro-batch (bf16 elements; an FP8 one counts
  // half), by class, worst class.
  double saved_layer = 0.0, saved_gemm_layer = 0.0, kept_layer = 0.0, score_layer = 0.0;
  for (const auto& lc : t.classes) {
    const double fp8_half = 0.5 * fp8_saved_elems(lc, l);
    const double scores = unfused_score_elems(lc, l, cal, static_cast<double>(s.seq));
    score_layer = std::max(score_layer, scores);
    saved_layer = std::max(saved_layer, lc.saved_elems_per_token - fp8_half + scores);
    double op_sac = 0.0;
    for (double k : op_sac_saved_op_elems(lc, l, static_cast<double>(t.d_model))) op_sac += k;
    saved_gemm_layer = std::max(saved_gemm_layer, l.torchtitan_op_sac ? op_sac : lc.saved_gemm_elems_per_token - fp8_half);
    kept_layer = std::max(kept_layer, kept_saved_elems(lc, l, cal, static_cast<double>(t.d_model)) + scores);
  }
  // Sequence parallelism splits activations over tp; the routed rows are per GPU.
  const double tok = s.tokens_mb / tp;
  const double act_bytes = 2.0 * cal.activation_bytes_factor;  // bf16, times what the engine keeps beyond it
  const double layer_bytes = saved_layer * tok * act_bytes;
  const double carry_bytes = static_cast<double>(t.d_model) * tok * act_bytes;
  const double live_layers = s.layers_per_stage * s.in_flight;
  switch (l.recompute) {
    case models::Recompute::kNone: m.activations = live_layers * kept_layer * tok * act_bytes; break;
    case models::Recompute::kSelective:
      m.activations = live_layers * (l.recompute_modules != 0 ? kept_layer : saved_gemm_layer) * tok * act_bytes;
      break;
    case models::Recompute::kFull:
      m.activations = layer_bytes + (l.offload_residual ? 2.0 * carry_bytes : live_layers * carry_bytes);
      if (l.offload_residual) m.host_activations = live_layers * carry_bytes;
      break;
  }
  if (l.recompute != models::Recompute::kFull && l.offload_residual) {
    // Offload applies to the residual carry only; the rest stays on device.
    m.host_activations = live_layers * carry_bytes;
  }
  // Activation gradients of one layer's backward: a share of its saved activations;
  // of the unfused attention's scores, one fp16 score matrix (2 B per score) beyond
  // those kept: the dropout's input gradient while its output gradient is live, each
  // freed with the saved tensors of its op (Megatron-LM 2021 ParallelSelfAttention's
  // bmm -> dropout -> fused softmax backward).
  const double score_bytes = score_layer * tok * act_bytes;
  const double score_grad_bytes = cal.attention_score_bytes > 0 ? score_bytes * 2.0 / cal.attention_score_bytes : 0.0;
  m.backward_workspace = cal.backward_workspace_factor * (layer_bytes - score_bytes) + score_grad_bytes;

  if (l.ep > 1 && t.experts > 0) {
    const double row_bytes = static_cast<double>(t.moe_width) * 2.0;
    const double a = s.expert_rows_mb;
    const double per_direction = l.ep_transport == Transport::pooled ? (l.sender_cf + l.receiver_cf) * a * row_bytes
                                                                       : l.receiver_cf * a * row_bytes;
    m.ep_buffers = 2.0 * per_direction;  // dispatch and combine
  }
  if (l.cp > 1) {
    // K and V elements per token of the widest attention op (bf16, split over tp).
    double kv_per_token = 0.0;
    for (const auto& lc : t.classes) {
      for (const auto& e : lc.ops) {
        if (e.kind == models::OpKind::kAttention) {
          kv_per_token = std::max(kv_per_token, e.kv_heads * (e.qk_head_dim + e.head_dim) * 2.0 / tp);
        }
      }
    }
    const double chunk = s.tokens_mb * kv_per_token;  // this rank's share of the sequence
    m.cp_buffers = l.cp_kind == CpKind::kRing ? 2.0 * 2.0 * chunk  // send + receive, KV and dKV
                                              : 2.0 * static_cast<double>(l.cp) * chunk;  // gathered KV and dKV
  }
  const double block = std::min(s.tokens_mb, cal.loss_block_tokens);
  m.loss_workspace = block * static_cast<double>(t.vocab) / tp * (2.0 + 4.0 + 2.0);
  if (l.pp > 1) {
    // The first stage holds the most micro-batches in flight, the last one the loss:
    // report the heavier of the two stages.
    const double first = m.activations;
    const double last = first / std::max(1.0, s.in_flight) + m.loss_workspace;
    if (first >= last) {
      m.loss_workspace = 0.0;
    } else {
      m.activations = first / std::max(1.0, s.in_flight);
    }
  }
  if (cal.peak_by_phase > 0) {
    const MemoryBreakdown peak = peak_by_phase(t, l, cal, s, m, deepspeed_walk);
    m.activations = peak.activations;
    m.backward_workspace = peak.backward_workspace;
    m.working_weights = peak.working_weights;
    m.ep_buffers = peak.ep_buffers;
    m.cp_buffers = peak.cp_buffers;
    m.loss_workspace = peak.loss_workspace;
  }
  m.runtime_reserve = cal.runtime_reserved_bytes;
  const double live = m.master_weights + m.gradients + m.optimizer_states + m.working_weights + m.activations +
                      m.backward_workspace + m.ep_buffers + m.cp_buffers + m.loss_workspace;
  m.fragmentation = cal.allocator_fragmentation * live;
  m.device_total = live + m.runtime_reserve + m.fragmentation;
  m.host_total = m.host_optimizer + m.host_activations;
  m.device_capacity = c.system.gpu.hbm_bytes;
  m.host_capacity = c.system.host.memory_bytes_per_gpu;
  m.fits_device = m.device_capacity <= 0 || m.device_total <= m.device_capacity;
  m.fits_host = m.host_capacity <= 0 || m.host_total <= m.host_capacity;
  return m;
}

std::vector<std::pair<std::string, double>> MemoryBreakdown::lines() const {
  return {{"master_weights", master_weights},
          {"gradients", gradients},
          {"optimizer_states", optimizer_states},
          {"working_weights", working_weights},
          {"activations", activations},
          {"backward_workspace", backward_workspace},
          {"ep_buffers", ep_buffers},
          {"cp_buffers", cp_buffers},
          {"loss_workspace", loss_workspace},
          {"runtime_reserve", runtime_reserve},
          {"fragmentation", fragmentation},
          {"host_optimizer", host_optimizer},
          {"host_activations", host_activations}};
}

}  // namespace rackstep::sim
