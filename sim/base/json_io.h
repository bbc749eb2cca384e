// Strict JSON reading with error messages that name file, JSON path, expected
// and found. Every config type in rackstep (models, topologies, layouts,
// scenarios, calibration) reads through JsonReader, so unknown keys, wrong
// types, missing keys and out-of-range numbers are reported the same way.
//
//   nlohmann::json doc = load_json_file("models/zoo/tiny.json");
//   JsonReader r(doc, "models/zoo/tiny.json");
//   int64_t d = r.integer("d_model", {.min = 1});          // required
//   double cf = r.number("capacity_factor", 1.25, {.min_exclusive = 0});
//   JsonReader attn = r.object("attention");
//   ...
//   attn.finish();  // any key not read is an error ("unknown key")
//   r.finish();
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "sim/base/check.h"

namespace rackstep {

// Nesting deeper than this is refused while parsing (the deepest shipped file
// nests 5 levels); nothing recursive ever sees a deeper value.
constexpr int kMaxJsonDepth = 64;

// Reads and parses a JSON file of at most kMaxJsonInputBytes (sim/base/file_io.h)
// nested at most kMaxJsonDepth deep; a missing file, a syntax error (with its
// byte offset), a number beyond double range (1e400) or a limit exceeded is a
// UserError naming the file.
nlohmann::json load_json_file(const std::string& path);
// The parsing half of load_json_file: `path` only names the text in errors.
nlohmann::json parse_json_text(const std::string& text, const std::string& path);

// Writes through sim/base/file_io.h's write_output_file: regular files are
// replaced atomically (temp file + fsync + rename) so a crash never leaves half
// a file; symlinks are followed; devices and FIFOs are written in place; a
// failed or short write is a UserError naming the file and the reason.
void write_json_file_atomic(const std::string& path, const nlohmann::json& doc, int indent = 2);
void write_text_file_atomic(const std::string& path, const std::string& text);

struct NumberRange {
  std::optional<double> min;            // value >= min
  std::optional<double> min_exclusive;  // value > min_exclusive
  std::optional<double> max;            // value <= max
};

class JsonReader {
 public:
  JsonReader(const nlohmann::json& obj, std::string file, std::string path = "");

  bool has(const std::string& key) const;
  // Required and optional readers. Each marks the key as read.
  int64_t integer(const std::string& key, NumberRange range = {});
  int64_t integer(const std::string& key, int64_t fallback, NumberRange range = {});
  double number(const std::string& key, NumberRange range = {});
  double number(const std::string& key, double fallback, NumberRange range = {});
  bool boolean(const std::string& key);
  bool boolean(const std::string& key, bool fallback);
  std::string string(const std::string& key);
  std::string string(const std::string& key, const std::string& fallback);
  // A string that must be one of `choices`.
  std::string choice(const std::string& key, const std::vector<std::string>& choices,
                     const std::string& fallback);
  std::vector<std::string> string_list(const std::string& key, std::vector<std::string> fallback);
  std::vector<int64_t> integer_list(const std::string& key, std::vector<int64_t> fallback);
  JsonReader object(const std::string& key);
  // An optional sub-object; an absent key reads as an empty object.
  JsonReader object_or_empty(const std::string& key);
  // Elements of an array of objects.
  std::vector<JsonReader> object_list(const std::string& key);
  // Marks a key as read without interpreting it (e.g. "source", "comment").
  void ignore(const std::string& key);

  // Errors on the first key that was never read.
  void finish() const;

  // Throws a UserError at this object's path (or at path/key).
  [[noreturn]] void fail(const std::string& key, const std::string& expected,
                         const std::string& found) const;

  const std::string& file() const { return file_; }
  const std::string& path() const { return path_; }
  std::string path_of(const std::string& key) const { return path_ + "/" + key; }
  const nlohmann::json& raw() const { return *obj_; }

 private:
  const nlohmann::json& at(const std::string& key);
  double checked_number(const std::string& key, const nlohmann::json& v, NumberRange range, bool as_count = false);

  const nlohmann::json* obj_;
  std::string file_;
  std::string path_;
  std::set<std::string> read_;
  // Empty object standing in for an absent optional sub-object.
  static const nlohmann::json& empty_object();
};

// Short description of a JSON value's type and content, for "found ..." text.
std::string describe_json(const nlohmann::json& v);

}  // namespace rackstep
