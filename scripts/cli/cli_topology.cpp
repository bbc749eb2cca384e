// `rackstep topology FILE`: what a hardware description says, with sources.
#include <cstdio>
#include <memory>

#include "scripts/cli/command.h"
#include "scripts/cli/flags.h"
#include "topologies/topology.h"

namespace rackstep::topologies {
namespace {

struct Args {
  std::string path;
  int64_t domains = 0;
  bool json = false;
};

int run(const Args& a) {
  const Cluster c = load_cluster(a.path, a.domains);
  const auto& g = c.system.gpu;
  nlohmann::json j = {{"name", c.name},
                      {"gpus", c.gpus()},
                      {"domains", c.domains},
                      {"gpus_per_domain", c.gpus_per_domain},
                      {"gpu", g.name},
                      {"peak_bf16_flops_per_s", g.peak_bf16_flops_per_s},
                      {"hbm_bytes", g.hbm_bytes},
                      {"hbm_bw_bytes_per_s", g.hbm_bw_bytes_per_s},
                      {"nvlink_bw_bytes_per_s_per_direction", c.system.domain.link_bw_bytes_per_s},
                      {"nic_bw_bytes_per_s", c.system.scale_out.nic_bw_bytes_per_s},
                      {"sources", c.system.sources}};
  if (a.json) {
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("%s: %lld GPUs = %lld domains x %lld (%s)\n", c.name.c_str(), static_cast<long long>(c.gpus()),
              static_cast<long long>(c.domains), static_cast<long long>(c.gpus_per_domain), g.name.c_str());
  std::printf("  peak BF16 %.3g FLOP/s, HBM %.0f GB at %.2f TB/s, NVLink %.0f GB/s/dir, NIC %.0f GB/s/dir\n",
              g.peak_bf16_flops_per_s, g.hbm_bytes / 1e9, g.hbm_bw_bytes_per_s / 1e12,
              c.system.domain.link_bw_bytes_per_s / 1e9, c.system.scale_out.nic_bw_bytes_per_s / 1e9);
  std::printf("  sources:\n");
  for (const auto& [k, v] : c.system.sources) std::printf("    %-44s %s\n", k.c_str(), v.c_str());
  return 0;
}

cli::Registration reg{"topology", "Show a hardware description (system or cluster JSON) with its sources",
                      [](CLI::App& app) {
                        auto a = std::make_shared<Args>();
                        app.add_option("file", a->path, "system or cluster JSON")->required();
                        app.add_option("--domains", a->domains, "override the number of racks/nodes")
                            ->check(cli::count(1, 10000));
                        app.add_flag("--json", a->json, "print JSON");
                        return [a] { return run(*a); };
                      }};

}  // namespace
}  // namespace rackstep::topologies
