#include "analysis/triage.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <regex>
#include <sstream>

#include <fmt/format.h>

#include "analysis/memory_snapshot.h"
#include "analysis/series.h"
#include "analysis/writeup.h"
#include "core/byte_size.h"
#include "core/errors.h"
#include "core/oom_message.h"
#include "experiments/memory_model.h"
#include "replay/capsule_file.h"
#include "replay/mask_fit.h"

namespace harness::analysis {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return text;
}

bool has(const std::string& text, const std::string& part) { return lower(text).find(lower(part)) != std::string::npos; }

std::string first_line(const std::string& text) { return text.substr(0, text.find('\n')); }

std::string bytes_text(double bytes) { return format_bytes(bytes); }

std::string join(const std::vector<std::string>& parts, const std::string& separator) {
  std::string text;
  for (const auto& part : parts) text += (text.empty() ? "" : separator) + part;
  return text;
}

// The last `count` lines of a text.
std::string last_lines(const std::string& text, size_t count) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  if (lines.size() <= count) return text;
  std::vector<std::string> kept(lines.end() - static_cast<long>(count), lines.end());
  return fmt::format("... ({} earlier lines)\n", lines.size() - count) + join(kept, "\n");
}

std::string dtype_of(const std::string& torch_name) {
  if (torch_name == "bfloat16" || torch_name == "bf16") return "bf16";
  if (torch_name == "float16" || torch_name == "fp16") return "fp16";
  if (torch_name == "float32" || torch_name == "fp32") return "fp32";
  return torch_name;
}

std::optional<int64_t> integer_at(const json& object, const char* key) {
  if (object.is_object() && object.contains(key) && object[key].is_number_integer()) return object[key].get<int64_t>();
  return std::nullopt;
}

// ---- reading what failed -----------------------------------------------------------------------

CapturedStep step_from_file(const replay::CapsuleInfo& file, const json& meta, const json& capture) {
  CapturedStep step;
  const json captured = meta.value("captured", json::object());
  step.op = captured.value("op", "");
  step.compiled = captured.value("compiled", false);
  const replay::TensorEntry* q = file.find("q");
  const replay::TensorEntry* k = file.find("k");
  if (!q || !k || !file.find("v") || q->shape.size() != 4 || k->shape.size() != 4) {
    step.why_not = "the capture file holds no q, k, v of [batch, heads, length, head_dim]";
    return step;
  }
  step.batch = q->shape[0];
  step.heads = q->shape[1];
  step.q_len = q->shape[2];
  step.head_dim = q->shape[3];
  step.kv_heads = k->shape[1];
  step.kv_len = k->shape[2];
  step.dtype = dtype_of(q->dtype);
  if (step.op.empty() && capture.contains("calls")) step.op = "attention";
  std::vector<std::string> refusals;
  if (meta.contains("scale") && meta["scale"].is_number() && step.head_dim > 0) {
    const double standard = 1.0 / std::sqrt(static_cast<double>(step.head_dim));
    if (std::abs(meta["scale"].get<double>() - standard) > 1e-6 * standard)
      refusals.push_back(fmt::format("scale {} (the kernels run 1/sqrt(head_dim) = {:.6g})", meta["scale"].get<double>(), standard));
  }
  if (meta.contains("score_mod") && !meta["score_mod"].is_null()) refusals.push_back("a score_mod");
  if (meta.value("dropout_p", 0.0) > 0.0) refusals.push_back("dropout");
  const json mask = meta.value("mask", json::object());
  const std::string type = mask.is_object() ? mask.value("type", "") : "";
  if (type == "blockmask") {
    try {
      const replay::MaskTables tables =
          replay::read_mask_tables(file, step.q_len, step.kv_len, mask.value("block_size", json(128)));
      std::vector<std::string> why_not;
      if (const auto fitted = replay::fit_named_mask(tables, why_not)) {
        step.mask = fitted->mask;
        step.block_size = fitted->block_size;
        step.anchors = fitted->anchors;
        step.context = fitted->context;
        step.mask_note = fmt::format("captured as block tables ({} x {} blocks), equal element for element to {}",
                                     tables.block_q, tables.block_kv, fitted->mask.value("type", "?"));
        if (fitted->mask.value("type", "") == "dflash")
          step.mask_note += fmt::format(" with draft blocks of {}, {} anchors, {} documents", fitted->block_size,
                                        fitted->anchors, fitted->doc_lengths.size());
      } else {
        // The replay runs the mask as its bits (replay --import: a blockmask mask); the experiments
        // run at the captured lengths with their own mask.
        step.mask_note = "captured as block tables; none of the named kinds (" + join(why_not, "; ") +
                         "), so the replay runs it as its bits";
        const replay::FittedMask lengths = replay::lengths_only_mask("dflash", step.q_len, step.kv_len);
        step.block_size = lengths.block_size;
        step.anchors = lengths.anchors;
        step.context = lengths.context;
      }
    } catch (const replay::CapsuleError& error) {
      step.mask_note = std::string("captured as block tables that cannot be read: ") + error.what();
      refusals.push_back("unreadable mask tables");
    }
  } else if (type == "full" || type == "causal") {
    const replay::FittedMask fitted = replay::lengths_only_mask(type, step.q_len, step.kv_len);
    step.mask = fitted.mask;
    step.block_size = fitted.block_size;
    step.anchors = fitted.anchors;
    step.context = fitted.context;
    step.mask_note = type == "full" ? "no mask (every key visible)" : "causal";
  } else {
    step.mask_note = "not captured: " + mask.value("why", std::string("no mask description"));
    refusals.push_back("no mask");
  }
  if (step.dtype != "bf16" && step.dtype != "fp16" && step.dtype != "fp32") refusals.push_back("dtype " + step.dtype);
  step.replayable = refusals.empty();
  if (!refusals.empty()) step.why_not = "the call has " + join(refusals, ", ") + ", which a replay on the harness kernels cannot run";
  return step;
}

// A Python exception line: "torch.OutOfMemoryError: CUDA out of memory. ..." or "KeyError: 'nargs'".
const std::regex& exception_line() {
  static const std::regex pattern(R"(^([A-Za-z_][A-Za-z0-9_.]*(?:Error|Exception|Exit|Interrupt|Warning)):?\s?(.*)$)");
  return pattern;
}

}  // namespace

Failure read_capture_file(const std::string& path) {
  replay::CapsuleInfo file;
  try {
    file = replay::read_safetensors(path);
  } catch (const replay::CapsuleError& error) {
    throw UsageError(std::string(error.what()) + " (harness triage reads the .safetensors files of python -m harness.capture)");
  }
  if (!file.header.contains("capture") || !file.header["capture"].is_string())
    throw UsageError(path + ": not a capture file (no 'capture' metadata; python -m harness.capture writes them, "
                     "harness triage --log FILE reads a job's log instead)");
  const json capture = json::parse(file.header["capture"].get<std::string>(), nullptr, false);
  if (capture.is_discarded() || !capture.is_object() || capture.value("format", "") != "harness-capture")
    throw UsageError(path + ": its 'capture' metadata is not a harness-capture header");
  Failure failure;
  failure.source = path;
  failure.capture = capture;
  const json exception = capture.value("exception", json::object());
  failure.exception_type = exception.value("type", "");
  failure.message = exception.value("message", "");
  failure.traceback = exception.value("traceback", "");
  const json where = capture.value("failure", json::object());
  failure.phase = where.value("phase", "");
  failure.in_attention = where.value("in_attention", false);
  failure.detail = where.value("detail", "");
  failure.rank = integer_at(capture.value("rank", json::object()), "rank");
  failure.python = capture.value("process", json::object()).value("python", "");
  const json memory = capture.value("memory", json::object());
  if (auto requested = integer_at(memory.value("oom", json::object()), "requested_bytes")) failure.requested_bytes = requested;
  if (!failure.requested_bytes)
    if (auto parsed = parse_oom_message(failure.message)) failure.requested_bytes = parsed->requested_bytes;
  if (memory.contains("snapshot") && memory["snapshot"].is_string()) {
    const fs::path snapshot = fs::path(path).parent_path() / memory["snapshot"].get<std::string>();
    if (fs::exists(snapshot)) failure.snapshot_path = snapshot.string();
  }
  if (file.header.contains("meta") && file.header["meta"].is_string()) {
    const json meta = json::parse(file.header["meta"].get<std::string>(), nullptr, false);
    if (meta.is_object()) failure.step = step_from_file(file, meta, capture);
  }
  return failure;
}

Failure read_failure_log(const std::string& path, const std::string& text) {
  static const std::regex rank_prefix(R"(^\[(?:rank|default)\d+\]:\s?)");
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    lines.push_back(std::regex_replace(line, rank_prefix, ""));
  }
  Failure failure;
  failure.source = path;
  failure.from_log = true;
  // The last "Traceback (most recent call last):" and the exception line that ends it.
  size_t traceback_at = lines.size();
  for (size_t i = lines.size(); i-- > 0;)
    if (lines[i].rfind("Traceback (most recent call last)", 0) == 0) {
      traceback_at = i;
      break;
    }
  std::smatch match;
  const size_t search_from = traceback_at < lines.size() ? traceback_at + 1 : 0;
  for (size_t i = search_from; i < lines.size(); ++i) {
    const std::string& line = lines[i];
    if (line.empty() || std::isspace(static_cast<unsigned char>(line[0]))) continue;
    if (std::regex_match(line, match, exception_line())) {
      failure.exception_type = match[1];
      failure.message = match[2];
      if (traceback_at < lines.size()) {
        std::vector<std::string> frames(lines.begin() + static_cast<long>(traceback_at), lines.begin() + static_cast<long>(i) + 1);
        failure.traceback = join(frames, "\n");
      }
      if (traceback_at < lines.size()) break;
    }
  }
  if (failure.exception_type.empty()) {
    // No Python exception: an allocator's message on its own still says what failed.
    for (size_t i = lines.size(); i-- > 0;)
      if (parse_oom_message(lines[i]) && (has(lines[i], "out of memory") || has(lines[i], "tried to allocate"))) {
        failure.message = lines[i];
        break;
      }
    if (failure.message.empty())
      throw UsageError(path + ": the log shows no Python exception (no \"Traceback (most recent call last):\" followed by "
                       "an \"...Error: ...\" line) and no out-of-memory message");
  }
  if (auto parsed = parse_oom_message(failure.message)) failure.requested_bytes = parsed->requested_bytes;
  if (has(failure.traceback, "backward")) failure.phase = "backward";
  failure.in_attention = failure.phase == "backward" &&
                         (has(failure.traceback, "flex_attention") || has(failure.traceback, "scaled_dot_product") ||
                          has(failure.traceback, "sdpa") || has(failure.traceback, "attention"));
  return failure;
}

std::string_view failure_kind_name(FailureKind kind) {
  switch (kind) {
    case FailureKind::attention_oom: return "out of memory in an attention call";
    case FailureKind::oom: return "out of memory";
    case FailureKind::autotune_race: return "Triton autotuner state (nargs)";
    case FailureKind::kernel_cache: return "damaged kernel cache";
    case FailureKind::nonfinite: return "NaN or Inf";
    case FailureKind::unknown: return "no shipped hypothesis";
  }
  return "?";
}

namespace {

std::pair<FailureKind, std::string> classify(const Failure& failure) {
  const std::string& type = failure.exception_type;
  const std::string text = failure.message;
  const std::string everything = type + "\n" + text + "\n" + failure.traceback;
  const bool oom = has(type, "OutOfMemoryError") || has(text, "out of memory") || has(text, "tried to allocate") ||
                   has(text, "not enough memory") || has(text, "cudaErrorMemoryAllocation") ||
                   has(text, "CUBLAS_STATUS_ALLOC_FAILED");
  if (oom) {
    const std::string what = fmt::format("{} \"{}\"", type.empty() ? "the message" : type, first_line(text).substr(0, 160));
    if (failure.in_attention)
      return {FailureKind::attention_oom, what + " raised in the " + (failure.phase.empty() ? "" : failure.phase + " of the ") +
                                              "attention call" + (failure.detail.empty() ? "" : " (" + failure.detail + ")")};
    if (failure.phase == "backward" && failure.from_log)
      return {FailureKind::attention_oom, what + " in a backward whose traceback names attention"};
    return {FailureKind::oom, what + (failure.phase.empty() ? "" : " in the " + failure.phase) +
                                  ", not inside an observed attention call"};
  }
  const bool key_or_type = type == "KeyError" || type == "TypeError" || has(type, ".KeyError") || has(type, ".TypeError");
  if (key_or_type && (has(everything, "nargs") || has(failure.traceback, "autotuner") ||
                      has(text, "'NoneType' object is not a mapping")))
    return {FailureKind::autotune_race,
            fmt::format("{} \"{}\" from Triton's autotuner call state", type, first_line(text).substr(0, 160))};
  const bool damaged = has(everything, "JSONDecodeError") || has(everything, "UnpicklingError") || has(type, "EOFError") ||
                       has(text, "Ran out of input") || has(text, "invalid load key") || has(text, "corrupt") ||
                       has(text, "truncated") || has(text, "Expecting value") || has(everything, "BadZipFile");
  if (damaged && has(everything, "cache"))
    return {FailureKind::kernel_cache, fmt::format("{} \"{}\" reading a cache", type, first_line(text).substr(0, 160))};
  if (has(type, "FloatingPointError") || has(text, "NaN or Inf") || has(text, "non-finite"))
    return {FailureKind::nonfinite, fmt::format("{} \"{}\"", type, first_line(text).substr(0, 160))};
  return {FailureKind::unknown, fmt::format("{} \"{}\" matches none of the shipped hypotheses' failures",
                                            type.empty() ? "the failure" : type, first_line(text).substr(0, 160))};
}

// The captured dims as --set arguments of an attention_step experiment.
std::vector<std::string> dims_sets(const CapturedStep& step) {
  std::vector<std::string> sets = {
      fmt::format("dims.batch={}", step.batch),       fmt::format("dims.heads={}", step.heads),
      fmt::format("dims.kv_heads={}", step.kv_heads), fmt::format("dims.head_dim={}", step.head_dim),
      fmt::format("dims.dtype={}", step.dtype),       fmt::format("dims.block_size={}", step.block_size),
      fmt::format("dims.anchors={}", step.anchors),   fmt::format("dims.context={}", step.context)};
  // The whole mask section at once: a --set of an object replaces it, so no field of the spec's own
  // mask (documents, a dflash-only rule) is left to contradict the captured one.
  if (step.mask.is_object()) sets.push_back("mask=" + step.mask.dump());
  return sets;
}

// anchor_scaling's sweep at the captured count: a quarter, a half and all of it (distinct, >= 1).
std::string anchor_sweep(int64_t anchors) {
  std::vector<int64_t> values;
  for (int64_t value : {anchors / 4, anchors / 2, anchors})
    if (value >= 1 && std::find(values.begin(), values.end(), value) == values.end()) values.push_back(value);
  return json(values).dump();
}

}  // namespace

TriagePlan plan_triage(const Failure& failure, const PlanOptions& options) {
  TriagePlan plan;
  std::tie(plan.kind, plan.classification) = classify(failure);
  const std::vector<std::string> device = {"--device", options.device};
  const bool with_step = failure.step && failure.step->q_len > 0;
  if (with_step) plan.sets = dims_sets(*failure.step);
  const std::vector<std::string> captured_sets = plan.sets;
  plan.sets.insert(plan.sets.end(), options.sets.begin(), options.sets.end());
  // The captured dims (but those `skip_prefixes` names), then `extra`, then the user's own --set.
  const auto with_sets = [&](std::vector<std::string> args, const std::vector<std::string>& skip_prefixes = {},
                             const std::vector<std::string>& extra = {}) {
    std::vector<std::string> sets;
    for (const std::string& set : captured_sets) {
      bool skipped = false;
      for (const auto& prefix : skip_prefixes) skipped = skipped || set.rfind(prefix, 0) == 0;
      if (!skipped) sets.push_back(set);
    }
    sets.insert(sets.end(), extra.begin(), extra.end());
    sets.insert(sets.end(), options.sets.begin(), options.sets.end());
    for (const std::string& set : sets) {
      args.push_back("--set");
      args.push_back(set);
    }
    return args;
  };
  const std::string message = failure.message.empty() ? failure.exception_type : failure.message;
  const auto explain_steps = [&]() {
    if (!failure.requested_bytes) {
      plan.notes.push_back("the message names no allocation size: explain-oom is not run");
      return;
    }
    plan.steps.push_back({"explain_oom", "explain", "bwd_fusion",
                          "which tensor of the attention step, at the captured dims, has the size the allocator asked for",
                          with_sets({"explain-oom", message, "--spec", "bwd_fusion"})});
    plan.steps.push_back({"explain_oom_solve", "explain", "bwd_fusion",
                          "at which anchor count or context length a tensor asks for exactly that size",
                          with_sets({"explain-oom", message, "--spec", "bwd_fusion", "--solve", "dims.anchors", "--solve",
                                     "dims.context"})});
  };
  const auto run_step = [&](const std::string& experiment, const std::string& purpose,
                            const std::vector<std::string>& extra_sets = {}, const std::vector<std::string>& skip = {}) {
    std::vector<std::string> args = {"run", experiment};
    args.insert(args.end(), device.begin(), device.end());
    args = with_sets(args, skip, extra_sets);
    plan.hypotheses.push_back(experiment);
    plan.steps.push_back({experiment, "run", experiment, purpose, args});
  };
  const auto plain_run = [&](const std::string& experiment, const std::string& purpose, std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {"run", experiment};
    args.insert(args.end(), device.begin(), device.end());
    args.insert(args.end(), extra.begin(), extra.end());
    plan.hypotheses.push_back(experiment);
    plan.steps.push_back({experiment, "run", experiment, purpose, args});
  };
  switch (plan.kind) {
    case FailureKind::attention_oom:
      explain_steps();
      run_step("bwd_fusion", "does the attention backward at the captured dims run a dense path that materializes the "
                             "Q×KV scores, where the fused kernels do not");
      run_step("anchor_scaling", "does the dense backward's memory grow with Q×KV (the anchor count) while the fused one "
                                 "grows with Q+KV",
               {"dims.anchors=" + anchor_sweep(with_step ? failure.step->anchors : 512)}, {"dims.anchors="});
      break;
    case FailureKind::oom:
      explain_steps();
      plan.notes.push_back("the OOM was not raised inside an attention call, which is what bwd_fusion and "
                           "anchor_scaling test; explain-oom says whether the request is the size of an attention tensor");
      break;
    case FailureKind::autotune_race: {
      plain_run("warmup_race", "callers warming up one shared-state autotuner at once corrupt each other's call state");
      std::vector<std::string> extra;
      if (!failure.python.empty() && fs::exists(failure.python)) extra = {"--python", failure.python};
      plain_run("triton_autotune_race_py", "Triton's own @triton.autotune, warmed up from threads at once, in the job's "
                                           "Python",
                extra);
      break;
    }
    case FailureKind::kernel_cache:
      plain_run("cache_corruption", "a damaged on-disk kernel cache crashes the run or makes it use a bad config");
      break;
    case FailureKind::nonfinite:
      plan.notes.push_back("no shipped experiment tests a NaN/Inf hypothesis; the replays check every tensor of the step "
                           "for NaN/Inf (replay/README.md)");
      break;
    case FailureKind::unknown:
      plan.notes.push_back("no shipped experiment tests this failure");
      break;
  }
  const bool experiments_at_dims = std::any_of(plan.steps.begin(), plan.steps.end(), [](const TriageStep& step) {
    return step.kind == "explain" || step.experiment == "bwd_fusion" || step.experiment == "anchor_scaling";
  });
  if (with_step && !failure.step->mask.is_object() && experiments_at_dims)
    plan.notes.push_back("the captured mask is none of the named kinds, so the experiments run their own (dflash) "
                         "mask at the captured lengths");
  if (with_step && failure.step->replayable) {
    for (const char* variant : {"dense", "fused"}) {
      std::vector<std::string> args = {"replay", "--import", fs::absolute(failure.source).string(), "--variant", variant};
      args.insert(args.end(), device.begin(), device.end());
      if (!options.memory_limit.empty()) {
        args.push_back("--memory-limit");
        args.push_back(options.memory_limit);
      }
      plan.steps.push_back({std::string("replay_") + variant, "replay", variant,
                            std::string(variant) == "dense"
                                ? "the captured step on the original, unfused path (the dense reference: fp32 scores "
                                  "materialized), its memory measured"
                                : "the captured step on the fused kernels, its memory measured and its outputs checked",
                            args});
    }
  } else if (failure.from_log) {
    plan.notes.push_back("a log carries no step: nothing is replayed (capture the job with python -m harness.capture "
                         "to replay it)");
  } else if (!with_step) {
    plan.notes.push_back("the capture holds no attention step (no call's tensors were kept), so nothing is replayed");
  } else {
    plan.notes.push_back("the captured step is not replayed: " + failure.step->why_not);
  }
  return plan;
}

std::string plan_text(const Failure& failure, const TriagePlan& plan, const std::string& binary, const std::string& db_path) {
  std::string text = fmt::format("triage of {}\n", failure.source);
  text += fmt::format("failure: {}: {}\n", failure_kind_name(plan.kind), plan.classification);
  if (failure.step) {
    const CapturedStep& step = *failure.step;
    text += fmt::format("step: {}{} q [{}, {}, {}, {}] k/v [{}, {}, {}, {}] {}; mask {}\n", step.op,
                        step.compiled ? " (compiled)" : "", step.batch, step.heads, step.q_len, step.head_dim, step.batch,
                        step.kv_heads, step.kv_len, step.head_dim, step.dtype, step.mask_note);
  }
  text += "hypotheses: " + (plan.hypotheses.empty() ? std::string("none") : join(plan.hypotheses, ", ")) + "\n";
  text += "plan:\n";
  int index = 0;
  for (const TriageStep& step : plan.steps) {
    std::string command = shell_quote(binary);
    for (const auto& arg : step.args) command += " " + shell_quote(arg);
    command += " --db " + shell_quote(db_path);
    text += fmt::format("  {}. {}: {}\n     {}\n", ++index, step.id, step.purpose, command);
  }
  for (const auto& note : plan.notes) text += "note: " + note + "\n";
  return text;
}

nlohmann::json plan_json(const Failure& failure, const TriagePlan& plan) {
  json steps = json::array();
  for (const TriageStep& step : plan.steps)
    steps.push_back({{"id", step.id}, {"kind", step.kind}, {"experiment", step.experiment}, {"purpose", step.purpose},
                     {"args", step.args}});
  json result = {{"source", failure.source},
                 {"failure", {{"kind", std::string(failure_kind_name(plan.kind))},
                              {"classification", plan.classification},
                              {"exception_type", failure.exception_type},
                              {"message", failure.message},
                              {"phase", failure.phase},
                              {"in_attention", failure.in_attention}}},
                 {"hypotheses", plan.hypotheses},
                 {"sets", plan.sets},
                 {"steps", steps},
                 {"notes", plan.notes}};
  if (failure.requested_bytes) result["failure"]["requested_bytes"] = *failure.requested_bytes;
  if (failure.rank) result["failure"]["rank"] = *failure.rank;
  if (failure.step) {
    const CapturedStep& s = *failure.step;
    result["step"] = {{"op", s.op}, {"compiled", s.compiled}, {"batch", s.batch}, {"heads", s.heads},
                      {"kv_heads", s.kv_heads}, {"head_dim", s.head_dim}, {"q_len", s.q_len}, {"kv_len", s.kv_len},
                      {"dtype", s.dtype}, {"replayable", s.replayable}, {"why_not", s.why_not}, {"mask", s.mask},
                      {"mask_note", s.mask_note}};
  }
  return result;
}

// ---- results --------------------------------------------------------------------------------------

namespace {

const StepResult* result_of(const std::vector<StepResult>& results, const std::string& id) {
  for (const auto& result : results)
    if (result.step.id == id) return &result;
  return nullptr;
}

// The median of a metric of a run (at its last sweep point when there are several), or nullopt.
std::optional<double> metric(const db::RunDetail& run, const std::string& variant, const std::string& name,
                             const json& point = nullptr) {
  const auto series = collect_series(run.metrics);
  const Series* found = nullptr;
  for (const auto& s : series)
    if (s.variant == variant && s.metric == name && (point.is_null() || s.point == point)) found = &s;
  if (!found || found->values.empty()) return std::nullopt;
  return found->spread.median;
}

const db::Trial* trial_of(const db::RunDetail& run, const std::string& variant) {
  for (const auto& trial : run.trials)
    if (trial.variant == variant) return &trial;
  return nullptr;
}

// "ok, bwd peak 130 MiB" / "oom asking for 16 GiB" for a replay or a one-point run's variant.
std::string variant_summary(const db::RunDetail& run, const std::string& variant) {
  const db::Trial* trial = trial_of(run, variant);
  if (!trial) return "not run";
  if (trial->status == "oom")
    return "oom" + (trial->requested_bytes ? ", asking for " + bytes_text(static_cast<double>(*trial->requested_bytes)) : "");
  if (trial->status != "ok") return trial->status + (trial->error.empty() ? "" : ": " + first_line(trial->error).substr(0, 120));
  std::string text = "ok";
  if (auto bwd = metric(run, variant, "bwd_peak_bytes")) text += ", backward peak " + bytes_text(*bwd);
  if (auto fwd = metric(run, variant, "fwd_peak_bytes")) text += ", forward peak " + bytes_text(*fwd);
  if (auto match = metric(run, variant, "match")) text += *match == 1.0 ? ", matches the fp32 reference" : ", does NOT match the fp32 reference";
  return text;
}

std::string explain_summary(const json& output) {
  if (!output.is_object()) return "";
  if (output.contains("matches")) {
    const json& matches = output["matches"];
    if (matches.empty()) return "no tensor of the model";
    const json& best = matches[0];
    return fmt::format("{} {} `{}` of the {} path ({} {}, {}; {:.1f} % off)",
                       output.value("matched", false) ? "matches" : "nearest (not within tolerance):",
                       best.value("phase", ""), best.value("tensor", "?"), best.value("variant", "?"),
                       json(best.value("shape", json::array())).dump(), best.value("dtype", ""),
                       bytes_text(best.value("bytes", 0.0)), 100.0 * best.value("relative_error", 0.0));
  }
  if (output.contains("solves")) {
    std::vector<std::string> parts;
    for (const auto& solve : output["solves"]) {
      const std::string dim = solve.value("dim", "?");
      if (!solve.value("skipped", std::string()).empty()) continue;
      std::vector<std::string> values;
      for (const auto& solution : solve.value("solutions", json::array())) {
        if (!solution.value("invalid", std::string()).empty()) continue;
        values.push_back(fmt::format("{}={} ({} of {})", dim, solution.value("best", int64_t{0}), solution.value("tensor", "?"),
                                     solution.value("variants", "?")));
        if (values.size() == 3) break;
      }
      parts.push_back(values.empty() ? dim + ": no value" : join(values, ", "));
    }
    return join(parts, "; ");
  }
  return "";
}

}  // namespace

Conclusion conclude(const Failure& failure, const TriagePlan& plan, const std::vector<StepResult>& results) {
  Conclusion conclusion;
  json& facts = conclusion.facts;
  const auto run_of = [&](const std::string& id) -> const db::RunDetail* {
    const StepResult* result = result_of(results, id);
    return result && result->run ? &*result->run : nullptr;
  };
  const db::RunDetail* dense_replay = run_of("replay_dense");
  const db::RunDetail* fused_replay = run_of("replay_fused");
  const db::RunDetail* fusion = run_of("bwd_fusion");
  const db::RunDetail* scaling = run_of("anchor_scaling");
  std::optional<double> dense_bwd, fused_bwd;
  std::string dense_status, fused_status;
  if (dense_replay) {
    dense_bwd = metric(*dense_replay, "dense", "bwd_peak_bytes");
    if (const db::Trial* t = trial_of(*dense_replay, "dense")) dense_status = t->status;
  }
  if (fused_replay) {
    fused_bwd = metric(*fused_replay, "fused", "bwd_peak_bytes");
    if (const db::Trial* t = trial_of(*fused_replay, "fused")) fused_status = t->status;
  }
  if (dense_bwd) facts["replay_dense_bwd_peak_bytes"] = *dense_bwd;
  if (fused_bwd) facts["replay_fused_bwd_peak_bytes"] = *fused_bwd;
  if (failure.requested_bytes) facts["requested_bytes"] = *failure.requested_bytes;
  std::string named;
  if (const StepResult* explain = result_of(results, "explain_oom"); explain && explain->output.is_object() &&
                                                                     explain->output.value("matched", false)) {
    const json& best = explain->output["matches"][0];
    named = fmt::format("`{}` of the {} path", best.value("tensor", "?"), best.value("variant", "?"));
    facts["request_is"] = {{"tensor", best.value("tensor", "")}, {"variant", best.value("variant", "")}};
  }
  if (fusion) facts["bwd_fusion_verdict"] = fusion->run.verdict;
  if (scaling) facts["anchor_scaling_verdict"] = scaling->run.verdict;

  std::vector<std::string> sentences;
  switch (plan.kind) {
    case FailureKind::attention_oom:
    case FailureKind::oom: {
      const std::string request = failure.requested_bytes ? bytes_text(static_cast<double>(*failure.requested_bytes)) : "";
      // The fix is claimed only where the measurements carry it: the fused replay ran, needs less than
      // the request that failed, and far less than the dense replay (or the dense one ran out).
      const bool fused_fits = fused_status == "ok" && fused_bwd.has_value() &&
                              (!failure.requested_bytes || *fused_bwd < static_cast<double>(*failure.requested_bytes));
      const bool dense_large = dense_status == "oom" || (dense_bwd && fused_bwd && *dense_bwd > 2.0 * std::max(*fused_bwd, 1.0));
      if (plan.kind == FailureKind::attention_oom && fused_fits && dense_large) {
        std::string why = std::string("The unfused attention ") + (failure.phase == "forward" ? "path" : "backward") +
                          " materializes the Q×KV scores";
        std::vector<std::string> evidence;
        if (!request.empty() && !named.empty()) evidence.push_back("the " + request + " the job asked for is " + named);
        if (dense_status == "oom")
          evidence.push_back("the captured step replayed on the dense path runs out of memory");
        else if (dense_bwd)
          evidence.push_back("the captured step replayed on the dense path peaks at " + bytes_text(*dense_bwd) +
                             " in its backward");
        evidence.push_back("on the fused kernels the same step's backward needs " + bytes_text(*fused_bwd));
        if (fusion && !fusion->run.verdict.empty()) evidence.push_back("bwd_fusion at the captured dims: " + fusion->run.verdict);
        if (scaling && !scaling->run.verdict.empty()) evidence.push_back("anchor_scaling: " + scaling->run.verdict);
        sentences.push_back(why + ": " + join(evidence, "; ") + ".");
        sentences.push_back(fmt::format(
            "**Fix:** run this attention fused, e.g. `torch.compile(flex_attention)` (flex's fused kernels) or "
            "`harness.attention(q, k, v, block_mask)`: the fused backward needs {} where the unfused one asked for {}.",
            bytes_text(*fused_bwd), request.empty() && dense_bwd ? bytes_text(*dense_bwd) : request));
        facts["fix"] = "fused attention";
      } else if (plan.kind == FailureKind::attention_oom) {
        std::vector<std::string> seen;
        if (!request.empty()) seen.push_back("the job asked for " + request + (named.empty() ? "" : " (" + named + ")"));
        if (dense_replay) seen.push_back("dense replay: " + variant_summary(*dense_replay, "dense"));
        if (fused_replay) seen.push_back("fused replay: " + variant_summary(*fused_replay, "fused"));
        if (fusion) seen.push_back("bwd_fusion: " + fusion->run.verdict);
        sentences.push_back("The measurements do not show that the fused path fits where the unfused one ran out: " +
                            (seen.empty() ? std::string("nothing was measured") : join(seen, "; ")) + ".");
      } else {
        sentences.push_back("The out-of-memory error was raised outside the attention calls; no shipped hypothesis "
                            "covers it." +
                            (named.empty() ? std::string() : " Its request has the size of " + named + ".") +
                            (dense_bwd && fused_bwd ? " The captured attention step itself needs " + bytes_text(*dense_bwd) +
                                                          " (dense) and " + bytes_text(*fused_bwd) + " (fused) in its backward."
                                                    : ""));
      }
      break;
    }
    case FailureKind::autotune_race: {
      const db::RunDetail* race = run_of("warmup_race");
      const db::RunDetail* triton = run_of("triton_autotune_race_py");
      const std::string race_verdict = race ? race->run.verdict : "";
      const std::string triton_verdict = triton ? triton->run.verdict : "";
      if (race_verdict == "RACE" || triton_verdict == "RACE") {
        sentences.push_back("The shared autotuner call state races: " +
                            join({race ? "warmup_race " + race_verdict : "", triton ? "triton_autotune_race_py " + triton_verdict : ""},
                                 ", ") +
                            ".");
        sentences.push_back("**Fix:** warm up every autotuned kernel once, sequentially, before threads or processes "
                            "share it (or keep the autotuner's call state per call, as the harness autotuner does).");
        facts["fix"] = "sequential warm-up";
      } else {
        sentences.push_back("The race did not reproduce here (warmup_race " +
                            (race_verdict.empty() ? std::string("not run") : race_verdict) + ", triton_autotune_race_py " +
                            (triton_verdict.empty() ? std::string("not run") : triton_verdict) + ").");
      }
      break;
    }
    case FailureKind::kernel_cache: {
      const db::RunDetail* cache = run_of("cache_corruption");
      const std::string verdict = cache ? cache->run.verdict : "not run";
      sentences.push_back("cache_corruption: " + verdict + ".");
      if (verdict == "RECOVERS")
        sentences.push_back("**Fix:** validate the kernel cache on read and write it atomically (write a temporary file, "
                            "then rename), as the harness autotuner does; clearing the damaged cache lets the job run now.");
      break;
    }
    case FailureKind::nonfinite:
    case FailureKind::unknown: {
      std::vector<std::string> seen;
      if (dense_replay) seen.push_back("dense: " + variant_summary(*dense_replay, "dense"));
      if (fused_replay) seen.push_back("fused: " + variant_summary(*fused_replay, "fused"));
      sentences.push_back(std::string("No shipped hypothesis matches this failure (") +
                          std::string(failure_kind_name(plan.kind)) + ")." +
                          (seen.empty() ? std::string(" The step could not be replayed.")
                                        : " The captured step replayed: " + join(seen, "; ") + "."));
      break;
    }
  }
  conclusion.text = join(sentences, " ");
  facts["kind"] = std::string(failure_kind_name(plan.kind));
  return conclusion;
}

// ---- the document ---------------------------------------------------------------------------------

namespace {

std::string shape_text(int64_t a, int64_t b, int64_t c, int64_t d) { return fmt::format("[{}, {}, {}, {}]", a, b, c, d); }

void add_what_failed(Document& doc, const Failure& failure, const TriagePlan& plan) {
  doc.heading(2, "What failed");
  TableBlock table;
  table.headers = {"", ""};
  table.rows.push_back({"exception", failure.exception_type.empty() ? "(none named)" : "`" + failure.exception_type + "`"});
  table.rows.push_back({"message", first_line(failure.message).substr(0, 400)});
  table.rows.push_back({"class", std::string(failure_kind_name(plan.kind))});
  if (!failure.phase.empty()) table.rows.push_back({"where", failure.phase + (failure.detail.empty() ? "" : ": " + failure.detail)});
  if (failure.requested_bytes)
    table.rows.push_back({"allocation asked for", fmt::format("{} ({} bytes)", bytes_text(static_cast<double>(*failure.requested_bytes)),
                                                              *failure.requested_bytes)});
  if (failure.rank) table.rows.push_back({"rank", std::to_string(*failure.rank)});
  if (failure.capture.is_object()) {
    const json process = failure.capture.value("process", json::object());
    std::vector<std::string> argv;
    for (const auto& word : process.value("argv", json::array())) argv.push_back(shell_quote(word.get<std::string>()));
    table.rows.push_back({"job", "`" + join(argv, " ") + "` (pid " + std::to_string(process.value("pid", 0)) + ")"});
    const json env = failure.capture.value("env", json::object());
    std::string toolchain = fmt::format("torch {}, CUDA {}, Python {}", env.value("torch", "?"),
                                        env["torch_cuda"].is_string() ? env["torch_cuda"].get<std::string>() : "none",
                                        env.value("python", "?"));
    if (env.contains("triton") && env["triton"].is_string()) toolchain += ", triton " + env["triton"].get<std::string>();
    for (const auto& gpu : env.value("gpus", json::array()))
      toolchain += fmt::format("; GPU {} {} ({})", gpu.value("index", 0), gpu.value("name", "?"),
                               bytes_text(gpu.value("total_memory_bytes", 0.0)));
    table.rows.push_back({"toolchain", toolchain + ", host " + env.value("host", "?")});
    table.rows.push_back({"attention calls observed", std::to_string(failure.capture.value("calls_observed", 0))});
  }
  if (failure.step) {
    const CapturedStep& s = *failure.step;
    table.rows.push_back({"failing call", fmt::format("`{}`{}: q {}, k/v {}, {}", s.op, s.compiled ? " (torch.compile)" : " (eager)",
                                                      shape_text(s.batch, s.heads, s.q_len, s.head_dim),
                                                      shape_text(s.batch, s.kv_heads, s.kv_len, s.head_dim), s.dtype)});
    table.rows.push_back({"mask", s.mask_note});
    if (!s.replayable) table.rows.push_back({"replay", s.why_not});
  }
  table.rows.push_back({"source", "`" + failure.source + "`"});
  doc.table(std::move(table));
  if (!failure.traceback.empty()) {
    doc.paragraph("The traceback (its end):");
    doc.code(last_lines(failure.traceback, 30));
  }
  if (failure.capture.is_object())
    for (const auto& note : failure.capture.value("notes", json::array())) doc.paragraph("Capture note: " + note.get<std::string>());
}

void add_snapshot(Document& doc, const Failure& failure, const std::optional<spec::Spec>& named_by) {
  if (failure.snapshot_path.empty()) return;
  doc.heading(2, "The allocator at the failing request");
  SnapshotSummary summary;
  try {
    summary = read_snapshot(failure.snapshot_path);
  } catch (const std::exception& error) {
    doc.paragraph(fmt::format("The snapshot `{}` cannot be read: {}", failure.snapshot_path, error.what()));
    return;
  }
  if (named_by) {
    try {
      name_blocks(summary, memory_model::predict(*named_by, "dense", "cuda"));
    } catch (const std::exception&) {
      // A spec the model does not cover: the blocks stay unnamed.
    }
  }
  const std::vector<SnapshotBlock>& blocks = summary.oom ? summary.oom->live : summary.at_peak;
  std::string text = fmt::format("PyTorch's caching allocator, as `{}` recorded it (open it in memory_viz: `python -m "
                                 "torch.cuda._memory_viz trace_plot {} -o snapshot.html`): {} events",
                                 fs::path(failure.snapshot_path).filename().string(),
                                 fs::path(failure.snapshot_path).filename().string(), summary.trace_events);
  if (summary.oom)
    text += fmt::format("; the failing request asked for {}{} with {} allocated and {} reserved",
                        bytes_text(static_cast<double>(summary.oom->requested_bytes)),
                        summary.oom->name.empty() ? "" : " (" + summary.oom->name + ")",
                        bytes_text(static_cast<double>(summary.oom->allocated)), bytes_text(static_cast<double>(summary.oom->reserved)));
  if (!blocks.empty())
    text += fmt::format("; the largest live block is {}{}", bytes_text(static_cast<double>(blocks.front().bytes)),
                        blocks.front().name.empty() ? "" : " = `" + blocks.front().name + "` of the dense path");
  doc.paragraph(text + ".");
  if (named_by) doc.paragraph("Blocks are named with the tensors the memory model predicts for the dense (unfused) path at the captured dims.");
  TableBlock table;
  table.headers = {"#", "block", "predicted tensor"};
  table.right_align = {true, true, false};
  for (size_t i = 0; i < blocks.size() && i < 8; ++i)
    table.rows.push_back({std::to_string(i + 1), bytes_text(static_cast<double>(blocks[i].bytes)),
                          blocks[i].name.empty() ? "-" : "`" + blocks[i].name + "`"});
  if (!table.rows.empty()) doc.table(std::move(table));
  doc.figure({"snapshot-peak", fmt::format("Largest allocations at the {}", summary.oom ? "failing request" : "peak"),
              render_snapshot_peak_svg(summary, 8, summary.oom ? "Largest allocations at the OOM" : "Largest allocations at the peak")});
  doc.figure({"snapshot-timeline", "Allocated and reserved bytes over the recorded history",
              render_snapshot_timeline_svg(summary, "Allocator timeline")});
}

std::string step_command(const TriageStep& step, const std::string& db_path) {
  std::string command = "harness";
  for (const auto& arg : step.args) command += " " + shell_quote(arg);
  return command + " --db " + shell_quote(db_path);
}

void add_hypotheses(Document& doc, const TriagePlan& plan, const std::vector<StepResult>& results, const std::string& db_path) {
  doc.heading(2, "Hypotheses tested");
  if (plan.hypotheses.empty()) {
    doc.paragraph("None: " + plan.classification + ".");
  } else {
    TableBlock table;
    table.headers = {"experiment", "hypothesis", "run", "verdict"};
    for (const auto& result : results) {
      if (result.step.kind != "run") continue;
      table.rows.push_back({"`" + result.step.experiment + "`", result.step.purpose,
                            result.run ? std::to_string(result.run->run.id) : "-",
                            result.run ? (result.run->run.verdict.empty() ? "(none)" : "**" + result.run->run.verdict + "**")
                                       : "could not run (exit " + std::to_string(result.exit_code) + ")"});
    }
    doc.table(std::move(table));
  }
  for (const auto& result : results) {
    if (result.step.kind == "replay") continue;
    doc.heading(3, result.step.kind == "run" ? "`" + result.step.experiment + "`" : "explain-oom (" + result.step.id + ")");
    doc.paragraph(result.step.purpose + ".");
    doc.code(step_command(result.step, db_path), "sh");
    if (!result.error.empty() && !result.run && !result.output.is_object()) {
      doc.paragraph(fmt::format("Could not run (exit {}): {}", result.exit_code, result.error));
      continue;
    }
    if (result.step.kind == "explain") {
      const std::string summary = explain_summary(result.output);
      doc.paragraph(fmt::format("{} bytes asked for: {}.", result.output.value("requested_bytes", int64_t{0}),
                                summary.empty() ? "no answer" : summary));
      continue;
    }
    if (!result.run) continue;
    const db::RunDetail& run = *result.run;
    const json hypothesis = run.spec.value("hypothesis", json(""));
    if (hypothesis.is_string()) doc.paragraph("Hypothesis: " + hypothesis.get<std::string>());
    doc.paragraph(fmt::format("Run {} on {}: verdict **{}**.", run.run.id, run.run.device,
                              run.run.verdict.empty() ? "(none)" : run.run.verdict));
    // The verdict's evidence: the clause that fired and the values it read.
    std::vector<std::string> evidence;
    if (run.run.evidence.contains("values"))
      for (const auto& value : run.run.evidence["values"])
        evidence.push_back(fmt::format("`{}`: read {} ({})", value.value("comparison", "?"),
                                       value.contains("value") ? value["value"].dump() : "?",
                                       value.value("held", false) ? "holds" : "does not hold"));
    if (run.run.evidence.contains("if") && run.run.evidence["if"].is_string())
      doc.paragraph("The clause that decided: `" + run.run.evidence["if"].get<std::string>() + "` → " +
                    run.run.verdict + ".");
    else if (run.run.evidence.value("else", false))
      doc.paragraph("No clause held: the rule's `else` gave " + run.run.verdict + ".");
    if (!evidence.empty()) doc.bullets(evidence);
    TableBlock table;
    table.headers = {"point", "variant", "status", "fwd peak", "bwd peak", "match"};
    table.right_align = {false, false, false, true, true, false};
    for (const auto& trial : run.trials) {
      const auto fwd = metric(run, trial.variant, "fwd_peak_bytes", trial.point);
      const auto bwd = metric(run, trial.variant, "bwd_peak_bytes", trial.point);
      const auto match = metric(run, trial.variant, "match", trial.point);
      std::string status = trial.status;
      if (trial.status == "oom" && trial.requested_bytes) status += " (" + bytes_text(static_cast<double>(*trial.requested_bytes)) + ")";
      table.rows.push_back({trial.point.empty() ? "-" : trial.point.dump(), trial.variant, status, fwd ? bytes_text(*fwd) : "-",
                            bwd ? bytes_text(*bwd) : "-", match ? (*match == 1.0 ? "yes" : "no") : "-"});
    }
    if (!table.rows.empty()) doc.table(std::move(table));
  }
}

void add_replays(Document& doc, const std::vector<StepResult>& results, const std::string& db_path) {
  std::vector<const StepResult*> replays;
  for (const auto& result : results)
    if (result.step.kind == "replay") replays.push_back(&result);
  if (replays.empty()) return;
  doc.heading(2, "The captured step, replayed");
  doc.paragraph("The failing call's own tensors (q, k, v, grad_out) and its mask, run once on the original, unfused path "
                "(the dense reference: the fp32 scores materialized, as flex_attention's eager path and SDPA's math path "
                "do) and once on the fused kernels; each is checked against an fp32 reference, and its output against "
                "the one the job computed.");
  TableBlock table;
  table.headers = {"path", "run", "verdict", "status", "fwd peak", "bwd peak", "output vs the job's"};
  table.right_align = {false, true, false, false, true, true, false};
  for (const StepResult* result : replays) {
    const std::string variant = result->step.experiment;
    if (!result->run) {
      table.rows.push_back({variant, "-", "could not run", "", "", "", first_line(result->error).substr(0, 200)});
      continue;
    }
    const db::RunDetail& run = *result->run;
    const db::Trial* trial = trial_of(run, variant);
    std::string status = trial ? trial->status : "-";
    if (trial && trial->status == "oom" && trial->requested_bytes)
      status += " (" + bytes_text(static_cast<double>(*trial->requested_bytes)) + ")";
    const auto fwd = metric(run, variant, "fwd_peak_bytes"), bwd = metric(run, variant, "bwd_peak_bytes");
    std::string outputs = "-";
    if (result->output.is_object() && result->output.contains("outputs"))
      for (const auto& c : result->output["outputs"])
        if (c.value("tensor", "") == "out.0")
          outputs = c.value("bitwise_equal", false) ? "bitwise equal"
                                                    : fmt::format("max abs err {:.3g} (rel {:.3g})", c.value("max_abs_err", 0.0),
                                                                  c.value("max_rel_err", 0.0));
    table.rows.push_back({variant, std::to_string(run.run.id), run.run.verdict, status, fwd ? bytes_text(*fwd) : "-",
                          bwd ? bytes_text(*bwd) : "-", outputs});
  }
  doc.table(std::move(table));
  for (const StepResult* result : replays)
    if (result->output.is_object() && result->output.contains("reason"))
      doc.paragraph(fmt::format("`{}`: {}.", result->step.experiment, result->output["reason"].get<std::string>()));
  std::string commands;
  for (const StepResult* result : replays) commands += step_command(result->step, db_path) + "\n";
  doc.code(commands, "sh");
}

// A run's writeup, its headings one level down, its figures' ids made unique.
void append_run_writeup(Document& doc, const db::Store& store, const db::RunDetail& run, const std::string& db_path) {
  Writeup writeup;
  try {
    writeup = build_writeup(store, run, db_path);
  } catch (const std::exception& error) {
    doc.paragraph(fmt::format("The writeup of run {} cannot be built: {}", run.run.id, error.what()));
    return;
  }
  doc.heading(3, fmt::format("Run {}: {}", run.run.id, writeup.document.title));
  for (Block block : writeup.document.blocks) {
    if (auto* heading = std::get_if<Heading>(&block)) {
      heading->level = std::min(3, heading->level + 2);
      if (heading->level < 3) heading->level = 3;
    }
    if (auto* figure = std::get_if<Figure>(&block)) figure->id = fmt::format("run{}-{}", run.run.id, figure->id);
    doc.blocks.push_back(std::move(block));
  }
}

}  // namespace

Document triage_document(const Failure& failure, const TriagePlan& plan, const std::vector<StepResult>& results,
                         const Conclusion& conclusion, const db::Store* store, const std::string& db_path,
                         const std::optional<spec::Spec>& named_by) {
  Document doc;
  doc.title = fmt::format("Triage: {}{}", failure.exception_type.empty() ? std::string("failure") : failure.exception_type,
                          failure.phase.empty() ? "" : " in the " + failure.phase);
  doc.heading(2, "Conclusion");
  doc.paragraph(conclusion.text);
  add_what_failed(doc, failure, plan);
  add_snapshot(doc, failure, named_by);
  doc.heading(2, "How it was matched");
  doc.paragraph(fmt::format("Class: **{}**. {}.", failure_kind_name(plan.kind), plan.classification));
  if (!plan.sets.empty()) doc.paragraph("The experiments ran at the captured dims: `" + join(plan.sets, " ") + "`.");
  if (!plan.notes.empty()) doc.bullets(plan.notes);
  add_hypotheses(doc, plan, results, db_path);
  add_replays(doc, results, db_path);
  doc.heading(2, "Reproduce");
  std::string commands;
  if (failure.capture.is_object()) {
    const json process = failure.capture.value("process", json::object());
    std::vector<std::string> argv;
    for (const auto& word : process.value("argv", json::array())) argv.push_back(shell_quote(word.get<std::string>()));
    commands += "python -m harness.capture -- " + join(argv, " ") + "    # the job, captured\n";
  }
  commands += std::string("harness triage ") + (failure.from_log ? "--log " : "") + shell_quote(failure.source) + " --db " +
              shell_quote(db_path) + " -o triage.md\n";
  for (const auto& result : results) commands += step_command(result.step, db_path) + "\n";
  doc.code(commands, "sh");
  if (store) {
    bool any = false;
    for (const auto& result : results) {
      if (!result.run) continue;
      if (!any) doc.heading(2, "Appendix: each run's writeup");
      any = true;
      append_run_writeup(doc, *store, *result.run, db_path);
    }
  }
  return doc;
}

}  // namespace harness::analysis
