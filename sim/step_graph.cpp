// Task graph of training steps; see sim/step_graph.h.
#include "sim/step_graph.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <utility>

#include "sim/base/check.h"
#include "sim/base/value_error.h"
#include "sim/goodput.h"
#include "sim/memory.h"

namespace rackstep::sim {

namespace {

// One collective call as the engine runs it (priced by Predictor::price).
using Comm = CommCost;

// ------------------------------------------------------------ costs

// One layer: compute split around the routed experts, and its collectives.
struct LayerCost {
  LayerTiming t;
  bool ep = false;  // routed experts behind an EP all-to-all
  // Forward / backward seconds before the dispatch, of the expert GEMMs, and
  // from the combine on; *_w: their weight-gradient part (zero-bubble W).
  double pre_fwd = 0, exp_fwd = 0, post_fwd = 0;
  double pre_bwd = 0, exp_bwd = 0, post_bwd = 0;
  double pre_w = 0, exp_w = 0, post_w = 0;
  // The same parts in hardware FLOPs per GPU (trace slices; zero-bubble W: half a GEMM's backward).
  double pre_fwd_f = 0, exp_fwd_f = 0, post_fwd_f = 0;
  double pre_bwd_f = 0, exp_bwd_f = 0, post_bwd_f = 0;
  double pre_w_f = 0, exp_w_f = 0, post_w_f = 0;
  Comm gather, reduce_scatter, dispatch, combine, tp, cp_fwd, cp_bwd;
  std::vector<Comm> grad_sync;  // all-reduces of this layer's gradients across replicas
  double w_s() const { return pre_w + exp_w + post_w; }
  double w_f() const { return pre_w_f + exp_w_f + post_w_f; }
  double fwd_f() const { return pre_fwd_f + exp_fwd_f + post_fwd_f; }
  double bwd_f() const { return pre_bwd_f + exp_bwd_f + post_bwd_f; }
};

struct Costs {
  std::vector<LayerCost> layers;
  double pre_fwd_s = 0, pre_bwd_s = 0, head_fwd_s = 0, head_bwd_s = 0;
  double pre_fwd_f = 0, pre_bwd_f = 0, head_fwd_f = 0, head_bwd_f = 0;  // FLOPs
  Comm send;                      // activation (or gradient) across a stage boundary
  Comm edge_sync, replicated_sync;  // LM head / embedding gradients across replicas
  Comm ns_gather, ns_redistribute;  // Muon: shards to matrix owners and back
  double ep_overlap_eff = 1.0;
  int64_t waves = 1;              // EP waves per pass
  int64_t bucket_layers = 1;      // layers per gradient all-reduce bucket (0: one after the backward)
  bool kept_weights = false;      // ZeRO-3 keep_gathered_weights: each layer gathered once per step
  StepBreakdown step;
  double checkpoint_bytes_per_gpu = 0, checkpoint_blocking = 1, storage_bw = 0;
};

// Splits each layer's op times around the dispatch and combine ops.
void split_layers(const Predictor& p, const std::vector<OpTiming>& ops, Costs& c) {
  const models::LayerGraph& g = p.graph();
  const size_t first_block = g.block_begin.empty() ? g.head_begin : g.block_begin.front();
  for (const OpTiming& o : ops) {
    if (o.layer >= 0) continue;
    if (o.graph_index < first_block) {
      c.pre_fwd_s += o.fwd_s;
      c.pre_bwd_s += o.bwd_s;
      c.pre_fwd_f += o.fwd_flops;
      c.pre_bwd_f += o.bwd_flops;
    } else if (o.graph_index >= g.head_begin) {
      c.head_fwd_s += o.fwd_s;
      c.head_bwd_s += o.bwd_s;
      c.head_fwd_f += o.fwd_flops;
      c.head_bwd_f += o.bwd_flops;
    }
  }
  for (size_t i = 0; i < c.layers.size(); ++i) {
    LayerCost& k = c.layers[i];
    const size_t end = i + 1 < g.block_begin.size() ? g.block_begin[i + 1] : g.head_begin;
    int part = 0;  // 0 before the dispatch, 1 the experts, 2 from the combine on
    for (size_t j = g.block_begin[i]; j < end; ++j) {
      const models::Op& op = g.ops[j];
      if (k.ep && op.kind == models::OpKind::kDispatch) part = 1;
      if (k.ep && op.kind == models::OpKind::kCombine) part = 2;
      // GEMM backward = dgrad + wgrad of equal FLOPs; the wgrad half is W.
      const bool gemm = op.op_class == models::OpClass::kGemm || op.op_class == models::OpClass::kGroupedGemm;
      const double w = gemm ? 0.5 * ops[j].bwd_s : 0.0;
      double* fwd[] = {&k.pre_fwd, &k.exp_fwd, &k.post_fwd};
      double* bwd[] = {&k.pre_bwd, &k.exp_bwd, &k.post_bwd};
      double* wg[] = {&k.pre_w, &k.exp_w, &k.post_w};
      *fwd[part] += ops[j].fwd_s;
      *bwd[part] += ops[j].bwd_s;
      *wg[part] += w;
      double* fwd_f[] = {&k.pre_fwd_f, &k.exp_fwd_f, &k.post_fwd_f};
      double* bwd_f[] = {&k.pre_bwd_f, &k.exp_bwd_f, &k.post_bwd_f};
      double* wg_f[] = {&k.pre_w_f, &k.exp_w_f, &k.post_w_f};
      *fwd_f[part] += ops[j].fwd_flops;
      *bwd_f[part] += ops[j].bwd_flops;
      *wg_f[part] += gemm ? 0.5 * ops[j].bwd_flops : 0.0;
    }
  }
}

// The priced step, arranged for scheduling: each layer's compute split around
// its routed experts, and the calls Predictor::price priced.
Costs gather_costs(const Predictor& p, const Layout& l, const StepPrice& price, const StepGraphOptions& o) {
  Costs c;
  c.step = price.prediction.breakdown;
  for (size_t i = 0; i < price.layers.size(); ++i) {
    const LayerTiming& t = price.layers[i];
    const LayerCollectives& x = price.collectives[i];
    LayerCost k;
    k.t = t;
    k.ep = t.ep_dispatch_s > 0 || t.ep_combine_s > 0;
    k.gather = x.fsdp_gather;
    k.reduce_scatter = x.grad_reduce_scatter;
    k.dispatch = x.ep_dispatch;
    k.combine = x.ep_combine;
    k.tp = x.tp;
    k.cp_fwd = x.cp;
    k.cp_bwd = x.cp.scaled(2.0);  // KV forward and dKV back
    k.grad_sync = {x.grad_sync_dense, x.grad_sync_expert};
    c.layers.push_back(k);
  }
  split_layers(p, price.ops, c);
  const StepCollectives& sc = price.step_collectives;
  c.edge_sync = sc.edge_grad_sync;
  c.replicated_sync = sc.replicated_grad_sync;
  c.ns_gather = sc.muon_gather;
  c.ns_redistribute = sc.muon_redistribute;
  c.send = sc.pp_send;
  c.kept_weights = l.zero_stage >= 3 && l.keep_gathered_weights;
  const bool pooled = l.ep_transport == Transport::pooled;
  c.waves = pooled ? std::max<int64_t>(1, l.waves) : 1;
  c.ep_overlap_eff = pooled ? p.calibration().ep_wave_overlap_eff : 1.0;
  c.bucket_layers = p.calibration().grad_sync_bucket_layers;
  if (o.checkpoint_every > 0) {
    const GoodputConfig g = default_goodput_config();
    const double total = p.table().total_params * g.checkpoint_bytes_per_param;
    c.checkpoint_bytes_per_gpu = total / static_cast<double>(l.gpus());
    c.checkpoint_blocking = g.checkpoint_blocking_fraction;
    c.storage_bw = g.checkpoint_write_bytes_per_s;
  }
  return c;
}

// A factor as a user wrote it: "0.5", "inf", not std::to_string's "0.500000".
std::string factor(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", v);
  return b;
}

std::string num(const char* prefix, int64_t v) {
  std::string s(prefix);  // appended, not operator+: GCC 12 warns (-Wrestrict) on the temporary
  s += std::to_string(v);
  return s;
}

using Pass = PipelinePass;
using Slot = PipelineSlot;

// ------------------------------------------------------------ the graph

// One representative GPU: its streams and links.
struct Rank {
  int process = -1;
  int64_t nic_via = -1;  // a failed NIC: the rank whose NIC carries this one's traffic
  ResourceId compute, ag, rs, ep, ep2, tp, cp, pp_send, pp_recv, dp, copy, host, ckpt;
  ResourceId nvlink, nic;  // shared by every stream (contention on)
};

// kSpine: NIC traffic that also leaves its scalable unit.
enum class Tier { kNvlink, kNic, kSpine };

class Builder {
 public:
  // chunks: model chunks per stage; lpc: layers per model chunk.
  Builder(Engine& e, const Costs& c, const Layout& l, const topologies::Cluster& cl, const StepGraphOptions& o,
          int64_t stages, int64_t chunks, int64_t lpc, int64_t micro_batches)
      : e_(e), c_(c), l_(l), cl_(cl), o_(o), stages_(stages), v_(chunks), lpc_(lpc), m_(micro_batches) {
    v_shape_ = l.schedule == PpSchedule::kDualPipeV && l.pp > 1;
    spine_fraction_ = 1.0 / std::max(1.0, cl.system.scale_out.spine_oversubscription);
  }

  // Representative ranks, stage-major; the shared fabric and storage.
  void add_ranks(int64_t ranks_per_stage, int64_t multiplicity) {
    n_ = ranks_per_stage;
    const auto& sys = cl_.system;
    nvlink_bw_ = std::max(sys.domain.link_bw_bytes_per_s, sys.domain.link_bw_measured_bytes_per_s);
    nic_bw_ = sys.scale_out.nic_bw_bytes_per_s;
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
        k.ep2 = stream("ep_all_to_all_2", ResourceKind::kCommStream);
        k.tp = stream("tp", ResourceKind::kCommStream);
        k.cp = stream("cp_ring", ResourceKind::kCommStream);
        k.pp_send = stream("pp_send", ResourceKind::kCommStream);
        // Receives wait only for their sender, never for each other.
        k.pp_recv = e_.add_resource(k.process, "pp_recv", ResourceKind::kCommStream, 0, Order::kReadyOrder, 1 << 20);
        k.dp = stream("grad_sync", ResourceKind::kCommStream);
        k.copy = stream("host_copy", ResourceKind::kCopyEngine);
        k.host = e_.add_resource(k.process, "host_cpu", ResourceKind::kHostCpu, 0, Order::kReadyOrder, 1);
        k.ckpt = stream("checkpoint", ResourceKind::kCopyEngine);
        if (nvlink_bw_ > 0) k.nvlink = e_.add_resource(k.process, "nvlink_port", ResourceKind::kNvlinkPort, nvlink_bw_);
        if (nic_bw_ > 0) k.nic = e_.add_resource(k.process, "nic", ResourceKind::kNic, nic_bw_);
        ranks_.push_back(k);
      }
    }
    for (int64_t f : o_.failed_nics) {
      if (f < 0 || f >= static_cast<int64_t>(ranks_.size())) {
        throw ValueError("timeline", "failed_nics", "a rank in 0.." + std::to_string(ranks_.size() - 1),
                         std::to_string(f));
      }
      if (n_ < 2 || !(nic_bw_ > 0) || !(nvlink_bw_ > 0)) {
        throw ValueError("timeline", "failed_nics",
                         "a step of at least 2 explicit ranks per stage on a cluster with NICs and NVLink",
                         n_ < 2 ? std::to_string(n_) + " explicit rank per stage" : "a cluster without NICs or NVLink");
      }
      const int64_t s = f / n_, r = f % n_;
      ranks_[static_cast<size_t>(f)].nic_via = s * n_ + (r + 1) % n_;
    }
    gate_.assign(ranks_.size(), TaskId{});
    pending_sync_.assign(static_cast<size_t>(stages_), {});
    if (nic_bw_ > 0 && cl_.domains > 1 && o_.contention) {
      // The scale-out fabric as one shared link. Non-blocking, it carries
      // every NIC at full rate: every flow on it also crosses a NIC, and the
      // NICs add up to its capacity, so it never binds. It is then left out:
      // a link every flow shares would join all flows into one max-min
      // component, and rebalancing that per flow event costs GPUs^2.
      const int f = e_.add_process("fabric");
      if (o_.fabric_oversubscription > 1.0) {
        fabric_ = e_.add_resource(f, "scale_out_fabric", ResourceKind::kFabricLink,
                                  static_cast<double>(cl_.gpus()) * nic_bw_ / o_.fabric_oversubscription);
      }
      // Between scalable units: the spine carries 1/oversubscription of the
      // NICs below it (topology's spine_oversubscription, as the predictor).
      const int64_t unit = cl_.system.scale_out.domains_per_unit;
      if (unit > 0 && cl_.domains > unit && spine_fraction_ < 1.0) {
        spine_ = e_.add_resource(f, "spine", ResourceKind::kFabricLink,
                                 static_cast<double>(cl_.gpus()) * nic_bw_ * spine_fraction_);
      }
    }
    if (c_.checkpoint_bytes_per_gpu > 0) {
      const int st = e_.add_process("storage");
      storage_ = e_.add_resource(st, "checkpoint_storage", ResourceKind::kFabricLink, c_.storage_bw);
    }
  }

  // One step: every stage runs its schedule in order on its compute stream,
  // then the per-step tail.
  TaskId step(int64_t index, bool gc) {
    step_ = index;
    const size_t slots = static_cast<size_t>(chunks_total() * m_ * n_);
    recv_fwd_.assign(slots, {});
    recv_bwd_.assign(slots, {});
    last_fwd_.assign(slots, {});
    last_bwd_.assign(slots, {});
    for (int64_t s = 0; s < stages_; ++s) {
      for (const Slot& x : schedule(s)) {
        switch (x.pass) {
          case Pass::kForward: forward(s, x.chunk, x.mb); break;
          case Pass::kBackward: backward(s, x.chunk, x.mb, false); break;
          case Pass::kInputGrad: backward(s, x.chunk, x.mb, true); break;
          case Pass::kWeightGrad: weight_grad(s, x.chunk, x.mb); break;
        }
      }
    }
    link_stages();
    return tail(gc);
  }

 private:
  std::vector<Slot> schedule(int64_t s) const {
    if (stages_ == 1) return pipeline_order(PpSchedule::k1F1B, 1, 1, m_, 0);
    return pipeline_order(l_.schedule, stages_, v_, m_, s);
  }

  Rank& rank(int64_t s, int64_t r) { return ranks_[static_cast<size_t>(s * n_ + r)]; }
  int64_t chunks_total() const { return stages_ * v_; }
  // Model chunk q holds layers [q lpc, (q + 1) lpc); q = 0 embeds, the last one has the head.
  int64_t model_chunk(int64_t s, int64_t c) const {
    return pipeline_model_chunk(v_shape_ ? PpSchedule::kDualPipeV : PpSchedule::k1F1B, stages_, s, c);
  }
  int64_t stage_of(int64_t q) const {
    if (v_shape_) return q < stages_ ? q : 2 * stages_ - 1 - q;
    return q % stages_;
  }
  size_t slot(int64_t q, int64_t mb, int64_t r) const { return static_cast<size_t>((q * m_ + mb) * n_ + r); }

  TaskId task(ResourceId on, std::string name, const char* cat, double d, TaskId after) {
    TaskId t = e_.add_compute(on, std::move(name), cat, d);
    // Stream order already makes a task wait for its stream predecessor.
    if (after.valid() && e_.stream_predecessor(t).v != after.v) e_.add_dependency(after, t);
    return t;
  }

  // The links a flow of `tier` from this stream crosses. Without contention
  // every (stream, tier) gets links of its own.
  std::vector<ResourceId> links(Rank& k, ResourceId stream, Tier tier) {
    const bool nv = tier == Tier::kNvlink;
    if (o_.contention) {
      if (!nv && k.nic_via >= 0) {
        // Over NVLink to a neighbour, out through its NIC.
        std::vector<ResourceId> out{k.nvlink, ranks_[static_cast<size_t>(k.nic_via)].nic};
        if (fabric_.valid()) out.push_back(fabric_);
        if (tier == Tier::kSpine && spine_.valid()) out.push_back(spine_);
        return out;
      }
      std::vector<ResourceId> out{nv ? k.nvlink : k.nic};
      if (!nv && fabric_.valid()) out.push_back(fabric_);
      if (tier == Tier::kSpine && spine_.valid()) out.push_back(spine_);
      return out;
    }
    const auto key = std::make_pair(stream.v, static_cast<int>(tier));
    auto it = private_.find(key);
    if (it == private_.end()) {
      const std::string name = e_.resource_name(stream) + (nv ? ".nvlink" : tier == Tier::kSpine ? ".spine" : ".nic");
      it = private_.emplace(key, e_.add_resource(k.process, name, nv ? ResourceKind::kNvlinkPort : ResourceKind::kNic,
                                                 nv ? nvlink_bw_ : nic_bw_)).first;
    }
    return {it->second};
  }

  // One rank's part of a call: latency, then the tiers' flows together (the
  // first holds the stream; the others stream beside it and the stream waits
  // for all of them). Its tasks that wait for the call's inputs go to `starts`;
  // the task that ends the part is returned.
  TaskId comm_part(Rank& k, ResourceId stream, const std::string& name, const char* cat, const Comm& c,
                   std::vector<TaskId>& starts) {
    struct Flow {
      const char* suffix;
      double bytes;
      Tier tier;
    };
    Flow flows[3];
    size_t nflows = 0;
    if (c.bw_s > 0 && nvlink_bw_ > 0 && c.nvlink_bytes > 0) flows[nflows++] = {"", c.nvlink_bytes, Tier::kNvlink};
    if (c.bw_s > 0 && nic_bw_ > 0 && c.nic_bytes > c.spine_bytes) {
      flows[nflows++] = {".nic", c.nic_bytes - c.spine_bytes, Tier::kNic};
    }
    if (c.bw_s > 0 && nic_bw_ > 0 && c.spine_bytes > 0) flows[nflows++] = {".spine", c.spine_bytes, Tier::kSpine};
    const size_t first = starts.size();
    for (size_t i = 0; i < nflows || i == 0; ++i) {
      TaskSpec t;
      t.category = cat;
      if (i == 0) t.on = stream;
      t.duration_s = nflows == 0 ? c.time_s() : c.latency_s;
      t.name = name + (i == 0 || nflows == 0 ? "" : flows[i].suffix);
      if (nflows > 0) {
        t.bytes = flows[i].bytes;
        t.links = links(k, stream, flows[i].tier);
        t.max_rate_bytes_per_s = t.bytes / c.bw_s;
      }
      starts.push_back(e_.add_task(std::move(t)));
    }
    if (starts.size() - first == 1) return starts[first];
    TaskId join = task(stream, name + ".join", cat, 0.0, starts[first]);
    for (size_t i = first + 1; i < starts.size(); ++i) e_.add_dependency(starts[i], join);
    return join;
  }

  // A collective over one stage's ranks: each rank's part starts once every
  // rank is ready (so a late rank holds up everyone): one barrier between the
  // ranks' inputs and every part (Engine::add_dependencies, linear in ranks).
  // It also ends together (a ring or an all-to-all is done on any rank only
  // when every rank's share has moved: a slow link holds up all), unless
  // sync_end is false (point-to-point sends of independent pipelines).
  // Zero time: nothing.
  void collective(int64_t s, ResourceId Rank::*stream, const std::string& name, const char* cat, const Comm& c,
                  std::vector<TaskId>& prev, const std::vector<TaskId>& extra = {}, bool sync_end = true) {
    if (c.time_s() <= 0) return;
    std::vector<TaskId> deps;
    deps.reserve(prev.size() + extra.size());
    for (TaskId d : prev) {
      if (d.valid()) deps.push_back(d);
    }
    for (TaskId d : extra) {
      if (d.valid()) deps.push_back(d);
    }
    std::vector<TaskId> starts;
    starts.reserve(static_cast<size_t>(3 * n_));
    for (int64_t r = 0; r < n_; ++r) prev[r] = comm_part(rank(s, r), rank(s, r).*stream, name, cat, c, starts);
    e_.add_dependencies(deps, starts);
    if (!sync_end || n_ == 1) return;
    const std::vector<TaskId> parts = prev;
    for (int64_t r = 0; r < n_; ++r) prev[r] = e_.add_compute(rank(s, r).*stream, name + ".done", cat, 0.0);
    e_.add_dependencies(parts, prev);
  }

  void compute(int64_t s, const std::string& name, const char* cat, double d, std::vector<TaskId>& prev,
               double flops = 0) {
    for (int64_t r = 0; r < n_; ++r) {
      prev[r] = task(rank(s, r).compute, name, cat, d, prev[r]);
      e_.set_task_flops(prev[r], flops);
    }
  }

  void join(std::vector<TaskId>& prev, const std::vector<TaskId>& other) {
    for (int64_t r = 0; r < n_; ++r) {
      if (other[r].valid() && prev[r].valid()) e_.add_dependency(other[r], prev[r]);
    }
  }

  // FSDP gather of `layer`'s parameters, allowed to start once `window` (the
  // compute two layers back, or the previous step's end) is done.
  std::vector<TaskId> gather(int64_t s, int64_t layer, const std::string& tag, const std::vector<TaskId>& window) {
    const Comm& c = c_.layers[layer].gather;
    if (c.time_s() <= 0) return std::vector<TaskId>(n_);
    std::vector<TaskId> g = window;
    collective(s, &Rank::ag, num("L", layer) + "." + tag + ".allgather", "fsdp_allgather", c, g);
    return g;
  }

  // The routed experts of one pass: W waves of (first all-to-all, expert GEMMs,
  // second all-to-all). First transfers share one stream, second ones another,
  // so wave i's dispatch overlaps wave i-1's GEMMs and wave i's combine wave
  // i+1's. Overlapped transfers take SMs from the GEMMs: each overlapped wave's
  // GEMMs lose (1 - overlap efficiency) of the overlapped time (calibration).
  void experts(int64_t s, int64_t layer, const std::string& tag, double expert_s, double expert_f, bool backward,
               const char* cat, std::vector<TaskId>& prev) {
    const LayerCost& k = c_.layers[layer];
    const double w = static_cast<double>(c_.waves);
    const Comm first = (backward ? k.combine : k.dispatch).scaled(1.0 / w);
    const Comm second = (backward ? k.dispatch : k.combine).scaled(1.0 / w);
    const char* c1 = backward ? "ep_combine" : "ep_dispatch";
    const char* c2 = backward ? "ep_dispatch" : "ep_combine";
    const std::string base = num("L", layer) + "." + tag;
    const std::vector<TaskId> start = prev;
    const double gemm_s = expert_s / w;
    const double comm_s = first.time_s() + second.time_s();
    for (int64_t i = 0; i < c_.waves; ++i) {
      const std::string wave = c_.waves > 1 ? num(".w", i) : std::string();
      std::vector<TaskId> x = start;
      collective(s, &Rank::ep, base + wave + (backward ? ".combine_grad" : ".dispatch"), c1, first, x);
      const double penalty = i > 0 ? (1.0 - c_.ep_overlap_eff) * std::min(gemm_s, comm_s) : 0.0;
      for (int64_t r = 0; r < n_; ++r) {
        TaskId after = x[r].valid() ? x[r] : start[r];
        x[r] = task(rank(s, r).compute, base + wave + ".experts", cat, gemm_s * load(r) + penalty, after);
        e_.set_task_flops(x[r], expert_f / w * load(r));
      }
      collective(s, &Rank::ep2, base + wave + (backward ? ".dispatch_grad" : ".combine"), c2, second, x);
      prev = x;
    }
  }

  // Routed-expert load of rank r (StepGraphOptions::expert_load).
  double load(int64_t r) const {
    if (o_.expert_load.empty()) return 1.0;
    return o_.expert_load[static_cast<size_t>(r) % o_.expert_load.size()];
  }

  // TP passes are exposed; a CP ring pass runs beside the layer's compute.
  void tp_cp(int64_t s, int64_t layer, const std::string& tag, const char* cat, const Comm& cp,
             std::vector<TaskId> before, std::vector<TaskId>& prev) {
    const LayerCost& k = c_.layers[layer];
    collective(s, &Rank::tp, num("L", layer) + "." + tag + ".tp", "tp", k.tp, prev);
    if (cp.time_s() <= 0) return;
    collective(s, &Rank::cp, num("L", layer) + "." + tag + ".cp_ring", "cp_ring", cp, before);
    compute(s, num("L", layer) + "." + tag + ".join", cat, 0.0, prev);
    join(prev, before);
  }

  // A forward-shaped pass of one layer (forward, or the full recompute's replay).
  void layer_forward(int64_t s, int64_t layer, const std::string& tag, const char* cat,
                     const std::vector<TaskId>& g, std::vector<TaskId>& prev) {
    const LayerCost& k = c_.layers[layer];
    const std::vector<TaskId> before = prev;
    const std::string name = num("L", layer) + "." + tag;
    if (!k.ep) {
      compute(s, name, cat, k.t.fwd_s, prev, k.fwd_f());
      join(prev, g);
    } else {
      compute(s, name + ".pre", cat, k.pre_fwd, prev, k.pre_fwd_f);
      join(prev, g);
      experts(s, layer, tag, k.exp_fwd, k.exp_fwd_f, false, cat, prev);
      compute(s, name + ".post", cat, k.post_fwd, prev, k.post_fwd_f);
    }
    tp_cp(s, layer, tag, cat, k.cp_fwd, before, prev);
  }

  // Backward of one layer; input_only: the weight-gradient GEMMs are left to a W pass.
  void layer_backward(int64_t s, int64_t layer, const std::string& tag, bool input_only,
                      const std::vector<TaskId>& g, std::vector<TaskId>& prev) {
    const LayerCost& k = c_.layers[layer];
    const std::vector<TaskId> before = prev;
    const std::string name = num("L", layer) + "." + tag;
    const double leave_w = input_only ? 1.0 : 0.0;  // the W pass runs these later
    if (!k.ep) {
      compute(s, name, "backward", k.t.bwd_s - leave_w * k.w_s(), prev, k.bwd_f() - leave_w * k.w_f());
      join(prev, g);
    } else {
      compute(s, name + ".post", "backward", k.post_bwd - leave_w * k.post_w, prev,
              k.post_bwd_f - leave_w * k.post_w_f);
      join(prev, g);
      experts(s, layer, tag, k.exp_bwd - leave_w * k.exp_w, k.exp_bwd_f - leave_w * k.exp_w_f, true, "backward", prev);
      compute(s, name + ".pre", "backward", k.pre_bwd - leave_w * k.pre_w, prev, k.pre_bwd_f - leave_w * k.pre_w_f);
    }
    tp_cp(s, layer, tag, "backward", k.cp_bwd, before, prev);
  }

  std::vector<TaskId> stage_gate(int64_t s) {
    return std::vector<TaskId>(gate_.begin() + s * n_, gate_.begin() + (s + 1) * n_);
  }

  std::string pass_tag(int64_t c, int64_t mb, const char* what) const {
    return num("mb", mb) + (v_ > 1 ? num(".c", c) : std::string()) + what;
  }

  // Sends across a stage boundary (nothing when both chunks sit on this stage).
  void send(int64_t s, int64_t to_q, const std::string& tag, std::vector<TaskId>& prev) {
    if (stage_of(to_q) == s) return;
    collective(s, &Rank::pp_send, tag + ".send", "pp_send", c_.send, prev, {}, false);
  }

  void forward(int64_t s, int64_t c, int64_t mb) {
    const int64_t q = model_chunk(s, c);
    const std::string tag = pass_tag(c, mb, ".fwd");
    std::vector<TaskId> prev(n_);
    for (int64_t r = 0; r < n_; ++r) {
      if (q > 0) {
        prev[r] = task(rank(s, r).pp_recv, tag + ".recv", "pp_recv", 0.0, {});
        recv_fwd_[slot(q, mb, r)] = prev[r];
      } else {
        prev[r] = gate_[s * n_ + r];
      }
    }
    if (q == 0) compute(s, "embed." + tag, "forward", c_.pre_fwd_s, prev, c_.pre_fwd_f);
    std::vector<std::vector<TaskId>> done;
    for (int64_t i = 0; i < lpc_; ++i) {
      const int64_t layer = q * lpc_ + i;
      std::vector<TaskId> window = i >= 2 ? done[i - 2] : stage_gate(s);
      // Kept gathered weights: the step's first micro-batch gathers them; later
      // passes find them in memory (and follow it on the compute stream).
      std::vector<TaskId> g = c_.kept_weights && mb > 0 ? std::vector<TaskId>(n_) : gather(s, layer, tag, window);
      layer_forward(s, layer, tag, "forward", g, prev);
      done.push_back(prev);
    }
    if (q == chunks_total() - 1) compute(s, "head." + tag, "forward", c_.head_fwd_s, prev, c_.head_fwd_f);
    if (q < chunks_total() - 1) send(s, q + 1, tag, prev);
    for (int64_t r = 0; r < n_; ++r) last_fwd_[slot(q, mb, r)] = prev[r];
  }

  void backward(int64_t s, int64_t c, int64_t mb, bool input_only) {
    const int64_t q = model_chunk(s, c);
    const std::string tag = pass_tag(c, mb, input_only ? ".bwd_input" : ".bwd");
    std::vector<TaskId> prev(n_);
    if (q < chunks_total() - 1) {
      for (int64_t r = 0; r < n_; ++r) {
        prev[r] = task(rank(s, r).pp_recv, tag + ".recv", "pp_recv", 0.0, {});
        recv_bwd_[slot(q, mb, r)] = prev[r];
      }
    } else {
      for (int64_t r = 0; r < n_; ++r) prev[r] = last_fwd_[slot(q, mb, r)];
      compute(s, "head." + tag, "backward", c_.head_bwd_s, prev, c_.head_bwd_f);
      if (mb == m_ - 1 && c_.bucket_layers > 0) {
        std::vector<TaskId> head = prev;
        collective(s, &Rank::dp, "head.grad_sync", "grad_sync", c_.edge_sync, head);
      }
    }
    // A backward on this stage also needs this stage's own forward of the chunk.
    for (int64_t r = 0; r < n_; ++r) {
      const TaskId f = last_fwd_[slot(q, mb, r)];
      if (f.valid() && prev[r].valid() && f.v != prev[r].v) e_.add_dependency(f, prev[r]);
    }
    const bool full = l_.recompute == models::Recompute::kFull;
    std::vector<std::vector<TaskId>> done;
    for (int64_t i = lpc_ - 1; i >= 0; --i) {
      const int64_t layer = q * lpc_ + i;
      const int64_t k = lpc_ - 1 - i;  // position in backward order
      std::vector<TaskId> window = k >= 2 ? done[k - 2] : prev;
      std::vector<TaskId> g = c_.kept_weights ? std::vector<TaskId>(n_) : gather(s, layer, tag, window);
      const LayerCost& t = c_.layers[layer];
      if (full) {
        layer_forward(s, layer, tag + ".recompute", "recompute", g, prev);
      } else if (t.t.recompute_s > 0) {
        compute(s, num("L", layer) + "." + tag + ".recompute", "recompute", t.t.recompute_s, prev);
        join(prev, g);
      }
      layer_backward(s, layer, tag, input_only, g, prev);
      if (!input_only) reduce_scatter(s, layer, tag, mb, prev);
      done.push_back(prev);
    }
    if (q == 0) compute(s, "embed." + tag, "backward", c_.pre_bwd_s, prev, c_.pre_bwd_f);
    if (q > 0) send(s, q - 1, tag, prev);
    for (int64_t r = 0; r < n_; ++r) last_bwd_[slot(q, mb, r)] = prev[r];
  }

  // A layer's gradient reduce-scatter; after the step's last micro-batch, the
  // reduction across replicas follows on the gradient stream.
  void reduce_scatter(int64_t s, int64_t layer, const std::string& tag, int64_t mb, const std::vector<TaskId>& ready) {
    std::vector<TaskId> grads = ready;
    collective(s, &Rank::rs, num("L", layer) + "." + tag + ".reduce_scatter", "fsdp_reduce_scatter",
               c_.layers[layer].reduce_scatter, grads);
    if (mb != m_ - 1) return;
    auto& pending = pending_sync_[static_cast<size_t>(s)];
    pending.push_back(layer);
    if (c_.bucket_layers > 0 && static_cast<int64_t>(pending.size()) >= c_.bucket_layers) sync_gradients(s, grads);
  }

  // The cross-replica all-reduces of the layers whose gradients wait, in one
  // bucket after `ready` (the stream keeps buckets in order).
  void sync_gradients(int64_t s, std::vector<TaskId> ready, const std::vector<TaskId>& also = {}) {
    auto& pending = pending_sync_[static_cast<size_t>(s)];
    for (int64_t layer : pending) {
      for (const Comm& c : c_.layers[layer].grad_sync) {
        collective(s, &Rank::dp, num("L", layer) + ".grad_sync", "grad_sync", c, ready, also);
      }
    }
    pending.clear();
  }

  // Zero-bubble W: the weight-gradient GEMMs of a chunk, after its B, then each
  // layer's gradient reduce-scatter.
  void weight_grad(int64_t s, int64_t c, int64_t mb) {
    const int64_t q = model_chunk(s, c);
    const std::string tag = pass_tag(c, mb, ".bwd_weight");
    std::vector<TaskId> prev(n_);
    for (int64_t r = 0; r < n_; ++r) prev[r] = last_bwd_[slot(q, mb, r)];
    for (int64_t i = lpc_ - 1; i >= 0; --i) {
      const int64_t layer = q * lpc_ + i;
      compute(s, num("L", layer) + "." + tag, "backward", c_.layers[layer].w_s(), prev, c_.layers[layer].w_f());
      reduce_scatter(s, layer, tag, mb, prev);
    }
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
  // up the gradient reduction across replicas; then the optimizer and, on a
  // checkpoint step, the save.
  TaskId tail(bool gc) {
    TaskId end;
    const bool save = o_.checkpoint_every > 0 && storage_.valid() && (step_ + 1) % o_.checkpoint_every == 0;
    for (int64_t s = 0; s < stages_; ++s) {
      std::vector<TaskId> ready(n_), comm_done(n_);
      for (int64_t r = 0; r < n_; ++r) {
        Rank& k = rank(s, r);
        // Zero-time markers: "everything on this stream so far is done".
        ready[r] = task(k.compute, num("step", step_) + ".backward_done", "backward", 0.0, {});
        comm_done[r] = task(k.rs, num("step", step_) + ".reduce_scatter_done", "fsdp_reduce_scatter", 0.0, {});
      }
      // One bucket after the backward (bucket_layers 0), or the last partial one.
      if (c_.bucket_layers <= 0 && s == 0) {
        std::vector<TaskId> head = comm_done;
        collective(s, &Rank::dp, num("step", step_) + ".head_grad_sync", "grad_sync", c_.edge_sync, head, ready);
      }
      sync_gradients(s, comm_done, ready);
      for (int64_t r = 0; r < n_; ++r) {
        comm_done[r] = task(rank(s, r).dp, num("step", step_) + ".grad_sync_done", "grad_sync", 0.0, comm_done[r]);
      }
      for (int64_t r = 0; r < n_; ++r) {
        ready[r] = task(rank(s, r).compute, num("step", step_) + ".gradients_reduced", "backward", 0.0, ready[r]);
        e_.add_dependency(comm_done[r], ready[r]);
      }
      // The host pauses once its GPU work is drained (it launches nothing
      // meanwhile); the next sync point waits for the paused rank.
      const double stall = gc ? c_.step.host_stall_s : 0.0;
      if (stall > 0) {
        const int64_t who = step_ % n_;
        ready[who] = task(rank(s, who).host, num("step", step_) + ".gc_pause", "gc_stall", stall, ready[who]);
      }
      // The embedding's gradients come last.
      collective(s, &Rank::dp, num("step", step_) + ".embedding_grad_sync", "grad_sync", c_.replicated_sync, ready);
      barrier(s, ready);
      // Muon: gather the shards of each matrix to its owner, Newton–Schulz and
      // the element-wise updates, send the orthogonalised result back.
      collective(s, &Rank::dp, num("step", step_) + ".newton_schulz_gather", "optimizer_comm", c_.ns_gather, ready);
      compute(s, num("step", step_) + ".optimizer", "optimizer", c_.step.optimizer_compute_s, ready);
      collective(s, &Rank::dp, num("step", step_) + ".newton_schulz_redistribute", "optimizer_comm",
                 c_.ns_redistribute, ready);
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
      if (save) checkpoint(s, ready);
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

  // Each rank of a stage continues once every rank is here.
  void barrier(int64_t s, std::vector<TaskId>& ready) {
    if (n_ == 1) return;
    std::vector<TaskId> all;
    for (TaskId t : ready) {
      if (t.valid()) all.push_back(t);
    }
    for (int64_t r = 0; r < n_; ++r) ready[r] = task(rank(s, r).compute, num("step", step_) + ".sync", "optimizer", 0.0, {});
    e_.add_dependencies(all, ready);
  }

  // Every GPU writes its shard to shared storage; the blocking share holds up
  // the next step, the rest drains behind it.
  void checkpoint(int64_t s, std::vector<TaskId>& ready) {
    const double bytes = c_.checkpoint_bytes_per_gpu;
    const double blocking = std::clamp(c_.checkpoint_blocking, 0.0, 1.0);
    for (int64_t r = 0; r < n_; ++r) {
      Rank& k = rank(s, r);
      auto save = [&](const char* what, double b) {
        return e_.add_transfer(num("step", step_) + what, "checkpoint", {storage_}, b, k.ckpt);
      };
      if (blocking > 0) {
        TaskId t = save(".checkpoint_save", bytes * blocking);
        e_.add_dependency(ready[r], t);
        ready[r] = t;
      }
      if (blocking < 1) e_.add_dependency(ready[r], save(".checkpoint_save_async", bytes * (1.0 - blocking)));
    }
  }

  Engine& e_;
  const Costs& c_;
  const Layout& l_;
  const topologies::Cluster& cl_;
  const StepGraphOptions& o_;
  int64_t stages_, v_, lpc_, m_, n_ = 1, step_ = 0;
  bool v_shape_ = false;
  double nvlink_bw_ = 0, nic_bw_ = 0;
  double spine_fraction_ = 1.0;
  ResourceId fabric_, spine_, storage_;
  std::map<std::pair<int32_t, int>, ResourceId> private_;  // (stream, tier) -> its own link
  std::vector<Rank> ranks_;
  std::vector<TaskId> gate_;  // per rank: previous step's end
  std::vector<std::vector<int64_t>> pending_sync_;  // per stage: layers whose gradients wait for a bucket
  // Per (model chunk, micro-batch, rank): receive tasks and last tasks of each pass.
  std::vector<TaskId> recv_fwd_, recv_bwd_, last_fwd_, last_bwd_;
};

// Schedules that cannot run with these micro-batches or layers, in one line.
void check_schedule(const Layout& l, int64_t layers, int64_t m) {
  if (l.pp <= 1) return;
  const std::string p = std::to_string(l.pp), mb = std::to_string(m);
  switch (l.schedule) {
    case PpSchedule::kInterleaved1F1B:
      if (m % l.pp != 0) {
        throw UserError("timeline: interleaved 1F1B needs micro-batches (" + mb + ") to be a multiple of pp (" + p + ")");
      }
      return;
    case PpSchedule::kDualPipeV:
      if (l.pp_virtual > 2) {
        throw UserError("timeline: dualpipev places 2 model chunks per stage (V shape), found pp_virtual " +
                        std::to_string(l.pp_virtual));
      }
      if (layers % (2 * l.pp) != 0) {
        throw UserError("timeline: dualpipev needs 2 x pp (" + std::to_string(2 * l.pp) + ") to divide the " +
                        std::to_string(layers) + " layers");
      }
      if (m < 2 * l.pp) {
        throw UserError("timeline: dualpipev needs at least 2 x pp (" + std::to_string(2 * l.pp) +
                        ") micro-batches, found " + mb);
      }
      return;
    case PpSchedule::kZeroBubble:
      if (l.pp_virtual > 1) throw UserError("timeline: zero_bubble (ZB-H1) takes one model chunk per stage");
      return;
    case PpSchedule::k1F1B: return;
  }
}

}  // namespace

StepGraph build_step_graph(const Predictor& p, const Layout& l, const StepGraphOptions& o) {
  StepGraph sg;
  const StepPrice price = p.price(l);
  sg.prediction = price.prediction;
  if (!sg.prediction.valid) {
    std::string why;
    for (const auto& i : sg.prediction.issues) why += (why.empty() ? "" : "; ") + i.detail;
    throw UserError("timeline: layout '" + l.name + "' is invalid: " + why);
  }
  if (o.steps < 1) throw ValueError("timeline", "steps", "at least 1", std::to_string(o.steps));
  if (o.ranks_per_stage < 1) {
    throw ValueError("timeline", "ranks_per_stage", "at least 1", std::to_string(o.ranks_per_stage));
  }
  if (!(o.fabric_oversubscription >= 1.0)) {
    throw ValueError("timeline", "fabric_oversubscription", "at least 1", factor(o.fabric_oversubscription));
  }
  if (o.checkpoint_every < 0) {
    throw ValueError("timeline", "checkpoint_every", "0 (none) or more", std::to_string(o.checkpoint_every));
  }
  for (double f : o.expert_load) {
    if (!(f > 0) || !std::isfinite(f)) {
      throw ValueError("timeline", "expert_load", "factors finite and > 0", factor(f));
    }
  }
  const int64_t per_stage = l.gpus() / l.pp;
  if (per_stage % o.ranks_per_stage != 0) {
    throw ValueError("timeline", "ranks_per_stage", "a divisor of the " + std::to_string(per_stage) + " GPUs of a stage",
                     std::to_string(o.ranks_per_stage));
  }
  const Costs costs = gather_costs(p, l, price, o);
  const int64_t layers = static_cast<int64_t>(costs.layers.size());
  sg.stages = l.pp;
  sg.micro_batches = std::max<int64_t>(1, std::llround(sg.prediction.micro_batches));
  check_schedule(l, layers, sg.micro_batches);
  int64_t chunks = 1;
  if (l.pp > 1 && l.schedule == PpSchedule::kInterleaved1F1B) chunks = l.pp_virtual;
  if (l.pp > 1 && l.schedule == PpSchedule::kDualPipeV) chunks = 2;
  sg.layers_per_stage = layers / l.pp;
  sg.checkpoint_bytes = costs.checkpoint_bytes_per_gpu * static_cast<double>(l.gpus());
  Builder b(sg.engine, costs, l, p.cluster(), o, sg.stages, chunks, sg.layers_per_stage / chunks, sg.micro_batches);
  b.add_ranks(o.ranks_per_stage, per_stage / o.ranks_per_stage);
  for (int64_t s = 0; s < o.steps; ++s) sg.step_end.push_back(b.step(s, o.gc_stalls));
  return sg;
}

}  // namespace rackstep::sim
