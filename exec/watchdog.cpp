#include "exec/watchdog.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <string>
#include <thread>

#include "exec/dist.h"

#ifdef RACKSTEP_HAVE_MPI
#include <mpi.h>
#endif

namespace rackstep::exec {

namespace {

constexpr double kStaleHeartbeatS = 2.0;  // the thread beats every 0.2 s
constexpr auto kTick = std::chrono::milliseconds(200);

// One rank's slot in the host's shared table.
struct Slot {
  std::atomic<uint64_t> heartbeat_ns;  // 0 = never (not on this host)
  std::atomic<uint64_t> entered;       // collectives entered
  std::atomic<uint32_t> in_collective;
  std::atomic<int32_t> pid;
};

struct State {
  std::atomic<const char*> name{nullptr};  // the collective waited in ("MPI_Allreduce(...)"), null = none
  std::atomic<uint64_t> started_ns{0};
  std::atomic<uint64_t> entered{0};
  std::atomic<int64_t> timeout_ms{0};
  std::atomic<Slot*> table{nullptr};
  int rank = 0, size = 1;
  bool running = false;
};

State& state() {
  static State* s = new State;  // never destroyed: the detached thread may outlive static destructors
  return *s;
}

uint64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);  // system-wide: comparable between the processes of a host
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

std::string call_name(const char* call) {
  std::string s(call);
  const size_t p = s.find('(');
  return p == std::string::npos ? s : s.substr(0, p);
}

// Who is missing, from the host table; `lower_live_waiter` tells whether a
// lower rank waits too (it reports; this one stays quiet a little longer).
std::string diagnose(const State& s, Slot* table, uint64_t now, bool& lower_live_waiter) {
  std::string stopped, behind;
  int unseen = 0;
  const uint64_t mine = s.entered.load();
  for (int r = 0; r < s.size; ++r) {
    if (r == s.rank) continue;
    const Slot& slot = table[r];
    const uint64_t hb = slot.heartbeat_ns.load();
    if (hb == 0) {
      ++unseen;
      continue;
    }
    const double age_s = static_cast<double>(now - std::min(now, hb)) * 1e-9;
    char buf[200];
    if (age_s > kStaleHeartbeatS) {
      std::snprintf(buf, sizeof buf, "%srank %d (pid %d) stopped: no heartbeat for %.0f s", stopped.empty() ? "" : "; ",
                    r, slot.pid.load(), age_s);
      stopped += buf;
    } else if (slot.entered.load() < mine) {
      std::snprintf(buf, sizeof buf, "%srank %d (pid %d) has not reached it (busy or hung in its own code)",
                    behind.empty() ? "" : "; ", r, slot.pid.load());
      behind += buf;
    } else if (r < s.rank && slot.in_collective.load() != 0) {
      lower_live_waiter = true;
    }
  }
  std::string out = stopped;
  if (!behind.empty()) out += (out.empty() ? "" : "; ") + behind;
  if (out.empty()) {
    out = unseen > 0 ? "every rank on this host is waiting too: the missing rank is on another host (" +
                           std::to_string(unseen) + " ranks not visible here)"
                     : "every rank is waiting in a collective (mismatched collectives?)";
  }
  return out;
}

[[noreturn]] void abort_job(const std::string& line) {
  std::fprintf(stderr, "rackstep: %s\n", line.c_str());
  std::fflush(stderr);
#ifdef RACKSTEP_HAVE_MPI
  // Called from the watchdog thread: the main thread is blocked inside MPI and
  // will never return to call it. Open MPI's abort tears the job down from any thread.
  MPI_Abort(MPI_COMM_WORLD, 3);
#endif
  _exit(3);
}

void watch() {
  State& s = state();
  for (;;) {
    std::this_thread::sleep_for(kTick);
    const uint64_t now = now_ns();
    Slot* table = s.table.load();
    if (table) table[s.rank].heartbeat_ns.store(now);
    const int64_t timeout_ms = s.timeout_ms.load();
    const char* name = s.name.load();
    if (timeout_ms <= 0 || name == nullptr) continue;
    const double waited_s = static_cast<double>(now - std::min(now, s.started_ns.load())) * 1e-9;
    if (waited_s * 1e3 < static_cast<double>(timeout_ms)) continue;
    bool lower_live_waiter = false;
    const std::string who =
        table ? diagnose(s, table, now, lower_live_waiter) : std::string("no host table to tell which rank");
    if (lower_live_waiter && waited_s * 1e3 < static_cast<double>(timeout_ms) + 3000) continue;  // it reports
    char head[256];
    std::snprintf(head, sizeof head,
                  "rank %d: collective %s (number %llu) has waited %.0f s, past --collective-timeout-s %.0f: ",
                  s.rank, call_name(name).c_str(), static_cast<unsigned long long>(s.entered.load()), waited_s,
                  static_cast<double>(timeout_ms) / 1e3);
    abort_job(head + who + "; aborting the job (MPI_Abort)");
  }
}

// The host table: /dev/shm/rackstep-watchdog-<key>, a key every rank shares.
Slot* open_table(const Comm& world) {
  int64_t key = world.root() ? static_cast<int64_t>(::getpid()) * 1000003 + static_cast<int64_t>(::time(nullptr)) : 0;
  world.allreduce_sum(&key, 1);
  const std::string name = "/rackstep-watchdog-" + std::to_string(key);
  const size_t bytes = sizeof(Slot) * static_cast<size_t>(world.size());
  const int fd = ::shm_open(name.c_str(), O_CREAT | O_RDWR, 0600);
  void* p = MAP_FAILED;
  if (fd >= 0) {
    if (::ftruncate(fd, static_cast<off_t>(bytes)) == 0) {
      p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    }
    ::close(fd);
  }
  world.barrier();  // every rank of the host has mapped it
  ::shm_unlink(name.c_str());
  if (p == MAP_FAILED) {
    std::fprintf(stderr, "rackstep: rank %d: no shared watchdog table (%s): timeouts will not name the rank\n",
                 world.rank(), name.c_str());
    return nullptr;
  }
  return static_cast<Slot*>(p);  // zero-filled by ftruncate; Slot's atomics are lock-free words
}

}  // namespace

void start_collective_watchdog(const Comm& world, double timeout_s) {
  State& s = state();
  s.timeout_ms.store(static_cast<int64_t>(timeout_s * 1e3));
  if (world.size() <= 1 || s.running || timeout_s <= 0) return;
  s.rank = world.rank();
  s.size = world.size();
  Slot* table = open_table(world);
  if (table) {
    table[s.rank].pid.store(static_cast<int32_t>(::getpid()));
    table[s.rank].heartbeat_ns.store(now_ns());
    s.table.store(table);
  }
  s.running = true;
  std::thread(watch).detach();
}

CollectiveGuard::CollectiveGuard(const char* name) {
  State& s = state();
  const uint64_t n = s.entered.fetch_add(1, std::memory_order_relaxed) + 1;
  s.started_ns.store(now_ns(), std::memory_order_relaxed);
  s.name.store(name, std::memory_order_release);
  if (Slot* t = s.table.load(std::memory_order_relaxed)) {
    t[s.rank].entered.store(n, std::memory_order_relaxed);
    t[s.rank].in_collective.store(1, std::memory_order_relaxed);
  }
}

CollectiveGuard::~CollectiveGuard() {
  State& s = state();
  s.name.store(nullptr, std::memory_order_release);
  if (Slot* t = s.table.load(std::memory_order_relaxed)) t[s.rank].in_collective.store(0, std::memory_order_relaxed);
}

}  // namespace rackstep::exec
