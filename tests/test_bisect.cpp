// harness bisect's parts that need no install: the search with skip, PEP 440 ordering, versions
// of a wheel folder, the judging of probes against the ends (noise-aware, by the diff's rule),
// and the bisect rows of the db.

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>

#include "analysis/bisect.h"
#include "core/errors.h"
#include "core/package_versions.h"
#include "db/store.h"
#include "tests/catch.h"

namespace {

namespace fs = std::filesystem;
using harness::analysis::BisectMode;
using harness::analysis::BisectSearch;
using harness::analysis::ProbeOutcome;

// Runs the search over `count` candidates whose first bad one is `flip`, with `broken` ones
// skipped. Returns the number of probes between the ends.
int search(BisectSearch& bisect, size_t flip, const std::set<size_t>& broken = {}) {
  int probes = 0;
  while (const auto position = bisect.next()) {
    ++probes;
    REQUIRE(probes < 100);
    if (broken.count(*position)) {
      bisect.record(*position, ProbeOutcome::kSkip);
    } else {
      bisect.record(*position, *position >= flip ? ProbeOutcome::kBad : ProbeOutcome::kGood);
    }
  }
  return probes;
}

harness::analysis::ProbeReading metric_reading(std::vector<double> values) {
  harness::analysis::ProbeReading reading;
  reading.usable = true;
  reading.unit = "bytes";
  harness::analysis::SideValues side;
  side.values = values;
  side.repeated = values.size() > 1;
  side.spread = harness::analysis::spread_of(values);
  reading.metric = side;
  return reading;
}

// The message of the UsageError `call` throws ("" when it throws none).
template <typename Call>
std::string usage_error_of(Call call) {
  try {
    call();
  } catch (const harness::UsageError& error) {
    return error.what();
  }
  return "";
}

}  // namespace

TEST_CASE("bisect finds every flip position within ceil(log2(n-1)) probes", "[bisect]") {
  for (size_t count = 2; count <= 40; ++count) {
    const int bound = BisectSearch::max_probes(count);
    CHECK(bound == static_cast<int>(std::ceil(std::log2(static_cast<double>(std::max<size_t>(count - 1, 1))))));
    for (size_t flip = 1; flip < count; ++flip) {
      BisectSearch bisect(count);
      const int probes = search(bisect, flip);
      INFO("count " << count << ", flip " << flip);
      CHECK(bisect.first_bad() == flip);
      CHECK(bisect.last_good() == flip - 1);
      CHECK(bisect.unresolved().empty());
      CHECK(probes <= bound);
    }
  }
  // The fixture's case: 1.0 .. 1.7, flip at 1.5 (position 5): 1.3, 1.5, 1.4.
  BisectSearch eight(8);
  CHECK(eight.next() == 3u);
  CHECK(search(eight, 5) == 3);
}

TEST_CASE("bisect skips candidates that cannot be probed and reports a range around them", "[bisect]") {
  BisectSearch away(8);  // 1.3 broken, the flip at 1.5: still found exactly
  search(away, 5, {3});
  CHECK(away.first_bad() == 5);
  CHECK(away.last_good() == 4);
  CHECK(away.unresolved().empty());

  BisectSearch at(8);  // 1.5 itself broken: the change is at 1.5 or 1.6
  search(at, 5, {5});
  CHECK(at.last_good() == 4);
  CHECK(at.first_bad() == 6);
  CHECK(at.unresolved() == std::vector<size_t>{5});

  BisectSearch all(6);  // nothing between the ends can run
  search(all, 3, {1, 2, 3, 4});
  CHECK(all.last_good() == 0);
  CHECK(all.first_bad() == 5);
  CHECK(all.unresolved().size() == 4);
  CHECK_THROWS_AS(BisectSearch(1), std::invalid_argument);
}

TEST_CASE("PEP 440 versions sort as pip sorts them", "[bisect][versions]") {
  const auto sorted = harness::sort_versions(
      {"2.10.0", "2.9.1", "2.6.0", "2.6.0rc1", "2.6.0.dev20241001", "2.6.0.post1", "2.5.1", "2.5.1+cu124", "1!0.1",
       "2.6.0a1", "2.6.0b2"},
      "test");
  CHECK(sorted == std::vector<std::string>{"2.5.1", "2.6.0.dev20241001", "2.6.0a1", "2.6.0b2", "2.6.0rc1", "2.6.0",
                                           "2.6.0.post1", "2.9.1", "2.10.0", "1!0.1"});
  CHECK(harness::compare_versions(*harness::parse_version("2.5"), *harness::parse_version("2.5.0")) == 0);
  CHECK_FALSE(harness::parse_version("latest"));
  CHECK_THROWS_AS(harness::sort_versions({"2.5.1", "nope"}, "test"), harness::UsageError);
  CHECK(harness::normalize_package_name("Harness_Probe.pkg") == "harness-probe-pkg");

  const std::vector<std::string> available = {"2.5.1", "2.6.0", "2.7.0rc1", "2.7.0", "2.8.0", "2.11.0", "2.12.0"};
  CHECK(harness::versions_between(available, "2.5.1", "2.8.0", false, "t") ==
        std::vector<std::string>{"2.5.1", "2.6.0", "2.7.0", "2.8.0"});
  CHECK(harness::versions_between(available, "2.5.1", "2.8.0", true, "t").size() == 5);
  // A fix searched downwards: good is the newer version.
  CHECK(harness::versions_between(available, "2.8.0", "2.6.0", false, "t") ==
        std::vector<std::string>{"2.8.0", "2.7.0", "2.6.0"});
  CHECK_THROWS_AS(harness::versions_between(available, "2.5.1", "2.5.1", false, "t"), harness::UsageError);
  CHECK_THROWS_AS(harness::versions_between(available, "2.4.0", "2.8.0", false, "t"), harness::UsageError);

  const std::string pip_output =
      "WARNING: pip index is currently an experimental command.\n"
      "torch (2.11.0)\nAvailable versions: 2.11.0, 2.10.0, 2.9.1, 2.9.0\n  INSTALLED: 2.11.0\n";
  CHECK(harness::parse_pip_index_versions(pip_output) == std::vector<std::string>{"2.11.0", "2.10.0", "2.9.1", "2.9.0"});
  CHECK(harness::parse_pip_index_versions("ERROR: No matching distribution found for nope").empty());
}

TEST_CASE("versions of a package in a folder of wheels", "[bisect][versions]") {
  std::string pattern = (fs::temp_directory_path() / "harness-versions-XXXXXX").string();
  REQUIRE(mkdtemp(pattern.data()) != nullptr);
  const fs::path dir = pattern;
  for (const char* name : {"harness_probe_pkg-1.10-py3-none-any.whl", "harness_probe_pkg-1.2-py3-none-any.whl",
                           "harness-probe-pkg-1.3.tar.gz", "other_pkg-9.0-py3-none-any.whl", "README.txt",
                           "harness_probe_pkg-1.2-cp311-cp311-manylinux1_x86_64.whl"})
    std::ofstream(dir / name) << "x";
  CHECK(harness::versions_in_folder(dir.string(), "harness-probe-pkg") ==
        std::vector<std::string>{"1.2", "1.3", "1.10"});
  CHECK(harness::versions_in_folder(dir.string(), "absent").empty());
  CHECK_THROWS_AS(harness::versions_in_folder((dir / "missing").string(), "x"), harness::UsageError);
  fs::remove_all(dir);
}

TEST_CASE("a metric probe is judged against both ends by the diff's noise rule", "[bisect]") {
  harness::analysis::BisectTarget target;
  target.mode = BisectMode::kMetric;
  target.variant = "main";
  target.metric = "peak_bytes";
  target.threshold = 0.10;
  const auto good = metric_reading({100, 101, 99, 100.5, 99.5});
  const auto bad = metric_reading({200, 202, 198, 201, 199});
  CHECK_NOTHROW(harness::analysis::check_ends(target, good, bad, "1.0", "1.7"));

  auto judged = harness::analysis::judge_probe(target, good, bad, metric_reading({199, 201, 200, 202, 198}));
  CHECK(judged.outcome == ProbeOutcome::kBad);
  judged = harness::analysis::judge_probe(target, good, bad, metric_reading({100, 98, 102, 101, 99}));
  CHECK(judged.outcome == ProbeOutcome::kGood);
  // Halfway, far from both: not called either way, and more repeats would not help to say which.
  judged = harness::analysis::judge_probe(target, good, bad, metric_reading({150, 151, 149, 150, 150}));
  CHECK(judged.outcome == ProbeOutcome::kSkip);
  CHECK(judged.inside_noise);
  // One noisy run that overlaps both ends: inside the noise.
  judged = harness::analysis::judge_probe(target, good, bad, metric_reading({150}));
  CHECK(judged.outcome == ProbeOutcome::kSkip);
  CHECK(judged.inside_noise);

  // Ends whose difference is inside the noise: no change to bisect.
  const auto noisy_good = metric_reading({10.0, 10.72, 9.44, 10.32, 9.2});
  const auto noisy_bad = metric_reading({10.3, 11.04, 9.72, 10.63, 9.48});
  CHECK(usage_error_of([&] { harness::analysis::check_ends(target, noisy_good, noisy_bad, "1.0", "1.7"); })
            .find("do not differ outside the noise") != std::string::npos);
  // Outside the noise but under the threshold.
  target.threshold = 2.0;
  CHECK(usage_error_of([&] { harness::analysis::check_ends(target, good, bad, "1.0", "1.7"); }).find("threshold") !=
        std::string::npos);
}

TEST_CASE("verdict and status probes read as the end they match", "[bisect]") {
  harness::analysis::BisectTarget target;
  harness::analysis::ProbeReading good, bad, probe;
  good.usable = bad.usable = probe.usable = true;
  good.verdict = "LEGACY";
  bad.verdict = "FLIPPED";
  probe.verdict = "FLIPPED";
  CHECK(harness::analysis::judge_probe(target, good, bad, probe).outcome == ProbeOutcome::kBad);
  probe.verdict = "INVALID";
  CHECK(harness::analysis::judge_probe(target, good, bad, probe).outcome == ProbeOutcome::kSkip);
  bad.verdict = "LEGACY";
  CHECK(usage_error_of([&] { harness::analysis::check_ends(target, good, bad, "1.0", "1.3"); }).find("same verdict") !=
        std::string::npos);
  target.mode = BisectMode::kStatus;
  target.variant = "eager";
  good.status = "ok";
  bad.status = "unsupported";
  probe.status = "ok";
  CHECK(harness::analysis::judge_probe(target, good, bad, probe).outcome == ProbeOutcome::kGood);
  probe.usable = false;
  probe.why_not = "cannot install";
  CHECK(harness::analysis::judge_probe(target, good, bad, probe).reason == "cannot install");
}

TEST_CASE("package changes between two envs", "[bisect]") {
  const auto changes = harness::analysis::package_changes({{"torch", "2.5.1"}, {"triton", "3.1.0"}, {"numpy", "2.1"}},
                                                          {{"torch", "2.6.0"}, {"triton", "3.2.0"}, {"numpy", "2.1"},
                                                           {"nvidia-cusparselt-cu12", "0.6.2"}});
  REQUIRE(changes.size() == 3);
  CHECK(changes[0].key == "nvidia-cusparselt-cu12");
  CHECK(changes[0].before == "(absent)");
  CHECK(changes[1].key == "torch");
  CHECK(changes[2].after == "3.2.0");
}

TEST_CASE("bisect rows round-trip through the db", "[bisect][db]") {
  std::string pattern = (fs::temp_directory_path() / "harness-bisect-db-XXXXXX").string();
  REQUIRE(mkdtemp(pattern.data()) != nullptr);
  {
    harness::db::Store store(pattern + "/test.db");
    harness::db::Bisect bisect;
    bisect.experiment = "bisect_probe";
    bisect.mode = "verdict";
    bisect.package = "harness_probe_pkg";
    bisect.good = "1.0";
    bisect.bad = "1.7";
    bisect.args = {{"find_links", {"/tmp/w"}}};
    const int64_t id = store.begin_bisect(bisect);
    CHECK(store.get_bisect(id)->status == "running");
    harness::db::BisectProbe probe;
    probe.bisect_id = id;
    probe.seq = 1;
    probe.position = 3;
    probe.label = "1.3";
    probe.outcome = "skip";
    probe.reason = "cannot install";
    probe.details = {{"error", "bad zip"}};
    store.add_bisect_probe(probe);
    store.finish_bisect(id, "found", "1.4", "1.5", {{"probes_between", 3}});
    const auto stored = store.get_bisect(id);
    REQUIRE(stored);
    CHECK(stored->status == "found");
    CHECK(stored->first_bad == "1.5");
    CHECK(stored->result["probes_between"] == 3);
    CHECK(stored->args["find_links"][0] == "/tmp/w");
    const auto probes = store.list_bisect_probes(id);
    REQUIRE(probes.size() == 1);
    CHECK(probes[0].details["error"] == "bad zip");
    CHECK(probes[0].run_ids.empty());
    CHECK(store.list_bisects().size() == 1);
    CHECK_FALSE(store.get_bisect(id + 1));
    CHECK_THROWS_AS(store.finish_bisect(id + 1, "found", "", "", {}), harness::db::DbError);
  }
  fs::remove_all(pattern);
}
