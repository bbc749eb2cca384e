// Progress of long work on stderr, for the command-line front end: silent for
// the first seconds (short work prints nothing), then at most one line per
// second with the share done and an estimate of the time left. Library code
// takes a plain callback (done, total) and knows nothing of this.
//
//   cli::Progress progress("goodput", "runs");
//   req.progress = progress.callback();      // simulate_goodput calls it as it goes
//   ... ; progress.finish();                 // a final line, if anything was printed
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>

namespace rackstep::cli {

class Progress {
 public:
  using Clock = std::chrono::steady_clock;
  Progress(std::string what, std::string unit, double quiet_s = 2.0)
      : what_(std::move(what)), unit_(std::move(unit)), quiet_s_(quiet_s), start_(Clock::now()), last_(start_) {}

  // Returns the line it printed ("" when it stayed quiet); `now` is for tests.
  std::string update(int64_t done, int64_t total, Clock::time_point now = Clock::now()) {
    const double elapsed = std::chrono::duration<double>(now - start_).count();
    if (elapsed < quiet_s_ || done <= 0 || total <= 0) return "";
    if (printed_ && std::chrono::duration<double>(now - last_).count() < 1.0 && done < total) return "";
    last_ = now;
    printed_ = true;
    const double left_s = elapsed * static_cast<double>(total - done) / static_cast<double>(done);
    char buf[200];
    std::snprintf(buf, sizeof buf, "%s: %.0f%% (%lld of %lld %s), about %.0f s left", what_.c_str(),
                  100.0 * static_cast<double>(done) / static_cast<double>(total), static_cast<long long>(done),
                  static_cast<long long>(total), unit_.c_str(), left_s);
    std::fprintf(stderr, "%s\n", buf);
    return buf;
  }
  std::function<void(int64_t, int64_t)> callback() {
    return [this](int64_t done, int64_t total) { update(done, total); };
  }

 private:
  std::string what_, unit_;
  double quiet_s_;
  Clock::time_point start_, last_;
  bool printed_ = false;
};

}  // namespace rackstep::cli
