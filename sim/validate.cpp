#include "sim/validate.h"
#include "sim/base/source_dir.h"

#include <algorithm>
#include <cmath>
#include <exception>
#include <filesystem>

#include "sim/base/json_io.h"
#include "sim/predict.h"
#include "sim/stack.h"

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

namespace rackstep::sim {

std::string default_validation_dir() { return std::string(rackstep::source_dir()) + "/tests/validation"; }

std::vector<ValidationRun> load_validation_set(const std::string& dir) {
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.is_regular_file() && e.path().extension() == ".json") files.push_back(e.path().string());
  }
  std::sort(files.begin(), files.end());
  std::vector<ValidationRun> out;
  for (const std::string& f : files) {
    const nlohmann::json doc = load_json_file(f);  // JsonReader keeps a pointer to it
    JsonReader r(doc, f);
    r.string("name");
    r.ignore("comment");
    const std::string citation = r.string("citation");
    for (JsonReader& j : r.object_list("runs")) {
      ValidationRun v;
      v.file = f;
      v.id = j.string("id");
      v.role = j.string("role");
      if (v.role != "fitted" && v.role != "validation") j.fail("role", "\"fitted\" or \"validation\"", v.role);
      v.citation = citation + "; " + j.string("source");
      JsonReader check = j.object("verified");
      const std::string status = check.string("status");
      if (status != "verified" && status != "unverified") check.fail("status", "\"verified\" or \"unverified\"", status);
      v.verified = status == "verified";
      v.verification = check.string("how");
      check.finish();
      v.model_path = src(j.string("model"));
      v.cluster_path = src(j.string("cluster"));
      v.domains = j.integer("domains", 0, {.min = 0});
      v.gpus_per_domain = j.integer("gpus_per_domain", 0, {.min = 0});
      v.stack = j.string("stack");
      if (j.has("layout_file")) {
        v.layout_json = load_json_file(src(j.string("layout_file")));
      } else {
        v.layout_json = j.raw().at("layout");
        j.ignore("layout");
      }
      JsonReader m = j.object("measured");
      v.measured_step_time_s = m.number("step_time_s", 0.0, {.min = 0});
      v.measured_mfu = m.number("mfu", 0.0, {.min = 0, .max = 1});
      v.measured_ran = m.boolean("ran", true);
      m.ignore("memory_gib");
      m.ignore("comment");
      m.finish();
      j.ignore("comment");
      j.finish();
      out.push_back(std::move(v));
    }
    r.finish();
  }
  return out;
}

void run_validation(std::vector<ValidationRun>& runs, const std::string& calibration_path) {
  const std::string base = calibration_path.empty() ? default_calibration_path() : calibration_path;
  for (ValidationRun& v : runs) {
    try {
      const auto g = models::build_layer_graph(models::load_model(v.model_path));
      const auto c = v.gpus_per_domain > 0
                         ? topologies::make_cluster(topologies::load_system(v.cluster_path), v.domains, v.gpus_per_domain)
                         : topologies::load_cluster(v.cluster_path, v.domains);
      const Layout l = parse_layout(v.layout_json, v.file + " run " + v.id);
      const Stack stack = load_stack(stack_path(v.stack));
      const Prediction p = Predictor(g, c, stack_calibration(stack, base)).predict(l);
      v.layout_desc = describe(l);
      for (const auto& i : check_stack(l, stack)) v.notes.push_back(i.detail);
      for (const auto& w : p.warnings) v.notes.push_back(w);
      bool structural = false;
      for (const auto& i : p.issues) {
        if (i.reason != Reason::kDeviceMemory && i.reason != Reason::kHostMemory) {
          structural = true;
          v.error_text += std::string(to_string(i.reason)) + ": " + i.detail + "; ";
        }
      }
      if (structural) continue;
      v.ok = true;
      v.step_time_s = p.step_time_s;
      v.mfu = p.mfu;
      v.fits = p.memory.fits_device && p.memory.fits_host;
      v.memory_gib = p.memory.device_total / kGiB;
      v.capacity_gib = p.memory.device_capacity / kGiB;
      v.prediction = prediction_to_json(p);
    } catch (const std::exception& e) {
      v.error_text = e.what();
    }
  }
}

ValidationSummary summarize(const std::vector<ValidationRun>& runs, const std::string& role, SourceCheck check) {
  ValidationSummary s;
  std::vector<double> errs;
  for (const ValidationRun& v : runs) {
    if (v.role != role) continue;
    if (check == SourceCheck::kVerified && !v.verified) continue;
    if (check == SourceCheck::kUnverified && v.verified) continue;
    ++s.runs;
    if (v.ok && v.verdict_right()) ++s.verdicts_right;
    if (!v.ok || v.measured_step_time_s <= 0) continue;
    errs.push_back(std::abs(v.step_error()));
  }
  s.with_step = static_cast<int>(errs.size());
  if (errs.empty()) return s;
  std::sort(errs.begin(), errs.end());
  const size_t n = errs.size();
  s.median_abs_step_error = n % 2 ? errs[n / 2] : 0.5 * (errs[n / 2 - 1] + errs[n / 2]);
  s.max_abs_step_error = errs.back();
  return s;
}

}  // namespace rackstep::sim
