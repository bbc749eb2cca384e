#include "exec/arena.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "sim/base/check.h"
#include "sim/base/file_io.h"
#include "models/layer_graph.h"

namespace rackstep::exec {

const char* to_string(OptGroup g) {
  switch (g) {
    case OptGroup::kMuonH: return "muonh";
    case OptGroup::kMuon: return "muon";
    case OptGroup::kAdamH: return "adamh";
    case OptGroup::kAdam: return "adam";
  }
  return "?";
}

bool is_matrix_group(OptGroup g) { return g == OptGroup::kMuonH || g == OptGroup::kMuon; }
bool is_hyperball_group(OptGroup g) { return g == OptGroup::kMuonH || g == OptGroup::kAdamH; }

int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t TensorView::matrices() const { return spec->shape.size() == 3 ? spec->shape[0] : 1; }
int64_t TensorView::rows() const { return spec->shape[spec->shape.size() - 2]; }
int64_t TensorView::cols() const { return spec->shape.back(); }

namespace {

void check_spec(const TensorSpec& s) {
  RS_CHECK(!s.name.empty(), "arena tensors need a name");
  RS_CHECK(!s.shape.empty(), "arena tensor " + s.name + " has no shape");
  for (int64_t d : s.shape) RS_CHECK(d > 0, "arena tensor " + s.name + " has a non-positive dim");
  if (is_matrix_group(s.group)) {
    RS_CHECK(s.shape.size() == 2 || s.shape.size() == 3,
             "Muon tensor " + s.name + " must be a matrix or a stack of expert matrices");
  }
  if (s.group == OptGroup::kAdamH) {
    RS_CHECK(s.shape.size() == 2, "AdamH tensor " + s.name + " must be a matrix");
  }
}

int64_t round_up(int64_t n, int64_t to) { return (n + to - 1) / to * to; }

}  // namespace

ArenaLayout::ArenaLayout(std::vector<TensorSpec> specs) : specs_(std::move(specs)) {
  Checksum64 fp(0x52534152454e41ULL);  // "RSARENA"
  offsets_.reserve(specs_.size());
  for (size_t i = 0; i < specs_.size(); ++i) {
    const TensorSpec& s = specs_[i];
    check_spec(s);
    RS_CHECK(index_.emplace(s.name, i).second, "duplicate arena tensor " + s.name);
    offsets_.push_back(total_floats_);
    const int64_t n = numel(s.shape);
    param_count_ += n;
    total_floats_ += round_up(n, kAlignFloats);
    // The fingerprint covers names, shapes and groups in order (length-prefixed
    // so "ab"+"c" and "a"+"bc" differ).
    const uint64_t name_len = s.name.size();
    fp.update(&name_len, sizeof name_len).update(s.name.data(), s.name.size());
    const uint64_t rank = s.shape.size();
    fp.update(&rank, sizeof rank).update(s.shape.data(), s.shape.size() * sizeof(int64_t));
    const uint8_t group = static_cast<uint8_t>(s.group);
    fp.update(&group, 1);
  }
  fingerprint_ = fp.value();
}

int64_t ArenaLayout::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? -1 : static_cast<int64_t>(it->second);
}

std::shared_ptr<const ArenaLayout> ArenaLayout::subset(const std::vector<OptGroup>& keep) const {
  std::vector<TensorSpec> kept;
  for (const TensorSpec& s : specs_) {
    if (std::find(keep.begin(), keep.end(), s.group) != keep.end()) kept.push_back(s);
  }
  return std::make_shared<const ArenaLayout>(std::move(kept));
}

Arena::Arena(std::shared_ptr<const ArenaLayout> layout)
    : layout_(std::move(layout)), data_(static_cast<size_t>(layout_->total_floats()), 0.0f) {}

TensorView Arena::view(size_t i) {
  RS_CHECK(i < layout_->size(), "arena tensor index out of range");
  return {data_.data() + layout_->offset(i), &layout_->spec(i), numel(layout_->spec(i).shape)};
}

ConstTensorView Arena::view(size_t i) const {
  RS_CHECK(i < layout_->size(), "arena tensor index out of range");
  return {data_.data() + layout_->offset(i), &layout_->spec(i), numel(layout_->spec(i).shape)};
}

TensorView Arena::view(const std::string& name) {
  const int64_t i = layout_->find(name);
  RS_CHECK(i >= 0, "no arena tensor named " + name);
  return view(static_cast<size_t>(i));
}

ConstTensorView Arena::view(const std::string& name) const {
  const int64_t i = layout_->find(name);
  RS_CHECK(i >= 0, "no arena tensor named " + name);
  return view(static_cast<size_t>(i));
}

void Arena::zero() { std::fill(data_.begin(), data_.end(), 0.0f); }

std::vector<std::pair<size_t, size_t>> partition_tensors(const ArenaLayout& layout, int world) {
  RS_CHECK(world >= 1, "partition needs at least one rank");
  std::vector<std::pair<size_t, size_t>> parts;
  const double per_rank = static_cast<double>(layout.param_count()) / world;
  size_t begin = 0;
  double done = 0;
  for (int r = 0; r < world; ++r) {
    size_t end = begin;
    const double target = per_rank * (r + 1);
    // Take tensors while the running total stays closest to this rank's target.
    while (end < layout.size() && (r == world - 1 || done + 0.5 * numel(layout.spec(end).shape) <= target)) {
      done += static_cast<double>(numel(layout.spec(end).shape));
      ++end;
    }
    parts.emplace_back(begin, end);
    begin = end;
  }
  return parts;
}

std::vector<TensorSpec> arena_specs_from_graph(const models::LayerGraph& graph) {
  std::vector<TensorSpec> specs;
  for (const models::Op& op : graph.ops) {
    for (const models::ParamTensor& p : op.params) {
      if (!p.learnable) continue;
      specs.push_back({p.name, p.shape, static_cast<OptGroup>(static_cast<int>(p.optimizer))});
    }
  }
  return specs;
}

// --- checksum -----------------------------------------------------------------

namespace {
constexpr uint64_t kK1 = 0x87c37b91114253d5ULL;  // odd multipliers (MurmurHash3)
constexpr uint64_t kK2 = 0x4cf5ad432745937fULL;
uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
}  // namespace

void Checksum64::mix(uint64_t word) {
  state_ ^= word * kK1;
  state_ = rotl(state_, 31) * kK2 + 0x52dce729;
}

Checksum64& Checksum64::update(const void* data, size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  total_bytes_ += bytes;
  while (bytes > 0 && pending_bytes_ > 0 && pending_bytes_ < 8) {
    pending_[pending_bytes_++] = *p++;
    --bytes;
    if (pending_bytes_ == 8) {
      uint64_t w;
      std::memcpy(&w, pending_, 8);
      mix(w);
      pending_bytes_ = 0;
    }
  }
  for (; bytes >= 8; bytes -= 8, p += 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);  // little-endian hosts only (x86-64, aarch64)
    mix(w);
  }
  for (; bytes > 0; --bytes) pending_[pending_bytes_++] = *p++;
  return *this;
}

uint64_t Checksum64::value() const {
  Checksum64 c = *this;
  if (c.pending_bytes_ > 0) {
    uint64_t w = 0;
    std::memcpy(&w, c.pending_, c.pending_bytes_);
    c.mix(w);
  }
  c.mix(c.total_bytes_);  // the length tells "ab\0" from "ab"
  uint64_t h = c.state_;  // splitmix64 finaliser (bijective)
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ULL;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebULL;
  h ^= h >> 31;
  return h;
}

uint64_t checksum64(const void* data, size_t bytes, uint64_t seed) {
  return Checksum64(seed).update(data, bytes).value();
}

// --- atomic file writes ------------------------------------------------------------

void write_binary_file_atomic(const std::string& path, const std::vector<FilePiece>& pieces) {
  std::vector<OutputPiece> out;
  out.reserve(pieces.size());
  for (const FilePiece& p : pieces) out.push_back({p.data, p.bytes});
  write_output_file(path, out);  // sim/base/file_io.h: symlinks, devices, checked writes
}

}  // namespace rackstep::exec
