// Autotuner: per-key once-slots in memory, a validated JSON cache on disk.
// Disk format (version kAutotuneCacheVersion):
//   {"format": "harness-autotune", "version": 1,
//    "entries": [{"device": ..., "build": ..., "key": <canonical key>, "config": ..., "timings_ms": {config: ms}}]}
// One file serves every device and build; an entry is used only by the device and build that wrote
// it. Readers never lock: writers replace the file by rename, so a reader sees the old or the new
// file, never half of one. Writers serialize on flock(path + ".lock") and re-read the file under the
// lock, so two processes storing different keys at once keep both; under the lock they also
// remove the temp files of writers that were killed before their rename.

#include "kernels/autotune.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <utility>

#include "core/errors.h"
#include "core/files.h"

namespace harness::kernels {

namespace {

using nlohmann::json;

constexpr const char* kFormatName = "harness-autotune";

bool contains(const std::vector<std::string>& candidates, const std::string& config) {
  return std::find(candidates.begin(), candidates.end(), config) != candidates.end();
}

std::string errno_text() { return std::strerror(errno); }

//! The well-formed entries of a cache file; problems go to `problems` (when given).
//! A missing file is not a problem: it is the first use.
std::vector<json> read_cache_entries(const std::string& path, std::vector<std::string>* problems) {
  auto report = [&](std::string message) {
    if (problems) problems->push_back(std::move(message));
  };
  std::ifstream in(path, std::ios::binary);
  if (!in) return {};
  std::stringstream buffer;
  buffer << in.rdbuf();
  const json document = json::parse(buffer.str(), nullptr, /*allow_exceptions=*/false);
  if (document.is_discarded()) {
    report("autotune cache " + path + ": not valid JSON (truncated or damaged, " + std::to_string(buffer.str().size()) +
           " bytes): ignored");
    return {};
  }
  if (!document.is_object() || document.value("format", json()) != kFormatName) {
    report("autotune cache " + path + ": not a harness autotune cache (no \"format\": \"" + kFormatName + "\"): ignored");
    return {};
  }
  const json version = document.value("version", json());
  if (!version.is_number_integer() || version.get<int64_t>() != kAutotuneCacheVersion) {
    report("autotune cache " + path + ": format version " + version.dump() + ", this build reads version " +
           std::to_string(kAutotuneCacheVersion) + ": ignored");
    return {};
  }
  const json entries = document.value("entries", json());
  if (!entries.is_array()) {
    report("autotune cache " + path + ": \"entries\" is not an array: ignored");
    return {};
  }
  std::vector<json> valid;
  for (std::size_t index = 0; index < entries.size(); ++index) {
    const json& entry = entries[index];
    bool well_formed = entry.is_object();
    for (const char* field : {"device", "build", "key", "config"}) {
      well_formed = well_formed && entry.contains(field) && entry[field].is_string();
    }
    well_formed = well_formed && entry.contains("timings_ms") && entry["timings_ms"].is_object();
    if (well_formed) {
      for (const auto& [config, ms] : entry["timings_ms"].items()) well_formed = well_formed && ms.is_number();
    }
    if (!well_formed) {
      report("autotune cache " + path + ": entry " + std::to_string(index) + " is malformed: ignored");
      continue;
    }
    valid.push_back(entry);
  }
  return valid;
}

//! Removes the temp files of writers that died between creating and renaming theirs (SIGKILL, the
//! OOM killer): without this each such death leaves a cache-sized file behind for good. Call it
//! only under the writers' lock: every writer holds the lock from creating its temp file to
//! renaming it, so a temp file seen under the lock belongs to nobody alive.
void remove_dead_temp_files(const std::string& path) {
  const std::filesystem::path cache(path);
  const std::string prefix = atomic_temp_prefix(path);
  constexpr std::size_t kSuffixLength = 6;  // mkstemp's XXXXXX
  std::error_code error;
  std::filesystem::directory_iterator listing(cache.parent_path().empty() ? "." : cache.parent_path(), error);
  if (error) return;  // the write that follows reports what is wrong with the folder
  for (const auto& file : listing) {
    const std::string name = file.path().filename().string();
    if (name.size() == prefix.size() + kSuffixLength && name.starts_with(prefix)) ::unlink(file.path().c_str());
  }
}

//! Holds an exclusive flock on a sidecar lock file for its lifetime.
class FileLock {
 public:
  explicit FileLock(const std::string& lock_path) : fd_(::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644)) {
    if (fd_ < 0) {
      error_ = "cannot open lock file " + lock_path + ": " + errno_text();
      return;
    }
    while (::flock(fd_, LOCK_EX) != 0) {
      if (errno == EINTR) continue;
      error_ = "cannot lock " + lock_path + ": " + errno_text();
      return;
    }
  }
  ~FileLock() {
    if (fd_ >= 0) ::close(fd_);  // closing the descriptor releases the flock
  }
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;
  const std::string& error() const { return error_; }

 private:
  int fd_;
  std::string error_;
};

}  // namespace

std::string AutotuneKey::canonical() const {
  return op + "/d" + std::to_string(head_dim) + "/" + dtype + "/" + mask_kind + "/q2^" + std::to_string(q_bucket) + "/kv2^" +
         std::to_string(kv_bucket);
}

int AutotuneKey::size_bucket(int64_t length) {
  int bucket = 0;
  while (bucket < 63 && (int64_t{1} << bucket) < length) ++bucket;
  return bucket;
}

AutotuneKey AutotuneKey::attention(std::string op, int64_t head_dim, std::string dtype, std::string mask_kind, int64_t q_len,
                                   int64_t kv_len) {
  return AutotuneKey{std::move(op), head_dim, std::move(dtype), std::move(mask_kind), size_bucket(q_len), size_bucket(kv_len)};
}

std::string default_autotune_cache_path() {
  if (const char* path = std::getenv("HARNESS_AUTOTUNE_CACHE"); path && *path) return path;
  if (const char* home = std::getenv("HOME"); home && *home) return std::string(home) + "/.cache/harness/autotune.json";
  throw std::runtime_error("autotune: no cache path: set HARNESS_AUTOTUNE_CACHE or HOME, or AutotuneOptions::cache_path");
}

const char* choice_source_name(ChoiceSource source) {
  switch (source) {
    case ChoiceSource::memory: return "memory";
    case ChoiceSource::disk: return "disk";
    case ChoiceSource::tuned: return "tuned";
  }
  return "unknown";
}

Autotuner::Autotuner(AutotuneOptions options) : options_(std::move(options)) {
  if (options_.use_disk_cache) cache_path_ = options_.cache_path.empty() ? default_autotune_cache_path() : options_.cache_path;
}

std::vector<std::string> Autotuner::diagnostics() const {
  std::lock_guard lock(mutex_);
  return diagnostics_;
}

void Autotuner::add_diagnostic(std::string message) {
  std::lock_guard lock(mutex_);
  diagnostics_.push_back(std::move(message));
}

Choice Autotuner::choose(const AutotuneKey& key, const std::vector<std::string>& candidates,
                         const TimingFunction& time_candidate_ms) {
  const std::string name = key.canonical();
  if (candidates.empty()) throw std::invalid_argument("autotune " + name + ": no candidate configs");
  if (!time_candidate_ms) throw std::invalid_argument("autotune " + name + ": no timing function");
  for (;;) {
    std::shared_ptr<const Slot> slot;
    std::promise<Resolved> promise;
    bool owner = false;
    {
      std::lock_guard lock(mutex_);
      auto found = slots_.find(name);
      if (found == slots_.end()) {
        slot = std::make_shared<const Slot>(Slot{promise.get_future().share()});
        slots_.emplace(name, slot);
        owner = true;
      } else {
        slot = found->second;
      }
    }
    if (owner) {
      // Resolve outside the lock: tuning one key must not hold up the others.
      try {
        Resolved resolved = resolve(key, candidates, time_candidate_ms);
        promise.set_value(resolved);
        return Choice{resolved.config, resolved.source, resolved.timings};
      } catch (...) {
        {
          std::lock_guard lock(mutex_);
          slots_.erase(name);  // the next call tunes again (only the owner of a slot erases it while unset)
        }
        promise.set_exception(std::current_exception());
        throw;
      }
    }
    const Resolved& resolved = slot->result.get();  // waits for the owner; rethrows its exception
    if (contains(candidates, resolved.config)) return Choice{resolved.config, ChoiceSource::memory, resolved.timings};
    // Tuned against another candidate list: drop the slot (unless someone already replaced it) and tune again.
    std::lock_guard lock(mutex_);
    diagnostics_.push_back("autotune " + name + ": cached config \"" + resolved.config +
                           "\" is not among the current candidates: re-tuning");
    auto found = slots_.find(name);
    if (found != slots_.end() && found->second == slot) slots_.erase(found);
  }
}

Autotuner::Resolved Autotuner::resolve(const AutotuneKey& key, const std::vector<std::string>& candidates,
                                       const TimingFunction& time_candidate_ms) {
  const std::string name = key.canonical();
  Resolved resolved;
  if (!cache_path_.empty() && lookup_disk(name, candidates, resolved)) return resolved;

  resolved.source = ChoiceSource::tuned;
  double best_ms = std::numeric_limits<double>::infinity();
  for (const std::string& config : candidates) {
    double ms = time_candidate_ms(config);
    if (!std::isfinite(ms) || ms < 0.0) ms = std::numeric_limits<double>::infinity();
    resolved.timings.push_back({config, ms});
    if (ms < best_ms) {  // strict: ties keep the earlier candidate
      best_ms = ms;
      resolved.config = config;
    }
  }
  if (resolved.config.empty()) {
    throw std::runtime_error("autotune " + name + ": none of the " + std::to_string(candidates.size()) +
                             " candidate configs could run (every timing was non-finite or negative)");
  }
  if (!cache_path_.empty()) store_disk(name, resolved);
  return resolved;
}

bool Autotuner::lookup_disk(const std::string& key, const std::vector<std::string>& candidates, Resolved& found) {
  std::vector<std::string> problems;
  const std::vector<json> entries = read_cache_entries(cache_path_, &problems);
  // Entries of this key that cannot serve this call. Other devices' and builds' entries belong in
  // a shared cache: they are worth a diagnostic only when they are all there is for the key.
  std::vector<std::string> unusable;
  bool hit = false;
  for (const json& entry : entries) {
    if (hit || entry["key"] != key) continue;
    const std::string device = entry["device"], build = entry["build"], config = entry["config"];
    if (device != options_.device_identity) {
      unusable.push_back("autotune cache " + cache_path_ + ": entry for " + key + " is for device \"" + device + "\", not \"" +
                         options_.device_identity + "\": ignored");
    } else if (build != options_.build_identity) {
      unusable.push_back("autotune cache " + cache_path_ + ": entry for " + key + " is from build \"" + build + "\", not \"" +
                         options_.build_identity + "\": ignored");
    } else if (!contains(candidates, config)) {
      unusable.push_back("autotune cache " + cache_path_ + ": entry for " + key + " has config \"" + config +
                         "\", not among the current candidates: ignored");
    } else {
      hit = true;
      found.config = config;
      found.source = ChoiceSource::disk;
      found.timings.clear();
      for (const std::string& candidate : candidates) {
        const json& timings = entry["timings_ms"];
        const double ms = timings.contains(candidate) ? timings[candidate].get<double>() : std::numeric_limits<double>::infinity();
        found.timings.push_back({candidate, ms});
      }
    }
  }
  if (!hit) problems.insert(problems.end(), unusable.begin(), unusable.end());
  for (std::string& problem : problems) add_diagnostic(std::move(problem));
  return hit;
}

void Autotuner::store_disk(const std::string& key, const Resolved& resolved) {
  // A failed write costs a re-tune next time, not this call's result: report it and go on.
  std::error_code error;
  const std::filesystem::path parent = std::filesystem::path(cache_path_).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, error);
  if (error) {
    add_diagnostic("autotune cache " + cache_path_ + ": cannot create " + parent.string() + ": " + error.message() +
                   ": result not saved");
    return;
  }
  FileLock lock(cache_path_ + ".lock");
  if (!lock.error().empty()) {
    add_diagnostic("autotune cache: " + lock.error() + ": result not saved");
    return;
  }
  remove_dead_temp_files(cache_path_);
  // Re-read under the lock: entries other processes wrote since our lookup must survive.
  // Damaged parts were reported at lookup and are dropped here.
  json entries = json::array();
  for (json& entry : read_cache_entries(cache_path_, nullptr)) {
    const bool replaced = entry["key"] == key && entry["device"] == options_.device_identity &&
                          entry["build"] == options_.build_identity;
    if (!replaced) entries.push_back(std::move(entry));
  }
  json timings = json::object();
  for (const CandidateTiming& timing : resolved.timings) {
    if (std::isfinite(timing.time_ms)) timings[timing.config] = timing.time_ms;  // JSON has no inf
  }
  entries.push_back({{"device", options_.device_identity},
                     {"build", options_.build_identity},
                     {"key", key},
                     {"config", resolved.config},
                     {"timings_ms", std::move(timings)}});
  const json document = {{"format", kFormatName}, {"version", kAutotuneCacheVersion}, {"entries", std::move(entries)}};
  try {
    write_file_atomic(cache_path_, document.dump(2) + "\n");
  } catch (const InfraError& failure) {
    add_diagnostic(std::string("autotune cache: ") + failure.what() + ": result not saved");
  }
}

}  // namespace harness::kernels
