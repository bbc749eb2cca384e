// Liveness of a multi-process run: a watchdog on MPI collectives.
//
// A rank that is stopped (SIGSTOP, a debugger, a swapped-out node) or hung in
// its own code never enters the next collective, and every other rank waits
// in that collective forever at 100% CPU. The watchdog turns this into a clear
// error: each collective of exec/dist.h marks its start and end
// (CollectiveGuard); a thread checks twice a second and, when one collective
// has waited longer than the timeout, prints one line naming the collective,
// this rank and the rank(s) that stopped answering, then MPI_Aborts the job.
//
// Which rank stopped: the ranks of a host share a small table in /dev/shm
// (one slot per rank: a heartbeat the watchdog thread refreshes, the count of
// collectives entered, and the one it is in). A stopped process refreshes
// nothing, so its heartbeat goes stale; a rank hung in its own code keeps a
// fresh heartbeat but has entered fewer collectives. Ranks on other hosts are
// not in the table: the message says so instead of naming them.
//
//   Comm world = Comm::world();
//   start_collective_watchdog(world, /*timeout_s=*/600);   // 0 = off
//   { CollectiveGuard g("MPI_Allreduce"); MPI_Allreduce(...); }
#pragma once

#include <cstdint>

namespace rackstep::exec {

class Comm;

// Starts the watchdog thread (once per process; later calls only change the
// timeout). Collective over `world`: every rank calls it. No-op on one process.
void start_collective_watchdog(const Comm& world, double timeout_s);

// Marks one collective call (name: the MPI function) for the watchdog. Cheap:
// two relaxed atomic stores when the watchdog is off.
class CollectiveGuard {
 public:
  explicit CollectiveGuard(const char* name);
  ~CollectiveGuard();
  CollectiveGuard(const CollectiveGuard&) = delete;
  CollectiveGuard& operator=(const CollectiveGuard&) = delete;
};

}  // namespace rackstep::exec
