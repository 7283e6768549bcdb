// harness_mask_describe: resolves one benchmark case's mask (dflash anchors, document lengths) the
// way harness_bench_attention does and prints it as JSON, without LibTorch or a GPU. Used by
// bench/attention_vs_flex.py to hand every peer the same mask, and by its CPU test.
//
//   harness_mask_describe --mask dflash --anchors 128 [--context 8192 --documents 4 ...]

#include <exception>
#include <iostream>

#include "bench/bench_case.h"

int main(int argc, char** argv) {
  using namespace harness::bench;
  const CaseOptions o = parse_case(argc, argv, "harness_mask_describe", "",
                                   [](CaseOptions&, const std::string&, const std::string&) { return false; });
  try {
    std::cout << describe_case(o, resolve_case(o)).dump() << std::endl;
  } catch (const std::exception& error) {
    std::cout << nlohmann::json{{"error", error.what()}}.dump() << std::endl;
    return 2;
  }
  return 0;
}
