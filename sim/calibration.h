// Calibration of the step-time predictor: the efficiencies that turn datasheet
// peaks into achieved rates, per op class and shape, per collective, plus
// launch overheads, overlap factors, host stalls and memory overheads.
//
// Every number lives in sim/calibration.json as {"value": x, "source": "..."};
// the source says where it was measured or how it was derived (spec/hardware.md,
// spec/calibration.md). A later issue fits them from real runs and writes the
// same file. Code holds the formulas that use them (sim/cost.cpp,
// sim/collectives.cpp, sim/predict.cpp), never the numbers.
//
//   Calibration cal = load_calibration();                 // sim/calibration.json
//   double e = gemm_efficiency(cal, gpu, m, n, k);          // 0..1 of peak bf16
//   double ge = grouped_gemm_efficiency(cal, gpu, rows_per_expert, k, n);
#pragma once

#include <cstdint>
#include <map>
#include <utility>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "topologies/topology.h"

namespace rackstep::sim {

// Measured MoE dispatch/combine algorithm bandwidth at an EP size, as a fraction
// of the GPU's measured one-way NVLink bandwidth (so it transfers across GPUs).
struct EpBandwidthPoint {
  int64_t ep = 8;
  double dispatch_eff = 0.7;
  double combine_eff = 0.7;
};

struct Calibration {
  // Dense GEMM: efficiency at a large square shape (8192^3), per GPU name,
  // scaled by a saturating shape factor x / (x + gemm_half_dim) per dimension.
  std::map<std::string, double> gemm_peak_eff;   // GPU name -> eff at 8192^3
  double gemm_peak_eff_default = 0.7;
  // Share of gemm_peak_eff a GPU keeps under a training step's continuous load where its
  // power limit holds the tensor cores below the clock the figure was measured at (block
  // gemm.sustained_ratio, optional; GPU name -> ratio, absent = 1). gemm_peak_efficiency
  // applies it. The attention kernels carry their own (AttentionEfficiency::sustained_ratio).
  std::map<std::string, double> gemm_sustained_ratio;
  double gemm_half_dim = 128;
  // A GPU architecture's measured BF16 GEMM rates by shape (block gemm.shape_tables), as
  // the rate at (M, N, K) over the rate at the table's largest shape, on one grid of
  // dimensions shared by the three axes. A GPU with a table takes its shape factor from it
  // (gemm_efficiency_at); the others keep x / (x + gemm_half_dim).
  struct GemmShapeTable {
    std::vector<double> ln_dims;   // ln of the measured dimensions, ascending
    std::vector<double> relative;  // (i_m, i_n, i_k) -> rate / rate at the largest shape, k fastest
  };
  std::map<std::string, GemmShapeTable> gemm_shape_by_gpu;  // GPU name -> its architecture's table
  // FP8 GEMMs: efficiency relative to the BF16 curve, at the FP8 peak.
  double fp8_gemm_relative_eff = 0.83;
  std::vector<std::string> fp8_gemm_measured_gpus;  // GPUs fp8_gemm_relative_eff was measured on (others: a warning)
  // Dense FP8 GEMMs: per GPU name, the FP8 efficiency (of the FP8 peak) over the BF16
  // one (of the BF16 peak), both measured on that GPU; a GPU without an entry takes
  // fp8_gemm_relative_eff (under a warning, sim/predict.cpp). Grouped GEMMs keep
  // fp8_gemm_relative_eff (its measurement is a grouped GEMM's).
  std::map<std::string, double> fp8_dense_relative_eff;
  // Block-scaled FP8 GEMM kernels (MXFP8, blockwise) over per-tensor FP8 ones, same shapes.
  double fp8_block_scaled_relative_eff = 1.0;
  // Per-tensor FP8 (delayed, current scaling) on a GPU whose FP8 GEMMs take any operand
  // layout: the trainer keeps one copy of each operand, so dgrad and wgrad run non-TN
  // kernels; their rate over the TN forward GEMM's (1 = the same rate).
  double fp8_non_tn_backward_relative_eff = 1.0;
  // Grouped expert GEMM: one measured anchor (the six-GEMM expert MLP of the
  // hero); the grouped factor (anchor eff / dense eff at the anchor shape) is
  // derived at load time and applied to every other grouped shape.
  double grouped_anchor_iteration_s = 0.0876;
  double grouped_anchor_rows = 524288;           // routed rows per GPU
  double grouped_anchor_local_experts = 6;
  double grouped_anchor_k = 3072, grouped_anchor_n = 3072;
  double grouped_anchor_flop_multiple = 3.0;     // fwd (1) + bwd (2) of the SwiGLU
  double grouped_anchor_peak_flops_per_s = 2.5e15;
  double grouped_factor = 0.65;                  // derived
  // A stack whose expert GEMMs are per-expert dense library GEMMs (Transformer Engine
  // GroupedLinear: one cuBLAS GEMM per local expert on several streams) sets
  // grouped_gemm.per_expert_dense_relative_efficiency: the measured grouped rate over the
  // dense curve (same precision) at the per-expert shape. > 0 replaces grouped_factor
  // above, and FP8 expert GEMMs then take the dense FP8 factors (fp8_dense_relative_eff,
  // block scaling, the non-TN backward) instead of fp8_gemm_relative_eff. 0 = the anchor.
  double grouped_per_expert_dense_relative_eff = 0;
  // The trainer's MoE kernels beside the expert GEMMs (calibration block `moe_kernels`;
  // all false: a step whose compiler fuses or hides them, as the grouped anchor above
  // was measured). Megatron-Core's eager path (stacks megatron-lm, megatron-bridge-2025):
  bool moe_sort_rows_by_local_expert = false;  // all-to-all dispatcher: sort_chunks_by_idxs after the dispatch and before the combine
  bool moe_fp8_pad_expert_rows = false;        // FP8 expert GEMMs copy each expert's rows to the FP8 alignment (TE Fp8Padding / Fp8Unpadding)
  bool moe_activation_kernel = false;          // the experts' activation is a kernel of its own between the two grouped GEMMs
  bool moe_fp8_quantize_per_expert = false;    // FP8 inputs of the grouped GEMMs are quantized expert by expert (TE split_quantize)
  // A dense MLP's activation (GLU or GeLU) run as a kernel of its own between fc1 and fc2
  // (calibration block `dense_kernels`, sim/cost.cpp dense_activation_bytes): bytes through
  // HBM per fc1-output element (2 x width per row for a gated MLP) in forward and backward.
  // 0: fused into the GEMMs or hidden by a compiler (Marin's XLA step).
  double dense_act_fwd_bytes = 0, dense_act_bwd_bytes = 0;
  // The same for a gated MLP (GLU: silu(h1) * h3) where the stack runs it in other
  // kernels than a plain activation (dense_kernels glu_activation_*; eager PyTorch's
  // F.silu and the product are two passes, a compiled step fuses them into one).
  // dense_glu_act_own false: a gated MLP takes dense_act_*_bytes as well.
  bool dense_glu_act_own = false;
  double dense_glu_act_fwd_bytes = 0, dense_glu_act_bwd_bytes = 0;
  // The FP8 cast of one input that feeds several dense linears (OpEntry::same_input_as_prev:
  // a block's wq, wk, wv) runs once, not once per linear (dense_kernels
  // fp8_quantize_shared_input_once: a compiler that merges the identical casts).
  bool dense_fp8_shared_input_once = false;
  // The trainer casts each FP8 linear's weight every pass (dense_kernels
  // fp8_weight_cast_per_pass; torchao's Float8Linear): the forward takes the amax of the
  // gathered bf16 weight and casts it, unless the weights arrive FP8 (Layout::fp8_params),
  // and the backward's dgrad copies the FP8 weight into the column-major layout
  // torch._scaled_mm takes. false: the weights' casts are not charged (Transformer Engine
  // casts them once per step, is_first_microbatch, left out).
  bool dense_fp8_weight_cast_per_pass = false;
  // Norms, RoPE, residual adds and the loss a trainer runs as several framework ops or
  // compiled functions, each a pass through HBM (calibration block `eager_elementwise`,
  // keyed by the op kind's name, models::to_string(OpKind): rmsnorm, rope, residual_add,
  // cross_entropy): bytes per element of the op's input (its in_elems per token: the
  // logits for the loss) moved in one forward and in one backward, and
  // the kernels each launches. Absent: the op is one fused pass (sim/cost.cpp).
  struct EagerPasses {
    double fwd_bytes_per_elem = 0, bwd_bytes_per_elem = 0;
    double fwd_kernels = 1, bwd_kernels = 1;
  };
  std::map<std::string, EagerPasses, std::less<>> eager_elementwise;
  // Attention kernels (flash): fraction of peak in forward / backward.
  double attention_fwd_eff = 0.45;
  double attention_bwd_eff = 0.45;
  // The same per GPU (block attention.per_gpu), where the kernel's measured rate on that
  // GPU differs: a fused-attention kernel is bound by the tensor cores and the softmax's
  // exponentials (SFU) in a ratio that differs between GPU generations. A GPU without an
  // entry uses the two above (attention_efficiency).
  struct AttentionEfficiency {
    double fwd = 0.45, bwd = 0.45;
    // Share of fwd / bwd the kernel keeps under a training step's continuous load, where
    // those two were measured in a short benchmark (per_gpu `sustained_ratio`, optional):
    // a GPU whose power limit is below what its tensor cores draw at the boost clock runs
    // a burst at the boost clock and a sustained load at the lower clock the limit holds.
    // 1 = the figures are sustained rates (or no throttling is known).
    double sustained_ratio = 1.0;
    double masked_tile_cost = 1;  // this GPU's attention_masked_tile_cost
  };
  std::map<std::string, AttentionEfficiency> attention_eff_by_gpu;
  // The efficiencies above hold at head dim 128; other head dims scale them by
  // these (head dim, factor) points, interpolated linearly and held beyond the
  // ends (attention_head_dim_factor). Empty: 1 at every head dim.
  std::vector<std::pair<double, double>> attention_head_dim_fwd, attention_head_dim_bwd;
  // Query and key tile of the flash kernel: it computes whole tiles, so a causal
  // or sliding-window span is rounded out to tiles (attention_tiled_span). 0 = exact.
  double attention_tile_tokens = 0;
  // Cost of a key tile that needs the causal or window mask (the diagonal tile, a
  // window's edge tiles) in unmasked tiles' work: flash kernels run those tiles in a loop
  // of their own that evaluates the mask on every score (attention_tiled_span). 1 = a
  // masked tile costs what an unmasked one does; a per_gpu entry may set its own.
  // Above 1 the efficiencies are rescaled to hold at attention_efficiency_seq_tokens, the
  // causal sequence they were measured at (attention_masked_tile_scale), so only other
  // sequences and windows move.
  double attention_masked_tile_cost = 1;
  double attention_efficiency_seq_tokens = 0;
  // Attention kernels priced by sequence length (block attention_kernels: kernel name ->
  // GPU name -> curve), one used where the stack names it (attention.kernel): a flash
  // kernel's fixed costs per (batch, head) and per query tile, and its causal diagonal
  // tiles, weigh more the shorter the sequence, so its rate rises with the length
  // (attention_kernel_efficiency). Each curve is a published fwd+bwd benchmark of causal
  // attention at a few head dims and sequences, FLOPs counted as sim/cost.cpp counts
  // them (the causal half, backward 2.5x the forward), so its diagonal tiles are in it.
  struct AttentionKernelCurve {
    // head dim -> (ln of the sequence in tokens, fwd+bwd fraction of the BF16 peak), ascending
    std::map<double, std::vector<std::pair<double, double>>> fwd_bwd_eff_by_ln_seq;
    double fwd_over_bwd_rate = 1;  // the forward's rate over the backward's: splits fwd+bwd into the passes
  };
  std::map<std::string, std::map<std::string, AttentionKernelCurve>> attention_kernels;
  // The stack's kernel (attention.kernel; empty: the flat efficiencies above). A GPU
  // the kernel has no curve for runs at the flat efficiencies.
  std::string attention_kernel;
  // Unfused attention (block attention.unfused; 0 = a fused flash kernel): the trainer
  // materialises every head's seq x seq score matrix in HBM: a batched GEMM writes the
  // scores, elementwise kernels (scale-mask-softmax, dropout) pass over them, a second
  // batched GEMM reads them (sim/cost.cpp unfused_attention_time). Bytes per score of
  // the elementwise kernels between the GEMMs, forward and backward.
  double attention_unfused_fwd_bytes = 0, attention_unfused_bwd_bytes = 0;
  // Ring context parallelism runs as Transformer Engine's AttnFuncWithCPAndKVP2P: besides
  // the fused-attention call of each ring step, it copies and accumulates the step's
  // operands and results through HBM (the KV send buffer, half-sequence chunks made
  // contiguous, the softmax-LSE output correction, dQ and dKV accumulation): priced by
  // sim/cost.h cp_ring_attention_passes. False: the ring's attention is its kernels alone.
  bool attention_cp_ring_te_passes = false;
  // The routed experts' elementwise passes that run as kernels of their own beside
  // the grouped GEMMs (sim/cost.h expert_elementwise_bytes), bytes through HBM per
  // element: the GLU activation and a clamped SwiGLU's clamps per fc1-output element
  // (2 x width per row), the output bias per fc2-output element. 0: none (fused).
  double expert_glu_fwd_bytes = 0, expert_glu_bwd_bytes = 0;
  double expert_clamp_fwd_bytes = 0, expert_clamp_bwd_bytes = 0;
  double expert_bias_fwd_bytes = 0, expert_bias_bwd_bytes = 0;
  // Selective recompute of a module whose output the forward frees and the recompute
  // copies back into the freed storage before the backward reads it (block
  // recompute.restores_discarded_output: Megatron-Core's CheckpointWithoutOutput for
  // layernorm and moe_act): one more read and write of that output per replay.
  bool recompute_restores_output = false;
  // YaRN-scaled RoPE run as eager framework ops, not one fused kernel (calibration
  // block `yarn_rope_unfused`; absent: fused, rope_yarn_unfused false). Per rotated
  // tensor (q, k): bytes through HBM per element, forward and backward, and the kernels
  // each launches (each an eager call on the host: sim/cost.cpp op_host_issue_s).
  bool rope_yarn_unfused = false;
  double rope_yarn_fwd_bytes = 0, rope_yarn_bwd_bytes = 0;
  double rope_yarn_fwd_kernels = 0, rope_yarn_bwd_kernels = 0;
  // Memory-bound op classes: fraction of measured HBM bandwidth.
  double mem_eff_elementwise = 0.7;
  double mem_eff_norm = 0.6;
  double mem_eff_routing = 0.3;
  double mem_eff_loss = 0.5;
  double mem_eff_lookup = 0.3;
  double mem_eff_optimizer = 0.8;
  // Each kernel launch costs this much host/device overhead.
  double launch_overhead_s = 4e-6;
  // EP drop fraction when sim/drops cannot price a layout's dispatch settings.
  // EP drop fraction where sim/drops cannot price the dispatch settings; 0 = the drop model's own fit
  // target (sim/drop_calibration.json /fit/target_drop: the hero's measured 2.67%), so the fact lives once.
  double fallback_drop_fraction = 0;
  // Loss: the LM head + cross-entropy run in blocks of this many tokens
  // (logits never fully materialised).
  double loss_block_tokens = 8192;

  // Collectives.
  double scale_out_eff = 0.85;                    // rail-aligned rings over the NICs
  double inter_domain_nics = 0;                   // NICs per domain one communicator drives (0 = all)
  double inter_domain_step_latency_s = 45e-6;     // per step of a chunked ring across domains
  std::vector<EpBandwidthPoint> ep_nvlink;        // sorted by ep: all-to-all and DeepEP
  std::vector<EpBandwidthPoint> ep_hybridep_nvlink;  // sorted by ep: HybridEP's dispatch / combine kernels
  double ep_a2a_latency_s = 30e-6;                // per all-to-all call
  double ep_ragged_sync_s = 20e-6;                // ragged: size exchange before each call
  double ep_wave_overlap_eff = 0.5;               // pooled waves: achieved share of ideal overlap
  // SMs an EP all-to-all's kernels hold while compute runs beside it (merged-1F1B overlap).
  double ep_all_to_all_sms = 32, ep_flex_sms = 32;
  double fsdp_collective_sms = 0;  // SMs an FSDP / ZeRO-3 gather or gradient reduce-scatter holds while it runs
  double fsdp_prefetch_overlap = 1.0;             // share of the previous layer's compute usable
  // ZeRO-3 gather granularity: one all-gather per layer (FSDP wrapping a block, a
  // JAX scan) or one per parameter-holding module (DeepSpeed's per-submodule fetch),
  // each call paying the ring's latency.
  bool fsdp_gather_per_module = false;
  // What a module is under per-module gathers (sim/cost.h fsdp_modules): false, each
  // parameter-holding op of the layer graph; true, Megatron-LM's modules: the
  // projections of one input fused into one Linear (ParallelAttention.query_key_value)
  // and a dense MLP as its two Linears (ParallelMLP.dense_h_to_4h, dense_4h_to_h).
  bool fsdp_megatron_modules = false;
  // ZeRO-3 with full recompute: the recompute forward gathers the layer again (the
  // trainer releases a module's weights after each forward), so the backward
  // gathers a third time instead of reusing the recompute's gather.
  bool fsdp_regather_for_recompute = false;
  // HBM passes a ZeRO-3 trainer makes over the gathered parameters and their unsharded
  // gradients each micro-batch besides the collectives (predict.cpp price_fsdp_copies), read
  // from the stack; all 0 = none (Megatron's distributed optimizer, JAX):
  //   fsdp_gather_copy_passes      per gather, at the gather dtype (2 B): FSDP2's copy-out
  //                                of the all-gather output into per-parameter tensors
  //   fsdp_grad_view_passes        per backward, at the param dtype (2 B): FSDP1's flat
  //                                parameter gradient assembled from its views' gradients
  //   fsdp_grad_copy               when the unsharded gradient is copied into a buffer at
  //                                the reduce dtype (a read at 2 B, a write at grad_bytes):
  //                                kAlways, FSDP2's reduce-scatter copy-in; kWhenCast, only
  //                                when the reduce dtype is not the param dtype (FSDP1's cast)
  //   fsdp_grad_reduce_dtype_passes per backward, at the reduce dtype: FSDP1's pre-division
  enum class FsdpGradCopy { kNone, kWhenCast, kAlways };
  double fsdp_gather_copy_passes = 0;
  double fsdp_grad_view_passes = 0;
  FsdpGradCopy fsdp_grad_copy = FsdpGradCopy::kNone;
  double fsdp_grad_reduce_dtype_passes = 0;
  // Parameters the trainer prefetches ahead of the running module (0 = no limit): a
  // module larger than this is fetched when it is reached, so only this share of
  // its gather can hide behind the previous module's compute.
  double fsdp_prefetch_bucket_params = 0;
  // DeepSpeed ZeRO-3's parameter coordinator (stage3.py, PartitionedParameterCoordinator),
  // read from the stack; 0 = not that coordinator. A module prefetches the next
  // whole parameters (at least fsdp_prefetch_bucket_params elements) only while the
  // gathered parameters are under fsdp_max_live_params; parameters under
  // fsdp_persistence_threshold_params stay whole on every GPU and are never gathered.
  double fsdp_max_live_params = 0;
  double fsdp_persistence_threshold_params = 0;
  // A module used again within this many gathered elements stays gathered (stage3_max_reuse_distance).
  double fsdp_max_reuse_distance_params = 0;
  // Gradients reduce-scattered in buckets of this many elements (reduce_bucket_size); 0 = per layer.
  double grad_reduce_bucket_params = 0;
  // Collectives over tensor lists (one view per rank: DeepSpeed 0.3's all_gather and
  // reduce_scatter through torch.distributed): host ops per rank per call, each
  // launch_overhead_s, with the GPU idle (the gather synchronises the device first).
  double fsdp_list_ops_per_rank = 0;
  // Every gather zero-fills its whole output buffer before the collective (DeepSpeed
  // v0.3.13-v0.5.4 _allgather_param: torch.zeros, then torch.cuda.synchronize()): a write of the
  // gathered bytes at HBM bandwidth, exposed like the gather itself.
  bool fsdp_gather_zero_fill = false;
  // Ring latency from NCCL's tuning model (src/graph/tuning.cc, Simple protocol):
  // base + (ranks-1 - (domains-1))·intra hop + (domains-1)·inter hop per ring pass,
  // in place of inter_domain_step_latency_s. All three 0 = not used.
  double ring_base_latency_s = 0;
  double ring_intra_hop_latency_s = 0;
  double ring_inter_hop_latency_s = 0;
  // Cross-replica gradient buckets: layers per bucket, released as the backward
  // reaches them (0 = one bucket after the whole backward). sim/predict.cpp derives
  // the exposed share from the schedule.
  int64_t grad_sync_bucket_layers = 1;
  double tp_overlap = 0.0;
  // Transformer Engine userbuffers TP overlap (Layout::tp_userbuffers): SMs the comm
  // kernels of the pipelined reduce-scatters (proj/fc2 forward) and of the bulk overlaps
  // (the backward's reduce-scatters beside the weight-gradient GEMMs) hold, and the chunks
  // a pipelined GEMM is split into. The ring-exchange all-gathers move data on copy
  // engines (no SMs) in tp chunks. Pipeline and bulk GEMMs run on the SMs left (set_sm_margin).
  // 0 = not given (a layout with userbuffers is refused).
  double tp_ub_pipeline_sms = 0, tp_ub_pipeline_splits = 0, tp_ub_bulk_sms = 0;
  double cp_ring_overlap = 1.0;

  // Host.
  double host_link_duplex = 1.0;                  // h2d and d2h concurrently at full rate
  double gc_pause_s = 1.45;
  double gc_interval_steps = 260;                 // automatic collection, per process
  double coordinated_gc_interval_steps = 100;     // coordinated: all ranks collect every N steps
  int64_t gpus_per_host_process = 4;
  // Host issue of an eager trainer (PyTorch + Transformer Engine): each framework op
  // costs the host op_issue_s (Python, dispatcher, module code) and each kernel it
  // launches launch_overhead_s. The host normally runs ahead of the device and hides
  // this; a device-to-host sync inside an MoE layer (the dropless dispatcher reads the
  // tokens per expert) drains that lead, so each pass of such a layer takes
  // max(device, host) (sim/predict.cpp). 0 = a compiled step (Marin's JAX: one
  // executable per step), whose host never paces the device.
  double op_issue_s = 0;                           // host time of one framework call (GPUs not in the map)
  std::map<std::string, double> op_issue_s_by_gpu; // GPU name -> the same on that system's host CPU
  double moe_host_syncs_per_layer = 0;             // device-to-host syncs per MoE layer forward
  // The experts' fused quick-GEGLU activation (a gated expert whose gate is x sigmoid(alpha x),
  // alpha != 1) syncs the host once per call: each forward, and each moe_act recompute
  // (sim/cost.h expert_activation_syncs).
  bool quick_glu_activation_syncs = false;
  bool grouped_gemm_launch_per_expert = false;     // one GEMM launch per local expert and matrix
  std::map<std::string, double, std::less<>> host_calls_per_op; // op kind (models::to_string) -> framework calls per forward; default 1
  double host_calls_per_local_expert = 0;          // expert_mlp: further calls per local expert (split, buffers)
  bool host_issues_fp8_quantize = false;           // the host launches each FP8 quantize kernel (Fp8QuantizeTime launches)
  // FP8 experts (sim/cost.h fp8_expert_host_calls): framework calls per pass per local
  // expert (the quantized tensors each GroupedLinear builds per expert), by FP8 recipe
  // (sim/layout.h fp8_recipe_name; a recipe not in the map: none), and per pass for the FP8
  // row padding and unpadding modules around the experts.
  std::map<std::string, double, std::less<>> host_fp8_calls_per_local_expert;
  double host_fp8_padding_calls = 0;
  // CUDA graphs (Layout::cuda_graphs): a layer's captured ops cost the host one replay
  // per pass, graph_replay_calls framework calls plus one graph launch, instead of their
  // own calls and launches; the dispatch op's first moe_preprocess_calls calls (its
  // preprocess, before the host sync) are captured with the moe_preprocess scope.
  double graph_replay_calls = 0;
  double moe_preprocess_calls = 0;
  // Merged-1F1B EP overlap (Layout::ep_a2a_overlap): Megatron-Core runs each layer as
  // schedule nodes (attention, post-attention, dispatch, MLP, combine; attention and MLP
  // for a dense layer), each pass of each node wrapped in stream and event handling and,
  // in the backward, an autograd engine run of its own: further framework calls per node
  // and pass, beside its ops' own.
  double merged_1f1b_calls_per_node = 0;
  // Megatron-Core's all-to-all dispatcher with moe_permute_fusion off (Layout::moe_permute_fusion):
  // further framework calls per forward of the dispatch and combine ops (keys "dispatch",
  // "combine") over the fused kernels' one call each: the unfused permute / unpermute
  // (unfused_permute_calls; the dispatch's permute runs before the host sync, so a
  // moe_preprocess graph captures it), and the unfused sort_chunks_by_idxs with the device-to-host
  // copy of its chunk sizes (unfused_sort_chunks_calls, only with more than one local expert).
  std::map<std::string, double, std::less<>> host_unfused_permute_calls;
  std::map<std::string, double, std::less<>> host_unfused_sort_chunks_calls;

  // Memory overheads.
  double allocator_fragmentation = 0.05;          // of live bytes
  double runtime_reserved_bytes = 2.5e9;          // CUDA context, NCCL, cuBLAS workspaces
  double backward_workspace_factor = 0.5;         // activation grads live in a layer's backward, × saved
  // Bytes the engine keeps per saved activation over the model's bf16 count
  // (optional memory.activation_bytes_factor; 1 on GPUs). The CPU engine keeps
  // every activation and its gradient in fp32: `rackstep calibrate` measures it.
  double activation_bytes_factor = 1.0;
  // Whether the MoE combine keeps the k expert outputs for the routing-weight
  // gradient (1: it weights them there, exec/kernels.h moe_combine_backward) or
  // not (0: the trainer weights rows inside the expert activation, Megatron-Core).
  double combine_saves_expert_outputs = 1.0;
  // Bytes per attention score an unfused attention keeps for its backward (optional
  // memory.attention_score_bytes): 0 for a fused (flash) kernel, which keeps none.
  double attention_score_bytes = 0.0;
  // Whether the ZeRO shard group spans the context-parallel ranks (1: states of
  // every ZeRO stage sharded, and ZeRO-3 weights gathered and gradients
  // reduce-scattered, over fsdp x cp GPUs; Megatron-Core's data-parallel group with
  // CP, torchtitan's dp_shard_cp mesh) or the fsdp ranks only (0). See
  // sim/layout.h and LayoutShape::shard_ranks.
  double zero_shards_over_cp = 0.0;
  // Whether device memory peaks at one moment of the step (1: a framework that
  // frees each buffer after its last use, so the peak is the largest sum of what
  // is live together: the loss's logits before the last layer's backward, one op's
  // backward at a time) or holds every line at once (0: rackstep's own engine,
  // whose activation arena is allocated for the whole step). Optional
  // memory.peak_by_phase.
  double peak_by_phase = 0.0;
  // GPUs whose FP8 GEMMs take either operand layout (Transformer Engine's
  // is_non_tn_fp8_gemm_supported: sm_100 and later), so an FP8 weight is one byte
  // per element; elsewhere it also keeps an FP8 transpose (two bytes).
  std::vector<std::string> fp8_non_tn_gpus;

  std::string file;                               // where it was read from
};

std::string default_calibration_path();          // <source dir>/sim/calibration.json
Calibration load_calibration(const std::string& path = default_calibration_path());
Calibration parse_calibration(const nlohmann::json& doc, const std::string& file);
// The calibration compiled from the default file once (thread-safe).
const Calibration& default_calibration();

// Efficiencies, 0..1 of the GPU's dense BF16 peak.
// The key of a GPU's entries measured at its power limit in the per-GPU GEMM maps
// (gemm.peak_efficiency, sustained_ratio, fp8_dense_relative_efficiency): "H100-SXM@500W".
// A part run below its rated power draws less current through the tensor cores, so its
// clock under GEMM load is lower; where such an entry exists it replaces the GPU's own.
std::string gpu_power_key(const topologies::GpuSpec& gpu);
// At 8192^3 under sustained load: the GPU's figure times its gemm_sustained_ratio (the
// entries at its power limit where the calibration has them, gpu_power_key).
double gemm_peak_efficiency(const Calibration& c, const topologies::GpuSpec& gpu);
// Attention kernel efficiency (fraction of the BF16 peak) on `gpu` at head dim 128 under a
// training step's sustained load: attention.per_gpu's entry (its burst figures times its
// sustained_ratio; the result's sustained_ratio is 1), else the stack-wide fwd_efficiency /
// bwd_efficiency.
Calibration::AttentionEfficiency attention_efficiency(const Calibration& c, const topologies::GpuSpec& gpu);
// Linear in x between (x, y) points sorted by x, held at the first and last y beyond them.
double interpolate_held(const std::vector<std::pair<double, double>>& points, double x);
// The curve of the stack's attention kernel on `gpu` (nullptr: no kernel named, or none
// measured on that GPU: the flat efficiencies above apply).
const Calibration::AttentionKernelCurve* attention_kernel_curve(const Calibration& c, const topologies::GpuSpec& gpu);
// One head dim's fwd+bwd curve (ln sequence, efficiency) beyond its longest published
// length, as the 1 / efficiency = a + b / sequence form of attention_kernel_tail.
struct AttentionCurveTail {
  double a = 0;  // 1 / the asymptotic efficiency
  double b = 0;  // tokens: the length-linear costs; 0 = the curve is held at its last point
};
// A flash kernel spends per (batch, head) its sequence^2 work at an asymptotic rate plus costs
// linear in the sequence (a prologue and epilogue per query tile, the causal diagonal tiles):
// time / work, 1 / efficiency, is a + b / sequence. Fitted through a curve's last two points,
// it carries the curve past its end toward the asymptote 1 / a. A curve that stops rising
// there (b <= 0), or has one point, is held. a <= 0 when the last two points rise faster
// than the form allows (no finite asymptote): the calibration parser rejects such a curve.
AttentionCurveTail attention_kernel_tail(const std::vector<std::pair<double, double>>& points);
// A kernel's forward and backward efficiency at a causal sequence and head dim: its fwd+bwd
// curve interpolated linearly in log(sequence) between the published lengths and linearly
// in head dim, held below the shortest, extended beyond the longest by attention_kernel_tail,
// then split by the forward over backward rate r
// (3.5 / fb = 1 / fwd + 2.5 / bwd with fwd = r bwd: fwd = fb (1 + 2.5 r) / 3.5).
Calibration::AttentionEfficiency attention_kernel_efficiency(const Calibration::AttentionKernelCurve& k, double seq_tokens,
                                                             double head_dim);
// Dense FP8 GEMM efficiency relative to the BF16 curve on this GPU (its measured entry,
// else gemm.fp8_relative_efficiency); `measured` says which.
double fp8_dense_relative_efficiency(const Calibration& c, const topologies::GpuSpec& gpu, bool* measured = nullptr);
// The measured shape table of this GPU's architecture (nullptr: none, the half_dim curve applies).
const Calibration::GemmShapeTable* gemm_shape_table(const Calibration& c, const topologies::GpuSpec& gpu);
// The shape curve from a known peak efficiency and shape table (no name lookup: the fast
// path). With a table: its relative rate, trilinear in (ln M, ln N, ln K), 1 at and beyond
// its largest dimension, and below its smallest the half_dim curve's fall from that edge.
double gemm_efficiency_at(const Calibration& c, double peak_eff, const Calibration::GemmShapeTable* shape, double m,
                          double n, double k);
double gemm_efficiency(const Calibration& c, const topologies::GpuSpec& gpu, double m, double n, double k);
double grouped_gemm_efficiency(const Calibration& c, const topologies::GpuSpec& gpu, double rows_per_expert,
                               double k, double n);
double grouped_gemm_efficiency_at(const Calibration& c, double peak_eff, const Calibration::GemmShapeTable* shape,
                                  double rows_per_expert, double k, double n);
// Host time of one framework call of an eager trainer on this GPU's system (0: a compiled step).
double host_op_issue_s(const Calibration& c, const topologies::GpuSpec& gpu);
// EP dispatch / combine efficiency vs NVLink measured bandwidth, interpolated in log(ep).
double ep_dispatch_eff(const Calibration& c, int64_t ep);
double ep_combine_eff(const Calibration& c, int64_t ep);
// The same for the flex dispatcher's HybridEP backend (Layout::ep_flex_backend).
double ep_hybridep_dispatch_eff(const Calibration& c, int64_t ep);
double ep_hybridep_combine_eff(const Calibration& c, int64_t ep);

}  // namespace rackstep::sim
