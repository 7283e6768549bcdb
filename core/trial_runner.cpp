#include "core/trial_runner.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "core/errors.h"

extern char** environ;

namespace harness {
namespace {

std::atomic<bool> g_interrupted{false};

void on_interrupt(int) { g_interrupted.store(true); }

// Grace period between SIGTERM and SIGKILL when a child overstays.
constexpr double kKillGraceSeconds = 2.0;

}  // namespace

void install_interrupt_handlers() {
  struct sigaction action {};
  action.sa_handler = on_interrupt;
  sigemptyset(&action.sa_mask);
  // A closed terminal (SIGHUP) or a reader that went away (SIGPIPE: `harness run ... | head -1`)
  // ends the run like Ctrl-C: children killed, the run stored as interrupted, temp files removed,
  // instead of the default action killing the harness and leaving the run "running".
  for (int signal : {SIGINT, SIGTERM, SIGHUP, SIGPIPE}) sigaction(signal, &action, nullptr);
}

bool interrupt_requested() { return g_interrupted.load(); }

std::string signal_name(int signal) {
  const char* abbrev = sigabbrev_np(signal);
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(signal);
}

ChildOutcome run_child(const ChildCommand& command, const std::function<void(const std::string&)>& on_line) {
  if (command.argv.empty()) throw InfraError("run_child: empty command");
  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC) != 0) throw InfraError(std::string("pipe: ") + std::strerror(errno));
  int stdout_fds[2] = {-1, -1};
  if (command.separate_stdout && pipe2(stdout_fds, O_CLOEXEC) != 0) {
    const std::string reason = std::strerror(errno);
    close(pipe_fds[0]);
    close(pipe_fds[1]);
    throw InfraError("pipe: " + reason);
  }
  auto close_all = [&] {
    for (int fd : {pipe_fds[0], pipe_fds[1], stdout_fds[0], stdout_fds[1]}) {
      if (fd >= 0) close(fd);
    }
  };

  // Build argv/envp before fork: only async-signal-safe calls are allowed in the child.
  std::vector<char*> argv;
  for (const auto& arg : command.argv) argv.push_back(const_cast<char*>(arg.c_str()));
  argv.push_back(nullptr);
  std::vector<std::string> env_storage;
  for (char** entry = environ; *entry; ++entry) {
    std::string item(*entry);
    const auto name = item.substr(0, item.find('='));
    if (!command.env.count(name)) env_storage.push_back(std::move(item));
  }
  for (const auto& [name, value] : command.env) env_storage.push_back(name + "=" + value);
  std::vector<char*> envp;
  for (auto& item : env_storage) envp.push_back(item.data());
  envp.push_back(nullptr);

  const auto start = std::chrono::steady_clock::now();
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    const std::string reason = std::strerror(errno);
    close_all();
    throw InfraError("fork: " + reason);
  }
  if (pid == 0) {
    setpgid(0, 0);  // own process group: a timeout kills the child's helpers too
    // A child must not outlive its parent (kill -9 of the harness would leave it holding its GPU
    // memory under PID 1): the kernel kills it when the parent thread ends. The getppid() check
    // closes the race with a parent that died before prctl.
    if (command.die_with_parent && (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent)) _exit(127);
    dup2(command.separate_stdout ? stdout_fds[1] : pipe_fds[1], STDOUT_FILENO);
    dup2(pipe_fds[1], STDERR_FILENO);
    const int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0) dup2(devnull, STDIN_FILENO);
    execve(argv[0], argv.data(), envp.data());
    const char message[] = "harness: exec of the trial child failed\n";
    (void)!write(STDERR_FILENO, message, sizeof(message) - 1);
    _exit(127);
  }
  setpgid(pid, pid);
  close(pipe_fds[1]);
  if (command.separate_stdout) close(stdout_fds[1]);

  ChildOutcome outcome;
  std::string tail, partial_line, stdout_text;
  auto keep_stdout = [&](const char* data, size_t size) {
    stdout_text.append(data, size);
    if (stdout_text.size() > 2 * command.stdout_limit_bytes)
      stdout_text.erase(0, stdout_text.size() - command.stdout_limit_bytes);
  };
  auto keep = [&](const char* data, size_t size) {
    tail.append(data, size);
    if (tail.size() > 2 * command.stderr_tail_bytes) tail.erase(0, tail.size() - command.stderr_tail_bytes);
    if (!on_line) return;
    partial_line.append(data, size);
    size_t newline;
    while ((newline = partial_line.find('\n')) != std::string::npos) {
      on_line(partial_line.substr(0, newline));
      partial_line.erase(0, newline + 1);
    }
  };

  // At most ~31 years: a timeout past what a clock's integer nanoseconds hold never wraps into the past.
  const auto deadline = start + std::chrono::duration<double>(std::min(command.timeout_s, 1e9));
  bool pipe_open = true, stdout_open = command.separate_stdout, killed = false;
  std::chrono::steady_clock::time_point kill_at{};
  int status = 0;
  bool reaped = false;
  // Reads what is ready on an open pipe into `sink`; marks it closed at end of file or on an error.
  auto read_ready = [](const pollfd& fd, bool& open, const std::function<void(const char*, size_t)>& sink) {
    if (!open || !(fd.revents & (POLLIN | POLLHUP | POLLERR))) return;
    char buffer[4096];
    const ssize_t got = read(fd.fd, buffer, sizeof(buffer));
    if (got > 0) sink(buffer, static_cast<size_t>(got));
    else if (got == 0 || (got < 0 && errno != EINTR && errno != EAGAIN)) open = false;
  };
  while (!reaped) {
    if (pipe_open || stdout_open) {
      // A closed pipe is left out of the poll set (a negative fd is ignored).
      pollfd fds[2] = {{pipe_open ? pipe_fds[0] : -1, POLLIN, 0}, {stdout_open ? stdout_fds[0] : -1, POLLIN, 0}};
      if (poll(fds, 2, 100) > 0) {
        read_ready(fds[0], pipe_open, keep);
        read_ready(fds[1], stdout_open, keep_stdout);
      }
    } else {
      usleep(20000);
    }
    const pid_t done = waitpid(pid, &status, WNOHANG);
    if (done == pid) reaped = true;
    const auto now = std::chrono::steady_clock::now();
    if (!reaped && !killed && (now >= deadline || g_interrupted.load())) {
      outcome.timed_out = now >= deadline && !g_interrupted.load();
      outcome.interrupted = g_interrupted.load();
      kill(-pid, SIGTERM);
      killed = true;
      kill_at = now + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                          std::chrono::duration<double>(kKillGraceSeconds));
    }
    if (!reaped && killed && now >= kill_at) kill(-pid, SIGKILL);
  }
  // Drain what the child wrote before it ended (its helpers may hold the pipe: don't block).
  auto drain = [](int fd, const std::function<void(const char*, size_t)>& sink) {
    fcntl(fd, F_SETFL, O_NONBLOCK);
    char buffer[4096];
    ssize_t got;
    while ((got = read(fd, buffer, sizeof(buffer))) > 0) sink(buffer, static_cast<size_t>(got));
    close(fd);
  };
  drain(pipe_fds[0], keep);
  if (command.separate_stdout) drain(stdout_fds[0], keep_stdout);
  if (on_line && !partial_line.empty()) on_line(partial_line);
  if (stdout_text.size() > command.stdout_limit_bytes)
    stdout_text.erase(0, stdout_text.size() - command.stdout_limit_bytes);
  outcome.stdout_text = std::move(stdout_text);

  if (WIFEXITED(status)) outcome.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) outcome.signal = WTERMSIG(status);
  if (tail.size() > command.stderr_tail_bytes) {
    tail.erase(0, tail.size() - command.stderr_tail_bytes);
    const auto newline = tail.find('\n');
    if (newline != std::string::npos) tail.erase(0, newline + 1);
  }
  outcome.stderr_tail = std::move(tail);
  outcome.duration_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return outcome;
}

}  // namespace harness
