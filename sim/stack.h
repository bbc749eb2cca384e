// Training-stack profiles: what a trainer (Marin's JAX/Levanter, Megatron-LM,
// PyTorch FSDP, DeepSpeed) can run and how it behaves, as data (sim/stacks/*.json,
// every entry with a source), like the topologies are for hardware.
//
// A stack names the layout features it supports (ZeRO stages, pipeline schedules,
// uneven stages, CP kinds, EP transports, TP, offload, recompute kinds, kept
// gathered weights, FP8 GEMMs) and overrides the predictor's calibration where the trainer
// differs (host GC pauses, gradient bucketing, FSDP prefetch overlap, TP overlap,
// kernel efficiencies per op class, per-kernel framework overhead). The overrides
// use sim/calibration.json's own structure and are merged over it.
//
//   Stack s = load_stack(stack_path("megatron-lm"));   // or a path to a JSON file
//   Calibration cal = stack_calibration(s);            // sim/calibration.json + s's overrides
//   std::vector<LayoutIssue> why = check_stack(layout, s);   // empty = the stack runs it
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "sim/calibration.h"
#include "sim/layout.h"

namespace rackstep::sim {

struct StackSupport {
  std::vector<int64_t> zero_stages{0, 1, 2, 3};
  std::vector<PpSchedule> schedules{PpSchedule::k1F1B, PpSchedule::kInterleaved1F1B, PpSchedule::kZeroBubble,
                                    PpSchedule::kDualPipeV};
  bool pipeline = true;
  bool uneven_stages = true;
  bool tensor_parallel = true;
  bool expert_parallel = true;
  // EP over tensor × data ranks with its own expert TP (Layout::folded): only a
  // stack whose file says so (Megatron-Core's MoE parallel folding).
  bool expert_folding = false;
  std::vector<CpKind> cp_kinds{CpKind::kRing, CpKind::kAllGatherKv};  // empty = no context parallel
  std::vector<Transport> ep_transports{Transport::pooled, Transport::ragged};
  // EP dispatchers (Layout::ep_dispatcher) and the merged-1F1B EP overlap
  // (Layout::ep_a2a_overlap): only what a stack's file names (Megatron-Core's flex
  // dispatcher with DeepEP / HybridEP, --overlap-moe-expert-parallel-comm).
  std::vector<EpDispatcher> ep_dispatchers{EpDispatcher::kAllToAll};
  // The flex dispatcher's backends (Layout::ep_flex_backend) the stack ships: DeepEP,
  // Megatron-Core's default, unless its file names more.
  std::vector<FlexBackend> ep_flex_backends{FlexBackend::kDeepEp};
  bool ep_a2a_overlap = false;
  bool optimizer_offload = true;
  bool residual_offload = true;
  std::vector<models::Recompute> recompute{models::Recompute::kNone, models::Recompute::kSelective,
                                           models::Recompute::kFull};
  bool keep_gathered_weights = true;
  bool replicate_embedding = true;
  bool coordinated_gc = true;
  bool fp8_gemms = true;         // FP8 GEMMs (Layout::fp8)
  bool bf16_gradients = true;    // bf16 gradient buffers under an fp32 master (Layout::grad_dtype)
  // Module-level recompute (Layout::recompute_modules): Megatron-Core's; none unless the stack names them.
  std::vector<models::RecomputeModule> recompute_modules{};
  bool fp8_params = false;       // FP8 GEMM weights kept as FP8 (Layout::fp8_params)
  bool edges_in_pipeline_split = false;  // Layout::edges_in_pipeline_split
  // CUDA graph scopes the trainer can capture (Layout::cuda_graphs): none unless the
  // stack names them (Megatron-Core's cuda_graph_scope; a compiled JAX step has no such knob).
  std::vector<CudaGraphScope> cuda_graph_scopes{};
};

struct Stack {
  std::string name;
  std::string file;
  std::string comment;
  StackSupport supports;
  nlohmann::json calibration_overrides = nlohmann::json::object();  // merged over sim/calibration.json
};

// "marin-july-2026" -> <source dir>/sim/stacks/marin-july-2026.json; a path is returned as is.
std::string stack_path(const std::string& name_or_path);
// A file may name "extends": "<stack>": it is that stack with the file's entries merged over it.
Stack load_stack(const std::string& path);
Stack parse_stack(const nlohmann::json& doc, const std::string& file);
// sim/calibration.json (or `base_path`) with the stack's overrides merged in.
Calibration stack_calibration(const Stack& s, const std::string& base_path = default_calibration_path());
// What a command runs under, as `predict --stack S --calibration F` reads it: the named
// stack (empty when `stack_name` is) and its overrides merged over F (sim/calibration.json
// when `calibration_path` is empty), or F alone without a stack.
struct CommandCalibration {
  Stack stack;  // name empty: no stack
  Calibration cal;
};
CommandCalibration command_calibration(const std::string& stack_name, const std::string& calibration_path);
// Every feature of the layout the stack cannot run (Reason::kStack), empty when it can.
std::vector<LayoutIssue> check_stack(const Layout& l, const Stack& s);
bool stack_runs(const Layout& l, const Stack& s);

// The stack the default sizing scenario and `--stack` default name.
inline constexpr const char* kDefaultStack = "marin-july-2026";

}  // namespace rackstep::sim
