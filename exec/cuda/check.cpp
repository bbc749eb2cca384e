#include "exec/cuda/check.h"

#include <cstdio>
#include <cstdlib>

namespace rackstep::exec::cuda {

void fail_call(const char* library, const char* call, const char* error, const char* file, int line) {
  std::fprintf(stderr, "rackstep: %s call failed at %s:%d: %s: %s\n", library, file, line, call, error);
  std::abort();
}

}  // namespace rackstep::exec::cuda
