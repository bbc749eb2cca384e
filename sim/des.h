// Discrete-event engine for training-step timelines.
//
// A step is a graph of tasks on resources. Resources belong to processes (one
// process per GPU, plus processes for shared switches and fabric):
//   - serial resources (compute streams, comm streams, copy engines, host CPUs)
//     run one task at a time: in issue order (a CUDA stream) or in ready order
//     (a queue, optionally with several slots);
//   - link resources (NVLink ports, NICs, switch and fabric links) carry byte
//     flows; concurrent flows share a link's bandwidth max-min fairly
//     (progressive filling), so contention is simulated, not assumed away.
// A task holds at most one serial resource for its whole life, spends a fixed
// duration_s first (compute time, or a latency), then moves `bytes` over its
// links. It starts when all its dependencies have finished.
//
// Symmetry: a process may stand for `multiplicity` identical GPUs (one
// representative rank per symmetric group). Its links then carry that many
// copies of each flow with that many times the capacity, while a shared link
// (multiplicity 1) sees every copy: weighted max-min fairness keeps contention
// right while large clusters stay cheap.
//
// Determinism: one seed fixes every jitter and straggler draw; draws are keyed
// by task id, so they do not depend on event order.
//
//   rackstep::sim::Engine e;
//   int gpu0 = e.add_process("gpu0");
//   auto s = e.add_resource(gpu0, "compute", ResourceKind::kComputeStream);
//   auto nic = e.add_resource(gpu0, "nic", ResourceKind::kNic, 50e9);
//   TaskId f = e.add_compute(s, "fwd", "forward", 1e-3);
//   TaskId g = e.add_transfer("ag", "fsdp_allgather", {nic}, 1e9);
//   e.add_dependency(g, f);               // f waits for g
//   RunResult r = e.run(opts);           // throws UserError on a dependency cycle
//   StepSummary s = summarize(e, r);
#pragma once

#include <cstdint>
#include <deque>
#include <unordered_map>
#include <limits>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace rackstep::sim {

class TraceWriter;

enum class ResourceKind : uint8_t {
  kComputeStream,  // serial: kernels in issue order
  kCommStream,     // serial: collectives in issue order (their bytes go over links)
  kCopyEngine,     // serial: host<->device copies, offload
  kHostCpu,        // serial: data loading, GC, optimizer on host
  kNvlinkPort,     // link: one GPU's NVLink bandwidth, one direction
  kNic,            // link: one scale-out NIC, one direction
  kSwitchLink,     // link: NVLink switch port / trunk
  kFabricLink,     // link: leaf-spine or cross-rack fabric link
};
const char* resource_kind_name(ResourceKind k);
bool is_link(ResourceKind k);

// What a task's time counts as in summaries.
enum class TaskClass : uint8_t { kCompute, kCommunication, kHost };

// Serial resources: kInOrder runs tasks in the order they were added (an
// implicit dependency on the previous task); kReadyOrder runs them first come,
// first served, up to `slots` at a time.
enum class Order : uint8_t { kInOrder, kReadyOrder };

struct ResourceId {
  int32_t v = -1;
  bool valid() const { return v >= 0; }
};
struct TaskId {
  int32_t v = -1;
  bool valid() const { return v >= 0; }
};

struct TaskSpec {
  std::string name;
  std::string category;          // "forward", "fsdp_allgather", "ep_dispatch", "gc_stall", ...
  ResourceId on;                 // serial resource held for the whole task (optional for pure transfers)
  double duration_s = 0;         // fixed part: compute time, or latency before bytes flow
  double bytes = 0;              // bytes per copy moved over `links` after duration_s
  std::vector<ResourceId> links; // every link the flow crosses
  double weight = 0;             // copies of this flow (0 = multiplicity of the owning process)
  double max_rate_bytes_per_s = std::numeric_limits<double>::infinity();  // per-copy cap
  bool jitter = true;            // whether RunOptions jitter/stragglers apply
};

struct RunOptions {
  uint64_t seed = 0;
  double jitter_sigma = 0;          // lognormal sigma on duration_s (mean-preserving)
  double straggler_probability = 0; // per task: chance its duration_s is multiplied by...
  double straggler_slowdown = 1;    // ...this factor
  // Whole-process slowdowns (a slow GPU): (process, factor >= 1) on duration_s.
  std::vector<std::pair<int, double>> slow_processes;
  // Degraded links (a flapping NVLink port, a NIC at reduced speed):
  // (link resource, factor >= 1) divides its bandwidth.
  std::vector<std::pair<ResourceId, double>> slow_links;
};

struct RunResult {
  double makespan_s = 0;
  std::vector<double> start_s;          // per task
  std::vector<double> end_s;            // per task
  std::vector<double> busy_s;           // per resource: serial held time; links: time with >= 1 flow
  std::vector<double> bytes_moved;      // per resource (all copies)
  // The chain that sets the makespan, first task .. last-finishing task: each
  // task's predecessor is the one whose end let it start (its last dependency
  // to finish, its stream predecessor, or the task that freed its slot), so
  // the chain has no gaps: it starts at 0 and ends at the makespan.
  std::vector<TaskId> critical_path;
  std::vector<double> flow_start_s;     // per task: when its bytes began to flow (end_s if it moves
                                        // none); empty when no task moves bytes
  // Per task: the task whose end let it start (its last dependency to finish,
  // its stream predecessor, or the task that freed its slot); -1 for none.
  std::vector<int32_t> cause;
  uint64_t events = 0;                  // events popped from the queue (incl. stale reschedules)
  uint64_t rate_updates = 0;            // flow-rate recomputations
};

class Engine {
 public:
  // A process is a GPU (or a switch / the fabric); multiplicity = how many
  // identical processes it stands for.
  int add_process(std::string name, int64_t multiplicity = 1);
  ResourceId add_resource(int process, std::string name, ResourceKind kind,
                          double bw_bytes_per_s = 0, Order order = Order::kInOrder,
                          int slots = 1);
  TaskId add_task(TaskSpec spec);
  // Shorthands for the two common shapes of task.
  TaskId add_compute(ResourceId on, std::string name, std::string category, double duration_s);
  TaskId add_transfer(std::string name, std::string category, std::vector<ResourceId> links,
                      double bytes, ResourceId on = {}, double latency_s = 0);
  // `after` starts only once `before` has finished.
  void add_dependency(TaskId before, TaskId after);
  // Every task in `after` starts only once every task in `before` has
  // finished (a barrier: all-to-all order between two groups). Large groups
  // are joined through one internal hub, |before| + |after| edges instead of
  // |before| x |after|; the hub is not a task (no id, no time, never on the
  // critical path). Pairs, where that is as cheap, go to dependencies();
  // hub-joined groups do not (trace arrows skip them).
  void add_dependencies(const std::vector<TaskId>& before, const std::vector<TaskId>& after);

  // Simulates the graph. Throws UserError naming the cycle and its offending
  // dependency when the graph (with stream order) cannot be scheduled.
  RunResult run(const RunOptions& opts = {}) const;

  // Read access, for summaries and traces.
  int64_t num_tasks() const { return static_cast<int64_t>(tasks_.size()); }
  int64_t num_resources() const { return static_cast<int64_t>(resources_.size()); }
  int num_processes() const { return static_cast<int>(processes_.size()); }
  const std::string& process_name(int p) const { return processes_[p].name; }
  int64_t process_multiplicity(int p) const { return processes_[p].multiplicity; }
  const std::string& resource_name(ResourceId r) const { return resources_[r.v].name; }
  ResourceKind resource_kind(ResourceId r) const { return resources_[r.v].kind; }
  int resource_process(ResourceId r) const { return resources_[r.v].process; }
  double resource_bw(ResourceId r) const { return resources_[r.v].bw_bytes_per_s; }
  const std::string& task_name(TaskId t) const { return names_[tasks_[t.v].name]; }
  // Bytes per copy the task moves (0 for none), its copies, and the links it crosses.
  double task_bytes(TaskId t) const { return tasks_[t.v].flow < 0 ? 0.0 : flows_[tasks_[t.v].flow].bytes; }
  double task_weight(TaskId t) const;
  // Hardware FLOPs of a compute task (per copy), shown on its trace slice; 0 when unknown.
  void set_task_flops(TaskId t, double flops);
  double task_flops(TaskId t) const { return static_cast<size_t>(t.v) < flops_.size() ? flops_[t.v] : 0.0; }
  std::vector<ResourceId> task_links(TaskId t) const;
  const std::string& task_category(TaskId t) const { return categories_[tasks_[t.v].category]; }
  TaskClass task_class(TaskId t) const;
  // Seconds the task's bytes would take if no other flow shared its links
  // (its own copies still do): bytes / min(cap, link capacity / weight).
  // 0 for a task that moves no bytes.
  double uncontended_flow_s(TaskId t) const;
  // The resource a task is drawn on: its serial resource, else its first link.
  ResourceId task_home(TaskId t) const;
  int task_process(TaskId t) const { return resources_[task_home(t).v].process; }
  // The previous task on the same in-order resource (invalid for none).
  TaskId stream_predecessor(TaskId t) const { return {tasks_[t.v].stream_prev}; }
  const std::vector<std::pair<int32_t, int32_t>>& dependencies() const { return deps_; }
  // Every task that waits on a group joined by add_dependencies (once per group).
  std::vector<int32_t> hub_after_tasks() const;
  // Human-readable "name (process/resource)".
  std::string describe(TaskId t) const;

 private:
  struct Process {
    std::string name;
    int64_t multiplicity;
  };
  struct Resource {
    std::string name;
    int process;
    ResourceKind kind;
    Order order;
    int slots;
    double bw_bytes_per_s;
    int32_t last_task;  // last task issued on an in-order resource
  };
  // Compact records (32 bytes: a 8,192-GPU step has tens of millions):
  // names are interned (ranks of a collective share theirs), and what only a
  // transfer has lives in a FlowSpec of its own.
  struct Task {
    uint32_t category;
    uint32_t name;        // into names_
    int32_t on;
    int32_t stream_prev;  // previous task on the same in-order resource, or -1
    double duration_s;
    int32_t flow;         // into flows_, or -1 when the task moves no bytes
    bool jitter;
  };
  struct FlowSpec {
    double bytes;
    double weight;
    double max_rate;
    uint32_t links_begin, links_end;  // into links_
  };
  friend class Run;

  std::vector<Process> processes_;
  std::vector<Resource> resources_;
  std::vector<Task> tasks_;
  std::vector<FlowSpec> flows_;
  std::vector<float> flops_;  // per task, up to the last task given FLOPs (display only: float is enough)
  std::deque<std::string> names_;  // stable addresses: name_ids_ views them
  std::unordered_map<std::string_view, uint32_t> name_ids_;
  std::vector<int32_t> links_;
  std::vector<std::pair<int32_t, int32_t>> deps_;  // (before, after)
  // Groups joined by add_dependencies through a hub: before tasks in
  // hub_tasks_[before_begin, after_begin), after tasks in [after_begin, end).
  struct Hub {
    uint32_t before_begin, after_begin, end;
    uint32_t deps_before;  // deps_.size() when added: its place in the order of dependencies
  };
  std::vector<Hub> hubs_;
  std::vector<int32_t> hub_tasks_;
  // Changes with every addition (unique across engines; copies share it while
  // equal): a thread that ran this very graph before reuses what it derived.
  uint64_t stamp_ = 0;
  void touch();
  std::vector<std::string> categories_;
  std::map<std::string, uint32_t, std::less<>> category_ids_;
};

// What a step's timeline adds up to.
struct ResourceUse {
  ResourceId id;
  double busy_s = 0;
  double utilisation = 0;  // busy_s / makespan
  double bytes = 0;
};
struct StepSummary {
  double makespan_s = 0;
  // Critical path: the tasks and the time it spends per category and per
  // class ("compute", "communication", "host"); the classes add up to the
  // makespan. Contention: the part of its transfers' time lost to sharing
  // links with other flows (actual flow time - uncontended_flow_s).
  std::vector<TaskId> critical_path;
  std::map<std::string, double> critical_path_s_by_category;
  std::map<std::string, double> critical_path_s_by_class;
  std::map<std::string, double> critical_path_contention_s_by_category;
  double critical_path_contention_s = 0;
  // Per GPU (processes with a compute stream), averaged with multiplicity:
  double compute_busy_s = 0;                        // compute stream busy
  std::map<std::string, double> exposed_s_by_kind;  // non-compute work while compute idles
  double bubble_s = 0;                              // compute idle with nothing else in flight
  double bubble_fraction = 0;                       // bubble_s / makespan
  std::vector<ResourceUse> resources;
};
StepSummary summarize(const Engine& e, const RunResult& r);

// How long each GPU's compute stream sat waiting between two of its kernels,
// and for whom: following RunResult::cause back through communication (its
// own and other ranks'), the first compute or host task reached. On another
// process, the wait is for that process (a late rank holding up a
// collective), keyed by its name; on this GPU itself, the transfers were the
// hold-up, keyed "<category of the first transfer> transfers".
struct RankWait {
  int process = -1;
  double wait_s = 0;
  std::map<std::string, double> wait_s_by_cause;
};
std::vector<RankWait> compute_waits(const Engine& e, const RunResult& r);
// A plain-text table of the summary.
std::string format_summary(const Engine& e, const StepSummary& s);

const char* task_class_name(TaskClass c);

struct TraceOptions {
  bool dependency_flows = true;  // arrows for cross-resource dependencies
  bool mark_critical = true;     // args {"critical": true} on critical-path slices (read by gui/)
  int64_t max_flows = 200000;    // keep huge traces openable
};
struct TraceStats {
  int64_t slices = 0;
  int64_t arrows = 0;            // dependency arrows written
  int64_t arrows_left_out = 0;   // beyond max_flows
  int64_t extra_lanes = 0;       // threads added so that no two slices on one thread overlap
};
// Processes -> trace processes, resources -> threads, tasks -> complete events.
// Times are integer nanoseconds, each instant rounded once, so a task that
// starts when another ends shares its timestamp and never overlaps it; tasks
// that do overlap on one resource (flows sharing a link, slots of a
// ready-order queue) go to extra lanes, threads named "<resource> #2", ...
// Slices carry args: "critical": true on r.critical_path; for transfers
// "bytes" (per copy), "copies", "links", "tier" (nvlink / nic / spine /
// fabric) and "communicator" (the stream that issued it). Dependencies become
// flow arrows (a barrier joined by add_dependencies: from the before task that
// released it to each after task).
TraceStats export_trace(const Engine& e, const RunResult& r, TraceWriter& w, const TraceOptions& opts = {});

}  // namespace rackstep::sim
