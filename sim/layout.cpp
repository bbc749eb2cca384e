#include "sim/layout.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "sim/base/check.h"
#include "sim/base/json_io.h"

namespace rackstep::sim {

const char* to_string(Reason r) {
  switch (r) {
    case Reason::kGpuProduct: return "gpu_product";
    case Reason::kFsdpDivides: return "fsdp_divides_data";
    case Reason::kEpDivides: return "ep_divides_data";
    case Reason::kEpExperts: return "ep_divides_experts";
    case Reason::kEpDense: return "ep_without_experts";
    case Reason::kPpLayers: return "pp_divides_layers";
    case Reason::kPpSchedule: return "pp_schedule";
    case Reason::kCpSeq: return "cp_divides_seq";
    case Reason::kTpHeads: return "tp_divides_heads";
    case Reason::kTpDomain: return "tp_within_domain";
    case Reason::kBatchSplit: return "batch_split";
    case Reason::kWaves: return "transport_settings";
    case Reason::kDeviceMemory: return "device_memory";
    case Reason::kHostMemory: return "host_memory";
    case Reason::kZeroStage: return "zero_stage";
    case Reason::kPrecision: return "precision";
    case Reason::kStack: return "stack_support";
    case Reason::kCount: break;
  }
  return "?";
}

const char* to_string(PpSchedule s) {
  switch (s) {
    case PpSchedule::k1F1B: return "1f1b";
    case PpSchedule::kInterleaved1F1B: return "interleaved_1f1b";
    case PpSchedule::kZeroBubble: return "zero_bubble";
    case PpSchedule::kDualPipeV: return "dualpipev";
  }
  return "?";
}


int64_t batch_seqs(const Layout& l, const models::LayerGraph& g) {
  const int64_t seq = l.seq(g.model);
  if (l.tokens_per_step > 0) return l.tokens_per_step / seq;
  if (l.seq_len > 0) return g.model.tokens_per_step() / seq;  // same tokens per step
  return g.model.recipe.batch_seqs;
}

int64_t micro_batches(const Layout& l, const models::LayerGraph& g) {
  const int64_t per_rank = batch_seqs(l, g) / l.data;
  return l.micro_batch_seqs > 0 ? per_rank / l.micro_batch_seqs : 0;
}

namespace {

// Visits each rule in order; `add` returns false to stop at the first issue.
template <typename Add>
void visit_rules(const Layout& l, const models::LayerGraph& g, const topologies::Cluster& c, Add&& add) {
  const auto& m = g.model;
  const auto str = [](int64_t v) { return std::to_string(v); };
  if (l.data < 1 || l.tp < 1 || l.cp < 1 || l.pp < 1 || l.fsdp < 1 || l.ep < 1 || l.pp_virtual < 1) {
    add(Reason::kGpuProduct, "every parallel size must be >= 1");
    return;  // the divisibility rules below would divide by zero
  }
  if (l.gpus() != c.gpus()) {
    if (!add(Reason::kGpuProduct, "data×tp×cp×pp = " + str(l.data) + "×" + str(l.tp) + "×" + str(l.cp) +
                                      "×" + str(l.pp) + " = " + str(l.gpus()) + " ≠ " + str(c.gpus()) +
                                      " GPUs in the cluster"))
      return;
  }
  if (l.data > 0 && l.fsdp > 0 && l.data % l.fsdp != 0) {
    if (!add(Reason::kFsdpDivides, "fsdp " + str(l.fsdp) + " does not divide data " + str(l.data))) return;
  }
  if (m.moe.experts == 0 && l.ep > 1) {
    if (!add(Reason::kEpDense, "ep " + str(l.ep) + " on a model without routed experts")) return;
  }
  if (m.moe.experts > 0 && m.moe.experts % l.ep != 0) {
    if (!add(Reason::kEpExperts, "ep " + str(l.ep) + " does not divide " + str(m.moe.experts) + " experts"))
      return;
  }
  if (l.etp < 0) {
    if (!add(Reason::kEpDivides, "etp " + str(l.etp) + " (>= 1, or 0 for tp)")) return;
  }
  const int64_t etp = l.expert_tp();
  if (m.moe.experts == 0 && etp != l.tp) {
    if (!add(Reason::kEpDense, "etp " + str(etp) + " on a model without routed experts")) return;
  }
  if (l.folded() && m.moe.experts > 0 && etp > 1 && m.moe.expert_width > 0 && m.moe.expert_width % etp != 0) {
    if (!add(Reason::kEpExperts, "etp " + str(etp) + " does not divide the expert width " + str(m.moe.expert_width)))
      return;
  }
  // MoE parallel folding (layout.h): the expert mesh ep × etp × expert_dp regroups a stage's tp × cp × data GPUs.
  if (etp > 0 && (l.tp * l.cp * l.data) % (l.ep * etp) != 0) {
    if (!add(Reason::kEpDivides, "ep×etp = " + str(l.ep) + "×" + str(etp) + " = " + str(l.ep * etp) +
                                     " does not divide tp×cp×data = " + str(l.tp) + "×" + str(l.cp) + "×" +
                                     str(l.data) + " = " + str(l.tp * l.cp * l.data) + " GPUs of a stage"))
      return;
  }
  if (l.zero_stage < 0 || l.zero_stage > 3 || (l.zero_stage == 0 && l.fsdp > 1)) {
    if (!add(Reason::kZeroStage, "zero_stage " + str(l.zero_stage) + " with fsdp " + str(l.fsdp) +
                                     " (0..3; 0 shards nothing, so fsdp must be 1)"))
      return;
  }
  if (l.keep_gathered_weights && l.zero_stage != 3) {
    if (!add(Reason::kZeroStage, "keep_gathered_weights needs zero_stage 3 (found " + str(l.zero_stage) + ")"))
      return;
  }
  if (l.fp8 != Fp8Gemms::kNone && c.system.gpu.peak_fp8_flops_per_s <= 0) {
    if (!add(Reason::kPrecision, "FP8 GEMMs on " + c.system.gpu.name + ", whose topology gives no fp8 peak")) return;
  }
  if (l.uneven_stages ? m.layers < l.pp * l.pp_virtual : m.layers % (l.pp * l.pp_virtual) != 0) {
    if (!add(Reason::kPpLayers, "pp×virtual " + str(l.pp * l.pp_virtual) +
                                    (l.uneven_stages ? " exceeds " : " does not divide ") + str(m.layers) +
                                    " layers"))
      return;
  }
  const bool needs_pp = l.schedule != PpSchedule::k1F1B || l.pp_virtual > 1;
  if (needs_pp && l.pp == 1) {
    if (!add(Reason::kPpSchedule, std::string("schedule ") + to_string(l.schedule) + " / virtual stages " +
                                      str(l.pp_virtual) + " need pp > 1"))
      return;
  }
  if (l.pp_virtual > 1 && l.schedule != PpSchedule::kInterleaved1F1B && l.schedule != PpSchedule::kDualPipeV) {
    if (!add(Reason::kPpSchedule, "virtual stages need the interleaved_1f1b or dualpipev schedule")) return;
  }
  // A causal ring split gives each CP rank two chunks (front and back) to balance work.
  const int64_t cp_chunks = l.cp > 1 && l.cp_kind == CpKind::kRing ? 2 * l.cp : l.cp;
  const int64_t seq = l.seq(m);
  if (seq % cp_chunks != 0) {
    if (!add(Reason::kCpSeq, "cp " + str(l.cp) + " (" + str(cp_chunks) + " chunks) does not divide seq " +
                                 str(seq)))
      return;
  }
  const auto& a = m.attention;
  const int64_t kv_min = std::min(a.local.kv_heads > 0 ? a.local.kv_heads : a.kv_heads,
                                  a.global.kv_heads > 0 ? a.global.kv_heads : a.kv_heads);
  if (a.heads % l.tp != 0 || (a.kind == models::AttentionKind::kGqa && kv_min % l.tp != 0 && l.tp % kv_min != 0)) {
    if (!add(Reason::kTpHeads, "tp " + str(l.tp) + " does not divide " + str(a.heads) + " heads / " +
                                   str(kv_min) + " KV heads"))
      return;
  }
  if (l.tp > c.gpus_per_domain || (l.cp > 1 && l.tp * l.cp > c.gpus_per_domain && l.cp_kind == CpKind::kRing &&
                                   c.gpus_per_domain % l.tp != 0)) {
    if (!add(Reason::kTpDomain, "tp " + str(l.tp) + " is larger than an NVLink domain (" +
                                    str(c.gpus_per_domain) + " GPUs)"))
      return;
  }
  const int64_t batch = batch_seqs(l, g);
  if (l.micro_batch_seqs < 1 || l.data < 1 || batch % l.data != 0 || (batch / l.data) % l.micro_batch_seqs != 0) {
    if (!add(Reason::kBatchSplit, "batch of " + str(batch) + " sequences does not split into data " +
                                      str(l.data) + " × micro-batches of " + str(l.micro_batch_seqs)))
      return;
  }
  if (l.tokens_per_step > 0 && l.tokens_per_step % seq != 0) {
    if (!add(Reason::kBatchSplit, "tokens per step " + str(l.tokens_per_step) + " is not a multiple of seq " +
                                      str(seq)))
      return;
  }
  if (l.pp > 1 && micro_batches(l, g) < l.pp && l.schedule != PpSchedule::kZeroBubble) {
    if (!add(Reason::kBatchSplit, str(micro_batches(l, g)) + " micro-batches cannot fill " + str(l.pp) +
                                      " pipeline stages"))
      return;
  }
  if (l.waves < 1 || l.ragged_chunks < 1 || l.sender_cf <= 0 || l.receiver_cf <= 0) {
    if (!add(Reason::kWaves, "waves, chunks and capacity factors must be positive")) return;
  }
  if (l.ep_transport == Transport::capacity) {
    if (!add(Reason::kWaves, "a layout's EP transport is pooled or ragged (capacity is a drop-model setting)")) return;
  }
  // A graph replays fixed shapes and cannot wait on the host: a dropless (ragged) MoE layer reads its
  // token counts on the host, so only fixed-capacity experts can sit inside one (Megatron-Core asserts
  // "moe cuda graph is only supported with drop-padding MoE", transformer_config.py).
  const bool graphs_experts = l.graphs(CudaGraphScope::kMoe) || l.graphs(CudaGraphScope::kFullIteration);
  if (m.moe.experts > 0 && graphs_experts && l.ep_transport != Transport::pooled) {
    if (!add(Reason::kWaves, std::string("cuda_graphs ") +
                                 (l.graphs(CudaGraphScope::kMoe) ? "moe" : "full_iteration") +
                                 " needs fixed-capacity experts (ep_transport pooled): the ragged dispatcher syncs the host in every MoE layer"))
      return;
  }
}

}  // namespace

std::vector<LayoutIssue> check_layout(const Layout& l, const models::LayerGraph& g, const topologies::Cluster& c) {
  std::vector<LayoutIssue> out;
  visit_rules(l, g, c, [&](Reason r, const std::string& why) {
    out.push_back({r, why});
    return true;
  });
  return out;
}

bool first_issue(const Layout& l, const models::LayerGraph& g, const topologies::Cluster& c, Reason* reason) {
  bool found = false;
  // The detail strings are built only for the first failing rule.
  visit_rules(l, g, c, [&](Reason r, const std::string&) {
    found = true;
    *reason = r;
    return false;
  });
  return found;
}

namespace {

models::Recompute parse_recompute(const std::string& s) {
  if (s == "none") return models::Recompute::kNone;
  if (s == "selective") return models::Recompute::kSelective;
  return models::Recompute::kFull;
}

const char* recompute_name(models::Recompute r) {
  switch (r) {
    case models::Recompute::kNone: return "none";
    case models::Recompute::kSelective: return "selective";
    case models::Recompute::kFull: return "full";
  }
  return "?";
}

std::vector<std::string> recompute_module_names(uint32_t modules) {
  std::vector<std::string> names;
  for (const auto m : models::kAllRecomputeModules) {
    if (modules & models::recompute_module_bit(m)) names.push_back(models::to_string(m));
  }
  return names;
}

PpSchedule parse_schedule(const std::string& s) {
  if (s == "interleaved_1f1b") return PpSchedule::kInterleaved1F1B;
  if (s == "zero_bubble") return PpSchedule::kZeroBubble;
  if (s == "dualpipev") return PpSchedule::kDualPipeV;
  return PpSchedule::k1F1B;
}

// Layout::cuda_graphs from a list of scope names, with Megatron-Core's rules on how they combine
// (transformer_config.py __post_init__, cuda_graph_impl "transformer_engine" / "local").
uint32_t parse_cuda_graphs(JsonReader& r, models::Recompute recompute) {
  if (!r.has("cuda_graphs")) return 0;
  std::vector<std::string> names;
  for (const auto s : kAllCudaGraphScopes) names.push_back(to_string(s));
  uint32_t bits = 0;
  for (const std::string& name : r.string_list("cuda_graphs", {})) {
    const auto it = std::find(names.begin(), names.end(), name);
    if (it == names.end()) r.fail("cuda_graphs", "scope names (attn, mlp, moe, moe_router, moe_preprocess, full_iteration)", name);
    bits |= cuda_graph_bit(kAllCudaGraphScopes[it - names.begin()]);
  }
  const auto has = [&](CudaGraphScope s) { return (bits & cuda_graph_bit(s)) != 0; };
  if (has(CudaGraphScope::kFullIteration) && bits != cuda_graph_bit(CudaGraphScope::kFullIteration)) {
    r.fail("cuda_graphs", "full_iteration alone (the whole step is one graph)", "full_iteration with layer scopes");
  }
  if (has(CudaGraphScope::kMoe) && has(CudaGraphScope::kMoeRouter)) {
    r.fail("cuda_graphs", "moe or moe_router, not both (moe captures the router too)", "moe and moe_router");
  }
  if (has(CudaGraphScope::kMoePreprocess) && !has(CudaGraphScope::kMoeRouter)) {
    r.fail("cuda_graphs", "moe_preprocess together with moe_router (the preprocess graph continues the router's)", "moe_preprocess alone");
  }
  if (bits != 0 && !has(CudaGraphScope::kFullIteration) && recompute == models::Recompute::kFull) {
    r.fail("cuda_graphs", "recompute \"none\" or \"selective\" with layer scopes (Megatron-Core: full recompute only with full_iteration graphs)",
           "recompute \"full\"");
  }
  return bits;
}

}  // namespace

const char* to_string(CudaGraphScope s) {
  switch (s) {
    case CudaGraphScope::kAttn: return "attn";
    case CudaGraphScope::kMlp: return "mlp";
    case CudaGraphScope::kMoe: return "moe";
    case CudaGraphScope::kMoeRouter: return "moe_router";
    case CudaGraphScope::kMoePreprocess: return "moe_preprocess";
    case CudaGraphScope::kFullIteration: return "full_iteration";
  }
  return "?";
}

Layout parse_layout(const nlohmann::json& doc, const std::string& file) {
  JsonReader r(doc, file);
  Layout l;
  r.ignore("comment");
  r.ignore("source");
  l.name = r.string("name", "");
  const NumberRange pos{.min = 1};
  l.data = r.integer("data", 1, pos);
  l.fsdp = r.integer("fsdp", 1, pos);
  l.ep = r.integer("ep", 1, pos);
  l.etp = r.integer("etp", 0, {.min = 0});
  l.tp = r.integer("tp", 1, pos);
  l.pp = r.integer("pp", 1, pos);
  l.pp_virtual = r.integer("pp_virtual", 1, pos);
  l.schedule = parse_schedule(r.choice("schedule", {"1f1b", "interleaved_1f1b", "zero_bubble", "dualpipev"}, "1f1b"));
  l.cp = r.integer("cp", 1, pos);
  l.cp_kind = r.choice("cp_kind", {"ring", "all_gather_kv"}, "ring") == "ring" ? CpKind::kRing : CpKind::kAllGatherKv;
  l.micro_batch_seqs = r.integer("micro_batch_seqs", 1, pos);
  l.tokens_per_step = r.integer("tokens_per_step", 0, {.min = 0});
  l.seq_len = r.integer("seq_len", 0, {.min = 0});
  l.recompute = parse_recompute(r.choice("recompute", {"none", "selective", "full"}, "full"));
  if (r.has("recompute_modules")) {
    std::vector<std::string> names;
    for (const auto m : models::kAllRecomputeModules) names.push_back(models::to_string(m));
    for (const std::string& name : r.string_list("recompute_modules", {})) {
      const auto it = std::find(names.begin(), names.end(), name);
      if (it == names.end()) r.fail("recompute_modules", "Megatron-Core module names (core_attn, mla_up_proj, layernorm, mlp, moe_act, moe, shared_experts)", name);
      l.recompute_modules |= models::recompute_module_bit(models::kAllRecomputeModules[it - names.begin()]);
    }
    if (l.recompute_modules != 0 && l.recompute != models::Recompute::kSelective) {
      r.fail("recompute_modules", "recompute \"selective\" (the modules are what selective recompute replays, as Megatron-Core's recompute_granularity)",
             std::string("recompute \"") + recompute_name(l.recompute) + "\"");
    }
  }
  l.torchtitan_op_sac = r.choice("selective_policy", {"keep_gemms", "torchtitan_op_sac"}, "keep_gemms") == "torchtitan_op_sac";
  if (l.torchtitan_op_sac && (l.recompute != models::Recompute::kSelective || l.recompute_modules != 0)) {
    r.fail("selective_policy", "recompute \"selective\" without recompute_modules (the policy is what selective recompute saves)",
           std::string("recompute \"") + recompute_name(l.recompute) + (l.recompute_modules != 0 ? "\" with recompute_modules" : "\""));
  }
  l.offload_residual = r.boolean("offload_residual", false);
  l.optimizer_state = r.choice("optimizer_state", {"device", "host"}, "device") == "host" ? StatePlacement::kHost
                                                                                          : StatePlacement::kDevice;
  l.master_dtype = r.choice("master_dtype", {"fp32", "bf16"}, "fp32") == "fp32" ? MasterDtype::kFp32 : MasterDtype::kBf16;
  const std::string grad = r.choice("grad_dtype", {"master", "fp32", "bf16"}, "master");
  l.grad_dtype = grad == "fp32" ? GradDtype::kFp32 : grad == "bf16" ? GradDtype::kBf16 : GradDtype::kAsMaster;
  l.ep_transport = parse_transport(r.choice("ep_transport", {"pooled", "ragged"}, "ragged"));
  l.sender_cf = r.number("sender_cf", kDefaultSenderCf, {.min_exclusive = 0, .max = 16});
  l.receiver_cf = r.number("receiver_cf", kDefaultReceiverCf, {.min_exclusive = 0, .max = 16});
  l.waves = r.integer("waves", kDefaultWaves, {.min = 1, .max = 64});
  l.ragged_chunks = r.integer("ragged_chunks", kDefaultRaggedChunks, {.min = 1, .max = 64});
  l.coordinated_gc = r.boolean("coordinated_gc", false);
  l.replicate_embedding = r.boolean("replicate_embedding", false);
  l.zero_stage = r.integer("zero_stage", 3, {.min = 0, .max = 3});
  l.keep_gathered_weights = r.boolean("keep_gathered_weights", false);
  l.uneven_stages = r.boolean("uneven_stages", false);
  const std::string fp8 = r.choice("fp8", {"none", "experts", "linear"}, "none");
  l.fp8 = fp8 == "linear" ? Fp8Gemms::kLinear : fp8 == "experts" ? Fp8Gemms::kExperts : Fp8Gemms::kNone;
  const std::string recipe = r.choice("fp8_recipe", {"delayed", "current", "mxfp8", "blockwise"}, "delayed");
  l.fp8_recipe = recipe == "current"   ? Fp8Recipe::kCurrent
                 : recipe == "mxfp8"   ? Fp8Recipe::kMxfp8
                 : recipe == "blockwise" ? Fp8Recipe::kBlockwise
                                         : Fp8Recipe::kDelayed;
  l.fp8_params = r.boolean("fp8_params", false);
  l.edges_in_pipeline_split = r.boolean("edges_in_pipeline_split", false);
  if (l.edges_in_pipeline_split && l.pp < 2) {
    r.fail("edges_in_pipeline_split", "pp of 2 or more (the split of layers over pipeline stages)", "pp " + std::to_string(l.pp));
  }
  if (l.fp8_params && l.fp8 == Fp8Gemms::kNone) {
    r.fail("fp8_params", "fp8 \"linear\" or \"experts\" (FP8 weights are those of FP8 GEMMs)", "fp8 \"none\"");
  }
  l.tp_comm_overlap = r.number("tp_comm_overlap", -1.0, {.min = -1, .max = 1});
  l.tp_userbuffers = r.boolean("tp_userbuffers", false);
  if (l.tp_userbuffers && l.tp < 2) r.fail("tp_userbuffers", "tp of 2 or more (it overlaps TP collectives)", "tp " + std::to_string(l.tp));
  if (l.tp_userbuffers && l.tp_comm_overlap >= 0) {
    r.fail("tp_userbuffers", "no tp_comm_overlap share beside it (userbuffers prices the overlap per GEMM)",
           "tp_comm_overlap " + std::to_string(l.tp_comm_overlap));
  }
  if (l.tp_userbuffers && l.torchtitan_op_sac) {
    r.fail("tp_userbuffers", "no selective_policy \"torchtitan_op_sac\" beside it (userbuffers is Transformer Engine's, the policy torchtitan's)",
           "selective_policy \"torchtitan_op_sac\"");
  }
  l.ep_comm_overlap = r.number("ep_comm_overlap", -1.0, {.min = -1, .max = 1});
  l.ep_dispatcher = r.choice("ep_dispatcher", {"all_to_all", "flex"}, "all_to_all") == "flex" ? EpDispatcher::kFlex
                                                                                          : EpDispatcher::kAllToAll;
  if (r.has("ep_flex_backend") && l.ep_dispatcher != EpDispatcher::kFlex) {
    r.fail("ep_flex_backend", "ep_dispatcher \"flex\" (the backend is the flex dispatcher's)", "ep_dispatcher \"all_to_all\"");
  }
  l.ep_flex_backend = r.choice("ep_flex_backend", {"deepep", "hybridep"}, "deepep") == "hybridep" ? FlexBackend::kHybridEp
                                                                                               : FlexBackend::kDeepEp;
  l.ep_a2a_overlap = r.boolean("ep_a2a_overlap", false);
  l.moe_permute_fusion = r.boolean("moe_permute_fusion", true);
  if (!l.moe_permute_fusion && (l.ep_dispatcher != EpDispatcher::kAllToAll || l.ep_transport != Transport::ragged)) {
    r.fail("moe_permute_fusion", "ep_dispatcher \"all_to_all\" with ep_transport \"ragged\" (the unfused permute is Megatron-Core's all-to-all dispatcher's)",
           "moe_permute_fusion false with another dispatcher or transport");
  }
  l.cuda_graphs = parse_cuda_graphs(r, l.recompute);
  r.finish();
  // The one folding rule that needs no model: the expert mesh must tile a stage's GPUs.
  const int64_t stage_gpus = l.tp * l.cp * l.data, expert_mesh = l.ep * l.expert_tp();
  if (stage_gpus % expert_mesh != 0) {
    throw UserError(file, "/ep",
                    "ep × etp dividing tp × cp × data = " + std::to_string(l.tp) + " × " + std::to_string(l.cp) +
                        " × " + std::to_string(l.data) + " = " + std::to_string(stage_gpus) +
                        " (expert parallelism folds over the GPUs of a stage; etp 0 = tp)",
                    "ep × etp = " + std::to_string(l.ep) + " × " + std::to_string(l.expert_tp()) + " = " +
                        std::to_string(expert_mesh));
  }
  return l;
}

const char* fp8_recipe_name(Fp8Recipe r) {
  switch (r) {
    case Fp8Recipe::kCurrent: return "current";
    case Fp8Recipe::kMxfp8: return "mxfp8";
    case Fp8Recipe::kBlockwise: return "blockwise";
    case Fp8Recipe::kDelayed: return "delayed";
  }
  return "delayed";
}

double Layout::stage_layers(int64_t layers) const {
  const double n = static_cast<double>(layers), p = static_cast<double>(pp);
  return uneven_stages ? std::ceil(n / p) : n / p;
}

Layout load_layout(const std::string& path) { return parse_layout(load_json_file(path), path); }

nlohmann::json layout_to_json(const Layout& l) {
  nlohmann::json j;
  if (!l.name.empty()) j["name"] = l.name;
  j["data"] = l.data;
  j["fsdp"] = l.fsdp;
  j["ep"] = l.ep;
  if (l.etp > 0) j["etp"] = l.etp;  // written only when set: 0 reads back as tp
  j["tp"] = l.tp;
  j["pp"] = l.pp;
  j["pp_virtual"] = l.pp_virtual;
  j["schedule"] = to_string(l.schedule);
  j["cp"] = l.cp;
  j["cp_kind"] = l.cp_kind == CpKind::kRing ? "ring" : "all_gather_kv";
  j["micro_batch_seqs"] = l.micro_batch_seqs;
  if (l.tokens_per_step > 0) j["tokens_per_step"] = l.tokens_per_step;
  if (l.seq_len > 0) j["seq_len"] = l.seq_len;
  j["recompute"] = recompute_name(l.recompute);
  if (l.recompute_modules != 0) j["recompute_modules"] = recompute_module_names(l.recompute_modules);
  if (l.torchtitan_op_sac) j["selective_policy"] = "torchtitan_op_sac";
  j["offload_residual"] = l.offload_residual;
  j["optimizer_state"] = l.optimizer_state == StatePlacement::kHost ? "host" : "device";
  j["master_dtype"] = l.master_dtype == MasterDtype::kFp32 ? "fp32" : "bf16";
  if (l.grad_dtype != GradDtype::kAsMaster) j["grad_dtype"] = l.grad_dtype == GradDtype::kFp32 ? "fp32" : "bf16";
  j["ep_transport"] = transport_name(l.ep_transport);
  j["sender_cf"] = l.sender_cf;
  j["receiver_cf"] = l.receiver_cf;
  j["waves"] = l.waves;
  j["ragged_chunks"] = l.ragged_chunks;
  j["coordinated_gc"] = l.coordinated_gc;
  j["replicate_embedding"] = l.replicate_embedding;
  // Written only when not the default, so layouts from before they existed read back unchanged.
  if (l.zero_stage != 3) j["zero_stage"] = l.zero_stage;
  if (l.keep_gathered_weights) j["keep_gathered_weights"] = true;
  if (l.uneven_stages) j["uneven_stages"] = true;
  if (l.fp8 != Fp8Gemms::kNone) j["fp8"] = l.fp8 == Fp8Gemms::kLinear ? "linear" : "experts";
  if (l.fp8 != Fp8Gemms::kNone) j["fp8_recipe"] = fp8_recipe_name(l.fp8_recipe);
  if (l.fp8_params) j["fp8_params"] = true;
  if (l.edges_in_pipeline_split) j["edges_in_pipeline_split"] = true;
  if (l.tp_comm_overlap >= 0) j["tp_comm_overlap"] = l.tp_comm_overlap;
  if (l.tp_userbuffers) j["tp_userbuffers"] = true;
  if (l.ep_comm_overlap >= 0) j["ep_comm_overlap"] = l.ep_comm_overlap;
  if (l.ep_dispatcher == EpDispatcher::kFlex) j["ep_dispatcher"] = "flex";
  if (l.ep_dispatcher == EpDispatcher::kFlex && l.ep_flex_backend == FlexBackend::kHybridEp) j["ep_flex_backend"] = "hybridep";
  if (l.ep_a2a_overlap) j["ep_a2a_overlap"] = true;
  if (!l.moe_permute_fusion) j["moe_permute_fusion"] = false;
  if (l.cuda_graphs != 0) {
    j["cuda_graphs"] = nlohmann::json::array();
    for (const auto s : kAllCudaGraphScopes) {
      if (l.graphs(s)) j["cuda_graphs"].push_back(to_string(s));
    }
  }
  return j;
}

std::string describe(const Layout& l) {
  std::ostringstream s;
  s << "data " << l.data << " fsdp " << l.fsdp << " ep " << l.ep;
  if (l.folded()) s << " (folded, etp " << l.expert_tp() << ")";
  s << " tp " << l.tp << " pp " << l.pp;
  if (l.pp > 1) s << " (" << to_string(l.schedule) << (l.pp_virtual > 1 ? " v" + std::to_string(l.pp_virtual) : "") << ")";
  s << " cp " << l.cp << " | mb " << l.micro_batch_seqs << " | recompute " << recompute_name(l.recompute);
  if (l.recompute_modules != 0) {
    const std::vector<std::string> names = recompute_module_names(l.recompute_modules);
    for (size_t i = 0; i < names.size(); ++i) s << (i == 0 ? " (" : ", ") << names[i];
    s << ")";
  }
  if (l.offload_residual) s << " +offload";
  if (l.fsdp > 1 && l.zero_stage != 3) s << " | zero " << l.zero_stage;
  if (l.keep_gathered_weights) s << " | keep gathered";
  if (l.uneven_stages) s << " | uneven stages";
  if (l.edges_in_pipeline_split) s << " (embedding, loss as layers)";
  if (l.fp8 != Fp8Gemms::kNone) {
    s << " | fp8 " << (l.fp8 == Fp8Gemms::kLinear ? "linear" : "experts") << " " << fp8_recipe_name(l.fp8_recipe);
  }
  if (l.fp8_params) s << " (fp8 params)";
  if (l.grad_dtype != GradDtype::kAsMaster) s << " | grads " << (l.grad_dtype == GradDtype::kFp32 ? "fp32" : "bf16");
  s << " | opt " << (l.optimizer_state == StatePlacement::kHost ? "host" : "device");
  if (l.ep > 1) s << " | " << transport_name(l.ep_transport);
  if (l.ep > 1 && l.ep_dispatcher == EpDispatcher::kFlex) {
    s << " flex" << (l.ep_flex_backend == FlexBackend::kHybridEp ? " hybridep" : "");
  }
  if (l.ep > 1 && l.ep_a2a_overlap) s << " +a2a overlap";
  if (!l.moe_permute_fusion) s << " +unfused permute";
  if (l.cuda_graphs != 0) {
    s << " | graphs";
    const char* sep = " ";
    for (const auto g : kAllCudaGraphScopes) {
      if (!l.graphs(g)) continue;
      s << sep << to_string(g);
      sep = ", ";
    }
  }
  return s.str();
}

}  // namespace rackstep::sim
