// Tensor dumps: what is written is read back bit for bit, and damaged dumps are
// refused with a message instead of being read as garbage.
#include <catch2/catch.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include <unistd.h>

#include "exec/dump.h"
#include "sim/base/check.h"
#include "sim/base/json_io.h"

namespace fs = std::filesystem;
using rackstep::exec::DumpDtype;
using rackstep::exec::TensorDump;
using rackstep::exec::read_tensor_dump;

namespace {

std::string fresh_dir(const std::string& tag) {
  const fs::path p = fs::temp_directory_path() / ("rackstep_dump_" + tag + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  return p.string();
}

TensorDump sample_dump() {
  TensorDump d;
  const float w[6] = {1.5f, -2.0f, 3.25f, 0.0f, -0.0f, 1e-30f};  // (2, 3)
  const int32_t tok[5] = {0, 255, -1, 7, 1 << 30};                // (5)
  const float odd[3] = {7.0f, 8.0f, 9.0f};                        // (3): not 64-byte sized
  d.add_f32("w", {2, 3}, w);
  d.add_f32("odd", {3}, odd);
  d.add_i32("tokens", {5}, tok);
  d.add_scalar("loss", 2.5);
  d.meta()["step"] = 3;
  return d;
}

}  // namespace

TEST_CASE("a tensor dump reads back bit for bit", "[dump]") {
  const std::string dir = fresh_dir("roundtrip");
  sample_dump().write(dir);
  const TensorDump back = read_tensor_dump(dir);
  REQUIRE(back.tensors().size() == 4);
  const auto* w = back.find("w");
  REQUIRE(w != nullptr);
  CHECK(w->shape == std::vector<int64_t>{2, 3});
  CHECK(w->f32() == std::vector<float>{1.5f, -2.0f, 3.25f, 0.0f, -0.0f, 1e-30f});
  CHECK(back.find("odd")->f32() == std::vector<float>{7.0f, 8.0f, 9.0f});
  const auto* tok = back.find("tokens");
  REQUIRE(tok != nullptr);
  CHECK(tok->dtype == DumpDtype::kI32);
  CHECK(tok->i32() == std::vector<int32_t>{0, 255, -1, 7, 1 << 30});
  CHECK(back.find("loss")->shape.empty());
  CHECK(back.find("loss")->f32() == std::vector<float>{2.5f});
  CHECK(back.meta().at("step") == 3);
  CHECK(back.find("absent") == nullptr);
  // Offsets are 64-byte aligned so a reader can map tensors directly.
  const auto manifest = rackstep::load_json_file(dir + "/manifest.json");
  for (const auto& t : manifest.at("tensors")) CHECK(t.at("offset").get<int64_t>() % 64 == 0);
  fs::remove_all(dir);
}

TEST_CASE("a truncated tensors.bin is refused", "[dump]") {
  const std::string dir = fresh_dir("truncated");
  sample_dump().write(dir);
  fs::resize_file(dir + "/tensors.bin", 10);
  CHECK_THROWS_AS(read_tensor_dump(dir), rackstep::UserError);
  fs::remove_all(dir);
}

TEST_CASE("a manifest with an unknown key or a missing file is refused", "[dump]") {
  const std::string dir = fresh_dir("badmanifest");
  sample_dump().write(dir);
  auto manifest = rackstep::load_json_file(dir + "/manifest.json");
  manifest["tensors"][0]["stride"] = 1;
  rackstep::write_json_file_atomic(dir + "/manifest.json", manifest);
  CHECK_THROWS_AS(read_tensor_dump(dir), rackstep::UserError);
  fs::remove_all(dir);
  CHECK_THROWS_AS(read_tensor_dump(dir), rackstep::UserError);
}
