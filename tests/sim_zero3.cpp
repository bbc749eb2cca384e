// ZeRO-3 under DeepSpeed's 2021 coordinator (issue 13), each mechanism against the
// figure its source gives:
//  - NCCL's tuning-model ring latency (src/graph/tuning.cc of NCCL 2.7.8 / 2.8.4):
//    baseLat + (nRanks-1 - (nNodes-1))·intraLat + (nNodes-1)·interLat per ring pass;
//  - the coordinator's prefetch under stage3_max_live_parameters, the host's
//    per-rank list work of every gather and reduce-scatter (partition_parameters.py
//    of DeepSpeed v0.3.13), and the gathered-weight / gradient working set.
// The DeepSpeed stacks time ZeRO-3 with all of them and hold its working set (with
// grad_reduce_bucket_params, DeepSpeed's reduce_bucket_size). Each is checked on its own
// here, with the unfused attention's score matrices the 2021 Megatron-LM stacks keep.
#include <catch2/catch.hpp>

#include <string>

#include "sim/base/check.h"
#include "sim/base/json_io.h"
#include "sim/base/source_dir.h"
#include "sim/collectives.h"
#include "sim/cost.h"
#include "sim/predict.h"
#include "sim/stack.h"

using namespace rackstep;
using namespace rackstep::sim;

namespace {

std::string src(const std::string& p) { return std::string(rackstep::source_dir()) + "/" + p; }

// NCCL 2.8.4 src/graph/tuning.cc, Ring / Simple: baseLat 8.4 us, hwLat NVLINK 3.4 us, NET 9.6 us.
Calibration nccl_2021(Calibration c) {
  c.ring_base_latency_s = 8.4e-6;
  c.ring_intra_hop_latency_s = 3.4e-6;
  c.ring_inter_hop_latency_s = 9.6e-6;
  return c;
}

// DeepSpeed v0.3.13 defaults (deepspeed/runtime/zero/constants.py).
Calibration deepspeed_2021(Calibration c) {
  c.fsdp_gather_per_module = true;
  c.fsdp_regather_for_recompute = true;
  c.fsdp_prefetch_bucket_params = 5e7;         // stage3_prefetch_bucket_size
  c.fsdp_max_live_params = 1e9;                // stage3_max_live_parameters
  c.fsdp_max_reuse_distance_params = 1e9;      // stage3_max_reuse_distance
  c.fsdp_persistence_threshold_params = 1e5;   // stage3_param_persistence_threshold
  c.grad_reduce_bucket_params = 5e8;           // reduce_bucket_size
  return nccl_2021(c);
}

topologies::Cluster dgx(int64_t nodes) { return topologies::load_cluster(src("topologies/zoo/dgx-a100-80gb.json"), nodes); }

const models::LayerGraph& gpt(const std::string& name) {
  static const auto g175 = models::build_layer_graph(models::load_model(src("tests/validation/models/gpt-175b.json")));
  static const auto g530 =
      models::build_layer_graph(models::load_model(src("tests/validation/models/megatron-gpt-529.6b.json")));
  return name == "175b" ? g175 : g530;
}

// ZeRO-3 over every GPU of `nodes` DGX A100 nodes, full recompute, one micro-batch of mb sequences.
Layout zero3(int64_t gpus, int64_t mb) {
  Layout l;
  l.data = gpus;
  l.fsdp = gpus;
  l.zero_stage = 3;
  l.micro_batch_seqs = mb;
  l.tokens_per_step = static_cast<double>(gpus * mb * 2048);
  l.recompute = models::Recompute::kFull;
  return l;
}

Prediction run(const std::string& model, int64_t nodes, int64_t mb, const Calibration& cal) {
  const auto c = dgx(nodes);
  return Predictor(gpt(model), c, cal).predict(zero3(nodes * 8, mb));
}

}  // namespace

TEST_CASE("NCCL's tuning-model ring latency: one flat ring, inter-node steps at the network's hop", "[zero3][collectives]") {
  const Network net = make_network(dgx(192), nccl_2021(default_calibration()));
  const Group all = group_of(net, 1536, 1);
  REQUIRE(all.domains == 192);
  // 1535 steps, 191 of them across nodes: 8.4 + 1344 x 3.4 + 191 x 9.6 us.
  CHECK(ring_pass_latency_s(net, all) == Approx(8.4e-6 + 1344 * 3.4e-6 + 191 * 9.6e-6).epsilon(1e-9));
  // A 1-byte gather is its latency; the bandwidth term is unchanged by the latency model.
  CHECK(all_gather_s(net, all, 1.0) == Approx(ring_pass_latency_s(net, all)).epsilon(1e-6));
  const Network fitted = make_network(dgx(192), default_calibration());
  CHECK(all_gather_s(net, all, 1e9) - ring_pass_latency_s(net, all) ==
        Approx(all_gather_s(fitted, all, 1e9) - ring_pass_latency_s(fitted, all)).epsilon(1e-9));
  // Without the table: the per-tier alphas (191 cross-node steps at the fitted step latency).
  CHECK(ring_pass_latency_s(fitted, all) ==
        Approx(191 * fitted.inter_step_alpha_s + 7 * fitted.intra_alpha_s).epsilon(1e-9));
}

TEST_CASE("DeepSpeed's coordinator: no gather hides behind compute; list work per rank is exposed", "[zero3]") {
  const Calibration ds = deepspeed_2021(default_calibration());
  const Prediction p = run("175b", 48, 4, ds);
  REQUIRE(p.valid);
  // The layer graph's GPT-175B block, one module per op, gathers 5 modules (q, k, v, o at
  // h^2 + h, the GeLU MLP at 2 x h x 4h + 5h; the norms stay whole): forward, recompute and
  // backward (the MLP, used last, kept from the recompute), each gather exposed in full;
  // the 14 reduce-scatters (one per parameter tensor: the norms' gains, the weights and
  // their biases) show only beyond the backward beside them.
  const Network net = make_network(dgx(48), ds);
  const Group all = group_of(net, 384, 1);
  const double h = 12288.0;
  const double qkvo = 4.0 * all_gather_s(net, all, (h * h + h) * 2.0);
  const double mlp = all_gather_s(net, all, (8.0 * h * h + 5.0 * h) * 2.0);
  const double gathers = 96.0 * (2.0 * (qkvo + mlp) + qkvo);
  double rs = 2.0 * reduce_scatter_s(net, all, h * 4.0) + 4.0 * reduce_scatter_s(net, all, (h * h + h) * 4.0) +
              reduce_scatter_s(net, all, (8.0 * h * h + 5.0 * h) * 4.0) + 7.0 * ring_pass_latency_s(net, all);
  CHECK(p.breakdown.fsdp_comm_s >= gathers * (1.0 - 1e-9));
  CHECK(p.breakdown.fsdp_comm_s <= gathers + 96.0 * rs);
  // Host list work: ranks x ops x launch overhead per call, with the GPU idle: 14
  // gathers a layer in full, the 14 reduce-scatters' share only beyond the backward.
  Calibration listed = ds;
  listed.fsdp_list_ops_per_rank = 2.0;
  const double per_call = 384.0 * 2.0 * ds.launch_overhead_s;
  const double added = run("175b", 48, 4, listed).breakdown.fsdp_comm_s - p.breakdown.fsdp_comm_s;
  CHECK(added >= 96.0 * 14.0 * per_call * (1.0 - 1e-9));
  CHECK(added <= 96.0 * 28.0 * per_call * (1.0 + 1e-9));
}

TEST_CASE("DeepSpeed's zero-filled gather buffers: the gathered bytes once more at HBM bandwidth", "[zero3]") {
  // _allgather_param (partition_parameters.py, v0.3.13 to v0.5.4) zero-fills the whole
  // buffer (torch.zeros) before its torch.cuda.synchronize(): exposed, as the gather. The
  // layer graph's GPT-175B block, one module per op: q, k, v, o (h^2 + h) and the GeLU MLP
  // (8h^2 + 5h) gathered in the forward and the recompute, q, k, v, o once more in the
  // backward (the MLP is kept from the recompute); fp16 buffers.
  Calibration ds = deepspeed_2021(default_calibration());
  ds.fsdp_list_ops_per_rank = 2.0;
  Calibration filled = ds;
  filled.fsdp_gather_zero_fill = true;
  const Prediction a = run("175b", 48, 4, ds);
  const Prediction b = run("175b", 48, 4, filled);
  REQUIRE(a.valid);
  REQUIRE(b.valid);
  const double h = 12288.0;
  const double qkvo = 4.0 * (h * h + h), mlp = 8.0 * h * h + 5.0 * h;
  const double elems = 96.0 * (2.0 * (qkvo + mlp) + qkvo);
  const double hbm = dgx(48).system.gpu.hbm_bw_measured_bytes_per_s;
  CHECK(b.breakdown.fsdp_comm_s - a.breakdown.fsdp_comm_s == Approx(elems * 2.0 / hbm).epsilon(1e-6));
  CHECK(b.breakdown.compute_fwd_s == a.breakdown.compute_fwd_s);
  CHECK(stack_calibration(load_stack(stack_path("megatron-deepspeed-2021"))).fsdp_gather_zero_fill);
}

TEST_CASE("DeepSpeed's ZeRO-3 working set: a module and its prefetch, two gradient buckets", "[zero3][memory]") {
  const Calibration two_layers = default_calibration();
  Calibration ds = deepspeed_2021(default_calibration());
  ds.fsdp_list_ops_per_rank = 2.0;
  // The layer graph's 529.6B block (h 20480), one module per op: q, k, v, o at 4.2e8
  // elements, the GeLU MLP at 3.36e9 (one op). The rule of two gathered layers and one fp32 layer gradient holds
  // 4 x 5.03e9 elements' bytes; DeepSpeed holds at most o with the MLP it prefetches (o is
  // under the live cap) and that prefetch's staging copy, plus the gradients: the bucket
  // reduced before (not yet partitioned), the current one and a reduce-scatter staging copy.
  const double w2 = run("530b", 80, 4, two_layers).memory.working_weights;
  const double wds = run("530b", 80, 4, ds).memory.working_weights;
  const double h = 20480.0;
  const double o = h * h, mlp = 8.0 * h * h;
  CHECK(wds < 0.5 * w2);
  CHECK(wds >= 2.0 * (o + 2.0 * mlp) * 0.99);
  CHECK(wds <= 2.0 * (o + 2.0 * mlp + 3.0 * mlp) * 1.01);
  // The staging copies are the list collectives' (a stack without them holds less).
  ds.fsdp_list_ops_per_rank = 0.0;
  CHECK(run("530b", 80, 4, ds).memory.working_weights < wds);
}

TEST_CASE("an unfused attention keeps its score matrices: one layer's under full recompute", "[zero3][memory]") {
  // 2021 Megatron-LM (megatron/model/transformer.py ParallelSelfAttention) keeps the
  // softmax output (2 B), the dropout mask (1 B) and the dropout output (2 B) of every
  // score: 5 a s^2 b bytes a layer (Korthikanti et al. 2022). The 529.6B block at
  // micro-batch 4: 128 heads x 2048^2 scores x 4 sequences.
  Calibration flash = deepspeed_2021(default_calibration());
  Calibration unfused = flash;
  unfused.attention_score_bytes = 5.0;
  const double scores = 128.0 * 2048.0 * 2048.0 * 4.0;
  const MemoryBreakdown a = run("530b", 80, 4, flash).memory;
  const MemoryBreakdown b = run("530b", 80, 4, unfused).memory;
  // Full recompute: one layer's scores, and one fp16 score gradient in its backward.
  CHECK(b.activations - a.activations == Approx(5.0 * scores).epsilon(1e-9));
  CHECK(b.backward_workspace - a.backward_workspace == Approx(2.0 * scores).epsilon(1e-9));
  CHECK(b.working_weights == a.working_weights);

  // Without recompute every layer keeps them; recomputing the core attention keeps none.
  const auto c = dgx(80);
  Layout none = zero3(640, 4);
  none.recompute = models::Recompute::kNone;
  const double all_a = Predictor(gpt("530b"), c, flash).predict(none).memory.activations;
  const double all_b = Predictor(gpt("530b"), c, unfused).predict(none).memory.activations;
  CHECK(all_b - all_a == Approx(105.0 * 5.0 * scores).epsilon(1e-9));
  Layout core = none;
  core.recompute = models::Recompute::kSelective;
  core.recompute_modules = models::recompute_module_bit(models::RecomputeModule::kCoreAttn);
  CHECK(Predictor(gpt("530b"), c, unfused).predict(core).memory.activations ==
        Predictor(gpt("530b"), c, flash).predict(core).memory.activations);
}

TEST_CASE("a bad memory.attention_score_bytes names the file and its JSON path", "[zero3][memory]") {
  nlohmann::json doc = load_json_file(default_calibration_path());
  doc["memory"]["attention_score_bytes"] = {{"value", -1}, {"source", "[A] test"}};
  try {
    (void)parse_calibration(doc, "cal.json");
    FAIL("a negative attention_score_bytes was accepted");
  } catch (const UserError& e) {
    CHECK_THAT(e.what(), Catch::Contains("cal.json") && Catch::Contains("attention_score_bytes"));
  }
}

TEST_CASE("parameters under the persistence threshold are never gathered", "[zero3][stack]") {
  // The DeepSpeed stacks carry DeepSpeed's default threshold; Marin's gathers everything.
  CHECK(stack_calibration(load_stack(stack_path("megatron-deepspeed-2021"))).fsdp_persistence_threshold_params == 1e5);
  CHECK(stack_calibration(load_stack(stack_path("deepspeed"))).fsdp_persistence_threshold_params == 1e5);
  CHECK(stack_calibration(load_stack(stack_path("marin-july-2026"))).fsdp_persistence_threshold_params == 0.0);
  // GPT-175B's block: two LayerNorms (12288 elements each) and q, k, v, o, MLP. Per
  // module, the norms' gathers go when they stay whole: exactly two ring calls of
  // 12288 bf16 elements less per pass (the pass count is the same either way).
  Calibration per_module = default_calibration();
  per_module.fsdp_gather_per_module = true;
  per_module.fsdp_prefetch_overlap = 0.0;  // every gather exposed
  Calibration persistent = per_module;
  persistent.fsdp_persistence_threshold_params = 1e5;
  const double all = run("175b", 16, 1, per_module).breakdown.fsdp_comm_s;
  const double fewer = run("175b", 16, 1, persistent).breakdown.fsdp_comm_s;
  const auto c = dgx(16);
  const Network net = make_network(c, per_module);
  const double norm_call = all_gather_s(net, group_of(net, 128, 1), 12288.0 * 2.0);
  // forward and backward gathers (no re-gather set): 2 passes x 2 norms x 96 layers.
  CHECK(all - fewer == Approx(2.0 * 2.0 * 96.0 * norm_call).epsilon(1e-6));
}

TEST_CASE("per-module ZeRO-3 reduce-scatters one call per parameter-holding op; the recompute's last module is kept",
          "[zero3][stack]") {
  const auto c = dgx(16);
  const Network net = make_network(c, default_calibration());
  const Group all = group_of(net, 128, 1);
  const double latency = ring_pass_latency_s(net, all);
  const auto rs_of_layer = [&](const Calibration& cal) {
    const StepPrice sp = Predictor(gpt("175b"), c, cal).price(zero3(128, 1), Predictor::PriceDetail::kFull);
    REQUIRE(!sp.layers.empty());
    return sp.layers[0].grad_reduce_scatter_s;
  };
  // GPT-175B's block holds 14 parameter tensors in 7 ops (2 norms' gains; q, k, v, o and
  // their biases; the MLP's two matrices and two biases): per module, one reduce-scatter
  // per tensor (the weights at their bytes, the biases at the latency) instead of 1 call
  // for the layer, so 13 more ring latencies.
  Calibration per_layer = default_calibration();
  Calibration per_module = per_layer;
  per_module.fsdp_gather_per_module = true;
  CHECK(rs_of_layer(per_module) - rs_of_layer(per_layer) == Approx(13.0 * latency).epsilon(1e-6));

  // Re-gathering for the backward skips the MLP (the last module, used again at once);
  // o is not kept (the MLP's 1.2e9 elements lie between its two uses, over 1e9).
  Calibration regather = per_module;
  regather.fsdp_regather_for_recompute = true;
  regather.fsdp_prefetch_overlap = 0.0;  // every gather exposed
  Calibration kept = regather;
  kept.fsdp_max_reuse_distance_params = 1e9;
  const double mlp = 8.0 * 12288.0 * 12288.0 + 5.0 * 12288.0;  // 2 x h x 4h and the biases
  const auto comm = [&](const Calibration& cal) {
    const Prediction p = Predictor(gpt("175b"), c, cal).predict(zero3(128, 1));
    REQUIRE(p.valid);
    return p.breakdown.fsdp_comm_s;
  };
  CHECK(comm(regather) - comm(kept) == Approx(96.0 * all_gather_s(net, all, mlp * 2.0)).epsilon(1e-6));
  CHECK(stack_calibration(load_stack(stack_path("megatron-deepspeed-2021"))).fsdp_max_reuse_distance_params == 1e9);
}

namespace {

double device_lines(const MemoryBreakdown& m) {
  double sum = 0.0;
  for (const auto& [name, v] : m.lines()) {
    if (name.rfind("host_", 0) != 0) sum += v;
  }
  return sum;
}

}  // namespace

TEST_CASE("peak by phase: the loss's logits are freed before any layer's backward", "[zero3][memory][peak_by_phase]") {
  // Without recompute every layer's activations are held through the loss and the
  // backward; the loss's logits block (the saved softmax) is freed by the loss's own
  // backward, before the last layer's backward brings its activation gradients. The
  // 175B block's workspace (half its 17h saved elements a token, 2 B each) is smaller
  // than the block of logits (51200 x 8 B a token): the peak is the loss's moment.
  Calibration summed = default_calibration();
  Calibration phased = summed;
  phased.peak_by_phase = 1.0;
  const auto c = dgx(48);
  Layout none = zero3(384, 1);
  none.recompute = models::Recompute::kNone;
  const MemoryBreakdown a = Predictor(gpt("175b"), c, summed).predict(none).memory;
  const MemoryBreakdown b = Predictor(gpt("175b"), c, phased).predict(none).memory;
  REQUIRE(a.backward_workspace > 0.0);
  REQUIRE(a.loss_workspace > a.backward_workspace);
  CHECK(b.loss_workspace == Approx(a.loss_workspace).epsilon(1e-12));
  CHECK(b.activations == Approx(a.activations).epsilon(1e-12));
  CHECK(b.backward_workspace == 0.0);
  CHECK(b.device_total == Approx(a.device_total - a.backward_workspace * (1.0 + summed.allocator_fragmentation))
                              .epsilon(1e-12));
  CHECK(device_lines(b) == Approx(b.device_total).epsilon(1e-12));

  // Under full recompute the loss sees only the layer inputs the checkpoints keep; one
  // layer's recomputed activations and their gradients outweigh the logits: no loss line.
  const MemoryBreakdown full = Predictor(gpt("175b"), c, phased).predict(zero3(384, 1)).memory;
  CHECK(full.loss_workspace == 0.0);
  CHECK(full.backward_workspace > 0.0);
  CHECK(full.device_total < Predictor(gpt("175b"), c, summed).predict(zero3(384, 1)).memory.device_total);
}

TEST_CASE("peak by phase: score gradients inside the attention's backward, with the working set of that moment",
          "[zero3][memory][peak_by_phase]") {
  // The 529.6B block at micro-batch 4 under DeepSpeed's ZeRO-3 and 2021 Megatron-LM's
  // unfused attention. Summed, every line is taken at its own peak: the working set at
  // its largest module, the score gradients of the attention, the MLP's activations. At
  // one moment, inside the attention's backward: the ops after it (o, the second norm,
  // the MLP) have run their backward and freed their saved activations, the score
  // gradients are live, and the working set is what o prefetched plus the gradients
  // still unreduced, less than its own peak.
  Calibration summed = deepspeed_2021(default_calibration());
  summed.fsdp_list_ops_per_rank = 2.0;
  summed.attention_score_bytes = 5.0;
  Calibration phased = summed;
  phased.peak_by_phase = 1.0;
  const MemoryBreakdown a = run("530b", 80, 4, summed).memory;
  const MemoryBreakdown b = run("530b", 80, 4, phased).memory;
  const double h = 20480.0, tokens = 4.0 * 2048.0;
  const double freed = (h + h + 9.0 * h) * tokens * 2.0;  // o's input, the norm's, the MLP's (h + 4h x 2)
  CHECK(a.activations - b.activations == Approx(freed).epsilon(1e-3));
  CHECK(b.backward_workspace == Approx(a.backward_workspace).epsilon(1e-12));  // the score gradients are in it
  CHECK(b.working_weights < a.working_weights);
  CHECK(b.loss_workspace == 0.0);
  CHECK(b.device_total < a.device_total - a.loss_workspace);
  CHECK(device_lines(b) == Approx(b.device_total).epsilon(1e-12));
  // The sharded state still separates the 560- and 640-GPU runs by what it shards.
  const MemoryBreakdown b560 = run("530b", 70, 4, phased).memory;
  const double state = [](const MemoryBreakdown& m) { return m.master_weights + m.gradients + m.optimizer_states; }(b560) -
                       (b.master_weights + b.gradients + b.optimizer_states);
  CHECK(b560.device_total - b.device_total == Approx(state * (1.0 + phased.allocator_fragmentation)).epsilon(1e-9));
}

TEST_CASE("the PyTorch stacks peak by phase; Marin's and the default calibration sum the lines", "[zero3][stack][peak_by_phase]") {
  for (const char* s : {"deepspeed", "megatron-deepspeed-2021", "megatron-lm-2021", "megatron-lm-2022", "megatron-lm",
                        "megatron-bridge-2025", "pytorch-fsdp", "pytorch-fsdp-eager", "pytorch-fsdp1",
                        "llm-foundry-torch113"}) {
    CHECK(stack_calibration(load_stack(stack_path(s))).peak_by_phase == 1.0);
  }
  CHECK(stack_calibration(load_stack(stack_path("marin-july-2026"))).peak_by_phase == 0.0);
  CHECK(default_calibration().peak_by_phase == 0.0);
}

TEST_CASE("Megatron's modules under ZeRO-3: one query_key_value, the MLP as two Linears, in time and memory",
          "[zero3][memory][stack]") {
  // DeepSpeed gathers, releases and reduces module by module; Megatron-LM's 2021 block
  // (megatron/model/transformer.py) has query_key_value (3h x h, q, k and v fused), dense
  // (h x h) and the MLP's dense_h_to_4h and dense_4h_to_h (4h x h each), each with a bias;
  // the layer graph has three projections and one MLP op.
  const double h = 20480.0;
  Calibration ops = deepspeed_2021(default_calibration());
  ops.fsdp_list_ops_per_rank = 2.0;
  ops.attention_score_bytes = 5.0;
  ops.peak_by_phase = 1.0;
  Calibration megatron = ops;
  megatron.fsdp_megatron_modules = true;
  const OpTable t = build_op_table(gpt("530b"));
  REQUIRE(t.classes.size() == 1);
  const auto gathered = [&](const Calibration& cal) {
    std::vector<double> elems;
    for (const FsdpModule& m : fsdp_modules(t.classes[0], cal)) {
      if (m.param_elems >= cal.fsdp_persistence_threshold_params) elems.push_back(m.param_elems);
    }
    return elems;
  };
  const std::vector<double> per_op = gathered(ops), per_module = gathered(megatron);
  REQUIRE(per_op.size() == 5);  // q, k, v, o, the MLP
  REQUIRE(per_module.size() == 4);
  CHECK(per_module[0] == Approx(3.0 * h * h + 3.0 * h));  // query_key_value and its bias
  CHECK(per_module[1] == Approx(h * h + h));              // dense
  CHECK(per_module[2] == Approx(4.0 * h * h + 2.5 * h));  // the MLP's biases split in proportion
  CHECK(per_module[3] == Approx(4.0 * h * h + 2.5 * h));
  CHECK(per_module[2] + per_module[3] == Approx(per_op[4]).epsilon(1e-12));

  // Time: one reduce-scatter per parameter tensor either way, one gather per module: the
  // fused projections gather once (2 calls fewer a pass), the MLP twice (1 more).
  const auto c = dgx(16);
  const Network net = make_network(c, megatron);
  const Group all = group_of(net, 128, 1);
  Calibration ops_gathers = ops, megatron_gathers = megatron;
  for (Calibration* cal : {&ops_gathers, &megatron_gathers}) {
    cal->fsdp_max_live_params = 0.0;  // the plain per-module timing: no coordinator walk
    cal->fsdp_prefetch_overlap = 0.0;
    cal->fsdp_regather_for_recompute = false;
    cal->fsdp_max_reuse_distance_params = 0.0;
  }
  const auto layer = [&](const Calibration& cal) {
    const StepPrice sp = Predictor(gpt("530b"), c, cal).price(zero3(128, 1), Predictor::PriceDetail::kFull);
    REQUIRE(!sp.layers.empty());
    return sp.layers[0];
  };
  const double fused = all_gather_s(net, all, 2.0 * per_module[0]) - 3.0 * all_gather_s(net, all, 2.0 * per_op[0]);
  const double split = 2.0 * all_gather_s(net, all, 2.0 * per_module[2]) - all_gather_s(net, all, 2.0 * per_op[4]);
  CHECK(layer(megatron_gathers).fsdp_gather_s - layer(ops_gathers).fsdp_gather_s ==
        Approx(fused + split).epsilon(1e-6));
  // 2 gains, 2 tensors for each of the 4 Linears, against 2 gains, 2 each for q, k, v, o
  // and 4 for the MLP: 4 calls fewer, 3 of them latency-only (the biases).
  CHECK(layer(ops_gathers).grad_reduce_scatter_s - layer(megatron_gathers).grad_reduce_scatter_s ==
        Approx(3.0 * ring_pass_latency_s(net, all) + reduce_scatter_s(net, all, 4.0 * per_op[0]) +
               reduce_scatter_s(net, all, 4.0 * per_op[1]) + reduce_scatter_s(net, all, 4.0 * per_op[2]) +
               reduce_scatter_s(net, all, 4.0 * per_op[4]) - reduce_scatter_s(net, all, 4.0 * per_module[0]) -
               reduce_scatter_s(net, all, 4.0 * per_module[2]) - reduce_scatter_s(net, all, 4.0 * per_module[3]))
            .epsilon(1e-6));

  // Memory at micro-batch 4, at its peak moment: with one MLP module its 3.4e9-element
  // gradient and staging copy sit beside o's backward. With Megatron's, each bias's and
  // gain's gradient (hooked like any parameter's) reduces a full bucket as it arrives:
  // fc2's gradient is reduced when fc1's bias arrives and partitioned when fc1's weight
  // does, fc1's reduced when o's bias arrives. Inside the attention's backward (the score
  // gradients live) the set is qkv, prefetched by o, o's gradient in the bucket and fc1's
  // reduced gradient with its staging copy.
  const MemoryBreakdown a = run("530b", 80, 4, ops).memory;
  const MemoryBreakdown b = run("530b", 80, 4, megatron).memory;
  const double scores = 128.0 * 2048.0 * 2048.0 * 4.0;
  CHECK(b.backward_workspace >= 2.0 * scores);  // the score gradients' moment (fp16, one per score)
  CHECK(b.working_weights == Approx(2.0 * (per_module[0] + per_module[1] + 2.0 * per_module[2])).epsilon(1e-3));
  CHECK(b.device_total < a.device_total - per_module[3] * 2.0);  // fc2's gradient no longer beside o's backward
}

TEST_CASE("the recompute's modules kept for the backward: the reuse distance counts each later module twice",
          "[zero3][stack]") {
  // DeepSpeed's _keep_for_later (stage3.py, v0.3.13 to v0.5.x) keeps a module the
  // recompute forward gathered when the parameters of the modules the trace records
  // between its release and its backward sum under stage3_max_reuse_distance (1e9):
  // each later module twice, its recompute forward and its backward. Megatron's GPT-175B
  // block: dense_4h_to_h (fc2: 4h x h, its share of the MLP's biases 2.5h) is used again
  // at once and kept; dense_h_to_4h (fc1) is 2 x 6.04e8 = 1.21e9 elements away, over
  // 1e9, and gathered again.
  const double h = 12288.0;
  const double fc2 = 4.0 * h * h + 2.5 * h;
  const auto c = dgx(16);
  Calibration cal = deepspeed_2021(default_calibration());
  cal.fsdp_megatron_modules = true;
  cal.fsdp_max_live_params = 0.0;  // the plain per-module timing: no coordinator walk
  cal.fsdp_prefetch_overlap = 0.0;  // every gather exposed
  const Network net = make_network(c, cal);
  const auto comm = [&](const Calibration& k) {
    const Prediction p = Predictor(gpt("175b"), c, k).predict(zero3(128, 1));
    REQUIRE(p.valid);
    return p.breakdown.fsdp_comm_s;
  };
  Calibration none = cal;
  none.fsdp_max_reuse_distance_params = 0.0;
  CHECK(comm(none) - comm(cal) == Approx(96.0 * all_gather_s(net, group_of(net, 128, 1), fc2 * 2.0)).epsilon(1e-6));
  // The coordinator's walk (the stack's timing) draws the same line: a reuse distance
  // of 1.3e9 keeps fc1 too, 1e9 does not.
  Calibration walk = deepspeed_2021(default_calibration());
  walk.fsdp_megatron_modules = true;
  walk.fsdp_list_ops_per_rank = 2.0;
  Calibration wider = walk;
  wider.fsdp_max_reuse_distance_params = 1.3e9;
  CHECK(comm(walk) > comm(wider));
}

TEST_CASE("FSDP gathers and reduce-scatters hidden behind compute slow it by the SMs NCCL's calls hold",
          "[zero3][collectives]") {
  // sim/calibration.json fsdp_collective_sms: NCCL runs one thread block per channel, so
  // compute beside a call runs on the GPU's other SMs until it ends. Where the compute
  // outlasts its calls, each call costs its time x comm_sms / sms of the compute
  // (sim/cost.h beside_compute_exposed_s); with no SMs held it hides whole.
  Calibration free = default_calibration();
  free.fsdp_collective_sms = 0.0;
  Calibration held = free;
  held.fsdp_collective_sms = 16.0;
  const auto c = dgx(16);
  const Layout l = zero3(128, 8);
  const StepPrice sp = Predictor(gpt("175b"), c, held).price(l, Predictor::PriceDetail::kFull);
  REQUIRE(!sp.layers.empty());
  const LayerTiming& t = sp.layers[0];
  const double sms = static_cast<double>(c.system.gpu.sms);
  REQUIRE(sms == 108.0);
  const double slow = sms / (sms - 16.0);
  REQUIRE(sm_share_stretch(sms, 16.0) == Approx(slow));
  // Compute-bound: each call ends before the compute beside it, even stretched.
  REQUIRE(t.fwd_s > t.fsdp_gather_s * slow);
  REQUIRE(t.bwd_s > (t.fsdp_gather_s + t.grad_reduce_scatter_s) * slow);
  CHECK(Predictor(gpt("175b"), c, free).predict(l).breakdown.fsdp_comm_s == 0.0);
  // Forward gather, backward gather (the recompute reuses it), gradient reduce-scatter, 96 layers.
  const double calls_s = 96.0 * (2.0 * t.fsdp_gather_s + t.grad_reduce_scatter_s);
  CHECK(sp.prediction.breakdown.fsdp_comm_s == Approx(calls_s * 16.0 / sms).epsilon(1e-9));
  // Where a call outlasts the stretched compute, the call's excess shows and nothing more.
  CHECK(beside_compute_exposed_s(10.0, 2.0, slow) == Approx(8.0));
  CHECK(beside_compute_exposed_s(1.0, 2.0, slow) == Approx(16.0 / sms));
}

TEST_CASE("DeepSpeed's reduce-scatters hidden behind the backward slow it by the SMs they hold",
          "[zero3][collectives]") {
  // The coordinator's gathers are synchronous (exposed whole); each module's gradient
  // reduce-scatter runs beside the next module's backward on the reduction stream, and
  // where that backward outlasts it, the call's fsdp_collective_sms SMs slow it: at most
  // each call's time x comm_sms / sms, only the NCCL call (not the host's list work).
  Calibration free = deepspeed_2021(default_calibration());
  free.fsdp_collective_sms = 0.0;
  Calibration held = free;
  held.fsdp_collective_sms = 16.0;
  const double added = run("175b", 48, 4, held).breakdown.fsdp_comm_s - run("175b", 48, 4, free).breakdown.fsdp_comm_s;
  // The block's 14 reduce-scatters (as in the coordinator test above), 96 layers.
  const Network net = make_network(dgx(48), free);
  const Group all = group_of(net, 384, 1);
  const double h = 12288.0;
  const double rs = 2.0 * reduce_scatter_s(net, all, h * 4.0) + 4.0 * reduce_scatter_s(net, all, (h * h + h) * 4.0) +
                    reduce_scatter_s(net, all, (8.0 * h * h + 5.0 * h) * 4.0) + 7.0 * ring_pass_latency_s(net, all);
  CHECK(added > 0.0);
  CHECK(added <= 96.0 * rs * 16.0 / 108.0 * (1.0 + 1e-9));
}
