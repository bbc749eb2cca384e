#include "sim/base/file_io.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "sim/base/check.h"

namespace rackstep {

namespace fs = std::filesystem;

namespace {

// Writes all bytes, retrying short writes; false with errno set on failure
// (a write of 0 bytes counts as ENOSPC: nothing more fits).
bool write_all(int fd, const void* data, size_t bytes) {
  const auto* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return false;
    if (n == 0) {
      errno = ENOSPC;
      return false;
    }
    p += n;
    bytes -= static_cast<size_t>(n);
  }
  return true;
}

std::string errno_text(int e) { return std::strerror(e); }

std::string mib(uint64_t bytes) { return std::to_string(bytes >> 20) + " MiB"; }

void fsync_dir(const fs::path& dir) {
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return;  // durability of the rename is best effort where the directory cannot be opened
  ::fsync(dfd);
  ::close(dfd);
}

// Devices, FIFOs, sockets: open the existing node and write in place.
void write_in_place(const std::string& path, const std::string& target, const std::vector<OutputPiece>& pieces) {
  const int fd = ::open(target.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) throw UserError(path, "", "a writable output", errno_text(errno));
  for (const OutputPiece& piece : pieces) {
    if (!write_all(fd, piece.data, piece.bytes)) {
      const int e = errno;
      ::close(fd);
      throw UserError(path, "", "the output written in full", "write failed: " + errno_text(e));
    }
  }
  ::close(fd);
}

// The descriptor a path names (/dev/stdout, /dev/fd/N, /proc/self/fd/N), -1 for
// other paths. Written through the descriptor itself: `-o /dev/stdout >> log`
// appends where the shell put it, never replaced by a rename or reopened at 0.
int named_descriptor(const std::string& path) {
  if (path == "/dev/stdout") return 1;
  if (path == "/dev/stderr") return 2;
  for (const char* prefix : {"/dev/fd/", "/proc/self/fd/"}) {
    const std::string p = prefix;
    if (path.rfind(p, 0) != 0 || path.size() == p.size()) continue;
    const std::string digits = path.substr(p.size());
    if (digits.size() > 6 || digits.find_first_not_of("0123456789") != std::string::npos) return -1;
    return std::stoi(digits);
  }
  return -1;
}

void write_to_descriptor(const std::string& path, int fd, const std::vector<OutputPiece>& pieces) {
  if (fd == 1) std::fflush(stdout);  // keep the order of what the command printed before
  for (const OutputPiece& piece : pieces) {
    if (!write_all(fd, piece.data, piece.bytes)) {
      throw UserError(path, "", "the output written in full", "write failed: " + errno_text(errno));
    }
  }
}

void write_atomic(const std::string& path, const std::string& target, const std::vector<OutputPiece>& pieces) {
  const fs::path t(target);
  const fs::path dir = t.has_parent_path() ? t.parent_path() : fs::path(".");
  const std::string tmp = target + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw UserError(path, "", "a writable location", "cannot create " + tmp + ": " + errno_text(errno));
  auto fail = [&](const std::string& what, int e) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw UserError(path, "", "the file written in full", what + ": " + errno_text(e));
  };
  for (const OutputPiece& piece : pieces) {
    if (!write_all(fd, piece.data, piece.bytes)) fail("write failed", errno);
  }
  if (::fsync(fd) != 0) fail("fsync failed", errno);
  if (::close(fd) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    throw UserError(path, "", "the file written in full", "close failed: " + errno_text(e));
  }
  if (::rename(tmp.c_str(), target.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    throw UserError(path, "", "a rename of the finished temp file", errno_text(e));
  }
  fsync_dir(dir);
}

}  // namespace

std::string resolve_output_path(const std::string& path) {
  if (path.empty()) throw UserError("<output>", "", "a file name", "an empty path");
  fs::path p(path);
  for (int hops = 0; hops <= 40; ++hops) {
    struct stat st;
    if (::lstat(p.c_str(), &st) != 0) {
      if (errno == ENOENT) return p.string();  // a new file (its directory is checked when it is created)
      throw UserError(path, "", "a writable output path", errno_text(errno));
    }
    if (!S_ISLNK(st.st_mode)) return p.string();
    std::error_code ec;
    const fs::path to = fs::read_symlink(p, ec);
    if (ec) throw UserError(path, "", "a readable symbolic link", ec.message());
    p = to.is_absolute() ? to : p.parent_path() / to;
  }
  throw UserError(path, "", "a path without a symbolic-link loop", "more than 40 links");
}

void write_output_file(const std::string& path, const std::vector<OutputPiece>& pieces) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    // A new file, or a dangling link: create it where the link points.
    if (errno == ENOENT) return write_atomic(path, resolve_output_path(path), pieces);
    throw UserError(path, "", "a writable output path", errno_text(errno));
  }
  if (S_ISDIR(st.st_mode)) throw UserError(path, "", "a file to write", "a directory");
  // The kernel follows the path itself, /dev/stdout's /proc links included.
  if (const int fd = named_descriptor(path); fd >= 0) return write_to_descriptor(path, fd, pieces);
  if (!S_ISREG(st.st_mode)) return write_in_place(path, path, pieces);
  char* real = ::realpath(path.c_str(), nullptr);
  if (real == nullptr) throw UserError(path, "", "a resolvable output path", errno_text(errno));
  const std::string target = real;
  std::free(real);
  write_atomic(path, target, pieces);
}

std::string read_input_file(const std::string& path, uint64_t max_bytes, const std::string& what) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int e = errno;
    throw UserError(path, "", what, e == ENOENT ? "no such file" : "a file that cannot be opened: " + errno_text(e));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    throw UserError(path, "", what, errno_text(e));
  }
  if (S_ISDIR(st.st_mode)) {
    ::close(fd);
    throw UserError(path, "", what, "a directory");
  }
  if (S_ISREG(st.st_mode) && static_cast<uint64_t>(st.st_size) > max_bytes) {
    ::close(fd);
    throw UserError(path, "", what + " of at most " + mib(max_bytes),
                    std::to_string(st.st_size >> 20) + " MiB");
  }
  std::string out;
  if (S_ISREG(st.st_mode)) out.reserve(static_cast<size_t>(st.st_size));
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int e = errno;
      ::close(fd);
      throw UserError(path, "", what, "a read error: " + errno_text(e));
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
    if (out.size() > max_bytes) {
      ::close(fd);
      throw UserError(path, "", what + " of at most " + mib(max_bytes), "more (an endless device or pipe?)");
    }
  }
  ::close(fd);
  return out;
}

AppendFile::AppendFile(std::string path) : path_(std::move(path)) {
  // O_APPEND through the path: the kernel follows symlinks and keeps devices.
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd_ < 0) throw UserError(path_, "", "a file open for appending", errno_text(errno));
}

AppendFile::~AppendFile() {
  if (fd_ >= 0) ::close(fd_);
}

void AppendFile::append(const std::string& text) {
  RS_CHECK(fd_ >= 0, "append to a closed file");
  if (!write_all(fd_, text.data(), text.size())) {
    throw UserError(path_, "", "the line appended in full (" + std::to_string(text.size()) + " bytes)",
                    "write failed: " + errno_text(errno));
  }
}

std::vector<std::string> remove_stale_temp_files(const std::string& dir) {
  std::vector<std::string> removed;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    // NAME.tmp (older writers) or NAME.tmp.PID
    const size_t at = name.rfind(".tmp");
    if (at == std::string::npos || at == 0) continue;
    const std::string tail = name.substr(at + 4);
    const bool has_pid = tail.size() >= 2 && tail.size() <= 10 && tail[0] == '.' &&
                         tail.find_first_not_of("0123456789", 1) == std::string::npos;
    if (!tail.empty() && !has_pid) continue;
    if (has_pid) {
      const long pid = std::stol(tail.substr(1));
      if (pid == ::getpid()) continue;
      if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;  // its writer may still run
    }
    std::error_code rm;
    if (e.is_regular_file(rm) && fs::remove(e.path(), rm)) removed.push_back(name);
  }
  return removed;
}

}  // namespace rackstep
