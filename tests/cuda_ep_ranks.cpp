// Expert parallelism on the GPU (exec/cuda/experts.h: NCCL in device memory)
// against the MPI transport on the CPU (exec/dist.h MpiExperts), N processes
// under mpirun, one GPU each:
//
//   mpirun -np 2 build/tests/test_cuda_ep_ranks     (CTest: cuda_ep_ranks, label gpu)
//
// Every rank trains tiny-moe for 3 steps with --ep N, pooled then ragged, with
// capacities that bind, on "cuda" and on "cpu", both with --verify-dispatch
// (every layer's kept assignments checked against sim::dispatch on every
// rank). The two runs share the planning (exec/ep_plan.h): each step's drops
// must be equal and the losses equal to the rounding of the GPU's arithmetic.
// The GPU runs again with the waves' exchange not overlapping their experts
// (ep_overlap off): its losses must be the overlapped run's bit for bit.
//
// Needs >= 2 ranks and a GPU per rank; otherwise every rank prints why and
// exits 77, which CTest reports as skipped, never as passed.
#include <cuda_runtime.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "exec/cuda/backend.h"
#include "exec/dist.h"
#include "exec/train.h"
#include "sim/base/source_dir.h"
#include "tests/exec_test_data.h"
#include "tests/rank_test.h"

namespace {

using namespace rackstep;
using namespace rackstep::exec;
namespace fs = std::filesystem;

using testing::expect;

struct Run {
  std::vector<StepLog> logs;
  int64_t verified = 0;
};

Run train(const Comm& world, const std::string& data, const std::string& backend, sim::Transport transport,
          bool overlap = true) {
  TrainOptions o;
  o.model_path = std::string(source_dir()) + "/models/zoo/tiny-moe.json";
  o.data_dir = data;
  o.backend = backend;
  o.steps = 3;
  o.batch = 2 * world.size();
  o.seq = 64;
  o.seed = 5;
  o.threads = 1;
  o.eval_batches = 1;
  o.dispatch.enabled = true;
  o.dispatch.ep = world.size();
  o.dispatch.config.transport = transport;
  o.dispatch.config.sender_cf = 0.8;
  o.dispatch.config.receiver_cf = 0.8;
  o.dispatch.config.waves = 2;
  o.verify_dispatch = true;
  o.ep_overlap = overlap;
  Run r;
  Trainer t(o, &world);
  while (!t.done()) r.logs.push_back(t.step());
  r.verified = t.verified_dispatch_layers();
  return r;
}

}  // namespace

int main() {
  const int ranks = launcher_world_size();
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess) devices = 0;
  if (ranks < 2 || devices < ranks) {
    std::printf("test_cuda_ep_ranks: skipped: needs >= 2 ranks under mpirun and a GPU per rank (ranks %d, GPUs %d)\n",
                ranks, devices);
    return 77;
  }
  cuda::register_cuda_backend();
  Comm world = Comm::world();
  const fs::path root = testing::shared_temp_dir(world, "rackstep-ep-ranks");
  if (world.root()) testing::build_word_dataset(root, 7);
  world.barrier();
  const std::string data = (root / "data").string();
  const int r = world.rank();
  for (const sim::Transport transport : {sim::Transport::pooled, sim::Transport::ragged}) {
    const std::string name = sim::transport_name(transport);
    const Run cpu = train(world, data, "cpu", transport);
    const Run gpu = train(world, data, "cuda", transport);
    expect(cpu.logs.size() == 3 && gpu.logs.size() == 3, name + ": 3 steps each", r);
    expect(gpu.verified > 0 && gpu.verified == cpu.verified, name + ": every layer verified against sim::dispatch", r);
    int64_t dropped = 0;
    for (size_t i = 0; i < cpu.logs.size() && i < gpu.logs.size(); ++i) {
      const sim::DropCounts &c = cpu.logs[i].drops, &g = gpu.logs[i].drops;
      const std::string step = name + " step " + std::to_string(i + 1);
      expect(c.sender == g.sender && c.receiver == g.receiver && c.assignments == g.assignments,
             step + ": drops equal to the MPI transport's", r);
      expect(std::abs(gpu.logs[i].loss - cpu.logs[i].loss) <= 1e-4 * std::abs(cpu.logs[i].loss),
             step + ": loss within 1e-4 of the CPU's", r);
      dropped += g.dropped();
      if (world.root()) {
        std::printf("test_cuda_ep_ranks: %s: loss cpu %.9g cuda %.9g, dropped cpu %lld cuda %lld of %lld\n",
                    step.c_str(), cpu.logs[i].loss, gpu.logs[i].loss, static_cast<long long>(c.dropped()),
                    static_cast<long long>(g.dropped()), static_cast<long long>(g.assignments));
      }
    }
    expect(dropped > 0, name + ": the capacities bind (something is dropped)", r);
    // The waves' exchange not overlapping their experts: the same calls in the same order, bit for bit.
    const Run serial = train(world, data, "cuda", transport, false);
    expect(serial.logs.size() == gpu.logs.size(), name + ": --ep-overlap off: 3 steps", r);
    for (size_t i = 0; i < serial.logs.size() && i < gpu.logs.size(); ++i) {
      expect(serial.logs[i].loss == gpu.logs[i].loss, name + ": --ep-overlap off: losses bitwise equal", r);
    }
  }
  const bool passed = testing::all_passed(world);
  world.barrier();
  if (world.root()) {
    fs::remove_all(root);
    std::printf("test_cuda_ep_ranks: %d ranks: %s\n", world.size(), passed ? "passed" : "FAILED");
  }
  return passed ? 0 : 1;
}
