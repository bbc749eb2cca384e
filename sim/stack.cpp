#include "sim/stack.h"

#include <algorithm>
#include <filesystem>

#include "sim/base/check.h"
#include "sim/base/json_io.h"
#include "sim/base/source_dir.h"

namespace rackstep::sim {

namespace {

// Every support entry is {"value": ..., "source": "..."}.
const nlohmann::json& supported(JsonReader& r, const std::string& key) {
  JsonReader o = r.object(key);
  o.string("source");
  const nlohmann::json& v = o.raw().at("value");
  o.ignore("value");
  o.finish();
  return v;
}

bool flag(JsonReader& r, const std::string& key, bool fallback) {
  if (!r.has(key)) return fallback;
  const nlohmann::json& v = supported(r, key);
  if (!v.is_boolean()) throw UserError(r.file(), r.path_of(key) + "/value", "true or false", v.dump());
  return v.get<bool>();
}

template <typename T>
std::vector<T> choices(JsonReader& r, const std::string& key, const std::vector<std::pair<std::string, T>>& names,
                       std::vector<T> fallback) {
  if (!r.has(key)) return fallback;
  const nlohmann::json& v = supported(r, key);
  std::string all;
  for (const auto& [n, x] : names) all += (all.empty() ? "" : ", ") + n;
  if (!v.is_array()) throw UserError(r.file(), r.path_of(key) + "/value", "a list of " + all, v.dump());
  std::vector<T> out;
  for (const auto& e : v) {
    const auto it = std::find_if(names.begin(), names.end(), [&](const auto& p) { return e.is_string() && p.first == e; });
    if (it == names.end()) throw UserError(r.file(), r.path_of(key) + "/value", "one of " + all, e.dump());
    out.push_back(it->second);
  }
  return out;
}

template <typename T>
bool has(const std::vector<T>& v, T x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

}  // namespace

std::string stack_path(const std::string& name_or_path) {
  if (name_or_path.find('/') != std::string::npos || name_or_path.ends_with(".json")) return name_or_path;
  return std::string(rackstep::source_dir()) + "/sim/stacks/" + name_or_path + ".json";
}

Stack parse_stack(const nlohmann::json& doc, const std::string& file) {
  JsonReader r(doc, file);
  Stack s;
  s.file = file;
  s.name = r.string("name");
  s.comment = r.string("comment", "");
  r.ignore("source");
  JsonReader sup = r.object_or_empty("supports");
  StackSupport& f = s.supports;
  if (sup.has("zero_stages")) {
    const nlohmann::json& v = supported(sup, "zero_stages");
    f.zero_stages.clear();
    for (const auto& e : v) {
      if (!e.is_number_integer() || e.get<int64_t>() < 0 || e.get<int64_t>() > 3) {
        throw UserError(file, "/supports/zero_stages/value", "a list of ZeRO stages 0..3", e.dump());
      }
      f.zero_stages.push_back(e.get<int64_t>());
    }
  }
  f.schedules = choices<PpSchedule>(sup, "schedules",
                                    {{"1f1b", PpSchedule::k1F1B},
                                     {"interleaved_1f1b", PpSchedule::kInterleaved1F1B},
                                     {"zero_bubble", PpSchedule::kZeroBubble},
                                     {"dualpipev", PpSchedule::kDualPipeV}},
                                    f.schedules);
  f.pipeline = flag(sup, "pipeline", f.pipeline);
  f.uneven_stages = flag(sup, "uneven_stages", f.uneven_stages);
  f.tensor_parallel = flag(sup, "tensor_parallel", f.tensor_parallel);
  f.expert_parallel = flag(sup, "expert_parallel", f.expert_parallel);
  f.expert_folding = flag(sup, "expert_folding", f.expert_folding);
  f.cp_kinds = choices<CpKind>(sup, "cp_kinds", {{"ring", CpKind::kRing}, {"all_gather_kv", CpKind::kAllGatherKv}},
                               f.cp_kinds);
  f.ep_transports = choices<Transport>(sup, "ep_transports", {{"pooled", Transport::pooled}, {"ragged", Transport::ragged}},
                                       f.ep_transports);
  f.ep_dispatchers = choices<EpDispatcher>(sup, "ep_dispatchers",
                                           {{"all_to_all", EpDispatcher::kAllToAll}, {"flex", EpDispatcher::kFlex}},
                                           f.ep_dispatchers);
  f.ep_flex_backends = choices<FlexBackend>(sup, "ep_flex_backends",
                                            {{"deepep", FlexBackend::kDeepEp}, {"hybridep", FlexBackend::kHybridEp}},
                                            f.ep_flex_backends);
  f.ep_a2a_overlap = flag(sup, "ep_a2a_overlap", f.ep_a2a_overlap);
  f.optimizer_offload = flag(sup, "optimizer_offload", f.optimizer_offload);
  f.residual_offload = flag(sup, "residual_offload", f.residual_offload);
  f.recompute = choices<models::Recompute>(sup, "recompute",
                                           {{"none", models::Recompute::kNone},
                                            {"selective", models::Recompute::kSelective},
                                            {"full", models::Recompute::kFull}},
                                           f.recompute);
  f.keep_gathered_weights = flag(sup, "keep_gathered_weights", f.keep_gathered_weights);
  f.replicate_embedding = flag(sup, "replicate_embedding", f.replicate_embedding);
  f.coordinated_gc = flag(sup, "coordinated_gc", f.coordinated_gc);
  f.fp8_gemms = flag(sup, "fp8_gemms", f.fp8_gemms);
  f.bf16_gradients = flag(sup, "bf16_gradients", f.bf16_gradients);
  f.fp8_params = flag(sup, "fp8_params", f.fp8_params);
  f.edges_in_pipeline_split = flag(sup, "edges_in_pipeline_split", f.edges_in_pipeline_split);
  {
    std::vector<std::pair<std::string, models::RecomputeModule>> names;
    for (const auto m : models::kAllRecomputeModules) names.emplace_back(models::to_string(m), m);
    f.recompute_modules = choices<models::RecomputeModule>(sup, "recompute_modules", names, f.recompute_modules);
  }
  {
    std::vector<std::pair<std::string, CudaGraphScope>> names;
    for (const auto g : kAllCudaGraphScopes) names.emplace_back(to_string(g), g);
    f.cuda_graph_scopes = choices<CudaGraphScope>(sup, "cuda_graph_scopes", names, f.cuda_graph_scopes);
  }
  sup.finish();
  if (r.has("calibration")) {
    s.calibration_overrides = r.raw().at("calibration");
    r.ignore("calibration");
    if (!s.calibration_overrides.is_object()) {
      throw UserError(file, "/calibration", "an object in sim/calibration.json's structure",
                      s.calibration_overrides.dump());
    }
  }
  r.finish();
  return s;
}

namespace {

// A stack file with "extends": the named stack's document (itself resolved the same way)
// with this file's entries merged over it (JSON merge patch: this file's name, comment,
// supports and calibration entries replace the base's, key by key).
nlohmann::json resolved_stack_document(const std::string& path, int depth) {
  nlohmann::json doc = load_json_file(path);
  const auto it = doc.find("extends");
  if (it == doc.end()) return doc;
  if (!it->is_string()) throw UserError(path, "/extends", "the name of the stack this one extends", it->dump());
  if (depth >= 8) throw UserError(path, "/extends", "a chain of at most 8 stacks (no cycle)", it->get<std::string>());
  nlohmann::json merged = resolved_stack_document(stack_path(it->get<std::string>()), depth + 1);
  doc.erase("extends");
  merged.merge_patch(doc);
  return merged;
}

}  // namespace

Stack load_stack(const std::string& path) { return parse_stack(resolved_stack_document(path, 0), path); }

Calibration stack_calibration(const Stack& s, const std::string& base_path) {
  nlohmann::json doc = load_json_file(base_path);
  doc.merge_patch(s.calibration_overrides);
  // Errors name the stack file: its overrides are what changed.
  return parse_calibration(doc, s.file + " (over " + base_path + ")");
}

CommandCalibration command_calibration(const std::string& stack_name, const std::string& calibration_path) {
  CommandCalibration out;
  const std::string base = calibration_path.empty() ? default_calibration_path() : calibration_path;
  if (!stack_name.empty()) {
    out.stack = load_stack(stack_path(stack_name));
    out.cal = stack_calibration(out.stack, base);
    return out;
  }
  out.cal = calibration_path.empty() ? default_calibration() : load_calibration(calibration_path);
  return out;
}

std::vector<LayoutIssue> check_stack(const Layout& l, const Stack& s) {
  const StackSupport& f = s.supports;
  std::vector<LayoutIssue> out;
  const auto no = [&](const std::string& what) { out.push_back({Reason::kStack, s.name + " does not run " + what}); };
  if (l.fsdp > 1 && !has(f.zero_stages, l.zero_stage)) no("ZeRO stage " + std::to_string(l.zero_stage));
  if (l.pp > 1 && !f.pipeline) no("pipeline parallelism");
  if (l.pp > 1 && f.pipeline && !has(f.schedules, l.schedule)) no(std::string("the ") + to_string(l.schedule) + " schedule");
  if (l.uneven_stages && !f.uneven_stages) no("uneven pipeline stages");
  if (l.tp > 1 && !f.tensor_parallel) no("tensor parallelism");
  if (l.ep > 1 && !f.expert_parallel) no("expert parallelism");
  if (l.folded() && !f.expert_folding) {
    no("expert parallelism folded over tensor and data ranks (ep " + std::to_string(l.ep) + ", etp " +
       std::to_string(l.expert_tp()) + ", tp " + std::to_string(l.tp) + ", data " + std::to_string(l.data) + ")");
  }
  if (l.cp > 1 && !has(f.cp_kinds, l.cp_kind)) no(l.cp_kind == CpKind::kRing ? "ring context parallelism" : "all-gather-KV context parallelism");
  if (l.ep > 1 && !has(f.ep_transports, l.ep_transport)) no(std::string("the ") + transport_name(l.ep_transport) + " EP transport");
  if (l.ep > 1 && !has(f.ep_dispatchers, l.ep_dispatcher)) {
    no(l.ep_dispatcher == EpDispatcher::kFlex ? "the flex EP dispatcher (DeepEP / HybridEP)"
                                              : "the all-to-all EP dispatcher");
  }
  if (l.ep > 1 && l.ep_dispatcher == EpDispatcher::kFlex && !has(f.ep_flex_backends, l.ep_flex_backend)) {
    no(l.ep_flex_backend == FlexBackend::kHybridEp ? "the flex dispatcher's HybridEP backend (ep_flex_backend)"
                                                   : "the flex dispatcher's DeepEP backend (ep_flex_backend)");
  }
  if (l.ep > 1 && l.ep_a2a_overlap && !f.ep_a2a_overlap) {
    no("EP all-to-all overlap across micro-batches (ep_a2a_overlap)");
  }
  if (l.optimizer_state == StatePlacement::kHost && !f.optimizer_offload) no("optimizer state on host");
  if (l.offload_residual && !f.residual_offload) no("residual carry offload");
  if (!has(f.recompute, l.recompute)) {
    no(std::string(l.recompute == models::Recompute::kNone ? "no" : l.recompute == models::Recompute::kFull ? "full" : "selective") +
       " recompute");
  }
  for (const auto m : models::kAllRecomputeModules) {
    if ((l.recompute_modules & models::recompute_module_bit(m)) && !has(f.recompute_modules, m)) {
      no(std::string("module recompute of ") + models::to_string(m));
    }
  }
  for (const auto g : kAllCudaGraphScopes) {
    if (l.graphs(g) && !has(f.cuda_graph_scopes, g)) no(std::string("CUDA graphs of ") + to_string(g));
  }
  if (l.keep_gathered_weights && !f.keep_gathered_weights) no("kept gathered weights");
  if (l.replicate_embedding && !f.replicate_embedding) no("a replicated embedding");
  if (l.coordinated_gc && !f.coordinated_gc) no("coordinated GC");
  if (l.fp8 != Fp8Gemms::kNone && !f.fp8_gemms) no("FP8 GEMMs");
  if (l.fp8_params && !f.fp8_params) no("FP8 parameters");
  if (l.edges_in_pipeline_split && !f.edges_in_pipeline_split) no("a pipeline split that counts the embedding and loss as layers");
  if (l.grad_dtype == GradDtype::kBf16 && l.master_dtype == MasterDtype::kFp32 && !f.bf16_gradients) {
    no("bf16 gradient buffers under an fp32 master");
  }
  return out;
}

bool stack_runs(const Layout& l, const Stack& s) { return check_stack(l, s).empty(); }

}  // namespace rackstep::sim
