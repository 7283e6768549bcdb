// Through the binary: hostile specs and arguments end with exit 2 and a short message
// naming the file, the JSON path or the option; under --json the error is also on stdout.

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "tests/catch.h"
#include "tests/test_paths.h"

namespace {

namespace fs = std::filesystem;

struct Result {
  int exit_code = -1;
  std::string out, err;
};

std::string slurp(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

struct Sandbox {
  fs::path dir;
  Sandbox() {
    std::string pattern = (fs::temp_directory_path() / "harness-hostile-cli-XXXXXX").string();
    REQUIRE(mkdtemp(pattern.data()) != nullptr);
    dir = pattern;
  }
  ~Sandbox() {
    std::error_code ignored;
    fs::remove_all(dir, ignored);
  }
  std::string db() const { return (dir / "test.db").string(); }
  std::string write(const std::string& name, const std::string& text) const {
    std::ofstream(dir / name, std::ios::binary) << text;
    return (dir / name).string();
  }
  Result harness(const std::string& args) const {
    const auto out = dir / "stdout", err = dir / "stderr";
    const int status = std::system((std::string(HARNESS_BINARY) + " " + args + " >" + out.string() + " 2>" + err.string()).c_str());
    return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), slurp(out), slurp(err)};
  }
};

const std::string kBwdFusion = std::string(HARNESS_EXPERIMENTS_DIR) + "/bwd_fusion.json";

}  // namespace

TEST_CASE("case 1: 100 000 nested brackets: exit 2 naming the file, a short message", "[cli][hostile]") {
  Sandbox box;
  const std::string path = box.write("deep.json", std::string(100000, '['));
  const Result run = box.harness("run " + path + " --device cpu --db " + box.db());
  CHECK(run.exit_code == 2);
  CHECK(run.err.find(path) != std::string::npos);
  CHECK(run.err.find("nested more than 64 levels") != std::string::npos);
  CHECK(run.err.size() < 2000);
  CHECK_FALSE(fs::exists(box.db()));
}

TEST_CASE("case 1: --set with 60 000 nested brackets: exit 2", "[cli][hostile]") {
  Sandbox box;
  const std::string value = std::string(60000, '[') + std::string(60000, ']');
  const std::string args_file = box.write("set.txt", "name=" + value);
  const Result run = box.harness("run " + kBwdFusion + " --device cpu --db " + box.db() + " --set \"$(cat " +
                                        args_file + ")\"");
  CHECK(run.exit_code == 2);
  CHECK(run.err.find("--set name=") != std::string::npos);
  CHECK(run.err.size() < 3000);
}

TEST_CASE("case 2: 1e999 names file and path, a 10 MB value is not echoed, 1 000 problems are counted", "[cli][hostile]") {
  Sandbox box;
  const std::string overflow = box.write("overflow.json", R"({"name": 1e999})");
  const Result number = box.harness("run " + overflow + " --device cpu --db " + box.db());
  CHECK(number.exit_code == 2);
  CHECK(number.err.find(overflow + ": name: number out of range") != std::string::npos);

  auto spec = nlohmann::ordered_json::parse(slurp(kBwdFusion));
  spec["name"] = std::string(10'000'000, 'a');
  const std::string big = box.write("big.json", spec.dump());
  const Result huge = box.harness("run " + big + " --device cpu --db " + box.db());
  CHECK(huge.exit_code == 2);
  CHECK(huge.err.size() < 4000);

  spec = nlohmann::ordered_json::parse(slurp(kBwdFusion));
  nlohmann::ordered_json values = nlohmann::ordered_json::array();
  for (int i = 0; i < 1000; ++i) values.push_back("bad" + std::to_string(i));
  spec["sweep"] = {{"dims.anchors", values}};
  const Result many = box.harness("run " + box.write("many.json", spec.dump()) + " --device cpu --db " + box.db());
  CHECK(many.exit_code == 2);
  CHECK(many.err.find("more problems") != std::string::npos);
  CHECK(many.err.size() < 20000);
}

TEST_CASE("case 5: under --json every error is also a JSON object on stdout", "[cli][hostile]") {
  Sandbox box;
  const auto check = [](const Result& result, int exit_code) {
    INFO(result.err);
    CHECK(result.exit_code == exit_code);
    const auto json = nlohmann::json::parse(result.out);
    CHECK(json["exit_code"] == exit_code);
    CHECK_FALSE(json["error"].get<std::string>().empty());
    return json;
  };
  check(box.harness("runs --json --db " + box.db()), 2);
  check(box.harness("run no_such_experiment --json --db " + box.db()), 2);
  check(box.harness("run bwd_fusion --json --device gpu7 --db " + box.db()), 2);
  check(box.harness("runs --json --limit banana --db " + box.db()), 2);
  const auto spec = check(box.harness("run bwd_fusion --json --device cpu --set dims.heads=0 --db " + box.db()), 2);
  CHECK(spec["problems"][0]["path"] == "dims.heads");
  CHECK(spec["problem_count"] == 1);
}

TEST_CASE("case 6: a mistyped --db for a reading command is an error, not a new empty db", "[cli][hostile]") {
  Sandbox box;
  for (const std::string command : {"runs", "show 1", "diff 1 2", "writeup 1", "db check"}) {
    const Result result = box.harness(command + " --db " + (box.dir / "typo.db").string());
    INFO(command << ": " << result.err);
    CHECK(result.exit_code == 2);
    CHECK((result.err.find("no database") != std::string::npos || result.err.find("no db at") != std::string::npos));
  }
  CHECK_FALSE(fs::exists(box.dir / "typo.db"));
}

TEST_CASE("case 7: empty and overflowing sizes, huge device indexes are usage errors", "[cli][hostile]") {
  Sandbox box;
  const Result empty = box.harness("run bwd_fusion --device cpu --memory-limit '' --db " + box.db());
  CHECK(empty.exit_code == 2);
  CHECK(empty.err.find("--memory-limit ''") != std::string::npos);
  const Result huge = box.harness("run bwd_fusion --device cpu --memory-limit 99999999999TiB --db " + box.db());
  CHECK(huge.exit_code == 2);
  CHECK(huge.err.find("at most 1EiB") != std::string::npos);
  const Result device = box.harness("run bwd_fusion --device cuda:99999999999999999999 --db " + box.db());
  CHECK(device.exit_code == 2);
  CHECK(device.err.find("--device") != std::string::npos);
  CHECK(device.err.find("stoll") == std::string::npos);
  const Result devices = box.harness("run bwd_fusion --devices cuda:0,cuda:99999999999999999999 --db " + box.db());
  CHECK(devices.exit_code == 2);
  const Result explain = box.harness("explain-oom --spec bwd_fusion --bytes 99999999999TiB --db " + box.db());
  CHECK(explain.exit_code == 2);
  CHECK_FALSE(fs::exists(box.db()));
}

TEST_CASE("case 7: duplicate keys in a spec file are refused", "[cli][hostile]") {
  Sandbox box;
  std::string text = slurp(kBwdFusion);
  text.replace(text.find("\"name\""), 6, "\"name\": \"first\", \"name\"");
  const std::string path = box.write("dup.json", text);
  const Result run = box.harness("run " + path + " --device cpu --db " + box.db());
  CHECK(run.exit_code == 2);
  CHECK(run.err.find(path + ": name: duplicate key \"name\"") != std::string::npos);
}
