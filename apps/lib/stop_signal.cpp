#include "apps/lib/stop_signal.h"

#include <time.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdint>
#include <cstring>
#include <initializer_list>

namespace tt::app {

namespace {

volatile std::sig_atomic_t g_stop_signal = 0;
volatile std::sig_atomic_t g_accepting = 1;
volatile std::sig_atomic_t g_start_up = 0;        // nothing written yet: a stop ends the process at once
volatile std::sig_atomic_t g_finishing = 0;       // training has ended: only its last outputs are left
volatile std::sig_atomic_t g_quiet_stop = 0;      // report_stops_after_the_step: the loop announces a stop
volatile std::sig_atomic_t g_quiet_start_up = 0;  // a rank other than 0: rank 0 announces a start-up stop
std::atomic<int64_t> g_first_request_ms{0};       // lock-free: safe in a signal handler
static_assert(std::atomic<int64_t>::is_always_lock_free);

int64_t monotonic_ms() {
  timespec t{};
  clock_gettime(CLOCK_MONOTONIC, &t);  // async-signal-safe
  return int64_t{t.tv_sec} * 1000 + t.tv_nsec / 1000000;
}

// Another signal this close after the first is the same request, delivered twice: a Ctrl-C reaches a whole
// process group, so a wrapper script that passes it on as SIGTERM makes the child see SIGINT and SIGTERM.
// The same signal again is the user asking twice.
constexpr int64_t kSameRequestMs = 2000;

void on_stop_signal(int signal) {
  // A scheduler's warning (SIGUSR1, or SIGUSR2 passed on by a launcher) may come again: never "asked twice".
  const bool repeated = g_stop_signal != 0 && signal != SIGUSR1 && signal != SIGUSR2;
  if (g_accepting != 0 && repeated && signal != g_stop_signal &&
      monotonic_ms() - g_first_request_ms.load() < kSameRequestMs) {
    const char same[] = "stop already requested (send the signal again to end now)\n";
    [[maybe_unused]] const ssize_t n = ::write(STDERR_FILENO, same, sizeof(same) - 1);
    return;
  }
  // When nothing is left to finish (an abort under way): the signal's default action.
  if (g_accepting == 0 || repeated) {
    // Asked twice: the user means now. Default action, no checkpoint.
    if (g_accepting != 0 && g_finishing == 0) {
      const char now[] = "\nstopping at once: nothing since the last complete checkpoint is saved\n";
      [[maybe_unused]] const ssize_t n = ::write(STDERR_FILENO, now, sizeof(now) - 1);
    }
    std::signal(signal, SIG_DFL);
    std::raise(signal);
    return;
  }
  // During start-up nothing is trained or written: end now rather than after the load (minutes for a large
  // model), a step and a checkpoint.
  if (g_start_up != 0) {
    const char early[] = "\nstop requested during start-up: ending now, nothing written yet\n";
    if (g_quiet_start_up == 0) {
      [[maybe_unused]] const ssize_t n = ::write(STDERR_FILENO, early, sizeof(early) - 1);
    }
    std::signal(signal, SIG_DFL);
    std::raise(signal);
    return;
  }
  if (g_stop_signal == 0) g_first_request_ms.store(monotonic_ms());
  g_stop_signal = signal;
  if (g_quiet_stop != 0 && g_finishing == 0) return;
  const char step[] = "\nstop requested: finishing this step and writing a checkpoint\n";
  const char outputs[] = "\nstop requested: training has ended; cutting the text sample short\n";
  [[maybe_unused]] const ssize_t n = g_finishing ? ::write(STDERR_FILENO, outputs, sizeof(outputs) - 1)
                                                 : ::write(STDERR_FILENO, step, sizeof(step) - 1);
}

}  // namespace

void install_stop_handlers() {
  struct sigaction action;
  std::memset(&action, 0, sizeof(action));
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // file writes and waits in progress carry on
  for (int signal : {SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGUSR2}) {
    // Started under `nohup`, SIGHUP stays ignored: the user detached the run from the terminal. (A script's
    // background job also starts with SIGINT ignored; there `kill -INT` is still meant as a stop.)
    struct sigaction inherited;
    if (signal == SIGHUP && sigaction(signal, nullptr, &inherited) == 0 && inherited.sa_handler == SIG_IGN)
      continue;
    sigaction(signal, &action, nullptr);
  }
}

void accept_stop_requests(bool accept) {
  g_accepting = accept ? 1 : 0;
}

StartUp::StartUp() {
  g_start_up = 1;
}
StartUp::~StartUp() {
  g_start_up = 0;
}

void report_stops_after_the_step(bool announce_start_up_stops) {
  g_quiet_stop = 1;
  g_quiet_start_up = announce_start_up_stops ? 0 : 1;
}

void finishing_outputs() {
  g_finishing = 1;
}

int stop_signal() {
  return g_stop_signal;
}

const char* signal_name(int signal) {
  switch (signal) {
    case SIGINT:
      return "SIGINT";
    case SIGTERM:
      return "SIGTERM";
    case SIGUSR1:
      return "SIGUSR1";
    case SIGUSR2:
      return "SIGUSR2";
    case SIGHUP:
      return "SIGHUP";
    default:
      return "a signal";
  }
}

}  // namespace tt::app
