#include "topologies/topology.h"
#include "sim/base/source_dir.h"

#include <filesystem>

#include "sim/base/check.h"
#include "sim/base/json_io.h"

namespace rackstep::topologies {
namespace {

const NumberRange kPositive{.min_exclusive = 0.0};
const NumberRange kNonNegative{.min = 0.0};

// Reads {"value": x, "source": "..."}; a bare number is an error (every
// hardware figure must say where it comes from).
double sourced(JsonReader& r, const std::string& key, SystemSpec& s, NumberRange range,
               bool required = true) {
  if (!r.has(key)) {
    if (required) r.fail(key, "{\"value\": number, \"source\": string}", "nothing");
    r.ignore(key);
    return 0.0;
  }
  const auto& v = r.raw().at(key);
  if (!v.is_object()) r.fail(key, "{\"value\": number, \"source\": string}", describe_json(v));
  JsonReader o = r.object(key);
  double x = o.number("value", range);
  std::string src = o.string("source");
  if (src.empty()) o.fail("source", "a non-empty source", "\"\"");
  o.finish();
  s.sources[r.path_of(key)] = src;
  return x;
}

void parse_gpu(JsonReader r, SystemSpec& s) {
  auto& g = s.gpu;
  g.name = r.string("name");
  JsonReader peak = r.object("peak_flops_per_s");
  g.peak_bf16_flops_per_s = sourced(peak, "bf16", s, kPositive);
  g.peak_fp8_flops_per_s = sourced(peak, "fp8", s, kNonNegative, false);
  g.peak_fp4_flops_per_s = sourced(peak, "fp4", s, kNonNegative, false);
  g.peak_tf32_flops_per_s = sourced(peak, "tf32", s, kNonNegative, false);
  g.peak_fp32_flops_per_s = sourced(peak, "fp32", s, kNonNegative, false);
  peak.finish();
  g.mfu_peak_flops_per_s = r.has("mfu_peak_flops_per_s") ? sourced(r, "mfu_peak_flops_per_s", s, kPositive)
                                                          : g.peak_bf16_flops_per_s;
  g.hbm_bytes = sourced(r, "hbm_bytes", s, kPositive);
  g.hbm_physical_bytes = sourced(r, "hbm_physical_bytes", s, kNonNegative, false);
  g.hbm_bw_bytes_per_s = sourced(r, "hbm_bw_bytes_per_s", s, kPositive);
  g.hbm_bw_measured_bytes_per_s = r.has("hbm_bw_measured_bytes_per_s")
                                      ? sourced(r, "hbm_bw_measured_bytes_per_s", s, kPositive)
                                      : g.hbm_bw_bytes_per_s;
  g.sms = static_cast<int64_t>(sourced(r, "sms", s, kNonNegative, false));
  g.l2_bytes = sourced(r, "l2_bytes", s, kNonNegative, false);
  g.power_w = sourced(r, "power_w", s, kNonNegative, false);
  r.finish();
}

void parse_domain(JsonReader r, SystemSpec& s) {
  auto& d = s.domain;
  d.size = static_cast<int64_t>(sourced(r, "size", s, kPositive));
  d.healthy_gpus = r.has("healthy_gpus") ? static_cast<int64_t>(sourced(r, "healthy_gpus", s, kPositive)) : d.size;
  if (d.healthy_gpus > d.size) {
    r.fail("healthy_gpus", "at most size (" + std::to_string(d.size) + ")", std::to_string(d.healthy_gpus));
  }
  d.gpus_per_tray = static_cast<int64_t>(sourced(r, "gpus_per_tray", s, kPositive, false));
  if (d.gpus_per_tray == 0) d.gpus_per_tray = d.size;
  d.link_bw_bytes_per_s = sourced(r, "link_bw_bytes_per_s", s, kPositive);
  d.link_bw_measured_bytes_per_s = r.has("link_bw_measured_bytes_per_s")
                                       ? sourced(r, "link_bw_measured_bytes_per_s", s, kPositive)
                                       : d.link_bw_bytes_per_s;
  d.latency_s = sourced(r, "latency_s", s, kNonNegative);
  r.finish();
}

void parse_host(JsonReader r, SystemSpec& s) {
  auto& h = s.host;
  h.memory_bytes_per_gpu = sourced(r, "memory_bytes_per_gpu", s, kPositive);
  h.h2d_bw_bytes_per_s = sourced(r, "h2d_bw_bytes_per_s", s, kPositive);
  h.memory_bw_bytes_per_s_per_gpu = sourced(r, "memory_bw_bytes_per_s_per_gpu", s, kNonNegative, false);
  h.cpu_cores_per_gpu = static_cast<int64_t>(sourced(r, "cpu_cores_per_gpu", s, kNonNegative, false));
  r.finish();
}

void parse_scale_out(JsonReader r, SystemSpec& s) {
  auto& f = s.scale_out;
  f.topology = r.choice("topology", {"rail_optimized_fat_tree", "fat_tree", "none"}, "rail_optimized_fat_tree");
  f.nic_bw_bytes_per_s = sourced(r, "nic_bw_bytes_per_s", s, kPositive);
  f.all_to_all_bw_bytes_per_s = r.has("all_to_all_bw_bytes_per_s")
                                    ? sourced(r, "all_to_all_bw_bytes_per_s", s, kPositive)
                                    : f.nic_bw_bytes_per_s;
  f.latency_s = sourced(r, "latency_s", s, kNonNegative);
  f.domains_per_unit = static_cast<int64_t>(sourced(r, "domains_per_unit", s, kNonNegative, false));
  f.spine_oversubscription =
      r.has("spine_oversubscription") ? sourced(r, "spine_oversubscription", s, {.min = 1.0}) : 1.0;
  r.finish();
}

void parse_collectives(JsonReader& r, SystemSpec& s) {
  if (!r.has("measured_collectives")) {
    r.ignore("measured_collectives");
    return;
  }
  for (JsonReader c : r.object_list("measured_collectives")) {
    CollectivePoint p;
    p.op = c.choice("op", {"all_reduce", "all_gather", "reduce_scatter", "all_to_all"}, "all_reduce");
    p.domains = c.integer("domains", 1, kPositive);
    p.gpus = c.integer("gpus", kPositive);
    p.bytes = c.number("bytes", kPositive);
    p.bus_bw_bytes_per_s = c.number("bus_bw_bytes_per_s", kPositive);
    p.source = c.string("source");
    c.finish();
    s.measured_collectives.push_back(p);
  }
}

}  // namespace

SystemSpec parse_system(const nlohmann::json& doc, const std::string& file) {
  JsonReader r(doc, file);
  SystemSpec s;
  s.file = file;
  r.ignore("comment");
  s.name = r.string("name");
  s.kind = r.choice("kind", {"rack", "node", "host"}, "rack");
  parse_gpu(r.object("gpu"), s);
  parse_domain(r.object("domain"), s);
  parse_host(r.object("host"), s);
  if (r.has("scale_out")) {
    parse_scale_out(r.object("scale_out"), s);
  } else {
    r.ignore("scale_out");
    s.scale_out.topology = "none";
  }
  parse_collectives(r, s);
  r.ignore("domains");  // read by load_cluster when a system file is used as a cluster
  r.ignore("system");
  r.finish();
  return s;
}

SystemSpec load_system(const std::string& path) { return parse_system(load_json_file(path), path); }

Cluster make_cluster(const SystemSpec& system, int64_t domains, int64_t gpus_per_domain) {
  Cluster c;
  c.system = system;
  c.domains = domains;
  c.gpus_per_domain = gpus_per_domain > 0 ? gpus_per_domain : system.domain.healthy_gpus;
  c.name = system.name + "x" + std::to_string(domains);
  return c;
}

Cluster load_cluster(const std::string& path, int64_t domains) {
  const nlohmann::json doc = load_json_file(path);
  if (!doc.is_object()) throw UserError(path, "/", "an object", describe_json(doc));
  if (!doc.contains("system")) {
    Cluster c = make_cluster(parse_system(doc, path), 1);
    if (doc.contains("domains")) {
      JsonReader r(doc, path);
      c.domains = r.integer("domains", {.min = 1});
    }
    if (domains > 0) c.domains = domains;
    c.name = c.system.name + "x" + std::to_string(c.domains);
    return c;
  }
  JsonReader r(doc, path);
  r.ignore("comment");
  std::string name = r.string("name");
  std::string system_file = r.string("system");
  std::filesystem::path sys_path = std::filesystem::path(path).parent_path() / system_file;
  int64_t n = r.integer("domains", {.min = 1, .max = 10000});  // bounds memory and time (issue 17)
  int64_t per = r.integer("healthy_gpus_per_domain", 0, {.min = 0});
  r.finish();
  std::error_code ec;  // an over-long or looping name is "missing", not a filesystem_error
  if (!std::filesystem::exists(sys_path, ec)) {
    r.fail("system", "a system file next to the cluster file", "\"" + sys_path.string() + "\" missing");
  }
  SystemSpec sys = load_system(sys_path.string());
  if (per > sys.domain.size) {
    r.fail("healthy_gpus_per_domain", "at most the domain size (" + std::to_string(sys.domain.size) + ")",
           std::to_string(per));
  }
  Cluster c = make_cluster(sys, domains > 0 ? domains : n, per);
  c.name = name;
  return c;
}

std::string zoo_path(const std::string& relative) {
  return std::string(rackstep::source_dir()) + "/" + relative;
}

}  // namespace rackstep::topologies
