#include "exec/train.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <utility>

#include "exec/backend.h"
#include "exec/dump.h"
#include "exec/kernels.h"
#include "exec/resources.h"
#include "exec/run_identity.h"
#include "sim/base/file_io.h"
#include "exec/train_layout.h"
#include "sim/base/json_io.h"
#include "sim/base/value_error.h"

namespace rackstep::exec {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// --- machine ---------------------------------------------------------------------

void set_threads(int threads) {
  if (threads <= 0) return;
  omp_set_num_threads(threads);
  openblas_set_num_threads(threads);
}

int current_threads() { return omp_get_max_threads(); }

// --- logs ------------------------------------------------------------------------

nlohmann::json StepLog::to_json() const {
  return {{"step", step},
          {"loss", loss},
          {"ce", ce},
          {"z_loss", z_loss},
          {"router_z_loss", router_z_loss},
          {"grad_norm",
           {{"muonh", grad_norm[0]}, {"muon", grad_norm[1]}, {"adamh", grad_norm[2]}, {"adam", grad_norm[3]}}},
          {"lr", {{"adam", lr_adam}, {"muonh", lr_muonh}}},
          {"drops",
           {{"assignments", drops.assignments},
            {"sender", drops.sender},
            {"receiver", drops.receiver},
            {"padding", drops.padding},
            {"fraction", drops.fraction()}}},
          {"step_s", step_s},
          {"tokens_per_s", tokens_per_s},
          {"mfu", mfu}};
}

// --- trainer ---------------------------------------------------------------------

namespace {

std::string checkpoint_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "ckpt-%08lld.rsck", static_cast<long long>(step));
  return buf;
}

std::vector<uint8_t> to_bytes(const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  return {b, b + n};
}

nlohmann::json run_settings(const TrainOptions& o, const models::LayerGraph& g, uint64_t fingerprint, int64_t steps,
                            int64_t batch, int64_t seq) {
  return {{"model", o.model_path},
          {"model_name", g.model.name},
          {"fingerprint", std::to_string(fingerprint)},
          {"data", o.data_dir},
          {"steps", steps},
          {"batch", batch},
          {"seq", seq},
          {"seed", o.seed},
          {"lr_scale", o.lr_scale},
          {"dispatch",
           {{"enabled", o.dispatch.enabled},
            {"ep", o.dispatch.ep},
            {"transport", sim::transport_name(o.dispatch.config.transport)},
            {"sender_cf", o.dispatch.config.sender_cf},
            {"receiver_cf", o.dispatch.config.receiver_cf}}}};
}

}  // namespace

std::string Trainer::latest_checkpoint(const std::string& dir) {
  std::error_code ec;
  if (dir.empty() || !fs::is_directory(dir, ec)) return "";
  static const std::regex kName(R"(ckpt-(\d{8})\.rsck)");
  std::string best;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (std::regex_match(name, kName) && name > fs::path(best).filename().string()) best = e.path().string();
  }
  return best;
}

Trainer::Trainer(TrainOptions options, const Comm* comm) : o_(std::move(options)) {
  comm_ = comm;
  set_threads(o_.threads);
  if (o_.model_path.empty()) throw ValueError("train", "model_path", "a model JSON", "none");
  if (o_.data_dir.empty()) throw ValueError("train", "data_dir", "a dataset directory", "none");
  graph_ = models::build_layer_graph(models::load_model(o_.model_path));
  const auto& m = graph_.model;
  int64_t seq = o_.seq > 0 ? o_.seq : m.seq_len;
  int64_t batch = o_.batch > 0 ? o_.batch : m.recipe.batch_seqs;
  if (!o_.layout_path.empty()) {
    const TrainLayout l = train_layout(sim::load_layout(o_.layout_path), o_.layout_path, graph_, world(), o_.batch);
    if (o_.seq == 0) seq = l.seq;
    batch = l.batch_seqs;
    o_.dispatch = l.dispatch;
    placement_only_ = l.placement_only;
  }
  if (o_.dispatch.enabled) o_.dispatch.config = with_model_experts(o_.dispatch.config, graph_);
  if (batch < 1) throw UserError(o_.model_path, "/recipe/batch_seqs", "a batch (or one given for this run)", "none");
  global_batch_ = batch;
  if (o_.dp_collectives != "host" && o_.dp_collectives != "backend") {
    throw ValueError("train", "dp_collectives", "host or backend", o_.dp_collectives);
  }
  if (!(o_.grad_bucket_mb >= 0)) {
    throw ValueError("train", "grad_bucket_mb", "a size >= 0 (0: one reduce-scatter after the backward)",
                     std::to_string(o_.grad_bucket_mb));
  }
  const auto [first_seq, end_seq] = sequence_slice(batch, world(), comm_ ? comm_->rank() : 0);
  check_training_memory(graph_, end_seq - first_seq, seq, o_.model_path);  // before any allocation
  // UserError for what this backend cannot run
  model_ = std::make_unique<Model>(graph_, end_seq - first_seq, seq, make_backend(o_.backend));
  if (const std::string why = model_->backend().set_precision(o_.precision); !why.empty()) {
    throw ValueError("train", "precision", why, o_.precision);
  }
  if (distributed()) {  // router losses: each rank's share of the global batch's
    model_->set_router_loss_share(global_batch_ * seq, [this](int64_t* counts, int n) { comm_->allreduce_sum(counts, n); });
  }
  make_experts();

  const DatasetInfo info = read_dataset_info(o_.data_dir);
  if (info.tokenizer.vocab_size() > m.vocab) {
    throw UserError(o_.model_path, "/vocab",
                    "at least the dataset's vocabulary of " + std::to_string(info.tokenizer.vocab_size()) + " (" +
                        o_.data_dir + ")",
                    std::to_string(m.vocab));
  }
  unigram_nats_ = info.unigram_entropy_bits_per_token * std::log(2.0);
  identity_ = run_identity(dataset_identity(info), {{"batch", batch},
                                                    {"seq", seq},
                                                    {"dispatch", run_settings(o_, graph_, 0, 0, 0, 0)["dispatch"]}});
  train_ = std::make_unique<TokenLoader>(o_.data_dir, Split::kTrain, seq, o_.seed);
  if (info.eval_tokens > seq) eval_ = std::make_unique<TokenLoader>(o_.data_dir, Split::kEval, seq, o_.seed);

  total_steps_ = o_.steps > 0 ? o_.steps : models::recipe_steps(graph_);
  if (total_steps_ < 1) throw ValueError("train", "steps", "at least 1", std::to_string(total_steps_));
  OptimizerConfig cfg = default_optimizer_config(total_steps_, m.d_model, batch * seq);
  if (m.recipe.adam_lr > 0) {
    cfg.adam_lr = m.recipe.adam_lr;
    cfg.muonh_lr = m.recipe.adam_lr * m.recipe.muonh_lr_ratio;
  }
  cfg.adam_lr *= o_.lr_scale;
  cfg.muonh_lr *= o_.lr_scale;
  cfg.beta1 = m.recipe.beta1;
  cfg.beta2 = m.recipe.beta2;
  cfg.ns_steps = static_cast<int>(m.recipe.newton_schulz_steps);
  cfg.warmup_fraction = m.recipe.warmup_fraction;
  cfg.final_lr_fraction = m.recipe.final_lr_fraction;
  optimizer_ = std::make_unique<Optimizer>(cfg);

  model_->init_params(o_.seed);
  if (o_.dp_collectives == "backend") make_backend_collectives();
  if (sharded()) {
    setup_shards();
  } else {
    opt_state_ = init_optimizer_state(model_->params());
  }
  if (!o_.out_dir.empty() && is_root()) {
    // Temp files of writers killed mid-write (ckpt-N.rsck.tmp.PID, run.json.tmp.PID).
    for (const std::string& name : remove_stale_temp_files(o_.out_dir)) {
      std::fprintf(stderr, "rackstep: removed %s, left by an interrupted write\n", name.c_str());
    }
  }
  if (o_.resume) {
    if (o_.out_dir.empty()) {
      throw ValueError("train", "out_dir", "a run directory holding the checkpoints to resume from", "none");
    }
    std::vector<std::string> notes;
    const std::string latest =
        newest_valid_checkpoint(o_.out_dir, [&notes](const std::string& line) { notes.push_back(line); });
    if (latest.empty()) throw UserError(o_.out_dir, "", "a checkpoint ckpt-*.rsck to resume from", "none");
    if (!notes.empty()) fall_back_past_invalid(latest, notes);
    resume_from(latest);
  } else if (!o_.out_dir.empty()) {
    const std::string existing = latest_checkpoint(o_.out_dir);
    if (!existing.empty()) {
      throw UserError(o_.out_dir, "", "an empty run directory (or resume from it)", "checkpoint " + existing);
    }
  }
  if (dp_) {  // this rank's shard, stepped where the collectives leave it
    backend_opt_ = model_->backend().make_optimizer(cfg, shard_params_.layout_ptr());
    if (!backend_opt_) {
      throw ValueError("train", "dp_collectives", "a backend whose optimizer runs in its memory (or host)", "backend");
    }
    backend_opt_->load_state(opt_state_);
  } else if (!distributed()) {  // the backend's own optimizer, where it has one, from the state just set up or resumed
    backend_opt_ = model_->backend().make_optimizer(cfg, std::as_const(*model_).params().layout_ptr());
    if (backend_opt_) backend_opt_->load_state(opt_state_);
  }
  started_at_ = opt_state_.step;
  peak_flops_ = measure_sgemm_flops_per_s(1024, 0.2);  // exec/kernels.h: best of timed sgemms
  // Ranks measure at the same time, sharing the machine: their sum is the
  // peak of the whole run.
  if (comm_) comm_->allreduce_sum(&peak_flops_, 1);
  flops_per_token_ = models::count_flops(graph_, seq, models::FlopConvention::kMarin).training;
  if (o_.profile && is_root()) {  // rank 0 profiles its own slice
    profiler_ = std::make_unique<Profiler>(graph_, model_->batch(), seq, current_threads());
    profiler_->set_dtype(o_.precision == "bf16" ? "bf16" : "f32");  // written on a device only
    profiler_->attach(*model_);
    if (dp_) dp_->set_brackets(profiler_.get());  // the trace's collectives lane
  }
  if (!o_.out_dir.empty() && is_root()) write_run_json();
  if (!o_.routing_trace.empty() || !o_.routing_trace_eval.empty()) {
    if (distributed()) {  // a trace records one process's routing
      throw ValueError("train", o_.routing_trace.empty() ? "routing_trace_eval" : "routing_trace",
                       "a run in one process", std::to_string(world()) + " processes");
    }
    if (o_.routing_trace_every < 1) {
      throw ValueError("train", "routing_trace_every", "at least 1", std::to_string(o_.routing_trace_every));
    }
    const int64_t max_tokens = int64_t(1) << 24;  // 16M tokens: 1 GiB for a 4-layer top-2 model
    if (!o_.routing_trace.empty())
      trace_train_ = std::make_unique<RoutingTraceRecorder>(graph_, seq, false, o_.routing_trace, max_tokens);
    if (!o_.routing_trace_eval.empty())
      trace_eval_ = std::make_unique<RoutingTraceRecorder>(graph_, seq, true, o_.routing_trace_eval, max_tokens);
  }
}

// --- expert parallel ---------------------------------------------------------------

namespace {
ExpertTransportOptions transport_options(const TrainOptions& o) {
  return {.verify = o.verify_dispatch, .overlap = o.ep_overlap};
}
}  // namespace

// Expert parallelism across processes: EP groups of `ep` consecutive ranks
// exchange their routed rows, over MPI in host memory (MpiExperts) or through
// the backend's own transport in its memory (Backend::make_experts: NCCL on the
// GPU). A backend whose memory is not the host's runs its transport in one
// process with ep 1 too (a group of one: the same calls, and the same drops as
// the simulated dispatch of one GPU), where it has one. Otherwise the dispatch
// is simulated (Model::set_dispatch: sim::dispatch over `ep` virtual GPUs).
void Trainer::make_experts() {
  const int64_t ep = o_.dispatch.enabled ? o_.dispatch.ep : 1;
  const bool host_memory = model_->backend().uses_host_memory();
  const bool transport = o_.dispatch.enabled && o_.dispatch.config.transport != sim::Transport::capacity;
  if (distributed() && ep > 1) {
    if (world() % ep != 0) {
      throw ValueError("train", "ep", "a divisor of the " + std::to_string(world()) + " processes",
                       std::to_string(ep));
    }
    Comm group = ranks().split(rank() / static_cast<int>(ep));
    if (host_memory) {
      experts_ = std::make_unique<MpiExperts>(std::move(group), o_.dispatch.config, o_.verify_dispatch);
    } else {
      check_ep_transport(o_.dispatch.config, ep);  // capacity: the same refusal as on the host
      std::string why;
      experts_ = model_->backend().make_experts(std::move(group), o_.dispatch.config, transport_options(o_), why);
      if (!experts_) throw ValueError("train", "ep", why, std::to_string(ep) + " on backend " + o_.backend);
    }
    model_->set_expert_backend(experts_.get());
    return;
  }
  if (!host_memory && transport && !distributed() && ep == 1) {
    std::string why;
    experts_ = model_->backend().make_experts(ranks().split(0), o_.dispatch.config, transport_options(o_), why);
    if (experts_) {
      model_->set_expert_backend(experts_.get());
      return;
    }
  }
  if (o_.verify_dispatch) {
    throw ValueError("train", "verify_dispatch",
                     "expert parallelism across processes to check (several processes and ep > 1, or one process "
                     "with ep 1 on a backend with its own transport)",
                     std::to_string(world()) + " process(es) with ep " + std::to_string(ep) + " on backend " +
                         o_.backend);
  }
  model_->set_dispatch(o_.dispatch);
}

// --- data parallel -----------------------------------------------------------------

// The backend's collectives over the world's ZeRO shards (the CPU engine's
// boundaries, so checkpoints stay interchangeable), or ValueError saying why not.
void Trainer::make_backend_collectives() {
  shards_ = make_shard_plan(model_->params().layout(), world());
  std::string why;
  dp_ = model_->backend().make_collectives(ranks(), shards_.float_offsets(), shards_.float_counts(), why);
  if (!dp_) throw ValueError("train", "dp_collectives", why.empty() ? "host" : why, "backend");
  const ParamShard& my = shards_.shards[static_cast<size_t>(rank())];
  dp_shard_grads_ = model_->backend().allocate(sizeof(float) * static_cast<size_t>(std::max<int64_t>(my.floats, 1)));
}

void Trainer::setup_shards() {
  shards_ = make_shard_plan(model_->params().layout(), world());
  const ParamShard& my = shards_.shards[static_cast<size_t>(rank())];
  const auto layout = shard_layout(model_->params().layout(), my);
  shard_params_ = Arena(layout);
  shard_grads_ = Arena(layout);
  std::copy_n(model_->params().data() + my.offset, my.floats, shard_params_.data());
  opt_state_ = init_optimizer_state(shard_params_);  // ||W0|| of this rank's matrices only
}

Batch Trainer::my_slice(const Batch& global) const {
  if (!distributed()) return global;
  const auto [first, end] = sequence_slice(global.batch, world(), comm_->rank());
  Batch b;
  b.batch = end - first;
  b.seq = global.seq;
  const auto from = static_cast<std::ptrdiff_t>(first * global.seq), to = static_cast<std::ptrdiff_t>(end * global.seq);
  b.inputs.assign(global.inputs.begin() + from, global.inputs.begin() + to);
  b.targets.assign(global.targets.begin() + from, global.targets.begin() + to);
  b.doc_ids.assign(global.doc_ids.begin() + from, global.doc_ids.begin() + to);
  return b;
}

int64_t Trainer::target_count(const Batch& b) {
  return std::count_if(b.targets.begin(), b.targets.end(), [](int32_t t) { return t >= 0; });
}

void Trainer::backward_reducing() {
  reduce_scatter_ranges_ = 0;
  if (!dp_ && !distributed()) {
    model_->backward();
    return;
  }
  const std::vector<int64_t> offsets = shards_.float_offsets(), counts = shards_.float_counts();
  int64_t unsent_end = offsets.back() + counts.back();  // [0, unsent_end) not begun: the whole arena
  const auto start = [&](int64_t begin) {
    if (dp_) {
      dp_->start_reduce_scatter(dp_shard_grads_->as<float>(), model_->backend_grads(), begin, unsent_end);
    } else {
      const RangeParts p = range_parts(offsets, counts, begin, unsent_end);
      comm_->start_reduce_scatter_sum(model_->grads().data() + begin,
                                      shard_grads_.data() + p.shard_offsets[static_cast<size_t>(rank())],
                                      std::vector<int>(p.counts.begin(), p.counts.end()));
    }
    unsent_end = begin;
    ++reduce_scatter_ranges_;
  };
  // Host copies of a backend's gradients are current after its backward only.
  const bool overlap = o_.grad_bucket_mb > 0 && (dp_ || model_->backend().uses_host_memory());
  const double bucket_floats = o_.grad_bucket_mb * 1024 * 1024 / sizeof(float);
  Model::GradsFinal begin_final;
  if (overlap) {
    begin_final = [&](int64_t final_from) {
      if (static_cast<double>(unsent_end - final_from) >= bucket_floats) start(final_from);
    };
  }
  model_->backward(begin_final);
  if (unsent_end > 0) start(0);
}

// Wait for the gradients' reduce-scatter into this rank's shard, step the shard,
// all-gather the parameters. `norms` gets the global gradient norms per group.
void Trainer::reduce_and_step(GroupNorms& norms, int64_t step_no) {
  const std::vector<int> counts = shards_.floats();
  comm_->wait_started();
  double sq[4] = {0, 0, 0, 0};
  for (size_t i = 0; i < shard_grads_.layout().size(); ++i) {
    const TensorView t = shard_grads_.view(i);
    double s = 0;
    for (int64_t j = 0; j < t.numel; ++j) s += static_cast<double>(t.data[j]) * t.data[j];
    sq[static_cast<int>(t.spec->group)] += s;
  }
  comm_->allreduce_sum(sq, 4);
  for (int g = 0; g < 4; ++g) norms.by_group[g] = std::sqrt(sq[g]);
  check_global_norms(norms, step_no);
  const ParamShard& my = shards_.shards[static_cast<size_t>(comm_->rank())];
  std::copy_n(model_->params().data() + my.offset, my.floats, shard_params_.data());
  optimizer_->step(shard_params_, shard_grads_, opt_state_);
  comm_->allgatherv(shard_params_.data(), model_->params().data(), counts);
}

void Trainer::check_global_norms(const GroupNorms& norms, int64_t step_no) {
  for (int g = 0; g < 4; ++g) {
    if (std::isfinite(norms.by_group[g])) continue;
    const std::string op = model_->find_nonfinite_backward();  // every rank: the backward's exchanges are collective
    throw NonFiniteError("train: step " + std::to_string(step_no) + ": " + to_string(static_cast<OptGroup>(g)) +
                         " gradient norm is not finite; first op with a non-finite gradient on rank " +
                         std::to_string(rank()) + ": " + (op.empty() ? "none found" : op));
  }
}

// reduce_and_step in the backend's memory: the same shards, sums and update,
// no arena crosses to the host. The group norms' squares add over ranks (the
// shards tile the tensors), as the host path's per-tensor Σ g² do.
void Trainer::reduce_and_step_on_backend(GroupNorms& norms, int64_t step_no) {
  auto* shard_grads = dp_shard_grads_->as<float>();
  dp_->wait_reduce_scatter();
  const GroupNorms mine = backend_opt_->grad_norms(shard_grads);
  double sq[4];
  for (int g = 0; g < 4; ++g) sq[g] = mine.by_group[g] * mine.by_group[g];
  ranks().allreduce_sum(sq, 4);
  for (int g = 0; g < 4; ++g) norms.by_group[g] = std::sqrt(sq[g]);
  check_global_norms(norms, step_no);
  const ParamShard& my = shards_.shards[static_cast<size_t>(rank())];
  float* params = model_->backend_params();  // the host copy is stale from here on
  backend_opt_->step(params + my.offset, shard_grads, opt_state_.step);
  ++opt_state_.step;
  dp_->all_gather(params);
}

void Trainer::check_and_step(GroupNorms& gn, int64_t step_no, const std::function<void()>& optimizer_starts) {
  gn = backend_opt_ ? backend_opt_->grad_norms(model_->backend_grads()) : group_norms(model_->grads());
  for (int g = 0; g < 4; ++g) {
    if (std::isfinite(gn.by_group[g])) continue;
    const std::string op = model_->find_nonfinite_backward();
    throw NonFiniteError("train: step " + std::to_string(step_no) + ": " + to_string(static_cast<OptGroup>(g)) +
                         " gradient norm is not finite; first op with a non-finite gradient: " +
                         (op.empty() ? "none found" : op));
  }
  optimizer_starts();
  if (!backend_opt_) {
    optimizer_->step(model_->params(), model_->grads(), opt_state_);
    return;
  }
  // Resident: parameters, gradients and moments stay in the backend's memory.
  backend_opt_->step(model_->backend_params(), model_->backend_grads(), opt_state_.step);
  ++opt_state_.step;
}

void Trainer::write_run_json() const {
  std::error_code ec;
  fs::create_directories(o_.out_dir, ec);
  if (ec) throw UserError(o_.out_dir, "", "a creatable run directory", ec.message());
  nlohmann::json settings =
      run_settings(o_, graph_, model_->params().layout().fingerprint(), total_steps_, global_batch_, model_->seq());
  settings["processes"] = world();  // informational: any rank count may resume
  settings["identity"] = identity_;   // also in every checkpoint, which is what resume compares
  write_json_file_atomic((fs::path(o_.out_dir) / "run.json").string(), settings);
}

void Trainer::resume_from(const std::string& path) {
  // The run's settings must match: the schedule, batch and data order define the run.
  const std::string run_path = (fs::path(o_.out_dir) / "run.json").string();
  std::error_code ec;
  if (!fs::exists(run_path, ec)) throw UserError(run_path, "", "the run's settings (written by rackstep train)", "no such file");
  const nlohmann::json was = load_json_file(run_path);
  const nlohmann::json now =
      run_settings(o_, graph_, model_->params().layout().fingerprint(), total_steps_, global_batch_, model_->seq());
  for (const char* key : {"fingerprint", "steps", "batch", "seq", "seed", "lr_scale", "dispatch"}) {
    if (!was.contains(key) || was[key] != now[key]) {
      throw UserError(run_path, std::string("/") + key, "the value of this invocation, " + now[key].dump(),
                      was.contains(key) ? was[key].dump() : "none");
    }
  }
  CheckpointMeta meta;
  if (!sharded()) {
    load_checkpoint(path, model_->params(), opt_state_, meta);  // validates everything before writing
  } else {
    // Every rank reads the whole (single-process format) file and keeps its shard.
    OptimizerState full = init_optimizer_state(model_->params());
    load_checkpoint(path, model_->params(), full, meta);
    const ParamShard& my = shards_.shards[static_cast<size_t>(rank())];
    std::copy_n(model_->params().data() + my.offset, my.floats, shard_params_.data());
    opt_state_.step = full.step;
    std::copy_n(full.momentum.data() + my.offset, my.floats, opt_state_.momentum.data());
    std::copy_n(full.second_moment.data() + my.v_offset, my.v_floats, opt_state_.second_moment.data());
    std::copy_n(full.w0_norm.begin() + my.w0_offset, my.w0_count, opt_state_.w0_norm.begin());
  }
  check_identity(path, meta.identity);
  if (meta.rng_state != to_bytes(&o_.seed, sizeof o_.seed)) {
    throw UserError(path, "", "a checkpoint of a run with seed " + std::to_string(o_.seed), "another seed");
  }
  if (meta.qb_state.size() % sizeof(float) != 0) throw UserError(path, "", "a whole number of QB biases", "a ragged QB section");
  std::vector<float> qb(meta.qb_state.size() / sizeof(float));
  std::memcpy(qb.data(), meta.qb_state.data(), meta.qb_state.size());
  model_->set_balancing_state(qb);
  train_->set_position(meta.data_position);
}

// Newer checkpoints than `valid` failed validation (`notes` says why). Refused
// unless --resume-fallback; then they are moved aside (kept as *.corrupt, so
// the next resume does not meet them again) and the run continues from `valid`.
void Trainer::fall_back_past_invalid(const std::string& valid, const std::vector<std::string>& notes) {
  const std::string& why = notes.front();  // "skipping an unusable checkpoint: <file>: <reason>"
  const std::string reason = why.substr(why.find(": ") + 2);
  if (!o_.resume_fallback) {
    throw UserError(reason + "; the newest valid checkpoint is " + fs::path(valid).filename().string() +
                    " (resume from it with --resume-fallback)");
  }
  if (!is_root()) return;
  for (const std::string& n : notes) std::fprintf(stderr, "rackstep: %s\n", n.c_str());
  for (const std::string& path : checkpoints_newest_first(o_.out_dir)) {
    if (path == valid) break;
    std::error_code ec;
    fs::rename(path, path + ".corrupt", ec);
    std::fprintf(stderr, "rackstep: moved %s aside to %s.corrupt%s\n", path.c_str(), path.c_str(),
                 ec ? (": " + ec.message()).c_str() : "");
  }
}

// The checkpoint's dataset and layout against this invocation's (exec/run_identity.h).
void Trainer::check_identity(const std::string& path, const std::string& saved_text) {
  if (saved_text.empty()) {
    if (is_root()) {
      std::fprintf(stderr, "rackstep: %s records no dataset identity (an older checkpoint): the dataset is not checked\n",
                   path.c_str());
    }
    return;
  }
  nlohmann::json saved;
  try {
    saved = nlohmann::json::parse(saved_text);
  } catch (const nlohmann::json::exception&) {
    throw UserError(path, "", "a run identity section of JSON text", "other bytes");
  }
  const std::vector<std::string> diffs = identity_differences(saved, identity_, o_.data_dir);
  if (diffs.empty()) return;
  std::string layout_diffs, data_diffs;
  for (const std::string& d : diffs) {
    std::string& to = d.rfind("layout", 0) == 0 ? layout_diffs : data_diffs;
    to += (to.empty() ? "" : "; ") + d;
  }
  if (!layout_diffs.empty()) throw UserError(path, "", "a checkpoint of this layout", layout_diffs);
  if (!o_.allow_data_change) {
    throw UserError(path, "", "a checkpoint of this dataset (unless this run allows a data change)",
                    data_diffs);
  }
  if (!is_root()) return;
  std::fprintf(stderr, "rackstep: data change allowed: continuing on other data: %s\n", data_diffs.c_str());
  append_log({{"event", "data_change"},
              {"step", opt_state_.step},
              {"checkpoint", path},
              {"from", saved["dataset"]},
              {"to", identity_["dataset"]}});
}

bool Trainer::done() const {
  if (opt_state_.step >= total_steps_) return true;
  return o_.stop_after > 0 && opt_state_.step - started_at_ >= o_.stop_after;
}

StepLog Trainer::step() {
  StepLog s;
  const Batch global = train_->next_batch(global_batch_);
  const Batch b = my_slice(global);
  if (distributed()) model_->set_loss_tokens(target_count(global));
  const bool profiling = profiler_ && opt_state_.step - started_at_ < o_.profile_steps;
  if (profiling) profiler_->begin_step(opt_state_.step);
  if (!profiling && profiler_) {
    model_->set_op_timer(nullptr);
    if (dp_) dp_->set_brackets(nullptr);
  }
  const auto t0 = Clock::now();
  model_->zero_grads();
  model_->set_training(true);
  LossResult r = model_->forward(b.inputs.data(), b.targets.data(), b.doc_ids.data());
  const int64_t step_no = opt_state_.step + 1;
  if (trace_train_ && step_no % o_.routing_trace_every == 0) trace_train_->record(*model_, b, step_no);
  if (distributed()) {
    // Slices' losses are shares of the global mean; drops are each rank's own assignments.
    double sums[4] = {r.ce, r.z_loss, r.router_z_loss / world(), r.router_loss};
    comm_->allreduce_sum(sums, 4);
    r.ce = sums[0];
    r.z_loss = sums[1];
    r.router_z_loss = sums[2];
    r.router_loss = sums[3];
    r.loss = r.ce + r.z_loss + r.router_loss;
    int64_t d[4] = {r.drops.assignments, r.drops.sender, r.drops.receiver, r.drops.padding};
    comm_->allreduce_sum(d, 4);
    r.drops = {d[0], d[1], d[2], d[3]};
  }
  if (!std::isfinite(r.loss)) {
    const std::string op = model_->find_nonfinite_forward(b.inputs.data(), b.targets.data(), b.doc_ids.data());
    throw NonFiniteError("train: step " + std::to_string(step_no) + ": loss is " + std::to_string(r.loss) +
                         "; first op with a non-finite output: " + (op.empty() ? "none found" : op));
  }
  backward_reducing();
  s.lr_adam = optimizer_->lr(OptGroup::kAdam, opt_state_.step);
  s.lr_muonh = optimizer_->lr(OptGroup::kMuonH, opt_state_.step);
  if (distributed()) {
    // Quantile balancing counts the whole global batch (integer sums: exact).
    for (auto& [hist, n] : model_->balancing_histograms()) comm_->allreduce_sum(hist, static_cast<int>(n));
  }
  GroupNorms gn;
  // The profile's optimizer slice: from here (after the gradient norms where
  // they are checked first) to the end of the balancing update.
  const auto optimizer_starts = [&] {
    if (profiling) profiler_->begin_optimizer();
  };
  if (dp_) {
    optimizer_starts();
    reduce_and_step_on_backend(gn, step_no);  // checks the norms itself
  } else if (distributed()) {
    optimizer_starts();
    reduce_and_step(gn, step_no);  // checks the norms itself
  } else {
    check_and_step(gn, step_no, optimizer_starts);
  }
  model_->update_balancing();
  if (profiling) profiler_->end_optimizer();
  const auto t1 = Clock::now();
  if (profiling) {
    profiler_->record_routing(*model_, b.doc_ids.data());
    profiler_->end_step();
  }
  s.step = opt_state_.step;
  s.loss = r.loss;
  s.ce = r.ce;
  s.z_loss = r.z_loss;
  s.router_z_loss = r.router_z_loss;
  for (int g = 0; g < 4; ++g) s.grad_norm[g] = gn.by_group[g];
  s.drops = r.drops;
  s.step_s = std::chrono::duration<double>(t1 - t0).count();
  if (comm_) comm_->allreduce_max(&s.step_s, 1);  // the step ends when the slowest rank does
  s.tokens_per_s = static_cast<double>(global_batch_ * model_->seq()) / s.step_s;
  s.mfu = flops_per_token_ * s.tokens_per_s / peak_flops_;
  return s;
}

double Trainer::evaluate() {
  if (!eval_) return std::nan("");
  const int64_t n = std::min(o_.eval_batches, eval_->eval_batches(global_batch_));
  if (n < 1) return std::nan("");
  model_->set_training(false);
  model_->set_op_timer(nullptr);  // evals are not part of the step profile
  double sum = 0.0;
  if (trace_eval_) trace_eval_->clear();  // the trace holds the last evaluation
  for (int64_t i = 0; i < n; ++i) {
    const Batch global = eval_->eval_batch(i, global_batch_);
    const Batch b = my_slice(global);
    if (distributed()) model_->set_loss_tokens(target_count(global));
    sum += model_->forward(b.inputs.data(), b.targets.data(), b.doc_ids.data()).ce;
    if (trace_eval_) trace_eval_->record(*model_, b, opt_state_.step);
  }
  if (trace_eval_) trace_eval_->write();
  if (comm_) comm_->allreduce_sum(&sum, 1);
  model_->set_training(true);
  if (profiler_ && opt_state_.step - started_at_ < o_.profile_steps) profiler_->attach(*model_);
  return sum / static_cast<double>(n);
}

std::string Trainer::save_checkpoint() {
  if (o_.out_dir.empty()) throw ValueError("train", "out_dir", "a run directory for the checkpoints", "none");
  std::unique_ptr<OptimizerState> gathered;
  const OptimizerState* state = &opt_state_;
  if (backend_opt_) backend_opt_->save_state(opt_state_);  // this rank's moments (its shard's, when sharded)
  if (sharded()) {
    // Rank 0 assembles the single-process state: shards tile every arena in rank order.
    if (is_root()) gathered = std::make_unique<OptimizerState>(init_optimizer_state(model_->params()));
    const Comm& c = ranks();
    c.gatherv(opt_state_.momentum.data(), gathered ? gathered->momentum.data() : nullptr, shards_.floats());
    c.gatherv(opt_state_.second_moment.data(), gathered ? gathered->second_moment.data() : nullptr,
              shards_.v_floats());
    c.gatherv(opt_state_.w0_norm.data(), gathered ? gathered->w0_norm.data() : nullptr, shards_.w0_counts());
    if (gathered) gathered->step = opt_state_.step;
    state = gathered.get();
  }
  CheckpointMeta meta;
  meta.step = opt_state_.step;
  meta.rng_state = to_bytes(&o_.seed, sizeof o_.seed);
  meta.data_position = train_->position();
  const std::vector<float> qb = model_->balancing_state();
  meta.qb_state = to_bytes(qb.data(), qb.size() * sizeof(float));
  meta.identity = identity_.dump();
  const std::string path = (fs::path(o_.out_dir) / checkpoint_name(opt_state_.step)).string();
  if (is_root()) exec::save_checkpoint(path, std::as_const(*model_).params(), *state, meta);  // reads: stays resident
  if (comm_) comm_->barrier();  // the file exists for every rank once this returns
  return path;
}

void Trainer::append_log(const nlohmann::json& line) const {
  if (o_.out_dir.empty() || !is_root()) return;
  // Opened per line (a few per step): each write is checked, a full disk stops the run at once.
  AppendFile((fs::path(o_.out_dir) / "log.jsonl").string()).append(line.dump() + "\n");
}

void Trainer::write_routing_trace() const {
  if (trace_train_) trace_train_->write();
}

void Trainer::write_profile() const {
  if (!profiler_ || o_.out_dir.empty()) return;
  profiler_->write(o_.out_dir);
}

// --- the command -------------------------------------------------------------------

namespace {

std::string step_line(const StepLog& s, int64_t total) {
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "step %5lld/%-5lld loss %.4f (ce %.4f z %.5f) rz %.3f |g| muonh %.3f adamh %.3f adam %.3f "
                "drop %.2f%% %7.0f tok/s MFU %5.1f%% %6.0f ms",
                static_cast<long long>(s.step), static_cast<long long>(total), s.loss, s.ce, s.z_loss,
                s.router_z_loss, s.grad_norm[0], s.grad_norm[2], s.grad_norm[3], 100.0 * s.drops.fraction(),
                s.tokens_per_s, 100.0 * s.mfu, 1e3 * s.step_s);
  return buf;
}

}  // namespace

int run_training(const TrainOptions& options, const TrainOutput& out, const Comm* comm) {
  Trainer t(options, comm);
  const bool root = t.is_root();  // only rank 0 prints (and writes, see Trainer)
  const auto& m = t.graph().model;
  const models::ParamCounts pc = models::count_params(t.graph());
  if (!out.json && root) {
    std::printf("model %s: %.2fM params (%.2fM active), %lld x %lld tokens/step, %.3f MFLOP/token (training, Marin)\n",
                m.name.c_str(), pc.total / 1e6, pc.active / 1e6, static_cast<long long>(t.global_batch()),
                static_cast<long long>(t.model().seq()), t.model_flops_per_token() / 1e6);
    std::printf("threads %d, measured sgemm peak %.1f GFLOP/s, unigram entropy %.4f nats/token, steps %lld%s\n",
                current_threads(), t.peak_flops() / 1e9, t.unigram_entropy_nats(),
                static_cast<long long>(t.total_steps()),
                options.resume ? (", resumed at step " + std::to_string(t.step_index())).c_str() : "");
    if (!t.placement_only().empty()) {
      std::string fields;
      for (const std::string& f : t.placement_only()) fields += (fields.empty() ? "" : ", ") + f;
      std::printf("layout fields not applied (memory placement only, the math is the same): %s\n", fields.c_str());
    }
    if (t.world() > 1) {
      const bool ep = t.dispatch().enabled && t.dispatch().ep > 1;
      std::printf("processes %d: data parallel over %lld sequences each, ZeRO optimizer shards%s\n", t.world(),
                  static_cast<long long>(t.model().batch()),
                  ep ? (", expert parallel " + std::to_string(t.dispatch().ep) + " (" +
                        sim::transport_name(t.dispatch().config.transport) + " transport)")
                           .c_str()
                     : "");
    }
    std::fflush(stdout);
  }
  nlohmann::json history = nlohmann::json::array(), evals = nlohmann::json::array(),
                 checkpoints = nlohmann::json::array();
  double last_eval = std::nan("");
  int64_t last_eval_step = -1, last_ckpt_step = -1;
  double tok_s_sum = 0, mfu_sum = 0;
  int64_t counted = 0;
  StepLog last;
  bool first = true;
  const int64_t newline_every = std::max<int64_t>(1, t.total_steps() / 20);
  auto run_eval = [&] {
    last_eval = t.evaluate();
    last_eval_step = t.step_index();
    if (std::isnan(last_eval)) return;
    const nlohmann::json e = {{"step", t.step_index()}, {"eval_loss", last_eval}};
    evals.push_back(e);
    t.append_log(e);
    if (!out.json && root) {
      if (out.progress) std::printf("\r\x1b[K");
      std::printf("eval  %5lld        loss %.4f (unigram entropy %.4f)\n", static_cast<long long>(t.step_index()),
                  last_eval, t.unigram_entropy_nats());
      std::fflush(stdout);
    }
  };
  auto checkpoint = [&] {
    const std::string path = t.save_checkpoint();
    last_ckpt_step = t.step_index();
    checkpoints.push_back(path);
    if (!out.json && root) {
      if (out.progress) std::printf("\r\x1b[K");
      std::printf("checkpoint %s\n", path.c_str());
      std::fflush(stdout);
    }
  };
  while (!t.done()) {
    last = t.step();
    if (!first) {  // the first step of an invocation runs cold (page faults, thread start)
      tok_s_sum += last.tokens_per_s;
      mfu_sum += last.mfu;
      ++counted;
    }
    first = false;
    history.push_back(last.to_json());
    t.append_log(last.to_json());
    if (!out.json && root) {
      const std::string line = step_line(last, t.total_steps());
      if (out.progress) {
        const bool keep = last.step % newline_every == 0 || t.done();
        std::printf("\r\x1b[K%s%s", line.c_str(), keep ? "\n" : "");
      } else {
        std::printf("%s\n", line.c_str());
      }
      std::fflush(stdout);
    }
    if (options.eval_every > 0 && last.step % options.eval_every == 0) run_eval();
    if (options.checkpoint_every > 0 && !options.out_dir.empty() && last.step % options.checkpoint_every == 0) {
      checkpoint();
    }
  }
  if (last_eval_step != t.step_index()) run_eval();
  if (!options.out_dir.empty() && last_ckpt_step != t.step_index()) checkpoint();
  t.write_profile();
  t.write_routing_trace();
  if (!root) return 0;
  if (out.json) {
    nlohmann::json doc = {{"model", m.name},
                          {"params", pc.total},
                          {"batch", t.global_batch()},
                          {"processes", t.world()},
                          {"verified_dispatch_layers", t.verified_dispatch_layers()},
                          {"dispatch", options.layout_path.empty() && !options.dispatch.enabled
                                           ? nlohmann::json(nullptr)
                                           : nlohmann::json{{"ep", t.dispatch().ep},
                                                            {"transport", sim::transport_name(t.dispatch().config.transport)},
                                                            {"sender_cf", t.dispatch().config.sender_cf},
                                                            {"receiver_cf", t.dispatch().config.receiver_cf},
                                                            {"waves", t.dispatch().config.waves},
                                                            {"experts", t.dispatch().config.n_experts},
                                                            {"top_k", t.dispatch().config.top_k}}},
                          {"layout_not_applied", t.placement_only()},
                          {"seq", t.model().seq()},
                          {"threads", current_threads()},
                          {"sgemm_peak_flops_per_s", t.peak_flops()},
                          {"model_flops_per_token", t.model_flops_per_token()},
                          {"unigram_entropy_nats_per_token", t.unigram_entropy_nats()},
                          {"total_steps", t.total_steps()},
                          {"steps", history},
                          {"evals", evals},
                          {"checkpoints", checkpoints},
                          {"final",
                           {{"step", t.step_index()},
                            {"loss", history.empty() ? nlohmann::json(nullptr) : nlohmann::json(last.loss)},
                            {"eval_loss", std::isnan(last_eval) ? nlohmann::json(nullptr) : nlohmann::json(last_eval)},
                            {"mean_tokens_per_s", counted ? tok_s_sum / counted : 0.0},
                            {"mean_mfu", counted ? mfu_sum / counted : 0.0}}}};
    std::printf("%s\n", doc.dump(2).c_str());
    return 0;
  }
  if (counted > 0) {
    std::printf("done: %lld steps, mean %.0f tokens/s, MFU %.1f%% of the measured sgemm peak",
                static_cast<long long>(t.step_index()), tok_s_sum / counted, 100.0 * mfu_sum / counted);
    if (!std::isnan(last_eval)) std::printf(", eval loss %.4f vs unigram %.4f nats", last_eval, t.unigram_entropy_nats());
    std::printf("\n");
  }
  return 0;
}

// --- reference dump ----------------------------------------------------------------

void add_step_inputs(TensorDump& dump, const Model& model, const models::ModelConfig& m, const Batch& b) {
  const int64_t B = model.batch(), T = model.seq();
  dump.add_i32("batch.tokens", {B, T}, b.inputs.data());
  dump.add_i32("batch.targets", {B, T}, b.targets.data());
  dump.add_i32("batch.doc", {B, T}, b.doc_ids.data());
  dump.add_i32("batch.pos", {B, T}, model.positions());
  dump.add_arena("param.", model.params());
  for (int l = 0; l < m.layers; ++l) {
    if (const float* bias = model.balancing_bias(l)) {
      dump.add_f32("buffer.layers." + std::to_string(l) + ".moe.router.bias", {m.moe.experts}, bias);
    }
  }
}

void write_reference_dump(const TrainOptions& options, const std::string& dir) {
  TrainOptions o = options;
  o.out_dir.clear();
  o.resume = false;
  o.profile = false;
  Trainer t(o);
  Model& model = t.model();
  const auto& m = t.graph().model;
  const int64_t B = model.batch(), T = model.seq(), N = model.tokens();
  const Batch b = t.loader().next_batch(B);

  TensorDump dump;
  add_step_inputs(dump, model, m, b);
  model.zero_grads();
  model.set_training(true);
  const LossResult r = model.forward(b.inputs.data(), b.targets.data(), b.doc_ids.data());
  model.backward();
  for (int l = 0; l < m.layers; ++l) {
    if (const int32_t* e = model.routed_experts(l)) {
      dump.add_i32("route.layers." + std::to_string(l) + ".moe.expert", {N, m.moe.top_k}, e);
    }
  }
  dump.add_f32("logits", {B, T, m.vocab}, model.logits());
  dump.add_scalar("loss", r.loss);
  dump.add_scalar("ce", r.ce);
  dump.add_scalar("z_loss", r.z_loss);
  dump.add_arena("grad.", model.grads());
  const Optimizer& opt = t.optimizer();
  nlohmann::json lr = {{"muonh", opt.lr(OptGroup::kMuonH, 0)},
                       {"muon", opt.lr(OptGroup::kMuon, 0)},
                       {"adamh", opt.lr(OptGroup::kAdamH, 0)},
                       {"adam", opt.lr(OptGroup::kAdam, 0)}};
  Optimizer step_opt(opt.config());
  step_opt.step(model.params(), model.grads(), t.optimizer_state());
  dump.add_arena("after.", model.params());
  auto& meta = dump.meta();
  meta["model"] = o.model_path;
  meta["model_name"] = m.name;
  meta["seed"] = o.seed;
  meta["threads"] = current_threads();
  meta["lr"] = lr;
  meta["beta1"] = opt.config().beta1;
  meta["beta2"] = opt.config().beta2;
  meta["adam_eps"] = opt.config().eps;
  meta["adam_weight_decay"] = opt.config().adam_weight_decay;
  meta["ns_steps"] = opt.config().ns_steps;
  meta["norm_eps"] = m.norm.eps;
  meta["qk_norm_eps"] = m.norm.eps;
  meta["qk_norm_multiplier"] = m.attention.qk_norm_multiplier;
  meta["xsa_eps"] = kXsaEps;
  meta["rope_theta"] = m.attention.rope_theta;
  // The q/k head dim: MLA appends the RoPE key dims to each head.
  const int64_t qk_hd =
      m.attention.head_dim + (m.attention.kind == models::AttentionKind::kMla ? m.attention.mla_rope_dim : 0);
  auto rot_dims = [&](const models::AttentionLayerKind& k) {
    return k.position == models::PositionKind::kRope ? std::lround(k.rope_fraction * static_cast<double>(qk_hd)) : 0L;
  };
  meta["rot_dims_local"] = rot_dims(m.attention.local);
  meta["rot_dims_global"] = rot_dims(m.attention.global);
  meta["attn_scale"] = 1.0 / std::sqrt(static_cast<double>(qk_hd));
  meta["router_loss"] = r.router_loss;
  meta["logit_z_loss_weight"] = m.logit_z_loss_weight;
  meta["routing_weight_sum"] = m.moe.routing_weight_sum;
  meta["router_z_loss"] = r.router_z_loss;
  meta["positions"] = "token index inside its sequence";
  meta["kv_projection"] = "K and V projected at the stored KV width; global layers read the first kv_used heads";
  meta["qb_bias"] = "zero at the first step; afterwards from the previous step's logit histogram";
  dump.write(dir);
}

}  // namespace rackstep::exec
