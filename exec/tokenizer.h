// Tokenizers for the training data: bytes, or byte-level BPE trained on the
// corpus. Ids 1..255 are the raw bytes; id 0 is the end-of-document token that
// closes every document in a shard (the NUL byte never occurs in text: the
// builder skips files holding it as binary), so a byte tokenizer's vocabulary
// is exactly 256, as the byte-level models in models/zoo expect. BPE merges
// follow from 256 on.
//
//   Tokenizer t = Tokenizer::bytes();                   // vocab 256
//   Tokenizer b = train_bpe(texts, /*vocab_size=*/1024); // 768 merges
//   std::vector<uint32_t> ids = b.encode("def f(x):\n");
//   std::string back = b.decode(ids);                   // == the input
//   b.save("data/tokenizer.json");  Tokenizer::load("data/tokenizer.json");
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace rackstep::exec {

class Tokenizer {
 public:
  static constexpr uint32_t kEodId = 0;
  static constexpr uint32_t kFirstMergeId = 256;

  static Tokenizer bytes();
  // Merges in rank order: merge i makes id kFirstMergeId + i from (left, right).
  static Tokenizer bpe(std::vector<std::pair<uint32_t, uint32_t>> merges);
  // Reads a tokenizer.json written by save(); a bad file is a UserError.
  static Tokenizer load(const std::string& path);
  void save(const std::string& path) const;

  std::string kind() const { return merges_.empty() ? "byte" : "bpe"; }
  uint32_t vocab_size() const { return kFirstMergeId + static_cast<uint32_t>(merges_.size()); }
  uint32_t eod_id() const { return kEodId; }
  const std::vector<std::pair<uint32_t, uint32_t>>& merges() const { return merges_; }

  // Appends the ids of `text` (no end-of-document token) to `out`. Text must
  // not hold NUL bytes: they would read as end of document.
  void encode_into(std::string_view text, std::vector<uint32_t>& out);
  std::vector<uint32_t> encode(std::string_view text);
  std::string decode(const std::vector<uint32_t>& ids) const;

 private:
  std::vector<std::pair<uint32_t, uint32_t>> merges_;
  std::unordered_map<uint64_t, uint32_t> merge_rank_;       // (left, right) -> rank
  std::vector<std::string> token_bytes_;                     // id -> bytes
  std::unordered_map<std::string, std::vector<uint32_t>> cache_;  // chunk -> ids
  void build_tables();
  void encode_chunk(std::string_view chunk, std::vector<uint32_t>& out);
};

// Splits text into pre-tokenisation chunks (GPT-2 style, in bytes): a run of
// letters/digits/high bytes with at most one leading space, a run of other
// punctuation with at most one leading space, or a run of whitespace. BPE
// merges never cross chunk boundaries.
std::vector<std::string_view> pretokenize(std::string_view text);

// Byte-level BPE: counts chunks over all texts, then repeatedly merges the most
// frequent adjacent pair (ties: smallest (left, right)) until vocab_size.
Tokenizer train_bpe(const std::vector<std::string_view>& texts, uint32_t vocab_size);

}  // namespace rackstep::exec
