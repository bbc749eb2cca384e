// The CUDA backend as a plugin of the rackstep command (librackstep_cuda.so,
// next to the binary). Linking cuBLAS and cuBLASLt into the command itself
// cost every process ~220 MB of resident memory at start (their relocations),
// CPU training runs and `rackstep predict` included; so the command links no
// CUDA library and exec::load_backend_plugin("cuda") (exec/backend.h) opens
// this library only when `--backend cuda` asks for it. The command exports its
// symbols (ENABLE_EXPORTS), so the plugin's calls into exec resolve to the
// command's copies: one backend registry.
#include "exec/cuda/backend.h"
#include "exec/cuda/microbench.h"

extern "C" __attribute__((visibility("default"))) void rackstep_cuda_plugin_register() {
  rackstep::exec::cuda::register_cuda_backend();
  rackstep::exec::register_op_backend("cuda", rackstep::exec::cuda::make_cuda_op_backend);  // calibrate
}
