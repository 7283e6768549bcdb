#pragma once
// What the end-to-end tests of the built binary share: running `harness` with captured output, a
// scratch folder per test, reading files whole. HARNESS_BINARY is the binary under test (tests/test_paths.h).

#include <stdlib.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>

#include "tests/test_paths.h"

namespace harness::test {

namespace fs = std::filesystem;

//! How one command ended and what it printed.
struct Result {
  int exit_code = -1;
  std::string out;
  std::string err;
};

//! The whole file ("" when it cannot be read).
inline std::string slurp(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

//! Whether `part` occurs in `text`.
inline bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

//! A new folder under the system temp folder named `prefix`-XXXXXX.
inline fs::path make_scratch_dir(const std::string& prefix) {
  std::string pattern = (fs::temp_directory_path() / (prefix + "-XXXXXX")).string();
  if (!mkdtemp(pattern.data())) throw std::runtime_error("mkdtemp failed for " + pattern);
  return pattern;
}

//! Runs `env HARNESS_BINARY args` through the shell (args already quoted where needed), its stdout
//! and stderr captured through files in `capture_dir`.
inline Result run_harness(const std::string& args, const fs::path& capture_dir, const std::string& env = "") {
  const auto out = capture_dir / "stdout", err = capture_dir / "stderr";
  const std::string command = env + " " + HARNESS_BINARY + " " + args + " >" + out.string() + " 2>" + err.string();
  const int status = std::system(command.c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, slurp(out), slurp(err)};
}

//! A scratch folder per test, holding the db and the captured output; removed at scope end.
struct Sandbox {
  fs::path dir;
  explicit Sandbox(const std::string& prefix = "harness-cli") : dir(make_scratch_dir(prefix)) {}
  ~Sandbox() {
    std::error_code ignored;
    fs::remove_all(dir, ignored);
  }
  Sandbox(const Sandbox&) = delete;
  Sandbox& operator=(const Sandbox&) = delete;
  std::string db() const { return (dir / "test.db").string(); }
  //! Runs the harness binary with `args`; `env` ("VAR=value ...") goes before it.
  Result harness(const std::string& args, const std::string& env = "") const { return run_harness(args, dir, env); }
};

}  // namespace harness::test
