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
