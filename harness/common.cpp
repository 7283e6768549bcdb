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

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

namespace harness {

void write_file_atomic(const std::string& path, const std::string& content) {
  const std::string temporary = path + ".tmp." + std::to_string(getpid());
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    out << content;
    out.flush();
    if (!out) throw InfraError("cannot write " + temporary + ": " + std::strerror(errno));
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    const std::string reason = std::strerror(errno);
    std::remove(temporary.c_str());
    throw InfraError("cannot rename " + temporary + " to " + path + ": " + reason);
  }
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InfraError("cannot read " + path + ": " + std::strerror(errno));
  std::ostringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

}  // namespace harness
