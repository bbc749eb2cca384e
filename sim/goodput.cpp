// Goodput Monte Carlo; see sim/goodput.h.
//
// One run, one attempt at a time. An attempt starts from the last committed
// checkpoint and runs segments of k steps, each followed by a save. Three
// things can end it, whichever comes first in running time:
//   - completion: the last segment (no save after it) finishes;
//   - a failure (GPU, link, hang) after Exp(lambda) running seconds;
//   - the j-th save failing, j ~ Geometric(p).
// So a run costs O(interruptions) random draws, not O(steps).
#include "sim/goodput.h"
#include "sim/base/source_dir.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>

#include "sim/base/check.h"
#include "sim/base/value_error.h"
#include "sim/base/json_io.h"

namespace rackstep::sim {

namespace {

constexpr double kDay = 86400.0;

// ---------------------------------------------------------------- config

const NumberRange kPositive{std::nullopt, 0.0, std::nullopt};
const NumberRange kNonNegative{0.0, std::nullopt, std::nullopt};
const NumberRange kFraction{0.0, std::nullopt, 1.0};
const NumberRange kBelowOne{0.0, std::nullopt, 0.99};

}  // namespace

void apply_goodput_json(GoodputConfig& c, const nlohmann::json& doc, const std::string& file,
                        bool require_all) {
  JsonReader r(doc, file);
  r.ignore("comment");
  // Every number: required in the defaults file, optional in an override.
  auto num = [&](JsonReader& o, const char* key, double& field, NumberRange range) {
    field = require_all ? o.number(key, range) : o.number(key, field, range);
  };
  auto section = [&](const char* key) { return require_all ? r.object(key) : r.object_or_empty(key); };

  JsonReader gpu = section("gpu_failure");
  gpu.ignore("source");
  num(gpu, "mtbf_gpu_days", c.gpu_failure_mtbf_gpu_days, kNonNegative);
  gpu.finish();

  JsonReader link = section("link_failure");
  link.ignore("source");
  num(link, "mtbf_gpu_days", c.link_failure_mtbf_gpu_days, kNonNegative);
  link.finish();

  JsonReader hang = section("hang");
  hang.ignore("source");
  num(hang, "mean_steps_between", c.hang_mean_steps_between, kNonNegative);
  num(hang, "detect_s", c.hang_detect_s, kNonNegative);
  hang.finish();

  JsonReader restart = section("restart");
  restart.ignore("source");
  num(restart, "median_s", c.restart_median_s, kNonNegative);
  num(restart, "log_sigma", c.restart_log_sigma, {0.0, std::nullopt, 3.0});
  restart.finish();

  JsonReader ck = section("checkpoint");
  ck.ignore("source");
  num(ck, "interval_s", c.checkpoint_interval_s, kPositive);
  num(ck, "bytes_per_param", c.checkpoint_bytes_per_param, kNonNegative);
  num(ck, "write_bytes_per_s", c.checkpoint_write_bytes_per_s, kPositive);
  num(ck, "blocking_fraction", c.checkpoint_blocking_fraction, kFraction);
  num(ck, "failure_probability", c.checkpoint_failure_probability, kBelowOne);
  ck.finish();

  JsonReader gc = section("gc_stall");
  gc.ignore("source");
  num(gc, "fraction_of_elapsed", c.gc_stall_fraction, kBelowOne);
  gc.finish();
  r.finish();
}

GoodputConfig default_goodput_config() {
  const std::string path = std::string(rackstep::source_dir()) + "/sim/goodput_defaults.json";
  GoodputConfig c;
  apply_goodput_json(c, load_json_file(path), path, true);
  return c;
}

GoodputConfig load_goodput_config(const std::string& path) {
  GoodputConfig c = default_goodput_config();
  apply_goodput_json(c, load_json_file(path), path, false);
  return c;
}

nlohmann::json goodput_config_json(const GoodputConfig& c) {
  return {
      {"gpu_failure", {{"mtbf_gpu_days", c.gpu_failure_mtbf_gpu_days}}},
      {"link_failure", {{"mtbf_gpu_days", c.link_failure_mtbf_gpu_days}}},
      {"hang", {{"mean_steps_between", c.hang_mean_steps_between}, {"detect_s", c.hang_detect_s}}},
      {"restart", {{"median_s", c.restart_median_s}, {"log_sigma", c.restart_log_sigma}}},
      {"checkpoint",
       {{"interval_s", c.checkpoint_interval_s},
        {"bytes_per_param", c.checkpoint_bytes_per_param},
        {"write_bytes_per_s", c.checkpoint_write_bytes_per_s},
        {"blocking_fraction", c.checkpoint_blocking_fraction},
        {"failure_probability", c.checkpoint_failure_probability}}},
      {"gc_stall", {{"fraction_of_elapsed", c.gc_stall_fraction}}},
  };
}

double young_interval_s(double save_cost_s, double mtbf_s) {
  return std::sqrt(2.0 * save_cost_s * mtbf_s);
}

double daly_interval_s(double save_cost_s, double mtbf_s) {
  if (save_cost_s >= 2.0 * mtbf_s) return mtbf_s;
  const double x = save_cost_s / (2.0 * mtbf_s);
  return std::sqrt(2.0 * save_cost_s * mtbf_s) * (1.0 + std::sqrt(x) / 3.0 + x / 9.0) - save_cost_s;
}

namespace {

// ---------------------------------------------------------------- sampling

// splitmix64: small, fast, and a run's stream depends only on (seed, run).
struct Rng {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  double uniform() { return (static_cast<double>(next() >> 11) + 0.5) * (1.0 / 9007199254740992.0); }
  double exponential(double rate) { return -std::log(uniform()) / rate; }
  double normal() {
    return std::sqrt(-2.0 * std::log(uniform())) * std::cos(6.283185307179586 * uniform());
  }
};

// Rates and costs of one scenario in running seconds.
struct Model {
  int64_t steps;
  int64_t k;             // steps per checkpoint segment
  double step_s;         // wall time per step while running, GC stalls included
  double save_s;         // blocking time per save
  double lambda_gpu, lambda_link, lambda_hang;  // per running second
  double lambda;         // total
  double p_save_fail;
  double restart_median_s, restart_sigma;
  double hang_detect_s;
};

Model make_model(const GoodputRequest& req, const GoodputConfig& c, double interval_s) {
  Model m;
  m.steps = static_cast<int64_t>(std::ceil(req.tokens / req.tokens_per_step));
  // GC stalls are a share of elapsed time (calibration.md: 3.83%), so a step
  // stretches by 1 / (1 - share).
  m.step_s = req.step_time_s / (1.0 - c.gc_stall_fraction);
  // In double first: a tiny step against a long interval overflows llround.
  const double k = interval_s / m.step_s;
  m.k = k >= static_cast<double>(m.steps) ? std::max<int64_t>(1, m.steps) : std::max<int64_t>(1, std::llround(k));
  m.save_s = c.checkpoint_blocking_fraction * c.checkpoint_bytes_per_param * req.total_params /
             c.checkpoint_write_bytes_per_s;
  const double g = static_cast<double>(req.gpus);
  m.lambda_gpu = c.gpu_failure_mtbf_gpu_days > 0 ? g / (c.gpu_failure_mtbf_gpu_days * kDay) : 0;
  m.lambda_link = c.link_failure_mtbf_gpu_days > 0 ? g / (c.link_failure_mtbf_gpu_days * kDay) : 0;
  m.lambda_hang = c.hang_mean_steps_between > 0 ? 1.0 / (c.hang_mean_steps_between * m.step_s) : 0;
  m.lambda = m.lambda_gpu + m.lambda_link + m.lambda_hang;
  m.p_save_fail = c.checkpoint_failure_probability;
  m.restart_median_s = c.restart_median_s;
  m.restart_sigma = c.restart_log_sigma;
  m.hang_detect_s = c.hang_detect_s;
  return m;
}

struct RunTally {
  double wall_s = 0;
  double kept_save_s = 0, lost_s = 0, restart_s = 0, detect_s = 0;
  int64_t gpu = 0, link = 0, hang = 0, save_fail = 0;
};

RunTally simulate_run(const Model& m, Rng& rng) {
  RunTally t;
  const double inf = std::numeric_limits<double>::infinity();
  const double seg_s = static_cast<double>(m.k) * m.step_s + m.save_s;
  int64_t committed = 0;
  auto restart = [&] {
    double r = m.restart_median_s * std::exp(m.restart_sigma * rng.normal());
    t.restart_s += r;
    t.wall_s += r;
  };
  while (committed < m.steps) {
    const int64_t left = m.steps - committed;
    const int64_t segments = (left + m.k - 1) / m.k;  // saves after all but the last
    const double last_s = static_cast<double>(left - (segments - 1) * m.k) * m.step_s;
    const double done_at = static_cast<double>(segments - 1) * seg_s + last_s;
    const double fail_at = m.lambda > 0 ? rng.exponential(m.lambda) : inf;
    double save_fail_at = inf;
    int64_t j = 0;  // index (1-based) of the first failing save
    if (m.p_save_fail > 0) {
      j = 1 + static_cast<int64_t>(std::floor(std::log(rng.uniform()) / std::log1p(-m.p_save_fail)));
      if (j <= segments - 1) save_fail_at = static_cast<double>(j) * seg_s;
    }
    if (done_at <= fail_at && done_at <= save_fail_at) {
      t.wall_s += done_at;
      t.kept_save_s += static_cast<double>(segments - 1) * m.save_s;
      committed = m.steps;
      break;
    }
    if (save_fail_at < fail_at) {
      // Saves 1..j-1 were kept; segment j and its failed save are lost.
      t.wall_s += save_fail_at;
      t.kept_save_s += static_cast<double>(j - 1) * m.save_s;
      t.lost_s += seg_s;
      committed += (j - 1) * m.k;
      ++t.save_fail;
      restart();
      continue;
    }
    const int64_t kept = static_cast<int64_t>(std::floor(fail_at / seg_s));
    t.wall_s += fail_at;
    t.kept_save_s += static_cast<double>(kept) * m.save_s;
    t.lost_s += fail_at - static_cast<double>(kept) * seg_s;
    committed += kept * m.k;
    // Which kind of failure, in proportion to its rate.
    const double u = rng.uniform() * m.lambda;
    if (u < m.lambda_hang) {
      ++t.hang;
      t.detect_s += m.hang_detect_s;
      t.wall_s += m.hang_detect_s;
    } else if (u < m.lambda_hang + m.lambda_gpu) {
      ++t.gpu;
    } else {
      ++t.link;
    }
    restart();
  }
  return t;
}

uint64_t run_seed(uint64_t seed, int64_t run) {
  Rng r{seed ^ (0xd1b54a32d192ed03ULL * static_cast<uint64_t>(run + 1))};
  return r.next();
}

double percentile(const std::vector<double>& sorted, double q) {
  // Linear interpolation between closest ranks.
  const double pos = q * static_cast<double>(sorted.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (pos - static_cast<double>(lo)) * (sorted[hi] - sorted[lo]);
}

// Errors name the request's fields, not flags: `rackstep size` fills the
// request from a prediction and a scenario, so its user never typed
// --step-time-s; `rackstep goodput` maps the fields to its flags.
void validate(const GoodputRequest& req) {
  auto bad = [](const char* field, const std::string& expected, double found) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%g", found);
    throw ValueError("goodput", field, expected, buf);
  };
  if (!(req.step_time_s > 0) || !std::isfinite(req.step_time_s)) bad("step_time_s", "a time > 0", req.step_time_s);
  if (!(req.tokens_per_step >= 1) || !std::isfinite(req.tokens_per_step)) {
    bad("tokens_per_step", "a count >= 1", req.tokens_per_step);
  }
  if (!(req.tokens > 0) || !std::isfinite(req.tokens)) bad("tokens", "a budget > 0", req.tokens);
  if (req.tokens / req.tokens_per_step > 1e12) bad("tokens", "at most 1e12 steps' worth", req.tokens);
  if (req.gpus < 1) bad("gpus", "at least 1", static_cast<double>(req.gpus));
  if (!(req.total_params > 0) || !std::isfinite(req.total_params)) bad("total_params", "a parameter count > 0", req.total_params);
  if (!(req.deadline_days >= 0) || !std::isfinite(req.deadline_days)) {
    bad("deadline_days", "days >= 0 (0 = none)", req.deadline_days);
  }
  if (req.runs < 1 || req.runs > 10000000) bad("runs", "1 to 10,000,000", static_cast<double>(req.runs));
  if (req.bins < 1 || req.bins > 1000) bad("bins", "1 to 1000", req.bins);
}

std::vector<HistogramBin> histogram(const std::vector<double>& sorted, int bins) {
  const double lo = sorted.front(), hi = sorted.back();
  const double width = hi > lo ? (hi - lo) / bins : 1.0;
  std::vector<HistogramBin> h(bins);
  for (int b = 0; b < bins; ++b) h[b] = {lo + b * width, lo + (b + 1) * width, 0};
  for (double d : sorted) {
    int b = std::min(bins - 1, static_cast<int>((d - lo) / width));
    ++h[b].runs;
  }
  return h;
}

// Every interruption is one turn of simulate_run's loop. A segment (k steps and
// a save) completes with probability q = exp(-lambda * seg_s) * (1 - p_save_fail),
// so a run expects segments * (1/q - 1) interruptions. Refused before any work
// when a run would never finish or the whole Monte Carlo would take too long.
constexpr double kMaxInterruptions = 2e8;  // a few seconds' worth of loop turns in total

double expected_interruptions(const GoodputRequest& req, const Model& m) {
  const double seg_s = static_cast<double>(m.k) * m.step_s + m.save_s;
  const double log_q = -m.lambda * seg_s + std::log1p(-m.p_save_fail);
  const double segments = std::ceil(static_cast<double>(m.steps) / static_cast<double>(m.k));
  const double per_run = log_q < -700 ? std::numeric_limits<double>::infinity() : segments * std::expm1(-log_q);
  return per_run * static_cast<double>(req.runs);
}

void check_work(const GoodputRequest& req, const Model& m) {
  const double seg_s = static_cast<double>(m.k) * m.step_s + m.save_s;
  const double log_q = -m.lambda * seg_s + std::log1p(-m.p_save_fail);
  const double segments = std::ceil(static_cast<double>(m.steps) / static_cast<double>(m.k));
  const double per_run = log_q < -700 ? std::numeric_limits<double>::infinity() : segments * std::expm1(-log_q);
  const double total = per_run * static_cast<double>(req.runs);
  if (std::isfinite(total) && total <= kMaxInterruptions) return;
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "goodput: expected at most %.0g simulated interruptions in total, found %.3g (%.3g per run: "
                "a checkpoint segment of %.3g s completes with probability %.3g against a mean time between "
                "interruptions of %.3g s); a shorter step or checkpoint interval, or fewer runs, bring that down",
                kMaxInterruptions, total, per_run, seg_s, std::exp(log_q), m.lambda > 0 ? 1.0 / m.lambda : 0.0);
  throw UserError(buf);
}

}  // namespace

GoodputResult simulate_goodput(const GoodputRequest& req, const GoodputConfig& cfg) {
  validate(req);
  GoodputResult r;
  const Model m = make_model(req, cfg, cfg.checkpoint_interval_s);
  check_work(req, m);
  r.steps = m.steps;
  r.steps_per_checkpoint = m.k;
  r.ideal_days = static_cast<double>(m.steps) * req.step_time_s / kDay;
  r.days.resize(req.runs);
  RunTally sum;
  // Progress counts both passes (this one and the re-run at Daly's interval below) as one piece of work.
  const int64_t total_runs = 2 * req.runs;
  for (int64_t i = 0; i < req.runs; ++i) {
    if (req.progress && (i & 1023) == 0) req.progress(i, total_runs);
    Rng rng{run_seed(req.seed, i)};
    RunTally t = simulate_run(m, rng);
    r.days[i] = t.wall_s / kDay;
    sum.kept_save_s += t.kept_save_s;
    sum.lost_s += t.lost_s;
    sum.restart_s += t.restart_s;
    sum.detect_s += t.detect_s;
    sum.gpu += t.gpu;
    sum.link += t.link;
    sum.hang += t.hang;
    sum.save_fail += t.save_fail;
  }
  const double n = static_cast<double>(req.runs);
  std::sort(r.days.begin(), r.days.end());
  double total = 0;
  for (double d : r.days) total += d;
  r.mean_days = total / n;
  r.p10_days = percentile(r.days, 0.10);
  r.p50_days = percentile(r.days, 0.50);
  r.p90_days = percentile(r.days, 0.90);
  r.goodput_fraction = r.ideal_days / r.mean_days;
  if (req.deadline_days > 0) {
    auto it = std::upper_bound(r.days.begin(), r.days.end(), req.deadline_days);
    r.p_finish_by_deadline = static_cast<double>(it - r.days.begin()) / n;
  }
  r.breakdown.productive_days = r.ideal_days;
  r.breakdown.gc_days = static_cast<double>(m.steps) * (m.step_s - req.step_time_s) / kDay;
  r.breakdown.checkpoint_days = sum.kept_save_s / n / kDay;
  r.breakdown.lost_work_days = sum.lost_s / n / kDay;
  r.breakdown.restart_days = sum.restart_s / n / kDay;
  r.breakdown.hang_detect_days = sum.detect_s / n / kDay;
  r.gpu_failures = static_cast<double>(sum.gpu) / n;
  r.link_failures = static_cast<double>(sum.link) / n;
  r.hangs = static_cast<double>(sum.hang) / n;
  r.checkpoint_failures = static_cast<double>(sum.save_fail) / n;
  r.histogram = histogram(r.days, req.bins);

  // Young/Daly on the same rates; save failures count as interruptions too
  // (one per 1/p saves, i.e. per interval/p running seconds).
  r.save_cost_s = m.save_s;
  double lambda = m.lambda + (m.p_save_fail > 0 ? m.p_save_fail / cfg.checkpoint_interval_s : 0);
  r.system_mtbf_s = lambda > 0 ? 1.0 / lambda : std::numeric_limits<double>::infinity();
  // Daly's comparison re-runs the Monte Carlo; skipped (not printed) where that run alone would be too long.
  const bool daly_affordable =
      lambda > 0 && m.save_s > 0 &&
      expected_interruptions(req, make_model(req, cfg, daly_interval_s(m.save_s, 1.0 / lambda))) <= kMaxInterruptions;
  if (daly_affordable) {
    r.young_interval_s = young_interval_s(m.save_s, r.system_mtbf_s);
    r.daly_interval_s = daly_interval_s(m.save_s, r.system_mtbf_s);
    // Re-run the same draws at Daly's interval: the simulated effect of the choice.
    const Model md = make_model(req, cfg, r.daly_interval_s);
    double at_daly = 0;
    for (int64_t i = 0; i < req.runs; ++i) {
      if (req.progress && (i & 1023) == 0) req.progress(req.runs + i, total_runs);
      Rng rng{run_seed(req.seed, i)};
      at_daly += simulate_run(md, rng).wall_s;
    }
    r.mean_days_at_daly_interval = at_daly / n / kDay;
  }
  if (req.progress) req.progress(total_runs, total_runs);
  return r;
}

nlohmann::json goodput_result_json(const GoodputRequest& req, const GoodputResult& r) {
  nlohmann::json bins = nlohmann::json::array();
  for (const auto& b : r.histogram) bins.push_back({{"lo_days", b.lo_days}, {"hi_days", b.hi_days}, {"runs", b.runs}});
  nlohmann::json j = {
      {"request",
       {{"step_time_s", req.step_time_s},
        {"tokens_per_step", req.tokens_per_step},
        {"tokens", req.tokens},
        {"gpus", req.gpus},
        {"deadline_days", req.deadline_days},
        {"runs", req.runs},
        {"seed", req.seed}}},
      {"steps", r.steps},
      {"steps_per_checkpoint", r.steps_per_checkpoint},
      {"ideal_days", r.ideal_days},
      {"mean_days", r.mean_days},
      {"p10_days", r.p10_days},
      {"p50_days", r.p50_days},
      {"p90_days", r.p90_days},
      {"goodput_fraction", r.goodput_fraction},
      {"p_finish_by_deadline", req.deadline_days > 0 ? nlohmann::json(r.p_finish_by_deadline) : nlohmann::json()},
      {"breakdown_days",
       {{"productive", r.breakdown.productive_days},
        {"gc_stalls", r.breakdown.gc_days},
        {"checkpoint_saves", r.breakdown.checkpoint_days},
        {"lost_work", r.breakdown.lost_work_days},
        {"restarts", r.breakdown.restart_days},
        {"hang_detection", r.breakdown.hang_detect_days}}},
      {"interruptions_per_run",
       {{"gpu_failure", r.gpu_failures},
        {"link_failure", r.link_failures},
        {"hang", r.hangs},
        {"checkpoint_failure", r.checkpoint_failures}}},
      {"checkpoint_interval",
       {{"system_mtbf_s", r.system_mtbf_s},
        {"save_cost_s", r.save_cost_s},
        {"young_s", r.young_interval_s},
        {"daly_s", r.daly_interval_s},
        {"mean_days_at_daly", r.mean_days_at_daly_interval}}},
      {"histogram", bins},
  };
  return j;
}

std::string format_goodput(const GoodputRequest& req, const GoodputResult& r) {
  std::ostringstream o;
  char buf[256];
  auto line = [&](const char* label, const char* fmt, double v) {
    std::snprintf(buf, sizeof buf, "  %-34s ", label);
    o << buf;
    std::snprintf(buf, sizeof buf, fmt, v);
    o << buf << "\n";
  };
  std::snprintf(buf, sizeof buf, "goodput: %lld steps x %.3f s on %lld GPUs, %lld runs (seed %llu)\n",
                static_cast<long long>(r.steps), req.step_time_s, static_cast<long long>(req.gpus),
                static_cast<long long>(req.runs), static_cast<unsigned long long>(req.seed));
  o << buf;
  line("ideal (no interruptions, no GC)", "%.2f days", r.ideal_days);
  std::snprintf(buf, sizeof buf, "  %-34s %.2f / %.2f / %.2f days\n", "p10 / p50 / p90", r.p10_days,
                r.p50_days, r.p90_days);
  o << buf;
  line("mean", "%.2f days", r.mean_days);
  line("goodput fraction (ideal / mean)", "%.3f", r.goodput_fraction);
  if (req.deadline_days > 0) {
    char label[64];
    std::snprintf(label, sizeof label, "P(finish by %.1f days)", req.deadline_days);
    line(label, "%.3f", r.p_finish_by_deadline);
  }
  o << "where the time goes (mean per run):\n";
  line("productive steps", "%.2f days", r.breakdown.productive_days);
  line("GC stalls", "%.2f days", r.breakdown.gc_days);
  line("checkpoint saves", "%.3f days", r.breakdown.checkpoint_days);
  line("lost work (rolled back)", "%.2f days", r.breakdown.lost_work_days);
  line("restarts", "%.2f days", r.breakdown.restart_days);
  line("hang detection", "%.2f days", r.breakdown.hang_detect_days);
  o << "interruptions (mean per run):\n";
  line("GPU failures", "%.1f", r.gpu_failures);
  line("link failures", "%.1f", r.link_failures);
  line("hangs", "%.1f", r.hangs);
  line("checkpoint failures", "%.1f", r.checkpoint_failures);
  o << "checkpoint interval:\n";
  std::snprintf(buf, sizeof buf, "  configured every %lld steps; save stall %.2f s; system MTBF %.2f h\n",
                static_cast<long long>(r.steps_per_checkpoint), r.save_cost_s, r.system_mtbf_s / 3600.0);
  o << buf;
  if (r.daly_interval_s > 0) {
    std::snprintf(buf, sizeof buf, "  Young %.0f s, Daly %.0f s; mean at Daly's interval %.2f days\n",
                  r.young_interval_s, r.daly_interval_s, r.mean_days_at_daly_interval);
    o << buf;
  }
  o << "wall-clock days, " << req.runs << " runs:\n";
  int64_t most = 1;
  for (const auto& b : r.histogram) most = std::max(most, b.runs);
  for (const auto& b : r.histogram) {
    const int bar = static_cast<int>(std::lround(40.0 * static_cast<double>(b.runs) / static_cast<double>(most)));
    std::snprintf(buf, sizeof buf, "  %8.2f - %8.2f  %6lld  ", b.lo_days, b.hi_days, static_cast<long long>(b.runs));
    o << buf << std::string(bar, '#') << "\n";
  }
  return o.str();
}

}  // namespace rackstep::sim
