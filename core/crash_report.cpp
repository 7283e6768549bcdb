#include "core/crash_report.h"

#include <execinfo.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include <initializer_list>

namespace harness {
namespace {

const char* g_who = "harness";
constexpr int kMaxFrames = 28;  // the innermost ones: the stderr tail a trial keeps is 8 KB

void write_text(const char* text) {
  const ssize_t ignored = ::write(STDERR_FILENO, text, strlen(text));
  (void)ignored;
}

void on_fatal_signal(int signal_number) {
  // Only async-signal-safe calls from here on (backtrace() was called once at install time, so
  // libgcc is loaded and it does not allocate).
  write_text("\n");
  write_text(g_who);
  write_text(": fatal signal ");
  write_text(sigabbrev_np(signal_number) ? sigabbrev_np(signal_number) : "?");
  write_text("; native backtrace (innermost first):\n");
  void* frames[kMaxFrames];
  const int count = backtrace(frames, kMaxFrames);
  backtrace_symbols_fd(frames, count, STDERR_FILENO);
  signal(signal_number, SIG_DFL);
  raise(signal_number);
}

}  // namespace

#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define HARNESS_SANITIZED 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define HARNESS_SANITIZED 1
#endif

void install_crash_report(const char* who) {
#ifdef HARNESS_SANITIZED
  (void)who;  // the sanitizer's own handlers report fatal signals, with symbols
  return;
#endif
  static bool installed = false;
  if (installed) return;
  installed = true;
  g_who = who;
  void* warm[1];
  backtrace(warm, 1);
  struct sigaction action {};
  action.sa_handler = on_fatal_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESETHAND | SA_NODEFER;
  for (const int signal_number : {SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL}) sigaction(signal_number, &action, nullptr);
}

}  // namespace harness
