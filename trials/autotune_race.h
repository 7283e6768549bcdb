#pragma once
// Kind autotune_race: T threads warm up one fresh autotuner at once, K rounds, and every call is
// checked against the known truth (no exception, the fastest config, the right output). The tuned
// kernel is a fake one on the CPU with a known cost per config and problem size, and a short
// sleep per launch that keeps the calls overlapping: tuning one key takes
// candidates x bench_launches x kernel_us (600 us by default), the window in which the threads'
// calls meet. Torch-free.
//
// Variants (impl):
//   legacy_shared_state  the shared-state model of Triton's autotuner (shared_state_autotuner.h),
//                        the positive control: it must reproduce the founding failure;
//   per_call_state       the project's autotuner, kernels::Autotuner (memory cache only);
//   sequential_warmup    the founding case's fix: the same shared-state model, but the threads
//                        warm it up one after another.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "experiments/kinds/trial.h"
#include "experiments/spec.h"

namespace harness::kinds {

//! One batch of race rounds.
struct RaceOptions {
  std::string impl;                          //!< legacy_shared_state, per_call_state, sequential_warmup
  int threads = 4;                           //!< callers per round
  int rounds = 200;                          //!< each with a fresh autotuner
  int64_t jitter_us = 300;                   //!< each thread starts after a uniform delay in [0, jitter_us]
  int64_t kernel_us = 50;                    //!< duration of one fake launch (a sleep)
  int bench_launches = 4;                    //!< launches per candidate while tuning (do_bench's repetitions)
  std::vector<int64_t> sizes = {256, 512, 8192};  //!< thread t works on sizes[t % sizes.size()]
  uint64_t seed = 0;                         //!< start jitter
};

//! What a batch of rounds found.
struct RaceOutcome {
  int64_t rounds = 0;
  int64_t failed_rounds = 0;  //!< rounds in which at least one call failed
  int64_t calls = 0;
  int64_t failed_calls = 0;   //!< exceptions + wrong_configs + wrong_results
  int64_t exceptions = 0;
  int64_t wrong_configs = 0;  //!< returned (and ran) a config other than the fastest for its size
  int64_t wrong_results = 0;  //!< the output differs from what the kernel computes alone
  std::map<std::string, int64_t> failure_messages;  //!< message -> calls that failed with it
  double elapsed_ms = 0.0;
};

//! Runs `options.rounds` rounds. Throws std::invalid_argument for an unknown impl, threads < 1, bench_launches < 1
//! or no sizes.
RaceOutcome run_race(const RaceOptions& options);

//! The fake kernel's candidate configs, in candidate order.
const std::vector<std::string>& race_candidate_configs();
//! The fake kernel's known cost of `config` at problem size `n`, in ms.
double race_kernel_cost_ms(const std::string& config, int64_t n);
//! The fastest candidate at size `n` (ties: the earlier one), i.e. what a correct autotuner picks.
std::string race_fastest_config(int64_t n);

//! A binomial proportion's confidence interval.
struct ProportionInterval {
  double low = 0.0;
  double high = 1.0;
};
//! Wilson score interval of `failures` out of `trials` (default z: 95 %); [0, 1] when trials is 0.
ProportionInterval wilson_interval(int64_t failures, int64_t trials, double z = 1.959963984540054);

//! Runs one trial of kind autotune_race: `spec.repeats` batches of params.trials rounds. Counts and
//! the failure rate with its Wilson 95 % interval are over all rounds; elapsed_ms is per batch.
TrialResult run_autotune_race(const spec::Spec& spec, const TrialRequest& context);

}  // namespace harness::kinds
