// Training data: token shards on disk, the dataset builder, and the loader
// that serves (batch, seq) windows with per-token document ids.
//
// Shard file (little-endian), written by write_shard(), checked by read_shard():
//   offset  size  field
//        0     8  magic "RSTOKSH\0"
//        8     4  version (1)
//       12     4  dtype: 2 = uint16 tokens, 4 = uint32 tokens (bytes per token)
//       16     8  token_count
//       24     8  doc_count
//       32     4  vocab_size
//       36     4  reserved (0)
//       40     8  payload checksum (checksum64 of tokens bytes then doc_starts bytes)
//       48    16  reserved (0)
//       64        tokens[token_count]   (dtype)
//                 doc_starts[doc_count] (uint64): document i is tokens
//                 [doc_starts[i], doc_starts[i+1]) and ends with the EOD token
// File size must be exactly 64 + token_count * dtype + doc_count * 8.
//
// A dataset directory holds dataset.json (tokenizer, shard lists, counts,
// unigram entropy), tokenizer.json, train-NNNNN.bin and eval-NNNNN.bin.
//
//   TokenLoader train("data/py", Split::kTrain, /*seq=*/256, /*seed=*/1);
//   Batch b = train.next_batch(/*batch=*/8);   // b.inputs, b.targets, b.doc_ids: (8, 256)
//   DataPosition p = train.position();         // goes into the checkpoint
//   TokenLoader eval("data/py", Split::kEval, 256, 1);
//   for (int64_t i = 0; i < eval.eval_batches(8); ++i) Batch e = eval.eval_batch(i, 8);
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "exec/tokenizer.h"

namespace rackstep::exec {

constexpr char kShardMagic[8] = {'R', 'S', 'T', 'O', 'K', 'S', 'H', '\0'};
constexpr uint32_t kShardVersion = 1;
constexpr size_t kShardHeaderBytes = 64;

struct Shard {
  uint32_t vocab_size = 0;
  std::vector<uint32_t> tokens;      // (token_count)
  std::vector<uint64_t> doc_starts;  // (doc_count), doc_starts[0] == 0
};

// Writes atomically (temp file + fsync + rename); uint16 when vocab <= 65536.
void write_shard(const std::string& path, const Shard& shard);
// Reads and validates magic, version, dtype, size, checksum, token range and
// document starts; any mismatch is one UserError naming the file, what was
// expected and what was found.
Shard read_shard(const std::string& path);

// --- building --------------------------------------------------------------------

struct BuildOptions {
  std::vector<std::string> from;       // files or directories (recursed, sorted)
  bool use_default_corpus = false;     // Debian-shipped text, see default_corpus_files()
  std::string out_dir;
  std::string tokenizer = "byte";      // "byte" or "bpe"
  uint32_t vocab_size = 1024;          // bpe only
  int64_t shard_tokens = 1 << 22;      // a shard closes before exceeding this
  double eval_fraction = 0.02;         // of documents, chosen by content hash
  std::string split = "file";          // "file": one doc per file; "blank-lines": per paragraph
  std::function<void(const std::string&)> progress;  // optional progress lines
};

struct BuildSummary {
  std::string out_dir;
  std::string tokenizer;
  uint32_t vocab_size = 0;
  int64_t files = 0;
  int64_t skipped_files = 0;           // binary (NUL byte) or empty
  int64_t bytes = 0;                   // text bytes read
  int64_t train_documents = 0, eval_documents = 0;
  int64_t train_tokens = 0, eval_tokens = 0;  // EOD tokens included
  int64_t train_shards = 0, eval_shards = 0;
  double unigram_entropy_bits_per_token = 0;  // train split, EOD included
  double unigram_entropy_nats_per_token = 0;  // the loss scale (cross-entropy in nats)
  double bytes_per_token = 0;
  std::vector<std::string> sources;
};

// The default corpus, text every machine set up by scripts/setup.sh has:
// /usr/share/common-licenses (plain-text licences, regular files only) and the
// Python standard library sources of the newest /usr/lib/python3.N (*.py,
// without test/, tests/, idle_test/, site-/dist-packages, __pycache__).
// Sorted paths, so the corpus is the same on every such machine.
std::vector<std::string> default_corpus_files(std::vector<std::string>* roots = nullptr);

BuildSummary build_dataset(const BuildOptions& options);

// --- loading ---------------------------------------------------------------------

enum class Split { kTrain, kEval };

struct DatasetInfo {
  std::string dir;
  Tokenizer tokenizer = Tokenizer::bytes();
  std::vector<std::string> train_shards, eval_shards;  // paths
  int64_t train_tokens = 0, eval_tokens = 0;
  double unigram_entropy_bits_per_token = 0;
};
// Reads DIR/dataset.json (strict) and DIR/tokenizer.json.
DatasetInfo read_dataset_info(const std::string& dir);

// Where a loader is in its stream: the checkpoint stores these three numbers.
struct DataPosition {
  uint64_t seed = 0;
  uint64_t epoch = 0;
  uint64_t cursor = 0;  // windows of this epoch already served
};

struct Batch {
  int64_t batch = 0, seq = 0;
  std::vector<int32_t> inputs;   // (batch, seq) token ids
  std::vector<int32_t> targets;  // (batch, seq) next token ids
  std::vector<int32_t> doc_ids;  // (batch, seq) document of each input token (split-global)
};

class TokenLoader {
 public:
  // Loads every shard of the split into memory. A split with fewer than
  // seq + 1 tokens is a UserError.
  TokenLoader(const std::string& dir, Split split, int64_t seq, uint64_t seed);

  int64_t seq() const { return seq_; }
  int64_t tokens() const { return static_cast<int64_t>(tokens_.size()); }
  int64_t documents() const { return static_cast<int64_t>(doc_starts_.size()); }
  uint32_t vocab_size() const { return vocab_size_; }
  // Non-overlapping windows of seq + 1 tokens (window w starts at w * seq).
  int64_t windows() const { return windows_; }

  // Training: windows in a seeded random order per epoch; an epoch ends when
  // fewer than batch * world windows remain. Rank r of `world` gets the r-th
  // slice of `batch` windows; every rank advances by batch * world.
  Batch next_batch(int64_t batch, int rank = 0, int world = 1);
  DataPosition position() const { return pos_; }
  void set_position(const DataPosition& pos);  // UserError when the seed differs

  // Evaluation: windows in file order, `batch` per call; the last partial
  // batch is dropped. Independent of the training position.
  int64_t eval_batches(int64_t batch) const { return windows_ / batch; }
  Batch eval_batch(int64_t index, int64_t batch) const;

 private:
  void fill_row(int64_t window, int64_t row, Batch& b) const;
  void shuffle_epoch();

  int64_t seq_;
  uint32_t vocab_size_ = 0;
  std::vector<uint32_t> tokens_;      // (tokens) all shards of the split, in order
  std::vector<uint64_t> doc_starts_;  // (documents) split-global token offsets
  int64_t windows_ = 0;
  DataPosition pos_;
  std::vector<int64_t> order_;        // (windows) this epoch's permutation
};

}  // namespace rackstep::exec
