// `rackstep predict --model M --cluster C --layout L [--domains N] [--json]`:
// step time, throughput, MFU, the breakdown and memory of one layout.
#include <cstdio>
#include <memory>
#include <string>

#include "sim/base/json_io.h"
#include "models/layer_graph.h"
#include "scripts/cli/command.h"
#include "scripts/cli/flags.h"
#include "sim/predict.h"
#include "sim/stack.h"

namespace rackstep::sim {
namespace {

struct PredictArgs {
  std::string model_path, cluster_path, layout_path, calibration_path, stack_name;
  int64_t domains = 0;
  bool json = false;
};

int run_predict(const PredictArgs& a) {
  const models::LayerGraph g = models::build_layer_graph(models::load_model(a.model_path));
  const topologies::Cluster c = topologies::load_cluster(a.cluster_path, a.domains);
  const Layout l = load_layout(a.layout_path);
  const CommandCalibration under = command_calibration(a.stack_name, a.calibration_path);
  const Stack& stack = under.stack;
  const Calibration& cal = under.cal;
  Prediction p = Predictor(g, c, cal).predict(l);
  if (!a.stack_name.empty()) {
    for (LayoutIssue& i : check_stack(l, stack)) p.issues.push_back(std::move(i));
  }
  if (a.json) {
    nlohmann::json j = prediction_to_json(p);
    j["model"] = g.model.name;
    j["cluster"] = c.name;
    j["gpus"] = c.gpus();
    j["layout"] = layout_to_json(l);
    if (!a.stack_name.empty()) j["stack"] = stack.name;
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("%s on %s (%lld GPUs): %s\n", g.model.name.c_str(), c.name.c_str(), static_cast<long long>(c.gpus()),
                describe(l).c_str());
    if (!a.stack_name.empty()) std::printf("stack: %s (%s)\n", stack.name.c_str(), stack.file.c_str());
    std::printf("%s", format_prediction(p).c_str());
  }
  return p.valid ? 0 : 2;
}

rackstep::cli::Registration reg{
    "predict", "Predict step time, MFU and memory of a model on a cluster under a layout",
    [](CLI::App& app) {
      auto a = std::make_shared<PredictArgs>();
      app.add_option("--model", a->model_path, "model JSON (models/zoo/*.json)")->required();
      app.add_option("--cluster", a->cluster_path, "cluster or system JSON (topologies/zoo/*.json)")->required();
      app.add_option("--layout", a->layout_path, "layout JSON (sim/layouts/*.json)")->required();
      app.add_option("--domains", a->domains, "override the cluster's domain (rack / node) count")
          ->check(cli::count(1, 10000));
      app.add_option("--calibration", a->calibration_path, "calibration JSON (default sim/calibration.json)");
      app.add_option("--stack", a->stack_name,
                     "training stack (sim/stacks/NAME.json or a path): its overrides of the calibration, and "
                     "what of the layout it cannot run");
      app.add_flag("--json", a->json, "print JSON");
      return [a] { return run_predict(*a); };
    }};

}  // namespace
}  // namespace rackstep::sim
