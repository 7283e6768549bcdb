// harness: settle GPU training bugs by experiment. Entry point: parses the command line,
// runs the chosen subcommand and maps failures to the documented exit codes.

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <nlohmann/json.hpp>

#include <iostream>
#include <map>
#include <algorithm>
#include <string_view>
#include <vector>

#include "build_info.h"
#include "db/store.h"
#include "experiments/spec.h"
#include "git_info.h"
#include "harness/cli/cli.h"
#include "core/printer.h"

namespace harness {

void add_global_options(CLI::App& command, GlobalOptions& options) {
  command.add_option("--db", options.db_path, "SQLite database file (default ./harness.db)");
  command.add_flag("--json", options.json, "Machine-readable JSON on stdout");
  command.add_option("--log-level", options.log_level, "trace, debug, info, warn, error, off")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "critical", "off"}));
  command.add_option("--experiments-dir", options.experiments_dirs, "Extra directory searched for specs");
}

void add_format_option(CLI::App& command, GlobalOptions& options) {
  command.add_option("--format", options.format, "text (default), json (same as --json), csv or md")
      ->check(CLI::IsMember({"text", "json", "csv", "md"}));
}

namespace {

//! `harness --version`: the version, the commit and the toolchain the binary was built with.
std::string version_text() {
  std::string cuda = std::string(HARNESS_NVCC_VERSION).empty()
                         ? std::string("none (built without the CUDA kernels)")
                         : std::string(HARNESS_NVCC_VERSION) + " (nvcc of the kernels, architectures " + HARNESS_CUDA_ARCHS + ")";
  return std::string("harness ") + HARNESS_VERSION + "\ncommit " + HARNESS_GIT_COMMIT + "\nLibTorch " +
         HARNESS_TORCH_CMAKE_VERSION + "\nCUDA " + cuda + "\nbuild " + HARNESS_BUILD_TYPE + ", " + HARNESS_CXX_COMPILER;
}

// Every error leaves the same way: text on stderr and, under --json, also an object on stdout
// ({"error": ..., "exit_code": ...} plus `extra`), so a script reading stdout sees why, not nothing.
int report_error(const GlobalOptions& options, int exit_code, const std::string& message,
                 const nlohmann::json& extra = nlohmann::json::object()) {
  std::cerr << "error: " << message << '\n';
  if (options.json) {
    nlohmann::json error = {{"error", message}, {"exit_code", exit_code}};
    error.update(extra);
    std::cout << error.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << std::endl;
  }
  return exit_code;
}

}  // namespace
}  // namespace harness

int main(int argc, char** argv) {
  using namespace harness;
  CLI::App app{"harness: settle GPU training bugs by experiment.\n"
               "Exit codes: 0 ok, 1 a --fail-on condition held, 2 usage or spec error, 3 infrastructure error."};
  app.require_subcommand(1);
  app.set_version_flag("--version", version_text(), "Version, commit, LibTorch and CUDA of this binary");
  GlobalOptions options;
  add_global_options(app, options);

  std::map<CLI::App*, Action> actions;
  auto add = [&](Action (*add_command)(CLI::App&, GlobalOptions&)) {
    const size_t before = app.get_subcommands({}).size();
    Action action = add_command(app, options);
    CLI::App* command = app.get_subcommands({})[before];
    command->fallthrough();
    actions[command] = std::move(action);
  };
  add(add_run_command);
  add(add_list_command);
  add(add_runs_command);
  add(add_metrics_command);
  add(add_show_command);
  add(add_env_command);
  add(add_diff_command);
  add(add_writeup_command);
  add(add_explain_command);
  add(add_replay_command);
  add(add_bisect_command);
  add(add_triage_command);
  add(add_envs_command);
  add(add_site_command);
  add(add_trial_command);
  add(add_env_child_command);
  add(add_slurm_command);
  add(add_db_command);
  add(add_slurm_task_command);

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::Success& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // --json may not have been parsed yet when the error came: look for it among the arguments.
    for (int i = 1; i < argc; ++i) {
      const std::string_view arg(argv[i]);
      options.json = options.json || arg == "--json" || arg == "--format=json" ||
                     (arg == "--format" && i + 1 < argc && std::string_view(argv[i + 1]) == "json");
    }
    if (options.json) return report_error(options, kExitUsage, e.what());
    app.exit(e);
    return kExitUsage;
  }

  auto logger = spdlog::stderr_color_mt("harness");
  spdlog::set_default_logger(logger);
  spdlog::set_pattern("[%H:%M:%S.%e] [%^%l%$] %v");
  spdlog::set_level(spdlog::level::from_str(options.log_level));

  for (auto& [command, action] : actions) {
    if (!command->parsed()) continue;
    try {
      return action();
    } catch (const spec::SpecError& e) {
      const auto& issues = e.issues();
      const size_t shown = std::min(issues.size(), spec::kMaxIssuesShown);
      std::string text = "invalid experiment spec (" + std::to_string(e.count()) + " problem" +
                         (e.count() == 1 ? "" : "s") + ", nothing was run or written):";
      nlohmann::json problems = nlohmann::json::array();
      for (size_t i = 0; i < shown; ++i) {
        text += "\n  " + issues[i].to_string();
        problems.push_back({{"source", issues[i].source}, {"path", issues[i].path}, {"message", issues[i].message}});
      }
      if (shown < e.count()) text += "\n  ... and " + std::to_string(e.count() - shown) + " more problems";
      return report_error(options, kExitUsage, text,
                          {{"problems", problems}, {"problem_count", e.count()}});
    } catch (const UsageError& e) {
      return report_error(options, kExitUsage, e.what());
    } catch (const db::DbMissingError& e) {
      return report_error(options, kExitUsage, e.what());
    } catch (const db::DbError& e) {
      return report_error(options, kExitInfra, std::string("database: ") + e.what());
    } catch (const std::exception& e) {
      return report_error(options, kExitInfra, e.what());
    }
  }
  return kExitUsage;
}
