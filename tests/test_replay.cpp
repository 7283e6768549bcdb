// Capsules: the file format round trip, every integrity failure named (never a crash), the trial
// child's capsule (written before the step, kept on failure, dropped on success), NaN/Inf
// detection, replaying a capsule, and importing a step saved with torch.save. The blockmask kind
// outside Python: mask files in both forms (packed bits, a BlockMask's lists with partial tiles),
// a spec that names one run as a trial (v_head_dim apart from head_dim, fp16), its capsule
// carrying the bits, and the replay of that capsule.

#include <ATen/ATen.h>
#include <ftw.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "trials/attention_step.h"
#include "experiments/spec.h"
#include "kernels/block_mask.h"
#include "replay/capsule.h"
#include "replay/import.h"
#include "replay/mask_bits.h"
#include "tests/catch.h"
#include "tests/mask_cases.h"
#include "tests/test_paths.h"

using namespace harness;

namespace {

namespace fs = std::filesystem;

// A scratch folder removed with nftw (std::filesystem::remove_all is interposed by libtorch.so).
struct TempDir {
  std::string path;
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "harness-replay-XXXXXX").string();
    REQUIRE(mkdtemp(pattern.data()) != nullptr);
    path = pattern;
  }
  ~TempDir() {
    nftw(
        path.c_str(), [](const char* item, const struct stat*, int, struct FTW*) { return ::remove(item); }, 16,
        FTW_DEPTH | FTW_PHYS);
  }
  std::string file(const std::string& name) const { return path + "/" + name; }
};

// The small attention_step spec the tests record: 2 layers, GQA 2:1, dflash in 2 documents.
spec::Spec small_spec(const std::string& extra_variants = "") {
  const std::string text = R"({
    "name": "replay_test", "hypothesis": "test", "kind": "attention_step",
    "dims": {"batch": 1, "heads": 2, "kv_heads": 1, "head_dim": 64, "anchors": 2, "block_size": 16,
             "context": 64, "dtype": "bf16", "layers": 2},
    "mask": {"type": "dflash", "context_rule": "before_anchor", "documents": 2, "in_block": "bidirectional", "seed": 3},
    "block_mask": {"block_size": 16},
    "variants": {"fused": {"impl": "fused"}, "dense": {"impl": "dense"})" +
                           extra_variants + R"(},
    "repeats": 1, "warmup": 0, "seed": 5,
    "verdict": [{"if": "fused.match", "then": "OK"}, {"else": "MISMATCH"}]})";
  spec::LoadOptions options;
  options.allow_faults = true;
  return spec::load_spec_text(text, "test_replay", options);
}

kinds::TrialRequest context_for(const std::string& variant, const TempDir& dir) {
  kinds::TrialRequest context;
  context.variant = variant;
  context.device = "cpu";
  context.artifact_dir = dir.file("artifacts");
  context.result_path = dir.file("result.json");
  return context;
}

const kinds::ArtifactRef* artifact(const kinds::TrialResult& result, const std::string& kind) {
  for (const auto& a : result.artifacts)
    if (a.kind == kind) return &a;
  return nullptr;
}

std::string error_of(const std::function<void()>& action) {
  try {
    action();
  } catch (const replay::CapsuleError& error) {
    return error.what();
  }
  return "";
}

std::string write_mask_file(const TempDir& dir, const replay::NamedTensors& tensors) {
  return replay::write_capsule(dir.path, {{"role", "mask"}}, tensors, ".safetensors").path;
}

// A mask's BlockMask at (q_block, kv_block), as FlexAttention keeps it: per q block the partial and
// the full kv blocks, and the partial blocks' tiles in list order.
replay::NamedTensors block_form(const kernels::ResolvedMask& mask, int64_t q_block, int64_t kv_block) {
  const at::Tensor dense = kernels::dense_mask(mask);
  const int64_t q_blocks = (mask.q_len + q_block - 1) / q_block, kv_blocks = (mask.kv_len + kv_block - 1) / kv_block;
  const at::Tensor padded =
      at::constant_pad_nd(dense, {0, kv_blocks * kv_block - mask.kv_len, 0, q_blocks * q_block - mask.q_len}, 0);
  at::Tensor counts = at::zeros({1, 1, q_blocks}, at::kInt), lists = at::zeros({1, 1, q_blocks, kv_blocks}, at::kInt);
  at::Tensor full_counts = at::zeros_like(counts), full_lists = at::zeros_like(lists);
  std::vector<at::Tensor> tiles;
  for (int64_t qb = 0; qb < q_blocks; ++qb) {
    int32_t partial = 0, full = 0;
    for (int64_t kvb = 0; kvb < kv_blocks; ++kvb) {
      const at::Tensor tile = padded.narrow(0, qb * q_block, q_block).narrow(1, kvb * kv_block, kv_block);
      const int64_t seen = tile.sum().item<int64_t>();
      if (seen == tile.numel()) {
        full_lists[0][0][qb][full++] = static_cast<int32_t>(kvb);
      } else if (seen > 0) {
        lists[0][0][qb][partial++] = static_cast<int32_t>(kvb);
        tiles.push_back(tile);
      }
    }
    counts[0][0][qb] = partial;
    full_counts[0][0][qb] = full;
  }
  return {{"mask.kv_num_blocks", counts},
          {"mask.kv_indices", lists},
          {"mask.full_kv_num_blocks", full_counts},
          {"mask.full_kv_indices", full_lists},
          {"mask.block_size", at::tensor(std::vector<int64_t>{q_block, kv_block})},
          {"mask.partial_bits", at::stack(tiles)}};
}

void overwrite_byte(const std::string& path, int64_t offset) {
  std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
  file.seekg(offset);
  const char byte = static_cast<char>(file.get());
  file.seekp(offset);
  file.put(static_cast<char>(byte ^ 0x5a));
}

}  // namespace

TEST_CASE("a capsule round-trips every tensor bit for bit", "[replay]") {
  TempDir dir;
  const replay::NamedTensors tensors = {
      {"a", at::randn({3, 5, 7}).to(at::kBFloat16)},
      {"b", at::arange(10, at::TensorOptions().dtype(at::kLong))},
      {"c", at::randn({4, 4}).t()},  // not contiguous: written in C order
      {"empty", at::empty({0, 3})},
  };
  const auto written = replay::write_capsule(dir.path, {{"role", "test"}}, tensors, ".capsule");
  CHECK(written.created);
  CHECK(fs::path(written.path).filename() == written.sha256 + ".capsule");
  CHECK(static_cast<int64_t>(fs::file_size(written.path)) == written.bytes);
  CHECK(replay::is_safetensors_file(written.path));

  const auto info = replay::inspect_capsule(written.path, /*verify_payload=*/true, written.sha256, "the test");
  REQUIRE(info.tensors.size() == tensors.size());
  CHECK(info.version == replay::kCapsuleVersion);
  CHECK(info.payload_offset % replay::kCapsuleAlignment == 0);
  for (const auto& [name, tensor] : tensors) {
    const auto* entry = info.find(name);
    REQUIRE(entry != nullptr);
    // safetensors: back to back from a 64-byte aligned start, each at a multiple of its element size.
    CHECK((info.payload_offset + entry->offset) % *replay::dtype_bytes(entry->dtype) == 0);
    const at::Tensor loaded = replay::load_tensor(info, *entry);
    CHECK(loaded.scalar_type() == tensor.scalar_type());
    CHECK(loaded.sizes() == tensor.sizes());
    CHECK(at::equal(loaded, tensor.contiguous()));
  }
  // The same content again is the same file.
  const auto again = replay::write_capsule(dir.path, {{"role", "test"}}, tensors, ".capsule");
  CHECK(again.sha256 == written.sha256);
  CHECK_FALSE(again.created);
}

TEST_CASE("a damaged capsule is an error naming the problem, never a crash", "[replay]") {
  TempDir dir;
  const auto written = replay::write_capsule(dir.path, {{"role", "test"}}, {{"x", at::randn({64, 64})}}, ".capsule");
  const auto info = replay::inspect_capsule(written.path, true);
  const std::string copy = dir.file("copy.capsule");

  SECTION("truncated") {
    fs::copy_file(written.path, copy);
    fs::resize_file(copy, static_cast<uintmax_t>(written.bytes - 100));
    const std::string error = error_of([&] { replay::inspect_capsule(copy, false); });
    CHECK(error.find("truncated") != std::string::npos);
    CHECK(error.find("100 missing") != std::string::npos);
    fs::resize_file(copy, 40);
    CHECK(error_of([&] { replay::inspect_capsule(copy, false); }).find("truncated") != std::string::npos);
  }
  SECTION("a flipped payload byte") {
    fs::copy_file(written.path, copy);
    overwrite_byte(copy, info.payload_offset + 1000);
    CHECK(replay::inspect_capsule(copy, false).sha256 == written.sha256);  // the structure is intact
    const std::string error = error_of([&] { replay::inspect_capsule(copy, true); });
    CHECK(error.find("tensor x") != std::string::npos);
    CHECK(error.find("corrupted") != std::string::npos);
  }
  SECTION("a changed header") {
    std::ifstream in(written.path, std::ios::binary);
    std::string file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    // The capsule header is a JSON string inside safetensors' header: its quotes are escaped.
    const std::string role = "role\\\":\\\"test";
    const auto at = file.find(role);
    REQUIRE(at != std::string::npos);
    file.replace(at + role.size() - 4, 4, "tost");
    std::ofstream(written.path, std::ios::binary | std::ios::trunc) << file;
    const std::string error = error_of([&] { replay::inspect_capsule(written.path, false); });
    CHECK(error.find("hash mismatch") != std::string::npos);
    fs::copy_file(written.path, copy);
    CHECK(error_of([&] { replay::inspect_capsule(copy, false, written.sha256, "the db"); }).find("the db records") !=
          std::string::npos);
  }
  SECTION("not a capsule") {
    std::ofstream(copy) << "PK\x03\x04 something else";
    const std::string error = error_of([&] { replay::inspect_capsule(copy, false); });
    CHECK(error.find("not a harness capsule") != std::string::npos);
    CHECK(error.find("--import") != std::string::npos);
    CHECK(error_of([&] { replay::inspect_capsule(dir.file("absent"), false); }).find("cannot open") != std::string::npos);
  }
}

TEST_CASE("a failing trial keeps the capsule it wrote before its step, replaying it fails alike", "[replay]") {
  TempDir dir;
  const spec::Spec spec = small_spec(R"(, "nan": {"impl": "fused", "fault": "nan"}, "oom": {"impl": "dense", "fault": "oom"})");

  SECTION("NaN in the forward: the first tensor and phase are named") {
    const auto result = kinds::run_attention_step(spec, context_for("nan", dir));
    REQUIRE(result.status == "nonfinite");
    CHECK(result.details["nonfinite"]["tensor"] == "out");
    CHECK(result.details["nonfinite"]["phase"] == "fwd");
    CHECK(result.details["nonfinite"]["layer"] == 0);
    CHECK(result.details["nonfinite"]["nan"].get<int64_t>() > 0);
    const auto* capsule = artifact(result, "capsule");
    REQUIRE(capsule != nullptr);
    REQUIRE(artifact(result, "outputs") != nullptr);
    const auto marker = replay::read_capsule_sidecar(dir.file("result.json"));
    REQUIRE(marker);
    CHECK(marker->sha256 == capsule->sha256);

    // The capsule carries the poisoned inputs: the plain fused variant fails the same way on them.
    auto context = context_for("fused", dir);
    context.replay_capsule = capsule->path;
    const auto replayed = kinds::run_attention_step(spec, context);
    CHECK(replayed.status == "nonfinite");
    CHECK(replayed.details["nonfinite"] == result.details["nonfinite"]);
  }
  SECTION("OOM: the capsule is kept, the replay asks for the same bytes") {
    const auto result = kinds::run_attention_step(spec, context_for("oom", dir));
    REQUIRE(result.status == "oom");
    const auto* capsule = artifact(result, "capsule");
    REQUIRE(capsule != nullptr);
    CHECK(artifact(result, "outputs") == nullptr);  // the step made none
    auto context = context_for("oom", dir);
    context.replay_capsule = capsule->path;
    const auto replayed = kinds::run_attention_step(spec, context);
    CHECK(replayed.status == "oom");
    CHECK(replayed.requested_bytes == result.requested_bytes);
  }
}

TEST_CASE("a passing trial drops its capsule unless asked to keep it, a kept one replays bit for bit", "[replay]") {
  TempDir dir;
  const spec::Spec spec = small_spec();
  const auto passed = kinds::run_attention_step(spec, context_for("fused", dir));
  REQUIRE(passed.status == "ok");
  CHECK(passed.artifacts.empty());
  CHECK_FALSE(fs::exists(replay::capsule_sidecar_path(dir.file("result.json"))));
  CHECK(fs::is_empty(dir.file("artifacts")));

  auto keep = context_for("fused", dir);
  keep.keep_capsules = true;
  const auto kept = kinds::run_attention_step(spec, keep);
  REQUIRE(kept.status == "ok");
  const auto* capsule = artifact(kept, "capsule");
  const auto* outputs = artifact(kept, "outputs");
  REQUIRE(capsule != nullptr);
  REQUIRE(outputs != nullptr);
  const auto info = replay::inspect_capsule(capsule->path, true, capsule->sha256);
  replay::check_step_fits_spec(info, spec);
  CHECK(info.find("mask.anchors") != nullptr);
  CHECK(info.header["variant"] == "fused");

  auto context = context_for("fused", dir);
  context.keep_capsules = true;
  context.replay_capsule = capsule->path;
  const auto replayed = kinds::run_attention_step(spec, context);
  REQUIRE(replayed.status == "ok");
  const auto* replayed_outputs = artifact(replayed, "outputs");
  REQUIRE(replayed_outputs != nullptr);
  const auto comparisons = replay::compare_outputs(replay::inspect_capsule(outputs->path, true),
                                                   replay::inspect_capsule(replayed_outputs->path, true));
  CHECK(comparisons.size() == 8);  // out, dq, dk, dv of 2 layers
  for (const auto& c : comparisons) CHECK(c.bitwise_equal);

  // The dense implementation on the same capsule: close, not bitwise.
  context.variant = "dense";
  const auto dense = kinds::run_attention_step(spec, context);
  REQUIRE(dense.status == "ok");
  const auto versus_dense = replay::compare_outputs(replay::inspect_capsule(outputs->path, true),
                                                    replay::inspect_capsule(artifact(dense, "outputs")->path, true));
  for (const auto& c : versus_dense) {
    CHECK(c.note.empty());
    CHECK(c.max_rel_err < 0.05);
  }
}

TEST_CASE("a capsule whose tensors do not fit its spec names each problem", "[replay]") {
  TempDir dir;
  const spec::Spec spec = small_spec();
  auto keep = context_for("fused", dir);
  keep.keep_capsules = true;
  const auto kept = kinds::run_attention_step(spec, keep);
  const auto info = replay::inspect_capsule(artifact(kept, "capsule")->path, false);

  spec::LoadOptions options;
  options.overrides = {"dims.anchors=3", "dims.layers=1"};
  const spec::Spec other = spec::load_spec_text(spec.resolved.dump(), "test", options);
  const std::string error = error_of([&] { replay::check_step_fits_spec(info, other); });
  CHECK(error.find("q.0 has shape [1,2,32,64] but the spec needs [1,2,48,64]") != std::string::npos);
  CHECK(error.find("q.1 belongs to a layer the spec does not have") != std::string::npos);
  CHECK(error.find("mask.anchors") != std::string::npos);

  // The trial child refuses it too, as an error result rather than a crash.
  auto context = context_for("fused", dir);
  context.replay_capsule = info.path;
  const auto result = kinds::run_attention_step(other, context);
  CHECK(result.status == "error");
  CHECK(result.details.contains("capsule_error"));
}

TEST_CASE("a step saved with torch.save imports as a capsule and replays", "[replay]") {
  TempDir dir;
  const int64_t batch = 1, heads = 2, kv_heads = 1, head_dim = 64, anchors = 2, block = 16, context = 48;
  const int64_t q_len = anchors * block, kv_len = context + q_len;
  c10::impl::GenericDict entries(c10::StringType::get(), c10::AnyType::get());
  entries.insert("q", at::randn({batch, heads, q_len, head_dim}));
  entries.insert("k", at::randn({batch, kv_heads, kv_len, head_dim}));
  entries.insert("v", at::randn({batch, kv_heads, kv_len, head_dim}));
  entries.insert("grad_out", at::randn({batch, heads, q_len, head_dim}));
  entries.insert("anchors", at::tensor(std::vector<int32_t>{20, 7}));  // any order, as the blocks are
  entries.insert("meta", std::string(R"({"name": "from_python", "dims": {"block_size": 16},
                                       "mask": {"type": "dflash", "documents": 1}})"));
  auto save = [&](const c10::impl::GenericDict& dict, const std::string& name) {
    const std::vector<char> bytes = torch::jit::pickle_save(dict);
    std::ofstream(dir.file(name), std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    return dir.file(name);
  };

  const auto imported = replay::import_step_file(save(entries, "step.pt"), dir.file("artifacts"));
  const auto info = replay::inspect_capsule(imported.capsule.path, true, imported.capsule.sha256);
  CHECK(info.header["source"] == "import");
  const spec::Spec spec = spec::parse_spec(info.header["spec"], "imported");
  CHECK(spec.dims.context == context);
  CHECK(spec.dtype == "fp32");
  CHECK(spec.name == "from_python");
  CHECK_FALSE(imported.outputs);

  auto trial = context_for("fused", dir);
  trial.replay_capsule = imported.capsule.path;
  const auto result = kinds::run_attention_step(spec, trial);
  REQUIRE(result.status == "ok");
  double match = -1;
  for (const auto& m : result.metrics)
    if (m.name == "match") match = m.value;
  CHECK(match == 1.0);

  SECTION("problems are named") {
    auto broken = entries.copy();
    CHECK(broken.erase("grad_out") == 1);
    CHECK(error_of([&] { replay::import_step_file(save(broken, "a.pt"), dir.path); }).find("'grad_out' is missing") !=
          std::string::npos);
    broken = entries.copy();
    broken.insert_or_assign("meta", std::string(R"({"dims": {"anchors": 3, "heads": 4}, "mask": {"type": "dflash"}})"));
    const std::string error = error_of([&] { replay::import_step_file(save(broken, "b.pt"), dir.path); });
    CHECK(error.find("meta.dims.heads = 4 but the tensors have 2") != std::string::npos);
    CHECK(error.find("anchors x block_size = 48 but Q_LEN is 32") != std::string::npos);
    broken = entries.copy();
    broken.insert_or_assign("anchors", at::tensor(std::vector<int32_t>{20, 400}));
    CHECK(error_of([&] { replay::import_step_file(save(broken, "c.pt"), dir.path); })
              .find("mask.anchors[1] = 400 lies outside the context") != std::string::npos);
    std::ofstream(dir.file("d.pt")) << "not a zip";
    CHECK(error_of([&] { replay::import_step_file(dir.file("d.pt"), dir.path); }).find("torch.save") !=
          std::string::npos);
  }
}

// Hostile torch.save files: LibTorch allocates what a file declares (the zip directory's record
// sizes, the lengths of the pickle's strings) before reading it. Every input the import fuzzer
// keeps (tests/fuzz/import/) is imported or refused with CapsuleError, and the declared sizes are
// checked against the file before LibTorch sees them.
TEST_CASE("a torch.save file that declares more bytes than it has is refused before any allocation", "[replay][hostile]") {
  TempDir dir;
  const fs::path corpus = fs::path(HARNESS_TEST_DATA_DIR) / "fuzz" / "import";
  size_t inputs = 0;
  for (const auto& entry : fs::directory_iterator(corpus)) {
    INFO(entry.path().string());
    try {
      replay::import_step_file(entry.path().string(), dir.file("artifacts"));
    } catch (const replay::CapsuleError&) {
    }
    ++inputs;
  }
  CHECK(inputs >= 5);
  // The fuzzer's out-of-memory input: a 9.6 KB file whose pickle announces a 3.59 GB string.
  const std::string oom = error_of(
      [&] { replay::import_step_file((corpus / "regression-pickle-string-length.pt").string(), dir.path); });
  CHECK(oom.find("a string of 3590324227 bytes, but only") != std::string::npos);
  // The fuzzer's UInt4 tensor: LibTorch has no copy kernel
  // for it, and its NotImplementedError escaped the import; now refused, naming the entry.
  CHECK(error_of([&] { replay::import_step_file((corpus / "regression-uint4-tensor.pt").string(), dir.path); })
            .find("entry 'q' is a UInt4 tensor") != std::string::npos);
  // A tensor whose sizes and strides reach past its storage (found by the import fuzzer):
  // LibTorch's unpickler sets them unchecked and the copy read out of bounds (ASan SEGV).
  CHECK(error_of([&] { replay::import_step_file((corpus / "regression-storage-bounds.pt").string(), dir.path); })
            .find("reaches past its storage of") != std::string::npos);
  // And a LONG_BINPUT whose memo index (1 869 898 497) made LibTorch's unpickler ask for 30 GB.
  CHECK(error_of([&] { replay::import_step_file((corpus / "regression-memo-index.pt").string(), dir.path); })
            .find("a memo index of 1869898497 in a pickle of 210 bytes") != std::string::npos);

  // A well-formed file whose zip directory then claims 3 GB for data.pkl.
  c10::impl::GenericDict entries(c10::StringType::get(), c10::AnyType::get());
  entries.insert("q", at::zeros({1, 1, 16, 8}));
  entries.insert("meta", std::string("{}"));
  std::vector<char> bytes = torch::jit::pickle_save(entries);
  const std::string text(bytes.begin(), bytes.end());
  bool patched = false;
  for (size_t at = text.find("PK\x01\x02"); at != std::string::npos; at = text.find("PK\x01\x02", at + 4)) {
    const uint16_t name_length = static_cast<uint8_t>(text[at + 28]) | static_cast<uint8_t>(text[at + 29]) << 8;
    if (text.compare(at + 46, name_length, "archive/data.pkl") != 0) continue;
    const uint32_t huge = 3000000000u;
    for (int i = 0; i < 4; ++i) bytes[at + 24 + i] = static_cast<char>(huge >> (8 * i));
    patched = true;
  }
  REQUIRE(patched);
  std::ofstream(dir.file("huge.pt"), std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  CHECK(error_of([&] { replay::import_step_file(dir.file("huge.pt"), dir.path); })
            .find("record 'archive/data.pkl' declares 3000000000 bytes in a file of") != std::string::npos);
}

// A capsule written by the version 1 writer (before capsules became safetensors files), kept under
// tests/data/capsule_v1 (the step of tests/cli/replay_small.json's dims, seeded random inputs): it
// still verifies, loads and replays, and replays bit for bit like the same step re-written now.
TEST_CASE("a version 1 capsule still verifies and replays", "[replay][migration]") {
  const fs::path folder = fs::path(HARNESS_TEST_DATA_DIR) / "data" / "capsule_v1";
  std::string step_path;
  for (const auto& entry : fs::directory_iterator(folder))
    if (entry.path().extension() == replay::kStepExtension) step_path = entry.path().string();
  REQUIRE_FALSE(step_path.empty());
  const auto info = replay::inspect_capsule(step_path, /*verify_payload=*/true, fs::path(step_path).stem().string(), "the test");
  CHECK(info.version == replay::kLegacyCapsuleVersion);
  CHECK_FALSE(replay::is_safetensors_file(step_path));
  const spec::Spec step_spec = spec::parse_spec(info.header["spec"], step_path, true);
  const replay::StepTensors step = replay::load_step(info, step_spec);

  // The same step written in today's format.
  TempDir dir;
  nlohmann::json header = info.header;
  header.erase("tensors");
  header.erase("payload_bytes");
  const auto rewritten = replay::write_capsule(dir.file("v2"), header, replay::step_tensors(step), replay::kStepExtension);
  const auto info_v2 = replay::inspect_capsule(rewritten.path, true, rewritten.sha256, "the test");
  CHECK(info_v2.version == replay::kCapsuleVersion);

  std::vector<replay::CapsuleInfo> outputs;
  for (const std::string& capsule : {step_path, rewritten.path}) {
    auto context = context_for("fused", dir);
    context.keep_capsules = true;
    context.replay_capsule = capsule;
    const auto replayed = kinds::run_attention_step(step_spec, context);
    REQUIRE(replayed.status == "ok");
    const auto* written = artifact(replayed, "outputs");
    REQUIRE(written != nullptr);
    outputs.push_back(replay::inspect_capsule(written->path, true));
  }
  const auto comparisons = replay::compare_outputs(outputs[0], outputs[1]);
  REQUIRE(comparisons.size() == 8);  // out, dq, dk, dv of 2 layers
  for (const auto& c : comparisons) CHECK(c.bitwise_equal);
}

TEST_CASE("a mask file of packed bits or of a BlockMask's lists loads as the same blockmask", "[replay][blockmask]") {
  TempDir dir;
  const kernels::ResolvedMask tree = test::tree_mask(53, 153);
  const std::string packed = write_mask_file(dir, {{"mask.bits", replay::mask_bits_tensor(tree)}});
  const kernels::ResolvedMask from_bits = replay::load_mask_file(packed, 53, 153);
  const kernels::ResolvedMask from_lists = replay::load_mask_file(write_mask_file(dir, block_form(tree, 32, 48)), 53, 153);
  CHECK(*from_bits.bits == *tree.bits);
  CHECK(*from_lists.bits == *tree.bits);

  // Slices that are all alike collapse to one; slices that differ stay.
  const at::Tensor two = at::cat({replay::mask_bits_tensor(tree), replay::mask_bits_tensor(tree)}, 0);
  CHECK_FALSE(replay::load_mask_file(write_mask_file(dir, {{"mask.bits", two}}), 53, 153).sliced());
  at::Tensor differ = two.clone();
  differ[1][0][7][0] = differ[1][0][7][0].bitwise_xor(1);
  const kernels::ResolvedMask sliced = replay::load_mask_file(write_mask_file(dir, {{"mask.bits", differ}}), 53, 153);
  CHECK(sliced.bit_batch == 2);
  CHECK(sliced.slice(1, 0).visible(7, 0) != tree.visible(7, 0));

  // Wrong sizes and missing pieces are named.
  CHECK(error_of([&] { replay::load_mask_file(packed, 53, 200); }).find("need int32 [batch, heads, 53, 7]") != std::string::npos);
  replay::NamedTensors short_tiles = block_form(tree, 32, 48);
  short_tiles.back().second = short_tiles.back().second.narrow(0, 1, short_tiles.back().second.size(0) - 1);
  CHECK(error_of([&] { replay::load_mask_file(write_mask_file(dir, short_tiles), 53, 153); })
            .find("mask.partial_bits is [") != std::string::npos);
  replay::NamedTensors no_tiles = block_form(tree, 32, 48);
  no_tiles.pop_back();
  CHECK(error_of([&] { replay::load_mask_file(write_mask_file(dir, no_tiles), 53, 153); })
            .find("mask.partial_bits is missing") != std::string::npos);
}

TEST_CASE("a blockmask spec with v_head_dim 128 under head_dim 192 runs in fp16, its capsule carries the bits and replays",
          "[replay][blockmask]") {
  TempDir dir;
  const kernels::ResolvedMask prefix_lm = test::prefix_lm_mask(64, 164, 40);
  const std::string file = write_mask_file(dir, {{"mask.bits", replay::mask_bits_tensor(prefix_lm)}});
  const std::string text = R"({
    "name": "blockmask_test", "hypothesis": "test", "kind": "attention_step",
    "dims": {"batch": 1, "heads": 4, "kv_heads": 2, "head_dim": 192, "v_head_dim": 128, "anchors": 4, "block_size": 16,
             "context": 100, "dtype": "fp16"},
    "mask": {"type": "blockmask", "file": ")" + file + R"("},
    "block_mask": {"block_size": 32},
    "variants": {"fused": {"impl": "fused"}, "dense": {"impl": "dense"}},
    "repeats": 1, "warmup": 0, "seed": 5,
    "verdict": [{"if": "fused.match", "then": "OK"}, {"else": "MISMATCH"}]})";
  const spec::Spec spec = spec::load_spec_text(text, "blockmask_test");
  kinds::TrialRequest context;
  context.variant = "fused";
  context.device = "cpu";
  context.artifact_dir = dir.file("artifacts");
  context.result_path = dir.file("result.json");
  context.keep_capsules = true;
  const auto result = kinds::run_attention_step(spec, context);
  INFO(result.error);
  REQUIRE(result.status == "ok");
  for (const auto& metric : result.metrics)
    if (metric.name == "match") CHECK(metric.value == 1.0);
  const kinds::ArtifactRef* capsule = nullptr;
  for (const auto& artifact : result.artifacts)
    if (artifact.kind == "capsule") capsule = &artifact;
  REQUIRE(capsule != nullptr);
  const auto info = replay::inspect_capsule(capsule->path, true, capsule->sha256);
  REQUIRE(info.find("mask.bits") != nullptr);
  CHECK((info.find("v.0")->shape == std::vector<int64_t>{1, 2, 164, 128}));
  CHECK((info.header["spec"]["mask"] == nlohmann::json{{"type", "blockmask"}, {"in_capsule", true}}));

  // The replay reads the spec from the capsule: no mask file needed.
  ::remove(file.c_str());
  const spec::Spec from_capsule = spec::load_spec_text(info.header["spec"].dump(), "capsule");
  auto replay_context = context;
  replay_context.replay_capsule = capsule->path;
  replay_context.result_path = dir.file("replay.json");
  const auto replayed = kinds::run_attention_step(from_capsule, replay_context);
  INFO(replayed.error);
  REQUIRE(replayed.status == "ok");
  const kinds::ArtifactRef* before = nullptr;
  const kinds::ArtifactRef* after = nullptr;
  for (const auto& artifact : result.artifacts)
    if (artifact.kind == "outputs") before = &artifact;
  for (const auto& artifact : replayed.artifacts)
    if (artifact.kind == "outputs") after = &artifact;
  REQUIRE(before != nullptr);
  REQUIRE(after != nullptr);
  for (const auto& comparison :
       replay::compare_outputs(replay::inspect_capsule(before->path, true), replay::inspect_capsule(after->path, true)))
    CHECK(comparison.bitwise_equal);
}
