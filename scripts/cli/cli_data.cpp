// `rackstep data build` tokenises text into shards; `rackstep data inspect`
// validates a dataset and prints its counts.
//
//   rackstep data build --default --out data/py              # Debian-shipped text, bytes
//   rackstep data build --default --out data/py-bpe --tokenizer bpe --vocab 1024
//   rackstep data build --from notes/ README.md --out data/notes --split blank-lines --json
//   rackstep data inspect data/py --json
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "exec/data.h"
#include "sim/base/check.h"
#include "scripts/cli/command.h"
#include "scripts/cli/flags.h"

namespace rackstep::exec {
namespace {

struct DataArgs {
  BuildOptions build;
  bool json = false;
  bool quiet = false;
  std::string inspect_dir;
  bool inspect_json = false;
};

nlohmann::json summary_json(const BuildSummary& s) {
  return {{"out_dir", s.out_dir},
          {"tokenizer", s.tokenizer},
          {"vocab_size", s.vocab_size},
          {"files", s.files},
          {"skipped_files", s.skipped_files},
          {"bytes", s.bytes},
          {"documents", {{"train", s.train_documents}, {"eval", s.eval_documents}}},
          {"tokens", {{"train", s.train_tokens}, {"eval", s.eval_tokens}}},
          {"shards", {{"train", s.train_shards}, {"eval", s.eval_shards}}},
          {"unigram_entropy_bits_per_token", s.unigram_entropy_bits_per_token},
          {"unigram_entropy_nats_per_token", s.unigram_entropy_nats_per_token},
          {"bytes_per_token", s.bytes_per_token},
          {"sources", s.sources}};
}

int run_build(DataArgs& a) {
  if (!a.quiet) {
    a.build.progress = [](const std::string& line) { std::fprintf(stderr, "data build: %s\n", line.c_str()); };
  }
  if (!a.build.use_default_corpus && a.build.from.empty()) {
    throw UserError("data build: expected --from <dir or files> or --default, found neither");
  }
  // The library names BuildOptions' fields; this command's user typed flags.
  const BuildSummary s = cli::flag_names({{"from", "--from"},
                                          {"out_dir", "--out"},
                                          {"tokenizer", "--tokenizer"},
                                          {"vocab_size", "--vocab"},
                                          {"shard_tokens", "--shard-tokens"},
                                          {"eval_fraction", "--eval-fraction"},
                                          {"split", "--split"}},
                                         [&] { return build_dataset(a.build); });
  if (a.json) {
    std::printf("%s\n", summary_json(s).dump(2).c_str());
    return 0;
  }
  std::printf("dataset        %s\n", s.out_dir.c_str());
  std::printf("tokenizer      %s, vocab %u\n", s.tokenizer.c_str(), s.vocab_size);
  std::printf("files          %lld read, %lld skipped (binary or empty), %.1f MiB\n", static_cast<long long>(s.files),
              static_cast<long long>(s.skipped_files), static_cast<double>(s.bytes) / (1 << 20));
  std::printf("%-14s %12s %12s %8s\n", "split", "documents", "tokens", "shards");
  std::printf("%-14s %12lld %12lld %8lld\n", "train", static_cast<long long>(s.train_documents),
              static_cast<long long>(s.train_tokens), static_cast<long long>(s.train_shards));
  std::printf("%-14s %12lld %12lld %8lld\n", "eval", static_cast<long long>(s.eval_documents),
              static_cast<long long>(s.eval_tokens), static_cast<long long>(s.eval_shards));
  std::printf("unigram entropy %.4f bits/token = %.4f nats/token (the loss a model must beat)\n",
              s.unigram_entropy_bits_per_token, s.unigram_entropy_nats_per_token);
  std::printf("bytes/token    %.3f\n", s.bytes_per_token);
  return 0;
}

int run_inspect(const DataArgs& a) {
  const DatasetInfo info = read_dataset_info(a.inspect_dir);
  // Reading every shard validates header, size and checksum of each.
  nlohmann::json splits = nlohmann::json::object();
  for (const auto& [name, shards] : {std::pair{"train", info.train_shards}, std::pair{"eval", info.eval_shards}}) {
    int64_t tokens = 0, docs = 0;
    for (const std::string& path : shards) {
      const Shard s = read_shard(path);
      tokens += static_cast<int64_t>(s.tokens.size());
      docs += static_cast<int64_t>(s.doc_starts.size());
    }
    if (tokens != (std::string(name) == "train" ? info.train_tokens : info.eval_tokens)) {
      throw UserError(a.inspect_dir + "/dataset.json", std::string("/") + name + "/tokens",
                      "the shards' total " + std::to_string(tokens), "a different count");
    }
    splits[name] = {{"shards", shards.size()}, {"tokens", tokens}, {"documents", docs}};
  }
  if (a.inspect_json) {
    std::printf("%s\n", nlohmann::json{{"dir", info.dir},
                                       {"tokenizer", info.tokenizer.kind()},
                                       {"vocab_size", info.tokenizer.vocab_size()},
                                       {"splits", splits},
                                       {"unigram_entropy_bits_per_token", info.unigram_entropy_bits_per_token},
                                       {"valid", true}}
                            .dump(2)
                            .c_str());
    return 0;
  }
  std::printf("dataset %s: %s tokenizer, vocab %u, all shards valid\n", info.dir.c_str(), info.tokenizer.kind().c_str(),
              info.tokenizer.vocab_size());
  for (const auto& [name, v] : splits.items()) {
    std::printf("  %-6s %3d shards %12lld tokens %8lld documents\n", name.c_str(), v["shards"].get<int>(),
                v["tokens"].get<long long>(), v["documents"].get<long long>());
  }
  std::printf("  unigram entropy %.4f bits/token\n", info.unigram_entropy_bits_per_token);
  return 0;
}

rackstep::cli::Registration reg{
    "data", "Build and inspect token-shard datasets for `rackstep train`", [](CLI::App& app) {
      auto a = std::make_shared<DataArgs>();
      app.require_subcommand(1);
      CLI::App* build = app.add_subcommand(
          "build",
          "Tokenise text into shards. Documents: one per file (--split file) or per blank-line-separated "
          "paragraph (--split blank-lines); each ends with the EOD token (id 0; files with NUL bytes are skipped as binary). Eval documents are "
          "picked by content hash.");
      build->add_option("--from", a->build.from, "text files or directories (recursed, sorted; binary files skipped)");
      build->add_flag("--default", a->build.use_default_corpus,
                      "use Debian-shipped text: /usr/share/common-licenses + /usr/lib/python3.N/**/*.py (no tests)");
      build->add_option("--out", a->build.out_dir, "dataset directory (created; may hold an earlier dataset)")
          ->required();
      build->add_option("--tokenizer", a->build.tokenizer, "byte or bpe")->check(CLI::IsMember({"byte", "bpe"}));
      build->add_option("--vocab", a->build.vocab_size, "bpe vocabulary size (256 + merges)");
      build->add_option("--shard-tokens", a->build.shard_tokens, "tokens per shard (documents are not split)");
      build->add_option("--eval-fraction", a->build.eval_fraction, "fraction of documents held out for eval");
      build->add_option("--split", a->build.split, "document rule: file or blank-lines")
          ->check(CLI::IsMember({"file", "blank-lines"}));
      build->add_flag("--json", a->json, "print the summary as JSON");
      build->add_flag("--quiet", a->quiet, "no progress lines on stderr");
      CLI::App* inspect = app.add_subcommand("inspect", "Validate every shard of a dataset and print its counts");
      inspect->add_option("dir", a->inspect_dir, "dataset directory")->required();
      inspect->add_flag("--json", a->inspect_json, "print as JSON");
      return [a, build] { return build->parsed() ? run_build(*a) : run_inspect(*a); };
    }};

}  // namespace
}  // namespace rackstep::exec
