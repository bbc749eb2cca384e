// The result files the viewer opens, read defensively: which kind a JSON file
// is (a Chrome trace, a `rackstep size --json` sizing result, a `rackstep
// drops --json` drop sweep), and the tables and chart specs drawn from them.
// Unknown fields are ignored and missing optional fields leave gaps, so the
// viewer keeps working while the commands' outputs grow.
//
//   nlohmann::ordered_json doc = read_json_file(path);  // keys in file order
//   if (detect_kind(doc, path) == FileKind::sizing) {
//     SizingResult s = parse_sizing(doc, path);
//     render_stacked_bars(memory_chart(s), "memory.png");
//   }
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "gui/charts.h"

namespace rackstep::gui {

enum class FileKind { trace, sizing, drops };

// Reads and parses a JSON file; throws rackstep::UserError naming the file.
nlohmann::ordered_json read_json_file(const std::string& path);
FileKind detect_kind(const nlohmann::ordered_json& doc, const std::string& path);

// A table: column names and rows of display text.
struct Table {
  std::vector<std::string> columns;
  std::vector<std::vector<std::string>> rows;
};

struct SizingCandidate {
  std::string name;
  std::vector<std::pair<std::string, std::string>> cells;  // column -> text
  std::vector<std::pair<std::string, double>> memory_gib;  // part -> GiB per GPU
  double hbm_gib = kNone;   // capacity per GPU, when the file gives it
  double days = kNone;      // days to the token budget
  double loss = kNone;      // forecast loss
  double p_finish = kNone;  // P(finish by the deadline)
  std::vector<double> finish_days;  // Monte Carlo samples of days to finish ("finish_days")
  bool winner = false;
};

struct SizingResult {
  std::vector<SizingCandidate> candidates;  // in file order (the ranking)
  double deadline_days = kNone;
  Table table;  // every scalar field, one row per candidate
};

// Candidates come from a top-level array or from "candidates" / "results" /
// "ranking"; the memory breakdown from the first object under a key naming
// memory (parts ending in _bytes are bytes, _gib GiB; totals, peaks and
// capacities are not parts).
SizingResult parse_sizing(const nlohmann::ordered_json& doc, const std::string& path);
StackedBarSpec memory_chart(const SizingResult& s);
ScatterSpec days_loss_chart(const SizingResult& s);  // candidates with days and loss
// The winner's (else the first candidate's) finish-day samples; no samples when none has them.
HistogramSpec finish_chart(const SizingResult& s);

struct DropsResult {
  std::string sweep;       // the swept key, empty for one point
  std::string scenario;    // one line describing the fixed settings
  LineSpec chart;          // drop % per kind against the swept value
  Table table;
};
DropsResult parse_drops(const nlohmann::ordered_json& doc, const std::string& path);

}  // namespace rackstep::gui
