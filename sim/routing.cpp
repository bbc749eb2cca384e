#include "sim/routing.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "sim/base/check.h"
#include "sim/base/json_io.h"

namespace rackstep::sim {

namespace {

NumberRange at_least(double lo) {
  NumberRange r;
  r.min = lo;
  return r;
}

int64_t round_length(double x) { return std::max<int64_t>(1, std::llround(x)); }

// log of a Gamma(shape, 1) draw, stable for tiny shapes (where the draw itself
// underflows): Gamma(a) = Gamma(a + 1) * U^(1/a) (Marsaglia & Tsang 2000, sec. 6).
double log_gamma_draw(std::mt19937_64& rng, double shape, std::gamma_distribution<double>& shifted) {
  if (shape >= 1) return std::log(std::max(shifted(rng), 1e-300));
  std::uniform_real_distribution<double> u(0.0, 1.0);
  double x = std::max(shifted(rng), 1e-300);
  double v = std::max(u(rng), 1e-300);
  return std::log(x) + std::log(v) / shape;
}

// Dirichlet(shape, ..., shape) of size n into out (sums to 1).
void dirichlet(std::mt19937_64& rng, double shape, std::vector<double>& out) {
  std::gamma_distribution<double> g(shape >= 1 ? shape : shape + 1.0, 1.0);
  double hi = -INFINITY;
  for (auto& x : out) {
    x = log_gamma_draw(rng, shape, g);
    hi = std::max(hi, x);
  }
  double sum = 0;
  for (auto& x : out) sum += (x = std::exp(x - hi));
  for (auto& x : out) x /= sum;
}

// Binomial(n, p): exact for small means, normal with the same mean and variance
// (rounded, clipped) where both n*p and n*(1-p) exceed 30.
int64_t binomial(std::mt19937_64& rng, int64_t n, double p) {
  if (n <= 0 || p <= 0) return 0;
  if (p >= 1) return n;
  const double mean = double(n) * p, var = mean * (1 - p);
  if (mean > 30 && double(n) - mean > 30) {
    std::normal_distribution<double> z(0.0, 1.0);
    return std::clamp<int64_t>(std::llround(mean + std::sqrt(var) * z(rng)), 0, n);
  }
  std::binomial_distribution<int64_t> b(n, p);
  return b(rng);
}

}  // namespace

DocLengths::Kind parse_doc_length_kind(const std::string& name) {
  if (name == "lognormal") return DocLengths::Kind::lognormal;
  if (name == "exponential") return DocLengths::Kind::exponential;
  if (name == "fixed") return DocLengths::Kind::fixed;
  throw UserError("document length distribution: expected lognormal, exponential or fixed, found \"" + name + "\"");
}

std::string doc_length_kind_name(DocLengths::Kind k) {
  switch (k) {
    case DocLengths::Kind::lognormal: return "lognormal";
    case DocLengths::Kind::exponential: return "exponential";
    case DocLengths::Kind::fixed: return "fixed";
  }
  return "?";
}

int64_t DocLengths::sample(std::mt19937_64& rng) const {
  switch (kind) {
    case Kind::lognormal: {
      std::lognormal_distribution<double> d(std::log(mean_tokens) - 0.5 * sigma * sigma, sigma);
      return round_length(d(rng));
    }
    case Kind::exponential: {
      std::exponential_distribution<double> d(1.0 / mean_tokens);
      return round_length(d(rng));
    }
    case Kind::fixed: return round_length(mean_tokens);
  }
  return 1;
}

int64_t DocLengths::sample_length_biased(std::mt19937_64& rng) const {
  // Length-biasing a lognormal(mu, s) gives lognormal(mu + s^2, s); an exponential
  // gives Gamma(2, mean); a fixed length stays fixed.
  switch (kind) {
    case Kind::lognormal: {
      std::lognormal_distribution<double> d(std::log(mean_tokens) + 0.5 * sigma * sigma, sigma);
      return round_length(d(rng));
    }
    case Kind::exponential: {
      std::gamma_distribution<double> d(2.0, mean_tokens);
      return round_length(d(rng));
    }
    case Kind::fixed: return round_length(mean_tokens);
  }
  return 1;
}

void water_fill(std::vector<double>& p, double total) {
  RS_CHECK(total <= double(p.size()) + 1e-9, "k inclusion probabilities cannot exceed the expert count");
  std::vector<uint8_t> capped(p.size(), 0);
  for (int iter = 0; iter < 64; ++iter) {
    double free_sum = 0, capped_total = 0;
    for (size_t i = 0; i < p.size(); ++i) {
      if (capped[i]) {
        capped_total += 1.0;
      } else {
        free_sum += p[i];
      }
    }
    RS_CHECK(free_sum > 0, "water-filling needs positive mass");
    const double scale = (total - capped_total) / free_sum;
    bool changed = false;
    for (size_t i = 0; i < p.size(); ++i) {
      if (capped[i]) continue;
      p[i] *= scale;
      if (p[i] > 1.0) {
        p[i] = 1.0;
        capped[i] = 1;
        changed = true;
      }
    }
    if (!changed) return;
  }
}

void balance_columns(std::vector<double>& m, int64_t rows, int64_t cols, int iterations) {
  std::vector<double> row_target(rows, 0.0), col(cols);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) row_target[r] += m[r * cols + c];
  const double col_target = std::accumulate(row_target.begin(), row_target.end(), 0.0) / double(cols);
  for (int it = 0; it < iterations; ++it) {
    std::fill(col.begin(), col.end(), 0.0);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) col[c] += m[r * cols + c];
    for (auto& x : col) x = x > 0 ? col_target / x : 1.0;
    for (int64_t r = 0; r < rows; ++r) {
      double* row = &m[r * cols];
      double sum = 0;
      for (int64_t c = 0; c < cols; ++c) sum += (row[c] *= col[c]);
      if (sum <= 0) continue;
      const double s = row_target[r] / sum;
      for (int64_t c = 0; c < cols; ++c) row[c] *= s;
    }
  }
}

RoutingGenerator::RoutingGenerator(const RoutingModel& model, const RoutingShape& shape)
    : shape_(shape), model_(model) {
  RS_CHECK(shape.top_k >= 1 && shape.top_k <= shape.n_experts, "validated by the caller");
  if (model.topics < 1) throw UserError("routing model topics: expected >= 1, found " + std::to_string(model.topics));
  if (!(model.topic_sharpness > 0) || !(model.concentration > 0) || !(model.doc_lengths.mean_tokens >= 1))
    throw UserError("routing model: topic_sharpness and concentration must be > 0, mean document length >= 1");
  if (!(model.persistent_share >= 0 && model.persistent_share <= 1) || model.coherence_tokens < 0)
    throw UserError("routing model: persistent_share must be in [0, 1] and coherence_tokens >= 0");
  if (!model.popularity.empty()) {
    if (static_cast<int64_t>(model.popularity.size()) != shape.n_experts)
      throw UserError("routing model popularity: expected " + std::to_string(shape.n_experts) +
                      " shares (one per expert), found " + std::to_string(model.popularity.size()));
    for (double p : model.popularity)
      if (!(p > 0 && p < 1)) throw UserError("routing model popularity: expected shares in (0, 1), found " + std::to_string(p));
  }
  const int64_t E = shape.n_experts, K = model.topics;
  // Topic rows: Dirichlet, water-filled to top-k inclusion probabilities <= 1, and
  // balanced so the average topic routes uniformly (what QB holds in expectation).
  std::mt19937_64 rng(model.topic_seed);
  topic_experts_.assign(K * E, 0.0);
  std::vector<double> row(E);
  for (int64_t t = 0; t < K; ++t) {
    dirichlet(rng, model.topic_sharpness, row);
    for (auto& x : row) x = std::max(x, 1e-12);
    std::copy(row.begin(), row.end(), topic_experts_.begin() + t * E);
  }
  for (int round = 0; round < 4; ++round) {
    balance_columns(topic_experts_, K, E, 16);
    for (int64_t t = 0; t < K; ++t) {
      std::copy(topic_experts_.begin() + t * E, topic_experts_.begin() + (t + 1) * E, row.begin());
      water_fill(row, double(shape.top_k));
      for (int64_t e = 0; e < E; ++e) topic_experts_[t * E + e] = row[e] / double(shape.top_k);
    }
  }
  // Second moment of fragment lengths per GPU, for the analytic estimate.
  std::mt19937_64 lrng(12345);
  double sq = 0;
  const int reps = 2000;
  double piece_sq = 0;
  const int64_t coherence = model.coherence_tokens;
  for (int i = 0; i < reps; ++i)
    for_each_fragment(lrng, [&](int64_t n) {
      sq += double(n) * double(n);
      if (coherence <= 0) return;
      for (; n > coherence; n -= coherence) piece_sq += double(coherence) * double(coherence);
      piece_sq += double(n) * double(n);
    });
  fragment_square_sum_ = sq / reps;
  piece_square_sum_ = piece_sq / reps;
}

RoutingGenerator::RoutingGenerator(const RoutingHistogram& hist, const RoutingShape& shape)
    : shape_(shape), hist_(hist) {
  if (hist.n_experts != shape.n_experts || hist.top_k != shape.top_k)
    throw UserError("routing histogram has " + std::to_string(hist.n_experts) + " experts, top-" +
                    std::to_string(hist.top_k) + "; the scenario has " + std::to_string(shape.n_experts) +
                    " experts, top-" + std::to_string(shape.top_k));
  RS_CHECK(!hist.tokens.empty(), "the reader rejects empty histograms");
  double cum = 0;
  for (int64_t t : hist.tokens) unit_cumulative_tokens_.push_back(cum += double(t));
}

// Calls visit(n) for every document fragment on one GPU (fragment lengths sum to
// tokens_per_gpu). Each window starts inside a length-biased document.
template <typename Visit>
void RoutingGenerator::for_each_fragment(std::mt19937_64& rng, Visit&& visit) const {
  const int64_t w = shape_.window_tokens();
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (int64_t start = 0; start < shape_.tokens_per_gpu; start += w) {
    const int64_t len = std::min(w, shape_.tokens_per_gpu - start);
    const int64_t first = model_.doc_lengths.sample_length_biased(rng);
    int64_t n = std::min<int64_t>(len, std::max<int64_t>(1, std::llround(u(rng) * double(first))));
    visit(n);
    for (int64_t pos = n; pos < len; pos += n) {
      n = std::min(len - pos, model_.doc_lengths.sample(rng));
      visit(n);
    }
  }
}

void RoutingGenerator::add_synthetic_rates(std::mt19937_64& rng, double* row) const {
  const int64_t E = shape_.n_experts, K = model_.topics;
  std::vector<double> weight(K, 0.0), theta(K);
  const double shape = model_.concentration / double(K);
  const int64_t coherence = model_.coherence_tokens;
  const double persistent = coherence > 0 ? model_.persistent_share : 1.0;
  auto add = [&](double tokens) {
    dirichlet(rng, shape, theta);
    for (int64_t t = 0; t < K; ++t) weight[t] += tokens * theta[t];
  };
  for_each_fragment(rng, [&](int64_t n) {
    if (persistent > 0) add(persistent * double(n));
    if (persistent >= 1) return;
    for (; n > coherence; n -= coherence) add((1 - persistent) * double(coherence));
    add((1 - persistent) * double(n));
  });
  const double k = shape_.top_k;
  for (int64_t t = 0; t < K; ++t) {
    const double wt = weight[t] * k;
    const double* phi = &topic_experts_[t * E];
    for (int64_t e = 0; e < E; ++e) row[e] += wt * phi[e];
  }
}

void RoutingGenerator::add_histogram_rates(std::mt19937_64& rng, double* row) const {
  const int64_t E = shape_.n_experts;
  const auto units = static_cast<int64_t>(hist_.tokens.size());
  std::uniform_int_distribution<int64_t> any_unit(0, units - 1);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  auto add = [&](int64_t unit, int64_t n) {
    const double scale = double(n) / double(hist_.tokens[unit]);
    const int32_t* c = &hist_.counts[unit * E];
    for (int64_t e = 0; e < E; ++e) row[e] += scale * double(c[e]);
  };
  const bool documents = hist_.unit == "document";
  const int64_t w = documents ? shape_.window_tokens() : shape_.tokens_per_gpu;
  for (int64_t start = 0; start < shape_.tokens_per_gpu; start += w) {
    const int64_t len = std::min(w, shape_.tokens_per_gpu - start);
    int64_t pos = 0;
    if (documents) {  // the window starts inside a document picked in proportion to its length
      const double x = u(rng) * unit_cumulative_tokens_.back();
      const auto unit = std::min<int64_t>(
          units - 1, std::upper_bound(unit_cumulative_tokens_.begin(), unit_cumulative_tokens_.end(), x) -
                         unit_cumulative_tokens_.begin());
      pos = std::min(len, std::max<int64_t>(1, std::llround(u(rng) * double(hist_.tokens[unit]))));
      add(unit, pos);
    }
    while (pos < len) {
      const int64_t unit = any_unit(rng);
      const int64_t n = std::min(len - pos, hist_.tokens[unit]);
      add(unit, n);
      pos += n;
    }
  }
}

void RoutingGenerator::sample_rates(std::mt19937_64& rng, std::vector<double>& rates) const {
  const int64_t G = shape_.gpus, E = shape_.n_experts;
  rates.assign(G * E, 0.0);
  for (int64_t g = 0; g < G; ++g) {
    if (synthetic()) {
      add_synthetic_rates(rng, &rates[g * E]);
    } else {
      add_histogram_rates(rng, &rates[g * E]);
    }
  }
  if (model_.balance_each_step || !synthetic()) {
    balance_columns(rates, G, E, 4);
    return;
  }
  if (model_.popularity.empty()) return;  // topic rows already average to a uniform load
  // The long-run skew QB leaves: expert e carries E * popularity[e] times its share.
  for (int64_t g = 0; g < G; ++g) {
    double* row = &rates[g * E];
    double before = 0, after = 0;
    for (int64_t e = 0; e < E; ++e) {
      before += row[e];
      after += (row[e] *= double(E) * model_.popularity[e]);
    }
    if (after > 0)
      for (int64_t e = 0; e < E; ++e) row[e] *= before / after;
  }
}

void RoutingGenerator::sample_counts(std::mt19937_64& rng, std::vector<int32_t>& counts) const {
  const int64_t G = shape_.gpus, E = shape_.n_experts;
  std::vector<double> rates;
  sample_rates(rng, rates);
  counts.assign(G * E, 0);
  const int64_t a = shape_.tokens_per_gpu * shape_.top_k;
  // Top-k without replacement: per-token variance k p (1 - k p) instead of the
  // multinomial's k p (1 - p); at p = 1/E the deviations shrink by sqrt of the ratio.
  const double k = shape_.top_k, uniform = 1.0 / double(E);
  const double shrink = std::sqrt(std::max(0.0, (1.0 - k * uniform) / (1.0 - uniform)));
  // Multinomial(a, rates/a) as a chain of conditional binomials.
  for (int64_t g = 0; g < G; ++g) {
    const double* r = &rates[g * E];
    int32_t* c = &counts[g * E];
    double rest = std::accumulate(r, r + E, 0.0);
    int64_t left = a;
    for (int64_t e = 0; e < E && left > 0; ++e) {
      const double p = rest > 0 ? std::min(1.0, r[e] / rest) : 1.0;
      c[e] = static_cast<int32_t>((e == E - 1) ? left : binomial(rng, left, p));
      left -= c[e];
      rest -= r[e];
    }
    if (shrink >= 1.0) continue;
    int64_t sum = 0, top = 0;
    for (int64_t e = 0; e < E; ++e) {
      const double mean = r[e];
      c[e] = static_cast<int32_t>(std::clamp<double>(std::llround(mean + shrink * (double(c[e]) - mean)), 0.0,
                                                     double(shape_.tokens_per_gpu)));
      sum += c[e];
      if (c[e] > c[top]) top = e;
    }
    c[top] = static_cast<int32_t>(std::max<int64_t>(0, c[top] + (a - sum)));  // rows keep tokens * k
  }
}

RoutingHistogram load_routing_histogram(const std::string& path) {
  const nlohmann::json doc = load_json_file(path);
  JsonReader r(doc, path);
  const std::string format = r.string("format");
  if (format != "rackstep.routing_histogram/1") r.fail("format", "\"rackstep.routing_histogram/1\"", "\"" + format + "\"");
  RoutingHistogram h;
  h.source = r.string("source", "");
  h.n_experts = r.integer("n_experts", at_least(1));
  h.top_k = static_cast<int>(r.integer("top_k", at_least(1)));
  if (h.top_k > h.n_experts) r.fail("top_k", "at most n_experts (" + std::to_string(h.n_experts) + ")", std::to_string(h.top_k));
  h.unit = r.choice("unit", {"document", "sequence"}, "document");
  auto entries = r.object_list("entries");
  if (entries.empty()) r.fail("entries", "at least one entry", "an empty array");
  for (auto& e : entries) {
    const int64_t tokens = e.integer("tokens", at_least(1));
    const auto counts = e.integer_list("counts", {});
    if (static_cast<int64_t>(counts.size()) != h.n_experts)
      e.fail("counts", std::to_string(h.n_experts) + " counts (one per expert)", std::to_string(counts.size()));
    int64_t sum = 0;
    for (size_t i = 0; i < counts.size(); ++i) {
      if (counts[i] < 0 || counts[i] > tokens)
        e.fail("counts/" + std::to_string(i), "0.." + std::to_string(tokens) + " (a token picks an expert at most once)",
               std::to_string(counts[i]));
      sum += counts[i];
    }
    if (sum != tokens * h.top_k)
      e.fail("counts", "counts summing to tokens * top_k = " + std::to_string(tokens * h.top_k), "sum " + std::to_string(sum));
    e.finish();
    h.tokens.push_back(tokens);
    for (int64_t c : counts) h.counts.push_back(static_cast<int32_t>(c));
  }
  r.finish();
  return h;
}

void write_routing_histogram(const std::string& path, const RoutingHistogram& h) {
  nlohmann::json doc;
  doc["format"] = "rackstep.routing_histogram/1";
  doc["source"] = h.source;
  doc["n_experts"] = h.n_experts;
  doc["top_k"] = h.top_k;
  doc["unit"] = h.unit;
  doc["entries"] = nlohmann::json::array();
  for (size_t u = 0; u < h.tokens.size(); ++u) {
    std::vector<int32_t> c(h.counts.begin() + u * h.n_experts, h.counts.begin() + (u + 1) * h.n_experts);
    doc["entries"].push_back({{"tokens", h.tokens[u]}, {"counts", c}});
  }
  write_json_file_atomic(path, doc, 1);
}

}  // namespace rackstep::sim
