// Generated Marin-family shapes hit their parameter targets.
#include <catch2/catch.hpp>

#include <cmath>

#include "sim/base/check.h"
#include "sim/base/source_dir.h"
#include "models/layer_graph.h"
#include "sim/generate.h"

using namespace rackstep;

static const models::ModelConfig& family() {
  static const models::ModelConfig m =
      models::load_model(std::string(rackstep::source_dir()) + "/models/zoo/marin-535b-a23b.json");
  return m;
}

TEST_CASE("generated shapes hit total and active within 2%", "[sim][generate]") {
  struct T {
    const char* name;
    double total, active;
    const char* attention;
  };
  const T targets[] = {{"129b-a15b", 129e9, 15e9, "gqa"},
                       {"707b-a23b", 707e9, 23e9, "gqa"},
                       {"360b-a21b-mla", 360e9, 21e9, "mla"},
                       {"535b-a23b", 535e9, 23e9, "gqa"},
                       {"30b-a3b", 30e9, 3e9, "gqa"}};
  for (const T& t : targets) {
    INFO(t.name);
    sim::ShapeTarget st;
    st.name = t.name;
    st.total_params = t.total;
    st.active_params = t.active;
    st.attention = t.attention;
    const sim::GeneratedShape s = sim::generate_shape(st, family());
    // Re-count independently through the layer graph.
    const auto p = models::count_params(models::build_layer_graph(s.model));
    CHECK(p.total == Approx(t.total).epsilon(0.02));
    CHECK(p.active == Approx(t.active).epsilon(0.02));
    CHECK(s.model.moe.experts % 8 == 0);
    CHECK(s.model.attention.heads * 128 == s.model.d_model);
    CHECK(s.model.layers % 2 == 0);
    CHECK((s.model.attention.kind == models::AttentionKind::kMla) == (std::string(t.attention) == "mla"));
  }
}

TEST_CASE("impossible targets are a clear error", "[sim][generate]") {
  sim::ShapeTarget t;
  t.name = "upside-down";
  t.total_params = 10e9;
  t.active_params = 20e9;
  CHECK_THROWS_AS(sim::generate_shape(t, family()), UserError);
  t.active_params = 0;
  CHECK_THROWS_AS(sim::generate_shape(t, family()), UserError);
}

TEST_CASE("active = total asks for a dense shape", "[sim][generate]") {
  sim::ShapeTarget t;
  t.name = "dense-70b";
  t.total_params = 70e9;
  t.active_params = 70e9;
  const sim::GeneratedShape s = sim::generate_shape(t, family());
  CHECK(s.model.moe.experts == 0);
  CHECK(s.model.moe.dense_width > s.model.d_model);
  CHECK(std::abs(s.total_rel_err) < 0.05);
  // Every layer is dense, so the counted active parameters are (nearly) the total.
  CHECK(s.active_params > 0.9 * s.total_params);
}
