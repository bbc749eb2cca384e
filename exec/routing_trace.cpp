#include "exec/routing_trace.h"

#include <utility>

#include "sim/base/check.h"

namespace rackstep::exec {

RoutingTraceRecorder::RoutingTraceRecorder(const models::LayerGraph& graph, int64_t seq, bool eval, std::string path,
                                           int64_t max_tokens)
    : path_(std::move(path)), max_tokens_(max_tokens) {
  const auto& m = graph.model;
  if (m.moe.experts <= 0) throw UserError("routing trace: expected a model with routed experts; " + m.name + " has none");
  if (m.moe.experts > 65535) throw UserError("routing trace: expert ids are stored as u16: expected at most 65535 experts");
  trace_.n_experts = m.moe.experts;
  trace_.top_k = static_cast<int>(m.moe.top_k);
  trace_.seq_len = seq;
  trace_.eval = eval;
  trace_.source = std::string("rackstep train, model ") + m.name + ", seq " + std::to_string(seq) + ", " +
                  (eval ? "last evaluation (consecutive eval windows)" : "training steps");
  for (size_t i = 0; i < graph.ops.size(); ++i) {
    if (graph.ops[i].kind != models::OpKind::kTopK) continue;
    topk_ops_.push_back(i);
    trace_.layer_index.push_back(graph.ops[i].layer);
  }
  RS_CHECK(!topk_ops_.empty(), "a model with routed experts has top-k ops");
  trace_.experts.resize(topk_ops_.size());
  trace_.scores.resize(topk_ops_.size());
}

void RoutingTraceRecorder::clear() {
  trace_.tokens.clear();
  for (auto& e : trace_.experts) e.clear();
  for (auto& s : trace_.scores) s.clear();
  next_sequence_ = 0;
}

void RoutingTraceRecorder::record(const CpuModel& model, const Batch& b, int64_t step) {
  const int64_t n = b.batch * b.seq;
  RS_CHECK(b.seq == trace_.seq_len, "the model runs at the trace's sequence length");
  if (trace_.token_count() + n > max_tokens_)
    throw UserError("routing trace " + path_ + ": would exceed at most " + std::to_string(max_tokens_) +
                    " tokens; record fewer steps (a longer interval between recorded steps) or eval batches");
  const int k = trace_.top_k;
  for (int64_t r = 0; r < b.batch; ++r) {
    for (int64_t t = 0; t < b.seq; ++t) {
      const int32_t doc = b.doc_ids.empty() ? 0 : b.doc_ids[static_cast<size_t>(r * b.seq + t)];
      trace_.tokens.push_back({static_cast<uint32_t>(step), next_sequence_, static_cast<uint32_t>(t),
                               static_cast<uint32_t>(doc)});
    }
    ++next_sequence_;
  }
  for (size_t l = 0; l < topk_ops_.size(); ++l) {
    const int32_t* expert = model.routed_experts(trace_.layer_index[l]);  // (N, k)
    int64_t width = 0;
    const float* weight = model.op_output(topk_ops_[l], &width);  // (N, k) combine weights
    RS_CHECK(expert && weight && width == k, "a top-k op writes (N, k) weights next to its experts");
    auto& e = trace_.experts[l];
    auto& s = trace_.scores[l];
    for (int64_t i = 0; i < n * k; ++i) e.push_back(static_cast<uint16_t>(expert[i]));
    s.insert(s.end(), weight, weight + n * k);
  }
}

void RoutingTraceRecorder::write() const {
  if (trace_.tokens.empty()) return;
  sim::write_routing_trace(path_, trace_);
}

}  // namespace rackstep::exec
