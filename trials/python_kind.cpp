#include "trials/python_kind.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <regex>
#include <sstream>
#include <stdexcept>

#include "core/oom_message.h"
#include "core/python_env.h"
#include "core/trial_runner.h"
#include "experiments/kinds/python_kind_info.h"

namespace harness::kinds {
namespace {

// How much of each stream the details keep: enough for a Python traceback with its chained
// exceptions (a torch.compile error runs to 3-6 KiB), small enough for a db row per trial.
constexpr size_t kTailBytes = 8192;

// The trial's parent kills the whole trial at spec.timeout_s, and that kill does not reach the
// script (it runs in its own process group). So the script's deadline leaves the trial time to
// stop it (SIGTERM, SIGKILL 2 s later) and write its result: 10 s, or a quarter of short limits.
double script_deadline(const spec::Spec& spec, const PythonParams& params) {
  const double reserve = std::min(10.0, spec.timeout_s / 4.0);
  const double cap = spec.timeout_s - reserve;
  return params.timeout_s ? std::min(*params.timeout_s, cap) : cap;
}

std::string tail_of(const std::string& text, size_t bytes) {
  if (text.size() <= bytes) return text;
  std::string tail = text.substr(text.size() - bytes);
  const auto newline = tail.find('\n');
  return newline == std::string::npos ? tail : tail.substr(newline + 1);
}

std::string trim(const std::string& text) {
  const auto begin = text.find_first_not_of(" \t\r\n");
  if (begin == std::string::npos) return "";
  const auto end = text.find_last_not_of(" \t\r\n");
  return text.substr(begin, end - begin + 1);
}

std::string last_nonempty_line(const std::string& text) {
  std::istringstream lines(text);
  std::string line, last;
  while (std::getline(lines, line)) {
    if (!trim(line).empty()) last = trim(line);
  }
  return last;
}

//! The last line of a Python traceback that names an exception ("torch.OutOfMemoryError: ...",
//! "LoweringException: RuntimeError: ..."), else the last non-empty line: what a reader wants from
//! a stderr tail, not the hint PyTorch prints after its traceback.
std::string last_error_line_of(const std::string& text) {
  static const std::regex exception_line(R"(^([A-Za-z_][\w.]*)(Error|Exception|Failed|Interrupt|Exit)\b[^:]*: .+)");
  std::istringstream lines(text);
  std::string line, last_exception;
  while (std::getline(lines, line)) {
    const std::string trimmed = trim(line);
    if (std::regex_search(trimmed, exception_line)) last_exception = trimmed;
  }
  return last_exception.empty() ? last_nonempty_line(text) : last_exception;
}

std::string shorten(const std::string& text, size_t limit = 300) {
  return text.size() <= limit ? text : text.substr(0, limit) + "...";
}

bool is_regular_file(const std::string& path) {
  struct stat info {};
  return stat(path.c_str(), &info) == 0 && S_ISREG(info.st_mode);
}

std::string unit_from_name(const std::string& name) {
  if (name.ends_with("_bytes")) return "bytes";
  if (name.ends_with("_ms")) return "ms";
  return "";
}

// Whether the output shows an allocation failure: PyTorch's CUDA and CPU allocators, and Python's own.
bool mentions_oom(const std::string& text) {
  return text.find("OutOfMemoryError") != std::string::npos || text.find("out of memory") != std::string::npos ||
         text.find("not enough memory") != std::string::npos || text.find("MemoryError") != std::string::npos;
}


// Keys of the printed object that say how the script ended, not what it measured.
bool is_protocol_key(const std::string& key) {
  return key == "skipped" || key == "oom" || key == "error" || key == "requested_bytes" || key == "units" ||
         key == "status";
}

std::string as_text(const nlohmann::json& value) { return value.is_string() ? value.get<std::string>() : value.dump(); }

// The metrics of the printed object (see python_kind.h for the rules).
std::vector<MetricValue> metrics_of(const nlohmann::json& output, const PythonParams& params) {
  const nlohmann::json units = output.value("units", nlohmann::json::object());
  auto unit_of = [&](const std::string& name) {
    if (const auto declared = params.metrics.find(name); declared != params.metrics.end()) return declared->second;
    if (units.is_object() && units.contains(name) && units[name].is_string()) return units[name].get<std::string>();
    return unit_from_name(name);
  };
  std::vector<MetricValue> metrics;
  for (const auto& [name, value] : output.items()) {
    if (is_protocol_key(name)) continue;
    if (value.is_number()) {
      metrics.push_back({name, value.get<double>(), unit_of(name), -1});
    } else if (value.is_boolean()) {
      metrics.push_back({name, value.get<bool>() ? 1.0 : 0.0, unit_of(name), -1});
    } else if (value.is_array() && !value.empty() &&
               std::all_of(value.begin(), value.end(), [](const nlohmann::json& v) { return v.is_number(); })) {
      for (size_t repeat = 0; repeat < value.size(); ++repeat)
        metrics.push_back({name, value[repeat].get<double>(), unit_of(name), static_cast<int>(repeat)});
    }
  }
  return metrics;
}

TrialResult failed(const std::string& status, const std::string& error, nlohmann::json details) {
  TrialResult result;
  result.status = status;
  result.error = error;
  result.details = std::move(details);
  return result;
}

}  // namespace

TrialResult run_python(const spec::Spec& spec, const TrialRequest& context) {
  nlohmann::json details = {{"variant", context.variant}, {"python", context.python}};
  PythonParams params;
  try {
    params = parse_python_params(spec.params);
  } catch (const std::invalid_argument& e) {
    return failed("error", e.what(), details);
  }
  for (const auto& entry : params.variants) {
    const std::string& name = entry.first;  // not a structured binding: clang < 16 cannot capture those
    const bool known = std::any_of(spec.variants.begin(), spec.variants.end(),
                                   [&](const spec::Variant& v) { return v.name == name; });
    if (!known) return failed("error", "params.variants." + name + " names no variant of the spec", details);
  }

  // The script: relative to the spec's folder, so that a spec and its script move together.
  std::filesystem::path script(params.script);
  if (script.is_relative() && !context.spec_dir.empty()) script = std::filesystem::path(context.spec_dir) / script;
  const std::string script_path = std::filesystem::absolute(script).lexically_normal().string();
  details["script"] = script_path;
  if (!is_regular_file(script_path)) {
    return failed("error",
                  "script not found: " + script_path + " (params.script \"" + params.script + "\"" +
                      (std::filesystem::path(params.script).is_relative()
                           ? ", resolved against " + (context.spec_dir.empty() ? std::string("the working directory")
                                                                                : context.spec_dir)
                           : std::string()) +
                      ")",
                  details);
  }
  const auto interpreter = find_program(context.python);
  if (!interpreter) {
    return failed("error",
                  "interpreter not found: '" + context.python + "' (--python) is no executable file" +
                      (context.python.find('/') == std::string::npos ? " in $PATH" : ""),
                  details);
  }
  details["interpreter"] = *interpreter;

  // The script always sees its device as cuda:0 (or no GPU at all on the CPU).
  std::string script_device = "cpu", visible_devices;
  if (context.device.rfind("cuda", 0) == 0) {
    const auto colon = context.device.find(':');
    visible_devices = colon == std::string::npos ? "0" : context.device.substr(colon + 1);
    script_device = "cuda:0";
  }
  ChildCommand command;
  command.argv = {*interpreter, script_path, "--device", script_device};
  command.argv.insert(command.argv.end(), params.args.begin(), params.args.end());
  command.env = {{"CUDA_VISIBLE_DEVICES", visible_devices}, {"PYTHONUNBUFFERED", "1"}};
  if (context.memory_limit_bytes > 0)
    command.env["HARNESS_MEMORY_LIMIT_BYTES"] = std::to_string(context.memory_limit_bytes);
  for (const auto& [name, value] : params.env) command.env[name] = value;
  if (const auto variant = params.variants.find(context.variant); variant != params.variants.end()) {
    command.argv.insert(command.argv.end(), variant->second.args.begin(), variant->second.args.end());
    for (const auto& [name, value] : variant->second.env) command.env[name] = value;
  }
  command.timeout_s = script_deadline(spec, params);
  command.stderr_tail_bytes = kTailBytes;
  command.separate_stdout = true;
  command.die_with_parent = true;
  details["argv"] = command.argv;
  details["env"] = command.env;
  details["timeout_s"] = command.timeout_s;

  // The parent stops a trial with SIGTERM to the trial's process group, which the script (in a
  // group of its own) would not get; with these handlers run_child kills the script first.
  install_interrupt_handlers();
  ChildOutcome outcome;
  try {
    outcome = run_child(command);
  } catch (const std::exception& e) {
    return failed("error", std::string("could not start the script: ") + e.what(), details);
  }
  details["exit_code"] = outcome.exit_code ? nlohmann::json(*outcome.exit_code) : nlohmann::json();
  details["signal"] = outcome.signal ? nlohmann::json(signal_name(*outcome.signal)) : nlohmann::json();
  details["duration_s"] = outcome.duration_s;
  details["stdout_tail"] = tail_of(outcome.stdout_text, kTailBytes);
  details["stderr_tail"] = outcome.stderr_tail;

  // The printed object, whatever the exit: metrics printed before a failure are kept.
  const std::string line = last_nonempty_line(outcome.stdout_text);
  nlohmann::json output;
  std::string output_problem;
  if (line.empty()) {
    output_problem = "the script printed nothing on stdout (expected one JSON object as its last line)";
  } else {
    try {
      output = nlohmann::json::parse(line);
    } catch (const nlohmann::json::parse_error& e) {
      // A line that does not even start like an object is a log line: the result never came.
      output_problem = line.front() == '{' ? "the last stdout line is not valid JSON (" + std::string(e.what()) +
                                                 "): \"" + shorten(line) + "\""
                                           : "the script printed no JSON object as its last stdout line: \"" +
                                                 shorten(line) + "\"";
    }
    if (output_problem.empty() && !output.is_object()) {
      output_problem = "the last stdout line is JSON but not an object: \"" + shorten(line) + "\"";
      output = nlohmann::json();
    }
    if (output.is_object()) details["output"] = output;
  }

  TrialResult result;
  result.details = details;
  if (output.is_object()) result.metrics = metrics_of(output, params);
  const std::string last_error_line = last_error_line_of(outcome.stderr_tail);

  if (outcome.interrupted) {
    result.status = "error";
    result.error = "the trial was stopped (SIGTERM/SIGINT) and killed the script after " +
                   std::to_string(static_cast<int>(outcome.duration_s)) + " s";
  } else if (outcome.timed_out) {
    result.status = "timeout";
    std::ostringstream text;
    text << "the script ran past its " << command.timeout_s << " s limit and was killed";
    if (!last_error_line.empty()) text << "; last output: " << shorten(last_error_line);
    result.error = text.str();
  } else if (outcome.signal) {
    result.status = "crashed";
    result.error = "the script was killed by " + signal_name(*outcome.signal);
    if (!last_error_line.empty()) result.error += "; last output: " + shorten(last_error_line);
  } else if (output.is_object() && output.contains("skipped")) {
    result.status = "unsupported";
    result.error = "skipped: " + as_text(output["skipped"]);
  } else if (output.is_object() && output.contains("oom")) {
    result.status = "oom";
    result.error = as_text(output["oom"]);
    if (output.contains("requested_bytes") && output["requested_bytes"].is_number())
      result.requested_bytes = static_cast<int64_t>(output["requested_bytes"].get<double>());
    else
      result.requested_bytes = allocator_requested_bytes(result.error);
  } else if (output.is_object() && output.contains("error")) {
    result.status = "error";
    result.error = as_text(output["error"]);
  } else if (outcome.exit_code != 0) {
    const std::string exit = "the script exited with code " + std::to_string(outcome.exit_code.value_or(-1));
    if (mentions_oom(outcome.stderr_tail)) {
      result.status = "oom";
      result.requested_bytes = allocator_requested_bytes(outcome.stderr_tail);
    } else {
      result.status = "error";
    }
    result.error = exit + (last_error_line.empty() ? "" : ": " + shorten(last_error_line));
    if (!result.metrics.empty()) result.error += " (after printing metrics, which are kept)";
  } else if (!output_problem.empty()) {
    result.status = "error";
    result.error = output_problem;
  } else {
    std::vector<std::string> missing;
    for (const auto& entry : params.metrics) {
      const std::string& name = entry.first;
      const bool printed = std::any_of(result.metrics.begin(), result.metrics.end(),
                                       [&](const MetricValue& m) { return m.name == name; });
      if (!printed) missing.push_back(name);
    }
    if (!missing.empty()) {
      result.status = "error";
      result.error = "the script printed no value for the declared metric";
      result.error += missing.size() > 1 ? "s" : "";
      for (size_t i = 0; i < missing.size(); ++i) result.error += (i ? ", " : " ") + missing[i];
      result.error += " (params.metrics)";
    }
  }
  if (!output_problem.empty()) result.details["output_problem"] = output_problem;
  return result;
}

}  // namespace harness::kinds
