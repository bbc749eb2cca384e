// Training checkpoints: one file holding everything `rackstep train --resume`
// needs to continue bitwise identically — parameters, optimizer state, the
// step, the loop's RNG state, the data loader's position and the router's
// quantile-balancing bias (opaque bytes owned by the loop).
//
// File layout (little-endian):
//   offset  size  field
//        0     8  magic "RSCKPT\0\0"
//        8     4  version (2; version 1 files, without the identity section, still load)
//       12     4  section count N
//       16     8  model fingerprint (ArenaLayout::fingerprint: names, shapes, groups)
//       24     8  training step
//       32     8  file size in bytes, checksum included
//       40    24  reserved (0)
//       64  24*N  section table: {u32 id, u32 0, u64 offset, u64 bytes}
//        …        sections, each at an 8-byte aligned offset
//   size-8     8  checksum64 of every byte before it
// Sections: params, momentum, second moment (fp32 arenas, padding included),
// ||W0|| (doubles), optimizer step, RNG state, data position, QB state and
// (version 2) the run identity: JSON text naming the dataset and the layout
// (exec/run_identity.h), which `train --resume` compares.
//
// Writes are atomic (temp file, fsync, rename): a crash leaves the previous
// checkpoint. Loads validate the whole file (size, magic, version, checksum,
// fingerprint, section sizes) before touching the destination, so a failed
// load changes nothing; every failure is one UserError line.
//
//   CheckpointMeta meta{.step = 1000, .rng_state = rng_bytes, .data_position = loader.position()};
//   save_checkpoint("run/ckpt-001000.rsck", params, opt_state, meta);
//   load_checkpoint("run/ckpt-001000.rsck", params, opt_state, meta);  // params' layout decides the model
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "exec/arena.h"
#include "exec/data.h"
#include "exec/optim.h"

namespace rackstep::exec {

constexpr char kCheckpointMagic[8] = {'R', 'S', 'C', 'K', 'P', 'T', '\0', '\0'};
constexpr uint32_t kCheckpointVersion = 2;

struct CheckpointMeta {
  int64_t step = 0;                   // training steps completed
  std::vector<uint8_t> rng_state;     // the loop's RNG, opaque
  DataPosition data_position;
  std::vector<uint8_t> qb_state;      // quantile-balancing bias/histograms, opaque
  std::string identity;               // JSON (exec/run_identity.h); "" = not recorded (version 1)
};

void save_checkpoint(const std::string& path, const Arena& params, const OptimizerState& opt,
                     const CheckpointMeta& meta);

// `params` and `opt` must already have the model's layout (opt from
// init_optimizer_state); they and `meta` are overwritten only on success.
void load_checkpoint(const std::string& path, Arena& params, OptimizerState& opt, CheckpointMeta& meta);

struct CheckpointInfo {
  uint32_t version = 0;
  uint64_t fingerprint = 0;
  int64_t step = 0;
  uint64_t bytes = 0;
};
// Header of a validated checkpoint (size, magic, version and checksum checked).
CheckpointInfo read_checkpoint_info(const std::string& path);

}  // namespace rackstep::exec
