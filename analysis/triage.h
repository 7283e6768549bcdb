#pragma once
// `harness triage`: from a failed job to one writeup. What failed is read from a capture file
// (python/harness/capture.py: the exception, where it happened, the failing attention call's step,
// the allocator snapshot) or from a job's log (its last Python exception); the failure is matched to
// the hypotheses the shipped experiments test; the plan is harness commands at the captured dims
// (the experiments, explain-oom, the step replayed on the original path and on the fused one); the
// CLI runs them (harness/cli/cli_triage.cpp) and the results become one document. Torch-free.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "analysis/document.h"
#include "db/store.h"
#include "experiments/spec.h"

namespace harness::analysis {

//! The attention step a capture file holds, as the plan needs it.
struct CapturedStep {
  std::string op;                //!< flex_attention, scaled_dot_product_attention
  bool compiled = false;         //!< through torch.compile(flex_attention)
  int64_t batch = 0, heads = 0, kv_heads = 0, head_dim = 0, q_len = 0, kv_len = 0;
  std::string dtype;             //!< bf16, fp16, fp32 (or the torch name when none of these)
  bool replayable = false;       //!< q, k, v present and the mask a named kind
  std::string why_not;           //!< when not replayable
  nlohmann::json mask = nullptr; //!< the named kind it matched (the spec's mask section), null when none
  std::string mask_note;         //!< what the mask was captured as and what it matched
  int64_t block_size = 16, anchors = 0, context = 0;  //!< the spec's geometry for that mask
};

//! What failed.
struct Failure {
  std::string source;            //!< the capture file or the log
  bool from_log = false;
  std::string exception_type;    //!< "torch.OutOfMemoryError", "KeyError", "" when none was found
  std::string message;           //!< the exception's text
  std::string traceback;
  std::string phase;             //!< forward, backward, outside, "" (a log: unknown)
  bool in_attention = false;     //!< in an observed attention call (its forward, or its backward under way)
  std::string detail;            //!< the capture's own sentence about where
  std::optional<int64_t> requested_bytes;  //!< the allocator's failing request (the capture's observer), else the message's
  std::optional<int64_t> rank;
  std::string python;            //!< the job's interpreter (capture)
  nlohmann::json capture = nullptr;        //!< the whole capture header (null for a log)
  std::optional<CapturedStep> step;        //!< null for a log, or a capture without a step
  std::string snapshot_path;     //!< the allocator snapshot beside the capture ("" when none)
};

//! Reads a capture file (safetensors with a "capture" metadata string). Throws UsageError naming the
//! file and the problem when it is not one.
Failure read_capture_file(const std::string& path);
//! The failure a log shows: its last Python exception (type, message, traceback; "[rankN]:" prefixes
//! of torchrun's logs removed). Throws UsageError when the log names no exception or OOM.
Failure read_failure_log(const std::string& path, const std::string& text);

//! The failure classes the shipped hypotheses are about.
enum class FailureKind { attention_oom, oom, autotune_race, kernel_cache, nonfinite, unknown };
std::string_view failure_kind_name(FailureKind kind);

//! One harness command of the plan (without the binary, --db and --json).
struct TriageStep {
  std::string id;          //!< unique within the plan: "bwd_fusion", "replay_dense", "explain_oom", ...
  std::string kind;        //!< run, explain, replay
  std::string experiment;  //!< for run: the experiment; for replay: the variant
  std::string purpose;     //!< why it is run, one sentence
  std::vector<std::string> args;
};

//! What triage will do.
struct TriagePlan {
  FailureKind kind = FailureKind::unknown;
  std::string classification;          //!< why this class: the text that matched
  std::vector<std::string> hypotheses; //!< the experiments that test it
  std::vector<std::string> sets;       //!< the captured dims as --set arguments
  std::vector<TriageStep> steps;
  std::vector<std::string> notes;      //!< what is not tested, and why
};

//! Options of the plan.
struct PlanOptions {
  std::string device = "auto";
  std::string memory_limit;            //!< for the replays ("" = none)
  std::vector<std::string> sets;       //!< the user's own --set, after the captured ones
};

//! Matches the failure to a class and lists the commands at the captured dims.
TriagePlan plan_triage(const Failure& failure, const PlanOptions& options);

//! The plan as text (what --dry-run prints) and as JSON.
std::string plan_text(const Failure& failure, const TriagePlan& plan, const std::string& binary, const std::string& db_path);
nlohmann::json plan_json(const Failure& failure, const TriagePlan& plan);

//! What one step gave.
struct StepResult {
  TriageStep step;
  int exit_code = 0;
  nlohmann::json output = nullptr;     //!< its --json output
  std::string error;                   //!< its error, when it failed
  std::optional<db::RunDetail> run;    //!< the run it stored (run and replay steps)
};

//! The conclusion the measurements support (one paragraph), and its facts as JSON.
struct Conclusion {
  std::string text;
  nlohmann::json facts = nlohmann::json::object();
};
Conclusion conclude(const Failure& failure, const TriagePlan& plan, const std::vector<StepResult>& results);

//! The writeup: what failed, the hypotheses tested and their verdicts with evidence, the replays,
//! the conclusion, how to reproduce, and each run's own writeup. `named_by` (the dense path of an
//! experiment at the captured dims, when it loads) names the snapshot's blocks.
Document triage_document(const Failure& failure, const TriagePlan& plan, const std::vector<StepResult>& results,
                         const Conclusion& conclusion, const db::Store* store, const std::string& db_path,
                         const std::optional<spec::Spec>& named_by);

}  // namespace harness::analysis
