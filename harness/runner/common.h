#pragma once
// What every subcommand shares: the global options and where specs are found. Exit codes and the
// errors that map to them are core/errors.h's.

#include <string>
#include <vector>

#include "core/errors.h"
#include "core/printer.h"

namespace harness {

//! Options every command takes.
struct GlobalOptions {
  std::string db_path = "harness.db";
  bool json = false;
  std::string log_level = "info";
  std::vector<std::string> experiments_dirs;  //!< --experiments-dir, searched first
  std::string format;                          //!< --format of the commands that export (runs, metrics, show, diff)
};

//! The format a command prints in: --format, else json under --json, else text. Under json it
//! sets options.json, so an error is printed as JSON too. UsageError when --json and another
//! --format are both given.
Format output_format(GlobalOptions& options);

//! Directories searched for experiment specs, first match wins: --experiments-dir,
//! $HARNESS_EXPERIMENTS, ./experiments, the installed specs beside the binary
//! (<bin>/../share/harness/experiments), then the source tree this binary was built from.
std::vector<std::string> experiment_search_dirs(const GlobalOptions& options);

//! Path of the running executable (to start trial children).
std::string self_executable();

}  // namespace harness
