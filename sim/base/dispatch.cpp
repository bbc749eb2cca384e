#include "sim/base/dispatch.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "sim/base/check.h"

namespace rackstep::sim {

Transport parse_transport(const std::string& name) {
  if (name == "pooled") return Transport::pooled;
  if (name == "ragged") return Transport::ragged;
  if (name == "capacity") return Transport::capacity;
  throw UserError("transport: expected pooled, ragged or capacity, found \"" + name + "\"");
}

std::string transport_name(Transport t) {
  switch (t) {
    case Transport::pooled: return "pooled";
    case Transport::ragged: return "ragged";
    case Transport::capacity: return "capacity";
  }
  return "?";
}

DropCounts& DropCounts::operator+=(const DropCounts& o) {
  assignments += o.assignments;
  sender += o.sender;
  receiver += o.receiver;
  padding += o.padding;
  return *this;
}

void validate(const DispatchConfig& cfg, int64_t ep) {
  auto num = [](double x) { return std::to_string(x); };
  if (!(cfg.receiver_cf > 0)) throw UserError("receiver capacity factor: expected > 0, found " + num(cfg.receiver_cf));
  if (cfg.transport == Transport::pooled && !(cfg.sender_cf > 0))
    throw UserError("sender capacity factor: expected > 0, found " + num(cfg.sender_cf));
  if (cfg.n_experts < 1) throw UserError("experts: expected >= 1, found " + std::to_string(cfg.n_experts));
  if (cfg.top_k < 1 || cfg.top_k > cfg.n_experts)
    throw UserError("top-k: expected 1.." + std::to_string(cfg.n_experts) + " (the expert count), found " +
                    std::to_string(cfg.top_k));
  if (ep < 1 || cfg.n_experts % ep != 0)
    throw UserError("EP size: expected a divisor of the " + std::to_string(cfg.n_experts) + " experts, found " +
                    std::to_string(ep));
  if (cfg.waves < 1) throw UserError("waves: expected >= 1, found " + std::to_string(cfg.waves));
  if (cfg.ragged_chunks < 1 || cfg.ragged_chunks > cfg.n_experts / ep)
    throw UserError("ragged chunks: expected 1..local experts (" + std::to_string(cfg.n_experts / ep) +
                    "), found " + std::to_string(cfg.ragged_chunks));
}

int64_t scaled_capacity(int64_t value, double cf, int64_t divisor, int64_t maximum) {
  auto c = static_cast<int64_t>(std::ceil(static_cast<double>(value) * cf / static_cast<double>(divisor)));
  return std::clamp<int64_t>(c, 1, std::max<int64_t>(maximum, 1));
}

CapacityRows physical_capacity(const DispatchConfig& cfg, int64_t ep, int64_t tokens_per_gpu) {
  const int64_t a = tokens_per_gpu * cfg.top_k;
  const int64_t local = cfg.n_experts / ep;
  auto rows = [](double x) { return std::max<int64_t>(static_cast<int64_t>(std::ceil(x)), 1); };
  CapacityRows c;
  switch (cfg.transport) {
    case Transport::pooled:
      c.sender_pool = rows(cfg.sender_cf * double(a) / double(ep * cfg.waves));
      c.receiver_buffer = rows(cfg.receiver_cf * double(a) / double(local * cfg.waves));
      break;
    case Transport::ragged:
      c.receiver_buffer = rows(cfg.receiver_cf * double(a));
      break;
    case Transport::capacity:
      c.receiver_buffer = rows(cfg.receiver_cf * double(a) / double(cfg.n_experts));
      break;
  }
  return c;
}

namespace {

struct Group {
  int64_t ep = 0, local = 0, tokens = 0, k = 0;
  std::vector<int64_t> valid;  // (S) valid assignments per GPU
  int64_t total_valid = 0;
};

Group check_group(const DispatchConfig& cfg, const std::vector<GpuAssignments>& gpus) {
  Group g;
  g.ep = static_cast<int64_t>(gpus.size());
  validate(cfg, g.ep);
  g.local = cfg.n_experts / g.ep;
  g.k = cfg.top_k;
  g.tokens = gpus.empty() ? 0 : gpus[0].tokens(cfg.top_k);
  for (size_t s = 0; s < gpus.size(); ++s) {
    const auto& a = gpus[s];
    const std::string where = "GPU " + std::to_string(s) + ": ";
    if (a.experts.size() % cfg.top_k != 0 || a.tokens(cfg.top_k) != g.tokens)
      throw UserError(where + "expected " + std::to_string(g.tokens) + " tokens x k=" + std::to_string(cfg.top_k) +
                      " expert ids, found " + std::to_string(a.experts.size()));
    if (!a.probs.empty() && a.probs.size() != a.experts.size())
      throw UserError(where + "router probs: expected one per assignment, found " + std::to_string(a.probs.size()));
    if (!a.token_valid.empty() && static_cast<int64_t>(a.token_valid.size()) != g.tokens)
      throw UserError(where + "token_valid: expected one flag per token, found " +
                      std::to_string(a.token_valid.size()));
    for (int32_t e : a.experts)
      if (e < 0 || e >= cfg.n_experts)
        throw UserError(where + "expert id: expected 0.." + std::to_string(cfg.n_experts - 1) + ", found " +
                        std::to_string(e));
    int64_t valid_tokens = g.tokens;
    if (!a.token_valid.empty()) valid_tokens = std::count_if(a.token_valid.begin(), a.token_valid.end(),
                                                             [](uint8_t v) { return v != 0; });
    g.valid.push_back(valid_tokens * g.k);
    g.total_valid += valid_tokens * g.k;
  }
  return g;
}

bool token_is_valid(const GpuAssignments& a, int64_t t) { return a.token_valid.empty() || a.token_valid[t] != 0; }

DispatchResult start_result(const Group& grp, const std::vector<GpuAssignments>& gpus) {
  DispatchResult r;
  r.keep.resize(gpus.size());
  r.per_gpu.resize(gpus.size());
  for (size_t s = 0; s < gpus.size(); ++s) {
    r.per_gpu[s].assignments = grp.tokens * grp.k;
    r.per_gpu[s].padding = grp.tokens * grp.k - grp.valid[s];
    // Valid assignments start kept; each stage clears what it drops.
    r.keep[s].assign(grp.tokens * grp.k, 0);
    for (int64_t t = 0; t < grp.tokens; ++t)
      if (token_is_valid(gpus[s], t)) std::fill_n(r.keep[s].begin() + t * grp.k, grp.k, 1);
  }
  return r;
}

void finish_result(DispatchResult& r) {
  r.counts = {};
  for (const auto& c : r.per_gpu) r.counts += c;
}

void dispatch_pooled(const DispatchConfig& cfg, const Group& grp, const std::vector<GpuAssignments>& gpus,
                     DispatchResult& r) {
  const int64_t S = grp.ep, W = cfg.waves;
  const CapacityRows phys = physical_capacity(cfg, S, grp.tokens);
  const int64_t recv_limit = scaled_capacity(grp.total_valid, cfg.receiver_cf, cfg.n_experts * W, phys.receiver_buffer);

  // Sender side. sent[s][d]: assignment indices GPU s placed for destination d, in
  // rank order (rank r sits in wave r mod W, slot r div W).
  std::vector<std::vector<std::vector<int64_t>>> sent(S, std::vector<std::vector<int64_t>>(S));
  for (int64_t s = 0; s < S; ++s) {
    const int64_t pool_limit = scaled_capacity(grp.valid[s], cfg.sender_cf, S * W, phys.sender_pool);
    const int64_t rank_limit = pool_limit * W;  // slot < pool_limit  <=>  rank < pool_limit * W
    std::vector<int64_t> rank(S, 0);
    for (int64_t i = 0; i < grp.tokens * grp.k; ++i) {
      if (!token_is_valid(gpus[s], i / grp.k)) continue;
      const int64_t d = gpus[s].experts[i] / grp.local;
      if (rank[d]++ < rank_limit) {
        sent[s][d].push_back(i);
        continue;
      }
      r.keep[s][i] = 0;
      r.per_gpu[s].sender++;
    }
  }

  // Receiver side, one wave at a time: capacity per local expert is granted in
  // slot-major, source-minor order (round-robin over sources), so no source GPU
  // is truncated first.
  std::vector<int64_t> used(grp.local);
  for (int64_t d = 0; d < S; ++d) {
    for (int64_t w = 0; w < W; ++w) {
      std::fill(used.begin(), used.end(), 0);
      for (int64_t slot = 0; slot < phys.sender_pool; ++slot) {
        bool any = false;
        for (int64_t s = 0; s < S; ++s) {
          const int64_t rank = slot * W + w;
          if (rank >= static_cast<int64_t>(sent[s][d].size())) continue;
          any = true;
          const int64_t i = sent[s][d][rank];
          const int64_t e = gpus[s].experts[i] % grp.local;
          if (used[e]++ < recv_limit) continue;
          r.keep[s][i] = 0;
          r.per_gpu[s].receiver++;
        }
        if (!any) break;  // pools fill slots in order: an empty slot row ends the wave
      }
    }
  }
}

// Chunk c of a GPU's local experts is [bounds[c], bounds[c+1]).
std::vector<int64_t> chunk_bounds(int64_t local, int64_t chunks) {
  std::vector<int64_t> b(chunks + 1);
  for (int64_t c = 0; c <= chunks; ++c) b[c] = c * local / chunks;
  return b;
}

void dispatch_ragged(const DispatchConfig& cfg, const Group& grp, const std::vector<GpuAssignments>& gpus,
                     DispatchResult& r) {
  const int64_t S = grp.ep;
  const CapacityRows phys = physical_capacity(cfg, S, grp.tokens);
  const int64_t gate = scaled_capacity(grp.total_valid, cfg.receiver_cf, S, phys.receiver_buffer);
  const auto bounds = chunk_bounds(grp.local, cfg.ragged_chunks);

  // by_expert[e][s]: GPU s's valid assignments to global expert e, in position order.
  std::vector<std::vector<std::vector<int64_t>>> by_expert(cfg.n_experts, std::vector<std::vector<int64_t>>(S));
  for (int64_t s = 0; s < S; ++s)
    for (int64_t i = 0; i < grp.tokens * grp.k; ++i)
      if (token_is_valid(gpus[s], i / grp.k)) by_expert[gpus[s].experts[i]][s].push_back(i);

  for (int64_t d = 0; d < S; ++d) {
    for (int64_t c = 0; c + 1 < static_cast<int64_t>(bounds.size()); ++c) {
      const int64_t cap = scaled_capacity(gate * (bounds[c + 1] - bounds[c]), 1.0, grp.local, gate);
      int64_t used = 0;
      for (int64_t e = d * grp.local + bounds[c]; e < d * grp.local + bounds[c + 1]; ++e)
        for (int64_t s = 0; s < S; ++s)
          for (int64_t i : by_expert[e][s]) {
            if (used++ < cap) continue;
            r.keep[s][i] = 0;
            r.per_gpu[s].receiver++;
          }
    }
  }
}

void dispatch_capacity(const DispatchConfig& cfg, const Group& grp, const std::vector<GpuAssignments>& gpus,
                       DispatchResult& r) {
  const CapacityRows phys = physical_capacity(cfg, grp.ep, grp.tokens);
  for (int64_t s = 0; s < grp.ep; ++s) {
    const auto& a = gpus[s];
    if (cfg.priority == CapacityPriority::router_prob && a.probs.empty())
      throw UserError("GPU " + std::to_string(s) + ": capacity by router probability needs router probs");
    const int64_t cap = scaled_capacity(grp.valid[s], cfg.receiver_cf, cfg.n_experts, phys.receiver_buffer);
    std::vector<int64_t> order;  // valid assignment indices in grant order
    for (int64_t i = 0; i < grp.tokens * grp.k; ++i)
      if (token_is_valid(a, i / grp.k)) order.push_back(i);
    if (cfg.priority == CapacityPriority::router_prob)
      std::stable_sort(order.begin(), order.end(), [&](int64_t x, int64_t y) { return a.probs[x] > a.probs[y]; });
    std::vector<int64_t> used(cfg.n_experts, 0);
    for (int64_t i : order) {
      if (used[a.experts[i]]++ < cap) continue;
      r.keep[s][i] = 0;
      r.per_gpu[s].receiver++;
    }
  }
}

}  // namespace

DispatchResult dispatch(const DispatchConfig& cfg, const std::vector<GpuAssignments>& gpus) {
  if (gpus.empty()) throw UserError("dispatch: expected at least one GPU's assignments, found none");
  const Group grp = check_group(cfg, gpus);
  DispatchResult r = start_result(grp, gpus);
  switch (cfg.transport) {
    case Transport::pooled: dispatch_pooled(cfg, grp, gpus, r); break;
    case Transport::ragged: dispatch_ragged(cfg, grp, gpus, r); break;
    case Transport::capacity: dispatch_capacity(cfg, grp, gpus, r); break;
  }
  finish_result(r);
  return r;
}

}  // namespace rackstep::sim
