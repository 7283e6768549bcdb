// End to end: `harness bisect` over real installs of tiny wheels this test builds itself
// (tests/python/make_bisect_wheels.py: harness_probe_pkg 1.0 .. 1.7, behaviour flips at 1.5),
// from a local folder with no package index (no network), each probe a stored run of
// tests/cli/bisect_probe.json in its own cached venv; `bisect show`, `writeup --bisect`,
// `envs list|prune`, and the bad inputs that exit 2.

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "tests/catch.h"
#include "tests/cli_support.h"
#include "tests/test_paths.h"

namespace {

namespace fs = std::filesystem;
using harness::test::Result;
using harness::test::slurp;

int shell(const std::string& command) {
  const int status = std::system(command.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// The wheels and the env cache, shared by every test of this build (CTest runs each test case in a
// process of its own, maybe several at once): the wheels are built once into a temporary folder
// and renamed into place, the envs of one package set are reused as they are for users (the env
// cache locks each key while it is built). A test that must see envs being made uses its own cache.
struct Fixture {
  fs::path root = fs::path(HARNESS_TEST_BINARY_DIR) / "bisect-fixture";
  fs::path wheels = root / "wheels";                      //!< 1.0 .. 1.7, all good
  fs::path broken_wheels = root / "wheels-broken-1.3";    //!< 1.3 truncated
  fs::path boundary_wheels = root / "wheels-broken-1.5";  //!< 1.5 itself truncated
  fs::path envs = root / "envs";
  Fixture() {
    fs::create_directories(root);
    make(wheels, "");
    make(broken_wheels, " --broken 1.3");
    make(boundary_wheels, " --broken 1.5");
  }
  static void make(const fs::path& folder, const std::string& options) {
    if (fs::exists(folder)) return;
    const fs::path temporary = folder.string() + ".tmp-" + std::to_string(getpid());
    const std::string maker = std::string("python3 ") + HARNESS_TEST_DATA_DIR + "/python/make_bisect_wheels.py ";
    REQUIRE(shell(maker + temporary.string() + options + " >/dev/null") == 0);
    std::error_code error;
    fs::rename(temporary, folder, error);  // another test process may have won: its wheels are the same bytes
    fs::remove_all(temporary, error);
  }
};

const Fixture& fixture() {
  static Fixture instance;
  return instance;
}

const std::string kProbeSpec = std::string(HARNESS_TEST_DATA_DIR) + "/cli/bisect_probe.json";

struct Sandbox : harness::test::Sandbox {
  Sandbox() : harness::test::Sandbox("harness-bisect") {}

  // A bisect of the probe package from `wheels`, offline, with the shared env cache.
  Result bisect(const fs::path& wheels, const std::string& extra, const std::string& installer = "pip") const {
    return harness("bisect " + kProbeSpec + " --package harness_probe_pkg --find-links " + wheels.string() +
                   " --no-index --installer " + installer + " --env-cache " + fixture().envs.string() +
                   " --device cpu --db " + db() + " " + extra);
  }
};

const nlohmann::json* probe_of(const nlohmann::json& bisect, const std::string& label) {
  for (const auto& probe : bisect["probes"])
    if (probe["label"] == label) return &probe;
  return nullptr;
}

int probes_between(const nlohmann::json& bisect) {
  int count = 0;
  for (const auto& probe : bisect["probes"])
    if (probe["label"] != bisect["good"] && probe["label"] != bisect["bad"]) ++count;
  return count;
}

}  // namespace

TEST_CASE("bisect finds the version where the verdict flipped, in ceil(log2) probes, each a stored run", "[cli][bisect]") {
  Sandbox box;
  const Result result = box.bisect(fixture().wheels, "--good 1.0 --bad 1.7 --json");
  INFO(result.err);
  REQUIRE(result.exit_code == 0);
  const auto bisect = nlohmann::json::parse(result.out);
  CHECK(bisect["status"] == "found");
  CHECK(bisect["first_bad"] == "1.5");
  CHECK(bisect["last_good"] == "1.4");
  CHECK(bisect["result"]["candidates"].size() == 8);
  // 8 candidates: 6 between the ends, ceil(log2(7)) = 3 probes, plus the two ends.
  CHECK(probes_between(bisect) == 3);
  CHECK(bisect["result"]["max_probes"] == 3);
  CHECK(bisect["probes"].size() == 5);
  REQUIRE(probe_of(bisect, "1.5"));
  CHECK((*probe_of(bisect, "1.5"))["outcome"] == "bad");
  CHECK((*probe_of(bisect, "1.5"))["details"]["verdict"] == "FLIPPED");
  CHECK((*probe_of(bisect, "1.4"))["details"]["verdict"] == "LEGACY");

  // Every probe is an ordinary run, under its own env (the venv's interpreter in the fingerprint).
  const Result runs = box.harness("runs --json --db " + box.db());
  REQUIRE(runs.exit_code == 0);
  const auto run_list = nlohmann::json::parse(runs.out);
  CHECK(run_list.size() == 5);
  std::set<std::string> envs;
  for (const auto& run : run_list) envs.insert(run["env_id"].get<std::string>());
  CHECK(envs.size() == 5);
  const int64_t run_15 = (*probe_of(bisect, "1.5"))["run_ids"][0];
  const Result shown = box.harness("show " + std::to_string(run_15) + " --json --db " + box.db());
  REQUIRE(shown.exit_code == 0);
  CHECK(shown.out.find("harness_probe_pkg") != std::string::npos);

  // Stored: `bisect show` prints the same answer.
  const Result show = box.harness("bisect show " + std::to_string(bisect["id"].get<int64_t>()) + " --db " + box.db());
  INFO(show.err);
  REQUIRE(show.exit_code == 0);
  CHECK(show.out.find("first bad: 1.5 (last good: 1.4)") != std::string::npos);
  CHECK(show.out.find("harness-probe-pkg") != std::string::npos);  // the package diff between 1.4 and 1.5
  CHECK(box.harness("bisect show 99 --db " + box.db()).exit_code == 2);

  // A second bisect reuses every env: no install.
  const Result again = box.bisect(fixture().wheels, "--good 1.0 --bad 1.7 --json");
  REQUIRE(again.exit_code == 0);
  const auto second = nlohmann::json::parse(again.out);
  for (const auto& probe : second["probes"]) CHECK(probe["details"]["env"]["reused"] == true);
}

TEST_CASE("bisect skips a version that cannot be installed", "[cli][bisect]") {
  Sandbox box;
  const Result result = box.bisect(fixture().broken_wheels, "--good 1.0 --bad 1.7 --json");
  INFO(result.err);
  REQUIRE(result.exit_code == 0);
  const auto bisect = nlohmann::json::parse(result.out);
  CHECK(bisect["first_bad"] == "1.5");
  CHECK(bisect["status"] == "found");
  const auto* broken = probe_of(bisect, "1.3");
  REQUIRE(broken);
  CHECK((*broken)["outcome"] == "skip");
  CHECK((*broken)["reason"].get<std::string>().find("cannot install") != std::string::npos);
  CHECK((*broken)["run_ids"].empty());
  CHECK(bisect["result"]["skipped"] == 1);

  // The broken version is the first bad one's neighbour: the answer is a range.
  const Result boundary = box.bisect(fixture().boundary_wheels, "--good 1.0 --bad 1.7 --json");
  INFO(boundary.err);
  REQUIRE(boundary.exit_code == 0);
  const auto range = nlohmann::json::parse(boundary.out);
  CHECK(range["status"] == "range");
  CHECK(range["last_good"] == "1.4");
  CHECK(range["first_bad"] == "1.6");
  CHECK(range["result"]["unresolved"] == nlohmann::json::array({"1.5"}));
}

TEST_CASE("bisect a metric: a regression outside the noise is found, one inside the noise is not called", "[cli][bisect]") {
  Sandbox box;
  const Result found = box.bisect(fixture().wheels, "--good 1.0 --bad 1.7 --metric peak_bytes --threshold 10% --json");
  INFO(found.err);
  REQUIRE(found.exit_code == 0);
  const auto bisect = nlohmann::json::parse(found.out);
  CHECK(bisect["mode"] == "metric");
  CHECK(bisect["target"] == "peak_bytes");  // as asked; the variant it resolved to is in the result
  CHECK(bisect["result"]["target"].get<std::string>().rfind("main.peak_bytes", 0) == 0);
  CHECK(bisect["first_bad"] == "1.5");

  // step_ms moves by 3 % at 1.5 with +-8 % noise over 5 repeats: not a change.
  const Result noise = box.bisect(fixture().wheels, "--good 1.0 --bad 1.7 --metric main.step_ms");
  CHECK(noise.exit_code == 2);
  CHECK(noise.err.find("do not differ outside the noise") != std::string::npos);
  // Outside the noise, but less than the threshold asked for.
  const Result small = box.bisect(fixture().wheels, "--good 1.0 --bad 1.7 --metric peak_bytes --threshold 150%");
  CHECK(small.exit_code == 2);
  CHECK(small.err.find("threshold") != std::string::npos);
  const Result unknown = box.bisect(fixture().wheels, "--good 1.0 --bad 1.7 --metric nope_bytes");
  CHECK(unknown.exit_code == 2);
  CHECK(unknown.err.find("nope_bytes") != std::string::npos);
}

TEST_CASE("bisect rejects bad input with exit 2", "[cli][bisect]") {
  Sandbox box;
  const Result unknown_package = box.harness("bisect " + kProbeSpec + " --package no_such_pkg --good 1.0 --bad 1.7 " +
                                             "--find-links " + fixture().wheels.string() + " --no-index --db " + box.db());
  CHECK(unknown_package.exit_code == 2);
  CHECK(unknown_package.err.find("unknown package") != std::string::npos);

  const Result same = box.bisect(fixture().wheels, "--good 1.2 --bad 1.2");
  CHECK(same.exit_code == 2);
  CHECK(same.err.find("same version") != std::string::npos);

  const Result same_verdict = box.bisect(fixture().wheels, "--good 1.0 --bad 1.3");
  CHECK(same_verdict.exit_code == 2);
  CHECK(same_verdict.err.find("same verdict LEGACY") != std::string::npos);

  const Result not_python = box.harness("bisect bwd_fusion --package torch --good 2.5.1 --bad 2.11.0 --db " + box.db());
  CHECK(not_python.exit_code == 2);
  CHECK(not_python.err.find("--builds") != std::string::npos);

  const Result absent_version = box.bisect(fixture().wheels, "--good 0.9 --bad 1.7");
  CHECK(absent_version.exit_code == 2);
  CHECK(absent_version.err.find("not among the versions") != std::string::npos);

  const Result both = box.bisect(fixture().wheels, "--good 1.0 --bad 1.7 --status main --metric peak_bytes");
  CHECK(both.exit_code == 2);
  const Result one_build = box.harness("bisect bwd_fusion --builds " + box.dir.string() + " --db " + box.db());
  CHECK(one_build.exit_code == 2);
  const Result no_build = box.harness("bisect bwd_fusion --builds /nonexistent/a /nonexistent/b --db " + box.db());
  CHECK(no_build.exit_code == 2);
  CHECK(no_build.err.find("/nonexistent/a") != std::string::npos);
}

TEST_CASE("bisect --envs searches existing interpreters, --builds runs each build's binary", "[cli][bisect]") {
  Sandbox box;
  // The envs a package bisect made: reused here as a user's own venvs.
  const Result made = box.bisect(fixture().wheels, "--good 1.0 --bad 1.7 --json");
  REQUIRE(made.exit_code == 0);
  const auto bisect = nlohmann::json::parse(made.out);
  auto env_of = [&](const std::string& version) {
    const auto* probe = probe_of(bisect, version);
    REQUIRE(probe);
    return (*probe)["details"]["env"]["path"].get<std::string>();
  };
  const Result envs = box.harness("bisect " + kProbeSpec + " --envs " + env_of("1.0") + " " + env_of("1.3") + " " +
                                  env_of("1.4") + " " + env_of("1.5") + " " + env_of("1.7") +
                                  " --device cpu --json --db " + box.db());
  INFO(envs.err);
  REQUIRE(envs.exit_code == 0);
  const auto over_envs = nlohmann::json::parse(envs.out);
  CHECK(over_envs["first_bad"] == env_of("1.5"));
  CHECK(over_envs["last_good"] == env_of("1.4"));
  CHECK(over_envs["package"] == "");

  // Two builds (here one binary under two names) running the same interpreter: same verdict.
  fs::create_directories(box.dir / "build-a" / "harness");
  fs::create_directories(box.dir / "build-b" / "harness");
  fs::create_symlink(HARNESS_BINARY, box.dir / "build-a" / "harness" / "harness");
  fs::create_symlink(HARNESS_BINARY, box.dir / "build-b" / "harness" / "harness");
  const Result builds = box.harness("bisect " + kProbeSpec + " --builds " + (box.dir / "build-a").string() + " " +
                                    (box.dir / "build-b").string() + " --python " + env_of("1.0") +
                                    "/bin/python --device cpu --db " + box.db());
  CHECK(builds.exit_code == 2);
  CHECK(builds.err.find("same verdict") != std::string::npos);
}

TEST_CASE("writeup renders a bisect: table, plot, env diff", "[cli][bisect]") {
  Sandbox box;
  const Result made = box.bisect(fixture().wheels, "--good 1.0 --bad 1.7 --metric peak_bytes --json");
  REQUIRE(made.exit_code == 0);
  const auto id = nlohmann::json::parse(made.out)["id"].get<int64_t>();
  const Result writeup =
      box.harness("writeup --bisect " + std::to_string(id) + " -o " + (box.dir / "report.md").string() + " --db " + box.db());
  INFO(writeup.err);
  REQUIRE(writeup.exit_code == 0);
  const std::string report = slurp(box.dir / "report.md");
  CHECK(report.find("first bad: 1.5") != std::string::npos);
  CHECK(report.find("| candidate |") != std::string::npos);
  CHECK(report.find("not probed") != std::string::npos);
  CHECK(report.find("report-metric.svg") != std::string::npos);
  const std::string svg = slurp(box.dir / "report-metric.svg");
  CHECK(svg.find("<svg") != std::string::npos);
  CHECK(svg.find("1.5") != std::string::npos);
  CHECK(box.harness("writeup --bisect 42 --db " + box.db()).exit_code == 2);
}

TEST_CASE("envs list shows the cached envs and prune removes them", "[cli][bisect]") {
  Sandbox box;
  const std::string cache = (box.dir / "envs").string();
  const Result made = box.harness("bisect " + kProbeSpec + " --package harness_probe_pkg --versions 1.4,1.5 --good 1.4 " +
                                  "--bad 1.5 --find-links " + fixture().wheels.string() +
                                  " --no-index --installer pip --env-cache " + cache + " --device cpu --db " + box.db());
  INFO(made.err);
  REQUIRE(made.exit_code == 0);
  fs::create_directories(box.dir / "envs" / "00000000deadbeef");  // what an interrupted install leaves
  const Result list = box.harness("envs list --json --env-cache " + cache);
  REQUIRE(list.exit_code == 0);
  const auto listed = nlohmann::json::parse(list.out);
  REQUIRE(listed["envs"].size() == 3);
  int ready = 0;
  for (const auto& env : listed["envs"]) ready += env["complete"].get<bool>();
  CHECK(ready == 2);

  const Result prune = box.harness("envs prune --env-cache " + cache);
  REQUIRE(prune.exit_code == 0);
  CHECK(prune.out.find("00000000deadbeef") != std::string::npos);
  CHECK(nlohmann::json::parse(box.harness("envs list --json --env-cache " + cache).out)["envs"].size() == 2);
  REQUIRE(box.harness("envs prune --all --env-cache " + cache).exit_code == 0);
  CHECK(box.harness("envs list --env-cache " + cache).out.find("no envs") != std::string::npos);
}

TEST_CASE("bisect installs with uv when it is there", "[cli][bisect][uv]") {
  if (shell("command -v uv >/dev/null 2>&1") != 0) {
    HARNESS_SKIP("uv is not in $PATH: the uv installer is not tested here (pip install uv)");
  }
  Sandbox box;
  // Its own env cache: the shared one may hold pip-made envs of the same package sets.
  const Result result = box.harness("bisect " + kProbeSpec + " --package harness_probe_pkg --find-links " +
                                    fixture().broken_wheels.string() + " --no-index --installer uv --env-cache " +
                                    (box.dir / "envs").string() + " --good 1.0 --bad 1.7 --device cpu --json --db " +
                                    box.db());
  INFO(result.err);
  REQUIRE(result.exit_code == 0);
  const auto bisect = nlohmann::json::parse(result.out);
  CHECK(bisect["first_bad"] == "1.5");
  CHECK((*probe_of(bisect, "1.3"))["outcome"] == "skip");
  CHECK((*probe_of(bisect, "1.5"))["details"]["env"]["installer"].get<std::string>().rfind("uv", 0) == 0);
}

TEST_CASE("bisect refuses values that pip or uv would read as options, before anything is installed", "[cli][bisect]") {
  Sandbox box;
  const std::string wheels = " --find-links " + fixture().wheels.string() + " --no-index --device cpu --db " + box.db();
  for (const std::string& args :
       {std::string("--package=-rrequirements.txt --good 1.0 --bad 1.7"),
        std::string("--package=--index-url=http://evil.invalid --good 1.0 --bad 1.7"),
        std::string("--package harness_probe_pkg --good=-e --bad 1.7"),
        std::string("--package harness_probe_pkg --good 1.0 --bad=--pre"),
        std::string("--package harness_probe_pkg --good 1.0 --bad 1.7 --versions=1.0,--pre,1.7"),
        std::string("--package harness_probe_pkg --good 1.0 --bad 1.7 --extra=-rrequirements.txt"),
        std::string("--package harness_probe_pkg --good 1.0 --bad 1.7 --index-url=--trusted-host=evil.invalid")}) {
    const Result result = box.harness("bisect " + kProbeSpec + " " + args + wheels);
    INFO(args << ": " << result.err);
    CHECK(result.exit_code == 2);
    CHECK(result.err.find("'-") != std::string::npos);
    CHECK_FALSE(fs::exists(box.db()));
  }
}
