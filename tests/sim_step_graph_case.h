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

// Llama 3 8B, FSDP 8 x TP 8 on H100s (torchtitan's Grand Teton TP8 rows' shape) under
// rackstep's selective recompute; `op_sac` switches to torchtitan's per-op policy.
inline Case llama8b_fsdp8_tp8(bool op_sac) {
  const std::string root = rackstep::source_dir();
  Case c{models::build_layer_graph(models::load_model(root + "/tests/validation/models/llama3-8b.json")),
         topologies::load_cluster(root + "/topologies/zoo/hgx-h100.json", 8), Layout{}};
  Layout& l = c.layout;
  l.data = 8;
  l.fsdp = 8;
  l.zero_stage = 3;
  l.tp = 8;
  l.micro_batch_seqs = 2;
  l.tokens_per_step = 8 * 2 * 8192;
  l.recompute = models::Recompute::kSelective;
  l.tp_comm_overlap = 0.0;
  l.torchtitan_op_sac = op_sac;
  return c;
}

}  // namespace rackstep::sim::test
