// The step graph schedules the collectives Predictor::price priced: every
// collective call in the task graph moves exactly the per-tier bytes of the
// priced call, at its bandwidth time, so the DES and the analytic prediction
// cannot drift apart in what they send.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "models/layer_graph.h"
#include "models/model.h"
#include "sim/base/source_dir.h"
#include "sim/des.h"
#include "sim/predict.h"
#include "sim/step_graph.h"
#include "tests/sim_step_graph_case.h"

using namespace rackstep;
using namespace rackstep::sim;

using test::Case;
using test::llama8b_fsdp8_tp8;
using test::load;

namespace {

// What one call in the engine moves: bytes over NVLink-port links and over NIC
// links (its flows are the task `name` and its `.nic` / `.spine` siblings, on
// the first process that runs it).
struct Moved {
  int tasks = 0;
  double nvlink_bytes = 0, nic_bytes = 0;
  double bw_s = 0;  // the stream flow's time alone on its links
};

Moved moved(const Engine& e, const std::string& name) {
  Moved m;
  int process = -1;
  for (int32_t i = 0; i < e.num_tasks(); ++i) {
    const TaskId t{i};
    const std::string& n = e.task_name(t);
    if (n != name && n != name + ".nic" && n != name + ".spine") continue;
    if (process < 0) process = e.task_process(t);
    if (e.task_process(t) != process) continue;
    ++m.tasks;
    const std::vector<ResourceId> links = e.task_links(t);
    if (links.empty()) continue;
    (e.resource_kind(links.front()) == ResourceKind::kNvlinkPort ? m.nvlink_bytes : m.nic_bytes) += e.task_bytes(t);
    if (n == name) m.bw_s = e.uncontended_flow_s(t);
  }
  return m;
}

void check_call(const Engine& e, const std::string& name, const CommCost& priced) {
  INFO(name << ": priced latency " << priced.latency_s << " s, bandwidth " << priced.bw_s << " s, NVLink "
            << priced.nvlink_bytes << " B, NIC " << priced.nic_bytes << " B");
  REQUIRE(priced.time_s() > 0);
  REQUIRE(priced.nvlink_bytes + priced.nic_bytes > 0);
  const Moved m = moved(e, name);
  REQUIRE(m.tasks > 0);
  CHECK(m.nvlink_bytes == Approx(priced.nvlink_bytes).epsilon(1e-12));
  CHECK(m.nic_bytes == Approx(priced.nic_bytes).epsilon(1e-12));
  CHECK(m.bw_s == Approx(priced.bw_s).epsilon(1e-6));
}

StepGraphOptions private_links() {
  StepGraphOptions o;
  o.contention = false;  // every stream on links of its own: a flow's time is its priced bandwidth time
  o.gc_stalls = false;
  return o;
}

}  // namespace

TEST_CASE("the step graph's collectives are the ones price() priced (FSDP, EP, gradient sync, Muon)",
          "[step_graph][price]") {
  Case c = load("marin-535b-a23b.json", "gb200-11-racks.json", "hero-ragged.json");
  const Predictor p(c.graph, c.cluster);
  const StepPrice price = p.price(c.layout);
  REQUIRE(price.prediction.valid);
  REQUIRE(price.collectives.size() == price.layers.size());
  // One pricing for both views: the prediction is predict()'s, the layer timings layer_timings()'.
  CHECK(price.prediction.step_time_s == p.predict(c.layout).step_time_s);
  CHECK(price.layers[3].fsdp_gather_s == p.layer_timings(c.layout)[3].fsdp_gather_s);
  // Every call's time is the predictor's time for it.
  CHECK(price.collectives[3].fsdp_gather.time_s() == Approx(price.layers[3].fsdp_gather_s).epsilon(1e-12));
  CHECK(price.collectives[3].ep_dispatch.time_s() == Approx(price.layers[3].ep_dispatch_s).epsilon(1e-12));

  const StepGraph sg = build_step_graph(p, c.layout, private_links());
  const Engine& e = sg.engine;
  // Layer 3 routes its tokens (the hero's first layers are dense).
  const int64_t moe = 3;
  REQUIRE(price.layers[moe].ep_dispatch_s > 0);
  const LayerCollectives& x = price.collectives[moe];
  check_call(e, "L3.mb0.fwd.allgather", x.fsdp_gather);
  check_call(e, "L3.mb0.bwd.reduce_scatter", x.grad_reduce_scatter);
  check_call(e, "L3.mb0.fwd.dispatch", x.ep_dispatch);
  check_call(e, "L3.mb0.fwd.combine", x.ep_combine);
  // The layer's two gradient all-reduces across replicas (dense, then experts) share one name.
  const Moved sync = moved(e, "L3.grad_sync");
  CHECK(sync.nvlink_bytes == Approx(x.grad_sync_dense.nvlink_bytes + x.grad_sync_expert.nvlink_bytes).epsilon(1e-12));
  CHECK(sync.nic_bytes == Approx(x.grad_sync_dense.nic_bytes + x.grad_sync_expert.nic_bytes).epsilon(1e-12));
  const StepCollectives& st = price.step_collectives;
  check_call(e, "step0.newton_schulz_gather", st.muon_gather);
  check_call(e, "step0.newton_schulz_redistribute", st.muon_redistribute);
  check_call(e, "step0.embedding_grad_sync", st.replicated_grad_sync);
}

TEST_CASE("the step graph's context-parallel and pipeline sends are the ones price() priced", "[step_graph][price]") {
  Case c = load("marin-535b-a23b.json", "hgx-h100.json", "h100-longctx-pp24.json", 96);
  const Predictor p(c.graph, c.cluster);
  const StepPrice price = p.price(c.layout);
  REQUIRE(price.prediction.valid);
  const StepGraph sg = build_step_graph(p, c.layout, private_links());
  check_call(sg.engine, "L0.mb0.c0.fwd.cp_ring", price.collectives[0].cp);
  check_call(sg.engine, "mb0.c0.fwd.send", price.step_collectives.pp_send);
}

TEST_CASE("the step graph's tensor-parallel passes are the ones price() priced", "[step_graph][price]") {
  Case c = load("marin-535b-a23b.json", "gb200-11-racks.json", "hero-ragged.json");
  c.layout.tp = 2;  // sequence parallel in pairs; the hero's EP / FSDP halved to keep data a multiple
  c.layout.data = 352;
  c.layout.fsdp = 32;
  c.layout.ep = 32;
  c.layout.micro_batch_seqs = 32;
  const Predictor p(c.graph, c.cluster);
  const StepPrice price = p.price(c.layout);
  REQUIRE(price.prediction.valid);
  const StepGraph sg = build_step_graph(p, c.layout, private_links());
  check_call(sg.engine, "L0.mb0.fwd.tp", price.collectives[0].tp);
  check_call(sg.engine, "L0.mb0.fwd.allgather", price.collectives[0].fsdp_gather);
}

TEST_CASE("the step graph replays the TP all-gathers a torchtitan op-SAC backward reruns, as price() priced",
          "[step_graph][price][op_sac]") {
  // rackstep's selective recompute against torchtitan's per-op policy, whose replay gathers
  // the attention and MLP inputs again.
  const Case c = llama8b_fsdp8_tp8(false);
  const Layout& l = c.layout;
  const Layout sac = llama8b_fsdp8_tp8(true).layout;
  const Predictor p(c.graph, c.cluster);
  const StepPrice keep = p.price(l), price = p.price(sac);
  REQUIRE(price.prediction.valid);
  CHECK(keep.collectives[0].tp_replay.time_s() == 0);
  // Two all-gathers of the pass's two all-gathers and two reduce-scatters of the same bytes: half its time.
  CHECK(price.collectives[0].tp_replay.time_s() > 0);
  CHECK(price.collectives[0].tp_replay.time_s() == Approx(0.5 * price.collectives[0].tp.time_s()).epsilon(1e-9));
  const StepGraph sg = build_step_graph(p, sac, private_links());
  check_call(sg.engine, "L0.mb0.bwd.tp_replay", price.collectives[0].tp_replay);
  check_call(sg.engine, "L31.mb0.bwd.tp_replay", price.collectives[31].tp_replay);
  // The timeline grows by what predict adds for the policy (replayed GEMMs and gathers, both exposed).
  const double grown_s = sg.engine.run().makespan_s -
                         build_step_graph(p, l, private_links()).engine.run().makespan_s;
  const double predicted_s = price.prediction.step_time_s - keep.prediction.step_time_s;
  CHECK(grown_s == Approx(predicted_s).epsilon(1e-6));
}

namespace {

// The timeline of `overlapped` (a TP overlap on) against the same layout's with its TP
// calls exposed: the step changes by what predict's changes, and each pass's calls, the
// hidden share beside the compute and the exposed one after it, move the priced bytes.
// Returns the forward's exposed TP seconds over the calls' own.
double check_tp_timeline(const Predictor& p, const Layout& exposed, const Layout& overlapped) {
  const StepPrice price = p.price(overlapped);
  REQUIRE(price.prediction.valid);
  const LayerCollectives& x = price.collectives[0];
  const StepGraph sg = build_step_graph(p, overlapped, private_links());
  for (const char* pass : {"fwd", "bwd"}) {
    const std::string name = std::string("L0.mb0.") + pass + ".tp";
    const Moved shown = moved(sg.engine, name), hidden = moved(sg.engine, name + "_hidden");
    CHECK(shown.nvlink_bytes + hidden.nvlink_bytes == Approx(x.tp.nvlink_bytes).epsilon(1e-9));
  }
  CHECK(x.tp_bwd_exposed_s < x.tp.time_s());
  const double exposed_des_s = build_step_graph(p, exposed, private_links()).engine.run().makespan_s;
  const double changed_predict_s = price.prediction.step_time_s - p.predict(exposed).step_time_s;
  CHECK(std::abs(changed_predict_s) > 1e-3 * price.prediction.step_time_s);
  CHECK(sg.engine.run().makespan_s - exposed_des_s == Approx(changed_predict_s).epsilon(1e-6));
  return x.tp_fwd_exposed_s / x.tp.time_s();
}

}  // namespace

TEST_CASE("the timeline hides the TP time an overlap hides and exposes what price() charges",
          "[step_graph][price][tp_overlap]") {
  // Llama 3 8B at TP 8 over 8 data ranks, no FSDP: nothing else runs beside the passes.
  Case c = llama8b_fsdp8_tp8(false);
  c.layout.fsdp = 1;
  c.layout.zero_stage = 0;
  const Layout& exposed = c.layout;
  Layout share = exposed;  // a share of every call hidden
  share.tp_comm_overlap = 0.5;
  Layout ub = exposed;  // Transformer Engine userbuffers, priced per GEMM
  ub.tp_comm_overlap = -1.0;
  ub.tp_userbuffers = true;
  const Predictor p(c.graph, c.cluster);
  CHECK(check_tp_timeline(p, exposed, share) == Approx(0.5));
  CHECK(check_tp_timeline(p, exposed, ub) < 1.0);
  // Two layers of Llama 3.1 405B's shape at TP 8 x CP 2 (the DGX Cloud recipe's): the
  // forward's ring-exchange GEMMs, run in tp pieces of 512 rows, cost more than the calls
  // they hide; the timeline charges that excess on the compute stream, as predict does.
  models::ModelConfig m = models::load_model(std::string(rackstep::source_dir()) +
                                           "/tests/validation/models/llama31-405b-dgxc.json");
  m.layers = 2;
  const Predictor big(models::build_layer_graph(m), c.cluster);
  Layout wide;
  wide.data = 4;
  wide.tp = 8;
  wide.cp = 2;
  wide.micro_batch_seqs = 1;
  wide.tokens_per_step = 4 * 8192;
  wide.recompute = models::Recompute::kNone;
  Layout wide_ub = wide;
  wide_ub.tp_userbuffers = true;
  CHECK(check_tp_timeline(big, wide, wide_ub) > 1.0);
}
