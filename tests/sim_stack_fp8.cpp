// FP8 GEMM efficiency is one GB200 measurement: applied to another GPU it is an
// assumption the prediction says out loud (issue 13), never a silent default.
#include <catch2/catch.hpp>

#include <string>

#include "sim/base/source_dir.h"
#include "sim/predict.h"

using namespace rackstep;
using namespace rackstep::sim;

namespace {
std::string src(const std::string& p) { return std::string(rackstep::source_dir()) + "/" + p; }
}  // namespace

TEST_CASE("FP8 GEMMs on a GPU the FP8 efficiency was not measured on carry a warning", "[stack][fp8]") {
  const auto g = models::build_layer_graph(models::load_model(src("tests/validation/models/llama3-70b.json")));
  const auto c = topologies::load_cluster(src("topologies/zoo/hgx-h100.json"), 1);
  Calibration cal = default_calibration();
  REQUIRE(!cal.fp8_gemm_measured_gpus.empty());
  cal.fp8_dense_relative_eff.erase(c.system.gpu.name);  // as if the H100 had no dense FP8 measurement
  Layout l;
  l.tp = 8;
  l.zero_stage = 0;
  l.tokens_per_step = 8192;
  l.recompute = models::Recompute::kNone;
  CHECK(Predictor(g, c, cal).predict(l).warnings.empty());  // BF16: nothing assumed
  l.fp8 = Fp8Gemms::kLinear;
  const Prediction h100 = Predictor(g, c, cal).predict(l);
  REQUIRE(h100.warnings.size() == 1);  // a dense model: the dense FP8 efficiency only
  CHECK(h100.warnings[0].find("H100") != std::string::npos);
  CHECK(h100.warnings[0].find("fp8_dense_relative_efficiency") != std::string::npos);
  // Measured on this GPU: no warning.
  cal.fp8_dense_relative_eff[c.system.gpu.name] = 0.9;
  CHECK(Predictor(g, c, cal).predict(l).warnings.empty());
}

TEST_CASE("FP8 expert GEMMs want the grouped FP8 measurement on the GPU", "[stack][fp8]") {
  const auto g = models::build_layer_graph(models::load_model(src("tests/validation/models/qwen3-30b-a3b.json")));
  const auto c = topologies::load_cluster(src("topologies/zoo/hgx-h100.json"), 1);
  Calibration cal = default_calibration();
  REQUIRE(cal.fp8_dense_relative_eff.count(c.system.gpu.name) == 1);  // dense: measured on H100
  Layout l;
  l.data = 8;
  l.fsdp = 8;
  l.ep = 8;
  l.zero_stage = 1;
  l.tokens_per_step = 8 * 4096;
  l.recompute = models::Recompute::kNone;
  l.fp8 = Fp8Gemms::kExperts;
  const Prediction p = Predictor(g, c, cal).predict(l);
  REQUIRE(p.warnings.size() == 1);
  CHECK(p.warnings[0].find("grouped") != std::string::npos);
  cal.fp8_gemm_measured_gpus.push_back(c.system.gpu.name);
  CHECK(Predictor(g, c, cal).predict(l).warnings.empty());
}
