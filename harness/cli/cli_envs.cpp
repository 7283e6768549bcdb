// `harness envs list|prune`: the cached Python envs that `harness bisect` made (one per package
// set, under ~/.cache/harness/envs): what each holds, how big it is, and removing them.

#include <chrono>
#include <ctime>
#include <iostream>
#include <memory>

#include <fmt/format.h>

#include "core/byte_size.h"
#include "core/printer.h"
#include "core/venv_cache.h"
#include "harness/cli/cli.h"

namespace harness {
namespace {

struct EnvsArgs {
  std::string cache;
  bool all = false;
  double older_than_days = 30.0;
  bool dry_run = false;
};

std::string requirements_of(const CachedEnv& env) {
  std::string text;
  for (const auto& requirement : env.request.value("requirements", nlohmann::json::array()))
    text += (text.empty() ? "" : " ") + requirement.get<std::string>();
  return text;
}

// Days since an ISO 8601 UTC time ("2026-12-01T14:00:00Z"); a huge age when it does not parse.
double age_days(const std::string& when) {
  std::tm utc{};
  if (when.size() < 19 || !strptime(when.substr(0, 19).c_str(), "%Y-%m-%dT%H:%M:%S", &utc)) return 1e9;
  const auto then = std::chrono::system_clock::from_time_t(timegm(&utc));
  return std::chrono::duration<double>(std::chrono::system_clock::now() - then).count() / 86400.0;
}

int list_envs_command(const EnvsArgs& args, const GlobalOptions& options) {
  const std::string root = args.cache.empty() ? env_cache_root() : args.cache;
  const auto envs = list_envs(root);
  if (options.json) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& env : envs) {
      out.push_back({{"key", env.key},           {"path", env.path},       {"complete", env.complete},
                     {"installer", env.installer}, {"request", env.request}, {"packages", env.packages},
                     {"created_at", env.created_at}, {"last_used_at", env.last_used_at},
                     {"bytes", folder_bytes(env.path)}});
    }
    print_json(std::cout, {{"root", root}, {"envs", out}});
    return kExitOk;
  }
  if (envs.empty()) {
    std::cout << "no envs in " << root << '\n';
    return kExitOk;
  }
  Table table;
  table.headers = {"key", "requirements", "python", "installer", "size", "created", "last used", "state"};
  table.right_align = {false, false, false, false, true, false, false, false};
  for (const auto& env : envs) {
    table.rows.push_back({env.key, requirements_of(env), env.request.value("python_version", ""), env.installer,
                          format_bytes(static_cast<double>(folder_bytes(env.path))), env.created_at, env.last_used_at,
                          env.complete ? "ready" : "incomplete"});
  }
  std::cout << root << " (sizes count files hard-linked from uv's cache too)\n";
  print_table(std::cout, table);
  return kExitOk;
}

int prune_envs_command(const EnvsArgs& args, const GlobalOptions& options) {
  if (args.older_than_days < 0) throw UsageError("--older-than must be 0 days or more");
  const std::string root = args.cache.empty() ? env_cache_root() : args.cache;
  nlohmann::json removed = nlohmann::json::array();
  double freed = 0.0;
  for (const auto& env : list_envs(root)) {
    const bool stale = age_days(env.last_used_at) > args.older_than_days;
    if (!args.all && env.complete && !stale) continue;
    const double bytes = static_cast<double>(folder_bytes(env.path));
    if (!args.dry_run) remove_env(root, env.key);
    freed += bytes;
    removed.push_back({{"key", env.key}, {"requirements", requirements_of(env)}, {"bytes", bytes},
                       {"why", args.all ? "--all" : !env.complete ? "incomplete" : "unused"}});
  }
  if (options.json) {
    print_json(std::cout, {{"root", root}, {"removed", removed}, {"bytes", freed}, {"dry_run", args.dry_run}});
    return kExitOk;
  }
  for (const auto& env : removed) {
    std::cout << fmt::format("{} {} {} ({}, {})\n", args.dry_run ? "would remove" : "removed",
                             env["key"].get<std::string>(), env["requirements"].get<std::string>(),
                             format_bytes(env["bytes"].get<double>()), env["why"].get<std::string>());
  }
  std::cout << fmt::format("{} env{} {}, {}\n", removed.size(), removed.size() == 1 ? "" : "s",
                           args.dry_run ? "to remove" : "removed", format_bytes(freed));
  return kExitOk;
}

}  // namespace

Action add_envs_command(CLI::App& app, GlobalOptions& options) {
  auto args = std::make_shared<EnvsArgs>();
  auto* command = app.add_subcommand("envs", "The cached Python envs of `harness bisect`: list or prune them");
  command->require_subcommand(1);
  auto* list = command->add_subcommand("list", "Every cached env: requirements, python, installer, size, last use");
  list->add_option("--env-cache", args->cache, "The cache folder (default ~/.cache/harness/envs)");
  add_global_options(*list, options);
  auto* prune = command->add_subcommand(
      "prune", "Remove envs unused for --older-than days (default 30) and unfinished installs; --all removes every env");
  prune->add_option("--env-cache", args->cache, "The cache folder (default ~/.cache/harness/envs)");
  prune->add_flag("--all", args->all, "Remove every env");
  prune->add_option("--older-than", args->older_than_days, "Days since last use (default 30)");
  prune->add_flag("--dry-run", args->dry_run, "Only say what would be removed");
  add_global_options(*prune, options);
  list->fallthrough();
  prune->fallthrough();
  add_global_options(*command, options);
  return [args, list, &options] {
    return list->parsed() ? list_envs_command(*args, options) : prune_envs_command(*args, options);
  };
}

}  // namespace harness
