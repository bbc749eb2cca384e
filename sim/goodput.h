// Goodput over a whole training run: how interruptions, restarts, checkpoints
// and host stalls turn a step time into wall-clock days, as a distribution.
//
// Monte Carlo, event by event (not step by step): failures of GPUs and links
// arrive as a Poisson process in running time (rate x GPUs), hangs as one per
// `mean_steps_between` steps, and each checkpoint save can fail and crash the
// job. An interruption rolls the run back to its last good checkpoint and
// costs a restart (lognormal around the median); a hang also costs the time
// until it is detected. Garbage-collection stalls stretch every step.
// Rates default to sim/goodput_defaults.json, each with its source.
//
//   rackstep::sim::GoodputConfig cfg = rackstep::sim::default_goodput_config();
//   rackstep::sim::GoodputRequest req;
//   req.step_time_s = 17.15; req.tokens_per_step = 46137344; req.tokens = 18e12;
//   req.gpus = 704; req.deadline_days = 80;
//   req.total_params = 535.48e9;
//   rackstep::sim::GoodputResult r = rackstep::sim::simulate_goodput(req, cfg);
//   // r.p50_days, r.p_finish_by_deadline, r.histogram ...
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace rackstep::sim {

// Zero everywhere means "no such interruption"; the defaults file fills it in.
struct GoodputConfig {
  double gpu_failure_mtbf_gpu_days = 0;       // GPU errors (XID, HBM): GPU-days per failure
  double link_failure_mtbf_gpu_days = 0;      // NIC / IB port failures: GPU-days per failure
  double hang_mean_steps_between = 0;         // one hang per this many steps
  double hang_detect_s = 0;                   // a hang runs this long before it is killed
  double restart_median_s = 0;                // median time from crash to training again
  double restart_log_sigma = 0;               // lognormal spread of restart time
  double checkpoint_interval_s = 3600;        // running time between saves
  double checkpoint_bytes_per_param = 0;      // saved bytes = this x GoodputRequest::total_params
  double checkpoint_write_bytes_per_s = 1;
  double checkpoint_blocking_fraction = 1;    // share of the write that stalls training
  double checkpoint_failure_probability = 0;  // per save: the save crashes the job
  double gc_stall_fraction = 0;               // share of elapsed running time lost to GC stalls
};

// Reads sim/goodput_defaults.json from the source tree.
GoodputConfig default_goodput_config();
// The defaults overlaid with `path` (same schema; every key optional, unknown keys are errors).
GoodputConfig load_goodput_config(const std::string& path);
// The same overlay from an already-parsed document (`file` names it in errors).
void apply_goodput_json(GoodputConfig& cfg, const nlohmann::json& doc, const std::string& file,
                        bool require_all);
nlohmann::json goodput_config_json(const GoodputConfig& cfg);

struct GoodputRequest {
  double step_time_s = 0;       // one training step, without GC stalls
  double tokens_per_step = 0;
  double tokens = 0;            // the token budget
  int64_t gpus = 0;
  double total_params = 0;      // the model's parameters: the checkpoint scales with them
  double deadline_days = 0;     // 0 = no deadline
  int64_t runs = 1000;
  uint64_t seed = 0;
  int bins = 20;                // histogram bins
  // Called as runs complete (done, total), e.g. the CLI's progress line; may be empty.
  std::function<void(int64_t, int64_t)> progress;
};

struct HistogramBin {
  double lo_days, hi_days;
  int64_t runs;
};

// Means per run, in days, of where wall-clock time went.
struct GoodputBreakdown {
  double productive_days = 0;   // steps x step_time_s
  double gc_days = 0;           // GC stalls on committed work
  double checkpoint_days = 0;   // blocking saves that were kept
  double lost_work_days = 0;    // work (and saves) rolled back to the last checkpoint
  double restart_days = 0;
  double hang_detect_days = 0;
};

struct GoodputResult {
  int64_t steps = 0;
  int64_t steps_per_checkpoint = 0;
  double ideal_days = 0;              // steps x step_time_s: no interruptions, no stalls
  std::vector<double> days;           // one per run, sorted
  double mean_days = 0, p10_days = 0, p50_days = 0, p90_days = 0;
  double goodput_fraction = 0;        // ideal_days / mean_days
  double p_finish_by_deadline = -1;   // -1 when no deadline was given
  GoodputBreakdown breakdown;
  // Mean interruptions per run, by kind.
  double gpu_failures = 0, link_failures = 0, hangs = 0, checkpoint_failures = 0;
  std::vector<HistogramBin> histogram;
  // Checkpoint interval cross-check (Young 1974, Daly 2006) on the same rates.
  double system_mtbf_s = 0;           // running time between interruptions (all kinds)
  double save_cost_s = 0;             // blocking time per save
  double young_interval_s = 0;
  double daly_interval_s = 0;
  double mean_days_at_daly_interval = 0;
};

GoodputResult simulate_goodput(const GoodputRequest& req, const GoodputConfig& cfg);

// Young (1974): tau = sqrt(2 delta M).
double young_interval_s(double save_cost_s, double mtbf_s);
// Daly (2006), "A higher order estimate of the optimum checkpoint interval":
// tau = sqrt(2 delta M) [1 + sqrt(delta/2M)/3 + (delta/2M)/9] - delta for delta < 2M, else M.
double daly_interval_s(double save_cost_s, double mtbf_s);

nlohmann::json goodput_result_json(const GoodputRequest& req, const GoodputResult& r);
std::string format_goodput(const GoodputRequest& req, const GoodputResult& r);

}  // namespace rackstep::sim
