#pragma once
// Memory model of the attention_step kind. For one variant of a spec it lists the tensors the step
// allocates and replays their allocations and frees in the order the code makes them (inputs, each
// layer's forward, the backward from the last layer to the first), which gives the forward and
// backward peaks as docs/RUNNING.md defines them (allocated bytes above the phase's start) and the
// point where a capped allocator runs out. The allocators differ by device kind: "cpu" is the
// harness's tracking allocator (exact bytes); "cuda" is PyTorch's caching allocator (blocks of
// 512 B; segments of 2 MiB, 20 MiB or the request rounded to 2 MiB, which decide where a cap is hit).
// Also: which tensor an OOM message's byte count could have been. Torch-free.

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/oom_message.h"
#include "experiments/spec.h"

namespace harness::memory_model {

//! One kind of tensor a variant allocates (each layer's copy of it counts in `count`).
struct Allocation {
  std::string tensor;            //!< e.g. "scores", "probabilities", "dq"
  std::vector<int64_t> shape;
  std::string dtype;             //!< bf16, fp16, fp32, bool, int32, uint8
  int64_t bytes = 0;             //!< of one such tensor: elements × element size
  std::string phase;             //!< inputs (before the step), fwd (freed in the forward), saved (alive when the backward starts), bwd
  std::string note;              //!< what it is, with its size formula (e.g. "H·Q·KV·4")
  int64_t count = 1;             //!< how many the step allocates (per-layer tensors: layers)
};

//! A term of a peak: tensors of one kind alive at the peak that the phase allocated (count, bytes
//! together), or, with negative bytes, ones alive at the phase's start and freed before the peak.
struct PeakTerm {
  std::string tensor;
  int64_t count = 0;
  int64_t bytes = 0;
};

//! The model's answer for one variant.
struct Prediction {
  std::string variant;
  std::string impl;                   //!< dense or fused
  std::string device_kind;            //!< cpu or cuda
  std::vector<Allocation> allocations;  //!< in the order first allocated
  int64_t fwd_peak_bytes = 0;         //!< as the device's allocator counts (cuda: 512-byte blocks)
  int64_t bwd_peak_bytes = 0;
  int64_t baseline_bytes = 0;         //!< allocated before the forward: inputs, masks, BlockMasks
  int64_t saved_bytes = 0;            //!< added by the forward and alive when the backward starts
  std::vector<PeakTerm> fwd_peak_terms;  //!< what makes up fwd_peak_bytes
  std::vector<PeakTerm> bwd_peak_terms;
  int cpu_threads = 1;                //!< cpu fused: workers whose tiles are counted at once
};

//! Knobs the spec does not carry.
struct ModelOptions {
  //! CPU fused kernel: worker threads assumed to hold their tile buffers at the same time (the
  //! peak is then an upper bound: threads rarely peak together). 0: std::thread::hardware_concurrency().
  int cpu_threads = 1;
  //! CUDA fused: the forward kernel that ran (its tiling sets the BlockMask and the schedule
  //! scratch), as the dispatch trace names it; "" is the untuned default.
  std::string cuda_fwd_kernel;
  //! CUDA fused: the backward kernel that ran, as the dispatch trace names it (wgmma_atomic adds its
  //! fp32 dQ accumulator to the scratch); "" is the untuned default (kernels/cuda/attention_config.h).
  std::string cuda_bwd_kernel;
};

//! Predicted allocations and peaks of one variant of an attention_step spec (spec.dims, spec.dtype,
//! spec.layers, spec.mask, spec.mask_block) on a device kind ("cpu" or "cuda"). Throws
//! std::invalid_argument for another kind of spec, an unknown variant or device kind.
Prediction predict(const spec::Spec& spec, const std::string& variant, const std::string& device_kind);
//! Same with options.
Prediction predict(const spec::Spec& spec, const std::string& variant, const std::string& device_kind,
                   const ModelOptions& options);
//! The prediction as JSON (what `run` stores and `--json` prints).
nlohmann::json to_json(const Prediction& prediction);

//! Bytes the device's allocator accounts for one tensor of `bytes` (cuda: a 512-byte multiple, at
//! least 512; cpu: the bytes themselves).
int64_t allocated_bytes(int64_t bytes, const std::string& device_kind);
//! Bytes a CUDA OOM message reports as "Tried to allocate": the segment the caching allocator asked
//! for (2 MiB for blocks up to 1 MiB, 20 MiB below 10 MiB, else rounded up to 2 MiB).
int64_t cuda_request_bytes(int64_t bytes);

//! Where a step runs out of memory under a cap, replaying the allocations through the device's
//! allocator (cuda: segments, best-fit reuse of freed blocks and splitting, so fragmentation can
//! end the step before the allocated bytes reach the cap).
struct OomPrediction {
  std::string tensor;            //!< the allocation that fails
  int64_t layer = 0;             //!< its layer (0-based)
  std::string phase;             //!< fwd or bwd (inputs when the inputs alone do not fit)
  int iteration = 0;             //!< 0 is the first warm-up step
  int64_t requested_bytes = 0;   //!< as the allocator reports it (cuda: the segment it asked for)
  int64_t allocated_bytes = 0;   //!< allocated by tensors just before
  int64_t reserved_bytes = 0;    //!< held by the allocator just before (cuda segments; cpu: = allocated)
};
//! The first allocation that does not fit in `limit_bytes` over the trial's warm-up and repeats;
//! nullopt when every step fits. Not modelled: cuBLAS workspaces (tens of MiB on an H200) and the
//! CUDA context, which is not allocator memory.
std::optional<OomPrediction> predict_oom(const spec::Spec& spec, const std::string& variant,
                                         const std::string& device_kind, int64_t limit_bytes,
                                         const ModelOptions& options = {});

//! A tensor whose size matches a byte count.
struct Match {
  std::string tensor;
  std::string variant;           //!< variants that allocate it, comma-separated ("dense" or "dense,fused")
  nlohmann::json point;          //!< sweep point ({} without a sweep)
  std::vector<int64_t> shape;
  std::string dtype;
  int64_t bytes = 0;             //!< the tensor's bytes
  double relative_error = 0.0;   //!< |bytes asked - tensor| / bytes asked (against the CUDA segment size when that is closer)
  std::string phase;
  std::string explanation;       //!< one line: formula with the numbers, and the tensors of the same size
  bool within_tolerance = true;  //!< false for the nearest tensors listed when none matches
  std::string occurrence;        //!< which one failed, when the OOM message's context and the OOM replay agree
};

//! Tensors of the spec's variants (at each sweep point when a list of point specs is given) whose
//! size matches `bytes`, best first.
std::vector<Match> explain(const std::vector<std::pair<nlohmann::json, spec::Spec>>& point_specs, int64_t bytes,
                           size_t limit = 10);

//! OOM messages are parsed by core/oom_message.h (harness::parse_oom_message).
using harness::OomMessage;
using harness::parse_oom_message;

//! How explain() matches.
struct ExplainOptions {
  double tolerance = 0.03;             //!< relative; PyTorch prints two decimals of the unit
  std::string device_kind = "cuda";    //!< whose tensors and rounding
  bool nearest_when_none = false;      //!< no match: list the nearest tensors, marked not within tolerance
  ModelOptions model;
};
//! explain() with options, and with an OOM message's context: where the message gives a cap
//! (capacity) and the replay under it fails on a tensor of the asked size, that match says which
//! one (layer, phase, allocated and reserved bytes before it).
std::vector<Match> explain(const std::vector<std::pair<nlohmann::json, spec::Spec>>& point_specs,
                           const OomMessage& message, const ExplainOptions& options, size_t limit = 10);

}  // namespace harness::memory_model
