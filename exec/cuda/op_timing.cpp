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

  // Event 0 marks the step's start; each interval a (begin, end) pair of
  // pool indices; the last recorded event ends the step.
  void begin_step() override {
    used_ = 0;
    open_.clear();
    closed_.clear();
    record();
  }
  // Slots in begin order; end() closes the innermost open one.
  void begin() override { begin_on(stream_); }
  void end() override { end_on(stream_); }
  // Events of another stream (the collectives') time against the step's first
  // event too; they complete before the step's last, as the backend's stream
  // waits for the collectives before its optimizer step and next forward.
  void begin_on(void* queue) override {
    open_.push_back(closed_.size());
    closed_.push_back({record(static_cast<cudaStream_t>(queue)), 0});
  }
  void end_on(void* queue) override {
    RS_CHECK(!open_.empty(), "OpTiming::end without begin");
    closed_[open_.back()].second = record(static_cast<cudaStream_t>(queue));
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
  size_t record() { return record(stream_); }
  size_t record(cudaStream_t stream) {
    if (used_ == pool_.size()) {  // grows to the largest step once, then reused
      cudaEvent_t e = nullptr;
      RS_CUDA_CHECK(cudaEventCreate(&e));
      pool_.push_back(e);
    }
    RS_CUDA_CHECK(cudaEventRecord(pool_[used_], stream));
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
  std::vector<size_t> open_;                       // slots of closed_ still open, innermost last
  std::vector<std::pair<size_t, size_t>> closed_;  // per interval, in begin order: its events in pool_
};

}  // namespace

std::unique_ptr<OpTiming> make_event_timing(cudaStream_t stream) { return std::make_unique<EventTiming>(stream); }

}  // namespace rackstep::exec::cuda
