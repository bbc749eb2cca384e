// Multi-process training helpers without MPI (exec/dist.h): ZeRO shards of the
// tiny model's arena (tiling, whole tensors, owner steps equal to the full
// step), sequence slices, the single-process communicator, and the EP
// transports' local decisions composed over an in-memory all-to-all, which
// must drop exactly what sim::dispatch drops. The MPI paths themselves run in
// tests/cli/train_mpi.sh.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>

#include "exec/dist.h"
#include "sim/base/source_dir.h"
#include "exec/optim.h"
#include "sim/base/check.h"
#include "models/layer_graph.h"
#include "models/model.h"
#include "sim/base/dispatch.h"

using namespace rackstep;
using namespace rackstep::exec;

namespace {

std::shared_ptr<const ArenaLayout> tiny_layout() {
  const auto g = models::build_layer_graph(models::load_model(std::string(rackstep::source_dir()) +
                                                              "/models/zoo/tiny-moe.json"));
  return std::make_shared<const ArenaLayout>(arena_specs_from_graph(g));
}

void fill(Arena& a, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-scale, scale);
  for (size_t i = 0; i < a.layout().size(); ++i) {
    TensorView t = a.view(i);
    for (int64_t j = 0; j < t.numel; ++j) t.data[j] = u(rng);
  }
}

// Random assignments of S ranks, `tokens` each; `hot` > 0 sends that share of
// first choices to expert 0 (a skewed router).
std::vector<std::vector<int32_t>> random_assignments(uint32_t seed, int S, int tokens, int E, int k, double hot) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> pick(0, E - 1);
  std::uniform_real_distribution<double> u(0, 1);
  std::vector<std::vector<int32_t>> out(static_cast<size_t>(S));
  for (auto& a : out) {
    for (int t = 0; t < tokens; ++t) {
      std::vector<int32_t> chosen;
      while (static_cast<int>(chosen.size()) < k) {
        const int e = (chosen.empty() && u(rng) < hot) ? 0 : pick(rng);
        if (std::find(chosen.begin(), chosen.end(), e) == chosen.end()) chosen.push_back(e);
      }
      a.insert(a.end(), chosen.begin(), chosen.end());
    }
  }
  return out;
}

}  // namespace

TEST_CASE("ZeRO shards are whole tensors that tile every arena", "[dist]") {
  const auto layout = tiny_layout();
  Arena params(layout);
  fill(params, 1, 0.5f);
  const OptimizerState full = init_optimizer_state(params);
  for (int world : {1, 2, 3, 4, 7}) {
    const ShardPlan plan = make_shard_plan(*layout, world);
    REQUIRE(static_cast<int>(plan.shards.size()) == world);
    int64_t floats = 0, v = 0, w0 = 0;
    size_t next = 0;
    for (const ParamShard& s : plan.shards) {
      CHECK(s.begin == next);
      CHECK(s.offset == floats);
      CHECK(s.v_offset == v);
      CHECK(s.w0_offset == w0);
      next = s.end;
      floats += s.floats;
      v += s.v_floats;
      w0 += s.w0_count;
      // The shard's own arena is its range of the full one, float for float.
      const auto sl = shard_layout(*layout, s);
      CHECK(sl->total_floats() == s.floats);
      Arena own(sl);
      std::copy_n(params.data() + s.offset, s.floats, own.data());
      const OptimizerState st = init_optimizer_state(own);
      CHECK(st.second_moment.total_floats() == s.v_floats);
      REQUIRE(static_cast<int64_t>(st.w0_norm.size()) == s.w0_count);
      for (int64_t i = 0; i < s.w0_count; ++i) CHECK(st.w0_norm[i] == full.w0_norm[s.w0_offset + i]);
    }
    CHECK(next == layout->size());
    CHECK(floats == params.total_floats());
    CHECK(v == full.second_moment.total_floats());
    CHECK(w0 == static_cast<int64_t>(full.w0_norm.size()));
  }
}

TEST_CASE("owners stepping their shards equal one full optimizer step, bitwise", "[dist]") {
  const auto layout = tiny_layout();
  Arena params(layout), grads(layout);
  fill(params, 2, 0.5f);
  OptimizerConfig cfg;
  cfg.adam_lr = 0.01;
  cfg.muonh_lr = 0.04;
  cfg.total_steps = 10;
  OptimizerState full = init_optimizer_state(params);
  Arena stepped = params;
  const int world = 3;
  const ShardPlan plan = make_shard_plan(*layout, world);
  std::vector<Arena> own_p, own_g;
  std::vector<OptimizerState> own_st;
  for (const ParamShard& s : plan.shards) {
    own_p.emplace_back(shard_layout(*layout, s));
    own_g.emplace_back(own_p.back().layout_ptr());
    std::copy_n(params.data() + s.offset, s.floats, own_p.back().data());
    own_st.push_back(init_optimizer_state(own_p.back()));
  }
  for (int step = 0; step < 3; ++step) {
    fill(grads, 10 + step, 1.0f);
    Optimizer(cfg).step(stepped, grads, full);
    for (int r = 0; r < world; ++r) {
      const ParamShard& s = plan.shards[static_cast<size_t>(r)];
      std::copy_n(grads.data() + s.offset, s.floats, own_g[r].data());  // the reduce-scatter's result
      Optimizer(cfg).step(own_p[r], own_g[r], own_st[r]);
    }
  }
  // All-gather of the shards = the full step's parameters; the gathered
  // moments = the full state's (what a checkpoint writes).
  for (int r = 0; r < world; ++r) {
    const ParamShard& s = plan.shards[static_cast<size_t>(r)];
    CHECK(std::memcmp(own_p[r].data(), stepped.data() + s.offset, sizeof(float) * s.floats) == 0);
    CHECK(std::memcmp(own_st[r].momentum.data(), full.momentum.data() + s.offset, sizeof(float) * s.floats) == 0);
    CHECK(std::memcmp(own_st[r].second_moment.data(), full.second_moment.data() + s.v_offset,
                      sizeof(float) * s.v_floats) == 0);
    CHECK(own_st[r].step == full.step);
  }
}

TEST_CASE("sequence slices split the global batch evenly or refuse", "[dist]") {
  CHECK(sequence_slice(8, 4, 0) == std::make_pair<int64_t, int64_t>(0, 2));
  CHECK(sequence_slice(8, 4, 3) == std::make_pair<int64_t, int64_t>(6, 8));
  CHECK(sequence_slice(5, 1, 0) == std::make_pair<int64_t, int64_t>(0, 5));
  CHECK_THROWS_AS(sequence_slice(6, 4, 0), UserError);
}

TEST_CASE("a range's reduce-scatter parts are its intersections with the shards in rank order",
          "[dist]") {
  const std::vector<int64_t> offsets = {0, 10, 10, 25}, counts = {10, 0, 15, 5};  // rank 1 owns nothing
  const RangeParts p = range_parts(offsets, counts, 6, 27);
  CHECK(p.offsets == std::vector<int64_t>{6, 10, 10, 25});
  CHECK(p.counts == std::vector<int64_t>{4, 0, 15, 2});
  CHECK(p.shard_offsets == std::vector<int64_t>{6, 0, 0, 0});
  const RangeParts inside = range_parts(offsets, counts, 12, 20);  // within rank 2's shard
  CHECK(inside.counts == std::vector<int64_t>{0, 0, 8, 0});
  CHECK(inside.offsets[2] == 12);
  CHECK(inside.shard_offsets[2] == 2);
  const RangeParts whole = range_parts(offsets, counts, 0, 30);  // the whole arena: the shards themselves
  CHECK(whole.offsets == offsets);
  CHECK(whole.counts == counts);
  CHECK(whole.shard_offsets == std::vector<int64_t>{0, 0, 0, 0});
}

TEST_CASE("a range splits evenly over the ranks only when every part has the same nonzero size", "[dist]") {
  const auto even = [](const std::vector<int64_t>& offsets, const std::vector<int64_t>& counts, int64_t begin,
                       int64_t end) {
    const RangeParts p = range_parts(offsets, counts, begin, end);
    return even_part_floats(p.offsets, p.counts);
  };
  const std::vector<int64_t> offsets = {0, 8, 16, 24}, counts = {8, 8, 8, 8};
  CHECK(even(offsets, counts, 0, 32) == 8);  // the whole arena: one ncclReduceScatter
  CHECK(even(offsets, counts, 4, 28) == 0);  // parts of 4, 8, 8, 4
  CHECK(even(offsets, counts, 8, 16) == 0);  // rank 1's shard only: the other parts are empty
  CHECK(even(offsets, counts, 0, 0) == 0);   // nothing to reduce
  CHECK(even({0, 10, 10, 25}, {10, 0, 15, 5}, 0, 30) == 0);  // uneven shards
  CHECK(even({0}, {12}, 3, 9) == 6);                         // one rank: always even
}

TEST_CASE("one process: the world is rank 0 of 1 and collectives copy", "[dist]") {
  if (launcher_world_size() > 1) return;  // started by mpirun: not this case
  Comm world = Comm::world();
  CHECK(world.rank() == 0);
  CHECK(world.size() == 1);
  const float x[3] = {1, 2, 3};
  float y[3] = {0, 0, 0};
  world.reduce_scatter_sum(x, y, {3});
  CHECK(y[2] == 3.0f);
  float z[3] = {0, 0, 0};
  world.start_reduce_scatter_sum(x, z, {3});
  world.wait_started();
  CHECK(z[2] == 3.0f);
  double d = 2.5;
  world.allreduce_sum(&d, 1);
  CHECK(d == 2.5);
}

TEST_CASE("without MPI, a multi-process launch is one clear error", "[dist]") {
  if (mpi_available() || launcher_world_size() > 1) return;  // MPI builds: tests/cli/train_mpi.sh
  setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
  CHECK_THROWS_AS(Comm::world(), UserError);
  unsetenv("OMPI_COMM_WORLD_SIZE");
}

TEST_CASE("pooled sends: rank r of a destination goes to wave r mod W, slot r div W", "[dist]") {
  // S = 2 ranks, 1 expert each, W = 2 waves of P = 2 rows, logical pool limit 1.
  const int32_t expert[4] = {0, 0, 0, 1};
  const SendPlan p = plan_pooled_send(expert, 4, 2, 1, 2, 2, 1);
  CHECK(p.rows == 8);
  CHECK(p.row_of[0] == 0);   // rank 0: wave 0, dest 0, slot 0
  CHECK(p.row_of[1] == 4);   // rank 1: wave 1, dest 0, slot 0
  CHECK(p.row_of[2] == -1);  // rank 2 >= limit 1 * W: sender drop
  CHECK(p.row_of[3] == 2);   // dest 1, wave 0, slot 0
  // Receiver with limit 1 per expert per wave: source 0 before source 1 in a slot.
  const int32_t header[8] = {0, -1, 0, -1, 0, -1, -1, -1};  // (w, s, slot)
  const RecvPlan r = plan_pooled_receive(header, 2, 1, 2, 2, 1);
  CHECK(r.kept_rows == std::vector<int64_t>{0, 4});  // row 2 (wave 0, source 1) is past the limit
  CHECK(r.kept[2] == 0);
}

TEST_CASE("the transports' local decisions drop exactly what sim::dispatch drops", "[dist][dispatch]") {
  int64_t dropped_somewhere = 0;
  for (sim::Transport t : {sim::Transport::pooled, sim::Transport::ragged}) {
    for (int S : {1, 2, 4}) {
      for (double cf : {0.6, 1.0, 1.25, 4.0}) {
        for (double hot : {0.0, 0.5}) {
          sim::DispatchConfig cfg;
          cfg.n_experts = 8;
          cfg.top_k = 2;
          cfg.transport = t;
          cfg.sender_cf = cf;
          cfg.receiver_cf = cf * 1.05;
          cfg.waves = 3;
          cfg.ragged_chunks = 2;
          const auto experts = random_assignments(static_cast<uint32_t>(S * 100 + cf * 10 + hot * 7), S, 64, 8, 2, hot);
          std::vector<sim::GpuAssignments> gpus(static_cast<size_t>(S));
          for (int s = 0; s < S; ++s) gpus[s].experts = experts[s];
          const sim::DispatchResult want = sim::dispatch(cfg, gpus);
          const sim::DispatchResult got = transport_decisions(cfg, experts);
          INFO(sim::transport_name(t) << " S=" << S << " cf=" << cf << " hot=" << hot);
          REQUIRE(got.keep == want.keep);
          CHECK(got.counts.sender == want.counts.sender);
          CHECK(got.counts.receiver == want.counts.receiver);
          CHECK(got.counts.assignments == want.counts.assignments);
          dropped_somewhere += got.counts.dropped();
        }
      }
    }
  }
  CHECK(dropped_somewhere > 0);  // the small capacity factors do drop
}

TEST_CASE("the capacity transport is not an EP transport across processes", "[dist]") {
  sim::DispatchConfig cfg;
  cfg.n_experts = 8;
  cfg.top_k = 2;
  cfg.transport = sim::Transport::capacity;
  CHECK_THROWS_AS(transport_decisions(cfg, random_assignments(1, 2, 8, 8, 2, 0)), UserError);
}

// The shared plan (exec/ep_plan.h) as a transport uses it, with the dispatch's
// grouping a permutation: every index a device gather reads (send_source,
// result_row, grad_source, compute_of_row) must point where the MPI transport
// copies, and the exchange blocks must tile both buffers.
TEST_CASE("one rank's EP plan: gather indices and exchange blocks agree with its decisions", "[dist][dispatch]") {
  for (sim::Transport t : {sim::Transport::pooled, sim::Transport::ragged}) {
    const int S = 2, tokens = 48, E = 8, k = 2;
    sim::DispatchConfig cfg;
    cfg.n_experts = E;
    cfg.top_k = k;
    cfg.transport = t;
    cfg.sender_cf = 0.7;
    cfg.receiver_cf = 0.7;
    cfg.waves = 2;
    INFO(sim::transport_name(t));
    const auto experts = random_assignments(7, S, tokens, E, k, 0.5);
    const sim::DispatchResult want = transport_decisions(cfg, experts);
    // Rank 0 alone, its rows grouped by a shuffled order; the group's exchange in memory.
    std::vector<int32_t> sorted_pos(static_cast<size_t>(tokens * k));
    std::iota(sorted_pos.begin(), sorted_pos.end(), 0);
    std::shuffle(sorted_pos.begin(), sorted_pos.end(), std::mt19937(3));
    std::vector<EpLayerPlan> plans;
    for (int s = 0; s < S; ++s) plans.emplace_back(cfg, S, experts[s].data(), sorted_pos.data(), tokens);
    for (int d = 0; d < S; ++d) {
      std::vector<int32_t> counts(static_cast<size_t>(S));
      for (int s = 0; s < S; ++s) counts[s] = plans[s].send.rows_to[d];
      plans[d].set_rows_from(counts.data());
    }
    for (const bool back : {false, true}) {
      for (int w = 0; w < plans[0].phases(); ++w) {
        const ExchangeBlocks b = plans[0].blocks(w, back);
        for (int p = 0; p < S; ++p) {  // the peer's matching block has as many rows
          CHECK(plans[p].blocks(w, back).recv_rows[0] == b.send_rows[p]);
        }
      }
    }
    int64_t send_total = 0, recv_total = 0;
    for (int w = 0; w < plans[0].phases(); ++w) {
      const ExchangeBlocks b = plans[0].blocks(w, false);
      for (int p = 0; p < S; ++p) {
        send_total += b.send_rows[p];
        recv_total += b.recv_rows[p];
      }
    }
    CHECK(send_total == plans[0].send.rows);
    CHECK(recv_total == plans[0].recv_rows());
    // Receive with every row kept, then return what sim::dispatch keeps for rank 0.
    std::vector<int32_t> returned(static_cast<size_t>(plans[0].send.rows), 0);
    for (int64_t a = 0; a < tokens * k; ++a) {
      const int64_t row = plans[0].send.row_of[a];
      if (row >= 0) returned[row] = want.keep[0][a];
    }
    std::vector<uint8_t> keep(static_cast<size_t>(tokens * k), 9);
    sim::DropCounts drops;
    plans[0].finish(returned.data(), keep.data(), drops);
    CHECK(drops.sender == want.per_gpu[0].sender);
    CHECK(drops.receiver == want.per_gpu[0].receiver);
    CHECK(plans[0].sent_kept == want.keep[0]);
    for (int64_t a = 0; a < tokens * k; ++a) {
      const int32_t pos = sorted_pos[a];
      const int64_t row = plans[0].send.row_of[a];
      CHECK(keep[pos] == want.keep[0][a]);
      if (row >= 0) CHECK(plans[0].send_source[row] == pos);  // the dispatch gathers the assignment's row
      CHECK(plans[0].result_row[pos] == (want.keep[0][a] ? row : -1));
      if (row >= 0) CHECK(plans[0].grad_source[row] == (want.keep[0][a] ? pos : -1));
    }
  }
}

// The device transport plans each exchange phase as its rows land and computes
// phase by phase (exec/cuda/experts.cpp), so that a pooled wave's experts run
// while the next wave travels: a phase's decisions must read only its own rows'
// headers, and the compute order must hold each phase's rows together, by
// local expert, in the receive buffer's part of that phase.
TEST_CASE("EP receive decisions phase by phase: each wave's from its own rows, computed wave by wave",
          "[dist][dispatch]") {
  for (sim::Transport t : {sim::Transport::pooled, sim::Transport::ragged}) {
    const int S = 2, tokens = 48, E = 8, k = 2, local = E / S;
    sim::DispatchConfig cfg;
    cfg.n_experts = E;
    cfg.top_k = k;
    cfg.transport = t;
    cfg.sender_cf = 0.9;
    cfg.receiver_cf = 0.7;
    cfg.waves = 3;
    cfg.ragged_chunks = 2;
    INFO(sim::transport_name(t));
    const auto experts = random_assignments(11, S, tokens, E, k, 0.5);
    std::vector<int32_t> identity(static_cast<size_t>(tokens * k));
    std::iota(identity.begin(), identity.end(), 0);
    std::vector<EpLayerPlan> plans;
    for (int s = 0; s < S; ++s) plans.emplace_back(cfg, S, experts[s].data(), identity.data(), tokens);
    for (int d = 0; d < S; ++d) {
      std::vector<int32_t> counts(static_cast<size_t>(S));
      for (int s = 0; s < S; ++s) counts[s] = plans[s].send.rows_to[d];
      plans[d].set_rows_from(counts.data());
    }
    // Rank 0's received headers, every source's blocks moved as the exchange moves them.
    EpLayerPlan& me = plans[0];
    std::vector<int32_t> header(static_cast<size_t>(me.recv_rows()), -7);
    for (int w = 0; w < me.phases(); ++w) {
      const ExchangeBlocks mine = me.blocks(w, false);
      for (int s = 0; s < S; ++s) {
        const ExchangeBlocks theirs = plans[s].blocks(w, false);
        std::copy_n(plans[s].send_header.begin() + theirs.send_at[0], theirs.send_rows[0],
                    header.begin() + mine.recv_at[s]);
      }
    }
    EpLayerPlan whole = me, phased = me;
    whole.plan_receive(header.data());
    CHECK(me.recv_phase_begin(me.phases()) == me.recv_rows());
    for (int p = 0; p < phased.phases(); ++p) {
      // Later phases' rows not landed yet: empty slots, which would change the decisions if read.
      std::vector<int32_t> landed(header.begin(), header.begin() + phased.recv_phase_begin(p + 1));
      landed.resize(header.size(), -1);
      phased.plan_receive_phase(p, landed.data());
    }
    CHECK(phased.recv.kept_rows == whole.recv.kept_rows);
    CHECK(phased.recv.offsets == whole.recv.offsets);
    CHECK(phased.recv_header == whole.recv_header);
    CHECK(phased.compute_rows == whole.compute_rows);
    const auto R = static_cast<int64_t>(whole.recv.kept_rows.size());
    REQUIRE(static_cast<int64_t>(whole.compute_rows.size()) == R);
    REQUIRE(static_cast<int>(whole.phase_rows.size()) == whole.phases());
    int64_t next = 0;
    for (int p = 0; p < whole.phases(); ++p) {
      const PhaseRows& pr = whole.phase_rows[static_cast<size_t>(p)];
      CHECK(pr.first == next);
      REQUIRE(static_cast<int>(pr.offsets.size()) == local + 1);
      for (int e = 0; e < local; ++e) {
        for (int32_t j = pr.offsets[e]; j < pr.offsets[e + 1]; ++j) {
          const int32_t row = whole.compute_rows[static_cast<size_t>(pr.first + j)];
          CHECK(row >= whole.recv_phase_begin(p));  // the phase's own part of the receive buffer
          CHECK(row < whole.recv_phase_begin(p + 1));
          CHECK(header[row] == e);  // grouped by local expert
          CHECK(whole.compute_of_row[row] == pr.first + j);
        }
      }
      next = pr.first + pr.offsets[local];
    }
    CHECK(next == R);
    CHECK(std::count_if(whole.compute_of_row.begin(), whole.compute_of_row.end(), [](int32_t j) { return j >= 0; }) ==
          R);
    std::vector<int64_t> computed(whole.compute_rows.begin(), whole.compute_rows.end()), kept = whole.recv.kept_rows;
    std::sort(computed.begin(), computed.end());
    std::sort(kept.begin(), kept.end());
    CHECK(computed == kept);  // the same rows as the one-call order, reordered
    if (t == sim::Transport::pooled) {
      CHECK(R < whole.recv_rows());  // the receiver capacity binds
      CHECK(std::vector<int64_t>(whole.compute_rows.begin(), whole.compute_rows.end()) != whole.recv.kept_rows);
    } else {
      CHECK(std::vector<int64_t>(whole.compute_rows.begin(), whole.compute_rows.end()) == whole.recv.kept_rows);
    }
  }
}
