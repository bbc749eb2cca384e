// Expert parallelism on the GPU: the routed experts of an EP group of ranks
// (one process per GPU), rows exchanged with NCCL in device memory; an
// ExpertBackend of exec/model.h, made by the CUDA backend's make_experts
// (exec/backend.h) for `rackstep train --backend cuda --ep N --dispatch
// pooled|ragged` under mpirun (and for one process with ep 1: a group of one).
//
// Per MoE layer, forward (the same steps as the MPI transport, exec/dist.h;
// every decision is exec/ep_plan.h's EpLayerPlan, made on the host, so the
// drops are exactly sim::dispatch's):
//   1. the sender's plan from the routed experts (host); its send rows are
//      gathered from the grouped rows on the device (gather_rows);
//   2. ragged: the row counts exchanged (one int per peer through NCCL);
//   3. the rows (L floats) and their headers (an int32 plane: local expert
//      id, -1 = empty slot) exchanged: pooled = one ncclGroupStart/End of
//      ncclSend/ncclRecv per wave, P rows per peer; ragged = one group of
//      variable sends; the headers come to the host;
//   4. the receiver's plan from the headers (host); the kept rows gathered
//      into per-expert order; the local experts' SwiGLU (cuda::experts_forward
//      on the backend's GEMM engine and stream);
//   5. the combine: outputs back in the received slots with header 1 =
//      computed, 0 = dropped, exchanged back; the sender's keep and drop
//      counts (host) and its output rows (gather_rows; 0 for a dropped row).
// Steps 3 to 5 go phase by phase (a pooled wave; the ragged exchange is one
// phase): a wave's receiver capacity is its own (exec/ep_plan.h), so wave w is
// planned (its headers to pinned host memory, an event per wave), computed by
// one grouped expert call and combined as soon as it lands, and with overlap on
// (ExpertTransportOptions, `--ep-overlap`) wave w + 1's dispatch is queued
// before wave w's experts, so it travels while they compute. Backward runs
// steps 3 and 5 on the gradients, without headers, the same way; the weight
// gradients add wave by wave. The exchanges run on a stream of their own
// (one: NCCL needs every rank to queue them in one order), which waits for the
// compute stream (an event) before each exchange; the compute stream waits for
// one wave's dispatch (its event) before computing it. Overlap off queues
// wave w + 1's dispatch after wave w's combine instead: the same calls on the
// same rows in the same order, so the same results bit for bit.
// The NCCL unique id travels over the group's exec::Comm (MPI), as for data
// parallel (exec/cuda/comm.h). Expert weights stay replicated in every rank's
// arena (exec/dist.h's limits): a rank computes, and has gradients for, its
// own experts [rank * E/S, (rank + 1) * E/S).
//
//   auto experts = cuda::make_nccl_experts(group, config, {.verify = true}, gemm);  // gemm: the backend's
//   model.set_expert_backend(experts.get());
#pragma once

#include <memory>

#include "exec/backend.h"
#include "exec/cuda/gemm.h"
#include "exec/dist.h"
#include "exec/model.h"
#include "sim/base/dispatch.h"

namespace rackstep::exec::cuda {

// The NCCL transport over `group` on the current device; compute on
// gemm.stream() with `gemm` (which outlives it). UserError for a dispatch the
// group cannot run (capacity; an expert count the group does not divide).
// Defined only where the backend is built with NCCL (RACKSTEP_HAVE_NCCL).
std::unique_ptr<ExpertBackend> make_nccl_experts(Comm group, const sim::DispatchConfig& config,
                                                 const ExpertTransportOptions& options, Gemm& gemm);

}  // namespace rackstep::exec::cuda
