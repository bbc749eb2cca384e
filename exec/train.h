// The training loop of the CPU engine: `rackstep train`.
//
// One step: next batch -> zero_grads -> forward -> backward -> (NaN/Inf check)
// -> optimizer step (exec/optim.h, Marin's groups and schedule) -> quantile-
// balancing bias for the next step. Logged per step: loss, logit z-loss, router
// z-loss, gradient norm per optimizer group, drop fraction (sim/base/dispatch.h:
// zero on one process unless a dispatch is simulated, see DispatchOptions),
// tokens/s and MFU = model FLOPs/s (Marin convention, models::count_flops) over
// the measured fp32 sgemm peak of this machine (exec/kernels.h,
// measure_sgemm_flops_per_s).
//
// A run directory (--out RUN) holds run.json (the settings a resume must
// share), log.jsonl (one JSON object per step and per eval), checkpoints
// ckpt-NNNNNNNN.rsck (exec/checkpoint.h: atomic, checksummed) and, with
// --profile, the profiler's outputs (exec/profiler.h). Temp files left by a
// killed writer are removed at start; every log line's write is checked.
// --resume loads the newest checkpoint; when it does not validate the error
// names the newest one that does, and --resume-fallback resumes from that one
// (moving the corrupt ones aside). It refuses a checkpoint whose dataset or layout differs
// (exec/run_identity.h; --allow-data-change continues on other data, logged),
// and continues bitwise identically to an uninterrupted run:
// parameters, optimizer moments and step, data position and QB bias all come
// back; nothing else carries state between steps.
//
// A non-finite loss or gradient stops the run with NonFiniteError naming the
// step and the first op (forward order, then backward order) whose output
// holds a NaN/Inf: the step is re-run op by op to find it (deterministic).
//
// Multi-process (exec/dist.h): under mpirun every rank builds a Trainer over
// the world communicator. Data parallel: each rank trains its slice of the
// same global batch, gradients are reduce-scattered into ZeRO shards (whole
// tensors), each owner steps its shard and the parameters are all-gathered.
// With --ep N (N > 1 dividing the rank count) the routed experts are split over
// EP groups of N ranks and tokens travel through the real pooled / ragged
// transport. Losses, drop counts and gradient norms are reduced over the world;
// only rank 0 prints, logs and writes files. Checkpoints gather the shards to
// rank 0 in the single-process format: any rank count resumes from them, and
// the same rank count resumes bitwise.
//
//   TrainOptions o;  o.model_path = "models/zoo/tiny-moe.json";  o.data_dir = "data/py";
//   o.steps = 200;  o.out_dir = "runs/tiny";  o.checkpoint_every = 50;
//   Trainer t(o);
//   while (!t.done()) { StepLog s = t.step(); ... }
#pragma once

#include <cstdint>
#include <limits>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "exec/checkpoint.h"
#include "exec/data.h"
#include "exec/dist.h"
#include "exec/dump.h"
#include "exec/model.h"
#include "exec/optim.h"
#include "exec/profiler.h"
#include "exec/routing_trace.h"
#include "sim/base/check.h"

namespace rackstep::exec {

struct TrainOptions {
  std::string model_path;
  std::string data_dir;
  std::string out_dir;          // "" = no run directory: no log, checkpoints or profile
  std::string backend = "cpu";  // where the ops run: a name of exec/backend.h's registry ("cpu", "cuda")
  std::string precision = "fp32";  // the heavy ops' arithmetic (Backend::set_precision): fp32, or bf16 on cuda
  // Data parallel's gradient reduce-scatter and parameter all-gather: "host"
  // (MPI over host copies of the arenas, the owner steps its host shard) or
  // "backend" (the backend's collectives in its memory, the owner steps its
  // shard there: NCCL on cuda; at one process too, a one-rank communicator).
  std::string dp_collectives = "host";
  // Data parallel: the gradients' reduce-scatter starts during the backward,
  // a range of at least this many MiB of the gradient arena at a time as the
  // backward finishes it (the top layers first), and overlaps the rest of the
  // backward; 0 = one reduce-scatter after the backward. Where the gradients
  // are reduced from host copies of a backend's arena, always one after.
  double grad_bucket_mb = 25;
  int64_t steps = 0;            // schedule length; 0 = the model recipe's steps
  int64_t stop_after = 0;       // end this invocation after this many steps (schedule unchanged); 0 = at `steps`
  int64_t batch = 0;            // sequences per step; 0 = the recipe's batch_seqs
  int64_t seq = 0;              // 0 = the model's seq_len
  int64_t eval_every = 0;       // 0 = only at the end (when eval data exists)
  int64_t eval_batches = 4;     // eval batches per evaluation (fewer if the split is small)
  int64_t checkpoint_every = 0; // 0 = only at the end (with --out)
  bool resume = false;
  bool allow_data_change = false;  // resume on a dataset other than the checkpoint's (logged)
  bool resume_fallback = false;    // resume past corrupt newer checkpoints (moved aside) from the newest valid one
  bool profile = false;
  int64_t profile_steps = 10;   // profile the first N steps of this invocation
  uint64_t seed = 1;            // parameter init and data order
  int threads = 0;              // 0 = the OpenMP default
  double lr_scale = 1.0;        // multiplies both fitted peak LRs
  std::string layout_path;      // a parallelism layout (exec/train_layout.h); "" = the flags below
  DispatchOptions dispatch;     // with several processes, dispatch.ep > 1 = real expert parallelism;
                                // experts and top-k are the model's (filled in by the Trainer)
  bool verify_dispatch = false; // EP across processes: check every layer against sim::dispatch
  bool ep_overlap = true;       // a backend's EP transport: a wave's exchange overlaps the previous wave's experts
  std::string routing_trace;       // training steps' routing (exec/routing_trace.h); "" = none
  std::string routing_trace_eval;  // the last evaluation's routing; "" = none
  int64_t routing_trace_every = 1; // record every N-th training step
};

struct StepLog {
  int64_t step = 0;             // 1-based: steps completed after this one
  double loss = 0, ce = 0, z_loss = 0, router_z_loss = 0;
  double grad_norm[4] = {0, 0, 0, 0};  // by OptGroup
  double lr_adam = 0, lr_muonh = 0;
  sim::DropCounts drops;
  double step_s = 0, tokens_per_s = 0, mfu = 0;
  nlohmann::json to_json() const;
};

class NonFiniteError : public UserError {
 public:
  using UserError::UserError;
};

// OpenMP and OpenBLAS thread counts (0 = leave the defaults).
void set_threads(int threads);
int current_threads();

class Trainer {
 public:
  // Loads model and data, builds the model, then initialises it from the seed
  // or (resume) from the newest checkpoint of out_dir. UserError on bad input;
  // nothing in out_dir is overwritten before the first checkpoint is due.
  // `comm`: the process group (not owned; nullptr = this process alone).
  explicit Trainer(TrainOptions options, const Comm* comm = nullptr);

  bool done() const;
  int64_t step_index() const { return opt_state_.step; }  // steps completed
  int64_t total_steps() const { return total_steps_; }
  StepLog step();
  // Mean cross-entropy over the held-out batches; NaN when there is no eval split.
  double evaluate();
  // Writes out_dir/ckpt-<step>.rsck (UserError without out_dir). Collective
  // with several processes: every rank calls it, rank 0 writes.
  std::string save_checkpoint();
  void append_log(const nlohmann::json& line) const;
  void write_profile() const;  // no-op without --profile and --out
  void write_routing_trace() const;  // no-op without --routing-trace

  Model& model() { return *model_; }
  int64_t global_batch() const { return global_batch_; }  // sequences per step over all ranks
  // Layout fields that place memory only and were not applied ("/recompute: full").
  const std::vector<std::string>& placement_only() const { return placement_only_; }
  // The EP dispatch this run uses (from the layout or the flags, experts from the model).
  const DispatchOptions& dispatch() const { return o_.dispatch; }
  int world() const { return comm_ ? comm_->size() : 1; }
  bool is_root() const { return !comm_ || comm_->root(); }
  // Layers checked against sim::dispatch so far (--verify-dispatch), this rank.
  int64_t verified_dispatch_layers() const { return experts_ ? experts_->verified_layers() : 0; }
  const TrainOptions& options() const { return o_; }
  const models::LayerGraph& graph() const { return graph_; }
  const Optimizer& optimizer() const { return *optimizer_; }
  OptimizerState& optimizer_state() { return opt_state_; }
  TokenLoader& loader() { return *train_; }
  double peak_flops() const { return peak_flops_; }
  double model_flops_per_token() const { return flops_per_token_; }
  double unigram_entropy_nats() const { return unigram_nats_; }
  const Profiler* profiler() const { return profiler_.get(); }
  // Data parallel: the ranges the last step's gradient reduce-scatter was begun in (1 = after the backward).
  int64_t reduce_scatter_ranges() const { return reduce_scatter_ranges_; }

  // The newest ckpt-*.rsck in dir, "" when none.
  static std::string latest_checkpoint(const std::string& dir);

 private:
  void resume_from(const std::string& path);
  void check_identity(const std::string& path, const std::string& saved_identity);
  void fall_back_past_invalid(const std::string& valid, const std::vector<std::string>& notes);
  void write_run_json() const;
  bool distributed() const { return world() > 1; }
  // The optimizer steps a ZeRO shard: several processes, or the backend's collectives.
  bool sharded() const { return distributed() || dp_ != nullptr; }
  int rank() const { return comm_ ? comm_->rank() : 0; }
  const Comm& ranks() const { return comm_ ? *comm_ : solo_; }
  void make_experts();  // expert parallelism: MpiExperts, the backend's transport, or the simulated dispatch
  void make_backend_collectives();
  Batch my_slice(const Batch& global) const;       // this rank's sequences
  static int64_t target_count(const Batch& b);
  void setup_shards();
  // The backward; under data parallel it begins the gradient reduce-scatter into this
  // rank's shard by ranges (grad_bucket_mb), which reduce_and_step* wait for.
  void backward_reducing();
  void reduce_and_step(GroupNorms& norms, int64_t step_no);  // DP: reduce-scatter, owner step, all-gather
  void reduce_and_step_on_backend(GroupNorms& norms, int64_t step_no);  // the same in the backend's memory
  // NonFiniteError naming the first op with a non-finite gradient, unless every global group norm is finite.
  void check_global_norms(const GroupNorms& norms, int64_t step_no);
  // One process: the group norms (NonFiniteError naming the op when one is not finite), then the update.
  void check_and_step(GroupNorms& norms, int64_t step_no, const std::function<void()>& optimizer_starts);

  const Comm* comm_ = nullptr;
  Comm solo_;  // ranks() of a run without a communicator: one process
  int64_t global_batch_ = 0;
  std::vector<std::string> placement_only_;  // layout fields not applied (exec/train_layout.h)
  ShardPlan shards_;
  Arena shard_params_, shard_grads_;   // this rank's tensors (ZeRO owner range)

  TrainOptions o_;
  models::LayerGraph graph_;
  std::unique_ptr<Model> model_;
  // Expert parallelism (make_experts): MpiExperts, or the backend's own
  // transport; nullptr = none. Declared after model_: it goes first (a
  // backend's transport holds the backend's stream).
  std::unique_ptr<ExpertBackend> experts_;
  std::unique_ptr<TokenLoader> train_, eval_;
  std::unique_ptr<Optimizer> optimizer_;
  OptimizerState opt_state_;   // with backend_opt_: its checkpoint form, current after save_checkpoint
  // The optimizer in the backend's memory (exec/backend.h): one process, or
  // this rank's shard under the backend's collectives; nullptr = optimizer_ on the host arenas. Declared after model_: it goes first.
  std::unique_ptr<BackendOptimizer> backend_opt_;
  // dp_collectives "backend": the collectives, and this rank's reduced
  // gradient shard (shards_ range floats) in backend memory; backend_opt_ then
  // steps the shard's layout. Declared after model_ (its backend outlives them).
  std::unique_ptr<BackendCollectives> dp_;
  std::unique_ptr<Buffer> dp_shard_grads_;
  std::unique_ptr<Profiler> profiler_;
  std::unique_ptr<RoutingTraceRecorder> trace_train_, trace_eval_;
  int64_t total_steps_ = 0;
  int64_t started_at_ = 0;      // step index when this invocation began
  int64_t reduce_scatter_ranges_ = 0;
  double peak_flops_ = 0;
  double flops_per_token_ = 0;
  double unigram_nats_ = 0;
  nlohmann::json identity_;     // dataset + layout (exec/run_identity.h), written into every checkpoint
};

// The whole command: train with progress output, evals, checkpoints and the
// final summary. Returns the exit status.
struct TrainOutput {
  bool json = false;            // one JSON document at the end instead of text
  bool progress = false;        // a live progress line (terminals)
};
int run_training(const TrainOptions& options, const TrainOutput& out, const Comm* comm = nullptr);

// `--reference-dump DIR`: one batch, no training loop. Writes (exec/dump.h)
// every parameter, the batch, RoPE positions, QB bias and chosen experts,
// logits, loss / ce / z_loss, every gradient, and every parameter after one
// optimizer step, with the constants the reference needs in meta.
void write_reference_dump(const TrainOptions& options, const std::string& dir);
// What a reference comparison feeds both sides for one step: the batch
// ("batch.tokens/targets/doc/pos", (B, T)), the parameters ("param.*") and each
// MoE layer's balancing bias ("buffer.layers.L.moe.router.bias", (E)).
void add_step_inputs(TensorDump& dump, const Model& model, const models::ModelConfig& m, const Batch& b);

}  // namespace rackstep::exec
