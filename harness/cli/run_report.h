#pragma once
// How a stored run is shown: the short summary `run` prints, the full view of `show`, and the
// JSON form of both. What is shown is analysis/run_sections.h's; this prints it as text.

#include <iosfwd>
#include <string>

#include <nlohmann/json.hpp>

#include "analysis/run_sections.h"
#include "db/store.h"

namespace harness {

//! The first line of a (possibly multi-line) message.
using analysis::first_line;
//! Every field of a run as JSON (run, env, spec, trials, metrics with summaries, artifacts).
nlohmann::json run_detail_json(const db::RunDetail& detail);
//! Verdict, per-variant status and key metrics (medians with spread).
void print_run_summary(std::ostream& out, const db::RunDetail& detail);
//! Everything: hypothesis, setup, env, trials, metrics, verdict evidence, dispatch trace, errors.
void print_run_detail(std::ostream& out, const db::RunDetail& detail);
//! The artifacts, each with the tool that opens it (safetensors, memory_viz, Perfetto); files
//! resolved against the folder of `db_path`.
void print_run_artifacts(std::ostream& out, const db::RunDetail& detail, const std::string& db_path);
//! What print_run_detail and print_run_artifacts show, as Markdown (`show --format md`).
void print_run_markdown(std::ostream& out, const db::RunDetail& detail, const std::string& db_path);

}  // namespace harness
