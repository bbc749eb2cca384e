// Issue 17's failures, one test each where the library can show them: output
// paths (symlinks, FIFOs, devices, directories, loops), checked writes
// (/dev/full), stale temp files, bounded input (size, /dev/zero, nesting,
// 1e400, over-long names), errors that never serialise a whole value, and
// resume's fallback to the newest valid checkpoint.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <future>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "exec/checkpoint.h"
#include "exec/run_identity.h"
#include "sim/base/check.h"
#include "sim/base/file_io.h"
#include "sim/base/json_io.h"
#include "tests/temp_dir.h"

using namespace rackstep;
namespace fs = std::filesystem;

namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

// The UserError message of f(), "" when it did not throw one.
template <typename F>
std::string user_error(F&& f) {
  try {
    f();
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("output to a symlink writes its target and keeps the link", "[reliability]") {
  TempDir dir("rel", "symlink");
  const std::string target = dir.file("target.json"), link = dir.file("link.json");
  write(target, "old");
  fs::create_symlink("target.json", link);
  write_text_file_atomic(link, "new text");
  CHECK(fs::is_symlink(link));
  CHECK(slurp(target) == "new text");
  // A dangling link is created where it points.
  const std::string dangling = dir.file("dangling.json");
  fs::create_symlink("sub-target.json", dangling);
  write_text_file_atomic(dangling, "made");
  CHECK(fs::is_symlink(dangling));
  CHECK(slurp(dir.file("sub-target.json")) == "made");
}

TEST_CASE("output to /dev/null keeps the device; /dev/full is a clear write error", "[reliability]") {
  write_text_file_atomic("/dev/null", std::string(100000, 'x'));
  struct stat st;
  REQUIRE(::stat("/dev/null", &st) == 0);
  CHECK(S_ISCHR(st.st_mode));
  if (::access("/dev/full", W_OK) != 0) return;
  const std::string e = user_error([] { write_text_file_atomic("/dev/full", "x"); });
  CHECK(e.find("/dev/full") != std::string::npos);
  CHECK(e.find("No space left on device") != std::string::npos);
  REQUIRE(::stat("/dev/full", &st) == 0);
  CHECK(S_ISCHR(st.st_mode));
}

TEST_CASE("output to a FIFO reaches its reader and the FIFO stays", "[reliability]") {
  TempDir dir("rel", "fifo");
  const std::string fifo = dir.file("pipe");
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  auto reader = std::async(std::launch::async, [&] { return slurp(fifo); });
  write_text_file_atomic(fifo, "through the pipe");
  CHECK(reader.get() == "through the pipe");
  struct stat st;
  REQUIRE(::stat(fifo.c_str(), &st) == 0);
  CHECK(S_ISFIFO(st.st_mode));
}

TEST_CASE("output to /dev/fd/N writes through the descriptor, appending where it stands", "[reliability]") {
  TempDir dir("rel", "fd");
  const std::string log = dir.file("log.txt");
  write(log, "before;");
  const int fd = ::open(log.c_str(), O_WRONLY | O_APPEND);
  REQUIRE(fd >= 0);
  write_text_file_atomic("/dev/fd/" + std::to_string(fd), "after");
  ::close(fd);
  CHECK(slurp(log) == "before;after");
}

TEST_CASE("bad output paths are one UserError each", "[reliability]") {
  TempDir dir("rel", "badout");
  CHECK(user_error([&] { write_text_file_atomic(dir.path.string(), "x"); }).find("a directory") != std::string::npos);
  fs::create_symlink("loop-b", dir.file("loop-a"));
  fs::create_symlink("loop-a", dir.file("loop-b"));
  CHECK(!user_error([&] { write_text_file_atomic(dir.file("loop-a"), "x"); }).empty());
  const std::string long_name = dir.file(std::string(300, 'n'));
  CHECK(!user_error([&] { write_text_file_atomic(long_name, "x"); }).empty());
  CHECK(!user_error([&] { write_text_file_atomic(dir.file("no/such/dir/x.json"), "x"); }).empty());
  // Nothing left behind by the failed writes.
  for (const auto& e : fs::directory_iterator(dir.path)) CHECK(e.path().filename().string().find(".tmp") == std::string::npos);
}

TEST_CASE("a log append on a full device fails at once with file and reason", "[reliability]") {
  if (::access("/dev/full", W_OK) != 0) return;
  AppendFile log("/dev/full");
  const std::string e = user_error([&] { log.append("{\"step\": 1}\n"); });
  CHECK(e.find("/dev/full") != std::string::npos);
  CHECK(e.find("No space left on device") != std::string::npos);
}

TEST_CASE("stale temp files of dead writers are removed, live ones kept", "[reliability]") {
  TempDir dir("rel", "stale");
  // A pid that is not running: a child that has exited and been reaped.
  const pid_t dead = ::fork();
  if (dead == 0) ::_exit(0);
  int status = 0;
  ::waitpid(dead, &status, 0);
  const std::string stale = "ckpt-00000010.rsck.tmp." + std::to_string(dead);
  const std::string mine = "ckpt-00000020.rsck.tmp." + std::to_string(::getpid());
  write(dir.file(stale), "half a checkpoint");
  write(dir.file(mine), "being written");
  write(dir.file("run.json.tmp"), "{");
  write(dir.file("log.jsonl"), "{}\n");
  const std::vector<std::string> removed = remove_stale_temp_files(dir.path.string());
  CHECK(removed.size() == 2);
  CHECK(!fs::exists(dir.file(stale)));
  CHECK(!fs::exists(dir.file("run.json.tmp")));
  CHECK(fs::exists(dir.file(mine)));
  CHECK(fs::exists(dir.file("log.jsonl")));
}

TEST_CASE("input files are bounded: size, endless devices, nesting, overflow, names", "[reliability]") {
  TempDir dir("rel", "input");
  // /dev/zero is refused after the limit, not read forever.
  const std::string zero = user_error([] { load_json_file("/dev/zero"); });
  CHECK(zero.find("/dev/zero") != std::string::npos);
  CHECK(zero.find("at most 64 MiB") != std::string::npos);
  // A regular file over the limit is refused before reading.
  {
    const std::string big = dir.file("big.json");
    std::ofstream out(big);
    out.seekp(static_cast<std::streamoff>(kMaxJsonInputBytes) + 10);
    out << ' ';
  }
  CHECK(user_error([&] { load_json_file(dir.file("big.json")); }).find("at most 64 MiB") != std::string::npos);
  // Nested 100,000 deep: refused, no stack overflow.
  write(dir.file("deep.json"), std::string(100000, '[') + std::string(100000, ']'));
  const std::string deep = user_error([&] { load_json_file(dir.file("deep.json")); });
  CHECK(deep.find("deep.json") != std::string::npos);
  CHECK(deep.find("nested at most 64") != std::string::npos);
  // 1e400 names the file.
  write(dir.file("overflow.json"), "{\"layers\": 1e400}");
  const std::string overflow = user_error([&] { load_json_file(dir.file("overflow.json")); });
  CHECK(overflow.find("overflow.json") != std::string::npos);
  CHECK(overflow.find("double range") != std::string::npos);
  // Over-long names and loops are UserErrors, not filesystem_error.
  CHECK(!user_error([&] { load_json_file(dir.file(std::string(5000, 'a'))); }).empty());
  fs::create_symlink("l2", dir.file("l1"));
  fs::create_symlink("l1", dir.file("l2"));
  CHECK(!user_error([&] { load_json_file(dir.file("l1")); }).empty());
  CHECK(user_error([&] { load_json_file(dir.path.string()); }).find("a directory") != std::string::npos);
}

TEST_CASE("error messages describe a value without serialising it", "[reliability]") {
  // Deep enough to overflow dump()'s recursion (nlohmann's own parser and destructor are iterative).
  const nlohmann::json doc =
      nlohmann::json::parse("{\"layers\": " + std::string(200000, '[') + std::string(200000, ']') + "}");
  CHECK(describe_json(doc["layers"]) == "array [[[[[...]]]]]");
  CHECK(describe_json(nlohmann::json(std::string(1000000, 'x'))).size() < 60);
  const std::string e = user_error([&] {
    JsonReader r(doc, "m.json");
    r.integer("layers");
  });
  CHECK(e == "m.json: /layers: expected an integer, found array [[[[[...]]]]]");
}

TEST_CASE("resume falls back to the newest valid checkpoint, with a note", "[reliability]") {
  using namespace rackstep::exec;
  TempDir dir("rel", "fallback");
  auto layout = std::make_shared<ArenaLayout>(std::vector<TensorSpec>{{"w", {4, 4}, OptGroup::kAdam}});
  Arena params(layout);
  OptimizerState opt = init_optimizer_state(params);
  CheckpointMeta meta;
  meta.identity = R"({"dataset":{"digest":"abc"}})";
  for (int64_t step : {10, 20, 30}) {
    meta.step = step;
    save_checkpoint(dir.file("ckpt-000000" + std::to_string(step) + ".rsck"), params, opt, meta);
  }
  // The newest is corrupt (one flipped byte), the one before truncated.
  std::string newest = slurp(dir.file("ckpt-00000030.rsck"));
  newest[100] ^= 1;
  write(dir.file("ckpt-00000030.rsck"), newest);
  const std::string middle = slurp(dir.file("ckpt-00000020.rsck"));
  write(dir.file("ckpt-00000020.rsck"), middle.substr(0, middle.size() / 2));
  std::vector<std::string> notes;
  const std::string chosen =
      newest_valid_checkpoint(dir.path.string(), [&](const std::string& n) { notes.push_back(n); });
  CHECK(fs::path(chosen).filename() == "ckpt-00000010.rsck");
  REQUIRE(notes.size() == 3);
  CHECK(notes[0].find("ckpt-00000030.rsck") != std::string::npos);
  CHECK(notes[0].find("checksum") != std::string::npos);
  CHECK(notes[1].find("truncated") != std::string::npos);
  CHECK(notes[2].find("ckpt-00000010.rsck") != std::string::npos);
  // The identity section comes back.
  CheckpointMeta back;
  load_checkpoint(chosen, params, opt, back);
  CHECK(back.identity == meta.identity);
  // None valid: one error listing why.
  fs::remove(chosen);
  const std::string e = user_error([&] { newest_valid_checkpoint(dir.path.string(), [](const std::string&) {}); });
  CHECK(e.find("none of 2 is usable") != std::string::npos);
}

TEST_CASE("identity differences name what differs", "[reliability]") {
  using namespace rackstep::exec;
  const nlohmann::json saved = run_identity({{"digest", "aaaa"}, {"train_shards", 2}, {"tokenizer", "byte"}},
                                            {{"batch", 4}, {"seq", 64}});
  CHECK(identity_differences(saved, saved, "d").empty());
  nlohmann::json other = saved;
  other["dataset"]["digest"] = "bbbb";
  const auto diffs = identity_differences(saved, other, "data/other");
  REQUIRE(diffs.size() == 1);
  CHECK(diffs[0].find("\"aaaa\" (checkpoint) vs \"bbbb\" (this run)") != std::string::npos);
  CHECK(diffs[0].find("data/other") != std::string::npos);
  other = saved;
  other["layout"]["seq"] = 128;
  const auto layout_diffs = identity_differences(saved, other, "d");
  REQUIRE(layout_diffs.size() == 1);
  CHECK(layout_diffs[0].rfind("layout seq 64 (checkpoint) vs 128", 0) == 0);
}
