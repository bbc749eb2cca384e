// Scenarios and ranking of `rackstep size`.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "sim/base/check.h"
#include "sim/base/source_dir.h"
#include "sim/base/json_io.h"
#include "sim/scaling_law.h"
#include "sim/scenario.h"
#include "sim/size.h"

using namespace rackstep;
using nlohmann::json;

namespace {

json small_scenario() {
  return json::parse(R"({
    "name": "t",
    "cluster": {"file": "topologies/zoo/gb200-nvl72.json", "domains": 1},
    "start_date": "2026-07-15", "deadline": "2026-12-01", "bringup_days": 25,
    "token_budget": 1e12, "tokens_per_step": 4194304, "goodput_runs": 50,
    "goodput": {"hang": {"mean_steps_between": 0}},
    "candidates": [{"model": "models/zoo/marin-ladder-d768.json"},
                   {"model": "models/zoo/marin-ladder-d1024.json"}]
  })");
}

std::string error_of(const json& doc) {
  try {
    sim::parse_scenario(doc, std::string(rackstep::source_dir()) + "/sim/scenarios/t.json");
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("dates parse and count days", "[sim][size]") {
  CHECK(sim::parse_date("2026-12-01") - sim::parse_date("2026-07-15") == 139);
  CHECK(sim::parse_date("2026-02-30") == -1);
  CHECK(sim::parse_date("July 15") == -1);
  CHECK(sim::format_date(sim::parse_date("2026-07-15")) == "2026-07-15");
}

TEST_CASE("bad scenarios are one clear error", "[sim][size]") {
  CHECK(error_of(small_scenario()).empty());
  json j = small_scenario();
  j["deadline"] = "2026-07-01";
  CHECK_THAT(error_of(j), Catch::Contains("/deadline: expected a date after start_date (2026-07-15), found \"2026-07-01\""));
  j = small_scenario();
  j["cluster"]["healthy_gpus_per_domain"] = 0;
  CHECK_THAT(error_of(j), Catch::Contains("/cluster/healthy_gpus_per_domain: expected a number >= 1, found 0"));
  j = small_scenario();
  j["cluster"]["domains"] = 0;
  CHECK_THAT(error_of(j), Catch::Contains("/cluster/domains: expected a number >= 1, found 0"));
  j = small_scenario();
  j["candidates"][0]["model"] = "models/zoo/no-such-model.json";
  CHECK_THAT(error_of(j), Catch::Contains("/candidates/0/model: expected an existing model file"));
  j = small_scenario();
  j["bringup_days"] = 200;
  CHECK_THAT(error_of(j), Catch::Contains("/bringup_days: expected less than the days from start to deadline (139)"));
  j = small_scenario();
  j["candidates"] = json::array();
  CHECK_THAT(error_of(j), Catch::Contains("/candidates: expected at least one candidate"));
  j = small_scenario();
  j["candidates"][0] = {{"generate", {{"total_params", 10e9}, {"active_params", 20e9}}}};
  CHECK_THAT(error_of(j), Catch::Contains("/candidates/0/generate/active_params: expected at most total_params"));
  j = small_scenario();
  j["tokens_per_active_param"] = 20;
  CHECK_THAT(error_of(j), Catch::Contains("expected exactly one of token_budget, tokens_per_active_param, found both"));
}

TEST_CASE("a budget beyond unique data x epochs warns", "[sim][size]") {
  json j = small_scenario();
  j["unique_tokens"] = 2e11;
  j["max_epochs"] = 2;
  const auto s = sim::parse_scenario(j, std::string(rackstep::source_dir()) + "/sim/scenarios/t.json");
  REQUIRE(s.warnings.size() == 1);
  CHECK_THAT(s.warnings[0], Catch::Contains("exceeds unique data x epochs"));
}

TEST_CASE("the scaling law rewards compute and penalises overtraining", "[sim][size]") {
  sim::ScalingLaw law;
  // Same tokens per parameter: more compute, lower loss.
  CHECK(law.forecast(1e24, 60 * 10e9, 10e9) > law.forecast(1e25, 60 * 100e9, 100e9));
  // 10x overtraining halves the effective compute.
  CHECK(law.compute_efficiency(600 * 1e9, 1e9) == Approx(0.5));
  CHECK(law.compute_efficiency(60 * 1e9, 1e9) == Approx(1.0));
  // The May-recipe fit at the hero's compute without a penalty: 1.6 + 88.90 * 2.696e24^-0.0941.
  sim::ScalingLaw no_penalty;
  no_penalty.overtrain_10x_efficiency = 1.0;
  CHECK(no_penalty.forecast(2.696e24, 1, 1.0 / 60) == Approx(2.046).epsilon(0.001));
}

TEST_CASE("size ranks runnable candidates by the chosen utility", "[sim][size]") {
  const auto s = sim::parse_scenario(small_scenario(), std::string(rackstep::source_dir()) + "/sim/scenarios/t.json");
  const sim::SizeResult r = sim::size(s);
  REQUIRE(r.candidates.size() == 2);
  REQUIRE(r.ranking.size() == 2);
  for (const auto& c : r.candidates) {
    INFO(c.name << ": " << c.verdict);
    REQUIRE(c.runnable);
    CHECK(c.prediction.step_time_s > 0);
    CHECK(c.goodput.p50_days >= c.ideal_days);
    CHECK(c.forecast_loss > s.law.e);
  }
  // Lowest loss first when both finish in time; the bigger rung has more compute.
  const auto& first = r.candidates[r.ranking[0]];
  const auto& second = r.candidates[r.ranking[1]];
  CHECK(first.forecast_loss <= second.forecast_loss);
  CHECK_THAT(r.winner_reason, Catch::Contains(first.name + " wins"));

  sim::Scenario fastest = s;
  fastest.rank_by = sim::RankBy::kFastest;
  const sim::SizeResult f = sim::size(fastest);
  CHECK(f.candidates[f.ranking[0]].goodput.p50_days <= f.candidates[f.ranking[1]].goodput.p50_days);
  const json j = sim::size_result_json(r);
  CHECK(j["candidates"].size() == 2);
  CHECK(j["candidates"][0]["rank"] == 1);
}
