#pragma once
// Runs one trial in its own child process: the parent enforces a timeout, captures the exit
// status or signal and the tail of stderr, and survives whatever the child does. Torch-free.

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace harness {

//! What to start.
struct ChildCommand {
  std::vector<std::string> argv;              //!< argv[0] is the executable path
  std::map<std::string, std::string> env;     //!< added to (or replacing in) the parent's environment
  double timeout_s = 600.0;
  size_t stderr_tail_bytes = 8192;            //!< how much of the child's stderr to keep
  bool separate_stdout = false;               //!< keep stdout apart (ChildOutcome::stdout_text), not in the tail
  size_t stdout_limit_bytes = 1 << 20;        //!< with separate_stdout: how much of the end of stdout to keep
  bool die_with_parent = true;                //!< SIGKILL the child when the thread that started it dies
};

//! How it ended.
struct ChildOutcome {
  std::optional<int> exit_code;  //!< set when the child exited
  std::optional<int> signal;     //!< set when a signal ended it
  bool timed_out = false;        //!< the parent killed it at the deadline
  bool interrupted = false;      //!< the parent was interrupted (SIGINT/SIGTERM) and killed it
  std::string stderr_tail;       //!< last bytes of stdout+stderr (stderr only with separate_stdout), cut at a line start
  std::string stdout_text;       //!< with separate_stdout: the end of stdout (at most stdout_limit_bytes)
  double duration_s = 0.0;
};

//! Starts the child in its own process group, streams its output lines to `on_line` (may be
//! empty; stderr only with separate_stdout), and waits. Throws InfraError when the child cannot
//! be started.
ChildOutcome run_child(const ChildCommand& command,
                       const std::function<void(const std::string&)>& on_line = {});

//! Installs SIGINT/SIGTERM/SIGHUP/SIGPIPE handlers that make a running run_child kill its child
//! and return with interrupted = true (instead of the harness dying and leaving a half-written run).
void install_interrupt_handlers();
//! Whether an interrupt arrived.
bool interrupt_requested();

//! "SIGSEGV" for 11, etc.
std::string signal_name(int signal);

}  // namespace harness
