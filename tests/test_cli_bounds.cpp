// Every bound on input is a bound on memory and time, through the binary: each hostile spec below
// runs under a virtual-memory limit (`ulimit -v`) and a time limit (`timeout -s KILL`) in the shell
// that starts the harness, and must end with exit 2 and a short message, never with the kernel's
// OOM killer, bad_alloc or the time limit. The memory limit is what the binary needs to start
// (LibTorch and CUDA's libraries mapped: about 2.8 GiB of address space on the CPU build, found
// once per test process) plus a headroom of one or two GiB; the time limits are generous for a
// loaded two-core machine. What they catch is growth with the input, which the unbounded versions
// showed in gigabytes and minutes.

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "tests/catch.h"
#include "tests/cli_support.h"
#include "tests/test_paths.h"

namespace {

namespace fs = std::filesystem;

using harness::test::has;
using harness::test::Result;
using harness::test::slurp;

const std::string kBwdFusion = std::string(HARNESS_EXPERIMENTS_DIR) + "/bwd_fusion.json";
const std::string kFaults = std::string(HARNESS_TEST_DATA_DIR) + "/cli/faults.json";
constexpr int kExitKilled = 128 + 9;

struct Box : harness::test::Sandbox {
  Box() : harness::test::Sandbox("harness-cli-bounds") {}
  std::string write(const std::string& name, const std::string& text) const {
    std::ofstream(dir / name, std::ios::binary) << text;
    return (dir / name).string();
  }
  // `args` under `ulimit -v` of what the binary needs to start plus `headroom_mib`, and a `seconds`
  // time limit (SIGKILL: exit 137).
  Result bounded(const std::string& args, int headroom_mib, int seconds) const {
    const int limit_kib = (loaded_mib() + headroom_mib) * 1024;
    return harness(args + " --db " + db(),
                   "ulimit -v " + std::to_string(limit_kib) + " && timeout -s KILL " + std::to_string(seconds));
  }
  // The address space `harness --version` needs, in steps of 256 MiB from 2 GiB (its libraries are
  // mapped whole, so this is most of what any command needs before it reads its input).
  int loaded_mib() const {
    static const int needed = [this] {
      for (int mib = 2048; mib <= 16384; mib += 256) {
        const Result version = harness("--version", "ulimit -v " + std::to_string(mib * 1024) + " &&");
        if (version.exit_code == 0) return mib;
      }
      FAIL("harness --version does not start under a 16 GiB address-space limit");
      return 0;
    }();
    return needed;
  }
};

// A small attention_step spec whose trials take a second or two on the CPU.
std::string small_spec_text() {
  auto spec = nlohmann::ordered_json::parse(slurp(kFaults));
  spec["variants"] = {{"fused", {{"impl", "fused"}}}};
  return spec.dump();
}

}  // namespace

TEST_CASE("dims beyond what the model and kernels can mean are refused in bounded memory and time",
          "[cli][bounds]") {
  Box box;
  // 4 194 304 layers once grew the parent's memory model to 23.9 GB; 2^30 ended in bad_alloc.
  for (const std::string& set : {std::string("dims.layers=4194304"), std::string("dims.layers=1073741824"),
                                 std::string("dims.heads=1048576"), std::string("dims.context=1073741824"),
                                 std::string("dims.batch=1000000"), std::string("dims.anchors=100000000")}) {
    const Result run = box.bounded("run " + kBwdFusion + " --device cpu --set " + set, 1024, 120);
    INFO(set << ": " << run.err);
    CHECK(run.exit_code == 2);
    CHECK(has(run.err, set.substr(0, set.find('='))));
    CHECK(run.err.size() < 4000);
  }
  CHECK_FALSE(fs::exists(box.db()));
}

TEST_CASE("the parent's memory model at the largest dims and counts fits in bounded memory and time",
          "[cli][bounds]") {
  Box box;
  // explain-oom replays the step's allocations over every warm-up and repeat under the message's
  // cap when a tensor has the size asked for (bwd_fusion's dense scores: 32 heads × 2048 × 10240 ×
  // 4 B = 2.50 GiB): layers, warm-ups and repeats at their largest must not multiply into the
  // parent's memory.
  const std::string message = "'CUDA out of memory. Tried to allocate 2.50 GiB. GPU 0 has a total capacity of 79.11 GiB'";
  const Result explain = box.bounded("explain-oom " + message + " --spec " + kBwdFusion +
                                         " --set dims.layers=1024 --set repeats=1000000 --set warmup=1000000 --json",
                                     1024, 120);
  INFO(explain.err);
  REQUIRE(explain.exit_code == 0);
  CHECK(has(explain.out, "scores"));
}

TEST_CASE("a verdict condition of 100 000 empty comparisons is exit 2 in bounded memory", "[cli][bounds]") {
  Box box;
  auto spec = nlohmann::ordered_json::parse(small_spec_text());
  std::string condition;
  for (int i = 0; i < 100000; ++i) condition += "&&";
  spec["verdict"] = {{{"if", condition}, {"then", "X"}}, {{"else", "Y"}}};
  const Result run = box.bounded("run " + box.write("and.json", spec.dump()) + " --device cpu", 1024, 120);
  INFO(run.err.substr(0, 2000));
  CHECK(run.exit_code == 2);
  CHECK(has(run.err, "verdict.0.if"));
  CHECK(run.err.size() < 20000);
}

TEST_CASE("200 000 keys in one object are refused in linear time", "[cli][bounds]") {
  Box box;
  std::string members;
  for (int i = 0; i < 200000; ++i) members += (i ? ",\"k" : "\"k") + std::to_string(i) + "\":1";
  const std::string text = small_spec_text();
  // In a kind's free-form params, and as unknown top-level fields.
  const std::string in_params = box.write("params.json", text.substr(0, text.size() - 1) + ",\"params\":{" + members + "}}");
  const std::string top_level = box.write("top.json", text.substr(0, text.size() - 1) + "," + members + "}");
  for (const std::string& path : {in_params, top_level}) {
    const Result run = box.bounded("run " + path + " --device cpu", 1024, 15);
    INFO(path << ": " << run.err.substr(0, 2000));
    CHECK(run.exit_code == 2);
    CHECK(has(run.err, "members"));
  }
}

TEST_CASE("a 15 MiB spec of many large objects is read in bounded time", "[cli][bounds]") {
  Box box;
  // 400 unknown fields, each an object of 4 000 members: every object within the cap, the text
  // within the size limit; parsing must not be quadratic in the members of each object.
  std::string text = small_spec_text();
  text.pop_back();
  for (int object = 0; object < 400; ++object) {
    text += ",\"x" + std::to_string(object) + "\":{";
    for (int i = 0; i < 4000; ++i) text += (i ? ",\"k" : "\"k") + std::to_string(i) + "\":1";
    text += "}";
  }
  text += "}";
  REQUIRE(text.size() < (15u << 20));
  const Result run = box.bounded("run " + box.write("wide.json", text) + " --device cpu", 2048, 60);
  INFO(run.err.substr(0, 2000));
  CHECK(run.exit_code == 2);
  CHECK(has(run.err, "unknown field"));
}

TEST_CASE("the spec size limit is checked before reading: a 6 GiB file, a FIFO and /dev/zero", "[cli][bounds]") {
  Box box;
  const fs::path huge = box.dir / "huge.json";
  { std::ofstream(huge) << "{"; }
  fs::resize_file(huge, 6ull << 30);  // sparse: no disk used
  const Result big = box.bounded("run " + huge.string() + " --device cpu", 1024, 60);
  INFO(big.err);
  CHECK(big.exit_code == 2);
  CHECK(has(big.err, "6442450944 bytes"));

  // A folder of specs holding a FIFO nobody writes and a link to /dev/zero: --all and list end.
  const fs::path specs = box.dir / "specs";
  fs::create_directories(specs);
  REQUIRE(mkfifo((specs / "fifo.json").c_str(), 0600) == 0);
  fs::create_symlink("/dev/zero", specs / "zero.json");
  for (const std::string& command : {std::string("run --all --device cpu"), std::string("list")}) {
    const Result result = box.bounded(command + " --experiments-dir " + specs.string(), 1024, 60);
    INFO(command << ": " << result.err);
    CHECK(result.exit_code != kExitKilled);
    CHECK(has(result.err + result.out, "fifo.json"));
    CHECK(has(result.err + result.out, "not a regular file"));
  }
  const Result run = box.bounded("run " + (specs / "fifo.json").string() + " --device cpu", 1024, 60);
  CHECK(run.exit_code == 2);
}

TEST_CASE("a run reads its spec file once", "[cli][bounds]") {
  Box box;
  const std::string spec = box.write("once.json", slurp(kBwdFusion));
  const fs::path trace = box.dir / "trace.txt";
  const Result dry = box.harness("run " + spec + " --device cpu --slurm-dry-run --db " + box.db(),
                                 "strace -f -e trace=open,openat -o " + trace.string());
  if (dry.exit_code != 0 && !fs::exists(trace)) {
    WARN("skipped: strace cannot trace here (" << dry.err.substr(0, 200) << ")");
    return;
  }
  INFO(dry.err);
  REQUIRE(dry.exit_code == 0);
  const std::string calls = slurp(trace);
  size_t opens = 0;
  for (size_t at = calls.find(spec); at != std::string::npos; at = calls.find(spec, at + 1)) ++opens;
  CHECK(opens == 1);
}

TEST_CASE("run --device cpu applies the cpu profile before --set, then validates", "[cli][bounds]") {
  Box box;
  // bwd_fusion: 8 KV heads; its cpu profile has 2, so 6 heads fit only with the profile applied.
  const Result dry = box.harness("run " + kBwdFusion + " --device cpu --set dims.heads=6 --slurm-dry-run --db " + box.db());
  INFO(dry.err);
  CHECK(dry.exit_code == 0);
  CHECK_FALSE(has(dry.err, "multiple of kv_heads (8)"));
  const Result run = box.harness("run " + kBwdFusion + " --device cpu --set dims.heads=6 --set repeats=1 --set warmup=0 "
                                 "--set 'variants={\"fused\":{\"impl\":\"fused\"}}' --json --db " + box.db());
  INFO(run.err);
  REQUIRE(run.exit_code == 0);
  CHECK(nlohmann::json::parse(run.out)["spec"]["dims"]["heads"] == 6);
  CHECK(nlohmann::json::parse(run.out)["spec"]["dims"]["kv_heads"] == 2);
  // An explicit profile behaves the same, and a device that is not the CPU gets no profile.
  CHECK(box.harness("run " + kBwdFusion + " --profile cpu --set dims.heads=6 --slurm-dry-run --db " + box.db()).exit_code == 0);
  const Result cuda = box.harness("run " + kBwdFusion + " --device cuda --set dims.heads=6 --slurm-dry-run --db " + box.db());
  CHECK(cuda.exit_code == 2);
  CHECK(has(cuda.err, "multiple of kv_heads (8)"));
}

TEST_CASE("absurd timeouts are refused, not turned into a negative deadline", "[cli][bounds]") {
  Box box;
  const std::string spec = box.write("small.json", small_spec_text());
  for (const std::string& timeout : {std::string("1e19"), std::string("9.3e18"), std::string("1e300"),
                                     std::string("604801")}) {
    const Result run = box.harness("run " + spec + " --device cpu --set timeout_s=" + timeout + " --db " + box.db());
    INFO(timeout << ": " << run.err);
    CHECK(run.exit_code == 2);
    CHECK(has(run.err, "timeout_s"));
  }
  CHECK_FALSE(fs::exists(box.db()));
}

TEST_CASE("a NUL byte in spec text is an error naming its offset", "[cli][bounds]") {
  Box box;
  const std::string text = small_spec_text();
  const std::string path = box.write("nul.json", text + std::string(1, '\0') + "garbage");
  const Result run = box.harness("run " + path + " --device cpu --db " + box.db());
  INFO(run.err);
  CHECK(run.exit_code == 2);
  CHECK(has(run.err, "NUL"));
  CHECK(has(run.err, "offset " + std::to_string(text.size())));
  CHECK_FALSE(fs::exists(box.db()));
}
