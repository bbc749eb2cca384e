// An impossible value of a named quantity, raised by library code that knows
// no command line. The library names the quantity as its request struct does
// (GoodputRequest::step_time_s -> "step_time_s"); a command that sets it from
// a flag names the flag instead (cli::flag_names in scripts/cli/flags.h), and
// every other caller (`rackstep size` computes the step time itself) prints
// the quantity:
//
//   throw rackstep::ValueError("goodput", "step_time_s", "a time > 0", "0");
//   // what(): "goodput: step_time_s: expected a time > 0, found 0"
//   // rackstep goodput prints "goodput: --step-time-s: expected a time > 0, found 0"
#pragma once

#include <string>

#include "sim/base/check.h"

namespace rackstep {

class ValueError : public UserError {
 public:
  ValueError(std::string context, std::string quantity, std::string expected, std::string found)
      : UserError(format(context, quantity, expected, found)),
        context_(std::move(context)),
        quantity_(std::move(quantity)),
        expected_(std::move(expected)),
        found_(std::move(found)) {}

  const std::string& quantity() const { return quantity_; }
  // The same error naming `name` (a flag) where it named the quantity.
  UserError renamed(const std::string& name) const { return UserError(format(context_, name, expected_, found_)); }

 private:
  static std::string format(const std::string& context, const std::string& quantity, const std::string& expected,
                            const std::string& found) {
    return (context.empty() ? "" : context + ": ") + quantity + ": expected " + expected + ", found " + found;
  }
  std::string context_, quantity_, expected_, found_;
};

}  // namespace rackstep
