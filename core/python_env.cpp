#include "core/python_env.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <sstream>

#include "core/errors.h"
#include "core/trial_runner.h"

namespace harness {
namespace {

// Runs inside the interpreter. It only imports packages (torch.version.cuda is the version torch
// was built with; nothing initializes CUDA) and prints one JSON object as its last stdout line.
// A package that is not installed is null; one that is installed but fails to import is null
// with "<name>_error", so a broken venv shows up in the fingerprint instead of looking absent.
constexpr const char* kProbeCode = R"PY(
import json, os, platform, sys
info = {"sys_executable": sys.executable, "real_path": os.path.realpath(sys.executable), "prefix": sys.prefix,
        "version": platform.python_version(), "implementation": platform.python_implementation(),
        "torch": None, "torch_git": None, "cuda": None, "triton": None, "numpy": None}
def load(name):
    try:
        return __import__(name)
    except ModuleNotFoundError as e:
        if e.name == name:
            return None
        info[name + "_error"] = type(e).__name__ + ": " + str(e)
    except Exception as e:
        info[name + "_error"] = type(e).__name__ + ": " + str(e)
    return None
torch = load("torch")
if torch is not None:
    info["torch"] = torch.__version__
    info["torch_git"] = torch.version.git_version
    info["cuda"] = torch.version.cuda
triton = load("triton")
if triton is not None:
    info["triton"] = triton.__version__
numpy = load("numpy")
if numpy is not None:
    info["numpy"] = numpy.__version__
print(json.dumps(info))
)PY";

bool is_executable_file(const std::string& path) {
  struct stat info {};
  return stat(path.c_str(), &info) == 0 && S_ISREG(info.st_mode) && access(path.c_str(), X_OK) == 0;
}

std::string last_line(const std::string& text) {
  std::istringstream lines(text);
  std::string line, last;
  while (std::getline(lines, line)) {
    if (line.find_first_not_of(" \t\r") != std::string::npos) last = line;
  }
  return last;
}

}  // namespace

std::optional<std::string> find_program(const std::string& program) {
  if (program.empty()) return std::nullopt;
  if (program.find('/') != std::string::npos) {
    const std::string absolute = std::filesystem::absolute(program).lexically_normal().string();
    if (is_executable_file(absolute)) return absolute;
    return std::nullopt;
  }
  const char* path = std::getenv("PATH");
  std::istringstream dirs(path ? path : "/usr/local/bin:/usr/bin:/bin");
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    if (dir.empty()) dir = ".";  // an empty $PATH entry means the current directory
    const std::string candidate = std::filesystem::absolute(dir + "/" + program).lexically_normal().string();
    if (is_executable_file(candidate)) return candidate;
  }
  return std::nullopt;
}

nlohmann::json python_fingerprint(const std::string& python, double timeout_s) {
  const auto executable = find_program(python);
  if (!executable) {
    throw UsageError("--python '" + python + "': no such executable" +
                     (python.find('/') == std::string::npos ? " in $PATH" : ""));
  }
  ChildCommand command;
  command.argv = {*executable, "-c", kProbeCode};
  command.timeout_s = timeout_s;
  command.separate_stdout = true;
  command.stderr_tail_bytes = 2048;
  const ChildOutcome outcome = run_child(command);
  const std::string where = "--python '" + python + "' (" + *executable + ")";
  if (outcome.timed_out || outcome.interrupted) {
    throw UsageError(where + ": no answer within " + std::to_string(static_cast<int>(timeout_s)) +
                     " s while importing torch and triton");
  }
  if (outcome.signal) throw UsageError(where + ": killed by " + signal_name(*outcome.signal) + "\n" + outcome.stderr_tail);
  if (outcome.exit_code != 0) {
    throw UsageError(where + ": exited with code " + std::to_string(outcome.exit_code.value_or(-1)) +
                     " instead of describing itself (is it a Python 3 interpreter?)\n" + outcome.stderr_tail);
  }
  const auto info = nlohmann::json::parse(last_line(outcome.stdout_text), nullptr, false);
  if (!info.is_object() || !info.contains("version")) {
    throw UsageError(where + ": printed no fingerprint (is it a Python 3 interpreter?)");
  }
  nlohmann::json fingerprint = {{"executable", *executable}};
  fingerprint.update(info);
  return fingerprint;
}

}  // namespace harness
