// Tensor dumps: named fp32 / int32 tensors written to a directory for
// comparison against an outside reference (tests/reference/, the PyTorch model
// of the same architecture), in the spirit of llm.c's reference-state files.
//
// Directory layout:
//   DIR/tensors.bin    every tensor's raw little-endian bytes, each starting on
//                      a 64-byte boundary (zero padding between them)
//   DIR/manifest.json  {"format": "rackstep-tensor-dump", "version": 1,
//                       "tensors": [{"name": "layers.0.attn.q_proj.w",
//                                    "shape": [128, 128], "dtype": "f32",
//                                    "offset": 0}, ...],   // offset in bytes
//                       "bin_bytes": N, "meta": {...}}
// Both files are written atomically (temp file + rename), tensors.bin first:
// a manifest on disk always describes a complete tensors.bin.
//
//   TensorDump dump;
//   dump.meta()["step"] = 0;
//   dump.add_f32("logits", {batch, seq, vocab}, logits);   // logits: (B, T, V)
//   dump.add_i32("batch.tokens", {batch, seq + 1}, tokens);
//   dump.add_arena("param.", params);                      // every tensor of an arena
//   dump.write("run/ref-dump");                             // creates the directory
//
//   TensorDump back = read_tensor_dump("run/ref-dump");      // tests, tools
//   const DumpedTensor* t = back.find("logits");
//
// The reference dump of `rackstep train --reference-dump DIR` (one training
// step from the initial weights; tests/reference/test_reference.py recomputes
// all of it in PyTorch and compares tensor by tensor). Names it reads:
//   batch.tokens  (B, T) i32   input token ids
//   batch.targets (B, T) i32   next-token targets, < 0 = not counted
//   batch.doc     (B, T) i32   document id per token (attention / SConv masks)
//   batch.pos     (B, T) i32   RoPE position per token (as passed to rope_forward)
//   param.<name>               every parameter arena tensor before the step
//   buffer.layers.L.moe.router.bias (E)  the QB selection bias this step used
//   route.layers.L.moe.expert (B*T, k) i32  chosen experts (optional: lets the
//                              reference tell an fp32 near-tie from a bug)
//   logits (B, T, V); loss, ce, z_loss: scalars (loss = ce + z_loss, weighted)
//   grad.<name>                every parameter gradient of that loss
//   after.<name>               every parameter after one optimizer step
//   meta: {"model": path, "lr": {"muonh": x, "adamh": x, "adam": x} (this
//          update's LRs, schedule applied), "beta1", "beta2", "adam_eps",
//          "adam_weight_decay", "ns_steps", "norm_eps", "xsa_eps",
//          "rope_theta", "attn_scale", "qk_norm_eps", ...}
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "exec/arena.h"

namespace rackstep::exec {

enum class DumpDtype : uint8_t { kF32, kI32 };
const char* to_string(DumpDtype d);

struct DumpedTensor {
  std::string name;
  std::vector<int64_t> shape;
  DumpDtype dtype = DumpDtype::kF32;
  std::vector<uint8_t> bytes;  // (numel * 4) little-endian values

  int64_t numel() const;
  // The values; RS_CHECK that the dtype matches.
  std::vector<float> f32() const;
  std::vector<int32_t> i32() const;
};

class TensorDump {
 public:
  // Copies the data (the caller's buffers may change right after). A repeated
  // name or a negative dim is a bug in the caller (RS_CHECK).
  void add_f32(const std::string& name, const std::vector<int64_t>& shape, const float* data);
  void add_i32(const std::string& name, const std::vector<int64_t>& shape, const int32_t* data);
  void add_f64_as_f32(const std::string& name, const std::vector<int64_t>& shape, const double* data);
  // A scalar fp32 tensor of shape [] (loss, z-loss).
  void add_scalar(const std::string& name, double value);
  // Every tensor of `arena` as `prefix + spec.name` with its spec shape
  // (padding left out): add_arena("grad.", grads) -> "grad.layers.0.attn.q_proj.w".
  void add_arena(const std::string& prefix, const Arena& arena);

  // Free-form metadata stored under "meta" in the manifest.
  nlohmann::json& meta() { return meta_; }
  const nlohmann::json& meta() const { return meta_; }

  const std::vector<DumpedTensor>& tensors() const { return tensors_; }
  const DumpedTensor* find(const std::string& name) const;  // nullptr when absent

  // Creates `dir` if needed and writes tensors.bin then manifest.json, each
  // atomically. An unwritable location is a UserError.
  void write(const std::string& dir) const;

 private:
  DumpedTensor& add(const std::string& name, const std::vector<int64_t>& shape, DumpDtype dtype);

  std::vector<DumpedTensor> tensors_;
  nlohmann::json meta_ = nlohmann::json::object();
};

// Reads a dump written by TensorDump::write. A missing file, a manifest that
// does not match the schema, or a tensor reaching past the end of tensors.bin
// is a UserError naming the file.
TensorDump read_tensor_dump(const std::string& dir);

}  // namespace rackstep::exec
