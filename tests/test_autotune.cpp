// Autotuner: memory and disk hits, the fastest candidate wins, one tuning run under concurrent
// warm-up, each kind of cache damage ignored and re-tuned, two processes merging their writes.

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <limits>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "kernels/autotune.h"
#include "tests/catch.h"

using namespace harness::kernels;
namespace fs = std::filesystem;

namespace {

const std::vector<std::string> kCandidates = {"block_m=32 block_n=32", "block_m=64 block_n=64", "block_m=128 block_n=64"};

//! A fresh directory under the system temp dir, removed at scope exit.
struct TempDir {
  fs::path path;
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "harness_autotune_XXXXXX").string();
    REQUIRE(::mkdtemp(pattern.data()) != nullptr);
    path = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    fs::remove_all(path, ignored);
  }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

AutotuneOptions options_for(const std::string& cache_path, std::string device = "NVIDIA H200|sm90",
                            std::string build = "build-a") {
  AutotuneOptions options;
  options.cache_path = cache_path;
  options.device_identity = std::move(device);
  options.build_identity = std::move(build);
  return options;
}

AutotuneKey fwd_key(int64_t q_len = 2048) { return AutotuneKey::attention("attention_fwd", 128, "bf16", "dflash", q_len, 10240); }

//! Fake timings: each config's time from a table; counts calls per config (thread-safe).
struct FakeTimer {
  std::map<std::string, double> ms;
  std::chrono::milliseconds delay{0};
  std::mutex mutex;
  std::map<std::string, int> calls;

  explicit FakeTimer(std::map<std::string, double> table, std::chrono::milliseconds sleep = std::chrono::milliseconds(0))
      : ms(std::move(table)), delay(sleep) {}
  TimingFunction function() {
    return [this](const std::string& config) {
      std::this_thread::sleep_for(delay);  // widens the window in which concurrent callers overlap
      std::lock_guard lock(mutex);
      ++calls[config];
      return ms.at(config);
    };
  }
  int total_calls() {
    std::lock_guard lock(mutex);
    int total = 0;
    for (const auto& [config, count] : calls) total += count;
    return total;
  }
};

std::map<std::string, double> middle_fastest() {
  return {{kCandidates[0], 3.0}, {kCandidates[1], 1.0}, {kCandidates[2], 2.0}};
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

//! The message of the exception `action` throws ("(nothing thrown)" if none); portable across Catch2 v2/v3.
std::string thrown_message(const std::function<void()>& action) {
  try {
    action();
  } catch (const std::exception& error) {
    return error.what();
  }
  return "(nothing thrown)";
}

bool any_contains(const std::vector<std::string>& messages, const std::string& needle) {
  return std::any_of(messages.begin(), messages.end(), [&](const std::string& m) { return m.find(needle) != std::string::npos; });
}

}  // namespace

TEST_CASE("autotune key: canonical form and ceil-log2 buckets", "[autotune]") {
  CHECK(AutotuneKey::size_bucket(0) == 0);
  CHECK(AutotuneKey::size_bucket(1) == 0);
  CHECK(AutotuneKey::size_bucket(2) == 1);
  CHECK(AutotuneKey::size_bucket(3) == 2);
  CHECK(AutotuneKey::size_bucket(2048) == 11);
  CHECK(AutotuneKey::size_bucket(2049) == 12);
  CHECK(fwd_key(2048).canonical() == "attention_fwd/d128/bf16/dflash/q2^11/kv2^14");
  CHECK(fwd_key(1500).canonical() == fwd_key(2048).canonical());
  CHECK(fwd_key(4096).canonical() != fwd_key(2048).canonical());
}

TEST_CASE("autotune: fastest candidate wins, tuned once, then memory and disk hits", "[autotune]") {
  TempDir dir;
  const std::string cache = dir.file("sub/autotune.json");  // parent created on first write
  FakeTimer timer(middle_fastest());
  Autotuner tuner(options_for(cache));

  const Choice first = tuner.choose(fwd_key(), kCandidates, timer.function());
  CHECK(first.config == kCandidates[1]);
  CHECK(first.source == ChoiceSource::tuned);
  REQUIRE(first.timings.size() == 3);
  CHECK(first.timings[0].config == kCandidates[0]);
  CHECK(first.timings[0].time_ms == 3.0);
  CHECK(timer.total_calls() == 3);

  const Choice second = tuner.choose(fwd_key(), kCandidates, timer.function());
  CHECK(second.config == kCandidates[1]);
  CHECK(second.source == ChoiceSource::memory);
  CHECK(timer.total_calls() == 3);
  CHECK(std::string(choice_source_name(second.source)) == "memory");

  REQUIRE(fs::exists(cache));
  FakeTimer other_timer(middle_fastest());
  Autotuner fresh(options_for(cache));
  const Choice from_disk = fresh.choose(fwd_key(), kCandidates, other_timer.function());
  CHECK(from_disk.config == kCandidates[1]);
  CHECK(from_disk.source == ChoiceSource::disk);
  CHECK(from_disk.timings.size() == 3);
  CHECK(other_timer.total_calls() == 0);
  CHECK(fresh.diagnostics().empty());
  CHECK(fresh.choose(fwd_key(), kCandidates, other_timer.function()).source == ChoiceSource::memory);
}

TEST_CASE("autotune: ties keep the earlier candidate, non-finite timings cannot win", "[autotune]") {
  TempDir dir;
  Autotuner tuner(options_for(dir.file("a.json")));
  const double inf = std::numeric_limits<double>::infinity();
  FakeTimer tie({{kCandidates[0], 2.0}, {kCandidates[1], 2.0}, {kCandidates[2], 5.0}});
  CHECK(tuner.choose(fwd_key(1024), kCandidates, tie.function()).config == kCandidates[0]);
  FakeTimer unsupported({{kCandidates[0], inf}, {kCandidates[1], std::nan("")}, {kCandidates[2], 9.0}});
  CHECK(tuner.choose(fwd_key(512), kCandidates, unsupported.function()).config == kCandidates[2]);
  FakeTimer none({{kCandidates[0], inf}, {kCandidates[1], inf}, {kCandidates[2], -1.0}});
  const std::string none_ran = thrown_message([&] { tuner.choose(fwd_key(256), kCandidates, none.function()); });
  CHECK(none_ran.find("none of the 3 candidate configs could run") != std::string::npos);
  const std::string empty = thrown_message([&] { tuner.choose(fwd_key(256), {}, none.function()); });
  CHECK(empty.find("no candidate configs") != std::string::npos);
}

TEST_CASE("autotune: a throwing timing function reaches the caller and the key is tuned again next time", "[autotune]") {
  TempDir dir;
  Autotuner tuner(options_for(dir.file("a.json")));
  const TimingFunction failing = [](const std::string&) -> double { throw std::runtime_error("launch failed"); };
  CHECK(thrown_message([&] { tuner.choose(fwd_key(), kCandidates, failing); }) == "launch failed");
  FakeTimer timer(middle_fastest());
  const Choice retry = tuner.choose(fwd_key(), kCandidates, timer.function());
  CHECK(retry.source == ChoiceSource::tuned);
  CHECK(retry.config == kCandidates[1]);
}

TEST_CASE("autotune: a memory entry outside the current candidates is re-tuned", "[autotune]") {
  Autotuner tuner([] {
    AutotuneOptions options;
    options.use_disk_cache = false;
    return options;
  }());
  CHECK(tuner.cache_path().empty());
  FakeTimer timer(middle_fastest());
  REQUIRE(tuner.choose(fwd_key(), kCandidates, timer.function()).config == kCandidates[1]);
  const std::vector<std::string> narrowed = {kCandidates[0], kCandidates[2]};
  const Choice retuned = tuner.choose(fwd_key(), narrowed, timer.function());
  CHECK(retuned.source == ChoiceSource::tuned);
  CHECK(retuned.config == kCandidates[2]);
  CHECK(any_contains(tuner.diagnostics(), "not among the current candidates"));
}

TEST_CASE("autotune: 16 threads warming up one key tune it once and agree", "[autotune]") {
  TempDir dir;
  Autotuner tuner(options_for(dir.file("a.json")));
  FakeTimer timer(middle_fastest(), std::chrono::milliseconds(20));
  constexpr int kThreads = 16;
  std::vector<Choice> choices(kThreads);
  std::atomic<int> ready{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      ready.fetch_add(1);
      while (ready.load() < kThreads) std::this_thread::yield();  // start together
      choices[static_cast<std::size_t>(t)] = tuner.choose(fwd_key(), kCandidates, timer.function());
    });
  }
  for (auto& thread : threads) thread.join();
  for (const std::string& config : kCandidates) CHECK(timer.calls[config] == 1);
  int tuned = 0;
  for (const Choice& choice : choices) {
    CHECK(choice.config == kCandidates[1]);
    CHECK(choice.timings.size() == 3);
    tuned += choice.source == ChoiceSource::tuned ? 1 : 0;
  }
  CHECK(tuned == 1);
}

TEST_CASE("autotune: different keys tune in parallel", "[autotune]") {
  TempDir dir;
  Autotuner tuner(options_for(dir.file("a.json")));
  std::mutex mutex;
  std::condition_variable changed;
  bool second_started = false;
  bool first_saw_second = false;
  // Key A's timing waits (up to 5 s) for key B's timing to start: only possible if B is not
  // queued behind A.
  const TimingFunction wait_for_b = [&](const std::string&) {
    std::unique_lock lock(mutex);
    if (changed.wait_for(lock, std::chrono::seconds(5), [&] { return second_started; })) first_saw_second = true;
    return 1.0;
  };
  const TimingFunction signal_b = [&](const std::string&) {
    {
      std::lock_guard lock(mutex);
      second_started = true;
    }
    changed.notify_all();
    return 1.0;
  };
  std::thread first([&] { tuner.choose(fwd_key(1024), {kCandidates[0]}, wait_for_b); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // let A take its slot first
  std::thread second([&] { tuner.choose(fwd_key(4096), {kCandidates[0]}, signal_b); });
  first.join();
  second.join();
  CHECK(first_saw_second);
}

TEST_CASE("autotune: damaged or stale disk cache is ignored with a diagnostic and re-tuned", "[autotune]") {
  TempDir dir;
  const std::string cache = dir.file("autotune.json");
  {
    FakeTimer timer(middle_fastest());
    Autotuner writer(options_for(cache));
    REQUIRE(writer.choose(fwd_key(), kCandidates, timer.function()).source == ChoiceSource::tuned);
  }
  const std::string good = read_text(cache);
  REQUIRE(!good.empty());

  std::vector<std::string> candidates = kCandidates;
  AutotuneOptions options = options_for(cache);
  std::string expected;
  SECTION("truncated file") {
    write_text(cache, good.substr(0, good.size() / 2));
    expected = "not valid JSON";
  }
  SECTION("garbage") {
    write_text(cache, std::string("\x7f" "ELF\x01\x00 garbage", 12));
    expected = "not valid JSON";
  }
  SECTION("empty file") {
    write_text(cache, "");
    expected = "not valid JSON";
  }
  SECTION("JSON that is not a cache") {
    write_text(cache, "[1, 2, 3]");
    expected = "not a harness autotune cache";
  }
  SECTION("older format version") {
    auto document = nlohmann::json::parse(good);
    document["version"] = kAutotuneCacheVersion - 1;
    write_text(cache, document.dump());
    expected = "format version";
  }
  SECTION("newer format version") {
    auto document = nlohmann::json::parse(good);
    document["version"] = kAutotuneCacheVersion + 1;
    write_text(cache, document.dump());
    expected = "format version";
  }
  SECTION("malformed entry") {
    auto document = nlohmann::json::parse(good);
    document["entries"][0]["config"] = 64;
    write_text(cache, document.dump());
    expected = "entry 0 is malformed";
  }
  SECTION("entry for another device") {
    options = options_for(cache, "NVIDIA A100|sm80");
    expected = "is for device \"NVIDIA H200|sm90\"";
  }
  SECTION("entry from another build") {
    options = options_for(cache, "NVIDIA H200|sm90", "build-b");
    expected = "is from build \"build-a\"";
  }
  SECTION("config not among the current candidates") {
    candidates = {kCandidates[0], kCandidates[2]};
    expected = "not among the current candidates";
  }

  FakeTimer timer(middle_fastest());
  Autotuner tuner(options);
  const Choice choice = tuner.choose(fwd_key(), candidates, timer.function());
  CHECK(choice.source == ChoiceSource::tuned);
  CHECK(timer.total_calls() == static_cast<int>(candidates.size()));
  INFO("diagnostics: " << nlohmann::json(tuner.diagnostics()).dump());
  CHECK(any_contains(tuner.diagnostics(), expected));

  // The re-tuned result was written back as a valid file: a fresh tuner gets a disk hit.
  FakeTimer unused(middle_fastest());
  Autotuner fresh(options);
  const Choice again = fresh.choose(fwd_key(), candidates, unused.function());
  CHECK(again.source == ChoiceSource::disk);
  CHECK(again.config == choice.config);
  CHECK(unused.total_calls() == 0);
}

TEST_CASE("autotune: entries of other devices survive a write", "[autotune]") {
  TempDir dir;
  const std::string cache = dir.file("autotune.json");
  FakeTimer timer(middle_fastest());
  Autotuner h200(options_for(cache, "NVIDIA H200|sm90"));
  h200.choose(fwd_key(), kCandidates, timer.function());
  Autotuner a100(options_for(cache, "NVIDIA A100|sm80"));
  a100.choose(fwd_key(), kCandidates, timer.function());
  const auto document = nlohmann::json::parse(read_text(cache));
  CHECK(document["entries"].size() == 2);
  Autotuner h200_again(options_for(cache, "NVIDIA H200|sm90"));
  CHECK(h200_again.choose(fwd_key(), kCandidates, timer.function()).source == ChoiceSource::disk);
}

TEST_CASE("autotune: two processes writing different keys at once keep both", "[autotune]") {
  TempDir dir;
  const std::string cache = dir.file("autotune.json");
  constexpr int kKeysPerProcess = 20;
  // Each child tunes its own keys (q lengths 2^p for p in its range), writing after each one, so
  // the two processes' read-merge-write cycles interleave; without the lock entries get lost.
  auto run_child = [&](int first_bucket) {
    try {
      Autotuner tuner(options_for(cache));
      const TimingFunction quick = [](const std::string& config) { return config == kCandidates[2] ? 0.5 : 1.0; };
      for (int i = 0; i < kKeysPerProcess; ++i) {
        tuner.choose(fwd_key(int64_t{1} << (first_bucket + i)), kCandidates, quick);
        if (!tuner.diagnostics().empty()) ::_exit(2);
      }
      ::_exit(0);
    } catch (...) {
      ::_exit(1);
    }
  };
  std::cout.flush();  // the children must not inherit and print Catch's buffered output again
  std::fflush(nullptr);
  std::vector<pid_t> children;
  for (int first_bucket : {0, kKeysPerProcess}) {
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) run_child(first_bucket);
    children.push_back(pid);
  }
  for (pid_t pid : children) {
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
  }
  Autotuner reader(options_for(cache));
  const TimingFunction must_not_run = [](const std::string&) -> double { throw std::runtime_error("entry lost"); };
  for (int bucket = 0; bucket < 2 * kKeysPerProcess; ++bucket) {
    INFO("q bucket " << bucket);
    const Choice choice = reader.choose(fwd_key(int64_t{1} << bucket), kCandidates, must_not_run);
    CHECK(choice.source == ChoiceSource::disk);
    CHECK(choice.config == kCandidates[2]);
  }
  CHECK(nlohmann::json::parse(read_text(cache))["entries"].size() == 2 * kKeysPerProcess);
}
