#include "core/process_identity.h"

#include <unistd.h>

#include <fstream>
#include <sstream>

namespace harness {
namespace {

std::string boot_id() {
  static const std::string id = [] {
    std::ifstream in("/proc/sys/kernel/random/boot_id");
    std::string text;
    std::getline(in, text);
    return text;
  }();
  return id;
}

std::string host_name() {
  char buffer[256] = {};
  if (gethostname(buffer, sizeof(buffer) - 1) != 0) return "";
  return buffer;
}

}  // namespace

std::string process_start_token(long pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!in || !std::getline(in, stat)) return "";
  // Field 2 (the command name) is in parentheses and may hold spaces: fields count from the last ')'.
  const auto close = stat.rfind(')');
  if (close == std::string::npos) return "";
  std::istringstream fields(stat.substr(close + 2));
  std::string field;
  for (int index = 3; index <= 22 && fields >> field; ++index) {
    if (index == 3 && (field == "Z" || field == "X")) return "";  // ended, not yet reaped: gone all the same
    if (index == 22) return boot_id() + "/" + field;              // starttime
  }
  return "";
}

ProcessIdentity current_process() {
  static const ProcessIdentity self = [] {
    ProcessIdentity identity;
    identity.host = host_name();
    identity.pid = static_cast<long>(getpid());
    identity.start = process_start_token(identity.pid);
    return identity;
  }();
  return self;
}

std::optional<bool> process_alive(const ProcessIdentity& process) {
  if (process.pid <= 0 || process.host.empty() || process.host != host_name()) return std::nullopt;
  const std::string start = process_start_token(process.pid);
  if (start.empty()) return false;  // no such process
  return process.start.empty() || start == process.start;
}

}  // namespace harness
