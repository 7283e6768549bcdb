#pragma once
// What every experiment kind shares inside the trial child: the request a trial runs (as JSON in
// its request file) and the result it reports to its parent (as JSON in the result file).
// Torch-free, so that kinds which need no LibTorch (autotune_race, cache_corruption, python) and
// the parent can use it.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kernels/dispatch.h"

namespace harness::kinds {

//! One measured value of a trial.
struct MetricValue {
  std::string name;
  double value = 0.0;
  std::string unit;
  int repeat = -1;  //!< -1 for values measured once
};

//! A file the trial produced that the parent stores as an artifact (a capsule, a log).
struct ArtifactRef {
  std::string kind;    //!< "capsule", "log", ...
  std::string sha256;  //!< of the file's bytes
  std::string path;    //!< absolute, or relative to the db's folder
  int64_t bytes = 0;
};

//! What a trial child reports to its parent.
struct TrialResult {
  std::string status = "ok";  //!< ok, oom, unsupported, error (crashed/timeout are the parent's)
  std::string error;
  std::optional<int64_t> requested_bytes;
  std::vector<MetricValue> metrics;
  std::vector<kernels::DispatchRecord> dispatch;
  nlohmann::json details = nlohmann::json::object();  //!< kind-specific evidence (failure list, probe output)
  std::vector<ArtifactRef> artifacts;
};

//! One trial as its child runs it: everything besides the (per-point, resolved) spec it names.
//! The one contract between whoever starts a trial (`run`, `replay`, triage, a Slurm task) and the
//! child: the parent fills it, writes it as JSON (to_json) into the child's request file, and
//! `harness __trial --request FILE` reads it back (trial_request_from_json); a Slurm manifest keeps
//! the run-wide part (device, caps, flags) in the same form.
struct TrialRequest {
  std::string spec_file;               //!< the resolved spec of the trial's point (JSON)
  std::string variant;
  std::string device;                  //!< "cpu", "cuda:N" (a Slurm manifest: as asked, e.g. "cuda")
  std::vector<std::string> devices;    //!< every device of --devices (kinds that use several at once); {device} when empty
  std::string result_path;             //!< the result file the parent reads
  int64_t memory_limit_bytes = 0;      //!< > 0: cap the device memory of the step
  bool allow_faults = false;
  std::string python = "python3";      //!< interpreter of the python kind (--python)
  std::string spec_dir;                //!< folder of the spec file (relative paths in params resolve here)
  std::string artifact_dir;            //!< where capsules go (the db's artifact folder); "" for none
  bool keep_capsules = false;          //!< keep capsules of trials that succeed
  bool memory_snapshot = false;        //!< keep the CUDA allocator snapshot of the measured step (an OOM's is kept always)
  bool trace = false;                  //!< run the measured step under the Kineto profiler, keep its Chrome trace
  std::string replay_capsule;          //!< replay: run the step recorded in this capsule instead of fresh inputs
  //! replay --import: the outputs the saving program computed for that step (an outputs capsule),
  //! judged by the same correctness check as the variant's
  std::string judge_outputs;
  double timeout_s = 600.0;            //!< the parent's limit; the child ends itself a little after it
};

//! The request as JSON, every field present.
nlohmann::json to_json(const TrialRequest& request);
//! The request from JSON: absent fields keep their defaults; a field of the wrong type or one the
//! request does not have throws std::invalid_argument naming it.
TrialRequest trial_request_from_json(const nlohmann::json& json);

nlohmann::json to_json(const TrialResult& result);
TrialResult trial_result_from_json(const nlohmann::json& json);

}  // namespace harness::kinds
