// The profiler on the CUDA backend (part of test_cuda, label gpu: skipped
// without a device): `rackstep train --backend cuda --profile` on tiny-moe for
// two steps writes device times from CUDA events (exec/cuda/op_timing.h) whose
// per-op sum covers the step's event time to 20% (the gaps are the host's work
// between ops), and the allocator's high-water mark (exec/cuda/memory.h)
// above the parameter arena it holds.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <utility>

#include "exec/cuda/backend.h"
#include "exec/train.h"
#include "sim/base/json_io.h"
#include "sim/base/source_dir.h"
#include "tests/exec_test_data.h"

using namespace rackstep;
using namespace rackstep::exec;
namespace fs = std::filesystem;

TEST_CASE("cuda: the profile of tiny-moe has per-op device times and the peak device memory",
          "[cuda][gpu][profile]") {
  cuda::register_cuda_backend();
  const fs::path root = fs::temp_directory_path() / ("rackstep-cuda-profile-" + std::to_string(::getpid()));
  fs::remove_all(root);
  TrainOptions o;
  o.model_path = std::string(rackstep::source_dir()) + "/models/zoo/tiny-moe.json";
  o.data_dir = testing::build_word_dataset(root / "words", 1);
  o.out_dir = (root / "run").string();
  o.backend = "cuda";
  o.steps = 2;
  o.batch = 2;
  o.seq = 64;
  o.seed = 4;
  o.eval_batches = 0;
  o.profile = true;
  o.profile_steps = 2;
  double arena_bytes = 0;
  {
    Trainer t(o);
    while (!t.done()) t.step();
    t.write_profile();
    arena_bytes = static_cast<double>(std::as_const(t.model()).params().bytes());
  }
  const nlohmann::json om = load_json_file((fs::path(o.out_dir) / "op_measurements.json").string());
  CHECK(om["format"] == "rackstep.op_measurements/1");
  CHECK(om["op_clock"] == "cuda_events");
  CHECK(om["device"].get<std::string>() != "cpu");
  CHECK(om["steps"] == 2);
  // The parameters, their gradients and the optimizer's moments are on the device at once.
  CHECK(om["peak_device_bytes"].get<double>() > arena_bytes);
  CHECK(om.value("device_used_at_peak_bytes", 0.0) >= om["peak_device_bytes"].get<double>());

  // Per step: the slices' device time against the step's event time (first event to the last interval's end).
  const nlohmann::json t = load_json_file((fs::path(o.out_dir) / "trace.json").string());
  const nlohmann::json& events = t.is_object() ? t["traceEvents"] : t;
  std::map<int64_t, double> op_s;
  for (const auto& e : events) {
    if (e.value("ph", "") == "X") op_s[e["args"]["step"].get<int64_t>()] += 1e-6 * e["dur"].get<double>();
  }
  REQUIRE(op_s.size() == 2);
  REQUIRE(om["step_device_s"].size() == 2);
  size_t i = 0;
  for (const auto& [step, s] : op_s) {
    const double span = om["step_device_s"][i++].get<double>();
    std::printf("cuda profile: step %lld: ops %.6f s of the step's %.6f s on the device\n",
                static_cast<long long>(step), s, span);
    CHECK(span > 0);
    CHECK(std::abs(s - span) <= 0.2 * span);
  }
  fs::remove_all(root);
}
