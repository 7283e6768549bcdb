// `harness writeup` in the analysis library: every section from a db written through db::Store,
// target resolution and its errors, the files written, well-formed SVG plots with the expected
// axes, and the reproduce command. Also writes the demo db the browser and notebook tests use.

#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "analysis/document.h"
#include "analysis/svg_plot.h"
#include "analysis/writeup.h"
#include "core/errors.h"
#include "core/files.h"
#include "tests/analysis_test_db.h"
#include "tests/catch.h"
#include "tests/test_paths.h"

namespace {

using harness::UsageError;
using nlohmann::json;

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// A strict check of XML well-formedness for the subset SVG uses: elements with quoted attributes,
// self-closing tags, text with only the five predefined entities or numeric references. Returns
// "" when well-formed, else what is wrong and where.
std::string xml_problem(const std::string& xml) {
  std::vector<std::string> open;
  size_t i = 0;
  auto name_char = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == ':' || c == '_'; };
  while (i < xml.size()) {
    if (xml[i] == '&') {
      const size_t end = xml.find(';', i);
      if (end == std::string::npos) return "unterminated entity at " + std::to_string(i);
      const std::string entity = xml.substr(i + 1, end - i - 1);
      if (entity != "amp" && entity != "lt" && entity != "gt" && entity != "quot" && entity != "apos" &&
          entity.rfind('#', 0) != 0)
        return "unknown entity &" + entity + "; at " + std::to_string(i);
      i = end + 1;
      continue;
    }
    if (xml[i] == '>') return "stray > at " + std::to_string(i);
    if (xml[i] != '<') {
      ++i;
      continue;
    }
    const bool closing = i + 1 < xml.size() && xml[i + 1] == '/';
    size_t j = i + (closing ? 2 : 1);
    const size_t name_start = j;
    while (j < xml.size() && name_char(xml[j])) ++j;
    const std::string name = xml.substr(name_start, j - name_start);
    if (name.empty()) return "tag without a name at " + std::to_string(i);
    if (closing) {
      if (j >= xml.size() || xml[j] != '>') return "bad closing tag </" + name + " at " + std::to_string(i);
      if (open.empty() || open.back() != name)
        return "</" + name + "> closes " + (open.empty() ? std::string("nothing") : "<" + open.back() + ">");
      open.pop_back();
      i = j + 1;
      continue;
    }
    // Attributes: name="value" separated by whitespace; values hold no '<' and no raw '&'.
    std::set<std::string> seen;
    for (;;) {
      while (j < xml.size() && std::isspace(static_cast<unsigned char>(xml[j]))) ++j;
      if (j >= xml.size()) return "unterminated <" + name;
      if (xml[j] == '>') {
        open.push_back(name);
        ++j;
        break;
      }
      if (xml[j] == '/' && j + 1 < xml.size() && xml[j + 1] == '>') {
        j += 2;
        break;
      }
      const size_t attribute_start = j;
      while (j < xml.size() && name_char(xml[j])) ++j;
      const std::string attribute = xml.substr(attribute_start, j - attribute_start);
      if (attribute.empty() || j >= xml.size() || xml[j] != '=') return "bad attribute in <" + name + " at " + std::to_string(j);
      if (!seen.insert(attribute).second) return "duplicate attribute " + attribute + " in <" + name;
      ++j;
      if (j >= xml.size() || (xml[j] != '"' && xml[j] != '\'')) return "unquoted attribute " + attribute;
      const char quote = xml[j];
      const size_t end = xml.find(quote, j + 1);
      if (end == std::string::npos) return "unterminated value of " + attribute;
      const std::string value = xml.substr(j + 1, end - j - 1);
      if (has(value, "<")) return "< in the value of " + attribute;
      for (size_t amp = value.find('&'); amp != std::string::npos; amp = value.find('&', amp + 1))
        if (value.find(';', amp) == std::string::npos) return "raw & in the value of " + attribute;
      j = end + 1;
    }
    i = j;
  }
  if (!open.empty()) return "<" + open.back() + "> never closed";
  return "";
}

std::string read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

const harness::analysis::Figure* figure_named(const harness::analysis::Writeup& writeup, const std::string& id) {
  for (const auto* figure : writeup.document.figures())
    if (figure->id == id) return figure;
  return nullptr;
}

struct Demo {
  harness::test::ScratchDir dir;
  std::string db = dir.file("demo.db");
  Demo() { harness::test::write_demo_db(db); }
};

}  // namespace

TEST_CASE("the XML checker rejects what it should", "[writeup][svg]") {
  CHECK(xml_problem(R"(<svg a="1"><g><line x="2"/></g><text>a &amp; b</text></svg>)") == "");
  CHECK(xml_problem("<svg><g></svg>") != "");
  CHECK(xml_problem(R"(<svg a=1></svg>)") != "");
  CHECK(xml_problem("<svg><text>a & b</text></svg>") != "");
  CHECK(xml_problem(R"(<svg a="1" a="2"></svg>)") != "");
  CHECK(xml_problem("<svg>") != "");
}

TEST_CASE("writeup of an experiment: every section, from its latest run", "[writeup]") {
  Demo demo;
  harness::db::Store store(demo.db);
  const auto detail = harness::analysis::resolve_writeup_target(store, "anchor_scaling");
  CHECK(detail.run.experiment == "anchor_scaling");
  CHECK_FALSE(detail.run.replay_of);  // the replay is newer, but a writeup is of the run itself
  const auto writeup = harness::analysis::build_writeup(store, detail, "h200.db");
  const std::string md = harness::analysis::render_markdown(writeup.document, "");

  for (const std::string section :
       {"# anchor_scaling: DENSE-OOM", "## Hypothesis", "## Setup", "### Dimensions", "### Environment", "## Method",
        "## Results", "## Verdict and evidence", "## Memory model against measured", "## Failures and replays",
        "## History across envs", "## Reproduce", "## All measurements"}) {
    INFO(section);
    CHECK(has(md, section));
  }
  CHECK(has(md, "Memory scales with the anchor count"));
  // Setup and method: swept dims, mask, env, sweep.
  CHECK(has(md, "(swept, see Method)"));
  CHECK(has(md, "`type=dflash`"));
  CHECK(has(md, "LibTorch 2.11.0"));
  CHECK(has(md, "Memory limit 96.0 GiB"));
  CHECK(has(md, "`dims.anchors` over [128,256,512]"));
  // Results: one row per point and variant, the OOM trial's status; the run-level fit is no point.
  CHECK(has(md, "| anchors=512, layers=5 | dense | oom |"));
  CHECK(has(md, "2 variants × 6 sweep points"));
  CHECK(has(md, "(6 points)"));
  CHECK(has(md, "`r2_q_kv`"));  // still listed with the measurements
  // Evidence: the clause and the fit the rule stored.
  CHECK(has(md, "by the clause `dense.status == oom`"));
  CHECK(has(md, "\"r2\":0.998"));
  // Memory model: predicted, measured and the error (dense measured at 0.97 × the model).
  CHECK(has(md, "-3.0 %"));
  CHECK(has(md, "+4.0 %"));
  CHECK(has(md, "(trial oom), requested 16.0 GiB"));
  // Failures: the error text, the capsule and the replay that reproduced it.
  CHECK(has(md, "Tried to allocate 16.00 GiB"));
  CHECK(has(md, "artifacts/5d/5d41402abc4b2a76.capsule"));
  CHECK(has(md, "REPRODUCED (reproduced)"));
  // Reproduce: the exact command, with the memory limit and the --set.
  CHECK(has(md, "harness run anchor_scaling --device cuda:0 --set 'dims.anchors=[128,256,512]' --memory-limit 96GiB "
                "--db h200.db"));
  CHECK(has(md, "harness replay " + std::to_string(detail.run.id) + " --db h200.db"));
  // Without files the plots are named, with where -o would put them.
  CHECK(has(md, "_Plot: bwd_peak_bytes against anchors"));

  // Plots: memory against anchors with the model and the OOM, time against anchors.
  const auto* memory = figure_named(writeup, "memory-bwd_peak_bytes");
  REQUIRE(memory);
  INFO(memory->svg);
  CHECK(xml_problem(memory->svg) == "");
  CHECK(has(memory->svg, ">anchors</text>"));
  CHECK(has(memory->svg, "(log scale)"));                // dense and fused differ by 100×
  CHECK(has(memory->svg, ">128</text>"));                // the swept values are the x ticks
  CHECK(has(memory->svg, ">512</text>"));
  CHECK(has(memory->svg, "dense · layers=5 OOM (requested)"));
  CHECK(has(memory->svg, "fused · layers=1 (model)"));
  CHECK(has(memory->svg, "stroke-dasharray"));
  CHECK(has(memory->svg, "GiB</text>"));
  const auto* time = figure_named(writeup, "time-bwd_ms");
  REQUIRE(time);
  CHECK(xml_problem(time->svg) == "");
}

TEST_CASE("writeup of a run without a sweep: history across envs and a diff command", "[writeup]") {
  Demo demo;
  harness::db::Store store(demo.db);
  const auto detail = harness::analysis::resolve_writeup_target(store, "bwd_fusion");
  const auto writeup = harness::analysis::build_writeup(store, detail, "harness.db");
  const std::string md = harness::analysis::render_markdown(writeup.document, "report-");
  CHECK(has(md, "2 finished runs of `bwd_fusion` under 2 envs"));
  CHECK(has(md, "LibTorch 2.10.0"));
  CHECK(has(md, "`fused.bwd_peak_bytes`"));
  CHECK(has(md, "harness diff 1 2 --db harness.db"));
  CHECK(has(md, "All 2 trials ended ok."));
  CHECK(has(md, "`fused.bwd_peak_bytes` = 56.6 MiB < 5.00 GiB (holds)"));
  CHECK(has(md, "![Memory per variant"));
  CHECK(has(md, "(report-memory.svg)"));
  CHECK(has(md, "(report-time.svg)"));
  const auto* memory = figure_named(writeup, "memory");
  REQUIRE(memory);
  CHECK(xml_problem(memory->svg) == "");
  CHECK(has(memory->svg, ">fused</text>"));
  CHECK(has(memory->svg, ">dense</text>"));
}

TEST_CASE("writeup of a race: failure rates with their intervals", "[writeup]") {
  Demo demo;
  harness::db::Store store(demo.db);
  const auto detail = harness::analysis::resolve_writeup_target(store, "warmup_race");
  const auto writeup = harness::analysis::build_writeup(store, detail, "harness.db");
  const auto* rates = figure_named(writeup, "failure-rate");
  REQUIRE(rates);
  CHECK(xml_problem(rates->svg) == "");
  CHECK(has(rates->svg, ">legacy_shared_state</text>"));
  CHECK_FALSE(has(rates->svg, "(log scale)"));
  // The whisker of legacy_shared_state spans its stored interval 0.930–0.983: three lines (bar
  // and two caps) beside its marker. Count whisker lines: both variants have an interval.
  size_t whiskers = 0;
  for (size_t at = rates->svg.find("stroke-width=\"1.5\""); at != std::string::npos;
       at = rates->svg.find("stroke-width=\"1.5\"", at + 1))
    ++whiskers;
  CHECK(whiskers == 6);
  const std::string md = harness::analysis::render_markdown(writeup.document, "");
  CHECK(has(md, "No memory-model predictions"));
  CHECK(has(md, "`threads`"));
  CHECK(has(md, "harness run warmup_race --device cpu --no-profile --db harness.db"));
}

TEST_CASE("writeup targets: run ids, experiments and errors", "[writeup]") {
  Demo demo;
  harness::db::Store store(demo.db);
  CHECK(harness::analysis::resolve_writeup_target(store, "1").run.id == 1);
  CHECK_THROWS_AS(harness::analysis::resolve_writeup_target(store, "999"), UsageError);
  CHECK_THROWS_AS(harness::analysis::resolve_writeup_target(store, "no_such_experiment"), UsageError);
  try {
    harness::analysis::resolve_writeup_target(store, "no_such_experiment");
  } catch (const UsageError& e) {
    CHECK(has(e.what(), "anchor_scaling, bwd_fusion, warmup_race"));
  }
  harness::test::ScratchDir dir;
  harness::db::Store empty(dir.file("empty.db"));
  CHECK_THROWS_AS(harness::analysis::resolve_writeup_target(empty, "bwd_fusion"), UsageError);
}

TEST_CASE("writeup files: Markdown, HTML and SVGs beside them", "[writeup]") {
  Demo demo;
  harness::db::Store store(demo.db);
  const auto writeup =
      harness::analysis::build_writeup(store, harness::analysis::resolve_writeup_target(store, "anchor_scaling"), "x.db");
  const std::string out = demo.dir.file("report.md");
  const auto files = harness::analysis::write_writeup(writeup, out, true);
  CHECK(files.markdown == out);
  CHECK(files.html == demo.dir.file("report.html"));
  REQUIRE(files.figures.size() == 2);
  for (const auto& figure : files.figures) {
    INFO(figure);
    CHECK(std::filesystem::exists(figure));
    CHECK(xml_problem(read(figure)) == "");
  }
  const std::string md = read(files.markdown), html = read(files.html);
  CHECK(has(md, "(report-memory-bwd_peak_bytes.svg)"));
  CHECK(std::filesystem::exists(demo.dir.file("report-memory-bwd_peak_bytes.svg")));
  CHECK(has(html, "<!DOCTYPE html>"));
  CHECK(has(html, "<svg xmlns=\"http://www.w3.org/2000/svg\""));
  CHECK(has(html, "<h2>Failures and replays</h2>"));
  CHECK(has(html, "<code>dims.anchors</code>"));
  // The page, minus its doctype, is well-formed too (every table cell and figure closed).
  CHECK(xml_problem(html.substr(html.find("<html"))) == "");

  // "-o report.html" writes the HTML there, and the Markdown beside it.
  const auto html_first = harness::analysis::write_writeup(writeup, demo.dir.file("page.html"), false);
  CHECK(html_first.html == demo.dir.file("page.html"));
  CHECK(html_first.markdown == demo.dir.file("page.md"));
}

TEST_CASE("SVG plots: axes, scales, empty data", "[writeup][svg]") {
  using harness::analysis::Plot;
  using harness::analysis::PlotSeries;
  Plot plot;
  plot.title = "a <b> & c";
  plot.x_label = "anchors";
  plot.y_label = "bytes";
  plot.y_unit = "bytes";
  PlotSeries line{"dense", {{128, 1 << 30}, {256, 4.0 * (1 << 30)}, {512, 16.0 * (1 << 30)}}};
  PlotSeries flat{"fused", {{128, 50e6, 49e6, 51e6}, {256, 60e6}, {512, 80e6}}, 1};
  plot.series = {line, flat};
  const std::string svg = harness::analysis::render_svg(plot);
  INFO(svg);
  CHECK(xml_problem(svg) == "");
  CHECK(has(svg, "a &lt;b&gt; &amp; c"));
  CHECK(has(svg, "bytes (log scale)"));
  CHECK(has(svg, ">1 GiB</text>"));
  CHECK(has(svg, "#1f77b4"));
  CHECK(has(svg, "#d62728"));

  plot.y_scale = harness::analysis::Scale::kLinear;
  CHECK_FALSE(has(harness::analysis::render_svg(plot), "(log scale)"));

  Plot empty;
  empty.title = "nothing";
  const std::string none = harness::analysis::render_svg(empty);
  CHECK(xml_problem(none) == "");
  CHECK(has(none, "no data"));

  CHECK(harness::analysis::tick_label(1048576, "bytes") == "1 MiB");
  CHECK(harness::analysis::tick_label(1.5 * 1073741824, "bytes") == "1.5 GiB");
  CHECK(harness::analysis::tick_label(0.25, "") == "0.25");
}

TEST_CASE("HTML and Markdown rendering of inline text and tables", "[writeup]") {
  harness::analysis::Document doc;
  doc.title = "t";
  doc.paragraph("**bold** and `code <x>`");
  doc.table({{"a|b", "c"}, {{"1|2", "x\ny"}}, {false, true}});
  doc.code("has ``` inside\n");
  const std::string html = harness::analysis::render_html(doc);
  CHECK(has(html, "<strong>bold</strong> and <code>code &lt;x&gt;</code>"));
  CHECK(has(html, "<td class=\"num\">x\ny</td>"));
  const std::string md = harness::analysis::render_markdown(doc, "");
  CHECK(has(md, "| a\\|b | c |"));
  CHECK(has(md, "| --- | ---: |"));
  CHECK(has(md, "| 1\\|2 | x y |"));
  CHECK(has(md, "````text\nhas ``` inside\n````"));
}

TEST_CASE("shell quoting and the reproduce command", "[writeup]") {
  CHECK(harness::analysis::shell_quote("dims.anchors=256") == "dims.anchors=256");
  CHECK(harness::analysis::shell_quote("a b") == "'a b'");
  CHECK(harness::analysis::shell_quote("it's") == "'it'\\''s'");
  harness::db::Run run;
  run.experiment = "bwd_fusion";
  run.device = "cuda:2";
  run.args = {{"experiment", "bwd_fusion"}, {"set", {"mask.documents=2"}}, {"memory_limit_bytes", 536870912}};
  CHECK(harness::analysis::reproduce_command(run, "my db.db") ==
        "harness run bwd_fusion --device cuda:2 --set mask.documents=2 --memory-limit 512MiB --db 'my db.db'");
  run.args = {{"argv", {"run", "bwd_fusion", "--device", "cuda:0"}}};
  CHECK(harness::analysis::reproduce_command(run, "x.db") == "harness run bwd_fusion --device cuda:0");
}

// Not a test: writes the demo db for the browser and notebook CTests (tests/CMakeLists.txt runs
// it with the tag as a fixture). Hidden, so plain runs of the unit tests skip it.
TEST_CASE("write the demo db to $HARNESS_DEMO_DB", "[.][demo_db]") {
  const char* path = std::getenv("HARNESS_DEMO_DB");
  REQUIRE(path != nullptr);
  std::filesystem::remove(path);
  harness::test::write_demo_db(path);
  harness::db::Store store(path);
  CHECK(store.list_runs().size() == 5);
}

// --- An allocator snapshot kept with a trial is rendered by the writeup -------------------------
TEST_CASE("writeup of a run with an allocator snapshot: its OOM state, named by the memory model", "[writeup][snapshot]") {
  harness::test::ScratchDir dir;
  const std::string db_path = dir.file("harness.db");
  harness::db::Store store(db_path);
  std::ifstream spec_file(std::string(HARNESS_TEST_DATA_DIR) + "/cli/replay_small.json");
  const json spec = json::parse(spec_file);
  harness::test::RunData run;
  run.env_id = store.put_env(harness::test::fingerprint("2.11.0", "13.0"));
  run.experiment_id = store.put_experiment("replay_small", spec);
  harness::test::TrialData dense{"dense"};
  dense.status = "oom";
  dense.requested_bytes = 24576;
  const int64_t run_id = harness::test::record_run(store, run, {dense});
  const auto trials = store.get_run(run_id)->trials;
  REQUIRE(trials.size() == 1);
  std::filesystem::create_directories(dir.file("artifacts"));
  std::filesystem::copy_file(std::string(HARNESS_TEST_DATA_DIR) + "/data/snapshot_synthetic_p2.pickle",
                             dir.file("artifacts/synthetic.snapshot.pickle"));
  harness::db::Artifact artifact;
  artifact.run_id = run_id;
  artifact.trial_id = trials[0].id;
  artifact.kind = "memory_snapshot";
  artifact.sha256 = "synthetic";
  artifact.path = "artifacts/synthetic.snapshot.pickle";
  artifact.bytes = static_cast<int64_t>(std::filesystem::file_size(dir.file(artifact.path)));
  store.add_artifact(artifact);

  const auto detail = harness::analysis::resolve_writeup_target(store, std::to_string(run_id));
  const auto writeup = harness::analysis::build_writeup(store, detail, db_path);
  const std::string md = harness::analysis::render_markdown(writeup.document, "report-");
  INFO(md.substr(md.find("## Allocator snapshots") == std::string::npos ? 0 : md.find("## Allocator snapshots"), 1200));
  CHECK(has(md, "## Allocator snapshots"));
  CHECK(has(md, "8 allocator events"));
  // Tiny dims: many of the model's tensors are 24 KiB; the first three are named, the rest counted.
  CHECK(has(md, "the OOM asked for 24.0 KiB (k expanded = v expanded = scores (+10 more))"));
  CHECK(has(md, "_memory_viz trace_plot"));
  const auto* peak = figure_named(writeup, "snapshot-1-peak");
  REQUIRE(peak);
  CHECK(xml_problem(peak->svg) == "");
  CHECK(has(peak->svg, "scores"));
  CHECK(has(peak->svg, "requested, failed"));
  const auto* timeline = figure_named(writeup, "snapshot-1-timeline");
  REQUIRE(timeline);
  CHECK(xml_problem(timeline->svg) == "");

  // A snapshot that is not one is said so, and the rest of the writeup stands.
  std::ofstream(dir.file(artifact.path), std::ios::trunc) << "not a pickle";
  const auto broken = harness::analysis::build_writeup(store, detail, db_path);
  const std::string broken_md = harness::analysis::render_markdown(broken.document, "report-");
  CHECK(has(broken_md, "cannot be read"));
  CHECK(has(broken_md, "## Failures and replays"));

  // A row edited to name a file outside the db's artifact folder (a db from someone else) is
  // named, never read, though a readable snapshot lies there.
  std::filesystem::copy_file(std::string(HARNESS_TEST_DATA_DIR) + "/data/snapshot_synthetic_p2.pickle",
                             dir.file("outside.snapshot.pickle"));
  harness::db::Artifact outside = artifact;
  outside.sha256 = "synthetic-outside";
  outside.path = "artifacts/../outside.snapshot.pickle";
  store.add_artifact(outside);
  const auto edited_detail = harness::analysis::resolve_writeup_target(store, std::to_string(run_id));
  const auto edited = harness::analysis::build_writeup(store, edited_detail, db_path);
  const std::string edited_md = harness::analysis::render_markdown(edited.document, "report-");
  CHECK(has(edited_md, "outside the db's artifact folder"));
  CHECK_FALSE(has(edited_md, "allocator events"));
}
