// Seeded fuzzing of every shipped JSON file through the readers that take user
// input: models (and their layer graph, parameter and FLOP counts), topologies
// (as clusters), layouts, scenarios and the calibration. Every mutated input
// must either load or be refused with a UserError; any other exception is a
// failure, printed with the seed and the input so it can be replayed. A slow
// input (over 2 s) fails too: input limits keep every reader fast.
//
// CI runs RACKSTEP_FUZZ_ITERATIONS (default 600) inputs, a few seconds. The long
// run (README, "Fuzzing"), under the sanitizer build:
//   RACKSTEP_FUZZ_ITERATIONS=1000000 RACKSTEP_FUZZ_SEED=7 ./build-asan/tests/test_fuzz
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <typeinfo>
#include <vector>

#include <nlohmann/json.hpp>

#include "sim/base/check.h"
#include "sim/base/json_io.h"
#include "models/layer_graph.h"
#include "models/model.h"
#include "sim/base/source_dir.h"
#include "sim/calibration.h"
#include "sim/layout.h"
#include "sim/scenario.h"
#include "tests/temp_dir.h"
#include "topologies/topology.h"

using namespace rackstep;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

enum class Kind { kModel, kTopology, kLayout, kScenario, kCalibration };

struct Seed {
  std::string path;
  Kind kind;
  std::string text;
};

std::vector<Seed> shipped_files() {
  const fs::path root = source_dir();
  std::vector<Seed> out;
  auto add_dir = [&](const char* dir, Kind kind) {
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(root / dir)) {
      if (e.path().extension() == ".json") files.push_back(e.path());
    }
    std::sort(files.begin(), files.end());
    for (const auto& f : files) {
      std::ifstream in(f);
      std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      out.push_back({f.string(), kind, text});
    }
  };
  add_dir("models/zoo", Kind::kModel);
  add_dir("topologies/zoo", Kind::kTopology);
  add_dir("sim/layouts", Kind::kLayout);
  add_dir("sim/scenarios", Kind::kScenario);
  out.push_back({(root / "sim/calibration.json").string(), Kind::kCalibration, ""});
  std::ifstream in(out.back().path);
  out.back().text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return out;
}

int64_t env_int(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  return v ? std::atoll(v) : fallback;
}

using Rng = std::mt19937_64;

size_t pick(Rng& rng, size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng); }

json extreme_value(Rng& rng) {
  static const std::vector<json> values = {
      0, -1, 1, 2, 3, 7, 1e308, -1e308, 1e-308, 4.9e-324, 0.5, -0.5, 2147483648.0, 9223372036854775807LL,
      -9223372036854775807LL, 4294967296LL, 100000, 1e9, 4e9, 1e12, 1e15, 1e18, 65536, 65537, 1024, 1e-9,
      "", "x", "nan", "inf", nullptr, true, false, json::array(), json::object(), json::array({1, 2, 3})};
  return values[pick(rng, values.size())];
}

// A random value node inside `doc` (a pointer into it), walking down a few levels.
json* random_node(json& doc, Rng& rng) {
  json* at = &doc;
  for (int depth = 0; depth < 6; ++depth) {
    if (at->is_object() && !at->empty() && pick(rng, 4) != 0) {
      auto it = at->begin();
      std::advance(it, static_cast<long>(pick(rng, at->size())));
      at = &it.value();
    } else if (at->is_array() && !at->empty() && pick(rng, 4) != 0) {
      at = &(*at)[pick(rng, at->size())];
    } else {
      break;
    }
  }
  return at;
}

// One structural mutation of a parsed document.
void mutate_tree(json& doc, Rng& rng) {
  json* node = random_node(doc, rng);
  switch (pick(rng, 8)) {
    case 0:
    case 1: *node = extreme_value(rng); break;
    case 2:
      if (node->is_number()) *node = node->get<double>() * static_cast<double>(1 << pick(rng, 20));
      else *node = extreme_value(rng);
      break;
    case 3:
      if (node->is_object() && !node->empty()) {
        auto it = node->begin();
        std::advance(it, static_cast<long>(pick(rng, node->size())));
        node->erase(it);
      }
      break;
    case 4:
      if (node->is_object()) (*node)["unknown_key_" + std::to_string(pick(rng, 100))] = extreme_value(rng);
      break;
    case 5:
      if (node->is_array() && !node->empty()) {
        const json first = (*node)[0];
        for (size_t i = pick(rng, 50); i > 0; --i) node->push_back(first);
      } else if (node->is_array()) {
        node->push_back(extreme_value(rng));
      }
      break;
    case 6: {  // nest the value deeper
      const size_t depth = 1 + pick(rng, 100);
      json v = *node;
      for (size_t i = 0; i < depth; ++i) v = json::array({v});
      *node = v;
      break;
    }
    default:
      // Off by a little, wrapping like the unsigned bits would (no signed overflow in the harness itself).
      if (node->is_number_integer()) {
        *node = static_cast<int64_t>(static_cast<uint64_t>(node->get<int64_t>()) + pick(rng, 5) - 2);
      }
      else if (node->is_number()) *node = -node->get<double>();
      else *node = extreme_value(rng);
  }
}

// One mutation of the text itself (syntax, overflow, nesting).
void mutate_text(std::string& text, Rng& rng) {
  if (text.empty()) text = "{";
  const size_t at = pick(rng, text.size());
  switch (pick(rng, 6)) {
    case 0: text.resize(at); break;
    case 1: text[at] = static_cast<char>(pick(rng, 256)); break;
    case 2: text.insert(at, "1e400"); break;
    case 3: text.insert(at, std::string(1 + pick(rng, 200000), '[')); break;
    case 4: text.insert(at, "{\"a\":" + std::string(pick(rng, 3000), '[')); break;
    default: text.insert(at, std::string(1 + pick(rng, 8), static_cast<char>(pick(rng, 256)))); break;
  }
}

// Loads `text` as `kind`; "" when it loaded or was refused with a UserError,
// otherwise what went wrong.
std::string try_load(const std::string& text, Kind kind, const std::string& scratch) {
  try {
    if (kind == Kind::kTopology) {  // clusters load from a file (system references resolve beside it)
      {
        std::ofstream out(scratch, std::ios::binary | std::ios::trunc);
        out << text;
      }
      const topologies::Cluster c = topologies::load_cluster(scratch);
      (void)c.gpus();
      return "";
    }
    const json doc = parse_json_text(text, "fuzz.json");
    switch (kind) {
      case Kind::kModel: {
        const models::LayerGraph g = models::build_layer_graph(models::parse_model(doc, "fuzz.json"));
        (void)models::count_params(g);
        (void)models::count_flops(g, g.model.seq_len, models::FlopConvention::kMarin);
        break;
      }
      case Kind::kLayout: (void)sim::parse_layout(doc, "fuzz.json"); break;
      case Kind::kScenario: (void)sim::parse_scenario(doc, "fuzz.json"); break;
      case Kind::kCalibration: (void)sim::parse_calibration(doc, "fuzz.json"); break;
      case Kind::kTopology: break;
    }
  } catch (const UserError&) {
    return "";
  } catch (const std::exception& e) {
    return std::string("uncaught ") + typeid(e).name() + ": " + e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("every mutated shipped JSON file loads or is refused with a UserError", "[fuzz]") {
  const std::vector<Seed> seeds = shipped_files();
  REQUIRE(seeds.size() >= 20);
  const int64_t iterations = env_int("RACKSTEP_FUZZ_ITERATIONS", 600);
  const uint64_t seed = static_cast<uint64_t>(env_int("RACKSTEP_FUZZ_SEED", 1));
  TempDir dir("fuzz", "json");
  // Cluster files name their system file relative to themselves: fuzz inputs sit beside copies of the zoo.
  fs::create_directories(dir.path / "topologies");
  for (const auto& e : fs::directory_iterator(fs::path(source_dir()) / "topologies/zoo")) {
    fs::copy_file(e.path(), dir.path / "topologies" / e.path().filename());
  }
  const std::string scratch = (dir.path / "topologies" / "fuzz-input.json").string();
  Rng rng(seed);
  int64_t loaded_clean = 0, failures = 0;
  const auto t_start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < iterations; ++i) {
    const Seed& s = seeds[pick(rng, seeds.size())];
    std::string text;
    if (pick(rng, 4) == 0) {
      text = s.text;
      mutate_text(text, rng);
    } else {
      json doc = json::parse(s.text);
      for (size_t m = 1 + pick(rng, 3); m > 0; --m) mutate_tree(doc, rng);
      text = doc.dump();
    }
    const auto t0 = std::chrono::steady_clock::now();
    const std::string problem = try_load(text, s.kind, scratch);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (problem.empty() && secs < 2.0) {
      ++loaded_clean;
      continue;
    }
    ++failures;
    const std::string saved = dir.path.parent_path() / ("rackstep-fuzz-failure-" + std::to_string(i) + ".json");
    std::ofstream(saved) << text;
    FAIL_CHECK("input " << i << " (seed " << seed << ", from " << s.path << ", kept in " << saved << "): "
                        << (problem.empty() ? "took " + std::to_string(secs) + " s" : problem));
  }
  const double total_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  std::printf("fuzz: %lld inputs from %zu shipped files, seed %llu, %.1f s, %lld failures\n",
              static_cast<long long>(iterations), seeds.size(), static_cast<unsigned long long>(seed), total_s,
              static_cast<long long>(failures));
  CHECK(failures == 0);
  CHECK(loaded_clean == iterations);
}
