// Goodput Monte Carlo against closed forms (renewal equations), the defaults
// file, determinism, deadlines, Young/Daly, and bad input.
#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <numeric>
#include <utility>
#include <vector>

#include "sim/base/check.h"
#include "scripts/cli/progress.h"
#include "sim/base/value_error.h"
#include "sim/goodput.h"

using namespace rackstep::sim;
using Catch::Matchers::Contains;

namespace {

// No interruptions, no stalls, free saves.
GoodputConfig quiet() {
  GoodputConfig c;
  c.checkpoint_interval_s = 100;
  c.checkpoint_bytes_per_param = 0;
  c.checkpoint_write_bytes_per_s = 1;
  return c;
}

// 10,000 one-second steps: 100 segments of 100 steps with a 100 s interval.
GoodputRequest small_run(int64_t runs = 2000) {
  GoodputRequest r;
  r.step_time_s = 1.0;
  r.total_params = 1;  // so checkpoint_bytes_per_param is the bytes per save
  r.tokens_per_step = 1000;
  r.tokens = 1e7;
  r.gpus = 1;
  r.runs = runs;
  return r;
}

constexpr double kDay = 86400.0;

}  // namespace

TEST_CASE("without interruptions every run takes the ideal time", "[goodput]") {
  GoodputResult r = simulate_goodput(small_run(50), quiet());
  CHECK(r.steps == 10000);
  CHECK(r.steps_per_checkpoint == 100);
  CHECK(r.ideal_days == Approx(10000.0 / kDay));
  CHECK(r.days.front() == Approx(r.ideal_days));
  CHECK(r.days.back() == Approx(r.ideal_days));
  CHECK(r.goodput_fraction == Approx(1.0));
}

TEST_CASE("GC stalls stretch the run by 1 / (1 - share)", "[goodput]") {
  GoodputConfig c = quiet();
  c.gc_stall_fraction = 0.0383;
  GoodputResult r = simulate_goodput(small_run(10), c);
  CHECK(r.mean_days == Approx(r.ideal_days / (1 - 0.0383)));
  CHECK(r.breakdown.gc_days == Approx(r.mean_days - r.ideal_days));
}

TEST_CASE("failures match the renewal equation for checkpointed segments", "[goodput]") {
  // Poisson failures at rate L, segments of T running seconds, restart R:
  // E[time per segment] = (exp(L T) - 1)(1/L + R).
  GoodputConfig c = quiet();
  const double lambda = 0.005;                     // per second: L T = 0.5
  c.gpu_failure_mtbf_gpu_days = 1.0 / (lambda * kDay);
  c.restart_median_s = 50;
  c.restart_log_sigma = 0;
  GoodputResult r = simulate_goodput(small_run(4000), c);
  const double per_segment = (std::exp(lambda * 100) - 1) * (1 / lambda + 50);
  CHECK(r.mean_days * kDay == Approx(100 * per_segment).epsilon(0.01));
  CHECK(r.gpu_failures == Approx(100 * (std::exp(0.5) - 1)).epsilon(0.02));
  CHECK(r.link_failures == 0);
  // The breakdown adds up to the mean.
  const auto& b = r.breakdown;
  CHECK(b.productive_days + b.gc_days + b.checkpoint_days + b.lost_work_days + b.restart_days +
            b.hang_detect_days ==
        Approx(r.mean_days));
}

TEST_CASE("checkpoint failures redo their segment", "[goodput]") {
  // 99 saves of 5 s each fail with p = 0.1 and cost a restart of 30 s:
  // E[segment with save] = (T + s) / (1 - p) + R p / (1 - p); the last segment has no save.
  GoodputConfig c = quiet();
  c.checkpoint_bytes_per_param = 5;
  c.checkpoint_failure_probability = 0.1;
  c.restart_median_s = 30;
  GoodputResult r = simulate_goodput(small_run(4000), c);
  const double p = 0.1;
  const double expected = 99 * ((100 + 5) / (1 - p) + 30 * p / (1 - p)) + 100;
  CHECK(r.mean_days * kDay == Approx(expected).epsilon(0.01));
  CHECK(r.checkpoint_failures == Approx(99 * p / (1 - p)).epsilon(0.03));
  CHECK(r.save_cost_s == Approx(5.0));
}

TEST_CASE("hangs add their detection time to each interruption", "[goodput]") {
  GoodputConfig c = quiet();
  c.hang_mean_steps_between = 500;
  c.hang_detect_s = 600;
  c.restart_median_s = 60;
  GoodputResult r = simulate_goodput(small_run(500), c);
  CHECK(r.hangs > 15);  // ~20 per 10,000 steps, a little more for redone work
  CHECK(r.hangs < 30);
  CHECK(r.breakdown.hang_detect_days == Approx(r.hangs * 600 / kDay));
  CHECK(r.breakdown.restart_days == Approx(r.hangs * 60 / kDay));
}

TEST_CASE("results are deterministic for a seed", "[goodput]") {
  GoodputConfig c = quiet();
  c.gpu_failure_mtbf_gpu_days = 0.01;
  c.restart_median_s = 60;
  c.restart_log_sigma = 0.5;
  GoodputRequest req = small_run(200);
  GoodputResult a = simulate_goodput(req, c);
  GoodputResult b = simulate_goodput(req, c);
  req.seed = 1;
  GoodputResult d = simulate_goodput(req, c);
  CHECK(a.days == b.days);
  CHECK(a.days != d.days);
}

TEST_CASE("deadline probability, percentiles and histogram are consistent", "[goodput]") {
  GoodputConfig c = quiet();
  c.gpu_failure_mtbf_gpu_days = 0.01;
  c.restart_median_s = 60;
  GoodputRequest req = small_run(1000);
  req.bins = 10;
  GoodputResult base = simulate_goodput(req, c);
  CHECK(base.p_finish_by_deadline == -1);
  CHECK(base.p10_days <= base.p50_days);
  CHECK(base.p50_days <= base.p90_days);
  int64_t total = 0;
  for (const auto& b : base.histogram) total += b.runs;
  CHECK(total == 1000);
  CHECK(base.histogram.size() == 10);
  req.deadline_days = base.p50_days;
  CHECK(simulate_goodput(req, c).p_finish_by_deadline == Approx(0.5).margin(0.01));
  req.deadline_days = base.days.back();
  CHECK(simulate_goodput(req, c).p_finish_by_deadline == 1.0);
  req.deadline_days = base.days.front() * 0.999;
  CHECK(simulate_goodput(req, c).p_finish_by_deadline == 0.0);
}

TEST_CASE("Young/Daly intervals sit at the simulated optimum", "[goodput][young]") {
  CHECK(young_interval_s(10, 5000) == Approx(std::sqrt(2.0 * 10 * 5000)));
  CHECK(daly_interval_s(10, 5000) < young_interval_s(10, 5000));
  CHECK(daly_interval_s(30000, 10000) == 10000);  // save cost >= 2 MTBF: checkpoint every MTBF
  GoodputConfig c = quiet();
  c.gpu_failure_mtbf_gpu_days = 2000.0 / kDay;  // MTBF 2,000 s
  c.checkpoint_bytes_per_param = 20;            // 20 s per save
  c.restart_median_s = 30;
  GoodputRequest req = small_run(1000);
  req.tokens = 1e8;  // 100,000 steps
  GoodputResult r = simulate_goodput(req, c);
  CHECK(r.system_mtbf_s == Approx(2000));
  const double best = r.daly_interval_s;
  REQUIRE(best > 200);
  REQUIRE(best < 400);
  auto mean_at = [&](double interval) {
    GoodputConfig ci = c;
    ci.checkpoint_interval_s = interval;
    return simulate_goodput(req, ci).mean_days;
  };
  CHECK(r.mean_days_at_daly_interval == Approx(mean_at(best)));
  CHECK(mean_at(best) < mean_at(best / 5));
  CHECK(mean_at(best) < mean_at(best * 5));
}

TEST_CASE("the defaults file carries the spec's rates", "[goodput][config]") {
  GoodputConfig c = default_goodput_config();
  CHECK(c.gpu_failure_mtbf_gpu_days == 2770);
  CHECK(c.restart_median_s == 660);
  CHECK(c.checkpoint_interval_s == 3600);
  CHECK(c.checkpoint_bytes_per_param * 535.48e9 == Approx(4.29e12).epsilon(1e-4));
  CHECK(c.gc_stall_fraction == 0.0383);
  CHECK(c.hang_mean_steps_between == 1500);
}

TEST_CASE("hero run: 390k steps, hourly checkpoints every ~200 steps", "[goodput][hero]") {
  GoodputRequest req;
  req.step_time_s = 17.15;
  req.tokens_per_step = 46137344;
  req.tokens = 18e12;
  req.gpus = 704;
  req.total_params = 535.48e9;
  req.runs = 200;
  GoodputResult r = simulate_goodput(req, default_goodput_config());
  CHECK(r.steps == 390140);
  // calibration.md: a failed save rolled back 206 steps of an hourly interval.
  CHECK(r.steps_per_checkpoint > 195);
  CHECK(r.steps_per_checkpoint < 215);
  CHECK(r.ideal_days == Approx(390140 * 17.15 / kDay));
  CHECK(r.goodput_fraction < 1.0);
  CHECK(r.goodput_fraction > 0.7);
  // calibration.md: 4.29 TB at 2 TB/s.
  CHECK(r.save_cost_s == Approx(4.29e12 / 2e12).epsilon(1e-3));
  // A model half the size saves in half the time.
  req.total_params /= 2;
  CHECK(simulate_goodput(req, default_goodput_config()).save_cost_s == Approx(r.save_cost_s / 2));
}

TEST_CASE("bad requests and configs are user errors", "[goodput][errors]") {
  // The library names the request's fields, never a flag (`rackstep size` fills
  // the request itself); ValueError::quantity() lets a command name its flag.
  auto quantity_of = [](const GoodputRequest& r) {
    try {
      simulate_goodput(r, quiet());
    } catch (const rackstep::ValueError& e) {
      CHECK_THAT(e.what(), !Contains("--"));
      return e.quantity();
    }
    return std::string("no error");
  };
  GoodputRequest req = small_run(10);
  req.step_time_s = 0;
  CHECK(quantity_of(req) == "step_time_s");
  CHECK_THROWS_WITH(simulate_goodput(req, quiet()), Contains("step_time_s: expected a time > 0"));
  CHECK(quantity_of(small_run(0)) == "runs");
  req = small_run(10);
  req.total_params = 0;
  CHECK(quantity_of(req) == "total_params");
  req = small_run(10);
  req.gpus = 0;
  CHECK(quantity_of(req) == "gpus");

  GoodputConfig c;
  nlohmann::json unknown = {{"hang", {{"mean_steps", 10}}}};
  CHECK_THROWS_WITH(apply_goodput_json(c, unknown, "over.json", false),
                    Contains("over.json") && Contains("/hang"));
  nlohmann::json range = {{"checkpoint", {{"failure_probability", 1.5}}}};
  CHECK_THROWS_WITH(apply_goodput_json(c, range, "over.json", false), Contains("failure_probability"));
  // An override keeps everything it does not mention.
  GoodputConfig d = default_goodput_config();
  apply_goodput_json(d, {{"hang", {{"mean_steps_between", 0}}}}, "over.json", false);
  CHECK(d.hang_mean_steps_between == 0);
  CHECK(d.gpu_failure_mtbf_gpu_days == 2770);
}

TEST_CASE("goodput reports progress as runs complete, ending at the total", "[goodput][progress]") {
  GoodputRequest req = small_run(3000);
  std::vector<std::pair<int64_t, int64_t>> calls;
  req.progress = [&](int64_t done, int64_t total) { calls.emplace_back(done, total); };
  simulate_goodput(req, default_goodput_config());
  REQUIRE(calls.size() >= 2);  // 3000 runs: progress at 0, 1024, 2048, ... and the end
  for (size_t i = 1; i < calls.size(); ++i) CHECK(calls[i].first >= calls[i - 1].first);
  CHECK(calls.back().first == calls.back().second);
}

TEST_CASE("the progress line stays quiet for short work, then says the share done and the time left",
          "[progress]") {
  using Clock = rackstep::cli::Progress::Clock;
  rackstep::cli::Progress p("goodput", "runs", /*quiet_s=*/2.0);
  const Clock::time_point t0 = Clock::now();
  CHECK(p.update(10, 100, t0 + std::chrono::milliseconds(500)).empty());  // still quiet
  CHECK(p.update(25, 100, t0 + std::chrono::seconds(3)) == "goodput: 25% (25 of 100 runs), about 9 s left");
  CHECK(p.update(26, 100, t0 + std::chrono::milliseconds(3200)).empty());  // at most one line a second
  CHECK_FALSE(p.update(100, 100, t0 + std::chrono::milliseconds(3300)).empty());  // the end is always said
}
