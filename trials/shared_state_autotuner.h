#pragma once
// FAULT MODEL: the positive control of the autotune_race experiment. Never used to pick real
// kernel configs (that is kernels::Autotuner, which keeps all per-call state in the call).
//
// A C++ model of the shared-state autotuner of the founding case, Triton's Autotuner.run (3.x):
//   self.nargs = dict(zip(self.arg_names, args))      # the call's arguments, on the shared object
//   key = ... {**self.nargs, **kwargs} ...             # read back to build the cache key
//   if key not in self.cache:
//       timings = {c: self._bench(*args, config=c) for c in configs}
//           # _bench: full_nargs = {**self.nargs, **current}, then do_bench launches the kernel
//           # many times, each after self.pre_hook(full_nargs) (reset_to_zero of the output)
//       self.cache[key] = min(timings, key=timings.get)
//       full_nargs = {**self.nargs, ...}; self.pre_hook(full_nargs, reset_only=True)
//   ret = self.fn.run(*args, **config.all_kwargs())
//   self.nargs = None
// Two threads warming one such object up at once read each other's arguments, or None once the
// other call has returned: `{**None}` raises "TypeError: 'NoneType' object is not a mapping" (the
// founding crash); a pre-hook given another call's arguments resets that call's output instead of
// its own (wrong results); a key built from another call's arguments files a config under the
// wrong key (wrong config).
//
// The model races logically but has no C++ data race: `nargs` is an atomic pointer and the cache
// a mutex-guarded map (Python's dict operations are atomic under the GIL), so the program is
// well-defined and ThreadSanitizer can run the whole experiment.

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace harness::kinds::fault_model {

//! The arguments of one call of the tuned kernel: what Triton keeps in `self.nargs`.
struct KernelArgs {
  int64_t n = 0;                        //!< problem size; the autotune key
  std::atomic<int64_t>* out = nullptr;  //!< output the kernel accumulates into (split-K style), zeroed by the pre-hook
};

//! Where Python raises TypeError: `{**self.nargs}` while `self.nargs` is None.
class PythonTypeError : public std::runtime_error {
 public:
  PythonTypeError() : std::runtime_error("TypeError: 'NoneType' object is not a mapping") {}
};

//! Launches `config` on `args` (accumulating into *args.out) and returns its time in ms.
using KernelFunction = std::function<double(const KernelArgs& args, const std::string& config)>;

//! Triton's shared-state autotuner, modelled (see the file comment). Thread-compatible only in the
//! way the original is: concurrent calls race on `nargs`.
class SharedStateAutotuner {
 public:
  //! `configs` in candidate order; `kernel` launches and times one config; do_bench launches each
  //! candidate `bench_launches` times.
  SharedStateAutotuner(std::vector<std::string> configs, KernelFunction kernel, int bench_launches)
      : configs_(std::move(configs)), kernel_(std::move(kernel)), bench_launches_(bench_launches) {}

  //! Autotuner.run: tunes the key on first sight, launches with the cached config and returns it.
  //! Throws PythonTypeError where Triton raises TypeError.
  std::string run(const KernelArgs& args) {
    nargs_.store(&args);                  // self.nargs = dict(zip(self.arg_names, args))
    const int64_t key = nargs().n;        // key from {**self.nargs, **kwargs}
    if (!cached(key)) {
      std::string best;
      double best_ms = 0.0;
      for (const std::string& config : configs_) {
        const KernelArgs& full = nargs();  // _bench: full_nargs = {**self.nargs, **current}
        double ms = 0.0;
        for (int launch = 0; launch < bench_launches_; ++launch) {  // do_bench
          full.out->store(0);              // self.pre_hook(full_nargs): reset_to_zero of the output
          ms = kernel_(args, config);      // fn.run(*args, ...): the caller's own arguments
        }
        if (best.empty() || ms < best_ms) {       // min() over the timings dict: first of the fastest
          best = config;
          best_ms = ms;
        }
      }
      store(key, best);                   // self.cache[key] = min(timings, key=timings.get)
      nargs().out->store(0);              // self.pre_hook(full_nargs, reset_only=True)
    }
    const std::string config = *cached(key);  // config = self.cache[key]
    kernel_(args, config);                // ret = self.fn.run(*args, **config.all_kwargs())
    nargs_.store(nullptr);                // self.nargs = None
    return config;
  }

 private:
  //! `{**self.nargs}`: whatever call's arguments are stored now; TypeError when None.
  const KernelArgs& nargs() const {
    const KernelArgs* current = nargs_.load();
    if (current == nullptr) throw PythonTypeError();
    return *current;
  }
  std::optional<std::string> cached(int64_t key) {
    std::lock_guard lock(cache_mutex_);
    const auto found = cache_.find(key);
    if (found == cache_.end()) return std::nullopt;
    return found->second;
  }
  void store(int64_t key, const std::string& config) {
    std::lock_guard lock(cache_mutex_);
    cache_[key] = config;
  }

  const std::vector<std::string> configs_;
  const KernelFunction kernel_;
  const int bench_launches_;
  std::atomic<const KernelArgs*> nargs_{nullptr};  //!< self.nargs; nullptr is None
  std::mutex cache_mutex_;                          //!< stands for the GIL around self.cache
  std::map<int64_t, std::string> cache_;            //!< self.cache: key -> config
};

}  // namespace harness::kinds::fault_model
