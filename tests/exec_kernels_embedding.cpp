// Embedding lookup and scatter-add backward.
#include "exec/kernels.h"
#include "tests/exec_kernels_testutil.h"

using namespace rackstep::exec;
using rackstep::exec::testing::check_gradient;
using rackstep::exec::testing::dot;
using rackstep::exec::testing::randn;

TEST_CASE("embedding forward copies rows; backward scatter-adds repeated tokens", "[exec][kernels][embedding]") {
  const int V = 5, d = 3, N = 4;
  auto table = randn(V * d, 1);
  std::vector<int32_t> tokens{2, 0, 2, 4};
  std::vector<float> out(N * d);
  embedding_forward(out.data(), tokens.data(), table.data(), N, d, V);
  for (int t = 0; t < N; ++t)
    for (int c = 0; c < d; ++c) CHECK(out[t * d + c] == table[tokens[t] * d + c]);

  std::vector<float> dout{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  std::vector<float> dtable(V * d, 1.0f);  // += onto existing values
  embedding_backward(dtable.data(), dout.data(), tokens.data(), N, d, V);
  CHECK(dtable[2 * d + 0] == 1 + 1 + 7);
  CHECK(dtable[2 * d + 2] == 1 + 3 + 9);
  CHECK(dtable[0 * d + 1] == 1 + 5);
  CHECK(dtable[4 * d + 2] == 1 + 12);
  CHECK(dtable[1 * d + 0] == 1);  // untouched row
  CHECK(dtable[3 * d + 1] == 1);
}

TEST_CASE("embedding gradient matches finite differences", "[exec][kernels][embedding]") {
  const int V = 6, d = 4, N = 9;
  auto table = randn(V * d, 2), r = randn(N * d, 3);
  std::vector<int32_t> tokens{1, 3, 1, 0, 5, 5, 5, 2, 1};
  std::vector<float> out(N * d), dtable(V * d, 0.0f);
  auto loss = [&] {
    embedding_forward(out.data(), tokens.data(), table.data(), N, d, V);
    return dot(out, r);
  };
  embedding_backward(dtable.data(), r.data(), tokens.data(), N, d, V);
  check_gradient("dtable", table, dtable, loss);
}
