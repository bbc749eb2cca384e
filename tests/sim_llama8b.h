// Llama 3 8B (d_model 4096, SwiGLU width 14336) on one GPU of a system file, for tests that
// price its block's ops: one micro-batch of 16,384 tokens of sequence 8,192 by default.
// Shared by the sim_* kernel tests.
#pragma once

#include <string>

#include "models/layer_graph.h"
#include "models/model.h"
#include "sim/base/source_dir.h"
#include "sim/cost.h"
#include "topologies/topology.h"

namespace rackstep::sim {

struct Llama8b {
  explicit Llama8b(const std::string& system_file)
      : t(build_op_table(models::build_layer_graph(
            models::load_model(std::string(source_dir()) + "/tests/validation/models/llama3-8b.json")))),
        sys(topologies::load_system(std::string(source_dir()) + "/" + system_file)) {}

  PriceContext ctx(const Calibration& cal, double tokens = 16384, double tp = 1) const {
    PriceContext c = device_price_context(sys.gpu, cal);
    c.tokens = tokens;
    c.seq = 8192;
    c.tp = tp;
    return c;
  }

  OpTable t;
  topologies::SystemSpec sys;
};

}  // namespace rackstep::sim
