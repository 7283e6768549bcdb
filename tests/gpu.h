#pragma once
// The skip every [cuda] test starts with: on a machine without a GPU it passes with a warning.

#include <torch/cuda.h>

#include "tests/catch.h"

namespace harness::test {

//! Whether a CUDA device is usable; warns that the test is skipped when not.
inline bool have_gpu() {
  if (torch::cuda::is_available()) return true;
  WARN("no CUDA device: [cuda] test skipped");
  return false;
}

}  // namespace harness::test
