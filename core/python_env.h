#pragma once
// The Python interpreter a `python` experiment runs with (`harness run --python PATH`): where it
// is, and which torch and triton it imports. Joins the env fingerprint, so that runs from two
// venvs diff like runs from two toolchains. Torch-free: the interpreter runs in a child process
// (argv only, never a shell) and never initializes CUDA.

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace harness {

//! The absolute path execve would run for `program`: a name without '/' is searched in $PATH, a
//! path is taken as it is (made absolute). Symlinks are kept, since a venv's python is a symlink
//! to the system one and following it would hide which venv runs. nullopt when no executable
//! regular file is found.
std::optional<std::string> find_program(const std::string& program);

//! Runs `python` and returns {executable (the path run, see find_program), real_path (symlinks
//! resolved), prefix (sys.prefix: the venv), version, implementation, torch, torch_git, cuda
//! (torch.version.cuda), triton, numpy}; a package that is absent is null, one whose import fails
//! otherwise is null with "<name>_error" saying why. Throws UsageError when the interpreter does
//! not exist, cannot run, or does not answer within `timeout_s`.
nlohmann::json python_fingerprint(const std::string& python, double timeout_s);

}  // namespace harness
