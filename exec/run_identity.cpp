#include "exec/run_identity.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>

#include "exec/arena.h"
#include "exec/checkpoint.h"
#include "sim/base/check.h"
#include "sim/base/file_io.h"
#include "sim/base/json_io.h"

namespace rackstep::exec {

namespace fs = std::filesystem;

namespace {

std::string hex64(uint64_t v) {
  char b[32];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(v));
  return b;
}

// A shard's header: magic, version, dtype, counts, vocabulary and the checksum
// of its contents (read_shard checks the contents against it when loading).
std::string shard_header(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UserError(path, "", "a readable token shard", "cannot open it");
  std::string head(kShardHeaderBytes, '\0');
  in.read(head.data(), static_cast<std::streamsize>(head.size()));
  if (in.gcount() != static_cast<std::streamsize>(head.size())) {
    throw UserError(path, "", "a token shard of at least 64 bytes", std::to_string(in.gcount()) + " bytes");
  }
  return head;
}

}  // namespace

nlohmann::json dataset_identity(const DatasetInfo& info) {
  Checksum64 sum(0x5253444154415345ULL);  // "RSDATASE"
  auto add_split = [&](const char* split, const std::vector<std::string>& shards) {
    sum.update(split, std::char_traits<char>::length(split) + 1);
    for (const std::string& path : shards) {
      const std::string name = fs::path(path).filename().string();
      sum.update(name.data(), name.size() + 1);
      const std::string head = shard_header(path);
      sum.update(head.data(), head.size());
    }
  };
  add_split("train", info.train_shards);
  add_split("eval", info.eval_shards);
  const std::string manifest_path = (fs::path(info.dir) / "dataset.json").string();
  const nlohmann::json manifest = load_json_file(manifest_path);
  const std::string tok_path = (fs::path(info.dir) / manifest.value("tokenizer", "tokenizer.json")).string();
  const std::string tok = read_input_file(tok_path, kMaxJsonInputBytes, "a tokenizer file");
  const uint64_t tok_digest = checksum64(tok.data(), tok.size());
  sum.update(&tok_digest, sizeof tok_digest);
  return {{"digest", hex64(sum.value())},
          {"train_shards", info.train_shards.size()},
          {"eval_shards", info.eval_shards.size()},
          {"train_tokens", info.train_tokens},
          {"eval_tokens", info.eval_tokens},
          {"tokenizer", info.tokenizer.kind()},
          {"tokenizer_digest", hex64(tok_digest)},
          {"vocab_size", info.tokenizer.vocab_size()}};
}

nlohmann::json run_identity(nlohmann::json dataset, nlohmann::json layout) {
  return {{"dataset", std::move(dataset)}, {"layout", std::move(layout)}};
}

std::vector<std::string> identity_differences(const nlohmann::json& saved, const nlohmann::json& now,
                                              const std::string& data_dir) {
  std::vector<std::string> out;
  auto compare = [&](const char* section, const char* key, const std::string& label) {
    const nlohmann::json& a = saved.contains(section) ? saved[section] : nlohmann::json();
    const nlohmann::json& b = now[section];
    const nlohmann::json was = a.is_object() && a.contains(key) ? a[key] : nlohmann::json();
    const nlohmann::json is = b.contains(key) ? b[key] : nlohmann::json();
    if (was != is) out.push_back(label + " " + was.dump() + " (checkpoint) vs " + is.dump() + " (this run)");
  };
  for (const char* k : {"tokenizer", "vocab_size", "tokenizer_digest", "train_shards", "eval_shards", "train_tokens",
                        "eval_tokens"}) {
    compare("dataset", k, std::string("dataset ") + k);
  }
  // The digest last: when only it differs, some shard holds other tokens.
  compare("dataset", "digest", "dataset digest (shard headers + contents' checksums, --data " + data_dir + ")");
  if (now.contains("layout")) {
    for (auto it = now["layout"].begin(); it != now["layout"].end(); ++it) {
      compare("layout", it.key().c_str(), "layout " + it.key());
    }
  }
  return out;
}

std::vector<std::string> checkpoints_newest_first(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  if (dir.empty() || !fs::is_directory(dir, ec)) return out;
  static const std::regex kName(R"(ckpt-(\d{8})\.rsck)");
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (std::regex_match(name, kName)) out.push_back(e.path().string());
  }
  // Names sort by step: eight zero-padded digits.
  std::sort(out.begin(), out.end(), [](const std::string& a, const std::string& b) {
    return fs::path(a).filename() > fs::path(b).filename();
  });
  return out;
}

std::string newest_valid_checkpoint(const std::string& dir, const std::function<void(const std::string&)>& note) {
  const std::vector<std::string> all = checkpoints_newest_first(dir);
  std::vector<std::string> failures;
  for (const std::string& path : all) {
    try {
      read_checkpoint_info(path);
    } catch (const UserError& e) {
      failures.push_back(e.what());
      continue;
    }
    for (const std::string& f : failures) note("skipping an unusable checkpoint: " + f);
    if (!failures.empty()) note("resuming from the newest valid checkpoint, " + path);
    return path;
  }
  if (all.empty()) return "";
  std::string all_failures;
  for (const std::string& f : failures) all_failures += (all_failures.empty() ? "" : "; ") + f;
  throw UserError(dir, "", "a valid checkpoint to resume from", "none of " + std::to_string(all.size()) +
                                                                   " is usable: " + all_failures);
}

}  // namespace rackstep::exec
