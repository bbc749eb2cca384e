// Exact EP dispatch on hand-made assignments: every branch of the pooled-wave,
// ragged and per-expert-capacity transports, with the counts derived by hand in
// the comments.
#include <catch2/catch.hpp>

#include <algorithm>
#include <random>

#include "sim/base/check.h"
#include "sim/base/dispatch.h"

using namespace rackstep::sim;

namespace {

GpuAssignments gpu(std::vector<int32_t> experts) {
  GpuAssignments a;
  a.experts = std::move(experts);
  return a;
}

int64_t kept_in_mask(const DispatchResult& r) {
  int64_t n = 0;
  for (const auto& m : r.keep) n += std::count(m.begin(), m.end(), 1);
  return n;
}

}  // namespace

TEST_CASE("hero pooled-wave buffer sizes match the spec", "[dispatch]") {
  // spec/marin-architecture.md: 65,536 tokens/GPU, k 8 -> A = 524,288; sender pool
  // 3,004 rows, receiver buffer 33,497 rows per expert per wave (6 local experts, W 3).
  DispatchConfig cfg{.n_experts = 384, .top_k = 8, .transport = Transport::pooled,
                     .sender_cf = 1.10, .receiver_cf = 1.15, .waves = 3};
  const CapacityRows rows = physical_capacity(cfg, 64, 65536);
  CHECK(65536 * cfg.top_k == 524288);
  CHECK(rows.sender_pool == 3004);
  CHECK(rows.receiver_buffer == 33497);
}

TEST_CASE("pooled waves: pool overflow, wave/slot placement and round-robin receivers", "[dispatch]") {
  // S 2, 4 experts (2 local), k 1, W 2, cf 1: pool ceil(8/4) = 2 slots per destination
  // per wave (rank limit 4); receiver ceil(8/4) = 2 rows per local expert per wave.
  DispatchConfig cfg{.n_experts = 4, .top_k = 1, .transport = Transport::pooled,
                     .sender_cf = 1.0, .receiver_cf = 1.0, .waves = 2};
  std::vector<GpuAssignments> g = {gpu({0, 0, 0, 0, 0, 0, 0, 0}), gpu({0, 0, 1, 1, 2, 2, 3, 3})};
  const auto r = dispatch(cfg, g);
  // GPU 0 ranks 4..7 to destination 0 find no slot: 4 sender drops.
  CHECK(r.per_gpu[0].sender == 4);
  CHECK(r.keep[0] == std::vector<uint8_t>({1, 1, 0, 0, 0, 0, 0, 0}));
  // Destination 0, wave 0 (ranks 0, 2): slot 0 = GPU0 t0 (e0), GPU1 t0 (e0) fill expert
  // 0's two rows; slot 1 = GPU0 t2 (e0) is a receiver drop, GPU1 t2 (e1) is kept.
  // Wave 1 likewise drops GPU0 t3. Source-major order would have dropped GPU1 t0/t1.
  CHECK(r.per_gpu[0].receiver == 2);
  CHECK(r.per_gpu[1].receiver == 0);
  CHECK(r.per_gpu[1].sender == 0);
  CHECK(r.keep[1] == std::vector<uint8_t>(8, 1));
  CHECK(r.counts.assignments == 16);
  CHECK(r.counts.dropped() == 6);
  CHECK(kept_in_mask(r) == r.counts.kept());
  CHECK(r.counts.fraction() == Approx(6.0 / 16.0));
}

TEST_CASE("pooled waves: padding tokens are padding drops and shrink the logical limits", "[dispatch]") {
  DispatchConfig cfg{.n_experts = 2, .top_k = 1, .transport = Transport::pooled,
                     .sender_cf = 1.0, .receiver_cf = 4.0, .waves = 1};
  // S 1: pool physical ceil(8/1) = 8, but with 4 valid tokens the logical pool is 4.
  GpuAssignments a = gpu({0, 0, 0, 0, 1, 1, 1, 1});
  a.token_valid = {1, 1, 1, 1, 0, 0, 0, 0};
  auto r = dispatch(cfg, {a});
  CHECK(r.counts.padding == 4);
  CHECK(r.counts.sender == 0);
  CHECK(r.keep[0] == std::vector<uint8_t>({1, 1, 1, 1, 0, 0, 0, 0}));
  a.token_valid = {1, 1, 1, 1, 1, 0, 0, 0};  // 5 valid: logical pool 5, all fit
  r = dispatch(cfg, {a});
  CHECK(r.counts.padding == 3);
  CHECK(r.counts.sender == 0);
  cfg.sender_cf = 0.5;  // 5 valid * 0.5 -> pool 3: ranks 3, 4 (tokens 3, 4) dropped
  r = dispatch(cfg, {a});
  CHECK(r.counts.sender == 2);
  CHECK(r.keep[0] == std::vector<uint8_t>({1, 1, 1, 0, 0, 0, 0, 0}));
}

TEST_CASE("ragged: one receiver gate split across expert chunks", "[dispatch]") {
  // S 2, 4 experts, k 1, cf 1: 8 valid -> gate ceil(8/2) = 4 rows per GPU.
  DispatchConfig cfg{.n_experts = 4, .top_k = 1, .transport = Transport::ragged, .receiver_cf = 1.0};
  std::vector<GpuAssignments> g = {gpu({0, 0, 0, 1}), gpu({0, 0, 2, 3})};
  cfg.ragged_chunks = 2;  // chunk = one expert, 2 rows each
  auto r = dispatch(cfg, g);
  // Expert 0 gets GPU0 t0,t1,t2 then GPU1 t0,t1: the first 2 kept, 3 receiver drops.
  CHECK(r.counts.receiver == 3);
  CHECK(r.counts.sender == 0);
  CHECK(r.keep[0] == std::vector<uint8_t>({1, 1, 0, 1}));
  CHECK(r.keep[1] == std::vector<uint8_t>({0, 0, 1, 1}));
  cfg.ragged_chunks = 1;  // one 4-row gate for experts 0 and 1: e0 takes all 4, e1 loses 1
  r = dispatch(cfg, g);
  CHECK(r.counts.receiver == 2);
  CHECK(r.keep[0] == std::vector<uint8_t>({1, 1, 1, 0}));
  CHECK(r.keep[1] == std::vector<uint8_t>({1, 0, 1, 1}));
}

TEST_CASE("capacity: per-expert capacity by position or by router probability", "[dispatch]") {
  // 2 experts, k 1, 4 tokens, cf 1: ceil(4/2) = 2 rows per expert.
  DispatchConfig cfg{.n_experts = 2, .top_k = 1, .transport = Transport::capacity, .receiver_cf = 1.0};
  GpuAssignments a = gpu({0, 0, 0, 1});
  a.probs = {0.1f, 0.9f, 0.8f, 0.5f};
  auto r = dispatch(cfg, {a});
  CHECK(r.counts.receiver == 1);
  CHECK(r.keep[0] == std::vector<uint8_t>({1, 1, 0, 1}));
  cfg.priority = CapacityPriority::router_prob;
  r = dispatch(cfg, {a});
  CHECK(r.counts.receiver == 1);
  CHECK(r.keep[0] == std::vector<uint8_t>({0, 1, 1, 1}));
  a.probs.clear();
  CHECK_THROWS_AS(dispatch(cfg, {a}), rackstep::UserError);
}

TEST_CASE("drop counts are functions of per-destination and per-expert counts", "[dispatch]") {
  // The Monte Carlo in sim/drops.cpp works on counts, not tokens. It relies on:
  // pooled sender drops = sum over (s,d) of max(0, n_sd - W*pool); ragged drops =
  // sum over chunks of max(0, rows - cap); capacity drops = sum of max(0, c_se - cap).
  std::mt19937_64 rng(7);
  const int S = 4, E = 16, k = 2, T = 40;
  std::vector<GpuAssignments> g(S);
  std::vector<std::vector<int64_t>> c(S, std::vector<int64_t>(E, 0));
  for (int s = 0; s < S; ++s) {
    std::discrete_distribution<int> pick({8, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 4});
    for (int t = 0; t < T; ++t) {
      int e0 = pick(rng), e1 = pick(rng);
      while (e1 == e0) e1 = pick(rng);
      g[s].experts.push_back(e0);
      g[s].experts.push_back(e1);
      c[s][e0]++;
      c[s][e1]++;
    }
  }
  DispatchConfig cfg{.n_experts = E, .top_k = k, .sender_cf = 1.0, .receiver_cf = 1.0, .waves = 2};
  cfg.transport = Transport::pooled;
  auto r = dispatch(cfg, g);
  const int64_t pool = physical_capacity(cfg, S, T).sender_pool;
  int64_t sender = 0;
  for (int s = 0; s < S; ++s)
    for (int d = 0; d < S; ++d) {
      int64_t n = 0;
      for (int e = d * 4; e < d * 4 + 4; ++e) n += c[s][e];
      sender += std::max<int64_t>(0, n - 2 * pool);
    }
  CHECK(r.counts.sender == sender);
  CHECK(r.counts.sender > 0);
  CHECK(r.counts.receiver > 0);
  CHECK(kept_in_mask(r) == r.counts.kept());

  cfg.transport = Transport::capacity;
  r = dispatch(cfg, g);
  const int64_t cap = physical_capacity(cfg, S, T).receiver_buffer;
  int64_t over = 0;
  for (int s = 0; s < S; ++s)
    for (int e = 0; e < E; ++e) over += std::max<int64_t>(0, c[s][e] - cap);
  CHECK(r.counts.receiver == over);

  cfg.transport = Transport::ragged;
  cfg.ragged_chunks = 2;
  r = dispatch(cfg, g);
  const int64_t gate = physical_capacity(cfg, S, T).receiver_buffer;  // all valid: logical = physical
  int64_t ragged = 0;
  for (int d = 0; d < S; ++d)
    for (int ch = 0; ch < 2; ++ch) {
      int64_t rows = 0;
      for (int e = d * 4 + ch * 2; e < d * 4 + ch * 2 + 2; ++e)
        for (int s = 0; s < S; ++s) rows += c[s][e];
      ragged += std::max<int64_t>(0, rows - (gate * 2 + 3) / 4);
    }
  CHECK(r.counts.receiver == ragged);
}

TEST_CASE("dispatch rejects impossible configurations and malformed assignments", "[dispatch]") {
  DispatchConfig cfg{.n_experts = 4, .top_k = 1};
  std::vector<GpuAssignments> g = {gpu({0, 1}), gpu({2, 3})};
  cfg.receiver_cf = 0;
  CHECK_THROWS_AS(dispatch(cfg, g), rackstep::UserError);
  cfg.receiver_cf = 1.15;
  cfg.sender_cf = -1;
  CHECK_THROWS_AS(dispatch(cfg, g), rackstep::UserError);
  cfg.sender_cf = 1.1;
  cfg.top_k = 5;
  CHECK_THROWS_AS(validate(cfg, 2), rackstep::UserError);
  cfg.top_k = 1;
  CHECK_THROWS_AS(dispatch(cfg, {gpu({0}), gpu({1}), gpu({2})}), rackstep::UserError);  // 3 does not divide 4
  CHECK_THROWS_AS(dispatch(cfg, {gpu({0, 9}), gpu({1, 2})}), rackstep::UserError);     // bad id
  CHECK_THROWS_AS(dispatch(cfg, {gpu({0, 1}), gpu({1})}), rackstep::UserError);        // ragged shapes
  CHECK_NOTHROW(dispatch(cfg, g));
}
