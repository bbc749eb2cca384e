// The backend registry (exec/backend.h).
#include "exec/backend.h"

#include <dlfcn.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <mutex>
#include <system_error>
#include <utility>

#include "exec/cpu/backend.h"
#include "exec/dist.h"
#include "exec/model.h"
#include "sim/base/check.h"

namespace rackstep::exec {

namespace {

struct Registry {
  std::mutex mu;
  std::map<std::string, BackendFactory> factories;
};

Registry& registry() {
  static Registry r;
  return r;
}

// Where a dense MLP's tensors sit in OpCall::w / dw (the table in exec/backend.h); -1 = absent.
struct MlpSlots {
  int w1, w3, w2, b1, b3, b2;
};
MlpSlots mlp_slots(const models::Op& op) {
  const bool gated = op.activation == models::MlpActivation::kSwiGlu;
  const int n = gated ? 3 : 2;  // matrices, then as many biases when the model has them
  const bool bias = op.params.size() > static_cast<size_t>(n);
  return {0, gated ? 1 : -1, n - 1, bias ? n : -1, bias && gated ? n + 1 : -1, bias ? 2 * n - 1 : -1};
}
float* slot(float* const* p, int j) { return j < 0 ? nullptr : p[j]; }

// The default clock: steady_clock at begin(), and at end() after the backend
// finished what the interval queued.
class HostOpTiming final : public OpTiming {
 public:
  using Clock = std::chrono::steady_clock;
  explicit HostOpTiming(Backend& backend) : backend_(backend) {}
  std::string clock() const override { return "host"; }
  void begin_step() override {
    open_.clear();
    step_.intervals.clear();
    origin_ = Clock::now();
  }
  // Slots in begin order; end() closes the innermost open one.
  void begin() override {
    open_.push_back({step_.intervals.size(), Clock::now()});
    step_.intervals.push_back({});
  }
  void end() override {
    RS_CHECK(!open_.empty(), "OpTiming::end without begin");
    const auto [slot, start] = open_.back();
    open_.pop_back();
    backend_.synchronize();
    const Clock::time_point stop = Clock::now();
    step_.intervals[slot] = {seconds(origin_, start), seconds(start, stop)};
  }
  StepTiming end_step() override {
    RS_CHECK(open_.empty(), "OpTiming::end_step with an interval open");
    backend_.synchronize();
    step_.span_s = seconds(origin_, Clock::now());
    return std::move(step_);
  }

 private:
  static double seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }
  Backend& backend_;
  Clock::time_point origin_;
  std::vector<std::pair<size_t, Clock::time_point>> open_;  // (slot, start)
  StepTiming step_;
};

}  // namespace

std::unique_ptr<OpTiming> Backend::make_op_timing() { return std::make_unique<HostOpTiming>(*this); }

SwiGluVariant expert_activation(const models::MoeConfig& moe) {
  SwiGluVariant v;
  v.alpha = static_cast<float>(moe.swiglu_alpha);
  v.limit = static_cast<float>(moe.swiglu_limit);
  v.linear_offset = static_cast<float>(moe.swiglu_linear_offset);
  return v;
}

ExpertOptions expert_options(const OpCall& c) {
  RS_CHECK(c.op->kind == models::OpKind::kExpertMlp, "expert options of a routed-expert op: " + c.op->name);
  ExpertOptions o;
  o.act = expert_activation(c.model->moe);
  if (!c.op->expert_bias) return o;
  RS_CHECK(c.op->params.size() == 6 && c.w[3] && c.w[4] && c.w[5], "expert biases unbound: " + c.op->name);
  o.b1 = c.w[3];
  o.b3 = c.w[4];
  o.b2 = c.w[5];
  o.db1 = c.dw[3];
  o.db3 = c.dw[4];
  o.db2 = c.dw[5];
  return o;
}

MlpActivation mlp_activation(const models::Op& op) {
  switch (op.activation) {
    case models::MlpActivation::kSwiGlu: return MlpActivation::kSwiGlu;
    case models::MlpActivation::kGelu: return MlpActivation::kGelu;
    case models::MlpActivation::kRelu2: return MlpActivation::kRelu2;
  }
  return MlpActivation::kSwiGlu;
}

MlpWeights mlp_weights(const OpCall& c) {
  RS_CHECK(c.op->kind == models::OpKind::kSharedMlp, "dense MLP weights of a kSharedMlp op: " + c.op->name);
  const MlpSlots s = mlp_slots(*c.op);
  MlpWeights w;
  w.w1 = slot(c.w, s.w1);
  w.w3 = slot(c.w, s.w3);
  w.w2 = slot(c.w, s.w2);
  w.b1 = slot(c.w, s.b1);
  w.b3 = slot(c.w, s.b3);
  w.b2 = slot(c.w, s.b2);
  return w;
}

MlpGrads mlp_grads(const OpCall& c) {
  RS_CHECK(c.op->kind == models::OpKind::kSharedMlp, "dense MLP gradients of a kSharedMlp op: " + c.op->name);
  const MlpSlots s = mlp_slots(*c.op);
  MlpGrads g;
  g.dw1 = slot(c.dw, s.w1);
  g.dw3 = slot(c.dw, s.w3);
  g.dw2 = slot(c.dw, s.w2);
  g.db1 = slot(c.dw, s.b1);
  g.db3 = slot(c.dw, s.b3);
  g.db2 = slot(c.dw, s.b2);
  return g;
}

std::vector<int64_t> saved_widths(const models::Op& op, const models::ModelConfig& m,
                                  const std::vector<int64_t>& in_widths) {
  using models::OpKind;
  switch (op.kind) {
    case OpKind::kRmsNorm:
    case OpKind::kCrossEntropy:
      return {1};  // rstd; lse
    case OpKind::kGatedNorm:
      return {op.params[0].shape[1], m.d_model};  // a = x·W_down (r), g (d)
    case OpKind::kQkNorm:
      return {in_widths[0] / op.qk_head_dim, in_widths[1] / op.qk_head_dim};  // rstd per q head, per k head
    case OpKind::kAttention:
    case OpKind::kAttnGate:
      return {op.heads};  // lse, stored (B, H, T); the gate g
    case OpKind::kExpertMlp: {
      const int64_t kF = m.moe.top_k * m.moe.expert_width;
      return {kF, kF, kF};  // a1, a3, h per assignment row
    }
    case OpKind::kSharedMlp: {
      const int64_t F = op.params[0].shape[1];
      const bool gated = op.activation == models::MlpActivation::kSwiGlu;
      return {F, gated ? F : 0, F};  // a1, a3 (SwiGLU only), h
    }
    default:
      return {};
  }
}

void register_backend(const std::string& name, BackendFactory make) {
  RS_CHECK(name != "cpu", "the CPU backend is built in");
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.factories[name] = std::move(make);
}

std::vector<std::string> available_backends() {
  std::vector<std::string> names = {"cpu"};
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  for (const auto& [name, make] : r.factories)
    if (make()) names.push_back(name);
  return names;
}

std::string load_backend_plugin(const std::string& name) {
  static std::mutex mu;
  static std::map<std::string, std::string> loaded;  // name -> "" or the first failure
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = loaded.find(name); it != loaded.end()) return it->second;
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  const std::string file = (ec ? std::filesystem::path(".") : exe.parent_path()) / ("librackstep_" + name + ".so");
  std::string& why = loaded[name];
  void* lib = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* e = dlerror();
    return why = e ? e : ("cannot open " + file);
  }
  using RegisterFn = void (*)();
  const std::string symbol = "rackstep_" + name + "_plugin_register";
  auto reg = reinterpret_cast<RegisterFn>(dlsym(lib, symbol.c_str()));
  if (!reg) return why = file + ": no symbol " + symbol;
  reg();
  return why = "";
}

std::unique_ptr<ExpertBackend> Backend::make_experts(Comm /*group*/, const sim::DispatchConfig& /*config*/,
                                                     const ExpertTransportOptions& /*options*/, std::string& why) {
  why = uses_host_memory() ? "the host transport (exec/dist.h MpiExperts: this backend uses host memory)"
                           : "expert parallelism in the " + name() + " backend's memory (it has none)";
  return nullptr;
}

std::unique_ptr<Backend> make_backend(const std::string& name) {
  if (name == "cpu") return make_cpu_backend();
  BackendFactory make;
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    if (auto it = r.factories.find(name); it != r.factories.end()) make = it->second;
  }
  std::unique_ptr<Backend> b = make ? make() : nullptr;
  if (b) return b;
  std::string names;
  for (const std::string& n : available_backends()) names += (names.empty() ? "" : ", ") + n;
  throw UserError("backend: expected one available here (" + names + "), found '" + name + "'");
}

}  // namespace rackstep::exec
