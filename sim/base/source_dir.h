// Where the source tree lives: zoo JSON, calibration and scenario files are read
// from it by default. Set at build time for this one file only, so the other
// objects do not depend on the checkout's path (ccache shares them between trees).
//
//   load_model(std::string(rackstep::source_dir()) + "/models/zoo/tiny-moe.json");
#pragma once

namespace rackstep {

const char* source_dir();

}  // namespace rackstep
