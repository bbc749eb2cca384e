// Reruns with the same thread count give bitwise identical results (the
// kernels reduce in a fixed order), and the small helpers behave.
#include <limits>

#include "exec/kernels.h"
#include "tests/exec_kernels_testutil.h"

using namespace rackstep::exec;
using rackstep::exec::testing::randn;

TEST_CASE("parameter-gradient reductions are bitwise reproducible", "[exec][kernels][determinism]") {
  const int N = 300, d = 37, B = 3, T = 100, C = 37, K = 4;
  auto x = randn(N * d, 1), dy = randn(N * d, 2), gain = randn(d, 3), w = randn(C * K, 4);
  std::vector<float> y(N * d), rstd(N);
  rmsnorm_forward(y.data(), rstd.data(), x.data(), gain.data(), 1e-6f, N, d);
  std::vector<int32_t> doc(B * T), tokens(N);
  for (int i = 0; i < B * T; ++i) doc[i] = i / 17;
  for (int i = 0; i < N; ++i) tokens[i] = (i * 31) % 11;
  auto run = [&] {
    std::vector<float> dx(N * d), dgain(d, 0.0f), dw(C * K, 0.0f), dtable(11 * d, 0.0f), db(d, 0.0f);
    rmsnorm_backward(dx.data(), dgain.data(), dy.data(), x.data(), rstd.data(), gain.data(), N, d);
    sconv_backward(dx.data(), dw.data(), dy.data(), x.data(), w.data(), doc.data(), B, T, C, K);
    embedding_backward(dtable.data(), dy.data(), tokens.data(), N, d, 11);
    std::vector<float> wl(d * d, 0.01f), dwl(d * d, 0.0f);
    linear_backward(dx.data(), dwl.data(), db.data(), dy.data(), x.data(), wl.data(), N, d, d);
    return std::vector<std::vector<float>>{dgain, dw, dtable, db, dx};
  };
  CHECK(run() == run());
}

TEST_CASE("attention backward is bitwise reproducible", "[exec][kernels][determinism]") {
  const int B = 2, T = 200, H = 4, kv = 2, hd = 8;  // T > one query tile
  auto q = randn(B * T * H * hd, 5), k = randn(B * T * kv * hd, 6), v = randn(B * T * kv * hd, 7),
       dout = randn(B * T * H * hd, 8);
  std::vector<float> o(q.size()), lse(B * H * T);
  attention_forward(o.data(), lse.data(), q.data(), k.data(), v.data(), nullptr, B, T, H, kv, kv,
                    hd, 150, 0.35f);
  auto run = [&] {
    std::vector<float> dq(q.size()), dk(k.size()), dv(v.size());
    attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(), v.data(),
                       o.data(), lse.data(), nullptr, B, T, H, kv, kv, hd, 150, 0.35f);
    return std::vector<std::vector<float>>{dq, dk, dv};
  };
  CHECK(run() == run());
}

TEST_CASE("first_nonfinite finds the first NaN or Inf", "[exec][kernels][helpers]") {
  std::vector<float> x{1, 2, 3, 4};
  CHECK(first_nonfinite(x.data(), x.size()) == 4);
  x[2] = std::numeric_limits<float>::infinity();
  x[3] = std::numeric_limits<float>::quiet_NaN();
  CHECK(first_nonfinite(x.data(), x.size()) == 2);
}

TEST_CASE("measured sgemm rate is positive and finite", "[exec][kernels][helpers]") {
  const double flops = measure_sgemm_flops_per_s(64, 0.0);
  CHECK(std::isfinite(flops));
  CHECK(flops > 0.0);
}
