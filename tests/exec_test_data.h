// A small dataset of generated text for the trainer tests (tests/exec_train.cpp,
// tests/dp_ranks.cpp): deterministic for a seed.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "exec/data.h"

namespace rackstep::exec::testing {

// 40 documents of 90 words each, from an 18-word vocabulary, written to
// root/text (deterministic for a seed) and built into a dataset in root/data,
// a fifth of it for evaluation. Returns the dataset's folder.
inline std::string build_word_dataset(const std::filesystem::path& root, uint64_t seed) {
  const std::filesystem::path text = root / "text";
  std::filesystem::create_directories(text);
  const char* words[] = {"the", "model", "trains", "on", "text", "and", "its", "loss", "falls", "while",
                         "experts", "route", "tokens", "to", "layers", "of", "a", "rack"};
  uint64_t s = seed;
  for (int f = 0; f < 40; ++f) {
    std::ofstream out(text / ("doc" + std::to_string(f) + ".txt"));
    for (int w = 0; w < 90; ++w) {
      s = s * 6364136223846793005ULL + 1442695040888963407ULL;
      out << words[(s >> 33) % 18] << ((w % 11 == 10) ? ".\n" : " ");
    }
  }
  BuildOptions o;
  o.from = {text.string()};
  o.out_dir = (root / "data").string();
  o.eval_fraction = 0.2;
  build_dataset(o);
  return o.out_dir;
}

}  // namespace rackstep::exec::testing
