// libFuzzer entry point of the capsule target (scripts/fuzz.sh).
#include "tests/fuzz/fuzz_targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  harness::fuzz::capsule_input(data, size);
  return 0;
}
