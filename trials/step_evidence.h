#pragma once
// Evidence a trial's step leaves in the formats PyTorch users already read: the CUDA caching
// allocator's history as a snapshot pickle (PyTorch's memory_viz opens it), a Kineto profiler
// trace as Chrome-trace JSON (Perfetto and chrome://tracing open it), and labelled ranges around
// each phase (RecordFunction for Kineto, NVTX for Nsight Systems). Each file is stored in the
// artifact folder under the SHA-256 of its bytes, like capsules.

#include <ATen/ATen.h>
#include <ATen/record_function.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "experiments/kinds/trial.h"
#include "kernels/dispatch.h"

namespace harness::kinds {

//! File name endings of the two artifacts (after the sha256).
inline constexpr const char* kSnapshotExtension = ".snapshot.pickle";
inline constexpr const char* kTraceExtension = ".trace.json";
//! Most allocator events one history keeps (a real-dims step makes a few thousand).
inline constexpr size_t kMaxHistoryEntries = 200000;

//! Records the CUDA caching allocator's history (LibTorch's `_record_memory_history`, without
//! stack traces: they cost more than the step) while alive; nothing on the CPU.
class AllocatorHistory {
 public:
  explicit AllocatorHistory(const at::Device& device);
  ~AllocatorHistory();
  AllocatorHistory(const AllocatorHistory&) = delete;
  AllocatorHistory& operator=(const AllocatorHistory&) = delete;

  bool recording() const { return recording_; }
  //! Drops what was recorded so far (the measured step starts here) and keeps recording.
  void restart();
  //! Stops recording (what was recorded stays in the next snapshot).
  void stop();
  //! Writes the snapshot (`_memory_snapshot_pickled`) as <dir>/<sha256>.snapshot.pickle; nullopt
  //! when nothing was recorded. Throws std::runtime_error when the file cannot be written.
  std::optional<ArtifactRef> save(const std::string& dir) const;
  //! After a c10::OutOfMemoryError: writes the snapshot the allocator's OOM observer took at the
  //! failing allocation, while the step's tensors were still alive (`*at_the_oom` = true), else
  //! one taken now (after the unwinding freed them). Throws like save().
  std::optional<ArtifactRef> save_at_oom(const std::string& dir, bool* at_the_oom = nullptr) const;

 private:
  bool recording_ = false;
  bool stored_ = false;
};

//! Runs what happens between start() and stop_and_save() under the Kineto profiler (CPU ops,
//! and on a GPU the CUDA kernels and runtime calls).
class StepProfiler {
 public:
  explicit StepProfiler(const at::Device& device) : device_(device) {}
  ~StepProfiler();
  StepProfiler(const StepProfiler&) = delete;
  StepProfiler& operator=(const StepProfiler&) = delete;

  void start();
  //! Stops and writes the Chrome trace as <dir>/<sha256>.trace.json. Throws std::runtime_error.
  ArtifactRef stop_and_save(const std::string& dir);

 private:
  at::Device device_;
  bool running_ = false;
};

//! A labelled range around one phase: a user-scope RecordFunction (a span in the Kineto trace,
//! an annotation in the allocator snapshot) and, in a CUDA build, an NVTX range.
class PhaseRange {
 public:
  explicit PhaseRange(std::string label);
  ~PhaseRange();
  PhaseRange(const PhaseRange&) = delete;
  PhaseRange& operator=(const PhaseRange&) = delete;

 private:
  std::string label_;  // outlives the RecordFunction, which keeps a view of it
  std::unique_ptr<at::RecordFunction> record_;
  bool nvtx_ = false;
};

//! "harness fwd layer 0 | attention_fwd fused_cpu (block_m=64 block_n=64)": the phase and the
//! distinct implementations, kernels and configs the dispatch trace recorded for it (in an earlier
//! iteration: the range opens before this one's calls are made). No records: the phase alone.
std::string phase_label(const std::string& phase, const std::vector<kernels::DispatchRecord>& records);

}  // namespace harness::kinds
