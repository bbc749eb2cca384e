// The training loop (exec/train.h): checkpoint -> resume is bitwise identical
// to an uninterrupted run; corrupt or foreign checkpoints are clear errors that
// change nothing; a NaN stops the run naming the step and the op.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "exec/data.h"
#include "sim/base/source_dir.h"
#include "exec/train.h"
#include "tests/exec_not_host_backend.h"
#include "tests/exec_test_data.h"
#include "sim/base/check.h"
#include "sim/base/json_io.h"
#include "sim/base/value_error.h"

using namespace rackstep;
using namespace rackstep::exec;
namespace fs = std::filesystem;

namespace {

const std::string kTiny = std::string(rackstep::source_dir()) + "/models/zoo/tiny-moe.json";

// A small dataset of generated text, built once per test binary run.
std::string test_dataset() {
  static const std::string dir = [] {
    const fs::path root = fs::temp_directory_path() / ("rackstep-train-test-" + std::to_string(::getpid()));
    return testing::build_word_dataset(root, 1);
  }();
  return dir;
}

// Runs a trainer to its end, appending its step logs; returns its final parameters.
std::vector<float> run_to_end(const TrainOptions& o, std::vector<StepLog>& logs) {
  Trainer t(o);
  while (!t.done()) logs.push_back(t.step());
  const Arena& p = std::as_const(t.model()).params();
  return {p.data(), p.data() + p.total_floats()};
}

TrainOptions small_options(const std::string& out) {
  TrainOptions o;
  o.model_path = kTiny;
  o.data_dir = test_dataset();
  o.out_dir = out;
  o.steps = 6;
  o.batch = 2;
  o.seq = 64;
  o.seed = 4;
  o.eval_batches = 1;
  return o;
}

std::string fresh_dir(const std::string& name) {
  const fs::path p = fs::temp_directory_path() / ("rackstep-train-" + name + "-" + std::to_string(::getpid()));
  fs::remove_all(p);
  return p.string();
}

std::vector<char> read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

}  // namespace

TEST_CASE("checkpoint then resume continues bitwise identically", "[exec][train][checkpoint]") {
  // Uninterrupted: 6 steps.
  std::vector<double> straight;
  std::vector<float> straight_params;
  {
    Trainer t(small_options(fresh_dir("straight")));
    while (!t.done()) straight.push_back(t.step().loss);
    straight_params.assign(t.model().params().data(), t.model().params().data() + t.model().params().total_floats());
  }
  REQUIRE(straight.size() == 6);
  // Interrupted after 3 steps, then resumed from the checkpoint by a new process-like Trainer.
  const std::string dir = fresh_dir("resume");
  std::vector<double> resumed;
  {
    TrainOptions o = small_options(dir);
    o.stop_after = 3;
    Trainer t(o);
    while (!t.done()) resumed.push_back(t.step().loss);
    t.save_checkpoint();
  }
  {
    TrainOptions o = small_options(dir);
    o.resume = true;
    Trainer t(o);
    CHECK(t.step_index() == 3);
    while (!t.done()) resumed.push_back(t.step().loss);
    REQUIRE(resumed.size() == straight.size());
    for (size_t i = 0; i < straight.size(); ++i) {
      INFO("step " << i + 1);
      CHECK(same_bits(resumed[i], straight[i]));
    }
    const Arena& p = t.model().params();
    REQUIRE(static_cast<size_t>(p.total_floats()) == straight_params.size());
    CHECK(std::memcmp(p.data(), straight_params.data(), straight_params.size() * sizeof(float)) == 0);
  }
}

TEST_CASE("corrupt or foreign checkpoints are clear errors and change nothing", "[exec][train][checkpoint]") {
  const std::string dir = fresh_dir("corrupt");
  std::string ckpt;
  {
    TrainOptions o = small_options(dir);
    o.stop_after = 1;
    Trainer t(o);
    t.step();
    ckpt = t.save_checkpoint();
  }
  SECTION("a flipped byte") {
    std::vector<char> bytes = read_bytes(ckpt);
    bytes[bytes.size() / 2] ^= 0x5a;
    { std::ofstream(ckpt, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size())); }
    TrainOptions o = small_options(dir);
    o.resume = true;
    try {
      Trainer t(o);
      FAIL("expected a UserError");
    } catch (const UserError& e) {
      CHECK(std::string(e.what()).find(ckpt) != std::string::npos);
    }
    CHECK(read_bytes(ckpt) == bytes);  // left as it was
  }
  SECTION("a truncated file") {
    std::vector<char> bytes = read_bytes(ckpt);
    bytes.resize(bytes.size() - 100);
    { std::ofstream(ckpt, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size())); }
    TrainOptions o = small_options(dir);
    o.resume = true;
    CHECK_THROWS_AS(Trainer(o), UserError);
    CHECK(read_bytes(ckpt) == bytes);
  }
  SECTION("another model's run") {
    nlohmann::json doc = load_json_file(kTiny);
    doc["layers"] = 2;
    const std::string other = (fs::path(dir) / "other-model.json").string();
    write_json_file_atomic(other, doc);
    const std::vector<char> before = read_bytes(ckpt);
    TrainOptions o = small_options(dir);
    o.model_path = other;
    o.resume = true;
    CHECK_THROWS_AS(Trainer(o), UserError);
    CHECK(read_bytes(ckpt) == before);
    // The checkpoint loader itself refuses the foreign layout too.
    const models::LayerGraph g = models::build_layer_graph(models::load_model(other));
    Model m(g, 1, 16);
    m.init_params(1);
    OptimizerState st = init_optimizer_state(m.params());
    CheckpointMeta meta;
    CHECK_THROWS_AS(load_checkpoint(ckpt, m.params(), st, meta), UserError);
  }
  SECTION("a fresh run into a used directory") {
    CHECK_THROWS_AS(Trainer(small_options(dir)), UserError);
    CHECK(fs::exists(ckpt));
  }
}

TEST_CASE("a NaN stops training naming the step and the first op", "[exec][train][nan]") {
  Trainer t(small_options(""));
  t.step();
  TensorView w = t.model().params().view("layers.1.attn.q_proj.w");
  w.data[5] = std::nanf("");
  try {
    t.step();
    FAIL("expected a NonFiniteError");
  } catch (const NonFiniteError& e) {
    const std::string msg = e.what();
    INFO(msg);
    CHECK(msg.find("step 2") != std::string::npos);
    CHECK(msg.find("layers.1.attn.q_proj") != std::string::npos);
  }
}

TEST_CASE("eval loss and logs", "[exec][train]") {
  const std::string dir = fresh_dir("eval");
  TrainOptions o = small_options(dir);
  Trainer t(o);
  const double e0 = t.evaluate();
  CHECK(std::isfinite(e0));
  const StepLog s = t.step();
  CHECK(s.step == 1);
  CHECK(s.tokens_per_s > 0);
  CHECK(s.mfu > 0);
  CHECK(s.grad_norm[static_cast<int>(OptGroup::kMuonH)] > 0);
  CHECK(s.grad_norm[static_cast<int>(OptGroup::kAdamH)] > 0);
  CHECK(s.grad_norm[static_cast<int>(OptGroup::kAdam)] > 0);
  CHECK(t.evaluate() == Approx(t.evaluate()));  // evals do not move the model

  // The logs: run_training writes one line per step and one per evaluation to
  // log.jsonl, and the eval lines hold the losses evaluate() returns.
  const std::string run = fresh_dir("eval-log");
  TrainOptions lo = small_options(run);
  lo.steps = 4;
  lo.eval_every = 2;
  TrainOutput quiet;
  quiet.json = true;
  REQUIRE(run_training(lo, quiet) == 0);
  std::ifstream log(fs::path(run) / "log.jsonl");
  REQUIRE(log.good());
  std::vector<int64_t> step_lines, eval_steps;
  std::vector<double> eval_losses;
  for (std::string line; std::getline(log, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j.contains("eval_loss")) {
      eval_steps.push_back(j.at("step").get<int64_t>());
      eval_losses.push_back(j.at("eval_loss").get<double>());
    } else {
      CHECK(std::isfinite(j.at("loss").get<double>()));
      step_lines.push_back(j.at("step").get<int64_t>());
    }
  }
  CHECK(step_lines == std::vector<int64_t>{1, 2, 3, 4});
  CHECK(eval_steps == std::vector<int64_t>{2, 4});
  // The logged eval at step 4 is bitwise the evaluate() of an identical run
  // after 4 steps (evaluations in between do not change training).
  TrainOptions again = small_options(fresh_dir("eval-again"));
  again.steps = 4;
  Trainer t2(again);
  for (int i = 0; i < 4; ++i) t2.step();
  REQUIRE(eval_losses.size() == 2);
  CHECK(same_bits(eval_losses[1], t2.evaluate()));
  CHECK(eval_losses[1] < std::log(256.0) + 0.5);  // about ln(vocab) or better, not garbage
}

// Residency (exec/backend.h, exec/model.h): a backend outside host memory with
// its own optimizer keeps parameters, gradients and moments there; the host
// sees them only at checkpoints. Run on the CPU backend dressed as a device
// (tests/exec_not_host_backend.h), whose optimizer is the host's: the run must
// be bitwise the CPU backend's, checkpoint and resume included, with no arena
// copy per step once it runs (the driver's lazy copies: the non-resident
// device path moves parameters in and gradients out every step).
TEST_CASE("a resident backend trains, checkpoints and resumes bitwise like the CPU, copying no arena per step",
          "[exec][train][resident]") {
  testing::register_not_host_backends();
  struct Run {
    std::vector<StepLog> logs;
    std::vector<float> params;
    std::vector<char> checkpoint;
    std::vector<size_t> copy_bytes;  // the model's arena copies after each step
    size_t arena_bytes = 0;
  };
  auto train = [](const std::string& backend, const std::string& dir) {
    Run r;
    {
      TrainOptions o = small_options(dir);
      o.backend = backend;
      o.steps = 4;
      o.stop_after = 2;
      Trainer t(o);
      r.arena_bytes = std::as_const(t.model()).params().bytes();
      while (!t.done()) {
        r.logs.push_back(t.step());
        r.copy_bytes.push_back(t.model().arena_copy_bytes());
      }
      r.checkpoint = read_bytes(t.save_checkpoint());
    }
    TrainOptions o = small_options(dir);
    o.backend = backend;
    o.steps = 4;
    o.resume = true;
    r.params = run_to_end(o, r.logs);
    return r;
  };
  const Run cpu = train("cpu", fresh_dir("resident-cpu"));
  const Run dev = train("cpu-as-device", fresh_dir("resident-dev"));
  const Run res = train("cpu-resident", fresh_dir("resident-res"));
  REQUIRE(cpu.logs.size() == 4);
  for (const Run* r : {&dev, &res}) {
    REQUIRE(r->logs.size() == cpu.logs.size());
    for (size_t i = 0; i < cpu.logs.size(); ++i) {
      INFO("step " << i + 1);
      CHECK(same_bits(r->logs[i].loss, cpu.logs[i].loss));
      for (int g = 0; g < 4; ++g) CHECK(same_bits(r->logs[i].grad_norm[g], cpu.logs[i].grad_norm[g]));
    }
    CHECK(r->checkpoint == cpu.checkpoint);
    CHECK(r->params == cpu.params);
  }
  CHECK(cpu.copy_bytes == std::vector<size_t>(2, 0));  // host memory: one copy of everything
  // The host optimizer on a device: parameters in and gradients out, every step.
  CHECK(dev.copy_bytes[1] - dev.copy_bytes[0] == 2 * dev.arena_bytes);
  // Resident: the initial parameters in, then nothing.
  CHECK(res.copy_bytes == std::vector<size_t>(2, res.arena_bytes));
}

TEST_CASE("the backend's data-parallel collectives train, checkpoint and resume like the host path",
          "[exec][train][dp]") {
  // One process: the shard plan of one rank covers the arena, the owner's step
  // runs in the backend's optimizer over it, and the collectives copy; the run
  // must be the host run bit for bit (the grad norms to the rounding of one
  // square root and its square), and its checkpoints interchangeable.
  testing::register_not_host_backends();
  auto options = [](const std::string& dir, const std::string& backend, const std::string& collectives) {
    TrainOptions o = small_options(dir);
    o.backend = backend;
    o.dp_collectives = collectives;
    o.steps = 4;
    return o;
  };
  struct Run {
    std::vector<StepLog> logs;
    std::vector<char> checkpoint;
    std::vector<float> params;
  };
  auto train = [&](const std::string& backend, const std::string& collectives, const std::string& resume_with) {
    const std::string dir = fresh_dir("dp-" + backend + "-" + collectives + "-" + resume_with);
    Run r;
    {
      TrainOptions o = options(dir, backend, collectives);
      o.stop_after = 2;
      Trainer t(o);
      while (!t.done()) r.logs.push_back(t.step());
      r.checkpoint = read_bytes(t.save_checkpoint());
    }
    TrainOptions o = options(dir, resume_with, resume_with == "cpu" ? "host" : collectives);
    o.resume = true;
    r.params = run_to_end(o, r.logs);
    return r;
  };
  const Run host = train("cpu", "host", "cpu");
  const Run dp = train("cpu-collectives", "backend", "cpu-collectives");
  const Run across = train("cpu-collectives", "backend", "cpu");  // a backend-collectives checkpoint, resumed on the host
  REQUIRE(host.logs.size() == 4);
  for (const Run* r : {&dp, &across}) {
    REQUIRE(r->logs.size() == host.logs.size());
    for (size_t i = 0; i < host.logs.size(); ++i) {
      INFO("step " << i + 1);
      CHECK(same_bits(r->logs[i].loss, host.logs[i].loss));
      for (int g = 0; g < 4; ++g) {
        CHECK(r->logs[i].grad_norm[g] == Approx(host.logs[i].grad_norm[g]).epsilon(1e-14).margin(1e-300));
      }
    }
    CHECK(r->checkpoint == host.checkpoint);
    CHECK(r->params == host.params);
  }
}

TEST_CASE("backend collectives are refused where the backend has none, and the setting is checked",
          "[exec][train][dp]") {
  testing::register_not_host_backends();
  TrainOptions o = small_options("");
  o.dp_collectives = "backend";
  for (const char* backend : {"cpu", "cpu-resident"}) {
    o.backend = backend;
    INFO(backend);
    REQUIRE_THROWS_AS(Trainer(o), ValueError);
    try {
      Trainer t(o);
    } catch (const ValueError& e) {
      CHECK_THAT(e.what(), Catch::Contains("dp_collectives") && Catch::Contains("reduce host copies over MPI"));
    }
  }
  o.backend = "cpu";
  o.dp_collectives = "nccl";
  try {
    Trainer t(o);
    FAIL("dp_collectives nccl accepted");
  } catch (const ValueError& e) {
    CHECK_THAT(e.what(), Catch::Contains("host or backend"));
  }
}

// Expert parallelism through the backend's own transport (Backend::make_experts,
// the path of the CUDA backend's NCCL experts), on the CPU dressed as a device
// whose transport is the MPI one over host copies (tests/exec_not_host_backend.h):
// in one process with ep 1 it is a group of one, and its decisions (the shared
// plan of exec/ep_plan.h) must be the simulated dispatch's (sim::dispatch of one
// GPU): the same drops at every step, and the same losses to the rounding of
// the expert GEMMs' row order.
// --verify-dispatch checks every layer against sim::dispatch on the way.
TEST_CASE("expert parallel through a backend's own transport drops and trains like the simulated dispatch",
          "[exec][train][ep]") {
  testing::register_not_host_backends();
  for (const sim::Transport transport : {sim::Transport::pooled, sim::Transport::ragged}) {
    int64_t moe_layers = 0;
    auto train = [&](const std::string& backend, bool verify, int64_t& verified) {
      TrainOptions o = small_options("");
      o.backend = backend;
      o.steps = 3;
      o.dispatch.enabled = true;
      o.dispatch.ep = 1;
      o.dispatch.config.transport = transport;
      o.dispatch.config.sender_cf = 0.8;
      o.dispatch.config.receiver_cf = 0.8;
      o.dispatch.config.waves = 2;
      o.verify_dispatch = verify;
      std::vector<StepLog> logs;
      Trainer t(o);
      while (!t.done()) logs.push_back(t.step());
      verified = t.verified_dispatch_layers();
      moe_layers = std::count_if(t.graph().ops.begin(), t.graph().ops.end(),
                                 [](const models::Op& op) { return op.kind == models::OpKind::kExpertMlp; });
      return logs;
    };
    INFO(sim::transport_name(transport));
    int64_t verified_sim = 0, verified_ep = 0;
    const std::vector<StepLog> simulated = train("cpu", false, verified_sim);
    const std::vector<StepLog> ep = train("cpu-collectives", true, verified_ep);
    REQUIRE(ep.size() == simulated.size());
    int64_t dropped = 0;
    for (size_t i = 0; i < ep.size(); ++i) {
      INFO("step " << i + 1);
      CHECK(ep[i].drops.sender == simulated[i].drops.sender);
      CHECK(ep[i].drops.receiver == simulated[i].drops.receiver);
      CHECK(ep[i].drops.assignments == simulated[i].drops.assignments);
      // The experts see their kept rows in the transport's order (source, slot),
      // not the grouping's: the weight gradients' sums run in another order.
      CHECK(ep[i].loss == Approx(simulated[i].loss).epsilon(1e-5));
      dropped += ep[i].drops.dropped();
    }
    CHECK(dropped > 0);  // the capacities bind: the comparison is about drops
    CHECK(verified_sim == 0);
    CHECK(verified_ep == 3 * moe_layers);  // every MoE layer of 3 steps checked against sim::dispatch
  }
}

TEST_CASE("a dispatch check without a transport to check is one clear error", "[exec][train][ep]") {
  // cpu-resident has no expert parallelism in its memory: one process with ep 1
  // falls back to the simulated dispatch, which --verify-dispatch cannot check.
  testing::register_not_host_backends();
  TrainOptions o = small_options("");
  o.dispatch.enabled = true;
  o.dispatch.ep = 1;
  o.dispatch.config.transport = sim::Transport::pooled;
  o.verify_dispatch = true;
  for (const char* backend : {"cpu", "cpu-resident"}) {
    o.backend = backend;
    INFO(backend);
    try {
      Trainer t(o);
      FAIL("--verify-dispatch accepted without a transport");
    } catch (const ValueError& e) {
      CHECK_THAT(e.what(), Catch::Contains("verify_dispatch") && Catch::Contains("backend " + std::string(backend)));
      CHECK(std::string(e.what()).find('\n') == std::string::npos);
    }
  }
  o.verify_dispatch = false;  // without the check: the simulated dispatch trains
  o.steps = 1;
  Trainer t(o);
  CHECK(t.step().drops.assignments > 0);
}
