#include "exec/cuda/op_timing.h"

#include <utility>
#include <vector>

#include "exec/cuda/check.h"
#include "sim/base/check.h"

namespace rackstep::exec::cuda {

namespace {

class EventTiming final : public OpTiming {
 public:
  explicit EventTiming(cudaStream_t stream) : stream_(stream) {}
  ~EventTiming() override {
    for (cudaEvent_t e : pool_) {
      const cudaError_t status = cudaEventDestroy(e);
      if (status != cudaErrorCudartUnloading) check_cuda(status, "cudaEventDestroy(e)", __FILE__, __LINE__);
    }
  }
  EventTiming(const EventTiming&) = delete;
  EventTiming& operator=(const EventTiming&) = delete;

  std::string clock() const override { return "cuda_events"; }

  // Event 0 marks the step's start; interval i is events (2i+1, 2i+2); the
  // last recorded event ends the step.
  void begin_step() override {
    used_ = 0;
    open_.clear();
    closed_.clear();
    record();
  }
  void begin() override { open_.push_back(record()); }
  void end() override {
    RS_CHECK(!open_.empty(), "OpTiming::end without begin");
    closed_.push_back({open_.back(), record()});
    open_.pop_back();
  }
  StepTiming end_step() override {
    RS_CHECK(open_.empty(), "OpTiming::end_step with an interval open");
    RS_CHECK(used_ > 0, "OpTiming::end_step without begin_step");
    const size_t last = record();
    RS_CUDA_CHECK(cudaEventSynchronize(pool_[last]));
    StepTiming s;
    s.intervals.reserve(closed_.size());
    for (const auto& [b, e] : closed_) s.intervals.push_back({since_start(b), elapsed(b, e)});
    s.span_s = since_start(last);
    return s;
  }

 private:
  size_t record() {
    if (used_ == pool_.size()) {  // grows to the largest step once, then reused
      cudaEvent_t e = nullptr;
      RS_CUDA_CHECK(cudaEventCreate(&e));
      pool_.push_back(e);
    }
    RS_CUDA_CHECK(cudaEventRecord(pool_[used_], stream_));
    return used_++;
  }
  double elapsed(size_t from, size_t to) const {
    float ms = 0;
    RS_CUDA_CHECK(cudaEventElapsedTime(&ms, pool_[from], pool_[to]));
    return 1e-3 * static_cast<double>(ms);
  }
  double since_start(size_t i) const { return elapsed(0, i); }

  cudaStream_t stream_;
  std::vector<cudaEvent_t> pool_;
  size_t used_ = 0;
  std::vector<size_t> open_;
  std::vector<std::pair<size_t, size_t>> closed_;
};

}  // namespace

std::unique_ptr<OpTiming> make_event_timing(cudaStream_t stream) { return std::make_unique<EventTiming>(stream); }

}  // namespace rackstep::exec::cuda
