// A fresh temporary directory per test, removed when it goes out of scope.
//
//   TempDir dir("ckpt", "resume");       // /tmp/rackstep-ckpt-resume-<pid>
//   std::string f = dir.file("a.bin");
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>

struct TempDir {
  std::filesystem::path path;
  TempDir(const std::string& prefix, const std::string& name)
      : path(std::filesystem::temp_directory_path() /
             ("rackstep-" + prefix + "-" + name + "-" + std::to_string(::getpid()))) {
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  std::string file(const std::string& n) const { return (path / n).string(); }
};
