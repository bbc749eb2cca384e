// `rackstep drops`: predicted expert-parallel token-drop fraction, split into
// sender / receiver / padding drops, with a 95% confidence interval.
//
//   rackstep drops                                   # the hero: pooled, cf 1.10/1.15, 4k, EP 64
//   rackstep drops --context 65536 --transport ragged
//   rackstep drops --sweep context=4096,16384,65536 --csv
//   rackstep drops --model models/zoo/marin-535b-a23b.json --layout L.json
//   rackstep drops --target-drop 0.0267 --gpus 704 --write-calibration sim/drop_calibration.json
//   rackstep drops --histogram routing.json          # measured routing instead of the model
//   rackstep drops --replay eval.rsrt --ep 4 --tokens-per-gpu 2048 --context 1024   # exact, from a trace
//   rackstep drops --fit eval.rsrt --fit-max-scale 512 --write-calibration fit.json  # model from a trace
//   rackstep drops --calibration fit.json --ep 4 --tokens-per-gpu 2048 --context 1024 # predict with it
#include <cmath>
#include <cstdio>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "sim/base/check.h"
#include "sim/base/json_io.h"
#include "models/model.h"
#include "scripts/cli/command.h"
#include "sim/drops.h"
#include "sim/layout.h"
#include "sim/routing_fit.h"
#include "sim/routing_replay.h"
#include "sim/base/routing_trace.h"

namespace rackstep::sim {
namespace {

struct DropsArgs {
  DropScenario scenario;
  std::string transport = "pooled";
  std::string method = "mc";
  McOptions mc;
  double target_drop = 0;
  double concentration = 0;     // 0 = from the calibration
  double doc_mean_tokens = 0;   // 0 = from the calibration
  std::string calibration;      // empty = sim/drop_calibration.json
  std::string write_calibration;
  std::string histogram;
  std::string replay;                // routing trace to replay exactly
  std::vector<std::string> fit;      // routing traces to fit the model to
  int64_t fit_max_scale = 0;         // longest chunk measured; 0 = the traces' sequence length
  int shuffles = 4;                  // replay: sequence orders
  std::string target_source;         // provenance of --target-drop
  std::string model;
  std::string layout;
  std::string sweep;
  bool json = false;
  bool csv = false;
  // Options the user typed, which win over --model / --layout values.
  CLI::Option *experts = nullptr, *top_k = nullptr, *ep = nullptr, *gpus = nullptr, *tokens = nullptr,
              *context = nullptr, *transport_opt = nullptr, *sender_cf = nullptr, *receiver_cf = nullptr,
              *waves = nullptr, *chunks = nullptr;
};

bool given(const CLI::Option* o) { return o != nullptr && o->count() > 0; }

double parse_number(const std::string& what, const std::string& text) {
  size_t used = 0;
  double x = 0;
  try {
    x = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size()) throw UserError(what + ": expected a number, found \"" + text + "\"");
  return x;
}

int64_t parse_integer(const std::string& what, const std::string& text) {
  const double x = parse_number(what, text);
  if (x != static_cast<double>(static_cast<int64_t>(x))) throw UserError(what + ": expected an integer, found \"" + text + "\"");
  return static_cast<int64_t>(x);
}

// Fills the scenario from --model and --layout; explicit flags keep their values.
void apply_model_and_layout(DropsArgs& a) {
  DropScenario& s = a.scenario;
  int64_t seq = 0;
  if (!a.model.empty()) {
    const models::ModelConfig m = models::load_model(a.model);
    if (m.moe.experts <= 0) throw UserError(a.model + ": expected a model with routed experts, found a dense model");
    if (!given(a.experts)) s.dispatch.n_experts = m.moe.experts;
    if (!given(a.top_k)) s.dispatch.top_k = static_cast<int>(m.moe.top_k);
    seq = m.seq_len;
  }
  if (!a.layout.empty()) {
    const Layout l = load_layout(a.layout);
    if (l.seq_len > 0) seq = l.seq_len;
    if (!given(a.ep)) s.ep = l.ep;
    if (!given(a.gpus)) s.gpus = l.data;  // EP groups are ep consecutive data ranks
    // MoE parallel folding (sim/layout.h): EP groups tile a stage's tp x cp x data GPUs.
    if (!given(a.gpus) && l.folded()) s.gpus = l.tp * l.cp * l.data / l.expert_tp();
    if (!given(a.transport_opt)) s.dispatch.transport = l.ep_transport;
    if (!given(a.sender_cf)) s.dispatch.sender_cf = l.sender_cf;
    if (!given(a.receiver_cf)) s.dispatch.receiver_cf = l.receiver_cf;
    if (!given(a.waves)) s.dispatch.waves = static_cast<int>(l.waves);
    if (!given(a.chunks)) s.dispatch.ragged_chunks = static_cast<int>(l.ragged_chunks);
    // One MoE dispatch carries a micro-batch; context parallelism splits its sequences.
    if (!given(a.gpus) && l.data > kMaxGpus)
      throw UserError(a.layout, "/data", "at most " + std::to_string(kMaxGpus) + " GPUs", std::to_string(l.data));
    if (!given(a.tokens) && seq > 0) {
      if (l.micro_batch_seqs > kMaxTokensPerGpu || seq > kMaxTokensPerGpu ||
          l.micro_batch_seqs * seq / std::max<int64_t>(1, l.cp) > kMaxTokensPerGpu)
        throw UserError(a.layout, "/micro_batch_seqs",
                        "micro_batch_seqs x seq_len / cp of at most " + std::to_string(kMaxTokensPerGpu) + " tokens per GPU",
                        std::to_string(l.micro_batch_seqs) + " x " + std::to_string(seq) + " / " + std::to_string(l.cp));
      s.tokens_per_gpu = l.micro_batch_seqs * seq / std::max<int64_t>(1, l.cp);
      // Folded: each EP rank dispatches its sequence-parallel share, gathered over expert TP.
      if (l.folded()) s.tokens_per_gpu = s.tokens_per_gpu * l.expert_tp() / l.tp;
    }
  }
  if (seq > 0 && !given(a.context)) s.context = seq;
}

struct Point {
  std::string value;  // the swept value, empty without --sweep
  DropScenario scenario;
  double concentration = 0;
  DropEstimate estimate;
};

void apply_sweep_value(const std::string& key, const std::string& v, DropScenario& s, RoutingModel& m) {
  if (key == "context") s.context = parse_integer("--sweep context", v);
  else if (key == "cf") s.dispatch.sender_cf = s.dispatch.receiver_cf = parse_number("--sweep cf", v);
  else if (key == "sender-cf") s.dispatch.sender_cf = parse_number("--sweep sender-cf", v);
  else if (key == "receiver-cf") s.dispatch.receiver_cf = parse_number("--sweep receiver-cf", v);
  else if (key == "tokens-per-gpu") s.tokens_per_gpu = parse_integer("--sweep tokens-per-gpu", v);
  else if (key == "ep") s.ep = parse_integer("--sweep ep", v);
  else if (key == "transport") s.dispatch.transport = parse_transport(v);
  else if (key == "concentration") m.concentration = parse_number("--sweep concentration", v);
  else
    throw UserError("--sweep: expected context, cf, sender-cf, receiver-cf, tokens-per-gpu, ep, transport or "
                    "concentration, found \"" + key + "\"");
}

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, sep);) out.push_back(item);
  return out;
}

std::string pct(double f) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", 100.0 * f);
  return buf;
}

nlohmann::json point_json(const Point& p, const std::string& sweep_key) {
  const DropEstimate& e = p.estimate;
  nlohmann::json j = {{"total", e.mean.total()},       {"total_ci95", e.total_ci95}, {"sender", e.mean.sender},
                      {"sender_ci95", e.ci95.sender},  {"receiver", e.mean.receiver},
                      {"receiver_ci95", e.ci95.receiver}, {"padding", e.mean.padding},
                      {"concentration", p.concentration}};
  if (!sweep_key.empty()) j[sweep_key] = p.value;
  return j;
}

std::string describe_scenario(const DropScenario& s) {
  std::ostringstream o;
  o << transport_name(s.dispatch.transport) << ", " << s.dispatch.n_experts << " experts top-" << s.dispatch.top_k
    << ", EP " << s.ep << " (" << s.step_gpus() << " GPUs), " << s.tokens_per_gpu << " tokens/GPU, context "
    << s.context;
  if (s.dispatch.transport == Transport::pooled)
    o << ", sender cf " << s.dispatch.sender_cf << ", receiver cf " << s.dispatch.receiver_cf << ", " << s.dispatch.waves
      << " waves";
  else if (s.dispatch.transport == Transport::ragged)
    o << ", receiver cf " << s.dispatch.receiver_cf << " over " << s.dispatch.ragged_chunks << " chunks";
  else
    o << ", expert cf " << s.dispatch.receiver_cf;
  return o.str();
}

std::string calibration_source(const DropsArgs& a, const DropScenario& s) {
  std::ostringstream o;
  o << "Fitted by `rackstep drops --target-drop " << a.target_drop << " --gpus " << s.step_gpus() << " --samples "
    << a.mc.samples << " --seed " << a.mc.seed << " --method " << a.method << "` at the settings under \"fit\" ("
    << describe_scenario(s) << "). Target: " << a.target_drop << " total drop fraction, "
    << (a.target_source.empty() ? "given on the command line (no --target-source)" : a.target_source)
    << ". Only `concentration` is fitted; the document-length distribution, topic count and topic sharpness are "
       "assumptions, not measurements.";
  return o.str();
}

std::string trace_fit_source(const DropsArgs& a, const TraceFit& f) {
  std::ostringstream o;
  o << "Fitted by `rackstep drops --fit";
  for (const auto& t : a.fit) o << " " << t;
  if (a.fit_max_scale > 0) o << " --fit-max-scale " << a.fit_max_scale;
  o << "` to statistics measured from " << f.tokens << " routed tokens (" << f.n_experts << " experts top-" << f.top_k
    << ", " << f.layers.size() << " MoE layers): per-layer expert popularity, document affinity over chunk lengths "
    << "8.." << (a.fit_max_scale > 0 ? std::to_string(a.fit_max_scale) : "the trace context")
    << " tokens (concentration and coherence length), and the lengths of " << f.documents
    << " whole documents (lognormal). No drop rate was fitted; the traces: ";
  for (size_t i = 0; i < f.sources.size(); ++i) o << (i ? "; " : "") << f.sources[i];
  o << ".";
  return o.str();
}

nlohmann::json fit_statistics(const TraceFit& f) {
  nlohmann::json layers = nlohmann::json::array();
  for (const auto& l : f.layers) {
    nlohmann::json scales = nlohmann::json::array();
    for (const auto& p : l.scales) scales.push_back({{"tokens", p.tokens}, {"chunks", p.chunks}, {"excess", p.excess}});
    nlohmann::json j = {{"layer", l.layer}, {"affinity", l.affinity}, {"affinity_document", l.affinity_document},
                        {"affinity_local", l.affinity_local}, {"persistent_share", l.model.persistent_share},
                        {"topic_variance", l.topic_variance},
                        {"popularity_cv", l.popularity_cv}, {"coherence_tokens", l.model.coherence_tokens},
                        {"concentration", l.model.concentration}, {"scales", scales}};
    if (l.drift_affinity_first > 0 || l.drift_affinity_last > 0)
      j["drift"] = {{"affinity_first_third", l.drift_affinity_first}, {"affinity_last_third", l.drift_affinity_last}};
    if (!l.note.empty()) j["note"] = l.note;
    layers.push_back(j);
  }
  return {{"tokens", f.tokens},
          {"documents", f.documents},
          {"doc_lengths", {{"kind", "lognormal"}, {"mean_tokens", f.doc_lengths.mean_tokens}, {"sigma", f.doc_lengths.sigma}}},
          {"layers", layers}};
}

void check_finite(const std::string& flag, double x) {
  if (!std::isfinite(x)) throw UserError(flag + ": expected a finite number, found " + std::to_string(x));
}

int run_drops(DropsArgs& a) {
  check_finite("--concentration", a.concentration);
  check_finite("--doc-mean-tokens", a.doc_mean_tokens);
  check_finite("--target-drop", a.target_drop);
  check_finite("--sender-cf", a.scenario.dispatch.sender_cf);
  check_finite("--receiver-cf", a.scenario.dispatch.receiver_cf);
  if (a.mc.samples < 1 || a.mc.samples > kMaxSamples)
    throw UserError("--samples: expected 1.." + std::to_string(kMaxSamples) + " (at most " + std::to_string(kMaxSamples) +
                    "), found " + std::to_string(a.mc.samples));
  if (a.mc.threads < 1 || a.mc.threads > 256)
    throw UserError("--threads: expected 1..256 (at most 256), found " + std::to_string(a.mc.threads));
  std::unique_ptr<RoutingTrace> replay;
  if (!a.replay.empty()) {
    replay = std::make_unique<RoutingTrace>(read_routing_trace(a.replay));
    if (!given(a.experts)) a.scenario.dispatch.n_experts = replay->n_experts;
    if (!given(a.top_k)) a.scenario.dispatch.top_k = replay->top_k;
  }
  std::unique_ptr<TraceFit> fitted;
  if (!a.fit.empty()) {
    std::vector<RoutingTrace> traces;
    for (const auto& t : a.fit) traces.push_back(read_routing_trace(t));
    FitOptions fo;
    fo.max_scale = a.fit_max_scale;
    fitted = std::make_unique<TraceFit>(fit_routing(traces, fo));
    if (!given(a.experts)) a.scenario.dispatch.n_experts = fitted->n_experts;
    if (!given(a.top_k)) a.scenario.dispatch.top_k = fitted->top_k;
  }
  const std::string cal_path = a.calibration.empty() ? default_drop_calibration_path() : a.calibration;
  DropCalibration cal = load_drop_calibration(cal_path);
  if (!a.calibration.empty() && !replay && !fitted) {  // a calibration for another router: its experts and top-k
    if (!given(a.experts)) a.scenario.dispatch.n_experts = cal.scenario.dispatch.n_experts;
    if (!given(a.top_k)) a.scenario.dispatch.top_k = cal.scenario.dispatch.top_k;
  }
  apply_model_and_layout(a);
  DropScenario base = a.scenario;
  if (given(a.transport_opt) || a.layout.empty()) base.dispatch.transport = parse_transport(a.transport);
  if (a.method != "mc" && a.method != "analytic")
    throw UserError("--method: expected mc or analytic, found \"" + a.method + "\"");
  const Method method = a.method == "mc" ? Method::monte_carlo : Method::analytic;
  if (a.json && a.csv) throw UserError("--json and --csv: expected at most one output format");
  base.validate();

  if (fitted) {
    cal.layer_models.clear();
    cal.layers.clear();
    for (const auto& l : fitted->layers) {
      cal.layer_models.push_back(l.model);
      cal.layers.push_back(l.layer);
    }
    cal.model = fitted->layers.front().model;
  }
  RoutingModel model = cal.model;
  if (!(a.concentration >= 0) || !(a.doc_mean_tokens >= 0))
    throw UserError("--concentration / --doc-mean-tokens: expected > 0");
  if (a.concentration > 0) model.concentration = a.concentration;
  if (a.doc_mean_tokens > 0) model.doc_lengths.mean_tokens = a.doc_mean_tokens;
  std::vector<RoutingModel> layer_models = calibration_models(cal);
  if (a.concentration > 0 || a.doc_mean_tokens > 0 || a.target_drop != 0) layer_models = {model};

  std::unique_ptr<RoutingHistogram> hist;
  if (!a.histogram.empty()) hist = std::make_unique<RoutingHistogram>(load_routing_histogram(a.histogram));
  if (hist && method == Method::analytic)
    throw UserError("--histogram: the analytic estimate needs the synthetic model; use --method mc");

  if (a.target_drop != 0) {
    if (hist || fitted || replay)
      throw UserError("--target-drop fits the synthetic model; it cannot be combined with --histogram, --fit or --replay");
    model.concentration = fit_concentration(base, model, a.target_drop, method, a.mc);
    layer_models = {model};
  }
  if (!a.write_calibration.empty() && fitted) {
    DropCalibration out = cal;
    out.scenario = base;
    out.target_drop = 0;
    out.achieved_drop = 0;
    out.method = "trace_statistics";
    out.samples = 0;
    out.traces = a.fit;
    out.statistics = fit_statistics(*fitted);
    out.source = trace_fit_source(a, *fitted);
    write_drop_calibration(a.write_calibration, out);
  } else if (!a.write_calibration.empty()) {
    if (a.target_drop == 0) throw UserError("--write-calibration: expected --target-drop or --fit to fit first");
    DropCalibration out;
    out.model = model;
    out.scenario = base;
    out.target_drop = a.target_drop;
    out.method = method == Method::monte_carlo ? "monte_carlo" : "analytic";
    out.samples = a.mc.samples;
    out.seed = a.mc.seed;
    RoutingGenerator gen(model, base.routing_shape());
    out.achieved_drop = estimate_drops(base, gen, method, a.mc).mean.total();
    out.source = calibration_source(a, base);
    write_drop_calibration(a.write_calibration, out);
  }

  std::string sweep_key;
  std::vector<std::string> values = {""};
  if (!a.sweep.empty()) {
    const auto eq = a.sweep.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == a.sweep.size())
      throw UserError("--sweep: expected key=v1,v2,..., found \"" + a.sweep + "\"");
    sweep_key = a.sweep.substr(0, eq);
    values = split(a.sweep.substr(eq + 1), ',');
  }
  std::vector<Point> points;
  for (const auto& v : values) {
    Point p;
    p.value = v;
    p.scenario = base;
    RoutingModel m = model;
    if (!sweep_key.empty()) apply_sweep_value(sweep_key, v, p.scenario, m);
    p.scenario.validate();
    if (!(m.concentration > 0)) throw UserError("concentration: expected > 0");
    p.concentration = m.concentration;
    if (replay) {
      ReplayOptions ro;
      ro.shuffles = a.shuffles;
      ro.seed = a.mc.seed;
      p.estimate = replay_drops(*replay, p.scenario, ro).estimate;
    } else if (hist) {
      RoutingGenerator gen(*hist, p.scenario.routing_shape());
      p.estimate = estimate_drops(p.scenario, gen, method, a.mc);
    } else {
      std::vector<DropEstimate> per_layer;
      for (RoutingModel lm : layer_models) {
        if (sweep_key == "concentration") lm.concentration = m.concentration;
        RoutingGenerator gen(lm, p.scenario.routing_shape());
        per_layer.push_back(estimate_drops(p.scenario, gen, method, a.mc));
      }
      p.estimate = average_estimates(per_layer);
    }
    points.push_back(p);
  }

  if (a.json) {
    nlohmann::json j;
    const auto& s = base;
    j["scenario"] = {{"experts", s.dispatch.n_experts}, {"top_k", s.dispatch.top_k}, {"ep", s.ep},
                     {"gpus", s.step_gpus()}, {"tokens_per_gpu", s.tokens_per_gpu}, {"context", s.context},
                     {"transport", transport_name(s.dispatch.transport)}, {"sender_cf", s.dispatch.sender_cf},
                     {"receiver_cf", s.dispatch.receiver_cf}, {"waves", s.dispatch.waves},
                     {"ragged_chunks", s.dispatch.ragged_chunks}};
    j["routing"] = replay ? nlohmann::json{{"kind", "replay"}, {"file", a.replay}, {"shuffles", a.shuffles}}
                   : hist ? nlohmann::json{{"kind", "histogram"}, {"file", a.histogram}}
                          : nlohmann::json{{"kind", "synthetic"}, {"concentration", model.concentration},
                                           {"layers", layer_models.size()}, {"fitted", a.target_drop != 0 || fitted},
                                           {"calibration", fitted ? "--fit" : cal_path}};
    if (fitted) j["fit"] = fit_statistics(*fitted);
    j["method"] = replay ? "replay" : method == Method::monte_carlo ? "monte_carlo" : "analytic";
    j["samples"] = method == Method::monte_carlo ? a.mc.samples : 0;
    j["seed"] = a.mc.seed;
    if (!sweep_key.empty()) j["sweep"] = sweep_key;
    j["points"] = nlohmann::json::array();
    for (const auto& p : points) j["points"].push_back(point_json(p, sweep_key));
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  if (a.csv) {
    std::printf("%s,total,total_ci95,sender,sender_ci95,receiver,receiver_ci95,padding\n",
                sweep_key.empty() ? "point" : sweep_key.c_str());
    for (size_t i = 0; i < points.size(); ++i) {
      const auto& e = points[i].estimate;
      std::printf("%s,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g\n",
                  sweep_key.empty() ? std::to_string(i).c_str() : points[i].value.c_str(), e.mean.total(),
                  e.total_ci95, e.mean.sender, e.ci95.sender, e.mean.receiver, e.ci95.receiver, e.mean.padding);
    }
    return 0;
  }
  std::printf("EP token drops: %s\n", describe_scenario(base).c_str());
  if (replay) {
    std::printf("routing: replay of %s (%lld tokens, %lld MoE layers, recorded at context %lld), %d shuffles\n",
                a.replay.c_str(), static_cast<long long>(replay->token_count()), static_cast<long long>(replay->layers()),
                static_cast<long long>(replay->seq_len), a.shuffles);
  } else if (hist) {
    std::printf("routing: histogram %s (%zu %ss)\n", a.histogram.c_str(), hist->tokens.size(), hist->unit.c_str());
  } else if (layer_models.size() > 1 || fitted) {
    std::printf("routing: %zu per-layer models fitted to routing traces (%s)\n", layer_models.size(),
                fitted ? "--fit" : cal_path.c_str());
  } else {
    std::printf("routing: synthetic, concentration %.4g (%s), mean document %.0f tokens\n", model.concentration,
                a.target_drop != 0 ? "fitted to --target-drop" : (a.concentration > 0 ? "--concentration" : cal_path.c_str()),
                model.doc_lengths.mean_tokens);
  }
  if (replay) {
    std::printf("estimate: exact dispatch of the recorded routing, mean over steps, 95%% CI over steps\n\n");
  } else std::printf("estimate: %s\n\n", method == Method::monte_carlo
                                      ? ("Monte Carlo, " + std::to_string(a.mc.samples) + " steps, seed " +
                                         std::to_string(a.mc.seed) + ", 95% CI").c_str()
                                      : "analytic (normal/gamma overflow), no CI");
  if (sweep_key.empty()) {
    const DropEstimate& e = points[0].estimate;
    std::printf("%-9s %9s %9s\n", "kind", "drop %", "± 95% CI");
    std::printf("%-9s %9s %9s\n", "sender", pct(e.mean.sender).c_str(), pct(e.ci95.sender).c_str());
    std::printf("%-9s %9s %9s\n", "receiver", pct(e.mean.receiver).c_str(), pct(e.ci95.receiver).c_str());
    std::printf("%-9s %9s %9s\n", "padding", pct(e.mean.padding).c_str(), pct(e.ci95.padding).c_str());
    std::printf("%-9s %9s %9s\n", "total", pct(e.mean.total()).c_str(), pct(e.total_ci95).c_str());
    return 0;
  }
  std::printf("%-14s %9s %9s %9s %9s\n", sweep_key.c_str(), "total %", "± CI", "sender %", "receiver %");
  for (const auto& p : points) {
    const DropEstimate& e = p.estimate;
    std::printf("%-14s %9s %9s %9s %9s\n", p.value.c_str(), pct(e.mean.total()).c_str(), pct(e.total_ci95).c_str(),
                pct(e.mean.sender).c_str(), pct(e.mean.receiver).c_str());
  }
  return 0;
}

rackstep::cli::Registration reg{
    "drops", "Predict expert-parallel token-drop fractions (sender / receiver / padding) with a confidence interval",
    [](CLI::App& app) {
      auto a = std::make_shared<DropsArgs>();
      auto& s = a->scenario;
      a->experts = app.add_option("--experts", s.dispatch.n_experts, "routed experts (default 384)");
      a->top_k = app.add_option("--top-k", s.dispatch.top_k, "experts per token (default 8)");
      a->ep = app.add_option("--ep", s.ep, "expert-parallel group size (default 64)");
      a->gpus = app.add_option("--gpus", s.gpus, "GPUs in the step, a multiple of --ep (default: one EP group)");
      a->tokens = app.add_option("--tokens-per-gpu", s.tokens_per_gpu, "tokens per GPU per MoE dispatch (default 65536)");
      a->context = app.add_option("--context", s.context, "sequence length in tokens (default 4096)");
      a->transport_opt = app.add_option("--transport", a->transport, "pooled | ragged | capacity (default pooled)");
      a->sender_cf = app.add_option("--sender-cf", s.dispatch.sender_cf, "pooled sender pool capacity factor")
                         ->capture_default_str();
      a->receiver_cf = app.add_option("--receiver-cf", s.dispatch.receiver_cf, "receiver / expert capacity factor")
                           ->capture_default_str();
      a->waves = app.add_option("--waves", s.dispatch.waves, "pooled waves W")->capture_default_str();
      a->chunks = app.add_option("--chunks", s.dispatch.ragged_chunks, "ragged receiver gate chunks")->capture_default_str();
      app.add_option("--method", a->method, "mc (Monte Carlo, default) | analytic");
      app.add_option("--samples", a->mc.samples, "Monte Carlo steps (default 16)");
      app.add_option("--seed", a->mc.seed, "random seed (default 1)");
      app.add_option("--threads", a->mc.threads, "threads for the Monte Carlo (default 1)");
      app.add_option("--target-drop", a->target_drop, "fit the routing concentration so the drop equals this fraction");
      app.add_option("--concentration", a->concentration, "routing concentration (smaller = more specialised)");
      app.add_option("--doc-mean-tokens", a->doc_mean_tokens, "mean document length in tokens");
      app.add_option("--calibration", a->calibration, "calibration JSON (default sim/drop_calibration.json)");
      app.add_option("--write-calibration", a->write_calibration, "with --target-drop or --fit: write the fit as calibration JSON");
      app.add_option("--histogram", a->histogram, "measured routing histogram JSON instead of the synthetic model");
      app.add_option("--replay", a->replay,
                     "routing trace (rackstep train --routing-trace-eval): exact drops of the recorded routing, "
                     "re-packed into sequences of --context and dealt to GPUs as the trainer does");
      app.add_option("--shuffles", a->shuffles, "--replay: sequence orders replayed (default 4)");
      app.add_option("--fit", a->fit,
                     "routing traces: fit per-layer routing models to their measured statistics (popularity, "
                     "document affinity, coherence, document lengths); with --write-calibration, save them");
      app.add_option("--fit-max-scale", a->fit_max_scale,
                     "--fit: longest chunk of one document measured, in tokens (default: the trace context)");
      app.add_option("--target-source", a->target_source,
                     "--target-drop: where the target comes from, written into the calibration's provenance");
      app.add_option("--model", a->model, "model JSON: experts, top-k and sequence length");
      app.add_option("--layout", a->layout, "layout JSON: EP size, transport, capacity factors, micro-batch");
      app.add_option("--sweep", a->sweep, "key=v1,v2,...: context, cf, sender-cf, receiver-cf, tokens-per-gpu, ep, transport, concentration");
      app.add_flag("--json", a->json, "print JSON");
      app.add_flag("--csv", a->csv, "print CSV");
      a->mc.samples = 16;
      return [a] { return run_drops(*a); };
    }};

}  // namespace
}  // namespace rackstep::sim
