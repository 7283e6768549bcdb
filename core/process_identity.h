#pragma once
// Who owns a run: host, pid and the process's start time. A pid alone is reused after the process
// dies; pid + start time (clock ticks since boot, with the boot's id) names one process for as
// long as the machine is up. Torch-free.

#include <optional>
#include <string>

namespace harness {

//! One process of one boot of one host.
struct ProcessIdentity {
  std::string host;   //!< gethostname()
  long pid = 0;
  std::string start;  //!< "<boot id>/<start time in clock ticks>"; "" when unknown
};

//! This process.
ProcessIdentity current_process();

//! Whether the process still runs: true or false on the same host, nullopt for another host
//! (a run started on another node of a cluster cannot be judged from here) or no identity.
std::optional<bool> process_alive(const ProcessIdentity& process);

//! The start token of `pid` on this machine ("" when it does not exist).
std::string process_start_token(long pid);

}  // namespace harness
