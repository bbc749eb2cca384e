// Generates Marin-family model shapes from size targets, for sizing
// candidates whose configs are not public ("a ~129B-A15B", "a 360B-A21B with MLA").
//
// The family recipe comes from a template model (default: the hero): head dim
// 128, heads = d/128, KV heads local = heads/4 and global = heads/8, expert
// width = latent = d/2 (d/4 when the targets need finer expert granularity),
// 2 shared experts of width d/2, depth = d / width_per_layer
// rounded to even. The generator searches d and top-k, and solves the expert
// count from the total target (parameters are linear in the expert count), so
// every count comes from the layer graph itself.
//
//   ShapeTarget t{.name = "129b-a15b", .total_params = 129e9, .active_params = 15e9};
//   GeneratedShape s = generate_shape(t, load_model("models/zoo/marin-535b-a23b.json"));
//   s.model;  s.total_params;  s.active_params;
#pragma once

#include <string>
#include <vector>

#include "models/model.h"

namespace rackstep::sim {

struct ShapeTarget {
  std::string name;
  double total_params = 0;
  double active_params = 0;
  std::string attention = "gqa";     // "gqa" or "mla"
  double d_per_layer = 128.0;        // width:depth rule (hero: 6144 / 48)
  int64_t expert_multiple = 64;      // experts rounded to a multiple of this (EP-friendly)
  std::vector<int64_t> top_k_choices = {2, 4, 5, 6, 7, 8};
};

struct GeneratedShape {
  models::ModelConfig model;
  double total_params = 0;
  double active_params = 0;
  double total_rel_err = 0;
  double active_rel_err = 0;
};

// active = total asks for a dense shape (no experts, SwiGLU MLP of width 8d/3, d
// searched for the total). Throws UserError when no shape of the family comes
// within 5% of both targets (of the total, for a dense one).
GeneratedShape generate_shape(const ShapeTarget& target, const models::ModelConfig& family_template);

}  // namespace rackstep::sim
