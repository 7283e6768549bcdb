#pragma once
// Subcommand registration: one file per subcommand (docs/STYLE.md 9). Each adds its CLI11
// subcommand and returns the action main() runs when it was chosen; the action returns the
// exit code.

#include <functional>

#include <CLI/CLI.hpp>

#include "harness/runner/common.h"

namespace harness {

using Action = std::function<int()>;

Action add_run_command(CLI::App& app, GlobalOptions& options);
Action add_list_command(CLI::App& app, GlobalOptions& options);
Action add_runs_command(CLI::App& app, GlobalOptions& options);
Action add_metrics_command(CLI::App& app, GlobalOptions& options);
Action add_show_command(CLI::App& app, GlobalOptions& options);
Action add_env_command(CLI::App& app, GlobalOptions& options);
Action add_diff_command(CLI::App& app, GlobalOptions& options);
Action add_writeup_command(CLI::App& app, GlobalOptions& options);
Action add_explain_command(CLI::App& app, GlobalOptions& options);
Action add_replay_command(CLI::App& app, GlobalOptions& options);
//! `slurm status|collect|cancel RUN` and `db merge SHARD...` (Slurm runs, docs/RUNNING.md).
Action add_slurm_command(CLI::App& app, GlobalOptions& options);
Action add_db_command(CLI::App& app, GlobalOptions& options);
Action add_bisect_command(CLI::App& app, GlobalOptions& options);
//! `triage CAPTURE | --log FILE`: a failed job matched to the shipped hypotheses, run, written up.
Action add_triage_command(CLI::App& app, GlobalOptions& options);
Action add_envs_command(CLI::App& app, GlobalOptions& options);
//! `site -o DIR`: the static site of the whole db (analysis/site.h).
Action add_site_command(CLI::App& app, GlobalOptions& options);
//! Hidden: `__trial` (one trial inside the child) and `__env` (fingerprint of a device, in a child).
Action add_trial_command(CLI::App& app, GlobalOptions& options);
Action add_env_child_command(CLI::App& app, GlobalOptions& options);
//! Hidden: `__slurm-task` (one Slurm array task's trials, into its shard).
Action add_slurm_task_command(CLI::App& app, GlobalOptions& options);

//! Adds --db, --json, --log-level and --experiments-dir to a subcommand.
void add_global_options(CLI::App& command, GlobalOptions& options);
//! Adds --format text|json|csv|md (the exports, docs/RUNNING.md) to a subcommand; read it with
//! output_format (harness/common.h).
void add_format_option(CLI::App& command, GlobalOptions& options);

}  // namespace harness
