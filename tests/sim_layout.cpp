// Layouts: JSON round trip, strict reading, and every invalid layout rejected
// with the right reason.
#include <catch2/catch.hpp>

#include <algorithm>

#include "models/check.h"
#include "models/source_dir.h"
#include "models/layer_graph.h"
#include "sim/layout.h"

using namespace rackstep;
using namespace rackstep::sim;

namespace {

const models::LayerGraph& hero_graph() {
  static const models::LayerGraph g =
      models::build_layer_graph(models::load_model(std::string(rackstep::source_dir()) + "/models/zoo/marin-535b-a23b.json"));
  return g;
}

topologies::Cluster racks(int64_t n) {
  return topologies::load_cluster(std::string(rackstep::source_dir()) + "/topologies/zoo/gb200-nvl72.json", n);
}

Layout hero_layout() { return load_layout(std::string(rackstep::source_dir()) + "/sim/layouts/hero-ragged.json"); }

bool has_reason(const std::vector<LayoutIssue>& v, Reason r) {
  return std::any_of(v.begin(), v.end(), [&](const LayoutIssue& i) { return i.reason == r; });
}

}  // namespace

TEST_CASE("the hero production layout is valid on 11 racks", "[layout]") {
  const Layout l = hero_layout();
  CHECK(l.data == 704);
  CHECK(l.ep == 64);
  CHECK(l.fsdp == 64);
  CHECK(l.recompute == models::Recompute::kFull);
  CHECK(l.offload_residual);
  CHECK(l.optimizer_state == StatePlacement::kHost);
  CHECK(check_layout(l, hero_graph(), racks(11)).empty());
  CHECK(micro_batches(l, hero_graph()) == 1);
}

TEST_CASE("layouts survive a JSON round trip", "[layout]") {
  Layout l = hero_layout();
  l.pp = 4;
  l.pp_virtual = 2;
  l.schedule = PpSchedule::kInterleaved1F1B;
  l.cp = 2;
  l.cp_kind = CpKind::kAllGatherKv;
  l.ep_transport = Transport::pooled;
  l.sender_cf = 1.3;
  const Layout back = parse_layout(layout_to_json(l), "roundtrip");
  CHECK(layout_to_json(back) == layout_to_json(l));
}

TEST_CASE("layout JSON is read strictly", "[layout]") {
  nlohmann::json j = layout_to_json(hero_layout());
  j["exprt_parallel"] = 8;
  CHECK_THROWS_AS(parse_layout(j, "bad.json"), UserError);
  nlohmann::json k = layout_to_json(hero_layout());
  k["recompute"] = "sometimes";
  CHECK_THROWS_AS(parse_layout(k, "bad.json"), UserError);
  CHECK_THROWS_AS(load_layout("/nonexistent/layout.json"), UserError);
}

TEST_CASE("invalid layouts are rejected with the right reason", "[layout]") {
  const auto& g = hero_graph();
  const auto c = racks(11);
  Layout base = hero_layout();

  Layout l = base;
  l.data = 700;
  CHECK(has_reason(check_layout(l, g, c), Reason::kGpuProduct));

  l = base;
  l.ep = 5;  // divides neither 384 experts nor 704 data ranks
  auto why = check_layout(l, g, c);
  CHECK(has_reason(why, Reason::kEpExperts));
  CHECK(has_reason(why, Reason::kEpDivides));

  l = base;
  l.pp = 5;  // breaks the layers and the GPU product
  why = check_layout(l, g, c);
  CHECK(has_reason(why, Reason::kPpLayers));
  CHECK(has_reason(why, Reason::kGpuProduct));

  l = base;
  l.data = 352;
  l.cp = 2;
  l.seq_len = 4098;  // 4 chunks do not divide it
  CHECK(has_reason(check_layout(l, g, c), Reason::kCpSeq));

  l = base;
  l.data = 64;
  l.fsdp = 64;
  l.tp = 11;  // 48 heads
  CHECK(has_reason(check_layout(l, g, c), Reason::kTpHeads));

  l = base;
  l.data = 11;
  l.tp = 64 * 2;  // twice an NVLink domain
  CHECK(has_reason(check_layout(l, g, c), Reason::kTpDomain));

  l = base;
  l.fsdp = 48;
  CHECK(has_reason(check_layout(l, g, c), Reason::kFsdpDivides));

  l = base;
  l.micro_batch_seqs = 3;  // 16 sequences per rank
  CHECK(has_reason(check_layout(l, g, c), Reason::kBatchSplit));

  l = base;
  l.schedule = PpSchedule::kDualPipeV;
  CHECK(has_reason(check_layout(l, g, c), Reason::kPpSchedule));

  Reason r = Reason::kCount;
  l = base;
  l.pp = 5;
  CHECK(first_issue(l, g, c, &r));
  CHECK(r == Reason::kGpuProduct);
  CHECK_FALSE(first_issue(base, g, c, &r));
}

TEST_CASE("a layout's EP transport is the dispatch library's, pooled or ragged, with its defaults", "[layout]") {
  // One enum and one set of defaults for layouts and the dispatch library.
  const Layout plain;
  const DispatchConfig dispatch;
  CHECK(plain.sender_cf == dispatch.sender_cf);
  CHECK(plain.receiver_cf == dispatch.receiver_cf);
  CHECK(plain.waves == dispatch.waves);
  CHECK(plain.ragged_chunks == dispatch.ragged_chunks);
  nlohmann::json j = layout_to_json(hero_layout());
  j.erase("sender_cf");
  j.erase("waves");
  const Layout read = parse_layout(j, "defaults.json");
  CHECK(read.sender_cf == kDefaultSenderCf);
  CHECK(read.waves == kDefaultWaves);
  CHECK(read.ep_transport == Transport::ragged);
  Layout capacity = hero_layout();
  capacity.ep_transport = Transport::capacity;
  CHECK(has_reason(check_layout(capacity, hero_graph(), racks(11)), Reason::kWaves));
  j["ep_transport"] = "capacity";
  CHECK_THROWS_AS(parse_layout(j, "capacity.json"), UserError);
}
