// Device part of the env fingerprint: the only place besides the trial entry point that asks
// LibTorch and the CUDA driver about the machine.
#include <dlfcn.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/Version.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <torch/version.h>

#if __has_include(<ATen/cuda/CUDAContext.h>)
#include <ATen/cuda/CUDAContext.h>
#define HARNESS_HAVE_ATEN_CUDA 1
#endif

#include <string>

#include "harness/runner/common.h"
#include "harness/runner/env.h"

namespace harness {
namespace {

// The driver version comes from libcuda itself (not the runtime), so it is read through
// dlopen: the binary must also run on machines without a driver.
std::string cuda_driver_version() {
  void* handle = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  if (!handle) return "none";
  using GetVersion = int (*)(int*);
  auto get_version = reinterpret_cast<GetVersion>(dlsym(handle, "cuDriverGetVersion"));
  int version = 0;
  std::string result = "unknown";
  if (get_version && get_version(&version) == 0)
    result = std::to_string(version / 1000) + "." + std::to_string((version % 1000) / 10);
  dlclose(handle);
  return result;
}

std::string dotted_cuda_version(long version) {
  if (version <= 0) return "none";
  return std::to_string(version / 1000) + "." + std::to_string((version % 1000) / 10);
}

}  // namespace

nlohmann::json device_fingerprint(const std::string& device) {
  nlohmann::json env;
  env["libtorch"] = TORCH_VERSION;
  env["cuda_driver"] = cuda_driver_version();
  const auto& hooks = at::detail::getCUDAHooks();
  const bool has_cuda = at::hasCUDA();
  env["cuda_runtime"] = has_cuda ? dotted_cuda_version(hooks.versionCUDART()) : "none";
  // cuDNN encodes its version as major*10000 + minor*100 + patch (91900 is 9.19.0).
  const long cudnn = has_cuda ? hooks.versionCuDNN() : 0;
  env["cudnn"] = cudnn > 0 ? std::to_string(cudnn / 10000) + "." + std::to_string(cudnn % 10000 / 100) + "." +
                                 std::to_string(cudnn % 100)
                           : "none";
  env["cpu_threads"] = at::get_num_threads();
  if (device.rfind("cuda", 0) != 0) return env;

  const int64_t index = device == "cuda" ? 0 : std::stoll(device.substr(5));
  const int64_t count = has_cuda ? static_cast<int64_t>(hooks.getNumGPUs()) : 0;
  env["gpu_count"] = count;
  if (index < 0 || index >= count)
    throw UsageError("--device " + device + ": no such device (this machine has " + std::to_string(count) +
                     " CUDA device" + (count == 1 ? "" : "s") + ")");
#ifdef HARNESS_HAVE_ATEN_CUDA
  const cudaDeviceProp* props = at::cuda::getDeviceProperties(static_cast<c10::DeviceIndex>(index));
  env["gpu_name"] = props->name;
  env["gpu_capability"] = std::to_string(props->major) + "." + std::to_string(props->minor);
  env["gpu_memory_bytes"] = static_cast<int64_t>(props->totalGlobalMem);
  env["gpu_sm_count"] = props->multiProcessorCount;
#else
  env["device_error"] = "this LibTorch has no CUDA headers";
#endif
  return env;
}

nlohmann::json full_fingerprint(const std::string& device) {
  nlohmann::json env = host_fingerprint();
  env.update(device_fingerprint(device));
  return env;
}

}  // namespace harness
