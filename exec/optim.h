// Optimizers over arena tensors, by Marin's parameter groups
// (spec/marin-architecture.md, "Optimizer (param groups)"):
//
//   MuonH  block matrices, per expert matrix for (E, in, out) stacks:
//          m <- beta1 m + (1 - beta1) g;  u <- (1 - beta1) g + beta1 m   (Nesterov, as public Muon)
//          O <- NewtonSchulz5(u)          (quintic a,b,c = 3.4445, -4.7750, 2.0315, on u/||u||_F,
//                                          transposed so rows <= cols)
//          W <- Norm(W - lr ||W0|| Norm(O)) ||W0||,  Norm(x) = x / ||x||_F   (hyperball)
//   Muon   the same without the hyperball: W <- W - lr sqrt(max(1, rows/cols)) O (ablations only)
//   AdamH  LM head: Adam direction u = mhat / (sqrt(vhat) + eps), then the same hyperball step
//   Adam   embedding, router, attention gate, gains, SConv kernels: bias-corrected Adam
//          (+ decoupled weight decay, 0 by default)
//
// Schedule: linear warmup over 1% of the steps to the peak, then linear decay to
// 5% of the peak at the last step. No gradient clipping. LR fit (Marin):
//   adam_lr  = 0.087571 * tokens^-0.3461 * d^-0.3448 * sqrt(tokens_per_batch)
//   muonh_lr = 13/3 * adam_lr
//
//   OptimizerConfig cfg = default_optimizer_config(steps, d_model, tokens_per_batch);
//   OptimizerState st = init_optimizer_state(params);    // records ||W0|| per matrix
//   Optimizer opt(cfg);
//   opt.step(params, grads, st);                          // one update, st.step += 1
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "exec/arena.h"

namespace rackstep::exec {

// Optimizer state per parameter, in bytes, for fp32 states (the memory
// predictor uses the same facts). Per hyperball matrix add kW0NormBytes.
//   MuonH / Muon: momentum                    4 B/param
//   AdamH / Adam: first + second moment       8 B/param
// Parameters (4 B) and gradients (4 B) are separate arenas and not included.
constexpr double optimizer_state_bytes_per_param(OptGroup g) {
  return (g == OptGroup::kMuonH || g == OptGroup::kMuon) ? 4.0 : 8.0;
}
constexpr double kW0NormBytes = 8.0;  // one double per hyperball matrix

// Newton–Schulz quintic coefficients (Jordan et al., "Muon", 2024).
constexpr float kNsA = 3.4445f, kNsB = -4.7750f, kNsC = 2.0315f;

struct OptimizerConfig {
  double adam_lr = 0;      // peak LR of Adam and AdamH tensors
  double muonh_lr = 0;     // peak LR of MuonH and Muon tensors
  double beta1 = 0.9062;   // Adam beta1 and Muon momentum
  double beta2 = 0.95;
  double eps = 1e-8;
  double adam_weight_decay = 0.0;
  int ns_steps = 5;
  int64_t total_steps = 1;
  double warmup_fraction = 0.01;
  double final_lr_fraction = 0.05;
};

// Marin's LR fit. tokens = total training tokens, d = model width.
double fit_adam_lr(double tokens, double d_model, double tokens_per_batch);
double fit_muonh_lr(double tokens, double d_model, double tokens_per_batch);
OptimizerConfig default_optimizer_config(int64_t total_steps, int64_t d_model, int64_t tokens_per_batch);

// Steps of linear warmup: round(warmup_fraction * total), at least 1.
int64_t warmup_steps(int64_t total_steps, double warmup_fraction);
// LR multiplier of update `step` (0-based): (step + 1) / W during warmup, so
// step W - 1 is the peak (1.0); then linear to `final_fraction` at total - 1.
double lr_multiplier(int64_t step, int64_t total_steps, double warmup_fraction, double final_fraction);

// Orthogonalises g (rows, cols) into out (rows, cols) with `steps` quintic
// Newton–Schulz iterations on g / (||g||_F + 1e-7), GEMMs through cblas_sgemm.
// `work` is resized as needed and reused across calls.
void newton_schulz(const float* g, int64_t rows, int64_t cols, int steps, float* out, std::vector<float>& work);

struct OptimizerState {
  int64_t step = 0;                // updates applied so far
  Arena momentum;                  // params' layout: Adam first moment, Muon momentum
  Arena second_moment;             // Adam and AdamH tensors only: second moment
  std::vector<double> w0_norm;     // initial ||W||_F per hyperball matrix, tensor order
  std::vector<int64_t> w0_index;   // (tensors) first w0_norm entry of each tensor, -1 if none
  std::vector<int64_t> v_index;    // (tensors) tensor index in second_moment, -1 if none
};

// Zero moments, and ||W0|| of every hyperball matrix taken from `params`.
OptimizerState init_optimizer_state(const Arena& params);

// Frobenius norm per group, e.g. of gradients for the training log.
struct GroupNorms {
  double by_group[4] = {0, 0, 0, 0};  // indexed by OptGroup
};
GroupNorms group_norms(const Arena& arena);

class Optimizer {
 public:
  explicit Optimizer(OptimizerConfig config);
  const OptimizerConfig& config() const { return config_; }

  // Applies update number state.step to tensors [begin, end) (a ZeRO owner's
  // range, see partition_tensors), then advances state.step.
  void step(Arena& params, const Arena& grads, OptimizerState& state, size_t begin = 0,
            size_t end = std::numeric_limits<size_t>::max());

  // Peak LR times the schedule for update `step`, per group.
  double lr(OptGroup group, int64_t step) const;

 private:
  void step_muon(TensorView w, const float* g, float* m, const OptimizerState& st, size_t tensor, double lr);
  void step_adam(TensorView w, const float* g, float* m, float* v, const OptimizerState& st, size_t tensor,
                 double lr);
  OptimizerConfig config_;
  std::vector<float> u_;     // update direction of one matrix / tensor
  std::vector<float> o_;     // Newton–Schulz output of one matrix
  std::vector<float> work_;  // Newton–Schulz workspace
};

// W <- Norm(W - lr ||W0|| Norm(u)) ||W0|| over n elements (the hyperball step).
void hyperball_update(float* w, const float* u, int64_t n, double lr, double w0_norm);

}  // namespace rackstep::exec
