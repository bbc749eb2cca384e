#include "models/layer_graph.h"

#include <cmath>

#include "sim/base/check.h"

namespace rackstep::models {

int64_t ParamTensor::numel() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

std::vector<int64_t> Op::in_shape(int64_t batch, int64_t seq) const {
  std::vector<int64_t> s{batch, seq};
  s.insert(s.end(), in_dims.begin(), in_dims.end());
  return s;
}

std::vector<int64_t> Op::out_shape(int64_t batch, int64_t seq) const {
  std::vector<int64_t> s{batch, seq};
  s.insert(s.end(), out_dims.begin(), out_dims.end());
  return s;
}

static int64_t product(const std::vector<int64_t>& v) {
  int64_t n = 1;
  for (int64_t x : v) n *= x;
  return n;
}

int64_t Op::in_elems_per_token() const { return product(in_dims); }

int64_t TensorDecl::elems_per_token() const {
  int64_t n = 1;
  for (const Dim& d : shape)
    if (d.size > 0) n *= d.size;
  return n;
}

std::string TensorDecl::shape_string() const {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) s += ", ";
    s += shape[i].name;
    if (shape[i].size > 0) s += "=" + std::to_string(shape[i].size);
  }
  return s + ")";
}
int64_t Op::out_elems_per_token() const { return product(out_dims); }

namespace {

// Builds the op list. Each add_* appends one op; the block structure follows
// spec/marin-architecture.md (pre-norm residual blocks, attention then MoE).
class GraphBuilder {
 public:
  explicit GraphBuilder(const ModelConfig& m) : m_(m) { g_.model = m; }

  LayerGraph build() {
    TensorDecl resid = add_embedding();
    for (int32_t l = 0; l < m_.layers; ++l) {
      g_.block_begin.push_back(g_.ops.size());
      resid = add_block(l, resid);
    }
    g_.block_begin.push_back(g_.ops.size());
    g_.head_begin = g_.ops.size();
    add_head(resid);
    return std::move(g_);
  }

 private:
  std::string lname(int32_t l, const std::string& what) const {
    return l < 0 ? what : "layers." + std::to_string(l) + "." + what;
  }

  // A (B, T, dims...) tensor of layer l.
  TensorDecl tensor(int32_t l, const std::string& what, std::vector<Dim> dims,
                    DType dtype = DType::kF32) const {
    TensorDecl t;
    t.name = lname(l, what);
    t.shape = {{"B", 0}, {"T", 0}};
    t.shape.insert(t.shape.end(), dims.begin(), dims.end());
    t.dtype = dtype;
    return t;
  }
  // A tensor of the same shape as `like`, named `what`.
  TensorDecl same_shape(int32_t l, const std::string& what, const TensorDecl& like) const {
    TensorDecl t = like;
    t.name = lname(l, what);
    return t;
  }
  // Declares the op's data flow; returns its first output.
  static TensorDecl flow(Op& op, std::vector<TensorDecl> inputs, std::vector<TensorDecl> outputs) {
    op.inputs = std::move(inputs);
    op.outputs = std::move(outputs);
    return op.outputs.empty() ? TensorDecl{} : op.outputs[0];
  }
  Dim d_model() const { return {"d_model", m_.d_model}; }

  Op& add(OpKind kind, OpClass cls, const std::string& name, int32_t layer,
          std::vector<int64_t> in_dims, std::vector<int64_t> out_dims) {
    Op op;
    op.kind = kind;
    op.op_class = cls;
    op.name = name;
    op.layer = layer;
    op.layer_kind = layer >= 0 ? m_.layer_kind(layer) : LayerKind::kLocal;
    op.in_dims = std::move(in_dims);
    op.out_dims = std::move(out_dims);
    g_.ops.push_back(std::move(op));
    return g_.ops.back();
  }

  static ParamTensor param(std::string name, std::vector<int64_t> shape, ParamRole role,
                           OptimizerKind opt, double active_fraction) {
    ParamTensor p;
    p.name = std::move(name);
    p.shape = std::move(shape);
    p.role = role;
    p.optimizer = opt;
    p.active_numel = active_fraction * static_cast<double>(p.numel());
    return p;
  }

  OptimizerKind opt_for(ParamRole role) const {
    switch (role) {
      case ParamRole::kBlockMatrix:
      case ParamRole::kExpertMatrix: return m_.recipe.block_matrices;
      case ParamRole::kEmbedding: return m_.recipe.embedding;
      case ParamRole::kLmHead: return m_.recipe.lm_head;
      default: return m_.recipe.other;
    }
  }

  // x (in) -> x W (out_used); W stored as (in, out_stored). active: whether the
  // weight is in Marin's active count and model FLOPs.
  // x: the input tensor, y: the output it declares (at the stored width).
  Op& add_linear(int32_t l, const std::string& what, int64_t in, int64_t out_used,
                 int64_t out_stored, bool active, const TensorDecl& x, std::vector<TensorDecl> y,
                 bool saves_input = true) {
    Op& op = add(OpKind::kLinear, OpClass::kGemm, lname(l, what), l, {in}, {out_used});
    flow(op, {x}, std::move(y));
    op.params.push_back(param(lname(l, what + ".w"), {in, out_stored}, ParamRole::kBlockMatrix,
                              opt_for(ParamRole::kBlockMatrix), active ? 1.0 : 0.0));
    op.gemm_k = in;
    op.gemm_n = out_used;
    op.gemm_count = 1;
    op.gemm_rows_per_token = 1.0;
    op.counts_in_model_flops = active;
    op.saved_elems_per_token = saves_input ? static_cast<double>(in) : 0.0;
    return op;
  }

  // A linear with an optional bias b (out_stored) after its weight: one add per output.
  Op& add_projection(bool bias, int32_t l, const std::string& what, int64_t in, int64_t out_used,
                     int64_t out_stored, bool active, const TensorDecl& x, std::vector<TensorDecl> y,
                     bool saves_input = true) {
    Op& op = add_linear(l, what, in, out_used, out_stored, active, x, std::move(y), saves_input);
    if (!bias) return op;
    op.params.push_back(param(lname(l, what + ".b"), {out_stored}, ParamRole::kOther,
                              opt_for(ParamRole::kOther), 0.0));
    op.ew_flops_per_token += static_cast<double>(out_used);
    return op;
  }

  TensorDecl add_rmsnorm(int32_t l, const std::string& what, int64_t width, const TensorDecl& x) {
    Op& op = add(OpKind::kRmsNorm, OpClass::kNorm, lname(l, what), l, {width}, {width});
    const TensorDecl y = flow(op, {x}, {same_shape(l, what + ".out", x)});
    op.params.push_back(param(lname(l, what + ".gain"), {width}, ParamRole::kOther,
                              opt_for(ParamRole::kOther), 0.0));
    op.ew_flops_per_token = 4.0 * static_cast<double>(width);
    op.saved_elems_per_token = static_cast<double>(width) + 1.0;  // input + 1/rms
    return y;
  }

  TensorDecl add_gated_norm(int32_t l, const std::string& what, const TensorDecl& x) {
    const int64_t d = m_.d_model, r = m_.norm.gated_rank;
    Op& op = add(OpKind::kGatedNorm, OpClass::kGemm, lname(l, what), l, {d}, {d});
    const TensorDecl y = flow(op, {x}, {same_shape(l, what + ".out", x)});
    op.params.push_back(param(lname(l, what + ".w_down"), {d, r}, ParamRole::kBlockMatrix,
                              opt_for(ParamRole::kBlockMatrix), 0.0));
    op.params.push_back(param(lname(l, what + ".w_up"), {r, d}, ParamRole::kBlockMatrix,
                              opt_for(ParamRole::kBlockMatrix), 0.0));
    op.gemm_k = d;
    op.gemm_n = r;
    op.gemm_count = 2;  // (d x r) then (r x d): same FLOPs
    op.gemm_rows_per_token = 1.0;
    op.ew_flops_per_token = 6.0 * static_cast<double>(d) + 4.0 * static_cast<double>(r);
    op.saved_elems_per_token = 2.0 * static_cast<double>(d) + static_cast<double>(r);
    return y;
  }

  // A pre-norm site: RMSNorm (+ gated norm) of the residual stream; returns the branch input.
  // In a block (l >= 0) the site is what Megatron-Core's "layernorm" recompute covers.
  TensorDecl add_norm_site(int32_t l, const std::string& what, bool gated, const TensorDecl& resid) {
    const uint32_t module = l >= 0 ? recompute_module_bit(RecomputeModule::kLayernorm) : 0u;
    const TensorDecl x = add_rmsnorm(l, what, m_.d_model, resid);
    g_.ops.back().recompute_modules |= module;
    if (!(gated && m_.norm.gated_rank > 0)) return x;
    const TensorDecl y = add_gated_norm(l, what + "_gate", x);
    g_.ops.back().recompute_modules |= module;
    return y;
  }

  // The convolution runs at the input's (stored) width; channels_used is what sim prices.
  TensorDecl add_sconv(int32_t l, const std::string& what, int64_t channels_used, int64_t channels_stored,
                       const TensorDecl& x) {
    const int64_t k = m_.sconv.kernel;
    Op& op = add(OpKind::kSConv, OpClass::kElementwise, lname(l, what), l, {channels_used},
                 {channels_used});
    const TensorDecl y = flow(op, {x}, {same_shape(l, what + ".out", x)});
    op.params.push_back(param(lname(l, what + ".kernel"), {channels_stored, k}, ParamRole::kOther,
                              opt_for(ParamRole::kOther), 0.0));
    op.ew_flops_per_token = 2.0 * static_cast<double>(k * channels_used);
    op.saved_elems_per_token = static_cast<double>(channels_used);
    return y;
  }

  // resid_out = resid + branch.
  TensorDecl add_residual(int32_t l, const std::string& what, const TensorDecl& resid, const TensorDecl& branch,
                          const std::string& resid_out) {
    Op& op = add(OpKind::kResidualAdd, OpClass::kElementwise, lname(l, what), l, {m_.d_model},
                 {m_.d_model});
    op.ew_flops_per_token = static_cast<double>(m_.d_model);
    return flow(op, {resid, branch}, {tensor(l, resid_out, {d_model()})});
  }

  // tokens (B, T) -> the residual stream (B, T, d_model).
  TensorDecl add_embedding() {
    const int64_t d = m_.d_model;
    Op& op = add(OpKind::kEmbedding, OpClass::kLookup, "embedding", -1, {1}, {d});
    op.params.push_back(param("embedding.w", {m_.vocab, d}, ParamRole::kEmbedding,
                              opt_for(ParamRole::kEmbedding), 0.0));
    if (m_.position_embedding.learned) {
      // The position table's row for each token's position in its sequence, added.
      op.params.push_back(param("embedding.positions", {m_.position_embedding.max_positions, d},
                                ParamRole::kEmbedding, opt_for(ParamRole::kEmbedding), 0.0));
      op.ew_flops_per_token = static_cast<double>(d);
    }
    const TensorDecl x = flow(op, {tensor(-1, "tokens", {}, DType::kI32)}, {tensor(-1, "embedding.out", {d_model()})});
    if (m_.norm.embedding_norm) return add_norm_site(-1, "embedding_norm", m_.norm.gated_embedding, x);
    return x;
  }

  // Returns the attention branch output (B, T, d_model).
  TensorDecl add_attention_gqa(int32_t l, const TensorDecl& x) {
    const auto& a = m_.attention;
    const auto& kind = m_.attention_kind(l);
    const int64_t d = m_.d_model, hd = a.head_dim;
    const int64_t q_width = a.heads * hd;
    const int64_t kv_used = kind.kv_heads * hd, kv_stored = a.kv_heads * hd;
    const Dim heads{"heads", a.heads}, kv_heads{"kv_heads", a.kv_heads}, head_dim{"head_dim", hd};
    // K and V are projected at the stored KV heads; a layer kind using fewer reads the first kv_used.
    Op& q_proj = add_projection(a.qkv_bias, l, "attn.q_proj", d, q_width, q_width, true, x,
                                {tensor(l, "attn.q", {heads, head_dim})});
    q_proj.saves_norm_output = true;
    const TensorDecl q = q_proj.outputs[0];
    TensorDecl k = add_projection(a.qkv_bias, l, "attn.k_proj", d, kv_used, kv_stored, true, x,
                              {tensor(l, "attn.k", {kv_heads, head_dim})}, false).outputs[0];
    const TensorDecl v = add_projection(a.qkv_bias, l, "attn.v_proj", d, kv_used, kv_stored, true, x,
                                    {tensor(l, "attn.v", {kv_heads, head_dim})}, false).outputs[0];
    if (m_.sconv.kernel > 0 && m_.sconv.on_k) k = add_sconv(l, "attn.k_sconv", kv_used, kv_stored, k);
    return add_attention_core(l, a.heads, kind.kv_heads, hd, hd, kind, x, q, {k}, v);
  }

  // MLA: queries (optionally through a latent), K/V from one compressed latent
  // plus a decoupled RoPE key shared by the heads. kv_down's output is two
  // tensors (its first kv_latent columns, then rope_dim); kv_up's is k_nope and v.
  TensorDecl add_attention_mla(int32_t l, const TensorDecl& x) {
    const auto& a = m_.attention;
    const auto& kind = m_.attention_kind(l);
    const int64_t d = m_.d_model, hd = a.head_dim, rope = a.mla_rope_dim;
    const int64_t q_width = a.heads * (hd + rope);
    const Dim heads{"heads", a.heads}, head_dim{"head_dim", hd}, qk_dim{"qk_head_dim", hd + rope};
    const TensorDecl q_out = tensor(l, "attn.q", {heads, qk_dim});
    TensorDecl q;
    const uint32_t up = recompute_module_bit(RecomputeModule::kMlaUpProj);
    if (a.mla_q_latent > 0) {
      Op& q_down = add_projection(a.qkv_bias, l, "attn.q_down", d, a.mla_q_latent, a.mla_q_latent, true, x,
                                  {tensor(l, "attn.q_latent", {{"q_latent", a.mla_q_latent}})});
      q_down.saves_norm_output = true;
      const TensorDecl c = q_down.outputs[0];
      const TensorDecl cn = add_rmsnorm(l, "attn.q_latent_norm", a.mla_q_latent, c);
      g_.ops.back().recompute_modules |= up;
      Op& q_up = add_projection(a.qkv_bias, l, "attn.q_up", a.mla_q_latent, q_width, q_width, true, cn, {q_out});
      q_up.recompute_modules |= up;
      q = q_up.outputs[0];
    } else {
      Op& q_proj = add_projection(a.qkv_bias, l, "attn.q_proj", d, q_width, q_width, true, x, {q_out});
      q_proj.saves_norm_output = true;
      q = q_proj.outputs[0];
    }
    const Op& down = add_projection(a.qkv_bias, l, "attn.kv_down", d, a.mla_kv_latent + rope, a.mla_kv_latent + rope, true, x,
                                {tensor(l, "attn.kv_latent", {{"kv_latent", a.mla_kv_latent}}),
                                 tensor(l, "attn.k_rope", {{"rope_dim", rope}})},
                                false);
    const TensorDecl kv_latent = down.outputs[0], k_rope = down.outputs[1];
    const TensorDecl kv_n = add_rmsnorm(l, "attn.kv_latent_norm", a.mla_kv_latent, kv_latent);
    g_.ops.back().recompute_modules |= up;
    Op& kv_up = add_projection(a.qkv_bias, l, "attn.kv_up", a.mla_kv_latent, 2 * a.heads * hd, 2 * a.heads * hd, true, kv_n,
                               {tensor(l, "attn.k_nope", {heads, head_dim}), tensor(l, "attn.v", {heads, head_dim})});
    kv_up.recompute_modules |= up;
    const TensorDecl k_nope = kv_up.outputs[0], v = kv_up.outputs[1];
    const size_t core_begin = g_.ops.size();
    const TensorDecl out = add_attention_core(l, a.heads, a.heads, hd, hd + rope, kind, x, q, {k_nope, k_rope}, v);
    // Megatron-Core's MLA applies RoPE inside the up-projection checkpoint.
    for (size_t i = core_begin; i < g_.ops.size(); ++i) {
      if (g_.ops[i].kind == OpKind::kRope) g_.ops[i].recompute_modules |= up;
    }
    return out;
  }

  // q (B, T, heads, qk_hd), k (B, T, kv heads, qk_hd) — MLA: the two parts
  // (k_nope, k_rope) the first op reading k assembles — and v (B, T, kv heads,
  // hd) -> QK-norm -> RoPE -> attention -> XSA -> gate -> o_proj -> SConv.
  // x is the branch input (the gate reads it). Returns the branch output.
  TensorDecl add_attention_core(int32_t l, int64_t heads, int64_t kv_heads, int64_t hd, int64_t qk_hd,
                                const AttentionLayerKind& kind, const TensorDecl& x, TensorDecl q,
                                std::vector<TensorDecl> k, const TensorDecl& v) {
    const auto& a = m_.attention;
    // After the first op that reads them, q and k are one tensor each.
    auto qk_flow = [&](Op& op, const std::string& suffix) {
      std::vector<TensorDecl> in{q};
      in.insert(in.end(), k.begin(), k.end());
      TensorDecl k_out = same_shape(l, "attn.k" + suffix, k[0]);
      if (k.size() > 1) k_out.shape.back() = {"qk_head_dim", qk_hd};
      flow(op, std::move(in), {same_shape(l, "attn.q" + suffix, q), k_out});
      q = op.outputs[0];
      k = {op.outputs[1]};
    };
    if (a.qk_norm) {
      Op& op = add(OpKind::kQkNorm, OpClass::kNorm, lname(l, "attn.qk_norm"), l,
                   {heads + kv_heads, qk_hd}, {heads + kv_heads, qk_hd});
      qk_flow(op, "_norm");
      op.heads = heads;
      op.kv_heads = kv_heads;
      op.head_dim = hd;
      op.qk_head_dim = qk_hd;
      op.ew_flops_per_token = 4.0 * static_cast<double>((heads + kv_heads) * qk_hd);
      op.saved_elems_per_token = static_cast<double>((heads + kv_heads) * qk_hd);
    }
    if (kind.position == PositionKind::kRope && kind.rope_fraction > 0) {
      Op& op = add(OpKind::kRope, OpClass::kElementwise, lname(l, "attn.rope"), l,
                   {heads + kv_heads, qk_hd}, {heads + kv_heads, qk_hd});
      op.heads = heads;
      op.kv_heads = kv_heads;
      op.head_dim = hd;
      op.qk_head_dim = qk_hd;
      op.rope_fraction = kind.rope_fraction;
      op.rope_yarn = a.rope_scaling == RopeScaling::kYarn;
      op.ew_flops_per_token = 3.0 * kind.rope_fraction * static_cast<double>((heads + kv_heads) * qk_hd);
      qk_flow(op, "_rot");
    }
    Op& att = add(OpKind::kAttention, OpClass::kAttention, lname(l, "attn.core"), l, {heads, qk_hd},
                  {heads, hd});
    {
      std::vector<TensorDecl> in{q};
      in.insert(in.end(), k.begin(), k.end());
      in.push_back(v);
      flow(att, std::move(in), {tensor(l, "attn.o", {{"heads", heads}, {"head_dim", hd}})});
    }
    TensorDecl o = att.outputs[0];
    att.recompute_modules |= recompute_module_bit(RecomputeModule::kCoreAttn);
    att.heads = heads;
    att.kv_heads = kv_heads;
    att.head_dim = hd;
    att.qk_head_dim = qk_hd;
    att.window = kind.window;
    att.counts_in_model_flops = true;
    att.alibi = kind.position == PositionKind::kAlibi;
    att.sinks = a.sinks;
    if (a.sinks) {
      att.params.push_back(param(lname(l, "attn.sinks"), {heads}, ParamRole::kOther, opt_for(ParamRole::kOther), 0.0));
    }
    // q, k, v, output and the row logsumexp (flash attention keeps these).
    att.saved_elems_per_token =
        static_cast<double>(heads * qk_hd + kv_heads * (qk_hd + hd) + heads * hd + heads);
    if (a.xsa) {
      Op& op = add(OpKind::kXsa, OpClass::kElementwise, lname(l, "attn.xsa"), l, {heads, hd}, {heads, hd});
      o = flow(op, {o, v}, {same_shape(l, "attn.o_xsa", o)});
      op.heads = heads;
      op.kv_heads = kv_heads;
      op.head_dim = hd;
      op.ew_flops_per_token = 6.0 * static_cast<double>(heads * hd);
      op.saved_elems_per_token = static_cast<double>(heads * hd);
    }
    if (a.gate) {
      const int64_t d = m_.d_model;
      Op& op = add(OpKind::kAttnGate, OpClass::kGemm, lname(l, "attn.gate"), l, {heads, hd}, {heads, hd});
      o = flow(op, {o, x}, {same_shape(l, "attn.o_gated", o)});
      op.params.push_back(param(lname(l, "attn.gate.w"), {d, heads}, ParamRole::kOther,
                                opt_for(ParamRole::kOther), 0.0));
      op.heads = heads;
      op.head_dim = hd;
      op.gemm_k = d;
      op.gemm_n = heads;
      op.gemm_count = 1;
      op.gemm_rows_per_token = 1.0;
      op.ew_flops_per_token = static_cast<double>(heads * (hd + 4));
      op.saved_elems_per_token = static_cast<double>(heads * hd + heads);
    }
    TensorDecl out = add_projection(a.o_bias, l, "attn.o_proj", heads * hd, m_.d_model, m_.d_model, true, o,
                                {tensor(l, "attn.out", {d_model()})}).outputs[0];
    if (m_.sconv.kernel > 0 && m_.sconv.on_attn_out) {
      out = add_sconv(l, "attn.out_sconv", m_.d_model, m_.d_model, out);
    }
    return out;
  }

  // A dense MLP (dense layers, shared experts) with the model's activation:
  // SwiGLU (silu(x W1) * (x W3)) W2, or act(x W1) W2 for GeLU / ReLU².
  // inputs: x, and (shared experts) the routed output the result adds to.
  TensorDecl add_mlp(int32_t l, const std::string& what, OpKind kind, int64_t in, int64_t width,
                     std::vector<TensorDecl> inputs) {
    const MlpActivation act = m_.mlp.activation;
    const bool gated = act == MlpActivation::kSwiGlu;
    Op& op = add(kind, OpClass::kGemm, lname(l, what), l, {in}, {in});
    const TensorDecl y = flow(op, std::move(inputs), {tensor(l, what + ".out", {d_model()})});
    op.activation = act;
    op.saves_norm_output = true;  // x, the pre-MLP norm's output
    op.recompute_modules |= m_.is_moe_layer(l) ? recompute_module_bit(RecomputeModule::kSharedExperts) | recompute_module_bit(RecomputeModule::kMoe)
                                : recompute_module_bit(RecomputeModule::kMlp);
    const auto opt = opt_for(ParamRole::kBlockMatrix);
    op.params.push_back(param(lname(l, what + ".w1"), {in, width}, ParamRole::kBlockMatrix, opt, 1.0));
    if (gated) op.params.push_back(param(lname(l, what + ".w3"), {in, width}, ParamRole::kBlockMatrix, opt, 1.0));
    op.params.push_back(param(lname(l, what + ".w2"), {width, in}, ParamRole::kBlockMatrix, opt, 1.0));
    op.gemm_k = in;
    op.gemm_n = width;
    op.gemm_count = gated ? 3 : 2;
    op.gemm_rows_per_token = 1.0;
    op.counts_in_model_flops = true;
    // Per hidden element: silu and the product 5; GeLU's tanh form
    // 0.5 x (1 + tanh(c (x + 0.044715 x³))) 8; ReLU² 2.
    const double act_flops = act == MlpActivation::kSwiGlu ? 5.0 : (act == MlpActivation::kGelu ? 8.0 : 2.0);
    op.ew_flops_per_token = act_flops * static_cast<double>(width);
    // x, the pre-activations (h1, h3 or a) and h.
    op.saved_elems_per_token = static_cast<double>(in + (gated ? 3 : 2) * width);
    if (m_.mlp.bias) {
      const auto other = opt_for(ParamRole::kOther);
      op.params.push_back(param(lname(l, what + ".b1"), {width}, ParamRole::kOther, other, 0.0));
      if (gated) op.params.push_back(param(lname(l, what + ".b3"), {width}, ParamRole::kOther, other, 0.0));
      op.params.push_back(param(lname(l, what + ".b2"), {in}, ParamRole::kOther, other, 0.0));
      op.ew_flops_per_token += static_cast<double>((gated ? 2 : 1) * width + in);
    }
    return y;
  }

  // x (B, T, d_model) -> router -> top-k; [latent_down -> norm] -> dispatch ->
  // experts -> combine -> [latent_up]; shared experts add to it. Returns the branch output.
  TensorDecl add_moe(int32_t l, const TensorDecl& x) {
    const auto& e = m_.moe;
    const int64_t d = m_.d_model, mw = m_.moe_width();
    Op& router = add(OpKind::kRouter, OpClass::kGemm, lname(l, "moe.router"), l, {d}, {e.experts});
    router.params.push_back(param(lname(l, "moe.router.w"), {d, e.experts}, ParamRole::kRouter,
                                  opt_for(ParamRole::kRouter), 1.0));
    ParamTensor bias = param(lname(l, "moe.router.bias"), {e.experts}, ParamRole::kOther,
                             opt_for(ParamRole::kOther), 0.0);
    bias.learnable = e.balancing != BalancingKind::kQuantile;  // QB sets it from statistics
    router.params.push_back(bias);
    router.gemm_k = d;
    router.gemm_n = e.experts;
    router.gemm_count = 1;
    router.gemm_rows_per_token = 1.0;
    router.counts_in_model_flops = true;
    router.ew_flops_per_token = 4.0 * static_cast<double>(e.experts);
    router.saved_elems_per_token = static_cast<double>(e.experts);
    const Dim experts{"experts", e.experts}, top_k{"top_k", e.top_k}, width{"moe_width", mw};
    const TensorDecl logits = flow(router, {x}, {tensor(l, "moe.router_logits", {experts})});

    Op& topk = add(OpKind::kTopK, OpClass::kRouting, lname(l, "moe.topk"), l, {e.experts}, {e.top_k});
    topk.ew_flops_per_token = static_cast<double>(e.experts) * std::log2(static_cast<double>(e.top_k + 2));
    topk.saved_elems_per_token = 2.0 * static_cast<double>(e.top_k);
    flow(topk, {logits},
         {tensor(l, "moe.weights", {top_k}), tensor(l, "moe.expert", {top_k}, DType::kI32)});
    const TensorDecl weights = topk.outputs[0], chosen = topk.outputs[1];

    TensorDecl moe_x = x;
    if (e.latent > 0) {
      const TensorDecl z = add_linear(l, "moe.latent_down", d, e.latent, e.latent, true, x,
                                      {tensor(l, "moe.x_latent", {width})}).outputs[0];
      moe_x = add_rmsnorm(l, "moe.latent_norm", e.latent, z);
    }
    Op& dispatch = add(OpKind::kDispatch, OpClass::kComm, lname(l, "moe.dispatch"), l, {mw},
                       {e.top_k, mw});
    // Rows grouped by expert; `weights` only set the drop priority of the capacity transport.
    const TensorDecl rows = flow(dispatch, {moe_x, weights, chosen}, {tensor(l, "moe.rows", {top_k, width})});
    dispatch.gemm_rows_per_token = static_cast<double>(e.top_k);

    Op& ex = add(OpKind::kExpertMlp, OpClass::kGroupedGemm, lname(l, "moe.experts"), l, {e.top_k, mw},
                 {e.top_k, mw});
    const auto opt = opt_for(ParamRole::kExpertMatrix);
    const double frac = static_cast<double>(e.top_k) / static_cast<double>(e.experts);
    ex.params.push_back(param(lname(l, "moe.experts.w1"), {e.experts, mw, e.expert_width},
                              ParamRole::kExpertMatrix, opt, frac));
    ex.params.push_back(param(lname(l, "moe.experts.w3"), {e.experts, mw, e.expert_width},
                              ParamRole::kExpertMatrix, opt, frac));
    ex.params.push_back(param(lname(l, "moe.experts.w2"), {e.experts, e.expert_width, mw},
                              ParamRole::kExpertMatrix, opt, frac));
    ex.gemm_k = mw;
    ex.gemm_n = e.expert_width;
    ex.gemm_count = 3;
    ex.gemm_rows_per_token = static_cast<double>(e.top_k);
    ex.counts_in_model_flops = true;
    ex.ew_flops_per_token = 5.0 * static_cast<double>(e.top_k * e.expert_width);
    ex.saved_elems_per_token = static_cast<double>(e.top_k * (mw + 3 * e.expert_width));
    ex.swiglu_limit = e.swiglu_limit;
    ex.swiglu_alpha = e.swiglu_alpha;
    if (e.swiglu_limit > 0) ex.ew_flops_per_token += 3.0 * static_cast<double>(e.top_k * e.expert_width);  // 3 clamps
    if (e.expert_bias) {
      // Adam and outside the active count like every bias; expert-sharded like the matrices beside them.
      const auto other = opt_for(ParamRole::kOther);
      ex.expert_bias = true;
      ex.params.push_back(param(lname(l, "moe.experts.b1"), {e.experts, e.expert_width}, ParamRole::kExpertMatrix, other, 0.0));
      ex.params.push_back(param(lname(l, "moe.experts.b3"), {e.experts, e.expert_width}, ParamRole::kExpertMatrix, other, 0.0));
      ex.params.push_back(param(lname(l, "moe.experts.b2"), {e.experts, mw}, ParamRole::kExpertMatrix, other, 0.0));
      ex.ew_flops_per_token += static_cast<double>(e.top_k * (2 * e.expert_width + mw));
    }
    const TensorDecl expert_out = flow(ex, {rows, chosen}, {tensor(l, "moe.expert_out", {top_k, width})});

    Op& combine = add(OpKind::kCombine, OpClass::kComm, lname(l, "moe.combine"), l, {e.top_k, mw}, {mw});
    combine.gemm_rows_per_token = static_cast<double>(e.top_k);
    combine.ew_flops_per_token = 2.0 * static_cast<double>(e.top_k * mw);
    combine.saved_elems_per_token = static_cast<double>(e.top_k * mw);
    TensorDecl routed = flow(combine, {expert_out, weights, chosen}, {tensor(l, "moe.routed", {width})});

    if (e.latent > 0) {
      routed = add_linear(l, "moe.latent_up", e.latent, d, d, true, routed,
                          {tensor(l, "moe.routed_up", {d_model()})}).outputs[0];
    }
    if (e.shared_experts > 0) {
      return add_mlp(l, "moe.shared", OpKind::kSharedMlp, d, e.shared_experts * e.shared_width, {x, routed});
    }
    return routed;
  }

  // Every op of a MoE layer from `begin` is in Megatron-Core's "moe" recompute
  // module; the routed experts' activation is "moe_act".
  void tag_moe_ops(size_t begin) {
    for (size_t i = begin; i < g_.ops.size(); ++i) {
      Op& op = g_.ops[i];
      op.recompute_modules |= recompute_module_bit(RecomputeModule::kMoe);
      if (op.kind == OpKind::kExpertMlp) op.recompute_modules |= recompute_module_bit(RecomputeModule::kMoeAct);
    }
  }

  // resid -> resid + attention(norm(resid)) -> resid_mid + mlp(norm(resid_mid)).
  TensorDecl add_block(int32_t l, const TensorDecl& resid) {
    const TensorDecl x = add_norm_site(l, "attn_norm", m_.norm.gated_pre_attention, resid);
    const TensorDecl attn =
        m_.attention.kind == AttentionKind::kMla ? add_attention_mla(l, x) : add_attention_gqa(l, x);
    const TensorDecl mid = add_residual(l, "attn_residual", resid, attn, "resid_mid");
    const TensorDecl x2 = add_norm_site(l, "mlp_norm", m_.norm.gated_pre_mlp, mid);
    const size_t mlp_begin = g_.ops.size();
    TensorDecl mlp = m_.is_moe_layer(l)
                         ? add_moe(l, x2)
                         : add_mlp(l, "mlp", OpKind::kSharedMlp, m_.d_model, m_.moe.dense_width, {x2});
    if (m_.is_moe_layer(l)) tag_moe_ops(mlp_begin);
    if (m_.sconv.kernel > 0 && m_.sconv.on_moe_out) mlp = add_sconv(l, "moe.out_sconv", m_.d_model, m_.d_model, mlp);
    return add_residual(l, "mlp_residual", mid, mlp, "resid_out");
  }

  // resid -> final norm -> logits (B, T, vocab) -> loss against targets (B, T).
  void add_head(const TensorDecl& resid) {
    const int64_t d = m_.d_model;
    const TensorDecl x = add_norm_site(-1, "final_norm", m_.norm.gated_final, resid);
    Op& head = add(OpKind::kLmHead, OpClass::kGemm, "lm_head", -1, {d}, {m_.vocab});
    if (!m_.tied_embeddings) {
      head.params.push_back(param("lm_head.w", {d, m_.vocab}, ParamRole::kLmHead,
                                  opt_for(ParamRole::kLmHead), 0.0));
    } else {
      head.shared_param = "embedding.w";  // read transposed: (vocab, d)
    }
    const TensorDecl logits = flow(head, {x}, {tensor(-1, "logits", {{"vocab", m_.vocab}})});
    head.gemm_k = d;
    head.gemm_n = m_.vocab;
    head.gemm_count = 1;
    head.gemm_rows_per_token = 1.0;
    head.counts_in_model_flops = true;
    head.saved_elems_per_token = static_cast<double>(d);
    Op& loss = add(OpKind::kCrossEntropy, OpClass::kLoss, "cross_entropy", -1, {m_.vocab}, {1});
    loss.ew_flops_per_token = 5.0 * static_cast<double>(m_.vocab);
    TensorDecl scalar;
    scalar.name = "loss";  // shape (): mean over the counted targets
    flow(loss, {logits, tensor(-1, "targets", {}, DType::kI32)}, {scalar});
  }

  const ModelConfig& m_;
  LayerGraph g_;
};

}  // namespace

LayerGraph build_layer_graph(const ModelConfig& model) { return GraphBuilder(model).build(); }

std::string check_data_flow(const LayerGraph& g) {
  std::vector<const TensorDecl*> written;
  auto find = [&](const std::string& name) -> const TensorDecl* {
    for (const TensorDecl* t : written)
      if (t->name == name) return t;
    return nullptr;
  };
  TensorDecl tokens, targets;
  tokens.name = "tokens";
  targets.name = "targets";
  tokens.shape = targets.shape = {{"B", 0}, {"T", 0}};
  tokens.dtype = targets.dtype = DType::kI32;
  written = {&tokens, &targets};
  for (const Op& op : g.ops) {
    if (op.outputs.empty()) return op.name + ": declares no output";
    for (const TensorDecl& in : op.inputs) {
      const TensorDecl* src = find(in.name);
      if (!src) return op.name + ": reads " + in.name + ", which no earlier op writes";
      if (src->shape_string() != in.shape_string() || src->dtype != in.dtype) {
        return op.name + ": reads " + in.name + " as " + in.shape_string() + ", written as " + src->shape_string();
      }
    }
    for (const TensorDecl& out : op.outputs) {
      if (find(out.name)) return op.name + ": writes " + out.name + " a second time";
      written.push_back(&out);
    }
  }
  return "";
}

double mean_attention_span(int64_t seq, int64_t window, FlopConvention convention) {
  const double s = static_cast<double>(seq);
  const bool windowed = window > 0 && window < seq;
  if (convention == FlopConvention::kMarin) return windowed ? static_cast<double>(window) : s;
  // Query i (0-based) sees min(i + 1, w) keys; average over i.
  if (!windowed) return (s + 1.0) / 2.0;
  const double w = static_cast<double>(window);
  const double ramp = w * (w + 1.0) / 2.0;  // queries 0..w-1
  return (ramp + (s - w) * w) / s;
}

namespace {

// The MoE latent projections (down to the expert width, back up to d_model),
// told apart from the attention projections by their declared shapes.
bool is_moe_latent(const Op& op) {
  auto on_moe_width = [](const std::vector<TensorDecl>& ts) {
    return !ts.empty() && !ts[0].shape.empty() && ts[0].shape.back().name == "moe_width";
  };
  return op.kind == OpKind::kLinear && (on_moe_width(op.inputs) || on_moe_width(op.outputs));
}

double gemm_flops_per_token(const Op& op) {
  return 2.0 * static_cast<double>(op.gemm_k) * static_cast<double>(op.gemm_n) *
         static_cast<double>(op.gemm_count) * op.gemm_rows_per_token;
}

// Scores and values 4*span*H*hd (2 for QK^T, 2 for PV), plus the softmax and
// mask 3*span*H, as Levanter's lm_flops_per_token counts them.
double attention_flops_per_token(const Op& op, int64_t seq, FlopConvention c) {
  const double span = mean_attention_span(seq, op.window, c);
  const double h = static_cast<double>(op.heads);
  return 2.0 * span * h * static_cast<double>(op.qk_head_dim) +
         2.0 * span * h * static_cast<double>(op.head_dim) + 3.0 * span * h;
}

}  // namespace

std::vector<double> alibi_slopes(int64_t heads) {
  auto power_of_two = [](int64_t n) {
    std::vector<double> s(static_cast<size_t>(n));
    for (int64_t h = 0; h < n; ++h) s[static_cast<size_t>(h)] = std::exp2(-8.0 * static_cast<double>(h + 1) / static_cast<double>(n));
    return s;
  };
  RS_CHECK(heads > 0, "alibi_slopes: at least one head");
  int64_t n = 1;
  while (n * 2 <= heads) n *= 2;
  std::vector<double> s = power_of_two(n);
  if (n == heads) return s;
  const std::vector<double> wide = alibi_slopes(2 * n);
  for (int64_t i = 0; static_cast<int64_t>(s.size()) < heads; i += 2) s.push_back(wide[static_cast<size_t>(i)]);
  return s;
}

double attention_extra_flops_per_token(bool alibi, bool sinks, double heads, double span) {
  return (alibi ? 2.0 * span * heads : 0.0) + (sinks ? 2.0 * heads : 0.0);
}

namespace {

double attention_extra_flops(const Op& op, int64_t seq) {
  return attention_extra_flops_per_token(op.alibi, op.sinks, static_cast<double>(op.heads),
                                         mean_attention_span(seq, op.window, FlopConvention::kExact));
}

}  // namespace

ParamCounts count_params(const LayerGraph& g) {
  ParamCounts c;
  double unselected = 0.0;
  for (const Op& op : g.ops) {
    for (const ParamTensor& p : op.params) {
      const double n = static_cast<double>(p.numel());
      c.total += n;
      c.active += p.active_numel;
      c.by_optimizer[static_cast<int>(p.optimizer)] += n;
      switch (op.kind) {
        case OpKind::kEmbedding:
          (&p == &op.params[0] ? c.embedding : c.positions) += n;
          break;
        case OpKind::kLmHead: c.lm_head += n; break;
        case OpKind::kExpertMlp:
          c.experts += n;
          unselected += n - p.active_numel;
          break;
        case OpKind::kSharedMlp:
          if (p.shape.size() == 1) {
            c.biases += n;
            break;
          }
          (g.model.is_moe_layer(op.layer) ? c.shared_experts : c.dense_mlp) += n;
          break;
        case OpKind::kAttention: c.attn_sinks += n; break;
        case OpKind::kRouter: c.router += n; break;
        case OpKind::kGatedNorm: c.gated_norms += n; break;
        case OpKind::kRmsNorm: c.norms += n; break;
        case OpKind::kSConv: c.sconv += n; break;
        case OpKind::kAttnGate: c.attn_gate += n; break;
        case OpKind::kLinear:
          if (p.shape.size() == 1) {
            c.biases += n;
            break;
          }
          (is_moe_latent(op) ? c.latent : c.attention) += n;
          break;
        default: break;
      }
    }
  }
  c.active_with_extras = c.active + c.gated_norms + c.sconv + c.lm_head;
  c.active_total_minus_unselected = c.total - unselected;
  return c;
}

FlopCounts count_flops(const LayerGraph& g, int64_t seq, FlopConvention convention) {
  FlopCounts f;
  for (const Op& op : g.ops) {
    const double gemm = gemm_flops_per_token(op);
    f.forward_hardware += gemm + op.ew_flops_per_token;
    if (op.kind == OpKind::kAttention) {
      const double a = attention_flops_per_token(op, seq, convention);
      f.attention_core += a;
      f.forward_hardware += attention_flops_per_token(op, seq, FlopConvention::kExact) + attention_extra_flops(op, seq);
      continue;
    }
    if (!op.counts_in_model_flops) continue;
    switch (op.kind) {
      case OpKind::kExpertMlp: f.experts += gemm; break;
      case OpKind::kSharedMlp: f.shared += gemm; break;
      case OpKind::kRouter: f.router += gemm; break;
      case OpKind::kLmHead: f.lm_head += gemm; break;
      case OpKind::kLinear:
        (is_moe_latent(op) ? f.latent : f.projections) += gemm;
        break;
      default: f.other += gemm; break;
    }
  }
  f.forward = f.attention_core + f.projections + f.experts + f.shared + f.router + f.latent +
              f.lm_head + f.other;
  f.training = 3.0 * f.forward;
  return f;
}

OpCost op_cost(const Op& op, int64_t batch, int64_t seq, double act_bytes, double param_bytes) {
  OpCost c;
  const double tokens = static_cast<double>(batch) * static_cast<double>(seq);
  const double gemm = gemm_flops_per_token(op) * tokens;
  const double ew = op.ew_flops_per_token * tokens;
  double params = 0.0;
  for (const auto& p : op.params) params += static_cast<double>(p.numel());
  c.param_bytes = params * param_bytes;
  if (op.kind == OpKind::kAttention) {
    const double a = attention_flops_per_token(op, seq, FlopConvention::kExact) * tokens;
    const double extra = attention_extra_flops(op, seq) * tokens;
    c.fwd_flops = a + extra;
    c.bwd_flops = 2.5 * a + 2.0 * extra;  // flash attention backward recomputes QK^T: 5 matmuls vs 2
    c.model_fwd_flops = attention_flops_per_token(op, seq, FlopConvention::kMarin) * tokens;
  } else {
    c.fwd_flops = gemm + ew;
    c.bwd_flops = 2.0 * gemm + 2.0 * ew;
    c.model_fwd_flops = op.counts_in_model_flops ? gemm : 0.0;
  }
  double in_elems = static_cast<double>(op.in_elems_per_token());
  if (op.kind == OpKind::kAttention) {
    in_elems = static_cast<double>(op.heads * op.qk_head_dim + op.kv_heads * (op.qk_head_dim + op.head_dim));
  }
  c.bytes_read = in_elems * tokens * act_bytes + c.param_bytes;
  c.bytes_written = static_cast<double>(op.out_elems_per_token()) * tokens * act_bytes;
  c.saved_bytes = op.saved_elems_per_token * tokens * act_bytes;
  return c;
}

double training_hardware_flops_per_token(const LayerGraph& g, int64_t seq, Recompute policy) {
  double total = 0.0;
  for (size_t i = 0; i < g.ops.size(); ++i) {
    const Op& op = g.ops[i];
    const OpCost c = op_cost(op, 1, seq);
    const double fwd = c.fwd_flops / static_cast<double>(seq);
    const double bwd = c.bwd_flops / static_cast<double>(seq);
    double recompute = 0.0;
    const bool in_block = op.layer >= 0;
    if (policy == Recompute::kFull && in_block) recompute = fwd;
    if (policy == Recompute::kSelective && in_block && op.op_class != OpClass::kGemm &&
        op.op_class != OpClass::kGroupedGemm) {
      recompute = fwd;
    }
    total += fwd + bwd + recompute;
  }
  return total;
}

int64_t recipe_steps(const LayerGraph& g) {
  const auto& r = g.model.recipe;
  if (r.steps > 0) return r.steps;
  const double tps = static_cast<double>(g.model.tokens_per_step());
  if (r.total_tokens > 0) return static_cast<int64_t>(std::ceil(static_cast<double>(r.total_tokens) / tps));
  return static_cast<int64_t>(std::llround(r.tokens_per_active_param * count_params(g).active / tps));
}

const char* to_string(RecomputeModule m) {
  switch (m) {
    case RecomputeModule::kCoreAttn: return "core_attn";
    case RecomputeModule::kMlaUpProj: return "mla_up_proj";
    case RecomputeModule::kLayernorm: return "layernorm";
    case RecomputeModule::kMlp: return "mlp";
    case RecomputeModule::kMoeAct: return "moe_act";
    case RecomputeModule::kMoe: return "moe";
    case RecomputeModule::kSharedExperts: return "shared_experts";
  }
  return "?";
}

const char* to_string(OpKind k) {
  switch (k) {
    case OpKind::kEmbedding: return "embedding";
    case OpKind::kRmsNorm: return "rmsnorm";
    case OpKind::kGatedNorm: return "gated_norm";
    case OpKind::kLinear: return "linear";
    case OpKind::kSConv: return "sconv";
    case OpKind::kQkNorm: return "qk_norm";
    case OpKind::kRope: return "rope";
    case OpKind::kAttention: return "attention";
    case OpKind::kXsa: return "xsa";
    case OpKind::kAttnGate: return "attn_gate";
    case OpKind::kRouter: return "router";
    case OpKind::kTopK: return "topk";
    case OpKind::kDispatch: return "dispatch";
    case OpKind::kExpertMlp: return "expert_mlp";
    case OpKind::kCombine: return "combine";
    case OpKind::kSharedMlp: return "shared_mlp";
    case OpKind::kResidualAdd: return "residual_add";
    case OpKind::kLmHead: return "lm_head";
    case OpKind::kCrossEntropy: return "cross_entropy";
  }
  return "?";
}

const char* to_string(DType t) {
  switch (t) {
    case DType::kF32: return "f32";
    case DType::kI32: return "i32";
  }
  return "?";
}

const char* to_string(OpClass c) {
  switch (c) {
    case OpClass::kGemm: return "gemm";
    case OpClass::kGroupedGemm: return "grouped_gemm";
    case OpClass::kAttention: return "attention";
    case OpClass::kElementwise: return "elementwise";
    case OpClass::kNorm: return "norm";
    case OpClass::kRouting: return "routing";
    case OpClass::kLoss: return "loss";
    case OpClass::kComm: return "comm";
    case OpClass::kLookup: return "lookup";
  }
  return "?";
}

const char* to_string(ParamRole r) {
  switch (r) {
    case ParamRole::kBlockMatrix: return "block_matrix";
    case ParamRole::kExpertMatrix: return "expert_matrix";
    case ParamRole::kEmbedding: return "embedding";
    case ParamRole::kLmHead: return "lm_head";
    case ParamRole::kRouter: return "router";
    case ParamRole::kOther: return "other";
  }
  return "?";
}

}  // namespace rackstep::models
