// Whether a training run can fit this machine, checked before anything is
// allocated: a model file with d_model 2^20 or a vocabulary of 16M would
// otherwise be allocated until the kernel kills the process.
//
//   check_training_memory(graph, /*batch=*/8, /*seq=*/256, model_path);  // UserError with the figures
#pragma once

#include <cstdint>
#include <string>

#include "models/layer_graph.h"

namespace rackstep::exec {

// A lower bound on the bytes `train` needs on this rank: parameters, gradients
// and two optimizer moments in fp32 (16 bytes per parameter) plus the logits
// and their gradient (2 x batch x seq x vocab floats).
double training_memory_lower_bound_bytes(const models::LayerGraph& g, int64_t batch, int64_t seq);

// UserError naming the model file, the bound and the machine's memory when
// the bound exceeds the physical memory.
void check_training_memory(const models::LayerGraph& g, int64_t batch, int64_t seq, const std::string& model_path);

}  // namespace rackstep::exec
