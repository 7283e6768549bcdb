// `harness bisect EXPERIMENT --package P --good G --bad B | --envs A B ... | --builds DIR ...`:
// which version (env, build) changed a verdict, a trial status or a metric. Each candidate gets
// its cached env (core/venv_cache.h), each probe is an ordinary `harness run` stored in the db,
// the search and the judging are analysis/bisect.h's, and the bisect is stored with its probes
// (`harness bisect show ID`, `harness writeup --bisect ID`).

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <memory>
#include <map>
#include <regex>
#include <sstream>

#include <fmt/format.h>

#include "analysis/bisect.h"
#include "analysis/series.h"
#include "core/package_versions.h"
#include "core/printer.h"
#include "core/python_env.h"
#include "core/trial_runner.h"
#include "core/venv_cache.h"
#include "db/store.h"
#include "experiments/spec.h"
#include "experiments/sweep.h"
#include "harness/cli/cli.h"
#include "harness/runner/run_support.h"

namespace harness {
namespace {

namespace fs = std::filesystem;
using analysis::BisectMode;
using analysis::ProbeOutcome;

struct BisectArgs {
  std::string experiment;
  std::string package;
  std::string good;
  std::string bad;
  std::string versions;
  std::vector<std::string> find_links;
  bool no_index = false;
  std::string index_url;
  bool pre = false;
  std::string python = "python3";
  std::vector<std::string> extras;
  std::string installer = "auto";
  std::string env_cache;
  double install_timeout_s = 3600.0;
  std::vector<std::string> envs;
  std::vector<std::string> builds;
  std::string device = "auto";
  std::vector<std::string> overrides;
  std::string profile;
  bool no_profile = false;
  std::string metric;
  std::string threshold = "10%";
  std::string status_variant;
  int max_reruns = 2;
};

struct ShowArgs {
  int64_t id = 0;
};

//! One thing the bisect can probe.
struct Candidate {
  std::string label;    //!< the version, interpreter or build as the user wrote it
  std::string python;   //!< interpreter of the run ("" until the env exists)
  std::string harness;  //!< the harness binary that runs it
  bool needs_env = false;
};

//! What probing one candidate gave.
struct ProbeRecord {
  std::vector<db::RunDetail> runs;
  nlohmann::json env = nlohmann::json();  //!< the cached env (versions only)
  nlohmann::json packages = nlohmann::json();
  std::string failure;        //!< why there is no run (install or run failed), one line
  std::string install_error;  //!< the installer's whole message
};

double parse_threshold(const std::string& text) {
  static const std::regex pattern(R"(\s*([0-9]*\.?[0-9]+)\s*(%?)\s*)");
  std::smatch match;
  if (!std::regex_match(text, match, pattern))
    throw UsageError("--threshold '" + text + "': expected a relative change such as 10% or 0.1");
  double value = std::stod(match[1].str());
  if (match[2].matched && match[2].length() > 0) value /= 100.0;
  if (!(value > 0.0)) throw UsageError("--threshold '" + text + "': must be more than 0");
  return value;
}

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> items;
  std::string item;
  std::istringstream stream(text);
  while (std::getline(stream, item, ',')) {
    const auto begin = item.find_first_not_of(" \t");
    if (begin == std::string::npos) continue;
    items.push_back(item.substr(begin, item.find_last_not_of(" \t") - begin + 1));
  }
  return items;
}

std::string first_line(const std::string& text) { return text.substr(0, text.find('\n')); }

// The line of an installer's failure a table can show: the last one that says "error", else the
// first, cut to 160 characters (the whole message stays in the probe's details).
std::string short_reason(const std::string& message) {
  std::istringstream lines(message);
  std::string line, chosen;
  while (std::getline(lines, line)) {
    const auto begin = line.find_first_not_of(" \t");
    if (begin == std::string::npos) continue;
    std::string lower = line;
    std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
    if (lower.find("error") != std::string::npos) chosen = line.substr(begin);
  }
  if (chosen.empty()) chosen = first_line(message);
  return chosen.size() > 160 ? chosen.substr(0, 157) + "..." : chosen;
}

// The interpreter of --envs ENTRY: a venv (or prefix) folder's bin/python, or the path itself.
std::string interpreter_of(const std::string& entry) {
  if (fs::is_directory(entry)) {
    for (const char* candidate : {"bin/python", "bin/python3"}) {
      const auto python = find_program((fs::path(entry) / candidate).string());
      if (python) return *python;
    }
    throw UsageError("--envs " + entry + ": a folder without bin/python (expected a venv or an interpreter)");
  }
  const auto python = find_program(entry);
  if (!python) throw UsageError("--envs " + entry + ": no such interpreter");
  return *python;
}

// The harness binary of --builds ENTRY: a build folder (harness/harness in it), or the binary.
std::string harness_of(const std::string& entry) {
  if (fs::is_directory(entry)) {
    for (const char* candidate : {"harness/harness", "bin/harness", "harness"}) {
      const auto binary = find_program((fs::path(entry) / candidate).string());
      if (binary && !fs::is_directory(*binary)) return *binary;
    }
    throw UsageError("--builds " + entry + ": no harness binary in it (looked for harness/harness, bin/harness)");
  }
  const auto binary = find_program(entry);
  if (!binary) throw UsageError("--builds " + entry + ": no such build folder or harness binary");
  return *binary;
}

// The versions of --package between --good and --bad: --versions, else the --find-links folders,
// else the package index (`pip index versions`).
std::pair<std::vector<std::string>, std::string> list_versions(const BisectArgs& args) {
  std::vector<std::string> available;
  std::string source;
  if (!args.versions.empty()) {
    available = split_list(args.versions);
    source = "--versions";
    // --versions lists what to probe: good and bad are in it or added at the ends.
    for (const auto& end : {args.good, args.bad})
      if (std::find(available.begin(), available.end(), end) == available.end()) available.push_back(end);
  } else if (!args.find_links.empty()) {
    for (const auto& folder : args.find_links) {
      const auto found = versions_in_folder(folder, args.package);
      available.insert(available.end(), found.begin(), found.end());
      source += (source.empty() ? "--find-links " : ", ") + folder;
    }
    if (available.empty())
      throw UsageError(fmt::format("--package {}: unknown package, no wheels or source archives of it in {}",
                                   args.package, source));
  } else {
    if (args.no_index) throw UsageError("--no-index needs --find-links DIR or --versions LIST: no index to list versions from");
    const std::string python = resolve_base_python(args.python);
    ChildCommand command;
    command.argv = {python, "-m", "pip", "index", "versions", args.package, "--disable-pip-version-check"};
    if (!args.index_url.empty()) command.argv.insert(command.argv.end(), {"--index-url", args.index_url});
    if (args.pre) command.argv.push_back("--pre");
    command.timeout_s = 300.0;
    command.separate_stdout = true;
    const auto outcome = run_child(command);
    available = parse_pip_index_versions(outcome.stdout_text);
    source = "the package index (pip index versions " + args.package + ")";
    if (available.empty()) {
      const std::string said = outcome.stderr_tail.empty() ? outcome.stdout_text : outcome.stderr_tail;
      if (said.find("No matching distribution") != std::string::npos)
        throw UsageError(fmt::format("--package {}: unknown package on the index", args.package));
      throw InfraError(fmt::format("--package {}: could not list its versions with pip index versions: {}", args.package,
                                   said.empty() ? "no output" : said));
    }
  }
  return {versions_between(available, args.good, args.bad, args.pre, source), source};
}

class Bisector {
 public:
  Bisector(const BisectArgs& args, const GlobalOptions& options) : args_(args), options_(options) {}

  int run() {
    validate();
    db::Store store(options_.db_path);
    store_ = &store;
    db::Bisect row;
    row.experiment = spec_name_;
    row.mode = analysis::mode_name(target_.mode);
    row.target = target_.mode == BisectMode::kMetric
                     ? (target_.variant.empty() ? target_.metric : target_.variant + "." + target_.metric)
                     : target_.variant;
    row.package = args_.package;
    row.good = candidates_.front().label;
    row.bad = candidates_.back().label;
    row.args = command_json();
    row.result = {{"candidates", labels()}, {"source", source_}, {"target", target_.describe()}, {"over", over_}};
    bisect_id_ = store.begin_bisect(row);
    log(fmt::format("bisect {}: {} over {} ({} candidates: {} ... {}), by {}", bisect_id_, spec_name_, over_,
                    candidates_.size(), row.good, row.bad, target_.describe()));
    install_interrupt_handlers();
    try {
      search();
    } catch (const std::exception& error) {
      const std::string status = interrupt_requested() ? "interrupted" : "failed";
      store.finish_bisect(bisect_id_, status, "", "", result_json(), error.what());
      throw;
    }
    const auto bisect = *store.get_bisect(bisect_id_);
    const auto probes = store.list_bisect_probes(bisect_id_);
    if (options_.json) {
      print_json(std::cout, analysis::bisect_json(bisect, probes));
    } else {
      std::cout << analysis::bisect_text(bisect, probes);
    }
    return kExitOk;
  }

 private:
  void validate() {
    const int sources = (!args_.package.empty()) + (!args_.envs.empty()) + (!args_.builds.empty());
    if (sources != 1)
      throw UsageError("bisect over exactly one of: --package P --good G --bad B, --envs A B ..., --builds DIR DIR ...");
    if (args_.package.empty() && (!args_.good.empty() || !args_.bad.empty()))
      throw UsageError("--good and --bad go with --package (with --envs and --builds the first is good, the last bad)");
    if (!args_.metric.empty() && !args_.status_variant.empty())
      throw UsageError("give --metric or --status, not both");
    if (args_.max_reruns < 0) throw UsageError("--max-reruns must be 0 or more");
    check_device_syntax(args_.device);
    // Values that reach pip's or uv's command line: one that starts with '-' would be read there
    // as an option of its own (`-r FILE`, `--index-url URL`), whatever it stood for here.
    const auto refuse_option_like = [](const std::string& option, const std::string& value) {
      if (!value.empty() && value[0] == '-')
        throw UsageError(fmt::format("{} '{}': starts with '-', which pip and uv would read as an option", option, value));
    };
    refuse_option_like("--package", args_.package);
    refuse_option_like("--good", args_.good);
    refuse_option_like("--bad", args_.bad);
    refuse_option_like("--index-url", args_.index_url);
    for (const auto& version : split_list(args_.versions)) refuse_option_like("--versions", version);
    for (const auto& extra : args_.extras) refuse_option_like("--extra", extra);
    for (const auto& folder : args_.find_links) refuse_option_like("--find-links", folder);

    // The experiment: its spec must load as `harness run` would load it.
    const auto path = spec::find_spec(args_.experiment, experiment_search_dirs(options_));
    if (!path) throw UsageError(fmt::format("unknown experiment '{}' (`harness list` shows them)", args_.experiment));
    spec_path_ = fs::absolute(*path).string();
    spec::LoadOptions load;
    load.overrides = args_.overrides;
    load.profile = args_.profile;
    load.allow_faults = faults_allowed();
    const spec::Spec spec = spec::load_spec_file(spec_path_, load);
    spec_name_ = spec.name;
    hypothesis_ = spec.hypothesis;
    // Every trial may use its whole limit; the run adds its env probe and its own start.
    run_timeout_s_ = (spec.timeout_s + 60.0) * static_cast<double>(spec.variants.size()) *
                         static_cast<double>(spec::sweep_points(spec).size()) +
                     600.0;
    if (spec.kind != "python" && args_.builds.empty()) {
      throw UsageError(fmt::format("{} is a '{}' experiment: only python experiments run under other Python packages or "
                                   "interpreters; bisect the harness builds that run it with --builds DIR ...",
                                   spec.name, spec.kind));
    }
    if (!args_.status_variant.empty()) {
      const bool known = std::any_of(spec.variants.begin(), spec.variants.end(),
                                     [&](const spec::Variant& v) { return v.name == args_.status_variant; });
      if (!known) throw UsageError(fmt::format("--status {}: {} has no such variant", args_.status_variant, spec.name));
      target_.mode = BisectMode::kStatus;
      target_.variant = args_.status_variant;
    } else if (!args_.metric.empty()) {
      target_.mode = BisectMode::kMetric;
      const auto dot = args_.metric.find('.');
      if (dot != std::string::npos) {
        target_.variant = args_.metric.substr(0, dot);
        target_.metric = args_.metric.substr(dot + 1);
      } else {
        target_.metric = args_.metric;
      }
      target_.threshold = parse_threshold(args_.threshold);
    }

    if (!args_.package.empty()) {
      static const std::regex name(R"([A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?)");
      if (!std::regex_match(args_.package, name))
        throw UsageError("--package '" + args_.package + "': not a package name");
      if (args_.good.empty() || args_.bad.empty()) throw UsageError("--package needs --good VERSION and --bad VERSION");
      for (const auto& folder : args_.find_links)
        if (!fs::is_directory(folder)) throw UsageError("--find-links " + folder + ": no such folder");
      // Same before asking any index: nothing to search between one version and itself.
      const auto good = parse_version(args_.good), bad = parse_version(args_.bad);
      if (good && bad && compare_versions(*good, *bad) == 0)
        throw UsageError("--good " + args_.good + " and --bad " + args_.bad + " are the same version: nothing to bisect");
      resolve_base_python(args_.python);  // a missing interpreter is bad input, before any install
      if (args_.installer == "uv" && !find_uv())
        throw UsageError("--installer uv: no uv executable ($HARNESS_UV, or uv in $PATH; `pip install uv` installs it)");
      if (args_.installer != "auto" && args_.installer != "uv" && args_.installer != "pip")
        throw UsageError("--installer '" + args_.installer + "': expected auto, uv or pip");
      auto [versions, source] = list_versions(args_);
      source_ = source;
      over_ = "package " + args_.package;
      for (const auto& version : versions) candidates_.push_back({version, "", self_executable(), true});
    } else if (!args_.envs.empty()) {
      if (args_.envs.size() < 2) throw UsageError("--envs needs at least two interpreters (good first, bad last)");
      over_ = "interpreters";
      for (const auto& entry : args_.envs) candidates_.push_back({entry, interpreter_of(entry), self_executable(), false});
    } else {
      if (args_.builds.size() < 2) throw UsageError("--builds needs at least two builds (good first, bad last)");
      over_ = "harness builds";
      const auto python = find_program(args_.python);
      for (const auto& entry : args_.builds)
        candidates_.push_back({entry, python ? *python : args_.python, harness_of(entry), false});
    }
    std::vector<std::string> seen;
    for (const auto& candidate : candidates_) {
      if (std::find(seen.begin(), seen.end(), candidate.label) != seen.end())
        throw UsageError("'" + candidate.label + "' is listed twice: the candidates must be distinct");
      seen.push_back(candidate.label);
    }
  }

  std::vector<std::string> labels() const {
    std::vector<std::string> out;
    for (const auto& c : candidates_) out.push_back(c.label);
    return out;
  }

  nlohmann::json command_json() const {
    return {{"experiment", args_.experiment}, {"spec_path", spec_path_},     {"package", args_.package},
            {"good", args_.good},             {"bad", args_.bad},            {"versions", args_.versions},
            {"find_links", args_.find_links}, {"no_index", args_.no_index},  {"index_url", args_.index_url},
            {"python", args_.python},         {"extras", args_.extras},      {"installer", args_.installer},
            {"envs", args_.envs},             {"builds", args_.builds},      {"device", args_.device},
            {"set", args_.overrides},         {"profile", args_.profile},    {"no_profile", args_.no_profile},
            {"metric", args_.metric},         {"threshold", args_.threshold}, {"status", args_.status_variant},
            {"max_reruns", args_.max_reruns}};
  }

  void log(const std::string& line) const {
    if (!options_.json) std::cerr << line << '\n';
  }

  // Creates (or reuses) the candidate's env. Returns false with `record.failure` set when it
  // cannot be installed.
  bool prepare(Candidate& candidate, ProbeRecord& record) {
    if (!candidate.needs_env) return true;
    EnvRequest request;
    request.python = args_.python;
    request.requirements = {args_.package + "==" + candidate.label};
    request.requirements.insert(request.requirements.end(), args_.extras.begin(), args_.extras.end());
    request.find_links = args_.find_links;
    request.no_index = args_.no_index;
    request.index_url = args_.index_url;
    request.installer = args_.installer;
    request.timeout_s = args_.install_timeout_s;
    try {
      const auto env = ensure_env(request, args_.env_cache.empty() ? env_cache_root() : args_.env_cache,
                                  [&](const std::string& line) { log("  " + line); });
      candidate.python = env.python;
      record.env = {{"key", env.key},           {"path", env.path},           {"python", env.python},
                    {"installer", env.installer}, {"install_s", env.install_s}, {"reused", env.reused},
                    {"requirements", env.request.value("requirements", nlohmann::json::array())}};
      record.packages = env.packages;
      return true;
    } catch (const EnvInstallError& error) {
      record.failure = std::string("cannot install: ") + short_reason(error.what());
      record.install_error = error.what();
      return false;
    }
  }

  // One `harness run` of the experiment with the candidate's interpreter (and binary). Returns
  // the stored run, or nullopt with `failure` set.
  std::optional<db::RunDetail> run_once(const Candidate& candidate, std::string& failure) {
    ChildCommand command;
    command.argv = {candidate.harness, "run",  spec_path_,         "--device", args_.device,
                    "--db",            options_.db_path, "--json", "--python", candidate.python};
    for (const auto& override_arg : args_.overrides) command.argv.insert(command.argv.end(), {"--set", override_arg});
    if (!args_.profile.empty()) command.argv.insert(command.argv.end(), {"--profile", args_.profile});
    if (args_.no_profile) command.argv.push_back("--no-profile");
    command.timeout_s = run_timeout_s_;
    command.separate_stdout = true;
    command.stdout_limit_bytes = 64 << 20;
    command.stderr_tail_bytes = 4096;
    command.die_with_parent = true;
    const auto outcome = run_child(command);
    if (outcome.interrupted || interrupt_requested()) throw InfraError("interrupted");
    const auto json = nlohmann::json::parse(outcome.stdout_text, nullptr, false);
    int64_t run_id = 0;
    if (!json.is_discarded() && json.is_object() && json.contains("run") && json["run"].contains("id"))
      run_id = json["run"]["id"].get<int64_t>();
    if (outcome.exit_code == kExitUsage && run_id == 0) {
      failure = "harness run refused it (exit 2): " + first_line(outcome.stderr_tail);
      return std::nullopt;
    }
    if (run_id == 0) {
      failure = fmt::format("harness run stored no run ({}): {}",
                            outcome.timed_out ? "timed out"
                            : outcome.signal  ? signal_name(*outcome.signal)
                                              : "exit " + std::to_string(outcome.exit_code.value_or(-1)),
                            first_line(outcome.stderr_tail));
      return std::nullopt;
    }
    return store_->get_run(run_id);
  }

  ProbeRecord probe(Candidate& candidate) {
    ProbeRecord record;
    if (!prepare(candidate, record)) return record;
    auto run = run_once(candidate, record.failure);
    if (run) record.runs.push_back(std::move(*run));
    return record;
  }

  // Repeats a metric probe that reads inside the noise, pooling the repeats of every run.
  analysis::ProbeJudgement judge_with_reruns(Candidate& candidate, ProbeRecord& record) {
    auto reading = analysis::read_probe(target_, record.runs);
    auto judgement = analysis::judge_probe(target_, good_, bad_, reading);
    for (int rerun = 0; judgement.inside_noise && rerun < args_.max_reruns; ++rerun) {
      log(fmt::format("  {}: {}; running it again ({} of {})", candidate.label, judgement.reason, rerun + 1,
                      args_.max_reruns));
      std::string failure;
      auto run = run_once(candidate, failure);
      if (!run) break;
      record.runs.push_back(std::move(*run));
      reading = analysis::read_probe(target_, record.runs);
      judgement = analysis::judge_probe(target_, good_, bad_, reading);
    }
    if (judgement.inside_noise) judgement.reason += fmt::format(" after {} run(s): skipped", record.runs.size());
    return judgement;
  }

  // The metric the writeup plots: the target's, or the first metric the good end measured (for
  // the status target, of its variant).
  void choose_plot_metric(const db::RunDetail& good_run) {
    if (target_.mode == BisectMode::kMetric) {
      plot_variant_ = target_.variant;
      plot_metric_ = target_.metric;
      return;
    }
    for (const auto& series : analysis::collect_series(good_run.metrics)) {
      if (target_.mode == BisectMode::kStatus && series.variant != target_.variant) continue;
      if (series.metric.rfind("model_", 0) == 0) continue;
      plot_variant_ = series.variant;
      plot_metric_ = series.metric;
      return;
    }
  }

  nlohmann::json details_of(const ProbeRecord& record, const analysis::ProbeReading& reading) const {
    nlohmann::json details = {{"reading", reading.usable ? (target_.mode == BisectMode::kVerdict  ? reading.verdict
                                                            : target_.mode == BisectMode::kStatus ? reading.status
                                                                                                  : std::string())
                                                         : std::string()}};
    if (!record.env.is_null()) details["env"] = record.env;
    if (!record.failure.empty())
      details["error"] = record.install_error.empty() ? record.failure : record.install_error;
    if (!record.runs.empty()) {
      details["verdict"] = record.runs.back().run.verdict;
      details["env_id"] = record.runs.back().run.env_id;
      std::string statuses;
      for (const auto& trial : record.runs.back().trials) {
        if (target_.mode == BisectMode::kStatus && trial.variant != target_.variant) continue;
        statuses += (statuses.empty() ? "" : ", ") + trial.variant + " " + trial.status;
      }
      details["status"] = statuses;
    }
    if (reading.metric) {
      details["metric"] = {{"median", reading.metric->spread.median}, {"min", reading.metric->spread.min},
                           {"max", reading.metric->spread.max},       {"count", reading.metric->spread.count},
                           {"values", reading.metric->values},        {"unit", reading.unit}};
      details["reading"] = format_value(reading.metric->spread.median, reading.unit);
    }
    if (!plot_metric_.empty() && !record.runs.empty()) {
      analysis::BisectTarget plot_target{BisectMode::kMetric, plot_variant_, plot_metric_, 0.0};
      const auto plotted = analysis::read_probe(plot_target, record.runs);
      if (plotted.metric) {
        details["plot"] = {{"median", plotted.metric->spread.median}, {"min", plotted.metric->spread.min},
                           {"max", plotted.metric->spread.max}, {"unit", plotted.unit}};
      }
    }
    return details;
  }

  void store_probe(size_t position, const std::string& outcome, const std::string& reason, const ProbeRecord& record,
                   const analysis::ProbeReading& reading) {
    db::BisectProbe row;
    row.bisect_id = bisect_id_;
    row.seq = ++seq_;
    row.position = static_cast<int>(position);
    row.label = candidates_[position].label;
    row.outcome = outcome;
    row.reason = reason;
    for (const auto& run : record.runs) row.run_ids.push_back(run.run.id);
    row.details = details_of(record, reading);
    store_->add_bisect_probe(row);
    log(fmt::format("  [{}] {:<12} {:<5} {}", row.seq, row.label, outcome, reason));
  }

  // Probes one end; it must run and be readable, or the bisect has no reference.
  ProbeRecord probe_end(size_t position, const char* which) {
    Candidate& candidate = candidates_[position];
    log(fmt::format("probing the {} end {}", which, candidate.label));
    ProbeRecord record = probe(candidate);
    if (record.runs.empty()) {
      store_probe(position, "skip", record.failure, record, {});
      throw UsageError(fmt::format("--{} {}: {}", which, candidate.label, record.failure));
    }
    return record;
  }

  void search() {
    const size_t last = candidates_.size() - 1;
    ProbeRecord good_record = probe_end(0, "good");
    target_ = analysis::resolve_target(target_, good_record.runs.back());
    choose_plot_metric(good_record.runs.back());
    good_ = analysis::read_probe(target_, good_record.runs);
    ProbeRecord bad_record = probe_end(last, "bad");
    bad_ = analysis::read_probe(target_, bad_record.runs);
    const std::string good_reason = good_.usable ? "the good end" : good_.why_not;
    const std::string bad_reason = bad_.usable ? "the bad end" : bad_.why_not;
    store_probe(0, "good", good_reason, good_record, good_);
    store_probe(last, "bad", bad_reason, bad_record, bad_);
    packages_[0] = good_record.packages;
    packages_[last] = bad_record.packages;
    run_ids_[0] = good_record.runs.back().run.id;
    run_ids_[last] = bad_record.runs.back().run.id;
    analysis::check_ends(target_, good_, bad_, candidates_[0].label, candidates_[last].label);

    analysis::BisectSearch search(candidates_.size());
    while (const auto position = search.next()) {
      if (interrupt_requested()) throw InfraError("interrupted");
      Candidate& candidate = candidates_[*position];
      log(fmt::format("probing {} ({} candidates left between {} and {})", candidate.label,
                      search.first_bad() - search.last_good() - 1, candidates_[search.last_good()].label,
                      candidates_[search.first_bad()].label));
      ProbeRecord record = probe(candidate);
      analysis::ProbeJudgement judgement;
      analysis::ProbeReading reading;
      if (record.runs.empty()) {
        judgement.reason = record.failure;
      } else {
        judgement = judge_with_reruns(candidate, record);
        reading = analysis::read_probe(target_, record.runs);
      }
      search.record(*position, judgement.outcome);
      store_probe(*position, analysis::outcome_name(judgement.outcome), judgement.reason, record, reading);
      ++probes_between_;
      if (judgement.outcome == ProbeOutcome::kSkip) ++skipped_;
      packages_[*position] = record.packages;
      if (!record.runs.empty()) run_ids_[*position] = record.runs.back().run.id;
    }
    last_good_ = search.last_good();
    first_bad_ = search.first_bad();
    for (const size_t position : search.unresolved()) unresolved_.push_back(candidates_[position].label);
    max_probes_ = analysis::BisectSearch::max_probes(candidates_.size());
    store_->finish_bisect(bisect_id_, unresolved_.empty() ? "found" : "range", candidates_[last_good_].label,
                          candidates_[first_bad_].label, result_json());
  }

  nlohmann::json result_json() const {
    nlohmann::json result = {{"candidates", labels()},        {"source", source_},
                             {"over", over_},                 {"target", target_.describe()},
                             {"hypothesis", hypothesis_},     {"spec_path", spec_path_},
                             {"probes_between", probes_between_}, {"skipped", skipped_},
                             {"max_probes", max_probes_},     {"unresolved", unresolved_},
                             {"plot_metric", plot_metric_.empty() ? "" : plot_variant_ + "." + plot_metric_}};
    if (first_bad_ == 0) return result;
    const auto good_packages = packages_.find(last_good_), bad_packages = packages_.find(first_bad_);
    if (good_packages != packages_.end() && bad_packages != packages_.end()) {
      result["package_changes"] = nlohmann::json::array();
      for (const auto& change : analysis::package_changes(good_packages->second, bad_packages->second))
        result["package_changes"].push_back({{"key", change.key}, {"a", change.before}, {"b", change.after}});
    }
    std::vector<std::string> reproduce;
    for (const size_t position : {last_good_, first_bad_}) {
      const Candidate& candidate = candidates_[position];
      if (candidate.needs_env) {
        std::string install = fmt::format("python3 -m venv /tmp/{0}-{1} && /tmp/{0}-{1}/bin/pip install '{0}=={1}'",
                                          args_.package, candidate.label);
        for (const auto& extra : args_.extras) install += " '" + extra + "'";
        if (args_.no_index) install += " --no-index";
        for (const auto& folder : args_.find_links) install += " --find-links " + fs::absolute(folder).string();
        reproduce.push_back(install);
      }
      std::string run = fmt::format("{} run {} --device {} --python {}", candidate.harness, spec_path_, args_.device,
                                    candidate.needs_env ? fmt::format("/tmp/{}-{}/bin/python", args_.package, candidate.label)
                                                        : candidate.python);
      for (const auto& override_arg : args_.overrides) run += " --set '" + override_arg + "'";
      reproduce.push_back(run + " --db " + options_.db_path);
    }
    const auto good_run = run_ids_.find(last_good_), bad_run = run_ids_.find(first_bad_);
    if (good_run != run_ids_.end() && bad_run != run_ids_.end())
      reproduce.push_back(fmt::format("harness diff {} {} --db {}", good_run->second, bad_run->second, options_.db_path));
    result["reproduce"] = reproduce;
    return result;
  }

  const BisectArgs& args_;
  const GlobalOptions& options_;
  db::Store* store_ = nullptr;
  std::string spec_path_, spec_name_, hypothesis_, source_ = "", over_;
  double run_timeout_s_ = 3600.0;
  analysis::BisectTarget target_;
  analysis::ProbeReading good_, bad_;
  std::vector<Candidate> candidates_;
  int64_t bisect_id_ = 0;
  int seq_ = 0, probes_between_ = 0, skipped_ = 0, max_probes_ = 0;
  size_t last_good_ = 0, first_bad_ = 0;
  std::vector<std::string> unresolved_;
  std::string plot_variant_, plot_metric_;
  std::map<size_t, nlohmann::json> packages_;
  std::map<size_t, int64_t> run_ids_;
};

int show_bisect(const ShowArgs& args, const GlobalOptions& options) {
  const db::Store store(options.db_path, db::Access::read);
  const auto bisect = store.get_bisect(args.id);
  if (!bisect) {
    std::string known;
    for (const auto& row : store.list_bisects()) known += (known.empty() ? "" : ", ") + std::to_string(row.id);
    throw UsageError(fmt::format("no bisect {} in {} (bisects: {})", args.id, options.db_path,
                                 known.empty() ? "none" : known));
  }
  const auto probes = store.list_bisect_probes(args.id);
  if (options.json) {
    print_json(std::cout, analysis::bisect_json(*bisect, probes));
  } else {
    std::cout << analysis::bisect_text(*bisect, probes);
  }
  return kExitOk;
}

}  // namespace

Action add_bisect_command(CLI::App& app, GlobalOptions& options) {
  auto args = std::make_shared<BisectArgs>();
  auto show = std::make_shared<ShowArgs>();
  auto* command = app.add_subcommand(
      "bisect", "Find the version (env, build) where a verdict, a trial status or a metric changed: binary search with "
                "skip, each probe a stored run in its own cached env");
  command->add_option("experiment", args->experiment, "The experiment (a name or a spec path)");
  command->add_option("--package", args->package, "The Python package whose versions are bisected (e.g. torch)");
  command->add_option("--good", args->good, "A version that reads as before (the old verdict/status/metric)");
  command->add_option("--bad", args->bad, "A version that reads as after");
  command->add_option("--versions", args->versions,
                      "Comma-separated versions to search (default: every release between good and bad on the index, "
                      "or in --find-links)");
  command->add_option("--find-links", args->find_links, "A folder of wheels: versions and packages come from it too");
  command->add_flag("--no-index", args->no_index, "Install only from --find-links (no package index)");
  command->add_option("--index-url", args->index_url, "Another package index than PyPI");
  command->add_flag("--pre", args->pre, "Include pre-releases between good and bad");
  command->add_option("--python", args->python,
                      "Base interpreter of the envs: a path, a name, or a version such as 3.11 (python3.11)");
  command->add_option("--extra", args->extras, "Another requirement every env gets (e.g. 'numpy<2'); repeatable");
  command->add_option("--installer", args->installer, "auto (uv when found, else venv + pip), uv or pip");
  command->add_option("--env-cache", args->env_cache, "Where the envs live (default ~/.cache/harness/envs)");
  command->add_option("--install-timeout", args->install_timeout_s, "Seconds each env install may take (default 3600)");
  command->add_option("--envs", args->envs, "Bisect these interpreters or venvs, in order (good first, bad last)")
      ->expected(2, 1 << 20);
  command->add_option("--builds", args->builds,
                      "Bisect these harness builds (folders or binaries), in order (good first, bad last)")
      ->expected(2, 1 << 20);
  command->add_option("--device", args->device, "Device of every probe's run (cpu, cuda:N, auto)");
  command->add_option("--set", args->overrides, "Override a spec field in every probe (path=value)");
  command->add_option("--profile", args->profile, "Apply a profile of the spec");
  command->add_flag("--no-profile", args->no_profile, "Never apply a profile");
  command->add_option("--metric", args->metric,
                      "Bisect a metric ([VARIANT.]NAME) instead of the verdict: changes called outside the noise only");
  command->add_option("--threshold", args->threshold, "With --metric: smallest change that counts (default 10%)");
  command->add_option("--status", args->status_variant, "Bisect the trial status of this variant instead of the verdict");
  command->add_option("--max-reruns", args->max_reruns,
                      "With --metric: runs added to a probe that reads inside the noise before it is skipped (default 2)");
  add_global_options(*command, options);

  auto* show_command = command->add_subcommand("show", "A stored bisect: its probes, the answer, the env diff");
  show_command->add_option("id", show->id, "Bisect id")->required();
  add_global_options(*show_command, options);
  show_command->fallthrough();

  return [args, show, command, show_command, &options] {
    if (show_command->parsed()) return show_bisect(*show, options);
    if (args->experiment.empty()) throw UsageError("name an experiment: harness bisect EXPERIMENT --package P ...");
    (void)command;
    Bisector bisector(*args, options);
    return bisector.run();
  };
}

}  // namespace harness
