#pragma once
// The exit codes every command documents and the errors that map to them. Torch-free, the lowest
// layer: every other folder may throw these.

#include <stdexcept>

namespace harness {

//! Documented exit codes (README): 0 ok, 1 a --fail-on condition held, 2 usage or spec error,
//! 3 infrastructure error (db, process spawning, device unreachable).
enum ExitCode : int { kExitOk = 0, kExitFailOn = 1, kExitUsage = 2, kExitInfra = 3 };

//! Bad input from the user (arguments, unknown names, a malformed file they named): exit code 2.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

//! The machinery failed (not the experiment): exit code 3.
class InfraError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace harness
