#include "sim/base/json_io.h"

#include <cmath>
#include <cstdio>
#include <filesystem>

#include "sim/base/file_io.h"

namespace rackstep {

namespace {

// Thrown by the parse callback past kMaxJsonDepth; the parser stops there, so a
// file nested 100,000 deep is refused before any deep recursion can happen.
struct TooDeep {};

}  // namespace

nlohmann::json load_json_file(const std::string& path) {
  return parse_json_text(read_input_file(path, kMaxJsonInputBytes, "a readable JSON file"), path);
}

nlohmann::json parse_json_text(const std::string& text, const std::string& path) {
  const nlohmann::json::parser_callback_t limit_depth = [](int depth, nlohmann::json::parse_event_t event,
                                                            nlohmann::json&) {
    if ((event == nlohmann::json::parse_event_t::object_start ||
         event == nlohmann::json::parse_event_t::array_start) &&
        depth >= kMaxJsonDepth) {
      throw TooDeep{};
    }
    return true;
  };
  try {
    return nlohmann::json::parse(text, limit_depth);
  } catch (const TooDeep&) {
    throw UserError(path, "", "JSON nested at most " + std::to_string(kMaxJsonDepth) + " levels deep",
                    "deeper nesting");
  } catch (const nlohmann::json::parse_error& e) {
    throw UserError(path, "", "valid JSON", "a syntax error at byte " + std::to_string(e.byte));
  } catch (const nlohmann::json::out_of_range&) {
    // 406: a number beyond double range, e.g. 1e400.
    throw UserError(path, "", "numbers within double range (|x| < 1.8e308)", "a number that overflows");
  } catch (const nlohmann::json::exception& e) {
    throw UserError(path, "", "valid JSON", e.what());
  }
}

void write_text_file_atomic(const std::string& path, const std::string& text) {
  write_output_file(path, {{text.data(), text.size()}});
}

void write_json_file_atomic(const std::string& path, const nlohmann::json& doc, int indent) {
  write_text_file_atomic(path, doc.dump(indent) + "\n");
}

namespace {

// Compact JSON text of v, stopping once `out` passes `limit` characters and
// never descending more than a few levels: bounded time and stack for any value.
void brief(const nlohmann::json& v, int depth, size_t limit, std::string& out) {
  if (out.size() > limit) return;
  if (!v.is_structured()) {
    if (v.is_string() && v.get_ref<const std::string&>().size() > limit) {
      out += nlohmann::json(v.get_ref<const std::string&>().substr(0, limit)).dump();
      return;
    }
    out += v.dump();
    return;
  }
  if (depth >= 4) {
    out += v.is_array() ? "[...]" : "{...}";
    return;
  }
  out += v.is_array() ? '[' : '{';
  bool first = true;
  for (auto it = v.begin(); it != v.end() && out.size() <= limit; ++it) {
    if (!first) out += ',';
    first = false;
    if (v.is_object()) out += nlohmann::json(it.key()).dump() + ':';
    brief(*it, depth + 1, limit, out);
  }
  out += v.is_array() ? ']' : '}';
}

}  // namespace

std::string describe_json(const nlohmann::json& v) {
  // Never a full dump(): the value may be huge or nested 100,000 deep.
  std::string s;
  brief(v, 0, 40, s);
  if (s.size() > 40) s = s.substr(0, 37) + "...";
  switch (v.type()) {
    case nlohmann::json::value_t::string: return "string " + s;
    case nlohmann::json::value_t::boolean: return "boolean " + s;
    case nlohmann::json::value_t::array: return "array " + s;
    case nlohmann::json::value_t::object: return "object " + s;
    case nlohmann::json::value_t::null: return "null";
    default: return s;
  }
}

const nlohmann::json& JsonReader::empty_object() {
  static const nlohmann::json e = nlohmann::json::object();
  return e;
}

JsonReader::JsonReader(const nlohmann::json& obj, std::string file, std::string path)
    : obj_(&obj), file_(std::move(file)), path_(std::move(path)) {
  if (!obj.is_object()) {
    throw UserError(file_, path_.empty() ? "/" : path_, "an object", describe_json(obj));
  }
}

bool JsonReader::has(const std::string& key) const { return obj_->contains(key); }

void JsonReader::fail(const std::string& key, const std::string& expected,
                      const std::string& found) const {
  throw UserError(file_, key.empty() ? (path_.empty() ? "/" : path_) : path_of(key), expected,
                  found);
}

const nlohmann::json& JsonReader::at(const std::string& key) {
  read_.insert(key);
  auto it = obj_->find(key);
  if (it == obj_->end()) fail(key, "a value (required key)", "nothing");
  return *it;
}

double JsonReader::checked_number(const std::string& key, const nlohmann::json& v,
                                  NumberRange range, bool as_count) {
  if (!v.is_number()) fail(key, "a number", describe_json(v));
  double x = v.get<double>();
  if (!std::isfinite(x)) fail(key, "a finite number", describe_json(v));
  auto fmt = [](double d) {
    char buf[64];
    // Whole numbers in full (a limit of 16777216 reads better than 1.67772e+07).
    if (std::floor(d) == d && std::fabs(d) < 1e15) {
      std::snprintf(buf, sizeof buf, "%.0f", d);
    } else {
      std::snprintf(buf, sizeof buf, "%g", d);
    }
    return std::string(buf);
  };
  if (range.min && x < *range.min) fail(key, "a number >= " + fmt(*range.min), fmt(x));
  if (range.min_exclusive && x <= *range.min_exclusive)
    fail(key, "a number > " + fmt(*range.min_exclusive), fmt(x));
  // Integer maxima bound memory or time: stated as a limit.
  if (range.max && x > *range.max) fail(key, (as_count ? "at most " : "a number <= ") + fmt(*range.max), fmt(x));
  return x;
}

int64_t JsonReader::integer(const std::string& key, NumberRange range) {
  const auto& v = at(key);
  if (!v.is_number_integer() &&
      !(v.is_number_float() && std::floor(v.get<double>()) == v.get<double>() &&
        std::fabs(v.get<double>()) < 9e15)) {
    fail(key, "an integer", describe_json(v));
  }
  return static_cast<int64_t>(checked_number(key, v, range, /*as_count=*/true));
}

int64_t JsonReader::integer(const std::string& key, int64_t fallback, NumberRange range) {
  if (!has(key)) {
    read_.insert(key);
    return fallback;
  }
  return integer(key, range);
}

double JsonReader::number(const std::string& key, NumberRange range) {
  return checked_number(key, at(key), range);
}

double JsonReader::number(const std::string& key, double fallback, NumberRange range) {
  if (!has(key)) {
    read_.insert(key);
    return fallback;
  }
  return number(key, range);
}

bool JsonReader::boolean(const std::string& key) {
  const auto& v = at(key);
  if (!v.is_boolean()) fail(key, "true or false", describe_json(v));
  return v.get<bool>();
}

bool JsonReader::boolean(const std::string& key, bool fallback) {
  if (!has(key)) {
    read_.insert(key);
    return fallback;
  }
  return boolean(key);
}

std::string JsonReader::string(const std::string& key) {
  const auto& v = at(key);
  if (!v.is_string()) fail(key, "a string", describe_json(v));
  return v.get<std::string>();
}

std::string JsonReader::string(const std::string& key, const std::string& fallback) {
  if (!has(key)) {
    read_.insert(key);
    return fallback;
  }
  return string(key);
}

std::string JsonReader::choice(const std::string& key, const std::vector<std::string>& choices,
                               const std::string& fallback) {
  std::string s = string(key, fallback);
  for (const auto& c : choices) {
    if (c == s) return s;
  }
  std::string expected = "one of";
  for (size_t i = 0; i < choices.size(); ++i) expected += (i ? ", " : " ") + choices[i];
  fail(key, expected, "\"" + s + "\"");
}

std::vector<std::string> JsonReader::string_list(const std::string& key,
                                                 std::vector<std::string> fallback) {
  if (!has(key)) {
    read_.insert(key);
    return fallback;
  }
  const auto& v = at(key);
  if (!v.is_array()) fail(key, "an array of strings", describe_json(v));
  std::vector<std::string> out;
  for (size_t i = 0; i < v.size(); ++i) {
    if (!v[i].is_string()) fail(key + "/" + std::to_string(i), "a string", describe_json(v[i]));
    out.push_back(v[i].get<std::string>());
  }
  return out;
}

std::vector<int64_t> JsonReader::integer_list(const std::string& key,
                                              std::vector<int64_t> fallback) {
  if (!has(key)) {
    read_.insert(key);
    return fallback;
  }
  const auto& v = at(key);
  if (!v.is_array()) fail(key, "an array of integers", describe_json(v));
  std::vector<int64_t> out;
  for (size_t i = 0; i < v.size(); ++i) {
    if (!v[i].is_number_integer())
      fail(key + "/" + std::to_string(i), "an integer", describe_json(v[i]));
    out.push_back(v[i].get<int64_t>());
  }
  return out;
}

JsonReader JsonReader::object(const std::string& key) {
  const auto& v = at(key);
  if (!v.is_object()) fail(key, "an object", describe_json(v));
  return JsonReader(v, file_, path_of(key));
}

JsonReader JsonReader::object_or_empty(const std::string& key) {
  if (!has(key)) {
    read_.insert(key);
    return JsonReader(empty_object(), file_, path_of(key));
  }
  return object(key);
}

std::vector<JsonReader> JsonReader::object_list(const std::string& key) {
  const auto& v = at(key);
  if (!v.is_array()) fail(key, "an array of objects", describe_json(v));
  std::vector<JsonReader> out;
  for (size_t i = 0; i < v.size(); ++i) {
    out.emplace_back(v[i], file_, path_of(key) + "/" + std::to_string(i));
  }
  return out;
}

void JsonReader::ignore(const std::string& key) { read_.insert(key); }

void JsonReader::finish() const {
  for (auto it = obj_->begin(); it != obj_->end(); ++it) {
    if (!read_.count(it.key())) fail(it.key(), "a known key", "unknown key \"" + it.key() + "\"");
  }
}

}  // namespace rackstep
