// Slice names shared by predicted and measured traces; see sim/slice_name.h.
#include "sim/slice_name.h"

namespace rackstep::sim {

const char* to_string(Pass p) {
  switch (p) {
    case Pass::kForward: return "forward";
    case Pass::kBackward: return "backward";
    case Pass::kRecompute: return "recompute";
    case Pass::kOptimizer: return "optimizer";
    case Pass::kComm: return "comm";
    case Pass::kHost: return "host";
  }
  return "host";
}

namespace {
const char* suffix(Pass p) {
  switch (p) {
    case Pass::kForward: return ".fwd";
    case Pass::kBackward: return ".bwd";
    case Pass::kRecompute: return ".recompute";
    case Pass::kComm: return ".comm";
    default: return "";
  }
}
}  // namespace

std::string slice_name(const models::Op& op, Pass p) { return op.name + suffix(p); }

bool parse_slice_name(const std::string& slice, std::string* op, Pass* p) {
  for (Pass q : {Pass::kForward, Pass::kBackward, Pass::kRecompute, Pass::kComm}) {
    const std::string s = suffix(q);
    if (slice.size() > s.size() && slice.compare(slice.size() - s.size(), s.size(), s) == 0) {
      *op = slice.substr(0, slice.size() - s.size());
      *p = q;
      return true;
    }
  }
  return false;
}

}  // namespace rackstep::sim
