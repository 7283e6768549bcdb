#include "core/venv_cache.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <tuple>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <regex>
#include <set>
#include <sstream>

#include "core/files.h"
#include "core/python_env.h"
#include "core/trial_runner.h"

namespace harness {
namespace {

namespace fs = std::filesystem;

constexpr const char* kMarker = "harness-env.json";

// Lists every installed distribution of the env's interpreter: works for envs made by uv (which
// installs no pip into them) and by pip alike.
constexpr const char* kListPackages = R"PY(
import importlib.metadata as metadata, json
print(json.dumps({d.metadata["Name"]: d.version for d in metadata.distributions() if d.metadata["Name"]}))
)PY";

constexpr const char* kDescribePython = R"PY(
import json, os, platform, sys
print(json.dumps({"real_path": os.path.realpath(sys.executable), "version": platform.python_version()}))
)PY";

std::string now_utc() {
  const auto now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm utc{};
  gmtime_r(&now, &utc);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &utc);
  return text;
}

std::string last_line(const std::string& text) {
  std::istringstream lines(text);
  std::string line, last;
  while (std::getline(lines, line))
    if (line.find_first_not_of(" \t\r") != std::string::npos) last = line;
  return last;
}

// The last lines of an installer's output: what a reader needs to see why it failed.
std::string tail_lines(const std::string& text, size_t count) {
  std::vector<std::string> lines;
  std::istringstream stream(text);
  std::string line;
  while (std::getline(stream, line))
    if (line.find_first_not_of(" \t\r") != std::string::npos) lines.push_back(line);
  std::string tail;
  for (size_t i = lines.size() > count ? lines.size() - count : 0; i < lines.size(); ++i) tail += "\n  " + lines[i];
  return tail;
}

ChildOutcome run_tool(const std::vector<std::string>& argv, double timeout_s,
                      const std::map<std::string, std::string>& env = {}) {
  ChildCommand command;
  command.argv = argv;
  command.env = env;
  command.timeout_s = timeout_s;
  command.separate_stdout = true;
  command.stderr_tail_bytes = 16384;
  command.die_with_parent = true;
  return run_child(command);
}

bool succeeded(const ChildOutcome& outcome) { return !outcome.timed_out && !outcome.interrupted && outcome.exit_code == 0; }

std::string how_it_ended(const ChildOutcome& outcome, double timeout_s) {
  if (outcome.interrupted) return "interrupted";
  if (outcome.timed_out) return "ran past " + std::to_string(static_cast<int>(timeout_s)) + " s and was stopped";
  if (outcome.signal) return "killed by " + signal_name(*outcome.signal);
  return "exited with code " + std::to_string(outcome.exit_code.value_or(-1));
}

std::string command_text(const std::vector<std::string>& argv) {
  std::string text;
  for (const auto& word : argv) text += (text.empty() ? "" : " ") + word;
  return text;
}

// "pip 23.2.1 from ..." -> {23, 2}; nullopt when pip is not there.
std::optional<std::pair<int, int>> pip_version(const std::string& python) {
  const auto outcome = run_tool({python, "-m", "pip", "--version"}, 60.0);
  if (!succeeded(outcome)) return std::nullopt;
  static const std::regex pattern(R"(pip ([0-9]+)\.([0-9]+))");
  std::smatch match;
  const std::string text = outcome.stdout_text;
  if (!std::regex_search(text, match, pattern)) return std::nullopt;
  return std::pair<int, int>{std::stoi(match[1].str()), std::stoi(match[2].str())};
}

// Holds flock() on ROOT/KEY.lock, so that two harness processes never build one env at once.
class EnvLock {
 public:
  explicit EnvLock(const std::string& path) {
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) throw InfraError("cannot create the env lock " + path + ": " + std::strerror(errno));
    if (::flock(fd_, LOCK_EX) != 0) {
      ::close(fd_);
      throw InfraError("cannot lock " + path + ": " + std::strerror(errno));
    }
  }
  ~EnvLock() {
    ::flock(fd_, LOCK_UN);
    ::close(fd_);
  }
  EnvLock(const EnvLock&) = delete;
  EnvLock& operator=(const EnvLock&) = delete;

 private:
  int fd_ = -1;
};

std::optional<CachedEnv> read_marker(const std::string& root, const std::string& key) {
  const std::string folder = (fs::path(root) / key).string();
  CachedEnv env;
  env.key = key;
  env.path = folder;
  env.python = folder + "/bin/python";
  std::error_code error;
  if (!fs::is_directory(folder, error)) return std::nullopt;
  const std::string marker = folder + "/" + kMarker;
  if (!fs::exists(marker, error)) return env;  // incomplete
  const auto json = nlohmann::json::parse(read_file(marker), nullptr, false);
  if (!json.is_object()) return env;
  env.complete = true;
  env.installer = json.value("installer", "");
  env.install_s = json.value("install_s", 0.0);
  env.request = json.value("request", nlohmann::json::object());
  env.packages = json.value("packages", nlohmann::json::object());
  env.created_at = json.value("created_at", "");
  env.last_used_at = json.value("last_used_at", env.created_at);
  return env;
}

void write_marker(const CachedEnv& env) {
  const nlohmann::json marker = {{"key", env.key},           {"installer", env.installer},
                                 {"install_s", env.install_s}, {"request", env.request},
                                 {"packages", env.packages},   {"created_at", env.created_at},
                                 {"last_used_at", env.last_used_at}};
  write_file_atomic(env.path + "/" + kMarker, marker.dump(2) + "\n");
}

}  // namespace

std::string env_cache_root() {
  if (const char* root = std::getenv("HARNESS_ENV_CACHE"); root && *root) return root;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) return std::string(xdg) + "/harness/envs";
  const char* home = std::getenv("HOME");
  return std::string(home && *home ? home : "/tmp") + "/.cache/harness/envs";
}

std::optional<std::string> find_uv() {
  if (const char* uv = std::getenv("HARNESS_UV")) {
    if (!*uv) return std::nullopt;
    return find_program(uv);
  }
  return find_program("uv");
}

std::string resolve_base_python(const std::string& python) {
  static const std::regex version(R"([0-9]+(\.[0-9]+)*)");
  const bool is_version = std::regex_match(python, version);
  const std::string program = is_version ? "python" + python : python;
  const auto found = find_program(program);
  if (!found) {
    throw UsageError("--python '" + python + "': no " + (is_version ? "interpreter python" + python + " in $PATH"
                                                                   : "such executable" + std::string(
                                                                         python.find('/') == std::string::npos
                                                                             ? " in $PATH"
                                                                             : "")));
  }
  return *found;
}

nlohmann::json canonical_request(const EnvRequest& request) {
  const std::string base = resolve_base_python(request.python);
  const auto described = run_tool({base, "-c", kDescribePython}, 120.0);
  const auto identity = nlohmann::json::parse(last_line(described.stdout_text), nullptr, false);
  if (!succeeded(described) || !identity.is_object())
    throw UsageError("--python '" + request.python + "' (" + base + ") does not run as a Python 3 interpreter" +
                     tail_lines(described.stderr_tail, 5));
  std::vector<std::string> requirements = request.requirements;
  std::sort(requirements.begin(), requirements.end());
  requirements.erase(std::unique(requirements.begin(), requirements.end()), requirements.end());
  std::vector<std::string> links;
  for (const auto& link : request.find_links) links.push_back(fs::absolute(link).lexically_normal().string());
  return {{"python", identity.value("real_path", base)},
          {"python_version", identity.value("version", "")},
          {"requirements", requirements},
          {"find_links", links},
          {"no_index", request.no_index},
          {"index_url", request.index_url}};
}

std::string env_key(const nlohmann::json& canonical) {
  // FNV-1a, 64 bits: a folder name, not a security boundary; the marker's copy of the request is
  // compared on reuse, so a collision would rebuild, never hand out the wrong env.
  uint64_t hash = 1469598103934665603ULL;
  for (const unsigned char byte : canonical.dump()) {
    hash ^= byte;
    hash *= 1099511628211ULL;
  }
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(hash));
  return text;
}

CachedEnv ensure_env(const EnvRequest& request, const std::string& root,
                     const std::function<void(const std::string&)>& log) {
  auto say = [&](const std::string& line) {
    if (log) log(line);
  };
  if (request.installer != "auto" && request.installer != "uv" && request.installer != "pip")
    throw UsageError("--installer '" + request.installer + "': expected auto, uv or pip");
  std::optional<std::string> uv;
  if (request.installer != "pip") uv = find_uv();
  if (request.installer == "uv" && !uv)
    throw UsageError("--installer uv: no uv executable ($HARNESS_UV, or uv in $PATH; `pip install uv` installs it)");
  const nlohmann::json canonical = canonical_request(request);
  const std::string key = env_key(canonical);
  std::error_code error;
  fs::create_directories(root, error);
  if (error) throw InfraError("cannot create the env cache " + root + ": " + error.message());
  EnvLock lock((fs::path(root) / (key + ".lock")).string());

  if (auto existing = read_marker(root, key); existing && existing->complete && existing->request == canonical) {
    existing->reused = true;
    existing->last_used_at = now_utc();
    write_marker(*existing);
    return *existing;
  }
  CachedEnv env;
  env.key = key;
  env.path = (fs::path(root) / key).string();
  env.python = env.path + "/bin/python";
  env.request = canonical;
  if (fs::exists(env.path, error)) {
    say("removing " + env.path + " (an install that did not finish, or another package set)");
    remove_tree(env.path);
  }
  // The interpreter itself, not a launcher in front of it (pyenv's shims are shell scripts).
  const std::string base = canonical["python"].get<std::string>();
  const auto started = std::chrono::steady_clock::now();
  std::vector<std::string> create, install;
  std::map<std::string, std::string> tool_env;
  if (uv) {
    const auto version = run_tool({*uv, "--version"}, 60.0);
    // "uv 0.5.1 (x86_64-unknown-linux-gnu)" -> "uv 0.5.1"
    const std::string said = succeeded(version) ? last_line(version.stdout_text) : "uv";
    const auto second_space = said.find(' ', said.find(' ') + 1);
    env.installer = said.substr(0, second_space);
    // An explicit interpreter: uv must never download one, nor read a project's settings.
    tool_env = {{"UV_PYTHON_DOWNLOADS", "never"}, {"UV_NO_CONFIG", "1"}};
    create = {*uv, "venv", "--quiet", "--python", base, env.path};
    install = {*uv, "pip", "install", "--python", env.python};
  } else {
    const auto pip = pip_version(base);
    if (!pip) {
      throw UsageError("--python " + base + " has no pip and no uv was found: install uv (`pip install uv`) or use " +
                       "an interpreter with pip");
    }
    env.installer = "pip " + std::to_string(pip->first) + "." + std::to_string(pip->second);
    // pip >= 22.3 installs into another interpreter (--python): the venv needs no pip of its own,
    // which saves seconds per env. Older pip: a venv with pip, which installs into itself.
    const bool outer_pip = *pip >= std::pair<int, int>{22, 3};
    create = {base, "-m", "venv"};
    if (outer_pip) create.push_back("--without-pip");
    create.push_back(env.path);
    install = outer_pip ? std::vector<std::string>{base, "-m", "pip", "--python", env.python, "install"}
                        : std::vector<std::string>{env.python, "-m", "pip", "install"};
    install.insert(install.end(), {"--disable-pip-version-check", "--no-input"});
    tool_env = {{"PIP_DISABLE_PIP_VERSION_CHECK", "1"}};
  }
  if (request.no_index) install.push_back("--no-index");
  for (const auto& link : canonical["find_links"]) install.insert(install.end(), {"--find-links", link.get<std::string>()});
  if (!request.index_url.empty()) install.insert(install.end(), {"--index-url", request.index_url});
  for (const auto& requirement : canonical["requirements"]) install.push_back(requirement.get<std::string>());

  auto fail = [&](const std::string& step, const std::vector<std::string>& argv, const ChildOutcome& outcome) {
    remove_tree(env.path);
    throw EnvInstallError(step + " failed (" + env.installer + ", " + how_it_ended(outcome, request.timeout_s) +
                          "): " + command_text(argv) + tail_lines(outcome.stderr_tail + "\n" + outcome.stdout_text, 6));
  };
  say("creating " + env.path + " with " + env.installer);
  const auto created = run_tool(create, request.timeout_s, tool_env);
  if (!succeeded(created)) fail("creating the venv", create, created);
  std::string wanted;
  for (const auto& requirement : canonical["requirements"]) wanted += " " + requirement.get<std::string>();
  say("installing" + wanted);
  const auto installed = run_tool(install, request.timeout_s, tool_env);
  if (!succeeded(installed)) fail("installing" + wanted, install, installed);
  const auto listed = run_tool({env.python, "-c", kListPackages}, 300.0);
  const auto packages = nlohmann::json::parse(last_line(listed.stdout_text), nullptr, false);
  if (!succeeded(listed) || !packages.is_object()) fail("listing the installed packages", {env.python, "-c", "..."}, listed);
  env.packages = packages;
  env.install_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  env.created_at = env.last_used_at = now_utc();
  env.complete = true;
  write_marker(env);
  return env;
}

std::vector<CachedEnv> list_envs(const std::string& root) {
  std::vector<CachedEnv> envs;
  std::error_code error;
  if (!fs::is_directory(root, error)) return envs;
  for (const auto& entry : fs::directory_iterator(root, error)) {
    if (!entry.is_directory()) continue;
    if (auto env = read_marker(root, entry.path().filename().string())) envs.push_back(std::move(*env));
  }
  std::sort(envs.begin(), envs.end(), [](const CachedEnv& a, const CachedEnv& b) {
    return std::tie(a.created_at, a.key) < std::tie(b.created_at, b.key);
  });
  return envs;
}

uint64_t folder_bytes(const std::string& path) {
  uint64_t total = 0;
  std::set<std::pair<dev_t, ino_t>> seen;
  std::error_code error;
  for (auto it = fs::recursive_directory_iterator(path, fs::directory_options::skip_permission_denied, error);
       it != fs::recursive_directory_iterator(); it.increment(error)) {
    if (error) break;
    struct stat info {};
    if (::lstat(it->path().c_str(), &info) != 0 || !S_ISREG(info.st_mode)) continue;
    if (info.st_nlink > 1 && !seen.insert({info.st_dev, info.st_ino}).second) continue;
    total += static_cast<uint64_t>(info.st_blocks) * 512;
  }
  return total;
}

void remove_env(const std::string& root, const std::string& key) {
  const std::string folder = (fs::path(root) / key).string();
  {
    EnvLock lock((fs::path(root) / (key + ".lock")).string());  // not while another process builds it
    remove_tree(folder);
  }
  std::error_code error;
  if (fs::exists(folder, error)) throw InfraError("could not remove " + folder);
  fs::remove(fs::path(root) / (key + ".lock"), error);
}

}  // namespace harness
