#include "trials/step_evidence.h"

#include <torch/csrc/autograd/profiler_kineto.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <torch/csrc/cuda/memory_snapshot.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>
#include <stdexcept>

#if defined(HARNESS_WITH_CUDA_KERNELS) && __has_include(<nvtx3/nvToolsExt.h>)
#include <nvtx3/nvToolsExt.h>
#define HARNESS_NVTX 1
#endif

#include "core/files.h"
#include "db/store.h"

namespace harness::kinds {
namespace {

namespace fs = std::filesystem;

// Stores `bytes` as <dir>/<sha256><extension> (atomically); the same content has the same name.
ArtifactRef store_artifact(const std::string& kind, const std::string& dir, const std::string& bytes,
                           const std::string& extension) {
  std::error_code error;
  fs::create_directories(dir, error);
  if (error) throw std::runtime_error("cannot create the artifact folder " + dir + ": " + error.message());
  const std::string sha = db::sha256_hex(bytes);
  const std::string path = fs::absolute(fs::path(dir) / (sha + extension)).string();
  if (!fs::exists(path)) write_file_atomic(path, bytes);
  return {kind, sha, path, static_cast<int64_t>(bytes.size())};
}

// The snapshot taken by the caching allocator's out-of-memory observer: at the moment an
// allocation fails, before the exception unwinds the step and frees its tensors (a snapshot taken
// in the catch block shows the failing step's blocks already freed). The allocator calls its
// observers after releasing its lock, so the observer can snapshot it (PyTorch's documented
// pattern: torch._C._cuda_attach_out_of_memory_observer). Observers cannot be detached: one is
// attached per process and armed by the AllocatorHistory that is alive.
struct OomCapture {
  std::mutex mutex;
  bool armed = false;
  std::optional<std::string> snapshot;
};

OomCapture& oom_capture() {
  static OomCapture capture;
  return capture;
}

void attach_oom_observer() {
  static std::once_flag once;
  std::call_once(once, [] {
    c10::cuda::CUDACachingAllocator::attachOutOfMemoryObserver([](int64_t, size_t, size_t, size_t) {
      OomCapture& capture = oom_capture();
      std::lock_guard<std::mutex> lock(capture.mutex);
      if (!capture.armed || capture.snapshot) return;  // the first OOM of the step is the one to explain
      try {
        capture.snapshot = torch::cuda::_memory_snapshot_pickled();
      } catch (...) {
        // No snapshot at the OOM; save_at_oom() falls back to one taken after it.
      }
    });
  });
}

void arm_oom_capture(bool armed) {
  OomCapture& capture = oom_capture();
  std::lock_guard<std::mutex> lock(capture.mutex);
  capture.armed = armed;
  capture.snapshot.reset();
}

}  // namespace

AllocatorHistory::AllocatorHistory(const at::Device& device) {
  if (!device.is_cuda()) return;
  attach_oom_observer();
  arm_oom_capture(true);
  // "all": allocations, frees and segment events; no context (stack traces) and a bounded ring.
  torch::cuda::_record_memory_history(std::optional<std::string>("all"), std::nullopt, "python", kMaxHistoryEntries,
                                      /*clearHistory=*/true);
  recording_ = true;
  stored_ = true;
}

AllocatorHistory::~AllocatorHistory() {
  if (stored_) arm_oom_capture(false);
  try {
    stop();
  } catch (...) {
    // Stopping only fails when CUDA is already broken; the trial reports that error itself.
  }
}

void AllocatorHistory::restart() {
  if (!stored_) return;
  torch::cuda::_record_memory_history(std::optional<std::string>("all"), std::nullopt, "python", kMaxHistoryEntries,
                                      /*clearHistory=*/true);
  recording_ = true;
}

void AllocatorHistory::stop() {
  if (!recording_) return;
  recording_ = false;
  torch::cuda::_record_memory_history(std::nullopt);
}

std::optional<ArtifactRef> AllocatorHistory::save(const std::string& dir) const {
  if (!stored_ || dir.empty()) return std::nullopt;
  return store_artifact("memory_snapshot", dir, torch::cuda::_memory_snapshot_pickled(), kSnapshotExtension);
}

std::optional<ArtifactRef> AllocatorHistory::save_at_oom(const std::string& dir, bool* at_the_oom) const {
  if (at_the_oom) *at_the_oom = false;
  if (!stored_ || dir.empty()) return std::nullopt;
  std::optional<std::string> captured;
  {
    OomCapture& capture = oom_capture();
    std::lock_guard<std::mutex> lock(capture.mutex);
    captured.swap(capture.snapshot);
  }
  if (!captured) return save(dir);
  if (at_the_oom) *at_the_oom = true;
  return store_artifact("memory_snapshot", dir, *captured, kSnapshotExtension);
}

StepProfiler::~StepProfiler() {
  if (!running_) return;
  try {
    torch::autograd::profiler::disableProfiler();
  } catch (...) {
    // The step already failed; a profiler that cannot stop leaves no trace, nothing more.
  }
}

void StepProfiler::start() {
  namespace impl = torch::profiler::impl;
  const impl::ProfilerConfig config(impl::ProfilerState::KINETO, /*report_input_shapes=*/true, /*profile_memory=*/false,
                                    /*with_stack=*/false, /*with_flops=*/false, /*with_modules=*/false);
  std::set<impl::ActivityType> activities = {impl::ActivityType::CPU};
  if (device_.is_cuda()) activities.insert(impl::ActivityType::CUDA);
  torch::autograd::profiler::prepareProfiler(config, activities);
  torch::autograd::profiler::enableProfiler(config, activities);
  running_ = true;
}

ArtifactRef StepProfiler::stop_and_save(const std::string& dir) {
  if (!running_) throw std::logic_error("StepProfiler::stop_and_save without start");
  running_ = false;
  const auto result = torch::autograd::profiler::disableProfiler();
  // Kineto writes the file itself: a temporary one in the folder, read back to be named by its hash.
  std::error_code error;
  fs::create_directories(dir, error);
  std::string temporary = (fs::path(dir) / ".trace-XXXXXX").string();
  const int fd = ::mkstemp(temporary.data());
  if (fd < 0) throw std::runtime_error("cannot create a temporary file in " + dir);
  ::close(fd);
  result->save(temporary);
  std::ifstream in(temporary, std::ios::binary);
  std::ostringstream bytes;
  bytes << in.rdbuf();
  ::unlink(temporary.c_str());
  if (bytes.str().empty()) throw std::runtime_error("the profiler wrote an empty trace");
  return store_artifact("trace", dir, bytes.str(), kTraceExtension);
}

PhaseRange::PhaseRange(std::string label) : label_(std::move(label)) {
  record_ = std::make_unique<at::RecordFunction>(at::RecordScope::USER_SCOPE);
  if (record_->isActive()) record_->before(std::string_view(label_));
#ifdef HARNESS_NVTX
  nvtxRangePushA(label_.c_str());
  nvtx_ = true;
#endif
}

PhaseRange::~PhaseRange() {
  record_.reset();  // ends the RecordFunction
#ifdef HARNESS_NVTX
  if (nvtx_) nvtxRangePop();
#endif
}

std::string phase_label(const std::string& phase, const std::vector<kernels::DispatchRecord>& records) {
  std::string label = "harness " + phase;
  std::vector<std::string> seen;
  for (const auto& r : records) {
    std::string part = r.op + " " + r.impl + (r.kernel.empty() ? "" : " " + r.kernel) + (r.config.empty() ? "" : " (" + r.config + ")");
    if (std::find(seen.begin(), seen.end(), part) != seen.end()) continue;
    seen.push_back(part);
    label += (seen.size() == 1 ? " | " : "; ") + part;
  }
  return label;
}

}  // namespace harness::kinds
