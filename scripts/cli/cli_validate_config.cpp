// `rackstep validate-config FILE...`: checks model, system and cluster files
// (the kind is recognised from the keys) and reports the first error in each.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "sim/base/json_io.h"
#include "models/layer_graph.h"
#include "scripts/cli/command.h"
#include "topologies/topology.h"

namespace rackstep::sim {
namespace {

struct Args {
  std::vector<std::string> files;
  bool json = false;
};

// Returns the kind of a config file from its keys.
std::string kind_of(const nlohmann::json& doc) {
  if (!doc.is_object()) return "unknown";
  if (doc.contains("d_model")) return "model";
  if (doc.contains("system")) return "cluster";
  if (doc.contains("gpu")) return "system";
  return "unknown";
}

std::string check_file(const std::string& path, std::string& kind) {
  try {
    const nlohmann::json doc = load_json_file(path);
    kind = kind_of(doc);
    if (kind == "model") {
      const auto m = models::parse_model(doc, path);
      (void)models::build_layer_graph(m);
    } else if (kind == "system") {
      (void)topologies::parse_system(doc, path);
    } else if (kind == "cluster") {
      (void)topologies::load_cluster(path);
    } else {
      return path + ": /: expected a model (d_model), system (gpu) or cluster (system) file, found none of those keys";
    }
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

int run(const Args& a) {
  nlohmann::json out = nlohmann::json::array();
  int bad = 0;
  for (const auto& f : a.files) {
    std::string kind = "unknown";
    const std::string err = check_file(f, kind);
    bad += !err.empty();
    out.push_back({{"file", f}, {"kind", kind}, {"ok", err.empty()}, {"error", err}});
    if (a.json) continue;
    if (err.empty()) {
      std::printf("ok      %-8s %s\n", kind.c_str(), f.c_str());
    } else {
      std::fprintf(stderr, "rackstep: %s\n", err.c_str());
    }
  }
  if (a.json) std::printf("%s\n", out.dump(2).c_str());
  return bad ? 2 : 0;
}

cli::Registration reg{"validate-config", "Check model, system and cluster JSON files",
                      [](CLI::App& app) {
                        auto a = std::make_shared<Args>();
                        app.add_option("files", a->files, "JSON files to check")->required();
                        app.add_flag("--json", a->json, "print results as JSON");
                        return [a] { return run(*a); };
                      }};

}  // namespace
}  // namespace rackstep::sim
