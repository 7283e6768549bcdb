#pragma once
// Memory and time measurement inside a trial child: the CUDA caching allocator's peak
// allocated bytes on a GPU, a tracking CPU allocator giving the same two numbers on the CPU;
// CUDA events on a GPU, a steady clock on the CPU.

#include <ATen/ATen.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

namespace harness::kinds {

//! Replaces LibTorch's CPU allocator with one that counts live and peak bytes (idempotent).
//! Allocations that bypass c10's CPU allocator (oneDNN scratch, BLAS workspaces) are not seen.
void install_cpu_tracking_allocator();

//! Makes the device's allocator behave like a smaller device: allocations beyond `bytes` fail
//! with an out-of-memory error (CUDA: the caching allocator's per-process memory fraction; CPU:
//! the tracking allocator refuses them). 0 lifts the limit.
void set_memory_limit(const at::Device& device, int64_t bytes);

//! Allocated bytes on one device: current and peak since the last reset.
class MemoryMeter {
 public:
  explicit MemoryMeter(const at::Device& device);
  void reset_peak();
  int64_t current() const;
  int64_t peak() const;

 private:
  at::Device device_;
};

//! Times one phase: CUDA events on the device's current stream, or a steady clock on the CPU.
class PhaseTimer {
 public:
  explicit PhaseTimer(const at::Device& device);
  ~PhaseTimer();
  void start();
  //! Waits for the device and returns the elapsed milliseconds.
  double stop();

 private:
  at::Device device_;
  std::chrono::steady_clock::time_point host_start_;
  void* start_event_ = nullptr;
  void* stop_event_ = nullptr;
};

//! Waits for all work queued on the device.
void synchronize(const at::Device& device);

//! Exact requested bytes of the last CUDA OOM (from the caching allocator's OOM observer),
//! nullopt when none happened.
std::optional<int64_t> last_cuda_oom_request();
//! Registers the OOM observer on a CUDA device (idempotent).
void watch_cuda_oom(const at::Device& device);

}  // namespace harness::kinds
