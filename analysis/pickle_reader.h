#pragma once
// A reader of the subset of Python's pickle format that plain data uses: dicts, lists, tuples,
// strings, bytes, ints of any size, floats, booleans and None, with the memo (protocols 2 to 5,
// framing included). That is what PyTorch's allocator snapshots are: LibTorch's
// `_memory_snapshot_pickled()` and Python's `pickle.dump(torch.cuda.memory._snapshot())` both
// write only such values. Anything else (classes, reduce calls, persistent ids) is refused, never
// executed. Torch-free, so the writeup reads snapshots on any machine.

#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

namespace harness::analysis {

//! A pickle this reader cannot read: truncated, corrupt, or using an opcode outside the subset.
//! The message names the opcode and its byte offset.
class PickleError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

//! The value a pickle holds, as JSON: dict -> object (non-string keys written as their JSON
//! text), list and tuple -> array, bytes -> string of the raw bytes, ints beyond 64 bits -> double.
//! Throws PickleError.
nlohmann::json read_pickle(const std::string& bytes);

}  // namespace harness::analysis
