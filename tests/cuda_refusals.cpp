// What the CUDA backend refuses (exec/cuda/backend.h, unsupported()), checked
// without a device: the refusal is a pure function of the layer graph, so CI
// proves here that the models the GPU is meant to run are not refused, and
// that what it cannot run yet is refused with the model file's setting.
#include <catch2/catch.hpp>

#include <set>
#include <string>

#include "exec/cuda/backend.h"
#include "models/layer_graph.h"
#include "models/model.h"
#include "sim/base/source_dir.h"

namespace {

using namespace rackstep;
using models::OpKind;

// "json_path found value" of every op the CUDA backend refuses in model m.
std::set<std::string> refused(const models::ModelConfig& m) {
  std::set<std::string> r;
  for (const models::Op& op : models::build_layer_graph(m).ops) {
    const exec::cuda::Unsupported u = exec::cuda::unsupported(op, m);
    if (!u.json_path.empty()) r.insert(u.json_path + " found " + u.found);
  }
  return r;
}

models::ModelConfig zoo(const std::string& file) {
  return models::load_model(std::string(source_dir()) + "/" + file);
}

}  // namespace

TEST_CASE("cuda backend: GPT-2's block (GeLU MLP, MLP biases, learned positions) is not refused", "[cuda][refusal]") {
  // tiny-gpt-gelu: learned positions, Q/K/V and output biases, a GeLU MLP with
  // biases, LayerNorm, tied embeddings, NoPE attention.
  CHECK(refused(zoo("models/zoo/tiny-gpt-gelu.json")).empty());
}

TEST_CASE("cuda backend: every dense MLP activation, with and without biases, is not refused", "[cuda][refusal]") {
  for (const auto act : {models::MlpActivation::kSwiGlu, models::MlpActivation::kGelu, models::MlpActivation::kRelu2}) {
    for (const bool bias : {false, true}) {
      models::ModelConfig m = zoo("models/zoo/tiny-moe.json");
      m.mlp.activation = act;
      m.mlp.bias = bias;
      m.moe.dense_layers = 1;  // a dense layer besides the shared experts
      m.moe.dense_width = 48;
      INFO("activation " << static_cast<int>(act) << " bias " << bias);
      CHECK(refused(m).empty());
    }
  }
}

TEST_CASE("cuda: gpt-oss's ops all run on the GPU (nothing refused)", "[cuda][refusal]") {
  // Attention biases, sinks, the routed experts' biases and clamped SwiGLU.
  for (const char* file : {"tests/models/tiny-gpt-oss-moe.json", "tests/validation/models/gpt-oss-120b.json"}) {
    INFO(file);
    CHECK(refused(zoo(file)).empty());
  }
}

TEST_CASE("cuda backend: ALiBi is refused with the model file's setting, one line", "[cuda][refusal]") {
  // The CPU backend runs ALiBi scores; the CUDA attention kernels have no bias term yet.
  const std::set<std::string> r = refused(zoo("models/zoo/tiny-alibi-sink-moe.json"));
  REQUIRE(!r.empty());
  for (const std::string& line : r) {
    INFO(line);
    CHECK(line.find("/attention/") == 0);
    CHECK(line.find("/position found alibi") != std::string::npos);
  }
}
