#include "harness/trial_runner.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "harness/common.h"

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
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
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
  const pid_t pid = fork();
  if (pid < 0) {
    close(pipe_fds[0]);
    close(pipe_fds[1]);
    throw InfraError(std::string("fork: ") + std::strerror(errno));
  }
  if (pid == 0) {
    setpgid(0, 0);  // own process group: a timeout kills the child's helpers too
    dup2(pipe_fds[1], STDOUT_FILENO);
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

  ChildOutcome outcome;
  std::string tail, partial_line;
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

  const auto deadline = start + std::chrono::duration<double>(command.timeout_s);
  bool pipe_open = true, killed = false;
  std::chrono::steady_clock::time_point kill_at{};
  int status = 0;
  bool reaped = false;
  while (!reaped) {
    if (pipe_open) {
      pollfd fd{pipe_fds[0], POLLIN, 0};
      const int ready = poll(&fd, 1, 100);
      if (ready > 0) {
        char buffer[4096];
        const ssize_t got = read(pipe_fds[0], buffer, sizeof(buffer));
        if (got > 0) keep(buffer, static_cast<size_t>(got));
        else if (got == 0 || (got < 0 && errno != EINTR && errno != EAGAIN)) pipe_open = false;
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
  fcntl(pipe_fds[0], F_SETFL, O_NONBLOCK);
  char buffer[4096];
  ssize_t got;
  while ((got = read(pipe_fds[0], buffer, sizeof(buffer))) > 0) keep(buffer, static_cast<size_t>(got));
  close(pipe_fds[0]);
  if (on_line && !partial_line.empty()) on_line(partial_line);

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
