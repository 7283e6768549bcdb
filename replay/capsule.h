#pragma once
// Capsules with LibTorch: write tensors into a capsule file, load them back as CPU tensors, and
// the pieces of a recorded attention step (its inputs, mask data and RNG states) that the trial
// child records before the step and restores for a replay. The format is replay/capsule_file.h's.

#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "replay/capsule_file.h"

namespace harness::replay {

//! Tensors by name, in the order they are written.
using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

//! Capsule dtype name ("bf16", "int64", ...) of a LibTorch dtype; throws CapsuleError for others.
std::string dtype_name(at::ScalarType type);
//! LibTorch dtype of a capsule dtype name; throws CapsuleError for an unknown name.
at::ScalarType scalar_type(const std::string& dtype);

//! Writes the tensors (any device; copied to contiguous CPU memory first) with `header` as
//! `<dir>/<sha256><extension>` (write_capsule_file).
WrittenCapsule write_capsule(const std::string& dir, nlohmann::json header, const NamedTensors& tensors,
                             const std::string& extension);

//! One tensor of a capsule as a CPU tensor, read straight into its storage.
at::Tensor load_tensor(const CapsuleInfo& info, const TensorEntry& entry);

//! A recorded attention step, as the trial runs it.
struct StepTensors {
  std::vector<at::Tensor> q, k, v, grad_out;  //!< per layer, on the CPU, in the spec's dtype
  std::optional<std::vector<int64_t>> anchors;  //!< dflash anchors, when recorded
  std::optional<std::vector<int32_t>> doc_id;   //!< document of each position, when recorded
  at::Tensor mask_bits;                         //!< blockmask: int32 [B, H, Q_LEN, words] (undefined otherwise)
  at::Tensor cpu_rng_state;                     //!< the default CPU generator's state (undefined when absent)
  at::Tensor cuda_rng_state;                    //!< the default CUDA generator's state of the trial's device
};

//! Loads the step recorded in an inspected capsule for `spec` (attention_step): checks that the
//! tensors fit the spec, then reads every tensor (their hashes are the replay parent's to verify,
//! once, before it starts the child). Throws CapsuleError naming the problem.
StepTensors load_step(const CapsuleInfo& info, const spec::Spec& spec);

//! The tensors of a step capsule in their recorded names: q.L, k.L, v.L, grad_out.L per layer,
//! mask.anchors, mask.doc_id and mask.bits when given, rng.cpu and rng.cuda when defined.
NamedTensors step_tensors(const StepTensors& step);

}  // namespace harness::replay
