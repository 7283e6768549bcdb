// `harness triage` on the command line: a job's log matched to the shipped hypotheses (dry runs:
// the plan, nothing run or written), a failure no hypothesis covers written up, and bad input refused
// with exit 2 and nothing written. The capture -> triage -> writeup flow with a real captured step is
// tests/python/test_capture.py.

#include <cstdint>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "tests/catch.h"
#include "tests/cli_support.h"

using harness::test::has;
using harness::test::Sandbox;
using json = nlohmann::json;

namespace {

std::string write(const Sandbox& box, const std::string& name, const std::string& text) {
  const auto path = box.dir / name;
  std::ofstream(path, std::ios::binary) << text;
  return path.string();
}

// A torchrun worker's log: "[rankN]:" before every line of the traceback.
const char* kRaceLog = R"([rank1]: Traceback (most recent call last):
[rank1]:   File "/job/train.py", line 88, in <module>
[rank1]:     loss.backward()
[rank1]:   File "/venv/lib/python3.11/site-packages/triton/runtime/autotuner.py", line 170, in run
[rank1]:     full_nargs = {**self.nargs, **kwargs, **config.all_kwargs()}
[rank1]: TypeError: 'NoneType' object is not a mapping
E1204 12:00:00 torch/distributed/elastic/multiprocessing/api.py:874] failed (exitcode: 1) local_rank: 1
)";

const char* kOomLog = R"(step 0: loss 10.4
Traceback (most recent call last):
  File "/job/train.py", line 120, in <module>
    loss.backward()
  File "/venv/lib/python3.11/site-packages/torch/_tensor.py", line 631, in backward
    torch.autograd.backward(
  File "/venv/lib/python3.11/site-packages/torch/_higher_order_ops/flex_attention.py", line 900, in backward
    grad_query, grad_key, grad_value = flex_attention_backward(
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 15.09 GiB. GPU 0 has a total capacity of 79.10 GiB of which 3.21 GiB is free. Including non-PyTorch memory, this process has 84.07 GiB memory in use.
)";

const char* kCacheLog = R"(Traceback (most recent call last):
  File "/job/train.py", line 40, in <module>
    out = attention(q, k, v)
  File "/venv/lib/python3.11/site-packages/triton/runtime/cache.py", line 120, in get_group
    return json.loads(f.read())
json.decoder.JSONDecodeError: Expecting value: line 1 column 1 (char 0)
)";

json dry_run(const Sandbox& box, const std::string& log) {
  const auto result = box.harness("triage --log " + log + " --dry-run --json --db " + box.db());
  REQUIRE(result.exit_code == 0);
  CHECK_FALSE(harness::test::fs::exists(box.db()));  // a dry run writes nothing
  return json::parse(result.out);
}

std::vector<std::string> step_ids(const json& plan) {
  std::vector<std::string> ids;
  for (const auto& step : plan["steps"]) ids.push_back(step["id"].get<std::string>());
  return ids;
}

}  // namespace

TEST_CASE("triage --log: a Triton autotuner TypeError in a torchrun log is the warm-up race", "[triage]") {
  Sandbox box("harness-triage");
  const json plan = dry_run(box, write(box, "race.log", kRaceLog));
  CHECK(plan["failure"]["exception_type"] == "TypeError");
  CHECK(plan["failure"]["message"] == "'NoneType' object is not a mapping");
  CHECK(has(plan["failure"]["kind"].get<std::string>(), "autotuner"));
  CHECK(plan["hypotheses"] == json({"warmup_race", "triton_autotune_race_py"}));
  CHECK(step_ids(plan) == std::vector<std::string>{"warmup_race", "triton_autotune_race_py"});
  CHECK(plan["steps"][0]["args"] == json({"run", "warmup_race", "--device", "auto"}));
}

TEST_CASE("triage --log: an OOM in a backward through flex_attention plans bwd_fusion, anchor_scaling and explain-oom",
          "[triage]") {
  Sandbox box("harness-triage");
  const std::string log = write(box, "oom.log", kOomLog);
  const json plan = dry_run(box, log);
  CHECK(plan["failure"]["exception_type"] == "torch.OutOfMemoryError");
  CHECK(plan["failure"]["requested_bytes"].get<int64_t>() == 16202764124);  // 15.09 GiB, rounded to the byte
  CHECK(plan["failure"]["phase"] == "backward");
  CHECK(plan["hypotheses"] == json({"bwd_fusion", "anchor_scaling"}));
  CHECK(step_ids(plan) == std::vector<std::string>{"explain_oom", "explain_oom_solve", "bwd_fusion", "anchor_scaling"});
  CHECK(plan["steps"][0]["args"][1].get<std::string>().rfind("CUDA out of memory. Tried to allocate 15.09 GiB", 0) == 0);
  bool replay_note = false;
  for (const auto& note : plan["notes"]) replay_note = replay_note || has(note.get<std::string>(), "a log carries no step");
  CHECK(replay_note);
  // The text form names the commands with the db.
  const auto text = box.harness("triage --log " + log + " --dry-run --device cuda:1 --db " + box.db());
  REQUIRE(text.exit_code == 0);
  CHECK(has(text.out, "run bwd_fusion --device cuda:1"));
  CHECK(has(text.out, "--db " + box.db()));
}

TEST_CASE("triage --log: a JSON decode error reading a kernel cache is the cache hypothesis", "[triage]") {
  Sandbox box("harness-triage");
  const json plan = dry_run(box, write(box, "cache.log", kCacheLog));
  CHECK(plan["hypotheses"] == json({"cache_corruption"}));
}

TEST_CASE("triage --log: a failure no hypothesis covers is written up as such", "[triage]") {
  Sandbox box("harness-triage");
  const std::string log = write(box, "other.log", "Traceback (most recent call last):\n  File \"t.py\", line 1\nValueError: "
                                                  "shapes do not match\n");
  const auto result = box.harness("triage --log " + log + " --device cpu -o " + (box.dir / "triage.md").string() +
                                  " --db " + box.db());
  REQUIRE(result.exit_code == 0);
  const std::string writeup = harness::test::slurp(box.dir / "triage.md");
  CHECK(has(writeup, "# Triage: ValueError"));
  CHECK(has(writeup, "No shipped hypothesis matches this failure"));
  CHECK(has(writeup, "a log carries no step"));
}

TEST_CASE("triage refuses bad input with exit 2 and writes nothing", "[triage]") {
  Sandbox box("harness-triage");
  const std::string log = write(box, "oom.log", kOomLog);
  const auto expect_usage = [&](const std::string& args, const std::string& said) {
    const auto result = box.harness(args + " --db " + box.db());
    INFO(args << "\n" << result.err);
    CHECK(result.exit_code == 2);
    CHECK(has(result.err, said));
    CHECK_FALSE(harness::test::fs::exists(box.db()));
  };
  expect_usage("triage", "needs a CAPTURE file or --log FILE");
  expect_usage("triage " + log + " --log " + log, "needs a CAPTURE file or --log FILE");
  expect_usage("triage --log " + (box.dir / "missing.log").string(), "no such file");
  expect_usage("triage --log " + write(box, "quiet.log", "all good\nstep 3 done\n"), "shows no Python exception");
  expect_usage("triage " + log, "not a safetensors file");
  // A safetensors file without the capture header (a step saved with harness.save_step, say).
  const std::string header = R"({"__metadata__":{"meta":"{}"}})";
  std::string file(8, '\0');
  for (int i = 0; i < 8; ++i) file[static_cast<size_t>(i)] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  expect_usage("triage " + write(box, "step.safetensors", file + header), "not a capture file");
  expect_usage("triage --log " + log + " -o " + (box.dir / "no" / "triage.md").string(), "does not exist");
  expect_usage("triage --log " + log + " --device gpu7", "--device");
}
