// Data parallel through the backend's collectives (exec/backend.h,
// BackendCollectives) against the host path (MPI over host copies, exec/dist.h),
// N processes under mpirun:
//
//   mpirun -np 2 build/tests/test_dp_ranks           (CTest: exec_dp_ranks; CPU, in CI)
//   mpirun -np 2 build/tests/test_cuda_dp_ranks      (CTest: cuda_dp_ranks, label gpu)
//
// The CPU build trains tiny-moe on "cpu-collectives" (the CPU backend dressed
// as a device whose collectives are exec::Comm's MPI calls and whose optimizer
// steps its shard in "its" memory: tests/exec_not_host_backend.h) and on
// "cpu" with the host path: the same sums in the same order, so losses,
// checkpoint and parameters must be bitwise equal. The CUDA build trains on
// "cuda" with NCCL (reduce-scatter into the owner's device shard, the device
// optimizer, all-gather) and with the host path (the host optimizer): the same
// run to the rounding of the reduction order and of Newton–Schulz's GEMMs.
// Both stop after 2 of 3 steps, checkpoint, and resume the third step. The
// backend's path (and the CPU build's host path) also runs with the gradients'
// reduce-scatter begun during the backward in ranges (--grad-bucket-mb):
// bitwise the run without (two ranks' sums are the same in either order). The
// CPU build also trains with expert parallelism across the ranks (--ep N,
// pooled, --verify-dispatch) on both paths: MpiExperts on the host, and the
// backend's own transport (the path NCCL takes on the GPU), there with the
// reduce-scatter overlapping the backward's exchanges: bitwise equal.
//
// Needs >= 2 ranks (the CUDA build: a GPU per rank); otherwise every rank
// prints why and exits 77, which CTest reports as skipped, never as passed.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "exec/data.h"
#include "exec/dist.h"
#include "exec/train.h"
#include "sim/base/json_io.h"
#include "sim/base/source_dir.h"
#include "tests/exec_test_data.h"
#include "tests/rank_test.h"
#if defined(RACKSTEP_TEST_CUDA)
#include <cuda_runtime.h>

#include "exec/cuda/backend.h"
#else
#include "tests/exec_not_host_backend.h"
#endif

namespace {

using namespace rackstep;
using namespace rackstep::exec;
namespace fs = std::filesystem;

using testing::expect;

// Generated text built into a dataset by rank 0; every rank reads it.
std::string dataset(const Comm& world, const fs::path& root) {
  if (world.root()) testing::build_word_dataset(root, 7);
  world.barrier();
  return (root / "data").string();
}

struct Run {
  std::vector<double> losses;
  std::vector<char> checkpoint;  // rank 0's file
  std::vector<float> params;
  int64_t ranges = 0;  // the last step's reduce-scatter ranges
  std::map<std::string, int> lane;  // with `profile`, rank 0: slices per name on the trace's collectives lane
};

// Slices per name on thread "collectives" of a Chrome trace.
std::map<std::string, int> collectives_lane(const std::string& trace_path) {
  const nlohmann::json t = load_json_file(trace_path);
  const nlohmann::json& events = t.is_object() ? t["traceEvents"] : t;
  int lane = -1;
  for (const auto& e : events) {
    if (e.value("ph", "") == "M" && e.value("name", "") == "thread_name" && e["args"]["name"] == "collectives") {
      lane = e["tid"];
    }
  }
  std::map<std::string, int> n;
  for (const auto& e : events) {
    if (e.value("ph", "") == "X" && e["tid"] == lane) ++n[e["name"].get<std::string>()];
  }
  return n;
}

Run train(const Comm& world, const std::string& data, const std::string& dir, const std::string& backend,
          const std::string& collectives, int64_t ep = 1, double grad_bucket_mb = 0, bool profile = false) {
  TrainOptions o;
  o.grad_bucket_mb = grad_bucket_mb;
  if (ep > 1) {  // expert parallel across the ranks, pooled, with drops, every layer checked against sim::dispatch
    o.dispatch.enabled = true;
    o.dispatch.ep = ep;
    o.dispatch.config.transport = sim::Transport::pooled;
    o.dispatch.config.sender_cf = 0.8;
    o.dispatch.config.receiver_cf = 0.8;
    o.verify_dispatch = true;
  }
  o.model_path = std::string(source_dir()) + "/models/zoo/tiny-moe.json";
  o.data_dir = data;
  o.out_dir = dir;
  o.backend = backend;
  o.dp_collectives = collectives;
  o.steps = 3;
  o.batch = 4;
  o.seq = 64;
  o.seed = 5;
  o.threads = 1;
  o.eval_batches = 1;
  Run r;
  std::string path;
  {
    TrainOptions first = o;
    first.stop_after = 2;
    first.profile = profile;
    Trainer t(first, &world);
    while (!t.done()) r.losses.push_back(t.step().loss);
    path = t.save_checkpoint();
    t.write_profile();
    if (profile && world.root()) r.lane = collectives_lane(dir + "/trace.json");
  }
  if (world.root()) {
    std::ifstream f(path, std::ios::binary);
    r.checkpoint.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  }
  o.resume = true;
  Trainer t(o, &world);
  while (!t.done()) r.losses.push_back(t.step().loss);
  r.ranges = t.reduce_scatter_ranges();
  const Arena& p = std::as_const(t.model()).params();
  r.params.assign(p.data(), p.data() + p.total_floats());
  return r;
}

// ||a - b|| / ||b|| over two equally long vectors (1 when a is empty or not finite).
template <typename T>
double rel_diff(const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size() || a.empty()) return 1;
  double d = 0, n = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    d += (double(a[i]) - double(b[i])) * (double(a[i]) - double(b[i]));
    n += double(b[i]) * double(b[i]);
  }
  const double r = std::sqrt(d / std::max(n, 1e-300));
  return std::isfinite(r) ? r : 1;
}

}  // namespace

int main() {
  const int ranks = launcher_world_size();
#if defined(RACKSTEP_TEST_CUDA)
  const char* name = "test_cuda_dp_ranks";
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess) devices = 0;
  const bool can = ranks >= 2 && devices >= ranks;
  const std::string device_backend = "cuda";
#else
  const char* name = "test_dp_ranks";
  const int devices = 0;
  const bool can = ranks >= 2;
  const std::string device_backend = "cpu-collectives";
#endif
  if (!can) {
    std::printf("%s: skipped: needs >= 2 ranks under mpirun%s (ranks %d, GPUs %d)\n", name,
                device_backend == "cuda" ? " and a GPU per rank" : "", ranks, devices);
    return 77;
  }
#if defined(RACKSTEP_TEST_CUDA)
  cuda::register_cuda_backend();
#else
  testing::register_not_host_backends();
#endif
  Comm world = Comm::world();
  const fs::path root = testing::shared_temp_dir(world, "rackstep-dp-ranks");
  const std::string data = dataset(world, root);
  const std::string host_backend = device_backend == "cuda" ? "cuda" : "cpu";
  const Run host = train(world, data, (root / "host").string(), host_backend, "host");
  const Run dev = train(world, data, (root / "backend").string(), device_backend, "backend");
  // The reduce-scatter begun during the backward by ranges of >= 16 KiB (tiny-moe's
  // arena holds a few hundred KiB) on both paths.
  const double bucket_mb = 1.0 / 64;
  // Profiled (rank 0): the collectives are the trace's own lane.
  const Run dev_overlap =
      train(world, data, (root / "backend-overlap").string(), device_backend, "backend", 1, bucket_mb, true);
  const int r = world.rank();
  expect(host.losses.size() == 3 && dev.losses.size() == 3, "3 steps each", r);
  expect(host.ranges == 1 && dev.ranges == 1, "--grad-bucket-mb 0: one reduce-scatter after the backward", r);
  expect(dev_overlap.ranges > 2, "overlapped: the reduce-scatter begun in several ranges", r);
  if (world.root()) {  // 2 profiled steps: every range's reduce-scatter and the all-gather
    const std::map<std::string, int> want = {{"reduce_scatter", 2 * dev_overlap.ranges}, {"all_gather", 2}};
    expect(dev_overlap.lane == want, "profiled: 2 steps of collectives on the trace's collectives lane", r);
  }
  const bool bitwise = device_backend != "cuda";
  if (bitwise) {
    expect(std::memcmp(host.losses.data(), dev.losses.data(), sizeof(double) * host.losses.size()) == 0,
           "losses bitwise equal", r);
    expect(host.params == dev.params, "parameters after resume bitwise equal", r);
    expect(host.checkpoint == dev.checkpoint, "checkpoints bitwise equal", r);
    // Overlapped, the same per-element sums (of two ranks: commutative): bitwise the same run.
    const Run host_overlap =
        train(world, data, (root / "host-overlap").string(), host_backend, "host", 1, bucket_mb);
    expect(host_overlap.ranges > 2, "host path overlapped: the reduce-scatter begun in several ranges", r);
    expect(host_overlap.losses == host.losses && host_overlap.params == host.params &&
               host_overlap.checkpoint == host.checkpoint,
           "host path overlapped: losses, parameters and checkpoint bitwise equal", r);
  } else {
    // Reduction order (NCCL's against MPI's) and the device Newton–Schulz against the host's.
    expect(rel_diff(dev.losses, host.losses) < 1e-4, "losses within 1e-4", r);
    expect(rel_diff(dev.params, host.params) < 1e-4, "parameters within 1e-4 (relative norm)", r);
  }
  // The backend's path overlapped against itself not overlapped: the same sums
  // (NCCL's too: ncclReduce of two ranks per element) of the same gradients
  // (the CUDA kernels reduce in a fixed order), so bitwise the same run.
  expect(dev_overlap.losses == dev.losses && dev_overlap.params == dev.params &&
             dev_overlap.checkpoint == dev.checkpoint,
         "backend path overlapped: losses, parameters and checkpoint bitwise equal", r);
#if !defined(RACKSTEP_TEST_CUDA)
  // Expert parallel across the ranks through the backend's own transport
  // (Backend::make_experts, the path of the GPU's NCCL experts; here the MPI
  // transport reporting device memory) against MpiExperts on the host path:
  // the same plan and sums, so bitwise the same run.
  const Run host_ep = train(world, data, (root / "host-ep").string(), "cpu", "host", world.size());
  const Run dev_ep =
      train(world, data, (root / "backend-ep").string(), device_backend, "backend", world.size(), bucket_mb);
  expect(dev_ep.ranges > 2, "EP: the reduce-scatter begun in several ranges", r);
  expect(host_ep.losses.size() == 3 && host_ep.losses == dev_ep.losses, "EP: losses bitwise equal", r);
  expect(host_ep.params == dev_ep.params, "EP: parameters after resume bitwise equal", r);
  expect(host_ep.losses != host.losses, "EP: the dispatch changed the run (drops)", r);
#endif
  if (world.root()) {
    for (size_t i = 0; i < host.losses.size() && i < dev.losses.size(); ++i) {
      std::printf("%s: step %zu loss host %.9g backend %.9g\n", name, i + 1, host.losses[i], dev.losses[i]);
    }
  }
  const bool passed = testing::all_passed(world);
  world.barrier();
  if (world.root()) {
    fs::remove_all(root);
    std::printf("%s: %d ranks: %s\n", name, world.size(), passed ? "passed" : "FAILED");
  }
  return passed ? 0 : 1;
}
