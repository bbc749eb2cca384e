// The result files the viewer opens, read defensively: which kind a JSON file
// is (a Chrome trace, a `rackstep size --json` sizing result, a `rackstep
// drops --json` drop sweep). The tables and chart specs drawn from the sizing
// and drops results are in gui/result_charts.h.
//
//   nlohmann::ordered_json doc = read_json_file(path);  // keys in file order
//   if (detect_kind(doc, path) == FileKind::sizing) {
//     SizingResult s = parse_sizing(doc, path);
//     render_stacked_bars(memory_chart(s), "memory.png");
//   }
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "gui/result_charts.h"

namespace rackstep::gui {

enum class FileKind { trace, sizing, drops };

// Reads and parses a JSON file; throws rackstep::UserError naming the file.
nlohmann::ordered_json read_json_file(const std::string& path);
// The same for a file that may be gzipped (a .json.gz trace).
nlohmann::ordered_json read_trace_json(const std::string& path);
// Parses JSON text; throws rackstep::UserError naming `path` and the byte of a syntax error.
nlohmann::ordered_json parse_json_text(const std::string& text, const std::string& path);
FileKind detect_kind(const nlohmann::ordered_json& doc, const std::string& path);

}  // namespace rackstep::gui
