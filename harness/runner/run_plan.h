#pragma once
// What `harness run` does with a planned run whichever way its trials execute (one machine,
// `--devices`, or a Slurm job array): the plan (experiment → sweep points → variants), one trial
// started and recorded, and the verdict once every trial is in. Torch-free.

#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "db/store.h"
#include "experiments/spec.h"
#include "experiments/verdict.h"
#include "harness/runner/common.h"
#include "harness/runner/run_support.h"

namespace harness {

//! One experiment of the invocation: its spec, points and run row, and what its trials gave.
struct PlannedRun {
  std::string spec_path;
  spec::Spec spec;
  std::vector<nlohmann::json> points;
  std::vector<spec::Spec> point_specs;
  std::vector<std::string> point_files;
  int64_t run_id = 0;
  size_t pending = 0;  //!< trials not finished yet
  std::vector<db::Metric> metrics;
  std::vector<std::map<std::string, spec::VariantOutcome>> outcomes;  //!< per point
  bool any_failed = false;
  bool interrupted = false;
  bool finished = false;
};

//! One trial to run: indices into the planned runs, their points and variants.
struct Job {
  size_t run = 0;
  size_t point = 0;
  size_t variant = 0;
};

//! Fills points, point_specs and outcomes from run.spec.
void plan_points(PlannedRun& run);

//! Runs one trial of `run` in its child process and returns its rows (with the memory model's
//! predictions beside an attention_step's measurements). `base` holds what every trial of the
//! invocation shares (device, devices, caps, flags, artifact folder); the job fills in its point's
//! spec file, variant, spec folder, result file and timeout. Artifact paths are stored relative
//! to `db_path`'s folder.
RecordedTrial execute_trial(const PlannedRun& run, const Job& job, const kinds::TrialRequest& base,
                            const std::string& result_path, const std::string& db_path, const GlobalOptions& options);

//! Adds a recorded trial's outcome to the run's outcomes (by point and variant).
void note_outcome(PlannedRun& run, size_t point, const RecordedTrial& recorded);

//! The verdict of a run whose trials are all in: per point by the spec's rule; with a scaling
//! section once over the fits (stored as run-level metrics); several points agree or MIXED.
spec::Verdict decide(PlannedRun& run, db::Store& store);

}  // namespace harness
