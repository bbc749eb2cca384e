// The one name of a layer-graph op's slice in a Chrome trace, shared by the
// simulator's predicted timelines (sim/compare.*) and the engine's measured
// ones (exec/profiler.*), so the two map one to one: the op name plus the
// pass, e.g. "layers.3.attn.q_proj.fwd".
//
//   std::string s = slice_name(op, Pass::kForward);  // "layers.3.attn.q_proj.fwd"
//   std::string name; Pass p;
//   if (parse_slice_name(s, &name, &p)) { ... }       // name = op.name, p = kForward
#pragma once

#include <string>

#include "models/layer_graph.h"

namespace rackstep::sim {

// The passes a slice belongs to (its Chrome-trace category).
enum class Pass { kForward, kBackward, kRecompute, kOptimizer, kComm, kHost };
const char* to_string(Pass p);

// The one name of an op's slice in a pass, on both sides.
std::string slice_name(const models::Op& op, Pass p);
// The op name and pass of a slice name (inverse of slice_name); false if it is not one.
bool parse_slice_name(const std::string& slice, std::string* op, Pass* p);

}  // namespace rackstep::sim
