// `rackstep params MODEL.json`: parameter counts by component and optimizer
// group, active counts in both conventions, FLOPs per token by op class.
#include <cstdio>
#include <memory>
#include <string>

#include "sim/base/json_io.h"
#include "models/layer_graph.h"
#include "scripts/cli/command.h"
#include "scripts/cli/flags.h"

namespace rackstep::models {
namespace {

struct ParamsArgs {
  std::string model_path;
  int64_t seq = 0;
  bool json = false;
};

double rel_err(double got, double want) { return want == 0.0 ? 0.0 : (got - want) / want; }

nlohmann::json params_json(const LayerGraph& g, int64_t seq) {
  const ParamCounts p = count_params(g);
  const FlopCounts marin = count_flops(g, seq, FlopConvention::kMarin);
  const FlopCounts exact = count_flops(g, seq, FlopConvention::kExact);
  nlohmann::json j;
  j["model"] = g.model.name;
  j["seq_len"] = seq;
  j["params"] = {{"total", p.total},
                 {"active_marin", p.active},
                 {"active_with_gated_norms_sconv_lm_head", p.active_with_extras},
                 {"active_total_minus_unselected", p.active_total_minus_unselected},
                 {"by_component",
                  {{"embedding", p.embedding}, {"lm_head", p.lm_head}, {"attention", p.attention},
                   {"attn_gate", p.attn_gate}, {"routed_experts", p.experts},
                   {"shared_experts", p.shared_experts}, {"dense_mlp", p.dense_mlp},
                   {"latent_projections", p.latent}, {"router", p.router},
                   {"gated_norms", p.gated_norms}, {"norm_gains", p.norms}, {"sconv", p.sconv}}},
                 {"by_optimizer",
                  {{"muonh", p.by_optimizer[0]}, {"muon", p.by_optimizer[1]},
                   {"adamh", p.by_optimizer[2]}, {"adam", p.by_optimizer[3]}}}};
  // Components only some architectures have, listed where present.
  auto& components = j["params"]["by_component"];
  if (p.positions > 0) components["learned_positions"] = p.positions;
  if (p.biases > 0) components["biases"] = p.biases;
  if (p.attn_sinks > 0) components["attn_sinks"] = p.attn_sinks;
  auto flops = [](const FlopCounts& f) {
    return nlohmann::json{{"attention_core", f.attention_core}, {"projections", f.projections},
                          {"routed_experts", f.experts},        {"shared_experts", f.shared},
                          {"router", f.router},                 {"latent_projections", f.latent},
                          {"lm_head", f.lm_head},               {"forward", f.forward},
                          {"training", f.training}};
  };
  j["flops_per_token"] = {
      {"marin", flops(marin)},
      {"exact", flops(exact)},
      {"hardware_training",
       {{"recompute_none", training_hardware_flops_per_token(g, seq, Recompute::kNone)},
        {"recompute_selective", training_hardware_flops_per_token(g, seq, Recompute::kSelective)},
        {"recompute_full", training_hardware_flops_per_token(g, seq, Recompute::kFull)}}}};
  const int64_t steps = recipe_steps(g);
  j["recipe"] = {{"tokens_per_step", g.model.tokens_per_step()},
                 {"steps", steps},
                 {"total_tokens", static_cast<double>(steps) * static_cast<double>(g.model.tokens_per_step())},
                 {"training_flops_marin", marin.training * static_cast<double>(steps) *
                                              static_cast<double>(g.model.tokens_per_step())}};
  const auto& pub = g.model.published;
  if (pub.total_params > 0 || pub.active_params > 0) {
    const double active = pub.active_convention == "marin" ? p.active : p.active_total_minus_unselected;
    j["published"] = {{"total_params", pub.total_params},
                      {"total_rel_err", rel_err(p.total, pub.total_params)},
                      {"active_params", pub.active_params},
                      {"active_convention", pub.active_convention},
                      {"active_rel_err", rel_err(active, pub.active_params)},
                      {"source", pub.source}};
  }
  return j;
}

void print_row(const char* name, double v, double scale, const char* unit) {
  std::printf("  %-44s %12.3f %s\n", name, v / scale, unit);
}

int run_params(const ParamsArgs& args) {
  const ModelConfig m = load_model(args.model_path);
  const LayerGraph g = build_layer_graph(m);
  const int64_t seq = args.seq > 0 ? args.seq : m.seq_len;
  const nlohmann::json j = params_json(g, seq);
  if (args.json) {
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  const auto& p = j["params"];
  std::printf("%s: %lld layers (%lld global), d %lld, seq %lld\n\n", m.name.c_str(),
              static_cast<long long>(m.layers), static_cast<long long>(m.global_layer_count()),
              static_cast<long long>(m.d_model), static_cast<long long>(seq));
  std::printf("Parameters\n");
  for (auto& [k, v] : p["by_component"].items()) {
    if (v.get<double>() > 0) print_row(k.c_str(), v.get<double>(), 1e9, "B");
  }
  print_row("TOTAL", p["total"].get<double>(), 1e9, "B");
  print_row("active (Marin convention)", p["active_marin"].get<double>(), 1e9, "B");
  print_row("active + gated norms, SConv, LM head", p["active_with_gated_norms_sconv_lm_head"].get<double>(), 1e9, "B");
  print_row("active (total - unselected experts)", p["active_total_minus_unselected"].get<double>(), 1e9, "B");
  std::printf("\nParameters by optimizer group\n");
  for (auto& [k, v] : p["by_optimizer"].items()) {
    if (v.get<double>() > 0) print_row(k.c_str(), v.get<double>(), 1e9, "B");
  }
  std::printf("\nForward FLOPs per token           %14s %14s\n", "Marin (MFU)", "exact");
  const auto& fm = j["flops_per_token"]["marin"];
  const auto& fe = j["flops_per_token"]["exact"];
  for (auto& [k, v] : fm.items()) {
    std::printf("  %-32s %12.3f G %12.3f G\n", k.c_str(), v.get<double>() / 1e9, fe[k].get<double>() / 1e9);
  }
  const auto& hw = j["flops_per_token"]["hardware_training"];
  std::printf("\nHardware FLOPs per token, training (all ops, exact attention)\n");
  for (auto& [k, v] : hw.items()) print_row(k.c_str(), v.get<double>(), 1e9, "G");
  const auto& r = j["recipe"];
  std::printf("\nRecipe: %lld tokens/step, %lld steps, %.3fT tokens, %.4g training FLOPs (Marin)\n",
              static_cast<long long>(r["tokens_per_step"].get<int64_t>()),
              static_cast<long long>(r["steps"].get<int64_t>()), r["total_tokens"].get<double>() / 1e12,
              r["training_flops_marin"].get<double>());
  if (j.contains("published")) {
    const auto& pb = j["published"];
    std::printf("Published: total %.3fB (error %+.3f%%), active %.3fB [%s] (error %+.3f%%)\n",
                pb["total_params"].get<double>() / 1e9, 100 * pb["total_rel_err"].get<double>(),
                pb["active_params"].get<double>() / 1e9, pb["active_convention"].get<std::string>().c_str(),
                100 * pb["active_rel_err"].get<double>());
  }
  return 0;
}

cli::Registration reg{
    "params", "Count parameters (total, active) and FLOPs per token of a model",
    [](CLI::App& app) {
      auto args = std::make_shared<ParamsArgs>();
      app.add_option("model", args->model_path, "model JSON (e.g. models/zoo/marin-535b-a23b.json)")
          ->required();
      app.add_option("--seq", args->seq, "sequence length for attention FLOPs (default: the model's)")
          ->check(cli::count(1, int64_t{1} << 32));
      app.add_flag("--json", args->json, "print JSON instead of a table");
      return [args] { return run_params(*args); };
    }};

}  // namespace
}  // namespace rackstep::models
