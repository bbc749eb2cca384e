// `rackstep train --layout L.json`: the parallelism layout file `predict`
// reads (sim/layout.h, sim/layouts/*.json), applied to a CPU training job.
//
// What the layout says that changes the training math is honoured or refused:
// data (= the processes of an MPI job; in one process 1, or the EP group the
// batch is split into as virtual GPUs), ep with its transport and capacity
// settings (the EP dispatch: experts and top-k always come from the model's
// layer graph), the batch (tokens_per_step / seq_len / micro_batch_seqs) and
// master_dtype. What it cannot run (tensor, context or pipeline parallelism,
// expert tensor parallelism and so MoE parallel folding (etp, sim/layout.h), a
// bf16 master copy, gradient accumulation) is a UserError naming the field.
// Fields that only place memory (fsdp, recompute, offloads, optimizer-state
// placement, an embedding replica) leave the math unchanged; they are listed
// in `placement_only`, not applied.
//
//   sim::Layout l = sim::load_layout("sim/layouts/hero-pooled.json");
//   TrainLayout t = train_layout(l, "sim/layouts/hero-pooled.json", graph, /*processes=*/64, /*batch=*/0);
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "exec/model.h"
#include "models/layer_graph.h"
#include "sim/base/dispatch.h"
#include "sim/layout.h"

namespace rackstep::exec {

struct TrainLayout {
  DispatchOptions dispatch;                 // enabled iff ep > 1
  int64_t batch_seqs = 0;                   // global sequences per step
  int64_t seq = 0;                          // tokens per sequence
  std::vector<std::string> placement_only;  // "/recompute: full", ... (not applied)
};

// UserError (file, JSON path, expected, found) for a field this job cannot
// honour. batch_override > 0: the --batch the user gave (the layout's batch and
// micro-batch are then not used).
TrainLayout train_layout(const sim::Layout& l, const std::string& file, const models::LayerGraph& g,
                         int processes, int64_t batch_override);

// `config` with the routed-expert shape of the graph (experts, top-k);
// UserError when the model has no routed experts.
sim::DispatchConfig with_model_experts(sim::DispatchConfig config, const models::LayerGraph& g);

}  // namespace rackstep::exec
