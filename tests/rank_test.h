// What the multi-process tests (run under mpirun: tests/dp_ranks.cpp,
// tests/cuda_ep_ranks.cpp, tests/cuda_nccl_ranks.cpp) share: a failed
// expectation prints one line naming its rank and is counted; the counts are
// summed over the ranks at the end; a scratch folder every rank names alike.
//
//   expect(a == b, "losses bitwise equal", world.rank());
//   const fs::path root = shared_temp_dir(world, "rackstep-dp-ranks");
//   return all_passed(world) ? 0 : 1;
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>

#include "exec/dist.h"

namespace rackstep::exec::testing {

inline int rank_failures = 0;

inline void expect(bool ok, const std::string& what, int rank) {
  if (ok) return;
  ++rank_failures;
  std::printf("rank %d: FAIL: %s\n", rank, what.c_str());
}

// temp/<prefix>-<root's pid>: the same path on every rank of one run, another for the next run.
inline std::filesystem::path shared_temp_dir(const Comm& world, const std::string& prefix) {
  int root_pid = world.root() ? static_cast<int>(::getpid()) : 0;
  world.broadcast(&root_pid, sizeof root_pid, 0);
  return std::filesystem::temp_directory_path() / (prefix + "-" + std::to_string(root_pid));
}

// True when no rank failed an expectation (a collective: every rank calls it).
inline bool all_passed(const Comm& world) {
  int64_t failed = rank_failures;
  world.allreduce_sum(&failed, 1);
  return failed == 0;
}

}  // namespace rackstep::exec::testing
