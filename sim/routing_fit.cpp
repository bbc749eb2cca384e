#include "sim/routing_fit.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "sim/base/check.h"

namespace rackstep::sim {

namespace {

// E[sum of squared coherent piece lengths] of a chunk of L tokens when a document
// routes as independent pieces of `ell` tokens (random phase); ell = 0: one piece.
double piece_square_sum(int64_t L, int64_t ell) {
  if (ell <= 0) return double(L) * double(L);
  const int phases = 64;
  double total = 0;
  for (int i = 0; i < phases; ++i) {
    const double offset = (i + 0.5) * double(ell) / phases;
    double left = double(L), first = std::min(left, double(ell) - offset), sq = first * first;
    left -= first;
    for (; left > 0; left -= double(ell)) sq += std::pow(std::min(left, double(ell)), 2);
    total += sq;
  }
  return total / phases;
}

struct ScaleSum {
  double excess = 0;
  int64_t chunks = 0;
};

// Y(L) summed over the single-document chunks of L tokens of tokens [begin, end).
ScaleSum measure_scale(const RoutingTrace& t, size_t layer, const std::vector<double>& p, int64_t L, int64_t begin,
                       int64_t end) {
  const int64_t E = t.n_experts, k = t.top_k;
  const uint16_t* ex = t.experts[layer].data();
  double noise = 0;  // L k sum_e p_e (1 - k p_e): per-token top-k noise
  for (int64_t e = 0; e < E; ++e) noise += double(L * k) * p[e] * (1.0 - double(k) * p[e]);
  ScaleSum out;
  std::vector<int64_t> x(static_cast<size_t>(E));
  for (int64_t i = begin; i + L <= end; i += L) {
    const TraceToken &a = t.tokens[static_cast<size_t>(i)], &b = t.tokens[static_cast<size_t>(i + L - 1)];
    if (a.document != b.document || (!t.eval && a.sequence != b.sequence)) continue;
    std::fill(x.begin(), x.end(), 0);
    for (int64_t j = i * k; j < (i + L) * k; ++j) ++x[ex[j]];
    double sq = 0;
    for (int64_t e = 0; e < E; ++e) sq += std::pow(double(x[e]) - double(L * k) * p[e], 2);
    out.excess += (sq - noise) / double(k * k);
    ++out.chunks;
  }
  return out;
}

// Variance over topics of each expert's share, weighted by the popularity the
// generator applies (E p_e), summed over experts: V.
double topic_variance(const RoutingModel& m, int64_t E, int k) {
  RoutingShape shape;
  shape.n_experts = E;
  shape.top_k = k;
  shape.gpus = 1;
  shape.tokens_per_gpu = 1;
  shape.context = 1;
  const RoutingGenerator gen(m, shape);
  const auto& phi = gen.topic_experts();
  double v = 0;
  for (int64_t e = 0; e < E; ++e) {
    const double w = m.popularity.empty() ? 1.0 : double(E) * m.popularity[static_cast<size_t>(e)];
    double m1 = 0, m2 = 0;
    for (int t = 0; t < m.topics; ++t) {
      const double x = w * phi[static_cast<size_t>(t * E + e)];
      m1 += x;
      m2 += x * x;
    }
    m1 /= m.topics;
    m2 /= m.topics;
    v += std::max(0.0, m2 - m1 * m1);
  }
  return v;
}

DocLengths fit_doc_lengths(const std::vector<RoutingTrace>& traces, int64_t& documents) {
  std::vector<double> logs;
  for (const auto& t : traces) {
    const int64_t n = t.token_count();
    std::vector<int64_t> runs;
    int64_t start = 0;
    for (int64_t i = 1; i <= n; ++i) {
      const bool boundary = i == n || t.tokens[i].document != t.tokens[i - 1].document ||
                            (!t.eval && t.tokens[i].sequence != t.tokens[i - 1].sequence);
      if (!boundary) continue;
      runs.push_back(i - start);
      start = i;
    }
    // The first and last runs are cut by the trace's edges.
    for (size_t r = 1; r + 1 < runs.size(); ++r) logs.push_back(std::log(double(runs[r])));
  }
  documents = static_cast<int64_t>(logs.size());
  if (logs.size() < 3)
    throw UserError("fit: expected at least 3 whole documents in the traces, found " + std::to_string(logs.size()) +
                    "; record a longer evaluation (rackstep train --eval-batches)");
  double mu = 0, var = 0;
  for (double x : logs) mu += x;
  mu /= double(logs.size());
  for (double x : logs) var += (x - mu) * (x - mu);
  var /= double(logs.size() - 1);
  DocLengths d;
  d.kind = DocLengths::Kind::lognormal;
  d.sigma = std::max(0.05, std::sqrt(var));
  d.mean_tokens = std::max(1.0, std::exp(mu + 0.5 * d.sigma * d.sigma));
  return d;
}

}  // namespace

TraceFit fit_routing(const std::vector<RoutingTrace>& traces, const FitOptions& opt) {
  if (traces.empty()) throw UserError("fit: expected at least one routing trace");
  const RoutingTrace& first = traces.front();
  TraceFit out;
  out.n_experts = first.n_experts;
  out.top_k = first.top_k;
  for (const auto& t : traces) {
    if (t.n_experts != first.n_experts || t.top_k != first.top_k || t.layer_index != first.layer_index)
      throw UserError("fit: traces disagree on experts, top-k or MoE layers (" + t.source + " vs " + first.source + ")");
    out.tokens += t.token_count();
    out.sources.push_back(t.source);
  }
  const int64_t E = first.n_experts, k = first.top_k;
  const int64_t max_scale = opt.max_scale > 0 ? opt.max_scale : first.seq_len;
  if (max_scale < 8) throw UserError("fit: expected a largest chunk of at least 8 tokens, found " + std::to_string(max_scale));
  out.doc_lengths = fit_doc_lengths(traces, out.documents);

  for (size_t l = 0; l < first.experts.size(); ++l) {
    LayerFit f;
    f.layer = first.layer_index[l];
    // Long-run popularity over every trace.
    std::vector<double> p(static_cast<size_t>(E), 0.0);
    double assignments = 0;
    for (const auto& t : traces)
      for (uint16_t e : t.experts[l]) p[e] += 1.0, assignments += 1.0;
    double mean = 1.0 / double(E), var = 0;
    for (auto& x : p) {
      x = std::clamp(x / assignments, 1e-6, 1.0 - 1e-6);
      var += (x - mean) * (x - mean);
    }
    f.popularity_cv = std::sqrt(var / double(E)) / mean;

    for (int64_t L = 8; L <= max_scale; L *= 2) {
      ScaleSum sum;
      for (const auto& t : traces) {
        const ScaleSum s = measure_scale(t, l, p, L, 0, t.token_count());
        sum.excess += s.excess;
        sum.chunks += s.chunks;
      }
      if (sum.chunks > 0) f.scales.push_back({L, sum.chunks, sum.excess / double(sum.chunks)});
    }
    // Fading affinity: Y(L) = A_doc L^2 + A_loc S2(L, ell), a document-wide part and
    // a local part of coherence length ell. For each candidate ell, non-negative
    // least squares in relative error; the best ell wins.
    std::vector<const ScalePoint*> usable;
    for (const auto& s : f.scales)
      if (s.chunks >= 16 && s.excess > 0) usable.push_back(&s);
    if (usable.size() < 2)
      throw UserError("fit: layer " + std::to_string(f.layer) + ": expected at least 2 chunk lengths with 16+ chunks "
                      "and affinity above the per-token noise, found " + std::to_string(usable.size()) +
                      "; record more tokens");
    double best_resid = INFINITY, best_doc = 0, best_loc = 0;
    int64_t best_ell = 0;
    std::vector<int64_t> candidates;
    for (int64_t ell = 4; ell <= 4 * max_scale; ell *= 2) candidates.push_back(ell);
    for (int64_t ell : candidates) {
      // Rows: weight * (L^2 / Y, S2 / Y) . (A_doc, A_loc) = weight * 1.
      auto solve = [&](bool use_doc, bool use_loc, double& a_doc, double& a_loc) {
        double xx = 0, xy = 0, yy = 0, x1 = 0, y1 = 0;
        for (const auto* s : usable) {
          const double w = double(s->chunks), L = double(s->tokens);
          const double x = use_doc ? L * L / s->excess : 0, y = use_loc ? piece_square_sum(s->tokens, ell) / s->excess : 0;
          xx += w * x * x, xy += w * x * y, yy += w * y * y, x1 += w * x, y1 += w * y;
        }
        a_doc = a_loc = 0;
        if (use_doc && use_loc) {
          const double det = xx * yy - xy * xy;
          if (std::fabs(det) < 1e-300) return false;
          a_doc = (x1 * yy - y1 * xy) / det;
          a_loc = (y1 * xx - x1 * xy) / det;
          return a_doc >= 0 && a_loc >= 0;
        }
        if (use_doc) a_doc = x1 / xx;
        if (use_loc) a_loc = y1 / yy;
        return true;
      };
      for (int variant = 0; variant < 3; ++variant) {
        double a_doc = 0, a_loc = 0;
        if (!solve(variant != 2, variant != 1, a_doc, a_loc)) continue;
        double resid = 0;
        for (const auto* s : usable) {
          const double L = double(s->tokens);
          const double d = (a_doc * L * L + a_loc * piece_square_sum(s->tokens, ell)) / s->excess - 1.0;
          resid += double(s->chunks) * d * d;
        }
        if (resid < best_resid - 1e-12) best_resid = resid, best_doc = a_doc, best_loc = a_loc, best_ell = ell;
      }
    }
    // A_doc = w^2 X, A_loc = (1 - w)^2 X with X = V / (concentration + 1).
    const double root_doc = std::sqrt(best_doc), root_loc = std::sqrt(best_loc);
    f.affinity = (root_doc + root_loc) * (root_doc + root_loc);
    f.affinity_document = best_doc;
    f.affinity_local = best_loc;

    RoutingModel m = opt.base;
    m.doc_lengths = out.doc_lengths;
    m.balance_each_step = false;
    m.popularity = p;
    m.coherence_tokens = best_loc > 0 ? best_ell : 0;
    m.persistent_share = root_doc / (root_doc + root_loc);
    // Concentration from V / X - 1; sharper topics where the router is more
    // specialised than the topic rows allow.
    for (int round = 0; round < 12; ++round) {
      f.topic_variance = topic_variance(m, E, static_cast<int>(k));
      if (f.topic_variance / f.affinity - 1.0 >= 0.05) break;
      m.topic_sharpness *= 0.5;
    }
    m.concentration = f.topic_variance / f.affinity - 1.0;
    if (m.concentration < 0.05) {
      f.note = "affinity above what the topic rows reach; concentration held at 0.05";
      m.concentration = 0.05;
    }
    // Drift: a training trace's first and last third of tokens (run order = step order).
    if (!first.eval && traces.size() == 1 && first.tokens.front().step != first.tokens.back().step) {
      const int64_t n = first.token_count(), L = std::min<int64_t>(64, max_scale);
      const ScaleSum a = measure_scale(first, l, p, L, 0, n / 3), b = measure_scale(first, l, p, L, n - n / 3, n);
      const double s2 = double(L) * double(L);
      if (a.chunks > 0) f.drift_affinity_first = a.excess / double(a.chunks) / s2;
      if (b.chunks > 0) f.drift_affinity_last = b.excess / double(b.chunks) / s2;
    }
    f.model = m;
    out.layers.push_back(f);
  }
  return out;
}

}  // namespace rackstep::sim
