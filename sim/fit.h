// Fit the predictor's parameters to measurements of real execution: the second
// half of `rackstep calibrate` (the first is exec/microbench.h).
//
// Inputs: a measurements document ("rackstep.calibration_measurements/1":
// GEMMs, stream bandwidth, per-op model profiles, optimizer steps, resident
// memory, MPI collectives) or a profiled training run (op_measurements.json of
// `rackstep train --profile`, converted by measurements_from_run), a base
// topology (topologies/zoo/cpu-host.json) and a base calibration
// (sim/calibration.json).
//
// What is fitted, and how (every value written with a source "[M] ..." for a
// measured number or "[F] ..." for a fitted one, naming the measurements):
//   peak FLOP/s        best measured GEMM rate / 0.9 (the shape curve caps
//                      efficiency at 0.95, so the best shape lands at ~0.9)
//   HBM bandwidth      the stream measurement
//   GEMM shape curve   half_dim by a grid search; at each, the per-class
//   + class efficiencies and the launch overhead are the weighted linear
//                      least squares of the predictor's own op times
//                      (Predictor::op_timings, linear in 1/eff and in the
//                      launch overhead) against every measured op, each op's
//                      residual divided by its profile's total so the fit
//                      targets step time; plus one row per profile tying the
//                      summed ops to the whole forward + backward
//   optimizer          the memory-bound optimizer efficiency that makes the
//                      predicted optimizer step match the measured ones
//   memory             activation_bytes_factor: the engine's activation arena
//                      over the model's bf16 count [M]; runtime_reserved_bytes
//                      and backward_workspace_factor: each profile's peak
//                      resident set (VmHWM) vs the predicted breakdown [F]
//   collectives        latency and bandwidth of a ring all-reduce
//                      (2(P-1)·α + 2(P-1)/P·bytes/bw) over the measured points;
//                      per rank count, the per-process compute share when P
//                      processes share the host (topology-npP.json), and what
//                      an MPI rank holds resident beyond a lone process
//                      after the engine's step exchange at the model's size
//                      (calibration-npP.json: runtime_reserved_bytes)
// The op rows are one per profile and op class, each op on the branch of
// max(compute, memory) the current estimate makes active; summary.in_sample
// holds the fitted predictor's error per profile and class.
//
//   FitResult r = fit_measurements(measurements, "topologies/zoo/cpu-host.json", default_calibration_path(), "cal/measurements.json");
//   write r.calibration, r.topologies["topology.json"], ...; r.summary for --json.
#pragma once

#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "models/layer_graph.h"
#include "sim/layout.h"

namespace rackstep::sim {

struct FitResult {
  nlohmann::json calibration;                        // sim/calibration.json format
  std::map<std::string, nlohmann::json> topologies;  // file name -> topology JSON
  std::map<std::string, nlohmann::json> calibrations;  // per process count: calibration-npP.json
  nlohmann::json summary;                            // fitted values and fit errors
};

FitResult fit_measurements(const nlohmann::json& measurements, const std::string& base_topology_path,
                           const std::string& base_calibration_path, const std::string& measurements_file);

// A profiled run (RUN/op_measurements.json, RUN/run.json) as a measurements
// document with one profile; UserError when the run has no profile. A GPU
// run's file (exec/profiler.h: "op_clock" "cuda_events") holds device times,
// taken as they are (no de-loading), and its device memory ("device_used_at_peak_bytes",
// else "peak_device_bytes") stands for the resident peak; "backend" is its "device".
nlohmann::json measurements_from_run(const std::string& run_dir);

// A CUDA device's zoo topology (an absolute path) from topologies/cuda_devices.json
// by the name the device reports ("NVIDIA H200"); UserError naming `file`'s
// "/device", the names that map and `device` when none does.
std::string topology_for_device(const std::string& device, const std::string& file);

// The layout of a CPU run: one data rank per process, the process's batch in
// one micro-batch, no recompute (the CPU engine keeps every activation),
// optimizer state beside the weights and sharded over every process (fsdp =
// processes: the engine reduce-scatters gradients into ZeRO shards, steps its
// shard and all-gathers the parameters: ZeRO stage 1, whole parameters and
// gradient buffer on every rank).
Layout cpu_run_layout(int64_t processes, int64_t ep, int64_t batch, int64_t seq, const std::string& transport);

}  // namespace rackstep::sim
