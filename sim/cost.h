// Roofline pricing of layer-graph ops on one GPU.
//
// The layer graph (models/layer_graph.h) is the only description of the
// architecture; build_op_table() compacts it once per model into per-token
// facts (GEMM geometry, attention geometry, bytes, saved activations) and
// groups identical blocks into layer classes (the hero has two: local and
// global attention), so pricing a layout touches ~60 ops instead of ~1,500.
//
// An op's time on a GPU for one micro-batch is the roofline
//     t = max(FLOPs / (peak · eff(class, shape)), bytes / (HBM bw · eff_mem(class)))
//         + kernels · launch overhead
// with eff from sim/calibration.json: dense GEMMs by (m, n, k), grouped expert
// GEMMs by rows per expert (far below peak), flash attention fwd / bwd,
// memory-bound classes by HBM efficiency. Backward is 2× a GEMM's FLOPs
// (dgrad + wgrad), 2.5× attention's (flash recomputes QK^T), 2× the bytes.
//
//   OpTable t = build_op_table(graph);
//   PriceContext ctx = make_price_context(...);          // per layout, cheap
//   OpTime ot = price_op(t.classes[0].ops[3], ctx);        // ot.fwd_s, ot.bwd_s
#pragma once

#include <cstdint>
#include <vector>

#include "models/layer_graph.h"
#include "sim/calibration.h"
#include "sim/layout.h"
#include "topologies/topology.h"

namespace rackstep::sim {

// Per-token facts of one op (from models::Op and models::op_cost).
struct OpEntry {
  models::OpKind kind = models::OpKind::kLinear;
  models::OpClass cls = models::OpClass::kElementwise;
  size_t graph_index = 0;           // index in LayerGraph::ops of the class's first layer
  double gemm_k = 0, gemm_n = 0, gemm_count = 0, rows_per_token = 0;
  double ew_flops_per_token = 0;
  double in_elems = 0, out_elems = 0;  // activation elements per token (read / written)
  double param_elems = 0;
  double param_tensors = 0;         // parameter tensors (a weight, a bias ...)
  double saved_elems = 0;           // kept for backward, per token, no recompute
  uint32_t recompute_modules = 0;   // models::Op::recompute_modules
  bool saves_norm_output = false;   // models::Op::saves_norm_output
  // Attention geometry.
  double heads = 0, kv_heads = 0, head_dim = 0, qk_head_dim = 0;
  int64_t window = 0;
  bool alibi = false, sinks = false;  // attention: ALiBi scores, sink logits (hardware FLOPs only)
  bool expert_bias = false;         // experts: biases (models::Op::expert_bias)
  double swiglu_limit = 0;          // experts: SwiGLU clamp, 0 = none
  double swiglu_alpha = 1;          // experts: the gate's sigmoid scale (models::Op::swiglu_alpha)
  bool rope_yarn = false;           // rope: YaRN-scaled frequencies (models::Op::rope_yarn)
  bool model_flops = false;         // counts in Marin's MFU FLOPs
  bool same_input_as_prev = false;  // a projection of the input the op before it projects (k, v after q)
};

// Whether the stack runs this op as YaRN RoPE in eager framework ops rather than one
// fused kernel (Calibration::rope_yarn_unfused): priced per pass and per kernel.
bool rope_runs_unfused(const OpEntry& e, const Calibration& cal);

// The stack's eager passes for this op (Calibration::eager_elementwise, by op kind), or
// nullptr where the op is one fused pass.
const Calibration::EagerPasses* eager_passes(const OpEntry& e, const Calibration& cal);

// Blocks with identical op lists (same attention kind, MoE or dense).
struct LayerClass {
  int64_t first_layer = 0;
  int64_t count = 0;
  models::LayerKind kind = models::LayerKind::kLocal;
  bool moe = false;
  std::vector<OpEntry> ops;
  // Parameters of one layer of this class, by how they are sharded.
  double dense_params = 0;          // sharded by FSDP (attention, shared, latent, router, norms ...)
  double expert_params = 0;         // routed experts (sharded by EP)
  double muon_dense_params = 0;     // dense params in the Muon group
  // Muon matrices of one layer: (rows, cols, how many); experts count E each.
  struct Matrix { double m = 0, n = 0, count = 0; bool expert = false; };
  std::vector<Matrix> muon_matrices;
  double saved_elems_per_token = 0; // sum of saved activations (no recompute)
  double saved_gemm_elems_per_token = 0;  // saved by GEMM/attention ops (selective recompute keeps these)
  double saved_dense_gemm_elems_per_token = 0;    // of those, the dense GEMMs' saved inputs (FP8 under Fp8Gemms::kLinear)
  double saved_grouped_gemm_elems_per_token = 0;  // and the expert grouped GEMMs' (FP8 under kLinear or kExperts)
  double max_op_saved_elems = 0;
};

struct OpTable {
  std::vector<LayerClass> classes;
  std::vector<int32_t> layer_class; // (layers) class of each block
  std::vector<OpEntry> pre;         // embedding (+ its norm)
  std::vector<OpEntry> head;        // final norm, LM head, cross-entropy
  double embedding_params = 0;
  double head_params = 0;           // LM head + final norm
  double adam_params = 0;           // params in Adam/AdamH groups
  double muon_params = 0;           // params in Muon/MuonH groups
  double total_params = 0;
  double marin_nonattention_flops_per_token = 0;  // forward, model convention
  int64_t d_model = 0, vocab = 0, layers = 0, experts = 0, top_k = 0, moe_width = 0;
  int64_t seq_len = 0, batch_seqs = 0, ns_steps = 5;
  double expert_width = 0;
};

OpTable build_op_table(const models::LayerGraph& g);

// A module ZeRO-3 gathers, releases and reduce-scatters as one (the parameters of one
// nn.Module of the trainer's model code): over ops [first_op, last_op] of a layer
// class, `op_share` of each of those ops' parameters and backward work (an op holding
// several modules: part of it). `freed_saved_elems`: the op's saved activations
// (elements per token) its backward frees while the op's other modules still run.
struct FsdpModule {
  size_t first_op = 0, last_op = 0;
  double param_elems = 0;           // whole model (per GPU: / tp)
  double param_tensors = 1;         // its parameter tensors (a weight and its bias: 2)
  double op_share = 1.0;
  double freed_saved_elems = 0;
};

// The modules of one layer of class lc whose parameters ZeRO-3 shards (dense
// parameter-holding ops; the grouped expert GEMMs are not), forward order. With
// cal.fsdp_megatron_modules, Megatron-LM's: the projections of one input are one
// Linear (megatron/model/transformer.py ParallelAttention.query_key_value, 3h x h),
// and a dense MLP is two, dense_h_to_4h and dense_4h_to_h (ParallelMLP; a gated
// MLP's fc1 holds both input matrices, Megatron-Core's linear_fc1); otherwise each
// parameter-holding op is one.
std::vector<FsdpModule> fsdp_modules(const LayerClass& lc, const Calibration& cal);

// Marin-convention training FLOPs per token (3 × forward) at a sequence length;
// equals models::count_flops(g, seq, kMarin).training.
double model_flops_per_token(const OpTable& t, int64_t seq);

// What a GPU processes per micro-batch under a layout.
struct PriceContext {
  const topologies::GpuSpec* gpu = nullptr;
  const Calibration* cal = nullptr;
  double tokens = 0;                // tokens per micro-batch on this GPU (after CP split)
  double seq = 0;                   // full sequence (attention span)
  double tp = 1;
  double etp = 0;                   // expert tensor parallel (Layout::expert_tp); 0 = tp
  double expert_rows = 0;           // routed rows computed on this GPU (padding included)
  double local_experts = 1;
  double peak_flops_per_s = 0;
  double hbm_bw_bytes_per_s = 0;
  double gemm_peak_eff = 0.7;       // gemm_peak_efficiency(cal, gpu), looked up once
  const Calibration::GemmShapeTable* gemm_shape = nullptr;  // gemm_shape_table(cal, gpu), looked up once
  // Dense FP8 GEMMs: efficiency over the BF16 curve on this GPU (fp8_dense_relative_efficiency,
  // looked up once; the grouped GEMMs keep cal.fp8_gemm_relative_eff), and the scaling
  // recipe, whose quantization passes each FP8 GEMM's operands cost (fp8_quantize).
  double fp8_dense_rel_eff = 0.83;
  Fp8Recipe fp8_recipe = Fp8Recipe::kDelayed;

  // FP8 GEMMs (Layout::fp8): the FP8 peak, for block GEMMs (not the LM head) and/or
  // the expert grouped GEMMs; 0 = BF16. Efficiency there: the BF16 curve × fp8_dense_rel_eff (dense) or cal.fp8_gemm_relative_eff (grouped).
  double fp8_peak_flops_per_s = 0;
  bool fp8_linear = false, fp8_experts = false;
  bool fp8_params = false;          // the FP8 GEMMs' weights arrive as FP8 (Layout::fp8_params)
  double op_issue_s = 0;            // host_op_issue_s(cal, gpu): an eager trainer's host time per framework call
  // Passes over the routed rows the layout's dispatcher adds (cal.moe_* and the layout,
  // sim/predict.cpp): a sort by local expert after the dispatch and before the combine
  // (the all-to-all dispatcher, more than one local expert), and FP8 alignment copies
  // of the expert GEMMs' input and output rows (FP8 experts behind that dispatcher).
  bool moe_sort_rows = false;
  bool moe_fp8_pad_rows = false;
  // Megatron-Core's all-to-all dispatcher with moe_permute_fusion off (Layout::moe_permute_fusion):
  // the dispatch and combine run the PyTorch permute and unpermute over a routing map of
  // `experts` columns (sim/cost.cpp unfused_permute_time) and their further host calls.
  bool moe_permute_unfused = false;
  double experts = 0;
  // Megatron-Core's merged-1F1B EP overlap (Layout::ep_a2a_overlap): the host runs each
  // layer's passes as schedule nodes (cal.merged_1f1b_calls_per_node, layer_host_issue).
  bool merged_1f1b = false;
  // torchtitan's per-op selective recompute (Layout::torchtitan_op_sac): what price_ops
  // counts as the selective replay.
  bool torchtitan_op_sac = false;
  // Ranks of a ring context-parallel group (Layout::cp under cp_kind ring; 1 = no ring):
  // the attention op adds the ring's own passes (cp_ring_attention_passes) where the stack
  // runs Transformer Engine's (cal.attention_cp_ring_te_passes).
  double cp_ring = 1;
};

// The device's part of a PriceContext: its BF16 and FP8 peaks, its HBM bandwidth (measured
// where the topology gives it) and the calibration's per-GPU lookups (GEMM efficiency,
// GEMM shape table, FP8 over BF16). The layout's part (tokens, parallelism, FP8 use) is the caller's.
PriceContext device_price_context(const topologies::GpuSpec& gpu, const Calibration& cal);

// Transformer Engine's ring context-parallel attention (AttnFuncWithCPAndKVP2P, TE 1.11
// transformer_engine/pytorch/attention.py, bshd/sbhd, causal, BF16 attention): the HBM
// bytes and kernels of its passes beside the fused-attention calls, for one micro-batch
// on one GPU, the mean over the ring's `cp` ranks. `q_elems`: the local queries' elements
// (and so the output's, dO's, dQ's); `kv_elems`: the local keys' and values' together.
// Each rank holds two half-sequence chunks; step i attends to the KV of rank r - i.
//   forward: K and V concatenated into the send buffer (read + write); the output zeroed;
//     per step i > 0, the half the call needs made contiguous (KV's first half where
//     i <= r, else the queries' second half); per step the output corrected by the
//     step's softmax LSE (out += out_i * exp(lse_i - lse): read both, write), the whole
//     output where i <= r, its second half otherwise.
//   backward: KV copied into the ring buffer; per step but the last (the diagonal):
//     KV's first half contiguous where i >= cp - r - 1, else q, out and dO's second halves;
//     dQ copied or accumulated (whole or second half, by the step), dK and dV
//     concatenated, dKV copied or accumulated.
// 2 B per element (BF16); the FP32 LSE tensors (a head dim's 1/128 of these) are left out.
struct CpRingPasses {
  double fwd_bytes = 0, bwd_bytes = 0;
  double fwd_kernels = 0, bwd_kernels = 0;
};
CpRingPasses cp_ring_attention_passes(double q_elems, double kv_elems, int64_t cp);

// The memory-bound passes that turn one FP8 GEMM op's BF16 inputs into FP8 for one
// micro-batch on this GPU (forward: the activations each matrix reads; backward: the
// output gradients, for dgrad and wgrad), priced at HBM bandwidth. 0 when the op is
// not an FP8 GEMM under ctx. The weights' passes only where the stack casts them every
// pass (cal.dense_fp8_weight_cast_per_pass: torchao); Transformer Engine casts them once
// per step and reuses them across its micro-batches (is_first_microbatch): not charged.
struct Fp8QuantizeTime {
  double fwd_s = 0, bwd_s = 0;
  double fwd_bytes = 0, bwd_bytes = 0;
  // Kernels launched per pass (quantized tensors x kernels per tensor; for a grouped GEMM
  // under cal.moe_fp8_quantize_per_expert, fp8_grouped_quantize_kernels per tensor: a + b x
  // local experts). The host issues each (layer_host_issue, cal.host_issues_fp8_quantize).
  double fwd_launches = 0, bwd_launches = 0;
};
Fp8QuantizeTime fp8_quantize(const OpEntry& op, const PriceContext& ctx);
// HBM bytes per quantized element of a recipe (BF16 read, FP8 written, scales);
// `tn_only`: the GPU's FP8 GEMMs take only the TN layout (a transposed copy is written).
double fp8_quantize_bytes_per_elem(Fp8Recipe r, bool tn_only);
// Block-scaled FP8 GEMM kernels (mxfp8, blockwise) against per-tensor FP8 ones:
// cal.fp8_block_scaled_relative_eff, 1 for the per-tensor recipes.
double fp8_block_scaled_factor(const Calibration& cal, Fp8Recipe r);
// Whether the GPU's FP8 GEMMs take any operand layout (Blackwell: FP4 tensor cores mark it),
// so a per-tensor FP8 operand is kept once, not also as a transposed copy.
bool fp8_gemm_any_layout(const topologies::GpuSpec* gpu);
// A dense FP8 GEMM op's backward (dgrad + wgrad) rate over its forward's: per-tensor recipes
// on an any-layout GPU run the backward GEMMs on the one copy in non-TN layouts
// (cal.fp8_non_tn_backward_relative_eff); block-scaled recipes quantize both directions
// and every GEMM is TN, as are all on a TN-only GPU (1).
double fp8_backward_factor(const PriceContext& ctx);

// Bytes the routed experts' elementwise passes move through HBM outside their GEMMs, in
// one forward and one backward, for `rows` routed rows on this GPU and `n` expert width
// per GPU: the activation kernel, a clamped SwiGLU's clamps and the output biases, as
// the stack runs them (Calibration::expert_*_bytes; the activation only where
// cal.moe_activation_kernel says it is a kernel of its own; 0 where its GEMMs hide them).
struct ExpertElementwiseBytes {
  double fwd = 0, bwd = 0;
  double clamp_fwd = 0;  // of fwd, the clamps (they run before the activation kernel)
};
ExpertElementwiseBytes expert_elementwise_bytes(const OpEntry& e, const Calibration& cal, double rows, double n);

// Bytes a dense MLP's activation moves through HBM as a kernel of its own between fc1
// and fc2 (Megatron's fused bias-GeLU / bias-SwiGLU), in one forward and one backward,
// for `rows` rows and `n` MLP width per GPU: cal.dense_act_*_bytes per fc1-output
// element (2 n per row for a gated MLP, n for a plain one). 0 for ops that are not a
// dense MLP (OpKind::kSharedMlp) and where the stack fuses the activation into a GEMM.
struct DenseActivationBytes {
  double fwd = 0, bwd = 0;
};
DenseActivationBytes dense_activation_bytes(const OpEntry& e, const Calibration& cal, double rows, double n);

// Attention kernel efficiency at head dim `head_dim` relative to head dim 128 (the
// calibration's head-dim points, linear between them, held beyond the ends; 1 without points).
double attention_head_dim_factor(const std::vector<std::pair<double, double>>& points, double head_dim);

// Mean keys per query a flash kernel computes over a causal sequence of `seq` tokens
// (window 0 = full causal, else each query sees its last `window` keys) when it works
// in whole tiles of `tile` queries x `tile` keys: every key tile a query tile touches
// is computed for all its rows. tile 0 = the exact mean span. A key tile that needs the
// mask (some of its scores fall outside the causal band or the window) counts
// `masked_tile_cost` unmasked tiles: the diagonal tile of a causal query tile, both
// tiles of a 128-token window over 128-token tiles.
double attention_tiled_span(int64_t window, double seq, double tile, double masked_tile_cost = 1.0);

// The factor that keeps a full causal sequence of the calibration's
// attention_efficiency_seq_tokens at its measured time when masked tiles cost
// `masked_tile_cost` unmasked ones: its span with masked tiles weighted over its span
// without. 1 when masked tiles cost what unmasked ones do.
double attention_masked_tile_scale(const Calibration& cal, double masked_tile_cost);

// An op's device time (its host issue is op_host_issue_s / layer_host_issue).
struct OpTime {
  double fwd_s = 0, bwd_s = 0;
  double fwd_flops = 0, bwd_flops = 0;  // hardware FLOPs on this GPU
};

// An attention op priced as unfused (cal.attention_unfused_fwd_bytes > 0: Megatron-LM
// before flash attention): per head, a batched GEMM writes the seq x seq scores (Q K^T),
// scale-mask-softmax and dropout pass over them in HBM, a second batched GEMM reads the
// probabilities (P V); backward runs four batched GEMMs (dP, dV, dQ, dK) around the
// dropout and softmax backward passes. Each GEMM is the roofline of its FLOPs at the
// GEMM curve for its shape and its score bytes (2 B per score read or written); the
// elementwise passes move cal.attention_unfused_*_bytes per score. The whole square is
// computed (the causal mask is applied inside the softmax).
OpTime unfused_attention_time(const OpEntry& e, const PriceContext& ctx);

// Host issue time of one forward of an op: framework calls x ctx.op_issue_s plus
// kernel launches x cal.launch_overhead_s (grouped GEMMs one launch per local expert
// and matrix where cal.grouped_gemm_launch_per_expert); 0 when ctx.op_issue_s is 0
// (a compiled step). Its backward issues twice as much (autograd issues the input and
// the weight gradient of each op).
double op_host_issue_s(const OpEntry& op, const PriceContext& ctx);

OpTime price_op(const OpEntry& op, const PriceContext& ctx);

// Whether an experts op's activation syncs the host with the device once per call
// (cal.quick_glu_activation_syncs: the stack's fused quick-GEGLU, the gated activation
// whose gate is x sigmoid(alpha x) with alpha != 1, copies its linear offset to the
// device on every call, a blocking host-to-device copy).
bool expert_activation_syncs(const OpEntry& op, const Calibration& cal);

// The forward of an experts op (OpClass::kGroupedGemm) in two parts at its activation
// kernel, as Megatron-Core's TEGroupedMLP issues it: fc1 (its grouped GEMMs, (gemm_count
// - 1) of the op's gemm_count matrices, and their launches), a clamped GLU's clamps and
// half of the FP8 quantize and padding passes (fc1's input) before it; the activation,
// fc2 and the output bias after. device_*_s sum to price_op's fwd_s; host_before_share is
// the share of the op's host issue (op_host_issue_s) that fc1's module takes: half of the
// op's framework and per-expert calls [A: fc1 and fc2 are alike Transformer Engine
// GroupedLinear modules] and its fc1 launches.
struct ExpertActivationSplit {
  double device_before_s = 0, device_after_s = 0;
  double host_before_share = 0;
};
ExpertActivationSplit expert_activation_split(const OpEntry& op, const PriceContext& ctx);

// Host issue of one pass of one layer of a class under CUDA graphs (Layout::cuda_graphs,
// bits of cuda_graph_bit). Transformer Engine captures a layer's graphed scopes as one
// graph per layer, replayed once per forward and once per backward (Megatron-Core
// transformer_layer.py _te_cuda_graph_replay; TE graph.py Graphed.forward / backward):
// the captured ops cost the host cal.graph_replay_calls framework calls and one launch
// per pass instead of their own calls and launches; the rest stays eager (backward 2x
// its forward), plus, where cal.host_issues_fp8_quantize, each eager op's FP8 quantize launches
// per pass (fp8_quantize: fwd_launches, bwd_launches) and, per pass, its FP8 experts'
// framework calls (fp8_expert_host_calls). full_iteration leaves no host issue at all. Without graphs this is the
// sum of op_host_issue_s over the class's ops. op_fwd_s / op_bwd_s split the same time
// over the ops (a graph's replay on its first captured op), so the timeline issues
// exactly what predict charges; both empty when the host issues nothing.
// Framework calls per pass (forward, and again backward) that an eager FP8 grouped GEMM
// op costs the host beyond its BF16 calls and its quantize launches: per local expert,
// cal.host_fp8_calls_per_local_expert of its recipe (the quantized tensor each
// GroupedLinear builds per expert in tex.split_quantize: its buffers and its Python tensor
// object, Transformer Engine 2.9 / 2.11 csrc/quantizer.cpp create_tensor, where the recipe
// does not allocate the experts' outputs in bulk), and, where the experts' rows are
// padded for FP8 (ctx.moe_fp8_pad_rows), cal.host_fp8_padding_calls (Fp8Padding and
// Fp8Unpadding). 0 for a BF16 op, a dense op, or a GPU without FP8.
double fp8_expert_host_calls(const OpEntry& op, const PriceContext& ctx);

struct LayerHostIssue {
  double fwd_s = 0, bwd_s = 0;
  std::vector<double> op_fwd_s, op_bwd_s;  // (lc.ops.size()) or empty
};
LayerHostIssue layer_host_issue(const LayerClass& lc, const PriceContext& ctx, uint32_t cuda_graphs);

// Wall time of ops one host thread issues in order to one device stream, from a point
// where both are idle (just after a device-to-host sync): the host issues op i in
// host_s[i] after it issued op i-1; the device runs op i for device_s[i] once it is
// issued and op i-1 has run:  H += host_s[i];  D = max(D, H) + device_s[i];  returns D.
// It is max(sum host, sum device) plus the pipeline's fill (the first op's issue) or
// drain (the last op's run) where one side is the slower op by op, and the sum of both
// where host-heavy and device-heavy ops alternate: the host cannot run ahead of a device
// it has just waited for (PyTorch's eager issue: kernel launches are asynchronous, a
// device-to-host copy of a result is not).
double in_order_issue_s(const std::vector<double>& host_s, const std::vector<double>& device_s);

// A collective's kernels hold comm_sms of the GPU's sms SMs while they run (NCCL: one
// thread block per channel), so compute beside them runs on the rest: the factor on the
// compute's time while they overlap (1 when the call holds none, or on a GPU whose
// system does not give its SM count, topologies/topology.cpp gpu.sms).
double sm_share_stretch(double sms, double comm_sms);
// What a call of comm_s beside compute_s of compute takes beyond compute_s, the compute
// stretched by `slow` (sm_share_stretch) until the call ends: the call's excess where
// it outlasts the stretched compute, else the compute's loss to it.
double beside_compute_exposed_s(double comm_s, double compute_s, double slow);

// Sum over a list of ops; `recompute_selective_s` is the forward time of the ops selective
// recompute replays: all but GEMMs, grouped GEMMs and attention; under
// ctx.torchtitan_op_sac also every second dense GEMM of the list in forward order.
struct BlockTime {
  double fwd_s = 0, bwd_s = 0, recompute_selective_s = 0;
  double fwd_flops = 0, bwd_flops = 0, recompute_selective_flops = 0;
  double expert_fwd_s = 0;          // the grouped expert GEMMs (waves overlap these)
};
BlockTime price_ops(const std::vector<OpEntry>& ops, const PriceContext& ctx);
// Of an op's saved activations, the elements that are GEMM inputs (what FP8 GEMMs
// keep as FP8 casts).
double saved_gemm_input_elems(const OpEntry& e);

// Bytes per element a ZeRO-3 gather moves, and the gathered copy holds, of an op's
// weights: bf16, but one byte for the FP8 GEMMs' weights when the trainer gathers them
// as FP8 (Layout::fp8_params under FP8 linears; the LM head stays bf16, as price_op
// prices it). torchao's float8 all-gather under FSDP2 (torchao/float8/fsdp_utils.py at
// 0afa4c1, WeightWithDynamicFloat8CastTensor): fsdp_pre_all_gather casts the local shard
// to float8 with its scale, FSDP2 all-gathers the float8 data, and fsdp_post_all_gather
// wraps it in the Float8Tensor that Float8Linear's matmul takes as already cast.
double zero3_gathered_bytes_per_elem(const OpEntry& e, const Layout& l);
// The bytes of a layer's dense weights one ZeRO-3 gather moves (before the tp split).
double zero3_gathered_dense_bytes(const LayerClass& lc, const Layout& l);

}  // namespace rackstep::sim
