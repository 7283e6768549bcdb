#pragma once
// The bodies of the fuzz targets (scripts/fuzz.sh), shared with the corpus test that replays
// every file of tests/fuzz/<target>/ in the ordinary test run (test_fuzz_corpus.cpp). Each takes
// one input and returns normally when the code under test refused it the documented way (the
// error type of that input); anything else (another exception, a crash, a sanitizer report)
// is a finding.

#include <cstddef>
#include <cstdint>
#include <string>

#include "experiments/spec.h"

namespace harness::fuzz {

//! Spec loading and validation: the input is a spec's text, optionally followed by a line
//! "#--set" and then one override per line ("dims.anchors=[1,2]"). Only spec::SpecError may
//! escape; a valid spec is also expanded into its sweep points.
void spec_input(const uint8_t* data, size_t size);

//! The planner, spec to plan: the input as spec_input's. A valid spec is expanded into every sweep
//! point (each a validated spec, as `harness run` plans them), and the first points of an
//! attention_step spec are modelled as the parent models them: the memory model's prediction for
//! every variant on the CPU and CUDA allocators, and the OOM replay over every warm-up and repeat
//! under a cap (explain-oom's). Only spec::SpecError may escape; scripts/fuzz.sh runs it under
//! libFuzzer's memory and time limits, so a plan whose cost grows with a count is a finding.
void plan_input(const uint8_t* data, size_t size);

//! Capsule reading and verification: the input is a capsule file. Only replay::CapsuleError may
//! escape; a readable capsule is also checked against a small spec and compared with itself.
void capsule_input(const uint8_t* data, size_t size);

//! The small attention_step spec capsule_input checks capsules against.
const spec::Spec& capsule_spec();

//! Where capsule_input writes its file (per process; a capsule is read from a path).
std::string fuzz_scratch_path(const std::string& name);

}  // namespace harness::fuzz
