#pragma once
// PyTorch CUDA allocator snapshots (the pickle `torch.cuda.memory._dump_snapshot` and LibTorch's
// `_memory_snapshot_pickled()` write, which memory_viz opens), read without LibTorch: the
// allocated and reserved bytes over the recorded trace, the allocations alive at the peak and at
// an out-of-memory event, named with the tensors the memory model predicts for the trial.
// Torch-free: the writeup renders them on any machine.

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "experiments/memory_model.h"

namespace harness::analysis {

//! A snapshot that is not one: not a pickle of the expected shape. The message names the file.
class SnapshotError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

//! One live allocation (a block of the caching allocator).
struct SnapshotBlock {
  int64_t address = 0;
  int64_t bytes = 0;       //!< the block's size (the request rounded to 512 B)
  std::string name;        //!< the predicted tensor(s) of that size ("scores = probabilities"), "" when none
};

//! One point of the timeline: after trace event `event`.
struct SnapshotPoint {
  double time_ms = 0.0;    //!< since the first recorded event
  int64_t allocated = 0;
  int64_t reserved = 0;
};

//! The failed allocation the trace recorded.
struct SnapshotOom {
  int64_t requested_bytes = 0;
  int64_t device_free_bytes = 0;
  double time_ms = 0.0;
  int64_t allocated = 0;              //!< just before it
  int64_t reserved = 0;
  std::vector<SnapshotBlock> live;    //!< by size, largest first
  std::string name;                   //!< predicted tensor of the requested size
};

//! What the writeup and `harness show` say about a snapshot (of the device with a trace).
struct SnapshotSummary {
  int device = 0;
  int64_t trace_events = 0;
  int64_t segments = 0;
  int64_t allocated_at_end = 0;       //!< active blocks when the snapshot was taken
  int64_t reserved_at_end = 0;        //!< segments' total size then
  int64_t peak_allocated = 0;         //!< largest allocated bytes over the trace (and the end state)
  double peak_time_ms = 0.0;
  std::vector<SnapshotBlock> at_peak;  //!< by size, largest first
  int64_t largest_block = 0;          //!< over the end state and the trace
  std::optional<SnapshotOom> oom;     //!< the last OOM event of the trace
  std::vector<SnapshotPoint> timeline;
};

//! Summarizes a snapshot already read from its pickle (analysis/pickle_reader.h). `where` names
//! it in errors. Throws SnapshotError.
SnapshotSummary summarize_snapshot(const nlohmann::json& snapshot, const std::string& where);
//! Reads and summarizes a snapshot pickle file. Throws SnapshotError.
SnapshotSummary read_snapshot(const std::string& path);

//! Names blocks by the tensors of `prediction` (a memory-model prediction on "cuda") whose
//! allocated size equals the block's: "scores = probabilities".
void name_blocks(SnapshotSummary& summary, const memory_model::Prediction& prediction);

//! The timeline as SVG: allocated and reserved bytes over time, the peak and the OOM marked.
std::string render_snapshot_timeline_svg(const SnapshotSummary& summary, const std::string& title);
//! The `top` largest allocations at the OOM (when there was one) or at the peak, as bars with
//! their sizes and predicted names, the failed request last.
std::string render_snapshot_peak_svg(const SnapshotSummary& summary, size_t top, const std::string& title);

}  // namespace harness::analysis
