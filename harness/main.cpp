// harness: settle GPU training bugs by experiment. Entry point: parses the command line,
// runs the chosen subcommand and maps failures to the documented exit codes.

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <iostream>
#include <map>

#include "db/store.h"
#include "experiments/spec.h"
#include "harness/cli.h"

namespace harness {

void add_global_options(CLI::App& command, GlobalOptions& options) {
  command.add_option("--db", options.db_path, "SQLite database file (default ./harness.db)");
  command.add_flag("--json", options.json, "Machine-readable JSON on stdout");
  command.add_option("--log-level", options.log_level, "trace, debug, info, warn, error, off")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "critical", "off"}));
  command.add_option("--experiments-dir", options.experiments_dirs, "Extra directory searched for specs");
}

}  // namespace harness

int main(int argc, char** argv) {
  using namespace harness;
  CLI::App app{"harness: settle GPU training bugs by experiment.\n"
               "Exit codes: 0 ok, 1 a --fail-on condition held, 2 usage or spec error, 3 infrastructure error."};
  app.require_subcommand(1);
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
  add(add_show_command);
  add(add_env_command);
  add(add_diff_command);
  add(add_writeup_command);
  add(add_explain_command);
  add(add_replay_command);
  add(add_bisect_command);
  add(add_envs_command);
  add(add_trial_command);
  add(add_env_child_command);

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::Success& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
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
      std::cerr << "error: invalid experiment spec (" << e.issues().size() << " problem"
                << (e.issues().size() == 1 ? "" : "s") << ", nothing was run or written):\n";
      for (const auto& issue : e.issues()) std::cerr << "  " << issue.to_string() << '\n';
      return kExitUsage;
    } catch (const UsageError& e) {
      std::cerr << "error: " << e.what() << '\n';
      return kExitUsage;
    } catch (const db::DbError& e) {
      std::cerr << "error: database: " << e.what() << '\n';
      return kExitInfra;
    } catch (const std::exception& e) {
      std::cerr << "error: " << e.what() << '\n';
      return kExitInfra;
    }
  }
  return kExitUsage;
}
