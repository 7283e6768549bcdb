#pragma once
// Kind cache_corruption: damages the autotuner's on-disk cache the ways it happens in practice and
// checks that kernels::Autotuner notices (a diagnostic), re-tunes, never throws and never uses a
// bad entry, and that the cache on disk is valid afterwards. Torch-free; runs on the CPU with a
// fake timing function whose fastest config per key is known.
//
// Damages (variant impl), planted in a cache file a previous run wrote:
//   truncated        cut at a random byte (a non-atomic writer that died, a full disk)
//   zeroed           same length, all NUL bytes (power loss after a non-atomic write on ext4)
//   garbage          random bytes
//   empty            zero bytes
//   not_a_cache      another tool's JSON at the cache path
//   old_version      an older format version, with a different choice for the key
//   malformed_entry  the key's entry has fields of the wrong type
//   other_device     the key's entry was tuned on another GPU
//   other_build      the key's entry was tuned by another build
//   unknown_config   the key's entry names a config that is not among the candidates
// and races between writers, where nothing must be damaged:
//   two_writer_processes  two processes tuning and writing keys at once (fork)
//   two_writer_threads    two threads, each with its own Autotuner, doing the same
//   killed_writer         a writer process killed with SIGKILL in the middle of its writes

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "experiments/kinds/trial.h"
#include "experiments/spec.h"

namespace harness::kinds {

//! The damage kinds, in the order above.
const std::vector<std::string>& cache_damage_kinds();
//! Whether the damage leaves something for the autotuner to report (false for the writer races).
bool cache_damage_is_detectable(const std::string& damage);

//! What `trials` runs of one damage found.
struct CacheDamageOutcome {
  int64_t trials = 0;
  int64_t detected = 0;             //!< trials whose diagnostics named the damage (detectable kinds)
  int64_t recovered = 0;            //!< trials in which every check of the recovery held
  int64_t crashes = 0;              //!< calls into the autotuner that threw, writer processes that died on a signal
  int64_t bad_entry_used = 0;       //!< trials that got a config from the damaged or stale entry
  int64_t entries_lost = 0;         //!< keys a writer stored that the cache no longer holds
  int64_t leftover_temp_files = 0;  //!< killed_writer: temp files the killed writer left behind
  int64_t kills = 0;                //!< killed_writer: trials in which the writer died before finishing
  std::map<std::string, int64_t> problems;  //!< what failed, with counts
  std::vector<std::string> diagnostics;     //!< the autotuner's diagnostics in the first trial
};

//! Runs `trials` trials of `damage` in fresh folders under `work_dir`; `keys` keys per writer.
//! Throws std::invalid_argument for an unknown damage, std::runtime_error when the folders cannot
//! be made.
CacheDamageOutcome run_cache_damage(const std::string& damage, int trials, uint64_t seed, int keys,
                                    const std::string& work_dir);

//! Runs one trial of kind cache_corruption: spec.repeats trials of the variant's damage, in a
//! temporary folder removed afterwards. Metrics are over all of them (detected and recovered as
//! fractions of the trials).
TrialResult run_cache_corruption(const spec::Spec& spec, const TrialRequest& context);

}  // namespace harness::kinds
