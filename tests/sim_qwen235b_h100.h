// Test fixture shared by the EP tests (tests/sim_epfold.cpp, tests/sim_epcomm.cpp):
// Qwen3-235B-A22B (128 experts of width 1536, top-8, d_model 4096) on 32 DGX-H100
// nodes, and Megatron-Bridge's H100 recipe for it (tests/validation/
// megatron-bridge-folding.json): TP 2, PP 8, VP 4, EP 32 over tp x data, ETP 1.
#pragma once

#include <string>

#include "models/layer_graph.h"
#include "models/model.h"
#include "sim/base/source_dir.h"
#include "sim/layout.h"
#include "sim/predict.h"
#include "sim/stack.h"
#include "sim/sweep.h"
#include "topologies/topology.h"

namespace rackstep::sim::testing {

inline const Predictor& qwen235b_h100() {
  static const Predictor p(models::build_layer_graph(models::load_model(
                               std::string(rackstep::source_dir()) + "/tests/validation/models/qwen3-235b-a22b.json")),
                           topologies::load_cluster(std::string(rackstep::source_dir()) + "/topologies/zoo/hgx-h100.json", 32));
  return p;
}

// The same model on 8 nodes: big enough for TP 2 x data and EP across nodes, small
// enough to sweep quickly.
inline const Predictor& qwen235b_h100_8_nodes() {
  static const Predictor p(qwen235b_h100().graph(),
                           topologies::load_cluster(std::string(rackstep::source_dir()) + "/topologies/zoo/hgx-h100.json", 8));
  return p;
}

// One single-threaded sweep of p under a stack (nullptr: none), keeping the `top` fastest layouts:
// the EP tests compare what a stack with and without a feature lets the sweep try.
inline SweepResult sweep_under(const Predictor& p, const Stack* stack, size_t top) {
  SweepOptions opt;
  opt.threads = 1;
  opt.top = top;
  opt.stack = stack;
  return sweep(p, opt);
}

inline Layout qwen235b_folded() {
  Layout l;
  l.data = 16;
  l.fsdp = 16;
  l.zero_stage = 1;
  l.tp = 2;
  l.pp = 8;
  l.pp_virtual = 4;
  l.schedule = PpSchedule::kInterleaved1F1B;
  l.uneven_stages = true;
  l.ep = 32;
  l.etp = 1;
  l.tokens_per_step = 2048 * 4096;
  l.recompute = models::Recompute::kNone;
  l.fp8 = Fp8Gemms::kLinear;
  l.grad_dtype = GradDtype::kBf16;
  return l;
}

}  // namespace rackstep::sim::testing
