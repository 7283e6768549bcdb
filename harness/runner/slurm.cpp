#include "harness/runner/slurm.h"

#include <fmt/format.h>

#include <unistd.h>

#include <cstdlib>
#include <sstream>

#include "core/errors.h"
#include "core/trial_runner.h"
#include "harness/runner/common.h"

namespace harness::slurm {
namespace {

// Slurm's commands answer in milliseconds; a slurmctld that does not answer in 60 s is down
// (MessageTimeout defaults to 10 s, and the commands retry a few times).
constexpr double kCommandTimeoutS = 60.0;

struct CommandResult {
  bool ran = false;       // started and exited (not killed, not timed out)
  int exit_code = -1;
  std::string out;        // stdout
  std::string err;        // stderr, trimmed
};

// The command's absolute path from PATH (run_child starts a path, not a name); "" when absent.
std::string find_on_path(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::istringstream dirs(path ? path : "/usr/local/bin:/usr/bin:/bin");
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    const std::string candidate = (dir.empty() ? "." : dir) + "/" + name;
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

CommandResult run_command(const std::vector<std::string>& argv) {
  CommandResult result;
  const std::string executable = find_on_path(argv.front());
  if (executable.empty()) {
    result.err = argv.front() + " is not on PATH (is Slurm installed on this host?)";
    return result;
  }
  ChildCommand command;
  command.argv = argv;
  command.argv.front() = executable;
  command.timeout_s = kCommandTimeoutS;
  command.separate_stdout = true;
  const ChildOutcome outcome = run_child(command);
  result.ran = outcome.exit_code.has_value();
  result.exit_code = outcome.exit_code.value_or(-1);
  result.out = outcome.stdout_text;
  result.err = outcome.stderr_tail;
  while (!result.err.empty() && (result.err.back() == '\n' || result.err.back() == ' ')) result.err.pop_back();
  if (outcome.timed_out) result.err = fmt::format("{} did not answer in {:.0f} s", argv.front(), kCommandTimeoutS);
  if (outcome.interrupted) result.err = argv.front() + " was interrupted";
  return result;
}

std::string joined_command(const std::vector<std::string>& argv) {
  std::string text;
  for (const auto& arg : argv) text += (text.empty() ? "" : " ") + arg;
  return text;
}

CommandResult run_checked(const std::vector<std::string>& argv) {
  CommandResult result = run_command(argv);
  if (!result.ran || result.exit_code != 0) {
    throw InfraError(fmt::format("`{}` failed{}: {}", joined_command(argv),
                                 result.ran ? fmt::format(" (exit {})", result.exit_code) : "",
                                 result.err.empty() ? "no message" : result.err));
  }
  return result;
}

// A value for a shell script: single-quoted unless it is plainly safe.
std::string shell_quote(const std::string& value) {
  if (!value.empty() && value.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789/._-+=:,%") ==
                            std::string::npos)
    return value;
  std::string quoted = "'";
  for (char c : value) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

// A value on an #SBATCH line: sbatch splits those lines at blanks and understands double quotes
// (not single ones), so a value with a blank is double-quoted. What double quotes cannot carry (a
// quote, a line break or another control character, which would end the line and start a command
// of its own) is refused: a UsageError naming the value.
std::string sbatch_quote(const std::string& value) {
  if (const auto problem = sbatch_value_problem(value))
    throw UsageError("'" + printable(value) + "' cannot go into a Slurm batch script: " + *problem);
  return value.find_first_of(" \t") == std::string::npos ? value : "\"" + value + "\"";
}

// A comment line of the script: control characters are written as escapes, so text a user chose
// (a db path, a swept value) stays inside its comment.
std::string comment(const std::string& text) { return "# " + printable(text) + "\n"; }

std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> parts;
  std::string part;
  std::istringstream stream(text);
  while (std::getline(stream, part, separator)) parts.push_back(part);
  if (!text.empty() && text.back() == separator) parts.emplace_back();
  return parts;
}

}  // namespace

namespace {

// Why `text` cannot stay on one line of the script (a line break or another control character).
std::optional<std::string> control_character_problem(const std::string& text) {
  for (const char c : text) {
    if (static_cast<unsigned char>(c) < 0x20 && c != '\t') return std::string("it holds a line break or another control character");
    if (c == 0x7f) return std::string("it holds a control character");
  }
  return std::nullopt;
}

}  // namespace

std::optional<std::string> sbatch_value_problem(const std::string& value) {
  if (value.find('"') != std::string::npos) return std::string("it holds a double quote");
  return control_character_problem(value);
}

std::string printable(const std::string& text) {
  std::string out;
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (byte < 0x20 || byte == 0x7f) out += fmt::format("\\x{:02x}", byte);
    else out += c;
  }
  return out;
}

std::string batch_script(const BatchScript& script) {
  const JobRequest& request = script.request;
  std::string text = "#!/bin/bash\n";
  text += comment(script.description);
  text += "#\n";
  text += "# Written by `harness run --slurm`. One Slurm array task per chunk of trials; each task runs its\n";
  text += "# trials one after another, each in its own child process (as `harness run` does on one machine),\n";
  text += "# and writes them to its own SQLite shard in the run's folder. `harness slurm collect RUN` (or the\n";
  text += "# waiting `harness run`) merges the shards into the main db and requeues failed tasks.\n";
  text += "# Every path below must be on storage that the submitting host and every node see.\n";
  text += "#\n";
  for (const std::string& line : script.trial_lines) text += comment("  " + line);
  text += "#\n";
  auto option = [&](const std::string& what, const std::string& line) {
    // The line's values are quoted already (sbatch_quote): here only what would end the line.
    if (const auto problem = control_character_problem(line))
      throw UsageError("'" + printable(line) + "' cannot go into a Slurm batch script: " + *problem);
    text += comment(what) + "#SBATCH " + line + "\n";
  };
  option("The job's name in squeue.", "--job-name=" + sbatch_quote(request.job_name));
  option(request.array_parallel > 0
             ? fmt::format("Array tasks 0..{}, at most {} running at once.", script.tasks - 1, request.array_parallel)
             : fmt::format("Array tasks 0..{} (SLURM_ARRAY_TASK_ID picks the task's trials).", script.tasks - 1),
         fmt::format("--array=0-{}{}", script.tasks - 1,
                     request.array_parallel > 0 ? "%" + std::to_string(request.array_parallel) : ""));
  option("One process per task: harness, which starts its trials itself, one at a time.", "--ntasks=1");
  if (!request.partition.empty()) option("Partition (queue).", "--partition=" + sbatch_quote(request.partition));
  if (!request.account.empty()) option("Account charged.", "--account=" + sbatch_quote(request.account));
  if (!request.time.empty())
    option("Time limit of one task; a task past it ends TIMEOUT and is requeued up to --retries.",
           "--time=" + sbatch_quote(request.time));
  if (request.gpus_per_task > 0)
    option("GPUs per task. Slurm sets CUDA_VISIBLE_DEVICES to them: --device cuda means the first of them.",
           fmt::format("--gpus-per-task={}", request.gpus_per_task));
  if (request.cpus_per_task > 0) option("CPU cores per task.", fmt::format("--cpus-per-task={}", request.cpus_per_task));
  if (!request.mem.empty()) option("Host memory per task.", "--mem=" + sbatch_quote(request.mem));
  option("The task's log (harness's progress and errors; trials' own output is in the db).",
         "--output=" + sbatch_quote(script.log_dir + "/slurm-%A_%a.out"));
  option("A requeued task appends to its log instead of replacing it.", "--open-mode=append");
  option("Slurm may requeue the task itself after a node failure or preemption.", "--requeue");
  for (const std::string& extra : request.extra_args) option("Passed with --sbatch-arg.", extra);
  text += "\n";
  text += "set -eu\n";
  text += "exec " + shell_quote(script.harness) + " __slurm-task --manifest " + shell_quote(script.manifest) + "\n";
  return text;
}

bool is_finished(const std::string& state) {
  return state == "COMPLETED" || state == "FAILED" || state == "CANCELLED" || state == "TIMEOUT" ||
         state == "NODE_FAIL" || state == "PREEMPTED" || state == "OUT_OF_MEMORY" || state == "BOOT_FAIL" ||
         state == "DEADLINE" || state == "SPECIAL_EXIT" || state == "REVOKED";
}

std::vector<TaskState> parse_task_states(const std::string& text) {
  std::vector<TaskState> states;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.empty()) continue;
    const auto fields = split(line, '|');
    if (fields.size() < 5) throw InfraError("unexpected squeue line: " + line);
    TaskState state;
    state.state = fields[1];
    // "CANCELLED by 0" in some versions: the first word is the state.
    if (const auto space = state.state.find(' '); space != std::string::npos) state.state.resize(space);
    state.reason = fields[2];
    state.node = fields[3];
    try {
      state.restarts = fields[4].empty() ? 0 : std::stoi(fields[4]);
    } catch (const std::exception&) {
      throw InfraError("unexpected squeue restart count: " + line);
    }
    // A pending array not yet split into tasks is one line "first-last" (maybe "%N" after it).
    std::string range = fields[0].substr(0, fields[0].find('%'));
    for (const std::string& piece : split(range, ',')) {
      if (piece.empty()) continue;
      const auto dash = piece.find('-');
      try {
        const int first = std::stoi(piece.substr(0, dash));
        const int last = dash == std::string::npos ? first : std::stoi(piece.substr(dash + 1));
        for (int task = first; task <= last; ++task) {
          state.task = task;
          states.push_back(state);
        }
      } catch (const std::exception&) {
        throw InfraError("unexpected squeue array task id: " + line);
      }
    }
  }
  return states;
}

std::string submit_script(const std::string& script_path) {
  const CommandResult result = run_checked({"sbatch", "--parsable", script_path});
  // --parsable prints "JOBID" or "JOBID;CLUSTER".
  std::string job_id = result.out.substr(0, result.out.find_first_of(";\n"));
  if (job_id.empty() || job_id.find_first_not_of("0123456789") != std::string::npos)
    throw InfraError("sbatch printed no job id: " + result.out);
  return job_id;
}

std::optional<std::vector<TaskState>> query(const std::string& job_id, std::string* error) {
  const CommandResult result = run_command(
      {"squeue", "-r", "-t", "all", "-h", "-j", job_id, "-O", "ArrayTaskID:|,State:|,Reason:|,NodeList:|,RestartCnt:|"});
  if (!result.ran || result.exit_code != 0) {
    if (error) *error = result.err.empty() ? "squeue failed" : result.err;
    return std::nullopt;
  }
  return parse_task_states(result.out);
}

void requeue(const std::string& job_id, int task) {
  const std::string id = job_id + "_" + std::to_string(task);
  run_checked({"scontrol", "requeue", id});
  // Slurm holds a requeued batch job back (BeginTime, about two minutes) against requeue loops;
  // ours are bounded by --retries, so the task may start again soon. Not at once: slurmd revokes
  // the killed attempt's credential with a time in whole seconds, and an attempt launched within
  // that second is refused with it ("Job credential revoked", exit 1; seen on the local cluster in
  // 1 of 6 requeues with StartTime=now, each costing the task a retry). Two seconds later is past
  // it. Best effort: a site may forbid users to move their jobs' start time, and then the task
  // only starts later.
  run_command({"scontrol", "update", "JobId=" + id, "StartTime=now+2"});
}

void cancel(const std::string& job_id) { run_checked({"scancel", job_id}); }

std::optional<std::string> unavailable_reason() {
  const CommandResult result = run_command({"sinfo", "-h", "-o", "%P"});
  if (!result.ran) return "sinfo could not run (is Slurm installed? " + result.err + ")";
  if (result.exit_code != 0) return "sinfo failed: " + result.err;
  return std::nullopt;
}

}  // namespace harness::slurm
