#include "sim/sweep.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <set>
#include <thread>

#include "sim/base/check.h"

namespace rackstep::sim {

namespace {

struct Outer {
  int64_t tp, cp, pp, ep, fsdp;
  int64_t etp = 0;  // 0 = tp (unfolded); 1 = MoE parallel folding with whole experts
};

std::vector<int64_t> divisors(int64_t n) {
  std::vector<int64_t> d;
  for (int64_t i = 1; i <= n; ++i) {
    if (n % i == 0) d.push_back(i);
  }
  return d;
}

// Outer combinations; data follows from the GPU count (non-integer: rejected later).
// With tensor parallelism and a stack that folds (or no stack), the expert layers are
// also tried as EP over the tp x cp x data GPUs with whole experts (etp 1, sim/layout.h),
// Megatron-Bridge's choice for Qwen3-235B on H100.
std::vector<Outer> outer_space(const Predictor& p, const Stack* stack) {
  const bool fold = stack == nullptr || stack->supports.expert_folding;
  const auto& t = p.table();
  const int64_t gpus = p.cluster().gpus();
  const int64_t domain = p.cluster().gpus_per_domain;
  std::vector<Outer> out;
  const std::vector<int64_t> eps = t.experts > 0 ? divisors(t.experts) : std::vector<int64_t>{1};
  for (int64_t tp : {1, 2, 4, 8}) {
    if (tp > domain) continue;
    for (int64_t cp : {1, 2, 4, 8}) {
      for (int64_t pp : divisors(t.layers)) {
        const int64_t denom = tp * cp * pp;
        const int64_t data = gpus % denom == 0 ? gpus / denom : 0;
        for (int64_t ep : eps) {
          if (data > 0 && ep > data) break;
          std::set<int64_t> fsdps{1, ep, std::max<int64_t>(1, domain / (tp * cp)), std::max<int64_t>(1, data)};
          for (int64_t fsdp : fsdps) out.push_back({tp, cp, pp, ep, fsdp});
          if (data == 0) break;  // one representative of an impossible product is enough
        }
        if (!fold || tp == 1 || data == 0 || t.experts == 0) continue;
        for (int64_t ep : eps) {
          if (ep > tp * cp * data) break;
          if ((tp * cp * data) % ep != 0) continue;
          for (int64_t fsdp : std::set<int64_t>{1, data}) out.push_back({tp, cp, pp, ep, fsdp, 1});
        }
      }
    }
  }
  return out;
}

struct Worker {
  std::array<int64_t, static_cast<size_t>(Reason::kCount)> rejected{};
  std::array<bool, static_cast<size_t>(Reason::kCount)> has_example{};
  std::array<Layout, static_cast<size_t>(Reason::kCount)> example{};
  int64_t enumerated = 0, valid = 0;
  std::vector<SweepEntry> top;      // kept sorted, at most `keep`
  std::vector<SweepEntry> pareto;   // non-dominated (throughput, headroom)
};

bool dominated(const SweepEntry& a, const SweepEntry& b) {  // a dominated by b
  return b.prediction.tokens_per_s >= a.prediction.tokens_per_s && b.headroom_bytes >= a.headroom_bytes &&
         (b.prediction.tokens_per_s > a.prediction.tokens_per_s || b.headroom_bytes > a.headroom_bytes);
}

void offer_pareto(std::vector<SweepEntry>& front, const SweepEntry& e) {
  for (const auto& f : front) {
    if (dominated(e, f)) return;
  }
  front.erase(std::remove_if(front.begin(), front.end(), [&](const SweepEntry& f) { return dominated(f, e); }),
              front.end());
  front.push_back(e);
}

void offer_top(std::vector<SweepEntry>& top, const SweepEntry& e, size_t keep) {
  if (top.size() >= keep && e.prediction.step_time_s >= top.back().prediction.step_time_s) return;
  auto it = std::upper_bound(top.begin(), top.end(), e, [](const SweepEntry& a, const SweepEntry& b) {
    return a.prediction.step_time_s < b.prediction.step_time_s;
  });
  top.insert(it, e);
  if (top.size() > keep) top.pop_back();
}

void evaluate(const Predictor& p, const Layout& l, Worker& w, size_t keep, const Stack* stack) {
  ++w.enumerated;
  Reason r = Reason::kCount;
  if (stack && !stack_runs(l, *stack)) {
    const auto i = static_cast<size_t>(Reason::kStack);
    ++w.rejected[i];
    if (!w.has_example[i]) {
      w.has_example[i] = true;
      w.example[i] = l;
    }
    return;
  }
  const Prediction pr = p.predict_fast(l, &r);
  if (!pr.valid) {
    const auto i = static_cast<size_t>(r);
    ++w.rejected[i];
    if (!w.has_example[i]) {
      w.has_example[i] = true;
      w.example[i] = l;
    }
    return;
  }
  ++w.valid;
  const double headroom = pr.memory.device_capacity - pr.memory.device_total;
  const bool fits_top = w.top.size() < keep || pr.step_time_s < w.top.back().prediction.step_time_s;
  bool fits_front = true;
  for (const auto& f : w.pareto) {
    if (f.prediction.tokens_per_s >= pr.tokens_per_s && f.headroom_bytes >= headroom) {
      fits_front = false;
      break;
    }
  }
  if (!fits_top && !fits_front) return;
  const SweepEntry e{l, pr, headroom};
  if (fits_top) offer_top(w.top, e, keep);
  if (fits_front) offer_pareto(w.pareto, e);
}

// Reasons that depend on the mesh (tp, cp, pp, ep, fsdp, data) only.
bool is_mesh_reason(Reason r, const Layout& l, int64_t seqs) {
  switch (r) {
    case Reason::kGpuProduct:
    case Reason::kFsdpDivides:
    case Reason::kEpDivides:
    case Reason::kEpExperts:
    case Reason::kEpDense:
    case Reason::kCpSeq:
    case Reason::kTpHeads:
    case Reason::kTpDomain: return true;
    case Reason::kBatchSplit: return seqs % l.data != 0;  // no micro-batch size can fix it
    default: return false;
  }
}

// Inner loop: everything that does not change the mesh.
void sweep_outer(const Predictor& p, const Outer& o, const SweepOptions& opt, Worker& w) {
  const auto& t = p.table();
  const int64_t gpus = p.cluster().gpus();
  const int64_t denom = o.tp * o.cp * o.pp;
  Layout base;
  base.tp = o.tp;
  base.cp = o.cp;
  base.pp = o.pp;
  base.ep = o.ep;
  base.etp = o.etp;
  base.fsdp = o.fsdp;
  base.data = gpus % denom == 0 ? gpus / denom : std::max<int64_t>(1, gpus / denom);
  base.tokens_per_step = opt.tokens_per_step;
  const int64_t seqs = opt.tokens_per_step > 0 ? opt.tokens_per_step / std::max<int64_t>(1, t.seq_len) : t.batch_seqs;
  const int64_t per_rank = std::max<int64_t>(1, seqs / base.data);
  std::vector<int64_t> mbs;
  for (int64_t mb = 1; mb <= per_rank; mb *= 2) mbs.push_back(mb);
  std::vector<PpSchedule> schedules{PpSchedule::k1F1B};
  if (o.pp > 1) schedules = {PpSchedule::k1F1B, PpSchedule::kInterleaved1F1B, PpSchedule::kZeroBubble, PpSchedule::kDualPipeV};
  std::vector<Transport> transports{Transport::ragged};
  if (o.ep > 1) transports.push_back(Transport::pooled);
  // EP dispatchers and Megatron's merged-1F1B EP overlap (Layout::ep_dispatcher,
  // ep_a2a_overlap): what the stack names, every kind without a stack.
  // A flex dispatcher is tried with each backend the stack ships (Layout::ep_flex_backend);
  // without a stack, with DeepEP only (Megatron-Core's default backend: HybridEP is a
  // library a stack's file must name).
  struct Dispatch {
    EpDispatcher dispatcher;
    FlexBackend backend;
  };
  std::vector<Dispatch> dispatchers{{EpDispatcher::kAllToAll, FlexBackend::kDeepEp}};
  std::vector<bool> a2a_overlaps{false};
  if (o.ep > 1) {
    std::vector<EpDispatcher> kinds{EpDispatcher::kAllToAll, EpDispatcher::kFlex};
    std::vector<FlexBackend> backends{FlexBackend::kDeepEp};
    a2a_overlaps = {false, true};
    if (opt.stack != nullptr) {
      kinds = opt.stack->supports.ep_dispatchers;
      backends = opt.stack->supports.ep_flex_backends;
      if (!opt.stack->supports.ep_a2a_overlap) a2a_overlaps = {false};
    }
    RS_CHECK(!kinds.empty(), "a stack names at least one EP dispatcher");
    dispatchers.clear();
    for (EpDispatcher k : kinds) {
      if (k != EpDispatcher::kFlex) {
        dispatchers.push_back({k, FlexBackend::kDeepEp});
        continue;
      }
      for (FlexBackend b : backends) dispatchers.push_back({k, b});
    }
    RS_CHECK(!dispatchers.empty(), "a stack with the flex dispatcher names at least one of its backends");
  }
  struct Policy {
    models::Recompute r;
    bool offload;
  };
  std::vector<int64_t> zero_stages{3};
  if (opt.stack && o.fsdp > 1) {
    zero_stages.clear();
    for (int64_t z : opt.stack->supports.zero_stages) {
      if (z > 0) zero_stages.push_back(z);
    }
    if (zero_stages.empty()) zero_stages.push_back(3);  // rejected as stack_support below
  }
  const Policy policies[] = {{models::Recompute::kNone, false},
                             {models::Recompute::kSelective, false},
                             {models::Recompute::kFull, false},
                             {models::Recompute::kFull, true}};
  // A mesh that is invalid whatever the inner settings: count every inner layout
  // under that reason without predicting each (same reason by construction).
  const int64_t inner =
      static_cast<int64_t>(mbs.size() * schedules.size() * 4 * 2 * transports.size() * zero_stages.size() *
                           dispatchers.size() * a2a_overlaps.size());
  Reason r = Reason::kCount;
  Layout probe = base;
  const bool mesh_bad = first_issue(probe, p.graph(), p.cluster(), &r) && is_mesh_reason(r, probe, seqs);
  if (mesh_bad) {
    const auto i = static_cast<size_t>(r);
    w.enumerated += inner;
    w.rejected[i] += inner;
    if (!w.has_example[i]) {
      w.has_example[i] = true;
      w.example[i] = probe;
    }
    return;
  }
  for (int64_t mb : mbs) {
    for (PpSchedule s : schedules) {
      for (const Policy& pol : policies) {
        for (StatePlacement place : {StatePlacement::kDevice, StatePlacement::kHost}) {
          for (Transport tr : transports) {
            for (int64_t zero : zero_stages) {
              for (const Dispatch& disp : dispatchers) {
                for (bool a2a_overlap : a2a_overlaps) {
                  Layout l = base;
                  l.zero_stage = zero;
                  l.micro_batch_seqs = mb;
                  l.schedule = s;
                  l.pp_virtual = s == PpSchedule::kInterleaved1F1B ? 2 : 1;
                  l.recompute = pol.r;
                  l.offload_residual = pol.offload;
                  l.optimizer_state = place;
                  l.ep_transport = tr;
                  l.ep_dispatcher = disp.dispatcher;
                  l.ep_flex_backend = disp.backend;
                  l.ep_a2a_overlap = a2a_overlap;
                  evaluate(p, l, w, opt.top, opt.stack);
                }
              }
            }
          }
        }
      }
    }
  }
}

}  // namespace

SweepResult sweep(const Predictor& p, const SweepOptions& opt) {
  const std::vector<Outer> space = outer_space(p, opt.stack);
  int threads = opt.threads > 0 ? opt.threads : static_cast<int>(std::thread::hardware_concurrency());
  threads = std::max(1, threads);
  std::vector<Worker> workers(static_cast<size_t>(threads));
  std::atomic<size_t> next{0};
  const auto work = [&](Worker& w) {
    for (size_t i = next.fetch_add(1); i < space.size(); i = next.fetch_add(1)) sweep_outer(p, space[i], opt, w);
  };
  std::vector<std::thread> pool;
  for (int i = 1; i < threads; ++i) pool.emplace_back(work, std::ref(workers[static_cast<size_t>(i)]));
  work(workers[0]);
  for (auto& th : pool) th.join();

  SweepResult r;
  r.threads_used = threads;
  std::array<bool, static_cast<size_t>(Reason::kCount)> have{};
  for (auto& w : workers) {
    r.enumerated += w.enumerated;
    r.valid += w.valid;
    for (size_t i = 0; i < r.rejected.size(); ++i) {
      r.rejected[i] += w.rejected[i];
      if (w.has_example[i] && !have[i]) {
        have[i] = true;
        // The detail text of the example: the layout's first issue of this reason.
        std::vector<LayoutIssue> issues = p.predict(w.example[i]).issues;
        if (opt.stack && i == static_cast<size_t>(Reason::kStack)) issues = check_stack(w.example[i], *opt.stack);
        for (const auto& is : issues) {
          if (static_cast<size_t>(is.reason) == i) {
            r.example[i] = describe(w.example[i]) + ": " + is.detail;
            break;
          }
        }
        if (r.example[i].empty()) r.example[i] = describe(w.example[i]);
      }
    }
    for (const auto& e : w.top) offer_top(r.top, e, opt.top);
    for (const auto& e : w.pareto) offer_pareto(r.pareto, e);
  }
  std::sort(r.pareto.begin(), r.pareto.end(), [](const SweepEntry& a, const SweepEntry& b) {
    return a.prediction.tokens_per_s > b.prediction.tokens_per_s;
  });
  return r;
}

}  // namespace rackstep::sim
