#include "sim/collectives.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace rackstep::sim {

namespace {

// Fits t = 2(n-1)·alpha + 2(n-1)/n · B / beta to two measured one-domain
// all-reduce points (bus bw = 2(n-1)/n · B / t). Returns false when it cannot.
bool fit_intra(const topologies::SystemSpec& s, double* alpha, double* beta) {
  std::vector<topologies::CollectivePoint> pts;
  for (const auto& p : s.measured_collectives) {
    if (p.op == "all_reduce" && p.domains == 1 && p.gpus > 1 && p.bytes > 0) pts.push_back(p);
  }
  if (pts.size() < 2) return false;
  std::sort(pts.begin(), pts.end(), [](const auto& a, const auto& b) { return a.bytes < b.bytes; });
  const auto& a = pts.front();
  const auto& b = pts.back();
  const double n = static_cast<double>(a.gpus);
  const double ring = 2.0 * (n - 1.0) / n;
  const double ta = ring * a.bytes / a.bus_bw_bytes_per_s;
  const double tb = ring * b.bytes / b.bus_bw_bytes_per_s;
  if (tb <= ta) return false;
  const double bw = ring * (b.bytes - a.bytes) / (tb - ta);
  const double al = (ta - ring * a.bytes / bw) / (2.0 * (n - 1.0));
  if (!(bw > 0) || !(al >= 0)) return false;
  *alpha = al;
  *beta = bw;
  return true;
}

double ring_s(int64_t n, double alpha, double bw, double full_bytes) {
  if (n <= 1) return 0.0;
  const double nn = static_cast<double>(n);
  return (nn - 1.0) * alpha + (nn - 1.0) / nn * full_bytes / bw;
}

}  // namespace

Network make_network(const topologies::Cluster& c, const Calibration& cal) {
  const auto& s = c.system;
  Network n;
  n.gpus_per_domain = c.gpus_per_domain;
  n.link_bw_bytes_per_s = s.domain.link_bw_measured_bytes_per_s > 0 ? s.domain.link_bw_measured_bytes_per_s
                                                                    : 0.85 * s.domain.link_bw_bytes_per_s;
  n.intra_alpha_s = s.domain.latency_s > 0 ? s.domain.latency_s : 5e-6;
  n.intra_bw_bytes_per_s = n.link_bw_bytes_per_s;
  fit_intra(s, &n.intra_alpha_s, &n.intra_bw_bytes_per_s);
  n.inter_alpha_s = s.scale_out.latency_s > 0 ? s.scale_out.latency_s : 45e-6;
  n.nic_a2a_bw_bytes_per_s = s.scale_out.all_to_all_bw_bytes_per_s > 0 ? s.scale_out.all_to_all_bw_bytes_per_s
                                                                       : s.scale_out.nic_bw_bytes_per_s;
  n.inter_bw_bytes_per_s = n.nic_a2a_bw_bytes_per_s * cal.scale_out_eff;
  n.h2d_bw_bytes_per_s = s.host.h2d_bw_bytes_per_s;
  return n;
}

Group group_of(const Network& net, int64_t size, int64_t stride) {
  Group g;
  g.size = std::max<int64_t>(1, size);
  const int64_t span = g.size * stride;  // consecutive GPUs the group covers
  if (span <= net.gpus_per_domain) return g;
  // Members per domain: how many of the strided ranks fall into one domain.
  const int64_t per_domain = std::max<int64_t>(1, net.gpus_per_domain / std::max<int64_t>(1, stride));
  g.domains = std::max<int64_t>(1, (g.size + per_domain - 1) / per_domain);
  if (g.size % g.domains != 0) g.domains = g.size;  // irregular: treat as one rank per domain
  return g;
}

double all_gather_s(const Network& net, const Group& g, double full_bytes) {
  if (g.size <= 1 || full_bytes <= 0) return 0.0;
  const int64_t inner = g.per_domain();
  // Across domains first on 1/inner of the buffer (one rail per GPU), then inside.
  const double inter = ring_s(g.domains, net.inter_alpha_s, net.inter_bw_bytes_per_s, full_bytes / static_cast<double>(inner));
  return inter + ring_s(inner, net.intra_alpha_s, net.intra_bw_bytes_per_s, full_bytes);
}

double reduce_scatter_s(const Network& net, const Group& g, double full_bytes) {
  return all_gather_s(net, g, full_bytes);  // the mirror image of the gather
}

double all_reduce_s(const Network& net, const Group& g, double full_bytes) {
  if (g.size <= 1 || full_bytes <= 0) return 0.0;
  const int64_t inner = g.per_domain();
  const double intra = 2.0 * ring_s(inner, net.intra_alpha_s, net.intra_bw_bytes_per_s, full_bytes);
  const double inter = 2.0 * ring_s(g.domains, net.inter_alpha_s, net.inter_bw_bytes_per_s,
                                    full_bytes / static_cast<double>(inner));
  return intra + inter;
}

double all_to_all_s(const Network& net, const Group& g, double bytes_per_rank, double link_eff) {
  if (g.size <= 1 || bytes_per_rank <= 0) return 0.0;
  const double n = static_cast<double>(g.size);
  const double inner = static_cast<double>(g.per_domain());
  const double local_share = (inner - 1.0) / n;  // to peers in my domain
  const double remote_share = (n - inner) / n;   // leaves the domain over my NIC
  const double t_intra = local_share * bytes_per_rank / (net.link_bw_bytes_per_s * link_eff);
  const double t_inter = remote_share * bytes_per_rank / net.nic_a2a_bw_bytes_per_s;
  const double alpha = g.domains > 1 ? net.inter_alpha_s : net.intra_alpha_s;
  return alpha + std::max(t_intra, t_inter);
}

double send_recv_s(const Network& net, bool cross_domain, double bytes) {
  if (bytes <= 0) return 0.0;
  if (cross_domain) return net.inter_alpha_s + bytes / net.nic_a2a_bw_bytes_per_s;
  return net.intra_alpha_s + bytes / net.link_bw_bytes_per_s;
}

double all_reduce_bus_bw(const Network& net, int64_t domains, int64_t gpus_per_domain, double bytes) {
  Group g;
  g.size = domains * gpus_per_domain;
  g.domains = domains;
  const double t = all_reduce_s(net, g, bytes);
  const double n = static_cast<double>(g.size);
  return t > 0 ? 2.0 * (n - 1.0) / n * bytes / t : 0.0;
}

}  // namespace rackstep::sim
