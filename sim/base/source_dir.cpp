#include "sim/base/source_dir.h"

namespace rackstep {

const char* source_dir() { return RACKSTEP_SOURCE_DIR_PATH; }

}  // namespace rackstep
