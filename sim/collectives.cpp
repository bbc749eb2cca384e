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

// Latency and bandwidth halves of one ring pass (all-gather or reduce-scatter) of
// n ranks over a buffer of full_bytes: (n-1) steps, each moving 1/n of it.
double ring_alpha_s(int64_t n, double alpha) { return n <= 1 ? 0.0 : static_cast<double>(n - 1) * alpha; }
double ring_beta_s(int64_t n, double bw, double full_bytes) {
  if (n <= 1) return 0.0;
  const double nn = static_cast<double>(n);
  return (nn - 1.0) / nn * full_bytes / bw;
}

// One hierarchical pass (gather or scatter) of a buffer of full_bytes: the rail
// rings across domains on 1/inner of it, the domain rings on all of it, pipelined.
double hierarchical_pass_s(const Network& net, const Group& g, double full_bytes) {
  const int64_t inner = g.per_domain();
  const double alpha = ring_pass_latency_s(net, g);
  const double inter = ring_beta_s(g.domains, inter_bw(net, g), full_bytes / static_cast<double>(inner));
  const double intra = ring_beta_s(inner, net.intra_bw_bytes_per_s, full_bytes);
  return alpha + std::max(inter, intra);
}

}  // namespace

double ring_pass_latency_s(const Network& net, const Group& g) {
  if (g.size <= 1) return 0.0;
  if (!net.nccl_ring_latency()) {
    return ring_alpha_s(g.domains, net.inter_step_alpha_s) + ring_alpha_s(g.per_domain(), net.intra_alpha_s);
  }
  // NCCL's ring is flat: nRanks-1 steps, nNodes-1 of them across the network
  // (src/graph/tuning.cc: latency = baseLat + (nsteps - nInterSteps)·intraLat + nInterSteps·interLat).
  const double steps = static_cast<double>(g.size - 1);
  const double inter_steps = static_cast<double>(g.domains - 1);
  return net.ring_base_s + (steps - inter_steps) * net.ring_intra_hop_s + inter_steps * net.ring_inter_hop_s;
}

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
  n.inter_step_alpha_s = std::max(n.inter_alpha_s, cal.inter_domain_step_latency_s);
  n.inter_nics_per_domain = cal.inter_domain_nics;
  n.domains_per_unit = s.scale_out.domains_per_unit;
  n.spine_bw_fraction = 1.0 / std::max(1.0, s.scale_out.spine_oversubscription);
  n.ring_base_s = cal.ring_base_latency_s;
  n.ring_intra_hop_s = cal.ring_intra_hop_latency_s;
  n.ring_inter_hop_s = cal.ring_inter_hop_latency_s;
  return n;
}

int64_t units_spanned(const Network& net, int64_t domains) {
  if (net.domains_per_unit <= 0 || domains <= net.domains_per_unit) return 1;
  return (domains + net.domains_per_unit - 1) / net.domains_per_unit;
}

Group group_of(const Network& net, int64_t size, int64_t stride) {
  Group g;
  g.size = std::max<int64_t>(1, size);
  const int64_t span = g.size * std::max<int64_t>(1, stride);  // consecutive GPUs the group covers
  if (span <= net.gpus_per_domain) return g;
  // Members per domain: how many of the strided ranks fall into one domain.
  const int64_t per_domain = std::max<int64_t>(1, net.gpus_per_domain / std::max<int64_t>(1, stride));
  g.domains = std::max<int64_t>(1, (g.size + per_domain - 1) / per_domain);
  if (g.size % g.domains != 0) g.domains = g.size;  // irregular: treat as one rank per domain
  const int64_t spanned = (span + net.gpus_per_domain - 1) / std::max<int64_t>(1, net.gpus_per_domain);
  g.units = units_spanned(net, std::max(g.domains, spanned));
  return g;
}

double inter_bw(const Network& net, const Group& g) {
  // A communicator with `inner` GPUs per domain drives at most inter_nics_per_domain
  // NICs of each domain (NCCL binds each channel to one NIC); a rail group (one
  // GPU per domain) always has its own NIC. Rail rings cross the spine on few
  // flows, so its oversubscription does not slow them (all_to_all_s prices it).
  const double inner = static_cast<double>(g.per_domain());
  if (net.inter_nics_per_domain <= 0 || inner <= net.inter_nics_per_domain) return net.inter_bw_bytes_per_s;
  return net.inter_bw_bytes_per_s * net.inter_nics_per_domain / inner;
}

double all_gather_s(const Network& net, const Group& g, double full_bytes) {
  if (g.size <= 1 || full_bytes <= 0) return 0.0;
  return hierarchical_pass_s(net, g, full_bytes);
}

double reduce_scatter_s(const Network& net, const Group& g, double full_bytes) {
  return all_gather_s(net, g, full_bytes);  // the mirror image of the gather
}

double all_reduce_s(const Network& net, const Group& g, double full_bytes) {
  if (g.size <= 1 || full_bytes <= 0) return 0.0;
  return 2.0 * hierarchical_pass_s(net, g, full_bytes);  // reduce-scatter, then all-gather
}

double all_to_all_s(const Network& net, const Group& g, double bytes_per_rank, double link_eff) {
  if (g.size <= 1 || bytes_per_rank <= 0) return 0.0;
  return all_to_all_tiers_s(net, g, even_a2a_tiers(g, bytes_per_rank), link_eff);
}

namespace {
// GPUs of the group in my scalable unit (the rest are reached over the spine).
double unit_ranks(const Group& g) {
  return static_cast<double>(g.per_domain()) *
         std::ceil(static_cast<double>(g.domains) / static_cast<double>(std::max<int64_t>(1, g.units)));
}
}  // namespace

A2aTiers even_a2a_tiers(const Group& g, double bytes_per_rank) {
  A2aTiers b;
  if (g.size <= 1 || bytes_per_rank <= 0) return b;
  const double n = static_cast<double>(g.size);
  const double inner = static_cast<double>(g.per_domain());
  b.nvlink_bytes = (inner - 1.0) / n * bytes_per_rank;  // to peers in my domain
  b.nic_bytes = (n - inner) / n * bytes_per_rank;       // leaves the domain over my NIC
  if (g.units > 1) b.spine_bytes = std::max(0.0, n - unit_ranks(g)) / n * bytes_per_rank;
  return b;
}

double all_to_all_tiers_s(const Network& net, const Group& g, const A2aTiers& b, double link_eff) {
  if (g.size <= 1 || b.nvlink_bytes + b.nic_bytes <= 0) return 0.0;
  const double t_intra = b.nvlink_bytes / (net.link_bw_bytes_per_s * link_eff);
  double t_inter = b.nic_bytes / net.nic_a2a_bw_bytes_per_s;
  // Peers outside my scalable unit: the unit's NICs share the spine above them.
  if (b.spine_bytes > 0) {
    t_inter = std::max(t_inter, b.spine_bytes / (net.nic_a2a_bw_bytes_per_s * net.spine_bw_fraction));
  }
  const double alpha = g.domains > 1 ? net.inter_alpha_s : net.intra_alpha_s;
  return alpha + std::max(t_intra, t_inter);
}

namespace {
// P(none of a token's top_k experts, drawn without replacement from `experts`, is
// among `held` of them) = C(experts - held, k) / C(experts, k).
double miss_probability(double experts, double held, double k) {
  double p = 1.0;
  for (double i = 0; i < k; ++i) {
    const double left = experts - held - i;
    if (left <= 0) return 0.0;
    p *= left / (experts - i);
  }
  return p;
}
}  // namespace

A2aTiers flex_dispatch_tiers(const Group& g, double tokens, int64_t experts, int64_t top_k, double row_bytes) {
  A2aTiers b;
  if (g.size <= 1 || tokens <= 0 || experts <= 0 || top_k <= 0) return b;
  const double n = static_cast<double>(g.size);
  const double inner = static_cast<double>(g.per_domain());
  const double domains = static_cast<double>(g.domains);
  const double e = static_cast<double>(experts), k = static_cast<double>(std::min(top_k, experts));
  const double per_gpu = e / n;
  const double hit_gpu = 1.0 - miss_probability(e, per_gpu, k);             // a given GPU gets the token
  const double hit_domain = 1.0 - miss_probability(e, per_gpu * inner, k);  // a given domain does
  // NVLink: to the hit peers of my domain, and forwarding what other domains sent
  // me to the hit peers of mine (by symmetry as many rows as I send out).
  b.nvlink_bytes = tokens * domains * (inner - 1.0) * hit_gpu * row_bytes;
  b.nic_bytes = tokens * (domains - 1.0) * hit_domain * row_bytes;
  if (g.units > 1) {
    const double unit_domains = unit_ranks(g) / inner;
    b.spine_bytes = tokens * std::max(0.0, domains - unit_domains) * hit_domain * row_bytes;
  }
  return b;
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
  g.units = units_spanned(net, domains);
  const double t = all_reduce_s(net, g, bytes);
  const double n = static_cast<double>(g.size);
  return t > 0 ? 2.0 * (n - 1.0) / n * bytes / t : 0.0;
}

// ------------------------------------------------------------ bytes per tier

namespace {

constexpr double kOneByte = 1.0;

using RingTime = double (*)(const Network&, const Group&, double);

// passes: 1 for all-gather / reduce-scatter, 2 for all-reduce.
Traffic ring_traffic(const Network& net, const Group& g, double full_bytes, double passes, RingTime fn) {
  Traffic t;
  if (g.size <= 1 || full_bytes <= 0) return t;
  const double inner = static_cast<double>(g.per_domain());
  const double domains = static_cast<double>(g.domains);
  t.nvlink_bytes = passes * (inner - 1.0) / inner * full_bytes;
  t.nic_bytes = passes * (domains - 1.0) / domains * full_bytes / inner;
  if (g.units > 1) t.spine_bytes = t.nic_bytes;  // a rail ring across units runs at the spine's share
  t.bw_s = fn(net, g, full_bytes) - fn(net, g, kOneByte);
  return t;
}

}  // namespace

Traffic& Traffic::operator+=(const Traffic& o) {
  nvlink_bytes += o.nvlink_bytes;
  nic_bytes += o.nic_bytes;
  spine_bytes += o.spine_bytes;
  bw_s += o.bw_s;
  return *this;
}

Traffic all_gather_traffic(const Network& net, const Group& g, double full_bytes) {
  return ring_traffic(net, g, full_bytes, 1.0, all_gather_s);
}

Traffic reduce_scatter_traffic(const Network& net, const Group& g, double full_bytes) {
  return ring_traffic(net, g, full_bytes, 1.0, reduce_scatter_s);
}

Traffic all_reduce_traffic(const Network& net, const Group& g, double full_bytes) {
  return ring_traffic(net, g, full_bytes, 2.0, all_reduce_s);
}

Traffic all_to_all_traffic(const Network& net, const Group& g, double bytes_per_rank, double link_eff) {
  Traffic t;
  if (g.size <= 1 || bytes_per_rank <= 0) return t;
  t = all_to_all_tiers_traffic(net, g, even_a2a_tiers(g, bytes_per_rank), link_eff);
  t.bw_s = all_to_all_s(net, g, bytes_per_rank, link_eff) - all_to_all_s(net, g, kOneByte, link_eff);
  return t;
}

Traffic all_to_all_tiers_traffic(const Network& net, const Group& g, const A2aTiers& b, double link_eff) {
  Traffic t;
  if (g.size <= 1 || b.nvlink_bytes + b.nic_bytes <= 0) return t;
  t.nvlink_bytes = b.nvlink_bytes;
  t.nic_bytes = b.nic_bytes;
  t.spine_bytes = b.spine_bytes;
  // The bandwidth part: the call's time less its latency (the time of no bytes).
  t.bw_s = all_to_all_tiers_s(net, g, b, link_eff) - (g.domains > 1 ? net.inter_alpha_s : net.intra_alpha_s);
  return t;
}

Traffic send_recv_traffic(const Network& net, bool cross_domain, double bytes) {
  Traffic t;
  if (bytes <= 0) return t;
  (cross_domain ? t.nic_bytes : t.nvlink_bytes) = bytes;
  t.bw_s = send_recv_s(net, cross_domain, bytes) - send_recv_s(net, cross_domain, kOneByte);
  return t;
}

CommCost comm_cost(double t_s, const Traffic& tr) {
  CommCost c;
  if (!(t_s > 0)) return c;
  c.nvlink_bytes = tr.nvlink_bytes;
  c.nic_bytes = tr.nic_bytes;
  c.spine_bytes = std::min(tr.spine_bytes, tr.nic_bytes);
  c.bw_s = c.nvlink_bytes + c.nic_bytes > 0 ? std::clamp(tr.bw_s, 0.0, t_s) : 0.0;
  if (c.bw_s <= 0) c.nvlink_bytes = c.nic_bytes = c.spine_bytes = 0;
  c.latency_s = t_s - c.bw_s;
  return c;
}

}  // namespace rackstep::sim
