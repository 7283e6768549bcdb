#pragma once
// What every subcommand shares: global options, exit codes, the errors that map to them.

#include <stdexcept>
#include <string>
#include <vector>

namespace harness {

//! Documented exit codes (README): 0 ok, 1 a --fail-on condition held, 2 usage or spec error,
//! 3 infrastructure error (db, process spawning, device unreachable).
enum ExitCode : int { kExitOk = 0, kExitFailOn = 1, kExitUsage = 2, kExitInfra = 3 };

//! Bad input from the user (arguments, unknown names): exit code 2.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

//! The machinery failed (not the experiment): exit code 3.
class InfraError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

//! Options every command takes.
struct GlobalOptions {
  std::string db_path = "harness.db";
  bool json = false;
  std::string log_level = "info";
  std::vector<std::string> experiments_dirs;  //!< --experiments-dir, searched first
};

//! Directories searched for experiment specs: --experiments-dir, $HARNESS_EXPERIMENTS,
//! ./experiments, then the source tree this binary was built from.
std::vector<std::string> experiment_search_dirs(const GlobalOptions& options);

//! Path of the running executable (to start trial children).
std::string self_executable();

}  // namespace harness

namespace harness {

//! Writes `content` to `path` through a temporary file and rename(), so readers never see a
//! half-written file. Throws InfraError on failure.
void write_file_atomic(const std::string& path, const std::string& content);
//! Whole file as a string; throws InfraError naming the path when it cannot be read.
std::string read_file(const std::string& path);

}  // namespace harness
