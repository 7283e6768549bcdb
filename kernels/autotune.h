#pragma once
// Autotuner: picks a tile config per key by timing the candidates the first time the key is seen,
// then serves it from memory, and across processes from a JSON cache on disk. Torch-free: the
// caller supplies the timing function (it launches the kernel), so the tuner runs on the CPU.
//
// Per-call state only. The founding race (Triton's autotuner kept the current call's arguments in
// `self.nargs` on the shared object; two threads warming it up at once overwrote each other's and
// crashed) cannot happen here: the candidates and the timing function travel with each call, and
// the only shared state is the per-key result slot, written once under a mutex.

#include <cstdint>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace harness::kernels {

//! What a tuned config is valid for: op, head dim, dtype, mask kind and power-of-two size buckets.
struct AutotuneKey {
  std::string op;         //!< "attention_fwd", "attention_bwd", ...
  int64_t head_dim = 0;   //!< 64, 128, ...
  std::string dtype;      //!< "bf16", "fp32", ...
  std::string mask_kind;  //!< mask kind name of kernels/mask_desc.h ("dflash", "causal", ...)
  int q_bucket = 0;       //!< ceil(log2(q_len)), see size_bucket()
  int kv_bucket = 0;      //!< ceil(log2(kv_len))

  //! Canonical string form, e.g. "attention_fwd/d128/bf16/dflash/q2^11/kv2^13"; the cache key.
  std::string canonical() const;
  //! ceil(log2(length)); 0 for lengths <= 1. Lengths in one bucket share a config.
  static int size_bucket(int64_t length);
  //! Key of an attention op from its real lengths (bucketed here).
  static AutotuneKey attention(std::string op, int64_t head_dim, std::string dtype, std::string mask_kind, int64_t q_len,
                               int64_t kv_len);
};

//! Where the disk cache lives and which device/build its entries must match.
struct AutotuneOptions {
  std::string cache_path;       //!< empty: default_autotune_cache_path()
  bool use_disk_cache = true;   //!< false: memory only (nothing read or written)
  std::string device_identity;  //!< e.g. "NVIDIA H200|sm90" or "cpu"; entries for another device are ignored
  std::string build_identity;   //!< e.g. git hash + build flags; entries from another build are ignored
};

//! $HARNESS_AUTOTUNE_CACHE, else ~/.cache/harness/autotune.json; throws when neither HOME nor it is set.
std::string default_autotune_cache_path();

//! Version of the on-disk format; files with any other version are ignored and rewritten.
inline constexpr int kAutotuneCacheVersion = 1;

//! Where a choice came from.
enum class ChoiceSource { memory, disk, tuned };
//! "memory", "disk", "tuned".
const char* choice_source_name(ChoiceSource source);

//! One timed candidate; time_ms is +inf when the timing function reported it cannot run.
struct CandidateTiming {
  std::string config;
  double time_ms = 0.0;
};

//! The config chosen for a key, where it came from, and the timings behind it.
struct Choice {
  std::string config;
  ChoiceSource source = ChoiceSource::tuned;
  std::vector<CandidateTiming> timings;  //!< candidate order; from the tuning run, also on memory/disk hits
};

//! Times one candidate config in milliseconds; returns +inf (or NaN) for a config that cannot run.
using TimingFunction = std::function<double(const std::string& config)>;

//! Thread-safe autotuner with a memory cache and a validated, atomically written disk cache.
class Autotuner {
 public:
  explicit Autotuner(AutotuneOptions options);

  //! The config for `key`: from memory, else from disk, else the fastest candidate by
  //! `time_candidate_ms` (ties: the earlier candidate). Concurrent calls for one key tune it once
  //! and all get the same config; other keys proceed in parallel. A cached config that is not
  //! among `candidates` is ignored and the key re-tuned. Throws std::invalid_argument for an empty
  //! candidate list, std::runtime_error when no candidate can run; exceptions of the timing
  //! function reach every caller waiting for that tuning run, and the next call tunes again.
  Choice choose(const AutotuneKey& key, const std::vector<std::string>& candidates, const TimingFunction& time_candidate_ms);

  //! What was ignored or failed on the way (damaged cache file, stale entries, write errors), oldest first.
  std::vector<std::string> diagnostics() const;
  //! The disk cache file in use (empty when the disk cache is off).
  const std::string& cache_path() const { return cache_path_; }

 private:
  //! A resolved key: its config, timings and where the resolution found it.
  struct Resolved {
    std::string config;
    ChoiceSource source = ChoiceSource::tuned;
    std::vector<CandidateTiming> timings;
  };

  Resolved resolve(const AutotuneKey& key, const std::vector<std::string>& candidates, const TimingFunction& time_candidate_ms);
  bool lookup_disk(const std::string& key, const std::vector<std::string>& candidates, Resolved& found);
  void store_disk(const std::string& key, const Resolved& resolved);
  void add_diagnostic(std::string message);

  AutotuneOptions options_;
  std::string cache_path_;
  mutable std::mutex mutex_;                                      //!< guards slots_ and diagnostics_
  //! One key's result, set once by the thread that resolves it; the others wait on it.
  struct Slot {
    std::shared_future<Resolved> result;
  };

  std::map<std::string, std::shared_ptr<const Slot>> slots_;  //!< canonical key -> slot
  std::vector<std::string> diagnostics_;
};

}  // namespace harness::kernels
