// The Slurm command layer without a cluster: squeue's output as this Slurm (22.05) prints it, and
// the batch script `harness run --slurm` submits.

#include <sstream>

#include "core/errors.h"
#include "harness/runner/slurm.h"
#include "tests/catch.h"

namespace {

using harness::slurm::parse_task_states;

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("squeue lines become one state per array task, pending ranges expanded", "[slurm_unit]") {
  // Lines as `squeue -r -t all -h -O ArrayTaskID:|,State:|,Reason:|,NodeList:|,RestartCnt:|` printed
  // them on the local cluster: split tasks, a range not yet split (with a %N limit), a cancelled task.
  const auto states = parse_task_states(
      "0|RUNNING|None|vm|0|\n"
      "2-4%2|PENDING|JobArrayTaskLimit||0|\n"
      "1|CANCELLED by 0|None|vm|1|\n");
  REQUIRE(states.size() == 5);
  CHECK(states[0].task == 0);
  CHECK(states[0].state == "RUNNING");
  CHECK(states[0].node == "vm");
  CHECK(states[1].task == 2);
  CHECK(states[3].task == 4);
  CHECK(states[3].state == "PENDING");
  CHECK(states[3].reason == "JobArrayTaskLimit");
  CHECK(states[3].node.empty());
  CHECK(states[4].task == 1);
  CHECK(states[4].state == "CANCELLED");
  CHECK(states[4].restarts == 1);
  CHECK(parse_task_states("").empty());
  CHECK_THROWS_AS(parse_task_states("garbage\n"), harness::InfraError);
  CHECK_THROWS_AS(parse_task_states("x|RUNNING|None|vm|0|\n"), harness::InfraError);
}

TEST_CASE("finished states are the ones Slurm will not run again by itself", "[slurm_unit]") {
  using harness::slurm::is_finished;
  for (const char* state : {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY"})
    CHECK(is_finished(state));
  for (const char* state : {"PENDING", "RUNNING", "COMPLETING", "CONFIGURING", "REQUEUED", "SUSPENDED"})
    CHECK_FALSE(is_finished(state));
}

TEST_CASE("the batch script asks for every option, each commented, and quotes paths", "[slurm_unit]") {
  harness::slurm::BatchScript script;
  script.request.job_name = "harness-anchor_scaling";
  script.request.partition = "gpu";
  script.request.gpus_per_task = 1;
  script.request.mem = "32G";
  script.request.array_parallel = 8;
  script.request.extra_args = {"--qos=high"};
  script.tasks = 12;
  script.log_dir = "/shared/my runs/logs";
  script.harness = "/shared/bin/harness";
  script.manifest = "/shared/my runs/manifest.json";
  script.description = "harness run anchor_scaling --slurm";
  script.trial_lines = {"task 0: anchor_scaling anchors=8 fused"};
  const std::string text = harness::slurm::batch_script(script);
  CHECK(text.rfind("#!/bin/bash\n", 0) == 0);
  CHECK(contains(text, "#SBATCH --array=0-11%8\n"));
  CHECK(contains(text, "#SBATCH --partition=gpu\n"));
  CHECK(contains(text, "#SBATCH --gpus-per-task=1\n"));
  CHECK(contains(text, "#SBATCH --mem=32G\n"));
  CHECK(contains(text, "#SBATCH --qos=high\n"));
  CHECK(contains(text, "#SBATCH --requeue\n"));
  CHECK(contains(text, "#SBATCH --output=\"/shared/my runs/logs/slurm-%A_%a.out\"\n"));
  CHECK(contains(text, "#   task 0: anchor_scaling anchors=8 fused\n"));
  CHECK(contains(text, "exec /shared/bin/harness __slurm-task --manifest '/shared/my runs/manifest.json'\n"));
  CHECK_FALSE(contains(text, "--account"));  // not asked: the cluster's default
  // Every #SBATCH line follows a comment saying what it is for; sbatch stops reading options at
  // the first command, so all of them come before it.
  size_t at = 0;
  while ((at = text.find("\n#SBATCH", at)) != std::string::npos) {
    const size_t line_start = text.rfind('\n', at - 1);
    CHECK(text.compare(line_start + 1, 2, "# ") == 0);
    CHECK(at < text.find("\nexec "));
    ++at;
  }
}

TEST_CASE("no user text in the batch script becomes a line of its own", "[slurm_unit]") {
  harness::slurm::BatchScript script;
  script.request.job_name = "harness-x";
  script.tasks = 1;
  script.log_dir = "/shared/runs/logs";
  script.harness = "/shared/bin/harness";
  script.manifest = "/shared/runs/manifest.json";
  // A db path with a newline, written into the comments.
  script.description = "harness run x --slurm, db /tmp/a\ntouch /tmp/pwned\r\n#SBATCH --wrap=evil\n.db";
  script.trial_lines = {"task 0: x dims.anchors=\"a\nrm -rf ~\" fused"};
  const std::string text = harness::slurm::batch_script(script);
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    INFO(line);
    CHECK(line.find('\r') == std::string::npos);
    CHECK((line.empty() || line[0] == '#' || line == "set -eu" || line.rfind("exec ", 0) == 0));
    CHECK(line.rfind("#SBATCH --wrap", 0) != 0);
  }
  CHECK(contains(text, "touch /tmp/pwned"));  // kept readable inside its comment
  // A value that must go on an #SBATCH line or into the command is refused when it cannot be quoted there.
  for (const std::string& bad : {std::string("/shared/a\nb/logs"), std::string("/shared/a\"b/logs"), std::string("/shared/a\0b", 10)}) {
    script.log_dir = bad;
    CHECK_THROWS_AS(harness::slurm::batch_script(script), harness::UsageError);
  }
  script.log_dir = "/shared/runs/logs";
  script.request.partition = "gpu\n#SBATCH --wrap=evil";
  CHECK_THROWS_AS(harness::slurm::batch_script(script), harness::UsageError);
}
