// libFuzzer entry point of the spec target (scripts/fuzz.sh).
#include "tests/fuzz/fuzz_targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  harness::fuzz::spec_input(data, size);
  return 0;
}
