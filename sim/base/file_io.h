// Reading inputs and writing outputs so that no input can exhaust the machine
// and no output replaces what it should not.
//
// Outputs (write_output_file): the path's symlinks are followed, so `-o link`
// writes where the link points and the link stays. A regular file (or a new
// one) is replaced atomically: a temp file `<target>.tmp.<pid>` beside it,
// fsync, rename, fsync of the directory; a crash leaves the old file. A
// device, FIFO or socket (`-o /dev/stdout`, `-o /dev/null`, a named pipe) is
// written in place: renaming over it would replace the device node or leave
// the pipe's reader with nothing. A directory is refused. Every write is
// checked: a failed or short write (a full disk, /dev/full) is a UserError
// naming the file and the reason, and the temp file is removed.
//
// Inputs (read_input_file): at most `max_bytes`, checked before reading
// (regular files) or while reading (devices, pipes: /dev/zero is refused after
// max_bytes, not read forever). Missing files, directories, over-long names and
// symlink loops are UserErrors naming the file, never filesystem_error.
//
//   write_output_file("trace.json", {{text.data(), text.size()}});
//   std::string bytes = read_input_file("model.json", kMaxJsonInputBytes, "a JSON file");
//   AppendFile log("run/log.jsonl");  log.append(line + "\n");  // throws on a short write
//   remove_stale_temp_files("run");   // *.tmp.<pid> of processes that no longer run
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace rackstep {

// Every JSON input (model, topology, layout, scenario, calibration) is at most this big.
constexpr uint64_t kMaxJsonInputBytes = 64ull << 20;

struct OutputPiece {
  const void* data;
  size_t bytes;
};

// The file a write to `path` lands in: symlinks followed (at most 40, then a
// UserError: a loop). A dangling link resolves to where it points.
std::string resolve_output_path(const std::string& path);

// Writes the pieces one after another to `path` (see the header comment).
void write_output_file(const std::string& path, const std::vector<OutputPiece>& pieces);

// The whole file, at most max_bytes; `what` names the expected content in errors.
std::string read_input_file(const std::string& path, uint64_t max_bytes, const std::string& what);

// An append-only file (a log) whose every write is checked and flushed to the
// kernel at once: a failed or short write throws a UserError naming the file
// and the reason the moment it happens, so no line is lost silently.
class AppendFile {
 public:
  explicit AppendFile(std::string path);
  ~AppendFile();
  AppendFile(const AppendFile&) = delete;
  AppendFile& operator=(const AppendFile&) = delete;
  void append(const std::string& text);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
};

// Removes `dir`/*.tmp.<pid> (and the older `*.tmp`) left by writers that were
// killed: only when no process <pid> runs on this machine. Returns the names removed.
std::vector<std::string> remove_stale_temp_files(const std::string& dir);

}  // namespace rackstep
