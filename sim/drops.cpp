#include "sim/drops.h"
#include "sim/base/source_dir.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <thread>
#include <tuple>

#include "sim/base/check.h"
#include "sim/base/json_io.h"
#include "sim/predict.h"

namespace rackstep::sim {

namespace {

// E[max(0, X - cap)] for X ~ Normal(mean, var): the expected overflow of a buffer.
double normal_excess(double mean, double var, double cap) {
  if (var <= 0) return std::max(0.0, mean - cap);
  const double s = std::sqrt(var);
  const double z = (cap - mean) / s;
  const double pdf = std::exp(-0.5 * z * z) / std::sqrt(2 * M_PI);
  const double tail = 0.5 * std::erfc(z / std::sqrt(2.0));
  return std::max(0.0, s * pdf + (mean - cap) * tail);
}

// Regularised upper incomplete gamma Q(a, x) = Gamma(a, x) / Gamma(a): series for
// x < a + 1, continued fraction (modified Lentz) otherwise (Numerical Recipes 6.2).
double gamma_q(double a, double x) {
  if (x <= 0) return 1.0;
  const double log_prefix = a * std::log(x) - x - std::lgamma(a);
  if (x < a + 1) {
    double term = 1.0 / a, sum = term;
    for (int n = 1; n < 1000 && std::fabs(term) > std::fabs(sum) * 1e-15; ++n) sum += (term *= x / (a + n));
    return std::clamp(1.0 - sum * std::exp(log_prefix), 0.0, 1.0);
  }
  const double tiny = 1e-300;
  double b = x + 1 - a, c = 1 / tiny, d = 1 / b, h = d;
  for (int i = 1; i < 1000; ++i) {
    const double an = -i * (i - a);
    b += 2;
    d = an * d + b;
    if (std::fabs(d) < tiny) d = tiny;
    c = b + an / c;
    if (std::fabs(c) < tiny) c = tiny;
    d = 1 / d;
    const double delta = d * c;
    h *= delta;
    if (std::fabs(delta - 1) < 1e-15) break;
  }
  return std::clamp(std::exp(log_prefix) * h, 0.0, 1.0);
}

// E[max(0, X - cap)] for X ~ Gamma with the given mean and variance: the overflow
// of a right-skewed load (a document mixture has a long right tail). With shape a,
// scale b: a*b*Q(a+1, cap/b) - cap*Q(a, cap/b). Falls back to the normal where the
// shape is so large that the two agree.
double gamma_excess(double mean, double var, double cap) {
  if (var <= 0 || mean <= 0) return std::max(0.0, mean - cap);
  const double a = mean * mean / var, b = var / mean;
  if (a > 1e5) return normal_excess(mean, var, cap);
  const double x = cap / b;
  return std::max(0.0, mean * gamma_q(a + 1, x) - cap * gamma_q(a, x));
}

// Two-sided 95% Student t quantile for df degrees of freedom.
double t95(int df) {
  static const double table[] = {12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
                                 2.201,  2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086};
  if (df < 1) return 0;
  if (df <= 20) return table[df - 1];
  return 1.96 + 2.4 / df;
}

struct Sizes {
  int64_t S, local, W, A;
  CapacityRows phys;
};

Sizes sizes_of(const DropScenario& s) {
  return {s.ep, s.dispatch.n_experts / s.ep, s.dispatch.waves, s.tokens_per_gpu * s.dispatch.top_k,
          physical_capacity(s.dispatch, s.ep, s.tokens_per_gpu)};
}

std::vector<int64_t> chunk_bounds(int64_t local, int64_t chunks) {
  std::vector<int64_t> b(chunks + 1);
  for (int64_t c = 0; c <= chunks; ++c) b[c] = c * local / chunks;
  return b;
}

// Pooled waves for one EP group whose GPUs' counts start at c (S rows of n_experts).
void pooled_group(const DropScenario& s, const Sizes& z, const int32_t* c, double& sender, double& receiver) {
  const int64_t E = s.dispatch.n_experts, S = z.S, L = z.local, W = z.W;
  const int64_t pool = scaled_capacity(z.A, s.dispatch.sender_cf, S * W, z.phys.sender_pool);
  const int64_t recv = scaled_capacity(S * z.A, s.dispatch.receiver_cf, E * W, z.phys.receiver_buffer);
  std::vector<double> mean(S * L * W, 0.0), var(S * L * W, 0.0);  // (destination, local expert, wave)
  for (int64_t g = 0; g < S; ++g) {
    for (int64_t d = 0; d < S; ++d) {
      const int32_t* m = c + g * E + d * L;
      const int64_t n = std::accumulate(m, m + L, int64_t{0});
      const int64_t kept = std::min(n, W * pool);
      sender += double(n - kept);
      if (n == 0) continue;
      for (int64_t w = 0; w < W; ++w) {
        // Kept ranks r < kept with r mod W == w: this wave's rows from (g, d).
        const double rows = kept > w ? double((kept - w + W - 1) / W) : 0.0;
        const double fpc = n > 1 ? (double(n) - rows) / double(n - 1) : 0.0;  // hypergeometric
        for (int64_t e = 0; e < L; ++e) {
          const double p = double(m[e]) / double(n);
          mean[(d * L + e) * W + w] += rows * p;
          var[(d * L + e) * W + w] += rows * p * (1 - p) * fpc;
        }
      }
    }
  }
  for (size_t i = 0; i < mean.size(); ++i) receiver += normal_excess(mean[i], var[i], double(recv));
}

void ragged_group(const DropScenario& s, const Sizes& z, const int32_t* c, double& receiver) {
  const int64_t E = s.dispatch.n_experts, S = z.S, L = z.local;
  const int64_t gate = scaled_capacity(S * z.A, s.dispatch.receiver_cf, S, z.phys.receiver_buffer);
  const auto b = chunk_bounds(L, s.dispatch.ragged_chunks);
  for (int64_t d = 0; d < S; ++d)
    for (size_t ch = 0; ch + 1 < b.size(); ++ch) {
      const int64_t cap = scaled_capacity(gate * (b[ch + 1] - b[ch]), 1.0, L, gate);
      int64_t rows = 0;
      for (int64_t g = 0; g < S; ++g)
        for (int64_t e = d * L + b[ch]; e < d * L + b[ch + 1]; ++e) rows += c[g * E + e];
      receiver += double(std::max<int64_t>(0, rows - cap));
    }
}

void capacity_group(const DropScenario& s, const Sizes& z, const int32_t* c, double& receiver) {
  const int64_t E = s.dispatch.n_experts;
  const int64_t cap = scaled_capacity(z.A, s.dispatch.receiver_cf, E, z.phys.receiver_buffer);
  for (int64_t i = 0; i < z.S * E; ++i) receiver += double(std::max<int64_t>(0, c[i] - cap));
}

DropEstimate summarise(const std::vector<DropFractions>& per_sample, const std::string& method) {
  DropEstimate est;
  est.samples = static_cast<int>(per_sample.size());
  est.method = method;
  const double n = double(per_sample.size());
  auto stats = [&](auto get, double& mean, double& ci) {
    double m = 0, v = 0;
    for (const auto& f : per_sample) m += get(f);
    m /= n;
    for (const auto& f : per_sample) v += (get(f) - m) * (get(f) - m);
    mean = m;
    ci = per_sample.size() > 1 ? t95(int(n) - 1) * std::sqrt(v / (n - 1) / n) : 0.0;
  };
  double total_mean = 0;
  stats([](const DropFractions& f) { return f.sender; }, est.mean.sender, est.ci95.sender);
  stats([](const DropFractions& f) { return f.receiver; }, est.mean.receiver, est.ci95.receiver);
  stats([](const DropFractions& f) { return f.padding; }, est.mean.padding, est.ci95.padding);
  stats([](const DropFractions& f) { return f.total(); }, total_mean, est.total_ci95);
  return est;
}

// Mean and variance of one GPU's assignment count to a set of experts (analytic model).
struct Moments {
  double mean, var;
};

class AnalyticModel {
 public:
  AnalyticModel(const DropScenario& s, const RoutingGenerator& gen)
      : E_(s.dispatch.n_experts), K_(gen.model().topics), A_(double(s.tokens_per_gpu * s.dispatch.top_k)),
        phi_(gen.topic_experts()) {
    const double k = s.dispatch.top_k;
    // Long-run popularity (a model whose QB does not balance each step): expert e
    // carries E * popularity[e] times its topic share.
    const auto& pop = gen.model().popularity;
    weight_.assign(static_cast<size_t>(E_), 1.0);
    if (!gen.model().balance_each_step && !pop.empty())
      for (int64_t e = 0; e < E_; ++e) weight_[static_cast<size_t>(e)] = double(E_) * pop[static_cast<size_t>(e)];
    // Top-k without replacement shrinks the per-token noise (sim/routing.h, step 5).
    noise_scale_ = (1.0 - k / double(E_)) / (1.0 - 1.0 / double(E_));
    // Var of the rate: k^2 * E[sum_f n_f^2] * Var_t(phi_A) / (concentration + 1), from the
    // symmetric Dirichlet covariance Cov(theta_t, theta_u) = (delta_tu/K - 1/K^2)/(alpha + 1).
    // With fading affinity the document-wide and the local mixtures add:
    // w^2 E[sum n_f^2] + (1 - w)^2 E[sum piece^2].
    const RoutingModel& rm = gen.model();
    const double w = rm.coherence_tokens > 0 ? rm.persistent_share : 1.0;
    rate_var_scale_ = k * k * (w * w * gen.fragment_square_sum() + (1 - w) * (1 - w) * gen.piece_square_sum()) /
                      (rm.concentration + 1.0);
  }

  Moments of_experts(int64_t first, int64_t count) const {
    double m1 = 0, m2 = 0;
    for (int64_t t = 0; t < K_; ++t) {
      double p = 0;
      for (int64_t e = first; e < first + count; ++e) p += phi_[t * E_ + e] * weight_[static_cast<size_t>(e)];
      m1 += p;
      m2 += p * p;
    }
    m1 /= double(K_);
    m2 /= double(K_);
    const double mean = A_ * m1;
    const double rate_var = rate_var_scale_ * std::max(0.0, m2 - m1 * m1);
    // Multinomial noise around the rate: E[lambda (1 - lambda / A)].
    const double noise = noise_scale_ * (mean - (mean * mean + rate_var) / A_);
    return {mean, rate_var + noise};
  }

 private:
  int64_t E_, K_;
  double A_;
  const std::vector<double>& phi_;
  std::vector<double> weight_;  // (E) popularity weights, 1 = uniform
  double rate_var_scale_ = 0;
  double noise_scale_ = 1;
};

}  // namespace

RoutingShape DropScenario::routing_shape() const {
  RoutingShape r;
  r.n_experts = dispatch.n_experts;
  r.top_k = dispatch.top_k;
  r.gpus = step_gpus();
  r.tokens_per_gpu = tokens_per_gpu;
  r.context = context;
  return r;
}

void DropScenario::validate() const {
  sim::validate(dispatch, ep);
  auto num = [](double x) { return std::to_string(x); };
  // Bounds that keep one sampled step's memory and work finite (checked before
  // anything is allocated): counts are (GPUs, experts) int32, a GPU's windows
  // each draw a document mixture.
  if (!(dispatch.sender_cf <= kMaxCapacityFactor) || !(dispatch.receiver_cf <= kMaxCapacityFactor))
    throw UserError("capacity factors: expected at most " + num(kMaxCapacityFactor) + ", found " +
                    num(dispatch.sender_cf) + " / " + num(dispatch.receiver_cf));
  if (dispatch.waves > kMaxWaves)
    throw UserError("waves: expected at most " + std::to_string(kMaxWaves) + ", found " + std::to_string(dispatch.waves));
  if (dispatch.n_experts > kMaxExperts)
    throw UserError("experts: expected at most " + std::to_string(kMaxExperts) + ", found " + std::to_string(dispatch.n_experts));
  if (tokens_per_gpu < 1 || tokens_per_gpu > kMaxTokensPerGpu)
    throw UserError("tokens per GPU: expected 1.." + std::to_string(kMaxTokensPerGpu) + " (at most " +
                    std::to_string(kMaxTokensPerGpu) + "), found " + std::to_string(tokens_per_gpu));
  if (context < 1) throw UserError("context: expected >= 1 token, found " + std::to_string(context));
  if (tokens_per_gpu / context > kMaxSequencesPerGpu)
    throw UserError("context: expected at least " + std::to_string((tokens_per_gpu + kMaxSequencesPerGpu - 1) / kMaxSequencesPerGpu) +
                    " tokens (at most " + std::to_string(kMaxSequencesPerGpu) + " sequences per GPU at " +
                    std::to_string(tokens_per_gpu) + " tokens per GPU), found " + std::to_string(context));
  if (gpus < 0 || gpus > kMaxGpus)
    throw UserError("GPUs: expected 0.." + std::to_string(kMaxGpus) + " (at most " + std::to_string(kMaxGpus) +
                    "), found " + std::to_string(gpus));
  if (step_gpus() % ep != 0)
    throw UserError("GPUs: expected a multiple of the EP size " + std::to_string(ep) + ", found " +
                    std::to_string(gpus));
  if (step_gpus() * dispatch.n_experts > kMaxGpuExperts)
    throw UserError("GPUs x experts: expected at most " + std::to_string(kMaxGpuExperts) + " counts per step, found " +
                    std::to_string(step_gpus() * dispatch.n_experts));
}

DropFractions drops_from_counts(const DropScenario& s, const std::vector<int32_t>& counts) {
  const Sizes z = sizes_of(s);
  const int64_t E = s.dispatch.n_experts, groups = s.step_gpus() / s.ep;
  RS_CHECK(static_cast<int64_t>(counts.size()) == s.step_gpus() * E, "counts are (gpus, experts)");
  double sender = 0, receiver = 0;
  for (int64_t grp = 0; grp < groups; ++grp) {
    const int32_t* c = counts.data() + grp * z.S * E;
    switch (s.dispatch.transport) {
      case Transport::pooled: pooled_group(s, z, c, sender, receiver); break;
      case Transport::ragged: ragged_group(s, z, c, receiver); break;
      case Transport::capacity: capacity_group(s, z, c, receiver); break;
    }
  }
  const double total = double(s.step_gpus()) * double(z.A);
  return {sender / total, receiver / total, 0.0};
}

DropEstimate estimate_drops_mc(const DropScenario& s, const RoutingGenerator& gen, const McOptions& opt) {
  s.validate();
  if (opt.samples < 1) throw UserError("samples: expected >= 1, found " + std::to_string(opt.samples));
  std::vector<DropFractions> per_sample(opt.samples);
  auto run = [&](int first, int stride) {
    std::vector<int32_t> counts;
    for (int i = first; i < opt.samples; i += stride) {
      // One seed per sample: results do not depend on the thread count.
      std::seed_seq seq{opt.seed, uint64_t(i)};
      std::mt19937_64 rng(seq);
      gen.sample_counts(rng, counts);
      per_sample[i] = drops_from_counts(s, counts);
    }
  };
  const int threads = std::clamp(opt.threads, 1, opt.samples);
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(run, t, threads);
  run(0, threads);
  for (auto& t : pool) t.join();
  return summarise(per_sample, "monte_carlo");
}

DropEstimate estimate_drops_analytic(const DropScenario& s, const RoutingGenerator& gen) {
  s.validate();
  if (!gen.synthetic())
    throw UserError("the analytic estimate needs the synthetic routing model; use Monte Carlo with a histogram");
  const Sizes z = sizes_of(s);
  const AnalyticModel am(s, gen);
  const int64_t S = z.S, L = z.local, W = z.W;
  const double A = double(z.A);
  double sender = 0, receiver = 0;  // per GPU, in assignments
  switch (s.dispatch.transport) {
    case Transport::pooled: {
      const int64_t pool = scaled_capacity(z.A, s.dispatch.sender_cf, S * W, z.phys.sender_pool);
      const int64_t recv = scaled_capacity(S * z.A, s.dispatch.receiver_cf, s.dispatch.n_experts * W,
                                           z.phys.receiver_buffer);
      for (int64_t d = 0; d < S; ++d) {
        const Moments dest = am.of_experts(d * L, L);
        const double dropped = gamma_excess(dest.mean, dest.var, double(W * pool));
        sender += dropped;
        const double keep = dest.mean > 0 ? 1.0 - dropped / dest.mean : 1.0;
        for (int64_t e = 0; e < L; ++e) {
          const Moments ex = am.of_experts(d * L + e, 1);
          // Per source and wave: the kept share of the expert's rows (variance of the
          // count scaled by 1/W^2) plus the binomial spread of rows over waves.
          const double m = ex.mean * keep / double(W);
          const double v = ex.var * keep * keep / double(W * W) + ex.mean * keep * double(W - 1) / double(W * W);
          receiver += double(W) * gamma_excess(double(S) * m, double(S) * v, double(recv)) / double(S);
        }
      }
      break;
    }
    case Transport::ragged: {
      const int64_t gate = scaled_capacity(S * z.A, s.dispatch.receiver_cf, S, z.phys.receiver_buffer);
      const auto b = chunk_bounds(L, s.dispatch.ragged_chunks);
      for (int64_t d = 0; d < S; ++d)
        for (size_t ch = 0; ch + 1 < b.size(); ++ch) {
          const int64_t cap = scaled_capacity(gate * (b[ch + 1] - b[ch]), 1.0, L, gate);
          const Moments m = am.of_experts(d * L + b[ch], b[ch + 1] - b[ch]);
          receiver += gamma_excess(double(S) * m.mean, double(S) * m.var, double(cap)) / double(S);
        }
      break;
    }
    case Transport::capacity: {
      const int64_t cap = scaled_capacity(z.A, s.dispatch.receiver_cf, s.dispatch.n_experts, z.phys.receiver_buffer);
      for (int64_t e = 0; e < s.dispatch.n_experts; ++e) {
        const Moments m = am.of_experts(e, 1);
        receiver += gamma_excess(m.mean, m.var, double(cap));
      }
      break;
    }
  }
  DropEstimate est;
  est.method = "analytic";
  est.mean = {sender / A, receiver / A, 0.0};
  return est;
}

DropEstimate estimate_drops(const DropScenario& s, const RoutingGenerator& gen, Method m, const McOptions& opt) {
  return m == Method::analytic ? estimate_drops_analytic(s, gen) : estimate_drops_mc(s, gen, opt);
}

double fit_concentration(const DropScenario& s, RoutingModel model, double target, Method m, const McOptions& opt) {
  if (!(target > 0 && target < 1)) throw UserError("target drop: expected a fraction in (0, 1), found " + std::to_string(target));
  auto drop_at = [&](double log_alpha) {
    model.concentration = std::exp(log_alpha);
    RoutingGenerator gen(model, s.routing_shape());
    return estimate_drops(s, gen, m, opt).mean.total();
  };
  // Drops fall as concentration rises (documents route more like the average).
  double lo = std::log(1e-3), hi = std::log(1e4);
  const double most = drop_at(lo), least = drop_at(hi);
  if (target > most || target < least)
    throw UserError("target drop " + std::to_string(target) + " is outside what the routing model reaches here (" +
                    std::to_string(least) + " .. " + std::to_string(most) + ")");
  for (int it = 0; it < 24 && hi - lo > 1e-3; ++it) {
    const double mid = 0.5 * (lo + hi);
    (drop_at(mid) > target ? lo : hi) = mid;
  }
  return std::exp(0.5 * (lo + hi));
}

double default_drop_target() {
  static const double target = [] {
    const DropCalibration cal = load_drop_calibration();
    if (!(cal.target_drop > 0))
      throw UserError(default_drop_calibration_path(), "/fit/target_drop", "the drop fraction the default was fitted to",
                      "none");
    return cal.target_drop;
  }();
  return target;
}

std::string default_drop_calibration_path() { return std::string(rackstep::source_dir()) + "/sim/drop_calibration.json"; }

namespace {

// Ranges the calibration reader checks.
const NumberRange positive{.min_exclusive = 0.0};
const NumberRange one_or_more{.min = 1.0};
const NumberRange non_negative{.min = 0.0};
const NumberRange fraction{.min = 0.0, .max = 1.0};

RoutingModel read_routing_model(JsonReader& m) {
  RoutingModel model;
  JsonReader dl = m.object("doc_lengths");
  model.doc_lengths.kind = parse_doc_length_kind(dl.choice("kind", {"lognormal", "exponential", "fixed"}, "lognormal"));
  model.doc_lengths.mean_tokens = dl.number("mean_tokens", one_or_more);
  model.doc_lengths.sigma = dl.number("sigma", 1.0, positive);
  dl.ignore("comment");
  dl.finish();
  model.topics = static_cast<int>(m.integer("topics", one_or_more));
  model.topic_sharpness = m.number("topic_sharpness", positive);
  model.topic_seed = static_cast<uint64_t>(m.integer("topic_seed", 1, one_or_more));
  model.concentration = m.number("concentration", positive);
  model.coherence_tokens = m.integer("coherence_tokens", 0, non_negative);
  NumberRange share;
  share.min = 0.0;
  share.max = 1.0;
  model.persistent_share = m.number("persistent_share", 1.0, share);
  model.balance_each_step = m.boolean("balance_each_step", true);
  if (m.has("popularity")) {
    const nlohmann::json& p = m.raw()["popularity"];
    if (!p.is_array()) m.fail("popularity", "an array of expert shares", p.dump());
    for (size_t i = 0; i < p.size(); ++i) {
      if (!p[i].is_number() || !(p[i].get<double>() > 0 && p[i].get<double>() < 1))
        m.fail("popularity/" + std::to_string(i), "a share in (0, 1)", p[i].dump());
      model.popularity.push_back(p[i].get<double>());
    }
    m.ignore("popularity");
  }
  m.ignore("comment");
  m.ignore("layer");
  m.finish();
  return model;
}

nlohmann::json routing_model_json(const RoutingModel& m) {
  nlohmann::json j = {{"doc_lengths",
                       {{"kind", doc_length_kind_name(m.doc_lengths.kind)},
                        {"mean_tokens", m.doc_lengths.mean_tokens},
                        {"sigma", m.doc_lengths.sigma}}},
                      {"topics", m.topics},
                      {"topic_sharpness", m.topic_sharpness},
                      {"topic_seed", m.topic_seed},
                      {"concentration", m.concentration},
                      {"coherence_tokens", m.coherence_tokens},
                      {"persistent_share", m.persistent_share},
                      {"balance_each_step", m.balance_each_step}};
  if (!m.popularity.empty()) j["popularity"] = m.popularity;
  return j;
}

}  // namespace

std::vector<RoutingModel> calibration_models(const DropCalibration& cal) {
  return cal.layer_models.empty() ? std::vector<RoutingModel>{cal.model} : cal.layer_models;
}

DropEstimate average_estimates(const std::vector<DropEstimate>& per_layer) {
  RS_CHECK(!per_layer.empty(), "at least one layer");
  DropEstimate out = per_layer.front();
  if (per_layer.size() == 1) return out;
  const double n = double(per_layer.size());
  out.mean = {};
  out.ci95 = {};
  out.total_ci95 = 0;
  for (const auto& e : per_layer) {
    out.mean.sender += e.mean.sender / n;
    out.mean.receiver += e.mean.receiver / n;
    out.mean.padding += e.mean.padding / n;
    out.ci95.sender += e.ci95.sender * e.ci95.sender;
    out.ci95.receiver += e.ci95.receiver * e.ci95.receiver;
    out.ci95.padding += e.ci95.padding * e.ci95.padding;
    out.total_ci95 += e.total_ci95 * e.total_ci95;
  }
  out.ci95 = {std::sqrt(out.ci95.sender) / n, std::sqrt(out.ci95.receiver) / n, std::sqrt(out.ci95.padding) / n};
  out.total_ci95 = std::sqrt(out.total_ci95) / n;
  return out;
}

DropCalibration load_drop_calibration(const std::string& path) {
  const nlohmann::json doc = load_json_file(path);
  JsonReader r(doc, path);
  DropCalibration cal;
  cal.source = r.string("source");
  {
    JsonReader m = r.object("routing_model");
    cal.model = read_routing_model(m);
  }
  if (r.has("layer_models")) {
    for (auto& m : r.object_list("layer_models")) {
      cal.layers.push_back(static_cast<int32_t>(m.integer("layer", NumberRange{})));
      cal.layer_models.push_back(read_routing_model(m));
    }
  }
  {
    JsonReader f = r.object("fit");
    DropScenario& s = cal.scenario;
    s.dispatch.n_experts = f.integer("n_experts", one_or_more);
    s.dispatch.top_k = static_cast<int>(f.integer("top_k", one_or_more));
    s.dispatch.transport = parse_transport(f.choice("transport", {"pooled", "ragged", "capacity"}, "pooled"));
    s.dispatch.sender_cf = f.number("sender_cf", positive);
    s.dispatch.receiver_cf = f.number("receiver_cf", positive);
    s.dispatch.waves = static_cast<int>(f.integer("waves", 3, one_or_more));
    s.dispatch.ragged_chunks = static_cast<int>(f.integer("ragged_chunks", 2, one_or_more));
    s.ep = f.integer("ep", one_or_more);
    s.tokens_per_gpu = f.integer("tokens_per_gpu", one_or_more);
    s.context = f.integer("context", one_or_more);
    s.gpus = f.integer("gpus", 0, NumberRange{});
    cal.target_drop = f.number("target_drop", 0.0, fraction);
    cal.achieved_drop = f.number("achieved_drop", 0.0, fraction);
    cal.method = f.choice("method", {"monte_carlo", "analytic", "trace_statistics"}, "monte_carlo");
    cal.samples = static_cast<int>(f.integer("samples", 0, NumberRange{}));
    cal.seed = static_cast<uint64_t>(f.integer("seed", 1, NumberRange{}));
    cal.traces = f.string_list("traces", {});
    f.finish();
  }
  r.ignore("statistics");
  r.finish();
  return cal;
}

void write_drop_calibration(const std::string& path, const DropCalibration& cal) {
  const auto& s = cal.scenario;
  nlohmann::json doc = {
      {"source", cal.source},
      {"routing_model", routing_model_json(cal.model)},
      {"fit",
       {{"n_experts", s.dispatch.n_experts}, {"top_k", s.dispatch.top_k},
        {"transport", transport_name(s.dispatch.transport)}, {"sender_cf", s.dispatch.sender_cf},
        {"receiver_cf", s.dispatch.receiver_cf}, {"waves", s.dispatch.waves},
        {"ragged_chunks", s.dispatch.ragged_chunks}, {"ep", s.ep}, {"tokens_per_gpu", s.tokens_per_gpu},
        {"context", s.context}, {"gpus", s.gpus}, {"target_drop", cal.target_drop},
        {"achieved_drop", cal.achieved_drop}, {"method", cal.method}, {"samples", cal.samples},
        {"seed", cal.seed}}}};
  if (!cal.traces.empty()) doc["fit"]["traces"] = cal.traces;
  if (!cal.layer_models.empty()) {
    RS_CHECK(cal.layers.size() == cal.layer_models.size(), "one layer index per model");
    doc["layer_models"] = nlohmann::json::array();
    for (size_t i = 0; i < cal.layer_models.size(); ++i) {
      nlohmann::json m = routing_model_json(cal.layer_models[i]);
      m["layer"] = cal.layers[i];
      doc["layer_models"].push_back(m);
    }
  }
  if (!cal.statistics.is_null()) doc["statistics"] = cal.statistics;
  write_json_file_atomic(path, doc);
}

DropFractions predict_drops(int64_t n_experts, int top_k, int64_t ep, int64_t tokens_per_gpu, int64_t context,
                            Transport transport, double sender_cf, double receiver_cf, int waves, int ragged_chunks) {
  DropScenario s;
  s.dispatch.n_experts = n_experts;
  s.dispatch.top_k = top_k;
  s.dispatch.transport = transport;
  s.dispatch.sender_cf = sender_cf;
  s.dispatch.receiver_cf = receiver_cf;
  s.dispatch.waves = waves;
  s.dispatch.ragged_chunks = ragged_chunks;
  s.ep = ep;
  s.tokens_per_gpu = tokens_per_gpu;
  s.context = context;
  s.validate();

  static std::mutex mu;
  static std::unique_ptr<DropCalibration> cal;
  using GenKey = std::tuple<int64_t, int, int64_t, int64_t, size_t>;  // ..., layer model
  static std::map<GenKey, std::shared_ptr<RoutingGenerator>> generators;
  using Key = std::tuple<int64_t, int, int64_t, int64_t, int64_t, int, double, double, int, int>;
  static std::map<Key, DropFractions> results;

  std::lock_guard<std::mutex> lock(mu);
  const Key key{n_experts, top_k, ep, tokens_per_gpu, context, int(transport), sender_cf, receiver_cf, waves, ragged_chunks};
  if (auto it = results.find(key); it != results.end()) return it->second;
  if (!cal) cal = std::make_unique<DropCalibration>(load_drop_calibration());
  // A calibration fitted to routing traces has one model per MoE layer: average them.
  const std::vector<RoutingModel> models = calibration_models(*cal);
  std::vector<DropEstimate> per_layer;
  for (size_t i = 0; i < models.size(); ++i) {
    auto& gen = generators[GenKey{n_experts, top_k, tokens_per_gpu, context, i}];
    if (!gen) gen = std::make_shared<RoutingGenerator>(models[i], s.routing_shape());
    per_layer.push_back(estimate_drops_analytic(s, *gen));
  }
  return results[key] = average_estimates(per_layer).mean;
}

}  // namespace rackstep::sim
