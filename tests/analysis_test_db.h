#pragma once
// Test dbs for diff and writeup, written through db::Store as `harness run` writes them: envs,
// experiments, runs with trials and per-repeat metrics, verdicts with evidence, failures,
// replays. write_demo_db() holds one realistic investigation (two toolchains, an anchor sweep
// with a memory model and an OOM, a replay, a race experiment with failure rates).

#include <stdlib.h>

#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "db/store.h"

namespace harness::test {

//! A fresh directory under the system temp folder, removed with everything in it at scope end.
class ScratchDir {
 public:
  ScratchDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "harness_analysis_XXXXXX").string();
    if (!mkdtemp(pattern.data())) throw std::runtime_error("mkdtemp failed for " + pattern);
    path_ = pattern;
  }
  ~ScratchDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

//! One trial to record: its outcome and its metrics (every repeat, or values measured once).
struct TrialData {
  std::string variant;
  nlohmann::json point = nlohmann::json::object();
  std::string status = "ok";
  std::map<std::string, std::vector<double>> repeats;
  std::map<std::string, double> once;
  std::string error;
  std::string stderr_tail;
  std::optional<int64_t> requested_bytes;
};

//! The unit `harness run` stores for a metric of that name.
inline std::string unit_for(const std::string& metric) {
  if (metric.find("bytes") != std::string::npos) return "bytes";
  if (metric.size() > 3 && metric.compare(metric.size() - 3, 3, "_ms") == 0) return "ms";
  return "";
}

//! What a run is, besides its trials.
struct RunData {
  std::string env_id;
  int64_t experiment_id = 0;
  std::string device = "cuda:0";
  std::string profile;
  std::string verdict;
  nlohmann::json evidence = nlohmann::json::object();
  nlohmann::json args = nlohmann::json::object();
  std::optional<int64_t> replay_of;
  std::string status = "ok";
};

//! Records a finished run with its trials; returns its id.
inline int64_t record_run(db::Store& store, const RunData& data, const std::vector<TrialData>& trials) {
  db::Run run;
  run.experiment_id = data.experiment_id;
  run.env_id = data.env_id;
  run.device = data.device;
  run.profile = data.profile;
  run.args = data.args;
  run.replay_of = data.replay_of;
  const int64_t run_id = store.begin_run(run);
  for (const auto& t : trials) {
    db::Trial trial;
    trial.run_id = run_id;
    trial.variant = t.variant;
    trial.point = t.point;
    trial.status = t.status;
    trial.exit_code = t.status == "ok" ? 0 : 1;
    trial.error = t.error;
    trial.stderr_tail = t.stderr_tail;
    trial.requested_bytes = t.requested_bytes;
    trial.duration_s = 1.5;
    std::vector<db::Metric> metrics;
    for (const auto& [name, values] : t.repeats)
      for (size_t r = 0; r < values.size(); ++r)
        metrics.push_back({t.variant, t.point, name, values[r], unit_for(name), static_cast<int>(r)});
    for (const auto& [name, value] : t.once) metrics.push_back({t.variant, t.point, name, value, unit_for(name), -1});
    store.add_trial(trial, metrics);
  }
  store.finish_run(run_id, data.status, data.verdict, data.evidence);
  return run_id;
}

//! A fingerprint shaped like `harness env`'s, with the fields a test varies.
inline nlohmann::json fingerprint(const std::string& libtorch, const std::string& cuda_runtime,
                                  const nlohmann::json& env_vars = nlohmann::json::object(),
                                  const std::string& python_torch = "", const std::string& triton = "") {
  nlohmann::json env = {{"libtorch", libtorch},          {"cuda_runtime", cuda_runtime}, {"cuda_driver", "580.95.05"},
                        {"cudnn", "9.10.2"},             {"nvcc", "12.9.86"},            {"gpu_name", "NVIDIA H200"},
                        {"gpu_capability", "9.0"},       {"gpu_memory_bytes", 150121070592LL},
                        {"host_compiler", "GNU 12.2.0"}, {"build_type", "RelWithDebInfo"},
                        {"harness_version", "0.1.0"},    {"git_commit", "4fa760c0d1e2"},
                        {"os", "Debian GNU/Linux 12 (bookworm)"},
                        {"env_vars", env_vars.is_null() ? nlohmann::json::object() : env_vars}};
  if (!python_torch.empty())
    env["python"] = {{"executable", "/opt/venv/bin/python"}, {"version", "3.11.2"}, {"torch", python_torch},
                     {"triton", triton}, {"cuda", cuda_runtime}};
  return env;
}

//! The bwd_fusion spec as the run stores it (resolved).
inline nlohmann::json bwd_fusion_spec() {
  return nlohmann::json::parse(R"({
    "name": "bwd_fusion", "kind": "attention_step",
    "hypothesis": "The block mask breaks fusion, so the attention backward falls back to a dense path.",
    "dims": {"batch": 1, "heads": 32, "kv_heads": 8, "head_dim": 128, "anchors": 128, "block_size": 16,
             "context": 8192, "dtype": "bf16", "layers": 1},
    "mask": {"type": "dflash", "context_rule": "before_anchor", "documents": 4, "in_block": "bidirectional"},
    "variants": {"fused": {"impl": "fused"}, "dense": {"impl": "dense"}},
    "measure": ["fwd_peak_bytes", "bwd_peak_bytes", "fwd_ms", "bwd_ms"],
    "repeats": 5, "warmup": 1,
    "check": {"enabled": true, "factor": 2.0, "atol": 1e-5},
    "verdict": [{"if": "fused.bwd_peak_bytes < 5GiB && fused.match", "then": "FUSED"}, {"else": "DENSE"}]})");
}

//! The anchor_scaling spec: anchors 128/256/512 × layers 1/5.
inline nlohmann::json anchor_scaling_spec() {
  auto spec = bwd_fusion_spec();
  spec["name"] = "anchor_scaling";
  spec["hypothesis"] = "Memory scales with the anchor count: dense with Q·KV, fused with Q+KV.";
  spec["sweep"] = {{"dims.anchors", {128, 256, 512}}, {"dims.layers", {1, 5}}};
  spec["repeats"] = 3;
  spec["verdict"] = nlohmann::json::parse(R"([{"if": "dense.status == oom", "then": "DENSE-OOM"}, {"else": "FITS"}])");
  return spec;
}

//! Writes the demo investigation into a new db at `path`.
inline void write_demo_db(const std::string& path) {
  db::Store store(path);
  const std::string old_env = store.put_env(fingerprint("2.10.0", "12.8", {}, "2.10.0", "3.5.1"));
  const std::string new_env = store.put_env(
      fingerprint("2.11.0", "12.9", {{"PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"}}, "2.11.0", "3.6.0"));
  const nlohmann::json run_args = {{"experiment", "bwd_fusion"}, {"set", nlohmann::json::array()},
                                   {"requested_device", "cuda:0"}};

  // bwd_fusion under both toolchains: the dense backward got worse, the fused one did not.
  const int64_t bwd = store.put_experiment("bwd_fusion", bwd_fusion_spec());
  const nlohmann::json fused_evidence = nlohmann::json::parse(
      R"({"if": "fused.bwd_peak_bytes < 5GiB && fused.match", "then": "FUSED",
          "values": [{"variant": "fused", "metric": "bwd_peak_bytes", "value": 59342848, "op": "<",
                      "threshold": 5368709120, "held": true},
                     {"variant": "fused", "metric": "match", "value": 1, "held": true}]})");
  for (const auto& [env, dense_ms] : {std::pair{old_env, 23.0}, std::pair{new_env, 27.5}}) {
    RunData run{env, bwd};
    run.verdict = "FUSED";
    run.evidence = fused_evidence;
    run.args = run_args;
    TrialData fused{"fused"}, dense{"dense"};
    fused.repeats["bwd_peak_bytes"] = {59342848, 59342848, 59342848, 59342848, 59342848};
    fused.repeats["fwd_peak_bytes"] = {17092608, 17092608, 17092608, 17092608, 17092608};
    fused.repeats["bwd_ms"] = {0.71, 0.70, 0.72, 0.71, 0.73};
    fused.repeats["fwd_ms"] = {0.26, 0.27, 0.26, 0.25, 0.26};
    fused.once["match"] = 1;
    fused.once["max_abs_err"] = 0.0078;
    fused.once["model_bwd_peak_bytes"] = 58720256;
    dense.repeats["bwd_peak_bytes"] = {7.42 * 1073741824, 7.42 * 1073741824, 7.42 * 1073741824, 7.42 * 1073741824,
                                       7.42 * 1073741824};
    dense.repeats["fwd_peak_bytes"] = {5.57 * 1073741824, 5.57 * 1073741824, 5.57 * 1073741824, 5.57 * 1073741824,
                                       5.57 * 1073741824};
    dense.repeats["bwd_ms"] = {dense_ms, dense_ms + 0.2, dense_ms - 0.1, dense_ms + 0.1, dense_ms + 0.3};
    dense.repeats["fwd_ms"] = {14.9, 15.0, 14.8, 14.9, 15.1};
    dense.once["match"] = 1;
    dense.once["max_abs_err"] = 0.0089;
    dense.once["model_bwd_peak_bytes"] = 7.5 * 1073741824;
    record_run(store, run, {fused, dense});
  }

  // anchor_scaling under the new toolchain: 3 anchors × 2 layer counts, dense OOMs at 512 × 5.
  const int64_t scaling = store.put_experiment("anchor_scaling", anchor_scaling_spec());
  std::vector<TrialData> trials;
  for (int layers : {1, 5}) {
    for (int anchors : {128, 256, 512}) {
      const nlohmann::json point = {{"dims.anchors", anchors}, {"dims.layers", layers}};
      const double q = anchors * 16.0, kv = 8192.0 + q;
      const double dense_model = 3.0 * 32 * q * kv * 4 * layers / 5.0 + 32 * q * kv * 4;  // saved + scores
      const double fused_model = (q + kv) * 32 * 128 * 2 * 4.0 * layers;
      for (const std::string variant : {"fused", "dense"}) {
        TrialData t{variant, point};
        const double model = variant == "dense" ? dense_model : fused_model;
        t.once["model_bwd_peak_bytes"] = model;
        if (variant == "dense" && anchors == 512 && layers == 5) {
          t.status = "oom";
          t.requested_bytes = 17179869184;
          t.error = "CUDA out of memory. Tried to allocate 16.00 GiB (GPU 0; 96.00 GiB limit; 82.07 GiB in use)";
          t.stderr_tail = "trial dense: allocating scores\nCUDA out of memory. Tried to allocate 16.00 GiB\n";
        } else {
          const double measured = model * (variant == "dense" ? 0.97 : 1.04);
          t.repeats["bwd_peak_bytes"] = {measured, measured, measured};
          const double ms = (variant == "dense" ? 23.0 : 0.7) * anchors / 128.0 * layers;
          t.repeats["bwd_ms"] = {ms, ms * 1.02, ms * 0.99};
        }
        trials.push_back(std::move(t));
      }
    }
  }
  RunData scaling_run{new_env, scaling};
  scaling_run.verdict = "DENSE-OOM";
  scaling_run.evidence = nlohmann::json::parse(
      R"({"if": "dense.status == oom", "then": "DENSE-OOM", "fit": {"dense": {"exponent": 1.93, "r2": 0.998},
          "fused": {"exponent": 1.01, "r2": 0.999}}})");
  scaling_run.args = {{"experiment", "anchor_scaling"},
                      {"set", {"dims.anchors=[128,256,512]"}},
                      {"requested_device", "cuda:0"},
                      {"memory_limit_bytes", 103079215104LL}};
  const int64_t scaling_id = record_run(store, scaling_run, trials);
  // The run-level fit the scaling rule stores, at the empty point (not a sweep point).
  store.add_metrics(scaling_id, {{"dense", nlohmann::json::object(), "r2_q_kv", 0.998, "", -1}});
  db::Artifact capsule;
  capsule.run_id = scaling_id;
  capsule.kind = "capsule";
  capsule.sha256 = "5d41402abc4b2a76b9719d911017c592aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
  capsule.path = "artifacts/5d/5d41402abc4b2a76.capsule";
  capsule.bytes = 402653184;
  store.add_artifact(capsule);

  // The replay of the OOM step: it reproduces, with the same requested bytes.
  RunData replay{new_env, scaling};
  replay.replay_of = scaling_id;
  replay.verdict = "REPRODUCED";
  replay.evidence = {{"reproduced", true}, {"requested_bytes", 17179869184LL}};
  replay.status = "failed";
  TrialData replayed{"dense", {{"dims.anchors", 512}, {"dims.layers", 5}}};
  replayed.status = "oom";
  replayed.requested_bytes = 17179869184;
  replayed.error = "CUDA out of memory. Tried to allocate 16.00 GiB";
  record_run(store, replay, {replayed});

  // A race experiment: failure rates with their 95 % intervals.
  nlohmann::json race_spec = {{"name", "warmup_race"},
                              {"kind", "autotune_race"},
                              {"hypothesis", "Concurrent warmups of one autotuner corrupt its shared state."},
                              {"params", {{"threads", 4}, {"trials", 200}}},
                              {"variants", {{"legacy_shared_state", {{"impl", "legacy_shared_state"}}},
                                            {"per_call_state", {{"impl", "per_call_state"}}}}}};
  const int64_t race = store.put_experiment("warmup_race", race_spec);
  RunData race_run{new_env, race};
  race_run.device = "cpu";
  race_run.verdict = "RACE";
  TrialData legacy{"legacy_shared_state"}, fixed{"per_call_state"};
  legacy.once = {{"failure_rate", 0.965}, {"failure_rate_ci95_low", 0.930}, {"failure_rate_ci95_high", 0.983},
                 {"failures", 193}, {"trials", 200}};
  fixed.once = {{"failure_rate", 0.0}, {"failure_rate_ci95_low", 0.0}, {"failure_rate_ci95_high", 0.0188},
                {"failures", 0}, {"trials", 200}};
  record_run(store, race_run, {legacy, fixed});
}

}  // namespace harness::test
