// `harness explain-oom MESSAGE --spec NAME` (or `--bytes N`): which tensors of an experiment's
// variants, at each of its sweep points, have the size an out-of-memory error asked for, best first,
// from the memory model (experiments/memory_model.h). With the message's cap ("96.00 GiB allowed")
// the model also replays the step under it and says which allocation fails. With `--solve DIM`
// (or `--solve free`) it solves the model for that dim instead: the values at which a tensor asks
// for exactly the message's bytes, and the --set that replays one (experiments/memory_solve.h).

#include <algorithm>
#include <iostream>
#include <optional>

#include <fmt/format.h>

#include "experiments/memory_model.h"
#include "experiments/memory_solve.h"
#include "experiments/spec.h"
#include "experiments/sweep.h"
#include "harness/cli/cli.h"
#include "core/printer.h"
#include "harness/runner/run_support.h"

namespace harness {
namespace {

namespace mm = memory_model;

struct ExplainArgs {
  std::string message;
  std::string spec;
  std::vector<std::string> overrides;
  std::string profile;
  std::string bytes;
  std::string device_kind;
  double tolerance = 0.03;
  size_t limit = 10;
  std::vector<std::string> solve;  //!< dims to solve for; "free": every solvable dim no --set pins
};

mm::OomMessage read_message(const ExplainArgs& args) {
  if (!args.bytes.empty() && !args.message.empty()) throw UsageError("explain-oom: give an OOM message or --bytes, not both");
  if (!args.bytes.empty()) {
    mm::OomMessage message;
    message.requested_bytes = parse_size_option(args.bytes, "--bytes", false);
    return message;
  }
  if (args.message.empty()) throw UsageError("explain-oom: give the OOM message (\"Tried to allocate 15.09 GiB ...\") or --bytes N");
  const auto message = parse_oom_message(args.message);
  if (!message)
    throw UsageError(fmt::format("explain-oom: no allocation size in '{}' (expected e.g. \"Tried to allocate 15.09 GiB\", "
                                 "\"requested 17179869184 bytes\" or a size such as \"16 GiB\")",
                                 args.message));
  return *message;
}

std::vector<std::pair<nlohmann::json, spec::Spec>> load_points(const ExplainArgs& args, const GlobalOptions& options) {
  const auto dirs = experiment_search_dirs(options);
  const auto path = spec::find_spec(args.spec, dirs);
  if (!path) {
    std::string searched;
    for (const auto& dir : dirs) searched += (searched.empty() ? "" : ", ") + dir;
    throw UsageError(fmt::format("unknown experiment '{}' (searched {}; `harness list` shows them)", args.spec, searched));
  }
  spec::LoadOptions load;
  load.overrides = args.overrides;
  load.profile = args.profile;  // one the spec does not define is a spec error naming those it does
  const spec::Spec spec = spec::load_spec_file(*path, load);
  if (spec.kind != "attention_step")
    throw UsageError(fmt::format("explain-oom: {} is an experiment of kind {}; the memory model covers attention_step",
                                 args.spec, spec.kind));
  return spec::points_with_specs(spec);
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

nlohmann::json match_json(const mm::Match& m) {
  nlohmann::json json = {{"tensor", m.tensor},     {"variant", m.variant}, {"point", m.point},
                         {"shape", m.shape},       {"dtype", m.dtype},     {"bytes", m.bytes},
                         {"phase", m.phase},       {"relative_error", m.relative_error},
                         {"explanation", m.explanation}, {"within_tolerance", m.within_tolerance}};
  if (!m.occurrence.empty()) json["occurrence"] = m.occurrence;
  return json;
}

void print_matches(const std::vector<mm::Match>& matches) {
  Table table;
  table.headers = {"#", "tensor", "variant", "point", "shape", "dtype", "bytes", "phase", "error", "explanation"};
  table.right_align = {true, false, false, false, false, false, true, false, true, false};
  int rank = 0;
  for (const mm::Match& m : matches) {
    const std::string point = spec::point_label(m.point);
    table.rows.push_back({std::to_string(++rank), m.tensor, m.variant, point.empty() ? "-" : point, shape_text(m.shape), m.dtype,
                          format_bytes(static_cast<double>(m.bytes)), m.phase, fmt::format("{:.2f}%", 100.0 * m.relative_error),
                          m.explanation});
  }
  print_table(std::cout, table);
  rank = 0;
  for (const mm::Match& m : matches) {
    ++rank;
    if (!m.occurrence.empty()) std::cout << "#" << rank << ": " << m.occurrence << '\n';
  }
}

// The dims a --solve names, and the ones --set pins (their paths, "dims.context").
std::vector<std::string> dims_to_solve(const ExplainArgs& args, std::vector<std::string>& pinned) {
  for (const std::string& override_arg : args.overrides) {
    const auto equals = override_arg.find('=');
    if (equals != std::string::npos) pinned.push_back(override_arg.substr(0, equals));
  }
  std::vector<std::string> dims;
  for (const std::string& dim : args.solve) {
    if (dim == "free") {
      for (const std::string& d : mm::solvable_dims())
        if (std::find(dims.begin(), dims.end(), d) == dims.end()) dims.push_back(d);
      continue;
    }
    const std::string path = dim.rfind("dims.", 0) == 0 ? dim : "dims." + dim;
    if (std::find(mm::solvable_dims().begin(), mm::solvable_dims().end(), path) == mm::solvable_dims().end())
      throw UsageError(fmt::format("--solve {}: expected one of dims.context, dims.anchors, dims.heads, dims.batch or free", dim));
    // Asked for by name: solved even when --set pins it (the --set then only fixes the other points).
    pinned.erase(std::remove(pinned.begin(), pinned.end(), path), pinned.end());
    if (std::find(dims.begin(), dims.end(), path) == dims.end()) dims.push_back(path);
  }
  return dims;
}

std::string range_text(const mm::Solution& s) {
  return s.first == s.last ? std::to_string(s.first) : fmt::format("{}..{}", s.first, s.last);
}

void print_solves(const std::vector<mm::DimSolve>& solves, const mm::RequestInterval& interval,
                  const std::vector<std::string>& overrides) {
  std::cout << (interval.low == interval.high
                    ? fmt::format("solving for a request of exactly {} B\n", interval.low)
                    : fmt::format("solving for a request printed as {}: {}..{} B\n", interval.printed, interval.low, interval.high));
  for (const mm::DimSolve& solve : solves) {
    if (!solve.skipped.empty()) {
      std::cout << fmt::format("{}: not solved ({})\n", solve.dim, solve.skipped);
      continue;
    }
    if (solve.solutions.empty()) {
      std::cout << fmt::format("{}: no value makes any tensor ask for that size\n", solve.dim);
      continue;
    }
    std::cout << fmt::format("{}: values at which a tensor asks for that size\n", solve.dim);
    Table table;
    table.headers = {"point", "spec", "values", "best", "tensor", "variant", "shape", "dtype", "request", "formula"};
    table.right_align = {false, true, true, true, false, false, false, false, true, false};
    for (const mm::Solution& s : solve.solutions) {
      const std::string point = spec::point_label(s.point);
      std::string tensor = s.tensor;
      for (const std::string& other : s.others) tensor += "=" + other;
      table.rows.push_back({point.empty() ? "-" : point, std::to_string(s.spec_value), range_text(s),
                            s.invalid.empty() ? std::to_string(s.best) : "-", tensor, s.variants, shape_text(s.best_shape),
                            s.dtype, fmt::format("{} B", s.best_request_bytes), s.note});
    }
    print_table(std::cout, table);
    for (const mm::Solution& s : solve.solutions) {
      const std::string point = spec::point_label(s.point);
      if (!s.invalid.empty()) {
        std::cout << fmt::format("  {} at {}: no valid spec in {} ({})\n", s.tensor, point.empty() ? "the spec" : point,
                                 range_text(s), s.invalid);
        continue;
      }
      // The user's own --set arguments (but the solved dim's), then the point's and the solution.
      std::string sets;
      for (const std::string& set : overrides)
        if (set.rfind(s.dim + "=", 0) != 0) sets += " --set " + set;
      for (const std::string& set : s.set_args) sets += " --set " + set;
      std::cout << fmt::format("  replay {} ({} B asked at {}={}):{}\n", s.tensor, s.best_request_bytes, s.dim, s.best, sets);
    }
  }
}

}  // namespace

Action add_explain_command(CLI::App& app, GlobalOptions& options) {
  auto args = std::make_shared<ExplainArgs>();
  auto* command = app.add_subcommand(
      "explain-oom", "Which tensors of an experiment have the size an out-of-memory error asked for (memory model)");
  command->add_option("message", args->message, "The OOM message, e.g. \"Tried to allocate 15.09 GiB ... 84.07 GiB in use\"");
  command->add_option("--spec", args->spec, "Experiment name or spec file")->required();
  // One value per --set, so that a message after it stays the positional argument.
  command->add_option("--set", args->overrides, "Override a spec field: path=value (a list sweeps it)")
      ->allow_extra_args(false);
  command->add_option("--profile", args->profile, "Apply a profile of the spec");
  command->add_option("--bytes", args->bytes, "The requested size instead of a message (17179869184, 16GiB)");
  command->add_option("--device-kind", args->device_kind, "cuda or cpu (default: from the message, else cuda)")
      ->check(CLI::IsMember({"cuda", "cpu"}));
  command->add_option("--tolerance", args->tolerance, "Relative size tolerance of a match (default 0.03)")
      ->check(CLI::Range(0.0, 1.0));
  command->add_option("--solve", args->solve,
                      "Solve the memory model for a dim (dims.context, dims.anchors, dims.heads, dims.batch; "
                      "free: each one --set does not pin) so a tensor asks for exactly the message's bytes")
      ->allow_extra_args(false);
  command->add_option("--limit", args->limit, "Most matches listed (default 10)")->check(CLI::PositiveNumber);
  add_global_options(*command, options);
  return [args, &options] {
    const mm::OomMessage message = read_message(*args);
    const auto points = load_points(*args, options);
    mm::ExplainOptions explain;
    explain.tolerance = args->tolerance;
    explain.device_kind = !args->device_kind.empty() ? args->device_kind : !message.device_kind.empty() ? message.device_kind : "cuda";
    explain.nearest_when_none = true;
    if (!args->solve.empty()) {
      std::vector<std::string> pinned;
      const auto dims = dims_to_solve(*args, pinned);
      const mm::RequestInterval interval = mm::request_interval(args->message, message.requested_bytes);
      const auto solves = mm::solve(points, dims, pinned, interval, explain.device_kind, explain.model);
      if (options.json) {
        nlohmann::json json = {{"spec", args->spec},
                               {"requested_bytes", message.requested_bytes},
                               {"request_low", interval.low},
                               {"request_high", interval.high},
                               {"device_kind", explain.device_kind},
                               {"solves", nlohmann::json::array()}};
        for (const auto& solve : solves) json["solves"].push_back(mm::to_json(solve));
        print_json(std::cout, json);
        return kExitOk;
      }
      print_solves(solves, interval, args->overrides);
      return kExitOk;
    }
    const auto matches = mm::explain(points, message, explain, args->limit);
    const bool matched = !matches.empty() && matches.front().within_tolerance;

    if (options.json) {
      nlohmann::json json = {{"spec", args->spec},
                             {"requested_bytes", message.requested_bytes},
                             {"device_kind", explain.device_kind},
                             {"tolerance", explain.tolerance},
                             {"points", points.size()},
                             {"matched", matched},
                             {"matches", nlohmann::json::array()}};
      if (message.in_use_bytes) json["in_use_bytes"] = *message.in_use_bytes;
      if (message.capacity_bytes) json["capacity_bytes"] = *message.capacity_bytes;
      if (message.allocated_bytes) json["allocated_bytes"] = *message.allocated_bytes;
      for (const mm::Match& m : matches) json["matches"].push_back(match_json(m));
      print_json(std::cout, json);
      return kExitOk;
    }
    std::cout << fmt::format("asked for {} ({} B) on {}", format_bytes(static_cast<double>(message.requested_bytes)),
                             message.requested_bytes, explain.device_kind);
    if (message.in_use_bytes) std::cout << fmt::format(", {} in use", format_bytes(static_cast<double>(*message.in_use_bytes)));
    if (message.allocated_bytes)
      std::cout << fmt::format(", {} allocated by PyTorch", format_bytes(static_cast<double>(*message.allocated_bytes)));
    if (message.capacity_bytes) std::cout << fmt::format(", cap {}", format_bytes(static_cast<double>(*message.capacity_bytes)));
    std::cout << fmt::format("\nexperiment {}: {} point(s), {} variant(s)\n", args->spec, points.size(),
                             points.front().second.variants.size());
    if (matches.empty()) {
      std::cout << "the spec allocates no tensors\n";
    } else if (matched) {
      std::cout << fmt::format("tensors within {:.1f}% of that size, best first:\n", 100.0 * explain.tolerance);
      print_matches(matches);
    } else {
      std::cout << fmt::format("no tensor is within {:.1f}% of that size; the nearest (not a match):\n", 100.0 * explain.tolerance);
      print_matches(matches);
    }
    return kExitOk;
  };
}

}  // namespace harness
