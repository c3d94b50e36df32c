#include "dist/collective_timeout.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "base/error.h"
#include "dist/runtime.h"

namespace tt::dist {

namespace {

constexpr auto kWatchdogPeriod = std::chrono::milliseconds(100);
// The most one period of the watchdog may add to a wait (see run()).
constexpr double kMaxCountedGapS = 1.0;

// The wait in progress: its start (steady clock, ns; 0: none) and the collective's name. Lock-free, since
// every collective marks its wait.
std::atomic<int64_t> wait_since_ns{0};
std::atomic<const char*> wait_what{nullptr};

// set_collective_timeout's value (0: not set) and the name it was set by.
std::atomic<double> chosen_timeout_s{0.0};
std::mutex chosen_source_mutex;
std::string chosen_source;

int64_t now_ns() {
  const auto since_epoch = std::chrono::steady_clock::now().time_since_epoch();
  return std::chrono::duration_cast<std::chrono::nanoseconds>(since_epoch).count();
}

double timeout_from_env(const char* variable, double fallback) {
  const char* text = std::getenv(variable);
  if (text == nullptr || *text == '\0') return fallback;
  char* end = nullptr;
  const double seconds = std::strtod(text, &end);
  TT_CHECK(end != text && *end == '\0' && seconds > 0,
           std::string(variable) + " must be a positive number of seconds, got '" + text + "'");
  return seconds;
}

CollectiveTimeout timeout(const char* variable, double fallback) {
  const double chosen = chosen_timeout_s.load();
  if (chosen > 0) {
    std::lock_guard<std::mutex> lock(chosen_source_mutex);
    return {chosen, chosen_source};
  }
  return {timeout_from_env(variable, fallback), variable};
}

std::string format_seconds(double seconds) {
  char text[32];
  std::snprintf(text, sizeof(text), "%g", seconds);
  return text;
}

}  // namespace

void set_collective_timeout(double seconds, const std::string& source) {
  TT_CHECK(seconds > 0, "the collective timeout must be a positive number of seconds, got " +
                            format_seconds(seconds) + " (" + source + ")");
  {
    std::lock_guard<std::mutex> lock(chosen_source_mutex);
    chosen_source = source;
  }
  chosen_timeout_s.store(seconds);
}

CollectiveTimeout mpi_timeout() {
  return timeout("TT_MPI_TIMEOUT_S", kDefaultMpiTimeoutS);
}

std::string describe(const CollectiveTimeout& timeout) {
  return format_seconds(timeout.seconds) + " s (" + timeout.source + ")";
}

CollectiveTimeout nccl_timeout() {
  return timeout("TT_NCCL_TIMEOUT_S", kDefaultNcclTimeoutS);
}

CollectiveWait::CollectiveWait(const char* what) {
  if (wait_since_ns.load(std::memory_order_relaxed) != 0) return;  // inside another mark
  wait_what.store(what, std::memory_order_relaxed);
  wait_since_ns.store(now_ns(), std::memory_order_release);
  owner_ = true;
}

CollectiveWait::~CollectiveWait() {
  if (owner_) wait_since_ns.store(0, std::memory_order_release);
}

struct CollectiveWatchdog::Thread {
  // The environment is read here, on the thread that builds the runtime, so a malformed value is an error
  // at start-up rather than in the watchdog.
  explicit Thread(std::string who_)
      : who(std::move(who_)),
        env_timeout{timeout_from_env("TT_MPI_TIMEOUT_S", kDefaultMpiTimeoutS), "TT_MPI_TIMEOUT_S"} {
    thread = std::thread([this] { run(); });
  }
  ~Thread() {
    {
      std::lock_guard<std::mutex> lock(mutex);
      stop = true;
    }
    wake.notify_all();
    thread.join();
  }

  void run() {
    std::unique_lock<std::mutex> lock(mutex);
    int64_t last_tick = now_ns(), watched_since = 0;
    double waited_s = 0;
    while (!wake.wait_for(lock, kWatchdogPeriod, [this] { return stop; })) {
      const int64_t now = now_ns();
      // Only time this process ran counts: a gap far beyond the period means the whole process was stopped
      // (SIGSTOP, a frozen node), and then it is the one the others wait for, not the one to blame.
      const double tick_s = std::min(static_cast<double>(now - last_tick) * 1e-9, kMaxCountedGapS);
      last_tick = now;
      const int64_t since = wait_since_ns.load(std::memory_order_acquire);
      const char* what = wait_what.load(std::memory_order_relaxed);
      if (since == 0 || since != wait_since_ns.load(std::memory_order_acquire)) {
        watched_since = 0;
        continue;
      }
      if (since != watched_since) {
        watched_since = since;
        waited_s = std::min(static_cast<double>(now - since) * 1e-9, tick_s);
      } else {
        waited_s += tick_s;
      }
      // set_collective_timeout may come at any time; the environment's value was read at start-up.
      CollectiveTimeout limit = env_timeout;
      if (chosen_timeout_s.load() > 0) limit = mpi_timeout();
      if (!(waited_s > limit.seconds)) continue;  // an infinite limit never passes
      abort_job("MPI " + std::string(what ? what : "collective") + " did not complete within " +
                describe(limit) +
                "; another rank is stopped, hung or in a different collective; ending the job [" + who + "]");
    }
  }

  std::string who;
  CollectiveTimeout env_timeout;
  std::mutex mutex;
  std::condition_variable wake;
  bool stop = false;
  std::thread thread;
};

CollectiveWatchdog::CollectiveWatchdog(std::string who) : thread_(std::make_unique<Thread>(std::move(who))) {}

StuckQueryMonitor::StuckQueryMonitor(double timeout_s, std::function<void(const std::string&)> fail,
                                     double period_s)
    : timeout_(timeout_s), period_(period_s), fail_(std::move(fail)), thread_([this] { run(); }) {}

StuckQueryMonitor::~StuckQueryMonitor() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void StuckQueryMonitor::begin(const std::string& what) {
  std::lock_guard<std::mutex> lock(mutex_);
  what_ = what;
  since_ = Clock::now();
}

void StuckQueryMonitor::end() {
  std::lock_guard<std::mutex> lock(mutex_);
  since_.reset();
}

void StuckQueryMonitor::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!wake_.wait_for(lock, period_, [this] { return stop_; })) {
    if (!since_ || !(Clock::now() - *since_ > timeout_)) continue;  // an infinite timeout never passes
    since_.reset();                                                 // once per query
    const std::string what = what_;
    lock.unlock();
    fail_(what);
    lock.lock();
  }
}

CollectiveWatchdog::~CollectiveWatchdog() = default;

}  // namespace tt::dist
