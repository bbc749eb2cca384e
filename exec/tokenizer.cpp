#include "exec/tokenizer.h"

#include <algorithm>
#include <map>

#include "sim/base/check.h"
#include "sim/base/json_io.h"

namespace rackstep::exec {

namespace {

uint64_t pair_key(uint32_t a, uint32_t b) { return (static_cast<uint64_t>(a) << 32) | b; }

bool is_word_byte(unsigned char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c >= 0x80;  // UTF-8 sequences stay inside words
}
bool is_space_byte(unsigned char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

}  // namespace

std::vector<std::string_view> pretokenize(std::string_view text) {
  std::vector<std::string_view> chunks;
  size_t i = 0;
  const size_t n = text.size();
  auto uc = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  while (i < n) {
    size_t j = i;
    // One leading space joins the following word or punctuation run.
    if (uc(j) == ' ' && j + 1 < n && !is_space_byte(uc(j + 1))) ++j;
    if (is_word_byte(uc(j))) {
      while (j < n && is_word_byte(uc(j))) ++j;
    } else if (!is_space_byte(uc(j))) {
      while (j < n && !is_word_byte(uc(j)) && !is_space_byte(uc(j))) ++j;
    } else {
      // Whitespace run; leave the last space for the next word when one follows.
      while (j < n && is_space_byte(uc(j))) ++j;
      if (j < n && j - i > 1 && uc(j - 1) == ' ') --j;
    }
    chunks.push_back(text.substr(i, j - i));
    i = j;
  }
  return chunks;
}

Tokenizer Tokenizer::bytes() {
  Tokenizer t;
  t.build_tables();
  return t;
}

Tokenizer Tokenizer::bpe(std::vector<std::pair<uint32_t, uint32_t>> merges) {
  Tokenizer t;
  t.merges_ = std::move(merges);
  t.build_tables();
  return t;
}

void Tokenizer::build_tables() {
  token_bytes_.clear();
  merge_rank_.clear();
  cache_.clear();
  token_bytes_.emplace_back();  // id 0, end of document, decodes to nothing
  for (int b = 1; b < 256; ++b) token_bytes_.emplace_back(1, static_cast<char>(b));
  for (size_t r = 0; r < merges_.size(); ++r) {
    const auto [a, b] = merges_[r];
    const uint32_t id = kFirstMergeId + static_cast<uint32_t>(r);
    RS_CHECK(a < id && b < id && a != kEodId && b != kEodId, "BPE merge refers to a later id");
    token_bytes_.push_back(token_bytes_[a] + token_bytes_[b]);
    merge_rank_.emplace(pair_key(a, b), static_cast<uint32_t>(r));
  }
}

void Tokenizer::encode_chunk(std::string_view chunk, std::vector<uint32_t>& out) {
  if (merges_.empty()) {
    for (char c : chunk) out.push_back(static_cast<unsigned char>(c));
    return;
  }
  auto cached = cache_.find(std::string(chunk));
  if (cached != cache_.end()) {
    out.insert(out.end(), cached->second.begin(), cached->second.end());
    return;
  }
  std::vector<uint32_t> ids;
  ids.reserve(chunk.size());
  for (char c : chunk) ids.push_back(static_cast<unsigned char>(c));
  // Apply the lowest-rank merge present until none applies (standard BPE).
  while (ids.size() > 1) {
    uint32_t best_rank = UINT32_MAX;
    for (size_t k = 0; k + 1 < ids.size(); ++k) {
      auto it = merge_rank_.find(pair_key(ids[k], ids[k + 1]));
      if (it != merge_rank_.end()) best_rank = std::min(best_rank, it->second);
    }
    if (best_rank == UINT32_MAX) break;
    const auto [a, b] = merges_[best_rank];
    const uint32_t merged = kFirstMergeId + best_rank;
    size_t w = 0;
    for (size_t k = 0; k < ids.size(); ++k) {
      if (k + 1 < ids.size() && ids[k] == a && ids[k + 1] == b) {
        ids[w++] = merged;
        ++k;
      } else {
        ids[w++] = ids[k];
      }
    }
    ids.resize(w);
  }
  out.insert(out.end(), ids.begin(), ids.end());
  cache_.emplace(std::string(chunk), std::move(ids));
}

void Tokenizer::encode_into(std::string_view text, std::vector<uint32_t>& out) {
  if (merges_.empty()) {
    for (char c : text) out.push_back(static_cast<unsigned char>(c));
    return;
  }
  for (std::string_view chunk : pretokenize(text)) encode_chunk(chunk, out);
}

std::vector<uint32_t> Tokenizer::encode(std::string_view text) {
  std::vector<uint32_t> out;
  encode_into(text, out);
  return out;
}

std::string Tokenizer::decode(const std::vector<uint32_t>& ids) const {
  std::string s;
  for (uint32_t id : ids) {
    RS_CHECK(id < token_bytes_.size(), "token id outside the vocabulary");
    s += token_bytes_[id];
  }
  return s;
}

void Tokenizer::save(const std::string& path) const {
  nlohmann::json merges = nlohmann::json::array();
  for (const auto& [a, b] : merges_) merges.push_back({a, b});
  nlohmann::json doc = {{"kind", kind()},
                        {"vocab_size", vocab_size()},
                        {"eod_id", kEodId},
                        {"comment", "id 0 end of document, 1-255 bytes, 256+ merges in rank order"},
                        {"merges", merges}};
  write_json_file_atomic(path, doc, 0);
}

Tokenizer Tokenizer::load(const std::string& path) {
  const nlohmann::json doc = load_json_file(path);
  JsonReader r(doc, path);
  const std::string kind = r.choice("kind", {"byte", "bpe"}, "byte");
  const int64_t vocab = r.integer("vocab_size", {256, std::nullopt, 1u << 24});
  r.integer("eod_id", {kEodId, std::nullopt, kEodId});
  r.ignore("comment");
  std::vector<std::pair<uint32_t, uint32_t>> merges;
  if (r.has("merges")) {
    const nlohmann::json& m = r.raw().at("merges");
    r.ignore("merges");
    if (!m.is_array()) r.fail("merges", "an array of [left, right] id pairs", describe_json(m));
    for (size_t i = 0; i < m.size(); ++i) {
      const nlohmann::json& e = m[i];
      const uint32_t next_id = kFirstMergeId + static_cast<uint32_t>(i);
      const bool ok = e.is_array() && e.size() == 2 && e[0].is_number_unsigned() && e[1].is_number_unsigned() &&
                      e[0].get<uint64_t>() < next_id && e[1].get<uint64_t>() < next_id &&
                      e[0].get<uint64_t>() != kEodId && e[1].get<uint64_t>() != kEodId;
      if (!ok) {
        throw UserError(path, "/merges/" + std::to_string(i),
                        "a pair of earlier non-EOD ids (< " + std::to_string(next_id) + ")", describe_json(e));
      }
      merges.emplace_back(e[0].get<uint32_t>(), e[1].get<uint32_t>());
    }
  }
  r.finish();
  if ((kind == "byte") != merges.empty()) {
    throw UserError(path, "/kind", kind == "byte" ? "no merges for a byte tokenizer" : "merges for a bpe tokenizer",
                    std::to_string(merges.size()) + " merges");
  }
  if (vocab != kFirstMergeId + static_cast<int64_t>(merges.size())) {
    throw UserError(path, "/vocab_size", "256 + merges = " + std::to_string(kFirstMergeId + merges.size()),
                    std::to_string(vocab));
  }
  return bpe(std::move(merges));
}

// --- BPE training ----------------------------------------------------------------

namespace {

struct Word {
  std::vector<uint32_t> ids;
  int64_t count = 0;
};

// Adds `sign * word.count` to every adjacent pair of `word`.
void count_pairs(const Word& word, int64_t sign, std::unordered_map<uint64_t, int64_t>& pairs) {
  for (size_t k = 0; k + 1 < word.ids.size(); ++k) pairs[pair_key(word.ids[k], word.ids[k + 1])] += sign * word.count;
}

}  // namespace

Tokenizer train_bpe(const std::vector<std::string_view>& texts, uint32_t vocab_size) {
  RS_CHECK(vocab_size >= Tokenizer::kFirstMergeId, "BPE vocabulary below 256");
  // Unique chunks with counts; an ordered map keeps training deterministic.
  std::map<std::string_view, int64_t> chunk_counts;
  for (std::string_view t : texts) {
    for (std::string_view c : pretokenize(t)) {
      if (c.find('\0') == std::string_view::npos) ++chunk_counts[c];  // id 0 is end of document
    }
  }
  std::vector<Word> words;
  words.reserve(chunk_counts.size());
  for (const auto& [chunk, count] : chunk_counts) {
    Word w;
    w.count = count;
    for (char c : chunk) w.ids.push_back(static_cast<unsigned char>(c));
    words.push_back(std::move(w));
  }
  std::unordered_map<uint64_t, int64_t> pairs;                   // pair -> weighted count
  std::unordered_map<uint64_t, std::vector<uint32_t>> where;     // pair -> words (may be stale)
  for (uint32_t wi = 0; wi < words.size(); ++wi) {
    count_pairs(words[wi], +1, pairs);
    for (size_t k = 0; k + 1 < words[wi].ids.size(); ++k) {
      where[pair_key(words[wi].ids[k], words[wi].ids[k + 1])].push_back(wi);
    }
  }

  std::vector<std::pair<uint32_t, uint32_t>> merges;
  const uint32_t n_merges = vocab_size - Tokenizer::kFirstMergeId;
  while (merges.size() < n_merges) {
    uint64_t best = 0;
    int64_t best_count = 0;
    for (const auto& [key, count] : pairs) {
      if (count > best_count || (count == best_count && count > 0 && key < best)) {
        best = key;
        best_count = count;
      }
    }
    if (best_count < 2) break;  // nothing left worth merging
    const uint32_t a = static_cast<uint32_t>(best >> 32), b = static_cast<uint32_t>(best & 0xffffffffu);
    const uint32_t merged = Tokenizer::kFirstMergeId + static_cast<uint32_t>(merges.size());
    merges.emplace_back(a, b);
    std::vector<uint32_t> touched = std::move(where[best]);
    where.erase(best);
    std::sort(touched.begin(), touched.end());
    touched.erase(std::unique(touched.begin(), touched.end()), touched.end());
    for (uint32_t wi : touched) {
      Word& w = words[wi];
      bool has = false;
      for (size_t k = 0; k + 1 < w.ids.size(); ++k) has = has || (w.ids[k] == a && w.ids[k + 1] == b);
      if (!has) continue;  // stale index entry
      count_pairs(w, -1, pairs);
      size_t out = 0;
      for (size_t k = 0; k < w.ids.size(); ++k) {
        if (k + 1 < w.ids.size() && w.ids[k] == a && w.ids[k + 1] == b) {
          w.ids[out++] = merged;
          ++k;
        } else {
          w.ids[out++] = w.ids[k];
        }
      }
      w.ids.resize(out);
      count_pairs(w, +1, pairs);
      for (size_t k = 0; k + 1 < w.ids.size(); ++k) {
        if (w.ids[k] == merged || w.ids[k + 1] == merged) where[pair_key(w.ids[k], w.ids[k + 1])].push_back(wi);
      }
    }
    pairs.erase(best);
    // Drop pairs whose count fell to zero so the scan stays short.
    for (auto it = pairs.begin(); it != pairs.end();) it = it->second == 0 ? pairs.erase(it) : std::next(it);
  }
  return Tokenizer::bpe(std::move(merges));
}

}  // namespace rackstep::exec
