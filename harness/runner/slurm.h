#pragma once
// Talking to Slurm through its commands (sbatch, squeue, scontrol, scancel), as a user would: no
// library, no daemon of our own. Torch-free. Also the batch script `harness run --slurm` submits.

#include <optional>
#include <string>
#include <vector>

namespace harness::slurm {

//! What the user asked of Slurm for each array task (`harness run --slurm` options).
struct JobRequest {
  std::string job_name;
  std::string partition;        //!< "" for the cluster's default
  std::string account;
  std::string time;             //!< time limit per task, "" for the partition's default
  int gpus_per_task = 0;
  int cpus_per_task = 0;        //!< 0 for the cluster's default
  std::string mem;              //!< per task, e.g. "32G"; "" for the cluster's default
  int array_parallel = 0;       //!< at most this many tasks at once (%N), 0 for no limit
  std::vector<std::string> extra_args;  //!< --sbatch-arg values, passed through verbatim
};

//! Everything the batch script needs besides the request.
struct BatchScript {
  JobRequest request;
  int tasks = 0;                //!< array indices 0..tasks-1
  std::string log_dir;          //!< slurm-%A_%a.out lands here
  std::string harness;          //!< absolute path of the harness binary (shared storage)
  std::string manifest;         //!< absolute path of the run's manifest (shared storage)
  std::string description;      //!< one comment line: what the job runs
  std::vector<std::string> trial_lines;  //!< comment lines: which trials each task runs
};

//! The script: #SBATCH lines for every option, each commented, then one `harness __slurm-task`.
//! No text becomes a line of its own: comments show control characters as escapes, values are
//! quoted, and a value that cannot be quoted on an #SBATCH line is a UsageError.
std::string batch_script(const BatchScript& script);
//! Why `value` cannot go on an #SBATCH line (a double quote, a line break, another control
//! character), or nullopt when it can.
std::optional<std::string> sbatch_value_problem(const std::string& value);
//! `text` with line breaks and other control characters written as escapes (\n, \x1b).
std::string printable(const std::string& text);

//! One array task as squeue reports it.
struct TaskState {
  int task = 0;
  std::string state;   //!< PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, TIMEOUT, NODE_FAIL, ...
  std::string reason;  //!< the pending reason or why it ended ("None" when Slurm gives none)
  std::string node;    //!< "" until it runs
  int restarts = 0;    //!< requeues so far
};

//! Whether the state is final (the task will not run again unless requeued).
bool is_finished(const std::string& state);

//! Parses `squeue -r -t all -h -O ArrayTaskID:|,State:|,Reason:|,NodeList:|,RestartCnt:|` output.
//! Lines of a task not yet split from its array ("4-7" or "4-7%2") are expanded.
std::vector<TaskState> parse_task_states(const std::string& text);

//! Runs sbatch on the script; returns the job id. InfraError with sbatch's message on failure.
std::string submit_script(const std::string& script_path);
//! Every array task of the job, or nullopt when Slurm no longer knows the job (MinJobAge passed)
//! or cannot be reached (InfraError only when the command cannot start at all).
std::optional<std::vector<TaskState>> query(const std::string& job_id, std::string* error = nullptr);
//! Puts a finished task back in the queue, eligible at once. InfraError with Slurm's message.
void requeue(const std::string& job_id, int task);
//! Cancels the whole job. InfraError with Slurm's message.
void cancel(const std::string& job_id);

//! Whether sbatch and squeue are on PATH and answer (sinfo); the reason when not.
std::optional<std::string> unavailable_reason();

}  // namespace harness::slurm
