// Result files read defensively for the viewer; see gui/result_files.h.
#include "gui/result_files.h"

#include <fstream>
#include <sstream>

#include "gui/trace_model.h"
#include "sim/base/check.h"

namespace rackstep::gui {

using json = nlohmann::ordered_json;

json read_json_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UserError(path, "", "a readable JSON file", "it cannot be opened");
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    return json::parse(ss.str());
  } catch (const json::parse_error& e) {
    throw UserError(path, "", "valid JSON", "a syntax error at byte " + std::to_string(e.byte));
  }
}

json read_trace_json(const std::string& path) { return parse_json_text(read_maybe_gzip(path), path); }

json parse_json_text(const std::string& text, const std::string& path) {
  try {
    return json::parse(text);
  } catch (const json::parse_error& e) {
    throw UserError(path, "", "valid JSON", "a syntax error at byte " + std::to_string(e.byte));
  }
}

FileKind detect_kind(const json& doc, const std::string& path) {
  if (looks_like_trace(doc)) return FileKind::trace;
  if (doc.is_object() && doc.contains("points")) return FileKind::drops;
  if (doc.is_array() && !doc.empty() && doc.front().is_object()) return FileKind::sizing;
  if (doc.is_object()) {
    for (const char* k : {"candidates", "results", "ranking"}) {
      if (doc.contains(k)) return FileKind::sizing;
    }
  }
  throw UserError(path, "",
                  "a Chrome trace (\"traceEvents\"), a sizing result (\"candidates\") or a drops result (\"points\")",
                  doc.is_object() ? "an object with none of these" : "a JSON " + std::string(doc.type_name()));
}

}  // namespace rackstep::gui
