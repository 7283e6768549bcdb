// Kind cache_corruption: plant a damage in the autotune cache (or race writers on it), then check
// the autotuner's diagnostics, its choice, the file it leaves and what a fresh autotuner reads back.

#include "trials/cache_corruption.h"

#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <utility>

#include <nlohmann/json.hpp>

#include "core/files.h"
#include "kernels/autotune.h"

namespace harness::kinds {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const std::string kThisDevice = "device-under-test|sm90";
const std::string kOtherDevice = "other-gpu|sm80";
const std::string kThisBuild = "build-under-test";
const std::string kOtherBuild = "older-build";
const std::vector<std::string> kCandidates = {"block_m=64 block_n=32", "block_m=64 block_n=64", "block_m=128 block_n=64"};
const std::string kUnknownConfig = "block_m=256 block_n=128";  //!< a config this build does not have
constexpr const char* kCacheName = "autotune.json";
constexpr int kPreviousRunKeys = 4;  //!< keys in the cache a previous run wrote before the damage
constexpr int kKeyUnderTest = 0;

//! How each damage looks, for the evidence.
const std::map<std::string, std::string>& damage_descriptions() {
  static const std::map<std::string, std::string> descriptions = {
      {"truncated", "the cache file cut at a random byte (a non-atomic writer that died, a full disk)"},
      {"zeroed", "the cache file's bytes all NUL, length kept (power loss after a non-atomic write on ext4)"},
      {"garbage", "the cache file overwritten with random bytes"},
      {"empty", "the cache file empty"},
      {"not_a_cache", "another tool's JSON at the cache path"},
      {"old_version", "an older format version, with a different choice for the key"},
      {"malformed_entry", "the key's entry with a timings field of the wrong type and a different choice"},
      {"other_device", "the key's entry tuned on another GPU, with a different choice"},
      {"other_build", "the key's entry tuned by another build, with a different choice"},
      {"unknown_config", "the key's entry naming a config that is not among the candidates"},
      {"two_writer_processes", "two processes tuning and writing keys into one cache at once"},
      {"two_writer_threads", "two threads, each with its own autotuner, writing keys into one cache at once"},
      {"killed_writer", "a writer process killed with SIGKILL in the middle of its writes"},
  };
  return descriptions;
}

//! Diagnostic phrases that name each detectable damage (any one suffices).
const std::map<std::string, std::vector<std::string>>& damage_diagnostics() {
  static const std::map<std::string, std::vector<std::string>> phrases = {
      {"truncated", {"not valid JSON"}},
      {"zeroed", {"not valid JSON"}},
      {"garbage", {"not valid JSON", "not a harness autotune cache"}},
      {"empty", {"not valid JSON"}},
      {"not_a_cache", {"not a harness autotune cache"}},
      {"old_version", {"format version"}},
      {"malformed_entry", {"is malformed"}},
      {"other_device", {"is for device \"" + kOtherDevice + "\""}},
      {"other_build", {"is from build \"" + kOtherBuild + "\""}},
      {"unknown_config", {"not among the current candidates"}},
  };
  return phrases;
}

//! Key `index` of the experiment: distinct power-of-two buckets of q (32 of them) and kv.
kernels::AutotuneKey key_of(int index) {
  return kernels::AutotuneKey::attention("attention_fwd", 128, "bf16", "dflash", int64_t{1} << (4 + index % 32),
                                         int64_t{1} << (4 + index / 32));
}

//! The fastest candidate of key `index` under the fake timing.
const std::string& fastest_for(int index) { return kCandidates[static_cast<size_t>(index % 3)]; }

//! Fake timing of key `index`: 1 ms for its fastest candidate, one more per step away from it.
//! Counts the timed candidates in `timed` when given.
kernels::TimingFunction timing_for(int index, std::atomic<int>* timed) {
  return [index, timed](const std::string& config) {
    if (timed) timed->fetch_add(1);
    const auto at = std::find(kCandidates.begin(), kCandidates.end(), config) - kCandidates.begin();
    return 1.0 + static_cast<double>(std::abs(at - index % 3));
  };
}

kernels::AutotuneOptions options_for(const std::string& path) {
  kernels::AutotuneOptions options;
  options.cache_path = path;
  options.device_identity = kThisDevice;
  options.build_identity = kThisBuild;
  return options;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  if (!out) throw std::runtime_error("cache_corruption: cannot write " + path);
}

//! What an independent reading of the cache file finds (not the autotuner's own reader).
struct CacheFileCheck {
  std::string problem;                      //!< empty when the file is a valid cache
  std::map<std::string, std::string> own;   //!< canonical key -> config, entries of this device and build
  int64_t foreign = 0;                      //!< entries of other devices or builds
};

CacheFileCheck check_cache_file(const std::string& path) {
  CacheFileCheck check;
  if (!fs::exists(path)) {
    check.problem = "no cache file";
    return check;
  }
  const json document = json::parse(read_text(path), nullptr, /*allow_exceptions=*/false);
  if (document.is_discarded()) {
    check.problem = "the cache file is not valid JSON";
    return check;
  }
  if (!document.is_object() || document.value("format", json()) != "harness-autotune" ||
      document.value("version", json()) != kernels::kAutotuneCacheVersion || !document.value("entries", json()).is_array()) {
    check.problem = "the cache file is not a version " + std::to_string(kernels::kAutotuneCacheVersion) + " harness cache";
    return check;
  }
  for (const json& entry : document["entries"]) {
    bool well_formed = entry.is_object() && entry.contains("timings_ms") && entry["timings_ms"].is_object();
    for (const char* field : {"device", "build", "key", "config"}) {
      well_formed = well_formed && entry.contains(field) && entry[field].is_string();
    }
    if (!well_formed) {
      check.problem = "the cache file holds a malformed entry: " + entry.dump();
      return check;
    }
    if (entry["device"] != kThisDevice || entry["build"] != kThisBuild) {
      ++check.foreign;
      continue;
    }
    const std::string key = entry["key"];
    if (!check.own.emplace(key, entry["config"].get<std::string>()).second) {
      check.problem = "the cache file holds two entries for " + key;
      return check;
    }
  }
  return check;
}

//! Temp files a writer leaves next to the cache if it dies between creating and renaming them.
int64_t count_temp_files(const fs::path& dir) {
  int64_t count = 0;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().filename().string().starts_with(atomic_temp_prefix(kCacheName))) ++count;
  }
  return count;
}

//! Removes a folder tree. nftw, not std::filesystem::remove_all: libtorch.so, loaded in the
//! trial child, interposes remove_all and crashes in it.
void remove_tree(const std::string& path) {
  ::nftw(
      path.c_str(), [](const char* file, const struct stat*, int, struct FTW*) { return ::remove(file); }, 16,
      FTW_DEPTH | FTW_PHYS);
}

//! A fresh folder under `work_dir`.
fs::path make_folder(const std::string& work_dir, const std::string& name) {
  fs::path dir = fs::path(work_dir) / name;
  std::error_code error;
  fs::create_directories(dir, error);
  if (error) throw std::runtime_error("cache_corruption: cannot create " + dir.string() + ": " + error.message());
  return dir;
}

bool mentions_any(const std::vector<std::string>& messages, const std::vector<std::string>& phrases) {
  return std::any_of(messages.begin(), messages.end(), [&](const std::string& message) {
    return std::any_of(phrases.begin(), phrases.end(),
                       [&](const std::string& phrase) { return message.find(phrase) != std::string::npos; });
  });
}

//! Checks that a fresh autotuner reads each key of `indices` from disk, cleanly; appends failures.
void check_fresh_reader(const std::string& path, const std::vector<int>& indices, CacheDamageOutcome& outcome,
                        std::vector<std::string>& failures) {
  try {
    kernels::Autotuner reader(options_for(path));
    std::atomic<int> timed{0};
    for (int index : indices) {
      const kernels::Choice choice = reader.choose(key_of(index), kCandidates, timing_for(index, &timed));
      if (choice.source != kernels::ChoiceSource::disk || choice.config != fastest_for(index)) {
        failures.push_back(std::string("a fresh autotuner got ") + kernels::choice_source_name(choice.source) + " config \"" +
                           choice.config + "\" for a stored key, expected the fastest from disk");
        return;
      }
    }
    if (timed.load() != 0) failures.push_back("a fresh autotuner had to time candidates for stored keys");
    if (!reader.diagnostics().empty()) failures.push_back("a fresh autotuner reported: " + reader.diagnostics().front());
  } catch (const std::exception& error) {
    ++outcome.crashes;
    failures.push_back(std::string("a fresh autotuner threw: ") + error.what());
  }
}

//! The cache a previous run leaves: keys 0..kPreviousRunKeys-1 tuned on this device and build.
void write_previous_run(const std::string& path) {
  kernels::Autotuner previous(options_for(path));
  for (int index = 0; index < kPreviousRunKeys; ++index) previous.choose(key_of(index), kCandidates, timing_for(index, nullptr));
  if (!previous.diagnostics().empty()) {
    throw std::runtime_error("cache_corruption: writing the undamaged cache failed: " + previous.diagnostics().front());
  }
}

//! Plants `damage` in the cache at `path`; returns the config of the damaged entry that a faulty
//! autotuner could pick ("" when no entry survives the damage).
std::string plant(const std::string& damage, const std::string& path, std::mt19937_64& rng) {
  const std::string good = read_text(path);
  if (good.size() < 4) throw std::runtime_error("cache_corruption: the undamaged cache is only " + std::to_string(good.size()) + " bytes");
  if (damage == "truncated") {
    write_text(path, good.substr(0, 1 + rng() % (good.size() - 2)));  // at least the closing brace goes
    return "";
  }
  if (damage == "zeroed") {
    write_text(path, std::string(good.size(), '\0'));
    return "";
  }
  if (damage == "garbage") {
    std::string bytes(good.size(), '\0');
    for (char& byte : bytes) byte = static_cast<char>(rng() & 0xff);
    write_text(path, bytes);
    return "";
  }
  if (damage == "empty") {
    write_text(path, "");
    return "";
  }
  if (damage == "not_a_cache") {
    write_text(path, R"({"tool": "someone else's settings", "version": 1, "entries": {"theme": "dark"}})");
    return "";
  }
  json document = json::parse(good);
  const std::string key = key_of(kKeyUnderTest).canonical();
  json* entry = nullptr;
  for (json& candidate : document["entries"]) {
    if (candidate["key"] == key) entry = &candidate;
  }
  if (entry == nullptr) throw std::runtime_error("cache_corruption: the undamaged cache has no entry for " + key);
  // A different choice than the fastest, so that using the damaged entry shows in the result.
  const std::string stale = kCandidates[static_cast<size_t>((kKeyUnderTest + 1) % 3)];
  if (damage == "old_version") {
    document["version"] = kernels::kAutotuneCacheVersion - 1;
    (*entry)["config"] = stale;
  } else if (damage == "malformed_entry") {
    (*entry)["config"] = stale;
    (*entry)["timings_ms"] = "fast";
  } else if (damage == "other_device") {
    (*entry)["device"] = kOtherDevice;
    (*entry)["config"] = stale;
  } else if (damage == "other_build") {
    (*entry)["build"] = kOtherBuild;
    (*entry)["config"] = stale;
  } else if (damage == "unknown_config") {
    (*entry)["config"] = kUnknownConfig;
  } else {
    throw std::invalid_argument("cache_corruption: no planted damage \"" + damage + "\"");
  }
  write_text(path, document.dump(2));
  return (*entry)["config"];
}

//! One trial of a planted damage; failures go to `failures`.
void planted_trial(const std::string& damage, const fs::path& dir, std::mt19937_64& rng, CacheDamageOutcome& outcome,
                   std::vector<std::string>& failures) {
  const std::string path = (dir / kCacheName).string();
  write_previous_run(path);
  const std::string damaged_config = plant(damage, path, rng);

  kernels::Autotuner tuner(options_for(path));
  std::atomic<int> timed{0};
  std::optional<kernels::Choice> choice;
  try {
    choice = tuner.choose(key_of(kKeyUnderTest), kCandidates, timing_for(kKeyUnderTest, &timed));
  } catch (const std::exception& error) {
    ++outcome.crashes;
    failures.push_back(std::string("the autotuner threw: ") + error.what());
  }
  const std::vector<std::string> diagnostics = tuner.diagnostics();
  if (outcome.trials == 0) outcome.diagnostics = diagnostics;
  if (mentions_any(diagnostics, damage_diagnostics().at(damage))) {
    ++outcome.detected;
  } else {
    failures.push_back("no diagnostic named the damage");
  }
  if (!choice) return;

  const std::string& fastest = fastest_for(kKeyUnderTest);
  if (choice->source != kernels::ChoiceSource::tuned || (!damaged_config.empty() && choice->config == damaged_config)) {
    ++outcome.bad_entry_used;
    failures.push_back(std::string("used the damaged entry: ") + kernels::choice_source_name(choice->source) + " config \"" +
                       choice->config + "\"");
  } else if (choice->config != fastest) {
    failures.push_back("re-tuned to \"" + choice->config + "\", not the fastest \"" + fastest + "\"");
  }
  if (timed.load() != static_cast<int>(kCandidates.size())) {
    failures.push_back("timed " + std::to_string(timed.load()) + " candidates while re-tuning, expected " +
                       std::to_string(kCandidates.size()));
  }
  const CacheFileCheck after = check_cache_file(path);
  const std::string key = key_of(kKeyUnderTest).canonical();
  if (!after.problem.empty()) {
    failures.push_back("after re-tuning: " + after.problem);
  } else if (!after.own.count(key) || after.own.at(key) != fastest) {
    failures.push_back("after re-tuning the cache does not hold the fastest config for the key");
  } else if ((damage == "other_device" || damage == "other_build") && after.foreign == 0) {
    failures.push_back("after re-tuning the other " + std::string(damage == "other_device" ? "device's" : "build's") +
                       " entry is gone");
  }
  check_fresh_reader(path, {kKeyUnderTest}, outcome, failures);
}

//! What one writer did: threw (a crash in the training loop) or went wrong otherwise.
struct WriterResult {
  bool threw = false;
  std::string problem;  //!< empty when all went well
};

//! Writer `writer` of two: tunes and stores keys writer*keys .. writer*keys+keys-1, then the key
//! both writers store (2*keys).
WriterResult run_writer(const std::string& path, int writer, int keys) {
  WriterResult result;
  try {
    kernels::Autotuner tuner(options_for(path));
    std::vector<int> indices;
    for (int i = 0; i < keys; ++i) indices.push_back(writer * keys + i);
    indices.push_back(2 * keys);
    for (int index : indices) {
      const kernels::Choice choice = tuner.choose(key_of(index), kCandidates, timing_for(index, nullptr));
      if (choice.config != fastest_for(index)) {
        result.problem = "writer " + std::to_string(writer) + " got \"" + choice.config + "\" for " + key_of(index).canonical();
        return result;
      }
    }
    if (!tuner.diagnostics().empty()) result.problem = "writer " + std::to_string(writer) + ": " + tuner.diagnostics().front();
  } catch (const std::exception& error) {
    result.threw = true;
    result.problem = "writer " + std::to_string(writer) + " threw: " + error.what();
  }
  return result;
}

//! Checks the cache after writers stored the keys `indices`: each there, with its fastest config.
void check_stored_keys(const std::string& path, const std::vector<int>& indices, CacheDamageOutcome& outcome,
                       std::vector<std::string>& failures) {
  const CacheFileCheck after = check_cache_file(path);
  if (!after.problem.empty()) {
    failures.push_back("after the writers: " + after.problem);
    return;
  }
  int64_t lost = 0;
  for (int index : indices) {
    const auto found = after.own.find(key_of(index).canonical());
    if (found == after.own.end()) {
      ++lost;
    } else if (found->second != fastest_for(index)) {
      ++outcome.bad_entry_used;
      failures.push_back("the cache holds \"" + found->second + "\" for " + found->first + ", not the fastest");
    }
  }
  if (lost > 0) {
    outcome.entries_lost += lost;
    failures.push_back("entries lost: " + std::to_string(lost) + " of " + std::to_string(indices.size()));
  }
  check_fresh_reader(path, indices, outcome, failures);
}

//! Waits for a forked child and returns its exit code; a signal counts as a crash (-1).
int reap(pid_t pid, const std::string& who, CacheDamageOutcome& outcome, std::vector<std::string>& failures) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFSIGNALED(status)) {
    ++outcome.crashes;
    failures.push_back(who + " died on signal " + std::to_string(WTERMSIG(status)));
    return -1;
  }
  return WEXITSTATUS(status);
}

//! Forks; the child runs `body` and exits with its return value (never returns to the caller).
template <typename Body>
pid_t fork_child(Body body) {
  std::fflush(nullptr);  // the child must not print the parent's buffered output again
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error(std::string("cache_corruption: fork failed: ") + std::strerror(errno));
  if (pid == 0) {
    int code = 3;
    try {
      code = body();
    } catch (...) {
    }
    ::_exit(code);
  }
  return pid;
}

void two_writers_trial(bool processes, const fs::path& dir, int keys, CacheDamageOutcome& outcome,
                       std::vector<std::string>& failures) {
  const std::string path = (dir / kCacheName).string();
  std::vector<WriterResult> results(2);
  if (processes) {
    int start[2];
    if (::pipe(start) != 0) throw std::runtime_error(std::string("cache_corruption: pipe failed: ") + std::strerror(errno));
    std::vector<pid_t> children;
    for (int writer = 0; writer < 2; ++writer) {
      children.push_back(fork_child([&, writer] {
        ::close(start[1]);
        char byte = 0;
        while (::read(start[0], &byte, 1) < 0 && errno == EINTR) {  // EOF: the parent released both writers
        }
        const WriterResult result = run_writer(path, writer, keys);
        write_text((dir / ("writer" + std::to_string(writer) + ".txt")).string(), result.problem);
        return result.problem.empty() ? 0 : (result.threw ? 1 : 2);
      }));
    }
    ::close(start[0]);
    ::close(start[1]);  // releases both at once
    for (int writer = 0; writer < 2; ++writer) {
      WriterResult& result = results[static_cast<size_t>(writer)];
      const int code = reap(children[static_cast<size_t>(writer)], "writer process " + std::to_string(writer), outcome, failures);
      result.problem = read_text((dir / ("writer" + std::to_string(writer) + ".txt")).string());
      result.threw = code == 1;
      if (code > 2) result.problem = "writer process " + std::to_string(writer) + " exited with code " + std::to_string(code);
    }
  } else {
    std::atomic<int> ready{0};
    std::vector<std::thread> writers;
    for (int writer = 0; writer < 2; ++writer) {
      writers.emplace_back([&, writer] {
        ready.fetch_add(1);
        while (ready.load() < 2) std::this_thread::yield();
        results[static_cast<size_t>(writer)] = run_writer(path, writer, keys);
      });
    }
    for (std::thread& writer : writers) writer.join();
  }
  for (const WriterResult& result : results) {
    if (result.threw) ++outcome.crashes;
    if (!result.problem.empty()) failures.push_back(result.problem);
  }
  std::vector<int> indices;
  for (int index = 0; index <= 2 * keys; ++index) indices.push_back(index);
  check_stored_keys(path, indices, outcome, failures);
}

void killed_writer_trial(const fs::path& dir, int keys, std::mt19937_64& rng, CacheDamageOutcome& outcome,
                         std::vector<std::string>& failures) {
  const std::string path = (dir / kCacheName).string();
  int notify[2];
  if (::pipe(notify) != 0) throw std::runtime_error(std::string("cache_corruption: pipe failed: ") + std::strerror(errno));
  const auto started = std::chrono::steady_clock::now();
  // The child stores keys 0..keys-1 one by one and reports each completed store with one byte.
  const pid_t child = fork_child([&] {
    ::close(notify[0]);
    kernels::Autotuner writer(options_for(path));
    for (int index = 0; index < keys; ++index) {
      writer.choose(key_of(index), kCandidates, timing_for(index, nullptr));
      const char byte = 'k';
      if (::write(notify[1], &byte, 1) != 1) return 4;
    }
    return 0;
  });
  ::close(notify[1]);
  // Kill it at a random point of a random store: after `before_kill` completed stores, within
  // the time the last store took.
  const int before_kill = 1 + static_cast<int>(rng() % static_cast<uint64_t>(keys - 1));
  int completed = 0;
  auto last = started;
  std::chrono::nanoseconds interval{0};
  char byte = 0;
  while (completed < before_kill && ::read(notify[0], &byte, 1) == 1) {
    const auto now = std::chrono::steady_clock::now();
    interval = now - last;
    last = now;
    ++completed;
  }
  std::this_thread::sleep_for(std::chrono::nanoseconds(static_cast<int64_t>(rng() % (static_cast<uint64_t>(interval.count()) + 1))));
  ::kill(child, SIGKILL);
  int status = 0;
  while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  while (::read(notify[0], &byte, 1) == 1) ++completed;  // stores that finished before the kill landed
  ::close(notify[0]);
  if (WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) {
    ++outcome.kills;
  } else if (WIFSIGNALED(status)) {
    ++outcome.crashes;
    failures.push_back("the writer died on signal " + std::to_string(WTERMSIG(status)) + " before the kill");
  } else if (WEXITSTATUS(status) != 0) {
    failures.push_back("the writer exited with code " + std::to_string(WEXITSTATUS(status)));
  }
  outcome.leftover_temp_files += count_temp_files(dir);

  // Every store that completed must be on disk, valid; the next writer must work and tidy up.
  std::vector<int> stored;
  for (int index = 0; index < completed; ++index) stored.push_back(index);
  if (!stored.empty()) check_stored_keys(path, stored, outcome, failures);
  try {
    kernels::Autotuner next(options_for(path));
    const kernels::Choice choice = next.choose(key_of(keys), kCandidates, timing_for(keys, nullptr));
    if (choice.config != fastest_for(keys)) failures.push_back("the next writer got \"" + choice.config + "\", not the fastest");
    if (!next.diagnostics().empty()) failures.push_back("the next writer reported: " + next.diagnostics().front());
  } catch (const std::exception& error) {
    ++outcome.crashes;
    failures.push_back(std::string("the next writer threw: ") + error.what());
  }
  if (const int64_t left = count_temp_files(dir); left > 0) {
    failures.push_back(std::to_string(left) + " temp file(s) of the killed writer still next to the cache after the next write");
  }
  stored.push_back(keys);
  check_stored_keys(path, stored, outcome, failures);
}

std::string variant_impl(const spec::Spec& spec, const std::string& variant) {
  for (const spec::Variant& candidate : spec.variants) {
    if (candidate.name == variant) return candidate.impl;
  }
  throw std::invalid_argument("cache_corruption: variant \"" + variant + "\" is not in spec " + spec.name);
}

}  // namespace

const std::vector<std::string>& cache_damage_kinds() {
  static const std::vector<std::string> kinds = {
      "truncated",    "zeroed",         "garbage",     "empty",          "not_a_cache",        "old_version",
      "malformed_entry", "other_device", "other_build", "unknown_config", "two_writer_processes", "two_writer_threads",
      "killed_writer"};
  return kinds;
}

bool cache_damage_is_detectable(const std::string& damage) { return damage_diagnostics().count(damage) > 0; }

CacheDamageOutcome run_cache_damage(const std::string& damage, int trials, uint64_t seed, int keys,
                                    const std::string& work_dir) {
  const auto& kinds = cache_damage_kinds();
  if (std::find(kinds.begin(), kinds.end(), damage) == kinds.end()) {
    throw std::invalid_argument("cache_corruption: unknown damage \"" + damage + "\"");
  }
  if (keys < 2) throw std::invalid_argument("cache_corruption: keys must be at least 2");
  CacheDamageOutcome outcome;
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < trials; ++trial) {
    const fs::path dir = make_folder(work_dir, damage + "_" + std::to_string(trial));
    std::vector<std::string> failures;
    if (cache_damage_is_detectable(damage)) {
      planted_trial(damage, dir, rng, outcome, failures);
    } else if (damage == "killed_writer") {
      killed_writer_trial(dir, keys, rng, outcome, failures);
    } else {
      two_writers_trial(damage == "two_writer_processes", dir, keys, outcome, failures);
    }
    ++outcome.trials;
    if (failures.empty()) ++outcome.recovered;
    for (const std::string& failure : failures) ++outcome.problems[failure];
  }
  return outcome;
}

TrialResult run_cache_corruption(const spec::Spec& spec, const TrialRequest& context) {
  const std::string damage = variant_impl(spec, context.variant);
  const int keys = spec.params.value("keys", 16);
  std::string pattern = (fs::temp_directory_path() / "harness_cache_corruption_XXXXXX").string();
  if (::mkdtemp(pattern.data()) == nullptr) {
    throw std::runtime_error("cache_corruption: cannot create a folder like " + pattern + ": " + std::strerror(errno));
  }
  CacheDamageOutcome outcome;
  try {
    outcome = run_cache_damage(damage, spec.repeats, spec.seed, keys, pattern);
  } catch (...) {
    remove_tree(pattern);
    throw;
  }
  remove_tree(pattern);

  TrialResult result;
  const double trials = static_cast<double>(outcome.trials);
  result.metrics.push_back({"trials", trials, "", -1});
  if (cache_damage_is_detectable(damage)) result.metrics.push_back({"detected", static_cast<double>(outcome.detected) / trials, "", -1});
  result.metrics.push_back({"recovered", static_cast<double>(outcome.recovered) / trials, "", -1});
  result.metrics.push_back({"crashes", static_cast<double>(outcome.crashes), "", -1});
  result.metrics.push_back({"bad_entry_used", static_cast<double>(outcome.bad_entry_used), "", -1});
  if (!cache_damage_is_detectable(damage)) {
    result.metrics.push_back({"entries_lost", static_cast<double>(outcome.entries_lost), "", -1});
  }
  if (damage == "killed_writer") {
    result.metrics.push_back({"kills", static_cast<double>(outcome.kills), "", -1});
    result.metrics.push_back({"leftover_temp_files", static_cast<double>(outcome.leftover_temp_files), "", -1});
  }
  json problems = json::array();
  for (const auto& [problem, count] : outcome.problems) problems.push_back({{"problem", problem}, {"count", count}});
  result.details = {{"damage", damage},
                    {"description", damage_descriptions().at(damage)},
                    {"trials", outcome.trials},
                    {"keys_per_writer", keys},
                    {"problems", problems},
                    {"diagnostics", outcome.diagnostics}};
  return result;
}

}  // namespace harness::kinds
