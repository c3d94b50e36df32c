#include "apps/lib/stop_signal.h"

#include <unistd.h>

#include <csignal>
#include <cstring>
#include <initializer_list>

namespace tt::app {

namespace {

volatile std::sig_atomic_t g_stop_signal = 0;
volatile std::sig_atomic_t g_accepting = 1;

void on_stop_signal(int signal) {
  // When no step is left to finish (an abort under way, the final outputs): the signal's default action.
  if (g_accepting == 0 || (g_stop_signal != 0 && signal != SIGUSR1)) {
    // Asked twice: the user means now. Default action, no checkpoint.
    std::signal(signal, SIG_DFL);
    std::raise(signal);
    return;
  }
  g_stop_signal = signal;
  const char message[] = "\nstop requested: finishing this step and writing a checkpoint\n";
  [[maybe_unused]] const ssize_t n = ::write(STDERR_FILENO, message, sizeof(message) - 1);
}

}  // namespace

void install_stop_handlers() {
  struct sigaction action;
  std::memset(&action, 0, sizeof(action));
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // file writes and waits in progress carry on
  for (int signal : {SIGINT, SIGTERM, SIGHUP, SIGUSR1}) sigaction(signal, &action, nullptr);
}

void accept_stop_requests(bool accept) {
  g_accepting = accept ? 1 : 0;
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
    case SIGHUP:
      return "SIGHUP";
    default:
      return "a signal";
  }
}

}  // namespace tt::app
