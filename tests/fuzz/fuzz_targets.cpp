#include "tests/fuzz/fuzz_targets.h"

#include <unistd.h>

#include <fstream>
#include <vector>

#include "experiments/memory_model.h"
#include "experiments/spec.h"
#include "experiments/sweep.h"
#include "replay/capsule_file.h"

namespace harness::fuzz {
// A small attention_step spec the capsules of tests/fuzz/capsule/ were written for.
const spec::Spec& capsule_spec() {
  static const spec::Spec spec = spec::load_spec_text(R"({
    "name": "fuzz_capsule", "hypothesis": "capsules are read safely", "kind": "attention_step",
    "dims": {"batch": 1, "heads": 2, "kv_heads": 1, "head_dim": 64, "anchors": 2, "block_size": 16,
             "context": 64, "dtype": "bf16", "layers": 1},
    "mask": {"type": "dflash", "context_rule": "before_anchor", "documents": 1, "in_block": "bidirectional", "seed": 0},
    "block_mask": {"block_size": 16},
    "variants": {"fused": {"impl": "fused"}},
    "measure": ["fwd_peak_bytes"], "repeats": 1, "warmup": 0,
    "verdict": [{"if": "fused.match", "then": "OK"}, {"else": "MISMATCH"}]})",
                                                      "fuzz_capsule.json");
  return spec;
}

std::string fuzz_scratch_path(const std::string& name) {
  const char* dir = std::getenv("TMPDIR");
  return std::string(dir && *dir ? dir : "/tmp") + "/harness-fuzz-" + std::to_string(getpid()) + "-" + name;
}

namespace {

// A spec input: the spec's text, then optionally a line "#--set" and one override per line.
std::pair<std::string, spec::LoadOptions> spec_and_overrides(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  spec::LoadOptions options;
  options.allow_faults = true;
  std::string text = input;
  const auto marker = input.find("\n#--set\n");
  if (marker != std::string::npos) {
    text = input.substr(0, marker);
    size_t start = marker + 8;
    while (start < input.size() && options.overrides.size() < 16) {
      const size_t end = input.find('\n', start);
      options.overrides.push_back(input.substr(start, end == std::string::npos ? std::string::npos : end - start));
      if (end == std::string::npos) break;
      start = end + 1;
    }
  }
  return {text, options};
}

}  // namespace

void spec_input(const uint8_t* data, size_t size) {
  const auto [text, options] = spec_and_overrides(data, size);
  try {
    const spec::Spec spec = spec::load_spec_text(text, "fuzz.json", options);
    const auto points = spec::sweep_points(spec);
    for (size_t p = 0; p < points.size() && p < 8; ++p) spec::spec_at_point(spec, points[p]);
  } catch (const spec::SpecError&) {
  }
}

void plan_input(const uint8_t* data, size_t size) {
  const auto [text, options] = spec_and_overrides(data, size);
  spec::Spec spec;
  try {
    spec = spec::load_spec_text(text, "fuzz.json", options);
  } catch (const spec::SpecError&) {
    return;
  }
  // As `harness run` plans: every point a validated spec of its own.
  const auto points = spec::sweep_points(spec);
  std::vector<spec::Spec> planned;
  for (const auto& point : points) planned.push_back(spec::spec_at_point(spec, point));
  if (spec.kind != "attention_step") return;
  // As the parent models a trial (model_metrics) and explain-oom replays one under a cap.
  constexpr int64_t kCap = int64_t{80} << 30;
  for (size_t p = 0; p < planned.size() && p < 4; ++p) {
    for (const spec::Variant& variant : planned[p].variants) {
      for (const char* device : {"cpu", "cuda"}) {
        memory_model::predict(planned[p], variant.name, device);
        memory_model::predict_oom(planned[p], variant.name, device, kCap);
      }
    }
  }
}

void capsule_input(const uint8_t* data, size_t size) {
  // Not named for a sha256: the name check would refuse nearly every mutation before the parser.
  const std::string path = fuzz_scratch_path("input.capsule");
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  try {
    const replay::CapsuleInfo info = replay::inspect_capsule(path, /*verify_payload=*/true);
    for (const auto& entry : info.tensors) replay::read_tensor_bytes(info, entry);
    try {
      replay::check_step_fits_spec(info, capsule_spec());
    } catch (const replay::CapsuleError&) {
    }
    replay::compare_outputs(info, info);
  } catch (const replay::CapsuleError&) {
  }
  unlink(path.c_str());
}

}  // namespace harness::fuzz
