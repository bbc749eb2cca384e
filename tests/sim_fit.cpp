// sim/fit.h: the calibration fit recovers the parameters of measurements the
// predictor itself generated (a closed loop: profiles of the tiny model priced
// with known efficiencies), and reports in-sample errors per op class.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>

#include "models/layer_graph.h"
#include "models/model.h"
#include "sim/base/source_dir.h"
#include "sim/calibration.h"
#include "sim/fit.h"
#include "sim/predict.h"
#include "topologies/topology.h"

using namespace rackstep;

namespace {

std::string src(const std::string& rel) { return std::string(rackstep::source_dir()) + "/" + rel; }

// Profiles of tiny-moe at three (batch, seq) points with every op priced by
// `truth` on `cluster`: what a noiseless CPU would measure.
nlohmann::json synthetic_measurements(const sim::Calibration& truth, const topologies::Cluster& cluster) {
  const std::string model = src("models/zoo/tiny-moe.json");
  const models::LayerGraph g = models::build_layer_graph(models::load_model(model));
  nlohmann::json profiles = nlohmann::json::array();
  for (const auto& [batch, seq] : std::vector<std::pair<int64_t, int64_t>>{{1, 128}, {4, 128}, {8, 256}}) {
    const sim::Layout l = sim::cpu_run_layout(1, 1, batch, seq, "ragged");
    const sim::Predictor p(g, cluster, truth);
    const std::vector<sim::OpTiming> t = p.op_timings(l);
    nlohmann::json ops = nlohmann::json::array();
    double fwd = 0, bwd = 0;
    for (size_t i = 0; i < t.size(); ++i) {
      ops.push_back({{"index", i}, {"op", g.ops[i].name}, {"fwd_s", t[i].fwd_s}, {"bwd_s", t[i].bwd_s}});
      fwd += t[i].fwd_s;
      bwd += t[i].bwd_s;
    }
    profiles.push_back({{"model", model}, {"batch", batch}, {"seq", seq}, {"forward_s", fwd}, {"backward_s", bwd},
                        {"optimizer_s", p.predict(l).breakdown.optimizer_compute_s}, {"ops", ops}});
  }
  return {{"format", "rackstep.calibration_measurements/1"}, {"backend", "cpu"}, {"threads", 1},
          {"stream", {{"bytes_per_s", 3e10}}}, {"profiles", profiles}};
}

}  // namespace

TEST_CASE("fit: recovers the efficiencies of profiles priced by a known calibration", "[fit]") {
  const std::string topo = src("topologies/zoo/cpu-host.json");
  const std::string base = sim::default_calibration_path();
  // The fitted topology (name, measured bandwidth) the synthetic profiles are priced on.
  const nlohmann::json stream_only = {{"format", "rackstep.calibration_measurements/1"}, {"backend", "cpu"},
                                      {"threads", 1}, {"stream", {{"bytes_per_s", 3e10}}}};
  const sim::FitResult r0 = sim::fit_measurements(stream_only, topo, base, "stream-only");
  const topologies::SystemSpec sys = topologies::parse_system(r0.topologies.at("topology.json"), "fitted");
  const topologies::Cluster one = topologies::make_cluster(sys, 1);

  sim::Calibration truth = sim::parse_calibration(r0.calibration, "fitted");
  truth.gemm_peak_eff[sys.gpu.name] = 0.6;
  truth.gemm_half_dim = 16;
  truth.grouped_factor = 0.7;
  truth.attention_fwd_eff = 0.2;
  truth.attention_bwd_eff = 0.25;
  truth.mem_eff_elementwise = 0.5;
  truth.mem_eff_norm = 0.12;
  truth.mem_eff_routing = 0.05;
  truth.mem_eff_loss = 0.1;
  truth.mem_eff_lookup = 0.3;
  truth.launch_overhead_s = 4e-6;

  const sim::FitResult r = sim::fit_measurements(synthetic_measurements(truth, one), topo, base, "synthetic");
  const nlohmann::json& e = r.summary.at("efficiencies");
  CHECK(r.summary.at("gemm_half_dim").get<double>() == 16);
  CHECK(e.at("gemm").get<double>() == Approx(0.6).epsilon(0.02));
  CHECK(e.at("grouped_gemm").get<double>() == Approx(0.7).epsilon(0.02));
  CHECK(e.at("attention_fwd").get<double>() == Approx(0.2).epsilon(0.02));
  CHECK(e.at("attention_bwd").get<double>() == Approx(0.25).epsilon(0.02));
  CHECK(e.at("norm").get<double>() == Approx(0.12).epsilon(0.02));
  CHECK(e.at("launch_overhead_s").get<double>() == Approx(4e-6).epsilon(0.05));
  CHECK(r.summary.at("fit_relative_rms").get<double>() < 0.01);
  // In sample, per class, with the fitted predictor itself.
  for (const auto& [cls, err] : r.summary.at("in_sample").at("by_class").items()) {
    INFO(cls);
    CHECK(std::fabs(err.get<double>()) < 0.02);
  }
  // The written files load and carry their sources.
  const sim::Calibration fitted = sim::parse_calibration(r.calibration, "fitted calibration");
  CHECK(fitted.attention_fwd_eff == Approx(0.2).epsilon(0.02));
  CHECK(r.calibration.at("attention").at("fwd_efficiency").at("source").get<std::string>().rfind("[F]", 0) == 0);
}

TEST_CASE("fit: the CPU run layout is ZeRO-1 over every process", "[fit]") {
  const sim::Layout l = sim::cpu_run_layout(4, 2, 8, 128, "pooled");
  CHECK(l.data == 4);
  CHECK(l.fsdp == 4);
  CHECK(l.zero_stage == 1);
  CHECK(l.micro_batch_seqs == 2);
  CHECK(l.ep_transport == sim::Transport::pooled);
}
