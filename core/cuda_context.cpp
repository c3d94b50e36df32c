#include "core/cuda_context.h"

#include <chrono>
#include <cstdlib>
#include <mutex>
#include <string>

#include "base/error.h"
#ifdef TT_WITH_CUDA
#include "kernels/cuda/cuda_kernels.h"
#endif

namespace tt {

namespace {
#ifdef TT_WITH_CUDA
constexpr int kMaxDevices = 16;
cudaStream_t g_streams[kMaxDevices] = {};
cudaStream_t g_side_streams[kMaxDevices] = {};
std::mutex g_stream_mutex;
#endif
thread_local int g_device = 0;
}  // namespace

Device Device::parse(const std::string& text) {
  if (text == "cpu") return cpu();
  if (text == "cuda") return cuda(0);
  if (text.rfind("cuda:", 0) == 0) {
    try {
      size_t used = 0;
      const int index = std::stoi(text.substr(5), &used);
      if (used == text.size() - 5 && index >= 0) return cuda(index);
    } catch (const std::exception&) {
    }
  }
  throw Error("unknown device '" + text + "' (expected cpu, cuda or cuda:N)");
}

bool cuda_available() {
#ifdef TT_WITH_CUDA
  return cuda::device_count() > 0;
#else
  return false;
#endif
}

void set_current_device(int device) {
#ifdef TT_WITH_CUDA
  if (device != g_device) TT_CUDA_CHECK(cudaSetDevice(device));
  g_device = device;
#else
  g_device = device;
#endif
}

int current_device() {
  return g_device;
}

#ifdef TT_WITH_CUDA
namespace {
// The stream of `device` in `table`, created (non-blocking, on that device, at CUDA's default priority) on
// first use. Every stream has the default priority: a compute stream at the greatest priority measured no
// faster (DDP on 2 x H200, one H100's step-fused).
cudaStream_t lazy_stream(cudaStream_t (&table)[kMaxDevices], int device) {
  std::lock_guard<std::mutex> lock(g_stream_mutex);
  TT_CHECK(device >= 0 && device < kMaxDevices, "bad CUDA device index " + std::to_string(device));
  if (!table[device]) {
    int previous = 0;
    TT_CUDA_CHECK(cudaGetDevice(&previous));
    TT_CUDA_CHECK(cudaSetDevice(device));
    const cudaError_t created = cudaStreamCreateWithFlags(&table[device], cudaStreamNonBlocking);
    TT_CUDA_CHECK(cudaSetDevice(previous));
    TT_CUDA_CHECK(created);
  }
  return table[device];
}
}  // namespace
#endif

void* compute_stream(int device) {
#ifdef TT_WITH_CUDA
  return lazy_stream(g_streams, device);
#else
  (void)device;
  return nullptr;
#endif
}

void* side_stream(int device) {
#ifdef TT_WITH_CUDA
  return lazy_stream(g_side_streams, device);
#else
  (void)device;
  return nullptr;
#endif
}

#ifdef TT_WITH_CUDA
namespace {
// An event of `device` (-1: the current one; an event belongs to the device current when it is created),
// leaving the current device as it was.
cudaEvent_t create_event(int device, unsigned flags) {
  int previous = 0;
  TT_CUDA_CHECK(cudaGetDevice(&previous));
  if (device >= 0) TT_CUDA_CHECK(cudaSetDevice(device));
  cudaEvent_t event = nullptr;
  const cudaError_t created = cudaEventCreateWithFlags(&event, flags);
  if (device >= 0) TT_CUDA_CHECK(cudaSetDevice(previous));
  TT_CUDA_CHECK(created);
  return event;
}
}  // namespace
#endif

StreamEvent::StreamEvent(int device) {
#ifdef TT_WITH_CUDA
  event_ = create_event(device, cudaEventDisableTiming);
#else
  (void)device;
#endif
}

StreamEvent::~StreamEvent() {
#ifdef TT_WITH_CUDA
  if (event_) cudaEventDestroy(static_cast<cudaEvent_t>(event_));
#endif
}

void StreamEvent::record(void* stream) {
#ifdef TT_WITH_CUDA
  TT_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(event_), static_cast<cudaStream_t>(stream)));
#else
  (void)stream;
#endif
}

void StreamEvent::block(void* waiter) {
#ifdef TT_WITH_CUDA
  TT_CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(waiter), static_cast<cudaEvent_t>(event_), 0));
#else
  (void)waiter;
#endif
}

void synchronize(Device device) {
#ifdef TT_WITH_CUDA
  if (device.is_cuda()) {
    TT_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(compute_stream(device.index))));
  }
#endif
}

DeviceClock::DeviceClock(Device device) : device_(device) {}

DeviceClock::~DeviceClock() {
#ifdef TT_WITH_CUDA
  for (void* e : events_) cudaEventDestroy(static_cast<cudaEvent_t>(e));
#endif
}

size_t DeviceClock::mark() {
#ifdef TT_WITH_CUDA
  if (device_.is_cuda()) {
    if (used_ == events_.size()) events_.push_back(create_event(device_.index, cudaEventDefault));
    TT_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(events_[used_]),
                                  static_cast<cudaStream_t>(compute_stream(device_.index))));
    return used_++;
  }
#endif
  if (used_ == host_ms_.size()) host_ms_.push_back(0);
  host_ms_[used_] =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
  return used_++;
}

double DeviceClock::ms_between(size_t a, size_t b) {
  TT_ASSERT(a < used_ && b < used_, "DeviceClock: no such time point");
#ifdef TT_WITH_CUDA
  if (device_.is_cuda()) {
    TT_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(events_[a])));
    TT_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(events_[b])));
    float ms = 0;
    TT_CUDA_CHECK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(events_[a]),
                                       static_cast<cudaEvent_t>(events_[b])));
    return ms;
  }
#endif
  return host_ms_[b] - host_ms_[a];
}

void DeviceClock::clear() {
  used_ = 0;
}

void set_matmul_sm_margin(int sms) {
  TT_CHECK(sms >= 0, "the matmul SM margin must be >= 0, got " + std::to_string(sms));
#ifdef TT_WITH_CUDA
  cuda::set_gemm_sm_margin(sms);
#endif
}

void set_matmul_autotune(int candidates) {
  TT_CHECK(candidates >= 0,
           "the matmul autotuning candidate count must be >= 0, got " + std::to_string(candidates));
#ifdef TT_WITH_CUDA
  cuda::set_gemm_autotune(candidates);
#endif
}

}  // namespace tt
