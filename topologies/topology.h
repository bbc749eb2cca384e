// Hardware descriptions: GPUs, NVLink domains (racks / nodes), hosts, the
// scale-out fabric, and clusters of N domains. Every number in the JSON
// carries its source: {"value": 2.5e15, "source": "[DS] NVIDIA GB200 datasheet"}.
//
//   rackstep::topologies::Cluster c = rackstep::topologies::load_cluster("topologies/zoo/gb200-nvl72.json", 11);
//   double peak = c.system.gpu.peak_bf16_flops_per_s;   // 2.5e15
//   int64_t gpus = c.gpus();                             // 11 * 64 = 704
//
// A cluster file names a system file and a domain count:
//   {"name": "gb200-12-racks", "system": "gb200-nvl72.json", "domains": 12}
// and load_cluster("x.json") accepts either kind of file (a system file is a
// one-domain cluster unless `domains` is given).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace rackstep::topologies {

struct GpuSpec {
  std::string name;
  double peak_bf16_flops_per_s = 0;  // dense
  double peak_fp8_flops_per_s = 0;
  double peak_fp4_flops_per_s = 0;
  double peak_tf32_flops_per_s = 0;
  double peak_fp32_flops_per_s = 0;
  double mfu_peak_flops_per_s = 0;   // the peak MFU is quoted against (Marin convention)
  double hbm_bytes = 0;              // usable by the job (driver-visible), the memory verdicts' capacity
  double hbm_physical_bytes = 0;     // marketed capacity ("80 GB" = 80 GiB); 0 = not given
  double hbm_bw_bytes_per_s = 0;     // datasheet
  double hbm_bw_measured_bytes_per_s = 0;
  int64_t sms = 0;
  double l2_bytes = 0;
  double power_w = 0;
};

// GPUs that reach each other over NVLink (a GB200 NVL72 rack, an HGX node).
struct DomainSpec {
  int64_t size = 1;                  // GPUs physically in the domain
  int64_t healthy_gpus = 1;          // GPUs a job uses per domain
  int64_t gpus_per_tray = 1;
  double link_bw_bytes_per_s = 0;    // per GPU, per direction (datasheet)
  double link_bw_measured_bytes_per_s = 0;  // GPU-to-GPU, one way
  double latency_s = 0;              // small-message collective latency in the domain
};

struct HostSpec {
  double memory_bytes_per_gpu = 0;
  double h2d_bw_bytes_per_s = 0;     // measured host<->device per GPU
  double memory_bw_bytes_per_s_per_gpu = 0;
  int64_t cpu_cores_per_gpu = 0;
};

struct ScaleOutSpec {
  std::string topology = "rail_optimized_fat_tree";
  double nic_bw_bytes_per_s = 0;     // per GPU, per direction
  double all_to_all_bw_bytes_per_s = 0;  // measured per NIC
  double latency_s = 0;
  int64_t domains_per_unit = 0;      // scalable unit size (racks); 0 = the whole cluster is one unit
  // Traffic between scalable units crosses the spine tier, which carries
  // 1/oversubscription of the NIC bandwidth below it (1 = non-blocking).
  double spine_oversubscription = 1.0;
};

// A measured collective bandwidth point (nccl-tests bus bandwidth).
struct CollectivePoint {
  std::string op;                    // "all_reduce", "all_to_all", ...
  int64_t domains = 1;               // 1 = inside one NVLink domain
  int64_t gpus = 0;
  double bytes = 0;
  double bus_bw_bytes_per_s = 0;
  std::string source;
};

struct SystemSpec {
  std::string name;
  std::string kind;                  // "rack", "node", "host"
  GpuSpec gpu;
  DomainSpec domain;
  HostSpec host;
  ScaleOutSpec scale_out;
  std::vector<CollectivePoint> measured_collectives;
  std::map<std::string, std::string> sources;  // JSON path -> source
  std::string file;
};

struct Cluster {
  std::string name;
  SystemSpec system;
  int64_t domains = 1;
  int64_t gpus_per_domain = 1;       // healthy GPUs used per domain
  int64_t gpus() const { return domains * gpus_per_domain; }
};

SystemSpec load_system(const std::string& path);
SystemSpec parse_system(const nlohmann::json& doc, const std::string& file);
// Loads a cluster or system file. domains > 0 overrides the file's count.
Cluster load_cluster(const std::string& path, int64_t domains = 0);
Cluster make_cluster(const SystemSpec& system, int64_t domains, int64_t gpus_per_domain = 0);

// Path of a file in the source tree's zoo (for embedded defaults).
std::string zoo_path(const std::string& relative);

}  // namespace rackstep::topologies
