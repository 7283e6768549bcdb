#pragma once
// Catch2 v2 (Debian 12) and v3 (Ubuntu 24.04, the GPU machine's image) differ in their headers;
// tests include this and write the v3 spellings (Catch::Approx, Catch::Matchers::ContainsSubstring),
// which v2 gets here as aliases.
#if __has_include(<catch2/catch_test_macros.hpp>)
#include <catch2/catch_approx.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#define HARNESS_CATCH_V3 1
#else
#include <catch2/catch.hpp>
#include <string>
namespace Catch {
using Approx = Detail::Approx;
namespace Matchers {
inline StdString::ContainsMatcher ContainsSubstring(const std::string& text,
                                                    CaseSensitive::Choice sensitivity = CaseSensitive::Yes) {
  return Contains(text, sensitivity);
}
}  // namespace Matchers
}  // namespace Catch
#endif

// Skips the running case visibly, with the reason (streamed like INFO): Catch2 v3's SKIP, which CTest
// reports as skipped; Catch2 v2 has no SKIP, so there the reason is a warning and the case returns.
// Only in the body of a TEST_CASE (on v2 it returns from the enclosing function).
#ifdef HARNESS_CATCH_V3
#define HARNESS_SKIP(...) SKIP(__VA_ARGS__)
#else
#define HARNESS_SKIP(...) \
  do {                    \
    WARN(__VA_ARGS__);    \
    return;               \
  } while (false)
#endif
