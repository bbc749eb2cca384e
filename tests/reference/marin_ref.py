"""The Marin MoE architecture in PyTorch: the reference the C++ engine is checked against.

Written from spec/marin-architecture.md and the layer graph (models/layer_graph.cpp),
independently of exec/: plain autograd over float64 tensors, no fused kernels, dense
masks. Parameter names and shapes are the layer graph's ("layers.3.attn.q_proj.w",
(in, out); routed experts (E, in, out)), so a C++ dump maps onto it one to one.

    cfg = ModelConfig.from_json("models/zoo/tiny-moe.json")
    params = {name: torch.tensor(...) for name, shape, group in param_specs(cfg)}
    model = MarinRef(cfg, consts)
    out = model.forward(params, buffers, batch)          # logits, ce, z_loss, loss
    out["loss"].backward()                              # every gradient
    after = optimizer_step(cfg, params, grads, hyper)   # MuonH / AdamH / Adam, one update

Constants the spec leaves to the implementation (norm eps, XSA eps, RoPE theta, the
attention scale) come from `consts`, which the test fills from the dump's metadata.
"""

import json
import math

import torch

# ---------------------------------------------------------------------------
# Model description: the subset of models/model.h this architecture needs, with
# the same defaults as models/model.cpp.

MUONH, MUON, ADAMH, ADAM = "muonh", "muon", "adamh", "adam"


class ModelConfig:
    def __init__(self, doc):
        self.name = doc["name"]
        self.vocab = doc["vocab"]
        self.tied = doc.get("tied_embeddings", False)
        self.d = doc["d_model"]
        self.layers = doc["layers"]
        self.seq_len = doc.get("seq_len", 4096)
        self.z_weight = doc.get("logit_z_loss_weight", 0.0)
        a = doc["attention"]
        self.mla = a.get("kind", "gqa") == "mla"
        self.heads = a["heads"]
        self.head_dim = a.get("head_dim", self.d // self.heads)
        self.kv_heads = a.get("kv_heads", self.heads)
        mla = a.get("mla", {})
        self.mla_kv_latent = mla.get("kv_latent", 0)
        self.mla_q_latent = mla.get("q_latent", 0)
        self.mla_rope_dim = mla.get("rope_dim", 64) if self.mla else 0
        self.local = self._layer_kind(a.get("local", {}))
        self.glob = self._layer_kind(a.get("global", {}))
        self.global_every = a.get("global_every", 1)
        self.last_layer_global = a.get("last_layer_global", False)
        self.rope_theta = a.get("rope_theta", 10000.0)
        self.qk_norm = a.get("qk_norm", False)
        self.qk_mult = a.get("qk_norm_multiplier", 1.0)
        self.xsa = a.get("xsa", False)
        self.gate = a.get("gate", False)
        self.qkv_bias = a.get("qkv_bias", False)
        self.o_bias = a.get("o_bias", False)
        self.sinks = a.get("sinks", False)
        mlp = doc.get("mlp", {})
        self.mlp_activation = mlp.get("activation", "swiglu")
        self.mlp_bias = mlp.get("bias", False)
        pe = doc.get("position_embedding", {})
        self.learned_positions = pe.get("kind", "none") == "learned"
        self.max_positions = pe.get("max_positions", self.seq_len) if self.learned_positions else 0
        s = doc.get("sconv", {})
        self.sconv_k = s.get("kernel", 0)
        sites = s.get("sites", [])
        self.sconv_k_site = "k" in sites
        self.sconv_attn_out = "attn_out" in sites
        self.sconv_moe_out = "moe_out" in sites
        n = doc.get("norm", {})
        self.layernorm = n.get("kind", "rmsnorm") == "layernorm"
        self.norm_eps = n.get("eps", 1e-6)
        self.gated_rank = n.get("gated_rank", 0)
        gsites = n.get("gated_sites", [])
        self.gated_pre_attention = "pre_attention" in gsites
        self.gated_pre_mlp = "pre_mlp" in gsites
        self.gated_embedding = "embedding" in gsites
        self.gated_final = "final" in gsites
        self.embedding_norm = n.get("embedding_norm", self.gated_embedding)
        m = doc.get("moe", {})
        self.experts = m.get("experts", 0)
        self.dense_layers = m.get("dense_layers", 0)
        self.dense_width = m.get("dense_width", 0)
        self.top_k = m.get("top_k", 0)
        self.expert_width = m.get("expert_width", 0)
        self.latent = m.get("latent", 0)
        self.shared_experts = m.get("shared_experts", 0)
        self.shared_width = m.get("shared_width", self.expert_width if self.shared_experts else 0)
        self.router = m.get("router", "sigmoid")
        self.weight_sum = m.get("routing_weight_sum", 1.0)
        self.balancing = m.get("balancing", "quantile")
        self.aux_weight = m.get("aux_loss_weight", 0.01)
        self.router_z_applied = m.get("router_z_loss_applied", False)
        self.router_z_weight = m.get("router_z_loss_weight", 0.0)
        # The routed experts' own variant (gpt-oss): biases and the clamped SwiGLU.
        self.expert_bias = m.get("expert_bias", False)
        self.swiglu_alpha = m.get("swiglu_alpha", 1.0)
        self.swiglu_limit = m.get("swiglu_limit", 0.0)
        self.swiglu_offset = m.get("swiglu_linear_offset", 0.0)
        r = doc.get("recipe", {})
        o = r.get("optimizer", {})
        self.opt_block = o.get("block_matrices", MUONH)
        self.opt_lm_head = o.get("lm_head", ADAMH)
        self.opt_embedding = o.get("embedding", ADAM)
        self.opt_other = o.get("other", ADAM)
        self.beta1 = r.get("beta1", 0.9062)
        self.beta2 = r.get("beta2", 0.95)
        self.ns_steps = r.get("newton_schulz_steps", 5)

    def _layer_kind(self, k):
        window = k.get("window", 0)
        pos = k.get("position", "rope")
        frac = k.get("rope_fraction", 1.0) if pos == "rope" else 0.0
        return {"kv_heads": k.get("kv_heads", self.kv_heads),
                "window": 0 if window == "full" else window, "rope_fraction": frac,
                "alibi": pos == "alibi"}

    @staticmethod
    def from_json(path):
        with open(path) as f:
            return ModelConfig(json.load(f))

    def is_global(self, layer):
        if self.global_every > 0 and (layer + 1) % self.global_every == 0:
            return True
        return self.last_layer_global and layer == self.layers - 1

    def kind(self, layer):
        return self.glob if self.is_global(layer) else self.local

    def is_moe_layer(self, layer):
        return self.experts > 0 and layer >= self.dense_layers

    def moe_width(self):
        return self.latent if self.latent > 0 else self.d


def param_specs(cfg):
    """Every learnable parameter, in layer-graph order: (name, shape, optimizer).

    Mirrors models/layer_graph.cpp. The QB router bias is a buffer (set from
    routing statistics), so it is not listed when balancing is "quantile"."""
    specs = []
    d, r = cfg.d, cfg.gated_rank
    block = cfg.opt_block

    def norm_site(prefix, width, gated):
        specs.append((prefix + ".gain", (width,), cfg.opt_other))
        if gated and r > 0:
            specs.append((prefix + "_gate.w_down", (d, r), block))
            specs.append((prefix + "_gate.w_up", (r, d), block))

    specs.append(("embedding.w", (cfg.vocab, d), cfg.opt_embedding))
    if cfg.learned_positions:
        specs.append(("embedding.positions", (cfg.max_positions, d), cfg.opt_embedding))
    if cfg.embedding_norm:
        norm_site("embedding_norm", d, cfg.gated_embedding)
    hd, H = cfg.head_dim, cfg.heads

    def proj(name, shape, bias):
        # A linear's weight (in, out), and its bias (out) when the model has one.
        specs.append((name + ".w", shape, block))
        if bias:
            specs.append((name + ".b", (shape[1],), cfg.opt_other))

    def mlp(prefix, width):
        gated = cfg.mlp_activation == "swiglu"
        specs.append((prefix + ".w1", (d, width), block))
        if gated:
            specs.append((prefix + ".w3", (d, width), block))
        specs.append((prefix + ".w2", (width, d), block))
        if cfg.mlp_bias:
            specs.append((prefix + ".b1", (width,), cfg.opt_other))
            if gated:
                specs.append((prefix + ".b3", (width,), cfg.opt_other))
            specs.append((prefix + ".b2", (d,), cfg.opt_other))

    qb = cfg.qkv_bias
    for l in range(cfg.layers):
        p = "layers.%d." % l
        norm_site(p + "attn_norm", d, cfg.gated_pre_attention)
        if cfg.mla:
            qk, ql, kvl, rd = hd + cfg.mla_rope_dim, cfg.mla_q_latent, cfg.mla_kv_latent, cfg.mla_rope_dim
            if ql > 0:
                proj(p + "attn.q_down", (d, ql), qb)
                specs.append((p + "attn.q_latent_norm.gain", (ql,), cfg.opt_other))
                proj(p + "attn.q_up", (ql, H * qk), qb)
            else:
                proj(p + "attn.q_proj", (d, H * qk), qb)
            proj(p + "attn.kv_down", (d, kvl + rd), qb)
            specs.append((p + "attn.kv_latent_norm.gain", (kvl,), cfg.opt_other))
            proj(p + "attn.kv_up", (kvl, 2 * H * hd), qb)
        else:
            proj(p + "attn.q_proj", (d, H * hd), qb)
            proj(p + "attn.k_proj", (d, cfg.kv_heads * hd), qb)
            proj(p + "attn.v_proj", (d, cfg.kv_heads * hd), qb)
            if cfg.sconv_k and cfg.sconv_k_site:
                specs.append((p + "attn.k_sconv.kernel", (cfg.kv_heads * hd, cfg.sconv_k), cfg.opt_other))
        if cfg.sinks:
            specs.append((p + "attn.sinks", (H,), cfg.opt_other))
        if cfg.gate:
            specs.append((p + "attn.gate.w", (d, H), cfg.opt_other))
        proj(p + "attn.o_proj", (H * hd, d), cfg.o_bias)
        if cfg.sconv_k and cfg.sconv_attn_out:
            specs.append((p + "attn.out_sconv.kernel", (d, cfg.sconv_k), cfg.opt_other))
        norm_site(p + "mlp_norm", d, cfg.gated_pre_mlp)
        if not cfg.is_moe_layer(l):
            mlp(p + "mlp", cfg.dense_width)
            if cfg.sconv_k and cfg.sconv_moe_out:
                specs.append((p + "moe.out_sconv.kernel", (d, cfg.sconv_k), cfg.opt_other))
            continue
        E, L, F = cfg.experts, cfg.moe_width(), cfg.expert_width
        specs.append((p + "moe.router.w", (d, E), cfg.opt_other))
        if cfg.balancing != "quantile":
            specs.append((p + "moe.router.bias", (E,), cfg.opt_other))
        if cfg.latent > 0:
            specs.append((p + "moe.latent_down.w", (d, cfg.latent), block))
            specs.append((p + "moe.latent_norm.gain", (cfg.latent,), cfg.opt_other))
        specs.append((p + "moe.experts.w1", (E, L, F), block))
        specs.append((p + "moe.experts.w3", (E, L, F), block))
        specs.append((p + "moe.experts.w2", (E, F, L), block))
        if cfg.expert_bias:
            specs.append((p + "moe.experts.b1", (E, F), cfg.opt_other))
            specs.append((p + "moe.experts.b3", (E, F), cfg.opt_other))
            specs.append((p + "moe.experts.b2", (E, L), cfg.opt_other))
        if cfg.latent > 0:
            specs.append((p + "moe.latent_up.w", (cfg.latent, d), block))
        if cfg.shared_experts > 0:
            mlp(p + "moe.shared", cfg.shared_experts * cfg.shared_width)
        if cfg.sconv_k and cfg.sconv_moe_out:
            specs.append((p + "moe.out_sconv.kernel", (d, cfg.sconv_k), cfg.opt_other))
    norm_site("final_norm", d, cfg.gated_final)
    if not cfg.tied:
        specs.append(("lm_head.w", (d, cfg.vocab), cfg.opt_lm_head))
    return specs


# ---------------------------------------------------------------------------
# Ops, each written from its definition in the spec.

def rmsnorm(x, gain, eps, multiplier=1.0):
    """x / sqrt(mean(x^2) + eps) * gain * multiplier over the last dim (Zhang & Sennrich 2019)."""
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * multiplier
    return y * gain if gain is not None else y


def layernorm(x, gain, eps):
    """(x - mean) / sqrt(var + eps) * gain over the last dim, no bias (Ba et al. 2016;
    the layer graph declares one gain per norm)."""
    mu = x.mean(-1, keepdim=True)
    var = (x - mu).pow(2).mean(-1, keepdim=True)
    return (x - mu) * torch.rsqrt(var + eps) * gain


def gated_norm(x, w_down, w_up):
    """Spec "norms": x * sigmoid(silu(x W_down) W_up)."""
    return x * torch.sigmoid(torch.nn.functional.silu(x @ w_down) @ w_up)


def swiglu(x, w1, w3, w2):
    """(silu(x W1) * (x W3)) W2 (Shazeer 2020)."""
    return (torch.nn.functional.silu(x @ w1) * (x @ w3)) @ w2


def dense_mlp(x, P, prefix, activation):
    """A dense MLP with optional biases (P holds prefix.b1 ... when the model has them):
    SwiGLU (silu(x W1 + b1) * (x W3 + b3)) W2 + b2, or act(x W1 + b1) W2 + b2 with
    act GeLU (tanh approximation, GPT-2) or ReLU² (So et al. 2021, Primer)."""
    def lin(z, w, b):
        y = z @ P[prefix + "." + w]
        return y + P[prefix + "." + b] if prefix + "." + b in P else y
    a1 = lin(x, "w1", "b1")
    if activation == "swiglu":
        h = torch.nn.functional.silu(a1) * lin(x, "w3", "b3")
    elif activation == "gelu":
        h = torch.nn.functional.gelu(a1, approximate="tanh")
    elif activation == "relu2":
        h = torch.relu(a1).pow(2)
    else:
        raise ValueError("unknown activation " + activation)
    return lin(h, "w2", "b2")


def alibi_slopes(n):
    """Press et al. 2022, the authors' get_slopes: 2^(-8(h+1)/n) for n a power of two;
    otherwise the slopes of the largest power of two below n, then every other slope of
    twice that."""
    def power_of_2(m):
        start = 2.0 ** (-(2.0 ** -(math.log2(m) - 3)))
        return [start * start ** i for i in range(m)]
    if math.log2(n).is_integer():
        return power_of_2(n)
    closest = 2 ** math.floor(math.log2(n))
    return power_of_2(closest) + alibi_slopes(2 * closest)[0::2][:n - closest]


def sconv(x, kernel, doc):
    """Depthwise causal conv along the sequence, taps masked at document boundaries.

    x (B, T, C), kernel (C, K), doc (B, T). Tap j (of K) reads token t - (K-1-j);
    tap K-1 is the token itself (spec "short conv": identity-initialised)."""
    B, T, C = x.shape
    K = kernel.shape[1]
    y = torch.zeros_like(x)
    for j in range(K):
        shift = K - 1 - j
        if shift >= T:
            continue
        src = torch.zeros_like(x)
        src[:, shift:, :] = x[:, :T - shift, :]
        live = torch.zeros(B, T, dtype=torch.bool)
        live[:, shift:] = doc[:, shift:] == doc[:, :T - shift]
        y = y + torch.where(live.unsqueeze(-1), src, torch.zeros_like(src)) * kernel[:, j]
    return y


def rope(x, pos, rot_dims, theta):
    """Partial rotary embedding, GPT-NeoX rotate-half pairing inside the first rot_dims dims.

    x (B, T, heads, hd); pair (i, i + rot_dims/2) rotates by pos * theta^(-2i/rot_dims)."""
    if rot_dims == 0:
        return x
    half = rot_dims // 2
    inv_freq = theta ** (-2.0 * torch.arange(half, dtype=torch.float64) / rot_dims)
    ang = pos.to(torch.float64).unsqueeze(-1) * inv_freq  # (B, T, half)
    c = torch.cos(ang).unsqueeze(2).to(x.dtype)
    s = torch.sin(ang).unsqueeze(2).to(x.dtype)
    x1, x2, rest = x[..., :half], x[..., half:rot_dims], x[..., rot_dims:]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s, rest], dim=-1)


def attention_mask(doc, window):
    """(B, T, T) visibility: causal, inside the window (0 = full), same document."""
    T = doc.shape[1]
    i = torch.arange(T).unsqueeze(1)
    j = torch.arange(T).unsqueeze(0)
    m = j <= i
    if window > 0:
        m = m & (j > i - window)
    return m.unsqueeze(0) & (doc.unsqueeze(2) == doc.unsqueeze(1))


def attention(q, k, v, mask, scale, slopes=None, sinks=None):
    """softmax(scale q k^T) v per head. q (B, T, H, hd), k/v (B, T, kv, hd): query head h
    reads kv head h // (H / kv). slopes (H): ALiBi, score_ij -= slope_h (i - j) (Press et
    al. 2022). sinks (H): a logit per head that joins each row's softmax and takes its
    share of the probability to nothing (gpt-oss's attention sinks)."""
    B, T, H, kv = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
    group = H // kv
    k = k.repeat_interleave(group, dim=2)
    v = v.repeat_interleave(group, dim=2)
    s = torch.einsum("bihd,bjhd->bhij", q, k) * scale
    if slopes is not None:
        dist = (torch.arange(T).unsqueeze(1) - torch.arange(T).unsqueeze(0)).to(s.dtype)  # i - j
        s = s - slopes.view(1, H, 1, 1) * dist
    s = s.masked_fill(~mask.unsqueeze(1), float("-inf"))
    if sinks is not None:
        column = sinks.view(1, H, 1, 1).expand(B, H, T, 1)
        p = torch.softmax(torch.cat([s, column], dim=-1), dim=-1)[..., :T]
    else:
        p = torch.softmax(s, dim=-1)
    return torch.einsum("bhij,bjhd->bihd", p, v)


def xsa(o, v, eps):
    """Exclusive self attention: o - (o.v / (v.v + eps)) v with v the token's own value
    vector of the kv head the query head reads. o (B, T, H, hd), v (B, T, kv, hd)."""
    v = v.repeat_interleave(o.shape[2] // v.shape[2], dim=2)
    c = (o * v).sum(-1, keepdim=True) / ((v * v).sum(-1, keepdim=True) + eps)
    return o - c * v


def expert_swiglu(a1, a3, cfg):
    """The routed experts' activation: silu(a1) a3, or gpt-oss's variant (openai/gpt-oss
    gpt_oss/torch/model.py swiglu): a1 clamped to at most limit, a3 to [-limit, limit]
    (limit 0: none), a1 sigmoid(alpha a1) (a3 + offset)."""
    if cfg.swiglu_alpha == 1.0 and cfg.swiglu_limit == 0.0 and cfg.swiglu_offset == 0.0:
        return torch.nn.functional.silu(a1) * a3
    if cfg.swiglu_limit > 0:
        a1 = a1.clamp(max=cfg.swiglu_limit)
        a3 = a3.clamp(min=-cfg.swiglu_limit, max=cfg.swiglu_limit)
    return a1 * torch.sigmoid(cfg.swiglu_alpha * a1) * (a3 + cfg.swiglu_offset)


def routed_experts(z, chosen, w, w1, w3, w2):
    """Grouped SwiGLU experts as an efficient PyTorch MoE does it: sort the (token, choice)
    assignments by expert, one GEMM chain per expert on its rows, weighted scatter-add
    back. z (N, L), chosen (N, k), w (N, k) combine weights; w1/w3 (E, L, F), w2 (E, F, L).
    The same sum as the dense form (used by the benchmark; the test keeps the dense one)."""
    N, k = chosen.shape
    flat = chosen.reshape(-1)
    order = torch.argsort(flat, stable=True)
    token = order // k
    counts = torch.bincount(flat, minlength=w1.shape[0]).tolist()
    xs = z[token]  # (N*k, L) grouped by expert
    ys, start = [], 0
    for e, c in enumerate(counts):
        xe = xs[start:start + c]
        ys.append((torch.nn.functional.silu(xe @ w1[e]) * (xe @ w3[e])) @ w2[e])
        start += c
    ys = torch.cat(ys) * w.reshape(-1)[order].unsqueeze(-1)
    return torch.zeros_like(z).index_add(0, token, ys)


def qb_bias(logits, k):
    """Quantile-balancing bias from one step's router logits (N, E): -quantile_e(1 - k/E)
    (exec/kernels.h, qb_bias_from_histogram, without the histogram's binning)."""
    return -torch.quantile(logits, 1.0 - k / logits.shape[1], dim=0)


# ---------------------------------------------------------------------------
# The model.

class MarinRef:
    def __init__(self, cfg, consts):
        """consts: norm_eps, qk_norm_eps, xsa_eps, rope_theta, attn_scale (None = 1/sqrt(hd)),
        rot_dims_local / rot_dims_global (None = rope_fraction * hd rounded down to even),
        tie_margin (biased-score gap below which a different expert choice counts as an
        fp32 near-tie, resolved to the engine's choice)."""
        self.cfg = cfg
        self.c = consts
        self.routing_report = {"near_ties": 0, "tokens": 0, "mismatches": 0, "first_mismatch": ""}
        # consts["keep_router_logits"]: forward() collects each MoE layer's router
        # logits (N, E) in self.router_logits, for quantile balancing.
        self.keep_router_logits = bool(consts.get("keep_router_logits", False))
        self.router_logits = []

    def rot_dims(self, layer):
        kind = self.cfg.kind(layer)
        key = "rot_dims_global" if self.cfg.is_global(layer) else "rot_dims_local"
        if self.c.get(key) is not None:
            return self.c[key]
        return int(kind["rope_fraction"] * self.cfg.head_dim) // 2 * 2

    def norm(self, x, gain):
        """The model's parametric norm: RMSNorm, or LayerNorm with a gain."""
        if self.cfg.layernorm:
            return layernorm(x, gain, self.c["norm_eps"])
        return rmsnorm(x, gain, self.c["norm_eps"])

    def norm_site(self, P, prefix, x, gated):
        x = self.norm(x, P[prefix + ".gain"])
        if gated and self.cfg.gated_rank > 0:
            x = gated_norm(x, P[prefix + "_gate.w_down"], P[prefix + "_gate.w_up"])
        return x

    def forward(self, P, buffers, batch, routes=None):
        """P: name -> tensor (float64); buffers: QB biases by name; batch: tokens, targets,
        doc, pos (B, T) int64; routes: optional name -> (N, k) engine choices."""
        cfg, c = self.cfg, self.c
        tokens, doc, pos = batch["tokens"], batch["doc"], batch["pos"]
        B, T = tokens.shape
        x = P["embedding.w"][tokens]  # (B, T, d)
        if cfg.learned_positions:
            x = x + P["embedding.positions"][pos]  # position of each token in its sequence
        if cfg.embedding_norm:
            x = self.norm_site(P, "embedding_norm", x, cfg.gated_embedding)
        self.router_z = []
        self.router_logits = []
        self.router_losses = []  # applied: aux balancing, weighted router z-loss
        for l in range(cfg.layers):
            x = x + self.attention_block(P, l, x, doc, pos)
            x = x + self.moe_block(P, buffers, l, x, doc, routes)
        x = self.norm_site(P, "final_norm", x, cfg.gated_final)
        w_head = P["embedding.w"].t() if cfg.tied else P["lm_head.w"]
        logits = x @ w_head  # (B, T, V)
        targets = batch["targets"]
        counted = targets >= 0
        lse = torch.logsumexp(logits, dim=-1)  # (B, T)
        tgt = logits.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)
        n = counted.sum()
        ce = ((lse - tgt) * counted).sum() / n
        z = cfg.z_weight * (lse.pow(2) * counted).sum() / n
        loss = ce + z
        for r in self.router_losses:
            loss = loss + r
        return {"logits": logits, "ce": ce, "z_loss": z, "loss": loss}

    def attention_block(self, P, l, x, doc, pos):
        cfg, c = self.cfg, self.c
        p = "layers.%d." % l
        B, T, d = x.shape
        H, hd = cfg.heads, cfg.head_dim
        kind = cfg.kind(l)
        kv = kind["kv_heads"]
        h = self.norm_site(P, p + "attn_norm", x, cfg.gated_pre_attention)
        if cfg.mla:
            q, k, v = self.mla_qkv(P, p, h)
        else:
            q = self.linear(P, p + "attn.q_proj", h).view(B, T, H, hd)
            # Layers that use fewer KV heads than stored read the first `kv` (spec, KV heads).
            k = self.linear(P, p + "attn.k_proj", h, kv * hd)
            v = self.linear(P, p + "attn.v_proj", h, kv * hd).view(B, T, kv, hd)
            if cfg.sconv_k and cfg.sconv_k_site:
                k = sconv(k, P[p + "attn.k_sconv.kernel"][:kv * hd], doc)
            k = k.view(B, T, kv, hd)
        if cfg.qk_norm:
            q = rmsnorm(q, None, c["qk_norm_eps"], cfg.qk_mult)
            k = rmsnorm(k, None, c["qk_norm_eps"], cfg.qk_mult)
        rd = self.rot_dims(l)
        if rd > 0:
            q = rope(q, pos, rd, c["rope_theta"])
            k = rope(k, pos, rd, c["rope_theta"])
        scale = c["attn_scale"] if c.get("attn_scale") is not None else 1.0 / math.sqrt(hd)
        slopes = torch.tensor(alibi_slopes(H), dtype=q.dtype) if kind["alibi"] else None
        sinks = P[p + "attn.sinks"] if cfg.sinks else None
        o = attention(q, k, v, attention_mask(doc, kind["window"]), scale, slopes, sinks)  # (B, T, H, hd)
        if cfg.xsa:
            o = xsa(o, v, c["xsa_eps"])
        if cfg.gate:
            g = 2.0 * torch.sigmoid(h @ P[p + "attn.gate.w"])  # (B, T, H)
            o = o * g.unsqueeze(-1)
        y = self.linear(P, p + "attn.o_proj", o.reshape(B, T, H * hd))
        if cfg.sconv_k and cfg.sconv_attn_out:
            y = sconv(y, P[p + "attn.out_sconv.kernel"], doc)
        return y

    @staticmethod
    def linear(P, name, x, cols=None):
        """x W (+ b when the model has it), the first `cols` output columns (all when None)."""
        w = P[name + ".w"] if cols is None else P[name + ".w"][:, :cols]
        y = x @ w
        if name + ".b" in P:
            y = y + (P[name + ".b"] if cols is None else P[name + ".b"][:cols])
        return y

    def mla_qkv(self, P, p, h):
        """MLA (DeepSeek-V2 §2.1): queries through an optional latent, K and V from one
        compressed latent, plus a RoPE key shared by the heads appended to each head's key.
        Column order of the layer graph: kv_down = [latent | rope key], kv_up = [k_nope | v]."""
        cfg = self.cfg
        B, T, _ = h.shape
        H, hd, r, kvl = cfg.heads, cfg.head_dim, cfg.mla_rope_dim, cfg.mla_kv_latent
        if cfg.mla_q_latent > 0:
            q = self.linear(P, p + "attn.q_up",
                            self.norm(self.linear(P, p + "attn.q_down", h), P[p + "attn.q_latent_norm.gain"]))
        else:
            q = self.linear(P, p + "attn.q_proj", h)
        c = self.linear(P, p + "attn.kv_down", h)  # (B, T, kvl + r)
        kv = self.linear(P, p + "attn.kv_up", self.norm(c[..., :kvl], P[p + "attn.kv_latent_norm.gain"]))
        k_nope = kv[..., :H * hd].reshape(B, T, H, hd)
        v = kv[..., H * hd:].reshape(B, T, H, hd)
        k = torch.cat([k_nope, c[..., kvl:].unsqueeze(2).expand(B, T, H, r)], dim=-1)
        return q.reshape(B, T, H, hd + r), k, v

    def select_experts(self, l, logits, bias, engine_choice):
        """Top-k of the biased scores (ties to the lower id). Where the engine chose
        differently, the engine's choice is used from here on (so the rest of the model
        can still be compared) and the token is counted: as a near-tie when the scores
        involved are within tie_margin (fp32 rounding), else as a mismatch."""
        cfg = self.cfg
        k = cfg.top_k
        score = logits.detach() + (bias if bias is not None else 0.0)
        # Stable descending sort: equal scores keep the lower expert id first.
        order = torch.sort(score, dim=-1, descending=True, stable=True).indices
        chosen = order[:, :k]
        self.routing_report["tokens"] += logits.shape[0]
        if engine_choice is None:
            return chosen
        mine = torch.zeros_like(score, dtype=torch.bool).scatter_(1, chosen, True)
        theirs = torch.zeros_like(score, dtype=torch.bool).scatter_(1, engine_choice, True)
        for t in (mine != theirs).any(dim=1).nonzero().flatten().tolist():
            s = score[t]
            kth = s[order[t, k - 1]].item()
            # The engine's lowest chosen score must be within the margin of our k-th.
            if kth - s[engine_choice[t]].min().item() <= self.c["tie_margin"]:
                self.routing_report["near_ties"] += 1
                continue
            self.routing_report["mismatches"] += 1
            if not self.routing_report["first_mismatch"]:
                self.routing_report["first_mismatch"] = (
                    "layer %d token %d: engine chose %s, reference %s (biased scores %s)"
                    % (l, t, sorted(engine_choice[t].tolist()), sorted(chosen[t].tolist()),
                       [round(v, 6) for v in s.tolist()]))
        return engine_choice

    def moe_block(self, P, buffers, l, x, doc, routes):
        cfg = self.cfg
        p = "layers.%d." % l
        B, T, d = x.shape
        N = B * T
        h = self.norm_site(P, p + "mlp_norm", x, cfg.gated_pre_mlp).reshape(N, d)
        if not cfg.is_moe_layer(l):  # a dense layer: one MLP
            y = dense_mlp(h, P, p + "mlp", cfg.mlp_activation).view(B, T, d)
            if cfg.sconv_k and cfg.sconv_moe_out:
                y = sconv(y, P[p + "moe.out_sconv.kernel"], doc)
            return y
        logits = h @ P[p + "moe.router.w"]  # (N, E)
        self.router_z.append((torch.logsumexp(logits.detach(), -1) ** 2).mean().item())
        bias = buffers.get(p + "moe.router.bias")
        if bias is None and cfg.balancing != "quantile":
            bias = P.get(p + "moe.router.bias")
        engine = routes.get(p + "moe.expert") if routes else None
        chosen = self.select_experts(l, logits, bias, engine)  # (N, k)
        # Combine weights: sigmoid of the unbiased logits of the chosen k, renormalised
        # to sum to weight_sum (spec, "router"); a softmax router: softmax over the chosen k.
        if cfg.router == "softmax":
            w = cfg.weight_sum * torch.softmax(logits.gather(1, chosen), dim=-1)
        else:
            u = torch.sigmoid(logits.gather(1, chosen))  # (N, k)
            w = cfg.weight_sum * u / u.sum(-1, keepdim=True)
        if cfg.router_z_applied:
            self.router_losses.append(cfg.router_z_weight * (torch.logsumexp(logits, -1) ** 2).mean())
        if cfg.balancing == "aux_loss":
            # Switch Transformer eq. 4 with top-k (DeepSeek-V3 §2.1.2): weight E Σ_e f_e P_e,
            # f_e the share of assignments (no gradient), P_e the mean router probability.
            if cfg.router == "softmax":
                prob = torch.softmax(logits, dim=-1)
            else:
                s = torch.sigmoid(logits)
                prob = s / s.sum(-1, keepdim=True)
            f = torch.bincount(chosen.reshape(-1), minlength=cfg.experts).to(logits.dtype) / chosen.numel()
            self.router_losses.append(cfg.aux_weight * cfg.experts * (f * prob.mean(0)).sum())
        # Dropped assignments (the engine's keep mask, (N, k) token-major) keep their
        # share of the renormalised weight but contribute nothing (spec, "drops").
        keep = routes.get(p + "moe.keep") if routes else None
        if keep is not None:
            w = w * keep.to(w.dtype)
        if self.keep_router_logits:
            self.router_logits.append(logits.detach())
        z = h
        if cfg.latent > 0:
            z = self.norm(h @ P[p + "moe.latent_down.w"], P[p + "moe.latent_norm.gain"])
        w1, w3, w2 = P[p + "moe.experts.w1"], P[p + "moe.experts.w3"], P[p + "moe.experts.w2"]
        if self.c.get("moe_impl", "dense") == "routed":
            assert not cfg.expert_bias and cfg.swiglu_limit == 0.0, "the routed form runs the plain experts only"
            comb = routed_experts(z, chosen, w, w1, w3, w2)
        else:
            # Every expert on every token, weighted by 0 where not chosen: the same sum
            # as routing, and the same gradients (the zero weights stop them).
            dense_w = torch.zeros(N, cfg.experts, dtype=logits.dtype).scatter(1, chosen, w)  # (N, E)
            a1 = torch.einsum("nl,elf->enf", z, w1)
            a3 = torch.einsum("nl,elf->enf", z, w3)
            if cfg.expert_bias:  # per-expert biases, before the clamp (HF GptOssExperts)
                a1 = a1 + P[p + "moe.experts.b1"].unsqueeze(1)
                a3 = a3 + P[p + "moe.experts.b3"].unsqueeze(1)
            ye = torch.einsum("enf,efl->enl", expert_swiglu(a1, a3, cfg), w2)  # (E, N, L)
            if cfg.expert_bias:  # and on W2, before the routing weight
                ye = ye + P[p + "moe.experts.b2"].unsqueeze(1)
            comb = torch.einsum("ne,enl->nl", dense_w, ye)
        y = comb @ P[p + "moe.latent_up.w"] if cfg.latent > 0 else comb
        if cfg.shared_experts > 0:
            y = y + dense_mlp(h, P, p + "moe.shared", cfg.mlp_activation)
        y = y.view(B, T, d)
        if cfg.sconv_k and cfg.sconv_moe_out:
            y = sconv(y, P[p + "moe.out_sconv.kernel"], doc)
        return y


# ---------------------------------------------------------------------------
# The optimizer (spec, "Optimizer (param groups)"), stateful over several steps.

NS_COEFFS = (3.4445, -4.7750, 2.0315)  # Jordan et al., "Muon" (2024)


def _frob(x):
    """Frobenius norm of each matrix of x (..., rows, cols), keepdim."""
    return x.pow(2).sum(dim=(-2, -1), keepdim=True).sqrt()


def newton_schulz(u, steps):
    """Quintic Newton-Schulz orthogonalisation of u (..., rows, cols), each matrix on its
    wide orientation (a leading expert dimension is a batch)."""
    a, b, c = NS_COEFFS
    tall = u.shape[-2] > u.shape[-1]
    x = u.transpose(-2, -1) if tall else u
    x = x / (_frob(x) + 1e-7)
    for _ in range(steps):
        A = x @ x.transpose(-2, -1)
        x = a * x + (b * A + c * A @ A) @ x
    return x.transpose(-2, -1) if tall else x


def hyperball(w, u, lr, w0_norm):
    """W <- Norm(W - lr ||W0|| Norm(u)) ||W0||, Norm(x) = x / ||x||_F, per matrix of
    w (..., rows, cols) or over the whole tensor when w0_norm is a number."""
    per_matrix = not isinstance(w0_norm, float)
    norm = _frob if per_matrix else (lambda x: x.norm())
    un = norm(u)
    w = w - lr * w0_norm * u / torch.where(un > 0, un, torch.ones_like(un))
    return w * (w0_norm / norm(w))


class OptimizerState:
    """Moments, update count and ||W0|| (per matrix, taken when the state is made)."""

    def __init__(self, specs, params):
        self.t = 0
        self.m = {n: torch.zeros_like(params[n]) for n, _, _ in specs}
        self.v = {n: torch.zeros_like(params[n]) for n, _, g in specs if g in (ADAM, ADAMH)}
        self.w0 = {}
        for n, _, g in specs:
            w = params[n].detach()
            if g == MUONH:
                self.w0[n] = _frob(w)
            elif g == ADAMH:
                self.w0[n] = w.norm().item()


def optimizer_update(specs, params, grads, hyper, state, lr):
    """Update number state.t + 1 of every parameter with lr {group: lr}; advances state.

    hyper: beta1, beta2, adam_eps, adam_weight_decay, ns_steps. Returns name -> new tensor
    (params are not modified)."""
    b1, b2, eps = hyper["beta1"], hyper["beta2"], hyper["adam_eps"]
    state.t += 1
    t = state.t
    c1, c2 = 1.0 / (1.0 - b1 ** t), 1.0 / (1.0 - b2 ** t)
    out = {}
    for name, shape, group in specs:
        w, g, m = params[name], grads[name], state.m[name]
        if group in (MUONH, MUON):
            m.mul_(b1).add_((1 - b1) * g)
            u = (1 - b1) * g + b1 * m  # Nesterov look-ahead
            o = newton_schulz(u, hyper["ns_steps"])
            if group == MUONH:
                out[name] = hyperball(w, o, lr[group], state.w0[name])
            else:
                out[name] = w - lr[group] * math.sqrt(max(1.0, w.shape[-2] / w.shape[-1])) * o
            continue
        v = state.v[name]
        m.mul_(b1).add_((1 - b1) * g)
        v.mul_(b2).add_((1 - b2) * g * g)
        u = (m * c1) / (torch.sqrt(v * c2) + eps)
        if group == ADAMH:
            out[name] = hyperball(w, u, lr[group], state.w0[name])
            continue
        out[name] = w - lr[group] * u - lr[group] * hyper["adam_weight_decay"] * w
    return out


def optimizer_step(cfg, specs, params, grads, hyper):
    """The first update (step 0, zero moments) of every parameter, at hyper["lr"]."""
    return optimizer_update(specs, params, grads, hyper, OptimizerState(specs, params), hyper["lr"])
