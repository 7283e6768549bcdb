#pragma once
// What `run` and `replay` share: a scratch folder, the device probe, the `__trial` command line,
// and turning how a trial child ended into db rows. Torch-free: the parent never touches CUDA.

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "db/artifact_paths.h"
#include "db/store.h"
#include "core/files.h"
#include "core/trial_runner.h"
#include "experiments/kinds/trial.h"
#include "harness/runner/common.h"

namespace harness {

//! A temporary folder for resolved specs and result files, removed (recursively) when destroyed.
class ScratchDir {
 public:
  ScratchDir();
  ~ScratchDir();
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  //! Path of `name` inside the folder.
  std::string file(const std::string& name) const;

 private:
  std::string path_;
};

//! A size option (explain-oom --bytes 16GiB) in bytes. With `allow_none`, "0" and "none" mean no
//! cap (0). UsageError naming `option` for anything else: an empty value, a word, a size below
//! one byte, or one beyond 2^60 bytes (1 EiB, far past any device).
int64_t parse_size_option(const std::string& text, const std::string& option, bool allow_none);

//! Checks "cpu", "cuda", "cuda:N" or "auto"; UsageError naming `option` otherwise.
void check_device_syntax(const std::string& device, const std::string& option = "--device");
//! --memory-limit: a size (core/byte_size.h), or 0 / none for no cap; nullopt when the option was
//! not `given`. UsageError naming the option otherwise, an empty value ('') included.
std::optional<int64_t> parse_memory_limit(const std::string& text, bool given);
//! Parses "cuda:0,cuda:1" into devices (no duplicates, no "auto"); UsageError naming the bad entry.
std::vector<std::string> parse_device_list(const std::string& list);

//! Asks a child (`harness __env`) for the device's fingerprint. Returns {resolved device, env}.
//! UsageError when the device does not exist; InfraError when the probe fails otherwise.
std::pair<std::string, nlohmann::json> probe_device(const std::string& device, const GlobalOptions& options,
                                                    const ScratchDir& scratch, double timeout_s);

//! Seconds after the parent's timeout at which a trial child ends itself (the request's timeout_s + this).
inline constexpr double kChildDeadlineGraceS = 10.0;
//! Exit code of a trial child that ended itself at its deadline (after writing a timeout result).
inline constexpr int kExitChildDeadline = 124;

//! The child command for a trial: writes `request` into its request file beside the result file
//! (`<result>.<variant>.request.json`, so that `ps` shows which variant a child runs) and returns
//! `harness __trial --request FILE`, timed out at request.timeout_s.
ChildCommand trial_command(const kinds::TrialRequest& request, const GlobalOptions& options);

//! A finished trial as db rows: the trial, its metrics and artifacts (artifact paths relative to
//! the db's folder).
struct RecordedTrial {
  db::Trial trial;
  std::vector<db::Metric> metrics;
  std::vector<db::Artifact> artifacts;
};

//! Turns how the child ended (and its result file, if any) into db rows for `variant` at `point`.
RecordedTrial record_trial(const std::string& variant, const nlohmann::json& point, const ChildOutcome& outcome,
                           const std::string& result_path, const std::string& db_path);

//! Stores a recorded trial and its artifacts; fills the ids.
void store_trial(db::Store& store, int64_t run_id, RecordedTrial& recorded);

//! The folder where trials of runs stored in `db_path` write their artifacts (capsules): the db's
//! own, "<db folder>/<db file>.artifacts" (db/artifact_paths.h).
std::string artifact_dir_for(const std::string& db_path);

//! Whether a trial status is a failure of the trial itself (not an outcome such as oom).
bool trial_failed(const std::string& status);

//! Whether HARNESS_ALLOW_FAULTS=1 (test-only fault injection).
bool faults_allowed();

}  // namespace harness
