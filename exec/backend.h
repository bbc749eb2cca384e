// The op set a backend implements: one op of the layer graph at a time, its
// forward or its backward, on tensors the model driver (exec/model.h) binds.
//
// In the ggml manner: the driver owns the architecture's data flow (which
// tensor each op reads and writes, the arena layout, the loss bookkeeping,
// routing decisions, optimizer, checkpoints, profiler) and knows no backend;
// a backend owns memory and compute (exec/cpu/backend.h with the kernels of
// exec/kernels.h; exec/cuda/ next) and knows no architecture. A new backend
// implements this interface and nothing in the driver changes.
//
// GRADIENT RULE (exec/kernels.h, kept by every backend):
//   * parameter gradients  +=  (dw[j] accumulates; the driver zeroes it per step)
//   * activation gradients  =  into in[j].grad, or += when in[j].accumulate
//                              (another reader of that tensor already wrote it)
//   * out[j].grad is the op's incoming gradient; a backend may overwrite it
//     (the router adds its z-loss gradient there).
//
// Memory: every pointer in an OpCall is in the backend's memory (host memory
// for the CPU, device memory for CUDA). The driver allocates every buffer with
// allocate(), moves batches in and results out with copy_to_backend() /
// copy_to_host(), and the routing state (expert ids, offsets, drops, QB
// histogram and bias) across where it decides on the host. For a backend
// whose memory is not the host's (uses_host_memory() false) the parameter and
// gradient arenas live in its memory and the host arenas are copies the driver
// keeps coherent lazily (exec/model.h): parameters go in only after the host
// changed them, gradients come out only when the host reads them.
//
// Residency: a backend that can run the optimizer in its own memory returns
// one from make_optimizer() (exec/cuda: Adam, AdamH, Muon, MuonH on the GPU);
// the trainer then steps the resident arenas and the host sees parameters and
// optimizer state only for checkpoints, dumps and logs. nullptr (the default)
// = the optimizer runs on the host arenas (the CPU backend: they are its own).
//
// Bindings per OpKind (in[], out[], saved[] widths are per token; N = B*T rows):
//   kEmbedding     tokens -> out0 (d);                        w0 table (V, d) [, w1 positions (P, d), read at pos]
//   kRmsNorm       in0 -> out0; saved0 rstd (1);              w0 gain; LayerNorm when model.norm.kind says so
//   kGatedNorm     in0 -> out0; saved0 a (r), saved1 g (d);   w0 down (d, r), w1 up (r, d)
//   kLinear        in0 -> out0;                               w0 (in, out) [, w1 bias (out)]
//   kSConv         in0 -> out0; doc;                          w0 (C, K)
//   kQkNorm        in0 q, in1 k -> out0, out1; saved0/1 rstd per head (heads)
//   kRope          in0 q, in1 k -> out0, out1; pos, rot_dims
//   kAttention     in0 q (H*qk), in1 k (kv*qk), in2 v (kv*qk) -> out0 (H*qk); saved0 lse (H); doc;
//                  [w0 sinks (H)] when op.sinks; ALiBi when op.alibi (slopes: models::alibi_slopes(H))
//   kXsa           in0 o, in1 v -> out0
//   kAttnGate      in0 o, in1 x -> out0; saved0 g (H);        w0 (d, H)
//   kRouter        in0 x -> out0 logits (E);                  w0 (d, E); routing hist (training)
//   kTopK          in0 logits -> out0 weights (k);            routing expert, threshold, bias; aux_loss()
//   kDispatch      in0 x (L), in1 weights -> out0 rows (k*L, grouped by expert); routing sorted_pos, offsets
//   kExpertMlp     in0 rows -> out0 rows; saved0..2 a1, a3, h (k*F); w0..2 (E,L,F), (E,L,F), (E,F,L); routing offsets, keep;
//                  [w3..5 = b1 (E,F), b3 (E,F), b2 (E,L)] when op.expert_bias; model.moe's SwiGLU variant (expert_activation)
//   kCombine       in0 rows, in1 weights -> out0 (L);         routing sorted_pos
//   kSharedMlp     in0 x [, in1 added] -> out0; saved0..2 a1, a3, h (F); op.activation:
//                  SwiGLU w0..2 = W1, W3, W2 [, w3..5 = b1, b3, b2];
//                  GeLU / ReLU² w0, w1 = W1, W2 [, w2, w3 = b1, b2], saved1 of width 0 (no a3)
//   kResidualAdd   in0, in1 -> out0
//   kLmHead        in0 -> out0 logits (V);                    w0 (d, V), or the table (V, d) when tied
//   kCrossEntropy  in0 logits; saved0 lse (1); targets, loss_tokens -> OpResult ce, z_loss
// What the driver does itself, with the layout helpers below: a linear with two
// outputs runs into one joined buffer whose columns it splits; MLA's key is
// assembled from its two parts before its first reader; attention whose v head
// is narrower than q/k runs on a zero-padded v and the output is sliced.
//
// Usage (what the driver does per op; exec/model.cpp):
//   std::unique_ptr<Backend> be = make_backend("cpu");
//   auto acts = be->allocate(bytes);                 // activation arena, zero-filled
//   OpCall c = ...;                                  // op, model, B, T, in/out/saved, w/dw
//   OpResult r = be->forward(c);                     // r.ce for the loss op, ...
//   be->backward(c);                                 // in[j].grad = or +=, dw[j] +=
//   be->synchronize();                               // before a host read
//   auto t = be->make_op_timing();                   // the profiler's clock (OpTiming)
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "exec/arena.h"
#include "exec/kernels.h"
#include "exec/optim.h"
#include "models/layer_graph.h"
#include "sim/base/dispatch.h"

namespace rackstep::exec {

// Op-set conventions every backend shares (the PyTorch reference too).
constexpr float kXsaEps = 1e-6f;
// Router-logit range of the quantile-balancing histogram; logits outside land
// in the edge bins (exec/kernels.h, qb_histogram).
constexpr float kQbLo = -8.0f, kQbHi = 8.0f;

// Bytes in a backend's memory, zero-filled, freed with the object.
class Buffer {
 public:
  virtual ~Buffer() = default;
  virtual void* data() = 0;
  virtual size_t bytes() const = 0;
  template <typename T>
  T* as() {
    return static_cast<T*>(data());
  }
};

// One activation bound to an op.
struct Bound {
  float* value = nullptr;   // (N, width)
  float* grad = nullptr;    // (N, width)
  int64_t width = 0;        // floats per token
  bool accumulate = false;  // backward of an input: "+=" into grad (else "=")
};

// Routing state of one MoE layer, in backend memory (the driver's routing
// decisions read and write it through copy_to_host / copy_to_backend).
struct Routing {
  int E = 0, k = 0, L = 0, F = 0;
  int32_t* expert = nullptr;      // (N, k) chosen experts, best first
  float* threshold = nullptr;     // (N) (k+1)-th biased score
  int32_t* sorted_pos = nullptr;  // (N*k) grouped row of assignment a = t*k + j
  int32_t* offsets = nullptr;     // (E + 1) expert e's rows: offsets[e] .. offsets[e+1]
  const int32_t* host_offsets = nullptr;  // the same on the host, after kDispatch (per-expert GEMM sizes)
  uint8_t* keep = nullptr;        // (N*k) grouped order; nullptr = keep all
  const float* bias = nullptr;    // (E) selection bias (QB state or a learnable tensor)
  int64_t* hist = nullptr;        // (E, bins) this step's router-logit histogram, or nullptr
  // Data parallelism: this slice's share of the global batch's router losses.
  // counts (E): the global batch's assignments per expert over count_tokens
  // tokens (aux loss; nullptr = this slice's own); loss_share: this slice's
  // tokens / the global batch's (the router z-loss weight's factor).
  const int64_t* counts = nullptr;
  int64_t count_tokens = 0;
  double loss_share = 1.0;
};

// One op of the layer graph with its tensors bound. Arrays are indexed as the
// op's declared inputs / outputs (table above); unused entries are empty.
struct OpCall {
  const models::Op* op = nullptr;
  const models::ModelConfig* model = nullptr;
  int64_t B = 0, T = 0, N = 0;  // sequences, tokens per sequence, rows = B*T
  Bound in[3], out[2], saved[3];
  static constexpr int kMaxParams = 6;         // a dense MLP with biases: W1, W3, W2, b1, b3, b2
  float* w[kMaxParams] = {};                   // parameters in op.params order
  float* dw[kMaxParams] = {};                  // their gradients, +=
  bool tied = false;                           // kLmHead: w0 is the embedding table (V, d)
  int rot_dims = 0;                            // kRope: rotated dims per head (even)
  const int32_t* tokens = nullptr;   // (N) kEmbedding
  const int32_t* targets = nullptr;  // (N) kCrossEntropy, < 0 ignored
  const int32_t* doc = nullptr;      // (N) document ids, or nullptr (one document per sequence)
  const int32_t* pos = nullptr;      // (N) RoPE positions
  int64_t loss_tokens = 0;           // kCrossEntropy: the mean's denominator (global batch)
  Routing* routing = nullptr;        // the MoE ops' layer state
  bool training = true;              // kRouter: add this step's logits to routing->hist
};

// A kRope op's YaRN parameters for the kernels (exec/kernels.h RopeYarn);
// std::nullopt for plain RoPE.
inline std::optional<RopeYarn> rope_yarn_of(const OpCall& c) {
  if (!c.op->rope_yarn) return std::nullopt;
  const models::YarnConfig& y = c.model->attention.yarn;
  return RopeYarn{.factor = y.factor,
                  .original_positions = static_cast<double>(y.original_max_position_embeddings),
                  .beta_fast = y.beta_fast,
                  .beta_slow = y.beta_slow,
                  .truncate = y.truncate};
}

// The optimizer of exec/optim.h in a backend's memory, over arenas of one
// layout (the parameters' and gradients', exec/arena.h) that the backend holds.
// Same update, same schedule, same state as exec::Optimizer: the host
// OptimizerState is its checkpoint form (load_state after init or a resume,
// save_state before a checkpoint).
//
//   auto opt = backend.make_optimizer(config, params.layout_ptr());   // nullptr: host optimizer
//   opt->load_state(state);                                           // moments, ||W0||, step
//   GroupNorms n = opt->grad_norms(model.backend_grads());
//   opt->step(model.backend_params(), model.backend_grads(), state.step++);
class BackendOptimizer {
 public:
  virtual ~BackendOptimizer() = default;
  virtual void load_state(const OptimizerState& host) = 0;  // the step count stays the caller's
  virtual void save_state(OptimizerState& host) = 0;        // moments and ||W0|| into host's arenas
  // Frobenius norm per optimizer group of a gradient arena in backend memory.
  virtual GroupNorms grad_norms(const float* grads) = 0;
  // Update number `step` (0-based, the schedule's) of every tensor, in place.
  virtual void step(float* params, const float* grads, int64_t step) = 0;
};

// Data parallelism over arenas in a backend's memory (ZeRO stage 1/2, the
// shards of exec/dist.h's ShardPlan): the gradients reduce-scattered into the
// owner's shard, the owner's optimizer step (BackendOptimizer over the shard's
// layout, on its range of the parameter arena), the parameters all-gathered.
// Rank r's range is [offsets[r], offsets[r] + counts[r]) of the arena, in
// floats; ranges tile it in rank order. The calls are queued in the backend's
// stream order (exec/cuda: NCCL on its own stream, fenced by events). The
// reduce-scatter goes by ranges of the arena (exec/dist.h range_parts), each
// begun once the work queued so far has written its gradients, so that the
// rest of the backward overlaps it (Model::backward reports which ranges are
// final); one range [0, total) is the whole reduce-scatter.
//
//   auto dp = backend.make_collectives(world, plan.float_offsets(), plan.float_counts(), why);
//   dp->start_reduce_scatter(shard_grads, model.backend_grads(), 0, total_floats);
//   dp->wait_reduce_scatter();
//   opt->step(model.backend_params() + my.offset, shard_grads, step);
//   dp->all_gather(model.backend_params());
// The profiler's brackets around each collective a backend queues on a queue
// of its own (exec/profiler.h: the trace's "collectives" lane): begin before
// the collective's work is queued on `queue`, end after.
class CollectiveBrackets {
 public:
  virtual ~CollectiveBrackets() = default;
  virtual void begin_collective(const char* name, void* queue) = 0;
  virtual void end_collective(void* queue) = 0;
};

class BackendCollectives {
 public:
  virtual ~BackendCollectives() = default;
  // Brackets around each collective queued from here on (nullptr: none). The
  // default has no queue of its own to time.
  virtual void set_brackets(CollectiveBrackets* /*brackets*/) {}
  // This rank's part of Σ_ranks grads[begin, end) (range_parts) into its place
  // in shard (counts[rank]), after the work queued so far.
  virtual void start_reduce_scatter(float* shard, const float* grads, int64_t begin, int64_t end) = 0;
  // The work queued after this sees every begun range reduced into the shard.
  virtual void wait_reduce_scatter() = 0;
  // params[offsets[r], +counts[r]) = rank r's own range, for every rank r (in place).
  virtual void all_gather(float* params) = 0;
};

// How the profiler (exec/profiler.h) times the work a backend queues: one
// interval per op and phase (and the optimizer), bracketing the calls that
// queue its work, resolved once per profiled step.
//   default (Backend::make_op_timing): the host's steady_clock, read at begin()
//     and, after Backend::synchronize(), at end() (the CPU backend's times as
//     before the hook; on a device that serialises the queue per op);
//   exec/cuda: a pair of CUDA events per interval recorded on the backend's
//     stream, no synchronisation until end_step(), which waits for the step's
//     last event and reads every interval with cudaEventElapsedTime from the
//     step's first event (events pooled across steps).
//
//   auto t = backend.make_op_timing();
//   t->begin_step();  t->begin(); ...queue op...; t->end();  ...;  StepTiming s = t->end_step();
struct StepTiming {
  struct Interval {
    double start_s = 0;     // from begin_step()'s mark
    double duration_s = 0;
  };
  std::vector<Interval> intervals;  // in begin() order (an interval may enclose others: end() closes the innermost)
  double span_s = 0;                // begin_step()'s mark to the end of the step's last queued work
};
class OpTiming {
 public:
  virtual ~OpTiming() = default;
  // "host" (steady_clock around a synchronize) or "cuda_events": op_measurements.json's "op_clock".
  virtual std::string clock() const = 0;
  virtual void begin_step() = 0;
  virtual void begin() = 0;
  virtual void end() = 0;
  // An interval of work on another of the backend's queues (exec/cuda: the
  // collectives' cudaStream_t), in the same begin order and nesting as
  // begin() / end(). A clock of one queue times it as its own.
  virtual void begin_on(void* /*queue*/) { begin(); }
  virtual void end_on(void* /*queue*/) { end(); }
  virtual StepTiming end_step() = 0;
};

// The device memory a backend used, for the profile (nullopt: host memory, the
// process's resident peak says it).
struct DeviceMemory {
  std::string device;            // the device's name ("NVIDIA H200": cudaGetDeviceProperties)
  double peak_bytes = 0;         // high-water mark of the bytes the backend had allocated
  double used_at_peak_bytes = -1;  // the device's used bytes (cudaMemGetInfo: context, pools, every process) when
                                   // that mark was set; < 0 unknown
  double total_bytes = 0;        // the device's memory
};

class Comm;           // exec/dist.h: the ranks (MPI, or one process)
class ExpertBackend;  // exec/model.h: routed experts computed across an EP group

// How a backend's expert-parallel transport runs (Backend::make_experts).
struct ExpertTransportOptions {
  bool verify = false;  // check every layer against sim::dispatch (exec/dist.h verify_against_dispatch)
  // A pooled wave's exchange travels while the previous wave's experts compute
  // (exec/cuda/experts.h); off: one after the other, the same arithmetic.
  bool overlap = true;
};

// Scalars an op's forward returns to the driver's loss bookkeeping.
struct OpResult {
  double ce = 0, z_loss = 0;  // kCrossEntropy
  double router_z = 0;        // kRouter: mean lse² of the logits (logged; applied when the model says so)
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;  // "cpu", "cuda"

  // --- memory ---------------------------------------------------------------
  virtual std::unique_ptr<Buffer> allocate(size_t bytes) = 0;
  virtual void copy_to_backend(void* dst, const void* host_src, size_t bytes) = 0;
  virtual void copy_to_host(void* host_dst, const void* src, size_t bytes) = 0;
  // The parameter / gradient arenas (exec/arena.h) as the backend reads them:
  // the host's floats themselves, or a mirror in backend memory.
  virtual bool uses_host_memory() const = 0;
  // The batch's document ids on the host too, after Model::load_batch copied them to `device_doc`
  // (the OpCall::doc of the batch's ops); nullptr, nullptr: one document per sequence. A backend
  // that needs a host view of the documents (exec/cuda: cuDNN's ragged segments) builds it here,
  // once per batch; the default needs none.
  virtual void set_documents(const int32_t* /*device_doc*/, const int32_t* /*host_doc*/, int64_t /*B*/,
                             int64_t /*T*/) {}
  // Wait for queued work (a profiler timestamp, a host read).
  virtual void synchronize() = 0;
  // The profiler's clock for this backend's work (OpTiming above); the default
  // reads the host's clock around synchronize(). The backend outlives it.
  virtual std::unique_ptr<OpTiming> make_op_timing();
  // Device memory in use so far (DeviceMemory above), nullopt for host memory.
  virtual std::optional<DeviceMemory> device_memory() const { return std::nullopt; }
  // Arithmetic of the heavy ops: "fp32" (every backend; the parity mode) or
  // "bf16" (GEMM operands rounded to bf16, fp32 accumulation and outputs, fp32
  // master weights, gradients and optimizer: exec/cuda). "" when this backend
  // now computes so, else the precisions it has, in words ("fp32, the cpu backend's only precision").
  virtual std::string set_precision(const std::string& precision) {
    return precision == "fp32" ? "" : "fp32, the " + name() + " backend's only precision";
  }
  // The optimizer in this backend's memory over arenas of `layout`, or nullptr
  // (the host runs exec::Optimizer on the host arenas). The backend outlives it.
  virtual std::unique_ptr<BackendOptimizer> make_optimizer(const OptimizerConfig& /*config*/,
                                                           std::shared_ptr<const ArenaLayout> /*layout*/) {
    return nullptr;
  }
  // Data-parallel collectives over `ranks` in this backend's memory, or nullptr
  // with `why` set (the trainer then reduces host copies over MPI, exec/dist.h).
  // Every rank of `ranks` calls it (a collective: exec/cuda shares the NCCL id).
  virtual std::unique_ptr<BackendCollectives> make_collectives(const Comm& /*ranks*/,
                                                               const std::vector<int64_t>& /*offsets*/,
                                                               const std::vector<int64_t>& /*counts*/,
                                                               std::string& why) {
    why = "collectives in the " + name() + " backend's memory (it has none: its ranks reduce host copies over MPI)";
    return nullptr;
  }
  // Expert parallelism over the EP group `group` in this backend's memory
  // (exec/cuda: NCCL), pooled or ragged as `config` says, or nullptr with
  // `why` set. A backend that uses host memory needs none (the trainer runs
  // exec/dist.h's MpiExperts on it). Every rank of `group` calls it. The
  // backend outlives it.
  virtual std::unique_ptr<ExpertBackend> make_experts(Comm group, const sim::DispatchConfig& config,
                                                      const ExpertTransportOptions& options, std::string& why);

  // --- the op set -----------------------------------------------------------
  virtual OpResult forward(const OpCall& c) = 0;
  virtual void backward(const OpCall& c) = 0;
  // kTopK under aux-loss balancing, after its forward: the weighted auxiliary
  // loss of the selection (the driver first reduces the counts under data
  // parallelism); its gradient is part of kTopK's backward.
  virtual double aux_loss(const OpCall& c) = 0;

  // --- layout helpers the driver's data flow uses ----------------------------
  // y (rows, wy) from x (rows, wx): the first min(wx, wy) columns, zeros after,
  // or added into y with accumulate.
  virtual void copy_columns(float* y, int64_t wy, const float* x, int64_t wx, int64_t rows, bool accumulate) = 0;
  // MLA key: k (N, H, hd + r) = [k_nope (N, H, hd) | k_rope (N, r) for every head].
  virtual void assemble_key(float* k, const float* k_nope, const float* k_rope, int64_t N, int64_t H, int64_t hd,
                            int64_t r) = 0;
  // Its backward: dk_nope = dk[..., :hd] (= or +=), dk_rope = Σ_h dk[..., hd:] (= or +=).
  virtual void split_key_grad(float* dk_nope, bool acc_nope, float* dk_rope, bool acc_rope, const float* dk,
                              int64_t N, int64_t H, int64_t hd, int64_t r) = 0;
  virtual void fill_zero(float* x, int64_t n) = 0;
  virtual bool all_finite(const float* x, int64_t n) = 0;
  // Quantile balancing: bias (E) = next step's selection bias from the
  // histogram (E, bins) (exec/kernels.h qb_bias_from_histogram); hist zeroed.
  virtual void update_balancing_bias(float* bias, int64_t* hist, int E, int k, int bins, float lo, float hi) = 0;
};

// The routed experts' SwiGLU variant of a model (models::MoeConfig swiglu_*),
// as every backend's expert kernels take it (exec/kernels.h).
SwiGluVariant expert_activation(const models::MoeConfig& moe);
// A kExpertMlp call's variant: its model's SwiGLU and, when op.expert_bias, the
// biases w3..5 = b1, b3, b2 with their gradients dw3..5.
ExpertOptions expert_options(const OpCall& c);

// A kSharedMlp call's activation, weights and gradients (+=), from its
// parameters in op.params order (the table above; absent ones nullptr).
MlpActivation mlp_activation(const models::Op& op);
MlpWeights mlp_weights(const OpCall& c);
MlpGrads mlp_grads(const OpCall& c);

// Per-token widths of the buffers an op's forward keeps for its backward
// (OpCall::saved, the table above), given its bound inputs' widths.
std::vector<int64_t> saved_widths(const models::Op& op, const models::ModelConfig& m,
                                  const std::vector<int64_t>& in_widths);

// The registry. "cpu" is always there; a binary that links another backend
// registers it before use (exec/cuda: "cuda", whose factory returns nullptr
// where no device is present). make_backend throws UserError naming the
// available ones for a name that is not registered or not available here.
using BackendFactory = std::function<std::unique_ptr<Backend>()>;
void register_backend(const std::string& name, BackendFactory make);
std::unique_ptr<Backend> make_backend(const std::string& name);
// Names whose factory gives a backend on this machine, "cpu" first.
std::vector<std::string> available_backends();
// Opens the plugin of backend `name` (lib<plugin_stem>.so next to the running
// binary, e.g. librackstep_cuda.so) and lets it register itself; "" on success,
// else why not (no such file, dlopen's or dlsym's message). Idempotent.
std::string load_backend_plugin(const std::string& name);

}  // namespace rackstep::exec
