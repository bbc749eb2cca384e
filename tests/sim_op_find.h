// The one op of a kind in a model's op table (the embedding's ops, the block classes, then the head), for tests that
// price a single op. Shared by the sim_* kernel tests.
#pragma once

#include "sim/base/check.h"
#include "sim/cost.h"

namespace rackstep::sim {

inline const OpEntry& find_op(const OpTable& t, models::OpKind kind) {
  for (const auto& e : t.pre) {
    if (e.kind == kind) return e;
  }
  for (const auto& c : t.classes) {
    for (const auto& e : c.ops) {
      if (e.kind == kind) return e;
    }
  }
  for (const auto& e : t.head) {
    if (e.kind == kind) return e;
  }
  RS_CHECK(false, "the model has an op of this kind");
  return t.head.front();
}

}  // namespace rackstep::sim
