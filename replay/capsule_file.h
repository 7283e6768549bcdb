#pragma once
// The capsule file format (replay/README.md), torch-free: a safetensors file whose metadata holds
// the capsule header (version 2), or the legacy layout (version 1: a one-line preamble, a JSON
// header, then the raw bytes of every tensor), which is still read and verified. The parent reads and verifies capsules with this (hash,
// truncation, tensors against the spec) and compares recorded outputs; the trial child writes
// and loads them through replay/capsule.h, which adds LibTorch on top.

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "experiments/kinds/trial.h"
#include "experiments/spec.h"

namespace harness::replay {

//! A capsule that cannot be used: not a capsule, truncated, hash mismatch, tensors that do not fit
//! its spec. The message names the file and the problem.
class CapsuleError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

//! The capsule header's "format"; also the first bytes of a legacy (version 1) capsule file,
//! followed there by " <version> <header bytes> <payload offset>\n".
inline constexpr const char* kCapsuleMagic = "harness-capsule";
//! The format version this binary writes (safetensors) and reads.
inline constexpr int kCapsuleVersion = 2;
//! The legacy layout, still read and verified.
inline constexpr int kLegacyCapsuleVersion = 1;
//! The payload (safetensors' data) starts at a multiple of this.
inline constexpr int64_t kCapsuleAlignment = 64;
//! safetensors' key of its string map, where the capsule header lives (as the string "capsule").
inline constexpr const char* kSafetensorsMetadataKey = "__metadata__";
//! safetensors' own limit on its JSON header (100 MB).
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;
//! File name extension of a step's inputs and of a trial's outputs.
inline constexpr const char* kStepExtension = ".capsule";
inline constexpr const char* kOutputsExtension = ".outputs";

//! One tensor of a capsule, as its header lists it.
struct TensorEntry {
  std::string name;            //!< "q.0", "grad_out.3", "mask.anchors", "rng.cpu", "dq.0", ...
  std::string dtype;           //!< bf16, fp16, fp32, fp64, int32, int64, uint8, bool
  std::vector<int64_t> shape;
  int64_t offset = 0;          //!< from the start of the payload
  int64_t bytes = 0;
  std::string sha256;          //!< of the tensor's bytes
};

//! A capsule file whose structure was checked: preamble, header, sizes.
struct CapsuleInfo {
  std::string path;
  std::string sha256;          //!< the capsule's id: sha256 of its header (which holds every tensor's sha256)
  int64_t file_bytes = 0;
  int64_t payload_offset = 0;  //!< of the first payload byte in the file (safetensors: 8 + its header length)
  int version = 0;             //!< kCapsuleVersion, or kLegacyCapsuleVersion for an old capsule
  nlohmann::json header;
  std::vector<TensorEntry> tensors;

  //! The entry of that name, or nullptr.
  const TensorEntry* find(const std::string& name) const;
};

//! Bytes of one element of a capsule dtype; nullopt for an unknown name.
std::optional<int64_t> dtype_bytes(const std::string& dtype);

//! Name of a per-layer tensor: "q.0", "dv.4".
std::string layer_tensor_name(const std::string& tensor, int64_t layer);

//! Reads and checks a capsule's structure; with `verify_payload`, also every tensor's bytes
//! against its sha256 (reads the whole file, hashing tensors on several threads). When
//! `expected_sha256` is given it must equal the capsule's id (`expected_from` names who expects
//! it, e.g. "the db (trial 12)"). Throws CapsuleError naming the file and the problem.
CapsuleInfo inspect_capsule(const std::string& path, bool verify_payload,
                            const std::optional<std::string>& expected_sha256 = std::nullopt,
                            const std::string& expected_from = "");

//! Whether the file starts like a safetensors file (8-byte length, then '{').
bool is_safetensors_file(const std::string& path);
//! Any safetensors file (one written from Python, not only a capsule): its tensors (sha256
//! empty; offsets from the data's start) and, as `header`, its __metadata__ strings. Throws
//! CapsuleError naming the file and what is wrong.
CapsuleInfo read_safetensors(const std::string& path);

//! One tensor to write: what its header entry says, and where its bytes are (C order).
struct TensorData {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  int64_t bytes = 0;
};

//! A capsule file on disk.
struct WrittenCapsule {
  std::string sha256;
  std::string path;      //!< absolute
  int64_t bytes = 0;
  bool created = false;  //!< false when a file with the same content (so the same name) was already there
};

//! Writes `header` (any JSON object; "format", "version", "tensors" and "payload_bytes" are
//! filled in) and the tensors as a safetensors file `<dir>/<sha256><extension>` (the header in
//! its __metadata__ "capsule"), through a temporary file and
//! link(), so a reader never sees a partial capsule and two writers of the same content agree.
//! Creates `dir`. Throws CapsuleError when it cannot write.
WrittenCapsule write_capsule_file(const std::string& dir, nlohmann::json header, const std::vector<TensorData>& tensors,
                                  const std::string& extension);

//! The raw bytes of one tensor (little-endian, C order). Throws CapsuleError.
std::string read_tensor_bytes(const CapsuleInfo& info, const TensorEntry& entry);
//! Reads one tensor's `entry.bytes` bytes into `out`. Throws CapsuleError.
void read_tensor_into(const CapsuleInfo& info, const TensorEntry& entry, void* out);

//! Checks that a step capsule's tensors fit `spec` (attention_step): every layer's q, k, v,
//! grad_out with the spec's shapes and dtype, no other layers, and mask data (when present) of
//! the right length with anchors inside the context. Throws CapsuleError naming each problem.
void check_step_fits_spec(const CapsuleInfo& info, const spec::Spec& spec);

//! How one tensor of two outputs files compares.
struct TensorComparison {
  std::string name;
  bool bitwise_equal = false;
  double max_abs_err = 0.0;   //!< max |replay - original| over finite pairs
  double max_rel_err = 0.0;   //!< max_abs_err / max |original| (0 when the original is all zero)
  int64_t nonfinite_mismatches = 0;  //!< positions where exactly one side, or differing kinds, are NaN/Inf
  std::string note;           //!< "missing in replay", "shape differs", ...
};

//! Compares the tensors of two outputs files (same names): bitwise through their sha256, and
//! otherwise element by element (bf16, fp16, fp32, fp64). Throws CapsuleError.
std::vector<TensorComparison> compare_outputs(const CapsuleInfo& original, const CapsuleInfo& replay);
//! The comparison as JSON (for the db and --json).
nlohmann::json to_json(const std::vector<TensorComparison>& comparisons);

//! Where the trial child tells its parent which capsule it wrote, before the step runs: the
//! parent reads it when the child died without a result file.
std::string capsule_sidecar_path(const std::string& result_path);
//! The artifact named by a trial's sidecar, when the sidecar and the capsule both exist.
std::optional<kinds::ArtifactRef> read_capsule_sidecar(const std::string& result_path);

//! sha256 of a byte range (lowercase hex); threads of `sha256_parallel` call this.
std::string sha256_of(const void* data, size_t bytes);
//! sha256 of each byte range, computed on up to hardware_concurrency threads (a capsule of 5 real
//! layers is ~1 GB; one core hashes ~100-250 MB/s, so this is the difference between ~5 s and < 1 s).
std::vector<std::string> sha256_parallel(const std::vector<std::pair<const void*, size_t>>& ranges);

}  // namespace harness::replay
