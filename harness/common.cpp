#include "harness/common.h"

#include <unistd.h>

#include <climits>
#include <cstdlib>

#include "build_info.h"

namespace harness {

std::vector<std::string> experiment_search_dirs(const GlobalOptions& options) {
  std::vector<std::string> dirs = options.experiments_dirs;
  if (const char* env = std::getenv("HARNESS_EXPERIMENTS")) dirs.emplace_back(env);
  dirs.emplace_back("experiments");
  dirs.emplace_back(std::string(HARNESS_SOURCE_DIR) + "/experiments");
  return dirs;
}

std::string self_executable() {
  char buffer[PATH_MAX];
  const ssize_t length = readlink("/proc/self/exe", buffer, sizeof(buffer) - 1);
  if (length <= 0) throw std::runtime_error("cannot read /proc/self/exe");
  return std::string(buffer, static_cast<size_t>(length));
}

}  // namespace harness
