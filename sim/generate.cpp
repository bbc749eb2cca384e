#include "sim/generate.h"

#include <cmath>
#include <cstdio>

#include "sim/base/check.h"
#include "models/layer_graph.h"

namespace rackstep::sim {
namespace {

int64_t round_even(double x) { return std::max<int64_t>(2, 2 * static_cast<int64_t>(std::llround(x / 2.0))); }

// The family recipe at width d with `experts` routed experts of which top_k are chosen.
models::ModelConfig family_shape(const models::ModelConfig& base, const ShapeTarget& t, int64_t d,
                                 int64_t top_k, int64_t experts, int64_t width_div = 2) {
  models::ModelConfig m = base;
  m.name = t.name;
  m.published = {};
  m.d_model = d;
  m.layers = round_even(static_cast<double>(d) / t.d_per_layer);
  auto& a = m.attention;
  a.head_dim = 128;
  a.heads = d / 128;
  a.kv_heads = std::max<int64_t>(1, a.heads / 4);
  while (a.heads % a.kv_heads != 0) --a.kv_heads;
  a.local.kv_heads = a.kv_heads;
  a.global.kv_heads = std::max<int64_t>(1, a.heads / 8);
  while (a.heads % a.global.kv_heads != 0 || a.global.kv_heads > a.kv_heads) --a.global.kv_heads;
  if (t.attention == "mla") {
    a.kind = models::AttentionKind::kMla;
    a.mla_kv_latent = 512;   // DeepSeek-V3's compression
    a.mla_q_latent = 1536;
    a.mla_rope_dim = 64;
    a.kv_heads = a.heads;
    a.local.kv_heads = a.global.kv_heads = a.heads;
  } else {
    a.kind = models::AttentionKind::kGqa;
  }
  auto& e = m.moe;
  e.experts = experts;
  e.top_k = top_k;
  e.latent = d / 2;
  e.expert_width = d / width_div;
  e.shared_experts = 2;
  e.shared_width = d / 2;
  if (m.norm.gated_rank > d) m.norm.gated_rank = d / 4;
  return m;
}

struct Counts {
  double total = 0, active = 0;
};

Counts counts(const models::ModelConfig& m) {
  const auto p = models::count_params(models::build_layer_graph(m));
  return {p.total, p.active};
}

// Shapes within 1.5% of both targets always beat shapes outside; the family
// preferences (EP-friendly expert counts, depth rule, top-k) break ties.
double score(const Counts& c, const ShapeTarget& t) {
  const double et = std::fabs(std::log(c.total / t.total_params));
  const double ea = std::fabs(std::log(c.active / t.active_params));
  return et + ea + (std::max(et, ea) > 0.015 ? 1.0 : 0.0);
}

// A dense candidate (active = total): the family's attention and norms, a SwiGLU
// MLP of width 8d/3 (rounded to 128) in every layer, no experts; d is searched to
// meet the total (the Marin active count of a dense model excludes the embedding,
// so it is not matched).
GeneratedShape dense_shape(const ShapeTarget& t, const models::ModelConfig& base) {
  GeneratedShape best;
  double best_err = 1e300;
  for (int64_t d = 512; d <= 32768; d += 256) {
    models::ModelConfig m = family_shape(base, t, d, 0, 0);
    m.moe = {};
    m.moe.dense_width = 128 * std::max<int64_t>(1, std::llround(8.0 * static_cast<double>(d) / 3.0 / 128.0));
    m.sconv.on_moe_out = false;
    const Counts c = counts(m);
    const double err = std::fabs(std::log(c.total / t.total_params));
    if (err >= best_err) continue;
    best_err = err;
    best.model = m;
    best.total_params = c.total;
    best.active_params = c.active;
  }
  best.total_rel_err = best.total_params / t.total_params - 1.0;
  best.active_rel_err = best.active_params / t.active_params - 1.0;
  if (std::fabs(best.total_rel_err) > 0.05) {
    throw UserError("shape target \"" + t.name + "\": no dense family shape within 5% of " +
                    std::to_string(t.total_params / 1e9) + "B");
  }
  return best;
}

}  // namespace

GeneratedShape generate_shape(const ShapeTarget& t, const models::ModelConfig& base) {
  if (!(t.total_params > 0) || !(t.active_params > 0)) {
    throw UserError("shape target \"" + t.name + "\": expected total and active parameters > 0");
  }
  if (t.active_params > t.total_params) {
    throw UserError("shape target \"" + t.name + "\": expected active <= total parameters, found active " +
                    std::to_string(t.active_params / 1e9) + "B > total " + std::to_string(t.total_params / 1e9) + "B");
  }
  if (t.active_params == t.total_params) return dense_shape(t, base);
  bool found = false;
  GeneratedShape best;
  double best_score = 1e300;
  for (int64_t d = 1024; d <= 12288; d += 512) {  // heads = d/128 a multiple of 4
    for (int64_t k : t.top_k_choices) for (int64_t wdiv : {2, 4}) {
      // Parameters are affine in the expert count and in the depth (per
      // local/global period): small graphs fix both lines; the winner is
      // re-counted exactly below.
      models::ModelConfig m = family_shape(base, t, d, k, std::max<int64_t>(k, 64), wdiv);
      const int64_t e0 = m.moe.experts, l0 = m.layers;
      const int64_t period = std::max<int64_t>(1, m.attention.global_every);
      m.layers = period;
      const Counts p1 = counts(m);
      m.layers = 2 * period;
      const Counts p2 = counts(m);
      m.moe.experts = e0 + 64;
      const Counts p2e = counts(m);
      const double per_layer_total = (p2.total - p1.total) / static_cast<double>(period);
      const double per_layer_active = (p2.active - p1.active) / static_cast<double>(period);
      const double outside_total = p1.total - per_layer_total * static_cast<double>(period);
      const double outside_active = p1.active - per_layer_active * static_cast<double>(period);
      // Per expert per layer.
      const double per_expert = (p2e.total - p2.total) / 64.0 / static_cast<double>(2 * period);
      const double active_per_expert = (p2e.active - p2.active) / 64.0 / static_cast<double>(2 * period);
      const double l0d = static_cast<double>(l0);
      const Counts c0{outside_total + per_layer_total * l0d, outside_active + per_layer_active * l0d};
      if (std::fabs(std::log(c0.active / t.active_params)) > 0.45) continue;  // depth cannot fix that
      for (int64_t dl = -6; dl <= 6; dl += 2) {
        const int64_t layers = l0 + dl;
        if (layers < 2) continue;
        const double ld = static_cast<double>(layers);
        const double base_total = outside_total + per_layer_total * ld;
        const double base_active = outside_active + per_layer_active * ld;
        const double exact_e = static_cast<double>(e0) + (t.total_params - base_total) / (per_expert * ld);
        for (int64_t mult = t.expert_multiple; mult >= 8; mult /= 2) {
          const int64_t e = std::max<int64_t>(mult, mult * std::llround(exact_e / static_cast<double>(mult)));
          if (e < k) continue;
          const double de = static_cast<double>(e - e0);
          const Counts est{base_total + per_expert * ld * de, base_active + active_per_expert * ld * de};
          // Prefer EP-friendly expert counts and the family's depth rule.
          const double s = score(est, t) + 0.002 * std::log2(static_cast<double>(t.expert_multiple / mult)) +
                           0.001 * std::abs(dl) + (wdiv == 2 ? 0.0 : 0.006) +
                           0.004 * std::fabs(std::log2(static_cast<double>(k) / static_cast<double>(base.moe.top_k)));
          if (s < best_score) {
            best_score = s;
            best.model = family_shape(base, t, d, k, e, wdiv);
            best.model.layers = layers;
            found = true;
          }
        }
      }
    }
  }
  if (!found) {
    throw UserError("shape target \"" + t.name + "\": no Marin-family shape has that total/active ratio");
  }
  const Counts c = counts(best.model);
  best.total_params = c.total;
  best.active_params = c.active;
  best.total_rel_err = c.total / t.total_params - 1.0;
  best.active_rel_err = c.active / t.active_params - 1.0;
  if (std::fabs(best.total_rel_err) > 0.05 || std::fabs(best.active_rel_err) > 0.05) {
    char buf[256];
    std::snprintf(buf, sizeof buf, "shape target \"%s\": expected a shape within 5%% of %.1fB/%.1fB, found at best %.1fB/%.1fB",
                  t.name.c_str(), t.total_params / 1e9, t.active_params / 1e9, c.total / 1e9, c.active / 1e9);
    throw UserError(buf);
  }
  return best;
}

}  // namespace rackstep::sim
