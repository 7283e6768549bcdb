#pragma once
// What an allocator's out-of-memory message says, read in one place: PyTorch's CUDA caching
// allocator ("Tried to allocate 15.09 GiB. GPU 0 has a total capacity of 79.10 GiB ... this process
// has 84.07 GiB memory in use"), its CPU allocator ("you tried to allocate 1234 bytes"), and the
// harness's own cap ("requested 17179869184 bytes ... --memory-limit N bytes"). Used by the trial
// child, the python kind and `explain-oom`. Torch-free.

#include <cstdint>
#include <optional>
#include <string>

namespace harness {

//! The size in "tried to allocate N UNIT" (case-insensitive; UNIT as in core/byte_size.h, bytes
//! when absent), rounded to the nearest byte. nullopt when the text has no such phrase.
std::optional<int64_t> allocator_requested_bytes(const std::string& text);

//! What an out-of-memory message says: the size asked for and, where given, its context.
struct OomMessage {
  int64_t requested_bytes = 0;
  std::optional<int64_t> in_use_bytes;     //!< "this process has N GiB memory in use" / "N GiB already allocated" / "with N bytes in use"
  std::optional<int64_t> capacity_bytes;   //!< the cap ("N GiB allowed", "--memory-limit N bytes"), else "total capacity of N GiB"
  std::optional<int64_t> allocated_bytes;  //!< "N GiB is allocated by PyTorch"
  std::string device_kind;                 //!< "cuda", "cpu", or "" when the message does not say
};

//! Parses "Tried to allocate 15.09 GiB" (also MiB/KiB/bytes), the harness's "requested N bytes",
//! or a bare size ("15.09 GiB", "17179869184") into bytes, with the "N GiB in use" / "already
//! allocated" / capacity context where present. nullopt when the text names no positive size.
std::optional<OomMessage> parse_oom_message(const std::string& text);

}  // namespace harness
