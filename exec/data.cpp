#include "exec/data.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "exec/arena.h"
#include "sim/base/check.h"
#include "sim/base/value_error.h"
#include "sim/base/json_io.h"

namespace rackstep::exec {

namespace fs = std::filesystem;

namespace {

template <typename T>
void put(std::vector<unsigned char>& buf, size_t at, T v) {
  std::memcpy(buf.data() + at, &v, sizeof v);  // little-endian hosts only
}
template <typename T>
T get(const std::string& buf, size_t at) {
  T v;
  std::memcpy(&v, buf.data() + at, sizeof v);
  return v;
}

std::string read_file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UserError(path, "", "a readable file", "cannot open it");
  std::ostringstream ss;
  ss << in.rdbuf();
  return std::move(ss).str();
}

std::string hex_bytes(const std::string& s, size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < std::min(n, s.size()); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    out += digits[c >> 4];
    out += digits[c & 15];
  }
  return out;
}

std::string hex64(uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

}  // namespace

// --- shard files ------------------------------------------------------------------

void write_shard(const std::string& path, const Shard& shard) {
  RS_CHECK(shard.vocab_size > 0, "shard needs a vocabulary size");
  RS_CHECK(shard.tokens.empty() || (!shard.doc_starts.empty() && shard.doc_starts[0] == 0),
           "a non-empty shard starts with a document");
  const uint32_t dtype = shard.vocab_size <= 65536 ? 2 : 4;
  std::vector<unsigned char> payload(shard.tokens.size() * dtype);
  for (size_t i = 0; i < shard.tokens.size(); ++i) {
    RS_CHECK(shard.tokens[i] < shard.vocab_size, "token outside the vocabulary");
    if (dtype == 2) put(payload, i * 2, static_cast<uint16_t>(shard.tokens[i]));
    else put(payload, i * 4, shard.tokens[i]);
  }
  const size_t doc_bytes = shard.doc_starts.size() * sizeof(uint64_t);
  const uint64_t checksum =
      Checksum64().update(payload.data(), payload.size()).update(shard.doc_starts.data(), doc_bytes).value();
  std::vector<unsigned char> header(kShardHeaderBytes, 0);
  std::memcpy(header.data(), kShardMagic, 8);
  put(header, 8, kShardVersion);
  put(header, 12, dtype);
  put(header, 16, static_cast<uint64_t>(shard.tokens.size()));
  put(header, 24, static_cast<uint64_t>(shard.doc_starts.size()));
  put(header, 32, shard.vocab_size);
  put(header, 40, checksum);
  write_binary_file_atomic(path, {{header.data(), header.size()},
                                  {payload.data(), payload.size()},
                                  {shard.doc_starts.data(), doc_bytes}});
}

Shard read_shard(const std::string& path) {
  const std::string buf = read_file_bytes(path);
  auto fail = [&](const std::string& expected, const std::string& found) -> UserError {
    return UserError(path, "", expected, found);
  };
  if (buf.size() < kShardHeaderBytes) {
    throw fail("a token shard of at least its 64-byte header (truncated?)", std::to_string(buf.size()) + " bytes");
  }
  if (std::memcmp(buf.data(), kShardMagic, 8) != 0) {
    throw fail("a rackstep token shard (magic 5253544f4b534800, \"RSTOKSH\")", "bytes " + hex_bytes(buf, 8));
  }
  const auto version = get<uint32_t>(buf, 8);
  if (version != kShardVersion) throw fail("shard version " + std::to_string(kShardVersion), std::to_string(version));
  const auto dtype = get<uint32_t>(buf, 12);
  if (dtype != 2 && dtype != 4) throw fail("dtype 2 (uint16) or 4 (uint32)", std::to_string(dtype));
  const auto token_count = get<uint64_t>(buf, 16);
  const auto doc_count = get<uint64_t>(buf, 24);
  const auto vocab = get<uint32_t>(buf, 32);
  const auto stored_checksum = get<uint64_t>(buf, 40);
  // Guard the size arithmetic against absurd header values before multiplying.
  if (token_count > (uint64_t{1} << 40) || doc_count > (uint64_t{1} << 40)) {
    throw fail("token and document counts below 2^40", std::to_string(token_count) + " tokens, " +
                                                            std::to_string(doc_count) + " documents");
  }
  const uint64_t expected_size = kShardHeaderBytes + token_count * dtype + doc_count * 8;
  if (buf.size() != expected_size) {
    throw fail(std::to_string(expected_size) + " bytes (64 header + " + std::to_string(token_count) + " tokens x " +
                   std::to_string(dtype) + " + " + std::to_string(doc_count) + " doc starts x 8)",
               std::to_string(buf.size()) + " bytes" + (buf.size() < expected_size ? " (truncated)" : ""));
  }
  const char* payload = buf.data() + kShardHeaderBytes;
  const uint64_t checksum = checksum64(payload, buf.size() - kShardHeaderBytes);
  if (checksum != stored_checksum) {
    throw fail("payload checksum " + hex64(stored_checksum) + " (from the header)",
               hex64(checksum) + " (the shard is corrupt)");
  }
  Shard s;
  s.vocab_size = vocab;
  s.tokens.resize(token_count);
  for (uint64_t i = 0; i < token_count; ++i) {
    s.tokens[i] = dtype == 2 ? get<uint16_t>(buf, kShardHeaderBytes + i * 2) : get<uint32_t>(buf, kShardHeaderBytes + i * 4);
    if (s.tokens[i] >= vocab) {
      throw fail("token ids below vocab_size " + std::to_string(vocab),
                 "id " + std::to_string(s.tokens[i]) + " at token " + std::to_string(i));
    }
  }
  s.doc_starts.resize(doc_count);
  std::memcpy(s.doc_starts.data(), payload + token_count * dtype, doc_count * 8);
  for (uint64_t i = 0; i < doc_count; ++i) {
    const uint64_t lo = i == 0 ? 0 : s.doc_starts[i - 1] + 1;
    if ((i == 0 && s.doc_starts[0] != 0) || s.doc_starts[i] < lo || s.doc_starts[i] >= token_count) {
      throw fail("document starts increasing from 0 and below " + std::to_string(token_count),
                 "start " + std::to_string(s.doc_starts[i]) + " for document " + std::to_string(i));
    }
  }
  if (token_count > 0 && doc_count == 0) throw fail("at least one document in a non-empty shard", "0 documents");
  return s;
}

// --- building ---------------------------------------------------------------------

namespace {

bool excluded_dir(const std::string& name) {
  return name == "__pycache__" || name == ".git" || name == "test" || name == "tests" || name == "idle_test" ||
         name == "site-packages" || name == "dist-packages";
}

// Regular files under `root` (symlinks skipped so a licence linked under two
// names counts once), sorted; `suffix` filters when non-empty.
void collect_files(const fs::path& root, const std::string& suffix, bool skip_test_dirs,
                   std::vector<std::string>& out) {
  std::error_code ec;
  if (fs::is_symlink(root, ec)) return;
  if (fs::is_regular_file(root, ec)) {
    out.push_back(root.string());
    return;
  }
  if (!fs::is_directory(root, ec)) throw UserError(root.string(), "", "a text file or a directory", "nothing there");
  std::vector<std::string> found;
  for (auto it = fs::recursive_directory_iterator(root, fs::directory_options::skip_permission_denied, ec);
       it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (ec) break;
    const std::string name = it->path().filename().string();
    if (it->is_symlink(ec)) continue;
    if (it->is_directory(ec)) {
      if (name == "__pycache__" || name == ".git" || (skip_test_dirs && excluded_dir(name))) it.disable_recursion_pending();
      continue;
    }
    if (!it->is_regular_file(ec)) continue;
    if (!suffix.empty() && (name.size() < suffix.size() || name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)) continue;
    found.push_back(it->path().string());
  }
  std::sort(found.begin(), found.end());
  out.insert(out.end(), found.begin(), found.end());
}

std::vector<std::string_view> split_documents(std::string_view text, const std::string& rule) {
  if (rule == "file") return {text};
  // "blank-lines": documents are separated by one or more lines holding only whitespace.
  std::vector<std::string_view> docs;
  size_t doc_begin = 0, line_begin = 0;
  auto flush = [&](size_t end) {
    std::string_view d = text.substr(doc_begin, end - doc_begin);
    if (d.find_first_not_of(" \t\r\n") != std::string_view::npos) docs.push_back(d);
  };
  while (line_begin < text.size()) {
    size_t line_end = text.find('\n', line_begin);
    if (line_end == std::string_view::npos) line_end = text.size();
    std::string_view line = text.substr(line_begin, line_end - line_begin);
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) {
      flush(line_begin);
      doc_begin = line_end + 1;
    }
    line_begin = line_end + 1;
  }
  if (doc_begin < text.size()) flush(text.size());
  return docs;
}

// A document is held out when its content hash falls below the fraction, so
// identical documents (duplicated licences) always land in the same split.
bool is_eval_document(std::string_view doc, double eval_fraction) {
  const uint64_t h = checksum64(doc.data(), doc.size(), 0x6576616cULL);  // "eval"
  return static_cast<double>(h >> 11) * 0x1.0p-53 < eval_fraction;
}

class ShardWriter {
 public:
  ShardWriter(std::string dir, std::string prefix, uint32_t vocab, int64_t shard_tokens)
      : dir_(std::move(dir)), prefix_(std::move(prefix)), shard_tokens_(shard_tokens) {
    current_.vocab_size = vocab;
  }
  void add_document(const std::vector<uint32_t>& ids) {
    if (!current_.tokens.empty() && static_cast<int64_t>(current_.tokens.size() + ids.size()) > shard_tokens_) flush();
    current_.doc_starts.push_back(current_.tokens.size());
    current_.tokens.insert(current_.tokens.end(), ids.begin(), ids.end());
    tokens_ += static_cast<int64_t>(ids.size());
    ++documents_;
  }
  void flush() {
    if (current_.tokens.empty()) return;
    char name[64];
    std::snprintf(name, sizeof name, "%s-%05zu.bin", prefix_.c_str(), names_.size());
    write_shard((fs::path(dir_) / name).string(), current_);
    names_.push_back(name);
    current_.tokens.clear();
    current_.doc_starts.clear();
  }
  const std::vector<std::string>& names() const { return names_; }
  int64_t tokens() const { return tokens_; }
  int64_t documents() const { return documents_; }

 private:
  std::string dir_, prefix_;
  int64_t shard_tokens_;
  Shard current_;
  std::vector<std::string> names_;
  int64_t tokens_ = 0, documents_ = 0;
};

void prepare_out_dir(const std::string& dir) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) {
    fs::create_directories(dir, ec);
    if (ec) throw UserError(dir, "", "a directory that can be created", ec.message());
    return;
  }
  if (!fs::is_directory(dir, ec)) throw UserError(dir, "", "a directory for the dataset", "a file");
  // Rebuilding over a dataset is fine; writing into someone's unrelated directory is not.
  const bool empty = fs::directory_iterator(dir, ec) == fs::directory_iterator();
  if (!empty && !fs::exists(fs::path(dir) / "dataset.json", ec)) {
    throw UserError(dir, "", "an empty directory or an existing rackstep dataset (dataset.json)",
                    "a non-empty directory without dataset.json");
  }
}

double entropy_bits(const std::vector<int64_t>& counts) {
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  if (total == 0) return 0.0;
  double h = 0;
  for (int64_t c : counts) {
    if (c == 0) continue;
    const double p = static_cast<double>(c) / static_cast<double>(total);
    h -= p * std::log2(p);
  }
  return h;
}

}  // namespace

std::vector<std::string> default_corpus_files(std::vector<std::string>* roots) {
  std::vector<std::string> files;
  const fs::path licenses = "/usr/share/common-licenses";
  std::error_code ec;
  if (fs::is_directory(licenses, ec)) {
    collect_files(licenses, "", false, files);
    if (roots) roots->push_back(licenses.string());
  }
  // Newest /usr/lib/python3.N that ships its sources (os.py is in libpython3.N-minimal).
  int best_minor = -1;
  for (int minor = 6; minor < 40; ++minor) {
    if (fs::exists("/usr/lib/python3." + std::to_string(minor) + "/os.py", ec)) best_minor = minor;
  }
  if (best_minor >= 0) {
    const std::string py = "/usr/lib/python3." + std::to_string(best_minor);
    collect_files(py, ".py", true, files);
    if (roots) roots->push_back(py + " (*.py, tests excluded)");
  }
  if (files.empty()) {
    throw UserError("/usr/share/common-licenses, /usr/lib/python3.N", "",
                    "Debian's licence texts or Python sources (run scripts/setup.sh)", "neither");
  }
  return files;
}

BuildSummary build_dataset(const BuildOptions& o) {
  // Errors name BuildOptions' fields, not flags; `rackstep data build` maps them to its flags.
  if (o.out_dir.empty()) throw ValueError("data", "out_dir", "a dataset directory", "nothing");
  if (o.tokenizer != "byte" && o.tokenizer != "bpe") throw ValueError("data", "tokenizer", "byte or bpe", o.tokenizer);
  if (o.split != "file" && o.split != "blank-lines") throw ValueError("data", "split", "file or blank-lines", o.split);
  if (!(o.eval_fraction >= 0 && o.eval_fraction < 1)) {
    throw ValueError("data", "eval_fraction", "a value in [0, 1)", std::to_string(o.eval_fraction));
  }
  if (o.shard_tokens < 1024) throw ValueError("data", "shard_tokens", "at least 1024", std::to_string(o.shard_tokens));
  if (o.tokenizer == "bpe" && (o.vocab_size < 257 || o.vocab_size > 65536)) {
    throw ValueError("data", "vocab_size", "257..65536 for bpe", std::to_string(o.vocab_size));
  }
  auto progress = [&](const std::string& line) {
    if (o.progress) o.progress(line);
  };

  BuildSummary s;
  s.out_dir = o.out_dir;
  std::vector<std::string> files;
  if (o.use_default_corpus) files = default_corpus_files(&s.sources);
  for (const std::string& f : o.from) {
    collect_files(f, "", false, files);
    s.sources.push_back(f);
  }
  if (files.empty()) throw ValueError("data", "from", "text files or directories holding some", "none");
  prepare_out_dir(o.out_dir);

  // Read every document; the corpora this is for are tens of MB.
  std::vector<std::string> texts;
  std::vector<std::string_view> train_docs, eval_docs;
  texts.reserve(files.size());
  for (size_t i = 0; i < files.size(); ++i) {
    std::string text = read_file_bytes(files[i]);
    if (text.empty() || text.find('\0') != std::string::npos) {
      ++s.skipped_files;
      continue;
    }
    ++s.files;
    s.bytes += static_cast<int64_t>(text.size());
    texts.push_back(std::move(text));
    if ((i + 1) % 200 == 0 || i + 1 == files.size()) {
      progress("read " + std::to_string(i + 1) + "/" + std::to_string(files.size()) + " files, " +
               std::to_string(s.bytes >> 20) + " MiB");
    }
  }
  for (const std::string& t : texts) {
    for (std::string_view d : split_documents(t, o.split)) {
      (is_eval_document(d, o.eval_fraction) ? eval_docs : train_docs).push_back(d);
    }
  }
  // Keep both splits usable: move the last train document out if none hashed to eval.
  if (o.eval_fraction > 0 && eval_docs.empty() && train_docs.size() >= 2) {
    eval_docs.push_back(train_docs.back());
    train_docs.pop_back();
  }
  if (train_docs.empty()) throw ValueError("data", "from", "at least one training document", "none");

  Tokenizer tok = Tokenizer::bytes();
  if (o.tokenizer == "bpe") {
    progress("training BPE to vocab " + std::to_string(o.vocab_size) + " on " + std::to_string(train_docs.size()) +
             " documents");
    tok = train_bpe(train_docs, o.vocab_size);
  }
  s.tokenizer = tok.kind();
  s.vocab_size = tok.vocab_size();

  std::vector<int64_t> counts(tok.vocab_size(), 0);
  std::vector<uint32_t> ids;
  auto write_split = [&](const std::vector<std::string_view>& docs, const std::string& prefix, bool count) {
    ShardWriter w(o.out_dir, prefix, tok.vocab_size(), o.shard_tokens);
    for (size_t i = 0; i < docs.size(); ++i) {
      ids.clear();
      tok.encode_into(docs[i], ids);
      ids.push_back(tok.eod_id());
      if (count) {
        for (uint32_t id : ids) ++counts[id];
      }
      w.add_document(ids);
      if ((i + 1) % 500 == 0 || i + 1 == docs.size()) {
        progress("tokenised " + prefix + " " + std::to_string(i + 1) + "/" + std::to_string(docs.size()) +
                 " documents, " + std::to_string(w.tokens()) + " tokens");
      }
    }
    w.flush();
    return w;
  };
  const ShardWriter train = write_split(train_docs, "train", true);
  const ShardWriter eval = write_split(eval_docs, "eval", false);
  s.train_documents = train.documents();
  s.eval_documents = eval.documents();
  s.train_tokens = train.tokens();
  s.eval_tokens = eval.tokens();
  s.train_shards = static_cast<int64_t>(train.names().size());
  s.eval_shards = static_cast<int64_t>(eval.names().size());
  s.unigram_entropy_bits_per_token = entropy_bits(counts);
  s.unigram_entropy_nats_per_token = s.unigram_entropy_bits_per_token * std::log(2.0);
  int64_t train_bytes = 0;
  for (std::string_view d : train_docs) train_bytes += static_cast<int64_t>(d.size());
  s.bytes_per_token = static_cast<double>(train_bytes) / static_cast<double>(s.train_tokens);

  tok.save((fs::path(o.out_dir) / "tokenizer.json").string());
  nlohmann::json manifest = {
      {"format", "rackstep-token-shards"},
      {"version", kShardVersion},
      {"tokenizer", "tokenizer.json"},
      {"vocab_size", s.vocab_size},
      {"document_rule", o.split},
      {"train", {{"shards", train.names()}, {"tokens", s.train_tokens}, {"documents", s.train_documents}}},
      {"eval", {{"shards", eval.names()}, {"tokens", s.eval_tokens}, {"documents", s.eval_documents}}},
      {"unigram_entropy_bits_per_token", s.unigram_entropy_bits_per_token},
      {"unigram_entropy_nats_per_token", s.unigram_entropy_nats_per_token},
      {"bytes_per_token", s.bytes_per_token},
      {"files", s.files},
      {"bytes", s.bytes},
      {"sources", s.sources}};
  write_json_file_atomic((fs::path(o.out_dir) / "dataset.json").string(), manifest);
  return s;
}

// --- loading ----------------------------------------------------------------------

DatasetInfo read_dataset_info(const std::string& dir) {
  const std::string path = (fs::path(dir) / "dataset.json").string();
  std::error_code ec;
  if (!fs::exists(path, ec)) throw UserError(path, "", "a dataset built by `rackstep data build`", "no such file");
  const nlohmann::json doc = load_json_file(path);
  JsonReader r(doc, path);
  r.choice("format", {"rackstep-token-shards"}, "");
  r.integer("version", {kShardVersion, std::nullopt, kShardVersion});
  DatasetInfo info;
  info.dir = dir;
  info.tokenizer = Tokenizer::load((fs::path(dir) / r.string("tokenizer")).string());
  const int64_t vocab = r.integer("vocab_size", {256, std::nullopt, std::nullopt});
  if (vocab != info.tokenizer.vocab_size()) {
    r.fail("vocab_size", "the tokenizer's " + std::to_string(info.tokenizer.vocab_size()), std::to_string(vocab));
  }
  r.choice("document_rule", {"file", "blank-lines"}, "file");
  auto read_split = [&](const std::string& key, std::vector<std::string>& shards, int64_t& tokens) {
    JsonReader sr = r.object(key);
    for (const std::string& name : sr.string_list("shards", {})) shards.push_back((fs::path(dir) / name).string());
    tokens = sr.integer("tokens", {0, std::nullopt, std::nullopt});
    sr.integer("documents", {0, std::nullopt, std::nullopt});
    sr.finish();
  };
  read_split("train", info.train_shards, info.train_tokens);
  read_split("eval", info.eval_shards, info.eval_tokens);
  info.unigram_entropy_bits_per_token = r.number("unigram_entropy_bits_per_token", {0, std::nullopt, std::nullopt});
  for (const char* k : {"unigram_entropy_nats_per_token", "bytes_per_token", "files", "bytes", "sources"}) r.ignore(k);
  r.finish();
  return info;
}

namespace {

// splitmix64: a small, well-mixed generator whose whole state is one word, so
// an epoch's order is a pure function of (seed, epoch).
uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace

TokenLoader::TokenLoader(const std::string& dir, Split split, int64_t seq, uint64_t seed) : seq_(seq) {
  if (seq < 1) throw UserError("sequence length: expected at least 1, found " + std::to_string(seq));
  const DatasetInfo info = read_dataset_info(dir);
  vocab_size_ = info.tokenizer.vocab_size();
  const auto& shards = split == Split::kTrain ? info.train_shards : info.eval_shards;
  for (const std::string& path : shards) {
    Shard s = read_shard(path);
    if (s.vocab_size != vocab_size_) {
      throw UserError(path, "", "vocab_size " + std::to_string(vocab_size_) + " (dataset.json)", std::to_string(s.vocab_size));
    }
    const uint64_t base = tokens_.size();
    for (uint64_t d : s.doc_starts) doc_starts_.push_back(base + d);
    tokens_.insert(tokens_.end(), s.tokens.begin(), s.tokens.end());
  }
  windows_ = tokens() > 0 ? (tokens() - 1) / seq_ : 0;
  if (windows_ < 1) {
    throw UserError(dir, split == Split::kTrain ? "train" : "eval",
                    "at least seq + 1 = " + std::to_string(seq_ + 1) + " tokens", std::to_string(tokens()));
  }
  pos_.seed = seed;
  shuffle_epoch();
}

void TokenLoader::shuffle_epoch() {
  order_.resize(windows_);
  for (int64_t i = 0; i < windows_; ++i) order_[i] = i;
  uint64_t state = pos_.seed ^ (0xd1b54a32d192ed03ULL * (pos_.epoch + 1));
  for (int64_t i = windows_ - 1; i > 0; --i) {
    // Modulo bias is below windows / 2^64: negligible.
    const auto j = static_cast<int64_t>(splitmix64(state) % static_cast<uint64_t>(i + 1));
    std::swap(order_[i], order_[j]);
  }
}

void TokenLoader::set_position(const DataPosition& pos) {
  if (pos.seed != pos_.seed) {
    throw UserError("data position: expected seed " + std::to_string(pos_.seed) + ", found " + std::to_string(pos.seed));
  }
  if (pos.cursor > static_cast<uint64_t>(windows_)) {
    throw UserError("data position: expected a cursor <= " + std::to_string(windows_) + " windows, found " +
                    std::to_string(pos.cursor) + " (another dataset?)");
  }
  const bool reshuffle = pos.epoch != pos_.epoch;
  pos_ = pos;
  if (reshuffle) shuffle_epoch();
}

void TokenLoader::fill_row(int64_t window, int64_t row, Batch& b) const {
  const uint64_t start = static_cast<uint64_t>(window * seq_);
  // The document holding `start`: the last doc start <= start.
  auto it = std::upper_bound(doc_starts_.begin(), doc_starts_.end(), start);
  auto doc = static_cast<int64_t>(it - doc_starts_.begin()) - 1;
  uint64_t next_start = it == doc_starts_.end() ? UINT64_MAX : *it;
  for (int64_t j = 0; j < seq_; ++j) {
    const uint64_t t = start + static_cast<uint64_t>(j);
    if (t == next_start) {
      ++doc;
      next_start = doc + 1 < documents() ? doc_starts_[doc + 1] : UINT64_MAX;
    }
    b.inputs[row * seq_ + j] = static_cast<int32_t>(tokens_[t]);
    b.targets[row * seq_ + j] = static_cast<int32_t>(tokens_[t + 1]);
    b.doc_ids[row * seq_ + j] = static_cast<int32_t>(doc);
  }
}

Batch TokenLoader::next_batch(int64_t batch, int rank, int world) {
  RS_CHECK(rank >= 0 && rank < world, "rank outside the world");
  const int64_t need = batch * world;
  if (batch < 1 || need > windows_) {
    throw UserError("batch: expected at most " + std::to_string(windows_) + " windows of " + std::to_string(seq_ + 1) +
                    " tokens per step (all ranks), found " + std::to_string(need));
  }
  if (pos_.cursor + need > static_cast<uint64_t>(windows_)) {
    ++pos_.epoch;
    pos_.cursor = 0;
    shuffle_epoch();
  }
  Batch b{batch, seq_, std::vector<int32_t>(batch * seq_), std::vector<int32_t>(batch * seq_),
          std::vector<int32_t>(batch * seq_)};
  for (int64_t i = 0; i < batch; ++i) fill_row(order_[pos_.cursor + rank * batch + i], i, b);
  pos_.cursor += need;
  return b;
}

Batch TokenLoader::eval_batch(int64_t index, int64_t batch) const {
  RS_CHECK(index >= 0 && index < eval_batches(batch), "eval batch index out of range");
  Batch b{batch, seq_, std::vector<int32_t>(batch * seq_), std::vector<int32_t>(batch * seq_),
          std::vector<int32_t>(batch * seq_)};
  for (int64_t i = 0; i < batch; ++i) fill_row(index * batch + i, i, b);
  return b;
}

}  // namespace rackstep::exec
