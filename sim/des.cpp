// Discrete-event engine; see sim/des.h. This file builds the task graph and
// runs it; reading a finished run (summary, waits, trace export) is
// sim/des_summary.cpp.
//
// The run keeps a min-heap of (time, task, version) events. A task is started
// when its last dependency finishes (and, on a ready-order resource, when a
// slot frees). Flows on links get rates from weighted max-min fairness,
// recomputed once per simulated instant (after its last event), only over the
// connected components (links <-> active flows) that the flows starting or
// finishing at that instant touch; a flow whose rate changes gets a new
// version and a new finish event, and the stale one is skipped when popped.
// The critical path falls out of the run: each task remembers the task whose
// end let it start.
#include "sim/des.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "models/check.h"

namespace rackstep::sim {

const char* resource_kind_name(ResourceKind k) {
  switch (k) {
    case ResourceKind::kComputeStream: return "compute_stream";
    case ResourceKind::kCommStream: return "comm_stream";
    case ResourceKind::kCopyEngine: return "copy_engine";
    case ResourceKind::kHostCpu: return "host_cpu";
    case ResourceKind::kNvlinkPort: return "nvlink_port";
    case ResourceKind::kNic: return "nic";
    case ResourceKind::kSwitchLink: return "switch_link";
    case ResourceKind::kFabricLink: return "fabric_link";
  }
  return "?";
}

bool is_link(ResourceKind k) { return k >= ResourceKind::kNvlinkPort; }

// ---------------------------------------------------------------- building

void Engine::touch() {
  static std::atomic<uint64_t> next{0};
  stamp_ = ++next;
}

int Engine::add_process(std::string name, int64_t multiplicity) {
  touch();
  if (multiplicity < 1) {
    throw UserError("process '" + name + "': multiplicity must be >= 1, found " +
                    std::to_string(multiplicity));
  }
  processes_.push_back({std::move(name), multiplicity});
  return static_cast<int>(processes_.size()) - 1;
}

ResourceId Engine::add_resource(int process, std::string name, ResourceKind kind,
                                double bw_bytes_per_s, Order order, int slots) {
  touch();
  RS_CHECK(process >= 0 && process < num_processes(), "resource of an undeclared process");
  if (is_link(kind) && !(bw_bytes_per_s > 0 && std::isfinite(bw_bytes_per_s))) {
    throw UserError("resource '" + name + "': a link needs a finite bandwidth > 0 bytes/s, found " +
                    std::to_string(bw_bytes_per_s));
  }
  if (slots < 1 || (order == Order::kInOrder && slots != 1)) {
    throw UserError("resource '" + name + "': slots must be 1 for an in-order stream and >= 1 otherwise, found " +
                    std::to_string(slots));
  }
  resources_.push_back({std::move(name), process, kind, order, slots, bw_bytes_per_s, -1});
  return {static_cast<int32_t>(resources_.size()) - 1};
}

TaskId Engine::add_task(TaskSpec spec) {
  touch();
  const int32_t id = static_cast<int32_t>(tasks_.size());
  auto bad = [&](const std::string& what) {
    throw UserError("task '" + spec.name + "': " + what);
  };
  if (!(spec.duration_s >= 0) || !std::isfinite(spec.duration_s)) bad("duration_s must be finite and >= 0");
  if (!(spec.bytes >= 0) || !std::isfinite(spec.bytes)) bad("bytes must be finite and >= 0");
  if (spec.bytes > 0 && spec.links.empty()) bad("moves bytes but crosses no link");
  if (!spec.on.valid() && spec.links.empty()) bad("needs a serial resource or at least one link");
  if (!(spec.weight >= 0)) bad("weight must be >= 0");
  if (!(spec.max_rate_bytes_per_s > 0)) bad("max_rate_bytes_per_s must be > 0");
  if (spec.on.valid()) {
    RS_CHECK(spec.on.v < num_resources(), "task on an undeclared resource");
    if (is_link(resources_[spec.on.v].kind)) bad("runs 'on' a link; links go in .links");
  }
  for (ResourceId l : spec.links) {
    RS_CHECK(l.valid() && l.v < num_resources(), "flow over an undeclared resource");
    if (!is_link(resources_[l.v].kind)) bad("flows over '" + resources_[l.v].name + "', which is not a link");
  }

  Task t;
  auto it = category_ids_.find(spec.category);
  if (it == category_ids_.end()) {
    it = category_ids_.emplace(spec.category, static_cast<uint32_t>(categories_.size())).first;
    categories_.push_back(spec.category);
  }
  t.category = it->second;
  auto name = name_ids_.find(spec.name);
  if (name == name_ids_.end()) {
    names_.push_back(std::move(spec.name));
    name = name_ids_.emplace(names_.back(), static_cast<uint32_t>(names_.size() - 1)).first;
  }
  t.name = name->second;
  t.on = spec.on.v;
  t.stream_prev = -1;
  if (spec.on.valid() && resources_[spec.on.v].order == Order::kInOrder) {
    t.stream_prev = resources_[spec.on.v].last_task;
    resources_[spec.on.v].last_task = id;
  }
  t.duration_s = spec.duration_s;
  t.jitter = spec.jitter;
  t.flow = -1;
  const int owner = resources_[spec.on.valid() ? spec.on.v : spec.links.front().v].process;
  if (!spec.links.empty()) {
    FlowSpec f;
    f.bytes = spec.bytes;
    f.max_rate = spec.max_rate_bytes_per_s;
    f.weight = spec.weight > 0 ? spec.weight : static_cast<double>(processes_[owner].multiplicity);
    f.links_begin = static_cast<uint32_t>(links_.size());
    for (ResourceId l : spec.links) links_.push_back(l.v);
    f.links_end = static_cast<uint32_t>(links_.size());
    t.flow = static_cast<int32_t>(flows_.size());
    flows_.push_back(f);
  }
  tasks_.push_back(t);
  return {id};
}

std::vector<int32_t> Engine::hub_after_tasks() const {
  std::vector<int32_t> out;
  for (const Hub& h : hubs_) out.insert(out.end(), hub_tasks_.begin() + h.after_begin, hub_tasks_.begin() + h.end);
  return out;
}

void Engine::set_task_flops(TaskId t, double flops) {
  RS_CHECK(t.valid() && t.v < num_tasks(), "FLOPs of an undeclared task");
  if (!(flops > 0)) return;
  if (flops_.size() <= static_cast<size_t>(t.v)) flops_.resize(static_cast<size_t>(t.v) + 1, 0.0f);
  flops_[t.v] = static_cast<float>(flops);
}

double Engine::task_weight(TaskId t) const {
  const Task& k = tasks_[t.v];
  if (k.flow >= 0) return flows_[k.flow].weight;
  return static_cast<double>(processes_[resources_[task_home(t).v].process].multiplicity);
}

std::vector<ResourceId> Engine::task_links(TaskId t) const {
  std::vector<ResourceId> out;
  const Task& k = tasks_[t.v];
  if (k.flow < 0) return out;
  for (uint32_t i = flows_[k.flow].links_begin; i < flows_[k.flow].links_end; ++i) out.push_back({links_[i]});
  return out;
}

TaskId Engine::add_compute(ResourceId on, std::string name, std::string category, double duration_s) {
  TaskSpec t;
  t.name = std::move(name);
  t.category = std::move(category);
  t.on = on;
  t.duration_s = duration_s;
  return add_task(std::move(t));
}

TaskId Engine::add_transfer(std::string name, std::string category, std::vector<ResourceId> links,
                            double bytes, ResourceId on, double latency_s) {
  TaskSpec t;
  t.name = std::move(name);
  t.category = std::move(category);
  t.on = on;
  t.duration_s = latency_s;
  t.bytes = bytes;
  t.links = std::move(links);
  return add_task(std::move(t));
}

void Engine::add_dependency(TaskId before, TaskId after) {
  touch();
  RS_CHECK(before.valid() && before.v < num_tasks() && after.valid() && after.v < num_tasks(),
           "dependency on an undeclared task");
  if (before.v == after.v) {
    throw UserError("task graph cannot be scheduled: " + describe(after) + " depends on itself");
  }
  deps_.emplace_back(before.v, after.v);
}

void Engine::add_dependencies(const std::vector<TaskId>& before, const std::vector<TaskId>& after) {
  touch();
  if (before.empty() || after.empty()) return;
  // Pairs while they are no more edges than a hub would need.
  if (before.size() * after.size() <= before.size() + after.size()) {
    for (TaskId a : after) {
      for (TaskId b : before) add_dependency(b, a);
    }
    return;
  }
  // A task in both groups would wait for itself. Checked in linear time for
  // the common case (the after group added later), else by sorting.
  int32_t max_before = -1, min_after = std::numeric_limits<int32_t>::max();
  for (TaskId b : before) {
    RS_CHECK(b.valid() && b.v < num_tasks(), "dependency on an undeclared task");
    max_before = std::max(max_before, b.v);
  }
  for (TaskId a : after) {
    RS_CHECK(a.valid() && a.v < num_tasks(), "dependency on an undeclared task");
    min_after = std::min(min_after, a.v);
  }
  if (max_before >= min_after) {
    std::vector<int32_t> b_ids;
    for (TaskId b : before) b_ids.push_back(b.v);
    std::sort(b_ids.begin(), b_ids.end());
    for (TaskId a : after) {
      if (std::binary_search(b_ids.begin(), b_ids.end(), a.v)) {
        throw UserError("task graph cannot be scheduled: " + describe(a) + " depends on itself");
      }
    }
  }
  Hub h;
  h.before_begin = static_cast<uint32_t>(hub_tasks_.size());
  for (TaskId b : before) hub_tasks_.push_back(b.v);
  h.after_begin = static_cast<uint32_t>(hub_tasks_.size());
  for (TaskId a : after) hub_tasks_.push_back(a.v);
  h.end = static_cast<uint32_t>(hub_tasks_.size());
  h.deps_before = static_cast<uint32_t>(deps_.size());
  hubs_.push_back(h);
}

ResourceId Engine::task_home(TaskId t) const {
  const Task& k = tasks_[t.v];
  if (k.on >= 0) return {k.on};
  return {links_[flows_[k.flow].links_begin]};
}

TaskClass Engine::task_class(TaskId t) const {
  if (task_bytes(t) > 0) return TaskClass::kCommunication;
  switch (resources_[task_home(t).v].kind) {
    case ResourceKind::kComputeStream: return TaskClass::kCompute;
    case ResourceKind::kHostCpu: return TaskClass::kHost;
    default: return TaskClass::kCommunication;
  }
}

double Engine::uncontended_flow_s(TaskId t) const {
  if (tasks_[t.v].flow < 0) return 0;
  const FlowSpec& k = flows_[tasks_[t.v].flow];
  if (k.bytes <= 0) return 0;
  double rate = k.max_rate;
  for (uint32_t i = k.links_begin; i < k.links_end; ++i) {
    const Resource& l = resources_[links_[i]];
    const double cap = l.bw_bytes_per_s * static_cast<double>(processes_[l.process].multiplicity);
    rate = std::min(rate, cap / k.weight);
  }
  return k.bytes / rate;
}

const char* task_class_name(TaskClass c) {
  switch (c) {
    case TaskClass::kCompute: return "compute";
    case TaskClass::kCommunication: return "communication";
    case TaskClass::kHost: return "host";
  }
  return "?";
}

std::string Engine::describe(TaskId t) const {
  ResourceId h = task_home(t);
  return "'" + task_name(t) + "' (" + processes_[resources_[h.v].process].name + "/" +
         resources_[h.v].name + ")";
}

// ---------------------------------------------------------------- running

namespace {

// Counter-based random numbers: a draw depends only on (seed, task, stream),
// never on the order events happen in. splitmix64 finaliser.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
double uniform01(uint64_t seed, uint64_t task, uint64_t stream) {
  uint64_t h = mix(seed ^ mix(task * 4 + stream));
  return (static_cast<double>(h >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}
double normal(uint64_t seed, uint64_t task) {
  // Box-Muller on two independent draws.
  double u1 = uniform01(seed, task, 0), u2 = uniform01(seed, task, 1);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

// A prefetch the compiler must keep. GCC 12 at -O2 and above drops
// __builtin_prefetch in this file (checked with -S: no prefetch left in
// Run::go), so on x86-64 it is spelled out.
inline void prefetch(const void* p) {
#if defined(__x86_64__)
  asm volatile("prefetcht0 %0" : : "m"(*static_cast<const char*>(p)));
#else
  __builtin_prefetch(p);
#endif
}

// An event sorts by (time, task, version) as one 128-bit unsigned integer:
// times are finite and >= 0, and the bits of such doubles order like the
// numbers. Ties break by task id, so a run does not depend on the order events
// were pushed in (the version only ever separates a live event from stale
// copies of the same task, which are skipped whatever their order).
__extension__ typedef unsigned __int128 EventKey;

struct Event {
  EventKey key;
  static Event at(double t, int32_t task, uint32_t version) {
    const uint64_t t_bits = std::bit_cast<uint64_t>(t);
    return {(static_cast<EventKey>(t_bits) << 64) | (static_cast<EventKey>(static_cast<uint32_t>(task)) << 32) |
            version};
  }
  double t() const { return std::bit_cast<double>(static_cast<uint64_t>(key >> 64)); }
  int32_t task() const { return static_cast<int32_t>(static_cast<uint32_t>(key >> 32)); }
  uint32_t version() const { return static_cast<uint32_t>(key); }
};

// A 4-ary min-heap of events. Half the depth of a binary heap, and a node's
// four children sit side by side (64 bytes), so a sift touches fewer cache
// lines; the smallest child is picked without branching on the keys.
// take() hands out the earliest event but leaves a hole at the root; the next
// push() fills the hole with one sift-down (the common case: a task ends and
// its stream successor starts), instead of a pop's sift-down plus a push's
// sift-up. The next take() or empty() closes a hole no push filled.
class EventHeap {
 public:
  void clear() {
    a_.clear();
    hole_ = false;
  }
  bool empty() {
    settle();
    return a_.empty();
  }
  // The time of the earliest event; the heap must not be empty.
  double next_time() {
    settle();
    return a_.front().t();
  }
  Event take() {
    settle();
    hole_ = true;
    return a_.front();
  }
  // The events that can come next after the one just taken: the root's children.
  template <typename F>
  void for_each_next(F&& f) const {
    const size_t end = std::min<size_t>(a_.size(), 5);
    for (size_t i = 1; i < end; ++i) f(a_[i]);
  }
  void push(const Event& e) {
    if (hole_) {
      hole_ = false;
      sift_down(e);
      return;
    }
    size_t i = a_.size();
    a_.push_back(e);
    while (i > 0) {
      const size_t parent = (i - 1) / 4;
      if (!(e.key < a_[parent].key)) break;
      a_[i] = a_[parent];
      i = parent;
    }
    a_[i] = e;
  }

 private:
  void settle() {
    if (!hole_) return;
    hole_ = false;
    const Event last = a_.back();
    a_.pop_back();
    if (!a_.empty()) sift_down(last);
  }
  // Places e at the root and moves it down to where it belongs.
  void sift_down(const Event& e) {
    const size_t n = a_.size();
    size_t i = 0;
    for (;;) {
      const size_t first = 4 * i + 1;
      if (first + 4 > n) {
        // The last, partial family (or none).
        if (first >= n) break;
        size_t best = first;
        for (size_t c = first + 1; c < n; ++c) best = a_[c].key < a_[best].key ? c : best;
        if (a_[best].key < e.key) {
          a_[i] = a_[best];
          i = best;
        }
        break;
      }
      // Smallest of four without branches on the keys.
      const size_t b01 = first + (a_[first + 1].key < a_[first].key);
      const size_t b23 = first + 2 + (a_[first + 3].key < a_[first + 2].key);
      const size_t best = a_[b23].key < a_[b01].key ? b23 : b01;
      if (!(a_[best].key < e.key)) break;
      a_[i] = a_[best];
      i = best;
    }
    a_[i] = e;
  }

  std::vector<Event> a_;
  bool hole_ = false;
};

enum class Phase : uint8_t { kWaiting, kLatency, kFlowing, kDone };

// Everything the event loop touches per task besides its start and end times
// (written straight into the result), in half a cache line: the engine's Task
// records (links, bytes) are only read when a flow starts or ends.
struct alignas(32) Hot {
  double duration_s;    // after jitter
  uint32_t succ_begin;  // successors: succ_[succ_begin, next task's succ_begin)
  int32_t pending;      // unfinished predecessors
  int32_t crit_pred;    // the task whose end let this one start
  uint32_t version;     // bumped when a flow is rescheduled
  int32_t on;           // serial resource or -1
  Phase phase;
  bool ready_order;     // `on` is a ready-order resource
  bool has_bytes;
};
static_assert(sizeof(Hot) == 32, "Hot should stay at 32 bytes: the event loop is bound by its cache lines");

// A flow with bytes still to move, in a small dense table (slots are reused):
// rebalance() walks every flow of a component, and those belong to tasks far
// apart in the task arrays, so per-task arrays cost a cache miss per flow.
struct Flow {
  int32_t task;
  uint32_t mark;                    // the last rebalance() (epoch) that reached it
  uint32_t links_begin, links_end;  // into Engine::links_
  double weight;
  double max_rate;
  double remaining;  // bytes per copy left at `last`
  double rate;       // per copy
  double last;
  double new_rate;
};

// What a run keeps per link, in one cache line: a flow starting or ending
// touches its links' state, and with 100,000 links (8,192 GPUs) separate
// arrays cost a cache miss each.
struct alignas(64) LinkState {
  std::vector<int32_t> flows;  // slots of its active flows
  double cap;                  // bytes/s, all copies
  double active_since;         // when its first current flow began
  double cap_left, w_left;     // rebalance() scratch
  uint32_t mark;               // the last rebalance() (epoch) that reached it
  bool dirty;                  // in dirty_links_
};

// The buffers a run works in. A thread keeps them between runs (see Run), so
// repeated runs (sweeps, benchmarks, Monte Carlo) neither allocate them again
// nor fault their pages in again; every run resets what it reads.
struct RunMemory {
  EventHeap heap_;
  std::vector<int32_t> ready_;
  std::vector<int32_t> succ_;
  std::vector<Hot> hot_;
  // Serial resources.
  std::vector<int> in_use_;
  std::vector<std::vector<int32_t>> queue_;
  std::vector<size_t> queue_head_;
  // Links and flows.
  std::vector<LinkState> link_;      // per resource (only links use it)
  std::vector<Flow> flows_;          // active flows; LinkState::flows holds their slots
  std::vector<int32_t> free_flows_;  // slots to reuse
  std::vector<int32_t> flow_slot_;   // per task: its slot while it flows
  std::vector<double> flow_start_;   // per task
  // Scratch for rebalance().
  std::vector<int32_t> dirty_links_;
  std::vector<int32_t> comp_links_, comp_flows_, unfrozen_, frozen_now_;
  // What setup() derived from the graph last time (Engine::stamp_): the task
  // records before jitter, and succ_ as it stands.
  uint64_t graph_stamp_ = 0;
  std::vector<Hot> hot_template_;
  bool any_flow_template_ = false;
};
thread_local RunMemory tl_run_memory;

}  // namespace

class Run : private RunMemory {
 public:
  // Borrows this thread's buffers; a run never calls back into user code, so
  // runs on one thread cannot nest.
  Run(const Engine& e, const RunOptions& o) : RunMemory(std::move(tl_run_memory)), e_(e), o_(o) {}
  ~Run() { tl_run_memory = std::move(static_cast<RunMemory&>(*this)); }
  Run(const Run&) = delete;
  Run& operator=(const Run&) = delete;

  RunResult go() {
    setup();
    for (int32_t t = 0; t < nodes_; ++t) {
      if (hot_[t].pending == 0) make_ready(t, -1);
    }
    drain();
    for (;;) {
      // Flows that start or end at one instant share one rate recomputation,
      // after the instant's last event.
      if (!dirty_links_.empty() && (heap_.empty() || heap_.next_time() > now_)) rebalance();
      if (heap_.empty()) break;
      const Event ev = heap_.take();
      ++r_.events;
      // The next event's task record is likely cold (hundreds of tasks run in
      // between); fetch the candidates' while this event is handled.
      // (The next record holds where its successor list ends.)
      heap_.for_each_next([&](const Event& next) {
        prefetch(&hot_[next.task()]);
        prefetch(&hot_[next.task() + 1]);
      });
      const int32_t t = ev.task();
      Hot& h = hot_[t];
      if (ev.version() != h.version) continue;  // a flow rescheduled since
      now_ = ev.t();
      if (h.phase == Phase::kLatency) {
        after_latency(t);
      } else {
        RS_CHECK(h.phase == Phase::kFlowing, "event for a task that is not running");
        end_flow(t);
        finish(t);
      }
      drain();
    }
    if (finished_ < n_) report_cycle();
    finalise();
    return std::move(r_);
  }

 private:
  using Task = Engine::Task;

  void setup() {
    n_ = static_cast<int32_t>(e_.tasks_.size());
    const size_t nr = e_.resources_.size();
    r_.busy_s.assign(nr, 0);
    r_.bytes_moved.assign(nr, 0);
    r_.start_s.assign(n_, 0);
    r_.end_s.assign(n_, 0);
    // Hubs (see Engine::add_dependencies) follow the tasks as nodes n_.. .
    nodes_ = n_ + static_cast<int32_t>(e_.hubs_.size());
    // A thread running the same graph again (sweeps, Monte Carlo, benchmarks)
    // copies the records instead of deriving them from the task list again.
    if (graph_stamp_ == e_.stamp_ && hot_template_.size() == static_cast<size_t>(nodes_) + 1) {
      hot_ = hot_template_;
      any_flow_ = any_flow_template_;
    } else {
      derive_from_graph();
    }
    draw_durations();
    setup_resources();
  }

  // The per-task records and successor lists, which depend on the graph only.
  // One pass over the task records, counting stream successors on the way
  // (see build_successors). Stream predecessors wait in crit_pred until the
  // successor lists are filled; make_ready sets crit_pred for real.
  void derive_from_graph() {
    graph_stamp_ = 0;
    const size_t nr = e_.resources_.size();
    hot_.resize(static_cast<size_t>(nodes_) + 1);
    for (int32_t u = n_; u < nodes_; ++u) hot_[u] = {0.0, 0, 0, -1, 0, -1, Phase::kWaiting, false, false};
    any_flow_ = false;
    std::vector<char> ready_order_on(nr);  // per resource; the Resource records are large
    for (size_t l = 0; l < nr; ++l) ready_order_on[l] = e_.resources_[l].order == Order::kReadyOrder;
    for (int32_t t = 0; t < n_; ++t) {
      const Task& k = e_.tasks_[t];
      const bool ready_order = k.on >= 0 && ready_order_on[k.on];
      const bool bytes = k.flow >= 0 && e_.flows_[k.flow].bytes > 0;
      hot_[t] = {k.duration_s, 0, 0, k.stream_prev, 0, k.on, Phase::kWaiting, ready_order, bytes};
      any_flow_ = any_flow_ || bytes;
      if (k.stream_prev < 0) continue;
      ++hot_[k.stream_prev].succ_begin;
      ++hot_[t].pending;
    }
    build_successors();
    hot_template_ = hot_;
    any_flow_template_ = any_flow_;
    graph_stamp_ = e_.stamp_;
  }

  void setup_resources() {
    const size_t nr = e_.resources_.size();
    // Links: capacity scales with the multiplicity of the process that owns them.
    link_.resize(nr);
    for (size_t l = 0; l < nr; ++l) {
      const auto& res = e_.resources_[l];
      LinkState& k = link_[l];
      k.flows.clear();
      k.cap = res.bw_bytes_per_s * static_cast<double>(e_.processes_[res.process].multiplicity);
      k.active_since = k.cap_left = k.w_left = 0;
      k.mark = 0;
      k.dirty = false;
    }
    for (auto [l, f] : o_.slow_links) {
      if (!l.valid() || l.v >= static_cast<int32_t>(nr) || !is_link(e_.resources_[l.v].kind) || !(f >= 1) ||
          !std::isfinite(f)) {
        throw UserError("degraded link " + std::to_string(l.v) + " x" + std::to_string(f) +
                        ": expected a declared link and a finite factor >= 1");
      }
      link_[l.v].cap /= f;
    }
    in_use_.assign(nr, 0);
    queue_.resize(nr);
    for (auto& q : queue_) q.clear();
    heap_.clear();
    ready_.clear();
    queue_head_.assign(nr, 0);
    dirty_links_.clear();
    // Flow state is per task but only needed when some task moves bytes.
    if (any_flow_) {
      flows_.clear();
      free_flows_.clear();
      flow_slot_.assign(n_, -1);
      flow_start_.assign(n_, 0);
    }
  }

  // Successors in CSR form: each task's explicit dependents in the order they
  // were added, then its stream successor. finish() releases them in this
  // order, which fixes the order of ready-order queues, so it must not change.
  // setup() has counted stream successors into succ_begin; with the explicit
  // ones added, an inclusive prefix sum turns each count into the end of the
  // task's range, and filling backwards (last edge first, decrementing) leaves
  // each succ_begin at its range's start. The extra entry closes the last range.
  void build_successors() {
    for (auto [b, a] : e_.deps_) {
      ++hot_[b].succ_begin;
      ++hot_[a].pending;
    }
    // A hub: an edge from each before task to it, and from it to each after task.
    for (size_t i = 0; i < e_.hubs_.size(); ++i) {
      const auto& hub = e_.hubs_[i];
      Hot& u = hot_[n_ + static_cast<int32_t>(i)];
      for (uint32_t j = hub.before_begin; j < hub.after_begin; ++j) {
        ++hot_[e_.hub_tasks_[j]].succ_begin;
        ++u.pending;
      }
      for (uint32_t j = hub.after_begin; j < hub.end; ++j) {
        ++u.succ_begin;
        ++hot_[e_.hub_tasks_[j]].pending;
      }
    }
    for (int32_t t = 1; t < nodes_; ++t) hot_[t].succ_begin += hot_[t - 1].succ_begin;
    const uint32_t total = nodes_ > 0 ? hot_[nodes_ - 1].succ_begin : 0;
    hot_[nodes_] = {0.0, total, 0, -1, 0, -1, Phase::kDone, false, false};
    succ_.resize(total);
    // Filled backwards, so each task's list reads: explicit dependents, hubs, stream successor.
    for (int32_t t = n_ - 1; t >= 0; --t) {
      const int32_t p = hot_[t].crit_pred;  // stream predecessor, see setup()
      if (p < 0) continue;
      succ_[--hot_[p].succ_begin] = t;
      hot_[t].crit_pred = -1;
    }
    for (size_t i = e_.hubs_.size(); i-- > 0;) {
      const auto& hub = e_.hubs_[i];
      const int32_t u = n_ + static_cast<int32_t>(i);
      for (uint32_t j = hub.end; j-- > hub.after_begin;) succ_[--hot_[u].succ_begin] = e_.hub_tasks_[j];
      for (uint32_t j = hub.after_begin; j-- > hub.before_begin;) succ_[--hot_[e_.hub_tasks_[j]].succ_begin] = u;
    }
    for (size_t i = e_.deps_.size(); i-- > 0;) {
      auto [b, a] = e_.deps_[i];
      succ_[--hot_[b].succ_begin] = a;
    }
  }

  // Durations with jitter, stragglers and slow processes drawn up front.
  void draw_durations() {
    std::vector<double> slow(e_.processes_.size(), 1.0);
    for (auto [p, f] : o_.slow_processes) {
      if (p < 0 || p >= static_cast<int>(slow.size()) || !(f > 0) || !std::isfinite(f)) {
        throw UserError("slow process " + std::to_string(p) + " x" + std::to_string(f) +
                        ": expected a declared process and a factor > 0");
      }
      slow[p] = f;
    }
    if (o_.jitter_sigma <= 0 && o_.straggler_probability <= 0 && o_.slow_processes.empty()) return;
    for (int32_t t = 0; t < n_; ++t) hot_[t].duration_s = effective_duration(t, slow);
  }

  double effective_duration(int32_t t, const std::vector<double>& slow) const {
    const Task& k = e_.tasks_[t];
    double d = k.duration_s;
    if (!k.jitter || d <= 0) return d;
    if (o_.jitter_sigma > 0) {
      // Mean-preserving lognormal: E[exp(s z - s^2/2)] = 1.
      d *= std::exp(o_.jitter_sigma * normal(o_.seed, t) - 0.5 * o_.jitter_sigma * o_.jitter_sigma);
    }
    if (o_.straggler_probability > 0 && uniform01(o_.seed, t, 2) < o_.straggler_probability) {
      d *= o_.straggler_slowdown;
    }
    const int home = e_.resources_[e_.task_home({t}).v].process;
    return d * slow[home];
  }

  void push(double t, int32_t task) { heap_.push(Event::at(t, task, hot_[task].version)); }

  // A task whose dependencies are done: start it, or queue it on a busy resource.
  void make_ready(int32_t t, int32_t cause) {
    Hot& h = hot_[t];
    if (t >= n_) {
      release_hub(t, cause);
      return;
    }
    h.crit_pred = cause;
    if (h.ready_order) {
      const int32_t on = h.on;
      if (in_use_[on] >= e_.resources_[on].slots) {
        queue_[on].push_back(t);
        return;
      }
      ++in_use_[on];
    }
    ready_.push_back(t);
  }

  // A hub takes no time: its after tasks are ready as soon as its last before
  // task ends, and that task (not the hub) is what let them start.
  void release_hub(int32_t u, int32_t cause) {
    hot_[u].phase = Phase::kDone;
    const uint32_t end = hot_[u + 1].succ_begin;
    for (uint32_t i = hot_[u].succ_begin; i < end; ++i) {
      const int32_t s = succ_[i];
      if (--hot_[s].pending == 0) make_ready(s, cause);
    }
  }

  // Starts every task made ready at `now_` (iteratively: zero-time chains can be long).
  void drain() {
    while (!ready_.empty()) {
      int32_t t = ready_.back();
      ready_.pop_back();
      start(t);
    }
  }

  void start(int32_t t) {
    Hot& h = hot_[t];
    r_.start_s[t] = now_;
    prefetch_for_end(t);
    if (h.duration_s > 0) {
      h.phase = Phase::kLatency;
      push(now_ + h.duration_s, t);
      return;
    }
    after_latency(t);
  }

  // Hundreds of streams run at once, each walking its own stretch of the task
  // arrays, too many for the hardware prefetcher to follow: every new cache
  // line a finishing task touches would be a miss to memory. Between a task's
  // start and its end many other events run, so fetching now what its end
  // will touch hides that latency: its successors' records (its own successor
  // list sits next to its predecessor's, just read, so is likely cached), its
  // end time, and its engine record when bytes will flow.
  void prefetch_for_end(int32_t t) {
    const Hot& h = hot_[t];
    const uint32_t end = hot_[t + 1].succ_begin;
    for (uint32_t i = h.succ_begin; i < end; ++i) prefetch(&hot_[succ_[i]]);
    prefetch(&r_.end_s[t]);
    prefetch(r_.start_s.data() + t + 1);  // the stream successor's, usually
    if (!h.has_bytes) return;
    prefetch(&flow_slot_[t]);
    // A 64-byte record need not sit on one cache line: fetch both ends.
    const char* k = reinterpret_cast<const char*>(&e_.flows_[e_.tasks_[t].flow]);
    prefetch(k);
    prefetch(k + sizeof(Engine::FlowSpec) - 1);
  }

  void after_latency(int32_t t) {
    if (hot_[t].has_bytes) {
      begin_flow(t);
      return;
    }
    finish(t);
  }

  void finish(int32_t t) {
    Hot& h = hot_[t];
    h.phase = Phase::kDone;
    r_.end_s[t] = now_;
    ++finished_;
    if (h.on >= 0) {
      r_.busy_s[h.on] += now_ - r_.start_s[t];
      if (h.ready_order) release_slot(h.on, t);
    }
    const uint32_t end = hot_[t + 1].succ_begin;
    for (uint32_t i = h.succ_begin; i < end; ++i) {
      const int32_t s = succ_[i];
      if (--hot_[s].pending == 0) make_ready(s, t);
    }
  }

  void release_slot(int32_t on, int32_t t) {
    auto& q = queue_[on];
    size_t& head = queue_head_[on];
    if (head == q.size()) {
      --in_use_[on];
      return;
    }
    int32_t next = q[head++];
    if (head == q.size()) {
      q.clear();
      head = 0;
    }
    hot_[next].crit_pred = t;  // it waited for this task's slot
    ready_.push_back(next);
  }

  // ------------------------------------------------------------ flows

  void begin_flow(int32_t t) {
    const Engine::FlowSpec& k = e_.flows_[e_.tasks_[t].flow];
    hot_[t].phase = Phase::kFlowing;
    flow_start_[t] = now_;
    int32_t slot = static_cast<int32_t>(flows_.size());
    if (free_flows_.empty()) {
      flows_.emplace_back();
    } else {
      slot = free_flows_.back();
      free_flows_.pop_back();
    }
    flows_[slot] = {t, 0, k.links_begin, k.links_end, k.weight, k.max_rate, k.bytes, 0, now_, 0};
    flow_slot_[t] = slot;
    for (uint32_t i = k.links_begin; i < k.links_end; ++i) {
      int32_t l = e_.links_[i];
      if (link_[l].flows.empty()) link_[l].active_since = now_;
      link_[l].flows.push_back(slot);
    }
    mark_dirty(k.links_begin, k.links_end);
  }

  void end_flow(int32_t t) {
    const Engine::FlowSpec& k = e_.flows_[e_.tasks_[t].flow];
    const int32_t slot = flow_slot_[t];
    free_flows_.push_back(slot);  // rebalance() below no longer reaches it
    for (uint32_t i = k.links_begin; i < k.links_end; ++i) {
      int32_t l = e_.links_[i];
      auto& fl = link_[l].flows;
      auto it = std::find(fl.begin(), fl.end(), slot);
      RS_CHECK(it != fl.end(), "finishing flow missing from its link");
      *it = fl.back();
      fl.pop_back();
      r_.bytes_moved[l] += k.bytes * k.weight;
      if (fl.empty()) r_.busy_s[l] += now_ - link_[l].active_since;
    }
    mark_dirty(k.links_begin, k.links_end);
  }

  // Links whose flows changed at `now_`; rebalance() runs once the instant is over.
  void mark_dirty(uint32_t lb, uint32_t le) {
    for (uint32_t i = lb; i < le; ++i) {
      const int32_t l = e_.links_[i];
      if (link_[l].dirty) continue;
      link_[l].dirty = true;
      dirty_links_.push_back(l);
    }
  }

  // Weighted max-min fair rates (progressive filling) over the component of
  // links and active flows reachable from the dirty links (several
  // components at once fill independently). A flow of weight w is w identical
  // copies; each copy gets the same per-copy rate.
  void rebalance() {
    ++r_.rate_updates;
    ++epoch_;
    comp_links_.clear();
    comp_flows_.clear();
    for (int32_t l : dirty_links_) {
      link_[l].dirty = false;
      mark_link(l);
    }
    dirty_links_.clear();
    for (size_t i = 0; i < comp_links_.size(); ++i) {
      for (int32_t f : link_[comp_links_[i]].flows) {
        Flow& k = flows_[f];
        if (k.mark == epoch_) continue;
        k.mark = epoch_;
        comp_flows_.push_back(f);
        for (uint32_t j = k.links_begin; j < k.links_end; ++j) mark_link(e_.links_[j]);
      }
    }
    if (comp_flows_.empty()) return;
    for (int32_t l : comp_links_) {
      link_[l].cap_left = link_[l].cap;
      link_[l].w_left = 0;
    }
    for (int32_t f : comp_flows_) {
      const Flow& k = flows_[f];
      for (uint32_t j = k.links_begin; j < k.links_end; ++j) link_[e_.links_[j]].w_left += k.weight;
    }
    unfrozen_ = comp_flows_;
    while (!unfrozen_.empty()) fill_round();
    for (int32_t f : comp_flows_) apply_rate(f);
  }

  void mark_link(int32_t l) {
    if (link_[l].mark == epoch_) return;
    link_[l].mark = epoch_;
    comp_links_.push_back(l);
  }

  // One round of progressive filling: raise every unfrozen flow to the
  // tightest fair share, then freeze the flows that hit a bottleneck.
  void fill_round() {
    double share = std::numeric_limits<double>::infinity();
    for (int32_t l : comp_links_) {
      if (link_[l].w_left > 0) share = std::min(share, std::max(link_[l].cap_left, 0.0) / link_[l].w_left);
    }
    for (int32_t f : unfrozen_) share = std::min(share, flows_[f].max_rate);
    const double tight = share * (1 + 1e-9);
    frozen_now_.clear();
    size_t keep = 0;
    for (int32_t f : unfrozen_) {
      const Flow& k = flows_[f];
      bool hit = k.max_rate <= tight;
      for (uint32_t j = k.links_begin; j < k.links_end && !hit; ++j) {
        int32_t l = e_.links_[j];
        hit = std::max(link_[l].cap_left, 0.0) <= tight * link_[l].w_left;
      }
      if (hit) {
        frozen_now_.push_back(f);
      } else {
        unfrozen_[keep++] = f;
      }
    }
    unfrozen_.resize(keep);
    RS_CHECK(!frozen_now_.empty(), "progressive filling made no progress");
    for (int32_t f : frozen_now_) {
      Flow& k = flows_[f];
      k.new_rate = share;
      for (uint32_t j = k.links_begin; j < k.links_end; ++j) {
        int32_t l = e_.links_[j];
        link_[l].cap_left -= share * k.weight;
        link_[l].w_left -= k.weight;
      }
    }
  }

  void apply_rate(int32_t slot) {
    Flow& f = flows_[slot];
    const double nr = f.new_rate;
    if (nr == f.rate) return;
    f.remaining = std::max(0.0, f.remaining - f.rate * (now_ - f.last));
    f.last = now_;
    f.rate = nr;
    ++hot_[f.task].version;
    RS_CHECK(nr > 0, "a flow got no bandwidth");
    push(now_ + f.remaining / nr, f.task);
  }

  // ------------------------------------------------------------ results

  void finalise() {
    double makespan = 0;
    int32_t last = -1;
    for (int32_t t = 0; t < n_; ++t) {
      if (r_.end_s[t] > makespan || last < 0) {
        makespan = std::max(makespan, r_.end_s[t]);
        last = t;
      }
    }
    r_.makespan_s = makespan;
    r_.cause.resize(static_cast<size_t>(n_));
    for (int32_t t = 0; t < n_; ++t) r_.cause[t] = hot_[t].crit_pred;
    for (int32_t t = last; t >= 0; t = hot_[t].crit_pred) r_.critical_path.push_back({t});
    std::reverse(r_.critical_path.begin(), r_.critical_path.end());
    // When each task's bytes began to flow: its end when it moves none.
    if (!any_flow_) return;
    r_.flow_start_s = r_.end_s;
    for (int32_t t = 0; t < n_; ++t) {
      if (hot_[t].has_bytes) r_.flow_start_s[t] = flow_start_[t];
    }
  }

  // Every unfinished task waits on an unfinished predecessor, so walking
  // predecessors must revisit a task: that loop is the cycle.
  [[noreturn]] void report_cycle() {
    std::vector<std::vector<int32_t>> preds(nodes_);
    for (auto [b, a] : e_.deps_) preds[a].push_back(b);
    for (int32_t t = 0; t < n_; ++t) {
      if (e_.tasks_[t].stream_prev >= 0) preds[t].push_back(e_.tasks_[t].stream_prev);
    }
    for (size_t i = 0; i < e_.hubs_.size(); ++i) {
      const auto& hub = e_.hubs_[i];
      const int32_t u = n_ + static_cast<int32_t>(i);
      for (uint32_t j = hub.before_begin; j < hub.after_begin; ++j) preds[u].push_back(e_.hub_tasks_[j]);
      for (uint32_t j = hub.after_begin; j < hub.end; ++j) preds[e_.hub_tasks_[j]].push_back(u);
    }
    int32_t t = 0;
    while (hot_[t].phase == Phase::kDone) ++t;
    std::vector<int32_t> seen_at(nodes_, -1), walk;
    while (seen_at[t] < 0) {
      seen_at[t] = static_cast<int32_t>(walk.size());
      walk.push_back(t);
      int32_t next = -1;
      for (int32_t p : preds[t]) {
        if (hot_[p].phase != Phase::kDone) {
          next = p;
          break;
        }
      }
      RS_CHECK(next >= 0, "an unfinished task with every predecessor done");
      t = next;
    }
    // walk[seen_at[t]..] is the cycle, each element waiting on the next.
    std::vector<int32_t> cycle(walk.begin() + seen_at[t], walk.end());
    // A hub is no task: the tasks on either side of it are the edge.
    cycle.erase(std::remove_if(cycle.begin(), cycle.end(), [&](int32_t u) { return u >= n_; }), cycle.end());
    std::reverse(cycle.begin(), cycle.end());  // now each element runs before the next
    throw UserError(describe_cycle(cycle));
  }

  std::string describe_cycle(const std::vector<int32_t>& cycle) const {
    std::ostringstream s;
    s << "task graph cannot be scheduled (dependency cycle of " << cycle.size() << " tasks): ";
    // The offending dependency: the explicit one in the cycle added last (it
    // closed the loop); stream order counts only if every edge is stream order.
    int64_t worst_index = -1;
    std::string worst;
    const size_t shown = std::min<size_t>(cycle.size(), 6);
    for (size_t i = 0; i < cycle.size(); ++i) {
      int32_t a = cycle[i], b = cycle[(i + 1) % cycle.size()];
      int64_t index = dependency_index(a, b);
      std::string edge = e_.describe({a}) + (index >= 0 ? " -> " : " -(stream order)-> ") +
                         e_.describe({b});
      if (index > worst_index || worst.empty()) {
        if (index > worst_index) worst_index = index;
        worst = edge;
      }
      if (i < shown) s << (i ? ", " : "") << edge;
    }
    if (shown < cycle.size()) s << ", ...";
    s << "; first offending dependency: " << worst;
    return s.str();
  }

  // Where the dependency before -> after comes in the order they were added
  // (larger = later), or -1 when there is none (stream order). Dependency i
  // ranks 2i + 1; a hub ranks just before the dependency added after it.
  int64_t dependency_index(int32_t before, int32_t after) const {
    int64_t found = -1;
    for (size_t i = 0; i < e_.deps_.size(); ++i) {
      if (e_.deps_[i].first == before && e_.deps_[i].second == after) found = 2 * static_cast<int64_t>(i) + 1;
    }
    for (const auto& hub : e_.hubs_) {
      const auto* b = e_.hub_tasks_.data();
      const bool in_before = std::find(b + hub.before_begin, b + hub.after_begin, before) != b + hub.after_begin;
      const bool in_after = std::find(b + hub.after_begin, b + hub.end, after) != b + hub.end;
      if (in_before && in_after) found = std::max(found, 2 * static_cast<int64_t>(hub.deps_before));
    }
    return found;
  }

  const Engine& e_;
  const RunOptions& o_;
  RunResult r_;
  int32_t n_ = 0;
  int32_t nodes_ = 0;  // tasks, then hubs
  int32_t finished_ = 0;
  bool any_flow_ = false;
  double now_ = 0;
  uint32_t epoch_ = 0;  // marks for rebalance()
};

RunResult Engine::run(const RunOptions& opts) const {
  if (tasks_.empty()) return {};
  if (opts.jitter_sigma < 0 || opts.straggler_probability < 0 || opts.straggler_probability > 1 ||
      !(opts.straggler_slowdown > 0)) {
    throw UserError("run options: expected jitter_sigma >= 0, straggler_probability in [0, 1], "
                    "straggler_slowdown > 0");
  }
  Run run(*this, opts);
  return run.go();
}

}  // namespace rackstep::sim
