// Parallelism layouts: how one training step of a model is spread over a cluster.
//
// A Layout names the size of every parallel axis and the memory policies; it is
// read from / written to JSON (examples in sim/layouts/) and checked against a
// model and a cluster by check_layout(), which returns *every* reason it is
// invalid (the sweep counts them per reason).
//
// Mesh (rank order, innermost first): tp, cp, data, pp.
//   gpus = data × tp × cp × pp      data = batch shards ("data-parallel" degree)
//   fsdp divides data: non-expert parameters, gradients and optimizer state are
//        sharded over groups of `fsdp` consecutive data ranks and replicated
//        across the data/fsdp groups (hybrid sharding; fsdp = 1 is plain DP,
//        fsdp = data is ZeRO-3 over everything). What the group shards is the
//        ZeRO stage (Rajbhandari et al. 2020): 1 = optimizer state and fp32
//        master weights (Megatron's distributed optimizer), 2 = + gradients,
//        3 = + the weights themselves, gathered layer by layer (FSDP; the
//        default). keep_gathered_weights: ZeRO-3 gathers once per step and
//        keeps the gathered weights and unsharded gradients across
//        micro-batches (FSDP reshard_after_forward=False with no_sync).
//        A trainer whose shard group spans the context-parallel ranks too
//        (calibration memory.zero_shards_over_cp: torchtitan's dp_shard_cp mesh,
//        Megatron-Core's data-parallel group with CP) shards over fsdp × cp GPUs
//        whenever zero_stage ≥ 1, fsdp = 1 included (torchtitan's 'FSDP 1, CP 8');
//        under such a trainer zero_stage 0 is how a layout says nothing is sharded.
//   ep   divides data: EP groups are `ep` consecutive data ranks; the experts
//        are split over them (experts/ep per GPU) and replicated across the
//        data/ep groups. When fsdp > ep, expert state is further sharded by
//        fsdp/ep (ZeRO over the expert-data axis).
//   etp  expert tensor parallel (Megatron-Core --expert-tensor-parallel-size; 0 =
//        tp, Megatron's default: arguments.py sets it to the tensor-parallel size
//        when unset). The expert layers regroup the same GPUs of a stage: the rule
//        is ep × etp × expert_dp = tp × cp × data ("MoE parallel folding", Liu et
//        al. 2025, arXiv:2504.14960; parallel_state.py builds the expert mesh with
//        RankGenerator order tp-ep-dp over the ranks of one stage). A *folded*
//        layout (etp ≠ tp, or ep not dividing data) places its EP groups as
//        Megatron does: `ep` ranks at stride etp over the stage's tp×cp×data ranks
//        (Qwen3-235B on H100: tp 2, etp 1, ep 32 = 2 TP ranks × 16 data ranks,
//        four 8-GPU nodes). An unfolded one keeps EP over data ranks (stride tp·cp),
//        which is the same placement whenever cp = 1.
//
// The Marin hero (spec/marin-architecture.md, "How the hero was laid out"):
//   {"data": 704, "fsdp": 64, "ep": 64, "recompute": "full", "offload_residual": true,
//    "optimizer_state": "host", "master_dtype": "fp32", "ep_transport": "ragged"}
//
//   Layout l = load_layout("sim/layouts/hero-ragged.json");
//   std::vector<LayoutIssue> why = check_layout(l, graph, cluster);  // empty = valid
//   nlohmann::json j = layout_to_json(l);
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/layer_graph.h"
#include "sim/base/dispatch.h"
#include "topologies/topology.h"

namespace rackstep::sim {

enum class PpSchedule { k1F1B, kInterleaved1F1B, kZeroBubble, kDualPipeV };
enum class CpKind { kRing, kAllGatherKv };
enum class StatePlacement { kDevice, kHost };
enum class MasterDtype { kFp32, kBf16 };
// Gradient buffers and their reduction: the master dtype's (the default), or set
// apart (Megatron's grad_reduce_in_fp32 = False: bf16 buffers under an fp32 master).
enum class GradDtype { kAsMaster, kFp32, kBf16 };
// Which GEMMs run in FP8 (per-op precision; attention, norms and the LM head stay BF16).
enum class Fp8Gemms { kNone, kExperts, kLinear };
// How the EP all-to-all moves a token (sim/collectives.h, EP dispatch bytes):
//   all_to_all  one row per (token, expert): Megatron-Core's MoEAlltoAllTokenDispatcher
//               permutes each token into top_k rows before the all-to-all; Marin's
//               ragged and pooled transports send the routed rows the same way.
//   flex        one row per (token, destination GPU), and across domains one per
//               (token, destination domain) forwarded over NVLink there: DeepEP /
//               HybridEP behind Megatron-Core's MoEFlexTokenDispatcher.
enum class EpDispatcher { kAllToAll, kFlex };
// Which library runs the flex dispatcher's dispatch and combine (Megatron-Core
// moe_flex_dispatcher_backend, default 'deepep' in TransformerConfig): DeepEP, or
// NVIDIA's HybridEP (TMA copies inside the NVLink domain, the registered buffer's copy
// fused into the permute). They move the same rows; their kernels reach different
// shares of the link (sim/calibration.json collectives.ep_nvlink / ep_hybridep_nvlink).
enum class FlexBackend { kDeepEp, kHybridEp };
// How FP8 GEMM inputs are scaled (Transformer Engine recipes): each sets the memory-bound
// quantization passes before the GEMMs (sim/cost.cpp, fp8_quantize). Delayed is the
// default: Megatron-LM's --fp8-recipe and Transformer Engine's fp8_autocast default.
//   delayed:   per-tensor scale from the amax history of earlier steps; one cast pass
//   current:   per-tensor scale from this tensor's amax (FP8-CS): an amax pass, then the cast
//   mxfp8:     1x32 block scales (Blackwell MXFP8): one pass, rowwise + columnwise copies
//   blockwise: 1x128 / 128x128 block scales (DeepSeek-V3 style): one pass, both copies
enum class Fp8Recipe { kDelayed, kCurrent, kMxfp8, kBlockwise };
const char* fp8_recipe_name(Fp8Recipe r);
// What an eager trainer captures in CUDA graphs (Megatron-Core's cuda_graph_scope,
// megatron/core/transformer/transformer_config.py): with Transformer Engine's
// make_graphed_callables, parts of each transformer layer, replayed as one graph per
// layer and pass (transformer_layer.py _te_cuda_graph_replay):
//   attn            the attention half (input norm, attention, its residual add)
//   mlp             a dense layer's MLP half
//   moe             an MoE layer's whole MLP half (fixed-capacity experts only)
//   moe_router      an MoE layer up to its router: pre-MLP norm, router, top-k,
//                   and the shared experts
//   moe_preprocess  with moe_router: the dispatcher's preprocess too (token counts,
//                   their all-gather, the permute), up to its host sync
// or, with Megatron-Core's own graphs (cuda_graph_impl "local"), full_iteration: the
// whole forward and backward of a step as one graph (no host issue left).
enum class CudaGraphScope : uint32_t { kAttn, kMlp, kMoe, kMoeRouter, kMoePreprocess, kFullIteration };
inline constexpr CudaGraphScope kAllCudaGraphScopes[] = {CudaGraphScope::kAttn,      CudaGraphScope::kMlp,
                                                         CudaGraphScope::kMoe,       CudaGraphScope::kMoeRouter,
                                                         CudaGraphScope::kMoePreprocess, CudaGraphScope::kFullIteration};
inline constexpr uint32_t cuda_graph_bit(CudaGraphScope s) { return 1u << static_cast<uint32_t>(s); }
const char* to_string(CudaGraphScope s);

struct Layout {
  std::string name;
  int64_t data = 1;              // batch shards
  int64_t fsdp = 1;              // shard-group size (divides data)
  int64_t ep = 1;                // expert-parallel group size (ep × etp divides tp × cp × data)
  int64_t etp = 0;               // expert tensor parallel; 0 = tp (Megatron-Core's default)
  int64_t tp = 1;                // tensor parallel (inside an NVLink domain)
  int64_t pp = 1;                // pipeline stages
  int64_t pp_virtual = 1;        // virtual stages per GPU (interleaved schedules)
  PpSchedule schedule = PpSchedule::k1F1B;
  int64_t cp = 1;                // context parallel
  CpKind cp_kind = CpKind::kRing;
  int64_t micro_batch_seqs = 1;  // sequences per micro-batch per data rank
  int64_t tokens_per_step = 0;   // 0 = the model recipe's batch
  int64_t seq_len = 0;           // 0 = the model's sequence length (long-context runs override)
  models::Recompute recompute = models::Recompute::kFull;
  // With recompute "selective": Megatron-Core's recompute_modules, the block parts
  // recomputed instead of saved (bits of models::recompute_module_bit; 0 = the
  // selective rule of Korthikanti et al.: every op but the GEMMs and attention).
  uint32_t recompute_modules = 0;
  // With recompute "selective" and no modules: torchtitan's per-op policy (activation_checkpoint
  // mode "selective", selective_ac_option "op"; parallelize_llama.py _save_list and
  // _custom_policy) instead of the Korthikanti rule. It saves the outputs of aten.mm, SDPA
  // and reduce_scatter_tensor, except every second aten.mm of a block, and recomputes the
  // rest: the even-numbered GEMMs of the block in forward order (FP8 ones as well) and the
  // TP all-gathers (all_gather_into_tensor is not in the list). Priced by sim/cost.cpp
  // price_ops, sim/predict.cpp and sim/memory.cpp op_sac_saved_op_elems.
  bool torchtitan_op_sac = false;
  // With FP8 GEMMs: their weights kept as FP8 tensors, not bf16 (Megatron-Core's
  // fp8_param_gather, Transformer Engine's fp8_model_init).
  bool fp8_params = false;
  // The embedding and the loss each take a layer's slot when the pipeline splits
  // layers (Megatron-Core account_for_embedding_in_pipeline_split and
  // account_for_loss_in_pipeline_split): a middle stage holds the most layers,
  // the first and last one layer fewer beside the embedding and the head.
  bool edges_in_pipeline_split = false;
  bool offload_residual = false; // residual carry of each layer kept on host
  StatePlacement optimizer_state = StatePlacement::kDevice;
  MasterDtype master_dtype = MasterDtype::kFp32;
  GradDtype grad_dtype = GradDtype::kAsMaster;  // gradient buffers and their reduction
  // EP transport (spec/marin-architecture.md, EP dispatch; sim/dispatch.h): fixed-capacity
  // pooled waves with sender and receiver capacity factors, or ragged with a receiver gate.
  Transport ep_transport = Transport::ragged;
  double sender_cf = kDefaultSenderCf;      // pooled: sender pool capacity factor
  double receiver_cf = kDefaultReceiverCf;  // receiver buffers (pooled) / gate (ragged)
  int64_t waves = kDefaultWaves;            // pooled: W
  int64_t ragged_chunks = kDefaultRaggedChunks;  // ragged: receiver gate split
  bool coordinated_gc = false;   // host GC pauses taken by all ranks at once
  bool replicate_embedding = false;  // embedding (and its state) whole on every GPU (the hero)
  int64_t zero_stage = 3;        // what the fsdp group shards (see above); 0 = nothing (fsdp must be 1)
  bool keep_gathered_weights = false;  // ZeRO-3: gather once per step, not per micro-batch
  bool uneven_stages = false;    // pp need not divide the layers: the first stages take one more
  Fp8Gemms fp8 = Fp8Gemms::kNone;  // linear: every block GEMM (experts included); experts: grouped GEMMs only
  Fp8Recipe fp8_recipe = Fp8Recipe::kDelayed;  // scaling of the FP8 GEMM inputs (read only with fp8)
  double tp_comm_overlap = -1;   // share of TP collectives hidden (this run's setting); < 0 = the stack's
  // Transformer Engine userbuffers TP overlap (Megatron's --tp-comm-overlap, NeMo's
  // ub_tp_comm_overlap): each TP all-gather / reduce-scatter runs beside the GEMM it feeds
  // or follows, priced per GEMM by sim/predict.cpp tp_userbuffers_exposed (instead of a share).
  bool tp_userbuffers = false;
  double ep_comm_overlap = -1;   // share of ragged EP all-to-all hidden; < 0 = none (exposed)
  EpDispatcher ep_dispatcher = EpDispatcher::kAllToAll;  // what the EP all-to-all sends (above)
  FlexBackend ep_flex_backend = FlexBackend::kDeepEp;     // flex only: whose kernels move the rows (above)
  // Megatron-Core's EP overlap (--overlap-moe-expert-parallel-comm; Megatron-Bridge
  // moe_a2a_overlap): in the 1F1B steady state one micro-batch's forward runs merged
  // with another's backward, each one's EP all-to-all hidden behind the other's compute.
  bool ep_a2a_overlap = false;
  // Megatron-Core's moe_permute_fusion (the all-to-all dispatcher): true, Transformer
  // Engine's fused permute, unpermute and chunk sort kernels (the default pricing); false,
  // the PyTorch ops of megatron/core/transformer/moe/moe_utils.py permute / unpermute /
  // sort_chunks_by_idxs with fused=False (sim/cost.cpp unfused_permute_time: an argsort
  // of the routing map, an index_select, and an atomic scatter_add back; more host calls).
  bool moe_permute_fusion = true;
  // CUDA graphs the trainer captures (bits of cuda_graph_bit; 0 = none, eager).
  uint32_t cuda_graphs = 0;

  int64_t gpus() const { return data * tp * cp * pp; }
  // The expert mesh of one stage (see etp above).
  int64_t expert_tp() const { return etp > 0 ? etp : tp; }
  bool folded() const { return expert_tp() != tp || (ep > 0 && data % ep != 0); }
  // Ranks of one expert's replicas: tp × cp × data / (ep × etp).
  int64_t expert_dp() const { return std::max<int64_t>(1, tp * cp * data / std::max<int64_t>(1, ep * expert_tp())); }
  // Distance between consecutive ranks of an EP group in the tp, cp, data rank order.
  int64_t ep_stride() const { return folded() ? expert_tp() : tp * cp; }
  // The most loaded stage's layers: layers / pp, or its ceiling with uneven stages.
  double stage_layers(int64_t layers) const;
  int64_t seq(const models::ModelConfig& m) const { return seq_len > 0 ? seq_len : m.seq_len; }
  bool graphs(CudaGraphScope s) const { return (cuda_graphs & cuda_graph_bit(s)) != 0; }
};

// Why a layout cannot run. Codes are stable (the sweep counts per code).
enum class Reason {
  kGpuProduct,        // data*tp*cp*pp != cluster GPUs
  kFsdpDivides,       // fsdp does not divide data
  kEpDivides,         // ep × etp does not divide tp × cp × data
  kEpExperts,         // ep does not divide the routed experts
  kEpDense,           // ep > 1 on a model without routed experts
  kPpLayers,          // pp*pp_virtual does not divide layers (unless uneven_stages)
  kPpSchedule,        // schedule / virtual stages need pp > 1 or pp_virtual > 1
  kCpSeq,             // cp does not divide seq (2*cp for a balanced causal split)
  kTpHeads,           // tp does not divide heads or KV heads
  kTpDomain,          // tp (or tp*cp for ring CP) larger than one NVLink domain
  kBatchSplit,        // global batch does not split into data * micro_batch sequences
  kWaves,             // transport settings out of range
  kDeviceMemory,      // does not fit in HBM (set by the sweep / predict)
  kHostMemory,        // offloaded state does not fit in host memory
  kZeroStage,         // zero_stage out of 0..3, or 0 with fsdp > 1
  kPrecision,         // FP8 GEMMs on a GPU without an FP8 peak
  kStack,             // the training stack cannot run this layout (sim/stack.h)
  kCount
};
const char* to_string(Reason r);

struct LayoutIssue {
  Reason reason;
  std::string detail;            // "ep 48 does not divide 384 experts" -> with numbers
};

// Every reason the layout is invalid for this model and cluster (empty = valid).
std::vector<LayoutIssue> check_layout(const Layout& l, const models::LayerGraph& g,
                                      const topologies::Cluster& c);
// Cheap variant for sweeps: the first reason only, no strings.
bool first_issue(const Layout& l, const models::LayerGraph& g, const topologies::Cluster& c,
                 Reason* reason);

// Global batch in sequences of this layout (tokens_per_step or the recipe's).
int64_t batch_seqs(const Layout& l, const models::LayerGraph& g);
// Micro-batches per data rank per step (gradient accumulation × pipeline fill).
int64_t micro_batches(const Layout& l, const models::LayerGraph& g);

Layout parse_layout(const nlohmann::json& doc, const std::string& file);
Layout load_layout(const std::string& path);
nlohmann::json layout_to_json(const Layout& l);
// One line: "data 704 fsdp 64 ep 64 | mb 16 | recompute full ..."
std::string describe(const Layout& l);

const char* to_string(PpSchedule s);

}  // namespace rackstep::sim
