// The layer graph: the one description of the architecture.
//
// build_layer_graph() turns a ModelConfig into an ordered list of typed ops
// (forward order). The predictor (sim/) prices each op; the executor (exec/)
// runs each op. Nothing else in rackstep knows the architecture: a feature is
// added here once and both halves see it.
//
// Shapes: every activation is (batch, seq, ...) — an op stores its trailing
// per-token dims; in_shape(b, s) / out_shape(b, s) prepend (b, s).
//
//   LayerGraph g = build_layer_graph(load_model("models/zoo/marin-535b-a23b.json"));
//   ParamCounts p = count_params(g);                    // total / active
//   FlopCounts f = count_flops(g, /*seq=*/4096);          // per token
//   for (const Op& op : g.ops) { OpCost c = op_cost(op, g, batch, seq); ... }
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "models/model.h"

namespace rackstep::models {

enum class OpKind {
  kEmbedding,      // token ids -> (d)
  kRmsNorm,        // learnable gain
  kGatedNorm,      // x * sigmoid(silu(x W_down) W_up)
  kLinear,         // x W; q/k/v/o projections, latent down/up, MLA projections
  kSConv,          // depthwise causal conv along seq, doc-boundary masked
  kQkNorm,         // non-parametric RMSNorm of Q and K, times a fixed multiplier
  kRope,           // partial rotary embedding of Q and K
  kAttention,      // softmax(QK^T/sqrt(hd)) V, causal, window, GQA, doc masking
  kXsa,            // subtract each head output's component along its own v
  kAttnGate,       // o_h *= 2 sigmoid(x W_gate)_h
  kRouter,         // logits = x W_router (+ bias for selection)
  kTopK,           // top-(k+1) threshold selection, quantile balancing bias
  kDispatch,       // EP all-to-all of routed rows (a transfer, no FLOPs)
  kExpertMlp,      // grouped SwiGLU over routed rows
  kCombine,        // EP all-to-all back + weighted sum of k rows per token
  kSharedMlp,      // SwiGLU of the shared experts / dense MLP
  kResidualAdd,
  kLmHead,         // (d) -> (vocab)
  kCrossEntropy,   // + logit z-loss
};

// Every OpKind, for tests that must cover the whole op set (priced by sim,
// run by every exec backend).
inline constexpr OpKind kAllOpKinds[] = {
    OpKind::kEmbedding, OpKind::kRmsNorm,  OpKind::kGatedNorm, OpKind::kLinear,    OpKind::kSConv,
    OpKind::kQkNorm,    OpKind::kRope,     OpKind::kAttention, OpKind::kXsa,       OpKind::kAttnGate,
    OpKind::kRouter,    OpKind::kTopK,     OpKind::kDispatch,  OpKind::kExpertMlp, OpKind::kCombine,
    OpKind::kSharedMlp, OpKind::kResidualAdd, OpKind::kLmHead, OpKind::kCrossEntropy,
};

// Megatron-Core's recompute_modules (TransformerConfig.recompute_modules, used with
// recompute_granularity "selective"): the parts of a block a trainer may
// recompute in the backward instead of saving. An op carries the bits
// (recompute_module_bit) of the modules whose recompute covers it.
enum class RecomputeModule {
  kCoreAttn,       // the attention kernel (normal checkpoint: keeps q, k, v)
  kMlaUpProj,      // MLA q/kv up-projections and RoPE (keeps the latents; q, k, v freed after attention)
  kLayernorm,      // the block's two pre-norms (their outputs discarded)
  kMlp,            // the dense MLP (normal checkpoint: keeps its input)
  kMoeAct,         // the routed experts' activation (its output discarded)
  kMoe,            // the whole MoE layer (normal checkpoint: keeps its input)
  kSharedExperts,  // the shared experts (normal checkpoint: keeps their input)
};
inline constexpr uint32_t recompute_module_bit(RecomputeModule m) { return 1u << static_cast<uint32_t>(m); }
inline constexpr RecomputeModule kAllRecomputeModules[] = {
    RecomputeModule::kCoreAttn, RecomputeModule::kMlaUpProj, RecomputeModule::kLayernorm, RecomputeModule::kMlp,
    RecomputeModule::kMoeAct,   RecomputeModule::kMoe,       RecomputeModule::kSharedExperts,
};
// Megatron-Core's names: "core_attn", "mla_up_proj", "layernorm", "mlp", "moe_act", "moe", "shared_experts".
const char* to_string(RecomputeModule m);

// What class of kernel an op runs as; efficiencies are calibrated per class.
enum class OpClass { kGemm, kGroupedGemm, kAttention, kElementwise, kNorm, kRouting, kLoss, kComm, kLookup };

// How a parameter is updated and counted.
enum class ParamRole {
  kBlockMatrix,    // matrices inside the blocks (MuonH group)
  kExpertMatrix,   // routed-expert matrices (MuonH, per expert)
  kEmbedding,
  kLmHead,
  kRouter,         // router matrix (Adam)
  kOther,          // gains, router bias, SConv kernels, attention gate (Adam)
};

struct ParamTensor {
  std::string name;              // "layers.3.attn.wq"
  std::vector<int64_t> shape;    // (in, out) for matrices, (E, in, out) for experts
  ParamRole role = ParamRole::kOther;
  OptimizerKind optimizer = OptimizerKind::kAdam;
  // Elements this tensor contributes to the active count (Marin convention):
  // top_k/E of routed experts, the stored size of attention projections, 0 for
  // gated norms, gate, SConv, gains, embeddings and the LM head.
  double active_numel = 0.0;
  bool learnable = true;         // false for buffers (the QB router bias)
  int64_t numel() const;
};

// Element type of a tensor in the data flow. kF32 is an activation (stored at
// the run's activation precision); kI32 holds token or expert ids.
enum class DType { kF32, kI32 };

// One dimension of a symbolic shape: "B" and "T" (sequences, tokens per
// sequence) are bound per step and have size 0; every other dim is a model
// dimension with its size ("heads" = 4, "head_dim" = 32).
struct Dim {
  std::string name;
  int64_t size = 0;
};

// A named tensor of the data flow. Names are unique in the graph and written
// once (the residual stream after layer 3's attention is
// "layers.3.resid_mid"); an op lists the tensors it reads and writes, and the
// data flow is exactly those lists: an executor allocates one buffer per
// output and hands each op the buffers its inputs name.
struct TensorDecl {
  std::string name;              // "layers.3.attn.q"
  std::vector<Dim> shape;        // (B, T, heads=4, head_dim=32)
  DType dtype = DType::kF32;
  int64_t elems_per_token() const;   // product of the model dims (B and T excluded)
  std::string shape_string() const;  // "(B, T, heads=4, head_dim=32)"
};

struct Op {
  OpKind kind = OpKind::kLinear;
  OpClass op_class = OpClass::kElementwise;
  std::string name;              // "layers.3.attn.q_proj"
  int32_t layer = -1;            // -1: outside the blocks
  LayerKind layer_kind = LayerKind::kLocal;
  std::vector<int64_t> in_dims;  // per-token trailing dims of the main input
  std::vector<int64_t> out_dims; // per-token trailing dims of the output
  std::vector<ParamTensor> params;
  // The data flow, in the order each OpKind defines (see build_layer_graph):
  // e.g. kAttention reads (q, k, v) and writes (out); kResidualAdd reads
  // (resid, branch) and writes the next resid.
  std::vector<TensorDecl> inputs;
  std::vector<TensorDecl> outputs;
  // A parameter of another op this op reads as its weight (the tied LM head
  // reads "embedding.w", transposed); "" = none.
  std::string shared_param;

  // GEMM geometry: per token, `gemm_rows_per_token` rows of a (k x n) GEMM,
  // `gemm_count` times (3 for SwiGLU). Experts: rows = top_k, k x n = latent x width.
  int64_t gemm_k = 0;
  int64_t gemm_n = 0;
  int64_t gemm_count = 0;
  double gemm_rows_per_token = 0.0;
  bool counts_in_model_flops = false;  // in Marin's MFU FLOP convention

  // Attention geometry (kAttention, kXsa, kRope, kQkNorm).
  int64_t heads = 0;
  int64_t kv_heads = 0;          // used by this layer kind
  int64_t head_dim = 0;          // value dim per head
  int64_t qk_head_dim = 0;       // query/key dim per head (MLA adds the RoPE dims)
  int64_t window = 0;            // 0 = full causal
  double rope_fraction = 0.0;    // kRope: fraction of each head's dims rotated
  bool rope_yarn = false;        // kRope: YaRN-scaled frequencies (AttentionConfig::rope_scaling)

  // kSharedMlp: its activation. Params: SwiGLU w1, w3, w2; GeLU / ReLU² w1, w2;
  // with mlp.bias then one bias per matrix in the same order (b1, [b3,] b2).
  // kLinear: w, then (qkv_bias / o_bias) its bias b (out_stored).
  // kEmbedding: the token table, then (learned positions) the position table.
  MlpActivation activation = MlpActivation::kSwiGlu;
  // kAttention: ALiBi scores (slopes from the head count, alibi_slopes()) and
  // attention sinks (params: one sink logit per query head, (heads)).
  bool alibi = false;
  bool sinks = false;
  // kExpertMlp: the experts' biases (params b1, b3 (E, F) and b2 (E, L) after the
  // matrices), their SwiGLU clamp (0 = none) and the gate's sigmoid scale (1 = SiLU;
  // 1.702 = the quick-GELU gpt-oss uses): ModelConfig::moe's expert variant.
  bool expert_bias = false;
  double swiglu_limit = 0.0;
  double swiglu_alpha = 1.0;

  // Elementwise work per token (hardware FLOPs), and activations this op keeps
  // for its backward, in elements per token (no recomputation).
  double ew_flops_per_token = 0.0;
  double saved_elems_per_token = 0.0;
  // Recompute modules covering this op (bits of recompute_module_bit), and
  // whether the input it saves is a block pre-norm's output (which "layernorm"
  // recompute discards and rebuilds).
  uint32_t recompute_modules = 0;
  bool saves_norm_output = false;

  std::vector<int64_t> in_shape(int64_t batch, int64_t seq) const;
  std::vector<int64_t> out_shape(int64_t batch, int64_t seq) const;
  int64_t in_elems_per_token() const;
  int64_t out_elems_per_token() const;
};

struct LayerGraph {
  ModelConfig model;
  std::vector<Op> ops;           // forward order
  // ops[block_begin[l] .. block_begin[l+1]) are layer l's ops.
  std::vector<size_t> block_begin;
  size_t head_begin = 0;         // first op after the last block (final norm ...)
};

LayerGraph build_layer_graph(const ModelConfig& model);

// The data flow is well formed: every input of every op was written by an
// earlier op (or is a graph input: "tokens", "targets") with the same shape and
// dtype, and no tensor is written twice. Returns "" or the first problem.
std::string check_data_flow(const LayerGraph& g);

// FLOP conventions.
//   kMarin: Marin's MFU convention (spec/marin-architecture.md): 2 x matmul
//           params touched (K/V at the used heads), attention 4*span*H*hd with
//           span = window or seq, no causal halving, plus the softmax/mask term
//           3*span*H (as in Levanter's lm_flops_per_token), LM head, no embedding.
//   kExact: causal halving and window clipping at the sequence start: span is
//           the mean number of visible keys per query.
enum class FlopConvention { kMarin, kExact };

// Mean number of keys a query sees: causal over seq, clipped to window.
double mean_attention_span(int64_t seq, int64_t window, FlopConvention convention);

// ALiBi slopes of `heads` heads (Press et al. 2022, the reference code's
// get_slopes): 2^(-8(h+1)/n) for n = heads a power of two; otherwise those of
// the largest power of two n below, then every other slope of 2n.
std::vector<double> alibi_slopes(int64_t heads);

// Hardware FLOPs per token of an attention op (`heads` query heads) beyond the
// convention's 3·span·H softmax term, at a mean span of `span` keys: ALiBi adds
// slope·distance to every visible score (2 per score); a sink adds one
// exponential and one add to each query row's denominator (2 per head).
// Not in Marin's model FLOPs (Levanter counts neither).
double attention_extra_flops_per_token(bool alibi, bool sinks, double heads, double span);

struct ParamCounts {
  double total = 0;              // every weight, embeddings and LM head included
  double active = 0;             // Marin convention
  double active_with_extras = 0; // + gated norms, SConv, LM head (Marin's "~23.7B")
  double active_total_minus_unselected = 0;  // total - unselected routed experts
  double embedding = 0, lm_head = 0, attention = 0, experts = 0, shared_experts = 0,
         latent = 0, router = 0, gated_norms = 0, norms = 0, sconv = 0, attn_gate = 0,
         dense_mlp = 0;
  double positions = 0;          // learned position table
  double biases = 0;             // linear and MLP biases
  double attn_sinks = 0;         // one sink logit per head per layer
  double by_optimizer[4] = {0, 0, 0, 0};  // indexed by OptimizerKind
};
ParamCounts count_params(const LayerGraph& g);

struct FlopCounts {
  // Forward FLOPs per token, by op class, in the given convention.
  double attention_core = 0, projections = 0, experts = 0, shared = 0, router = 0,
         latent = 0, lm_head = 0, other = 0;
  double forward = 0;            // model FLOPs (sum of the above except `other`)
  double training = 0;           // 3 x forward
  double forward_hardware = 0;   // every op incl. elementwise, norms, gates
};
FlopCounts count_flops(const LayerGraph& g, int64_t seq, FlopConvention convention);

// Hardware FLOPs per token of one training step under a recompute policy:
// forward + backward (2x) + recomputed forward of the ops recompute replays.
enum class Recompute { kNone, kSelective, kFull };
double training_hardware_flops_per_token(const LayerGraph& g, int64_t seq, Recompute policy);

// Per-op cost for one micro-batch of (batch, seq), consumed by sim/ and exec/.
struct OpCost {
  double fwd_flops = 0;          // hardware FLOPs, exact convention for attention
  double bwd_flops = 0;
  double model_fwd_flops = 0;    // Marin convention (0 for ops outside it)
  double bytes_read = 0;         // forward, activations at act_bytes + weights at param_bytes
  double bytes_written = 0;
  double saved_bytes = 0;        // activations kept for backward (no recompute)
  double param_bytes = 0;
};
OpCost op_cost(const Op& op, int64_t batch, int64_t seq, double act_bytes = 2.0,
               double param_bytes = 2.0);

// Training steps of the recipe: explicit, from a token budget, or
// round(tokens_per_active_param * active / tokens_per_step).
int64_t recipe_steps(const LayerGraph& g);

const char* to_string(OpKind k);
const char* to_string(OpClass c);
const char* to_string(ParamRole r);
const char* to_string(DType t);

}  // namespace rackstep::models
