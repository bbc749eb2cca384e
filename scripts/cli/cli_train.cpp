// `rackstep train`: train a model of the zoo on a token-shard dataset with the
// CPU engine (exec/train.h), or write a reference dump of one step.
//
//   rackstep data build --default --out data/py
//   rackstep train --model models/zoo/tiny-moe.json --data data/py --steps 300 --out runs/tiny
//       --eval-every 50 --checkpoint-every 100    (one command line)
//   rackstep train --model models/zoo/tiny-moe.json --data data/py --steps 300 --out runs/tiny --resume
//   rackstep train --model models/zoo/tiny-moe.json --data data/py --steps 20 --out runs/p --profile
//   rackstep train --model models/zoo/tiny-moe.json --data data/py --reference-dump /tmp/ref
//   rackstep train ... --layout L.json        # the layout file predict reads (exec/train_layout.h)
//   rackstep train ... --dispatch pooled --ep 4 --sender-cf 1.1 --receiver-cf 1.15   # simulated EP drops
//   mpirun -np 4 rackstep train --model models/zoo/tiny-moe.json --data data/py --batch 8   # data parallel
//   mpirun -np 4 rackstep train ... --dispatch pooled --ep 4 [--verify-dispatch]   # real expert parallel
//   rackstep train --model models/zoo/tiny-moe.json --data data/py --steps 20 --backend cuda   # on the GPU
//   rackstep train ... --routing-trace-eval runs/t/eval.rsrt --eval-batches 64   # routing for drops --replay
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "exec/backend.h"
#include "exec/dist.h"
#include "exec/train.h"
#include "exec/watchdog.h"
#include "sim/base/check.h"
#include "scripts/cli/command.h"
#include "scripts/cli/flags.h"

namespace rackstep::exec {
namespace {

struct TrainArgs {
  TrainOptions o;
  bool json = false;
  std::string reference_dump;
  std::string dispatch = "none";
  int64_t ep = 1;
  sim::DispatchConfig config;  // the flags' defaults are the dispatch library's
  double collective_timeout_s = 600;  // exec/watchdog.h; 0 = off
};

// --backend: "cpu" is built in; "cuda" is the plugin librackstep_cuda.so next
// to this binary (exec/cuda/plugin/plugin.cpp), built where nvcc was found,
// and needs a device.
void check_backend(const std::string& name) {
  if (name == "cpu") return;
  if (name != "cuda") throw UserError("train --backend: expected cpu or cuda, found '" + name + "'");
  if (const std::string why = load_backend_plugin("cuda"); !why.empty()) {
    throw UserError("train --backend cuda: expected the CUDA backend plugin (librackstep_cuda.so, built where nvcc "
                    "was found when CMake configured), found none: " + why);
  }
  for (const std::string& n : available_backends())
    if (n == "cuda") return;
  throw UserError("train --backend cuda: expected a CUDA device on this machine, found none");
}

// The library names TrainOptions' fields (and DispatchOptions::ep); this
// command's user typed flags. ep is a flag's only without --layout (a layout
// file sets it otherwise), batch only with --batch (else the recipe's or the layout's).
std::vector<std::pair<std::string, std::string>> flags_of(const TrainArgs& a) {
  std::vector<std::pair<std::string, std::string>> f = {{"model_path", "--model"},
                                                        {"data_dir", "--data"},
                                                        {"steps", "--steps"},
                                                        {"precision", "--precision"},
                                                        {"dp_collectives", "--dp-collectives"},
                                                        {"grad_bucket_mb", "--grad-bucket-mb"},
                                                        {"out_dir", "--out"},
                                                        {"verify_dispatch", "--verify-dispatch"},
                                                        {"ep_overlap", "--ep-overlap"},
                                                        {"routing_trace", "--routing-trace"},
                                                        {"routing_trace_eval", "--routing-trace-eval"},
                                                        {"routing_trace_every", "--routing-trace-every"}};
  if (a.o.layout_path.empty()) f.emplace_back("ep", "--ep");
  if (a.o.batch > 0) f.emplace_back("batch", "--batch");
  return f;
}

int run_on(TrainArgs& a, const Comm& world) {
  check_backend(a.o.backend);
  if (!a.o.layout_path.empty() && a.dispatch != "none") {
    throw UserError("train: expected --layout or --dispatch/--ep (the layout holds the EP settings), found both");
  }
  if (a.dispatch != "none") {
    a.o.dispatch.enabled = true;
    a.o.dispatch.ep = a.ep;
    a.o.dispatch.config = a.config;  // experts and top-k: the Trainer reads them from the model
    a.o.dispatch.config.transport = sim::parse_transport(a.dispatch);
  } else if (a.ep != 1) {
    throw UserError("train: --ep " + std::to_string(a.ep) + " needs --dispatch pooled|ragged|capacity");
  }
  if (a.o.checkpoint_every > 0 && a.o.out_dir.empty()) {
    throw UserError("train: --checkpoint-every needs --out <run dir>");
  }
  if (a.o.profile && a.o.out_dir.empty()) throw UserError("train: --profile needs --out <run dir>");
  if (!a.reference_dump.empty()) {
    if (world.size() > 1) throw UserError("train: --reference-dump runs in one process (not under mpirun)");
    rackstep::cli::flag_names(flags_of(a), [&] { write_reference_dump(a.o, a.reference_dump); });
    if (!a.json) std::printf("reference dump written to %s\n", a.reference_dump.c_str());
    return 0;
  }
  TrainOutput out;
  out.json = a.json;
  out.progress = !a.json && rackstep::cli::stdout_is_terminal();
  return rackstep::cli::flag_names(flags_of(a), [&] { return run_training(a.o, out, &world); });
}

// Under mpirun a rank's error cannot just return: the other ranks may wait in a
// collective. Print it (with the rank) and take the whole job down.
int run(TrainArgs& a) {
  Comm world = Comm::world();  // UserError when launched as several processes without MPI
  if (world.size() == 1) return run_on(a, world);
  start_collective_watchdog(world, a.collective_timeout_s);
  try {
    return run_on(a, world);
  } catch (const std::exception& e) {  // UserError, a failed write, bad_alloc: the same for every rank
    std::fprintf(stderr, "rackstep: rank %d: %s\n", world.rank(), e.what());
    std::fflush(stderr);
    world.abort(2);
  }
}

rackstep::cli::Registration reg{
    "train", "Train a model on a token-shard dataset (CPU: fp32 on OpenBLAS + OpenMP; or --backend cuda, fp32 or bf16)",
    [](CLI::App& app) {
      auto a = std::make_shared<TrainArgs>();
      app.add_option("--model", a->o.model_path, "model JSON (models/zoo/*.json)")->required();
      app.add_option("--data", a->o.data_dir, "dataset directory from `rackstep data build`")->required();
      app.add_option("--steps", a->o.steps, "schedule length in steps (default: the model recipe's)")
          ->check(CLI::PositiveNumber);
      app.add_option("--out", a->o.out_dir, "run directory: run.json, log.jsonl, checkpoints, profile");
      app.add_flag("--resume", a->o.resume,
                   "continue from the newest checkpoint in --out (bitwise identical); refused when it is corrupt "
                   "(see --resume-fallback) or its dataset or layout differs from this run's");
      app.add_flag("--resume-fallback", a->o.resume_fallback,
                   "with --resume: when the newest checkpoints are corrupt, move them aside (*.corrupt) and "
                   "resume from the newest valid one");
      app.add_flag("--allow-data-change", a->o.allow_data_change,
                   "with --resume: continue although --data is not the checkpoint's dataset (logged in log.jsonl)");
      app.add_option("--eval-every", a->o.eval_every, "eval loss on held-out shards every N steps (and at the end)")
          ->check(CLI::NonNegativeNumber);
      app.add_option("--eval-batches", a->o.eval_batches, "batches per evaluation")->check(CLI::PositiveNumber);
      app.add_option("--checkpoint-every", a->o.checkpoint_every, "checkpoint every N steps (and at the end)")
          ->check(CLI::NonNegativeNumber);
      app.add_option("--stop-after", a->o.stop_after, "end this invocation after N steps (schedule unchanged)")
          ->check(CLI::NonNegativeNumber);
      app.add_flag("--profile", a->o.profile,
                   "per-op Chrome trace, op_measurements.json and routing histograms in --out");
      app.add_option("--profile-steps", a->o.profile_steps, "steps profiled (from the first)")
          ->check(CLI::PositiveNumber);
      app.add_option("--seed", a->o.seed, "parameter init and data order");
      app.add_option("--backend", a->o.backend,
                     "where the ops run: cpu, or cuda (the GPU, parameters and optimizer resident; needs a CUDA build and a device)")
          ->capture_default_str();
      app.add_option("--precision", a->o.precision,
                     "arithmetic of the GEMMs: fp32 (the parity mode), or bf16 on --backend cuda (bf16 operands, "
                     "fp32 accumulation, fp32 master weights, gradients and optimizer state)")
          ->capture_default_str();
      app.add_option("--dp-collectives", a->o.dp_collectives,
                     "data parallel's gradient reduce-scatter and parameter all-gather: host (MPI over host copies) "
                     "or backend (in the backend's memory: NCCL on --backend cuda; one process too)")
          ->capture_default_str();
      app.add_option("--grad-bucket-mb", a->o.grad_bucket_mb,
                     "data parallel: begin the gradients' reduce-scatter during the backward, by ranges of at least "
                     "this many MiB as the backward finishes them (top layers first), overlapping the rest of it; "
                     "0 = one reduce-scatter after the backward")
          ->check(CLI::NonNegativeNumber)
          ->capture_default_str();
      app.add_option("--threads", a->o.threads, "OpenMP / OpenBLAS threads (results are bitwise reproducible per count)")
          ->check(CLI::NonNegativeNumber);
      app.add_option("--batch", a->o.batch, "sequences per step (default: the recipe's)")->check(CLI::PositiveNumber);
      app.add_option("--seq", a->o.seq, "tokens per sequence (default: the model's seq_len)")->check(CLI::PositiveNumber);
      app.add_option("--lr-scale", a->o.lr_scale, "multiplies the fitted peak learning rates")
          ->check(CLI::PositiveNumber);
      app.add_option("--dispatch", a->dispatch,
                     "simulate EP drops with the shared dispatch library: none (default), pooled, ragged, capacity")
          ->check(CLI::IsMember({"none", "pooled", "ragged", "capacity"}));
      app.add_option("--ep", a->ep,
                     "EP group size (with --dispatch): under mpirun, real expert parallelism over that many "
                     "processes; in one process, virtual GPUs the batch is split over")
          ->check(CLI::PositiveNumber);
      app.add_flag("--verify-dispatch", a->o.verify_dispatch,
                   "expert parallel under mpirun: check every layer's drops against sim/dispatch (all-gather)");
      app.add_option("--ep-overlap", a->o.ep_overlap,
                     "expert parallel on --backend cuda: a pooled wave's exchange travels while the previous "
                     "wave's experts compute (off: one after the other, bitwise the same results)")
          ->capture_default_str();
      app.add_option("--sender-cf", a->config.sender_cf, "pooled sender capacity factor")->capture_default_str();
      app.add_option("--receiver-cf", a->config.receiver_cf, "receiver / per-expert capacity factor")
          ->capture_default_str();
      app.add_option("--waves", a->config.waves, "pooled waves")->capture_default_str();
      app.add_option("--layout", a->o.layout_path,
                     "a parallelism layout, the file `predict` takes (sim/layouts/*.json): data = processes "
                     "(or, in one process, the EP group split into virtual GPUs), ep with its transport, "
                     "capacity factors and waves, the batch; tp/cp/pp > 1 or a bf16 master copy are errors, "
                     "memory-placement fields are listed and not applied");
      app.add_option("--routing-trace", a->o.routing_trace,
                     "write every recorded training step's routing (experts, scores, sequence, position, document) "
                     "to this file, format sim/base/routing_trace.h (for rackstep drops --replay / --fit)");
      app.add_option("--routing-trace-every", a->o.routing_trace_every, "with --routing-trace: every N-th step")
          ->check(CLI::PositiveNumber);
      app.add_option("--routing-trace-eval", a->o.routing_trace_eval,
                     "write the last evaluation's routing to this file (consecutive windows: whole documents)");
      app.add_option("--collective-timeout-s", a->collective_timeout_s,
                     "under mpirun: a collective waiting longer than this names the stopped rank and aborts the "
                     "job (default 600; 0 = wait forever)")
          ->check(rackstep::cli::number(0, 1e6));
      app.add_option("--reference-dump", a->reference_dump,
                     "instead of training: write one step's tensors (exec/dump.h) for the PyTorch reference");
      app.add_flag("--json", a->json, "one JSON document at the end instead of text");
      return [a] { return run(*a); };
    }};

}  // namespace
}  // namespace rackstep::exec
