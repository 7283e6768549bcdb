#pragma once
// The runner of kind python: runs a user's script (e.g. the real torch.compile(flex_attention)
// probe) with the interpreter of `harness run --python` and records the JSON object it prints.
// Torch-free: the script runs in its own process, started by the trial child.
//
// Script protocol:
// - argv: <python> <script> --device <cpu|cuda:0> <params.args...> <params.variants.V.args...>;
//   never a shell. A relative script path resolves against the spec's folder.
// - environment: the trial's, plus CUDA_VISIBLE_DEVICES=N for cuda:N (so the script's device is
//   always cuda:0) or "" for cpu (no GPU is visible), PYTHONUNBUFFERED=1 (the output tail
//   survives a kill), HARNESS_MEMORY_LIMIT_BYTES with --memory-limit (the script applies it, e.g.
//   torch.cuda.set_per_process_memory_fraction), then params.env and params.variants.V.env.
// - stdout: the last non-empty line is one JSON object (anything before it is kept as a log):
//   a number is a metric measured once; an array of numbers one value per repeat; true/false are
//   1/0; strings, objects and null are kept in the details only. Units come from params.metrics,
//   else the object's "units" {name: unit}, else the name (_bytes: bytes, _ms: ms). Keys that end
//   the trial otherwise: {"skipped": "reason"} -> unsupported; {"oom": "message",
//   "requested_bytes": N} -> oom; {"error": "message"} -> error. Python's json.dumps writes NaN,
//   which is not JSON: print null for a value that could not be measured.
// - exit: 0. A non-zero exit is an error (oom when the output shows an out-of-memory error, with
//   the requested bytes of "Tried to allocate 15.09 GiB"), a signal is crashed, running past
//   params.timeout_s (capped below the spec's timeout_s) is timeout; metrics printed before are
//   kept. Every trial's details keep the argv, the environment added, the exit, the parsed
//   object and the stdout and stderr tails.

#include "experiments/kinds/trial.h"
#include "experiments/spec.h"

namespace harness::kinds {

//! Runs one trial of kind python: the script for `context.variant` on `context.device`.
TrialResult run_python(const spec::Spec& spec, const TrialRequest& context);

}  // namespace harness::kinds
