#include "exec/profiler.h"

#include <algorithm>
#include <filesystem>
#include <optional>

#include "exec/microbench.h"
#include "sim/base/check.h"
#include "sim/base/json_io.h"
#include "sim/slice_name.h"
#include "sim/base/trace.h"

namespace rackstep::exec {

using models::OpClass;

Profiler::Profiler(const models::LayerGraph& graph, int64_t batch, int64_t seq, int threads)
    : graph_(&graph), batch_(batch), seq_(seq), threads_(threads), origin_(Clock::now()) {}

void Profiler::attach(Model& model) {
  backend_ = &model.backend();
  if (!timing_) timing_ = model.backend().make_op_timing();
  model.set_op_brackets(this);
}

void Profiler::begin_step(int64_t step) {
  RS_CHECK(timing_ != nullptr, "Profiler::begin_step before attach");
  step_ = step;
  pending_.clear();
  step_cpu0_ = process_cpu_seconds();
  step_wall0_ = Clock::now();  // the step's slices sit here plus their offsets from the clock's mark, taken next
  timing_->begin_step();
}

void Profiler::end_step() {
  const StepTiming t = timing_->end_step();  // waits for the step's work
  RS_CHECK(t.intervals.size() == pending_.size(), "Profiler: the clock's intervals do not match the brackets");
  const double step_start_s = since_origin(step_wall0_);
  for (size_t i = 0; i < pending_.size(); ++i) {
    const auto [op, phase] = pending_[i];
    const Slice s{op, phase, step_, step_start_s + t.intervals[i].start_s, t.intervals[i].duration_s};
    (phase == kCollective ? collective_slices_ : slices_).push_back(s);
  }
  pending_.clear();
  ++steps_;
  step_wall_s_.push_back(std::chrono::duration<double>(Clock::now() - step_wall0_).count());
  step_cpu_s_.push_back(process_cpu_seconds() - step_cpu0_);
  step_device_s_.push_back(t.span_s);
}

void Profiler::begin_op(size_t op, int phase) {
  pending_.push_back({op, phase});
  timing_->begin();
}
void Profiler::end_op(size_t /*op*/, int /*phase*/) { timing_->end(); }

void Profiler::begin_collective(const char* name, void* queue) {
  const auto it = std::find(collective_names_.begin(), collective_names_.end(), name);
  pending_.push_back({static_cast<size_t>(it - collective_names_.begin()), kCollective});
  if (it == collective_names_.end()) collective_names_.push_back(name);
  timing_->begin_on(queue);
}
void Profiler::end_collective(void* queue) { timing_->end_on(queue); }

void Profiler::begin_optimizer() { begin_op(0, 2); }
void Profiler::end_optimizer() { end_op(0, 2); }

void Profiler::record_routing(const Model& model, const int32_t* doc_ids) {
  const auto& m = graph_->model;
  const int k = static_cast<int>(m.moe.top_k);
  const int64_t E = m.moe.experts;
  for (int layer = 0; layer < m.layers; ++layer) {
    const int32_t* expert = model.routed_experts(layer);  // (N, k)
    if (!expert) continue;
    for (auto* h : {&by_sequence_[layer], &by_document_[layer]}) {
      h->n_experts = E;
      h->top_k = k;
      h->source = "rackstep train, model " + m.name + ", layer " + std::to_string(layer) + ", profiled steps";
    }
    by_sequence_[layer].unit = "sequence";
    by_document_[layer].unit = "document";
    for (int64_t b = 0; b < batch_; ++b) {
      std::vector<int32_t> seq_counts(static_cast<size_t>(E), 0);
      std::vector<int32_t> doc_counts(static_cast<size_t>(E), 0);
      int64_t doc_tokens = 0;
      auto flush_doc = [&] {
        if (doc_tokens == 0) return;
        auto& h = by_document_[layer];
        h.tokens.push_back(doc_tokens);
        h.counts.insert(h.counts.end(), doc_counts.begin(), doc_counts.end());
        std::fill(doc_counts.begin(), doc_counts.end(), 0);
        doc_tokens = 0;
      };
      for (int64_t t = 0; t < seq_; ++t) {
        const int64_t n = b * seq_ + t;
        if (t > 0 && doc_ids && doc_ids[n] != doc_ids[n - 1]) flush_doc();
        for (int j = 0; j < k; ++j) {
          ++seq_counts[static_cast<size_t>(expert[n * k + j])];
          ++doc_counts[static_cast<size_t>(expert[n * k + j])];
        }
        ++doc_tokens;
      }
      flush_doc();
      auto& h = by_sequence_[layer];
      h.tokens.push_back(seq_);
      h.counts.insert(h.counts.end(), seq_counts.begin(), seq_counts.end());
    }
  }
}

namespace {

const char* const kPhase[] = {"forward", "backward", "optimizer"};

bool is_gemm(OpClass c) { return c == OpClass::kGemm || c == OpClass::kGroupedGemm; }

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

std::map<std::string, double> Profiler::seconds_by_class() const {
  std::map<std::string, double> out;
  for (const Slice& s : slices_) {
    const std::string key = s.phase == 2 ? "optimizer" : models::to_string(graph_->ops[s.op].op_class);
    out[key] += s.duration_s;
  }
  return out;
}

double Profiler::gemm_flops() const {
  double flops = 0.0;
  for (const Slice& s : slices_) {
    if (s.phase == 2 || !is_gemm(graph_->ops[s.op].op_class)) continue;
    const models::OpCost c = models::op_cost(graph_->ops[s.op], batch_, seq_, 4.0, 4.0);
    flops += s.phase == 0 ? c.fwd_flops : c.bwd_flops;
  }
  return flops;
}

double Profiler::total_seconds() const {
  double t = 0.0;
  for (const Slice& s : slices_) t += s.duration_s;
  return t;
}

void Profiler::write(const std::string& dir) const {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw UserError(dir, "", "a directory for the profile", ec.message());
  const std::optional<DeviceMemory> mem = backend_ ? backend_->device_memory() : std::nullopt;

  sim::TraceWriter w;
  const int pid = w.process(mem ? "gpu0" : "cpu0");
  const int tid = w.thread(pid, "compute");
  for (const Slice& s : slices_) {
    if (s.phase == 2) {
      w.complete(pid, tid, "optimizer", kPhase[2], s.start_s, s.duration_s,
                 {{"step", s.step}, {"op", "optimizer"}, {"op_class", "optimizer"}});
      continue;
    }
    const models::Op& op = graph_->ops[s.op];
    w.complete(pid, tid, sim::slice_name(op, s.phase == 0 ? sim::Pass::kForward : sim::Pass::kBackward), kPhase[s.phase],
               s.start_s, s.duration_s,
               {{"step", s.step},
                {"op", op.name},
                {"op_class", models::to_string(op.op_class)},
                {"kind", models::to_string(op.kind)},
                {"class", models::to_string(op.op_class)}});
  }
  if (!collective_slices_.empty()) {
    const int lane = w.thread(pid, "collectives");
    for (const Slice& s : collective_slices_) {
      w.complete(pid, lane, collective_names_[s.op], "communication", s.start_s, s.duration_s, {{"step", s.step}});
    }
  }
  w.metadata("model", graph_->model.name);
  w.metadata("device", mem ? mem->device : std::string("cpu"));
  w.metadata("threads", threads_);
  w.metadata("batch", batch_);
  w.metadata("seq", seq_);
  w.write((fs::path(dir) / "trace.json").string());

  write_json_file_atomic((fs::path(dir) / "op_measurements.json").string(), measurements());

  for (const auto* hists : {&by_sequence_, &by_document_}) {
    for (const auto& [layer, h] : *hists) {
      if (h.tokens.empty()) continue;
      sim::write_routing_histogram(
          (fs::path(dir) / ("routing-layer" + std::to_string(layer) + "-" + h.unit + ".json")).string(), h);
    }
  }
}

nlohmann::json Profiler::measurements() const {
  // Median seconds per (op, phase).
  std::map<std::pair<size_t, int>, std::vector<double>> samples;
  for (const Slice& s : slices_) samples[{s.op, s.phase}].push_back(s.duration_s);
  nlohmann::json ops = nlohmann::json::array();
  for (const auto& [key, secs] : samples) {
    const auto [i, phase] = key;
    if (phase == 2) {
      ops.push_back({{"op", "optimizer"}, {"kind", "optimizer"}, {"class", "optimizer"}, {"phase", "optimizer"},
                     {"seconds", median(secs)}, {"seconds_min", *std::min_element(secs.begin(), secs.end())},
                     {"samples", secs.size()}});
      continue;
    }
    const models::Op& op = graph_->ops[i];
    const models::OpCost c = models::op_cost(op, batch_, seq_, 4.0, 4.0);
    const double flops = phase == 0 ? c.fwd_flops : c.bwd_flops;
    // Backward reads what forward read plus the output gradient, and writes the input gradients.
    const double bytes = phase == 0 ? c.bytes_read + c.bytes_written : 2.0 * (c.bytes_read + c.bytes_written);
    nlohmann::json params = nlohmann::json::array();
    for (const auto& p : op.params) params.push_back(p.shape);
    const double sec = median(secs);
    ops.push_back({{"op", op.name},
                   {"kind", models::to_string(op.kind)},
                   {"class", models::to_string(op.op_class)},
                   {"layer", op.layer},
                   {"phase", kPhase[phase]},
                   {"in_shape", op.in_shape(batch_, seq_)},
                   {"out_shape", op.out_shape(batch_, seq_)},
                   {"param_shapes", params},
                   {"flops", flops},
                   {"bytes", bytes},
                   {"seconds", sec},
                   {"seconds_min", *std::min_element(secs.begin(), secs.end())},
                   {"samples", secs.size()},
                   {"gflop_per_s", sec > 0 ? flops / sec / 1e9 : 0.0}});
  }
  nlohmann::json doc = {{"format", "rackstep.op_measurements/1"},
                        {"device", "cpu"},
                        {"dtype", "f32"},
                        {"threads", threads_},
                        {"model", graph_->model.name},
                        {"batch", batch_},
                        {"seq", seq_},
                        {"steps", steps_},
                        {"peak_rss_bytes", peak_rss_bytes()},
                        {"step_wall_s", step_wall_s_},
                        {"step_cpu_s", step_cpu_s_},
                              {"ops", ops}};
  // A device adds fields only (exec/profiler.h): readers of the CPU's file see it unchanged.
  const std::optional<DeviceMemory> mem = backend_ ? backend_->device_memory() : std::nullopt;
  if (mem) {
    doc["device"] = mem->device;
    doc["dtype"] = dtype_;
    doc["peak_device_bytes"] = mem->peak_bytes;
    if (mem->used_at_peak_bytes >= 0) doc["device_used_at_peak_bytes"] = mem->used_at_peak_bytes;
    doc["device_total_bytes"] = mem->total_bytes;
  }
  if (timing_ && timing_->clock() != "host") {
    doc["op_clock"] = timing_->clock();
    doc["step_device_s"] = step_device_s_;
  }
  return doc;
}

}  // namespace rackstep::exec
