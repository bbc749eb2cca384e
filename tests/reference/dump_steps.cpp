// Several consecutive training steps of the CPU engine, dumped for the PyTorch
// reference (tests/reference/test_reference.py, "steps" part): what one
// `rackstep train --reference-dump` step does not reach — optimizer moments
// carried across steps (momentum non-zero from the second update), the
// quantile-balancing bias after a step (non-zero from the second step), and
// simulated expert-parallel drops (sim/base/dispatch.h decides; the keep mask is
// dumped so the reference drops the same assignments).
//
//   reference_dump_steps --model models/zoo/tiny-moe.json --data DIR --out DIR
//       [--steps 3] [--dispatch capacity --ep 2 --receiver-cf 1.0]
//
// DIR/step<s>/ (exec/dump.h format, one per step s) holds, before the update:
// param.*, buffer.* (QB bias this step used), batch.*, route.*.moe.expert (N, k),
// route.*.moe.keep (N, k) token-major 0/1 (with --dispatch: what the shared
// dispatch library decides for this routing, i.e. what the engine drops; the
// model does not expose its mask, so it is asked again here), router.* logits
// (N, E), logits, loss / ce / z_loss, grad.*; after it: after.* (parameters) and
// next.*.moe.router.bias (the QB bias for step s + 1); meta: step, lr per group
// and the constants of write_reference_dump (exec/train.cpp).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "exec/dump.h"
#include "exec/kernels.h"
#include "exec/train.h"
#include "sim/base/check.h"
#include "models/layer_graph.h"
#include "sim/base/dispatch.h"

namespace {

using namespace rackstep;
using namespace rackstep::exec;

struct Args {
  TrainOptions o;
  std::string out;
  int steps = 3;
};

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "reference_dump_steps: %s\nusage: reference_dump_steps --model M --data DIR --out DIR [--steps N] "
               "[--dispatch pooled|ragged|capacity --ep S --sender-cf X --receiver-cf Y]\n",
               why);
  std::exit(2);
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (i + 1 >= argc) usage(("expected a value after " + k).c_str());
    const std::string v = argv[++i];
    if (k == "--model") a.o.model_path = v;
    else if (k == "--data") a.o.data_dir = v;
    else if (k == "--out") a.out = v;
    else if (k == "--steps") a.steps = std::atoi(v.c_str());
    else if (k == "--dispatch") {
      a.o.dispatch.enabled = true;
      a.o.dispatch.config.transport = sim::parse_transport(v);
    } else if (k == "--ep") a.o.dispatch.ep = std::atoll(v.c_str());
    else if (k == "--sender-cf") a.o.dispatch.config.sender_cf = std::atof(v.c_str());
    else if (k == "--receiver-cf") a.o.dispatch.config.receiver_cf = std::atof(v.c_str());
    else usage(("unknown option " + k).c_str());
  }
  if (a.o.model_path.empty() || a.o.data_dir.empty() || a.out.empty()) usage("--model, --data and --out are required");
  if (a.steps < 1) usage("--steps must be >= 1");
  return a;
}

// Index of the op of `kind` in MoE layer `layer`, or -1.
long find_op(const models::LayerGraph& g, models::OpKind kind, int layer) {
  for (size_t i = 0; i < g.ops.size(); ++i) {
    if (g.ops[i].kind == kind && g.ops[i].layer == layer) return static_cast<long>(i);
  }
  return -1;
}

// What the shared dispatch library decides for these assignments, token-major
// (N, k): the engine splits the batch into `ep` contiguous virtual GPUs of
// N/ep tokens (exec/model.h, DispatchOptions).
std::vector<int32_t> library_keep(const DispatchOptions& d, const int32_t* expert,  // (N, k)
                                  const float* weight,                              // (N, k)
                                  int64_t N, int k) {
  const int64_t A = N * k, per = A / d.ep;
  std::vector<sim::GpuAssignments> gpus(static_cast<size_t>(d.ep));
  for (int64_t s = 0; s < d.ep; ++s) {
    gpus[s].experts.assign(expert + s * per, expert + (s + 1) * per);
    gpus[s].probs.assign(weight + s * per, weight + (s + 1) * per);
  }
  const sim::DispatchResult r = sim::dispatch(d.config, gpus);
  std::vector<int32_t> keep(static_cast<size_t>(A));
  for (int64_t a = 0; a < A; ++a) keep[a] = r.keep[a / per][a % per];
  return keep;
}

void add_meta(TensorDump& dump, const Trainer& t, const Optimizer& opt, int64_t step, const LossResult& r) {
  const auto& m = t.graph().model;
  auto& meta = dump.meta();
  meta["step"] = step;
  meta["lr"] = {{"muonh", opt.lr(OptGroup::kMuonH, step)},
                {"muon", opt.lr(OptGroup::kMuon, step)},
                {"adamh", opt.lr(OptGroup::kAdamH, step)},
                {"adam", opt.lr(OptGroup::kAdam, step)}};
  meta["beta1"] = opt.config().beta1;
  meta["beta2"] = opt.config().beta2;
  meta["adam_eps"] = opt.config().eps;
  meta["adam_weight_decay"] = opt.config().adam_weight_decay;
  meta["ns_steps"] = opt.config().ns_steps;
  meta["norm_eps"] = m.norm.eps;
  meta["qk_norm_eps"] = m.norm.eps;
  meta["xsa_eps"] = kXsaEps;
  meta["rope_theta"] = m.attention.rope_theta;
  auto rot_dims = [&](const models::AttentionLayerKind& k) {
    return k.position == models::PositionKind::kRope
               ? std::lround(k.rope_fraction * static_cast<double>(m.attention.head_dim))
               : 0L;
  };
  meta["rot_dims_local"] = rot_dims(m.attention.local);
  meta["rot_dims_global"] = rot_dims(m.attention.global);
  meta["attn_scale"] = 1.0 / std::sqrt(static_cast<double>(m.attention.head_dim));
  meta["qb_bins"] = m.moe.balancing_bins;
  meta["qb_lo"] = kQbLo;
  meta["qb_hi"] = kQbHi;
  meta["drop_fraction"] = r.drops.fraction();
  meta["dropped"] = r.drops.dropped();
}

void dump_steps(const Args& a) {
  TrainOptions o = a.o;
  o.out_dir.clear();
  if (o.dispatch.enabled) {
    const models::ModelConfig spec = models::load_model(o.model_path);
    o.dispatch.config.n_experts = spec.moe.experts;
    o.dispatch.config.top_k = static_cast<int>(spec.moe.top_k);
  }
  Trainer t(o);
  CpuModel& model = t.model();
  const models::LayerGraph& g = t.graph();
  const auto& m = g.model;
  const int64_t B = model.batch(), T = model.seq(), N = model.tokens();
  const int E = static_cast<int>(m.moe.experts), k = static_cast<int>(m.moe.top_k);
  Optimizer opt(t.optimizer().config());
  OptimizerState& st = t.optimizer_state();
  model.set_training(true);
  for (int s = 0; s < a.steps; ++s) {
    const Batch b = t.loader().next_batch(B);
    TensorDump dump;
    add_step_inputs(dump, model, m, b);
    model.zero_grads();
    const LossResult r = model.forward(b.inputs.data(), b.targets.data(), b.doc_ids.data());
    // Forward outputs are read before backward, which may reuse their buffers.
    for (int l = 0; l < m.layers; ++l) {
      const int32_t* e = model.routed_experts(l);
      if (!e) continue;
      const std::string p = "layers." + std::to_string(l) + ".moe.";
      dump.add_i32("route." + p + "expert", {N, k}, e);
      const long router = find_op(g, models::OpKind::kRouter, l);
      RS_CHECK(router >= 0, "reference_dump_steps: MoE layer without a router op");
      dump.add_f32("router." + p + "logits", {N, E}, model.op_output(static_cast<size_t>(router)));
      if (!a.o.dispatch.enabled) continue;
      const long topk = find_op(g, models::OpKind::kTopK, l);
      RS_CHECK(topk >= 0, "reference_dump_steps: MoE layer without a top-k op");
      const std::vector<int32_t> decided = library_keep(o.dispatch, e, model.op_output(static_cast<size_t>(topk)), N, k);
      dump.add_i32("route." + p + "keep", {N, k}, decided.data());
    }
    dump.add_f32("logits", {B, T, m.vocab}, model.logits());
    model.backward();
    dump.add_scalar("loss", r.loss);
    dump.add_scalar("ce", r.ce);
    dump.add_scalar("z_loss", r.z_loss);
    dump.add_arena("grad.", model.grads());
    add_meta(dump, t, opt, st.step, r);
    opt.step(model.params(), model.grads(), st);
    model.update_balancing();
    dump.add_arena("after.", model.params());
    for (int l = 0; l < m.layers; ++l) {
      if (const float* bias = model.balancing_bias(l)) {
        dump.add_f32("next.layers." + std::to_string(l) + ".moe.router.bias", {E}, bias);
      }
    }
    dump.meta()["model"] = o.model_path;
    dump.write(a.out + "/step" + std::to_string(s));
    std::printf("step %d: loss %.6f, %lld of %lld assignments dropped\n", s, r.loss,
                static_cast<long long>(r.drops.dropped()), static_cast<long long>(r.drops.assignments));
  }
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  try {
    dump_steps(a);
  } catch (const UserError& e) {
    std::fprintf(stderr, "reference_dump_steps: %s\n", e.what());
    return 2;
  }
  return 0;
}
