// Collective cost model: fitted to the measured NVL72 all-reduce points, monotone
// in size, slower across domains, all-to-all bounded by the slowest tier.
#include <catch2/catch.hpp>

#include "sim/collectives.h"

using namespace rackstep;
using namespace rackstep::sim;

namespace {
topologies::Cluster racks(int64_t n) {
  return topologies::load_cluster(std::string(RACKSTEP_SOURCE_DIR) + "/topologies/zoo/gb200-nvl72.json", n);
}
}  // namespace

TEST_CASE("intra-rack alpha-beta is fitted from the measured all-reduce points", "[collectives]") {
  const Network net = make_network(racks(1), default_calibration());
  CHECK(net.intra_alpha_s > 2e-6);
  CHECK(net.intra_alpha_s < 9e-6);  // spec: 3-8 us inside a rack
  CHECK(net.intra_bw_bytes_per_s == Approx(895e9).epsilon(0.03));
  // Reproduces both measured points (72-GPU rack): 586 GB/s at 512 MB, 839 at 4 GB.
  CHECK(all_reduce_bus_bw(net, 1, 72, 512e6) == Approx(586e9).epsilon(0.01));
  CHECK(all_reduce_bus_bw(net, 1, 72, 4e9) == Approx(839e9).epsilon(0.01));
}

TEST_CASE("collectives grow with size and cost more across domains", "[collectives]") {
  const Network net = make_network(racks(12), default_calibration());
  const Group rack = group_of(net, 64, 1);
  CHECK(rack.domains == 1);
  const Group wide = group_of(net, 128, 1);
  CHECK(wide.domains == 2);
  const Group rail = group_of(net, 12, 64);
  CHECK(rail.domains == 12);
  CHECK(rail.per_domain() == 1);
  CHECK(all_gather_s(net, rack, 1e9) < all_gather_s(net, rack, 2e9));
  CHECK(all_gather_s(net, rack, 1e9) < all_gather_s(net, wide, 1e9));
  CHECK(all_reduce_s(net, rack, 1e9) > all_gather_s(net, rack, 1e9));
  CHECK(reduce_scatter_s(net, rack, 1e9) > 0);
  CHECK(all_gather_s(net, Group{}, 1e9) == 0.0);
  // All-to-all: leaving the rack goes over one NIC, far slower than NVLink.
  const double in_rack = all_to_all_s(net, rack, 1e9);
  const double two_racks = all_to_all_s(net, wide, 1e9);
  CHECK(two_racks > 5.0 * in_rack);
  CHECK(two_racks == Approx(0.5 * 1e9 / net.nic_a2a_bw_bytes_per_s).epsilon(0.05));
  CHECK(send_recv_s(net, true, 1e8) > send_recv_s(net, false, 1e8));
}

TEST_CASE("flat multi-rack all-reduce lands in the measured range", "[collectives]") {
  const Network net = make_network(racks(20), default_calibration());
  // Measured 406 GB/s at 16 GB over 20 racks: the hierarchical model is in the
  // right decade (the validation report shows the exact error).
  const double bw = all_reduce_bus_bw(net, 20, 72, 16e9);
  CHECK(bw > 200e9);
  CHECK(bw < 900e9);
}
