// Checkpoints: save -> load is bitwise identical, resume continues exactly,
// and corrupt / truncated / foreign files are clear UserErrors that leave the
// destination untouched.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "exec/checkpoint.h"
#include "sim/base/check.h"
#include "tests/temp_dir.h"

using namespace rackstep::exec;
namespace fs = std::filesystem;

namespace {

std::shared_ptr<const ArenaLayout> layout_a() {
  return std::make_shared<ArenaLayout>(std::vector<TensorSpec>{
      {"embed", {33, 8}, OptGroup::kAdam},
      {"layers.0.attn.wq", {8, 16}, OptGroup::kMuonH},
      {"layers.0.moe.w_gate", {4, 8, 5}, OptGroup::kMuonH},
      {"layers.0.norm.gain", {8}, OptGroup::kAdam},
      {"lm_head", {8, 33}, OptGroup::kAdamH}});
}

void fill(Arena& a, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 0.3f);
  for (size_t i = 0; i < a.layout().size(); ++i) {
    TensorView t = a.view(i);
    for (int64_t j = 0; j < t.numel; ++j) t.data[j] = d(rng);
  }
}

bool same_bits(const Arena& a, const Arena& b) {
  return a.bytes() == b.bytes() && std::memcmp(a.data(), b.data(), a.bytes()) == 0;
}

// A model with a few optimizer steps behind it.
struct Trained {
  Arena params, grads;
  OptimizerState opt;
  Optimizer optimizer;
  explicit Trained(std::shared_ptr<const ArenaLayout> layout, int steps = 3)
      : params(layout), grads(layout), optimizer([] {
          OptimizerConfig c;
          c.adam_lr = 0.01;
          c.muonh_lr = 0.03;
          c.total_steps = 20;
          return c;
        }()) {
    fill(params, 1);
    opt = init_optimizer_state(params);
    for (int s = 0; s < steps; ++s) step(s);
  }
  void step(int s) {
    fill(grads, 100 + s);
    optimizer.step(params, grads, opt);
  }
};

CheckpointMeta sample_meta() {
  CheckpointMeta m;
  m.step = 3;
  m.rng_state = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  m.data_position = {42, 2, 17};
  m.qb_state = {0xde, 0xad, 0xbe, 0xef, 0, 1};
  return m;
}

std::string read_bytes(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}
void write_bytes(const std::string& p, const std::string& b) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(b.data(), static_cast<std::streamsize>(b.size()));
}

std::string load_error(const std::string& path, Arena& params, OptimizerState& opt, CheckpointMeta& meta) {
  try {
    load_checkpoint(path, params, opt, meta);
  } catch (const rackstep::UserError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("save then load gives bitwise identical state", "[checkpoint]") {
  TempDir dir("ckpt", "roundtrip");
  Trained t(layout_a());
  const CheckpointMeta meta = sample_meta();
  save_checkpoint(dir.file("c.rsck"), t.params, t.opt, meta);

  Arena params(layout_a());
  fill(params, 999);  // different contents that must be overwritten
  OptimizerState opt = init_optimizer_state(params);
  CheckpointMeta got;
  load_checkpoint(dir.file("c.rsck"), params, opt, got);
  CHECK(same_bits(params, t.params));
  CHECK(same_bits(opt.momentum, t.opt.momentum));
  CHECK(same_bits(opt.second_moment, t.opt.second_moment));
  CHECK(opt.w0_norm == t.opt.w0_norm);
  CHECK(opt.step == 3);
  CHECK(got.step == 3);
  CHECK(got.rng_state == meta.rng_state);
  CHECK(got.qb_state == meta.qb_state);
  CHECK(got.data_position.seed == 42);
  CHECK(got.data_position.epoch == 2);
  CHECK(got.data_position.cursor == 17);
  const CheckpointInfo info = read_checkpoint_info(dir.file("c.rsck"));
  CHECK(info.fingerprint == layout_a()->fingerprint());
  CHECK(info.bytes == fs::file_size(dir.file("c.rsck")));
  // Atomic write leaves no temp file behind.
  int files = 0;
  for (auto& e : fs::directory_iterator(dir.path)) files += e.is_regular_file() ? 1 : 0;
  CHECK(files == 1);
}

TEST_CASE("resume from a checkpoint continues bitwise identically", "[checkpoint]") {
  TempDir dir("ckpt", "resume");
  Trained straight(layout_a(), 6);

  Trained first(layout_a(), 3);
  save_checkpoint(dir.file("c.rsck"), first.params, first.opt, sample_meta());
  Trained resumed(layout_a(), 0);
  CheckpointMeta meta;
  load_checkpoint(dir.file("c.rsck"), resumed.params, resumed.opt, meta);
  for (int s = 3; s < 6; ++s) resumed.step(s);
  CHECK(same_bits(resumed.params, straight.params));
  CHECK(same_bits(resumed.opt.momentum, straight.opt.momentum));
  CHECK(same_bits(resumed.opt.second_moment, straight.opt.second_moment));
}

TEST_CASE("a corrupt, truncated or foreign checkpoint is a clear error and changes nothing", "[checkpoint]") {
  TempDir dir("ckpt", "bad");
  Trained t(layout_a());
  const std::string good = dir.file("good.rsck");
  save_checkpoint(good, t.params, t.opt, sample_meta());
  const std::string bytes = read_bytes(good);

  Arena params(layout_a());
  fill(params, 7);
  OptimizerState opt = init_optimizer_state(params);
  const Arena params_before = params;
  const Arena momentum_before = opt.momentum;
  CheckpointMeta meta;
  meta.step = 77;
  auto unchanged = [&] {
    return same_bits(params, params_before) && same_bits(opt.momentum, momentum_before) && opt.step == 0 &&
           meta.step == 77;
  };

  SECTION("one flipped byte anywhere") {
    for (size_t at : {size_t{20}, size_t{100}, bytes.size() / 2, bytes.size() - 20, bytes.size() - 1}) {
      CAPTURE(at);
      std::string bad = bytes;
      bad[at] = static_cast<char>(bad[at] ^ 0x10);
      write_bytes(dir.file("bad.rsck"), bad);
      const std::string err = load_error(dir.file("bad.rsck"), params, opt, meta);
      CAPTURE(err);
      CHECK(!err.empty());
      CHECK(err.find("bad.rsck") != std::string::npos);
      CHECK(err.find('\n') == std::string::npos);
      CHECK(unchanged());
    }
    std::string bad = bytes;
    bad[bytes.size() / 2] ^= 0x01;
    write_bytes(dir.file("bad.rsck"), bad);
    CHECK(load_error(dir.file("bad.rsck"), params, opt, meta).find("corrupt") != std::string::npos);
  }
  SECTION("truncated") {
    write_bytes(dir.file("short.rsck"), bytes.substr(0, bytes.size() - 100));
    const std::string err = load_error(dir.file("short.rsck"), params, opt, meta);
    CHECK(err.find("truncated") != std::string::npos);
    CHECK(unchanged());
    write_bytes(dir.file("tiny.rsck"), bytes.substr(0, 10));
    CHECK(load_error(dir.file("tiny.rsck"), params, opt, meta).find("truncated") != std::string::npos);
    CHECK(unchanged());
  }
  SECTION("not a checkpoint") {
    write_bytes(dir.file("text.rsck"), std::string(200, 'x'));
    CHECK(load_error(dir.file("text.rsck"), params, opt, meta).find("magic") != std::string::npos);
    CHECK(load_error(dir.file("missing.rsck"), params, opt, meta).find("cannot open") != std::string::npos);
    CHECK(unchanged());
  }
  SECTION("another model") {
    // Same tensor count, one shape differs.
    auto other = std::make_shared<ArenaLayout>(std::vector<TensorSpec>{
        {"embed", {33, 8}, OptGroup::kAdam},
        {"layers.0.attn.wq", {8, 16}, OptGroup::kMuonH},
        {"layers.0.moe.w_gate", {4, 8, 6}, OptGroup::kMuonH},
        {"layers.0.norm.gain", {8}, OptGroup::kAdam},
        {"lm_head", {8, 33}, OptGroup::kAdamH}});
    REQUIRE(other->fingerprint() != layout_a()->fingerprint());
    Trained o(other);
    save_checkpoint(dir.file("other.rsck"), o.params, o.opt, sample_meta());
    const std::string err = load_error(dir.file("other.rsck"), params, opt, meta);
    CHECK(err.find("another model") != std::string::npos);
    CHECK(unchanged());
  }
}

TEST_CASE("a failed save leaves the previous checkpoint intact", "[checkpoint]") {
  TempDir dir("ckpt", "failsave");
  Trained t(layout_a());
  save_checkpoint(dir.file("c.rsck"), t.params, t.opt, sample_meta());
  const std::string before = read_bytes(dir.file("c.rsck"));
  // The target's directory does not exist: the temp file cannot be created.
  CHECK_THROWS_AS(save_checkpoint(dir.file("no/such/dir/c.rsck"), t.params, t.opt, sample_meta()),
                  rackstep::UserError);
  // Overwriting with a new state replaces the file as a whole.
  t.step(3);
  save_checkpoint(dir.file("c.rsck"), t.params, t.opt, sample_meta());
  CHECK(read_bytes(dir.file("c.rsck")) != before);
  CHECK_NOTHROW(read_checkpoint_info(dir.file("c.rsck")));
}

TEST_CASE("layout fingerprints cover names, shapes and groups", "[checkpoint][arena]") {
  const uint64_t base = layout_a()->fingerprint();
  auto with = [](std::vector<TensorSpec> s) { return ArenaLayout(std::move(s)).fingerprint(); };
  std::vector<TensorSpec> specs = layout_a()->specs();
  CHECK(with(specs) == base);
  auto renamed = specs;
  renamed[0].name = "embedding";
  CHECK(with(renamed) != base);
  auto regrouped = specs;
  regrouped[3].group = OptGroup::kAdamH;
  regrouped[3].shape = {8, 1};
  CHECK(with(regrouped) != base);
  auto reordered = specs;
  std::swap(reordered[0], reordered[1]);
  CHECK(with(reordered) != base);
}

TEST_CASE("checksum64 notices any single flipped byte, in any piece split", "[checkpoint][arena]") {
  std::string data(1003, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 31 + 7);
  const uint64_t whole = checksum64(data.data(), data.size());
  // Feeding in uneven pieces gives the same value.
  Checksum64 pieces;
  pieces.update(data.data(), 3).update(data.data() + 3, 500).update(data.data() + 503, 500);
  CHECK(pieces.value() == whole);
  for (size_t i = 0; i < data.size(); ++i) {
    std::string bad = data;
    bad[i] = static_cast<char>(bad[i] ^ 0x01);
    REQUIRE(checksum64(bad.data(), bad.size()) != whole);
  }
  CHECK(checksum64(data.data(), data.size() - 1) != whole);
}
