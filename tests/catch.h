#pragma once
// Catch2 v2 (Debian 12) and v3 (the H200 image) differ in their headers; tests include this.
#if __has_include(<catch2/catch_test_macros.hpp>)
#include <catch2/catch_approx.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#define HARNESS_CATCH_V3 1
#else
#include <catch2/catch.hpp>
#endif
