// `harness site` in the analysis library, and the export writers it shares with the CLI: CSV and
// Markdown cells, JSON inside a script, file names from db text; a site of the demo db with its
// regressions judged by the diff's own code, plot points that are the db's medians, every db
// string escaped (a db full of markup renders it as text), the folder replaced whole or refused.
// Also writes the synthetic db of `HARNESS_SYNTHETIC_RUNS` runs the site is measured on.

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <regex>
#include <set>
#include <sstream>

#include "analysis/diff.h"
#include "analysis/series.h"
#include "analysis/site.h"
#include "analysis/site_history.h"
#include "analysis/site_html.h"
#include "core/errors.h"
#include "core/printer.h"
#include "tests/analysis_test_db.h"
#include "tests/catch.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

std::string read(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

size_t count(const std::string& text, const std::string& part) {
  size_t n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

std::vector<fs::path> html_files(const fs::path& dir) {
  std::vector<fs::path> files;
  for (const auto& entry : fs::recursive_directory_iterator(dir))
    if (entry.path().extension() == ".html") files.push_back(entry.path());
  return files;
}

// Every href of a page that points inside the site (not http, not a fragment).
std::vector<std::string> local_links(const std::string& html) {
  std::vector<std::string> links;
  const std::regex href(R"(href="([^"]*)\")");
  for (auto it = std::sregex_iterator(html.begin(), html.end(), href); it != std::sregex_iterator(); ++it) {
    const std::string target = (*it)[1];
    if (target.rfind("http", 0) == 0 || target.rfind("#", 0) == 0 || target.rfind("file:", 0) == 0) continue;
    links.push_back(target);
  }
  return links;
}

harness::analysis::SiteStats build(const std::string& db, const fs::path& out, size_t window = 60) {
  harness::db::Store store(db, harness::db::Access::read);
  harness::analysis::SiteOptions options;
  options.db_path = db;
  options.history_window = window;
  return harness::analysis::write_site(store, out.string(), options);
}

}  // namespace

TEST_CASE("CSV cells are quoted when they hold commas, quotes, line breaks or edge spaces", "[site][export]") {
  harness::Table table;
  table.headers = {"id", "error"};
  table.rows = {{"1", "plain"},
                {"2", "a, b"},
                {"3", "say \"hi\""},
                {"4", "two\nlines"},
                {"5", " padded"},
                {"6", "cr\rlf"},
                {"7", ""}};
  std::ostringstream out;
  harness::print_csv(out, table);
  CHECK(out.str() ==
        "id,error\r\n1,plain\r\n2,\"a, b\"\r\n3,\"say \"\"hi\"\"\"\r\n4,\"two\nlines\"\r\n5,\" padded\"\r\n6,\"cr\rlf\"\r\n7,\r\n");
}

TEST_CASE("Markdown cells keep the table's shape, exact numbers read back", "[site][export]") {
  harness::Table table;
  table.headers = {"a|b", "c"};
  table.right_align = {false, true};
  table.rows = {{"x|y", "line\r\nbreak"}, {"", "z"}};
  std::ostringstream out;
  harness::print_markdown_table(out, table);
  CHECK(out.str() == "| a\\|b | c |\n| --- | ---: |\n| x\\|y | line break |\n|   | z |\n");
  CHECK(harness::format_exact(0.1) == "0.1");
  CHECK(std::stod(harness::format_exact(1.0 / 3.0)) == 1.0 / 3.0);
  CHECK(harness::format_exact(std::nan("")) == "nan");
  CHECK_THROWS_AS(harness::parse_format("xml"), harness::UsageError);
}

TEST_CASE("JSON for a script cannot end the script, file names from db text stay in their folder", "[site]") {
  using harness::analysis::site::script_json;
  using harness::analysis::site::slug;
  const std::string text = script_json(json{{"error", "</script><script>alert(1)</script> & \xe2\x80\xa8"}});
  CHECK_FALSE(has(text, "<"));
  CHECK_FALSE(has(text, ">"));
  CHECK_FALSE(has(text, "\xe2\x80\xa8"));
  CHECK(json::parse(text)["error"] == "</script><script>alert(1)</script> & \xe2\x80\xa8");
  CHECK(slug("bwd_fusion") == "bwd_fusion");
  for (const std::string& hostile : std::vector<std::string>{"../../etc", "a/b", "", "--", "<svg>", std::string(65, 'a'), "Upper"}) {
    const std::string name = slug(hostile);
    INFO(hostile << " -> " << name);
    CHECK(name.rfind("x-", 0) == 0);
    CHECK(name.size() == 18);
    CHECK(name.find_first_not_of("abcdefx0123456789-") == std::string::npos);
  }
  CHECK(slug("<a>") != slug("<b>"));
}

TEST_CASE("site of the demo db: every page, regressions by the diff's rule, points that are the db's medians",
          "[site]") {
  harness::test::ScratchDir dir;
  const std::string db = dir.file("demo.db");
  harness::test::write_demo_db(db);
  const fs::path out = dir.file("site");
  const auto stats = build(db, out);
  CHECK(stats.runs == 5);
  CHECK(stats.experiments == 3);  // bwd_fusion, anchor_scaling, warmup_race (the replay is no history of its own)
  for (const std::string page : {"index.html", "experiments.html", "regressions.html", "envs.html", "bisects.html",
                                 "experiment/bwd_fusion/index.html", "experiment/anchor_scaling/index.html",
                                 "experiment/warmup_race/index.html", "runs.js", "site.js", "site.css", ".harness-site"}) {
    INFO(page);
    CHECK(fs::exists(out / page));
  }
  harness::db::Store store(db, harness::db::Access::read);
  harness::db::RunFilter all;
  all.limit = 0;
  const auto runs = store.list_runs(all);
  for (const auto& run : runs) CHECK(fs::exists(out / "run" / (std::to_string(run.id) + ".html")));

  // Every link of every page resolves to a file of the site.
  for (const auto& page : html_files(out)) {
    for (const auto& target : local_links(read(page))) {
      INFO(page.string() << " -> " << target);
      CHECK(fs::exists((page.parent_path() / target).lexically_normal()));
    }
  }

  // bwd_fusion: the dense backward went from 23 ms to 27.5 ms over 5 repeats each; the site calls
  // it exactly as `harness diff` does.
  std::vector<int64_t> bwd_runs;
  for (const auto& run : runs)
    if (run.experiment == "bwd_fusion") bwd_runs.push_back(run.id);
  REQUIRE(bwd_runs.size() == 2);
  const int64_t old_run = std::min(bwd_runs[0], bwd_runs[1]), new_run = std::max(bwd_runs[0], bwd_runs[1]);
  const auto diff = harness::analysis::diff_runs(*store.get_run(old_run), *store.get_run(new_run));
  REQUIRE(diff.regressed());
  const std::string regressions = read(out / "regressions.html");
  int called = 0;
  for (const auto& c : diff.metrics) {
    if (!c.regression) continue;
    ++called;
    INFO(c.variant << "." << c.metric);
    CHECK(has(regressions, "<td>" + c.metric + "</td>"));
  }
  CHECK(called >= 1);
  CHECK(count(regressions, "<span class=\"worse\">") == static_cast<size_t>(called));
  // The improvement-free fused variant is not listed, nor anything about the unchanged runs.
  CHECK_FALSE(has(regressions, "<td>fused</td>"));
  const std::string experiment = read(out / "experiment/bwd_fusion/index.html");
  CHECK(has(experiment, "called WORSE than run " + std::to_string(old_run)));
  const std::string run_page = read(out / "run" / (std::to_string(new_run) + ".html"));
  CHECK(has(run_page, "Compared with run"));
  CHECK(has(run_page, "WORSE"));
  CHECK(has(run_page, "Python torch"));  // the env's changed components

  // A plotted point is the median of that run's repeats, exactly.
  const std::regex point(R"re(<g class="point" data-y="([^"]+)" data-key="(\d+)\|dense\|\{\}">)re");
  std::map<int64_t, double> dense_bwd_ms;
  const auto figure_start = experiment.find("data-metric=\"bwd_ms\"");
  REQUIRE(figure_start != std::string::npos);
  const std::string figure = experiment.substr(figure_start, experiment.find("</figure>", figure_start) - figure_start);
  for (auto it = std::sregex_iterator(figure.begin(), figure.end(), point); it != std::sregex_iterator(); ++it)
    dense_bwd_ms[std::stoll((*it)[2])] = std::stod((*it)[1]);
  REQUIRE(dense_bwd_ms.size() == 2);
  for (const auto& [id, plotted] : dense_bwd_ms) {
    const auto series = harness::analysis::collect_series(store.get_run(id)->metrics);
    const auto* s = harness::analysis::find_series(series, json::object(), "dense", "bwd_ms");
    REQUIRE(s);
    CHECK(plotted == s->spread.median);
  }
  CHECK(dense_bwd_ms[old_run] == 23.0 + 0.1);
  CHECK(dense_bwd_ms[new_run] == 27.5 + 0.1);

  // The replay links back to its run, and the run to its replay.
  const std::string index = read(out / "index.html");
  CHECK(count(index, "<tr><td class=\"num\"><a href=\"run/") == runs.size());
  CHECK(has(index, "<script src=\"runs.js\"></script>"));
}

TEST_CASE("site: a run's neighbour within the noise is not flagged, a verdict flip is", "[site]") {
  harness::test::ScratchDir dir;
  const std::string db = dir.file("h.db");
  {
    harness::db::Store store(db);
    const std::string env = store.put_env(harness::test::fingerprint("2.11.0", "13.0"));
    const int64_t experiment = store.put_experiment("bwd_fusion", harness::test::bwd_fusion_spec());
    auto run = [&](const std::vector<double>& ms, const std::string& verdict) {
      harness::test::RunData data{env, experiment};
      data.verdict = verdict;
      harness::test::TrialData fused{"fused"};
      fused.repeats["bwd_ms"] = ms;
      return harness::test::record_run(store, data, {fused});
    };
    run({1.00, 1.10, 1.05}, "FUSED");
    run({1.04, 1.12, 1.01}, "FUSED");  // overlaps the first: not called
    run({2.00, 2.10, 2.05}, "DENSE");  // outside: called worse, and the verdict flipped
  }
  const fs::path out = dir.file("site");
  build(db, out);
  harness::db::Store store(db, harness::db::Access::read);
  harness::db::RunFilter all;
  all.limit = 0;
  std::vector<harness::db::RunDetail> details;
  for (const auto& run : store.list_runs(all)) details.push_back(*store.get_run(run.id));
  const auto histories = harness::analysis::site::build_histories(details);
  REQUIRE(histories.size() == 1);
  REQUIRE(histories[0].runs.size() == 3);
  CHECK(histories[0].runs[0].regressions == 0);
  CHECK(histories[0].runs[1].regressions == 0);
  CHECK(histories[0].runs[2].regressions == 1);
  CHECK_FALSE(histories[0].runs[1].verdict_flip);
  CHECK(histories[0].runs[2].verdict_flip);
  const int64_t second = histories[0].runs[1].detail->run.id, third = histories[0].runs[2].detail->run.id;
  const std::string regressions = read(out / "regressions.html");
  CHECK(has(regressions, "run/" + std::to_string(third) + ".html"));
  CHECK_FALSE(has(regressions, "<tr><td><a href=\"run/" + std::to_string(second) + ".html\">"));
  const std::string experiment = read(out / "experiment/bwd_fusion/index.html");
  CHECK(has(experiment, "FUSED → DENSE"));
  CHECK(count(experiment, "class=\"flip\" style=") == 1);
  CHECK(has(experiment, "called WORSE than run " + std::to_string(second)));
}

TEST_CASE("site: every db string is escaped, file names from the db are safe", "[site][hostile]") {
  harness::test::ScratchDir dir;
  const std::string db = dir.file("h.db");
  const std::string script = "<script>alert(1)</script>";
  {
    harness::db::Store store(db);
    auto env = harness::test::fingerprint("2.11.0<script>alert('env')</script>", "13.0");
    env["env_vars"] = {{"LD_LIBRARY_PATH", "\"><img src=x onerror=alert(2)>"}};
    const std::string env_id = store.put_env(env);
    auto spec = harness::test::bwd_fusion_spec();
    spec["hypothesis"] = "</p>" + script;
    const int64_t experiment = store.put_experiment("<svg onload=alert(3)>", spec);
    for (int i = 0; i < 2; ++i) {
      harness::db::Run run;
      run.experiment_id = experiment;
      run.env_id = env_id;
      run.device = "cpu\"><b>bold</b>";
      run.args = {{"set", {script}}};
      const int64_t id = store.begin_run(run);
      harness::db::Trial trial;
      trial.run_id = id;
      trial.variant = "<i>fused</i>";
      trial.status = "error";
      trial.error = "</pre>" + script + ", \"quoted\"\nsecond line";
      trial.stderr_tail = "</pre><script>alert(4)</script>\n";
      trial.dispatch = json::array({{{"op", "attention_bwd"}, {"impl", "<u>dense</u>"}, {"reason", script}}});
      store.add_trial(trial, {{"<i>fused</i>", {{"dims.<x>", "<y>"}}, "bwd_ms<script>", 1.0 + i, "ms", -1}});
      harness::db::Artifact artifact;
      artifact.run_id = id;
      artifact.kind = "trace";
      artifact.sha256 = "<sha>";
      artifact.path = "../../<script>.trace.json";
      store.add_artifact(artifact);
      store.finish_run(id, "failed", "<b>DENSE</b>" + std::to_string(i), {{"reason", script}}, script);
    }
  }
  const fs::path out = dir.file("site");
  build(db, out);
  const auto pages = html_files(out);
  REQUIRE(pages.size() >= 8);
  for (const auto& page : pages) {
    const std::string html = read(page);
    INFO(page.string());
    // Only the index's own two scripts; no element the db spelled.
    CHECK(count(html, "<script") == (page == out / "index.html" ? 2u : 0u));
    for (const std::string injected : {"<img", "<b>", "<i>", "<u>", "<svg onload", "</p><script", "<x>", "<y>"}) {
      const size_t at = html.find(injected);
      INFO(injected << " in: " << (at == std::string::npos ? "" : html.substr(at > 80 ? at - 80 : 0, 200)));
      CHECK_FALSE(has(html, injected));
    }
    for (const auto& target : local_links(html)) CHECK(fs::exists((page.parent_path() / target).lexically_normal()));
  }
  CHECK_FALSE(has(read(out / "runs.js"), "<"));
  // The text is there, as text.
  bool shown = false;
  for (const auto& entry : fs::directory_iterator(out / "run")) shown = shown || has(read(entry.path()), "&lt;/pre&gt;&lt;script&gt;alert(1)&lt;/script&gt;");
  CHECK(shown);
  // The experiment's page is named by a hash of its name, inside experiment/.
  const auto slug = harness::analysis::site::slug("<svg onload=alert(3)>");
  CHECK(fs::exists(out / "experiment" / slug / "index.html"));
  for (const auto& entry : fs::recursive_directory_iterator(out))
    CHECK(entry.path().lexically_relative(out).string().find("..") == std::string::npos);
}

TEST_CASE("site: a foreign folder is refused untouched, a site is replaced whole, history is paged", "[site]") {
  harness::test::ScratchDir dir;
  const std::string db = dir.file("h.db");
  {
    harness::db::Store store(db);
    const std::string env = store.put_env(harness::test::fingerprint("2.11.0", "13.0"));
    const int64_t experiment = store.put_experiment("bwd_fusion", harness::test::bwd_fusion_spec());
    for (int i = 0; i < 5; ++i) {
      harness::test::RunData data{env, experiment};
      data.verdict = "FUSED";
      harness::test::TrialData fused{"fused"};
      fused.once["bwd_peak_bytes"] = 1000.0;
      harness::test::record_run(store, data, {fused});
    }
  }
  const fs::path foreign = dir.file("mine");
  fs::create_directories(foreign);
  std::ofstream(foreign / "notes.txt") << "keep me";
  CHECK_THROWS_AS(build(db, foreign), harness::UsageError);
  CHECK(read(foreign / "notes.txt") == "keep me");
  CHECK(std::distance(fs::directory_iterator(foreign), fs::directory_iterator()) == 1);
  std::ofstream(dir.file("file")) << "x";
  CHECK_THROWS_AS(build(db, dir.file("file")), harness::UsageError);
  CHECK_THROWS_AS(build(db, dir.file("no/such/parent")), harness::UsageError);

  const fs::path out = dir.file("site");
  build(db, out, 2);
  CHECK(fs::exists(out / "experiment/bwd_fusion/page-3.html"));
  CHECK_FALSE(fs::exists(out / "experiment/bwd_fusion/page-4.html"));
  CHECK(has(read(out / "experiment/bwd_fusion/index.html"), "older →"));
  std::ofstream(out / "stale.html") << "from before";
  build(db, out, 60);
  CHECK_FALSE(fs::exists(out / "stale.html"));
  CHECK_FALSE(fs::exists(out / "experiment/bwd_fusion/page-2.html"));
  CHECK(fs::exists(out / "index.html"));
  // Nothing is left beside it.
  for (const auto& entry : fs::directory_iterator(dir.file("")))
    CHECK(entry.path().filename().string().find(".partial-") == std::string::npos);
}

// The db `harness site` is measured on (docs/RUNNING.md, "A site of the db"): HARNESS_SYNTHETIC_RUNS
// runs (default 10 000) written through db::Store into $HARNESS_SYNTHETIC_DB: four experiments as
// the shipped specs record them (an attention step with 5 repeats, a 6-point sweep, a race, a
// python probe), eight envs in turn, a slow drift with steps and failures, so that the site has
// flips, regressions, env changes and long histories.
TEST_CASE("write a synthetic db of many runs to $HARNESS_SYNTHETIC_DB", "[.][synthetic_db]") {
  const char* path = std::getenv("HARNESS_SYNTHETIC_DB");
  REQUIRE(path != nullptr);
  const char* count_text = std::getenv("HARNESS_SYNTHETIC_RUNS");
  const int runs = count_text ? std::atoi(count_text) : 10000;
  REQUIRE(runs > 0);
  fs::remove(path);
  harness::db::Store store(path);
  std::vector<std::string> envs;
  for (int e = 0; e < 8; ++e)
    envs.push_back(store.put_env(harness::test::fingerprint(e < 4 ? "2.10.0" : "2.11.0", e % 2 ? "12.9" : "12.8",
                                                            {{"OMP_NUM_THREADS", std::to_string(1 + e % 4)}},
                                                            e < 4 ? "2.10.0" : "2.11.0", "3.5.1")));
  const int64_t bwd = store.put_experiment("bwd_fusion", harness::test::bwd_fusion_spec());
  const int64_t scaling = store.put_experiment("anchor_scaling", harness::test::anchor_scaling_spec());
  const int64_t race = store.put_experiment("warmup_race", json{{"name", "warmup_race"}, {"kind", "autotune_race"}});
  const int64_t python = store.put_experiment("flex_fusion_py", json{{"name", "flex_fusion_py"}, {"kind", "python"}});
  std::mt19937 random(20260101);
  std::normal_distribution<double> noise(0.0, 0.02);
  auto repeats = [&](double centre, int n) {
    std::vector<double> values;
    for (int r = 0; r < n; ++r) values.push_back(centre * (1.0 + noise(random)));
    return values;
  };
  for (int i = 0; i < runs; ++i) {
    const std::string& env = envs[static_cast<size_t>(i / 250) % envs.size()];
    const double drift = 1.0 + 0.1 * ((i / 250) % 8);  // each env a step slower
    harness::test::RunData data{env, 0};
    std::vector<harness::test::TrialData> trials;
    switch (i % 4) {
      case 0: {
        data.experiment_id = bwd;
        data.verdict = (i / 250) % 8 == 5 ? "DENSE" : "FUSED";
        harness::test::TrialData fused{"fused"}, dense{"dense"};
        fused.repeats["bwd_ms"] = repeats(0.7 * drift, 5);
        fused.repeats["fwd_ms"] = repeats(0.26 * drift, 5);
        fused.repeats["bwd_peak_bytes"] = std::vector<double>(5, 59342848.0);
        fused.once["match"] = 1;
        fused.once["max_abs_err"] = 0.0078;
        dense.repeats["bwd_ms"] = repeats(23.0 * drift, 5);
        dense.repeats["fwd_ms"] = repeats(15.0 * drift, 5);
        dense.repeats["bwd_peak_bytes"] = std::vector<double>(5, 7.42 * 1073741824);
        dense.once["match"] = 1;
        dense.once["max_abs_err"] = 0.0089;
        trials = {fused, dense};
        break;
      }
      case 1: {
        data.experiment_id = scaling;
        data.verdict = "DENSE-OOM";
        for (int layers : {1, 5})
          for (int anchors : {128, 256, 512})
            for (const std::string variant : {"fused", "dense"}) {
              harness::test::TrialData t{variant, {{"dims.anchors", anchors}, {"dims.layers", layers}}};
              if (variant == "dense" && anchors == 512 && layers == 5) {
                t.status = "oom";
                t.error = "CUDA out of memory. Tried to allocate 16.00 GiB";
              } else {
                t.repeats["bwd_ms"] = repeats((variant == "dense" ? 23.0 : 0.7) * anchors / 128.0 * layers * drift, 3);
                t.repeats["bwd_peak_bytes"] = std::vector<double>(3, anchors * layers * (variant == "dense" ? 6.0e7 : 4.0e5));
              }
              trials.push_back(std::move(t));
            }
        break;
      }
      case 2: {
        data.experiment_id = race;
        data.device = "cpu";
        data.verdict = i % 40 == 2 ? "NO_RACE" : "RACE";
        harness::test::TrialData legacy{"legacy_shared_state"}, fixed{"per_call_state"};
        legacy.once = {{"failure_rate", i % 40 == 2 ? 0.0 : 0.95}, {"failures", i % 40 == 2 ? 0 : 190}, {"trials", 200}};
        fixed.once = {{"failure_rate", 0.0}, {"failures", 0}, {"trials", 200}};
        trials = {legacy, fixed};
        break;
      }
      default: {
        data.experiment_id = python;
        data.device = "cpu";
        data.verdict = "FUSED";
        harness::test::TrialData eager{"eager"}, compiled{"compiled"};
        eager.once["bwd_peak_bytes"] = 3.0e9 * drift;
        compiled.once["bwd_peak_bytes"] = 2.0e8;
        if (i % 97 == 3) {
          compiled.status = "error";
          compiled.error = "Traceback (most recent call last):\n  File \"probe.py\", line 3\nRuntimeError: inductor, \"quoted\"";
          compiled.once.clear();
        }
        trials = {eager, compiled};
        break;
      }
    }
    harness::test::record_run(store, data, trials);
  }
  harness::db::RunFilter all;
  all.limit = 0;
  CHECK(store.list_runs(all).size() == static_cast<size_t>(runs));
}
