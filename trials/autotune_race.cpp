// Kind autotune_race: rounds of T threads warming up one fresh autotuner at once, each call checked
// against the fake kernel's known fastest config and output.

#include "trials/autotune_race.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <random>
#include <stdexcept>
#include <thread>
#include <utility>

#include "trials/shared_state_autotuner.h"
#include "kernels/autotune.h"

namespace harness::kinds {
namespace {

using fault_model::KernelArgs;
using fault_model::KernelFunction;
using fault_model::SharedStateAutotuner;

//! The fake kernel's tiles run in waves over this many parallel workers.
constexpr int64_t kWorkers = 8;
//! Fixed cost of one wave besides its tile, in cost units (1 unit = 1 us).
constexpr int64_t kWaveOverhead = 16;

//! Candidate configs and the tile size each one means.
struct FakeConfig {
  const char* name;
  int64_t block;
};
constexpr std::array<FakeConfig, 3> kFakeConfigs = {{{"block=32", 32}, {"block=64", 64}, {"block=128", 128}}};

//! The real autotuner's key of the fake kernel at size n (sizes in distinct power-of-two buckets
//! get distinct keys; the spec validator insists on that).
kernels::AutotuneKey race_key(int64_t n) {
  return kernels::AutotuneKey{"race_fake_kernel", 0, "fp32", "none", kernels::AutotuneKey::size_bucket(n), 0};
}

//! The outcome of one thread's call.
struct CallResult {
  std::optional<std::string> config;  //!< set when the call returned
  std::string error;                  //!< what it threw otherwise
};

//! Runs one round: fresh autotuner, T threads released together, each after its jitter.
void run_round(const RaceOptions& options, std::mt19937_64& rng, RaceOutcome& outcome) {
  const int threads = options.threads;
  std::vector<std::chrono::nanoseconds> jitter;
  for (int t = 0; t < threads; ++t) {
    const uint64_t range_ns = static_cast<uint64_t>(options.jitter_us) * 1000 + 1;
    jitter.emplace_back(static_cast<int64_t>(rng() % range_ns));  // platform-independent, unlike the distributions
  }
  // Outputs start zeroed, as a caller allocates them (torch.zeros); deque: atomics do not move.
  std::deque<std::atomic<int64_t>> outputs(static_cast<size_t>(threads));
  std::vector<KernelArgs> args;
  for (int t = 0; t < threads; ++t) {
    args.push_back(KernelArgs{options.sizes[static_cast<size_t>(t) % options.sizes.size()], &outputs[static_cast<size_t>(t)]});
  }
  const std::chrono::microseconds launch_time(options.kernel_us);
  const KernelFunction kernel = [launch_time](const KernelArgs& call, const std::string& config) {
    std::this_thread::sleep_for(launch_time);
    call.out->fetch_add(call.n);
    return race_kernel_cost_ms(config, call.n);
  };

  const bool per_call = options.impl == "per_call_state";
  const bool sequential = options.impl == "sequential_warmup";
  std::optional<SharedStateAutotuner> shared;
  std::optional<kernels::Autotuner> tuner;
  if (per_call) {
    kernels::AutotuneOptions tune_options;
    tune_options.use_disk_cache = false;  // fresh per round: a disk cache would turn later rounds into hits
    tuner.emplace(tune_options);
  } else {
    shared.emplace(race_candidate_configs(), kernel, options.bench_launches);
  }

  const auto call = [&](int t) -> std::string {
    const KernelArgs& mine = args[static_cast<size_t>(t)];
    if (!per_call) return shared->run(mine);
    // Per-call state: the timing function carries this call's arguments; its pre-hook resets this
    // call's output before each timed launch, and once more before the real launch.
    const kernels::TimingFunction time_candidate = [&](const std::string& config) {
      double ms = 0.0;
      for (int launch = 0; launch < options.bench_launches; ++launch) {
        mine.out->store(0);
        ms = kernel(mine, config);
      }
      return ms;
    };
    const kernels::Choice choice = tuner->choose(race_key(mine.n), race_candidate_configs(), time_candidate);
    mine.out->store(0);
    kernel(mine, choice.config);
    return choice.config;
  };

  std::vector<CallResult> results(static_cast<size_t>(threads));
  std::atomic<int> ready{0};
  std::mutex turn_mutex;
  std::condition_variable turn_changed;
  int turn = 0;  // sequential_warmup: the thread whose call may run
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      ready.fetch_add(1);
      while (ready.load() < threads) std::this_thread::yield();  // release all threads together
      std::this_thread::sleep_for(jitter[static_cast<size_t>(t)]);
      if (sequential) {
        std::unique_lock lock(turn_mutex);
        turn_changed.wait(lock, [&] { return turn == t; });
      }
      CallResult& result = results[static_cast<size_t>(t)];
      try {
        result.config = call(t);
      } catch (const std::exception& error) {
        result.error = error.what();
      } catch (...) {
        result.error = "an exception that is not a std::exception";
      }
      if (sequential) {
        {
          std::lock_guard lock(turn_mutex);
          ++turn;
        }
        turn_changed.notify_all();
      }
    });
  }
  for (std::thread& worker : workers) worker.join();

  bool round_failed = false;
  for (int t = 0; t < threads; ++t) {
    const CallResult& result = results[static_cast<size_t>(t)];
    const int64_t n = args[static_cast<size_t>(t)].n;
    const int64_t output = outputs[static_cast<size_t>(t)].load();
    const std::string fastest = race_fastest_config(n);
    std::string failure;
    if (!result.config) {
      ++outcome.exceptions;
      failure = result.error;
    } else if (*result.config != fastest) {
      ++outcome.wrong_configs;
      failure = "wrong config: size " + std::to_string(n) + " ran with " + *result.config + ", the fastest is " + fastest;
    } else if (output != n) {
      ++outcome.wrong_results;
      failure = "wrong result: size " + std::to_string(n) + " produced " + std::to_string(output) + ", expected " +
                std::to_string(n);
    }
    ++outcome.calls;
    if (!failure.empty()) {
      ++outcome.failed_calls;
      ++outcome.failure_messages[failure];
      round_failed = true;
    }
  }
  ++outcome.rounds;
  if (round_failed) ++outcome.failed_rounds;
}

//! The impl of the trial's variant; throws std::invalid_argument when the variant is not in the spec.
std::string variant_impl(const spec::Spec& spec, const std::string& variant) {
  for (const spec::Variant& candidate : spec.variants) {
    if (candidate.name == variant) return candidate.impl;
  }
  throw std::invalid_argument("autotune_race: variant \"" + variant + "\" is not in spec " + spec.name);
}

}  // namespace

const std::vector<std::string>& race_candidate_configs() {
  static const std::vector<std::string> configs = [] {
    std::vector<std::string> names;
    for (const FakeConfig& config : kFakeConfigs) names.emplace_back(config.name);
    return names;
  }();
  return configs;
}

double race_kernel_cost_ms(const std::string& config, int64_t n) {
  // ceil(n / block) tiles run in waves over kWorkers workers; a wave costs its tile plus a fixed
  // overhead. Small problems prefer small tiles (no idle workers), large ones big tiles (fewer
  // waves): at 256 block=32 wins, at 512 block=64, at 8192 block=128.
  for (const FakeConfig& candidate : kFakeConfigs) {
    if (config != candidate.name) continue;
    const int64_t tiles = (n + candidate.block - 1) / candidate.block;
    const int64_t waves = (tiles + kWorkers - 1) / kWorkers;
    return static_cast<double>(waves * (candidate.block + kWaveOverhead)) * 1e-3;
  }
  throw std::invalid_argument("autotune_race: the fake kernel has no config \"" + config + "\"");
}

std::string race_fastest_config(int64_t n) {
  std::string fastest;
  double fastest_ms = 0.0;
  for (const std::string& config : race_candidate_configs()) {
    const double ms = race_kernel_cost_ms(config, n);
    if (fastest.empty() || ms < fastest_ms) {
      fastest = config;
      fastest_ms = ms;
    }
  }
  return fastest;
}

ProportionInterval wilson_interval(int64_t failures, int64_t trials, double z) {
  if (trials <= 0) return {};
  const double n = static_cast<double>(trials);
  const double p = static_cast<double>(failures) / n;
  const double z2 = z * z;
  const double denominator = 1.0 + z2 / n;
  const double center = (p + z2 / (2.0 * n)) / denominator;
  const double half_width = z * std::sqrt(p * (1.0 - p) / n + z2 / (4.0 * n * n)) / denominator;
  // At p = 0 (p = 1) the bound is exactly 0 (1); the formula's rounding would leave a few ulps.
  return {failures == 0 ? 0.0 : std::max(0.0, center - half_width), failures == trials ? 1.0 : std::min(1.0, center + half_width)};
}

RaceOutcome run_race(const RaceOptions& options) {
  if (options.impl != "legacy_shared_state" && options.impl != "per_call_state" && options.impl != "sequential_warmup") {
    throw std::invalid_argument("autotune_race: unknown impl \"" + options.impl +
                                "\" (legacy_shared_state, per_call_state, sequential_warmup)");
  }
  if (options.threads < 1) throw std::invalid_argument("autotune_race: threads must be at least 1");
  if (options.bench_launches < 1) throw std::invalid_argument("autotune_race: bench_launches must be at least 1");
  if (options.sizes.empty()) throw std::invalid_argument("autotune_race: no problem sizes");
  RaceOutcome outcome;
  std::mt19937_64 rng(options.seed);
  const auto start = std::chrono::steady_clock::now();
  for (int round = 0; round < options.rounds; ++round) run_round(options, rng, outcome);
  outcome.elapsed_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  return outcome;
}

TrialResult run_autotune_race(const spec::Spec& spec, const TrialRequest& context) {
  TrialResult result;
  const nlohmann::json& params = spec.params;
  RaceOptions options;
  options.impl = variant_impl(spec, context.variant);
  std::vector<std::string> thread_devices;
  const nlohmann::json threads = params.value("threads", nlohmann::json(options.threads));
  if (threads.is_string()) {  // "per_device": one thread per device of --devices
    if (context.devices.size() < 2) {
      result.status = "error";
      result.error = "autotune_race: params.threads \"per_device\" needs at least 2 devices in --devices, got " +
                     std::to_string(context.devices.size()) + " (a race needs two callers)";
      return result;
    }
    options.threads = static_cast<int>(context.devices.size());
    thread_devices = context.devices;
  } else {
    options.threads = threads.get<int>();
    thread_devices.assign(static_cast<size_t>(options.threads), context.device);
  }
  options.rounds = params.value("trials", options.rounds);
  options.jitter_us = params.value("jitter_us", options.jitter_us);
  options.kernel_us = params.value("kernel_us", options.kernel_us);
  options.bench_launches = params.value("bench_launches", options.bench_launches);
  options.sizes = params.value("sizes", options.sizes);

  RaceOutcome total;
  for (int repeat = 0; repeat < spec.repeats; ++repeat) {
    options.seed = spec.seed + static_cast<uint64_t>(repeat);
    const RaceOutcome batch = run_race(options);
    result.metrics.push_back({"elapsed_ms", batch.elapsed_ms, "ms", repeat});
    total.rounds += batch.rounds;
    total.failed_rounds += batch.failed_rounds;
    total.calls += batch.calls;
    total.failed_calls += batch.failed_calls;
    total.exceptions += batch.exceptions;
    total.wrong_configs += batch.wrong_configs;
    total.wrong_results += batch.wrong_results;
    for (const auto& [message, count] : batch.failure_messages) total.failure_messages[message] += count;
  }

  const ProportionInterval interval = wilson_interval(total.failed_rounds, total.rounds);
  const double rate = total.rounds > 0 ? static_cast<double>(total.failed_rounds) / static_cast<double>(total.rounds) : 0.0;
  for (const auto& [name, value] : std::vector<std::pair<std::string, double>>{
           {"threads", options.threads},
           {"rounds", static_cast<double>(total.rounds)},
           {"failures", static_cast<double>(total.failed_rounds)},
           {"failure_rate", rate},
           {"failure_rate_ci_low", interval.low},
           {"failure_rate_ci_high", interval.high},
           {"calls", static_cast<double>(total.calls)},
           {"failed_calls", static_cast<double>(total.failed_calls)},
           {"exceptions", static_cast<double>(total.exceptions)},
           {"wrong_configs", static_cast<double>(total.wrong_configs)},
           {"wrong_results", static_cast<double>(total.wrong_results)}}) {
    result.metrics.push_back({name, value, "", -1});
  }

  // Evidence: what failed and how often (most frequent first), and what was run.
  std::vector<std::pair<std::string, int64_t>> messages(total.failure_messages.begin(), total.failure_messages.end());
  std::stable_sort(messages.begin(), messages.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  nlohmann::json failure_list = nlohmann::json::array();
  for (const auto& [message, count] : messages) failure_list.push_back({{"message", message}, {"count", count}});
  nlohmann::json fastest = nlohmann::json::object();
  std::vector<int64_t> thread_sizes;
  for (int t = 0; t < options.threads; ++t) thread_sizes.push_back(options.sizes[static_cast<size_t>(t) % options.sizes.size()]);
  for (int64_t n : options.sizes) fastest[std::to_string(n)] = race_fastest_config(n);
  result.details = {{"impl", options.impl},
                    {"threads", options.threads},
                    {"thread_devices", thread_devices},
                    {"thread_sizes", thread_sizes},
                    {"fastest_configs", fastest},
                    {"rounds_per_batch", options.rounds},
                    {"batches", spec.repeats},
                    {"jitter_us", options.jitter_us},
                    {"kernel_us", options.kernel_us},
                    {"bench_launches", options.bench_launches},
                    {"failure_messages", failure_list}};
  return result;
}

}  // namespace harness::kinds
