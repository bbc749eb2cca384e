#include "sim/calibration.h"
#include "sim/base/source_dir.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <iterator>

#include "models/layer_graph.h"
#include "sim/base/check.h"
#include "sim/base/json_io.h"

namespace rackstep::sim {

std::string default_calibration_path() { return std::string(rackstep::source_dir()) + "/sim/calibration.json"; }

namespace {

// {"value": x, "source": "..."}: the source is required (every number has one).
double sourced(JsonReader& parent, const std::string& key, NumberRange range = {}) {
  JsonReader v = parent.object(key);
  const double x = v.number("value", range);
  v.string("source");
  v.finish();
  return x;
}

bool sourced_flag(JsonReader& parent, const std::string& key) {
  JsonReader v = parent.object(key);
  const bool x = v.boolean("value");
  v.string("source");
  v.finish();
  return x;
}

// {"value": ["GPU", ...], "source": "..."}: a sourced list of GPU names; `path` is
// the key's JSON path in `file`, for the error line.
std::vector<std::string> sourced_gpu_names(JsonReader& parent, const std::string& key, const std::string& file,
                                           const std::string& path) {
  JsonReader v = parent.object(key);
  const nlohmann::json& names = v.raw().at("value");
  if (!names.is_array()) throw UserError(file, path + "/value", "a list of GPU names", names.dump());
  std::vector<std::string> out;
  for (const auto& n : names) {
    if (!n.is_string()) throw UserError(file, path + "/value", "a GPU name", n.dump());
    out.push_back(n.get<std::string>());
  }
  v.ignore("value");
  v.string("source");
  v.finish();
  return out;
}

double shape_factor(double x, double half) { return x / (x + half); }

// One architecture's block of gemm.shape_tables: its GPUs, the grid's dimensions (ascending,
// > 0, shared by M, N and K) and the measured rates in TFLOP/s as [m][n][k] nested lists.
// Each GPU named gets the rates over the rate at the largest shape.
void parse_gemm_shape_table(JsonReader& arch, Calibration& c) {
  const std::string& file = arch.file();
  const std::vector<std::string> gpus = sourced_gpu_names(arch, "gpus", file, arch.path_of("gpus"));
  JsonReader dims_r = arch.object("dims");
  if (!dims_r.has("value")) throw UserError(file, dims_r.path_of("value"), "a list of dimensions", "none");
  const nlohmann::json& dims = dims_r.raw().at("value");
  const std::string dims_path = dims_r.path_of("value");
  if (!dims.is_array() || dims.size() < 2) throw UserError(file, dims_path, "a list of at least two dimensions", describe_json(dims));
  Calibration::GemmShapeTable table;
  for (const auto& d : dims) {
    if (!d.is_number() || d.get<double>() <= 0) throw UserError(file, dims_path, "a dimension > 0", describe_json(d));
    const double ln = std::log(d.get<double>());
    if (!table.ln_dims.empty() && ln <= table.ln_dims.back()) throw UserError(file, dims_path, "ascending dimensions", describe_json(dims));
    table.ln_dims.push_back(ln);
  }
  dims_r.ignore("value");
  dims_r.string("source");
  dims_r.finish();
  JsonReader rates_r = arch.object("bf16_tflops");
  if (!rates_r.has("value")) throw UserError(file, rates_r.path_of("value"), "a table of rates", "none");
  const nlohmann::json& rates = rates_r.raw().at("value");
  const std::string rates_path = rates_r.path_of("value");
  const size_t d = table.ln_dims.size();
  const std::string want = std::to_string(d) + " x " + std::to_string(d) + " x " + std::to_string(d) + " rates > 0 ([m][n][k])";
  if (!rates.is_array() || rates.size() != d) throw UserError(file, rates_path, want, describe_json(rates));
  for (const auto& by_n : rates) {
    if (!by_n.is_array() || by_n.size() != d) throw UserError(file, rates_path, want, describe_json(by_n));
    for (const auto& by_k : by_n) {
      if (!by_k.is_array() || by_k.size() != d) throw UserError(file, rates_path, want, describe_json(by_k));
      for (const auto& x : by_k) {
        if (!x.is_number() || x.get<double>() <= 0) throw UserError(file, rates_path, want, describe_json(x));
        table.relative.push_back(x.get<double>());
      }
    }
  }
  rates_r.ignore("value");
  rates_r.string("source");
  rates_r.finish();
  const double largest = table.relative.back();
  for (double& x : table.relative) x /= largest;
  for (const auto& gpu : gpus) c.gemm_shape_by_gpu[gpu] = table;
}

// A list of measured EP dispatch/combine points ({"ep", "dispatch", "combine"}, each
// share sourced), sorted by EP size; at least one.
std::vector<EpBandwidthPoint> ep_bandwidth_points(JsonReader& col, const std::string& key) {
  const NumberRange frac{.min_exclusive = 0, .max = 1};
  std::vector<EpBandwidthPoint> pts;
  for (JsonReader& p : col.object_list(key)) {
    EpBandwidthPoint pt;
    pt.ep = p.integer("ep", {.min = 2});
    pt.dispatch_eff = sourced(p, "dispatch", frac);
    pt.combine_eff = sourced(p, "combine", frac);
    p.finish();
    pts.push_back(pt);
  }
  if (pts.empty()) col.fail(key, "at least one measured EP bandwidth point", "an empty list");
  std::sort(pts.begin(), pts.end(), [](const auto& a, const auto& b) { return a.ep < b.ep; });
  return pts;
}

// A key of a number-keyed object ("64", "8192") as that number (> 0), else one error at `path`.
double positive_key(const std::string& key, const std::string& file, const std::string& path, const char* what) {
  char* end = nullptr;
  const double x = std::strtod(key.c_str(), &end);
  if (end == key.c_str() || *end != '\0' || !(x > 0)) throw UserError(file, path, what, key);
  return x;
}

// attention_kernels: kernel name -> {per_gpu: GPU name -> {fwd_over_bwd_rate,
// fwd_bwd_efficiency: head dim -> sequence -> fraction of the BF16 peak}}.
void parse_attention_kernels(JsonReader kernels, const std::string& file, Calibration& c) {
  kernels.ignore("comment");
  for (auto it = kernels.raw().begin(); it != kernels.raw().end(); ++it) {
    if (it.key() == "comment") continue;
    JsonReader kernel = kernels.object(it.key());
    kernel.ignore("comment");
    JsonReader per_gpu = kernel.object("per_gpu");
    for (auto g = per_gpu.raw().begin(); g != per_gpu.raw().end(); ++g) {
      JsonReader gpu = per_gpu.object(g.key());
      Calibration::AttentionKernelCurve& curve = c.attention_kernels[it.key()][g.key()];
      curve.fwd_over_bwd_rate = sourced(gpu, "fwd_over_bwd_rate", {.min_exclusive = 0, .max = 4});
      JsonReader by_dim = gpu.object("fwd_bwd_efficiency");
      for (auto d = by_dim.raw().begin(); d != by_dim.raw().end(); ++d) {
        const double head_dim = positive_key(d.key(), file, by_dim.path_of(d.key()), "a head dim (a number > 0)");
        JsonReader by_seq = by_dim.object(d.key());
        std::vector<std::pair<double, double>>& points = curve.fwd_bwd_eff_by_ln_seq[head_dim];
        for (auto q = by_seq.raw().begin(); q != by_seq.raw().end(); ++q) {
          const double seq = positive_key(q.key(), file, by_seq.path_of(q.key()), "a sequence length (a number > 0)");
          points.emplace_back(std::log(seq), sourced(by_seq, q.key(), {.min_exclusive = 0, .max = 1}));
        }
        by_seq.finish();
        if (points.empty()) throw UserError(file, by_seq.path(), "at least one sequence length", "none");
        std::sort(points.begin(), points.end());
        if (!(attention_kernel_tail(points).a > 0)) {
          throw UserError(file, by_seq.path(),
                          "last two points rising toward a finite rate (1 / efficiency = a + b / sequence, a > 0)",
                          "a steeper rise");
        }
      }
      by_dim.finish();
      if (curve.fwd_bwd_eff_by_ln_seq.empty()) throw UserError(file, by_dim.path(), "at least one head dim", "none");
      gpu.finish();
    }
    per_gpu.finish();
    kernel.finish();
  }
  kernels.finish();
}

}  // namespace

Calibration parse_calibration(const nlohmann::json& doc, const std::string& file) {
  Calibration c;
  c.file = file;
  JsonReader r(doc, file);
  r.ignore("comment");
  const NumberRange frac{.min_exclusive = 0, .max = 1};
  const NumberRange pos{.min_exclusive = 0};
  const NumberRange nonneg{.min = 0};

  JsonReader gemm = r.object("gemm");
  JsonReader peaks = gemm.object("peak_efficiency");
  for (auto it = peaks.raw().begin(); it != peaks.raw().end(); ++it) c.gemm_peak_eff[it.key()] = sourced(peaks, it.key(), frac);
  peaks.finish();
  c.gemm_peak_eff_default = sourced(gemm, "default_peak_efficiency", frac);
  c.gemm_half_dim = sourced(gemm, "half_dim", nonneg);
  if (gemm.has("shape_tables")) {
    JsonReader tables = gemm.object("shape_tables");
    tables.ignore("comment");
    for (auto it = tables.raw().begin(); it != tables.raw().end(); ++it) {
      if (it.key() == "comment") continue;
      JsonReader arch = tables.object(it.key());
      parse_gemm_shape_table(arch, c);
      arch.finish();
    }
    tables.finish();
  }
  if (gemm.has("sustained_ratio")) {
    JsonReader sustained = gemm.object("sustained_ratio");
    for (auto it = sustained.raw().begin(); it != sustained.raw().end(); ++it) {
      c.gemm_sustained_ratio[it.key()] = sourced(sustained, it.key(), frac);
    }
    sustained.finish();
  }
  // Optional, so calibration files written before FP8 GEMMs existed still read.
  if (gemm.has("fp8_relative_efficiency")) c.fp8_gemm_relative_eff = sourced(gemm, "fp8_relative_efficiency", frac);
  if (gemm.has("fp8_measured_gpus")) {
    c.fp8_gemm_measured_gpus = sourced_gpu_names(gemm, "fp8_measured_gpus", file, "/gemm/fp8_measured_gpus");
  }
  if (gemm.has("fp8_dense_relative_efficiency")) {
    JsonReader per_gpu = gemm.object("fp8_dense_relative_efficiency");
    for (auto it = per_gpu.raw().begin(); it != per_gpu.raw().end(); ++it) {
      c.fp8_dense_relative_eff[it.key()] = sourced(per_gpu, it.key(), {.min_exclusive = 0, .max = 1.5});
    }
    per_gpu.finish();
  }
  if (gemm.has("fp8_block_scaled_relative_efficiency")) {
    c.fp8_block_scaled_relative_eff = sourced(gemm, "fp8_block_scaled_relative_efficiency", frac);
  }
  if (gemm.has("fp8_non_tn_backward_relative_efficiency")) {
    c.fp8_non_tn_backward_relative_eff = sourced(gemm, "fp8_non_tn_backward_relative_efficiency", frac);
  }
  gemm.finish();

  JsonReader gg = r.object("grouped_gemm");
  c.grouped_anchor_iteration_s = sourced(gg, "anchor_iteration_s", pos);
  c.grouped_anchor_rows = sourced(gg, "anchor_rows", pos);
  c.grouped_anchor_local_experts = sourced(gg, "anchor_local_experts", pos);
  c.grouped_anchor_k = sourced(gg, "anchor_k", pos);
  c.grouped_anchor_n = sourced(gg, "anchor_n", pos);
  c.grouped_anchor_flop_multiple = sourced(gg, "anchor_flop_multiple", pos);
  c.grouped_anchor_peak_flops_per_s = sourced(gg, "anchor_peak_flops_per_s", pos);
  if (gg.has("per_expert_dense_relative_efficiency")) {
    c.grouped_per_expert_dense_relative_eff = sourced(gg, "per_expert_dense_relative_efficiency", {.min_exclusive = 0, .max = 1});
  }
  gg.finish();

  if (r.has("dense_kernels")) {  // optional: a dense MLP's activation as a kernel of its own
    JsonReader dk = r.object("dense_kernels");
    if (dk.has("activation_fwd_bytes_per_fc1_elem")) {
      c.dense_act_fwd_bytes = sourced(dk, "activation_fwd_bytes_per_fc1_elem", {.min = 0, .max = 64});
    }
    if (dk.has("activation_bwd_bytes_per_fc1_elem")) {
      c.dense_act_bwd_bytes = sourced(dk, "activation_bwd_bytes_per_fc1_elem", {.min = 0, .max = 64});
    }
    if (dk.has("glu_activation_fwd_bytes_per_fc1_elem") || dk.has("glu_activation_bwd_bytes_per_fc1_elem")) {
      c.dense_glu_act_own = true;
      c.dense_glu_act_fwd_bytes = sourced(dk, "glu_activation_fwd_bytes_per_fc1_elem", {.min = 0, .max = 64});
      c.dense_glu_act_bwd_bytes = sourced(dk, "glu_activation_bwd_bytes_per_fc1_elem", {.min = 0, .max = 64});
    }
    if (dk.has("fp8_quantize_shared_input_once")) {
      c.dense_fp8_shared_input_once = sourced_flag(dk, "fp8_quantize_shared_input_once");
    }
    if (dk.has("fp8_weight_cast_per_pass")) {
      c.dense_fp8_weight_cast_per_pass = sourced_flag(dk, "fp8_weight_cast_per_pass");
    }
    dk.ignore("comment");
    dk.finish();
  }

  if (r.has("eager_elementwise")) {  // optional: norms, RoPE, residual adds as several eager ops
    JsonReader ee = r.object("eager_elementwise");
    ee.ignore("comment");
    for (auto it = ee.raw().begin(); it != ee.raw().end(); ++it) {
      if (it.key() == "comment") continue;
      bool known = false;
      for (const models::OpKind k : models::kAllOpKinds) {
        known = known || (it.key() == models::to_string(k) &&
                          (k == models::OpKind::kRmsNorm || k == models::OpKind::kRope || k == models::OpKind::kResidualAdd ||
                           k == models::OpKind::kCrossEntropy));
      }
      if (!known) {
        throw UserError(file, "/eager_elementwise/" + it.key(), "an op kind run as eager passes (rmsnorm, rope, residual_add, cross_entropy)",
                        it.key());
      }
      JsonReader op = ee.object(it.key());
      Calibration::EagerPasses& p = c.eager_elementwise[it.key()];
      p.fwd_bytes_per_elem = sourced(op, "fwd_bytes_per_elem", {.min_exclusive = 0, .max = 256});
      p.bwd_bytes_per_elem = sourced(op, "bwd_bytes_per_elem", {.min_exclusive = 0, .max = 256});
      p.fwd_kernels = sourced(op, "fwd_kernels", {.min = 1, .max = 64});
      p.bwd_kernels = sourced(op, "bwd_kernels", {.min = 1, .max = 64});
      op.finish();
    }
    ee.finish();
  }

  if (r.has("moe_kernels")) {  // optional: the trainer's MoE kernels beside the expert GEMMs
    JsonReader mk = r.object("moe_kernels");
    for (const auto& [key, field] : {std::pair{"sort_rows_by_local_expert", &c.moe_sort_rows_by_local_expert},
                                     std::pair{"fp8_pad_expert_rows", &c.moe_fp8_pad_expert_rows},
                                     std::pair{"activation_kernel", &c.moe_activation_kernel},
                                     std::pair{"fp8_quantize_per_expert", &c.moe_fp8_quantize_per_expert}}) {
      if (mk.has(key)) *field = sourced_flag(mk, key);
    }
    mk.ignore("comment");
    mk.finish();
  }

  if (r.has("recompute")) {  // optional: how the trainer's module recompute restores what it freed
    JsonReader rc = r.object("recompute");
    if (rc.has("restores_discarded_output")) c.recompute_restores_output = sourced_flag(rc, "restores_discarded_output");
    rc.ignore("comment");
    rc.finish();
  }

  if (r.has("attention_kernels")) parse_attention_kernels(r.object("attention_kernels"), file, c);
  JsonReader att = r.object("attention");
  if (att.has("kernel")) {
    JsonReader k = att.object("kernel");
    c.attention_kernel = k.string("value");
    k.string("source");
    k.finish();
    if (!c.attention_kernels.contains(c.attention_kernel)) {
      throw UserError(file, "/attention/kernel/value", "a kernel of /attention_kernels", c.attention_kernel);
    }
    // A kernel's curve holds its diagonal tiles and head dims already: the flat pricing's
    // tile and head-dim terms on top of it would count them twice.
    for (const char* key : {"tile_tokens", "masked_tile_cost", "head_dim_fwd_factor", "head_dim_bwd_factor"}) {
      if (att.has(key)) throw UserError(file, "/attention/" + std::string(key), "none beside /attention/kernel", key);
    }
  }
  c.attention_fwd_eff = sourced(att, "fwd_efficiency", frac);
  c.attention_bwd_eff = sourced(att, "bwd_efficiency", frac);
  // Optional: head-dim factors and the kernel tile (flash kernels measured at head dim 128).
  const auto head_dim_points = [&](const std::string& key) {
    std::vector<std::pair<double, double>> points;
    if (!att.has(key)) return points;
    JsonReader per_dim = att.object(key);
    for (auto it = per_dim.raw().begin(); it != per_dim.raw().end(); ++it) {
      const double hd = positive_key(it.key(), file, "/attention/" + key + "/" + it.key(), "a head dim (a number > 0)");
      points.emplace_back(hd, sourced(per_dim, it.key(), {.min_exclusive = 0, .max = 2}));
    }
    per_dim.finish();
    std::sort(points.begin(), points.end());
    return points;
  };
  c.attention_head_dim_fwd = head_dim_points("head_dim_fwd_factor");
  c.attention_head_dim_bwd = head_dim_points("head_dim_bwd_factor");
  if (att.has("tile_tokens")) c.attention_tile_tokens = sourced(att, "tile_tokens", nonneg);
  const NumberRange masked_cost{.min = 1, .max = 64};
  if (att.has("masked_tile_cost")) c.attention_masked_tile_cost = sourced(att, "masked_tile_cost", masked_cost);
  if (att.has("efficiency_seq_tokens")) {
    c.attention_efficiency_seq_tokens = sourced(att, "efficiency_seq_tokens", {.min_exclusive = 0});
  }
  // A masked-tile cost above 1 counts masked tiles (a tile) and holds the efficiencies at
  // the sequence they were measured at.
  const auto check_masked_cost = [&](double cost, const std::string& path) {
    if (cost == 1.0) return;
    if (c.attention_tile_tokens <= 0) {
      throw UserError(file, path, "a tile (/attention/tile_tokens > 0) to count masked tiles in", "no tile_tokens");
    }
    if (c.attention_efficiency_seq_tokens <= 0) {
      throw UserError(file, path, "the sequence the efficiencies hold at (/attention/efficiency_seq_tokens)",
                      "no efficiency_seq_tokens");
    }
  };
  check_masked_cost(c.attention_masked_tile_cost, "/attention/masked_tile_cost");
  if (att.has("cp_ring_te_passes")) c.attention_cp_ring_te_passes = sourced_flag(att, "cp_ring_te_passes");
  if (att.has("unfused")) {  // optional: score matrices through HBM (no flash kernel)
    JsonReader un = att.object("unfused");
    c.attention_unfused_fwd_bytes = sourced(un, "fwd_bytes_per_score", {.min_exclusive = 0, .max = 64});
    c.attention_unfused_bwd_bytes = sourced(un, "bwd_bytes_per_score", {.min_exclusive = 0, .max = 64});
    un.ignore("comment");
    un.finish();
  }
  if (att.has("per_gpu")) {
    JsonReader per_gpu = att.object("per_gpu");
    for (auto it = per_gpu.raw().begin(); it != per_gpu.raw().end(); ++it) {
      JsonReader g = per_gpu.object(it.key());
      Calibration::AttentionEfficiency& a = c.attention_eff_by_gpu[it.key()];
      a = {.fwd = sourced(g, "fwd_efficiency", frac),
           .bwd = sourced(g, "bwd_efficiency", frac),
           .masked_tile_cost = c.attention_masked_tile_cost};
      if (g.has("masked_tile_cost")) a.masked_tile_cost = sourced(g, "masked_tile_cost", masked_cost);
      check_masked_cost(a.masked_tile_cost, "/attention/per_gpu/" + it.key() + "/masked_tile_cost");
      if (g.has("sustained_ratio")) a.sustained_ratio = sourced(g, "sustained_ratio", frac);
      g.finish();
    }
    per_gpu.finish();
  }
  att.finish();

  if (r.has("expert_elementwise")) {  // optional: a stack whose experts run elementwise kernels of their own
    JsonReader x = r.object("expert_elementwise");
    const auto bytes = [&](const char* key, double& out) {
      if (x.has(key)) out = sourced(x, key, nonneg);
    };
    bytes("glu_fwd_bytes_per_fc1_elem", c.expert_glu_fwd_bytes);
    bytes("glu_bwd_bytes_per_fc1_elem", c.expert_glu_bwd_bytes);
    bytes("clamp_fwd_bytes_per_fc1_elem", c.expert_clamp_fwd_bytes);
    bytes("clamp_bwd_bytes_per_fc1_elem", c.expert_clamp_bwd_bytes);
    bytes("bias_fwd_bytes_per_fc2_elem", c.expert_bias_fwd_bytes);
    bytes("bias_bwd_bytes_per_fc2_elem", c.expert_bias_bwd_bytes);
    x.finish();
  }

  if (r.has("yarn_rope_unfused")) {  // optional: a trainer that runs YaRN's rotation as eager ops
    JsonReader y = r.object("yarn_rope_unfused");
    y.ignore("comment");
    c.rope_yarn_unfused = true;
    c.rope_yarn_fwd_bytes = sourced(y, "fwd_bytes_per_elem", nonneg);
    c.rope_yarn_bwd_bytes = sourced(y, "bwd_bytes_per_elem", nonneg);
    c.rope_yarn_fwd_kernels = sourced(y, "fwd_kernels_per_tensor", nonneg);
    c.rope_yarn_bwd_kernels = sourced(y, "bwd_kernels_per_tensor", nonneg);
    y.finish();
  }

  JsonReader mem = r.object("memory_bound");
  c.mem_eff_elementwise = sourced(mem, "elementwise", frac);
  c.mem_eff_norm = sourced(mem, "norm", frac);
  c.mem_eff_routing = sourced(mem, "routing", frac);
  c.mem_eff_loss = sourced(mem, "loss", frac);
  c.mem_eff_lookup = sourced(mem, "lookup", frac);
  c.mem_eff_optimizer = sourced(mem, "optimizer", frac);
  mem.finish();

  c.launch_overhead_s = sourced(r, "launch_overhead_s", nonneg);
  c.loss_block_tokens = sourced(r, "loss_block_tokens", pos);
  if (r.has("ep_drops")) {  // optional: an override of the drop calibration's fit target
    JsonReader d = r.object("ep_drops");
    c.fallback_drop_fraction = sourced(d, "fallback_fraction", {.min = 0, .max = 1});
    d.finish();
  }

  JsonReader col = r.object("collectives");
  c.scale_out_eff = sourced(col, "scale_out_efficiency", frac);
  c.inter_domain_nics = sourced(col, "inter_domain_nics", nonneg);
  c.inter_domain_step_latency_s = sourced(col, "inter_domain_step_latency_s", nonneg);
  c.ep_nvlink = ep_bandwidth_points(col, "ep_nvlink");
  c.ep_hybridep_nvlink = ep_bandwidth_points(col, "ep_hybridep_nvlink");
  c.ep_a2a_latency_s = sourced(col, "ep_a2a_latency_s", nonneg);
  c.ep_ragged_sync_s = sourced(col, "ep_ragged_sync_s", nonneg);
  c.ep_wave_overlap_eff = sourced(col, "ep_wave_overlap_efficiency", {.min = 0, .max = 1});
  c.ep_all_to_all_sms = sourced(col, "ep_all_to_all_sms", nonneg);
  c.ep_flex_sms = sourced(col, "ep_flex_sms", nonneg);
  c.fsdp_collective_sms = sourced(col, "fsdp_collective_sms", nonneg);
  c.fsdp_prefetch_overlap = sourced(col, "fsdp_prefetch_overlap", {.min = 0, .max = 1});
  // Optional, so calibration files written before them still read (default: Marin's, per layer, no re-gather).
  if (col.has("fsdp_gather_per_module")) c.fsdp_gather_per_module = sourced_flag(col, "fsdp_gather_per_module");
  if (col.has("fsdp_megatron_modules")) c.fsdp_megatron_modules = sourced_flag(col, "fsdp_megatron_modules");
  if (col.has("fsdp_gather_zero_fill")) c.fsdp_gather_zero_fill = sourced_flag(col, "fsdp_gather_zero_fill");
  if (col.has("fsdp_prefetch_bucket_params")) {
    c.fsdp_prefetch_bucket_params = sourced(col, "fsdp_prefetch_bucket_params", {.min = 0});
  }
  // DeepSpeed's coordinator, bucketed reductions, list collectives, NCCL's ring latency model and
  // Transformer Engine's userbuffers TP overlap: optional.
  for (const auto& [key, field] : {std::pair{"fsdp_max_live_params", &c.fsdp_max_live_params},
                                   std::pair{"fsdp_persistence_threshold_params", &c.fsdp_persistence_threshold_params},
                                   std::pair{"fsdp_max_reuse_distance_params", &c.fsdp_max_reuse_distance_params},
                                   std::pair{"grad_reduce_bucket_params", &c.grad_reduce_bucket_params},
                                   std::pair{"fsdp_list_ops_per_rank", &c.fsdp_list_ops_per_rank},
                                   std::pair{"ring_base_latency_s", &c.ring_base_latency_s},
                                   std::pair{"ring_intra_hop_latency_s", &c.ring_intra_hop_latency_s},
                                   std::pair{"ring_inter_hop_latency_s", &c.ring_inter_hop_latency_s},
                                   std::pair{"tp_userbuffers_pipeline_sms", &c.tp_ub_pipeline_sms},
                                   std::pair{"tp_userbuffers_pipeline_splits", &c.tp_ub_pipeline_splits},
                                   std::pair{"tp_userbuffers_bulk_sms", &c.tp_ub_bulk_sms}}) {
    if (col.has(key)) *field = sourced(col, key, {.min = 0});
  }
  if (col.has("fsdp_regather_for_recompute")) {
    c.fsdp_regather_for_recompute = sourced_flag(col, "fsdp_regather_for_recompute");
  }
  // Optional: a trainer's HBM passes over gathered parameters and unsharded gradients (none by default).
  if (col.has("fsdp_hbm_passes")) {
    JsonReader hp = col.object("fsdp_hbm_passes");
    hp.ignore("comment");
    c.fsdp_gather_copy_passes = sourced(hp, "gather_copy_passes", {.min = 0, .max = 8});
    c.fsdp_grad_view_passes = sourced(hp, "grad_view_passes", {.min = 0, .max = 8});
    JsonReader copy = hp.object("grad_copy");
    const std::string when = copy.choice("value", {"none", "when_cast", "always"}, "none");
    copy.string("source");
    copy.finish();
    c.fsdp_grad_copy = when == "always"      ? Calibration::FsdpGradCopy::kAlways
                       : when == "when_cast" ? Calibration::FsdpGradCopy::kWhenCast
                                             : Calibration::FsdpGradCopy::kNone;
    c.fsdp_grad_reduce_dtype_passes = sourced(hp, "grad_reduce_dtype_passes", {.min = 0, .max = 8});
    hp.finish();
  }
  c.grad_sync_bucket_layers = static_cast<int64_t>(sourced(col, "grad_sync_bucket_layers", {.min = 0, .max = 1e6}));
  c.tp_overlap = sourced(col, "tp_overlap", {.min = 0, .max = 1});
  c.cp_ring_overlap = sourced(col, "cp_ring_overlap", {.min = 0, .max = 1});
  col.finish();

  JsonReader host = r.object("host");
  c.host_link_duplex = sourced(host, "link_duplex", {.min = 0, .max = 1});
  c.gc_pause_s = sourced(host, "gc_pause_s", nonneg);
  c.gc_interval_steps = sourced(host, "gc_interval_steps", pos);
  c.coordinated_gc_interval_steps = sourced(host, "coordinated_gc_interval_steps", pos);
  c.gpus_per_host_process = static_cast<int64_t>(sourced(host, "gpus_per_host_process", {.min = 1}));
  // Optional (eager trainers' stacks set them): host issue cost and the syncs that expose it.
  if (host.has("op_issue_s")) {
    // {"default": {value, source}, "<GPU name>": {value, source}, ...}: the host CPU differs by system.
    JsonReader issue = host.object("op_issue_s");
    const NumberRange per_call{.min = 0, .max = 1e-2};
    c.op_issue_s = sourced(issue, "default", per_call);
    for (auto it = issue.raw().begin(); it != issue.raw().end(); ++it) {
      if (it.key() != "default") c.op_issue_s_by_gpu[it.key()] = sourced(issue, it.key(), per_call);
    }
    issue.finish();
  }
  if (host.has("calls_per_local_expert")) {
    c.host_calls_per_local_expert = sourced(host, "calls_per_local_expert", {.min = 0, .max = 1e3});
  }
  if (host.has("moe_syncs_per_layer")) c.moe_host_syncs_per_layer = sourced(host, "moe_syncs_per_layer", {.min = 0, .max = 1e3});
  if (host.has("quick_glu_activation_syncs")) {
    c.quick_glu_activation_syncs = sourced_flag(host, "quick_glu_activation_syncs");
  }
  if (host.has("fp8_quantize_launches_issued")) {
    c.host_issues_fp8_quantize = sourced_flag(host, "fp8_quantize_launches_issued");
  }
  if (host.has("fp8_calls_per_local_expert")) {
    // {"<recipe>": {value, source}, ...}: which recipes build each expert's tensor on its own.
    JsonReader per_recipe = host.object("fp8_calls_per_local_expert");
    for (auto it = per_recipe.raw().begin(); it != per_recipe.raw().end(); ++it) {
      const std::string& name = it.key();
      if (name != "delayed" && name != "current" && name != "mxfp8" && name != "blockwise") {
        throw UserError(file, "/host/fp8_calls_per_local_expert/" + name, "an FP8 recipe (delayed, current, mxfp8, blockwise)", name);
      }
      c.host_fp8_calls_per_local_expert[name] = sourced(per_recipe, name, {.min = 0, .max = 1e3});
    }
    per_recipe.finish();
  }
  if (host.has("fp8_padding_calls")) c.host_fp8_padding_calls = sourced(host, "fp8_padding_calls", {.min = 0, .max = 1e3});
  if (host.has("grouped_gemm_launch_per_expert")) {
    c.grouped_gemm_launch_per_expert = sourced_flag(host, "grouped_gemm_launch_per_expert");
  }
  if (host.has("graph_replay_calls")) c.graph_replay_calls = sourced(host, "graph_replay_calls", {.min = 0, .max = 1e3});
  if (host.has("moe_preprocess_calls")) c.moe_preprocess_calls = sourced(host, "moe_preprocess_calls", {.min = 0, .max = 1e4});
  if (host.has("merged_1f1b_calls_per_node")) {
    c.merged_1f1b_calls_per_node = sourced(host, "merged_1f1b_calls_per_node", {.min = 0, .max = 1e3});
  }
  if (host.has("calls_per_op")) {
    JsonReader calls = host.object("calls_per_op");
    for (auto it = calls.raw().begin(); it != calls.raw().end(); ++it) {
      const auto& kinds = models::kAllOpKinds;
      const bool known = std::any_of(std::begin(kinds), std::end(kinds),
                                     [&](models::OpKind k) { return it.key() == models::to_string(k); });
      if (!known) throw UserError(file, "/host/calls_per_op/" + it.key(), "an op kind (rmsnorm, linear, attention, topk, ...)", it.key());
      c.host_calls_per_op[it.key()] = sourced(calls, it.key(), {.min = 0, .max = 1e4});
    }
    calls.finish();
  }
  // The unfused permute's calls, per MoE op that runs it.
  const auto moe_op_calls = [&](const char* key, std::map<std::string, double, std::less<>>& out) {
    if (!host.has(key)) return;
    JsonReader calls = host.object(key);
    for (auto it = calls.raw().begin(); it != calls.raw().end(); ++it) {
      if (it.key() != "dispatch" && it.key() != "combine") {
        throw UserError(file, std::string("/host/") + key + "/" + it.key(), "dispatch or combine", it.key());
      }
      out[it.key()] = sourced(calls, it.key(), {.min = 0, .max = 1e4});
    }
    calls.finish();
  };
  moe_op_calls("unfused_permute_calls", c.host_unfused_permute_calls);
  moe_op_calls("unfused_sort_chunks_calls", c.host_unfused_sort_chunks_calls);
  if (c.moe_preprocess_calls > 0) {
    // The preprocess graph takes its calls out of the dispatch op's.
    const auto it = c.host_calls_per_op.find("dispatch");
    const double dispatch_calls = it != c.host_calls_per_op.end() ? it->second : 1.0;
    if (c.moe_preprocess_calls > dispatch_calls) {
      throw UserError(file, "/host/moe_preprocess_calls/value",
                      "at most host.calls_per_op.dispatch = " + std::to_string(dispatch_calls) +
                          " (the preprocess is part of the dispatch op's calls)",
                      std::to_string(c.moe_preprocess_calls));
    }
  }
  host.finish();

  JsonReader m = r.object("memory");
  c.allocator_fragmentation = sourced(m, "allocator_fragmentation", {.min = 0, .max = 1});
  c.runtime_reserved_bytes = sourced(m, "runtime_reserved_bytes", nonneg);
  c.backward_workspace_factor = sourced(m, "backward_workspace_factor", nonneg);
  if (m.has("activation_bytes_factor")) c.activation_bytes_factor = sourced(m, "activation_bytes_factor", {.min_exclusive = 0, .max = 100});
  if (m.has("attention_score_bytes")) c.attention_score_bytes = sourced(m, "attention_score_bytes", {.min = 0, .max = 16});
  if (m.has("combine_saves_expert_outputs")) c.combine_saves_expert_outputs = sourced(m, "combine_saves_expert_outputs", {.min = 0, .max = 1});
  if (m.has("zero_shards_over_cp")) c.zero_shards_over_cp = sourced(m, "zero_shards_over_cp", {.min = 0, .max = 1});
  if (m.has("peak_by_phase")) c.peak_by_phase = sourced(m, "peak_by_phase", {.min = 0, .max = 1});
  if (m.has("fp8_non_tn_gpus")) c.fp8_non_tn_gpus = sourced_gpu_names(m, "fp8_non_tn_gpus", file, "/memory/fp8_non_tn_gpus");
  m.finish();
  r.finish();

  // The grouped factor: measured anchor efficiency over the dense curve at the
  // anchor's per-expert shape, so other grouped shapes follow the dense curve.
  const double rows_per_expert = c.grouped_anchor_rows / c.grouped_anchor_local_experts;
  const double anchor_flops = c.grouped_anchor_flop_multiple * 2.0 * c.grouped_anchor_rows * c.grouped_anchor_k *
                              c.grouped_anchor_n * 3.0;  // three SwiGLU matrices
  const double anchor_eff = anchor_flops / (c.grouped_anchor_iteration_s * c.grouped_anchor_peak_flops_per_s);
  topologies::GpuSpec anchor_gpu;
  anchor_gpu.name = "GB200";
  const double dense = gemm_efficiency(c, anchor_gpu, rows_per_expert, c.grouped_anchor_n, c.grouped_anchor_k);
  c.grouped_factor = std::min(1.0, anchor_eff / dense);
  // A stack that runs its experts as per-expert dense GEMMs states its own factor.
  if (c.grouped_per_expert_dense_relative_eff > 0) c.grouped_factor = c.grouped_per_expert_dense_relative_eff;
  return c;
}

Calibration load_calibration(const std::string& path) { return parse_calibration(load_json_file(path), path); }

const Calibration& default_calibration() {
  static const Calibration c = load_calibration();
  return c;
}

std::string gpu_power_key(const topologies::GpuSpec& gpu) {
  RS_CHECK(gpu.power_w > 0, "a power-limit calibration key needs the GPU's power limit");
  return gpu.name + "@" + std::to_string(static_cast<long>(std::lround(gpu.power_w))) + "W";
}

namespace {

// A GPU's entry in a per-GPU calibration map: the one measured at its power limit
// ("H100-SXM@500W", gpu_power_key) where the map has one, else the GPU's own.
const double* gpu_entry(const std::map<std::string, double>& m, const topologies::GpuSpec& gpu) {
  if (gpu.power_w > 0) {
    if (const auto it = m.find(gpu_power_key(gpu)); it != m.end()) return &it->second;
  }
  const auto it = m.find(gpu.name);
  return it != m.end() ? &it->second : nullptr;
}

}  // namespace

double gemm_peak_efficiency(const Calibration& c, const topologies::GpuSpec& gpu) {
  const double* own = gpu_entry(c.gemm_peak_eff, gpu);
  const double peak = own != nullptr ? *own : c.gemm_peak_eff_default;
  // A training step keeps the tensor cores busy for seconds; a GPU whose power limit is
  // below their draw at the boost clock runs them at the lower clock the limit holds
  // (flashinfer PR #2899: a B200 at its ~1 kW drops from 1,965 to ~1,580 MHz after ~5 ms;
  // Transformer Engine's GEMM profiling guide shows the same loss in long cuBLAS loops).
  const double* sustained = gpu_entry(c.gemm_sustained_ratio, gpu);
  return sustained != nullptr ? peak * *sustained : peak;
}

Calibration::AttentionEfficiency attention_efficiency(const Calibration& c, const topologies::GpuSpec& gpu) {
  const auto it = c.attention_eff_by_gpu.find(gpu.name);
  if (it == c.attention_eff_by_gpu.end()) {
    return {.fwd = c.attention_fwd_eff, .bwd = c.attention_bwd_eff, .masked_tile_cost = c.attention_masked_tile_cost};
  }
  // A kernel benchmark times a few milliseconds of back-to-back launches, at the boost clock;
  // a training step holds the tensor cores busy for seconds, at the clock the power limit
  // sustains: the burst rate times the kernel's measured sustained share (flashinfer PR #2899:
  // a B200 drops from 1,965 to ~1,580 MHz after ~5 ms of FlashAttention-4, -14% TF/s).
  Calibration::AttentionEfficiency sustained = it->second;
  sustained.fwd *= sustained.sustained_ratio;
  sustained.bwd *= sustained.sustained_ratio;
  sustained.sustained_ratio = 1.0;  // a sustained rate now: nothing downstream applies it again
  return sustained;
}

const Calibration::AttentionKernelCurve* attention_kernel_curve(const Calibration& c, const topologies::GpuSpec& gpu) {
  if (c.attention_kernel.empty()) return nullptr;
  const auto& per_gpu = c.attention_kernels.at(c.attention_kernel);
  const auto it = per_gpu.find(gpu.name);
  return it == per_gpu.end() ? nullptr : &it->second;
}

double interpolate_held(const std::vector<std::pair<double, double>>& points, double x) {
  RS_CHECK(!points.empty(), "interpolation needs at least one point");
  if (x <= points.front().first) return points.front().second;
  if (x >= points.back().first) return points.back().second;
  const auto hi = std::lower_bound(points.begin(), points.end(), x, [](const auto& p, double v) { return p.first < v; });
  const auto lo = hi - 1;
  return lo->second + (hi->second - lo->second) * (x - lo->first) / (hi->first - lo->first);
}

AttentionCurveTail attention_kernel_tail(const std::vector<std::pair<double, double>>& points) {
  RS_CHECK(!points.empty(), "an attention kernel's curve has a point");
  if (points.size() < 2) return {.a = 1.0 / points.back().second, .b = 0};
  const auto& [ln_s1, e1] = points[points.size() - 2];
  const auto& [ln_s2, e2] = points.back();
  const double b = (1.0 / e1 - 1.0 / e2) / (std::exp(-ln_s1) - std::exp(-ln_s2));
  if (!(b > 0)) return {.a = 1.0 / e2, .b = 0};
  return {.a = 1.0 / e2 - b * std::exp(-ln_s2), .b = b};
}

namespace {

// One head dim's curve at ln_seq: interpolated in log(length) between the published points,
// held below the first, attention_kernel_tail beyond the last.
double attention_curve_at(const std::vector<std::pair<double, double>>& points, double ln_seq) {
  if (ln_seq <= points.back().first) return interpolate_held(points, ln_seq);
  const AttentionCurveTail t = attention_kernel_tail(points);
  RS_CHECK(t.a > 0, "the calibration parser rejects a curve whose tail has no finite asymptote");
  return 1.0 / (t.a + t.b * std::exp(-ln_seq));
}

}  // namespace

Calibration::AttentionEfficiency attention_kernel_efficiency(const Calibration::AttentionKernelCurve& k, double seq_tokens,
                                                             double head_dim) {
  RS_CHECK(seq_tokens > 0 && head_dim > 0, "an attention kernel is priced at a sequence and head dim > 0");
  // The head dims around head_dim (one alone at or beyond the ends), each curve at this
  // sequence in log(length): the benchmarks double the length from point to point.
  const auto& curves = k.fwd_bwd_eff_by_ln_seq;
  RS_CHECK(!curves.empty(), "an attention kernel's curve has a head dim");
  auto hi = curves.lower_bound(head_dim);
  if (hi == curves.end()) --hi;
  const auto lo = hi == curves.begin() || hi->first <= head_dim ? hi : std::prev(hi);
  const double ln_seq = std::log(seq_tokens);
  const double y_lo = attention_curve_at(lo->second, ln_seq), y_hi = attention_curve_at(hi->second, ln_seq);
  const double fwd_bwd = lo == hi ? y_hi : y_lo + (y_hi - y_lo) * (head_dim - lo->first) / (hi->first - lo->first);
  // fwd + bwd FLOPs are 1 + 2.5 forward units (the backward recomputes QK^T: models::op_cost).
  const double r = k.fwd_over_bwd_rate;
  const double fwd = fwd_bwd * (1.0 + 2.5 * r) / 3.5;
  return {.fwd = fwd, .bwd = fwd / r};
}

double fp8_dense_relative_efficiency(const Calibration& c, const topologies::GpuSpec& gpu, bool* measured) {
  const double* own = gpu_entry(c.fp8_dense_relative_eff, gpu);
  if (measured) *measured = own != nullptr;
  return own != nullptr ? *own : c.fp8_gemm_relative_eff;
}

const Calibration::GemmShapeTable* gemm_shape_table(const Calibration& c, const topologies::GpuSpec& gpu) {
  const auto it = c.gemm_shape_by_gpu.find(gpu.name);
  return it != c.gemm_shape_by_gpu.end() ? &it->second : nullptr;
}

double gemm_efficiency(const Calibration& c, const topologies::GpuSpec& gpu, double m, double n, double k) {
  return gemm_efficiency_at(c, gemm_peak_efficiency(c, gpu), gemm_shape_table(c, gpu), m, n, k);
}

namespace {

// Where x falls on a table's grid: the cell's lower index, the fraction of the way to the
// next point in ln x, and the half_dim curve's share below the smallest dimension.
struct GridPoint {
  size_t i = 0;
  double frac = 0;
  double below = 1;
};

GridPoint grid_point(const Calibration::GemmShapeTable& t, double x, double half_dim) {
  const double lo = std::exp(t.ln_dims.front());
  GridPoint p;
  if (x < lo) p.below = shape_factor(x, half_dim) / shape_factor(lo, half_dim);
  const double ln = std::clamp(std::log(std::max(x, lo)), t.ln_dims.front(), t.ln_dims.back());
  const auto hi = std::upper_bound(t.ln_dims.begin(), t.ln_dims.end() - 1, ln);
  p.i = static_cast<size_t>(std::distance(t.ln_dims.begin(), hi)) - 1;
  p.frac = (ln - t.ln_dims[p.i]) / (t.ln_dims[p.i + 1] - t.ln_dims[p.i]);
  return p;
}

double table_shape_factor(const Calibration::GemmShapeTable& t, double half_dim, double m, double n, double k) {
  const size_t d = t.ln_dims.size();
  const GridPoint pm = grid_point(t, m, half_dim), pn = grid_point(t, n, half_dim), pk = grid_point(t, k, half_dim);
  double f = 0;
  for (int a = 0; a < 2; ++a) {
    for (int b = 0; b < 2; ++b) {
      for (int e = 0; e < 2; ++e) {
        const double w = (a ? pm.frac : 1 - pm.frac) * (b ? pn.frac : 1 - pn.frac) * (e ? pk.frac : 1 - pk.frac);
        if (w == 0) continue;
        f += w * t.relative[((pm.i + a) * d + pn.i + b) * d + pk.i + e];
      }
    }
  }
  return f * pm.below * pn.below * pk.below;
}

}  // namespace

double gemm_efficiency_at(const Calibration& c, double peak, const Calibration::GemmShapeTable* shape, double m,
                          double n, double k) {
  const double h = c.gemm_half_dim;
  if (shape) return std::min(peak * table_shape_factor(*shape, h, m, n, k), 0.95);
  const double ref = shape_factor(8192.0, h);
  const double f = shape_factor(m, h) * shape_factor(n, h) * shape_factor(k, h) / (ref * ref * ref);
  return std::min(peak * f, 0.95);
}

double grouped_gemm_efficiency(const Calibration& c, const topologies::GpuSpec& gpu, double rows_per_expert,
                               double k, double n) {
  return c.grouped_factor * gemm_efficiency(c, gpu, rows_per_expert, n, k);
}

double grouped_gemm_efficiency_at(const Calibration& c, double peak_eff, const Calibration::GemmShapeTable* shape,
                                  double rows_per_expert, double k, double n) {
  return c.grouped_factor * gemm_efficiency_at(c, peak_eff, shape, rows_per_expert, n, k);
}

double host_op_issue_s(const Calibration& c, const topologies::GpuSpec& gpu) {
  const auto it = c.op_issue_s_by_gpu.find(gpu.name);
  return it != c.op_issue_s_by_gpu.end() ? it->second : c.op_issue_s;
}

namespace {

// Piecewise-linear in log(ep) through the measured points; flat below the first,
// extrapolated with the last slope above the last (EP 64 is beyond EP 36), floored.
double interp_ep(const std::vector<EpBandwidthPoint>& pts, int64_t ep, bool dispatch) {
  const auto val = [&](const EpBandwidthPoint& p) { return dispatch ? p.dispatch_eff : p.combine_eff; };
  if (pts.size() == 1 || ep <= pts.front().ep) return val(pts.front());
  size_t i = 1;
  while (i + 1 < pts.size() && pts[i].ep < ep) ++i;
  const auto& a = pts[i - 1];
  const auto& b = pts[i];
  const double t = std::log(static_cast<double>(ep) / static_cast<double>(a.ep)) /
                   std::log(static_cast<double>(b.ep) / static_cast<double>(a.ep));
  return std::max(0.2, val(a) + t * (val(b) - val(a)));
}

}  // namespace

double ep_dispatch_eff(const Calibration& c, int64_t ep) { return interp_ep(c.ep_nvlink, ep, true); }
double ep_combine_eff(const Calibration& c, int64_t ep) { return interp_ep(c.ep_nvlink, ep, false); }
double ep_hybridep_dispatch_eff(const Calibration& c, int64_t ep) { return interp_ep(c.ep_hybridep_nvlink, ep, true); }
double ep_hybridep_combine_eff(const Calibration& c, int64_t ep) { return interp_ep(c.ep_hybridep_nvlink, ep, false); }

}  // namespace rackstep::sim
