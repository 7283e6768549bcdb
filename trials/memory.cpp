#include "trials/memory.h"

#include <c10/core/CPUAllocator.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <stdexcept>

namespace harness::kinds {
namespace {

// Wraps the default CPU allocator; each allocation carries its size in the DataPtr context.
class TrackingCpuAllocator final : public c10::Allocator {
 public:
  explicit TrackingCpuAllocator(c10::Allocator* base) : base_(base) {}

  c10::DataPtr allocate(size_t bytes) override {
    const int64_t limit = limit_.load();
    const int64_t in_use = current_.load();
    TORCH_CHECK_WITH(OutOfMemoryError, limit <= 0 || in_use + static_cast<int64_t>(bytes) <= limit,
                     "CPU out of memory under --memory-limit ", limit, " bytes: tried to allocate ", bytes,
                     " bytes with ", in_use, " bytes in use");
    c10::DataPtr inner = base_->allocate(bytes);
    void* data = inner.get();
    const c10::Device device = inner.device();
    auto* context = new Allocation{std::move(inner), static_cast<int64_t>(bytes), this};
    add(static_cast<int64_t>(bytes));
    return {data, context, &release, device};
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

  int64_t current() const { return current_.load(); }
  int64_t peak() const { return peak_.load(); }
  void reset_peak() { peak_.store(current_.load()); }
  void set_limit(int64_t bytes) { limit_.store(bytes); }

 private:
  struct Allocation {
    c10::DataPtr inner;
    int64_t bytes;
    TrackingCpuAllocator* owner;
  };
  static void release(void* context) {
    auto* allocation = static_cast<Allocation*>(context);
    allocation->owner->add(-allocation->bytes);
    delete allocation;  // frees through the inner DataPtr's deleter
  }
  void add(int64_t delta) {
    const int64_t now = current_.fetch_add(delta) + delta;
    int64_t seen = peak_.load();
    while (now > seen && !peak_.compare_exchange_weak(seen, now)) {
    }
  }

  c10::Allocator* base_;
  std::atomic<int64_t> current_{0};
  std::atomic<int64_t> peak_{0};
  std::atomic<int64_t> limit_{0};
};

TrackingCpuAllocator* g_cpu_tracker = nullptr;
std::once_flag g_cpu_once;

std::atomic<int64_t> g_last_oom_request{-1};
std::once_flag g_oom_once;

void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status));
}

}  // namespace

void install_cpu_tracking_allocator() {
  std::call_once(g_cpu_once, [] {
    // Leaked on purpose: tensors may outlive any scope that could own it.
    g_cpu_tracker = new TrackingCpuAllocator(c10::GetCPUAllocator());
    c10::SetCPUAllocator(g_cpu_tracker, /*priority=*/100);
  });
}

void set_memory_limit(const at::Device& device, int64_t bytes) {
  if (device.is_cuda()) {
    size_t free_bytes = 0, total_bytes = 0;
    c10::cuda::CUDAGuard guard(device.index());
    // The caching allocator refuses a memory fraction for a device it has not initialized yet
    // ("Allocator not initialized for device"); a first small allocation initializes it.
    at::empty({1}, at::TensorOptions().dtype(at::kByte).device(device));
    check_cuda(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
    const double fraction = bytes > 0 ? std::min(1.0, static_cast<double>(bytes) / static_cast<double>(total_bytes)) : 1.0;
    c10::cuda::CUDACachingAllocator::setMemoryFraction(fraction, device.index());
    return;
  }
  install_cpu_tracking_allocator();
  g_cpu_tracker->set_limit(bytes);
}

MemoryMeter::MemoryMeter(const at::Device& device) : device_(device) {
  if (device_.is_cpu()) install_cpu_tracking_allocator();
}

void MemoryMeter::reset_peak() {
  if (device_.is_cuda()) {
    c10::cuda::CUDACachingAllocator::resetPeakStats(device_.index());
  } else {
    g_cpu_tracker->reset_peak();
  }
}

int64_t MemoryMeter::current() const {
  if (device_.is_cuda()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device_.index());
    return stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)].current;
  }
  return g_cpu_tracker->current();
}

int64_t MemoryMeter::peak() const {
  if (device_.is_cuda()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device_.index());
    return stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)].peak;
  }
  return g_cpu_tracker->peak();
}

PhaseTimer::PhaseTimer(const at::Device& device) : device_(device) {
  if (device_.is_cuda()) {
    cudaEvent_t start_event, stop_event;
    check_cuda(cudaEventCreate(&start_event), "cudaEventCreate");
    check_cuda(cudaEventCreate(&stop_event), "cudaEventCreate");
    start_event_ = start_event;
    stop_event_ = stop_event;
  }
}

PhaseTimer::~PhaseTimer() {
  if (start_event_) cudaEventDestroy(static_cast<cudaEvent_t>(start_event_));
  if (stop_event_) cudaEventDestroy(static_cast<cudaEvent_t>(stop_event_));
}

void PhaseTimer::start() {
  if (device_.is_cuda()) {
    const auto stream = c10::cuda::getCurrentCUDAStream(device_.index()).stream();
    check_cuda(cudaEventRecord(static_cast<cudaEvent_t>(start_event_), stream), "cudaEventRecord");
  } else {
    host_start_ = std::chrono::steady_clock::now();
  }
}

double PhaseTimer::stop() {
  if (device_.is_cuda()) {
    const auto stream = c10::cuda::getCurrentCUDAStream(device_.index()).stream();
    check_cuda(cudaEventRecord(static_cast<cudaEvent_t>(stop_event_), stream), "cudaEventRecord");
    check_cuda(cudaEventSynchronize(static_cast<cudaEvent_t>(stop_event_)), "cudaEventSynchronize");
    float ms = 0.0f;
    check_cuda(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start_event_),
                                    static_cast<cudaEvent_t>(stop_event_)),
               "cudaEventElapsedTime");
    return ms;
  }
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - host_start_).count();
}

void synchronize(const at::Device& device) {
  if (device.is_cuda()) c10::cuda::device_synchronize();
}

void watch_cuda_oom(const at::Device& device) {
  if (!device.is_cuda()) return;
  std::call_once(g_oom_once, [] {
    c10::cuda::CUDACachingAllocator::attachOutOfMemoryObserver(
        [](int64_t /*device*/, size_t alloc, size_t /*total*/, size_t /*free*/) {
          g_last_oom_request.store(static_cast<int64_t>(alloc));
        });
  });
}

std::optional<int64_t> last_cuda_oom_request() {
  const int64_t value = g_last_oom_request.load();
  if (value < 0) return std::nullopt;
  return value;
}

}  // namespace harness::kinds
