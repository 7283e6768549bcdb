// libFuzzer entry point of the plan target (scripts/fuzz.sh): spec to plan, dims and sweeps.
#include "tests/fuzz/fuzz_targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  harness::fuzz::plan_input(data, size);
  return 0;
}
