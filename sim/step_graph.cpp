// Task graph of training steps; see sim/step_graph.h.
#include "sim/step_graph.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "models/check.h"

namespace rackstep::sim {

namespace {

// One representative GPU: its streams and resources.
struct Rank {
  int process = -1;
  ResourceId compute, ag, rs, ep, tp, cp, pp_send, pp_recv, dp, copy, host;
};

// Costs from the predictor, per layer and per step.
struct Costs {
  std::vector<LayerTiming> layers;
  double pre_fwd_s = 0, pre_bwd_s = 0, head_fwd_s = 0, head_bwd_s = 0;
  double send_s = 0;  // activation (or gradient) across a stage boundary
  StepBreakdown step;
};

Costs gather_costs(const Predictor& p, const Layout& l, const Prediction& pred) {
  Costs c;
  c.layers = p.layer_timings(l);
  const models::LayerGraph& g = p.graph();
  std::vector<OpTiming> ops = p.op_timings(l);
  const size_t first_block = g.block_begin.empty() ? g.head_begin : g.block_begin.front();
  for (const OpTiming& o : ops) {
    if (o.layer >= 0) continue;
    if (o.graph_index < first_block) {
      c.pre_fwd_s += o.fwd_s;
      c.pre_bwd_s += o.bwd_s;
    } else if (o.graph_index >= g.head_begin) {
      c.head_fwd_s += o.fwd_s;
      c.head_bwd_s += o.bwd_s;
    }
  }
  if (l.pp > 1) {
    // The predictor's stage-boundary message: one micro-batch of activations in bf16.
    const double tokens_mb = static_cast<double>(l.micro_batch_seqs * l.seq(g.model)) / static_cast<double>(l.cp);
    const double act_bytes = tokens_mb * static_cast<double>(g.model.d_model) * 2.0 / static_cast<double>(l.tp);
    const bool cross = l.data * l.tp * l.cp >= p.network().gpus_per_domain;
    c.send_s = send_recv_s(p.network(), cross, act_bytes);
  }
  c.step = pred.breakdown;
  return c;
}

std::string num(const char* prefix, int64_t v) {
  std::string s(prefix);  // appended, not operator+: GCC 12 warns (-Wrestrict) on the temporary
  s += std::to_string(v);
  return s;
}

class Builder {
 public:
  // lps: layers per model chunk; chunks: model chunks per stage (virtual stages).
  Builder(Engine& e, const Costs& c, const Layout& l, int64_t stages, int64_t chunks, int64_t lps,
          int64_t micro_batches)
      : e_(e), c_(c), l_(l), stages_(stages), v_(chunks), lps_(lps), m_(micro_batches) {}

  // Representative ranks, stage-major.
  void add_ranks(int64_t ranks_per_stage, int64_t multiplicity) {
    n_ = ranks_per_stage;
    for (int64_t s = 0; s < stages_; ++s) {
      for (int64_t r = 0; r < n_; ++r) {
        std::string name = "stage" + std::to_string(s) + ".rank" + std::to_string(r);
        Rank k;
        k.process = e_.add_process(name, multiplicity);
        auto stream = [&](const char* n, ResourceKind kind) { return e_.add_resource(k.process, n, kind); };
        k.compute = stream("compute", ResourceKind::kComputeStream);
        k.ag = stream("fsdp_allgather", ResourceKind::kCommStream);
        k.rs = stream("fsdp_reduce_scatter", ResourceKind::kCommStream);
        k.ep = stream("ep_all_to_all", ResourceKind::kCommStream);
        k.tp = stream("tp", ResourceKind::kCommStream);
        k.cp = stream("cp_ring", ResourceKind::kCommStream);
        k.pp_send = stream("pp_send", ResourceKind::kCommStream);
        // Receives wait only for their sender, never for each other.
        k.pp_recv = e_.add_resource(k.process, "pp_recv", ResourceKind::kCommStream, 0, Order::kReadyOrder, 1 << 20);
        k.dp = stream("grad_sync", ResourceKind::kCommStream);
        k.copy = stream("host_copy", ResourceKind::kCopyEngine);
        k.host = e_.add_resource(k.process, "host_cpu", ResourceKind::kHostCpu, 0, Order::kReadyOrder, 1);
        ranks_.push_back(k);
      }
    }
    gate_.assign(ranks_.size(), TaskId{});
  }

  // One step: every stage runs its (interleaved) 1F1B schedule in order on its
  // compute stream, then the per-step tail.
  TaskId step(int64_t index, bool gc) {
    step_ = index;
    const size_t slots = static_cast<size_t>(stages_ * v_ * m_ * n_);
    recv_fwd_.assign(slots, {});
    recv_bwd_.assign(slots, {});
    last_fwd_.assign(slots, {});
    last_bwd_.assign(slots, {});
    for (int64_t s = 0; s < stages_; ++s) {
      // Megatron-LM's schedule (Narayanan et al. 2021): warm-up forwards, then
      // one forward / one backward, then cool-down backwards; virtual
      // micro-batch k runs chunk (k / p) mod v of micro-batch (k / pv) p + k mod p.
      const int64_t total = m_ * v_;
      const int64_t warmup = v_ == 1 ? std::min(stages_ - 1 - s, m_)
                                     : std::min((stages_ - 1 - s) * 2 + (v_ - 1) * stages_, total);
      int64_t f = 0, b = 0;
      for (; f < warmup; ++f) forward(s, fwd_chunk(f), vmb(f));
      while (b < total) {
        if (f < total) {
          forward(s, fwd_chunk(f), vmb(f));
          ++f;
        }
        backward(s, v_ - 1 - fwd_chunk(b), vmb(b));
        ++b;
      }
    }
    link_stages();
    return tail(gc);
  }

 private:
  Rank& rank(int64_t s, int64_t r) { return ranks_[s * n_ + r]; }
  int64_t fwd_chunk(int64_t k) const { return (k / stages_) % v_; }
  int64_t vmb(int64_t k) const { return (k / (stages_ * v_)) * stages_ + k % stages_; }
  // Model chunk q = c p + s holds layers [q lps, (q + 1) lps); q = 0 embeds, the last one has the head.
  int64_t chunks_total() const { return stages_ * v_; }
  size_t slot(int64_t q, int64_t mb, int64_t r) const { return static_cast<size_t>((q * m_ + mb) * n_ + r); }
  std::vector<TaskId> row(int64_t s, std::vector<TaskId>& all) {
    return std::vector<TaskId>(all.begin() + s * n_, all.begin() + (s + 1) * n_);
  }

  TaskId task(ResourceId on, std::string name, const char* cat, double d, TaskId after) {
    TaskId t = e_.add_compute(on, std::move(name), cat, d);
    if (after.valid()) e_.add_dependency(after, t);
    return t;
  }

  // A collective over one stage's ranks: each rank's part starts once every
  // rank is ready (so a late rank holds up everyone). Zero time: nothing.
  void collective(int64_t s, ResourceId Rank::*stream, const std::string& name, const char* cat, double d,
                  std::vector<TaskId>& prev, const std::vector<TaskId>& extra = {}) {
    if (d <= 0) return;
    std::vector<TaskId> parts(n_);
    for (int64_t r = 0; r < n_; ++r) {
      parts[r] = e_.add_compute(rank(s, r).*stream, name, cat, d);
      for (int64_t q = 0; q < n_; ++q) {
        if (prev[q].valid()) e_.add_dependency(prev[q], parts[r]);
        if (!extra.empty() && extra[q].valid()) e_.add_dependency(extra[q], parts[r]);
      }
    }
    prev = parts;
  }

  void compute(int64_t s, const std::string& name, const char* cat, double d, std::vector<TaskId>& prev) {
    for (int64_t r = 0; r < n_; ++r) prev[r] = task(rank(s, r).compute, name, cat, d, prev[r]);
  }

  // FSDP gather of `layer`'s parameters, allowed to start once `window` (the
  // compute two layers back, or the previous step's end) is done.
  std::vector<TaskId> gather(int64_t s, int64_t layer, const std::string& tag, const std::vector<TaskId>& window) {
    std::vector<TaskId> g = window;
    collective(s, &Rank::ag, num("L", layer) + "." + tag + ".allgather", "fsdp_allgather",
               c_.layers[layer].fsdp_gather_s, g);
    if (c_.layers[layer].fsdp_gather_s <= 0) return std::vector<TaskId>(n_);
    return g;
  }

  void join(std::vector<TaskId>& prev, const std::vector<TaskId>& other) {
    for (int64_t r = 0; r < n_; ++r) {
      if (other[r].valid() && prev[r].valid()) e_.add_dependency(other[r], prev[r]);
    }
  }

  // EP dispatch + combine after a layer's compute (ragged: exposed).
  void ep_pass(int64_t s, int64_t layer, const std::string& tag, std::vector<TaskId>& prev) {
    const LayerTiming& t = c_.layers[layer];
    collective(s, &Rank::ep, num("L", layer) + "." + tag + ".dispatch", "ep_dispatch", t.ep_dispatch_s, prev);
    collective(s, &Rank::ep, num("L", layer) + "." + tag + ".combine", "ep_combine", t.ep_combine_s, prev);
  }

  // TP passes are exposed; a CP ring pass runs beside the layer's compute.
  void tp_cp(int64_t s, int64_t layer, const std::string& tag, std::vector<TaskId> before, std::vector<TaskId>& prev) {
    const LayerTiming& t = c_.layers[layer];
    collective(s, &Rank::tp, num("L", layer) + "." + tag + ".tp", "tp", t.tp_comm_s, prev);
    if (t.cp_comm_s > 0) {
      collective(s, &Rank::cp, num("L", layer) + "." + tag + ".cp_ring", "cp_ring", t.cp_comm_s, before);
      compute(s, num("L", layer) + "." + tag + ".join", "forward", 0.0, prev);
      join(prev, before);
    }
  }

  std::vector<TaskId> stage_gate(int64_t s) { return row(s, gate_); }

  void forward(int64_t s, int64_t c, int64_t mb) {
    const int64_t q = c * stages_ + s;
    const std::string tag = num("mb", mb) + (v_ > 1 ? num(".c", c) : std::string()) + ".fwd";
    std::vector<TaskId> prev(n_);
    for (int64_t r = 0; r < n_; ++r) {
      if (q > 0) {
        prev[r] = task(rank(s, r).pp_recv, tag + ".recv", "pp_recv", 0.0, {});
        recv_fwd_[slot(q, mb, r)] = prev[r];
      } else {
        prev[r] = gate_[s * n_ + r];
      }
    }
    if (q == 0) compute(s, "embed." + tag, "forward", c_.pre_fwd_s, prev);
    std::vector<std::vector<TaskId>> done;
    for (int64_t i = 0; i < lps_; ++i) {
      const int64_t layer = q * lps_ + i;
      std::vector<TaskId> window = i >= 2 ? done[i - 2] : stage_gate(s);
      std::vector<TaskId> g = gather(s, layer, tag, window);
      std::vector<TaskId> before = prev;
      compute(s, num("L", layer) + "." + tag, "forward", c_.layers[layer].fwd_s, prev);
      join(prev, g);
      tp_cp(s, layer, tag, before, prev);
      ep_pass(s, layer, tag, prev);
      done.push_back(prev);
    }
    if (q == chunks_total() - 1) compute(s, "head." + tag, "forward", c_.head_fwd_s, prev);
    if (q < chunks_total() - 1) {
      for (int64_t r = 0; r < n_; ++r) {
        prev[r] = task(rank(s, r).pp_send, tag + ".send", "pp_send", c_.send_s, prev[r]);
      }
    }
    for (int64_t r = 0; r < n_; ++r) last_fwd_[slot(q, mb, r)] = prev[r];
  }

  void backward(int64_t s, int64_t c, int64_t mb) {
    const int64_t q = c * stages_ + s;
    const std::string tag = num("mb", mb) + (v_ > 1 ? num(".c", c) : std::string()) + ".bwd";
    std::vector<TaskId> prev(n_);
    if (q < chunks_total() - 1) {
      for (int64_t r = 0; r < n_; ++r) {
        prev[r] = task(rank(s, r).pp_recv, tag + ".recv", "pp_recv", 0.0, {});
        recv_bwd_[slot(q, mb, r)] = prev[r];
      }
    } else {
      for (int64_t r = 0; r < n_; ++r) prev[r] = last_fwd_[slot(q, mb, r)];
      compute(s, "head." + tag, "backward", c_.head_bwd_s, prev);
    }
    const bool full = l_.recompute == models::Recompute::kFull;
    std::vector<std::vector<TaskId>> done;
    for (int64_t i = lps_ - 1; i >= 0; --i) {
      const int64_t layer = q * lps_ + i;
      const int64_t k = lps_ - 1 - i;  // position in backward order
      std::vector<TaskId> window = k >= 2 ? done[k - 2] : prev;
      std::vector<TaskId> g = gather(s, layer, tag, window);
      const LayerTiming& t = c_.layers[layer];
      if (t.recompute_s > 0) {
        compute(s, num("L", layer) + "." + tag + ".recompute", "recompute", t.recompute_s, prev);
        join(prev, g);
        if (full) ep_pass(s, layer, tag + ".recompute", prev);
      }
      std::vector<TaskId> before = prev;
      compute(s, num("L", layer) + "." + tag, "backward", t.bwd_s, prev);
      join(prev, g);
      tp_cp(s, layer, tag, before, prev);
      std::vector<TaskId> grads = prev;
      collective(s, &Rank::rs, num("L", layer) + "." + tag + ".reduce_scatter", "fsdp_reduce_scatter",
                 t.grad_reduce_scatter_s, grads);
      ep_pass(s, layer, tag, prev);
      done.push_back(prev);
    }
    if (q == 0) compute(s, "embed." + tag, "backward", c_.pre_bwd_s, prev);
    if (q > 0) {
      for (int64_t r = 0; r < n_; ++r) {
        prev[r] = task(rank(s, r).pp_send, tag + ".send", "pp_send", c_.send_s, prev[r]);
      }
    }
    for (int64_t r = 0; r < n_; ++r) last_bwd_[slot(q, mb, r)] = prev[r];
  }

  // Sends feed the next model chunk's receives (added once both exist):
  // chunk q -> q + 1 forward, q + 1 -> q backward.
  void link_stages() {
    for (int64_t q = 0; q + 1 < chunks_total(); ++q) {
      for (int64_t mb = 0; mb < m_; ++mb) {
        for (int64_t r = 0; r < n_; ++r) {
          e_.add_dependency(last_fwd_[slot(q, mb, r)], recv_fwd_[slot(q + 1, mb, r)]);
          e_.add_dependency(last_bwd_[slot(q + 1, mb, r)], recv_bwd_[slot(q, mb, r)]);
        }
      }
    }
  }

  // After the last backward: a GC pause on one staggered rank per stage holds
  // up the gradient reduction across replicas; then the optimizer.
  TaskId tail(bool gc) {
    TaskId end;
    for (int64_t s = 0; s < stages_; ++s) {
      std::vector<TaskId> ready(n_), rs_done(n_);
      for (int64_t r = 0; r < n_; ++r) {
        Rank& k = rank(s, r);
        // Zero-time markers: "everything on this stream so far is done".
        ready[r] = task(k.compute, num("step", step_) + ".backward_done", "backward", 0.0, {});
        rs_done[r] = task(k.rs, num("step", step_) + ".reduce_scatter_done", "fsdp_reduce_scatter", 0.0, {});
      }
      const double stall = gc ? c_.step.host_stall_s : 0.0;
      if (stall > 0) {
        const int64_t who = step_ % n_;
        ready[who] = task(rank(s, who).host, num("step", step_) + ".gc_pause", "gc_stall", stall, ready[who]);
      }
      collective(s, &Rank::dp, num("step", step_) + ".grad_sync", "grad_sync", c_.step.grad_sync_s, ready, rs_done);
      join(ready, rs_done);
      compute(s, num("step", step_) + ".optimizer", "optimizer", c_.step.optimizer_compute_s, ready);
      collective(s, &Rank::dp, num("step", step_) + ".newton_schulz_comm", "optimizer_comm",
                 c_.step.optimizer_comm_s, ready);
      if (c_.step.optimizer_host_s > 0) {
        for (int64_t r = 0; r < n_; ++r) {
          ready[r] = task(rank(s, r).copy, num("step", step_) + ".optimizer_state_h2d", "optimizer_host",
                          c_.step.optimizer_host_s, ready[r]);
        }
      }
      // Offloaded residual carries, priced by the predictor as exposed per step.
      if (c_.step.offload_s > 0) {
        for (int64_t r = 0; r < n_; ++r) {
          ready[r] = task(rank(s, r).copy, num("step", step_) + ".offload", "offload", c_.step.offload_s, ready[r]);
        }
      }
      for (int64_t r = 0; r < n_; ++r) {
        gate_[s * n_ + r] = ready[r];
        end = ready[r];
      }
    }
    // Every stage's optimizer finishes before any stage starts the next step.
    TaskId barrier = task(rank(0, 0).compute, num("step", step_) + ".end", "optimizer", 0.0, {});
    for (TaskId g : gate_) e_.add_dependency(g, barrier);
    for (TaskId& g : gate_) g = barrier;
    return barrier;
  }

  Engine& e_;
  const Costs& c_;
  const Layout& l_;
  int64_t stages_, v_, lps_, m_, n_ = 1, step_ = 0;
  std::vector<Rank> ranks_;
  std::vector<TaskId> gate_;  // per rank: previous step's end
  // Per (model chunk, micro-batch, rank): receive tasks and last tasks of each pass.
  std::vector<TaskId> recv_fwd_, recv_bwd_, last_fwd_, last_bwd_;
};

}  // namespace

StepGraph build_step_graph(const Predictor& p, const Layout& l, const StepGraphOptions& o) {
  StepGraph sg;
  sg.prediction = p.predict(l);
  if (!sg.prediction.valid) {
    std::string why;
    for (const auto& i : sg.prediction.issues) why += (why.empty() ? "" : "; ") + i.detail;
    throw UserError("timeline: layout '" + l.name + "' is invalid: " + why);
  }
  const bool interleaved = l.schedule == PpSchedule::kInterleaved1F1B;
  if (l.pp > 1 && l.schedule != PpSchedule::k1F1B && !interleaved) {
    throw UserError(std::string("timeline: pipeline schedule '") + to_string(l.schedule) +
                    "' is not simulated yet; the DES builds 1f1b and interleaved_1f1b");
  }
  if (o.steps < 1 || o.ranks_per_stage < 1) {
    throw UserError("timeline: expected --steps >= 1 and --ranks-per-stage >= 1");
  }
  const int64_t per_stage = l.gpus() / l.pp;
  if (per_stage % o.ranks_per_stage != 0) {
    throw UserError("timeline: --ranks-per-stage " + std::to_string(o.ranks_per_stage) +
                    " must divide the " + std::to_string(per_stage) + " GPUs of a stage");
  }
  const Costs costs = gather_costs(p, l, sg.prediction);
  sg.stages = l.pp;
  const int64_t chunks = l.pp > 1 ? l.pp_virtual : 1;
  sg.layers_per_stage = static_cast<int64_t>(costs.layers.size()) / l.pp;
  sg.micro_batches = std::max<int64_t>(1, std::llround(sg.prediction.micro_batches));
  if (chunks > 1 && sg.micro_batches % l.pp != 0) {
    throw UserError("timeline: interleaved 1F1B needs micro-batches (" + std::to_string(sg.micro_batches) +
                    ") to be a multiple of pp (" + std::to_string(l.pp) + ")");
  }
  Builder b(sg.engine, costs, l, sg.stages, chunks, sg.layers_per_stage / chunks, sg.micro_batches);
  b.add_ranks(o.ranks_per_stage, per_stage / o.ranks_per_stage);
  for (int64_t s = 0; s < o.steps; ++s) sg.step_end.push_back(b.step(s, o.gc_stalls));
  return sg;
}

}  // namespace rackstep::sim
