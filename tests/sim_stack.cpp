// ZeRO stages, uneven pipeline stages, training-stack profiles, sourced device
// memory and the public validation set: the mechanisms of issue 13.
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>

#include "sim/base/check.h"
#include "sim/base/source_dir.h"
#include "sim/predict.h"
#include "sim/stack.h"
#include "sim/validate.h"

using namespace rackstep;
using namespace rackstep::sim;

namespace {

std::string src(const std::string& p) { return std::string(rackstep::source_dir()) + "/" + p; }

// GPT-175B (Korthikanti et al. 2022) on 8 DGX A100 nodes: a dense model the
// ZeRO stages are easy to reason about on.
const Predictor& gpt175b(int64_t nodes) {
  static const Predictor p8(models::build_layer_graph(models::load_model(src("tests/validation/models/gpt-175b.json"))),
                            topologies::load_cluster(src("topologies/zoo/dgx-a100-80gb.json"), 8));
  static const Predictor p16(models::build_layer_graph(models::load_model(src("tests/validation/models/gpt-175b.json"))),
                             topologies::load_cluster(src("topologies/zoo/dgx-a100-80gb.json"), 16));
  return nodes == 8 ? p8 : p16;
}

// data 8 x tp 8 x pp 2 on 128 GPUs, the fsdp group = all 8 data ranks.
Layout sharded(int64_t zero) {
  Layout l;
  l.data = 8;
  l.fsdp = zero == 0 ? 1 : 8;
  l.zero_stage = zero;
  l.tp = 8;
  l.pp = 2;
  l.micro_batch_seqs = 1;
  l.tokens_per_step = 64 * 2048;
  l.recompute = models::Recompute::kFull;
  return l;
}

MemoryBreakdown mem(const Predictor& p, const Layout& l) {
  return estimate_memory(p.table(), p.cluster(), l, p.calibration(), layout_shape(p.table(), p.cluster(), l, p.calibration()));
}

}  // namespace

TEST_CASE("each ZeRO stage shards what it names", "[stack][zero]") {
  const Predictor& p = gpt175b(16);
  const MemoryBreakdown z0 = mem(p, sharded(0)), z1 = mem(p, sharded(1)), z2 = mem(p, sharded(2)),
                        z3 = mem(p, sharded(3));
  // ZeRO-1 (Megatron's distributed optimizer): optimizer state and fp32 master / 8.
  CHECK(z1.optimizer_states == Approx(z0.optimizer_states / 8.0).epsilon(1e-9));
  CHECK(z1.master_weights == Approx(z0.master_weights / 8.0).epsilon(1e-9));
  CHECK(z1.gradients == Approx(z0.gradients).epsilon(1e-9));
  // ZeRO-2: gradients too.
  CHECK(z2.gradients == Approx(z0.gradients / 8.0).epsilon(1e-9));
  // ZeRO-1/2 keep whole bf16 weights; ZeRO-3 only two gathered layers of them.
  CHECK(z1.working_weights > 10.0 * z3.working_weights);
  CHECK(z3.device_total < z2.device_total);
  CHECK(z2.device_total < z1.device_total);
  CHECK(z1.device_total < z0.device_total);
}

TEST_CASE("ZeRO stages price their communication where it happens", "[stack][zero]") {
  const Predictor& p = gpt175b(16);
  const Prediction z1 = p.predict(sharded(1)), z3 = p.predict(sharded(3));
  REQUIRE(z1.valid);
  REQUIRE(z3.valid);
  // ZeRO-1 never gathers weights per layer; ZeRO-3 does, on every micro-batch.
  CHECK(z1.breakdown.fsdp_comm_s == 0.0);
  CHECK(z3.breakdown.fsdp_comm_s >= 0.0);
  // ZeRO-1 reduces whole gradients across all 8 data ranks once per step: more
  // bytes at the end of the step than ZeRO-3's replica all-reduce (one replica group).
  CHECK(z1.breakdown.grad_sync_s > z3.breakdown.grad_sync_s);
  // Kept gathered weights: one gather per step instead of one per micro-batch.
  Layout keep = sharded(3);
  keep.keep_gathered_weights = true;
  Calibration slow = p.calibration();
  slow.fsdp_prefetch_overlap = 0.0;  // every gather exposed, so the count shows
  const Predictor ps(p.graph(), p.cluster(), slow);
  const Prediction per_mb = ps.predict(sharded(3)), kept = ps.predict(keep);
  REQUIRE(per_mb.micro_batches > 1);
  CHECK(kept.breakdown.fsdp_comm_s < per_mb.breakdown.fsdp_comm_s / 2.0);
  CHECK(mem(p, keep).working_weights > mem(p, sharded(3)).working_weights);
}

TEST_CASE("bad ZeRO settings are rejected with a reason", "[stack][zero]") {
  const Predictor& p = gpt175b(16);
  Layout l = sharded(0);
  l.fsdp = 8;  // stage 0 shards nothing
  const auto issues = check_layout(l, p.graph(), p.cluster());
  REQUIRE(!issues.empty());
  CHECK(issues[0].reason == Reason::kZeroStage);
  Layout k = sharded(1);
  k.keep_gathered_weights = true;
  CHECK(check_layout(k, p.graph(), p.cluster())[0].reason == Reason::kZeroStage);
  // Round trip keeps the new fields; the defaults are not written.
  CHECK(parse_layout(layout_to_json(k), "rt").keep_gathered_weights);
  CHECK(parse_layout(layout_to_json(sharded(1)), "rt").zero_stage == 1);
  CHECK(!layout_to_json(sharded(3)).contains("zero_stage"));
}

TEST_CASE("uneven pipeline stages carry the extra layer", "[stack][pipeline]") {
  const Predictor& p = gpt175b(8);  // 96 layers on 64 GPUs
  Layout l;
  l.tp = 8;
  l.pp = 8;
  l.data = 1;
  l.tokens_per_step = 64 * 2048;
  Layout odd = l;
  odd.pp = 7;  // 96 / 7 is not whole: 14 layers on the busiest stage
  odd.data = 1;
  REQUIRE(!check_layout(odd, p.graph(), p.cluster()).empty());
  odd.uneven_stages = true;
  const auto issues = check_layout(odd, p.graph(), p.cluster());
  // Only the GPU count is off (56 GPUs of 64) once uneven stages are allowed.
  REQUIRE(issues.size() == 1);
  CHECK(issues[0].reason == Reason::kGpuProduct);
  const LayoutShape even = layout_shape(p.table(), p.cluster(), l, p.calibration());
  const LayoutShape uneven = layout_shape(p.table(), p.cluster(), odd, p.calibration());
  CHECK(even.layers_per_stage == 12.0);
  CHECK(uneven.layers_per_stage == 14.0);
  CHECK(uneven.dense_stage_params / even.dense_stage_params == Approx(14.0 / 12.0).epsilon(1e-9));
}

TEST_CASE("training stacks limit layouts and change the overheads", "[stack]") {
  const Stack marin = load_stack(stack_path("marin-july-2026"));
  const Stack megatron = load_stack(stack_path("megatron-lm"));
  Layout tp;
  tp.tp = 8;
  CHECK(!stack_runs(tp, marin));
  CHECK(stack_runs(tp, megatron));
  Layout zb;
  zb.pp = 4;
  zb.schedule = PpSchedule::kZeroBubble;
  CHECK(!stack_runs(zb, megatron));
  CHECK(check_stack(zb, megatron)[0].reason == Reason::kStack);
  const Layout hero = load_layout(src("sim/layouts/hero-pooled.json"));
  CHECK(stack_runs(hero, marin));
  CHECK(!stack_runs(load_layout(src("sim/layouts/hero-ragged.json")), marin));  // ragged came later
  // Marin's JAX GC pauses are not charged to Megatron.
  const Calibration base = default_calibration();
  const Calibration mc = stack_calibration(megatron);
  CHECK(base.gc_pause_s > 1.0);
  CHECK(mc.gc_pause_s == 0.0);
  CHECK(mc.grad_sync_bucket_layers == 1);
  CHECK(stack_calibration(marin).gc_pause_s == base.gc_pause_s);
  // Every shipped stack reads.
  for (const char* s : {"marin-july-2026", "marin-hero-later", "marin-hero-late", "megatron-lm", "megatron-lm-2021",
                        "megatron-lm-2022", "megatron-deepspeed-2021", "megatron-bridge-2025", "pytorch-fsdp", "pytorch-fsdp-eager",
                        "pytorch-fsdp1", "llm-foundry", "llm-foundry-torch113", "deepspeed"}) {
    CHECK_NOTHROW(stack_calibration(load_stack(stack_path(s))));
  }
}

TEST_CASE("device memory is the driver-visible bytes, not marketed GB", "[stack][memory]") {
  const auto h100 = topologies::load_system(src("topologies/zoo/hgx-h100.json"));
  // "80 GB" is 80 GiB of HBM3; the driver shows 81,559 MiB of it.
  CHECK(h100.gpu.hbm_physical_bytes == 80.0 * 1024 * 1024 * 1024);
  CHECK(h100.gpu.hbm_bytes == 81559.0 * 1024 * 1024);
  CHECK(h100.gpu.hbm_bytes > 80e9);
  for (const char* f : {"topologies/zoo/gb200-nvl72.json", "topologies/zoo/hgx-h200.json",
                        "topologies/zoo/dgx-a100-80gb.json", "topologies/zoo/dgx-b200.json",
                        "topologies/zoo/gb300-nvl72.json"}) {
    const auto s = topologies::load_system(src(f));
    CHECK(s.gpu.hbm_bytes <= s.gpu.hbm_physical_bytes);
    CHECK(s.gpu.hbm_bytes > 0.95 * s.gpu.hbm_physical_bytes);
  }
}

TEST_CASE("a GPU without GEMM calibration is a warning, not a silent default", "[stack]") {
  Calibration cal = default_calibration();
  const auto g = models::build_layer_graph(models::load_model(src("tests/validation/models/gpt-22b.json")));
  const auto c = topologies::load_cluster(src("topologies/zoo/dgx-a100-80gb.json"), 1);
  Layout l;
  l.tp = 8;
  l.tokens_per_step = 4 * 2048;
  CHECK(Predictor(g, c, cal).predict(l).warnings.empty());
  cal.gemm_peak_eff.erase(c.system.gpu.name);
  const Prediction p = Predictor(g, c, cal).predict(l);
  REQUIRE(p.warnings.size() == 1);
  CHECK(p.warnings[0].find("A100") != std::string::npos);
}

TEST_CASE("every published run of the validation set predicts, with its citation and source check", "[stack][validation]") {
  std::vector<ValidationRun> runs = load_validation_set();
  REQUIRE(runs.size() >= 10);
  run_validation(runs);
  int fitted = 0, validation = 0, did_not_fit = 0;
  for (const ValidationRun& v : runs) {
    INFO(v.id << ": " << v.error_text);
    CHECK(v.ok);
    CHECK(v.citation.size() > 20);
    CHECK(v.verification.size() > 20);
    CHECK(v.capacity_gib > 0);
    // The verdict is the prediction against the sourced usable memory, not a copy of the measurement.
    if (v.memory_gib > v.capacity_gib) CHECK_FALSE(v.fits);
    // Fitted rows set calibration values: a wrong verdict there means the calibration broke.
    if (v.role == "fitted") CHECK(v.verdict_right());
    if (!v.measured_ran) ++did_not_fit;
    (v.role == "fitted" ? fitted : validation) += 1;
  }
  CHECK(fitted > 0);
  CHECK(validation > 0);
  CHECK(did_not_fit > 0);  // a published run that did not fit is in the set
}

TEST_CASE("validation summaries count verified and unverified rows apart", "[stack][validation]") {
  std::vector<ValidationRun> runs = load_validation_set();
  run_validation(runs);
  for (const char* role : {"fitted", "validation"}) {
    const ValidationSummary all = summarize(runs, role);
    const ValidationSummary ok = summarize(runs, role, SourceCheck::kVerified);
    const ValidationSummary unv = summarize(runs, role, SourceCheck::kUnverified);
    CHECK(all.runs == ok.runs + unv.runs);
    CHECK(all.with_step == ok.with_step + unv.with_step);
    CHECK(all.verdicts_right == ok.verdicts_right + unv.verdicts_right);
    CHECK(all.max_abs_step_error == std::max(ok.max_abs_step_error, unv.max_abs_step_error));
  }
  CHECK(summarize(runs, "validation", SourceCheck::kVerified).runs > 0);
}

TEST_CASE("FP8 GEMMs run at the topology's FP8 peak, only where the layout puts them", "[stack][fp8]") {
  const auto g = models::build_layer_graph(models::load_model(src("tests/validation/models/gpt-22b.json")));
  const Predictor h100(g, topologies::load_cluster(src("topologies/zoo/hgx-h100.json"), 1));
  Layout l;
  l.tp = 8;
  l.tokens_per_step = 4 * 2048;
  Layout f = l;
  f.fp8 = Fp8Gemms::kLinear;
  const Prediction bf16 = h100.predict(l), fp8 = h100.predict(f);
  REQUIRE(bf16.valid);
  REQUIRE(fp8.valid);
  // Faster GEMMs, but less than 2x overall: attention, norms, the biases, the GeLU and the LM head stay BF16.
  CHECK(fp8.breakdown.compute_fwd_s < 0.85 * bf16.breakdown.compute_fwd_s);
  CHECK(fp8.breakdown.compute_fwd_s > 0.5 * bf16.breakdown.compute_fwd_s);
  // MFU stays quoted against the BF16 peak: same model FLOPs, shorter step.
  CHECK(fp8.mfu / bf16.mfu == Approx(bf16.step_time_s / fp8.step_time_s).epsilon(1e-9));
  // A100 has no FP8 peak in its topology: rejected with a reason, never priced at BF16.
  const Predictor a100(g, topologies::load_cluster(src("topologies/zoo/dgx-a100-80gb.json"), 1));
  const auto issues = check_layout(f, g, a100.cluster());
  REQUIRE(!issues.empty());
  CHECK(issues[0].reason == Reason::kPrecision);
  CHECK(!stack_runs(f, load_stack(stack_path("marin-july-2026"))));
  CHECK(stack_runs(f, load_stack(stack_path("megatron-lm"))));
}

TEST_CASE("per-run TP and EP overlap settings override the stack's", "[stack]") {
  const Predictor& p = gpt175b(16);
  Layout l = sharded(1);
  const Prediction base = p.predict(l);
  l.tp_comm_overlap = 1.0;
  const Prediction hidden = p.predict(l);
  REQUIRE(base.breakdown.tp_comm_s > 0);
  CHECK(hidden.breakdown.tp_comm_s == 0.0);
  CHECK(parse_layout(layout_to_json(l), "rt").tp_comm_overlap == 1.0);
}

TEST_CASE("userbuffers TP overlap hides each collective behind its GEMM, at the GEMM's SM share and split", "[stack][tp]") {
  const Predictor& p = gpt175b(16);
  Layout l = sharded(1);
  l.micro_batch_seqs = 4;  // 8192 rows a GEMM: chunks of 1024 rows at TP 8
  Layout ub = l;
  ub.tp_userbuffers = true;
  // Comm kernels that took no SMs: what the overlap hides, less the GEMM split into chunks.
  Calibration free_sms = p.calibration();
  free_sms.tp_ub_pipeline_sms = 0;
  free_sms.tp_ub_bulk_sms = 0;
  const Prediction exposed = p.predict(l), hidden = Predictor(p.graph(), p.cluster(), free_sms).predict(ub);
  const Prediction overlapped = p.predict(ub);
  REQUIRE(exposed.valid);
  REQUIRE(hidden.valid);
  REQUIRE(overlapped.valid);
  // The ring exchanges and the pipelined / bulk reduce-scatters hide most of the traffic...
  CHECK(hidden.breakdown.tp_comm_s < 0.75 * exposed.breakdown.tp_comm_s);
  // ...not all of it (the last pipelined chunk's reduce-scatter, the GEMMs in chunks);
  // the cost shows as TP time, compute is unchanged.
  CHECK(hidden.breakdown.tp_comm_s > 0.0);
  CHECK(hidden.breakdown.compute_fwd_s == exposed.breakdown.compute_fwd_s);
  // The comm kernels' SMs (TE's default 16 of an A100's 108) slow the GEMMs beside them:
  // for GPT-175B at TP 8 that costs more than the overlap saves.
  CHECK(overlapped.breakdown.tp_comm_s > exposed.breakdown.tp_comm_s);
  CHECK(parse_layout(layout_to_json(ub), "rt").tp_userbuffers);
  // A share beside it, or no TP to overlap, is refused.
  nlohmann::json both = layout_to_json(ub);
  both["tp_comm_overlap"] = 0.5;
  CHECK_THROWS_AS(parse_layout(both, "bad.json"), UserError);
  nlohmann::json no_tp = layout_to_json(ub);
  no_tp["tp"] = 1;
  no_tp["data"] = 64;
  CHECK_THROWS_AS(parse_layout(no_tp, "bad.json"), UserError);
}

TEST_CASE("context parallel buffers: a ring holds two KV blocks, an all-gather the whole sequence", "[stack][cp]") {
  const auto& p = gpt175b(8);
  Layout l;
  l.tp = 8;
  l.pp = 2;
  l.cp = 4;
  l.data = 1;
  l.seq_len = 65536;
  l.tokens_per_step = 16 * 65536;
  const MemoryBreakdown ring = mem(p, l);
  l.cp_kind = CpKind::kAllGatherKv;
  const MemoryBreakdown gathered = mem(p, l);
  REQUIRE(ring.cp_buffers > 0);
  // 2 blocks (send, receive) x (KV + dKV) against cp blocks x (KV + dKV).
  CHECK(gathered.cp_buffers / ring.cp_buffers == Approx(4.0 / 2.0).epsilon(1e-9));
  l.cp = 1;
  CHECK(mem(p, l).cp_buffers == 0.0);
}

TEST_CASE("FP8 GEMMs keep their saved inputs as FP8: one byte per GEMM-input element, the rest bf16", "[stack][memory]") {
  const auto m = models::load_model(src("tests/validation/models/llama3-70b.json"));
  const auto g = models::build_layer_graph(m);
  const auto c = topologies::load_cluster(src("topologies/zoo/hgx-h100.json"), 1);
  const Predictor p(g, c, default_calibration());
  Layout l;
  l.tp = 8;
  l.zero_stage = 0;
  l.micro_batch_seqs = 1;
  l.tokens_per_step = 8192;
  l.recompute = models::Recompute::kNone;
  const double bf16 = p.predict(l).memory.activations;
  l.fp8 = Fp8Gemms::kLinear;
  const double fp8 = p.predict(l).memory.activations;
  // Inputs of the GEMMs of one Llama block, per token: x once (q, k and v read the
  // same saved tensor), the attention output for o_proj, and the MLP's x and h (its
  // h1, h3 stay bf16 for the SwiGLU backward).
  const double d = static_cast<double>(m.d_model), ffn = static_cast<double>(m.moe.dense_width);
  const double heads_hd = static_cast<double>(m.attention.heads * m.attention.head_dim);
  const double gemm_inputs = d + heads_hd + d + ffn;
  REQUIRE(p.table().classes.size() == 1);
  const double saved = p.table().classes[0].saved_elems_per_token;
  CHECK(fp8 < bf16);
  CHECK(fp8 == Approx(bf16 * (1.0 - gemm_inputs / (2.0 * saved))).epsilon(1e-9));
  l.fp8 = Fp8Gemms::kExperts;  // a dense model has no expert GEMMs
  CHECK(p.predict(l).memory.activations == Approx(bf16).epsilon(1e-12));
}

TEST_CASE("Megatron-LM 2021 reduces fp16 gradients in 16 bits across data ranks", "[stack][validation]") {
  // Under --fp16 (examples/pretrain_gpt3_175B.sh of the paper's code) the 2021 local DDP
  // buckets param.grad by the parameter type and all-reduces the fp16 buckets
  // (megatron/model/distributed.py allreduce_gradients); fp32 reduction was opt-in
  // (--accumulate-allreduce-grads-in-fp32, forced only by --bf16, megatron/arguments.py).
  std::vector<ValidationRun> runs = load_validation_set();
  int rows = 0;
  for (const ValidationRun& v : runs) {
    if (v.stack != "megatron-lm-2021") continue;
    INFO(v.id);
    const Layout l = parse_layout(v.layout_json, v.id);
    CHECK(l.grad_dtype == GradDtype::kBf16);  // 2 B per gradient, as fp16
    ++rows;
  }
  CHECK(rows >= 10);
  // The 18.4B row (TP 8, PP 1, data 32): the exposed all-reduce carries half the bytes
  // of the same layout with fp32 gradients, and the gradient buffers take half the memory.
  const auto it = std::find_if(runs.begin(), runs.end(), [](const ValidationRun& v) { return v.id == "narayanan21-18.4b"; });
  REQUIRE(it != runs.end());
  const Predictor p(models::build_layer_graph(models::load_model(it->model_path)),
                    topologies::load_cluster(it->cluster_path, it->domains),
                    stack_calibration(load_stack(stack_path(it->stack))));
  const Layout half = parse_layout(it->layout_json, it->id);
  Layout full = half;
  full.grad_dtype = GradDtype::kFp32;
  const Prediction ph = p.predict(half), pf = p.predict(full);
  REQUIRE(pf.breakdown.grad_sync_s > 0);
  CHECK(ph.breakdown.grad_sync_s / pf.breakdown.grad_sync_s == Approx(0.5).margin(0.02));
  CHECK(ph.memory.gradients == Approx(0.5 * pf.memory.gradients));
  CHECK(ph.step_time_s < pf.step_time_s);
}

namespace {

// Llama 3.1 8B at 65536 tokens on one 8-GPU Grand Teton H100 host under the
// pytorch-fsdp stack (torchtitan's Table 2 runs), or with that stack's shard group
// confined to the fsdp ranks (zero_shards_over_cp 0).
const Predictor& titan_8b(bool shards_over_cp) {
  static const auto graph =
      models::build_layer_graph(models::load_model(src("tests/validation/models/llama31-8b-s65536.json")));
  static const auto cluster = topologies::load_cluster(src("topologies/zoo/grand-teton-h100.json"), 1);
  static const Calibration over_cp = stack_calibration(load_stack(stack_path("pytorch-fsdp")));
  static const Calibration data_only = [] {
    Calibration c = over_cp;
    c.zero_shards_over_cp = 0.0;
    return c;
  }();
  static const Predictor over(graph, cluster, over_cp), only(graph, cluster, data_only);
  return shards_over_cp ? over : only;
}

// ZeRO-3 over `data` ranks x `cp` context-parallel ranks, full recompute, one sequence each.
Layout fsdp_cp(int64_t data, int64_t cp) {
  Layout l;
  l.data = data;
  l.fsdp = data;
  l.cp = cp;
  l.cp_kind = CpKind::kAllGatherKv;
  l.zero_stage = 3;
  l.micro_batch_seqs = 1;
  l.tokens_per_step = data * 65536;
  l.recompute = models::Recompute::kFull;
  return l;
}

}  // namespace

TEST_CASE("torchtitan shards FSDP over data x context-parallel ranks: states / (data x cp)", "[stack][zero][cp]") {
  // torchtitan 9dec370 parallelize_llama.py: fully_shard over the flattened
  // ('dp_shard', 'cp') mesh, so FSDP 4 x CP 2 holds 1/8 of every state.
  CHECK(titan_8b(true).calibration().zero_shards_over_cp == 1.0);
  const Layout l = fsdp_cp(4, 2);
  const MemoryBreakdown over = mem(titan_8b(true), l), only = mem(titan_8b(false), l);
  CHECK(over.master_weights == Approx(only.master_weights / 2.0).epsilon(1e-9));
  CHECK(over.gradients == Approx(only.gradients / 2.0).epsilon(1e-9));
  CHECK(over.optimizer_states == Approx(only.optimizer_states / 2.0).epsilon(1e-9));
  // The gathered layers and the reduce-scatter's input stay whole layers.
  CHECK(over.working_weights == Approx(only.working_weights).epsilon(1e-9));
  // The same states as FSDP over 8 data ranks without CP.
  CHECK(over.master_weights == Approx(mem(titan_8b(true), fsdp_cp(8, 1)).master_weights).epsilon(1e-9));
  // 'FSDP 1, CP 8': no data sharding, yet the states split over the 8 CP ranks and
  // the weights are gathered layer by layer.
  const MemoryBreakdown cp8 = mem(titan_8b(true), fsdp_cp(1, 8));
  CHECK(cp8.master_weights == Approx(over.master_weights).epsilon(1e-9));
  CHECK(cp8.working_weights == Approx(over.working_weights).epsilon(1e-9));
  const MemoryBreakdown cp8_whole = mem(titan_8b(false), fsdp_cp(1, 8));
  CHECK(cp8_whole.master_weights == Approx(8.0 * over.master_weights).epsilon(1e-9));
  // Under a trainer that shards over cp, zero_stage 0 still shards nothing.
  Layout ddp = fsdp_cp(1, 8);
  ddp.zero_stage = 0;
  CHECK(mem(titan_8b(true), ddp).master_weights == Approx(cp8_whole.master_weights).epsilon(1e-9));
}

TEST_CASE("FSDP over data x cp gathers and reduce-scatters over data x cp ranks, no replica sync left", "[stack][zero][cp]") {
  const Layout l = fsdp_cp(4, 2);
  const Predictor& p = titan_8b(true);
  const LayoutShape s = layout_shape(p.table(), p.cluster(), l, p.calibration());
  CHECK(s.shard_ranks == 8);
  CHECK(layout_shape(p.table(), p.cluster(), l, titan_8b(false).calibration()).shard_ranks == 4);
  const StepPrice over = p.price(l), only = titan_8b(false).price(l);
  const LayerCollectives& c8 = over.collectives.front();
  const LayerCollectives& c4 = only.collectives.front();
  // A ring all-gather sends (n-1)/n of the gathered bytes from each GPU: 7/8 over
  // the 8 shard ranks, 3/4 over 4 (all on NVLink inside the host).
  CHECK(c8.fsdp_gather.nvlink_bytes / c4.fsdp_gather.nvlink_bytes == Approx((7.0 / 8.0) / (3.0 / 4.0)).epsilon(1e-9));
  CHECK(c8.grad_reduce_scatter.nvlink_bytes / c4.grad_reduce_scatter.nvlink_bytes ==
        Approx((7.0 / 8.0) / (3.0 / 4.0)).epsilon(1e-9));
  const Group g8 = group_of(p.network(), 8, 1);
  const double layer_bf16 = p.table().classes.front().dense_params * 2.0;
  CHECK(c8.fsdp_gather.nvlink_bytes == Approx(all_gather_traffic(p.network(), g8, layer_bf16).nvlink_bytes).epsilon(1e-9));
  // The shard group spans every GPU: no replica is left to all-reduce with; over
  // the fsdp ranks only, the 2 CP ranks' shards are all-reduced once per step.
  CHECK(c8.grad_sync_dense.time_s() == 0.0);
  CHECK(c4.grad_sync_dense.time_s() > 0.0);
  // FSDP 1, CP 8: a layout that gathered nothing gathers over the 8 CP ranks.
  CHECK(p.price(fsdp_cp(1, 8)).collectives.front().fsdp_gather.time_s() > 0.0);
  CHECK(titan_8b(false).price(fsdp_cp(1, 8)).collectives.front().fsdp_gather.time_s() == 0.0);
}
