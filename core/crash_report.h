#pragma once
// A native backtrace on stderr when a process dies of a fatal signal (SIGSEGV, SIGABRT, SIGBUS,
// SIGFPE, SIGILL), so that a trial recorded `crashed` keeps where it crashed in its stderr tail.
// Frames are printed as glibc's backtrace_symbols_fd writes them: module(symbol+offset) or
// module(+offset) [address]; a stripped binary's offsets resolve with
// `addr2line -f -C -e <unstripped binary> <offset>`. After the trace the signal is re-raised
// with its default action, so the exit status still says which signal it was.

namespace harness {

//! Installs the handlers (once per process; later calls do nothing). `who` starts each report.
void install_crash_report(const char* who);

}  // namespace harness
