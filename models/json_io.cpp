#include "models/json_io.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace rackstep {

nlohmann::json load_json_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    throw UserError(path, "", "a readable JSON file",
                    std::filesystem::exists(path) ? "a file that cannot be read" : "no such file");
  }
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    return nlohmann::json::parse(ss.str());
  } catch (const nlohmann::json::parse_error& e) {
    throw UserError(path, "", "valid JSON",
                    "a syntax error at byte " + std::to_string(e.byte));
  }
}

void write_text_file_atomic(const std::string& path, const std::string& text) {
  std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw UserError(path, "", "a writable path", "cannot create " + tmp);
    out << text;
    out.flush();
    if (!out) throw UserError(path, "", "a writable path", "a write error");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) throw UserError(path, "", "a writable path", "rename failed: " + ec.message());
}

void write_json_file_atomic(const std::string& path, const nlohmann::json& doc, int indent) {
  write_text_file_atomic(path, doc.dump(indent) + "\n");
}

std::string describe_json(const nlohmann::json& v) {
  std::string s = v.dump();
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
                                  NumberRange range) {
  if (!v.is_number()) fail(key, "a number", describe_json(v));
  double x = v.get<double>();
  if (!std::isfinite(x)) fail(key, "a finite number", describe_json(v));
  auto fmt = [](double d) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%g", d);
    return std::string(buf);
  };
  if (range.min && x < *range.min) fail(key, "a number >= " + fmt(*range.min), fmt(x));
  if (range.min_exclusive && x <= *range.min_exclusive)
    fail(key, "a number > " + fmt(*range.min_exclusive), fmt(x));
  if (range.max && x > *range.max) fail(key, "a number <= " + fmt(*range.max), fmt(x));
  return x;
}

int64_t JsonReader::integer(const std::string& key, NumberRange range) {
  const auto& v = at(key);
  if (!v.is_number_integer() &&
      !(v.is_number_float() && std::floor(v.get<double>()) == v.get<double>() &&
        std::fabs(v.get<double>()) < 9e15)) {
    fail(key, "an integer", describe_json(v));
  }
  return static_cast<int64_t>(checked_number(key, v, range));
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
