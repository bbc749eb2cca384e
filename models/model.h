// The model description: every knob of the Marin MoE family (and its
// relatives: MLA attention, dense or leading-dense layers, softmax routers).
//
// A ModelConfig is read from JSON (schema in models/README.md, examples in
// models/zoo/). Every field has an explicit default here, unknown keys are
// errors, and impossible combinations are rejected with file, JSON path,
// expected and found.
//
//   rackstep::models::ModelConfig m = rackstep::models::load_model("models/zoo/marin-535b-a23b.json");
//   rackstep::models::LayerGraph g = rackstep::models::build_layer_graph(m);
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace rackstep::models {

enum class AttentionKind { kGqa, kMla };
// Position information inside attention: rotary (RoPE), none (NoPE), or ALiBi
// (Press et al. 2022: a per-head linear penalty -slope_h * (i - j) on every
// score, slopes 2^(-8(h+1)/H) for H a power of two).
enum class PositionKind { kRope, kNope, kAlibi };
// Rotary frequency scaling: none (plain RoPE, base rope_theta) or YaRN (Peng et al.
// 2023, "YaRN: Efficient Context Window Extension of Large Language Models": the
// frequencies interpolated per band and cos/sin scaled by an attention factor).
enum class RopeScaling { kNone, kYarn };
// YaRN's parameters (rope_scaling "yarn"), named as HF transformers' rope_scaling
// names them (modeling_rope_utils._compute_yarn_parameters). Over the rotated dims
// d, pair i's frequency θ^(−2i/d) is kept (extrapolated) below the ramp's low end,
// divided by factor (interpolated) above its high end, blended linearly between;
// the ends are the pair indices that turn beta_fast and beta_slow times over
// original_max_position_embeddings positions. cos and sin are scaled by
// 0.1 ln(factor) + 1. gpt-oss (openai/gpt-oss torch/model.py RotaryEmbedding,
// config.json): factor 32, original_max_position_embeddings 4096, beta_fast 32,
// beta_slow 1, truncate false.
struct YarnConfig {
  double factor = 0.0;                            // context extension s (required, >= 1)
  int64_t original_max_position_embeddings = 0;   // the context L before extension (required)
  double beta_fast = 32.0;                        // HF's default
  double beta_slow = 1.0;                         // HF's default
  bool truncate = true;                           // floor/ceil the ramp's ends (HF's default)
};
// MLP activation: SwiGLU (gated, three matrices; Shazeer 2020), or a plain
// two-matrix MLP with GeLU (tanh approximation, as GPT-2) or ReLU² (So et al.
// 2021, "Primer").
enum class MlpActivation { kSwiGlu, kGelu, kRelu2 };
enum class RouterKind { kSigmoid, kSoftmax };
enum class BalancingKind { kQuantile, kAuxLoss, kNone };
enum class NormKind { kRmsNorm, kLayerNorm };
enum class OptimizerKind { kMuonH, kMuon, kAdamH, kAdam };
enum class LayerKind { kLocal, kGlobal };

// Attention settings that differ between local (sliding-window) and global layers.
struct AttentionLayerKind {
  int64_t kv_heads = 0;          // KV heads this layer kind uses (<= stored kv heads)
  int64_t window = 0;            // sliding window in tokens; 0 = full causal
  PositionKind position = PositionKind::kRope;
  double rope_fraction = 1.0;    // fraction of each head's dims rotated
};

struct AttentionConfig {
  AttentionKind kind = AttentionKind::kGqa;
  int64_t heads = 0;
  int64_t head_dim = 0;
  int64_t kv_heads = 0;          // stored KV heads (parameters); kinds may use fewer
  AttentionLayerKind local;
  AttentionLayerKind global;
  // Layer i (0-based) is global iff (i + 1) % global_every == 0, or it is the
  // last layer and last_layer_global. global_every = 1: all global; 0: none.
  int64_t global_every = 1;
  bool last_layer_global = false;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling = RopeScaling::kNone;  // the rotary frequencies' scaling
  YarnConfig yarn;                                 // rope_scaling == kYarn
  bool qk_norm = false;          // non-parametric RMSNorm on Q and K
  double qk_norm_multiplier = 1.0;
  bool xsa = false;              // exclusive self attention
  bool gate = false;             // per-head 2*sigmoid(x W_gate)
  bool qkv_bias = false;         // biases on the Q, K, V projections (GPT-2, Qwen2, gpt-oss)
  bool o_bias = false;           // bias on the output projection (GPT-2, gpt-oss)
  // Attention sinks (gpt-oss): a learnable logit per query head in every
  // softmax denominator, p_ij = exp(l_ij) / (exp(s_h) + sum_j exp(l_ij)).
  bool sinks = false;
  // MLA (kind == kMla): KV compressed to a latent, a decoupled RoPE key.
  int64_t mla_kv_latent = 0;
  int64_t mla_q_latent = 0;      // 0 = queries not compressed
  int64_t mla_rope_dim = 0;
};

struct SConvConfig {
  int64_t kernel = 0;            // 0 = no short convolutions
  bool on_k = false;             // after the K projection
  bool on_attn_out = false;      // on the attention branch output
  bool on_moe_out = false;       // on the MoE (MLP) branch output
};

struct NormConfig {
  NormKind kind = NormKind::kRmsNorm;
  double eps = 1e-6;
  int64_t gated_rank = 0;        // 0 = no gated norms
  bool gated_pre_attention = false;
  bool gated_pre_mlp = false;
  bool gated_embedding = false;
  bool gated_final = false;
  bool embedding_norm = false;   // RMSNorm (with gain) after the embedding
};

// The dense MLPs (dense layers, shared experts). Routed experts stay SwiGLU
// without biases.
struct MlpConfig {
  MlpActivation activation = MlpActivation::kSwiGlu;
  bool bias = false;             // biases on both (gated: all three) projections
};

// Learned absolute position embeddings (GPT-2): a (max_positions, d) table
// added to the token embedding at each token's position in its sequence.
struct PositionEmbeddingConfig {
  bool learned = false;
  int64_t max_positions = 0;     // table rows; defaults to seq_len
};

struct MoeConfig {
  int64_t experts = 0;           // 0 = dense MLP in every layer
  int64_t top_k = 0;
  int64_t expert_width = 0;      // FFN width of one routed expert
  int64_t latent = 0;            // 0 = experts at full width d
  int64_t shared_experts = 0;
  int64_t shared_width = 0;
  RouterKind router = RouterKind::kSigmoid;
  double routing_weight_sum = 1.0;
  BalancingKind balancing = BalancingKind::kQuantile;
  int64_t balancing_bins = 10000;
  double aux_loss_weight = 0.01;  // balancing "aux_loss": weight of E * sum_e f_e P_e (Switch Transformer)
  double router_z_loss_weight = 0.0;
  bool router_z_loss_applied = false;  // logged only when false
  int64_t dense_layers = 0;      // leading dense layers
  int64_t dense_width = 0;       // SwiGLU width of those dense layers
  // The routed experts' own variant (gpt-oss): biases on w1, w3 and w2, and the
  // SwiGLU h = x1 sigmoid(alpha x1) (x3 + linear_offset) with x1 clamped to at most
  // limit and x3 to [-limit, limit] (limit 0: no clamp). The predictor prices them
  // (the stack's expert_elementwise passes); the execution engine runs them
  // (exec/kernels.h ExpertOptions).
  bool expert_bias = false;
  double swiglu_alpha = 1.0;
  double swiglu_limit = 0.0;
  double swiglu_linear_offset = 0.0;
  bool standard_experts() const {
    return !expert_bias && swiglu_alpha == 1.0 && swiglu_limit == 0.0 && swiglu_linear_offset == 0.0;
  }
};

struct RecipeConfig {
  int64_t batch_seqs = 0;        // sequences per step
  int64_t steps = 0;             // explicit step count, or
  int64_t total_tokens = 0;      // a token budget, or
  double tokens_per_active_param = 0.0;  // steps = round(x * active / tokens_per_step)
  double warmup_fraction = 0.01;
  double final_lr_fraction = 0.05;
  double beta1 = 0.9062;
  double beta2 = 0.95;
  double adam_lr = 0.0;          // 0 = LR fit
  double muonh_lr_ratio = 13.0 / 3.0;
  int64_t newton_schulz_steps = 5;
  double grad_clip = 0.0;        // 0 = none
  // Optimizer per parameter role (Marin: MuonH for block matrices, AdamH for
  // the LM head, Adam for everything else).
  OptimizerKind block_matrices = OptimizerKind::kMuonH;
  OptimizerKind lm_head = OptimizerKind::kAdamH;
  OptimizerKind embedding = OptimizerKind::kAdam;
  OptimizerKind other = OptimizerKind::kAdam;  // router, gains, gates, SConv, biases
};

// Published figures for this shape, used by tests and `rackstep params` to
// show the difference. Never used as outputs.
struct PublishedCounts {
  double total_params = 0.0;
  double active_params = 0.0;
  std::string active_convention = "marin";  // "marin" or "total_minus_unselected"
  double forward_flops_per_token = 0.0;
  int64_t steps = 0;
  std::string source;
};

struct ModelConfig {
  std::string name;
  std::string source_file;       // where it was read from (for error messages)
  int64_t vocab = 0;
  bool tied_embeddings = false;
  int64_t d_model = 0;
  int64_t layers = 0;
  int64_t seq_len = 4096;
  double init_std_scale = 0.5;   // init std = scale / sqrt(d)
  double logit_z_loss_weight = 0.0;
  AttentionConfig attention;
  SConvConfig sconv;
  NormConfig norm;
  MlpConfig mlp;
  PositionEmbeddingConfig position_embedding;
  MoeConfig moe;
  RecipeConfig recipe;
  PublishedCounts published;

  bool is_moe_layer(int64_t layer) const { return moe.experts > 0 && layer >= moe.dense_layers; }
  LayerKind layer_kind(int64_t layer) const;
  const AttentionLayerKind& attention_kind(int64_t layer) const {
    return layer_kind(layer) == LayerKind::kGlobal ? attention.global : attention.local;
  }
  int64_t moe_width() const { return moe.latent > 0 ? moe.latent : d_model; }
  int64_t tokens_per_step() const { return recipe.batch_seqs * seq_len; }
  int64_t global_layer_count() const;
};

// Reads, checks and returns a model. Throws UserError on any bad input.
ModelConfig load_model(const std::string& path);
ModelConfig parse_model(const nlohmann::json& doc, const std::string& file);

const char* to_string(OptimizerKind k);
const char* to_string(LayerKind k);

}  // namespace rackstep::models
