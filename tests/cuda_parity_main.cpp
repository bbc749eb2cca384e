// main of test_parity_cuda: the backend parity harness (tests/exec_parity.cpp;
// ctest parity_cuda runs its device case, "[parity-devices]")
// with the CUDA backend registered in exec/backend.h's registry, so the
// harness enumerates "cuda" beside "cpu". Without a CUDA device it prints why
// and exits 77, which CTest reports as skipped (the CPU-only harness runs in
// test_exec), never as passed.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdio>

#include "exec/backend.h"
#include "exec/cuda/backend.h"

int main(int argc, char** argv) {
  rackstep::exec::cuda::register_cuda_backend();
  const auto names = rackstep::exec::available_backends();
  if (std::find(names.begin(), names.end(), "cuda") == names.end()) {
    std::printf("test_parity_cuda: skipped: no CUDA device on this machine\n");
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
