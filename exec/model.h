// The model driver: runs a layer graph's ops forward and backward on a backend.
//
// Built from the one layer graph (models/layer_graph.h), it knows the data
// flow and no backend: the parameter arena holds every learnable tensor of
// graph.ops[*].params (exec/arena.h), the activation arena one (N, width)
// buffer per op output ("slot"), N = batch*seq tokens, sized when the model is
// built, in the backend's memory. forward() walks graph.ops in order and hands
// each op with its bound tensors to the backend (exec/backend.h: the op set,
// one forward and one backward per OpKind; exec/cpu/backend.cpp runs them on
// the CPU kernels); backward() walks them back. What reads what is the layer
// graph's: every op declares the tensors it reads and writes
// (models::Op::inputs / outputs, e.g. the attention core reads
// layers.3.attn.q_rot, k_rot and v); plan() gives each written tensor a slot
// and each op the slots its inputs name. The driver keeps the loss
// bookkeeping, the routing state and its host decisions (drops through
// sim/dispatch.h, expert parallelism through an ExpertBackend, quantile
// balancing), the profiler's per-op callback and the non-finite culprit search.
//
// GRADIENT RULE (as in exec/kernels.h): parameter gradients += (call
// zero_grads() before a step), activation gradients =, the residual stream +=.
// An activation read by several ops (the branch input feeds Q, K, V, the gate,
// the router, latent-down and the shared experts) gets "=" from the first
// reader in backward order and "+=" from the others.
//
// Conventions the PyTorch reference must share (also in the reference dump's
// meta): RoPE position = token index inside its sequence; attention scale
// 1/sqrt(qk head dim); QK-norm eps = norm eps; XSA eps kXsaEps; K and V are
// projected at the stored KV width on every layer (global layers read the first
// kv_used heads, the unused heads' gradients are zero); QB bias from the
// previous step's histogram of router logits over [kQbLo, kQbHi].
//
// Norms: with norm.kind "layernorm" every parametric norm op (kRmsNorm) runs as
// LayerNorm with a gain; QK-norm stays RMS. Router losses (aux balancing,
// an applied router z-loss) are summed over the MoE layers, each a mean over
// this process's tokens; a tied LM head reads embedding.w transposed.
//
// MLA: the key arrives in two parts (k_nope per head, the RoPE key shared by
// the heads), assembled by the first op that reads it; RoPE rotates the leading
// rope_fraction of each (hd + rope_dim) q/k head, as the layer graph prices it;
// attention runs at the q/k head dim with v zero-padded.
//
// A backend whose memory is not the host's (exec/backend.h) holds the
// parameter and gradient arenas; the host arenas are copies kept coherent
// lazily. params() / grads() on a non-const Model return the host copy
// current and mark it as the one the caller may change (the next forward or
// backward copies it in); through a const Model they only read. A forward
// copies the parameters in only when the host changed them (init, a
// checkpoint load, a host optimizer step); a backward leaves the gradients in
// the backend. An optimizer in the backend's memory (Backend::make_optimizer)
// works on backend_params() / backend_grads() and no copy happens per step.
//
// Data parallelism splits the global batch's means into per-rank shares that
// add up, losses and gradients alike: cross-entropy over the global target
// count (set_loss_tokens), the router z-loss over the global token count and
// the aux loss with the global batch's assignment fractions, all-reduced per
// MoE layer in the forward (set_router_loss_share).
//
//   LayerGraph g = build_layer_graph(load_model("models/zoo/tiny-moe.json"));
//   Model m(g, /*batch=*/8, /*seq=*/256);   // + make_backend("cuda") for another backend
//   m.init_params(/*seed=*/1);
//   m.zero_grads();
//   LossResult l = m.forward(batch.inputs.data(), batch.targets.data(), batch.doc_ids.data());
//   m.backward();                          // m.grads() now holds d loss / d params
//   m.update_balancing();                  // QB bias for the next step
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "exec/arena.h"
#include "exec/backend.h"
#include "models/layer_graph.h"
#include "sim/base/dispatch.h"

namespace rackstep::exec {

// Which routed assignments the experts compute. Single process, EP = 1: no
// drops (enabled = false). With `enabled`, the batch's tokens are split into
// `ep` contiguous virtual GPUs of N/ep tokens and the shared dispatch library
// (sim/base/dispatch.h) decides every assignment's fate with `config` (pooled waves
// with sender/receiver cf, ragged, or per-expert capacity); the experts then
// skip exactly the assignments it drops.
struct DispatchOptions {
  bool enabled = false;
  int64_t ep = 1;
  sim::DispatchConfig config;
};

// Routed experts computed elsewhere: expert parallelism (exec/dist.h,
// MpiExperts, in host memory; exec/cuda/experts.h, NCCL in device memory).
// The model hands over one MoE layer's rows grouped by expert (its dispatch
// output) and gets back each row's expert output; the expert backend decides
// which assignments are dropped (keep = 0, output row 0). expert, sorted_pos
// and keep are host memory; rows, weights and gradients are in the model
// backend's memory, which must be the expert backend's (uses_host_memory).
struct ExpertLayer {
  int moe = 0;                  // MoE layer index (0 = the first MoE layer)
  int tokens = 0, E = 0, k = 0, L = 0, F = 0;
  const int32_t* expert = nullptr;      // (tokens, k) chosen experts
  const int32_t* sorted_pos = nullptr;  // (tokens * k) grouped row of each assignment
  const float* w1 = nullptr;            // (E, L, F) every expert; a backend uses its own
  const float* w3 = nullptr;            // (E, L, F)
  const float* w2 = nullptr;            // (E, F, L)
  float* dw1 = nullptr;                 // (E, L, F) +=
  float* dw3 = nullptr;                 // (E, L, F) +=
  float* dw2 = nullptr;                 // (E, F, L) +=
  // The experts' variant (models::MoeConfig): biases (nullptr = none) and SwiGLU.
  const float* b1 = nullptr;            // (E, F)
  const float* b3 = nullptr;            // (E, F)
  const float* b2 = nullptr;            // (E, L)
  float* db1 = nullptr;                 // (E, F) +=
  float* db3 = nullptr;                 // (E, F) +=
  float* db2 = nullptr;                 // (E, L) +=
  SwiGluVariant act;
};
class ExpertBackend {
 public:
  virtual ~ExpertBackend() = default;
  // xs, ys: (tokens * k, L) grouped rows; keep: (tokens * k) grouped order.
  // drops: this process's assignments (assignments, sender, receiver).
  virtual void forward(const ExpertLayer& l, const float* xs, float* ys, uint8_t* keep, sim::DropCounts& drops) = 0;
  // dys -> dxs (grouped rows, "="), expert weight gradients "+=".
  virtual void backward(const ExpertLayer& l, const float* dys, float* dxs) = 0;
  // Where its rows live: the host's memory (MpiExperts) or a device's (exec/backend.h, Backend::make_experts).
  virtual bool uses_host_memory() const { return true; }
  // Layers checked against sim::dispatch so far (--verify-dispatch).
  virtual int64_t verified_layers() const { return 0; }
};

struct LossResult {
  double loss = 0;    // ce + z_loss (the optimised value)
  double ce = 0;      // mean cross-entropy, nats per token
  double z_loss = 0;  // weighted logit z-loss
  double router_z_loss = 0;  // mean over MoE layers (logged; in `loss` when the model applies it)
  double router_loss = 0;    // applied router losses: aux balancing + weighted router z-loss, summed over layers
  sim::DropCounts drops;     // summed over MoE layers
};

// Per-op callbacks for the profiler: phase 0 = forward, 1 = backward.
using OpTimer = std::function<void(size_t op, int phase, std::chrono::steady_clock::time_point start,
                                   std::chrono::steady_clock::time_point end)>;
// The profiler's brackets around each op (exec/profiler.h): begin before the
// op's work is queued, end after; phase 0 = forward, 1 = backward. The
// profiler times them with the backend's clock (Backend::make_op_timing).
class OpBrackets {
 public:
  virtual ~OpBrackets() = default;
  virtual void begin_op(size_t op, int phase) = 0;
  virtual void end_op(size_t op, int phase) = 0;
};

class Model {
 public:
  // backend: where the ops run (nullptr = the CPU backend). Throws UserError
  // when the graph uses a feature the driver cannot run.
  Model(const models::LayerGraph& graph, int64_t batch, int64_t seq, std::unique_ptr<Backend> backend = nullptr);

  const models::LayerGraph& graph() const { return graph_; }
  Backend& backend() { return *backend_; }
  int64_t batch() const { return B_; }
  int64_t seq() const { return T_; }
  int64_t tokens() const { return N_; }

  // The host arenas, current on return (one copy out of the backend at most).
  // Non-const: the caller may write them, so the backend's copy is refreshed
  // before its next use.
  Arena& params();
  const Arena& params() const;
  Arena& grads();
  const Arena& grads() const;
  // The arenas in the backend's memory (the host's for a host-memory backend),
  // current on return, for an optimizer that runs there: after writing
  // through backend_params() the host copy is stale until params() reads it.
  float* backend_params();    // (params().total_floats())
  const float* backend_grads();  // (grads().total_floats())
  // Bytes copied between host and backend arenas so far (parameters in,
  // gradients and parameters out): what residency saves, for tests and reports.
  size_t arena_copy_bytes() const { return arena_copy_bytes_; }
  size_t activation_bytes() const { return 2 * act_floats_ * sizeof(float); }  // values + gradients

  // Normal(0, init_std_scale / sqrt(d)) for every matrix (embedding and LM
  // head included), identity SConv kernels, gains 1, biases 0 (the routed
  // experts' (E, width) ones too), zero QB bias. A pure
  // function of the seed (own Box–Muller over splitmix64: no libstdc++
  // distribution in the way of bitwise reproducibility).
  void init_params(uint64_t seed);
  void zero_grads();

  void set_dispatch(const DispatchOptions& d);
  // Expert parallelism: routed experts run through `experts` (not owned;
  // nullptr = here). Replaces the simulated dispatch. Needs a backend in host memory.
  void set_expert_backend(ExpertBackend* experts);
  // Data parallelism: the loss is a mean over `n` targets of the global batch
  // (this process holds a slice), so ranks' losses and gradients add up.
  // 0 = this batch's own target count.
  void set_loss_tokens(int64_t n) { loss_tokens_ = n; }
  // Data parallelism with router losses: this process's tokens are a slice of
  // a global batch of `global_tokens`; `reduce_counts` sums an array of
  // per-expert assignment counts over the ranks in place (an all-reduce, which
  // every rank's forward then calls once per MoE layer under aux-loss balancing).
  using CountReducer = std::function<void(int64_t* counts, int n)>;
  void set_router_loss_share(int64_t global_tokens, CountReducer reduce_counts);
  // This step's router-logit histogram of every MoE layer, (E, bins) each, on
  // the host, for data-parallel ranks to sum before update_balancing().
  std::vector<std::pair<int64_t*, size_t>> balancing_histograms();
  // Quantile balancing: `training` forwards add their router logits to the
  // layer's histogram; update_balancing() turns it into next step's bias.
  void set_training(bool training) { training_ = training; }
  void update_balancing();
  // The QB selection bias of every MoE layer, (moe layers, E), for checkpoints.
  std::vector<float> balancing_state() const;
  void set_balancing_state(const std::vector<float>& bias);  // UserError on a size mismatch

  // inputs, targets, doc_ids: (batch, seq) on the host; doc_ids may be nullptr (one document).
  LossResult forward(const int32_t* inputs, const int32_t* targets, const int32_t* doc_ids);
  // grads_final (optional): called in the backward whenever more of the
  // gradient arena is final, with the float offset from which it all is: the
  // arena is in op order, so the backward completes it from the top, tensor
  // by tensor as the last op writing each is done (a tensor written by
  // several ops, as the embedding table a tied LM head reads, is final after
  // the first of them in op order); 0 last. Data parallel reduce-scatters the
  // final ranges while the backward goes on. With a backend that queues its
  // work (exec/cuda), "done" means queued.
  using GradsFinal = std::function<void(int64_t final_from_floats)>;
  void backward(const GradsFinal& grads_final = nullptr);

  // With check_finite, forward/backward stop at the first op whose output
  // (forward) or input gradient / parameter gradient (backward) holds a NaN or
  // Inf and return its name; "" when everything is finite. Used to name the
  // culprit after a step's loss or gradient norm came out non-finite.
  // find_nonfinite_backward needs the forward state of that step and zeroes
  // the gradients itself.
  std::string find_nonfinite_forward(const int32_t* inputs, const int32_t* targets, const int32_t* doc_ids);
  std::string find_nonfinite_backward();

  // Per op and phase, host clock after the backend synchronised (replaces any
  // brackets; nullptr: neither).
  void set_op_timer(OpTimer timer) {
    timer_ = std::move(timer);
    brackets_ = nullptr;
  }
  // Brackets around each op (replaces any timer; nullptr: neither). Not owned.
  void set_op_brackets(OpBrackets* brackets) {
    brackets_ = brackets;
    timer_ = nullptr;
  }

  // Forward results on the host, for dumps and tests (valid until the next
  // call of one of them).
  const float* logits() const;                    // (N, V)
  const int32_t* positions() const { return pos_.data(); }  // (N)
  // Chosen experts of MoE layer `layer`, (N, k); nullptr for a dense layer.
  const int32_t* routed_experts(int layer) const;
  const float* balancing_bias(int layer) const;    // (E) or nullptr
  // Which of MoE layer `layer`'s assignments the experts computed, (N*k) in
  // assignment order (token-major, as routed_experts); all 1 without drops.
  std::vector<uint8_t> kept_assignments(int layer) const;
  // The forward output of op `i`, (N, out width), and its width. The dispatch and
  // expert ops' outputs are (N*k, L) in expert-grouped order (moe_group_by_expert's
  // sorted positions), not assignment order: assignment a is row sorted_pos[a].
  const float* op_output(size_t i, int64_t* width = nullptr) const;

 private:
  struct Slot {
    int64_t offset = 0;  // floats into the activation arena and its gradients
    int64_t width = 0;   // per token
  };
  // Slots an op reads and writes, and parameter indices; -1 = none.
  struct OpPlan {
    int in = -1, in2 = -1, in3 = -1;  // main input, second and third input
    int out = -1, out2 = -1;           // output (QK-norm, RoPE: out = q, out2 = k)
    int save = -1, save2 = -1, save3 = -1;  // buffers kept for backward (exec/backend.h, per OpKind)
    bool acc_in = false, acc_in2 = false, acc_in3 = false;  // backward: "+=" into that input's gradient
    int p0 = -1, p1 = -1, p2 = -1;     // parameter arena tensors in op.params order
    int p3 = -1, p4 = -1, p5 = -1;     // (a dense MLP's biases: exec/backend.h)
    int moe = -1;                      // index into moe_ of the op's layer
    int rot_dims = 0;                  // RoPE
    bool tied = false;                 // LM head: p0 is the embedding table (V, d), read transposed
    // MLA. A linear with two outputs (kv_down: latent | rope key; kv_up: k_nope | v)
    // computes into `joined` (N, out + out2) and splits its columns.
    int joined = -1;
    // The first op reading an MLA key gets it in two parts, k_nope (N, H, hd) and
    // the rope key shared by the heads, k_rope (N, r); it runs on the assembled
    // in2 = (N, H, hd + r), a slot of its own.
    int k_nope = -1, k_rope = -1;
    bool acc_k_nope = false, acc_k_rope = false;
    // Attention with qk head dim > v head dim: v is zero-padded to the qk head
    // dim (v_pad) and the output computed at it (o_pad), then sliced.
    int v_pad = -1, o_pad = -1;
  };
  // Routing state of one MoE layer: host copies for the driver's decisions,
  // and the backend's buffers the ops read and write (`dev`).
  struct MoeState {
    int layer = -1;
    int E = 0, k = 0, L = 0, F = 0;
    std::vector<int32_t> expert;      // (N, k)
    std::vector<int32_t> sorted_pos;  // (A)
    std::vector<int32_t> offsets;     // (E + 1)
    std::vector<uint8_t> keep;        // (A) grouped order; empty = keep all
    std::vector<float> bias;          // (E) QB selection bias (when not a parameter)
    std::vector<int64_t> hist;        // (E, bins) this step's router-logit histogram
    bool hist_on_host = false;        // hist was read out for an all-reduce: push before use
    int bias_param = -1;              // arena tensor of a learnable bias, else -1
    double router_z = 0;
    sim::DropCounts drops;
    Routing dev;                      // in backend memory
    uint8_t* keep_dev = nullptr;      // (A) dev.keep when this step drops, else dev.keep = nullptr
    std::vector<int64_t> counts;      // (E) the global batch's assignments per expert (aux loss under DP)
    int64_t* counts_dev = nullptr;
    float* bias_dev = nullptr;        // (E) the QB bias in backend memory
    std::vector<std::unique_ptr<Buffer>> buffers;
  };

  void plan(const models::LayerGraph& g);
  int new_slot(int64_t width);
  void allocate();
  float* A(int slot) const { return act_ + slots_[static_cast<size_t>(slot)].offset; }
  float* D(int slot) const { return dact_ + slots_[static_cast<size_t>(slot)].offset; }
  int64_t W(int slot) const { return slots_[static_cast<size_t>(slot)].width; }
  float* P(int p) const { return param_dev_ + params_.layout().offset(static_cast<size_t>(p)); }
  float* G(int p) const { return grad_dev_ + params_.layout().offset(static_cast<size_t>(p)); }

  OpCall bind(size_t i);  // op i with its tensors, as the backend takes it
  void load_batch(const int32_t* inputs, const int32_t* targets, const int32_t* doc_ids);  // and the parameters
  void forward_op(size_t i);
  void backward_op(size_t i);
  void op_timed(size_t i, int pass);  // pass 0 forward, 1 backward; with the profiler's brackets or timer, where set
  void decide_drops(MoeState& m, const float* weights);  // weights: (N, k) in backend memory
  double aux_loss(MoeState& m, size_t i);                  // op i: the layer's kTopK
  ExpertLayer expert_layer(const OpPlan& p);  // the kExpertMlp op's layer for the expert backend
  // Which copy of an arena holds its latest values (a host-memory backend has one copy: kBoth).
  enum class Fresh : uint8_t { kBoth, kHost, kBackend };
  void host_current(Arena& host, const float* dev, Fresh& fresh) const;  // copy out if the backend is newer
  void backend_current(const Arena& host, float* dev, Fresh& fresh);      // copy in if the host is newer
  template <typename T>
  const T* host_view(const T* p, int64_t n, std::vector<T>& copy) const;

  bool op_output_finite(size_t i);
  bool op_grads_finite(size_t i);

  models::LayerGraph graph_;
  int64_t B_ = 0, T_ = 0, N_ = 0;
  std::unique_ptr<Backend> backend_;
  // Host arenas; for a backend outside host memory, copies that const readers refresh.
  mutable Arena params_, grads_;
  mutable Fresh params_fresh_ = Fresh::kBoth, grads_fresh_ = Fresh::kBoth;
  mutable size_t arena_copy_bytes_ = 0;
  std::vector<Slot> slots_;
  std::vector<OpPlan> plan_;
  std::vector<int64_t> grads_final_from_;  // (ops) after op i's backward, the gradient arena from here on is final
  std::vector<MoeState> moe_;
  // Backend memory: activations and their gradients (act_floats_ each), the
  // arenas' mirrors (a backend in host memory reads the host arenas), the batch.
  size_t act_floats_ = 0;
  std::unique_ptr<Buffer> act_buf_, dact_buf_, param_buf_, grad_buf_, batch_buf_;
  float* act_ = nullptr;
  float* dact_ = nullptr;
  float* param_dev_ = nullptr;
  float* grad_dev_ = nullptr;
  int32_t* tokens_ = nullptr;       // (N) each: inputs, targets, doc ids, positions
  int32_t* targets_ = nullptr;
  int32_t* doc_ = nullptr;
  int32_t* pos_dev_ = nullptr;
  bool has_doc_ = false;
  std::vector<int32_t> pos_;        // (N) RoPE positions on the host
  mutable std::vector<float> host_floats_;  // a host copy of a backend tensor (logits, op_output)
  int64_t counted_targets_ = 0;
  double last_ce_ = 0, last_z_ = 0;  // the loss op's result
  int logits_slot_ = -1;
  bool training_ = true;
  DispatchOptions dispatch_;
  ExpertBackend* experts_ = nullptr;
  int64_t loss_tokens_ = 0;
  int64_t global_tokens_ = 0;       // data parallelism: the global batch's tokens (router losses)
  CountReducer reduce_counts_;
  double router_loss_ = 0;          // this forward's applied router losses
  OpTimer timer_;
  OpBrackets* brackets_ = nullptr;
};

// The name earlier code and tests use.
using CpuModel = Model;

}  // namespace rackstep::exec
