#pragma once
// `harness writeup`: the debugging writeup of a run — hypothesis, setup, method, results,
// verdict and evidence, memory model against measured, failures and replays, the history of
// the experiment across envs, the commands to reproduce — with SVG plots, as Markdown or HTML.

#include <string>
#include <vector>

#include "analysis/document.h"
#include "db/store.h"

namespace harness::analysis {

//! A writeup ready to render.
struct Writeup {
  Document document;
  int64_t run_id = 0;
  std::string experiment;
};

//! The run `target` names: a run id, or an experiment name (its newest finished run that is not
//! a replay). Throws UsageError for an empty db, an unknown run id or an unknown experiment.
db::RunDetail resolve_writeup_target(const db::Store& store, const std::string& target);

//! Builds the writeup of a run; history and replays are read from `store`. `db_path` is the
//! --db the reproduce commands name.
Writeup build_writeup(const db::Store& store, const db::RunDetail& detail, const std::string& db_path);

//! The files one writeup produced.
struct WrittenFiles {
  std::string markdown;
  std::string html;                  //!< "" unless HTML was asked for
  std::vector<std::string> figures;  //!< SVG files beside the report
};

//! Writes the report for `output_path` ("report.md" or "report.html"; the other extension is
//! derived): Markdown always, HTML when `html` or the path ends in .html, each plot as
//! `<stem>-<id>.svg` beside them. Throws InfraError when a file cannot be written.
WrittenFiles write_writeup(const Writeup& writeup, const std::string& output_path, bool html);

//! A word for the shell: unchanged when safe, else single-quoted.
std::string shell_quote(const std::string& word);

//! The `harness run` command line that repeats a run (from its stored args).
std::string reproduce_command(const db::Run& run, const std::string& db_path);

}  // namespace harness::analysis
