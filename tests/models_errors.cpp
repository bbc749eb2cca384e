// Bad model files give one clear UserError: file, JSON path, expected, found.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "sim/base/check.h"
#include "sim/base/source_dir.h"
#include "sim/base/json_io.h"
#include "models/model.h"

using namespace rackstep;
using nlohmann::json;

namespace {

json hero() {
  return load_json_file(std::string(rackstep::source_dir()) + "/models/zoo/marin-535b-a23b.json");
}

// Parses `doc` and returns the error message (empty when it parsed).
std::string error_of(const json& doc) {
  try {
    models::parse_model(doc, "m.json");
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("the hero file parses", "[models][errors]") { CHECK(error_of(hero()).empty()); }

TEST_CASE("each impossible model is one line naming path, expected and found", "[models][errors]") {
  struct Case {
    const char* what;
    std::function<void(json&)> edit;
    const char* message;
  };
  const std::vector<Case> cases = {
      {"unknown key", [](json& j) { j["d_modle"] = 1; },
       "m.json: /d_modle: expected a known key, found unknown key \"d_modle\""},
      {"unknown nested key", [](json& j) { j["moe"]["topk"] = 8; },
       "m.json: /moe/topk: expected a known key, found unknown key \"topk\""},
      {"missing required key", [](json& j) { j.erase("vocab"); },
       "m.json: /vocab: expected a value (required key), found nothing"},
      {"wrong type", [](json& j) { j["layers"] = "48"; },
       "m.json: /layers: expected an integer, found string \"48\""},
      {"zero layers", [](json& j) { j["layers"] = 0; }, "m.json: /layers: expected a number > 0, found 0"},
      {"negative width", [](json& j) { j["d_model"] = -6144; },
       "m.json: /d_model: expected a number > 0, found -6144"},
      {"heads not divisible by kv heads", [](json& j) { j["attention"]["kv_heads"] = 10; },
       "m.json: /attention/kv_heads: expected a divisor of heads (48), found 10"},
      {"local kv above stored", [](json& j) { j["attention"]["local"]["kv_heads"] = 24; },
       "m.json: /attention/local/kv_heads: expected at most the stored kv_heads (12), found 24"},
      {"top-k above experts", [](json& j) { j["moe"]["top_k"] = 400; },
       "m.json: /moe/top_k: expected at most experts (384), found 400"},
      {"zero window", [](json& j) { j["attention"]["local"]["window"] = 0; },
       "m.json: /attention/local/window: expected a number > 0, found 0"},
      {"negative window", [](json& j) { j["attention"]["local"]["window"] = -5; },
       "m.json: /attention/local/window: expected a number > 0, found -5"},
      {"latent above d", [](json& j) { j["moe"]["latent"] = 8192; },
       "m.json: /moe/latent: expected at most d_model (6144), found 8192"},
      {"bad enum", [](json& j) { j["moe"]["router"] = "relu"; },
       "m.json: /moe/router: expected one of sigmoid, softmax, found \"relu\""},
      {"NaN-like float for an integer", [](json& j) { j["vocab"] = 1.5; },
       "m.json: /vocab: expected an integer, found 1.5"},
      {"rope fraction out of range", [](json& j) { j["attention"]["local"]["rope_fraction"] = 1.5; },
       "m.json: /attention/local/rope_fraction: expected a number <= 1, found 1.5"},
      {"two step rules", [](json& j) { j["recipe"]["steps"] = 10; },
       "m.json: /recipe: expected exactly one of steps, total_tokens, tokens_per_active_param, found 2 of them"},
      {"bad gated site", [](json& j) { j["norm"]["gated_sites"][0] = "pre_attn"; },
       "m.json: /norm/gated_sites/0: expected one of pre_attention, pre_mlp, embedding, final, found \"pre_attn\""},
  };
  for (const auto& c : cases) {
    INFO(c.what);
    json doc = hero();
    c.edit(doc);
    CHECK(error_of(doc) == c.message);
  }
}

TEST_CASE("files that are not JSON are reported with the byte offset", "[models][errors]") {
  CHECK_THROWS_WITH(load_json_file("/nonexistent/model.json"),
                    "/nonexistent/model.json: expected a readable JSON file, found no such file");
  const std::string path = "/tmp/rackstep_test_bad.json";
  write_text_file_atomic(path, "{\"name\": \"x\",\n \"vocab\": 12,, }");
  CHECK_THROWS_WITH(load_json_file(path), Catch::Contains("expected valid JSON, found a syntax error at byte"));
  write_text_file_atomic(path, "[1, 2]");
  CHECK_THROWS_WITH(models::load_model(path), path + ": /: expected an object, found array [1,2]");
}
