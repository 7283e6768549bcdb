// `harness replay RUN`: re-execute the step a trial recorded in its capsule, in an isolated child,
// as a new run linked to the original (runs.replay_of), and say whether the failure reproduced
// and how the outputs compare. `harness replay --import step.pt`: the same for a step saved from
// Python (replay/save_step.py). Torch-free: verification and comparison read the capsule files
// directly; the import itself (LibTorch reads the torch.save file) runs in a child process.

#include <filesystem>
#include <iostream>
#include <optional>

#include <fmt/format.h>

#include "core/json_input.h"
#include "db/artifact_paths.h"
#include "db/store.h"
#include "experiments/spec.h"
#include "harness/cli/cli.h"
#include "core/printer.h"
#include "harness/runner/run_support.h"
#include "replay/capsule_file.h"
#include "replay/import.h"

namespace harness {
namespace {

namespace fs = std::filesystem;

struct ReplayArgs {
  int64_t run_id = 0;
  std::optional<int64_t> trial_id;
  std::string variant;
  std::vector<std::string> points;
  std::string device = "auto";
  std::vector<std::string> overrides;
  std::string memory_limit;
  bool memory_limit_given = false;
  std::string import_path;
  double env_timeout_s = 180.0;
  // Child side of --import (hidden): where the capsule goes and where to report.
  std::string import_to;
  std::string import_result;
};

// The step to replay: its capsule, the trial that recorded it (none for an import) and the outputs
// to compare against.
struct Source {
  replay::CapsuleInfo capsule;
  std::optional<db::Trial> trial;
  std::optional<replay::CapsuleInfo> outputs;
  nlohmann::json point = nlohmann::json::object();
  std::string label;  // "trial 12 of run 3" or "step.pt"
  int64_t memory_limit_bytes = 0;  // the recorded run's --memory-limit, replayed unless overridden
};

// A stored artifact's file: inside the db's artifact folder (db/artifact_paths.h), else a
// UsageError naming the row (a db edited by hand or from someone else is not followed out of it).
std::string artifact_path(const db::Artifact& artifact, const std::string& db_path) {
  const db::ResolvedArtifact resolved = db::ArtifactFolder(db_path).resolve(artifact.path);
  if (resolved.place == db::ResolvedArtifact::Place::outside)
    throw UsageError(fmt::format("{}: artifact {} of run {} names '{}', outside the db's artifact folder: {}; not read",
                                 db_path, artifact.id, artifact.run_id, clip_text(artifact.path, 200), resolved.problem));
  return resolved.file;
}

replay::CapsuleInfo inspect_or_usage_error(const std::string& path, bool verify_payload,
                                           const std::optional<std::string>& expected, const std::string& expected_from) {
  try {
    return replay::inspect_capsule(path, verify_payload, expected, expected_from);
  } catch (const replay::CapsuleError& error) {
    throw UsageError(error.what());
  }
}

// Whether a trial's point has every --point PATH=VALUE (PATH may also be the last component).
bool point_matches(const nlohmann::json& point, const std::vector<std::string>& filters) {
  for (const auto& filter : filters) {
    const auto equals = filter.find('=');
    const std::string key = filter.substr(0, equals);
    const auto wanted = nlohmann::json::parse(filter.substr(equals + 1), nullptr, false);
    bool found = false;
    for (const auto& [path, value] : point.items()) {
      const bool same_key = path == key || path.substr(path.rfind('.') + 1) == key;
      const bool same_value = wanted.is_discarded() ? value == filter.substr(equals + 1) : value == wanted;
      found = found || (same_key && same_value);
    }
    if (!found) return false;
  }
  return true;
}

// Picks the capsule to replay from a recorded run: --trial's, else the --variant trial's, else the
// first failed trial's, else the first one's (every variant of a point records the same inputs).
Source source_from_run(const ReplayArgs& args, const GlobalOptions& options) {
  const db::Store store(options.db_path, db::Access::read);
  const auto detail = store.get_run(args.run_id);
  if (!detail) throw UsageError(fmt::format("run {} is not in {}", args.run_id, options.db_path));
  for (const auto& filter : args.points)
    if (filter.find('=') == std::string::npos) throw UsageError(fmt::format("--point '{}': expected PATH=VALUE", filter));

  auto artifact_of = [&](int64_t trial_id, const std::string& kind) -> const db::Artifact* {
    for (const auto& artifact : detail->artifacts)
      if (artifact.trial_id && *artifact.trial_id == trial_id && artifact.kind == kind) return &artifact;
    return nullptr;
  };
  const db::Trial* chosen = nullptr;
  if (args.trial_id) {
    for (const auto& trial : detail->trials)
      if (trial.id == *args.trial_id) chosen = &trial;
    if (!chosen) throw UsageError(fmt::format("trial {} is not a trial of run {}", *args.trial_id, args.run_id));
    if (!artifact_of(chosen->id, "capsule"))
      throw UsageError(fmt::format("trial {} of run {} ({}, {}) has no capsule: capsules are kept for failed trials; "
                                   "run with --keep-capsules to keep every one",
                                   chosen->id, args.run_id, chosen->variant, chosen->status));
  } else {
    std::vector<const db::Trial*> candidates;
    for (const auto& trial : detail->trials)
      if (artifact_of(trial.id, "capsule") && point_matches(trial.point, args.points)) candidates.push_back(&trial);
    for (const auto* trial : candidates)
      if (!chosen && !args.variant.empty() && trial->variant == args.variant) chosen = trial;
    for (const auto* trial : candidates)
      if (!chosen && trial->status != "ok") chosen = trial;
    if (!chosen && !candidates.empty()) chosen = candidates.front();
    if (!chosen)
      throw UsageError(fmt::format("run {} has no capsule{}: capsules are kept for failed trials; run with "
                                   "--keep-capsules to keep every one",
                                   args.run_id, args.points.empty() ? "" : " at that --point"));
  }
  Source source;
  source.trial = *chosen;
  source.point = chosen->point;
  source.memory_limit_bytes = detail->run.args.value("memory_limit_bytes", int64_t{0});
  source.label = fmt::format("trial {} of run {}", chosen->id, args.run_id);
  const db::Artifact& capsule = *artifact_of(chosen->id, "capsule");
  source.capsule = inspect_or_usage_error(artifact_path(capsule, options.db_path), /*verify_payload=*/true,
                                          capsule.sha256, "the db (" + source.label + ")");
  if (const db::Artifact* outputs = artifact_of(chosen->id, "outputs")) {
    const std::string path = artifact_path(*outputs, options.db_path);
    if (fs::exists(path)) source.outputs = inspect_or_usage_error(path, false, outputs->sha256, "the db (" + source.label + ")");
  }
  return source;
}

// Imports a Python step in a child (LibTorch reads the file there; a file that crashes the
// reader cannot take the harness down) into the db's artifact folder.
Source source_from_import(const ReplayArgs& args, const GlobalOptions& options, const ScratchDir& scratch) {
  if (!fs::exists(args.import_path)) throw UsageError(fmt::format("--import {}: no such file", args.import_path));
  ChildCommand command;
  const std::string result_path = scratch.file("import.json");
  command.argv = {self_executable(), "replay", "--import", fs::absolute(args.import_path).string(), "--import-to",
                  artifact_dir_for(options.db_path), "--import-result", result_path, "--log-level", options.log_level};
  command.timeout_s = 600.0;
  const ChildOutcome outcome = run_child(command);
  if (outcome.interrupted) throw InfraError("interrupted while importing " + args.import_path);
  if (!fs::exists(result_path))
    throw UsageError(fmt::format("--import {}: reading the file failed ({}): {}", args.import_path,
                                 outcome.signal ? signal_name(*outcome.signal)
                                                : "exit " + std::to_string(outcome.exit_code.value_or(-1)),
                                 outcome.stderr_tail));
  const auto result = nlohmann::json::parse(read_file(result_path));
  if (result.contains("error")) throw UsageError(result["error"].get<std::string>());
  Source source;
  source.label = args.import_path;
  const auto& capsule = result["capsule"];
  source.capsule = inspect_or_usage_error(capsule["path"], true, capsule["sha256"].get<std::string>(), "the importer");
  if (result.contains("outputs"))
    source.outputs = inspect_or_usage_error(result["outputs"]["path"], false,
                                            result["outputs"]["sha256"].get<std::string>(), "the importer");
  return source;
}

// The child side of --import: write the capsule, report it (or the problem) as JSON.
int import_child(const ReplayArgs& args) {
  nlohmann::json result;
  try {
    const replay::ImportedStep imported = replay::import_step_file(args.import_path, args.import_to);
    auto ref = [](const replay::WrittenCapsule& written) {
      return nlohmann::json{{"sha256", written.sha256}, {"path", written.path}, {"bytes", written.bytes}};
    };
    result = {{"capsule", ref(imported.capsule)}, {"meta", imported.meta}};
    if (imported.outputs) result["outputs"] = ref(*imported.outputs);
  } catch (const replay::CapsuleError& error) {
    result = {{"error", error.what()}};
  }
  write_file_atomic(args.import_result, result.dump());
  return kExitOk;
}

nlohmann::json trial_json(const db::Trial& trial) {
  nlohmann::json json = {{"id", trial.id}, {"variant", trial.variant}, {"status", trial.status}, {"error", trial.error}};
  if (trial.requested_bytes) json["requested_bytes"] = *trial.requested_bytes;
  if (trial.signal) json["signal"] = signal_name(*trial.signal);
  if (trial.details.contains("nonfinite")) json["nonfinite"] = trial.details["nonfinite"];
  return json;
}

// Whether the replay failed the way the original did: the same status, and for an OOM the same
// requested bytes, for a crash the same signal, for NaN/Inf the same tensor, phase and layer.
std::pair<bool, std::string> reproduction(const db::Trial& original, const db::Trial& replayed) {
  if (original.status != replayed.status)
    return {false, fmt::format("status {} where the original was {}", replayed.status, original.status)};
  if (original.status == "oom" && original.requested_bytes != replayed.requested_bytes)
    return {false, fmt::format("oom, but requesting {} bytes where the original requested {}",
                               replayed.requested_bytes ? std::to_string(*replayed.requested_bytes) : "unknown",
                               original.requested_bytes ? std::to_string(*original.requested_bytes) : "unknown")};
  if (original.status == "crashed" && original.signal != replayed.signal)
    return {false, fmt::format("crashed, but by {} where the original was {}",
                               replayed.signal ? signal_name(*replayed.signal) : "an exit",
                               original.signal ? signal_name(*original.signal) : "an exit")};
  if (original.status == "nonfinite") {
    const auto where = [](const db::Trial& trial) {
      const auto& n = trial.details.value("nonfinite", nlohmann::json::object());
      return fmt::format("{} of layer {} ({})", n.value("tensor", "?"), n.value("layer", -1), n.value("phase", "?"));
    };
    if (where(original) != where(replayed))
      return {false, fmt::format("non-finite first in {} where the original had {}", where(replayed), where(original))};
    return {true, "non-finite values first in " + where(replayed)};
  }
  if (original.status == "oom")
    return {true, fmt::format("oom requesting the same {} bytes", original.requested_bytes.value_or(-1))};
  if (original.status == "crashed")
    return {true, "crashed by " + (replayed.signal ? signal_name(*replayed.signal) : std::string("an exit without a result"))};
  return {true, "status " + replayed.status};
}

double metric_value(const std::vector<db::Metric>& metrics, const std::string& name, double fallback) {
  for (const auto& metric : metrics)
    if (metric.name == name) return metric.value;
  return fallback;
}

void print_replay(std::ostream& out, const nlohmann::json& report) {
  out << fmt::format("replay run {} of {} — {} on {}, capsule {}\n", report["run"].get<int64_t>(),
                     report["source"].get<std::string>(), report["variant"].get<std::string>(),
                     report["device"].get<std::string>(), report["capsule"].get<std::string>().substr(0, 12));
  Table table;
  table.headers = {"", "variant", "status", "detail"};
  auto row = [&](const std::string& label, const nlohmann::json& trial) {
    std::string detail;
    if (trial.contains("requested_bytes"))
      detail = fmt::format("requested {} ({} bytes)", format_bytes(trial["requested_bytes"].get<double>()),
                           trial["requested_bytes"].get<int64_t>());
    else if (trial.contains("signal"))
      detail = trial["signal"].get<std::string>();
    else if (!trial.value("error", "").empty())
      detail = trial["error"].get<std::string>().substr(0, trial["error"].get<std::string>().find('\n'));
    table.rows.push_back({label, trial.value("variant", ""), trial.value("status", ""), detail});
  };
  if (report.contains("original")) row("original", report["original"]);
  row("replay", report["replay"]);
  print_table(out, table);
  out << fmt::format("{}: {}\n", report["verdict"].get<std::string>(), report["reason"].get<std::string>());
  if (report.contains("outputs") && !report["outputs"].empty()) {
    Table outputs;
    outputs.headers = {"tensor", "bitwise", "max abs err", "max rel err", "note"};
    outputs.right_align = {false, false, true, true, false};
    for (const auto& c : report["outputs"]) {
      const bool compared = c.contains("max_abs_err");
      outputs.rows.push_back({c["tensor"].get<std::string>(), c["bitwise_equal"].get<bool>() ? "equal" : "differs",
                              compared ? fmt::format("{:.3g}", c["max_abs_err"].get<double>()) : "",
                              compared ? fmt::format("{:.3g}", c["max_rel_err"].get<double>()) : "",
                              c.value("note", "")});
    }
    out << "outputs against the " << (report.contains("original") ? "original" : "imported") << " ones:\n";
    print_table(out, outputs);
  }
}

int run_replay(const ReplayArgs& args, const GlobalOptions& options) {
  if (!args.import_to.empty() || !args.import_result.empty()) {
    if (args.import_path.empty() || args.import_to.empty() || args.import_result.empty())
      throw UsageError("--import-to and --import-result go together with --import");
    return import_child(args);
  }
  if (args.import_path.empty() == (args.run_id == 0))
    throw UsageError("replay needs a RUN id or --import FILE (one of them)");
  if (!args.import_path.empty() && (args.trial_id || !args.points.empty()))
    throw UsageError("--trial and --point choose a trial of a recorded run; they do not go with --import");
  check_device_syntax(args.device);
  const std::optional<int64_t> memory_limit = parse_memory_limit(args.memory_limit, args.memory_limit_given);
  const bool allow_faults = faults_allowed();

  ScratchDir scratch;
  Source source = args.import_path.empty() ? source_from_run(args, options) : source_from_import(args, options, scratch);
  const int64_t memory_limit_bytes = memory_limit.value_or(source.memory_limit_bytes);
  const std::string variant = !args.variant.empty() ? args.variant : source.trial ? source.trial->variant : "fused";

  // The capsule's own spec, with --set applied, must still fit its tensors.
  spec::LoadOptions load;
  load.overrides = args.overrides;
  load.allow_faults = allow_faults;
  const std::string spec_source = "capsule " + source.capsule.sha256.substr(0, 12);
  const spec::Spec spec = spec::load_spec_text(source.capsule.header.at("spec").dump(), spec_source, load);
  const bool known_variant = std::any_of(spec.variants.begin(), spec.variants.end(),
                                         [&](const spec::Variant& v) { return v.name == variant; });
  if (!known_variant) {
    std::string names;
    for (const auto& v : spec.variants) names += (names.empty() ? "" : ", ") + v.name;
    throw UsageError(fmt::format("--variant {}: the capsule's spec has the variants {}", variant, names));
  }
  try {
    replay::check_step_fits_spec(source.capsule, spec);
  } catch (const replay::CapsuleError& error) {
    throw UsageError(error.what());
  }

  install_interrupt_handlers();
  const auto [device, env] = probe_device(args.device, options, scratch, args.env_timeout_s);
  db::Store store(options.db_path);
  db::Run row;
  row.env_id = store.put_env(env);
  row.experiment_id = store.put_experiment(spec.name, spec.resolved);
  row.experiment = spec.name;
  row.device = device;
  row.profile = spec.profile;
  row.args = {{"command", "replay"}, {"capsule", source.capsule.sha256}, {"variant", variant}, {"set", args.overrides},
              {"requested_device", args.device}};
  if (source.trial) {
    row.replay_of = args.run_id;
    row.args["trial"] = source.trial->id;
  } else {
    row.args["import"] = fs::absolute(args.import_path).string();
  }
  if (memory_limit_bytes > 0) row.args["memory_limit_bytes"] = memory_limit_bytes;
  const int64_t run_id = store.begin_run(row);

  kinds::TrialRequest request;
  request.spec_file = scratch.file("spec.json");
  write_file_atomic(request.spec_file, spec.resolved.dump(2));
  request.variant = variant;
  request.device = device;
  request.result_path = scratch.file("result.json");
  request.memory_limit_bytes = memory_limit_bytes;
  request.allow_faults = allow_faults;
  request.artifact_dir = artifact_dir_for(options.db_path);
  request.keep_capsules = true;  // the replay's outputs are what it is compared by
  request.replay_capsule = source.capsule.path;
  // An imported step's own outputs (those of the program that saved it) are judged too.
  if (!source.trial && source.outputs) request.judge_outputs = source.outputs->path;
  request.timeout_s = spec.timeout_s;
  if (!options.json)
    std::cerr << fmt::format("run {}: replaying {} ({}) with variant {} on {}\n", run_id, source.label,
                             source.capsule.sha256.substr(0, 12), variant, device);
  const std::string started_at = db::now_iso8601();
  const ChildOutcome outcome = run_child(trial_command(request, options));
  RecordedTrial recorded = record_trial(variant, source.point, outcome, request.result_path, options.db_path);
  recorded.trial.started_at = started_at;
  store_trial(store, run_id, recorded);
  const db::Trial& replayed = recorded.trial;

  nlohmann::json report = {{"run", run_id},
                           {"source", source.label},
                           {"capsule", source.capsule.sha256},
                           {"variant", variant},
                           {"device", device},
                           {"memory_limit_bytes", memory_limit_bytes},
                           {"replay", trial_json(replayed)}};
  std::string verdict, reason;
  if (source.trial) {
    report["replay_of"] = args.run_id;
    report["original"] = trial_json(*source.trial);
    const auto [reproduced, why] = reproduction(*source.trial, replayed);
    verdict = reproduced ? "REPRODUCED" : "NOT_REPRODUCED";
    reason = why + (variant != source.trial->variant
                        ? fmt::format(" (replayed with variant {}, recorded with {})", variant, source.trial->variant)
                        : "");
    report["reproduced"] = reproduced;
  } else {
    const double match = metric_value(recorded.metrics, "match", -1.0);
    verdict = replayed.status != "ok" ? "FAILED" : match == 1.0 ? "MATCH" : match == 0.0 ? "MISMATCH" : "RAN";
    reason = replayed.status != "ok" ? "status " + replayed.status
             : match < 0.0           ? "the step ran (no reference check)"
                                     : fmt::format("against the float64 reference: max abs err {:.3g}",
                                                   metric_value(recorded.metrics, "max_abs_err", 0.0));
    // Each tensor against its bounds (experiments/tolerance.h): "dq max 2.04e-03 <= 3.3e-03, mean ...".
    const auto tolerance = replayed.details.find("tolerance");
    if (match >= 0.0 && tolerance != replayed.details.end() && tolerance->is_object()) {
      report["tolerance"] = *tolerance;
      std::string bounds;
      for (const auto& [tensor, judged] : tolerance->items())
        bounds += (bounds.empty() ? "" : "; ") + judged.value("summary", tensor);
      reason += "; " + bounds;
    }
    // The saving program's own outputs against the same references.
    if (const auto imported = replayed.details.find("imported_check"); imported != replayed.details.end()) {
      report["imported_check"] = *imported;
      if (imported->contains("error")) {
        reason += "; the imported outputs were not judged: " + imported->value("error", "");
      } else {
        reason += std::string("; the imported outputs (the saving program's): ") +
                  (imported->value("match", false) ? "MATCH" : "MISMATCH (" + imported->value("check_failed", "") + ")");
      }
    }
  }
  report["verdict"] = verdict;
  report["reason"] = reason;
  if (source.outputs) {
    std::optional<replay::CapsuleInfo> replay_outputs;
    for (const auto& artifact : recorded.artifacts)
      if (artifact.kind == "outputs")
        replay_outputs = replay::inspect_capsule(artifact_path(artifact, options.db_path), false, artifact.sha256);
    report["outputs"] = replay_outputs ? replay::to_json(replay::compare_outputs(*source.outputs, *replay_outputs))
                                       : nlohmann::json::array();
  }
  const std::string status = replayed.status == "interrupted" ? "interrupted"
                             : trial_failed(replayed.status)  ? "failed"
                                                              : "ok";
  store.finish_run(run_id, status, verdict, report);

  if (options.json) {
    print_json(std::cout, report);
  } else {
    print_replay(std::cout, report);
  }
  return replayed.status == "interrupted" ? kExitInfra : kExitOk;
}

}  // namespace

Action add_replay_command(CLI::App& app, GlobalOptions& options) {
  auto args = std::make_shared<ReplayArgs>();
  auto* command = app.add_subcommand("replay", "Re-execute a recorded step (a trial's capsule, or a step saved from "
                                               "Python) in an isolated child and say whether its failure reproduces");
  command->add_option("run", args->run_id, "Run whose recorded step to replay");
  command->add_option("--trial", args->trial_id, "Trial of the run (default: the --variant one, else the first failed one)");
  command->add_option("--variant", args->variant,
                      "Variant to run (default: the recorded one); e.g. fused replays a dense trial's step with the fused kernels");
  command->add_option("--point", args->points, "Sweep point of the trial: PATH=VALUE (e.g. dims.anchors=512)");
  command->add_option("--device", args->device, "cpu, cuda:N, or auto");
  command->add_option("--set", args->overrides, "Override a field of the capsule's spec: path=value");
  command
      ->add_option("--memory-limit", args->memory_limit,
                   "Cap the device memory of the step (e.g. 96GiB; none lifts it); default: the recorded run's")
      ->each([args](const std::string&) { args->memory_limit_given = true; });
  command->add_option("--import", args->import_path, "A step saved from Python (replay/save_step.py) to replay");
  command->add_option("--import-to", args->import_to)->group("");
  command->add_option("--import-result", args->import_result)->group("");
  add_global_options(*command, options);
  return [args, &options] { return run_replay(*args, options); };
}

}  // namespace harness
