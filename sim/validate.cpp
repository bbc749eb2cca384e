#include "sim/validate.h"
#include "models/source_dir.h"

#include <algorithm>

#include "sim/predict.h"

namespace rackstep::sim {

namespace {

std::string src(const std::string& p) { return std::string(rackstep::source_dir()) + "/" + p; }

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

ValidationRow row(std::string q, std::string unit, double measured, double predicted, std::string how) {
  ValidationRow r{std::move(q), std::move(unit), measured, predicted, 0.0, std::move(how)};
  r.error = r.unit == "%" ? predicted - measured : (measured != 0 ? predicted / measured - 1.0 : 0.0);
  return r;
}

double sum_kinds(const std::vector<OpTiming>& ops, const models::LayerGraph& g,
                 std::initializer_list<models::OpKind> kinds) {
  double s = 0;
  for (const auto& o : ops) {
    const auto k = g.ops[o.graph_index].kind;
    if (std::find(kinds.begin(), kinds.end(), k) != kinds.end()) s += o.fwd_s + o.bwd_s;
  }
  return s;
}

void hero_rows(const Calibration& cal, std::vector<ValidationRow>& out) {
  const auto g = models::build_layer_graph(models::load_model(src("models/zoo/marin-535b-a23b.json")));
  const auto c = topologies::load_cluster(src("topologies/zoo/gb200-11-racks.json"));
  const Predictor p(g, c, cal);
  const Layout ragged = load_layout(src("sim/layouts/hero-ragged.json"));
  const Layout pooled = load_layout(src("sim/layouts/hero-pooled.json"));
  const Prediction pr = p.predict(ragged);
  const Prediction pp = p.predict(pooled);
  const std::string how = "marin-535b-a23b, gb200-11-racks, sim/layouts/hero-ragged.json";
  const std::string how_pooled = "marin-535b-a23b, gb200-11-racks, sim/layouts/hero-pooled.json";
  out.push_back(row("hero step time (ragged EP)", "s", 17.15, pr.step_time_s, how));
  out.push_back(row("hero MFU, Marin convention (ragged EP)", "%", 22.9, 100.0 * pr.mfu, how));
  out.push_back(row("hero MFU, Marin convention (pooled-wave EP)", "%", 22.7, 100.0 * pp.mfu, how_pooled));
  out.push_back(row("hero steps per day", "steps", 4880, 86400.0 / pr.step_time_s, how));
  out.push_back(row("hero tokens per week", "T tokens", 1.5, pr.tokens_per_s * 604800.0 / 1e12, how));
  out.push_back(row("hero EP drop fraction (pooled, cf 1.10/1.15)", "%", 2.67, 100.0 * pp.drop_fraction,
                    how_pooled + " (drops: " + pp.drop_source + ")"));
  out.push_back(row("hero device memory peak (ragged)", "GiB", 137.9, pr.memory.device_total / kGiB, how));
  out.push_back(row("hero device memory peak (pooled-wave)", "GiB", 149.9, pp.memory.device_total / kGiB, how_pooled));
  // A native attention-backward kernel: backward attention at the forward efficiency.
  Calibration fixed = cal;
  fixed.attention_bwd_eff = cal.attention_fwd_eff;
  const Prediction pa = Predictor(g, c, fixed).predict(ragged);
  out.push_back(row("native attention-backward kernel: step faster by", "%", 4.03,
                    100.0 * (pr.step_time_s / pa.step_time_s - 1.0), how + ", attention bwd eff = fwd eff"));
  out.push_back(row("Python GC pauses: share of elapsed time", "%", 3.83,
                    100.0 * pr.breakdown.host_stall_s / pr.step_time_s,
                    how + " (the measurement is the excess over a quiet-step baseline, other delays included:"
                          " marin-community/marin PR #9224)"));
  Layout coordinated = ragged;
  coordinated.coordinated_gc = true;
  const Prediction pc = p.predict(coordinated);
  out.push_back(row("coordinated GC: step faster by", "%", 2.46, 100.0 * (pr.step_time_s / pc.step_time_s - 1.0),
                    how + ", coordinated_gc (every rank collects every coordinated_gc_interval_steps)"));
}

void collective_rows(const Calibration& cal, std::vector<ValidationRow>& out) {
  for (const char* file : {"topologies/zoo/gb200-nvl72.json", "topologies/zoo/hgx-h100.json"}) {
    const auto sys = topologies::load_system(src(file));
    const std::string unit = sys.kind == "rack" ? " rack(s), " : " node(s), ";
    for (const auto& m : sys.measured_collectives) {
      if (m.op != "all_reduce" || m.domains < 1 || m.gpus <= 0) continue;
      const auto c = topologies::make_cluster(sys, m.domains, m.gpus / m.domains);
      const Network net = make_network(c, cal);
      const double bw = all_reduce_bus_bw(net, m.domains, m.gpus / m.domains, m.bytes);
      out.push_back(row(sys.gpu.name + " all-reduce bus bandwidth, " + std::to_string(m.domains) + unit +
                            std::to_string(static_cast<long long>(m.bytes / 1e6)) + " MB",
                        "GB/s", m.bus_bw_bytes_per_s / 1e9, bw / 1e9,
                        std::string("nccl-tests point in ") + file + " (" + m.source + ")"));
    }
  }
}

void snowball_rows(const Calibration& cal, std::vector<ValidationRow>& out) {
  const auto g = models::build_layer_graph(models::load_model(src("models/zoo/marin-67b-a2b.json")));
  // 16 nodes, batch 128, seq 4096: one sequence per GPU. The profiled run
  // (public Marin issue #6367, run MAY-033: "N16/EP8/model1, ring MoE, replicated
  // embeddings, remat=save_moe") kept experts EP 8 inside each node, sharded
  // everything else (and the experts across nodes) FSDP-style over all 128 GPUs,
  // replicated the embedding and saved the MoE activations (selective recompute).
  const auto c16 = topologies::load_cluster(src("topologies/zoo/hgx-h100.json"), 16);
  Layout l;
  l.name = "67b-ep8-fsdp-16-nodes";
  l.data = 128;
  l.fsdp = 128;
  l.ep = 8;
  l.micro_batch_seqs = 1;
  l.tokens_per_step = 128 * 4096;
  l.recompute = models::Recompute::kSelective;
  l.replicate_embedding = true;
  const Predictor p16(g, c16, cal);
  const Prediction r = p16.predict(l);
  const auto& b = r.breakdown;
  const double compute = b.compute_fwd_s + b.compute_bwd_s + b.compute_recompute_s + b.optimizer_compute_s;
  const double comm = b.ep_comm_s + b.fsdp_comm_s + b.tp_comm_s + b.cp_comm_s + b.grad_sync_s + b.optimizer_comm_s;
  const std::string how = "marin-67b-a2b, hgx-h100 x16 nodes, data 128 fsdp 128 ep 8 mb 1, selective recompute, replicated embedding";
  out.push_back(row("67B-A2B profile: compute share (16 nodes)", "%", 65.7, 100.0 * compute / r.step_time_s, how));
  out.push_back(row("67B-A2B profile: communication share (16 nodes)", "%", 33.7, 100.0 * comm / r.step_time_s, how));

  // Single node: forward/backward split by op family. The profiled run (public
  // Marin issue #4312, run May215: "S4096 B8 R1 E8 ... REPEMB") had batch 8, i.e.
  // one sequence per GPU, EP over the node's 8 GPUs, the embedding replicated.
  const auto c1 = topologies::load_cluster(src("topologies/zoo/hgx-h100.json"), 1);
  Layout n = l;
  n.data = 8;
  n.fsdp = 8;
  n.ep = 8;
  n.micro_batch_seqs = 1;
  n.tokens_per_step = 8 * 4096;
  n.recompute = models::Recompute::kNone;
  const Predictor p1(g, c1, cal);
  const Prediction r1 = p1.predict(n);
  const auto ops = p1.op_timings(n);
  using K = models::OpKind;
  const double moe = sum_kinds(ops, g, {K::kRouter, K::kTopK, K::kDispatch, K::kExpertMlp, K::kCombine, K::kSharedMlp});
  const double ce = sum_kinds(ops, g, {K::kLmHead, K::kCrossEntropy});
  const double attn = sum_kinds(ops, g, {K::kAttention});
  const double m = r1.micro_batches;
  const double coll = r1.breakdown.fsdp_comm_s + r1.breakdown.grad_sync_s + r1.breakdown.ep_comm_s;
  const double fb = r1.breakdown.compute_fwd_s + r1.breakdown.compute_bwd_s + coll;
  const std::string how1 = "marin-67b-a2b, one hgx-h100 node, data 8 fsdp 8 ep 8 mb 1 (batch 8), no recompute, replicated embedding";
  out.push_back(row("67B-A2B single node fwd/bwd share: MoE", "%", 43.0, 100.0 * m * moe / fb, how1));
  out.push_back(row("67B-A2B single node fwd/bwd share: cross-entropy", "%", 17.0, 100.0 * m * ce / fb, how1));
  out.push_back(row("67B-A2B single node fwd/bwd share: flash attention", "%", 10.0, 100.0 * m * attn / fb, how1));
  out.push_back(row("67B-A2B single node fwd/bwd share: collectives", "%", 5.0,
                    100.0 * coll / fb, how1));
  // Muon under FSDP: the orthogonalised expert updates redistributed, bf16, globally.
  double expert_muon = 0;
  for (const auto& lc : p16.table().classes) {
    for (const auto& mtx : lc.muon_matrices) {
      if (mtx.expert) expert_muon += mtx.m * mtx.n * mtx.count * static_cast<double>(lc.count);
    }
  }
  out.push_back(row("67B-A2B Muon-under-FSDP redistribution payload (global, bf16)", "GiB", 121.9,
                    expert_muon * 2.0 / kGiB, "expert MuonH matrices of the layer graph x 2 bytes"));
}

}  // namespace

std::vector<ValidationRow> validate_calibration(const Calibration& cal) {
  std::vector<ValidationRow> out;
  hero_rows(cal, out);
  collective_rows(cal, out);
  snowball_rows(cal, out);
  return out;
}

}  // namespace rackstep::sim
