// Pipeline-parallel schedules: the order each stage runs its forward and
// backward passes in; see sim/pipeline_schedule.h. The step graph
// (sim/step_graph.cpp) turns these orders into tasks with real dependencies.
#include "sim/pipeline_schedule.h"

#include <algorithm>
#include <deque>
#include <utility>
#include <vector>

#include "sim/base/check.h"

namespace rackstep::sim {

namespace {

using Pass = PipelinePass;
using Slot = PipelineSlot;

// Megatron-LM's schedule (Narayanan et al. 2021): warm-up forwards, then one
// forward / one backward, then cool-down backwards; virtual micro-batch k runs
// chunk (k / p) mod v of micro-batch (k / pv) p + k mod p.
std::vector<Slot> one_f_one_b(int64_t p, int64_t v, int64_t m, int64_t s, int64_t extra) {
  const int64_t total = m * v;
  const int64_t warmup = v == 1 ? std::min(p - 1 - s + extra, m) : std::min((p - 1 - s) * 2 + (v - 1) * p + extra, total);
  auto chunk = [&](int64_t k) { return (k / p) % v; };
  auto vmb = [&](int64_t k) { return (k / (p * v)) * p + k % p; };
  std::vector<Slot> out;
  int64_t f = 0, b = 0;
  for (; f < warmup; ++f) out.push_back({Pass::kForward, chunk(f), vmb(f)});
  while (b < total) {
    if (f < total) {
      out.push_back({Pass::kForward, chunk(f), vmb(f)});
      ++f;
    }
    out.push_back({Pass::kBackward, v - 1 - chunk(b), vmb(b)});
    ++b;
  }
  return out;
}

// ZB-H1 (Qi et al. 2024, "Zero Bubble Pipeline Parallelism"): 1F1B's order
// with the backward split into B (input gradient, on the critical path between
// stages) and W (weight gradient, needed by no other stage). Stage s defers up
// to p-1-s W passes in the steady state (1F1B's activation memory) and runs one
// W after every cool-down B, filling the waits for the next stage's gradient.
std::vector<Slot> zero_bubble_h1(int64_t p, int64_t m, int64_t s) {
  const int64_t warmup = std::min(p - 1 - s, m);
  const size_t defer = static_cast<size_t>(s);
  std::vector<Slot> out;
  std::deque<int64_t> pending;
  int64_t f = 0;
  for (; f < warmup; ++f) out.push_back({Pass::kForward, 0, f});
  for (int64_t b = 0; b < m; ++b) {
    const bool steady = f < m;
    if (steady) out.push_back({Pass::kForward, 0, f++});
    out.push_back({Pass::kInputGrad, 0, b});
    pending.push_back(b);
    if (!steady || pending.size() > defer) {
      out.push_back({Pass::kWeightGrad, 0, pending.front()});
      pending.pop_front();
    }
  }
  for (int64_t w : pending) out.push_back({Pass::kWeightGrad, 0, w});
  return out;
}

// DualPipeV (DeepSeek-AI, DualPipe repository, dualpipev.py: the "cut-in-half"
// DualPipe): rank r of p holds chunk 0 = model chunk r and chunk 1 = model
// chunk 2p-1-r, so a micro-batch goes down the ranks and back up. The eight
// phases below are that file's step counts; overlapped F&B pairs run one after
// the other on the compute stream (their transfers still overlap), and
// zero-bubble backwards leave their W to a FIFO drained later.
std::vector<Slot> dualpipe_v(int64_t p, int64_t m, int64_t r) {
  std::vector<Slot> out;
  int64_t next_f[2] = {0, 0}, next_b[2] = {0, 0};
  std::deque<std::pair<int64_t, int64_t>> w;  // (chunk, mb) whose weight grads wait
  auto F = [&](int64_t c) { out.push_back({Pass::kForward, c, next_f[c]++}); };
  auto B = [&](int64_t c, bool zb) {
    const int64_t mb = next_b[c]++;
    out.push_back({zb ? Pass::kInputGrad : Pass::kBackward, c, mb});
    if (zb) w.emplace_back(c, mb);
  };
  auto W = [&] {
    RS_CHECK(!w.empty(), "DualPipeV: a W pass with no deferred weight gradient");
    out.push_back({Pass::kWeightGrad, w.front().first, w.front().second});
    w.pop_front();
  };
  for (int64_t i = 0; i < (p - r - 1) * 2; ++i) F(0);  // 1: nF0
  for (int64_t i = 0; i < r + 1; ++i) {                 // 2: nF0F1
    F(0);
    F(1);
  }
  for (int64_t i = 0; i < p - r - 1; ++i) {  // 3: nB1W1F1 (zero bubble)
    B(1, true);
    W();
    F(1);
  }
  for (int64_t i = 0; i < m - 2 * p + r + 1; ++i) {  // 4: nF0B1F1B0 (main)
    F(0);
    B(1, false);
    F(1);
    B(0, false);
  }
  for (int64_t i = 0; i < p - r - 1; ++i) {  // 5: nB1F1B0
    B(1, false);
    F(1);
    B(0, false);
  }
  bool zb = false;
  const int64_t step6 = r + 1;
  for (int64_t i = 0; i < step6; ++i) {  // 6: nB1B0, zero bubble from the middle on
    if (i == step6 / 2 && r % 2 == 1) zb = true;
    B(1, zb);
    if (i == step6 / 2 && r % 2 == 0) zb = true;
    B(0, zb);
  }
  for (int64_t i = 0; i < p - r - 1; ++i) {  // 7: nWB0
    W();
    B(0, true);
  }
  while (!w.empty()) W();  // 8: nW
  return out;
}

}  // namespace

std::vector<PipelineSlot> pipeline_order(PpSchedule s, int64_t pp, int64_t virtual_stages, int64_t micro_batches,
                                         int64_t stage, int64_t extra_warmup) {
  switch (s) {
    case PpSchedule::kZeroBubble: return zero_bubble_h1(pp, micro_batches, stage);
    case PpSchedule::kDualPipeV: return dualpipe_v(pp, micro_batches, stage);
    case PpSchedule::kInterleaved1F1B: return one_f_one_b(pp, virtual_stages, micro_batches, stage, extra_warmup);
    case PpSchedule::k1F1B: return one_f_one_b(pp, 1, micro_batches, stage, extra_warmup);
  }
  return {};
}

int64_t pipeline_model_chunk(PpSchedule s, int64_t pp, int64_t stage, int64_t chunk) {
  if (s == PpSchedule::kDualPipeV) return chunk == 0 ? stage : 2 * pp - 1 - stage;
  return chunk * pp + stage;
}

}  // namespace rackstep::sim
