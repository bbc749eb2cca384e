// EP all-to-all communication (issue 13): what the dispatcher moves on each tier
// (Layout::ep_dispatcher: Megatron's all-to-all of top_k rows per token vs the flex
// dispatcher's one row per destination GPU / domain, sim/collectives.h
// flex_dispatch_tiers), the merged-1F1B overlap (Layout::ep_a2a_overlap), and which
// stacks run them.
#include <catch2/catch.hpp>

#include <string>

#include "sim/base/check.h"
#include "sim/calibration.h"
#include "sim/collectives.h"
#include "sim/predict.h"
#include "sim/stack.h"
#include "sim/sweep.h"
#include "tests/sim_qwen235b_h100.h"

using namespace rackstep;
using namespace rackstep::sim;

namespace {

using testing::qwen235b_folded;
using testing::qwen235b_h100;

// C(e - held, k) / C(e, k), written out independently of sim/collectives.cpp.
double none_of_k(double e, double held, int k) {
  double p = 1.0;
  for (int i = 0; i < k; ++i) p *= (e - held - i) / (e - i);
  return p;
}

Network rack_network(int64_t gpus_per_domain) {
  Network n;
  n.gpus_per_domain = gpus_per_domain;
  n.link_bw_bytes_per_s = 770e9;
  n.nic_a2a_bw_bytes_per_s = 48.5e9;
  n.intra_alpha_s = 5e-6;
  n.inter_alpha_s = 45e-6;
  return n;
}

// EP 8 inside one node: 32 H100 nodes as TP 1, PP 8, data 32.
Layout qwen_node_ep() {
  Layout l = qwen235b_folded();
  l.tp = 1;
  l.etp = 0;
  l.data = 32;
  l.fsdp = 32;
  l.ep = 8;
  return l;
}

// Qwen3-235B on four GB200 NVL72 racks (64 GPUs each): PP 8 x data 32, EP 32 inside a
// rack, the flex dispatcher, as the Megatron-Bridge GB200 rows run it.
const Predictor& qwen235b_gb200() {
  static const Predictor p(qwen235b_h100().graph(),
                           topologies::load_cluster(std::string(rackstep::source_dir()) + "/topologies/zoo/gb200-nvl72.json", 4));
  return p;
}

Layout qwen_rack_flex(FlexBackend backend) {
  Layout l = qwen_node_ep();
  l.pp_virtual = 1;
  l.schedule = PpSchedule::k1F1B;
  l.fp8 = Fp8Gemms::kNone;
  l.ep = 32;
  l.ep_dispatcher = EpDispatcher::kFlex;
  l.ep_flex_backend = backend;
  return l;
}

size_t first_moe_layer(const StepPrice& sp) {
  size_t moe = 0;
  while (moe < sp.collectives.size() && sp.collectives[moe].ep_dispatch.nvlink_bytes <= 0) ++moe;
  return moe;
}

}  // namespace

TEST_CASE("epcomm: the even split is the all-to-all the predictor always priced", "[epcomm]") {
  const Network net = rack_network(8);
  for (const int64_t size : {8, 32}) {
    const Group g = group_of(net, size, 1);
    const double bytes = 3e8;
    const A2aTiers even = even_a2a_tiers(g, bytes);
    CHECK(all_to_all_tiers_s(net, g, even, 0.7) == Approx(all_to_all_s(net, g, bytes, 0.7)).epsilon(1e-12));
    const double n = static_cast<double>(size), inner = static_cast<double>(g.per_domain());
    CHECK(even.nvlink_bytes == Approx((inner - 1.0) / n * bytes));
    CHECK(even.nic_bytes == Approx((n - inner) / n * bytes));
  }
}

TEST_CASE("epcomm: flex sends a token once per GPU holding any of its experts", "[epcomm]") {
  const Network net = rack_network(64);
  const Group g = group_of(net, 16, 1);  // EP 16 inside one rack
  REQUIRE(g.domains == 1);
  const double tokens = 8192, row = 4096 * 2.0;
  const A2aTiers flex = flex_dispatch_tiers(g, tokens, 128, 8, row);
  const A2aTiers even = even_a2a_tiers(g, tokens * 8 * row);  // Megatron's alltoall: top_k rows per token
  const double hit = 1.0 - none_of_k(128, 8, 8);              // 8 experts per GPU
  CHECK(flex.nvlink_bytes == Approx(tokens * 15.0 * hit * row));
  CHECK(flex.nic_bytes == 0.0);
  // 6.6 distinct GPUs of 16 per token instead of 8 rows: 0.825 of the bytes.
  CHECK(flex.nvlink_bytes / even.nvlink_bytes == Approx(hit * 16.0 / 8.0));
  CHECK(flex.nvlink_bytes / even.nvlink_bytes == Approx(0.825).margin(0.005));

  SECTION("one expert per token: nothing to de-duplicate") {
    const A2aTiers one = flex_dispatch_tiers(g, tokens, 128, 1, row);
    CHECK(one.nvlink_bytes == Approx(even_a2a_tiers(g, tokens * row).nvlink_bytes));
  }
  SECTION("every expert on every GPU's token: each peer gets it once") {
    const A2aTiers all = flex_dispatch_tiers(g, tokens, 16, 16, row);
    CHECK(all.nvlink_bytes == Approx(tokens * 15.0 * row));
  }
}

TEST_CASE("epcomm: across domains flex crosses the NIC once per destination domain", "[epcomm]") {
  const Network net = rack_network(8);
  const Group g = group_of(net, 32, 1);  // EP 32 over 4 nodes of 8
  REQUIRE(g.domains == 4);
  const double tokens = 2048, row = 4096 * 2.0;
  const A2aTiers flex = flex_dispatch_tiers(g, tokens, 128, 8, row);
  const A2aTiers even = even_a2a_tiers(g, tokens * 8 * row);
  const double hit_node = 1.0 - none_of_k(128, 32, 8);  // a node holds 32 of the 128 experts
  const double hit_gpu = 1.0 - none_of_k(128, 4, 8);
  CHECK(flex.nic_bytes == Approx(tokens * 3.0 * hit_node * row));
  // Local sends plus forwarding what the other nodes' rail peers sent.
  CHECK(flex.nvlink_bytes == Approx(tokens * 4.0 * 7.0 * hit_gpu * row));
  CHECK(flex.nic_bytes < 0.5 * even.nic_bytes);  // 2.7 of the 6 remote rows per token
  CHECK(all_to_all_tiers_s(net, g, flex) < all_to_all_tiers_s(net, g, even));
}

TEST_CASE("epcomm: the layout's dispatcher sets the EP bytes the predictor prices", "[epcomm]") {
  const Predictor& p = qwen235b_h100();
  Layout a2a = qwen_node_ep();
  Layout flex = a2a;
  flex.ep_dispatcher = EpDispatcher::kFlex;
  const StepPrice pa = p.price(a2a), pf = p.price(flex);
  size_t moe = 0;
  while (moe < pa.collectives.size() && pa.collectives[moe].ep_dispatch.nvlink_bytes <= 0) ++moe;
  REQUIRE(moe < pa.collectives.size());
  const double ratio = pf.collectives[moe].ep_dispatch.nvlink_bytes / pa.collectives[moe].ep_dispatch.nvlink_bytes;
  CHECK(ratio == Approx((1.0 - none_of_k(128, 16, 8)) * 8.0 / 8.0));  // EP 8: 16 experts per GPU
  CHECK(pf.layers[moe].ep_dispatch_s < pa.layers[moe].ep_dispatch_s);
  CHECK(pf.prediction.breakdown.ep_comm_s < pa.prediction.breakdown.ep_comm_s);
  // Everything else is the same step.
  CHECK(pf.prediction.breakdown.compute_fwd_s == Approx(pa.prediction.breakdown.compute_fwd_s));
}

TEST_CASE("epcomm: merged-1F1B overlap hides what the compute beside it covers, no more", "[epcomm]") {
  const Predictor& p = qwen235b_h100();
  Layout exposed = qwen235b_folded();
  Layout overlapped = exposed;
  overlapped.ep_a2a_overlap = true;
  const Prediction e = p.predict(exposed), o = p.predict(overlapped);
  REQUIRE(e.breakdown.ep_comm_s > 0);
  CHECK(o.breakdown.ep_comm_s < e.breakdown.ep_comm_s);
  // Four calls per layer cross 4 nodes' NICs; the expert GEMMs beside the dispatches
  // are shorter, so part stays exposed.
  CHECK(o.breakdown.ep_comm_s > 0.2 * e.breakdown.ep_comm_s);
  CHECK(o.step_time_s < e.step_time_s);

  SECTION("warm-up chunks have no partner: fewer micro-batches leave more exposed") {
    Layout few = overlapped, few_exposed = exposed;
    few.tokens_per_step = few_exposed.tokens_per_step = 256 * 4096;  // 16 micro-batches, 39 of 64 chunks warm-up
    const Prediction fo = p.predict(few), fe = p.predict(few_exposed);
    CHECK(fo.breakdown.ep_comm_s / fe.breakdown.ep_comm_s > o.breakdown.ep_comm_s / e.breakdown.ep_comm_s);
  }
}

TEST_CASE("epcomm: only a stack that names them runs flex dispatch and merged-1F1B overlap", "[epcomm]") {
  Layout l = qwen_node_ep();
  l.ep_dispatcher = EpDispatcher::kFlex;
  l.ep_a2a_overlap = true;
  const Stack megatron = load_stack(stack_path("megatron-bridge-2025"));
  const Stack marin = load_stack(stack_path("marin-july-2026"));
  CHECK(stack_runs(l, megatron));
  const std::vector<LayoutIssue> why = check_stack(l, marin);
  REQUIRE(why.size() >= 2);
  bool says_flex = false, says_overlap = false;
  for (const LayoutIssue& i : why) {
    says_flex = says_flex || i.detail.find("flex EP dispatcher") != std::string::npos;
    says_overlap = says_overlap || i.detail.find("ep_a2a_overlap") != std::string::npos;
  }
  CHECK(says_flex);
  CHECK(says_overlap);
}

TEST_CASE("epcomm: the layout fields read back as written", "[epcomm]") {
  Layout l = qwen_node_ep();
  l.ep_dispatcher = EpDispatcher::kFlex;
  l.ep_a2a_overlap = true;
  const Layout back = parse_layout(layout_to_json(l), "<test>");
  CHECK(back.ep_dispatcher == EpDispatcher::kFlex);
  CHECK(back.ep_a2a_overlap);
  const Layout plain = parse_layout(layout_to_json(qwen_node_ep()), "<test>");
  CHECK(plain.ep_dispatcher == EpDispatcher::kAllToAll);
  CHECK_FALSE(plain.ep_a2a_overlap);
  CHECK_FALSE(layout_to_json(qwen_node_ep()).contains("ep_dispatcher"));
}

TEST_CASE("epcomm: the sweep tries flex dispatch and merged-1F1B overlap only under a stack that names them", "[epcomm][sweep]") {
  const Predictor& p = testing::qwen235b_h100_8_nodes();
  const Stack bridge = load_stack(stack_path("megatron-bridge-2025"));
  Stack plain = bridge;
  plain.supports.ep_dispatchers = {EpDispatcher::kAllToAll};
  plain.supports.ep_a2a_overlap = false;
  const SweepResult with = testing::sweep_under(p, &bridge, 200);
  const SweepResult without = testing::sweep_under(p, &plain, 200);
  // Every EP layout is tried with 2 dispatchers x 2 overlap settings under the full stack.
  CHECK(with.enumerated > without.enumerated);
  CHECK(with.valid > without.valid);
  const auto count = [](const SweepResult& r, bool flex) {
    int n = 0;
    for (const auto& e : r.top) {
      if (flex ? e.layout.ep_dispatcher == EpDispatcher::kFlex : e.layout.ep_a2a_overlap) ++n;
    }
    return n;
  };
  CHECK(count(without, true) == 0);
  CHECK(count(without, false) == 0);
  // Flex sends fewer bytes than the all-to-all for the same layout, so the fastest EP layouts use it.
  INFO("top layouts with flex " << count(with, true) << ", with overlap " << count(with, false));
  CHECK(count(with, true) > 0);
}

TEST_CASE("epcomm: HybridEP moves the flex dispatcher's rows at its kernels' share of the link", "[epcomm]") {
  const Calibration& cal = default_calibration();
  // Its kernels leave the registered buffer's copy to the permute, which the Torch-API
  // figures (ep_nvlink) time with them: faster at every EP size measured, and slower at
  // larger EP (more peers per token) like every measured dispatcher.
  for (const int64_t ep : {8, 16, 32, 36}) {
    CHECK(ep_hybridep_dispatch_eff(cal, ep) > ep_dispatch_eff(cal, ep));
    CHECK(ep_hybridep_combine_eff(cal, ep) > ep_combine_eff(cal, ep));
  }
  CHECK(ep_hybridep_dispatch_eff(cal, 32) < ep_hybridep_dispatch_eff(cal, 8));

  const Predictor& p = qwen235b_gb200();
  const StepPrice deepep = p.price(qwen_rack_flex(FlexBackend::kDeepEp));
  const StepPrice hybrid = p.price(qwen_rack_flex(FlexBackend::kHybridEp));
  const size_t moe = first_moe_layer(deepep);
  REQUIRE(moe < deepep.collectives.size());
  // The same rows on the same tiers (one per token and destination GPU) ...
  const CommCost& d = deepep.collectives[moe].ep_dispatch;
  const CommCost& h = hybrid.collectives[moe].ep_dispatch;
  CHECK(h.nvlink_bytes == Approx(d.nvlink_bytes));
  CHECK(h.nic_bytes == Approx(d.nic_bytes));
  // ... at the backend's rate: the bandwidth time scales with 1 / efficiency.
  CHECK(h.bw_s / d.bw_s == Approx(ep_dispatch_eff(cal, 32) / ep_hybridep_dispatch_eff(cal, 32)));
  const CommCost& dc = deepep.collectives[moe].ep_combine;
  const CommCost& hc = hybrid.collectives[moe].ep_combine;
  CHECK(hc.bw_s / dc.bw_s == Approx(ep_combine_eff(cal, 32) / ep_hybridep_combine_eff(cal, 32)));
  CHECK(hybrid.prediction.breakdown.ep_comm_s < deepep.prediction.breakdown.ep_comm_s);
  // Only the EP calls change.
  CHECK(hybrid.prediction.breakdown.compute_fwd_s == Approx(deepep.prediction.breakdown.compute_fwd_s));
  CHECK(hybrid.prediction.breakdown.compute_bwd_s == Approx(deepep.prediction.breakdown.compute_bwd_s));

  SECTION("the all-to-all dispatcher has no backend: the field is the flex dispatcher's") {
    Layout a2a = qwen_rack_flex(FlexBackend::kHybridEp);
    a2a.ep_dispatcher = EpDispatcher::kAllToAll;
    Layout a2a_deepep = a2a;
    a2a_deepep.ep_flex_backend = FlexBackend::kDeepEp;
    CHECK(p.predict(a2a).breakdown.ep_comm_s == Approx(p.predict(a2a_deepep).breakdown.ep_comm_s));
    nlohmann::json j = layout_to_json(qwen_node_ep());
    j["ep_flex_backend"] = "hybridep";
    CHECK_THROWS_AS(parse_layout(j, "a2a.json"), UserError);
  }

  SECTION("the backend reads back as written; DeepEP, Megatron-Core's default, is not written") {
    const Layout back = parse_layout(layout_to_json(qwen_rack_flex(FlexBackend::kHybridEp)), "<test>");
    CHECK(back.ep_flex_backend == FlexBackend::kHybridEp);
    CHECK(layout_to_json(qwen_rack_flex(FlexBackend::kHybridEp))["ep_flex_backend"] == "hybridep");
    CHECK_FALSE(layout_to_json(qwen_rack_flex(FlexBackend::kDeepEp)).contains("ep_flex_backend"));
    CHECK(parse_layout(layout_to_json(qwen_rack_flex(FlexBackend::kDeepEp)), "<test>").ep_flex_backend ==
          FlexBackend::kDeepEp);
  }
}

TEST_CASE("epcomm: HybridEP is run and swept only under a stack that ships it", "[epcomm][sweep]") {
  const Stack bridge = load_stack(stack_path("megatron-bridge-2025"));
  Stack deepep_only = bridge;
  deepep_only.supports.ep_flex_backends = {FlexBackend::kDeepEp};
  const Layout hybrid = qwen_rack_flex(FlexBackend::kHybridEp);
  CHECK(stack_runs(hybrid, bridge));
  const std::vector<LayoutIssue> why = check_stack(hybrid, deepep_only);
  REQUIRE(why.size() == 1);
  CHECK(why[0].detail.find("HybridEP") != std::string::npos);
  CHECK(stack_runs(qwen_rack_flex(FlexBackend::kDeepEp), deepep_only));

  const Predictor& p = testing::qwen235b_h100_8_nodes();
  const SweepResult with = testing::sweep_under(p, &bridge, 200);
  const SweepResult without = testing::sweep_under(p, &deepep_only, 200);
  const SweepResult no_stack = testing::sweep_under(p, nullptr, 200);
  CHECK(with.enumerated > without.enumerated);
  const auto hybrid_count = [](const SweepResult& r) {
    int n = 0;
    for (const auto& e : r.top) n += e.layout.ep_flex_backend == FlexBackend::kHybridEp ? 1 : 0;
    return n;
  };
  CHECK(hybrid_count(without) == 0);
  CHECK(hybrid_count(no_stack) == 0);  // a library only a stack's file names
  INFO("top layouts with HybridEP " << hybrid_count(with));
  CHECK(hybrid_count(with) > 0);
}
