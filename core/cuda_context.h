// Per-process CUDA state: the current device and its compute stream. All compute of a rank is ordered on
// one stream; communication uses its own stream (dist/) ordered with events.
#pragma once

#include <cstddef>
#include <vector>

#include "core/device.h"

namespace tt {

// The compute stream of the device as an opaque handle (cudaStream_t); nullptr on CPU-only builds. Created
// at CUDA's default priority, like the communication and side streams.
void* compute_stream(int device);
// A second stream of the device for work that overlaps the compute stream (optimizer updates during
// backward); created on first use. nullptr on CPU-only builds.
void* side_stream(int device);
// A CUDA event for ordering two streams without blocking the host; created up front, so recording and
// waiting also work inside a CUDA graph capture (they become the graph's edges). Inert without CUDA.
class StreamEvent {
 public:
  explicit StreamEvent(int device = -1);  // on `device` (-1: the current one)
  ~StreamEvent();
  StreamEvent(const StreamEvent&) = delete;
  StreamEvent& operator=(const StreamEvent&) = delete;
  void record(void* stream);  // marks everything queued on `stream` so far
  void block(void* waiter);   // work queued on `waiter` from now on waits for the mark

 private:
  void* event_ = nullptr;
};
// Time points on a device's compute stream, for benchmarks: on CUDA, timing events recorded after the work
// queued so far (what torch.cuda.Event measures: GPU time, no host synchronisation in between); on the CPU,
// the host clock when mark() is called. Events are created on first use and reused after clear().
class DeviceClock {
 public:
  explicit DeviceClock(Device device);
  ~DeviceClock();
  DeviceClock(const DeviceClock&) = delete;
  DeviceClock& operator=(const DeviceClock&) = delete;
  size_t mark();                          // returns the index of the new point
  double ms_between(size_t a, size_t b);  // b's time minus a's; waits for both on CUDA
  void clear();                           // forgets the points (keeps the events)

 private:
  Device device_;
  std::vector<void*> events_;
  std::vector<double> host_ms_;
  size_t used_ = 0;
};
void set_current_device(int device);
int current_device();
// Waits for all work on the compute stream of `device`.
void synchronize(Device device);
// Leaves `sms` multiprocessors free of matmuls from now on (cuBLASLt's SM count target), so that
// communication kernels overlapping the compute stream can start at once; 0 restores the default.
// No effect without CUDA.
void set_matmul_sm_margin(int sms);
// Each new matmul problem times cuBLASLt's first `candidates` algorithms on its operands and keeps the
// fastest; 0 (the default) keeps the heuristic's first. Timing-dependent, so not bit-reproducible between
// processes. No effect without CUDA.
void set_matmul_autotune(int candidates);

}  // namespace tt
