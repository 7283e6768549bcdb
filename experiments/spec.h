#pragma once
// Experiment specs: parse, apply profile and --set overrides, validate completely (every error
// at once, each naming the file, the JSON path and what was expected). The verdict rule's
// language lives in experiments/verdict.h. Torch-free.

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "experiments/tolerance.h"
#include "kernels/mask_desc.h"

namespace harness::spec {

//! What each dim can mean (experiments/README.md, "Bounds"): the loader refuses anything beyond,
//! and the memory model and the planner rely on it (every product they form fits int64, and the
//! parent's work does not grow with a count that means nothing).
inline constexpr int64_t kMaxBatch = 4096;
inline constexpr int64_t kMaxHeads = 1024;                  //!< the largest open models have 128 query heads
inline constexpr int64_t kMaxHeadDim = 1024;                //!< the kernels take 64 and 128
inline constexpr int64_t kMaxBlockSize = 4096;              //!< a draft block (DFlash: 16)
inline constexpr int64_t kMaxPositions = int64_t{1} << 24;  //!< Q_LEN and the context: 16 Mi positions each
inline constexpr int64_t kMaxLayers = 1024;                 //!< the deepest open models have about 128
inline constexpr int64_t kMaxMaskBlock = int64_t{1} << 16;  //!< BlockMask blocks (FlexAttention's default: 128)
//! One layer's attention: query-key pairs (B·H·Q·KV, the dense scores' elements), and the elements
//! of q, k, v and the output (B·H·(Q+KV)·D). Past these one layer's scores alone would be 256 TiB
//! in fp32, or one input tensor 2 TiB in bf16; within them every sum of the memory model, times
//! the layers, stays below 2^60 bytes.
inline constexpr int64_t kMaxScorePairs = int64_t{1} << 46;
inline constexpr int64_t kMaxTensorElements = int64_t{1} << 40;
//! A trial longer than a week is a unit mistake; the bound also keeps deadlines from overflowing.
inline constexpr double kMaxTimeoutS = 7 * 24 * 3600.0;

//! Why dims are beyond what one layer's attention can mean (a dim past its bound, or a product
//! past kMaxScorePairs or kMaxTensorElements), or "" when they are within.
std::string dims_product_problem(const kernels::AttentionGeometry& dims);

//! One problem found in a spec.
struct SpecIssue {
  std::string source;   //!< file path, with "(--set a.b=c)" when an override caused it
  std::string path;     //!< JSON path, e.g. "dims.heads" or "variants.fused.impl"
  std::string message;  //!< what was expected and what was found
  std::string to_string() const;  //!< "source: path: message"
};

//! How many problems of one spec are printed; the rest are counted ("... and 99 950 more").
inline constexpr size_t kMaxIssuesShown = 50;
//! How many problems of one spec are kept (a few hundred bytes each); beyond that they are only
//! counted, so that reporting a spec with 100 000 problems takes no more memory than this.
inline constexpr size_t kMaxIssuesKept = 200;

//! Thrown with the problems of a spec; the CLI prints them (the first kMaxIssuesShown) and exits
//! with code 2.
class SpecError : public std::runtime_error {
 public:
  //! Values quoted in the issues are clipped to a few hundred bytes; issues past kMaxIssuesKept
  //! are counted with `more`, the problems found but not kept.
  explicit SpecError(std::vector<SpecIssue> issues, size_t more = 0);
  //! The problems kept (at most kMaxIssuesKept, and a closing remark where checking stopped).
  const std::vector<SpecIssue>& issues() const { return issues_; }
  //! Problems found beyond those kept.
  size_t more() const { return more_; }
  //! Every problem found.
  size_t count() const { return issues_.size() + more_; }

 private:
  struct Clipped {};
  SpecError(Clipped, std::vector<SpecIssue> issues, size_t more);
  std::vector<SpecIssue> issues_;
  size_t more_ = 0;
};

//! One variant of an experiment.
struct Variant {
  std::string name;
  std::string impl;   //!< "fused" or "dense"
  std::string fault;  //!< test-only fault injection ("" when none): segfault, abort, throw, hang, oom
  //! attention_step, impl fused: the CUDA kernels to run ("kernel": {"fwd": ..., "bwd": ...});
  //! "" = the autotuner's pick. Names: kernels/cuda/attention_config.h (fwd/bwd_kernel_label).
  std::string fwd_kernel;
  std::string bwd_kernel;
  //! attention_step, impl fused: the deterministic CUDA backward ("deterministic": true); false
  //! lets the kernels take their fastest backward (atomics allowed).
  bool deterministic = false;
  bool sets_kernel_choice = false;  //!< whether the spec wrote "kernel" or "deterministic"
};

//! The kernel names a variant's "kernel" object may give: every forward and backward kernel of
//! the CUDA fused attention (known to this build's headers even when it has no CUDA kernels).
std::vector<std::string> known_fwd_kernels();
std::vector<std::string> known_bwd_kernels();
//! The variant's kernel choice as the dispatch trace records it ("fwd=wgmma_m64_n64 bwd=autotuned
//! deterministic=false"); "" when the variant sets neither "kernel" nor "deterministic".
std::string kernel_choice_text(const Variant& variant);

//! One clause of the verdict rule: `if` all conditions hold, the verdict is `then`.
//! A clause with no conditions is the `else`.
struct VerdictClause {
  std::string condition;  //!< as written: "fused.bwd_peak_bytes < 5GiB && fused.match"
  std::string then;
};


//! One swept field: its JSON path and the values it takes, in the order written.
struct SweepAxis {
  std::string path;                   //!< e.g. "dims.anchors"
  std::vector<nlohmann::json> values;
};

//! How a swept metric grows: fit per variant against each model's regressor (least squares
//! y = a·x + b) and name the model with the best R². Models: q_kv (H·Q·KV: one layer's
//! materialized scores), q_plus_kv (H·(Q+KV)·d: tensors linear in the lengths), and layers_q_kv,
//! layers_q_plus_kv (the same kept by every layer of the stack).
struct Scaling {
  std::string metric;               //!< e.g. "bwd_peak_bytes"
  std::vector<std::string> models;  //!< e.g. {"q_kv", "q_plus_kv"}
};

struct Spec;

//! One point of a sweep as the loader resolved and validated it.
struct ResolvedPoint {
  nlohmann::json point;               //!< {path: value}, as sweep_points() gives it
  std::shared_ptr<const Spec> spec;   //!< the spec at that point (no sweep of its own)
};

//! A validated experiment spec.
struct Spec {
  std::string name;
  std::string hypothesis;
  std::string kind;                 //!< attention_step, autotune_race, cache_corruption, python
  kernels::AttentionGeometry dims;
  std::string dtype = "bf16";       //!< bf16, fp16, fp32
  int64_t layers = 1;
  kernels::MaskDesc mask;
  int64_t mask_block = 128;         //!< BlockMask block size (q and kv), FlexAttention's default
  std::vector<Variant> variants;    //!< in spec order
  std::vector<std::string> measure;
  int repeats = 3;
  int warmup = 1;
  double timeout_s = 600.0;
  uint64_t seed = 0;                //!< input tensors
  bool check = true;                //!< compare outputs and gradients with the fp32 reference
  Tolerance tolerance;
  std::vector<VerdictClause> verdict;
  nlohmann::json params = nlohmann::json::object();  //!< the kind's own section (checked by the kind)
  std::vector<SweepAxis> sweep;     //!< empty: one point
  std::optional<Scaling> scaling;   //!< only with a sweep
  std::string model;                //!< the model whose shape dims took (experiments/models.h), "" for none
  std::string profile;              //!< applied profile, "" for none
  std::string source;               //!< file it came from
  nlohmann::json resolved;          //!< the JSON after profile and overrides (stored in the db)
  //! With a sweep: every point, resolved and validated once when the spec loaded, in the order of
  //! sweep_points() (spec_at_point() hands them out); empty without a sweep.
  std::vector<ResolvedPoint> points;
};

//! Options of loading a spec.
struct LoadOptions {
  std::string profile;                  //!< profile to apply ("" for none)
  //! Applied when `profile` is "" and the spec defines it (`run --device cpu`: "cpu"); an absent
  //! one is no error.
  std::string implicit_profile;
  std::string model;                    //!< --model: a model's attention shape into dims (after the profile)
  std::vector<std::string> overrides;   //!< "--set" arguments, "path=value" (after the model)
  bool allow_faults = false;            //!< accept variants' "fault" (tests only)
};

//! The text of a spec file, read once and only when it can be accepted (core/json_input.h:
//! a regular file of at most 16 MiB, its size checked before reading). Throws SpecError.
std::string read_spec_text(const std::string& path);
//! Reads, overrides and validates a spec file. Throws SpecError listing every problem.
Spec load_spec_file(const std::string& path, const LoadOptions& options = {});
//! Same from JSON text (source names it in messages).
Spec load_spec_text(const std::string& text, const std::string& source, const LoadOptions& options = {});
//! Validates the already resolved JSON (profile and overrides applied). Throws SpecError.
Spec parse_spec(const nlohmann::json& resolved, const std::string& source, bool allow_faults = false);
//! Whether the spec defines a profile of that name.
bool has_profile(const nlohmann::json& raw, const std::string& profile);

//! Searches experiment directories for "<name>.json" (or accepts a path). nullopt if none.
std::optional<std::string> find_spec(const std::string& name_or_path,
                                     const std::vector<std::string>& search_dirs);

}  // namespace harness::spec
