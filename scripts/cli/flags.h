// Validators for numeric command-line flags. CLI11's own Range lets NaN through
// (every comparison with NaN is false) and says nothing about why a bound
// exists; these refuse NaN and infinities and state the bound as "at most N",
// so a bad value is one clear line with exit status 2 before any work starts.
//
//   app.add_option("--top", a->top, "...")->check(cli::count(1, 100000));
//   app.add_option("--step-time-s", a->req.step_time_s, "...")->check(cli::positive(1e7));
//   app.add_option("--min-p-finish", a->p, "...")->check(cli::number(0, 1));
#pragma once

#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "sim/base/value_error.h"

namespace rackstep::cli {

namespace detail {

inline std::string fmt(double v) {
  char b[48];
  // Whole numbers in full: "at most 1000000", not "at most 1e+06".
  if (std::floor(v) == v && std::fabs(v) < 1e15) {
    std::snprintf(b, sizeof b, "%.0f", v);
  } else {
    std::snprintf(b, sizeof b, "%g", v);
  }
  return b;
}

}  // namespace detail

// A finite number in [min, max] (or (min, max] with min_exclusive).
inline CLI::Validator number(double min, double max, bool min_exclusive = false) {
  const std::string lo = detail::fmt(min), hi = detail::fmt(max);
  const std::string expected = min_exclusive ? "a number > " + lo + " and at most " + hi
                                             : "a number from " + lo + " to at most " + hi;
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        double v = 0;
        if (!CLI::detail::lexical_cast(text, v)) return "expected " + expected + ", found \"" + text + "\"";
        if (!std::isfinite(v)) return "expected " + expected + " (finite), found " + text;
        if (v < min || v > max || (min_exclusive && v == min)) return "expected " + expected + ", found " + text;
        return "";
      },
      min_exclusive ? "NUMBER in (" + lo + ", " + hi + "]" : "NUMBER in [" + lo + ", " + hi + "]");
}

// A finite number > 0 and at most max.
inline CLI::Validator positive(double max) { return number(0, max, /*min_exclusive=*/true); }

// An integer in [min, max].
inline CLI::Validator count(int64_t min, int64_t max) {
  const std::string expected = "an integer from " + std::to_string(min) + " to at most " + std::to_string(max);
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        int64_t v = 0;
        if (!CLI::detail::lexical_cast(text, v)) return "expected " + expected + ", found \"" + text + "\"";
        if (v < min || v > max) return "expected " + expected + ", found " + text;
        return "";
      },
      "INT in [" + std::to_string(min) + ", " + std::to_string(max) + "]");
}

// Runs f(); a ValueError about one of `flag_of`'s quantities comes back
// naming the flag that set it. Library code names quantities, not flags
// (sim/base/value_error.h), so a command that takes a quantity as a flag says
// which flag was wrong:
//
//   GoodputResult r = cli::flag_names({{"step_time_s", "--step-time-s"}}, [&] { return simulate_goodput(req, cfg); });
template <class F>
auto flag_names(const std::vector<std::pair<std::string, std::string>>& flag_of, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const ValueError& e) {
    for (const auto& [quantity, flag] : flag_of) {
      if (e.quantity() == quantity) throw e.renamed(flag);
    }
    throw;
  }
}

}  // namespace rackstep::cli
