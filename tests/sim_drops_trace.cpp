// Routing traces: the binary format round trip and its validation, exact replay
// through sim::dispatch against hand-counted drops, and the trace-statistics fit
// recovering the popularity and affinity a synthetic router was built with.
#include <catch2/catch.hpp>

#include <cstring>
#include <fstream>
#include <random>
#include <string>

#include "sim/base/check.h"
#include "models/model.h"
#include "sim/base/source_dir.h"
#include "sim/calibration.h"
#include "sim/drops.h"
#include "sim/expert_load.h"
#include "sim/layout.h"
#include "sim/routing_fit.h"
#include "sim/routing_replay.h"
#include "sim/base/routing_trace.h"
#include "tests/temp_dir.h"

using namespace rackstep::sim;

namespace {

// n tokens of sequences of seq tokens; documents of doc_len tokens. Each token's
// top-k experts come from pick(token index, rng).
template <typename Pick>
RoutingTrace make_trace(int64_t E, int k, int64_t n, int64_t seq, int64_t doc_len, Pick pick) {
  RoutingTrace t;
  t.source = "test";
  t.n_experts = E;
  t.top_k = k;
  t.seq_len = seq;
  t.eval = true;
  t.layer_index = {1};
  t.experts.resize(1);
  t.scores.resize(1);
  std::mt19937_64 rng(7);
  for (int64_t i = 0; i < n; ++i) {
    t.tokens.push_back({0, static_cast<uint32_t>(i / seq), static_cast<uint32_t>(i % seq), static_cast<uint32_t>(i / doc_len)});
    const std::vector<int> ex = pick(i, rng);
    for (int j = 0; j < k; ++j) {
      t.experts[0].push_back(static_cast<uint16_t>(ex[j]));
      t.scores[0].push_back(1.0f / float(k));
    }
  }
  return t;
}

// Distinct experts: e0 and (e0 + 1..k-1) mod E.
std::vector<int> run_of(int e0, int k, int64_t E) {
  std::vector<int> v;
  for (int j = 0; j < k; ++j) v.push_back(static_cast<int>((e0 + j) % E));
  return v;
}

}  // namespace

TEST_CASE("a routing trace survives write and read; damage is named", "[drops][trace]") {
  TempDir dir("trace", "roundtrip");
  const RoutingTrace t = make_trace(8, 2, 300, 100, 70, [](int64_t i, std::mt19937_64&) { return run_of(int(i % 8), 2, 8); });
  const std::string f = dir.file("t.rsrt");
  write_routing_trace(f, t);
  const RoutingTrace r = read_routing_trace(f);
  CHECK(r.n_experts == 8);
  CHECK(r.top_k == 2);
  CHECK(r.seq_len == 100);
  CHECK(r.eval);
  CHECK(r.source == "test");
  CHECK(r.layer_index == t.layer_index);
  REQUIRE(r.token_count() == 300);
  CHECK(r.tokens[150].sequence == 1);
  CHECK(r.tokens[150].position == 50);
  CHECK(r.tokens[150].document == 2);
  CHECK(r.experts[0] == t.experts[0]);
  CHECK(r.scores[0] == t.scores[0]);

  // One flipped payload byte: the checksum says so.
  std::string bytes;
  {
    std::ifstream in(f, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  auto rewrite = [&](const std::string& b) {
    std::ofstream out(f, std::ios::binary | std::ios::trunc);
    out.write(b.data(), static_cast<std::streamsize>(b.size()));
  };
  std::string bad = bytes;
  bad[bad.size() - 3] ^= 0x40;
  rewrite(bad);
  CHECK_THROWS_WITH(read_routing_trace(f), Catch::Contains("checksum") && Catch::Contains(f));
  bad = bytes;
  bad.resize(bad.size() - 4);
  rewrite(bad);
  CHECK_THROWS_WITH(read_routing_trace(f), Catch::Contains("size"));
  bad = bytes;
  bad[0] = 'X';
  rewrite(bad);
  CHECK_THROWS_WITH(read_routing_trace(f), Catch::Contains("magic"));
}

TEST_CASE("replay counts exactly the drops the dispatch rules imply", "[drops][trace]") {
  // 4 experts top-1 on EP 4, ragged gate cf 1.0 over one chunk: each GPU takes at
  // most T assignments. Every token routes to expert 0, so GPU 0 receives 4T and
  // keeps T: 3/4 of the assignments are receiver drops, whatever the shuffle.
  const RoutingTrace hot = make_trace(4, 1, 4096, 64, 256, [](int64_t, std::mt19937_64&) { return std::vector<int>{0}; });
  DropScenario s;
  s.dispatch.n_experts = 4;
  s.dispatch.top_k = 1;
  s.dispatch.transport = Transport::ragged;
  s.dispatch.receiver_cf = 1.0;
  s.dispatch.ragged_chunks = 1;
  s.ep = 4;
  s.tokens_per_gpu = 256;
  s.context = 64;
  const ReplayResult r = replay_drops(hot, s, {.shuffles = 2, .seed = 1});
  CHECK(r.steps == 4);
  CHECK(r.estimate.mean.receiver == Approx(0.75));
  CHECK(r.estimate.mean.sender == 0);

  // Round-robin routing fills every expert equally: nothing drops.
  const RoutingTrace even = make_trace(4, 1, 4096, 64, 256, [](int64_t i, std::mt19937_64&) { return std::vector<int>{int(i % 4)}; });
  CHECK(replay_drops(even, s, {}).estimate.mean.total() == 0);

  // Too small a trace for one step is a user error naming the need.
  s.tokens_per_gpu = 4096;
  CHECK_THROWS_WITH(replay_drops(even, s, {}), Catch::Contains("needs 16384"));
}

TEST_CASE("the fit recovers popularity and document affinity from a trace", "[drops][trace]") {
  // Documents of 512 tokens; each document prefers one expert (half its tokens
  // pick it first), the rest uniform. Expert 0 is twice as popular overall.
  const int64_t E = 8, n = 1 << 16;
  std::vector<int> doc_expert(n / 512 + 1);
  std::mt19937_64 prng(3);
  for (auto& d : doc_expert) d = static_cast<int>(prng() % E);
  auto pick = [&](int64_t i, std::mt19937_64& rng) {
    std::uniform_real_distribution<double> u(0, 1);
    int e0;
    if (u(rng) < 1.0 / 9.0) e0 = 0;  // the popular expert
    else if (u(rng) < 0.5) e0 = doc_expert[i / 512];
    else e0 = static_cast<int>(rng() % E);
    return run_of(e0, 2, E);
  };
  const RoutingTrace t = make_trace(E, 2, n, 256, 512, pick);
  const TraceFit f = fit_routing({t}, {});
  REQUIRE(f.layers.size() == 1);
  const LayerFit& l = f.layers[0];
  CHECK(f.documents > 100);
  CHECK(f.doc_lengths.mean_tokens == Approx(512).epsilon(0.05));
  // Expert 0 is first pick with probability 2/9 and second (after 7) with 1/9:
  // a share of 1/6 of the assignments against 1/8 uniform; expert 3 has 1/9.
  CHECK(l.model.popularity[0] == Approx(1.0 / 6.0).epsilon(0.06));
  CHECK(l.model.popularity[3] == Approx(1.0 / 9.0).epsilon(0.08));
  CHECK_FALSE(l.model.balance_each_step);
  // Affinity: positive, and fitted as whole-document coherence (no fading inside 512 tokens).
  CHECK(l.affinity > 0);
  CHECK(l.model.concentration > 0);
  // The fitted model, without per-step balancing, puts receiver drops on the
  // ragged transport; the per-step balanced model would leave them near zero.
  DropScenario s;
  s.dispatch.n_experts = E;
  s.dispatch.top_k = 2;
  s.dispatch.transport = Transport::ragged;
  s.dispatch.receiver_cf = 1.1;
  s.ep = 4;
  s.tokens_per_gpu = 512;
  s.context = 256;
  RoutingGenerator gen(l.model, s.routing_shape());
  const DropEstimate fitted = estimate_drops_mc(s, gen, {.samples = 8});
  const ReplayResult truth = replay_drops(t, s, {.shuffles = 2});
  CHECK(fitted.mean.receiver > 0);
  CHECK(truth.estimate.mean.receiver > 0);
  CHECK(fitted.mean.receiver == Approx(truth.estimate.mean.receiver).epsilon(0.5));
}

TEST_CASE("the expert load per EP rank averages to one and grows with context", "[drops][load]") {
  DropScenario s;
  s.dispatch.n_experts = 64;
  s.dispatch.top_k = 4;
  s.ep = 8;
  s.tokens_per_gpu = 4096;
  RoutingModel m;
  m.concentration = 0.5;
  m.balance_each_step = false;
  auto load_at = [&](int64_t context) {
    s.context = context;
    RoutingGenerator gen(m, s.routing_shape());
    return expert_load(s, gen, {.samples = 8});
  };
  const ExpertLoad short_ctx = load_at(256), long_ctx = load_at(4096);
  double sum = 0;
  for (size_t r = 0; r < short_ctx.rank_sorted.size(); ++r) {
    sum += short_ctx.rank_sorted[r];
    if (r > 0) CHECK(short_ctx.rank_sorted[r] <= short_ctx.rank_sorted[r - 1]);
  }
  CHECK(sum == Approx(8.0).epsilon(1e-9));
  CHECK(short_ctx.max_over_mean > 1.0);
  CHECK(short_ctx.max_over_mean == Approx(short_ctx.rank_sorted[0]));
  // Fewer documents per GPU at a longer context: the busiest rank is busier.
  CHECK(long_ctx.max_over_mean > short_ctx.max_over_mean);
}

TEST_CASE("a layout's expert load comes from the drop model's routing; dense or ep 1 is balanced", "[drops][load]") {
  const auto model = rackstep::models::load_model(std::string(rackstep::source_dir()) + "/models/zoo/marin-535b-a23b.json");
  Layout l = load_layout(std::string(rackstep::source_dir()) + "/sim/layouts/hero-pooled.json");
  const ExpertLoad hero = expert_load_for_layout(model, l, {.samples = 4});
  REQUIRE(static_cast<int64_t>(hero.rank_sorted.size()) == l.ep);
  CHECK(hero.rank_sorted.front() > 1.0);   // the busiest EP rank does more than the mean
  CHECK(hero.rank_sorted.back() < 1.0);
  l.ep = 1;
  CHECK(expert_load_for_layout(model, l, {.samples = 4}).rank_sorted == std::vector<double>{1.0});
}

TEST_CASE("the predictor's fallback drop is the default drop calibration's fit target", "[drops][calibration]") {
  // One home for the hero's 2.67%: sim/drop_calibration.json /fit/target_drop.
  CHECK(default_drop_target() == load_drop_calibration().target_drop);
  CHECK(default_drop_target() == Approx(0.0267));
  CHECK(load_calibration().fallback_drop_fraction == 0);  // no second copy in sim/calibration.json
}
