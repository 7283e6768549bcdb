#pragma once
// Solving the memory model backwards: given the bytes an out-of-memory message asked for, the
// values of one free dimension (context, anchors, heads, batch) at which a tensor of the step
// asks the allocator for exactly that many bytes. `explain-oom` matches a message against the
// spec's own points; when none fits (the founding "Tried to allocate 15.09 GiB" is 6 % from the
// nearest sweep point, 16.00 GiB) this says which dims would reproduce it. Torch-free.

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "experiments/memory_model.h"
#include "experiments/spec.h"

namespace harness::memory_model {

//! The dims a solve can vary: their spec paths, in the order "every free one" tries them.
const std::vector<std::string>& solvable_dims();

//! Bytes a printed size stands for: "15.09 GiB" is any request in [15.085, 15.095) GiB, so the
//! closed byte interval [low, high] of requests PyTorch would print that way.
struct RequestInterval {
  int64_t low = 0;
  int64_t high = 0;
  int64_t nominal = 0;   //!< the printed value in bytes (15.09 × 2^30)
  std::string printed;   //!< "15.09 GiB" as the message wrote it; "" for an exact byte count
};
//! The interval of a message's requested size (the first "Tried to allocate N UNIT", "requested N
//! bytes" or bare size), or [bytes, bytes] when the text names the bytes exactly or is empty.
RequestInterval request_interval(const std::string& message_text, int64_t requested_bytes);

//! One tensor that asks for the message's bytes over a range of one dim's values.
struct Solution {
  std::string dim;                   //!< "dims.context"
  nlohmann::json point;              //!< the sweep point it was solved at ({} without a sweep)
  int64_t spec_value = 0;            //!< the dim's value at that point
  int64_t first = 0;                 //!< smallest value whose request lies in the interval
  int64_t last = 0;                  //!< largest one
  int64_t best = 0;                  //!< the valid value whose request is nearest the printed size
  int64_t best_request_bytes = 0;    //!< what the allocator asks for at `best`
  int64_t best_tensor_bytes = 0;     //!< the tensor's own bytes at `best`
  std::vector<int64_t> best_shape;
  std::string dtype;
  std::string tensor;                //!< first tensor kind, e.g. "scores"
  std::vector<std::string> others;   //!< other tensor kinds of the same size at `best`
  std::string variants;              //!< comma-separated
  std::string phase;
  std::string note;                  //!< the model's formula, e.g. "H·Q·KV·4"
  std::string invalid;               //!< non-empty: no value of the range makes a valid spec (why)
  std::vector<std::string> set_args; //!< the --set arguments that replay `best` at its point
};

//! Per dim: its solutions, or why there are none.
struct DimSolve {
  std::string dim;
  std::vector<Solution> solutions;
  std::string skipped;  //!< "pinned by --set", "" when it was solved
};

//! Solves each of `dims` ("dims.context", or the short "context") at every point: the values of
//! that dim (the others as the point has them) at which some tensor's request, as the device's
//! allocator reports it (cuda_request_bytes on cuda, the bytes on cpu), lies in `interval`. A
//! dim in `pinned` is skipped with that reason. Throws std::invalid_argument for a dim it cannot solve.
std::vector<DimSolve> solve(const std::vector<std::pair<nlohmann::json, spec::Spec>>& point_specs,
                            const std::vector<std::string>& dims, const std::vector<std::string>& pinned,
                            const RequestInterval& interval, const std::string& device_kind,
                            const ModelOptions& options = {});

//! The solve as JSON (for --json).
nlohmann::json to_json(const DimSolve& solve);

}  // namespace harness::memory_model
