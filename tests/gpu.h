#pragma once
// The skip every [cuda] test starts with: `if (!have_gpu()) return;`.
// Without a CUDA device the case is skipped visibly (Catch2 v3's SKIP; Catch2 v2 has none, so there
// it warns and returns, and CTest's `cuda` test, which runs the [cuda] cases through
// tests/cuda_tests.sh, reports SKIPPED). With a device, a build without the CUDA kernels fails the
// case instead of passing it: on a GPU machine a [cuda] test either runs or fails.

#include <torch/cuda.h>

#include "kernels/attention.h"
#include "tests/catch.h"

namespace harness::test {

//! Whether a CUDA device is usable and this build has the CUDA kernels; skips the case when there is
//! no device, fails it when there is one but the kernels were not built.
inline bool have_gpu() {
  if (!torch::cuda::is_available()) {
#ifdef HARNESS_CATCH_V3
    SKIP("no CUDA device: [cuda] test skipped");
#else
    WARN("no CUDA device: [cuda] test skipped");
#endif
    return false;
  }
  if (!kernels::cuda_kernels_built()) FAIL("a CUDA device is present but this build has no CUDA kernels");
  return true;
}

}  // namespace harness::test
