#pragma once
// CUDA error checks that throw (never exit()): the trial turns the exception into a recorded
// failure. The message names the statement, function, file, line and device.

#include <cuda_runtime_api.h>

#include <string>

#include "kernels/cuda/attention_params.h"

namespace harness::kernels::cuda {

//! Throws CudaError describing `status` when it is not cudaSuccess.
inline void check_cuda(cudaError_t status, const char* statement, const char* function, const char* file, int line) {
  if (status == cudaSuccess) return;
  int device = -1;
  cudaGetDevice(&device);
  throw CudaError(std::string("CUDA error '") + cudaGetErrorString(status) + "' (" + cudaGetErrorName(status) +
                  ") in `" + statement + "` at " + function + " " + file + ":" + std::to_string(line) +
                  " on device cuda:" + std::to_string(device));
}

}  // namespace harness::kernels::cuda

//! Checks a CUDA runtime call.
#define HARNESS_CUDA_CHECK(stmt) ::harness::kernels::cuda::check_cuda((stmt), #stmt, __func__, __FILE__, __LINE__)
//! Checks the launch that was just made (configuration errors are reported here; faults inside the
//! kernel surface at the next synchronizing call, which is checked too).
#define HARNESS_CUDA_LAUNCH_CHECK(what) \
  ::harness::kernels::cuda::check_cuda(cudaGetLastError(), "launch of " what, __func__, __FILE__, __LINE__)
