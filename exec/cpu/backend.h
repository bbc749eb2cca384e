// The CPU backend: the op set of exec/backend.h on the kernels of
// exec/kernels.h (OpenBLAS GEMMs, OpenMP elsewhere), in host memory.
//
// exec/cpu/backend.cpp holds one forward and one backward function per
// OpKind, each a few kernel calls; a new op (or a new variant of one) adds its
// kernels in exec/cpu/<family>.cpp and its pair there. Results are
// deterministic for a fixed thread count, as the kernels are.
//
//   std::unique_ptr<Backend> cpu = make_cpu_backend();
//   Model m(graph, batch, seq, std::move(cpu));   // exec/model.h
#pragma once

#include <memory>

#include "exec/backend.h"

namespace rackstep::exec {

std::unique_ptr<Backend> make_cpu_backend();

}  // namespace rackstep::exec
