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
#include "sim/cost.h"
#include "sim/goodput.h"
#include "sim/memory.h"

namespace rackstep::sim {

namespace {

// One collective call as the engine runs it (priced by Predictor::price).
using Comm = CommCost;

// ------------------------------------------------------------ costs

// One op as the host of an eager trainer issues it (Costs::host_issue): its
// device seconds per pass, hardware FLOPs, and host seconds to issue it
// (OpTiming; zero-bubble W: half a GEMM's backward, and half its issue).
struct Kernel {
  std::string name;                  // the layer-graph op's name
  double fwd_s = 0, bwd_s = 0, w_s = 0;
  double fwd_f = 0, bwd_f = 0, w_f = 0;
  double fwd_host_s = 0, bwd_host_s = 0, w_host_s = 0;
  // A host sync inside it (OpTiming): the forward's device and host seconds before the
  // sync (0: none), and whether the backward waits for one before its own kernels.
  double fwd_before_sync_s = 0, fwd_host_before_sync_s = 0;
  bool bwd_after_sync = false;
};

// Which part of a pass a run of kernels is: forward (or a recompute's replay),
// backward, a zero-bubble backward's input-gradient part (B) or its weight-gradient part (W).
enum class Dir { kForward, kBackward, kInput, kWeight };

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
  Comm gather, reduce_scatter, dispatch, combine, tp, tp_replay, cp_fwd, cp_bwd;
  double tp_fwd_exposed = 0, tp_bwd_exposed = 0, tp_replay_exposed = 0;  // LayerCollectives::tp_*_exposed_s
  std::vector<Comm> grad_sync;  // all-reduces of this layer's gradients across replicas
  // The same three parts op by op, in layer order (only when the host issues ops).
  std::vector<Kernel> kernels[3];
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
  // An eager trainer's host issues every op (calibration host.op_issue_s > 0): kernels
  // wait for their issue; moe_sync: the host waits for the device once per MoE
  // layer forward, before the dispatch (host.moe_syncs_per_layer).
  bool host_issue = false, moe_sync = false;
  std::vector<Kernel> pre_kernels, head_kernels;
  // Megatron-Core's merged-1F1B EP overlap (Layout::ep_a2a_overlap): a steady-state
  // forward and backward run as one, their all-to-alls beside each other's compute,
  // which runs at sms / (sms - comm_sms) of its time while a call holds comm_sms SMs.
  bool merged_1f1b = false;
  double sms = 0, comm_sms = 0;
  double fsdp_comm_sms = 0;  // SMs an FSDP gather or reduce-scatter holds (calibration fsdp_collective_sms)
  StepBreakdown step;
  double checkpoint_bytes_per_gpu = 0, checkpoint_blocking = 1, storage_bw = 0;
};

// Splits each layer's op times around the dispatch and combine ops.
Kernel kernel_of(const models::Op& op, const OpTiming& t) {
  const bool gemm = op.op_class == models::OpClass::kGemm || op.op_class == models::OpClass::kGroupedGemm;
  const double w = gemm ? 0.5 : 0.0;
  return {op.name, t.fwd_s, t.bwd_s, w * t.bwd_s, t.fwd_flops, t.bwd_flops, w * t.bwd_flops,
          t.fwd_host_s, t.bwd_host_s, w * t.bwd_host_s, t.fwd_before_sync_s, t.fwd_host_before_sync_s,
          t.bwd_after_sync};
}

void split_layers(const Predictor& p, const std::vector<OpTiming>& ops, Costs& c) {
  const models::LayerGraph& g = p.graph();
  const size_t first_block = g.block_begin.empty() ? g.head_begin : g.block_begin.front();
  for (const OpTiming& o : ops) {
    if (o.layer >= 0) continue;
    if (c.host_issue && o.graph_index < first_block) c.pre_kernels.push_back(kernel_of(g.ops[o.graph_index], o));
    if (c.host_issue && o.graph_index >= g.head_begin) c.head_kernels.push_back(kernel_of(g.ops[o.graph_index], o));
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
      if (c.host_issue) k.kernels[part].push_back(kernel_of(op, ops[j]));
    }
  }
}

// The priced step, arranged for scheduling: each layer's compute split around
// its routed experts, and the calls Predictor::price priced.
Costs gather_costs(const Predictor& p, const Layout& l, const StepPrice& price, const StepGraphOptions& o) {
  Costs c;
  c.step = price.prediction.breakdown;
  const Calibration& cal = p.calibration();
  for (const OpTiming& t : price.ops) c.host_issue = c.host_issue || t.fwd_host_s > 0;
  // Only a dropless (ragged) dispatcher syncs the host, as predict charges it.
  c.moe_sync = c.host_issue && cal.moe_host_syncs_per_layer > 0 && l.ep_transport != Transport::pooled;
  c.merged_1f1b = l.ep_a2a_overlap;
  c.sms = static_cast<double>(p.cluster().system.gpu.sms);
  c.comm_sms = l.ep_dispatcher == EpDispatcher::kFlex ? cal.ep_flex_sms : cal.ep_all_to_all_sms;
  c.fsdp_comm_sms = cal.fsdp_collective_sms;
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
    k.tp_replay = x.tp_replay;
    k.tp_fwd_exposed = x.tp_fwd_exposed_s;
    k.tp_bwd_exposed = x.tp_bwd_exposed_s;
    k.tp_replay_exposed = x.tp_replay_exposed_s;
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
  ResourceId issue;        // the host thread that issues an eager trainer's kernels (Costs::host_issue)
  ResourceId nvlink, nic;  // shared by every stream (contention on)
};

// kSpine: NIC traffic that also leaves its scalable unit.
enum class Tier { kNvlink, kNic, kSpine };

class Builder {
 public:
  // chunks: model chunks per stage; first_layer: model chunk q holds layers
  // [first_layer[q], first_layer[q + 1]) (chunk_first_layers).
  Builder(Engine& e, const Costs& c, const Layout& l, const topologies::Cluster& cl, const StepGraphOptions& o,
          int64_t stages, int64_t chunks, std::vector<int64_t> first_layer, int64_t micro_batches)
      : e_(e), c_(c), l_(l), cl_(cl), o_(o), stages_(stages), v_(chunks), first_layer_(std::move(first_layer)),
        m_(micro_batches) {
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
        if (c_.host_issue) k.issue = stream("host_issue", ResourceKind::kHostCpu);
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
    issue_gate_.assign(ranks_.size(), TaskId{});
    last_issue_.assign(ranks_.size(), TaskId{});
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
    // The host issues a step's first kernel once the previous step has ended.
    if (c_.host_issue) issue_gate_ = gate_;
    for (int64_t s = 0; s < stages_; ++s) {
      const std::vector<Slot> order = schedule(s);
      for (size_t i = 0; i < order.size(); ++i) {
        const Slot& x = order[i];
        // Merged 1F1B: each steady-state forward with the backward that follows it.
        if (merges() && x.pass == Pass::kForward && i + 1 < order.size() && order[i + 1].pass == Pass::kBackward) {
          merged(s, x, order[i + 1]);
          ++i;
          continue;
        }
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
  // Whether forwards and backwards merge (Layout::ep_a2a_overlap): in Megatron-Core's
  // 1F1B and interleaved schedules, and without a pipeline.
  bool merges() const {
    return c_.merged_1f1b && (stages_ == 1 || l_.schedule == PpSchedule::k1F1B ||
                              l_.schedule == PpSchedule::kInterleaved1F1B);
  }

  // The stage's order; a merged schedule warms up with one more forward.
  std::vector<Slot> schedule(int64_t s) const {
    const int64_t extra = merges() ? 1 : 0;
    if (stages_ == 1) return pipeline_order(PpSchedule::k1F1B, 1, 1, m_, 0, extra);
    return pipeline_order(l_.schedule, stages_, v_, m_, s, extra);
  }

  Rank& rank(int64_t s, int64_t r) { return ranks_[static_cast<size_t>(s * n_ + r)]; }
  int64_t chunks_total() const { return stages_ * v_; }
  // Model chunk q holds layers [first_layer_[q], first_layer_[q + 1]); q = 0 embeds, the last one has the head.
  int64_t chunk_layers(int64_t q) const { return first_layer_[q + 1] - first_layer_[q]; }
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

  // ------------------------------------------------------------ kernels and the host that issues them

  // The host thread's issue of one op on rank r of stage s: in program order
  // (Rank::issue is in-order), and after the device point a sync made it wait for.
  TaskId issue(int64_t s, int64_t r, const std::string& name, double host_s) {
    const size_t i = static_cast<size_t>(s * n_ + r);
    const TaskId t = e_.add_compute(ranks_[i].issue, name, "host_issue", host_s);
    if (issue_gate_[i].valid()) {
      e_.add_dependency(issue_gate_[i], t);
      issue_gate_[i] = {};
    }
    last_issue_[i] = t;
    return t;
  }

  // A device-to-host sync: the host issues nothing more until the device has run `device`.
  void host_sync(int64_t s, const std::vector<TaskId>& device) {
    for (int64_t r = 0; r < n_; ++r) issue_gate_[static_cast<size_t>(s * n_ + r)] = device[r];
  }

  // What a collective issued now waits for on the host: everything the host issued
  // before it (nothing for a compiled step, whose host never paces the device).
  std::vector<TaskId> issued(int64_t s) const {
    if (!c_.host_issue) return {};
    return std::vector<TaskId>(last_issue_.begin() + s * n_, last_issue_.begin() + (s + 1) * n_);
  }

  // How kernels() runs each kernel: device time stretch, host time scale, routed-expert load.
  struct Issue {
    double stretch = 1.0, host_scale = 1.0;
    bool experts = false;
  };

  // The kernels of `ops` on the compute stream (in reverse for a backward), each
  // after the host issued it (OpTiming's host seconds): the host runs ahead of
  // the device until a sync, and paces it where it is the slower of the two.
  // An op with a sync inside it (Kernel::fwd_before_sync_s, bwd_after_sync) stops
  // the host there until the device has run what it issued before.
  // `stretch` scales the device time (SMs a call beside them takes), `host_scale`
  // the host's (a wave issues its share); the first kernel also waits for `also`;
  // `experts`: the rank's routed-expert load applies.
  void kernels(int64_t s, const std::string& tag, const char* cat, const std::vector<Kernel>& ops, Dir d,
               std::vector<TaskId>& prev, double stretch, const std::vector<TaskId>* also, bool experts,
               double host_scale = 1.0) {
    const bool fwd = d == Dir::kForward;
    for (size_t j = 0; j < ops.size(); ++j) {
      const Kernel& k = ops[fwd ? j : ops.size() - 1 - j];
      double dev = k.fwd_s, fl = k.fwd_f, host = k.fwd_host_s;
      if (d == Dir::kBackward) dev = k.bwd_s, fl = k.bwd_f, host = k.bwd_host_s;
      if (d == Dir::kInput) dev = k.bwd_s - k.w_s, fl = k.bwd_f - k.w_f, host = k.bwd_host_s - k.w_host_s;
      if (d == Dir::kWeight) dev = k.w_s, fl = k.w_f, host = k.w_host_s;
      if (d == Dir::kWeight && dev <= 0) continue;  // no weight gradient
      const std::string name = k.name + "." + tag;
      const Issue run{.stretch = stretch, .host_scale = host_scale, .experts = experts};
      if (!fwd && d != Dir::kWeight && k.bwd_after_sync) host_sync(s, prev);
      if (fwd && k.fwd_before_sync_s > 0) {
        // FLOPs split with the device time (trace slices).
        const double share = dev > 0 ? k.fwd_before_sync_s / dev : 0.0;
        issue_kernel(s, name + ".before_sync", cat, k.fwd_host_before_sync_s, k.fwd_before_sync_s, fl * share, run,
                     prev, also);
        also = nullptr;
        host_sync(s, prev);
        issue_kernel(s, name, cat, host - k.fwd_host_before_sync_s, dev - k.fwd_before_sync_s, fl * (1.0 - share), run,
                     prev, nullptr);
        continue;
      }
      issue_kernel(s, name, cat, host, dev, fl, run, prev, also);
      also = nullptr;
    }
  }

  // One kernel on each rank's compute stream after its issue on the rank's host thread.
  void issue_kernel(int64_t s, const std::string& name, const char* cat, double host_s, double device_s, double flops,
                    const Issue& how, std::vector<TaskId>& prev, const std::vector<TaskId>* also) {
    for (int64_t r = 0; r < n_; ++r) {
      const TaskId h = issue(s, r, name + ".issue", host_s * how.host_scale);
      const double f = how.experts ? load(r) : 1.0;
      const TaskId before = prev[r];
      prev[r] = e_.add_compute(rank(s, r).compute, name, cat, device_s * how.stretch * f);
      if (before.valid() && e_.stream_predecessor(prev[r]).v != before.v) e_.add_dependency(before, prev[r]);
      e_.add_dependency(h, prev[r]);
      if (also && (*also)[r].valid()) e_.add_dependency((*also)[r], prev[r]);
      e_.set_task_flops(prev[r], flops * f);
    }
  }

  // One part of a pass on the compute stream: one task of `seconds` (a compiled
  // step), or its kernels after their issue when the host issues ops. `also`:
  // what it waits for besides the stream (a gather, a call's end).
  void part(int64_t s, const std::string& name, const std::string& tag, const char* cat, double seconds, double flops,
            const std::vector<Kernel>& ops, Dir d, std::vector<TaskId>& prev, double stretch = 1.0,
            const std::vector<TaskId>* also = nullptr) {
    if (c_.host_issue) {
      kernels(s, tag, cat, ops, d, prev, stretch, also, false);
      return;
    }
    compute(s, name, cat, seconds * stretch, prev, flops);
    if (also) join(prev, *also);
  }

  // Predict's compute beside a collective (sim/predict.cpp: the merged-1F1B EP
  // overlap's phases, FSDP gathers and reduce-scatters): compute beside calls of
  // comm_s that hold comm_sms of the GPU's SMs runs at (sms - comm_sms) / sms of its
  // speed until the calls end (sim/cost.h sm_share_stretch), the calls taking their
  // priced time. The factor on the compute's time.
  double stretch(double comm_s, double compute_s, double comm_sms) const {
    const double slow = sm_share_stretch(c_.sms, comm_sms);
    if (compute_s <= 0 || slow <= 1.0) return 1.0;
    const double t = compute_s * slow <= comm_s ? compute_s * slow : compute_s + comm_s * (1.0 - 1.0 / slow);
    return t / compute_s;
  }
  double stretch(const Comm& call, double compute_s) const { return stretch(call.time_s(), compute_s, c_.comm_sms); }

  // A layer pass's stretch beside its FSDP calls (`g`: the pass's gather; none where
  // kept weights skip it): the gather, and in the backward the gradient reduce-scatter,
  // as predict charges them (beside_compute_exposed_s per call).
  double fsdp_stretch(int64_t layer, const std::vector<TaskId>& g, Dir d) const {
    if (g.empty() || !g.front().valid()) return 1.0;
    const LayerCost& k = c_.layers[layer];
    const bool fwd = d == Dir::kForward;
    const double comm_s = k.gather.time_s() + (fwd ? 0.0 : k.reduce_scatter.time_s());
    return stretch(comm_s, fwd ? k.t.fwd_s : k.t.bwd_s, c_.fsdp_comm_sms);
  }

  // ------------------------------------------------------------ layers

  // The routed experts of one pass: W waves of (first all-to-all, expert GEMMs,
  // second all-to-all). First transfers share one stream, second ones another,
  // so wave i's dispatch overlaps wave i-1's GEMMs and wave i's combine wave
  // i+1's. Overlapped transfers take SMs from the GEMMs: each overlapped wave's
  // GEMMs lose (1 - overlap efficiency) of the overlapped time (calibration).
  // With host issue, each call waits for what the host issued before it.
  void experts(int64_t s, int64_t layer, const std::string& tag, double expert_s, double expert_f, Dir d,
               const char* cat, std::vector<TaskId>& prev) {
    const bool backward = d != Dir::kForward;
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
      collective(s, &Rank::ep, base + wave + (backward ? ".combine_grad" : ".dispatch"), c1, first, x, issued(s));
      const double penalty = i > 0 ? (1.0 - c_.ep_overlap_eff) * std::min(gemm_s, comm_s) : 0.0;
      if (c_.host_issue) {
        for (int64_t r = 0; r < n_; ++r) {
          if (!x[r].valid()) x[r] = start[r];
        }
        const double stretch_w = gemm_s > 0 ? (gemm_s + penalty) / (gemm_s * w) : 1.0 / w;
        kernels(s, tag + wave, cat, k.kernels[1], d, x, stretch_w, nullptr, true, 1.0 / w);
      } else {
        for (int64_t r = 0; r < n_; ++r) {
          TaskId after = x[r].valid() ? x[r] : start[r];
          x[r] = task(rank(s, r).compute, base + wave + ".experts", cat, gemm_s * load(r) + penalty, after);
          e_.set_task_flops(x[r], expert_f / w * load(r));
        }
      }
      collective(s, &Rank::ep2, base + wave + (backward ? ".dispatch_grad" : ".combine"), c2, second, x, issued(s));
      prev = x;
    }
  }

  // Routed-expert load of rank r (StepGraphOptions::expert_load).
  double load(int64_t r) const {
    if (o_.expert_load.empty()) return 1.0;
    return o_.expert_load[static_cast<size_t>(r) % o_.expert_load.size()];
  }

  // A pass's TP calls as predict charges them (LayerCollectives::tp_*_exposed_s): the
  // share they hide on the TP stream from the pass's start (`before`), beside its compute;
  // the share they expose after it, on the critical path; exposed time beyond the calls'
  // own (the GEMMs a userbuffers overlap runs chunked or on fewer SMs) on the compute stream.
  void tp_calls(int64_t s, const std::string& name, const char* cat, const Comm& calls, double exposed_s,
                std::vector<TaskId> before, std::vector<TaskId>& prev) {
    const double calls_s = calls.time_s();
    if (calls_s <= 0) return;
    const double shown = std::min(1.0, exposed_s / calls_s);
    collective(s, &Rank::tp, name + "_hidden", "tp", calls.scaled(1.0 - shown), before);
    collective(s, &Rank::tp, name, "tp", calls.scaled(shown), prev);
    if (exposed_s > calls_s) compute(s, name + "_overlap", cat, exposed_s - calls_s, prev);
    if (shown >= 1.0) return;
    compute(s, name + ".join", cat, 0.0, prev);  // a task of its own: the compute does not wait for the calls
    join(prev, before);
  }

  // A pass's TP calls (tp_exposed_s of them exposed, tp_calls); a CP ring pass runs beside
  // the layer's compute.
  void tp_cp(int64_t s, int64_t layer, const std::string& tag, const char* cat, double tp_exposed_s, const Comm& cp,
             std::vector<TaskId> before, std::vector<TaskId>& prev) {
    const LayerCost& k = c_.layers[layer];
    tp_calls(s, num("L", layer) + "." + tag + ".tp", cat, k.tp, tp_exposed_s, before, prev);
    if (cp.time_s() <= 0) return;
    collective(s, &Rank::cp, num("L", layer) + "." + tag + ".cp_ring", "cp_ring", cp, before);
    compute(s, num("L", layer) + "." + tag + ".join", cat, 0.0, prev);
    join(prev, before);
  }

  // A forward-shaped pass of one layer (forward, or the full recompute's replay).
  // An eager trainer's dropless dispatcher syncs the host before the dispatch.
  // `beside`: the stretch of its compute beside the layer's FSDP calls (fsdp_stretch).
  void layer_forward(int64_t s, int64_t layer, const std::string& tag, const char* cat,
                     const std::vector<TaskId>& g, std::vector<TaskId>& prev, double beside = 1.0) {
    const LayerCost& k = c_.layers[layer];
    const std::vector<TaskId> before = prev;
    const std::string name = num("L", layer) + "." + tag;
    if (!k.ep) {
      part(s, name, tag, cat, k.t.fwd_s, k.fwd_f(), k.kernels[0], Dir::kForward, prev, beside, &g);
    } else {
      part(s, name + ".pre", tag, cat, k.pre_fwd, k.pre_fwd_f, k.kernels[0], Dir::kForward, prev, beside, &g);
      if (c_.moe_sync) host_sync(s, prev);
      experts(s, layer, tag, k.exp_fwd, k.exp_fwd_f, Dir::kForward, cat, prev);
      part(s, name + ".post", tag, cat, k.post_fwd, k.post_fwd_f, k.kernels[2], Dir::kForward, prev, beside);
    }
    tp_cp(s, layer, tag, cat, k.tp_fwd_exposed, k.cp_fwd, before, prev);
  }

  // Backward of one layer; input_only: the weight-gradient GEMMs are left to a W pass.
  void layer_backward(int64_t s, int64_t layer, const std::string& tag, bool input_only,
                      const std::vector<TaskId>& g, std::vector<TaskId>& prev, double beside = 1.0) {
    const LayerCost& k = c_.layers[layer];
    const std::vector<TaskId> before = prev;
    const std::string name = num("L", layer) + "." + tag;
    const double leave_w = input_only ? 1.0 : 0.0;  // the W pass runs these later
    const Dir d = input_only ? Dir::kInput : Dir::kBackward;
    if (!k.ep) {
      part(s, name, tag, "backward", k.t.bwd_s - leave_w * k.w_s(), k.bwd_f() - leave_w * k.w_f(), k.kernels[0], d,
           prev, beside, &g);
    } else {
      part(s, name + ".post", tag, "backward", k.post_bwd - leave_w * k.post_w, k.post_bwd_f - leave_w * k.post_w_f,
           k.kernels[2], d, prev, beside, &g);
      experts(s, layer, tag, k.exp_bwd - leave_w * k.exp_w, k.exp_bwd_f - leave_w * k.exp_w_f, d, "backward", prev);
      part(s, name + ".pre", tag, "backward", k.pre_bwd - leave_w * k.pre_w, k.pre_bwd_f - leave_w * k.pre_w_f,
           k.kernels[0], d, prev, beside);
    }
    tp_cp(s, layer, tag, "backward", k.tp_bwd_exposed, k.cp_bwd, before, prev);
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

  // ------------------------------------------------------------ passes

  // A pass of one micro-batch through one model chunk of a stage, being built:
  // where each rank's part ends, and each layer's end (the gathers' window).
  struct PassState {
    int64_t s = 0, c = 0, q = 0, mb = 0;
    bool input_only = false;
    std::string tag;
    std::vector<TaskId> prev;
    std::vector<std::vector<TaskId>> done;
  };

  PassState forward_begin(int64_t s, int64_t c, int64_t mb) {
    PassState f{s, c, model_chunk(s, c), mb, false, pass_tag(c, mb, ".fwd"), std::vector<TaskId>(n_), {}};
    for (int64_t r = 0; r < n_; ++r) {
      if (f.q > 0) {
        f.prev[r] = task(rank(s, r).pp_recv, f.tag + ".recv", "pp_recv", 0.0, {});
        recv_fwd_[slot(f.q, mb, r)] = f.prev[r];
      } else {
        f.prev[r] = gate_[s * n_ + r];
      }
    }
    if (f.q == 0) {
      part(s, "embed." + f.tag, f.tag, "forward", c_.pre_fwd_s, c_.pre_fwd_f, c_.pre_kernels, Dir::kForward, f.prev);
    }
    return f;
  }

  // The FSDP gather of the forward's i-th layer (none for weights kept from the first micro-batch).
  std::vector<TaskId> forward_gather(PassState& f, int64_t i) {
    const int64_t layer = first_layer_[f.q] + i;
    std::vector<TaskId> window = i >= 2 ? f.done[i - 2] : stage_gate(f.s);
    // Kept gathered weights: the step's first micro-batch gathers them; later
    // passes find them in memory (and follow it on the compute stream).
    return c_.kept_weights && f.mb > 0 ? std::vector<TaskId>(n_) : gather(f.s, layer, f.tag, window);
  }

  void forward_layer(PassState& f, int64_t i) {
    const int64_t layer = first_layer_[f.q] + i;
    const std::vector<TaskId> g = forward_gather(f, i);
    layer_forward(f.s, layer, f.tag, "forward", g, f.prev, fsdp_stretch(layer, g, Dir::kForward));
    f.done.push_back(f.prev);
  }

  void forward_end(PassState& f) {
    if (f.q == chunks_total() - 1) {
      part(f.s, "head." + f.tag, f.tag, "forward", c_.head_fwd_s, c_.head_fwd_f, c_.head_kernels, Dir::kForward,
           f.prev);
    }
    if (f.q < chunks_total() - 1) send(f.s, f.q + 1, f.tag, f.prev);
    for (int64_t r = 0; r < n_; ++r) last_fwd_[slot(f.q, f.mb, r)] = f.prev[r];
  }

  void forward(int64_t s, int64_t c, int64_t mb) {
    PassState f = forward_begin(s, c, mb);
    for (int64_t i = 0; i < chunk_layers(f.q); ++i) forward_layer(f, i);
    forward_end(f);
  }

  PassState backward_begin(int64_t s, int64_t c, int64_t mb, bool input_only) {
    const int64_t q = model_chunk(s, c);
    PassState b{s, c, q, mb, input_only, pass_tag(c, mb, input_only ? ".bwd_input" : ".bwd"), std::vector<TaskId>(n_),
                {}};
    if (q < chunks_total() - 1) {
      for (int64_t r = 0; r < n_; ++r) {
        b.prev[r] = task(rank(s, r).pp_recv, b.tag + ".recv", "pp_recv", 0.0, {});
        recv_bwd_[slot(q, mb, r)] = b.prev[r];
      }
    } else {
      for (int64_t r = 0; r < n_; ++r) b.prev[r] = last_fwd_[slot(q, mb, r)];
      part(s, "head." + b.tag, b.tag, "backward", c_.head_bwd_s, c_.head_bwd_f, c_.head_kernels, Dir::kBackward,
           b.prev);
      if (mb == m_ - 1 && c_.bucket_layers > 0) {
        std::vector<TaskId> head = b.prev;
        collective(s, &Rank::dp, "head.grad_sync", "grad_sync", c_.edge_sync, head);
      }
    }
    // A backward on this stage also needs this stage's own forward of the chunk.
    for (int64_t r = 0; r < n_; ++r) {
      const TaskId f = last_fwd_[slot(q, mb, r)];
      if (f.valid() && b.prev[r].valid() && f.v != b.prev[r].v) e_.add_dependency(f, b.prev[r]);
    }
    return b;
  }

  // The backward's k-th layer (in backward order): its gather, then the
  // recompute's replay of its forward.
  std::vector<TaskId> backward_prepare(PassState& b, int64_t k) {
    const int64_t layer = first_layer_[b.q] + chunk_layers(b.q) - 1 - k;
    std::vector<TaskId> window = k >= 2 ? b.done[k - 2] : b.prev;
    std::vector<TaskId> g = c_.kept_weights ? std::vector<TaskId>(n_) : gather(b.s, layer, b.tag, window);
    const LayerCost& t = c_.layers[layer];
    const std::vector<TaskId> before = b.prev;
    if (l_.recompute == models::Recompute::kFull) {
      layer_forward(b.s, layer, b.tag + ".recompute", "recompute", g, b.prev);
    } else if (t.t.recompute_s > 0) {
      compute(b.s, num("L", layer) + "." + b.tag + ".recompute", "recompute", t.t.recompute_s, b.prev);
      join(b.prev, g);
    }
    // torchtitan's op-SAC replay gathers the attention and MLP inputs again, as predict prices it.
    tp_calls(b.s, num("L", layer) + "." + b.tag + ".tp_replay", "recompute", t.tp_replay, t.tp_replay_exposed, before,
             b.prev);
    return g;
  }

  void backward_layer(PassState& b, int64_t k) {
    const int64_t layer = first_layer_[b.q] + chunk_layers(b.q) - 1 - k;
    const std::vector<TaskId> g = backward_prepare(b, k);
    layer_backward(b.s, layer, b.tag, b.input_only, g, b.prev, fsdp_stretch(layer, g, Dir::kBackward));
    if (!b.input_only) reduce_scatter(b.s, layer, b.tag, b.mb, b.prev);
    b.done.push_back(b.prev);
  }

  void backward_end(PassState& b) {
    if (b.q == 0) {
      part(b.s, "embed." + b.tag, b.tag, "backward", c_.pre_bwd_s, c_.pre_bwd_f, c_.pre_kernels, Dir::kBackward,
           b.prev);
    }
    if (b.q > 0) send(b.s, b.q - 1, b.tag, b.prev);
    for (int64_t r = 0; r < n_; ++r) last_bwd_[slot(b.q, b.mb, r)] = b.prev[r];
  }

  void backward(int64_t s, int64_t c, int64_t mb, bool input_only) {
    PassState b = backward_begin(s, c, mb, input_only);
    for (int64_t k = 0; k < chunk_layers(b.q); ++k) backward_layer(b, k);
    backward_end(b);
  }

  // Megatron-Core's merged 1F1B step (Layout::ep_a2a_overlap; models/common/
  // model_chunk_schedule_plan.py, TransformerLayerSchedulePlan.run): a forward
  // and a backward of two micro-batches run as one, the forward's layer i beside
  // the backward's i-th layer from the end. Where both are MoE layers they
  // interleave (merged_layers); elsewhere each runs as alone.
  void merged(int64_t s, const Slot& fs, const Slot& bs) {
    PassState f = forward_begin(s, fs.chunk, fs.mb);
    PassState b = backward_begin(s, bs.chunk, bs.mb, false);
    const int64_t nf = chunk_layers(f.q), nb = chunk_layers(b.q);
    for (int64_t i = 0; i < std::max(nf, nb); ++i) {
      const bool both = i < nf && i < nb && c_.layers[first_layer_[f.q] + i].ep &&
                        c_.layers[first_layer_[b.q] + nb - 1 - i].ep;
      if (both) {
        merged_layers(f, b, i);
        continue;
      }
      if (i < nf) forward_layer(f, i);
      if (i < nb) backward_layer(b, i);
    }
    forward_end(f);
    backward_end(b);
  }

  // One MoE layer of each, in the four phases of the merged step, each
  // all-to-all on the EP stream beside the other pass's compute:
  //   the backward's combine gradient   beside the forward's attention block
  //   the forward's dispatch            beside the backward's expert data gradients
  //   the backward's dispatch gradient  beside its expert weight gradients and the forward's experts
  //   the forward's combine             beside the backward's attention block
  // The backward's part after its combine (in layer order) runs first, the
  // forward's part after its combine last; compute beside a call runs stretched
  // (stretch). A full recompute replays the backward's layer alone first.
  void merged_layers(PassState& f, PassState& b, int64_t i) {
    const int64_t s = f.s;
    const int64_t lf = first_layer_[f.q] + i, lb = first_layer_[b.q] + chunk_layers(b.q) - 1 - i;
    const LayerCost& kf = c_.layers[lf];
    const LayerCost& kb = c_.layers[lb];
    const std::vector<TaskId> gf = forward_gather(f, i);
    const std::vector<TaskId> gb = backward_prepare(b, i);
    const std::vector<TaskId> f_before = f.prev, b_before = b.prev;
    const std::string nf = num("L", lf) + "." + f.tag, nb = num("L", lb) + "." + b.tag;
    part(s, nb + ".post", b.tag, "backward", kb.post_bwd, kb.post_bwd_f, kb.kernels[2], Dir::kBackward, b.prev, 1.0,
         &gb);
    std::vector<TaskId> xb = b.prev;
    collective(s, &Rank::ep, nb + ".combine_grad", "ep_combine", kb.combine, xb, issued(s));
    part(s, nf + ".pre", f.tag, "forward", kf.pre_fwd, kf.pre_fwd_f, kf.kernels[0], Dir::kForward, f.prev,
         stretch(kb.combine, kf.pre_fwd), &gf);
    if (c_.moe_sync) host_sync(s, f.prev);
    std::vector<TaskId> xf = f.prev;
    collective(s, &Rank::ep, nf + ".dispatch", "ep_dispatch", kf.dispatch, xf, issued(s));
    const double dgrad = kb.exp_bwd - kb.exp_w;
    expert_part(s, nb + ".experts_dgrad", b.tag, dgrad, kb.exp_bwd_f - kb.exp_w_f, kb.kernels[1], Dir::kInput, b.prev,
                stretch(kf.dispatch, dgrad), &xb);
    xb = b.prev;
    collective(s, &Rank::ep, nb + ".dispatch_grad", "ep_dispatch", kb.dispatch, xb, issued(s));
    const double beside = stretch(kb.dispatch, kb.exp_w + kf.exp_fwd);
    expert_part(s, nb + ".experts_wgrad", b.tag, kb.exp_w, kb.exp_w_f, kb.kernels[1], Dir::kWeight, b.prev, beside,
                nullptr);
    expert_part(s, nf + ".experts", f.tag, kf.exp_fwd, kf.exp_fwd_f, kf.kernels[1], Dir::kForward, f.prev, beside, &xf);
    xf = f.prev;
    collective(s, &Rank::ep, nf + ".combine", "ep_combine", kf.combine, xf, issued(s));
    part(s, nb + ".pre", b.tag, "backward", kb.pre_bwd, kb.pre_bwd_f, kb.kernels[0], Dir::kBackward, b.prev,
         stretch(kf.combine, kb.pre_bwd), &xb);
    part(s, nf + ".post", f.tag, "forward", kf.post_fwd, kf.post_fwd_f, kf.kernels[2], Dir::kForward, f.prev, 1.0, &xf);
    tp_cp(s, lf, f.tag, "forward", kf.tp_fwd_exposed, kf.cp_fwd, f_before, f.prev);
    tp_cp(s, lb, b.tag, "backward", kb.tp_bwd_exposed, kb.cp_bwd, b_before, b.prev);
    reduce_scatter(s, lb, b.tag, b.mb, b.prev);
    f.done.push_back(f.prev);
    b.done.push_back(b.prev);
  }

  // The routed experts' GEMMs of one merged phase (one wave), at the rank's expert load.
  void expert_part(int64_t s, const std::string& name, const std::string& tag, double seconds, double flops,
                   const std::vector<Kernel>& ops, Dir d, std::vector<TaskId>& prev, double stretch_by,
                   const std::vector<TaskId>* also) {
    const char* cat = d == Dir::kForward ? "forward" : "backward";
    if (c_.host_issue) {
      kernels(s, tag, cat, ops, d, prev, stretch_by, also, true);
      return;
    }
    for (int64_t r = 0; r < n_; ++r) {
      prev[r] = task(rank(s, r).compute, name, cat, seconds * stretch_by * load(r), prev[r]);
      e_.set_task_flops(prev[r], flops * load(r));
      if (also && (*also)[r].valid()) e_.add_dependency((*also)[r], prev[r]);
    }
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
    for (int64_t i = chunk_layers(q) - 1; i >= 0; --i) {
      const int64_t layer = first_layer_[q] + i;
      const LayerCost& k = c_.layers[layer];
      if (c_.host_issue) {
        for (int p = 2; p >= 0; --p) kernels(s, tag, "backward", k.kernels[p], Dir::kWeight, prev, 1.0, nullptr, p == 1);
      } else {
        compute(s, num("L", layer) + "." + tag, "backward", k.w_s(), prev, k.w_f());
      }
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
  int64_t stages_, v_;
  std::vector<int64_t> first_layer_;  // per model chunk, and the layer count at the end
  int64_t m_, n_ = 1, step_ = 0;
  bool v_shape_ = false;
  double nvlink_bw_ = 0, nic_bw_ = 0;
  double spine_fraction_ = 1.0;
  ResourceId fabric_, spine_, storage_;
  std::map<std::pair<int32_t, int>, ResourceId> private_;  // (stream, tier) -> its own link
  std::vector<Rank> ranks_;
  std::vector<TaskId> gate_;  // per rank: previous step's end
  // Per rank, with host issue: what the host's next issue waits for (a sync's
  // device point, or the step's start), and the host's last issue so far.
  std::vector<TaskId> issue_gate_, last_issue_;
  std::vector<std::vector<int64_t>> pending_sync_;  // per stage: layers whose gradients wait for a bucket
  // Per (model chunk, micro-batch, rank): receive tasks and last tasks of each pass.
  std::vector<TaskId> recv_fwd_, recv_bwd_, last_fwd_, last_bwd_;
};

// The first layer of each of the `chunks` model chunks (in layer order), and the
// layer count last. Even: layers / chunks each. Uneven stages (Layout::uneven_stages,
// Megatron's --decoder-first/last-pipeline-num-layers as predict prices them): the
// first layers % chunks chunks take one more. Edges in the split
// (Layout::edges_in_pipeline_split, Megatron-Core's account_for_embedding/loss_in_pipeline_split):
// layers + 2 slots spread the same way, the embedding taking one of the first chunk's
// and the loss one of the last one's.
std::vector<int64_t> chunk_first_layers(const Layout& l, int64_t layers, int64_t chunks) {
  const bool edges = l.edges_in_pipeline_split && l.pp > 1;
  const int64_t slots = layers + (edges ? 2 : 0);
  std::vector<int64_t> first{0};
  for (int64_t q = 0; q < chunks; ++q) {
    int64_t n = slots / chunks + (q < slots % chunks ? 1 : 0);
    if (edges && q == 0) --n;
    if (edges && q == chunks - 1) --n;
    first.push_back(first.back() + std::max<int64_t>(0, n));
  }
  RS_CHECK(first.back() == layers, "the pipeline split places every layer once");
  return first;
}

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
  std::vector<int64_t> first = chunk_first_layers(l, layers, sg.stages * chunks);
  for (int64_t s = 0; s < sg.stages; ++s) {
    int64_t n = 0;
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t q = pipeline_model_chunk(l.pp > 1 && l.schedule == PpSchedule::kDualPipeV ? PpSchedule::kDualPipeV
                                                                                             : PpSchedule::k1F1B,
                                             sg.stages, s, c);
      n += first[q + 1] - first[q];
    }
    sg.layers_per_stage = std::max(sg.layers_per_stage, n);
  }
  sg.checkpoint_bytes = costs.checkpoint_bytes_per_gpu * static_cast<double>(l.gpus());
  Builder b(sg.engine, costs, l, p.cluster(), o, sg.stages, chunks, std::move(first), sg.micro_batches);
  b.add_ranks(o.ranks_per_stage, per_stage / o.ranks_per_stage);
  for (int64_t s = 0; s < o.steps; ++s) sg.step_end.push_back(b.step(s, o.gc_stalls));
  return sg;
}

}  // namespace rackstep::sim
