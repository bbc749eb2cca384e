// What a checkpoint must share with the invocation that resumes it, beyond
// the model (whose fingerprint the checkpoint header holds): the dataset and
// the layout. Stored as a small JSON section of the checkpoint
// (exec/checkpoint.h, version 2) and compared on `train --resume`.
//
// Dataset identity: a digest over every shard's 64-byte header in split order
// (magic, counts, vocabulary and the checksum of the shard's contents, which
// read_shard verifies against the bytes) with its file name, and over the
// tokenizer file's bytes. Moving the directory keeps the identity; swapping
// one shard for a valid shard of another dataset, rebuilding with another
// tokenizer, or pointing --data elsewhere changes it.
//
//   nlohmann::json id = run_identity(dataset_identity(info), layout_identity(...));
//   std::vector<std::string> diff = identity_differences(saved, id);  // "" when equal
//   // resume: the newest checkpoint that validates, with a note for each skipped one
//   std::string ckpt = newest_valid_checkpoint("runs/tiny", [](const std::string& note) { ... });
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "exec/data.h"

namespace rackstep::exec {

// {"digest", "train_shards", "eval_shards", "train_tokens", "eval_tokens", "tokenizer", "vocab_size"}
nlohmann::json dataset_identity(const DatasetInfo& info);

// The identity section: {"dataset": ..., "layout": ...} (layout: the settings
// that decide what a step computes: batch, seq, dispatch).
nlohmann::json run_identity(nlohmann::json dataset, nlohmann::json layout);

// One line per difference ("dataset digest 1a2b... (checkpoint) vs 3c4d... (--data D)"), empty when equal.
std::vector<std::string> identity_differences(const nlohmann::json& saved, const nlohmann::json& now,
                                              const std::string& data_dir);

// ckpt-*.rsck in dir, newest first.
std::vector<std::string> checkpoints_newest_first(const std::string& dir);

// The newest checkpoint of dir whose file validates (size, magic, version,
// checksum); `note` hears one line for each newer one skipped and why. A
// UserError listing every failure when none validates; "" when there is none.
std::string newest_valid_checkpoint(const std::string& dir, const std::function<void(const std::string&)>& note);

}  // namespace rackstep::exec
