// Data: shard round trips and validation, tokenizers, the dataset builder and
// the loader's windows, document ids, determinism and held-out split.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>

#include "exec/data.h"
#include "exec/tokenizer.h"
#include "sim/base/check.h"
#include "tests/temp_dir.h"

using namespace rackstep::exec;
namespace fs = std::filesystem;

namespace {

void write_text(const std::string& path, const std::string& text) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream out(path, std::ios::binary);
  out << text;
}
std::string read_bytes(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

std::string shard_error(const std::string& path) {
  try {
    read_shard(path);
  } catch (const rackstep::UserError& e) {
    return e.what();
  }
  return "";
}

// Text files of varied lengths, deterministic.
void write_corpus(const fs::path& dir, int files) {
  for (int f = 0; f < files; ++f) {
    std::string text;
    for (int line = 0; line < 20 + 7 * f; ++line) {
      text += "def function_" + std::to_string(f) + "_" + std::to_string(line) + "(x):\n    return x * " +
              std::to_string(line % 9) + "\n";
    }
    char name[32];
    std::snprintf(name, sizeof name, "file%02d.py", f);
    write_text((dir / name).string(), text);
  }
}

}  // namespace

TEST_CASE("shards round-trip in uint16 and uint32", "[data][shard]") {
  TempDir dir("data", "roundtrip");
  for (uint32_t vocab : {257u, 70000u}) {
    CAPTURE(vocab);
    Shard s;
    s.vocab_size = vocab;
    s.tokens = {1, 2, 256, 5, vocab - 1, 7, 256};
    s.doc_starts = {0, 3};
    write_shard(dir.file("s.bin"), s);
    const Shard r = read_shard(dir.file("s.bin"));
    CHECK(r.vocab_size == vocab);
    CHECK(r.tokens == s.tokens);
    CHECK(r.doc_starts == s.doc_starts);
    const uint64_t dtype = vocab <= 65536 ? 2 : 4;
    CHECK(fs::file_size(dir.file("s.bin")) == kShardHeaderBytes + 7 * dtype + 2 * 8);
  }
}

TEST_CASE("corrupt and truncated shards are one clear error each", "[data][shard]") {
  TempDir dir("data", "bad");
  Shard s;
  s.vocab_size = 257;
  for (uint32_t i = 0; i < 1000; ++i) s.tokens.push_back(i % 256);
  s.tokens.push_back(256);
  s.doc_starts = {0};
  write_shard(dir.file("good.bin"), s);
  const std::string good = read_bytes(dir.file("good.bin"));
  auto write_variant = [&](const std::string& bytes) {
    std::ofstream(dir.file("bad.bin"), std::ios::binary | std::ios::trunc) << bytes;
    return shard_error(dir.file("bad.bin"));
  };

  std::string flipped = good;
  flipped[kShardHeaderBytes + 500] ^= 0x04;
  std::string err = write_variant(flipped);
  CHECK(err.find("bad.bin") != std::string::npos);
  CHECK(err.find("checksum") != std::string::npos);
  CHECK(err.find("corrupt") != std::string::npos);

  err = write_variant(good.substr(0, good.size() - 9));
  CHECK(err.find("truncated") != std::string::npos);
  CHECK(err.find(std::to_string(good.size())) != std::string::npos);  // what was expected

  err = write_variant(good.substr(0, 30));
  CHECK(err.find("truncated") != std::string::npos);

  std::string magic = good;
  magic[0] = 'X';
  CHECK(write_variant(magic).find("magic") != std::string::npos);

  std::string version = good;
  version[8] = 9;
  CHECK(write_variant(version).find("version 1") != std::string::npos);

  std::string dtype = good;
  dtype[12] = 3;
  CHECK(write_variant(dtype).find("dtype") != std::string::npos);

  CHECK(write_variant(good + "extra").find("bytes") != std::string::npos);
  CHECK(shard_error(dir.file("missing.bin")).find("cannot open") != std::string::npos);
  CHECK(shard_error(dir.file("good.bin")).empty());
}

TEST_CASE("pretokenize covers the text exactly", "[data][tokenizer]") {
  const std::string text = "def f(x):\n    return x  +  1  # comment\n\n\tclass A_b: pass é!";
  std::string joined;
  for (std::string_view c : pretokenize(text)) {
    CHECK(!c.empty());
    joined += c;
  }
  CHECK(joined == text);
  const auto chunks = pretokenize("hello world");
  REQUIRE(chunks.size() == 2);
  CHECK(chunks[1] == " world");
}

TEST_CASE("byte and BPE tokenizers round-trip; BPE compresses", "[data][tokenizer]") {
  Tokenizer bytes = Tokenizer::bytes();
  CHECK(bytes.vocab_size() == 256);
  CHECK(bytes.eod_id() == 0);
  const std::string text = "import os\nimport sys\n\ndef main():\n    print(os.getcwd(), sys.argv)\n";
  const auto ids = bytes.encode(text);
  CHECK(ids.size() == text.size());
  CHECK(bytes.decode(ids) == text);

  std::string corpus;
  for (int i = 0; i < 50; ++i) corpus += text + "# line " + std::to_string(i) + "\n";
  Tokenizer bpe = train_bpe({corpus}, 300);
  // Training stops early once no pair occurs twice; this corpus nearly fills 300.
  CHECK(bpe.vocab_size() <= 300);
  CHECK(bpe.vocab_size() > 280);
  const auto bids = bpe.encode(corpus);
  CHECK(bpe.decode(bids) == corpus);
  CHECK(bids.size() < corpus.size() / 2);
  for (uint32_t id : bids) CHECK(id < 300);
  // Unseen text still round-trips (bytes are always in the vocabulary).
  const std::string unseen = "zebra\x01\xff quux";
  CHECK(bpe.decode(bpe.encode(unseen)) == unseen);

  TempDir dir("data", "tok");
  bpe.save(dir.file("tokenizer.json"));
  Tokenizer loaded = Tokenizer::load(dir.file("tokenizer.json"));
  CHECK(loaded.merges() == bpe.merges());
  CHECK(loaded.encode(corpus) == bids);
  write_text(dir.file("bad.json"), R"({"kind": "bpe", "vocab_size": 257, "eod_id": 0, "merges": [[300, 1]]})");
  CHECK_THROWS_AS(Tokenizer::load(dir.file("bad.json")), rackstep::UserError);
}

TEST_CASE("build a dataset and load (batch, seq) windows with document ids", "[data][loader]") {
  TempDir dir("data", "build");
  write_corpus(dir.path / "src", 12);
  BuildOptions o;
  o.from = {(dir.path / "src").string()};
  o.out_dir = dir.file("ds");
  o.shard_tokens = 4096;  // several shards
  o.eval_fraction = 0.2;
  const BuildSummary s = build_dataset(o);
  CHECK(s.files == 12);
  CHECK(s.train_documents + s.eval_documents == 12);
  CHECK(s.eval_documents >= 1);
  CHECK(s.train_shards > 1);
  CHECK(s.train_tokens + s.eval_tokens == s.bytes + 12);  // bytes + one EOD per document

  const int64_t seq = 64;
  TokenLoader a(o.out_dir, Split::kTrain, seq, 7);
  CHECK(a.tokens() == s.train_tokens);
  CHECK(a.documents() == s.train_documents);
  CHECK(a.windows() == (a.tokens() - 1) / seq);

  const Batch b = a.next_batch(4);
  REQUIRE(b.inputs.size() == 4 * seq);
  for (int64_t r = 0; r < 4; ++r) {
    for (int64_t j = 0; j + 1 < seq; ++j) {
      CHECK(b.targets[r * seq + j] == b.inputs[r * seq + j + 1]);
      // A new document starts exactly after an end-of-document token.
      const bool new_doc = b.doc_ids[r * seq + j + 1] != b.doc_ids[r * seq + j];
      CHECK(new_doc == (b.inputs[r * seq + j] == static_cast<int32_t>(Tokenizer::kEodId)));
      if (new_doc) CHECK(b.doc_ids[r * seq + j + 1] == b.doc_ids[r * seq + j] + 1);
    }
  }

  // Deterministic for a seed; another seed gives another order.
  TokenLoader same(o.out_dir, Split::kTrain, seq, 7), other(o.out_dir, Split::kTrain, seq, 8);
  CHECK(same.next_batch(4).inputs == b.inputs);
  CHECK(other.next_batch(4).inputs != b.inputs);

  // An epoch serves every window once: the same multiset as the windows in file order.
  TokenLoader epoch(o.out_dir, Split::kTrain, seq, 3);
  std::multiset<std::vector<int32_t>> served, all;
  const int64_t per_epoch = epoch.windows();
  for (int64_t i = 0; i < per_epoch; ++i) served.insert(epoch.next_batch(1).inputs);
  for (int64_t i = 0; i < per_epoch; ++i) all.insert(epoch.eval_batch(i, 1).inputs);
  CHECK(served == all);
  CHECK(epoch.position().epoch == 0);
  CHECK(epoch.position().cursor == static_cast<uint64_t>(per_epoch));
  epoch.next_batch(1);
  CHECK(epoch.position().epoch == 1);

  // Restoring a position continues the stream exactly.
  TokenLoader x(o.out_dir, Split::kTrain, seq, 5);
  for (int i = 0; i < 3; ++i) x.next_batch(2);
  const DataPosition p = x.position();
  const Batch expect = x.next_batch(2);
  TokenLoader y(o.out_dir, Split::kTrain, seq, 5);
  y.set_position(p);
  CHECK(y.next_batch(2).inputs == expect.inputs);
  CHECK_THROWS_AS(y.set_position({6, 0, 0}), rackstep::UserError);

  // Ranks of a data-parallel world get disjoint slices of the same global batch.
  TokenLoader r0(o.out_dir, Split::kTrain, seq, 9), r1(o.out_dir, Split::kTrain, seq, 9), whole(o.out_dir, Split::kTrain, seq, 9);
  const Batch g = whole.next_batch(4);
  const Batch b0 = r0.next_batch(2, 0, 2), b1 = r1.next_batch(2, 1, 2);
  CHECK(std::equal(b0.inputs.begin(), b0.inputs.end(), g.inputs.begin()));
  CHECK(std::equal(b1.inputs.begin(), b1.inputs.end(), g.inputs.begin() + 2 * seq));
  CHECK(r0.position().cursor == whole.position().cursor);

  // The held-out split: other documents, sequential windows.
  TokenLoader ev(o.out_dir, Split::kEval, 16, 7);
  CHECK(ev.tokens() == s.eval_tokens);
  REQUIRE(ev.eval_batches(2) >= 1);
  const Batch e0 = ev.eval_batch(0, 2);
  CHECK(e0.doc_ids[0] == 0);
  CHECK(ev.eval_batch(0, 2).inputs == e0.inputs);
  CHECK_THROWS_AS(TokenLoader(o.out_dir, Split::kEval, 1 << 20, 7), rackstep::UserError);
}

TEST_CASE("unigram entropy and blank-line documents", "[data][build]") {
  TempDir dir("data", "entropy");
  write_text(dir.file("src/a.txt"), "abab");
  BuildOptions o;
  o.from = {dir.file("src")};
  o.out_dir = dir.file("ds");
  o.eval_fraction = 0;
  const BuildSummary s = build_dataset(o);
  // Tokens a b a b EOD: p = 0.4, 0.4, 0.2.
  const double h = -(2 * 0.4 * std::log2(0.4) + 0.2 * std::log2(0.2));
  CHECK(s.unigram_entropy_bits_per_token == Approx(h));
  CHECK(s.unigram_entropy_nats_per_token == Approx(h * std::log(2.0)));
  CHECK(read_dataset_info(o.out_dir).unigram_entropy_bits_per_token == Approx(h));

  write_text(dir.file("para/p.txt"), "first para\nline two\n\n  \nsecond\n\n\nthird\n");
  o.from = {dir.file("para")};
  o.out_dir = dir.file("ds2");
  o.split = "blank-lines";
  CHECK(build_dataset(o).train_documents == 3);

  // Binary files are skipped; an unrelated non-empty directory is not overwritten.
  write_text(dir.file("mixed/bin.dat"), std::string("ab\0cd", 5));
  write_text(dir.file("mixed/t.txt"), "text");
  o.from = {dir.file("mixed")};
  o.out_dir = dir.file("ds3");
  o.split = "file";
  const BuildSummary m = build_dataset(o);
  CHECK(m.files == 1);
  CHECK(m.skipped_files == 1);
  o.out_dir = dir.file("src");
  CHECK_THROWS_AS(build_dataset(o), rackstep::UserError);
  CHECK(read_bytes(dir.file("src/a.txt")) == "abab");
}

TEST_CASE("the default corpus is Debian-shipped text of several MB", "[data][default]") {
  std::vector<std::string> roots;
  const std::vector<std::string> files = default_corpus_files(&roots);
  CHECK(files.size() > 300);
  uint64_t bytes = 0;
  bool has_os = false;
  for (const std::string& f : files) {
    bytes += fs::file_size(f);
    has_os = has_os || (f.size() >= 6 && f.substr(f.size() - 6) == "/os.py");
    CHECK(f.find("/test/") == std::string::npos);
    CHECK(f.find("__pycache__") == std::string::npos);
  }
  CHECK(has_os);
  CHECK(bytes > 4u << 20);
}
