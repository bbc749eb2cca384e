#include "models/model.h"

#include <cmath>

#include "sim/base/check.h"
#include "sim/base/json_io.h"

namespace rackstep::models {

LayerKind ModelConfig::layer_kind(int64_t layer) const {
  if (layer == layers - 1 && attention.last_layer_global) return LayerKind::kGlobal;
  if (attention.global_every <= 0) return LayerKind::kLocal;
  return (layer + 1) % attention.global_every == 0 ? LayerKind::kGlobal : LayerKind::kLocal;
}

int64_t ModelConfig::global_layer_count() const {
  int64_t n = 0;
  for (int64_t l = 0; l < layers; ++l) n += layer_kind(l) == LayerKind::kGlobal;
  return n;
}

const char* to_string(OptimizerKind k) {
  switch (k) {
    case OptimizerKind::kMuonH: return "muonh";
    case OptimizerKind::kMuon: return "muon";
    case OptimizerKind::kAdamH: return "adamh";
    case OptimizerKind::kAdam: return "adam";
  }
  return "?";
}

const char* to_string(LayerKind k) { return k == LayerKind::kGlobal ? "global" : "local"; }

namespace {

const NumberRange kPositive{.min_exclusive = 0.0};
const NumberRange kNonNegative{.min = 0.0};
// Bounds on every count that sizes the layer graph or an allocation, checked
// while reading (a `layers` of 1e5 once took 1.5 GB before any check). Each is
// well above any model in the zoo or in the literature.
constexpr double kMaxLayers = 4096;
constexpr double kMaxWidth = 1 << 20;      // d_model, head_dim, expert / dense widths, latents
constexpr double kMaxHeads = 1 << 14;
constexpr double kMaxVocab = 1 << 24;
constexpr double kMaxSeq = 1 << 24;
constexpr double kMaxExperts = 1 << 16;
NumberRange positive_at_most(double max) { return {.min_exclusive = 0.0, .max = max}; }
NumberRange non_negative_at_most(double max) { return {.min = 0.0, .max = max}; }

OptimizerKind parse_optimizer(JsonReader& r, const std::string& key, OptimizerKind fallback) {
  std::string s = r.choice(key, {"muonh", "muon", "adamh", "adam"}, to_string(fallback));
  if (s == "muonh") return OptimizerKind::kMuonH;
  if (s == "muon") return OptimizerKind::kMuon;
  if (s == "adamh") return OptimizerKind::kAdamH;
  return OptimizerKind::kAdam;
}

AttentionLayerKind parse_layer_kind(JsonReader r, int64_t stored_kv, int64_t heads) {
  AttentionLayerKind k;
  k.kv_heads = r.integer("kv_heads", stored_kv, positive_at_most(kMaxHeads));
  if (k.kv_heads > stored_kv) {
    r.fail("kv_heads", "at most the stored kv_heads (" + std::to_string(stored_kv) + ")",
           std::to_string(k.kv_heads));
  }
  if (heads % k.kv_heads != 0) {
    r.fail("kv_heads", "a divisor of heads (" + std::to_string(heads) + ")",
           std::to_string(k.kv_heads));
  }
  if (r.has("window")) {
    const auto& w = r.raw().at("window");
    if (w.is_string() && w.get<std::string>() == "full") {
      r.ignore("window");
    } else {
      k.window = r.integer("window", positive_at_most(kMaxSeq));
    }
  }
  std::string pos = r.choice("position", {"rope", "nope", "alibi"}, "rope");
  k.position = pos == "rope" ? PositionKind::kRope : (pos == "nope" ? PositionKind::kNope : PositionKind::kAlibi);
  k.rope_fraction = r.number("rope_fraction", 1.0, {.min = 0.0, .max = 1.0});
  if (k.position != PositionKind::kRope) k.rope_fraction = 0.0;
  r.finish();
  return k;
}

YarnConfig parse_yarn(JsonReader r) {
  YarnConfig y;
  y.factor = r.number("factor", {.min = 1.0});
  y.original_max_position_embeddings = r.integer("original_max_position_embeddings", positive_at_most(kMaxSeq));
  y.beta_fast = r.number("beta_fast", 32.0, kPositive);
  y.beta_slow = r.number("beta_slow", 1.0, kPositive);
  y.truncate = r.boolean("truncate", true);
  if (y.beta_slow >= y.beta_fast) {
    r.fail("beta_slow", "less than beta_fast (" + nlohmann::json(y.beta_fast).dump() + ")",
           nlohmann::json(y.beta_slow).dump());
  }
  r.finish();
  return y;
}

void parse_attention(JsonReader r, ModelConfig& m) {
  auto& a = m.attention;
  std::string kind = r.choice("kind", {"gqa", "mla"}, "gqa");
  a.kind = kind == "mla" ? AttentionKind::kMla : AttentionKind::kGqa;
  a.heads = r.integer("heads", positive_at_most(kMaxHeads));
  a.head_dim = r.integer("head_dim", m.d_model / a.heads, positive_at_most(kMaxWidth));
  a.kv_heads = r.integer("kv_heads", a.heads, positive_at_most(kMaxHeads));
  if (a.kv_heads > a.heads) {
    r.fail("kv_heads", "at most heads (" + std::to_string(a.heads) + ")",
           std::to_string(a.kv_heads));
  }
  if (a.heads % a.kv_heads != 0) {
    r.fail("kv_heads", "a divisor of heads (" + std::to_string(a.heads) + ")",
           std::to_string(a.kv_heads));
  }
  a.local = parse_layer_kind(r.object_or_empty("local"), a.kv_heads, a.heads);
  a.global = parse_layer_kind(r.object_or_empty("global"), a.kv_heads, a.heads);
  a.global_every = r.integer("global_every", 1, non_negative_at_most(kMaxLayers));
  a.last_layer_global = r.boolean("last_layer_global", false);
  a.rope_theta = r.number("rope_theta", 10000.0, kPositive);
  a.rope_scaling = r.choice("rope_scaling", {"none", "yarn"}, "none") == "yarn" ? RopeScaling::kYarn : RopeScaling::kNone;
  if (a.rope_scaling == RopeScaling::kYarn) {
    a.yarn = parse_yarn(r.object("yarn"));
  } else if (r.has("yarn")) {
    r.fail("yarn", "no yarn object unless rope_scaling is \"yarn\"", "a yarn object");
  }
  a.qk_norm = r.boolean("qk_norm", false);
  a.qk_norm_multiplier = r.number("qk_norm_multiplier", 1.0, kPositive);
  a.xsa = r.boolean("xsa", false);
  a.gate = r.boolean("gate", false);
  a.qkv_bias = r.boolean("qkv_bias", false);
  a.o_bias = r.boolean("o_bias", false);
  a.sinks = r.boolean("sinks", false);
  if (a.global.window != 0) {
    r.fail("global/window", "no window on global layers (they attend over the full sequence)",
           std::to_string(a.global.window));
  }
  JsonReader mla = r.object_or_empty("mla");
  if (a.kind == AttentionKind::kMla) {
    a.mla_kv_latent = mla.integer("kv_latent", positive_at_most(kMaxWidth));
    a.mla_q_latent = mla.integer("q_latent", 0, non_negative_at_most(kMaxWidth));
    a.mla_rope_dim = mla.integer("rope_dim", 64, non_negative_at_most(kMaxWidth));
    if (a.mla_kv_latent > m.d_model) {
      mla.fail("kv_latent", "at most d_model (" + std::to_string(m.d_model) + ")",
               std::to_string(a.mla_kv_latent));
    }
  }
  mla.finish();
  if (a.kind == AttentionKind::kMla &&
      (a.local.position == PositionKind::kAlibi || a.global.position == PositionKind::kAlibi)) {
    r.fail("local/position", "rope or nope with kind \"mla\" (its decoupled key is rotary)", "\"alibi\"");
  }
  r.finish();
}

void parse_mlp(JsonReader r, ModelConfig& m) {
  const std::string act = r.choice("activation", {"swiglu", "gelu", "relu2"}, "swiglu");
  m.mlp.activation = act == "swiglu" ? MlpActivation::kSwiGlu
                                     : (act == "gelu" ? MlpActivation::kGelu : MlpActivation::kRelu2);
  m.mlp.bias = r.boolean("bias", false);
  // Routed experts are SwiGLU without biases: a setting no dense MLP takes would be ignored.
  const bool dense_mlp = m.moe.experts == 0 || m.moe.dense_layers > 0 || m.moe.shared_experts > 0;
  if (!dense_mlp && m.mlp.activation != MlpActivation::kSwiGlu) {
    r.fail("activation", "swiglu when every MLP is a routed expert (no dense layers or shared experts; experts are SwiGLU)",
           "\"" + act + "\"");
  }
  if (!dense_mlp && m.mlp.bias) {
    r.fail("bias", "false when every MLP is a routed expert (no dense layers or shared experts; experts have no biases)",
           "true");
  }
  r.finish();
}

void parse_position_embedding(JsonReader r, ModelConfig& m) {
  auto& p = m.position_embedding;
  p.learned = r.choice("kind", {"none", "learned"}, "none") == "learned";
  if (!p.learned) {
    if (r.has("max_positions")) r.fail("max_positions", "no max_positions with kind \"none\"", "a table size");
    r.finish();
    return;
  }
  p.max_positions = r.integer("max_positions", m.seq_len, positive_at_most(kMaxSeq));
  if (p.max_positions < m.seq_len) {
    r.fail("max_positions", "at least seq_len (" + std::to_string(m.seq_len) + ")",
           std::to_string(p.max_positions));
  }
  r.finish();
}

void parse_sconv(JsonReader r, ModelConfig& m) {
  m.sconv.kernel = r.integer("kernel", 0, non_negative_at_most(kMaxSeq));
  auto sites = r.string_list("sites", {});
  for (size_t i = 0; i < sites.size(); ++i) {
    const auto& s = sites[i];
    if (s == "k") m.sconv.on_k = true;
    else if (s == "attn_out") m.sconv.on_attn_out = true;
    else if (s == "moe_out") m.sconv.on_moe_out = true;
    else r.fail("sites/" + std::to_string(i), "one of k, attn_out, moe_out", "\"" + s + "\"");
  }
  if (m.sconv.kernel > 0 && sites.empty()) r.fail("sites", "at least one site when kernel > 0", "[]");
  if (m.sconv.kernel == 0 && !sites.empty()) r.fail("kernel", "a kernel size > 0 for the listed sites", "0");
  r.finish();
}

void parse_norm(JsonReader r, ModelConfig& m) {
  auto& n = m.norm;
  n.kind = r.choice("kind", {"rmsnorm", "layernorm"}, "rmsnorm") == "rmsnorm" ? NormKind::kRmsNorm
                                                                           : NormKind::kLayerNorm;
  n.eps = r.number("eps", 1e-6, kPositive);
  n.gated_rank = r.integer("gated_rank", 0, non_negative_at_most(kMaxWidth));
  auto sites = r.string_list("gated_sites", {});
  for (size_t i = 0; i < sites.size(); ++i) {
    const auto& s = sites[i];
    if (s == "pre_attention") n.gated_pre_attention = true;
    else if (s == "pre_mlp") n.gated_pre_mlp = true;
    else if (s == "embedding") n.gated_embedding = true;
    else if (s == "final") n.gated_final = true;
    else r.fail("gated_sites/" + std::to_string(i), "one of pre_attention, pre_mlp, embedding, final",
                "\"" + s + "\"");
  }
  if (n.gated_rank > 0 && sites.empty()) r.fail("gated_sites", "at least one site when gated_rank > 0", "[]");
  if (n.gated_rank == 0 && !sites.empty()) r.fail("gated_rank", "a rank > 0 for the listed sites", "0");
  if (n.gated_rank > m.d_model) {
    r.fail("gated_rank", "at most d_model (" + std::to_string(m.d_model) + ")", std::to_string(n.gated_rank));
  }
  n.embedding_norm = r.boolean("embedding_norm", n.gated_embedding);
  if (n.gated_embedding && !n.embedding_norm) {
    r.fail("embedding_norm", "true when gated_sites has \"embedding\"", "false");
  }
  r.finish();
}

void parse_moe(JsonReader r, ModelConfig& m) {
  auto& e = m.moe;
  e.experts = r.integer("experts", 0, non_negative_at_most(kMaxExperts));
  e.dense_layers = r.integer("dense_layers", e.experts > 0 ? 0 : m.layers, non_negative_at_most(kMaxLayers));
  e.dense_width = r.integer("dense_width", 0, non_negative_at_most(kMaxWidth));
  if (e.dense_layers > m.layers) {
    r.fail("dense_layers", "at most layers (" + std::to_string(m.layers) + ")", std::to_string(e.dense_layers));
  }
  if (e.dense_layers > 0 && e.dense_width == 0) {
    r.fail("dense_width", "a width > 0 for the dense layers", "0");
  }
  if (e.experts == 0) {
    r.finish();
    return;
  }
  e.top_k = r.integer("top_k", positive_at_most(kMaxExperts));
  if (e.top_k > e.experts) {
    r.fail("top_k", "at most experts (" + std::to_string(e.experts) + ")", std::to_string(e.top_k));
  }
  e.expert_width = r.integer("expert_width", positive_at_most(kMaxWidth));
  e.latent = r.integer("latent", 0, non_negative_at_most(kMaxWidth));
  if (e.latent > m.d_model) {
    r.fail("latent", "at most d_model (" + std::to_string(m.d_model) + ")", std::to_string(e.latent));
  }
  e.shared_experts = r.integer("shared_experts", 0, non_negative_at_most(kMaxExperts));
  e.shared_width = r.integer("shared_width", e.shared_experts > 0 ? e.expert_width : 0, non_negative_at_most(kMaxWidth));
  if (e.shared_experts > 0 && e.shared_width == 0) r.fail("shared_width", "a width > 0", "0");
  e.router = r.choice("router", {"sigmoid", "softmax"}, "sigmoid") == "sigmoid" ? RouterKind::kSigmoid
                                                                              : RouterKind::kSoftmax;
  e.routing_weight_sum = r.number("routing_weight_sum", 1.0, kPositive);
  std::string b = r.choice("balancing", {"quantile", "aux_loss", "none"}, "quantile");
  e.balancing = b == "quantile" ? BalancingKind::kQuantile
                                : (b == "aux_loss" ? BalancingKind::kAuxLoss : BalancingKind::kNone);
  e.balancing_bins = r.integer("balancing_bins", 10000, {.min = 2, .max = 1 << 20});
  e.aux_loss_weight = r.number("aux_loss_weight", MoeConfig{}.aux_loss_weight, kNonNegative);
  e.router_z_loss_weight = r.number("router_z_loss_weight", 0.0, kNonNegative);
  e.router_z_loss_applied = r.boolean("router_z_loss_applied", false);
  e.expert_bias = r.boolean("expert_bias", false);
  e.swiglu_alpha = r.number("swiglu_alpha", 1.0, kPositive);
  e.swiglu_limit = r.number("swiglu_limit", 0.0, kNonNegative);
  e.swiglu_linear_offset = r.number("swiglu_linear_offset", 0.0);
  r.finish();
}

void parse_recipe(JsonReader r, ModelConfig& m) {
  auto& c = m.recipe;
  c.batch_seqs = r.integer("batch_seqs", positive_at_most(1 << 24));
  c.steps = r.integer("steps", 0, kNonNegative);
  c.total_tokens = r.integer("total_tokens", 0, kNonNegative);
  c.tokens_per_active_param = r.number("tokens_per_active_param", 0.0, kNonNegative);
  int given = (c.steps > 0) + (c.total_tokens > 0) + (c.tokens_per_active_param > 0);
  if (given != 1) {
    r.fail("", "exactly one of steps, total_tokens, tokens_per_active_param",
           std::to_string(given) + " of them");
  }
  c.warmup_fraction = r.number("warmup_fraction", 0.01, {.min = 0.0, .max = 1.0});
  c.final_lr_fraction = r.number("final_lr_fraction", 0.05, {.min = 0.0, .max = 1.0});
  c.beta1 = r.number("beta1", 0.9062, {.min = 0.0, .max = 1.0});
  c.beta2 = r.number("beta2", 0.95, {.min = 0.0, .max = 1.0});
  c.adam_lr = r.number("adam_lr", 0.0, kNonNegative);
  c.muonh_lr_ratio = r.number("muonh_lr_ratio", 13.0 / 3.0, kPositive);
  c.newton_schulz_steps = r.integer("newton_schulz_steps", 5, non_negative_at_most(100));
  c.grad_clip = r.number("grad_clip", 0.0, kNonNegative);
  JsonReader o = r.object_or_empty("optimizer");
  c.block_matrices = parse_optimizer(o, "block_matrices", OptimizerKind::kMuonH);
  c.lm_head = parse_optimizer(o, "lm_head", OptimizerKind::kAdamH);
  c.embedding = parse_optimizer(o, "embedding", OptimizerKind::kAdam);
  c.other = parse_optimizer(o, "other", OptimizerKind::kAdam);
  o.finish();
  r.finish();
}

void parse_published(JsonReader r, ModelConfig& m) {
  auto& p = m.published;
  // 0 = not published; otherwise a count of at least one parameter (a relative
  // error against 1e-300 printed "error +inf%").
  auto count_or_zero = [&r](const char* key) {
    const double v = r.number(key, 0.0, {.min = 0.0, .max = 1e16});
    if (v > 0 && v < 1) r.fail(key, "0 (not published) or a parameter count >= 1", std::to_string(v));
    return v;
  };
  p.total_params = count_or_zero("total_params");
  p.active_params = count_or_zero("active_params");
  p.active_convention = r.choice("active_convention", {"marin", "total_minus_unselected"}, "marin");
  p.forward_flops_per_token = r.number("forward_flops_per_token", 0.0, kNonNegative);
  p.steps = r.integer("steps", 0, kNonNegative);
  p.source = r.string("source", "");
  r.finish();
}

}  // namespace

ModelConfig parse_model(const nlohmann::json& doc, const std::string& file) {
  JsonReader r(doc, file);
  ModelConfig m;
  m.source_file = file;
  r.ignore("comment");
  r.ignore("$schema");
  m.name = r.string("name");
  m.vocab = r.integer("vocab", positive_at_most(kMaxVocab));
  m.tied_embeddings = r.boolean("tied_embeddings", false);
  m.d_model = r.integer("d_model", positive_at_most(kMaxWidth));
  m.layers = r.integer("layers", positive_at_most(kMaxLayers));
  m.seq_len = r.integer("seq_len", 4096, positive_at_most(kMaxSeq));
  m.init_std_scale = r.number("init_std_scale", 0.5, kPositive);
  m.logit_z_loss_weight = r.number("logit_z_loss_weight", 0.0, kNonNegative);
  parse_attention(r.object("attention"), m);
  if (m.attention.local.window >= m.seq_len && m.attention.global_every != 1) {
    // A window as long as the sequence is legal (it is full attention), kept as given.
  }
  parse_sconv(r.object_or_empty("sconv"), m);
  parse_norm(r.object_or_empty("norm"), m);
  parse_position_embedding(r.object_or_empty("position_embedding"), m);
  parse_moe(r.object_or_empty("moe"), m);
  if (m.moe.experts == 0 && m.moe.dense_width == 0) {
    r.fail("moe", "either experts > 0 or dense_width > 0 (every layer needs an MLP)", "neither");
  }
  parse_mlp(r.object_or_empty("mlp"), m);
  parse_recipe(r.object("recipe"), m);
  parse_published(r.object_or_empty("published"), m);
  r.finish();
  return m;
}

ModelConfig load_model(const std::string& path) { return parse_model(load_json_file(path), path); }

}  // namespace rackstep::models
