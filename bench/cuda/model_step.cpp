// A training step of a zoo model on the CUDA backend (exec/cuda/backend.h):
// forward, backward and the resident optimizer (exec/cuda/optimizer.h:
// parameters, gradients and moments on the device, no arena copy per step),
// timed per step and per op kind, as one JSON object on stdout
// (scripts/gpu-check.sh). --precision bf16 runs the bf16 mode (bf16 GEMM
// operands, fp32 accumulation and masters); --no-optimizer leaves the update out.
//
//   device_bytes_used  the device's used memory after the steps (cudaMemGetInfo)
//   step_s          median wall time of forward + backward + optimizer after one warm-up step
//   optimizer_s     of which the optimizer (gradient norms and the update), median
//   arena_copy_bytes_per_step  parameter / gradient bytes moved between host and device per
//                   timed step (0 when resident: the point of residency)
//   tokens_per_s, model_tflop_per_s = Marin-convention training FLOPs per token × tokens/s
//   mfu_fp32        against the fp32 cuBLASLt rate measured here (8192³, the parity mode's ceiling)
//   mfu_bf16        against the bf16 ceiling measured here (cuBLAS 8192³): the target mode
//   ops[]           seconds per OpKind and phase in one more step after the timed ones (the
//                   driver synchronises the backend after each op there, so that step is kept
//                   out of step_s: the host would wait on every op), largest first: where the time goes
//
//   build/bench/cuda_model_step --model models/zoo/marin-ladder-d768.json --batch 2 --seq 1024 [--steps 3]
//       [--precision fp32|bf16] [--no-optimizer]
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "exec/cuda/backend.h"
#include "exec/cuda/check.h"
#include "exec/cuda/gemm.h"
#include "exec/model.h"
#include "exec/optim.h"
#include "sim/base/check.h"
#include "models/layer_graph.h"
#include "models/model.h"

namespace {

using namespace rackstep;

// Seconds of one C = A·B of n³ (median of 5 after 2 warm-ups), data random-ish (not zeros).
double gemm_seconds(int n, exec::cuda::DType type) {
  const size_t elems = size_t(n) * n, bytes = elems * (type == exec::cuda::DType::kF32 ? 4 : 2);
  void *a = nullptr, *b = nullptr, *c = nullptr;
  RS_CUDA_CHECK(cudaMalloc(&a, bytes));
  RS_CUDA_CHECK(cudaMalloc(&b, bytes));
  RS_CUDA_CHECK(cudaMalloc(&c, bytes));
  std::vector<unsigned char> host(bytes);
  for (size_t i = 0; i < bytes; ++i) host[i] = static_cast<unsigned char>((i * 2654435761u >> 13) & 0x3f);  // small finite values
  RS_CUDA_CHECK(cudaMemcpy(a, host.data(), bytes, cudaMemcpyHostToDevice));
  RS_CUDA_CHECK(cudaMemcpy(b, host.data(), bytes, cudaMemcpyHostToDevice));
  exec::cuda::Gemm gemm(nullptr);
  cudaEvent_t start, stop;
  RS_CUDA_CHECK(cudaEventCreate(&start));
  RS_CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<double> t;
  for (int i = 0; i < 7; ++i) {
    RS_CUDA_CHECK(cudaEventRecord(start));
    gemm.run({.m = n, .n = n, .k = n}, type, c, a, b);
    RS_CUDA_CHECK(cudaEventRecord(stop));
    RS_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    RS_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    if (i >= 2) t.push_back(ms * 1e-3);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaFree(a);
  cudaFree(b);
  cudaFree(c);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

int usage(const char* argv0) {
  std::fprintf(stderr, "usage: %s --model M.json [--batch B] [--seq T] [--steps S] [--precision fp32|bf16] [--no-optimizer]\n",
               argv0);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_path;
  int64_t batch = 1, seq = 0, steps = 3;
  std::string precision = "fp32";
  bool optimizer = true;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--no-optimizer") {
      optimizer = false;
      continue;
    }
    if (i + 1 >= argc) return usage(argv[0]);
    if (a == "--model") model_path = argv[++i];
    else if (a == "--batch") batch = std::atoll(argv[++i]);
    else if (a == "--seq") seq = std::atoll(argv[++i]);
    else if (a == "--steps") steps = std::atoll(argv[++i]);
    else if (a == "--precision") precision = argv[++i];
    else return usage(argv[0]);
  }
  if (model_path.empty() || batch < 1 || steps < 1 || seq < 0) return usage(argv[0]);
  try {
    auto backend = exec::cuda::make_cuda_backend();
    if (!backend) {
      std::printf("{\"skipped\": \"no CUDA device\"}\n");
      return 77;
    }
    const models::ModelConfig cfg = models::load_model(model_path);
    if (seq == 0) seq = cfg.seq_len;
    const models::LayerGraph graph = models::build_layer_graph(cfg);
    if (const std::string why = backend->set_precision(precision); !why.empty()) {
      std::fprintf(stderr, "cuda_model_step: --precision %s: %s\n", precision.c_str(), why.c_str());
      return 2;
    }
    exec::Model m(graph, batch, seq, std::move(backend));
    m.init_params(1);
    const int64_t N = batch * seq;
    const exec::Model& cm = m;
    std::unique_ptr<exec::BackendOptimizer> opt;
    exec::OptimizerState state;
    if (optimizer) {
      const exec::OptimizerConfig oc = exec::default_optimizer_config(100, cfg.d_model, N);
      state = exec::init_optimizer_state(cm.params());  // ||W0|| on the host, once
      opt = m.backend().make_optimizer(oc, cm.params().layout_ptr());
      RS_CHECK(opt != nullptr, "the CUDA backend has a resident optimizer");
      opt->load_state(state);
    }
    std::vector<int32_t> inputs(static_cast<size_t>(N)), targets(static_cast<size_t>(N));
    uint64_t s = 17;
    for (int64_t i = 0; i < N; ++i) {
      s = s * 6364136223846793005ULL + 1442695040888963407ULL;
      inputs[static_cast<size_t>(i)] = static_cast<int32_t>((s >> 33) % static_cast<uint64_t>(cfg.vocab));
      targets[static_cast<size_t>(i)] = static_cast<int32_t>((s >> 17) % static_cast<uint64_t>(cfg.vocab));
    }
    std::vector<double> step_s, opt_s;
    double loss = 0;
    size_t copied_before = 0;
    for (int64_t step = 0; step <= steps; ++step) {  // step 0 warms up (plans, scratch, allocator)
      if (step == 1) copied_before = m.arena_copy_bytes();
      const auto t0 = std::chrono::steady_clock::now();
      m.zero_grads();
      loss = m.forward(inputs.data(), targets.data(), nullptr).loss;
      m.backward();
      m.backend().synchronize();
      const auto t_opt = std::chrono::steady_clock::now();
      if (opt) {
        opt->grad_norms(m.backend_grads());
        opt->step(m.backend_params(), m.backend_grads(), state.step++);
        m.backend().synchronize();
      }
      const auto t1 = std::chrono::steady_clock::now();
      const double dt = std::chrono::duration<double>(t1 - t0).count();
      if (step > 0) {
        step_s.push_back(dt);
        opt_s.push_back(std::chrono::duration<double>(t1 - t_opt).count());
      }
      std::fprintf(stderr, "cuda_model_step: step %lld: %.3f s, loss %.4f\n", static_cast<long long>(step), dt, loss);
    }
    const double copied_per_step = static_cast<double>(m.arena_copy_bytes() - copied_before) / static_cast<double>(steps);
    // Where the time goes: one forward + backward with the per-op timer (a synchronize after every op).
    std::map<std::pair<std::string, int>, double> op_s;  // (kind, phase) -> seconds
    m.set_op_timer([&](size_t op, int phase, auto t0, auto t1) {
      op_s[{models::to_string(graph.ops[op].kind), phase}] += std::chrono::duration<double>(t1 - t0).count();
    });
    m.zero_grads();
    m.forward(inputs.data(), targets.data(), nullptr);
    m.backward();
    m.backend().synchronize();
    m.set_op_timer(nullptr);
    size_t free_bytes = 0, total_bytes = 0;  // after the steps: parameters, gradients, activations, scratch
    RS_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    std::sort(step_s.begin(), step_s.end());
    std::sort(opt_s.begin(), opt_s.end());
    const double median_s = step_s[step_s.size() / 2];
    const double flops_per_token = models::count_flops(graph, seq, models::FlopConvention::kMarin).training;
    const double fp32_s = gemm_seconds(8192, exec::cuda::DType::kF32);
    const double bf16_s = gemm_seconds(8192, exec::cuda::DType::kBF16);
    const double gemm_flops = 2.0 * 8192.0 * 8192.0 * 8192.0;
    const double tokens_per_s = static_cast<double>(N) / median_s;
    nlohmann::json out;
    out["model"] = cfg.name;
    out["params_total"] = models::count_params(graph).total;
    out["batch"] = batch;
    out["seq"] = seq;
    out["steps_timed"] = steps;
    out["loss"] = loss;
    out["device_bytes_used"] = static_cast<double>(total_bytes - free_bytes);
    out["activation_bytes"] = static_cast<double>(m.activation_bytes());
    out["precision"] = precision;
    out["optimizer"] = optimizer ? "resident" : "none";
    out["step_s"] = median_s;
    out["optimizer_s"] = opt_s[opt_s.size() / 2];
    out["arena_copy_bytes_per_step"] = copied_per_step;
    out["tokens_per_s"] = tokens_per_s;
    out["model_tflop_per_s"] = flops_per_token * tokens_per_s * 1e-12;
    out["fp32_gemm_tflop_per_s"] = gemm_flops / fp32_s * 1e-12;
    out["bf16_gemm_tflop_per_s"] = gemm_flops / bf16_s * 1e-12;
    out["mfu_fp32"] = flops_per_token * tokens_per_s / (gemm_flops / fp32_s);
    out["mfu_bf16"] = flops_per_token * tokens_per_s / (gemm_flops / bf16_s);
    std::vector<std::pair<double, nlohmann::json>> ops;
    for (const auto& [key, sec] : op_s)
      ops.emplace_back(sec, nlohmann::json{{"kind", key.first}, {"phase", key.second == 0 ? "fwd" : "bwd"}, {"s", sec}});
    std::sort(ops.begin(), ops.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    out["ops"] = nlohmann::json::array();
    for (auto& [sec, j] : ops) out["ops"].push_back(j);
    std::printf("%s\n", out.dump(1).c_str());
    return 0;
  } catch (const UserError& e) {
    std::fprintf(stderr, "cuda_model_step: %s\n", e.what());
    return 2;
  }
}
