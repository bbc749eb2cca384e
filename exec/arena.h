// The parameter arena: every trainable tensor of a model in one contiguous
// fp32 buffer. Named tensors are views (offset + shape + optimizer group), so a
// checkpoint is one write of the buffer, a ZeRO shard is a range of tensors,
// and gradients / optimizer states are parallel arenas with the same layout.
//
// The layout is built from a plain list of tensor specs, so it does not depend
// on the layer-graph type; arena_specs_from_graph() derives that list from a
// models::LayerGraph.
//
//   auto layout = std::make_shared<ArenaLayout>(std::vector<TensorSpec>{
//       {"embed", {vocab, d}, OptGroup::kAdam},
//       {"layers.0.attn.wq", {d, heads * hd}, OptGroup::kMuonH},
//       {"layers.0.moe.w_up", {experts, latent, width}, OptGroup::kMuonH}});
//   Arena params(layout), grads(layout);
//   TensorView wq = params.view("layers.0.attn.wq");  // wq.data: (d, H*hd)
//   uint64_t fp = layout->fingerprint();               // checkpoint identity
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace rackstep::models {
struct LayerGraph;
}

namespace rackstep::exec {

// Optimizer groups (spec/marin-architecture.md, "Optimizer (param groups)").
// Same order as models::OptimizerKind so a cast converts between them.
enum class OptGroup : uint8_t {
  kMuonH = 0,  // block matrices: Nesterov + Newton–Schulz + hyperball
  kMuon = 1,   // same without the hyperball (plain Muon, for ablations)
  kAdamH = 2,  // LM head: Adam + hyperball
  kAdam = 3,   // embedding, router, gate, gains, SConv kernels
};
const char* to_string(OptGroup g);
// True for groups whose update is a matrix operation (2-D, or 3-D = per expert).
bool is_matrix_group(OptGroup g);
// True for groups that keep an initial Frobenius norm per matrix (hyperball).
bool is_hyperball_group(OptGroup g);

struct TensorSpec {
  std::string name;            // "layers.3.attn.wq"
  std::vector<int64_t> shape;  // (in, out) for matrices, (E, in, out) for experts
  OptGroup group = OptGroup::kAdam;
};

int64_t numel(const std::vector<int64_t>& shape);

// A tensor inside an arena. Matrix groups see it as `matrices` stacked
// (rows, cols) matrices: 2-D -> 1 matrix, 3-D (E, in, out) -> E matrices.
struct TensorView {
  float* data = nullptr;  // (numel), row-major in `spec->shape`
  const TensorSpec* spec = nullptr;
  int64_t numel = 0;
  int64_t matrices() const;
  int64_t rows() const;
  int64_t cols() const;
};
struct ConstTensorView {
  const float* data = nullptr;  // (numel)
  const TensorSpec* spec = nullptr;
  int64_t numel = 0;
};

class ArenaLayout {
 public:
  // Tensors start on 16-float (64-byte) boundaries; the padding stays zero.
  static constexpr int64_t kAlignFloats = 16;

  // Validates the specs: unique non-empty names, positive dims, matrix groups
  // 2-D or 3-D, AdamH 2-D. A bad spec list is a bug in the caller (RS_CHECK).
  explicit ArenaLayout(std::vector<TensorSpec> specs);

  size_t size() const { return specs_.size(); }
  const TensorSpec& spec(size_t i) const { return specs_[i]; }
  const std::vector<TensorSpec>& specs() const { return specs_; }
  int64_t offset(size_t i) const { return offsets_[i]; }  // in floats
  int64_t total_floats() const { return total_floats_; }  // incl. padding
  int64_t param_count() const { return param_count_; }    // excl. padding
  // Index of a tensor by name; -1 when absent.
  int64_t find(const std::string& name) const;

  // Identity of the model's parameter list: a hash of every (name, shape,
  // group) in order. Checkpoints from another model carry another fingerprint.
  uint64_t fingerprint() const { return fingerprint_; }

  // The layout holding only the tensors of `keep` groups, in the same order
  // (Adam second moments exist only for the Adam/AdamH tensors).
  std::shared_ptr<const ArenaLayout> subset(const std::vector<OptGroup>& keep) const;

 private:
  std::vector<TensorSpec> specs_;
  std::vector<int64_t> offsets_;
  std::unordered_map<std::string, size_t> index_;
  int64_t total_floats_ = 0;
  int64_t param_count_ = 0;
  uint64_t fingerprint_ = 0;
};

class Arena {
 public:
  Arena() = default;
  explicit Arena(std::shared_ptr<const ArenaLayout> layout);  // zero-filled

  const ArenaLayout& layout() const { return *layout_; }
  const std::shared_ptr<const ArenaLayout>& layout_ptr() const { return layout_; }
  float* data() { return data_.data(); }              // (total_floats)
  const float* data() const { return data_.data(); }  // (total_floats)
  int64_t total_floats() const { return static_cast<int64_t>(data_.size()); }
  size_t bytes() const { return data_.size() * sizeof(float); }

  TensorView view(size_t i);
  ConstTensorView view(size_t i) const;
  TensorView view(const std::string& name);  // RS_CHECK on an unknown name
  ConstTensorView view(const std::string& name) const;
  void zero();

 private:
  std::shared_ptr<const ArenaLayout> layout_;
  std::vector<float> data_;  // (total_floats)
};

// Splits the tensors into `world` contiguous ranges [begin, end) of roughly
// equal element counts, for ZeRO-style ownership of optimizer work: a matrix
// group's update needs the whole matrix, so shards are whole tensors.
std::vector<std::pair<size_t, size_t>> partition_tensors(const ArenaLayout& layout, int world);

// The arena spec of a model: every learnable parameter of the layer graph in
// op order, with its optimizer group. Buffers (the QB router bias) are not
// parameters; the training loop keeps them in the checkpoint's QB slot.
std::vector<TensorSpec> arena_specs_from_graph(const models::LayerGraph& graph);

// 64-bit checksum used by token shards and checkpoints, fed in pieces. Any
// change to a single 8-byte word of the stream (hence any single byte) changes
// the result: each round is a bijection of the state for a fixed word and of
// the word for a fixed state, and the finaliser is a bijection.
class Checksum64 {
 public:
  explicit Checksum64(uint64_t seed = 0) : state_(seed ^ 0x9e3779b97f4a7c15ULL) {}
  Checksum64& update(const void* data, size_t bytes);
  uint64_t value() const;  // does not end the stream

 private:
  void mix(uint64_t word);
  uint64_t state_;
  uint64_t total_bytes_ = 0;
  unsigned char pending_[8] = {};
  size_t pending_bytes_ = 0;
};
uint64_t checksum64(const void* data, size_t bytes, uint64_t seed = 0);

// Writes `pieces` one after another to `path` through sim/base/file_io.h's
// write_output_file: a regular file atomically (temp file, fsync, rename,
// fsync of the directory; on failure the temp file is removed and `path` is
// untouched), symlinks followed, devices and FIFOs written in place; a failed
// or short write is a UserError saying what failed.
struct FilePiece {
  const void* data;
  size_t bytes;
};
void write_binary_file_atomic(const std::string& path, const std::vector<FilePiece>& pieces);

}  // namespace rackstep::exec
