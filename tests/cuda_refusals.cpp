// What the CUDA backend refuses (exec/cuda/backend.h, unsupported()), checked
// without a device: the refusal is a pure function of the layer graph, so CI
// proves here that the models the GPU is meant to run are not refused, and
// that what it cannot run yet is refused with the model file's setting.
#include <catch2/catch.hpp>
#include <cuda_runtime.h>

#include <set>
#include <string>

#include "exec/cuda/backend.h"
#include "exec/cuda/cudnn_attention.h"
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

TEST_CASE("cuda backend: ALiBi attention (local and global layers, with sinks) is not refused", "[cuda][refusal]") {
  // The CUDA attention kernels subtract slope_h (i - j) from every score, forward
  // and backward, with the CPU backend's slopes (exec/cuda/attention.cu).
  const models::ModelConfig m = zoo("models/zoo/tiny-alibi-sink-moe.json");
  REQUIRE(m.attention.local.position == models::PositionKind::kAlibi);
  REQUIRE(m.attention.global.position == models::PositionKind::kAlibi);
  CHECK(refused(m).empty());
}

TEST_CASE("cuda backend: an op with a parameter its case does not bind is refused, one line", "[cuda][refusal]") {
  // What is left of the refusal: a layer graph that grew a parameter before the
  // CUDA backend learnt to bind it is an error naming that parameter, never run without it.
  const models::ModelConfig m = zoo("models/zoo/tiny-moe.json");
  for (models::Op op : models::build_layer_graph(m).ops) {
    if (op.kind != OpKind::kAttention) continue;
    op.params.push_back(models::ParamTensor{"layers.0.attn.extra", {4}});
    const exec::cuda::Unsupported u = exec::cuda::unsupported(op, m);
    CHECK(u.json_path == "/");
    CHECK(u.found == "parameter 'layers.0.attn.extra'");
    return;
  }
  FAIL("tiny-moe has no attention op");
}

TEST_CASE("cuda backend: cuDNN that does not start leaves the attention to the own kernel, no abort",
          "[cuda][refusal]") {
  // Without a device cudnnCreate fails as it does on a device whose cuDNN libraries do not load:
  // make_cudnn_attention says so on stderr and returns nullptr (the backend's own kernel then).
  int devices = 0;
  if (cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0) return;  // test_cuda's cuDNN cases run there
  CHECK(rackstep::exec::cuda::make_cudnn_attention(nullptr) == nullptr);
}
