// `harness slurm status|collect|cancel RUN`: a run submitted with `harness run --slurm`, followed
// after the fact. `status` only reads (Slurm's view of each task and which shards are merged);
// `collect` follows the job until every task is final, merging shards and requeueing failed tasks
// up to the run's --retries, then prints the run like `harness run` does; `cancel` cancels the
// job and finishes its runs with the trials that ran.

#include <iostream>
#include <map>

#include <fmt/format.h>

#include "db/store.h"
#include "harness/cli/cli.h"
#include "core/printer.h"
#include "harness/cli/run_report.h"
#include "harness/runner/slurm_run.h"
#include "core/trial_runner.h"

namespace harness {
namespace {

struct SlurmArgs {
  int64_t run_id = 0;
  std::vector<std::string> fail_on;
  double poll_s = 2.0;
};

int print_status(const SlurmArgs& args, const GlobalOptions& options) {
  db::Store store(options.db_path, db::Access::read);
  const nlohmann::json status = slurm::job_status(store, args.run_id);
  if (options.json) {
    print_json(std::cout, status);
    return kExitOk;
  }
  std::cout << fmt::format("run {}: Slurm job {}, run {}{}\nrun folder: {}\n", args.run_id,
                           status.at("job_id").get<std::string>(), status.at("status").get<std::string>(),
                           status.at("error").get<std::string>().empty() ? "" : " (" + status.at("error").get<std::string>() + ")",
                           status.at("run_dir").get<std::string>());
  Table table;
  table.headers = {"task", "trials", "state", "reason", "node", "restarts", "shards (attempt: merged?)"};
  table.right_align = {true, true, false, false, false, true};
  std::map<std::string, int> counts;
  for (const auto& task : status.at("tasks")) {
    std::string shards;
    for (const auto& shard : task.at("shards"))
      shards += fmt::format("{}{}: {}", shards.empty() ? "" : ", ", shard.at("attempt").get<int>(),
                            shard.at("merged").get<bool>() ? "merged" : "not merged");
    table.rows.push_back({std::to_string(task.at("task").get<int>()), std::to_string(task.at("trials").get<int>()),
                          task.at("state").get<std::string>(), task.at("reason").get<std::string>(),
                          task.at("node").get<std::string>(), std::to_string(task.at("restarts").get<int>()),
                          shards.empty() ? "-" : shards});
    ++counts[task.at("state").get<std::string>()];
  }
  print_table(std::cout, table);
  std::string line;
  for (const auto& [state, count] : counts) line += fmt::format("{}{} {}", line.empty() ? "" : " · ", count, state);
  std::cout << line << '\n';
  return kExitOk;
}

int collect(const SlurmArgs& args, const GlobalOptions& options) {
  db::Store store(options.db_path);
  install_interrupt_handlers();
  slurm::FollowOptions follow_options;
  follow_options.progress = !options.json;
  follow_options.poll_s = args.poll_s;
  const auto followed = slurm::follow(store, args.run_id, follow_options);
  if (followed.interrupted) {
    std::cerr << fmt::format("interrupted: the job keeps running; `harness slurm collect {}` again merges the rest\n",
                             args.run_id);
    return kExitInfra;
  }
  int exit_code = kExitOk;
  nlohmann::json all = nlohmann::json::array();
  for (size_t r = 0; r < followed.run_ids.size(); ++r) {
    const auto detail = store.get_run(followed.run_ids[r]);
    if (options.json) {
      all.push_back(run_detail_json(*detail));
    } else {
      if (r > 0) std::cout << '\n';
      print_run_summary(std::cout, *detail);
    }
    for (const auto& condition : args.fail_on) {
      if ((condition == "failed" && detail->run.status != "ok") ||
          (condition == "invalid" && (detail->run.verdict == "INVALID" || detail->run.verdict == "INCONCLUSIVE")) ||
          (condition.rfind("verdict=", 0) == 0 && detail->run.verdict == condition.substr(8)))
        exit_code = kExitFailOn;
    }
  }
  if (options.json) print_json(std::cout, all.size() == 1 ? all.front() : nlohmann::json{{"runs", all}});
  return exit_code;
}

int cancel(const SlurmArgs& args, const GlobalOptions& options) {
  db::Store store(options.db_path);
  slurm::cancel_job(store, args.run_id);
  std::cerr << "cancelled; finishing the run with the trials that ran\n";
  install_interrupt_handlers();
  slurm::FollowOptions follow_options;
  follow_options.requeue = false;
  follow_options.progress = !options.json;
  follow_options.poll_s = 1.0;
  const auto followed = slurm::follow(store, args.run_id, follow_options);
  if (options.json) {
    print_json(std::cout, slurm::job_status(store, args.run_id));
  } else {
    for (const int64_t id : followed.run_ids) print_run_summary(std::cout, *store.get_run(id));
  }
  return followed.finished ? kExitOk : kExitInfra;
}

}  // namespace

Action add_slurm_command(CLI::App& app, GlobalOptions& options) {
  auto args = std::make_shared<SlurmArgs>();
  auto* command = app.add_subcommand("slurm", "Follow, merge or cancel a run submitted with `harness run --slurm`");
  command->require_subcommand(1);
  auto* status = command->add_subcommand("status", "Each array task's Slurm state and which shards are merged");
  auto* collect_command =
      command->add_subcommand("collect", "Follow the job to its end: merge shards, requeue failed tasks, finish the run");
  auto* cancel_command = command->add_subcommand("cancel", "Cancel the job; finish the run with the trials that ran");
  for (CLI::App* sub : {status, collect_command, cancel_command}) {
    sub->add_option("run", args->run_id, "Run id (any run of the submission)")->required();
    add_global_options(*sub, options);
    sub->fallthrough();
  }
  collect_command->add_option("--fail-on", args->fail_on, "Exit 1 when: failed, invalid, verdict=NAME (as harness run)");
  collect_command->add_option("--poll", args->poll_s, "Seconds between looks at the queue (default 2)");
  add_global_options(*command, options);
  return [args, &options, status, collect_command, cancel_command] {
    if (status->parsed()) return print_status(*args, options);
    if (collect_command->parsed()) return collect(*args, options);
    if (cancel_command->parsed()) return cancel(*args, options);
    throw UsageError("harness slurm: expected status, collect or cancel");
  };
}

Action add_slurm_task_command(CLI::App& app, GlobalOptions& options) {
  auto manifest = std::make_shared<std::string>();
  auto* command = app.add_subcommand("__slurm-task", "(internal) run one Slurm array task's trials into its shard");
  command->group("");  // hidden
  command->add_option("--manifest", *manifest, "The run's manifest.json")->required();
  add_global_options(*command, options);
  return [manifest, &options] { return slurm::run_task(*manifest, options); };
}

}  // namespace harness
