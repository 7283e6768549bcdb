#pragma once
// What `harness show` shows of a stored run, as data: header lines, the trials, metrics, verdict,
// dispatch and env tables, stderr tails and the artifacts with the tool that opens each. The
// terminal (harness/cli/run_report.cpp) prints them as text; `harness site` renders them as HTML.

#include <string>
#include <vector>

#include "core/printer.h"
#include "db/store.h"

namespace harness::analysis {

//! The first line of a (possibly multi-line) message.
std::string first_line(const std::string& text);

//! "run 3 · bwd_fusion", the hypothesis, device · profile · status · times, dims, mask, Slurm, args, error.
std::vector<std::string> run_header_lines(const db::RunDetail& detail);
//! One row per trial: (point,) variant, status, time, exit, (Slurm task, attempt, node, state,) error.
Table run_trials_table(const db::RunDetail& detail);
//! Medians (with [min–max] for times) per variant, or per point and variant in a sweep; model
//! predictions beside the measured value. `all` adds per-tensor errors and the fits' values.
Table run_metrics_table(const db::RunDetail& detail, bool all);
//! "verdict: X   (rule: ...)" and below it the reason, the fits, per-point verdicts and the values
//! the deciding clause read ("  fused.bwd_peak_bytes = 1.2 GiB  < 5.0 GiB  (holds)").
std::vector<std::string> run_verdict_lines(const db::RunDetail& detail);
//! The correctness check of each trial that ran it: per tensor the errors against the float64
//! reference, the flash-style reference's, the bounds and whether it passed (experiments/tolerance.h).
Table run_check_table(const db::RunDetail& detail);
//! The title line printed above run_check_table.
extern const char* const kCheckTableTitle;
//! "  fused: correctness check failed: dq max 0.05 > bound 0.02", one per trial whose check failed.
std::vector<std::string> run_check_failure_lines(const db::RunDetail& detail);
//! The dispatch trace: variant, op, impl, device, calls, config, reason.
Table run_dispatch_table(const db::RunDetail& detail);
//! The env fingerprint as key, value rows.
Table run_env_table(const db::RunDetail& detail);

//! The stderr tail of a trial that did not end ok.
struct StderrTail {
  std::string title;  //!< "stderr of dense at anchors=512 (oom), last lines:"
  std::string text;
};
std::vector<StderrTail> run_stderr_tails(const db::RunDetail& detail);

//! A stored artifact as `show` lists it.
struct ArtifactEntry {
  db::Artifact artifact;
  std::string owner;                //!< " of dense (trial 7, oom)", or ""
  std::string path;                 //!< the file (db/artifact_paths.h); when `outside`, the row's text
  bool outside = false;             //!< the row points outside the db's artifact folders: never opened
  std::string summary;              //!< a snapshot's events, peak and OOM ("" for other kinds)
  std::vector<std::string> open;    //!< how to open it: "Perfetto: open it at https://ui.perfetto.dev ..."
};
//! The run's artifacts, their files resolved against the folder of `db_path`.
std::vector<ArtifactEntry> run_artifacts(const db::RunDetail& detail, const std::string& db_path);

//! The columns of a metrics export (`harness metrics`, `show --format csv`; docs/RUNNING.md):
//! run, experiment, variant, point, name, value, unit, repeat.
const std::vector<std::string>& metric_columns();
//! One row per stored value of the run: the point as compact JSON, the value in its shortest exact
//! form, repeat -1 for a value measured once.
void append_metric_rows(Table& table, const db::RunDetail& detail);
//! The same rows as JSON objects (the point an object, the value a number or null for NaN).
void append_metric_json(nlohmann::json& rows, const db::RunDetail& detail);

}  // namespace harness::analysis
