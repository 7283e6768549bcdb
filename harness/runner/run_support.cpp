#include "harness/runner/run_support.h"

#include <ftw.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <regex>

#include <fmt/format.h>

#include "core/byte_size.h"
#include "core/files.h"
#include "core/process_identity.h"

namespace harness {

namespace fs = std::filesystem;

namespace {

constexpr const char* kScratchPrefix = "harness-run-";

// Scratch folders are named harness-run-<pid>-<start ticks>-XXXXXX; one whose process is gone
// was left by a harness killed with SIGKILL (nothing can clean up after that): the next one
// removes it.
void remove_stale_scratch_dirs(const fs::path& temp) {
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(temp, error)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(kScratchPrefix, 0) != 0 || !entry.is_directory(error)) continue;
    long pid = 0;
    unsigned long long ticks = 0;
    if (std::sscanf(name.c_str() + std::strlen(kScratchPrefix), "%ld-%llu-", &pid, &ticks) != 2 || pid <= 0) continue;
    const std::string start = process_start_token(pid);
    if (start.empty() || start.substr(start.rfind('/') + 1) != std::to_string(ticks)) remove_tree(entry.path().string());
  }
}

}  // namespace

ScratchDir::ScratchDir() {
  const fs::path temp = fs::temp_directory_path();
  remove_stale_scratch_dirs(temp);
  const std::string start = current_process().start;
  std::string pattern = (temp / (std::string(kScratchPrefix) + std::to_string(getpid()) + "-" +
                                 start.substr(start.rfind('/') + 1) + "-XXXXXX"))
                            .string();
  if (!mkdtemp(pattern.data())) throw InfraError("cannot create a temporary directory");
  path_ = pattern;
}

ScratchDir::~ScratchDir() { remove_tree(path_); }

std::string ScratchDir::file(const std::string& name) const { return (fs::path(path_) / name).string(); }

int64_t parse_size_option(const std::string& text, const std::string& option, bool allow_none) {
  if (allow_none && (text == "0" || text == "none")) return 0;
  const std::string expected =
      std::string("expected a size such as 96GiB, 512MiB or a byte count, at most 1EiB") + (allow_none ? ", or none" : "");
  // parse_byte_size refuses sizes past INT64_MAX; 1 EiB is far past any device and far from that.
  constexpr int64_t kMaxBytes = int64_t{1} << 60;
  const auto bytes = parse_byte_size(text);
  if (!bytes || *bytes < 1 || *bytes > kMaxBytes) throw UsageError(fmt::format("{} '{}': {}", option, text, expected));
  return *bytes;
}

namespace {
// Device indexes past this are typos (the largest nodes have 16 GPUs); it also keeps the number
// far from int overflow in the device probe.
constexpr size_t kMaxDeviceIndexDigits = 4;

void check_device_index(const std::string& device, const std::string& option, const std::string& given) {
  const auto colon = device.find(':');
  if (colon != std::string::npos && device.size() - colon - 1 > kMaxDeviceIndexDigits)
    throw UsageError(fmt::format("{} '{}': device index {} is out of range", option, given, device.substr(colon + 1)));
}
}  // namespace

void check_device_syntax(const std::string& device, const std::string& option) {
  static const std::regex valid(R"(auto|cpu|cuda(:\d+)?)");
  if (!std::regex_match(device, valid))
    throw UsageError(fmt::format("{} '{}': expected cpu, cuda, cuda:N or auto", option, device));
  check_device_index(device, option, device);
}

std::optional<int64_t> parse_memory_limit(const std::string& text, bool given) {
  if (!given) return std::nullopt;
  return parse_size_option(text, "--memory-limit", true);
}

std::vector<std::string> parse_device_list(const std::string& list) {
  static const std::regex valid(R"(cpu|cuda:\d+)");
  std::vector<std::string> devices;
  size_t start = 0;
  while (true) {
    const size_t comma = list.find(',', start);
    const std::string entry = list.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (!std::regex_match(entry, valid))
      throw UsageError(fmt::format("--devices '{}': entry '{}' is not a device; expected a list such as cuda:0,cuda:1",
                                   list, entry));
    check_device_index(entry, "--devices", list);
    if (std::find(devices.begin(), devices.end(), entry) != devices.end())
      throw UsageError(fmt::format("--devices '{}': {} is listed twice", list, entry));
    devices.push_back(entry);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  const bool any_cpu = std::find(devices.begin(), devices.end(), "cpu") != devices.end();
  if (any_cpu && devices.size() > 1)
    throw UsageError(fmt::format("--devices '{}': cpu cannot be mixed with GPUs (specs resolve their cpu profile per run)",
                                 list));
  return devices;
}

std::pair<std::string, nlohmann::json> probe_device(const std::string& device, const GlobalOptions& options,
                                                    const ScratchDir& scratch, double timeout_s) {
  ChildCommand command;
  const std::string result_path = scratch.file("env-" + std::to_string(std::hash<std::string>{}(device)) + ".json");
  command.argv = {self_executable(), "__env", "--device", device, "--result", result_path, "--log-level", options.log_level};
  command.timeout_s = timeout_s;
  const ChildOutcome outcome = run_child(command);
  if (outcome.exit_code && *outcome.exit_code == kExitUsage) {
    std::string message = outcome.stderr_tail;
    const auto at = message.find("error: ");
    if (at != std::string::npos) message = message.substr(at + 7);
    while (!message.empty() && message.back() == '\n') message.pop_back();
    throw UsageError(message);
  }
  if (!outcome.exit_code || *outcome.exit_code != 0 || !fs::exists(result_path)) {
    throw InfraError(fmt::format("probing device {} failed ({}): {}", device,
                                 outcome.signal      ? signal_name(*outcome.signal)
                                 : outcome.timed_out ? "timeout"
                                                     : "exit " + std::to_string(outcome.exit_code.value_or(-1)),
                                 outcome.stderr_tail));
  }
  const auto json = nlohmann::json::parse(read_file(result_path));
  return {json.at("device").get<std::string>(), json.at("env")};
}

ChildCommand trial_command(const kinds::TrialRequest& request, const GlobalOptions& options) {
  std::string request_path = request.result_path;
  if (request_path.ends_with(".json")) request_path.resize(request_path.size() - 5);
  request_path += "." + request.variant + ".request.json";
  write_file_atomic(request_path, kinds::to_json(request).dump(2));
  ChildCommand command;
  command.argv = {self_executable(), "__trial", "--request", request_path, "--log-level", options.log_level};
  command.timeout_s = request.timeout_s;
  return command;
}

namespace {

void add_artifact(RecordedTrial& recorded, const nlohmann::json& entry, const std::string& db_path) {
  db::Artifact artifact;
  artifact.kind = entry.value("kind", "");
  artifact.sha256 = entry.value("sha256", "");
  artifact.path = db::ArtifactFolder(db_path).row_path(entry.value("path", ""));
  artifact.bytes = entry.value("bytes", int64_t{0});
  for (const auto& known : recorded.artifacts)
    if (known.sha256 == artifact.sha256 && known.kind == artifact.kind) return;
  recorded.artifacts.push_back(std::move(artifact));
}

}  // namespace

RecordedTrial record_trial(const std::string& variant, const nlohmann::json& point, const ChildOutcome& outcome,
                           const std::string& result_path, const std::string& db_path) {
  RecordedTrial recorded;
  db::Trial& trial = recorded.trial;
  trial.variant = variant;
  trial.point = point;
  trial.exit_code = outcome.exit_code;
  trial.signal = outcome.signal;
  trial.stderr_tail = outcome.stderr_tail;
  trial.duration_s = outcome.duration_s;
  if (outcome.interrupted) {
    trial.status = "interrupted";
    trial.error = "the harness was interrupted and stopped the trial";
  } else if (outcome.timed_out) {
    trial.status = "timeout";
    trial.error = fmt::format("no result after {:.0f} s; the child was killed", outcome.duration_s);
  } else if (outcome.signal) {
    trial.status = "crashed";
    trial.error = "killed by " + signal_name(*outcome.signal);
  } else if (!fs::exists(result_path)) {
    trial.status = "crashed";
    trial.error = fmt::format("exited with code {} without a result", outcome.exit_code.value_or(-1));
  } else {
    const auto result = nlohmann::json::parse(read_file(result_path), nullptr, false);
    if (result.is_discarded() || !result.is_object() || !result.contains("status")) {
      trial.status = "crashed";
      trial.error = "the result file is not valid JSON";
      return recorded;
    }
    trial.status = result.at("status").get<std::string>();
    trial.error = result.value("error", "");
    if (result.contains("requested_bytes")) trial.requested_bytes = result.at("requested_bytes").get<int64_t>();
    trial.dispatch = result.value("dispatch", nlohmann::json::array());
    trial.details = result.value("details", nlohmann::json::object());
    for (const auto& m : result.value("metrics", nlohmann::json::array())) {
      db::Metric metric;
      metric.variant = variant;
      metric.point = point;
      metric.name = m.at("name").get<std::string>();
      metric.value = m.at("value").get<double>();
      metric.unit = m.value("unit", "");
      metric.repeat = m.value("repeat", -1);
      recorded.metrics.push_back(std::move(metric));
    }
    for (const auto& entry : result.value("artifacts", nlohmann::json::array())) add_artifact(recorded, entry, db_path);
  }
  // A child that crashed before reporting still leaves the capsule it wrote before its step: the
  // marker beside the result file names it.
  const std::string marker = result_path + ".capsule";
  if (fs::exists(marker)) {
    const auto entry = nlohmann::json::parse(read_file(marker), nullptr, false);
    if (entry.is_object() && fs::exists(entry.value("path", ""))) add_artifact(recorded, entry, db_path);
  }
  return recorded;
}

void store_trial(db::Store& store, int64_t run_id, RecordedTrial& recorded) {
  recorded.trial.run_id = run_id;
  store.add_trial(recorded.trial, recorded.metrics);
  for (db::Artifact& artifact : recorded.artifacts) {
    artifact.run_id = run_id;
    artifact.trial_id = recorded.trial.id;
    store.add_artifact(artifact);
  }
}

std::string artifact_dir_for(const std::string& db_path) { return db::ArtifactFolder(db_path).own(); }

bool trial_failed(const std::string& status) {
  return status == "crashed" || status == "timeout" || status == "error" || status == "interrupted" ||
         status == "nonfinite" || status == "not_run";
}

bool faults_allowed() {
  const char* value = std::getenv("HARNESS_ALLOW_FAULTS");
  return value && std::string(value) == "1";
}

}  // namespace harness
