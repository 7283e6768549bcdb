#pragma once
// Import of a step saved from Python (replay/save_step.py): torch.save of a dict of named tensors
// plus a "meta" JSON string, turned into a step capsule (and, when the file carries the step's
// outputs, an outputs file to compare the replay against). The declaration is torch-free so that
// `harness replay` can offer it in a child process; the implementation needs LibTorch.

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "replay/capsule_file.h"

namespace harness::replay {

//! A Python step brought in.
struct ImportedStep {
  WrittenCapsule capsule;                //!< the step capsule
  std::optional<WrittenCapsule> outputs; //!< the outputs the file holds (out, dq, dk, dv), if any
  nlohmann::json meta;                   //!< the file's meta
};

//! Reads `step_path`, checks it (tensors present, shapes consistent with each other and with the
//! meta's dims, the spec built from them valid, mask data in range) and writes the capsule into
//! `dir`. Throws CapsuleError naming the file and every problem.
ImportedStep import_step_file(const std::string& step_path, const std::string& dir);

}  // namespace harness::replay
