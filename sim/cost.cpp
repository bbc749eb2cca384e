#include "sim/cost.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <string_view>
#include <utility>
#include <vector>

#include "sim/base/check.h"

namespace rackstep::sim {

namespace {

using models::OpClass;
using models::OpKind;

OpEntry make_entry(const models::Op& op, size_t index) {
  OpEntry e;
  e.kind = op.kind;
  e.cls = op.op_class;
  e.graph_index = index;
  e.gemm_k = static_cast<double>(op.gemm_k);
  e.gemm_n = static_cast<double>(op.gemm_n);
  e.gemm_count = static_cast<double>(op.gemm_count);
  e.rows_per_token = op.gemm_rows_per_token;
  e.ew_flops_per_token = op.ew_flops_per_token;
  e.in_elems = static_cast<double>(op.in_elems_per_token());
  e.out_elems = static_cast<double>(op.out_elems_per_token());
  if (op.kind == OpKind::kAttention) {
    // Flash attention reads q, k, v (op_cost's convention).
    e.in_elems = static_cast<double>(op.heads * op.qk_head_dim + op.kv_heads * (op.qk_head_dim + op.head_dim));
  }
  for (const auto& p : op.params) e.param_elems += static_cast<double>(p.numel());
  e.param_tensors = static_cast<double>(op.params.size());
  e.saved_elems = op.saved_elems_per_token;
  e.recompute_modules = op.recompute_modules;
  e.saves_norm_output = op.saves_norm_output;
  e.heads = static_cast<double>(op.heads);
  e.kv_heads = static_cast<double>(op.kv_heads);
  e.head_dim = static_cast<double>(op.head_dim);
  e.qk_head_dim = static_cast<double>(op.qk_head_dim);
  e.window = op.window;
  e.alibi = op.alibi;
  e.sinks = op.sinks;
  e.expert_bias = op.expert_bias;
  e.swiglu_limit = op.swiglu_limit;
  e.swiglu_alpha = op.swiglu_alpha;
  e.rope_yarn = op.rope_yarn;
  e.model_flops = op.counts_in_model_flops;
  return e;
}

bool is_muon(models::OptimizerKind k) {
  return k == models::OptimizerKind::kMuon || k == models::OptimizerKind::kMuonH;
}

void add_layer_params(const models::Op& op, LayerClass& c) {
  for (const auto& p : op.params) {
    const double n = static_cast<double>(p.numel());
    const bool expert = p.role == models::ParamRole::kExpertMatrix;
    (expert ? c.expert_params : c.dense_params) += n;
    if (!is_muon(p.optimizer) || p.shape.size() < 2) continue;
    if (!expert) c.muon_dense_params += n;
    LayerClass::Matrix m;
    m.expert = expert;
    m.m = static_cast<double>(p.shape[p.shape.size() - 2]);
    m.n = static_cast<double>(p.shape.back());
    m.count = p.shape.size() == 3 ? static_cast<double>(p.shape[0]) : 1.0;
    c.muon_matrices.push_back(m);
  }
}

// Span of keys per query in the Marin convention (window, else the whole sequence).
double marin_span(int64_t window, int64_t seq) {
  return window > 0 && window < seq ? static_cast<double>(window) : static_cast<double>(seq);
}

double attention_flops_per_token(const OpEntry& e, double span) {
  return 2.0 * span * e.heads * e.qk_head_dim + 2.0 * span * e.heads * e.head_dim + 3.0 * span * e.heads;
}

}  // namespace

OpTable build_op_table(const models::LayerGraph& g) {
  const auto& m = g.model;
  OpTable t;
  t.d_model = m.d_model;
  t.vocab = m.vocab;
  t.layers = m.layers;
  t.experts = m.moe.experts;
  t.top_k = m.moe.top_k;
  t.moe_width = m.moe_width();
  t.expert_width = static_cast<double>(m.moe.expert_width);
  t.seq_len = m.seq_len;
  t.batch_seqs = m.recipe.batch_seqs;
  t.ns_steps = m.recipe.newton_schulz_steps;
  const size_t first_block = g.block_begin.empty() ? g.head_begin : g.block_begin.front();
  for (size_t i = 0; i < first_block; ++i) t.pre.push_back(make_entry(g.ops[i], i));
  for (size_t i = g.head_begin; i < g.ops.size(); ++i) t.head.push_back(make_entry(g.ops[i], i));

  std::map<std::pair<int, bool>, int32_t> class_of;
  for (int64_t l = 0; l < m.layers; ++l) {
    const auto key = std::make_pair(static_cast<int>(m.layer_kind(l)), m.is_moe_layer(l));
    auto it = class_of.find(key);
    const size_t b = g.block_begin[static_cast<size_t>(l)], e = g.block_begin[static_cast<size_t>(l) + 1];
    if (it != class_of.end()) {
      LayerClass& c = t.classes[static_cast<size_t>(it->second)];
      RS_CHECK(c.ops.size() == e - b, "blocks of one class have the same op list");
      c.count += 1;
      t.layer_class.push_back(it->second);
      continue;
    }
    LayerClass c;
    c.first_layer = l;
    c.count = 1;
    c.kind = m.layer_kind(l);
    c.moe = m.is_moe_layer(l);
    for (size_t i = b; i < e; ++i) {
      const models::Op& op = g.ops[i];
      OpEntry entry = make_entry(op, i);
      entry.same_input_as_prev = i > b && op.kind == OpKind::kLinear && g.ops[i - 1].kind == OpKind::kLinear &&
                                 !op.inputs.empty() && !g.ops[i - 1].inputs.empty() &&
                                 op.inputs[0].name == g.ops[i - 1].inputs[0].name;
      c.saved_elems_per_token += entry.saved_elems;
      if (op.op_class == OpClass::kGemm || op.op_class == OpClass::kGroupedGemm || op.op_class == OpClass::kAttention) {
        c.saved_gemm_elems_per_token += entry.saved_elems;
      }
      if (op.op_class == OpClass::kGemm) c.saved_dense_gemm_elems_per_token += saved_gemm_input_elems(entry);
      if (op.op_class == OpClass::kGroupedGemm) c.saved_grouped_gemm_elems_per_token += saved_gemm_input_elems(entry);
      c.max_op_saved_elems = std::max(c.max_op_saved_elems, entry.saved_elems);
      add_layer_params(op, c);
      c.ops.push_back(std::move(entry));
    }
    class_of.emplace(key, static_cast<int32_t>(t.classes.size()));
    t.layer_class.push_back(static_cast<int32_t>(t.classes.size()));
    t.classes.push_back(std::move(c));
  }

  for (const auto& op : g.ops) {
    for (const auto& p : op.params) {
      const double n = static_cast<double>(p.numel());
      t.total_params += n;
      (is_muon(p.optimizer) ? t.muon_params : t.adam_params) += n;
      if (op.layer >= 0) continue;
      (op.kind == OpKind::kEmbedding ? t.embedding_params : t.head_params) += n;
    }
    if (op.kind != OpKind::kAttention && op.counts_in_model_flops) {
      t.marin_nonattention_flops_per_token += 2.0 * static_cast<double>(op.gemm_k) * static_cast<double>(op.gemm_n) *
                                              static_cast<double>(op.gemm_count) * op.gemm_rows_per_token;
    }
  }
  return t;
}

std::vector<FsdpModule> fsdp_modules(const LayerClass& lc, const Calibration& cal) {
  std::vector<FsdpModule> modules;
  for (size_t i = 0; i < lc.ops.size(); ++i) {
    const OpEntry& e = lc.ops[i];
    if (e.param_elems <= 0 || e.cls == OpClass::kGroupedGemm) continue;
    if (!cal.fsdp_megatron_modules) {
      modules.push_back({.first_op = i, .last_op = i, .param_elems = e.param_elems, .param_tensors = e.param_tensors});
      continue;
    }
    // query_key_value: the projections of one input (q, then k and v) are one Linear
    // (one weight and, with biases, one bias).
    if (e.same_input_as_prev && !modules.empty() && modules.back().last_op + 1 == i) {
      modules.back().last_op = i;
      modules.back().param_elems += e.param_elems;
      continue;
    }
    if (e.kind == OpKind::kSharedMlp && e.gemm_count >= 2) {
      // fc1 (gemm_count - 1 matrices of k x n) and fc2 (n x k), the biases split with
      // them in proportion. fc2's backward (first) frees its input, the activation's
      // output (n wide); fc1's frees the rest with the op.
      const double fc1_share = (e.gemm_count - 1.0) / e.gemm_count;
      // fc1's weights (and biases) are one tensor in Megatron (linear_fc1), fc2's one and its bias.
      const double tensors = e.param_tensors > e.gemm_count ? 2.0 : 1.0;
      modules.push_back({.first_op = i,
                         .last_op = i,
                         .param_elems = e.param_elems * fc1_share,
                         .param_tensors = tensors,
                         .op_share = fc1_share});
      modules.push_back({.first_op = i,
                         .last_op = i,
                         .param_elems = e.param_elems * (1.0 - fc1_share),
                         .param_tensors = tensors,
                         .op_share = 1.0 - fc1_share,
                         .freed_saved_elems = e.gemm_n});
      continue;
    }
    modules.push_back({.first_op = i, .last_op = i, .param_elems = e.param_elems, .param_tensors = e.param_tensors});
  }
  return modules;
}

PriceContext device_price_context(const topologies::GpuSpec& gpu, const Calibration& cal) {
  PriceContext c;
  c.gpu = &gpu;
  c.cal = &cal;
  c.peak_flops_per_s = gpu.peak_bf16_flops_per_s;
  c.hbm_bw_bytes_per_s = gpu.hbm_bw_measured_bytes_per_s > 0 ? gpu.hbm_bw_measured_bytes_per_s : gpu.hbm_bw_bytes_per_s;
  c.gemm_peak_eff = gemm_peak_efficiency(cal, gpu);
  c.gemm_shape = gemm_shape_table(cal, gpu);
  c.fp8_dense_rel_eff = fp8_dense_relative_efficiency(cal, gpu);
  c.fp8_peak_flops_per_s = gpu.peak_fp8_flops_per_s;
  return c;
}

double model_flops_per_token(const OpTable& t, int64_t seq) {
  double attn = 0.0;
  for (const auto& c : t.classes) {
    for (const auto& e : c.ops) {
      if (e.kind != OpKind::kAttention) continue;
      attn += static_cast<double>(c.count) * attention_flops_per_token(e, marin_span(e.window, seq));
    }
  }
  return 3.0 * (t.marin_nonattention_flops_per_token + attn);
}

// FP8 quantization (Transformer Engine's quantizers, transformer_engine/common/recipe
// and the cast / cast-transpose kernels). A GEMM's BF16 operand is read and written as
// FP8 row-wise for the GEMM that reads it and column-wise for the weight-gradient GEMM,
// which contracts over the other dimension. Per-tensor FP8 on a GPU whose FP8 GEMMs
// take only the TN layout (Hopper) writes that second copy as a transpose; Blackwell
// reads one copy in either layout (TE's is_non_tn_fp8_gemm_supported, sm_100+), while
// block scales (MXFP8, blockwise) differ by direction and always need both. Per element:
//   delayed:   one pass (scale from the amax history): read 2 B, write 1 B (+ 1 B TN-only)
//   current:   an amax pass (read 2 B), then the cast: read 2 B, write 1 B (+ 1 B TN-only)
//   mxfp8:     one pass: read 2 B, write 1 + 1 B and an E8M0 scale per 32 elements each
//   blockwise: one pass: read 2 B, write 1 + 1 B and an fp32 scale per 128 elements each
// Checked against TE's GEMM profiling guide (docs/examples/gemm_profiling, benchmark_gemm.py,
// hidden 4096 / intermediate 16384 / 15,872 tokens, every GEMM input quantized per call):
// autocast minus pre-quantized time on a B300 is 2.335 ms per layer for FP8 current
// scaling and 1.823 ms for MXFP8, over 2.48e9 quantized elements at 8 TB/s x 0.7 =
// 5.3 and 4.1 B per element; on an H200 NVL, 3.50 ms = 4.7 B per element (current).
double fp8_quantize_bytes_per_elem(Fp8Recipe r, bool tn_only) {
  const double transposed = tn_only ? 1.0 : 0.0;
  switch (r) {
    case Fp8Recipe::kCurrent: return 2.0 + 2.0 + 1.0 + transposed;
    case Fp8Recipe::kMxfp8: return 2.0 + 2.0 + 2.0 * 1.0 / 32.0;
    case Fp8Recipe::kBlockwise: return 2.0 + 2.0 + 2.0 * 4.0 / 128.0;
    case Fp8Recipe::kDelayed: return 2.0 + 1.0 + transposed;
  }
  return 4.0;
}

namespace {

// Kernels that quantize one grouped-GEMM operand whose rows are split by local expert
// (Transformer Engine 2.9 GroupedLinear: tex.split_quantize, extensions/cast.cpp). Delayed
// scaling casts every expert's rows in one fused nvte_multi_cast_transpose; the other
// recipes quantize expert by expert (multi_tensor_quantize_impl), current scaling with four
// kernels each (recipe/current_scaling.cu: zero_amax_kernel, amax_kernel,
// compute_scale_from_amax_kernel, then the cast; quantizer.cpp Float8CurrentScalingQuantizer),
// MXFP8 and blockwise with one (scales and casts in one kernel).
double fp8_grouped_quantize_kernels(Fp8Recipe r, double local_experts) {
  switch (r) {
    case Fp8Recipe::kDelayed: return 1.0;
    case Fp8Recipe::kCurrent: return 4.0 * local_experts;
    case Fp8Recipe::kMxfp8:
    case Fp8Recipe::kBlockwise: return local_experts;
  }
  return local_experts;
}
}  // namespace

CpRingPasses cp_ring_attention_passes(double q_elems, double kv_elems, int64_t cp) {
  RS_CHECK(cp >= 1 && q_elems >= 0 && kv_elems >= 0, "a ring of at least one rank, elements >= 0");
  CpRingPasses p;
  if (cp == 1) return p;
  constexpr double kCopy = 4.0, kAdd = 6.0, kZero = 2.0;  // bytes per BF16 element: read + write, read two + write, write
  const double q = q_elems, kv = kv_elems, n = static_cast<double>(cp);
  for (int64_t r = 0; r < cp; ++r) {
    // Forward (AttnFuncWithCPAndKVP2P.forward).
    p.fwd_bytes += kCopy * kv + kZero * q;  // torch.cat of K and V into the send buffer; out = zeros_like(q)
    p.fwd_kernels += 2.0;
    for (int64_t i = 0; i < cp; ++i) {
      if (i > 0) {  // the step's half chunk made contiguous: KV's first half (i <= r) or the queries' second half
        p.fwd_bytes += kCopy * (i <= r ? kv : q) / 2.0;
        p.fwd_kernels += 1.0;
      }
      p.fwd_bytes += kAdd * (i <= r ? q : q / 2.0);  // flash_attn_fwd_out_correction: out += out_i * exp(lse_i - lse)
      p.fwd_kernels += 1.0;
    }
    // Backward (AttnFuncWithCPAndKVP2P.backward): step i, the diagonal last.
    p.bwd_bytes += kCopy * kv;  // KV into the ring buffer (p2p_comm_buffers[0][0].copy_)
    p.bwd_kernels += 1.0;
    for (int64_t i = 0; i < cp; ++i) {
      const bool diagonal = i == cp - 1;
      const bool kv_half = !diagonal && i >= cp - r - 1;  // queries whole, KV's first half
      const bool q_half = !diagonal && !kv_half;          // queries' second half, KV whole
      if (kv_half) p.bwd_bytes += kCopy * kv / 2.0;       // kv[0].contiguous()
      if (q_half) p.bwd_bytes += 3.0 * kCopy * q / 2.0;   // q, out, dout [1].contiguous()
      p.bwd_kernels += kv_half ? 1.0 : q_half ? 3.0 : 0.0;
      // dQ: accumulated whole after the step that first writes it, or its second half.
      if (i > cp - r - 1) {
        p.bwd_bytes += kAdd * q;
      } else if (i == cp - r - 1) {
        p.bwd_bytes += r == cp - 1 ? kCopy * q : (kCopy + kAdd) * q / 2.0;
        p.bwd_kernels += r == cp - 1 ? 0.0 : 1.0;
      } else {
        p.bwd_bytes += (i > 0 ? kAdd : kCopy) * q / 2.0;
      }
      // dK and dV concatenated (torch.cat), then copied or accumulated into the dKV buffer.
      const double step_kv = kv_half ? kv / 2.0 : kv;
      p.bwd_bytes += kCopy * step_kv;
      if (diagonal) {
        p.bwd_bytes += r == 0 ? (kAdd + kCopy) * kv / 2.0 : kAdd * kv;
        p.bwd_kernels += r == 0 ? 1.0 : 0.0;
      } else if (kv_half) {
        p.bwd_bytes += (i == 0 && r == cp - 1 ? kCopy : kAdd) * kv / 2.0;
      } else {
        p.bwd_bytes += (i > 0 ? kAdd : kCopy) * kv;
      }
      p.bwd_kernels += 3.0;  // dQ, the concatenation, dKV
    }
  }
  p.fwd_bytes /= n;
  p.bwd_bytes /= n;
  p.fwd_kernels /= n;
  p.bwd_kernels /= n;
  return p;
}

Fp8QuantizeTime fp8_quantize(const OpEntry& e, const PriceContext& ctx) {
  Fp8QuantizeTime q;
  if (ctx.fp8_peak_flops_per_s <= 0) return q;
  double rows = 0;
  if (e.cls == OpClass::kGemm) {
    if (!ctx.fp8_linear || e.kind == models::OpKind::kLmHead) return q;
    rows = ctx.tokens * e.rows_per_token;
  } else if (e.cls == OpClass::kGroupedGemm) {
    if (!ctx.fp8_linear && !ctx.fp8_experts) return q;
    rows = ctx.expert_rows;
  } else {
    return q;
  }
  // Operands per row, by the op's matrices (k in, n out): one linear reads x (k) and gets
  // dy (n); two chained matrices (k -> n -> k) read x and h, get dy of each; a gated MLP
  // (w1|w3 fused, then w2) reads x and h, gets dy (k) and d[h1|h3] (2n). Under tensor
  // parallelism each GPU quantizes 1/tp of every operand: its sequence shard of the
  // replicated-width ones (TE quantizes before the sequence-parallel all-gather and
  // gathers FP8) and its own columns of the split ones.
  const double k = e.gemm_k / ctx.tp, n = std::max(1.0, e.gemm_n / ctx.tp);
  // An input the previous linear read too is cast once where the stack merges the casts
  // (cal.dense_fp8_shared_input_once): the previous op's forward cast serves this one.
  const bool shared_input = e.cls == OpClass::kGemm && e.same_input_as_prev && ctx.cal->dense_fp8_shared_input_once;
  const double input_elems = shared_input ? 0.0 : k;
  const double fwd_elems = e.gemm_count == 1 ? input_elems : input_elems + n;
  const double bwd_elems = e.gemm_count == 1 ? n : e.gemm_count == 3 ? k + 2.0 * n : k + n;
  const bool tn_only = !fp8_gemm_any_layout(ctx.gpu);
  const double per_elem = fp8_quantize_bytes_per_elem(ctx.fp8_recipe, tn_only);
  double passes = ctx.fp8_recipe == Fp8Recipe::kCurrent ? 2.0 : 1.0;  // kernels per quantized tensor
  if (e.cls == OpClass::kGroupedGemm && ctx.cal->moe_fp8_quantize_per_expert) {
    passes = fp8_grouped_quantize_kernels(ctx.fp8_recipe, ctx.local_experts);
  }
  const double tensors_fwd = (e.gemm_count == 1 ? 1.0 : 2.0) - (shared_input ? 1.0 : 0.0);
  const double tensors_bwd = e.gemm_count == 1 ? 1.0 : 2.0;
  const double bw = ctx.hbm_bw_bytes_per_s * ctx.cal->mem_eff_elementwise;
  q.fwd_bytes = rows * fwd_elems * per_elem;
  q.bwd_bytes = rows * bwd_elems * per_elem;
  q.fwd_launches = tensors_fwd * passes;
  q.bwd_launches = tensors_bwd * passes;
  if (e.cls == OpClass::kGemm && ctx.cal->dense_fp8_weight_cast_per_pass) {
    // torchao's Float8Linear (float8_linear.py at eab345c and 0afa4c1): the forward takes a
    // bf16 weight's amax (tensor_to_scale) and casts it (hp_tensor_and_scale_to_float8),
    // per-tensor bytes without a transposed copy, unless FSDP gathered it as FP8; the
    // backward's dgrad passes the FP8 weight to torch._scaled_mm row-major, which
    // float8_ops.py preprocess_addmm copies column-major (b.t().contiguous().t()): a read
    // and a write of one byte per element.
    const double weight_elems = e.param_elems / ctx.tp;
    if (!ctx.fp8_params) {
      q.fwd_bytes += weight_elems * fp8_quantize_bytes_per_elem(ctx.fp8_recipe, false);
      q.fwd_launches += 2.0;
    }
    q.bwd_bytes += weight_elems * 2.0;
    q.bwd_launches += 1.0;
  }
  q.fwd_s = q.fwd_bytes / bw + q.fwd_launches * ctx.cal->launch_overhead_s;
  q.bwd_s = q.bwd_bytes / bw + q.bwd_launches * ctx.cal->launch_overhead_s;
  return q;
}

double fp8_block_scaled_factor(const Calibration& cal, Fp8Recipe r) {
  return r == Fp8Recipe::kMxfp8 || r == Fp8Recipe::kBlockwise ? cal.fp8_block_scaled_relative_eff : 1.0;
}

// FP4 tensor cores mark a Blackwell-class GPU in the topology: FP8 GEMMs in any layout.
bool fp8_gemm_any_layout(const topologies::GpuSpec* gpu) { return gpu != nullptr && gpu->peak_fp4_flops_per_s > 0; }

// Transformer Engine on an any-layout GPU keeps a per-tensor FP8 operand row-wise only
// (its transpose storage exists only where is_non_tn_fp8_gemm_supported() is false), so
// dgrad (dy x W) and wgrad (x^T x dy) read it in the NN and NT layouts; a block-scaled
// recipe writes both directions and runs all three GEMMs TN. Measured in TE's GEMM
// profiling guide (pre-quantized, B300 vs H200 NVL): see calibration.json
// gemm.fp8_non_tn_backward_relative_efficiency.
double fp8_backward_factor(const PriceContext& ctx) {
  const bool per_tensor = ctx.fp8_recipe == Fp8Recipe::kDelayed || ctx.fp8_recipe == Fp8Recipe::kCurrent;
  return per_tensor && fp8_gemm_any_layout(ctx.gpu) ? ctx.cal->fp8_non_tn_backward_relative_eff : 1.0;
}

ExpertElementwiseBytes expert_elementwise_bytes(const OpEntry& e, const Calibration& cal, double rows, double n) {
  ExpertElementwiseBytes x;
  if (e.cls != OpClass::kGroupedGemm) return x;
  // The fc1 output (w1 | w3: 2 n per gated row) the activation reads, and the fc2
  // output (k per row) the output bias is added to.
  const double fc1 = rows * (e.gemm_count == 3 ? 2.0 : 1.0) * n, fc2 = rows * e.gemm_k;
  if (cal.moe_activation_kernel) {  // the activation is a kernel of its own (not fused into a GEMM)
    x.fwd = fc1 * cal.expert_glu_fwd_bytes;
    x.bwd = fc1 * cal.expert_glu_bwd_bytes;
  }
  if (e.swiglu_limit > 0) {
    x.clamp_fwd = fc1 * cal.expert_clamp_fwd_bytes;
    x.fwd += x.clamp_fwd;
    x.bwd += fc1 * cal.expert_clamp_bwd_bytes;
  }
  if (e.expert_bias) {
    x.fwd += fc2 * cal.expert_bias_fwd_bytes;
    x.bwd += fc2 * cal.expert_bias_bwd_bytes;
  }
  return x;
}

DenseActivationBytes dense_activation_bytes(const OpEntry& e, const Calibration& cal, double rows, double n) {
  DenseActivationBytes x;
  if (e.kind != OpKind::kSharedMlp) return x;
  const bool gated = e.gemm_count == 3;
  const double fc1 = rows * (gated ? 2.0 : 1.0) * n;
  const bool glu_own = gated && cal.dense_glu_act_own;
  x.fwd = fc1 * (glu_own ? cal.dense_glu_act_fwd_bytes : cal.dense_act_fwd_bytes);
  x.bwd = fc1 * (glu_own ? cal.dense_glu_act_bwd_bytes : cal.dense_act_bwd_bytes);
  return x;
}

double attention_head_dim_factor(const std::vector<std::pair<double, double>>& points, double head_dim) {
  return points.empty() ? 1.0 : interpolate_held(points, head_dim);
}

double attention_tiled_span(int64_t window, double seq, double tile, double masked_tile_cost) {
  if (tile <= 0 || seq <= 0) {
    return models::mean_attention_span(static_cast<int64_t>(seq), window, models::FlopConvention::kExact);
  }
  // Query tile b holds rows [b T, min((b+1) T, seq)); its last row sees keys up to
  // itself, its first row back to max(0, b T - window + 1) (0 without a window).
  // A key tile is unmasked when every row of the query tile sees every key in it: it
  // ends at or before the first row (causal) and, with a window, starts no earlier than
  // the last row's first key. flash-attention's forward runs the others in loops of
  // their own that apply the mask to every score (hopper/mainloop_fwd_sm90_tma_gmma_ws.hpp:
  // the causal/local masking iterations, the unmasked ones, then the local left-edge
  // masking iterations; tile bounds in hopper/block.h get_n_block_min_causal_local_mask
  // and get_n_block_min_before_local_mask).
  const double blocks = std::ceil(seq / tile);
  const double w = static_cast<double>(window);
  double scores = 0;
  for (double b = 0; b < blocks; b += 1.0) {
    const double first_row = b * tile, last_row = std::min(seq, (b + 1.0) * tile) - 1.0;
    const double first_key = window > 0 ? std::max(0.0, first_row - w + 1.0) : 0.0;
    const double lo = std::floor(first_key / tile), hi = std::floor(last_row / tile);
    const double unmasked_hi = std::min(hi, std::floor((first_row + 1.0) / tile) - 1.0);
    const double unmasked_lo = window > 0 ? std::max(lo, std::ceil(std::max(0.0, last_row - w + 1.0) / tile)) : lo;
    const double key_tiles = hi - lo + 1.0;
    const double unmasked = std::max(0.0, unmasked_hi - unmasked_lo + 1.0);
    const double masked = key_tiles - unmasked;
    scores += (last_row - first_row + 1.0) * (unmasked + masked_tile_cost * masked) * tile;
  }
  return scores / seq;
}

double attention_masked_tile_scale(const Calibration& cal, double masked_tile_cost) {
  const double tile = cal.attention_tile_tokens, seq = cal.attention_efficiency_seq_tokens;
  if (masked_tile_cost == 1.0 || tile <= 0 || seq <= 0) return 1.0;
  return attention_tiled_span(0, seq, tile, masked_tile_cost) / attention_tiled_span(0, seq, tile);
}

namespace {

double mem_eff(const Calibration& cal, OpClass c) {
  switch (c) {
    case OpClass::kNorm: return cal.mem_eff_norm;
    case OpClass::kRouting: return cal.mem_eff_routing;
    case OpClass::kLoss: return cal.mem_eff_loss;
    case OpClass::kLookup: return cal.mem_eff_lookup;
    default: return cal.mem_eff_elementwise;
  }
}

// Mean keys per query with causal masking and the window (the FLOPs a flash kernel does).
double exact_span(int64_t window, double seq) {
  return models::mean_attention_span(static_cast<int64_t>(seq), window, models::FlopConvention::kExact);
}

}  // namespace

namespace {

// The device time of an op (the roofline below).
OpTime price_op_device(const OpEntry& e, const PriceContext& ctx);

// RoPE rotates two tensors, the queries and the keys (one call each in Megatron-Core's
// attention.py: apply_rotary_pos_emb(query, ...), apply_rotary_pos_emb(key, ...)).
constexpr double kRotatedTensors = 2.0;

}  // namespace

bool rope_runs_unfused(const OpEntry& e, const Calibration& cal) {
  return e.kind == models::OpKind::kRope && e.rope_yarn && cal.rope_yarn_unfused;
}

const Calibration::EagerPasses* eager_passes(const OpEntry& e, const Calibration& cal) {
  if (cal.eager_elementwise.empty()) return nullptr;
  const auto it = cal.eager_elementwise.find(std::string_view(models::to_string(e.kind)));  // no allocation per op
  return it != cal.eager_elementwise.end() ? &it->second : nullptr;
}

namespace {

// The token embedding's lookup (and a learned position table's), per micro-batch on this GPU:
// a gather of the looked-up rows, never a pass over the table. Forward (torch F.embedding /
// Megatron-Core's VocabParallelEmbedding.forward, megatron/core/tensor_parallel/layers.py; JAX's
// take): every TP rank looks up all T tokens of the micro-batch in its V/tp-row shard, reading
// the int64 id and the row of each token in each table and writing the d-wide output row; under
// TP the ids outside the shard look up row 0 and are zeroed after (output_parallel[input_mask, :]
// = 0.0, (tp-1)/tp of the rows written again). Backward (PyTorch embedding_dense_backward_cuda,
// the sorted path of aten/src/ATen/native/cuda/EmbeddingBackwardKernel.cu
// embedding_backward_cuda_kernel): a table-sized gradient zero-filled (at::zeros of the V/tp × d
// shard, a dense write), the ids sorted, each partial segment of gradient rows summed into an
// FP32 buffer (compute_grad_weight: every gradient row read, [A] one partial per token, the upper
// bound when no id repeats) and the partials summed and written into the table's rows
// (sum_and_scatter: partials read, one row written per distinct id, [A] bounded by T). The id
// sort and segment offsets move tens of bytes per token against 12·d and are left out. Rows at
// the lookup class's efficiency, the zero fill included (the class's one rate, as the fit solves
// for it); one forward launch (two under TP) and kEmbeddingBackwardKernels backward launches per
// table.
double embedding_fwd_kernels(const PriceContext& ctx) { return ctx.tp > 1.0 ? 2.0 : 1.0; }

OpTime embedding_lookup_time(const OpEntry& e, const PriceContext& ctx) {
  constexpr double kIndexBytes = 8.0, kRowElemBytes = 2.0, kPartialElemBytes = 4.0;
  // zeros, the ids' iota and sort, unique_by_key, partials_per_segment, exclusive_sum,
  // compute_num_of_partial_segments, partial_segment_offset, compute_grad_weight, sum_and_scatter
  // (EmbeddingBackwardKernel.cu; the radix sort counted as one launch).
  constexpr double kEmbeddingBackwardKernels = 10.0;
  const Calibration& cal = *ctx.cal;
  RS_CHECK(e.param_tensors >= 1, "an embedding op looks up at least one table");
  const double tokens = ctx.tokens;  // every TP rank looks up the whole micro-batch
  const double tables = e.param_tensors;
  const double row_bytes = e.out_elems * kRowElemBytes;
  const double masked_share = (ctx.tp - 1.0) / ctx.tp;
  const double lookup_bw = ctx.hbm_bw_bytes_per_s * cal.mem_eff_lookup;
  const double gather_bytes = tokens * (tables * (kIndexBytes + row_bytes) + row_bytes + masked_share * row_bytes);
  const double zero_bytes = e.param_elems / ctx.tp * kRowElemBytes;
  const double partial_bytes = tokens * e.out_elems * kPartialElemBytes;
  const double segment_sum_bytes =
      tables * (tokens * (kIndexBytes + row_bytes) + 2.0 * partial_bytes + tokens * row_bytes);
  OpTime t;
  t.fwd_flops = e.ew_flops_per_token * tokens / ctx.tp;  // price_op_device's convention for the other ops
  t.bwd_flops = 2.0 * t.fwd_flops;
  t.fwd_s = gather_bytes / lookup_bw + embedding_fwd_kernels(ctx) * cal.launch_overhead_s;
  t.bwd_s = (zero_bytes + segment_sum_bytes) / lookup_bw + tables * kEmbeddingBackwardKernels * cal.launch_overhead_s;
  return t;
}

// Megatron-Core's unfused permute (Layout::moe_permute_fusion false): its device passes per
// micro-batch on this GPU (megatron/core/transformer/moe/moe_utils.py permute / unpermute with
// fused=False, dropless, at main of 2026-05-18, aa786b72c), for T tokens, k routed rows of h
// bf16 elements each, E experts, int64 indices (8 B) and fp32 probs (4 B):
//   dispatch forward, permute(): the routing map transposed (.T.contiguous(), T·E bool read
//     and written); its stable argsort, an iota of T·E int64 indices and one radix pass over
//     the one-byte keys reading and writing keys and indices; the first T·k indices modulo T;
//     the probs transposed (T·E·4 B read and written) and gathered (T·k: index and prob read,
//     prob written); tokens.index_select: every token read once (its k copies from L2), the
//     T·k rows written.
//   dispatch backward (autograd): index_select's, a zeroed T×h buffer and index_add_ of the
//     T·k row gradients into it (PyTorch aten/src/ATen/native/cuda/Indexing.cu, atomic adds);
//     the probs' index backward, a zeroed T·E·4 B buffer and index_put_ with accumulate over
//     the T·k indices (sorted first: read index and gradient, write gradient).
//   combine forward, unpermute() without probs: a zeroed T×h buffer, scatter_add_ of the T·k
//     rows into it (aten/src/ATen/native/cuda/ScatterGatherKernel.cu ReduceAdd: fastAtomicAdd).
//   combine backward: scatter_add_'s, a gather of the T·k rows from the T×h gradient.
// Dense copies and gathers at the elementwise efficiency, the sort and the atomic scatters
// (irregular read-modify-writes) at the routing one; one launch per pass. The chunk sort by
// local expert after the all-to-all (sort_chunks_by_idxs: torch.split and torch.cat when
// unfused) moves the bytes the fused kernel does (price_op_device's sort pass); only its host
// calls differ (unfused_permute_calls).
struct UnfusedPermute {
  OpTime time;
  double fwd_kernels = 0;
};
UnfusedPermute unfused_permute_time(const OpEntry& e, const PriceContext& ctx) {
  using models::OpKind;
  RS_CHECK(e.kind == OpKind::kDispatch || e.kind == OpKind::kCombine, "the unfused permute is the dispatch's and the combine's");
  RS_CHECK(ctx.experts > 0, "the unfused permute needs the routing map's expert count");
  const Calibration& cal = *ctx.cal;
  const double dense_bw = ctx.hbm_bw_bytes_per_s * cal.mem_eff_elementwise;
  const double irregular_bw = ctx.hbm_bw_bytes_per_s * cal.mem_eff_routing;
  const double launch = cal.launch_overhead_s;
  const double tokens = ctx.tokens / ctx.tp;
  const double width = std::min(e.in_elems, e.out_elems);                 // h
  const double rows = tokens * std::max(e.in_elems, e.out_elems) / width;  // T·k
  const double map = tokens * ctx.experts;                                 // T·E
  constexpr double kRowElemBytes = 2.0, kIndexBytes = 8.0, kProbBytes = 4.0, kMaskBytes = 1.0;
  const double token_bytes = tokens * width * kRowElemBytes, row_bytes = rows * width * kRowElemBytes;
  UnfusedPermute u;
  if (e.kind == OpKind::kDispatch) {
    const double dense_fwd_bytes = 2.0 * map * kMaskBytes                        // routing map transposed
                                   + 2.0 * rows * kIndexBytes                    // indices modulo T
                                   + 2.0 * map * kProbBytes                      // probs transposed
                                   + rows * (kIndexBytes + 2.0 * kProbBytes)     // probs gathered
                                   + token_bytes + rows * kIndexBytes + row_bytes;  // index_select
    const double sort_bytes = map * kIndexBytes + 2.0 * map * (kMaskBytes + kIndexBytes);
    u.fwd_kernels = 6;
    u.time.fwd_s = dense_fwd_bytes / dense_bw + sort_bytes / irregular_bw + u.fwd_kernels * launch;
    const double zero_bytes = token_bytes + map * kProbBytes;
    const double scatter_bytes = row_bytes + rows * kIndexBytes + token_bytes  // index_add_
                                 + rows * (kIndexBytes + 2.0 * kProbBytes);    // index_put_ (accumulate)
    u.time.bwd_s = zero_bytes / dense_bw + scatter_bytes / irregular_bw + 4.0 * launch;
    return u;
  }
  u.fwd_kernels = 2;
  u.time.fwd_s = token_bytes / dense_bw + (row_bytes + rows * kIndexBytes + token_bytes) / irregular_bw + u.fwd_kernels * launch;
  u.time.bwd_s = (token_bytes + rows * kIndexBytes + row_bytes) / dense_bw + launch;
  return u;
}

bool runs_unfused_permute(const OpEntry& e, const PriceContext& ctx) {
  return ctx.moe_permute_unfused && (e.kind == models::OpKind::kDispatch || e.kind == models::OpKind::kCombine);
}

// The framework calls the unfused permute adds to the op's forward: the permute's or
// unpermute's own, and the chunk sort's (with more than one local expert).
struct UnfusedPermuteCalls {
  double permute = 0, sort_chunks = 0;
};
UnfusedPermuteCalls unfused_permute_calls(const OpEntry& e, const PriceContext& ctx) {
  UnfusedPermuteCalls c;
  if (!runs_unfused_permute(e, ctx)) return c;
  const std::string_view kind = models::to_string(e.kind);
  const auto& permute = ctx.cal->host_unfused_permute_calls;
  const auto& sort = ctx.cal->host_unfused_sort_chunks_calls;
  if (const auto it = permute.find(kind); it != permute.end()) c.permute = it->second;
  if (const auto it = sort.find(kind); ctx.moe_sort_rows && it != sort.end()) c.sort_chunks = it->second;
  return c;
}

// Kernels an op launches (the GPU-side launch count of price_op), with the grouped
// expert GEMMs as one launch per local expert and matrix where the trainer loops over
// experts (Transformer Engine's GroupedLinear runs one cuBLAS GEMM per expert).
double op_kernel_launches(const OpEntry& e, const PriceContext& ctx) {
  switch (e.cls) {
    case OpClass::kGemm: return e.gemm_count + (e.ew_flops_per_token > 0 ? 1.0 : 0.0);
    case OpClass::kGroupedGemm:
      return e.gemm_count * (ctx.cal->grouped_gemm_launch_per_expert ? ctx.local_experts : 1.0) + 1.0;
    default: {
      if (rope_runs_unfused(e, *ctx.cal)) return kRotatedTensors * ctx.cal->rope_yarn_fwd_kernels;
      if (runs_unfused_permute(e, ctx)) return unfused_permute_time(e, ctx).fwd_kernels;
      if (e.kind == models::OpKind::kEmbedding) return embedding_fwd_kernels(ctx);
      const Calibration::EagerPasses* eager = eager_passes(e, *ctx.cal);
      return eager != nullptr ? eager->fwd_kernels : 1.0;
    }
  }
}

// The ops that open each schedule node of Megatron-Core's merged-1F1B layer
// (megatron/core/models/common/model_chunk_schedule_plan.py, TransformerLayerSchedulePlan
// _build_callable_nodes, core_v0.15.0): attn from the layer's first op, post_attn (pre-MLP
// norm and router) after the attention's residual add, then moe_dispatch, mlp (the
// experts) and moe_combine; a dense layer has attn and mlp only (the others are no-ops).
std::vector<size_t> schedule_node_ops(const LayerClass& lc) {
  using models::OpKind;
  std::vector<size_t> first;  // (5) for a MoE layer, (2) for a dense one
  if (lc.ops.empty()) return first;
  first.push_back(0);
  for (size_t j = 0; j + 1 < lc.ops.size(); ++j) {
    if (lc.ops[j].kind == OpKind::kResidualAdd) {
      first.push_back(j + 1);
      break;
    }
  }
  if (!lc.moe) return first;
  for (const OpKind k : {OpKind::kDispatch, OpKind::kExpertMlp, OpKind::kCombine}) {
    for (size_t j = 0; j < lc.ops.size(); ++j) {
      if (lc.ops[j].kind == k) {
        first.push_back(j);
        break;
      }
    }
  }
  return first;
}

}  // namespace

double fp8_expert_host_calls(const OpEntry& e, const PriceContext& ctx) {
  if (e.cls != OpClass::kGroupedGemm || fp8_quantize(e, ctx).fwd_launches <= 0) return 0.0;
  const Calibration& cal = *ctx.cal;
  const auto it = cal.host_fp8_calls_per_local_expert.find(std::string_view(fp8_recipe_name(ctx.fp8_recipe)));
  const double per_expert = it != cal.host_fp8_calls_per_local_expert.end() ? it->second : 0.0;
  return per_expert * ctx.local_experts + (ctx.moe_fp8_pad_rows ? cal.host_fp8_padding_calls : 0.0);
}

double op_host_issue_s(const OpEntry& e, const PriceContext& ctx) {
  const Calibration& cal = *ctx.cal;
  if (ctx.op_issue_s <= 0) return 0.0;
  const auto it = cal.host_calls_per_op.find(std::string_view(models::to_string(e.kind)));  // no allocation per op
  double calls = it != cal.host_calls_per_op.end() ? it->second : 1.0;
  // Eager RoPE: every kernel of the rotation is a framework call of its own.
  if (rope_runs_unfused(e, cal)) calls = kRotatedTensors * cal.rope_yarn_fwd_kernels;
  // Eager norms, RoPE, residual adds: likewise every kernel is a framework call.
  if (const Calibration::EagerPasses* eager = eager_passes(e, cal)) calls = eager->fwd_kernels;
  if (e.cls == OpClass::kGroupedGemm) calls += cal.host_calls_per_local_expert * ctx.local_experts;
  const UnfusedPermuteCalls unfused = unfused_permute_calls(e, ctx);
  calls += unfused.permute + unfused.sort_chunks;
  return calls * ctx.op_issue_s + op_kernel_launches(e, ctx) * cal.launch_overhead_s;
}

LayerHostIssue layer_host_issue(const LayerClass& lc, const PriceContext& ctx, uint32_t cuda_graphs) {
  LayerHostIssue h;
  const auto graphs = [&](CudaGraphScope s) { return (cuda_graphs & cuda_graph_bit(s)) != 0; };
  if (ctx.op_issue_s <= 0 || graphs(CudaGraphScope::kFullIteration)) return h;  // (nothing allocated: sweeps)
  h.op_fwd_s.assign(lc.ops.size(), 0.0);
  h.op_bwd_s.assign(lc.ops.size(), 0.0);
  const Calibration& cal = *ctx.cal;
  double eager_s = 0, captured = 0;  // eager ops' forward host time; captured ops (any > 0: one replay)
  double quantize_fwd_s = 0, quantize_bwd_s = 0;  // eager ops' FP8 quantize launches and FP8 expert calls, per pass
  size_t first_captured = lc.ops.size();
  bool attention_half = true;        // up to the attention's residual add (TransformerLayer._forward_attention)
  for (size_t j = 0; j < lc.ops.size(); ++j) {
    const OpEntry& e = lc.ops[j];
    const double host_s = op_host_issue_s(e, ctx);
    double eager_op_s = host_s, captured_op_s = 0;
    if (attention_half) {
      if (graphs(CudaGraphScope::kAttn)) std::swap(eager_op_s, captured_op_s);
    } else if (!lc.moe) {
      if (graphs(CudaGraphScope::kMlp)) std::swap(eager_op_s, captured_op_s);
    } else if (graphs(CudaGraphScope::kMoe)) {
      std::swap(eager_op_s, captured_op_s);
    } else if (graphs(CudaGraphScope::kMoeRouter)) {
      // The router graph ends where MoELayer.forward leaves it: pre-MLP norm, router, top-k
      // and the shared experts (captured when not overlapped with the dispatch).
      using models::OpKind;
      if (e.kind == OpKind::kRmsNorm || e.kind == OpKind::kRouter || e.kind == OpKind::kTopK ||
          e.kind == OpKind::kSharedMlp) {
        std::swap(eager_op_s, captured_op_s);
      } else if (e.kind == OpKind::kDispatch && graphs(CudaGraphScope::kMoePreprocess)) {
        // The dispatcher's preprocess joins the graph, the unfused permute with it, its calls
        // and the kernels it launches beyond the fused one (it runs before the host sync);
        // the device-to-host copy, sync and all-to-all stay eager.
        const double unfused_launches = runs_unfused_permute(e, ctx) ? op_kernel_launches(e, ctx) - 1.0 : 0.0;
        captured_op_s = (cal.moe_preprocess_calls + unfused_permute_calls(e, ctx).permute) * ctx.op_issue_s +
                        unfused_launches * cal.launch_overhead_s;
        eager_op_s = host_s - captured_op_s;
      }
    }
    eager_s += eager_op_s;
    captured += captured_op_s;
    if (captured_op_s > 0 && first_captured == lc.ops.size()) first_captured = j;
    h.op_fwd_s[j] = eager_op_s;
    h.op_bwd_s[j] = 2.0 * eager_op_s;
    // The op's FP8 quantize kernels are launched by the host one by one, per pass (not
    // doubled in the backward: it quantizes its own count of gradients); a captured op's
    // are replayed with its graph.
    if (cal.host_issues_fp8_quantize && eager_op_s > 0) {
      const Fp8QuantizeTime q = fp8_quantize(e, ctx);
      h.op_fwd_s[j] += q.fwd_launches * cal.launch_overhead_s;
      h.op_bwd_s[j] += q.bwd_launches * cal.launch_overhead_s;
      quantize_fwd_s += q.fwd_launches * cal.launch_overhead_s;
      quantize_bwd_s += q.bwd_launches * cal.launch_overhead_s;
    }
    // The FP8 experts' Python-level calls (fp8_expert_host_calls), the same in each pass.
    if (eager_op_s > 0) {
      const double fp8_s = fp8_expert_host_calls(e, ctx) * ctx.op_issue_s;
      h.op_fwd_s[j] += fp8_s;
      h.op_bwd_s[j] += fp8_s;
      quantize_fwd_s += fp8_s;
      quantize_bwd_s += fp8_s;
    }
    if (e.kind == models::OpKind::kResidualAdd) attention_half = false;
  }
  // Merged-1F1B EP overlap: each node's pass runs through ScheduleNode._forward / _backward
  // (megatron/core/pipeline_parallel/utils.py, core_v0.15.0): event wait and record on its
  // stream, the stream switch, NVTX, its inputs detached; a backward node runs an autograd
  // engine pass of its own. Charged on the node's first op, once per pass (not doubled in
  // the backward: a node's wrapper does the same work either way); eager whatever graphs
  // its ops replay.
  double node_s = 0;
  if (ctx.merged_1f1b && cal.merged_1f1b_calls_per_node > 0) {
    const double per_node_s = cal.merged_1f1b_calls_per_node * ctx.op_issue_s;
    for (const size_t j : schedule_node_ops(lc)) {
      h.op_fwd_s[j] += per_node_s;
      h.op_bwd_s[j] += per_node_s;
      node_s += per_node_s;
    }
  }
  const double replay_s = captured > 0 ? cal.graph_replay_calls * ctx.op_issue_s + cal.launch_overhead_s : 0.0;
  if (first_captured < lc.ops.size()) {
    h.op_fwd_s[first_captured] += replay_s;
    h.op_bwd_s[first_captured] += replay_s;
  }
  h.fwd_s = eager_s + quantize_fwd_s + replay_s + node_s;
  h.bwd_s = 2.0 * eager_s + quantize_bwd_s + replay_s + node_s;
  return h;
}

double sm_share_stretch(double sms, double comm_sms) {
  return sms > comm_sms && comm_sms > 0 ? sms / (sms - comm_sms) : 1.0;
}

double beside_compute_exposed_s(double comm_s, double compute_s, double slow) {
  if (comm_s <= 0) return 0.0;
  return compute_s * slow <= comm_s ? comm_s - compute_s : comm_s * (1.0 - 1.0 / slow);
}

double in_order_issue_s(const std::vector<double>& host_s, const std::vector<double>& device_s) {
  RS_CHECK(host_s.size() == device_s.size(), "one host and one device time per op");
  double host_at_s = 0, device_at_s = 0;
  for (size_t i = 0; i < host_s.size(); ++i) {
    host_at_s += host_s[i];
    device_at_s = std::max(device_at_s, host_at_s) + device_s[i];
  }
  return device_at_s;
}

OpTime price_op(const OpEntry& e, const PriceContext& ctx) { return price_op_device(e, ctx); }

namespace {

// Memory-bound kernels of the expert MLP beside its GEMMs, in an eager trainer that
// runs them on their own (ctx.moe_fp8_pad_rows), for `rows` routed rows of `n` local
// expert width each (the activation kernel, cal.moe_activation_kernel, is priced by
// expert_elementwise_bytes from the stack's byte counts):
//  - FP8 alignment copies (Transformer Engine's Fp8Padding / Fp8Unpadding, which
//    TEGroupedMLP applies to FP8 experts when the dispatcher leaves each expert's row count
//    unaligned): the input rows (k wide) are copied padded and the output rows copied
//    back, forward; the gradients take the reverse copies, backward. Each copy reads and
//    writes its rows in BF16.
struct ExpertRowPasses {
  double fwd_s = 0, bwd_s = 0;
};
ExpertRowPasses expert_row_passes(const OpEntry& e, const PriceContext& ctx, double rows, double n, bool fp8) {
  const Calibration& cal = *ctx.cal;
  ExpertRowPasses x;
  const double bw = ctx.hbm_bw_bytes_per_s * cal.mem_eff_elementwise;
  if (ctx.moe_fp8_pad_rows && fp8) {
    const double copies_s = 2.0 * (rows * e.gemm_k * 2.0 * 2.0) / bw + 2.0 * cal.launch_overhead_s;
    x.fwd_s += copies_s;
    x.bwd_s += copies_s;
  }
  return x;
}

// YaRN RoPE as eager framework ops (rope_runs_unfused): each pass of the rotation
// reads and writes q and k through HBM, cal.rope_yarn_*_bytes per element in all,
// and each is a kernel launch of its own, on both rotated tensors.
OpTime price_unfused_rope(const OpEntry& e, const PriceContext& ctx) {
  const Calibration& cal = *ctx.cal;
  const double elems = e.in_elems * ctx.tokens / ctx.tp;  // q and k, (heads + kv_heads) x head dim per token
  const double bw = ctx.hbm_bw_bytes_per_s * cal.mem_eff_elementwise;
  OpTime t;
  t.fwd_flops = e.ew_flops_per_token * ctx.tokens / ctx.tp;
  t.bwd_flops = 2.0 * t.fwd_flops;
  t.fwd_s = elems * cal.rope_yarn_fwd_bytes / bw + kRotatedTensors * cal.rope_yarn_fwd_kernels * cal.launch_overhead_s;
  t.bwd_s = elems * cal.rope_yarn_bwd_bytes / bw + kRotatedTensors * cal.rope_yarn_bwd_kernels * cal.launch_overhead_s;
  return t;
}

// A norm, RoPE or residual add run as several eager framework ops (eager_passes): each
// op streams its tensors through HBM on its own, the stack's bytes per input element in
// all, and each is a kernel launch of its own.
OpTime price_eager_passes(const OpEntry& e, const Calibration::EagerPasses& p, const PriceContext& ctx) {
  const Calibration& cal = *ctx.cal;
  const double elems = e.in_elems * ctx.tokens / ctx.tp;  // the sequence-parallel share, as the fused pass
  const double bw = ctx.hbm_bw_bytes_per_s * cal.mem_eff_elementwise;
  OpTime t;
  t.fwd_flops = e.ew_flops_per_token * ctx.tokens / ctx.tp;
  t.bwd_flops = 2.0 * t.fwd_flops;
  t.fwd_s = elems * p.fwd_bytes_per_elem / bw + p.fwd_kernels * cal.launch_overhead_s;
  t.bwd_s = elems * p.bwd_bytes_per_elem / bw + p.bwd_kernels * cal.launch_overhead_s;
  return t;
}

// The terms of a grouped expert GEMM op's price (price_op_device, expert_activation_split).
struct GroupedGemmPrice {
  double flops = 0, ew_flops = 0;         // GEMM FLOPs and elementwise FLOPs of one forward
  double peak = 0, bwd_eff = 0, mem_s = 0;
  double gemm_fwd_s = 0;                  // the forward GEMMs' roofline (FLOPs or bytes)
  double kernels = 0;                     // launches per forward: one grouped launch per matrix, the activation
  Fp8QuantizeTime q;
  ExpertRowPasses passes;
  ExpertElementwiseBytes x;
  double ew_bw = 0;                       // bytes per second of the elementwise passes
};
GroupedGemmPrice grouped_gemm_price(const OpEntry& e, const PriceContext& ctx) {
  const Calibration& cal = *ctx.cal;
  GroupedGemmPrice g;
  const double rows = ctx.expert_rows;
  const double n = std::max(1.0, e.gemm_n / (ctx.etp > 0 ? ctx.etp : ctx.tp));
  g.flops = 2.0 * e.gemm_k * n * e.gemm_count * rows;
  double eff = grouped_gemm_efficiency_at(cal, ctx.gemm_peak_eff, ctx.gemm_shape, rows / ctx.local_experts, e.gemm_k, n);
  const bool fp8 = (ctx.fp8_experts || ctx.fp8_linear) && ctx.fp8_peak_flops_per_s > 0;
  g.peak = fp8 ? ctx.fp8_peak_flops_per_s : ctx.peak_flops_per_s;
  // Per-expert dense GEMMs (cal.grouped_per_expert_dense_relative_eff) take the dense FP8
  // factors; otherwise the grouped FP8 measurement (fp8_gemm_relative_eff).
  const bool per_expert_dense = cal.grouped_per_expert_dense_relative_eff > 0;
  if (fp8) {
    eff *= per_expert_dense ? ctx.fp8_dense_rel_eff * fp8_block_scaled_factor(cal, ctx.fp8_recipe) : cal.fp8_gemm_relative_eff;
  }
  g.bwd_eff = eff * (fp8 && per_expert_dense ? fp8_backward_factor(ctx) : 1.0);
  const double operand_bytes = fp8 ? 1.0 : 2.0;  // FP8 operands (as for dense GEMMs)
  const double bytes =
      rows * (2.0 * e.gemm_k * operand_bytes + 3.0 * n * 2.0) + ctx.local_experts * e.gemm_count * e.gemm_k * n * operand_bytes;
  g.mem_s = bytes / (ctx.hbm_bw_bytes_per_s * cal.mem_eff_elementwise);
  g.gemm_fwd_s = std::max(g.flops / (g.peak * eff), g.mem_s);
  g.kernels = e.gemm_count + 1.0;
  g.ew_flops = e.ew_flops_per_token / e.rows_per_token * rows;
  g.q = fp8_quantize(e, ctx);
  g.passes = expert_row_passes(e, ctx, rows, n, fp8);
  g.x = expert_elementwise_bytes(e, cal, rows, n);
  g.ew_bw = ctx.hbm_bw_bytes_per_s * cal.mem_eff_elementwise;
  return g;
}

OpTime price_op_device(const OpEntry& e, const PriceContext& ctx) {
  const Calibration& cal = *ctx.cal;
  const double peak_bf16 = ctx.peak_flops_per_s;
  const double bw = ctx.hbm_bw_bytes_per_s;
  const double tokens = ctx.tokens / ctx.tp;  // sequence-parallel share of the activations
  const double launch = cal.launch_overhead_s;
  OpTime t;
  switch (e.cls) {
    case OpClass::kGemm: {
      const double rows = ctx.tokens * e.rows_per_token;
      const double n = std::max(1.0, e.gemm_n / ctx.tp);
      const double flops = 2.0 * e.gemm_k * n * e.gemm_count * rows;
      double eff = gemm_efficiency_at(cal, ctx.gemm_peak_eff, ctx.gemm_shape, rows, n, e.gemm_k);
      // FP8 for the block's linear layers; the LM head stays in BF16 (as Transformer Engine recipes keep it).
      const bool fp8 = ctx.fp8_linear && ctx.fp8_peak_flops_per_s > 0 && e.kind != models::OpKind::kLmHead;
      const double peak = fp8 ? ctx.fp8_peak_flops_per_s : peak_bf16;
      if (fp8) eff *= ctx.fp8_dense_rel_eff * fp8_block_scaled_factor(cal, ctx.fp8_recipe);
      // An FP8 GEMM reads its operands as FP8 (1 B: the quantized copies) and writes BF16.
      const double operand_bytes = fp8 ? 1.0 : 2.0;
      const double bytes = (e.in_elems * operand_bytes + e.out_elems * 2.0) * ctx.tokens + e.param_elems * operand_bytes / ctx.tp;
      const double mem_s = bytes / (bw * cal.mem_eff_elementwise);
      const double kernels = e.gemm_count + (e.ew_flops_per_token > 0 ? 1.0 : 0.0);
      const Fp8QuantizeTime q = fp8_quantize(e, ctx);
      const double bwd_eff = eff * (fp8 ? fp8_backward_factor(ctx) : 1.0);
      const DenseActivationBytes act = dense_activation_bytes(e, cal, rows, n);
      const double act_bw = bw * cal.mem_eff_elementwise;
      t.fwd_flops = flops + e.ew_flops_per_token * tokens;
      t.bwd_flops = 2.0 * t.fwd_flops;
      t.fwd_s = std::max(flops / (peak * eff), mem_s) + kernels * launch + q.fwd_s + act.fwd / act_bw;
      t.bwd_s = std::max(2.0 * flops / (peak * bwd_eff), 2.0 * mem_s) + 2.0 * kernels * launch + q.bwd_s + act.bwd / act_bw;
      return t;
    }
    case OpClass::kGroupedGemm: {
      const GroupedGemmPrice g = grouped_gemm_price(e, ctx);
      t.fwd_flops = g.flops + g.ew_flops;
      t.bwd_flops = 2.0 * t.fwd_flops;
      t.fwd_s = g.gemm_fwd_s + g.kernels * launch + g.q.fwd_s + g.passes.fwd_s + g.x.fwd / g.ew_bw;
      t.bwd_s = std::max(2.0 * g.flops / (g.peak * g.bwd_eff), 2.0 * g.mem_s) + 2.0 * g.kernels * launch + g.q.bwd_s +
                g.passes.bwd_s + g.x.bwd / g.ew_bw;
      return t;
    }
    case OpClass::kAttention: {
      if (cal.attention_unfused_fwd_bytes > 0) return unfused_attention_time(e, ctx);
      // FLOPs the model does (the exact span) and those the kernel computes (whole tiles:
      // for a 128-token window, a 128-row query tile touches two 128-key tiles), its masked
      // tiles weighted by their cost, held to the measured time at the efficiencies' sequence.
      const Calibration::AttentionEfficiency at128 =
          ctx.gpu != nullptr ? attention_efficiency(cal, *ctx.gpu)
                             : Calibration::AttentionEfficiency{.fwd = cal.attention_fwd_eff,
                                                                .bwd = cal.attention_bwd_eff,
                                                                .masked_tile_cost = cal.attention_masked_tile_cost};
      const double span = exact_span(e.window, ctx.seq);
      const double kernel_span =
          attention_tiled_span(e.window, ctx.seq, cal.attention_tile_tokens, at128.masked_tile_cost) /
          attention_masked_tile_scale(cal, at128.masked_tile_cost);
      const double per_token = attention_flops_per_token(e, span);
      const double flops = per_token * ctx.tokens / ctx.tp;
      const double kernel_flops = attention_flops_per_token(e, kernel_span) * ctx.tokens / ctx.tp;
      // The flat efficiencies hold at head dim 128; the QK^T and PV products contract
      // over / produce the head dim while the softmax work per score does not, so a smaller
      // head dim spends a larger share of the kernel outside the tensor cores. The stack's
      // kernel, where measured on this GPU, runs at its curve's rate at this sequence and
      // head dim instead (a causal benchmark: its diagonal tiles are in it).
      const double hd = std::min(e.qk_head_dim, e.head_dim);
      const Calibration::AttentionKernelCurve* curve = ctx.gpu != nullptr ? attention_kernel_curve(cal, *ctx.gpu) : nullptr;
      const Calibration::AttentionEfficiency eff =
          curve != nullptr ? attention_kernel_efficiency(*curve, ctx.seq, hd)
                           : Calibration::AttentionEfficiency{
                                 .fwd = at128.fwd * attention_head_dim_factor(cal.attention_head_dim_fwd, hd),
                                 .bwd = at128.bwd * attention_head_dim_factor(cal.attention_head_dim_bwd, hd)};
      const double fwd_eff = eff.fwd, bwd_eff = eff.bwd;
      // ALiBi and sinks: elementwise work inside the kernel (one more pass over the scores in backward).
      const double extra = models::attention_extra_flops_per_token(e.alibi, e.sinks, e.heads, span) * ctx.tokens / ctx.tp;
      const double bytes = (e.in_elems + e.out_elems) * ctx.tokens / ctx.tp * 2.0;
      const double mem_s = bytes / (bw * cal.mem_eff_elementwise);
      t.fwd_flops = flops + extra;
      t.bwd_flops = 2.5 * flops + 2.0 * extra;  // models::op_cost: backward recomputes QK^T
      const double wasted = kernel_flops - flops;  // masked scores of the tiles the kernel computes
      t.fwd_s = std::max((t.fwd_flops + wasted) / (peak_bf16 * fwd_eff), mem_s) + launch;
      t.bwd_s = std::max((t.bwd_flops + 2.5 * wasted) / (peak_bf16 * bwd_eff), 2.0 * mem_s) + 2.0 * launch;
      if (ctx.cp_ring > 1.0 && cal.attention_cp_ring_te_passes) {
        // The local heads' queries and keys + values of this micro-batch (at least one KV
        // head per GPU: Megatron-Core replicates query groups fewer than the TP ranks).
        const double q_elems = ctx.tokens * e.heads / ctx.tp * e.head_dim;
        const double kv_elems = ctx.tokens * std::max(1.0, e.kv_heads / ctx.tp) * (e.qk_head_dim + e.head_dim);
        const CpRingPasses ring = cp_ring_attention_passes(q_elems, kv_elems, static_cast<int64_t>(ctx.cp_ring));
        const double ring_bw = bw * cal.mem_eff_elementwise;
        t.fwd_s += ring.fwd_bytes / ring_bw + ring.fwd_kernels * launch;
        t.bwd_s += ring.bwd_bytes / ring_bw + ring.bwd_kernels * launch;
      }
      return t;
    }
    default: {
      if (rope_runs_unfused(e, cal)) return price_unfused_rope(e, ctx);
      if (const Calibration::EagerPasses* eager = eager_passes(e, cal)) return price_eager_passes(e, *eager, ctx);
      if (e.kind == OpKind::kEmbedding) return embedding_lookup_time(e, ctx);
      // Memory-bound: read the input (and weights), write the output.
      const double bytes = (e.in_elems + e.out_elems) * tokens * 2.0 + e.param_elems * 2.0;
      const double s = bytes / (bw * mem_eff(cal, e.cls));
      t.fwd_flops = e.ew_flops_per_token * tokens;
      t.bwd_flops = 2.0 * t.fwd_flops;
      t.fwd_s = s + launch;
      t.bwd_s = 2.0 * s + 2.0 * launch;
      if (runs_unfused_permute(e, ctx)) {
        const OpTime unfused = unfused_permute_time(e, ctx).time;
        t.fwd_s = unfused.fwd_s;
        t.bwd_s = unfused.bwd_s;
      }
      const bool moe_move = e.kind == OpKind::kDispatch || e.kind == OpKind::kCombine;
      if (moe_move && ctx.moe_sort_rows) {
        // Megatron-Core's all-to-all dispatcher sorts the received rows by local expert
        // after the dispatch's all-to-all and back before the combine's (sort_chunks_by_idxs,
        // token_dispatcher.py): one more read and write of every routed row on this GPU;
        // its backward is the inverse sort of the gradient, one pass again.
        const double width = e.kind == OpKind::kDispatch ? e.in_elems : e.out_elems;
        const double sort_s = 2.0 * ctx.expert_rows * width * 2.0 / (bw * cal.mem_eff_elementwise) + launch;
        t.fwd_s += sort_s;
        t.bwd_s += sort_s;
      }
      return t;
    }
  }
}

}  // namespace

bool expert_activation_syncs(const OpEntry& e, const Calibration& cal) {
  return cal.quick_glu_activation_syncs && e.cls == OpClass::kGroupedGemm && e.gemm_count == 3 && e.swiglu_alpha != 1.0;
}

ExpertActivationSplit expert_activation_split(const OpEntry& e, const PriceContext& ctx) {
  RS_CHECK(e.cls == OpClass::kGroupedGemm, "the activation split is an experts op's");
  const Calibration& cal = *ctx.cal;
  const GroupedGemmPrice g = grouped_gemm_price(e, ctx);
  const double fc1_share = (e.gemm_count - 1.0) / e.gemm_count;  // w1 | w3 of w1, w3, w2
  ExpertActivationSplit x;
  x.device_before_s = fc1_share * g.gemm_fwd_s + (e.gemm_count - 1.0) * cal.launch_overhead_s + 0.5 * g.q.fwd_s +
                      0.5 * g.passes.fwd_s + g.x.clamp_fwd / g.ew_bw;
  x.device_after_s = price_op(e, ctx).fwd_s - x.device_before_s;
  const double host_s = op_host_issue_s(e, ctx);
  if (host_s > 0) {
    const auto it = cal.host_calls_per_op.find(std::string_view(models::to_string(e.kind)));
    const double calls = (it != cal.host_calls_per_op.end() ? it->second : 1.0) +
                         cal.host_calls_per_local_expert * ctx.local_experts;
    const double per_expert = cal.grouped_gemm_launch_per_expert ? ctx.local_experts : 1.0;
    x.host_before_share = (0.5 * calls * ctx.op_issue_s + (e.gemm_count - 1.0) * per_expert * cal.launch_overhead_s) / host_s;
  }
  return x;
}

OpTime unfused_attention_time(const OpEntry& e, const PriceContext& ctx) {
  const Calibration& cal = *ctx.cal;
  RS_CHECK(e.cls == OpClass::kAttention, "unfused attention prices attention ops");
  const double seq = ctx.seq;
  // This GPU's heads (heads / tp) over the micro-batch's tokens, every query against every key.
  const double scores = ctx.tokens / ctx.tp * e.heads * seq;
  const double bw = ctx.hbm_bw_bytes_per_s * cal.mem_eff_elementwise;
  const double launch = cal.launch_overhead_s;
  const double qk = e.qk_head_dim, v = e.head_dim;
  // One batched GEMM over the heads: 2 FLOPs per score and contracted element; it writes
  // or reads the fp16 scores once (2 B each); (m, n, k) of one head's product.
  const auto gemm_s = [&](double contract, double m, double n, double k) {
    const double eff = gemm_efficiency_at(cal, ctx.gemm_peak_eff, ctx.gemm_shape, m, n, k);
    return std::max(2.0 * scores * contract / (ctx.peak_flops_per_s * eff), 2.0 * scores / bw) + launch;
  };
  OpTime t;
  const double fwd_gemm_s = gemm_s(qk, seq, seq, qk)    // S = Q K^T, writes the scores
                            + gemm_s(v, seq, v, seq);   // O = P V, reads the probabilities
  const double bwd_gemm_s = gemm_s(v, seq, seq, v)      // dP = dO V^T, writes dP
                            + gemm_s(v, v, seq, seq)    // dV = P^T dO, reads P
                            + gemm_s(qk, seq, qk, seq)  // dQ = dS K, reads dS
                            + gemm_s(qk, qk, seq, seq);  // dK = dS^T Q, reads dS
  // Softmax and dropout: one kernel each way and direction.
  t.fwd_s = fwd_gemm_s + scores * cal.attention_unfused_fwd_bytes / bw + 2.0 * launch;
  t.bwd_s = bwd_gemm_s + scores * cal.attention_unfused_bwd_bytes / bw + 2.0 * launch;
  t.fwd_flops = 2.0 * scores * (qk + v) + 3.0 * scores;
  t.bwd_flops = 2.0 * t.fwd_flops;
  return t;
}

// A linear saves its input; a fused SwiGLU (gemm_count 3) saves x and h, the
// inputs of w1|w3 and of w2, beside the bf16 h1, h3 that its activation
// backward reads.
double saved_gemm_input_elems(const OpEntry& e) {
  const double inputs = e.gemm_count == 3 ? e.gemm_k + e.gemm_n : e.gemm_k;
  return std::min(e.saved_elems, e.rows_per_token * inputs);
}

namespace {

// Of a dense GEMM op's gemm_count GEMMs, how many torchtitan's per-op policy replays
// (ctx.torchtitan_op_sac). Its _custom_policy (torchtitan/models/llama3/parallelize_llama.py
// at e7c0cae and 820504e, torchtitan/parallelisms/parallelize_llama.py at 9dec370) counts the
// aten.mm calls of one checkpointed block ("meta[mm_count_key] += 1", a fresh meta per
// checkpoint context) and saves an mm's output unless the count is even ("Saves output of
// all compute ops, except every second mm"); `mm_count` carries that count through the
// block's ops in forward order. An op's GEMMs run in its own order: a fused SwiGLU as
// w1, w3, w2 (FeedForward.forward, self.w2(F.silu(self.w1(x)) * self.w3(x))). An FP8
// linear counts as one too: torchao's Float8Linear calls torch.mm on Float8Tensors
// (float8_linear.py at eab345c), which the policy's dispatch mode sees as aten.mm before
// the subclass (float8_ops.py float8_mm) turns it into torch._scaled_mm.
double op_sac_replayed_gemms(const OpEntry& e, int64_t* mm_count) {
  double replayed = 0;
  for (int64_t i = 0; i < static_cast<int64_t>(e.gemm_count); ++i) {
    ++*mm_count;
    if (*mm_count % 2 == 0) replayed += 1.0;
  }
  return replayed;
}

}  // namespace

double zero3_gathered_bytes_per_elem(const OpEntry& e, const Layout& l) {
  const bool fp8 = l.fp8_params && l.fp8 == Fp8Gemms::kLinear && e.cls == OpClass::kGemm && e.kind != OpKind::kLmHead;
  return fp8 ? 1.0 : 2.0;
}

double zero3_gathered_dense_bytes(const LayerClass& lc, const Layout& l) {
  double fp8_elems = 0.0;  // elements gathered at one byte instead of two
  for (const OpEntry& e : lc.ops) {
    if (zero3_gathered_bytes_per_elem(e, l) < 2.0) fp8_elems += e.param_elems;
  }
  return 2.0 * lc.dense_params - fp8_elems;
}

BlockTime price_ops(const std::vector<OpEntry>& ops, const PriceContext& ctx) {
  BlockTime b;
  int64_t mm_count = 0;  // aten.mm calls so far in the block (ctx.torchtitan_op_sac)
  for (const auto& e : ops) {
    const OpTime t = price_op(e, ctx);
    b.fwd_s += t.fwd_s;
    b.bwd_s += t.bwd_s;
    b.fwd_flops += t.fwd_flops;
    b.bwd_flops += t.bwd_flops;
    if (e.cls == OpClass::kGroupedGemm) b.expert_fwd_s += t.fwd_s;
    const bool kept = e.cls == OpClass::kGemm || e.cls == OpClass::kGroupedGemm || e.cls == OpClass::kAttention;
    // The replayed share of a GEMM op: its forward split evenly over its GEMMs (a fused
    // SwiGLU's activation goes with them).
    const double share = !kept ? 1.0
                         : ctx.torchtitan_op_sac && e.cls == OpClass::kGemm && e.gemm_count > 0
                             ? op_sac_replayed_gemms(e, &mm_count) / e.gemm_count
                             : 0.0;
    b.recompute_selective_s += share * t.fwd_s;
    b.recompute_selective_flops += share * t.fwd_flops;
  }
  return b;
}

}  // namespace rackstep::sim
