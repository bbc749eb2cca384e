// Invariant checks and user errors, shared by every rackstep component.
//
// Two kinds of failure, kept apart:
//   RS_CHECK(cond, "why")  a bug in rackstep: prints file:line and aborts.
//   throw UserError(...)   something the user can fix (a bad file, an
//                          impossible layout): caught at the command boundary,
//                          printed as one line, exit status 2.
//
//   RS_CHECK(n_heads % n_kv_heads == 0, "GQA groups must be whole");
//   throw rackstep::UserError("model.json", "/attention/heads",
//                             "a multiple of kv_heads (12)", "50");
#pragma once

#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

namespace rackstep {

// A user-facing error: where it is (file, JSON path), what was expected and
// what was found. what() is the one line the command prints.
class UserError : public std::runtime_error {
 public:
  UserError(const std::string& file, const std::string& json_path,
            const std::string& expected, const std::string& found)
      : std::runtime_error(format(file, json_path, expected, found)) {}
  // For errors with no file behind them (a bad flag value, an impossible request).
  explicit UserError(const std::string& message) : std::runtime_error(message) {}

 private:
  static std::string format(const std::string& file, const std::string& json_path,
                            const std::string& expected, const std::string& found) {
    std::string s = file.empty() ? std::string("<input>") : file;
    if (!json_path.empty()) s += ": " + json_path;
    s += ": expected " + expected;
    if (!found.empty()) s += ", found " + found;
    return s;
  }
};

[[noreturn]] inline void check_failed(const char* file, int line, const char* cond,
                                      const std::string& why) {
  std::fprintf(stderr, "rackstep internal error at %s:%d: %s (%s)\n", file, line,
               why.c_str(), cond);
  std::abort();
}

}  // namespace rackstep

#define RS_CHECK(cond, why)                                              \
  do {                                                                   \
    if (!(cond)) ::rackstep::check_failed(__FILE__, __LINE__, #cond, why); \
  } while (0)
