// The high-water mark of the bytes held in a set of allocations: the CUDA
// backend's peak device memory (exec/cuda/memory.h counts every allocation it
// makes through one of these; the profiler writes the mark as
// op_measurements.json's "peak_device_bytes"). Host code, no device needed.
//
//   HighWater hw;
//   if (hw.add(p, bytes)) { /* a new high-water mark: sample the device's used bytes */ }
//   hw.remove(p);                      // at the free; unknown keys count nothing
//   hw.peak();                         // bytes, the largest current() ever was
#pragma once

#include <cstddef>
#include <mutex>
#include <unordered_map>

namespace rackstep::exec {

class HighWater {
 public:
  // Counts `bytes` held under `key` (an allocation's address; a key already
  // held is replaced). True when current() passed the previous high-water mark.
  bool add(const void* key, size_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    auto [it, fresh] = live_.emplace(key, bytes);
    if (!fresh) {
      current_ -= it->second;
      it->second = bytes;
    }
    current_ += bytes;
    if (current_ <= peak_) return false;
    peak_ = current_;
    return true;
  }
  // Stops counting `key`; returns its bytes (0 for a key not held: nullptr, another allocator's).
  size_t remove(const void* key) {
    std::lock_guard<std::mutex> lock(mu_);
    const auto it = live_.find(key);
    if (it == live_.end()) return 0;
    const size_t bytes = it->second;
    current_ -= bytes;
    live_.erase(it);
    return bytes;
  }
  size_t current() const {
    std::lock_guard<std::mutex> lock(mu_);
    return current_;
  }
  size_t peak() const {
    std::lock_guard<std::mutex> lock(mu_);
    return peak_;
  }
  size_t allocations() const {
    std::lock_guard<std::mutex> lock(mu_);
    return live_.size();
  }
  // The mark restarts at what is held now (a later phase's own peak).
  void reset_peak() {
    std::lock_guard<std::mutex> lock(mu_);
    peak_ = current_;
  }

 private:
  mutable std::mutex mu_;
  std::unordered_map<const void*, size_t> live_;
  size_t current_ = 0, peak_ = 0;
};

}  // namespace rackstep::exec
