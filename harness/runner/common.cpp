#include "harness/runner/common.h"

#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>

#include "build_info.h"

namespace harness {

std::vector<std::string> experiment_search_dirs(const GlobalOptions& options) {
  std::vector<std::string> dirs = options.experiments_dirs;
  if (const char* env = std::getenv("HARNESS_EXPERIMENTS")) dirs.emplace_back(env);
  dirs.emplace_back("experiments");
  // An installed binary (cmake --install, pip install): <prefix>/bin/harness ships its specs in
  // <prefix>/share/harness/experiments, wherever the prefix was moved to (cmake/InstallLayout.cmake).
  try {
    const std::filesystem::path bin_dir = std::filesystem::path(self_executable()).parent_path();
    dirs.push_back((bin_dir / HARNESS_INSTALL_EXPERIMENTS_FROM_BIN).lexically_normal().string());
  } catch (const std::runtime_error&) {
    // No /proc/self/exe: the other directories still apply.
  }
  dirs.emplace_back(std::string(HARNESS_SOURCE_DIR) + "/experiments");
  return dirs;
}

Format output_format(GlobalOptions& options) {
  if (options.format.empty()) return options.json ? Format::kJson : Format::kText;
  const Format format = parse_format(options.format);
  if (options.json && format != Format::kJson) throw UsageError("--json and --format " + options.format + ": give one of them");
  if (format == Format::kJson) options.json = true;
  return format;
}

std::string self_executable() {
  char buffer[PATH_MAX];
  const ssize_t length = readlink("/proc/self/exe", buffer, sizeof(buffer) - 1);
  if (length <= 0) throw std::runtime_error("cannot read /proc/self/exe");
  return std::string(buffer, static_cast<size_t>(length));
}

}  // namespace harness
