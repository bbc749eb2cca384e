// Cost of collectives on a hierarchical cluster: NVLink domains (racks, nodes)
// joined by a rail-optimised scale-out fabric, one NIC per GPU, domains grouped
// into scalable units under a spine tier.
//
// Model (alpha-beta per tier, so small messages are latency bound and large
// ones bandwidth bound):
//   inside a domain   ring steps cost alpha_intra each, payload moves at beta_intra
//                     (per-GPU bus bandwidth). Both are fitted from the cluster's
//                     measured one-domain all-reduce points (nccl-tests bus
//                     bandwidth at two sizes: t = 2(n-1)·alpha + 2(n-1)/n · B / beta),
//                     else taken from the domain's latency and measured link bandwidth.
//   across domains    each GPU runs a ring over its own rail (the same-index GPU of
//                     every domain): beta = the per-NIC rate × calibration
//                     scale_out_eff; alpha per ring step = the larger of the
//                     scale-out latency and calibration inter_domain_step_latency_s
//                     (a chunked ring waits for each chunk to cross the NIC). A
//                     communicator with many GPUs per domain drives at most
//                     calibration inter_domain_nics NICs of each domain (NCCL binds
//                     a channel to one NIC): that is what makes a full-rack
//                     all-reduce over many racks NIC bound while one rail's ring
//                     (the hero's cross-rack gradient reduction) keeps its NIC.
//   hybrid groups     (g GPUs in each of D domains) are hierarchical: reduce-scatter
//                     in the domain, all-reduce of the 1/g shard across domains,
//                     all-gather in the domain. The phases are pipelined in chunks
//                     (NCCL rings and NVLS trees stream every tier at once), so the
//                     time is the latencies of every phase plus the slowest tier's
//                     bandwidth term, not their sum.
//   all-to-all        limited by the slowest tier it crosses: the share of the
//                     payload that leaves the domain goes over one NIC, the rest
//                     over NVLink, concurrently; the share that leaves the
//                     scalable unit shares the spine.
//
//   Network net = make_network(cluster, cal);
//   Group g = group_of(net, /*size=*/64, /*stride=*/1);      // one rack
//   double t = all_gather_s(net, g, /*full_bytes=*/1e9);
#pragma once

#include <cstdint>

#include "sim/calibration.h"
#include "topologies/topology.h"

namespace rackstep::sim {

struct Network {
  int64_t gpus_per_domain = 1;
  double intra_alpha_s = 5e-6;
  double intra_bw_bytes_per_s = 0;     // bus bandwidth per GPU
  double link_bw_bytes_per_s = 0;      // measured one-way GPU-to-GPU NVLink
  double inter_alpha_s = 45e-6;        // one message across the fabric
  double inter_step_alpha_s = 45e-6;   // one step of a chunked ring across domains
  double inter_nics_per_domain = 0;    // NICs one communicator drives per domain (0 = all)
  double inter_bw_bytes_per_s = 0;     // per NIC, achieved by rings
  double nic_a2a_bw_bytes_per_s = 0;   // per NIC, all-to-all
  double h2d_bw_bytes_per_s = 0;
  int64_t domains_per_unit = 0;        // scalable unit (0 = one unit)
  double spine_bw_fraction = 1.0;      // 1 / spine oversubscription
  // NCCL's tuning-model ring latency (calibration ring_*_latency_s; all 0 = the
  // alpha-per-step model above): base + intra hops + inter hops per ring pass.
  double ring_base_s = 0, ring_intra_hop_s = 0, ring_inter_hop_s = 0;
  bool nccl_ring_latency() const { return ring_base_s + ring_intra_hop_s + ring_inter_hop_s > 0; }
};

Network make_network(const topologies::Cluster& c, const Calibration& cal);

// A communicator: `size` ranks spread over `domains` domains (size/domains per domain).
struct Group {
  int64_t size = 1;
  int64_t domains = 1;
  int64_t units = 1;                   // scalable units the domains span
  int64_t per_domain() const { return size / domains; }
};
// Ranks r*stride for r < size, with ranks numbered domain-major (gpus_per_domain per domain).
Group group_of(const Network& net, int64_t size, int64_t stride);

// full_bytes: the size of the whole (gathered / reduced) buffer.
double all_gather_s(const Network& net, const Group& g, double full_bytes);
double reduce_scatter_s(const Network& net, const Group& g, double full_bytes);
double all_reduce_s(const Network& net, const Group& g, double full_bytes);
// bytes_per_rank: what each rank sends in total (spread evenly over the group).
// link_eff scales the NVLink tier (EP kernels reach less than raw link rate).
double all_to_all_s(const Network& net, const Group& g, double bytes_per_rank, double link_eff = 1.0);
// An all-to-all whose per-GPU bytes on each tier the caller gives (a dispatcher that
// does not spread its rows evenly over the peers): NVLink and the NIC stream
// concurrently, the spine share runs at the spine's rate. all_to_all_s is this with
// the even split of even_a2a_tiers.
struct A2aTiers {
  double nvlink_bytes = 0, nic_bytes = 0, spine_bytes = 0;  // per GPU, one call
};
A2aTiers even_a2a_tiers(const Group& g, double bytes_per_rank);
double all_to_all_tiers_s(const Network& net, const Group& g, const A2aTiers& b, double link_eff = 1.0);
// EP dispatch (or combine) of `tokens` rows per GPU, each routed to top_k of `experts`
// experts spread evenly over the group, `row_bytes` a row, as DeepEP / HybridEP move
// them (Layout's flex dispatcher): one copy per destination GPU holding any of the
// token's experts (DeepEP get_dispatch_layout's is_token_in_rank), and across
// domains one copy per destination domain over the NIC, forwarded there over
// NVLink (its num_tokens_per_rdma_rank; DeepSeek-V3 report §3.2.2: a token reaches a
// node once and fans out over NVLink). Experts drawn uniformly (balanced routing).
A2aTiers flex_dispatch_tiers(const Group& g, double tokens, int64_t experts, int64_t top_k, double row_bytes);
double send_recv_s(const Network& net, bool cross_domain, double bytes);
// Latency of one ring pass (all-gather or reduce-scatter) over the group: NCCL's
// tuning model when the network carries it, else the alpha of each tier's ring.
double ring_pass_latency_s(const Network& net, const Group& g);
// Bandwidth per GPU of this group's rings across domains (NIC cap included).
double inter_bw(const Network& net, const Group& g);
// Scalable units that `domains` consecutive domains span.
int64_t units_spanned(const Network& net, int64_t domains);
// nccl-tests bus bandwidth of an all-reduce over `domains` full domains (for validation).
double all_reduce_bus_bw(const Network& net, int64_t domains, int64_t gpus_per_domain, double bytes);

// ------------------------------------------------------------ bytes per tier
// What the discrete-event simulator (sim/step_graph.h) needs of a collective:
// the real per-GPU bytes of its algorithm on each network tier, and how its
// time splits into a fixed latency and the time those bytes take.
//
// Per-GPU bytes of one call on each tier, and the bandwidth part of its time
// (its time for the payload minus its time for a 1-byte message).
//   ring (NCCL, hierarchical): inside each domain every GPU sends (n-1)/n of
//     the buffer per pass over NVLink; across domains the 1/inner shard goes
//     round a rail ring over the NIC (all the NIC bytes cross the spine when
//     the group spans scalable units).
//   all-to-all: the share to peers in the domain crosses NVLink, the rest the
//     NIC, the share to peers outside the scalable unit the spine too.
struct Traffic {
  double nvlink_bytes = 0, nic_bytes = 0, spine_bytes = 0, bw_s = 0;
  Traffic& operator+=(const Traffic& o);
};
Traffic all_gather_traffic(const Network& net, const Group& g, double full_bytes);
Traffic reduce_scatter_traffic(const Network& net, const Group& g, double full_bytes);
Traffic all_reduce_traffic(const Network& net, const Group& g, double full_bytes);
Traffic all_to_all_traffic(const Network& net, const Group& g, double bytes_per_rank, double link_eff = 1.0);
Traffic all_to_all_tiers_traffic(const Network& net, const Group& g, const A2aTiers& b, double link_eff = 1.0);
Traffic send_recv_traffic(const Network& net, bool cross_domain, double bytes);

// One call as the event engine runs it: a fixed latency, then the per-GPU bytes
// over the NVLink port and the NIC streaming together; alone on their links the
// tiers finish after bw_s, so latency_s + bw_s is the predictor's time.
struct CommCost {
  double latency_s = 0;
  double bw_s = 0;
  double nvlink_bytes = 0;  // per GPU
  double nic_bytes = 0;     // per GPU, leaves the NVLink domain
  double spine_bytes = 0;   // of nic_bytes: leaves the scalable unit over the spine
  double time_s() const { return latency_s + bw_s; }
  CommCost scaled(double f) const { return {latency_s * f, bw_s * f, nvlink_bytes * f, nic_bytes * f, spine_bytes * f}; }
};
// The predictor's time t_s for a call, split into latency and bandwidth time for
// the traffic's bytes (the bandwidth part never exceeds t_s).
CommCost comm_cost(double t_s, const Traffic& tr);

}  // namespace rackstep::sim
