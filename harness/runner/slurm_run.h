#pragma once
// A `harness run` on Slurm: the manifest that tells each array task which trials it runs, the
// submission, and the follower that merges each task's shard into the main db as the task ends,
// requeues failed tasks up to --retries, and finishes the runs (verdict, not_run trials) once
// every task is final. Used by `run --slurm`, `slurm status|collect|cancel` and `__slurm-task`.

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "db/store.h"
#include "harness/runner/common.h"
#include "harness/runner/run_plan.h"
#include "harness/runner/slurm.h"

namespace harness::slurm {

//! What `harness run --slurm` was asked beyond the plan.
struct SubmitOptions {
  JobRequest request;
  int retries = 2;           //!< requeues per task after a failure
  int trials_per_task = 1;
  bool dry_run = false;      //!< print the batch script, submit and write nothing
  bool wait = true;          //!< follow the job until every task is final
  std::string run_dir;       //!< "" for <db folder>/slurm/<token>
  kinds::TrialRequest trial;  //!< what each trial is asked besides its point (device as asked, caps, flags)
  nlohmann::json args_base = nlohmann::json::object();  //!< per run (by index): the local run's args
};

//! How the follower behaves.
struct FollowOptions {
  bool wait = true;          //!< poll until every task is final (false: one pass)
  bool requeue = true;       //!< requeue failed tasks that have retries left
  bool progress = true;      //!< the progress line on stderr
  double poll_s = 2.0;
};

//! What the follower saw.
struct FollowResult {
  bool finished = false;     //!< every task final and every run finished
  bool interrupted = false;  //!< Ctrl-C while waiting (nothing was cancelled)
  std::vector<int64_t> run_ids;
};

//! Plans the tasks, writes the run folder (manifest, point specs, batch script), creates the
//! runs in the main db (status running, args.slurm = job, token, folder) and submits; with
//! dry_run (store may be null) only prints the script. Returns the main runs' ids (empty for a dry run).
std::vector<int64_t> submit_runs(std::vector<PlannedRun>& runs, const std::vector<Job>& jobs,
                                 const SubmitOptions& submit, db::Store* store, const GlobalOptions& options,
                                 std::string* job_id);

//! Follows the Slurm job of `run_id` (and the other runs submitted with it).
FollowResult follow(db::Store& store, int64_t run_id, const FollowOptions& follow_options);

//! Prints one line per task (state, reason, node, restarts, shards merged) of the run's job.
nlohmann::json job_status(db::Store& store, int64_t run_id);

//! Cancels the run's job; its runs are then finished with the trials that ran (no requeue).
void cancel_job(db::Store& store, int64_t run_id);

//! The body of `__slurm-task`: runs this array task's trials into its shard. Returns the exit code.
int run_task(const std::string& manifest_path, const GlobalOptions& options);

//! The run's Slurm section (args.slurm) or UsageError naming the run when it is not a Slurm run.
nlohmann::json slurm_section(db::Store& store, int64_t run_id);

}  // namespace harness::slurm
