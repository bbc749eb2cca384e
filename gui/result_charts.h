// The tables and chart specs drawn from `rackstep size --json` and `rackstep
// drops --json` results: one set of builders for the desktop viewer and the
// command line's size report (scripts/cli/cli_size.cpp), so a report picture and
// the viewer's chart are the same data. No Qt here (the `rackstep` binary links
// it where Qt is absent too). Unknown fields are ignored and missing optional
// fields leave gaps, so readers keep working while the commands' outputs grow.
//
//   SizingResult s = parse_sizing(nlohmann::ordered_json(size_result_json(r)), "size.json");
//   StackedBarSpec mem = memory_chart(s);    // device memory per GPU, one bar per candidate
//   ScatterSpec days = days_loss_chart(s);   // days to train vs forecast loss
//   HistogramSpec finish = finish_chart(s);  // the winner's finish-day samples
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "gui/chart_spec.h"

namespace rackstep::gui {

// A table: column names and rows of display text.
struct Table {
  std::vector<std::string> columns;
  std::vector<std::vector<std::string>> rows;
};

struct SizingCandidate {
  std::string name;
  std::vector<std::pair<std::string, std::string>> cells;  // JSON key -> display text (in the column's unit)
  std::vector<std::pair<std::string, double>> memory_gib;  // device memory part -> GiB per GPU
  std::vector<std::pair<std::string, double>> host_memory_gib;  // host parts ("host_*"), not on the HBM
  double device_memory_gib() const;  // the sum of memory_gib
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
  Table table;  // every scalar field, one row per candidate: human column names with units, verdict first
  std::vector<std::string> column_keys;  // the JSON key of each table column
};

// A JSON key as a column title with its unit ("peak_memory_bytes" -> "peak memory (GiB)"),
// and a value as text in that unit.
std::string column_title(const std::string& key);
std::string column_text(const std::string& key, const nlohmann::ordered_json& value);
// A fraction as the CLI prints percentages ("%.3f" of 100 * f): 1e-269 reads 0.000.
std::string percent_text(double fraction);

// Candidates come from a top-level array or from "candidates" / "results" /
// "ranking"; the memory breakdown from the first object under a key naming
// memory (parts ending in _bytes are bytes, _gib GiB; totals, peaks and
// capacities are not parts).
SizingResult parse_sizing(const nlohmann::ordered_json& doc, const std::string& path);
StackedBarSpec memory_chart(const SizingResult& s);
ScatterSpec days_loss_chart(const SizingResult& s);  // candidates with days and loss
// A candidate's finish-day samples with the deadline; `index` < 0 picks the
// winner (else the first candidate with samples). No samples when it has none.
HistogramSpec finish_chart(const SizingResult& s, int index = -1);

struct DropsResult {
  std::string sweep;       // the swept key, empty for one point
  std::string scenario;    // one line describing the fixed settings
  LineSpec chart;          // drop % per kind against the swept value
  Table table;
};
DropsResult parse_drops(const nlohmann::ordered_json& doc, const std::string& path);

}  // namespace rackstep::gui
