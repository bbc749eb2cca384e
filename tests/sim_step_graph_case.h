// Shared by the step-graph tests: a model, cluster and layout from the zoos.
//
//   Case c = load("marin-535b-a23b.json", "gb200-11-racks.json", "hero-ragged.json");
#pragma once

#include <cstdint>
#include <string>

#include "models/layer_graph.h"
#include "sim/base/source_dir.h"
#include "models/model.h"
#include "sim/layout.h"
#include "topologies/topology.h"

namespace rackstep::sim::test {

struct Case {
  models::LayerGraph graph;
  topologies::Cluster cluster;
  Layout layout;
};

inline Case load(const std::string& model, const std::string& cluster, const std::string& layout,
                 int64_t domains = 0) {
  const std::string root = rackstep::source_dir();
  return {models::build_layer_graph(models::load_model(root + "/models/zoo/" + model)),
          topologies::load_cluster(root + "/topologies/zoo/" + cluster, domains),
          load_layout(root + "/sim/layouts/" + layout)};
}

}  // namespace rackstep::sim::test
