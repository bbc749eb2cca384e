#include "exec/checkpoint.h"

#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "sim/base/check.h"

namespace rackstep::exec {

namespace {

constexpr size_t kHeaderBytes = 64;
constexpr size_t kSectionEntryBytes = 24;

enum SectionId : uint32_t {
  kParams = 1,
  kMomentum = 2,
  kSecondMoment = 3,
  kW0Norm = 4,
  kOptStep = 5,
  kRng = 6,
  kDataPosition = 7,
  kQb = 8,
  kIdentity = 9,
};
constexpr uint32_t kSectionCount = 9;
constexpr uint32_t kVersion1SectionCount = 8;  // version 1: no identity section

const char* section_name(uint32_t id) {
  switch (id) {
    case kParams: return "params";
    case kMomentum: return "momentum";
    case kSecondMoment: return "second moment";
    case kW0Norm: return "||W0|| norms";
    case kOptStep: return "optimizer step";
    case kRng: return "RNG state";
    case kDataPosition: return "data position";
    case kQb: return "QB state";
    case kIdentity: return "run identity";
  }
  return "unknown";
}

template <typename T>
void put(std::vector<unsigned char>& buf, size_t at, T v) {
  std::memcpy(buf.data() + at, &v, sizeof v);
}
template <typename T>
T get(const std::string& buf, size_t at) {
  T v;
  std::memcpy(&v, buf.data() + at, sizeof v);
  return v;
}

std::string hex64(uint64_t v) {
  char b[32];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(v));
  return b;
}

uint64_t align8(uint64_t n) { return (n + 7) / 8 * 8; }

struct Piece {
  uint32_t id;
  const void* data;
  uint64_t bytes;
};

// The whole file in memory, validated up to (and including) the checksum.
struct ParsedFile {
  std::string bytes;
  CheckpointInfo info;
};

ParsedFile read_and_check(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UserError(path, "", "a readable checkpoint file", "cannot open it");
  std::ostringstream ss;
  ss << in.rdbuf();
  ParsedFile f{std::move(ss).str(), {}};
  const std::string& b = f.bytes;
  if (b.size() < kHeaderBytes + 8) {
    throw UserError(path, "", "a checkpoint of at least 72 bytes (truncated?)", std::to_string(b.size()) + " bytes");
  }
  if (std::memcmp(b.data(), kCheckpointMagic, 8) != 0) {
    throw UserError(path, "", "a rackstep checkpoint (magic \"RSCKPT\")", "other bytes");
  }
  f.info.version = get<uint32_t>(b, 8);
  if (f.info.version != kCheckpointVersion && f.info.version != 1) {
    throw UserError(path, "", "checkpoint version 1 or " + std::to_string(kCheckpointVersion),
                    std::to_string(f.info.version));
  }
  f.info.fingerprint = get<uint64_t>(b, 16);
  f.info.step = get<int64_t>(b, 24);
  f.info.bytes = get<uint64_t>(b, 32);
  if (f.info.bytes != b.size()) {
    throw UserError(path, "", std::to_string(f.info.bytes) + " bytes (from the header)",
                    std::to_string(b.size()) + " bytes" + (b.size() < f.info.bytes ? " (truncated)" : ""));
  }
  const uint64_t stored = get<uint64_t>(b, b.size() - 8);
  const uint64_t actual = checksum64(b.data(), b.size() - 8);
  if (stored != actual) {
    throw UserError(path, "", "checksum " + hex64(stored) + " (from the file)", hex64(actual) + " (the file is corrupt)");
  }
  return f;
}

}  // namespace

void save_checkpoint(const std::string& path, const Arena& params, const OptimizerState& opt,
                     const CheckpointMeta& meta) {
  RS_CHECK(opt.momentum.layout().fingerprint() == params.layout().fingerprint(),
           "optimizer state belongs to another model");
  const uint64_t opt_step = static_cast<uint64_t>(opt.step);
  const uint64_t position[3] = {meta.data_position.seed, meta.data_position.epoch, meta.data_position.cursor};
  const std::vector<Piece> pieces = {
      {kParams, params.data(), params.bytes()},
      {kMomentum, opt.momentum.data(), opt.momentum.bytes()},
      {kSecondMoment, opt.second_moment.data(), opt.second_moment.bytes()},
      {kW0Norm, opt.w0_norm.data(), opt.w0_norm.size() * sizeof(double)},
      {kOptStep, &opt_step, sizeof opt_step},
      {kRng, meta.rng_state.data(), meta.rng_state.size()},
      {kDataPosition, position, sizeof position},
      {kQb, meta.qb_state.data(), meta.qb_state.size()},
      {kIdentity, meta.identity.data(), meta.identity.size()},
  };
  static_assert(kSectionCount == 9, "one piece per section");

  std::vector<unsigned char> head(kHeaderBytes + kSectionCount * kSectionEntryBytes, 0);
  uint64_t offset = head.size();
  for (size_t i = 0; i < pieces.size(); ++i) {
    const size_t e = kHeaderBytes + i * kSectionEntryBytes;
    put(head, e, pieces[i].id);
    put(head, e + 8, offset);
    put(head, e + 16, pieces[i].bytes);
    offset += align8(pieces[i].bytes);
  }
  const uint64_t file_bytes = offset + 8;
  std::memcpy(head.data(), kCheckpointMagic, 8);
  put(head, 8, kCheckpointVersion);
  put(head, 12, kSectionCount);
  put(head, 16, params.layout().fingerprint());
  put(head, 24, meta.step);
  put(head, 32, file_bytes);

  static const unsigned char zeros[8] = {};
  std::vector<FilePiece> out = {{head.data(), head.size()}};
  Checksum64 sum;
  sum.update(head.data(), head.size());
  for (const Piece& p : pieces) {
    const uint64_t pad = align8(p.bytes) - p.bytes;
    out.push_back({p.data, p.bytes});
    out.push_back({zeros, pad});
    sum.update(p.data, p.bytes).update(zeros, pad);
  }
  const uint64_t checksum = sum.value();
  out.push_back({&checksum, sizeof checksum});
  write_binary_file_atomic(path, out);
}

CheckpointInfo read_checkpoint_info(const std::string& path) { return read_and_check(path).info; }

void load_checkpoint(const std::string& path, Arena& params, OptimizerState& opt, CheckpointMeta& meta) {
  const ParsedFile f = read_and_check(path);
  const std::string& b = f.bytes;
  const uint64_t want_fp = params.layout().fingerprint();
  if (f.info.fingerprint != want_fp) {
    throw UserError(path, "", "a checkpoint of this model (fingerprint " + hex64(want_fp) + ", " +
                                  std::to_string(params.layout().size()) + " tensors)",
                    "fingerprint " + hex64(f.info.fingerprint) + " (another model)");
  }
  RS_CHECK(opt.momentum.layout().fingerprint() == want_fp, "optimizer state belongs to another model");
  const uint32_t count = get<uint32_t>(b, 12);
  const uint32_t want_count = f.info.version == 1 ? kVersion1SectionCount : kSectionCount;
  if (count != want_count) {
    throw UserError(path, "", std::to_string(want_count) + " sections", std::to_string(count));
  }
  if (kHeaderBytes + uint64_t{count} * kSectionEntryBytes > b.size() - 8) {
    throw UserError(path, "", "a section table inside the file", std::to_string(b.size()) + " bytes");
  }
  // Locate every section and check its size against this model before copying anything.
  const uint64_t body_end = b.size() - 8;
  const uint64_t expected_bytes[kSectionCount + 1] = {
      0,
      params.bytes(),
      opt.momentum.bytes(),
      opt.second_moment.bytes(),
      opt.w0_norm.size() * sizeof(double),
      sizeof(uint64_t),
      UINT64_MAX,  // RNG: any size
      3 * sizeof(uint64_t),
      UINT64_MAX,  // QB: any size
      UINT64_MAX,  // identity: any size
  };
  const char* where[kSectionCount + 1] = {};
  uint64_t sizes[kSectionCount + 1] = {};
  for (uint32_t i = 0; i < count; ++i) {
    const size_t e = kHeaderBytes + i * kSectionEntryBytes;
    const auto id = get<uint32_t>(b, e);
    const auto off = get<uint64_t>(b, e + 8);
    const auto bytes = get<uint64_t>(b, e + 16);
    if (id < 1 || id > count || where[id] != nullptr) {
      throw UserError(path, "", "section ids 1.." + std::to_string(count) + " once each",
                      "id " + std::to_string(id));
    }
    if (off < kHeaderBytes + count * kSectionEntryBytes || off > body_end || bytes > body_end - off) {
      throw UserError(path, "", std::string("the ") + section_name(id) + " section inside the file",
                      "offset " + std::to_string(off) + ", " + std::to_string(bytes) + " bytes");
    }
    if (expected_bytes[id] != UINT64_MAX && bytes != expected_bytes[id]) {
      throw UserError(path, "", std::string("a ") + section_name(id) + " section of " +
                                    std::to_string(expected_bytes[id]) + " bytes for this model",
                      std::to_string(bytes) + " bytes");
    }
    where[id] = b.data() + off;
    sizes[id] = bytes;
  }
  // All checks passed: copy.
  std::memcpy(params.data(), where[kParams], sizes[kParams]);
  std::memcpy(opt.momentum.data(), where[kMomentum], sizes[kMomentum]);
  std::memcpy(opt.second_moment.data(), where[kSecondMoment], sizes[kSecondMoment]);
  std::memcpy(opt.w0_norm.data(), where[kW0Norm], sizes[kW0Norm]);
  uint64_t opt_step;
  std::memcpy(&opt_step, where[kOptStep], sizeof opt_step);
  opt.step = static_cast<int64_t>(opt_step);
  meta.step = f.info.step;
  meta.rng_state.assign(where[kRng], where[kRng] + sizes[kRng]);
  uint64_t position[3];
  std::memcpy(position, where[kDataPosition], sizeof position);
  meta.data_position = {position[0], position[1], position[2]};
  meta.qb_state.assign(where[kQb], where[kQb] + sizes[kQb]);
  meta.identity = where[kIdentity] ? std::string(where[kIdentity], sizes[kIdentity]) : std::string();
}

}  // namespace rackstep::exec
