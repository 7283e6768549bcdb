#pragma once
// How a stored run is shown: the short summary `run` prints, the full view of `show`, and the
// JSON form of both.

#include <iosfwd>
#include <string>

#include <nlohmann/json.hpp>

#include "db/store.h"

namespace harness {

//! The first line of a (possibly multi-line) message.
std::string first_line(const std::string& text);
//! Every field of a run as JSON (run, env, spec, trials, metrics with summaries, artifacts).
nlohmann::json run_detail_json(const db::RunDetail& detail);
//! Verdict, per-variant status and key metrics (medians with spread).
void print_run_summary(std::ostream& out, const db::RunDetail& detail);
//! Everything: hypothesis, setup, env, trials, metrics, verdict evidence, dispatch trace, errors.
void print_run_detail(std::ostream& out, const db::RunDetail& detail);

}  // namespace harness
