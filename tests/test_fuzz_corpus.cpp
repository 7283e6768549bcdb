// Every input kept in tests/fuzz/<target>/ (seeds and the regression inputs of crashes the fuzzer
// found) goes through the target's body on each test run: a fixed bug stays fixed without clang.
// The import target needs LibTorch and runs in scripts/fuzz.sh only.

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "replay/capsule_file.h"
#include "tests/catch.h"
#include "tests/fuzz/fuzz_targets.h"
#include "tests/test_paths.h"

namespace {

namespace fs = std::filesystem;

void replay_corpus(const std::string& target, void (*body)(const uint8_t*, size_t)) {
  const fs::path dir = fs::path(HARNESS_FUZZ_CORPUS_DIR) / target;
  REQUIRE(fs::is_directory(dir));
  size_t inputs = 0;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (!entry.is_regular_file()) continue;
    std::ifstream in(entry.path(), std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), {});
    INFO(entry.path().string());
    body(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    ++inputs;
  }
  CHECK(inputs > 0);
}

}  // namespace

TEST_CASE("the spec fuzz corpus loads or is refused with SpecError", "[hostile][fuzz]") {
  replay_corpus("spec", harness::fuzz::spec_input);
}

TEST_CASE("the plan fuzz corpus plans or is refused with SpecError", "[hostile][fuzz]") {
  replay_corpus("plan", harness::fuzz::plan_input);
}

TEST_CASE("the capsule fuzz corpus reads or is refused with CapsuleError", "[hostile][fuzz]") {
  replay_corpus("capsule", harness::fuzz::capsule_input);
}

TEST_CASE("the capsule seeds include a capsule that reads and fits the fuzz target's spec", "[hostile][fuzz]") {
  // Without one, mutations would all die at the first check and the fuzzer would learn nothing.
  const std::string path = std::string(HARNESS_FUZZ_CORPUS_DIR) + "/capsule/seed-step.capsule";
  const auto info = harness::replay::inspect_capsule(path, /*verify_payload=*/true);
  CHECK(info.tensors.size() == 5);
  CHECK_NOTHROW(harness::replay::check_step_fits_spec(info, harness::fuzz::capsule_spec()));
}
