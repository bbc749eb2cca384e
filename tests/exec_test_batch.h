// A batch of pseudo-random tokens with two documents per sequence, for the
// model tests (tests/exec_model.cpp, tests/exec_shapes.cpp): deterministic for
// a seed, targets the inputs shifted by one.
#pragma once

#include <cstdint>
#include <vector>

namespace rackstep::exec::testing {

struct TestBatch {
  std::vector<int32_t> inputs, targets, docs;  // (B, T) each
};

inline TestBatch make_batch(int64_t B, int64_t T, int64_t vocab, uint64_t seed) {
  TestBatch b;
  uint64_t s = seed;
  for (int64_t i = 0; i < B * T + 1; ++i) {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;  // LCG (Knuth MMIX)
    b.inputs.push_back(static_cast<int32_t>((s >> 33) % static_cast<uint64_t>(vocab)));
  }
  b.targets.assign(b.inputs.begin() + 1, b.inputs.end());
  b.inputs.pop_back();
  for (int64_t i = 0; i < B * T; ++i) b.docs.push_back(static_cast<int32_t>((i / T) * 2 + ((i % T) >= T / 3)));
  return b;
}

}  // namespace rackstep::exec::testing
