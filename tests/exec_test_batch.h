// A batch of pseudo-random tokens with two documents per sequence, for the
// model tests (tests/exec_model.cpp, tests/exec_shapes.cpp): deterministic for
// a seed, targets the inputs shifted by one. And a small corpus of generated
// text for the trainer tests (tests/exec_train.cpp, tests/dp_ranks.cpp).
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
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

// 40 documents of 90 words each, from an 18-word vocabulary, into `text_dir`
// (created): deterministic for a seed.
inline void write_word_corpus(const std::filesystem::path& text_dir, uint64_t seed) {
  std::filesystem::create_directories(text_dir);
  const char* words[] = {"the", "model", "trains", "on", "text", "and", "its", "loss", "falls", "while",
                         "experts", "route", "tokens", "to", "layers", "of", "a", "rack"};
  uint64_t s = seed;
  for (int f = 0; f < 40; ++f) {
    std::ofstream out(text_dir / ("doc" + std::to_string(f) + ".txt"));
    for (int w = 0; w < 90; ++w) {
      s = s * 6364136223846793005ULL + 1442695040888963407ULL;
      out << words[(s >> 33) % 18] << ((w % 11 == 10) ? ".\n" : " ");
    }
  }
}

}  // namespace rackstep::exec::testing
