#pragma once
// A Sandbox (tests/cli_support.h) whose every command runs on its own db with the test-only fault
// injection allowed, and json(): a command's --json answer, which must exit 0. Shared by the
// replay and evidence CLI tests; needs Catch2 (tests/catch.h) and nlohmann/json.

#include <string>

#include <nlohmann/json.hpp>

#include "tests/catch.h"
#include "tests/cli_support.h"

namespace harness::test {

struct DbSandbox : Sandbox {
  explicit DbSandbox(const std::string& prefix) : Sandbox(prefix) {}
  Result harness(const std::string& args) const { return Sandbox::harness(args + " --db " + db(), "HARNESS_ALLOW_FAULTS=1"); }
  nlohmann::json json(const std::string& args) const {
    const Result result = harness(args + " --json");
    INFO(args << "\n" << result.err);
    REQUIRE(result.exit_code == 0);
    return nlohmann::json::parse(result.out);
  }
};

}  // namespace harness::test
