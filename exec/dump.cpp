#include "exec/dump.h"

#include <bit>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>

#include "sim/base/check.h"
#include "sim/base/json_io.h"

namespace rackstep::exec {

// Raw bytes are the in-memory representation; the format is little-endian.
static_assert(std::endian::native == std::endian::little, "tensor dumps assume a little-endian host");

namespace {

constexpr int64_t kDumpAlignBytes = 64;
constexpr int64_t kDumpVersion = 1;
constexpr const char* kDumpFormat = "rackstep-tensor-dump";

int64_t aligned(int64_t bytes) { return (bytes + kDumpAlignBytes - 1) / kDumpAlignBytes * kDumpAlignBytes; }

int64_t shape_numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

}  // namespace

const char* to_string(DumpDtype d) { return d == DumpDtype::kF32 ? "f32" : "i32"; }

int64_t DumpedTensor::numel() const { return shape_numel(shape); }

std::vector<float> DumpedTensor::f32() const {
  RS_CHECK(dtype == DumpDtype::kF32, "tensor " + name + " is not f32");
  std::vector<float> v(static_cast<size_t>(numel()));
  std::memcpy(v.data(), bytes.data(), bytes.size());
  return v;
}

std::vector<int32_t> DumpedTensor::i32() const {
  RS_CHECK(dtype == DumpDtype::kI32, "tensor " + name + " is not i32");
  std::vector<int32_t> v(static_cast<size_t>(numel()));
  std::memcpy(v.data(), bytes.data(), bytes.size());
  return v;
}

DumpedTensor& TensorDump::add(const std::string& name, const std::vector<int64_t>& shape, DumpDtype dtype) {
  RS_CHECK(!name.empty(), "a dumped tensor needs a name");
  RS_CHECK(find(name) == nullptr, "tensor " + name + " dumped twice");
  for (int64_t s : shape) RS_CHECK(s >= 0, "tensor " + name + " has a negative dim");
  DumpedTensor t;
  t.name = name;
  t.shape = shape;
  t.dtype = dtype;
  t.bytes.resize(static_cast<size_t>(shape_numel(shape)) * 4);
  tensors_.push_back(std::move(t));
  return tensors_.back();
}

void TensorDump::add_f32(const std::string& name, const std::vector<int64_t>& shape, const float* data) {
  DumpedTensor& t = add(name, shape, DumpDtype::kF32);
  if (!t.bytes.empty()) std::memcpy(t.bytes.data(), data, t.bytes.size());
}

void TensorDump::add_i32(const std::string& name, const std::vector<int64_t>& shape, const int32_t* data) {
  DumpedTensor& t = add(name, shape, DumpDtype::kI32);
  if (!t.bytes.empty()) std::memcpy(t.bytes.data(), data, t.bytes.size());
}

void TensorDump::add_f64_as_f32(const std::string& name, const std::vector<int64_t>& shape,
                                const double* data) {
  std::vector<float> f(static_cast<size_t>(shape_numel(shape)));  // (numel)
  for (size_t i = 0; i < f.size(); ++i) f[i] = static_cast<float>(data[i]);
  add_f32(name, shape, f.data());
}

void TensorDump::add_scalar(const std::string& name, double value) {
  const float f = static_cast<float>(value);
  add_f32(name, {}, &f);
}

void TensorDump::add_arena(const std::string& prefix, const Arena& arena) {
  const ArenaLayout& layout = arena.layout();
  for (size_t i = 0; i < layout.size(); ++i) {
    add_f32(prefix + layout.spec(i).name, layout.spec(i).shape, arena.view(i).data);
  }
}

const DumpedTensor* TensorDump::find(const std::string& name) const {
  for (const DumpedTensor& t : tensors_) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

void TensorDump::write(const std::string& dir) const {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw UserError(dir, "", "a directory that can be created", ec.message());

  static const uint8_t kZeros[kDumpAlignBytes] = {};
  std::vector<FilePiece> pieces;
  nlohmann::json entries = nlohmann::json::array();
  int64_t offset = 0;
  for (const DumpedTensor& t : tensors_) {
    entries.push_back({{"name", t.name}, {"shape", t.shape}, {"dtype", to_string(t.dtype)}, {"offset", offset}});
    const int64_t bytes = static_cast<int64_t>(t.bytes.size());
    if (bytes > 0) pieces.push_back({t.bytes.data(), t.bytes.size()});
    const int64_t pad = aligned(bytes) - bytes;
    if (pad > 0) pieces.push_back({kZeros, static_cast<size_t>(pad)});
    offset += bytes + pad;
  }
  write_binary_file_atomic(dir + "/tensors.bin", pieces);
  const nlohmann::json manifest = {{"format", kDumpFormat}, {"version", kDumpVersion},
                                   {"tensors", entries},    {"bin_bytes", offset},
                                   {"meta", meta_}};
  write_json_file_atomic(dir + "/manifest.json", manifest, 1);
}

namespace {

std::vector<uint8_t> read_all_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UserError(path, "", "a readable tensor file", "it cannot be opened");
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

DumpedTensor read_entry(JsonReader& e, const std::vector<uint8_t>& bin, const std::string& bin_path) {
  DumpedTensor t;
  t.name = e.string("name");
  t.shape = e.integer_list("shape", {});
  for (int64_t s : t.shape) {
    if (s < 0) e.fail("shape", "non-negative dims", std::to_string(s));
  }
  t.dtype = e.choice("dtype", {"f32", "i32"}, "f32") == "f32" ? DumpDtype::kF32 : DumpDtype::kI32;
  const int64_t offset = e.integer("offset", {.min = 0});
  e.finish();
  const int64_t bytes = t.numel() * 4;
  if (offset + bytes > static_cast<int64_t>(bin.size())) {
    throw UserError(bin_path, "", "tensor " + t.name + " inside the file (" + std::to_string(offset + bytes) + " bytes)",
                    std::to_string(bin.size()) + " bytes");
  }
  t.bytes.assign(bin.begin() + offset, bin.begin() + offset + bytes);
  return t;
}

}  // namespace

TensorDump read_tensor_dump(const std::string& dir) {
  const std::string manifest_path = dir + "/manifest.json";
  const std::string bin_path = dir + "/tensors.bin";
  const nlohmann::json doc = load_json_file(manifest_path);
  JsonReader r(doc, manifest_path);
  if (r.string("format") != kDumpFormat) r.fail("format", std::string("\"") + kDumpFormat + "\"", describe_json(doc.at("format")));
  r.integer("version", {.min = static_cast<double>(kDumpVersion), .max = static_cast<double>(kDumpVersion)});
  const int64_t bin_bytes = r.integer("bin_bytes", {.min = 0});
  const std::vector<uint8_t> bin = read_all_bytes(bin_path);
  if (static_cast<int64_t>(bin.size()) != bin_bytes) {
    throw UserError(bin_path, "", std::to_string(bin_bytes) + " bytes (manifest bin_bytes)", std::to_string(bin.size()) + " bytes");
  }
  TensorDump dump;
  std::set<std::string> seen;
  for (JsonReader& e : r.object_list("tensors")) {
    const DumpedTensor t = read_entry(e, bin, bin_path);
    if (!seen.insert(t.name).second) e.fail("name", "a name used once", t.name);
    if (t.dtype == DumpDtype::kF32) {
      dump.add_f32(t.name, t.shape, t.f32().data());
    } else {
      dump.add_i32(t.name, t.shape, t.i32().data());
    }
  }
  if (doc.contains("meta")) dump.meta() = doc.at("meta");
  r.ignore("meta");
  r.finish();
  return dump;
}

}  // namespace rackstep::exec
