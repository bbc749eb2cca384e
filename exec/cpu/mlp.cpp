// Dense MLPs of every activation the layer graph declares (SwiGLU, GeLU,
// ReLU²), with optional biases. SwiGLU without biases runs the same calls in
// the same order as dense_swiglu_forward / _backward (bitwise the same).
#include "exec/kernels.h"
#include "sim/base/check.h"

namespace rackstep::exec {

namespace {

bool gated(MlpActivation act) { return act == MlpActivation::kSwiGlu; }

}  // namespace

void dense_mlp_forward(float* y, float* a1, float* a3, float* h, const float* x, const MlpWeights& w,
                       MlpActivation act, int N, int d, int F) {
  const size_t nf = static_cast<size_t>(N) * F;
  linear_forward(a1, x, w.w1, w.b1, N, d, F);
  switch (act) {
    case MlpActivation::kSwiGlu:
      RS_CHECK(w.w3 && a3, "dense_mlp_forward: SwiGLU needs W3 and a3");
      linear_forward(a3, x, w.w3, w.b3, N, d, F);
      swiglu_forward(h, a1, a3, nf);
      break;
    case MlpActivation::kGelu: gelu_forward(h, a1, nf); break;
    case MlpActivation::kRelu2: relu2_forward(h, a1, nf); break;
  }
  linear_forward(y, h, w.w2, w.b2, N, F, d);
}

size_t dense_mlp_scratch_floats(int N, int F) { return 3 * static_cast<size_t>(N) * F; }

void dense_mlp_backward(float* dx, const MlpGrads& g, const float* dy, const float* x, const float* a1,
                        const float* a3, const float* h, const MlpWeights& w, MlpActivation act, float* scratch,
                        int N, int d, int F, bool accumulate_dx) {
  const size_t nf = static_cast<size_t>(N) * F;
  float* dh = scratch;   // (N, F)
  float* da1 = dh + nf;  // (N, F)
  float* da3 = da1 + nf; // (N, F) SwiGLU
  linear_backward(dh, g.dw2, g.db2, dy, h, w.w2, N, F, d);
  switch (act) {
    case MlpActivation::kSwiGlu: swiglu_backward(da1, da3, dh, a1, a3, nf); break;
    case MlpActivation::kGelu: gelu_backward(da1, dh, a1, nf); break;
    case MlpActivation::kRelu2: relu2_backward(da1, dh, a1, nf); break;
  }
  linear_backward(dx, g.dw1, g.db1, da1, x, w.w1, N, d, F, accumulate_dx);
  if (gated(act)) linear_backward(dx, g.dw3, g.db3, da3, x, w.w3, N, d, F, /*accumulate_dx=*/true);
}

}  // namespace rackstep::exec
