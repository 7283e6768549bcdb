#include "trials/step_evidence.h"

#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/csrc/cuda/memory_snapshot.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
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

}  // namespace

AllocatorHistory::AllocatorHistory(const at::Device& device) {
  if (!device.is_cuda()) return;
  // "all": allocations, frees and segment events; no context (stack traces) and a bounded ring.
  torch::cuda::_record_memory_history(std::optional<std::string>("all"), std::nullopt, "python", kMaxHistoryEntries,
                                      /*clearHistory=*/true);
  recording_ = true;
  stored_ = true;
}

AllocatorHistory::~AllocatorHistory() {
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
