// libFuzzer entry point of the import target (scripts/fuzz.sh): `harness replay --import` of a
// torch.save file, LibTorch's unpickler included. Only replay::CapsuleError may escape.
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <string>

#include "core/files.h"
#include "replay/import.h"
#include "tests/fuzz/fuzz_targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = harness::fuzz::fuzz_scratch_path("step.pt");
  const std::string dir = harness::fuzz::fuzz_scratch_path("capsules");
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  try {
    harness::replay::import_step_file(path, dir);
  } catch (const harness::replay::CapsuleError&) {
  }
  unlink(path.c_str());
  harness::remove_tree(dir);
  return 0;
}
