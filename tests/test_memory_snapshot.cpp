// Allocator snapshots read without LibTorch (analysis/pickle_reader.h, analysis/memory_snapshot.h):
// the pickle subset at protocols 2 (LibTorch's pickler) and 4 (Python's pickle.dump), refusal of
// anything that would execute code, the timeline, peak and OOM state of a snapshot, the names
// the memory model gives its blocks, and the SVGs the writeup embeds.

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>

#include "analysis/memory_snapshot.h"
#include "analysis/pickle_reader.h"
#include "experiments/memory_model.h"
#include "experiments/spec.h"
#include "tests/catch.h"
#include "tests/test_paths.h"

namespace {

namespace an = harness::analysis;

const std::string kData = std::string(HARNESS_TEST_DATA_DIR) + "/data/";

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

harness::memory_model::Prediction dense_prediction() {
  harness::spec::LoadOptions options;
  options.allow_faults = true;  // its "throw" variant
  const auto spec = harness::spec::load_spec_file(std::string(HARNESS_TEST_DATA_DIR) + "/cli/replay_small.json", options);
  return harness::memory_model::predict(spec, "dense", "cuda");
}

}  // namespace

TEST_CASE("the pickle reader reads protocol 2 and 4 alike", "[snapshot]") {
  const auto p2 = an::read_pickle(read_bytes(kData + "snapshot_synthetic_p2.pickle"));
  const auto p4 = an::read_pickle(read_bytes(kData + "snapshot_synthetic_p4.pickle"));
  CHECK(p2 == p4);
  REQUIRE(p2.contains("segments"));
  CHECK(p2["segments"].size() == 2);
  CHECK(p2["segments"][0]["address"].get<int64_t>() == 0x7F0000000000);  // LONG1
  CHECK(p2["segments"][0]["segment_pool_id"] == nlohmann::json::array({0, 0}));  // a tuple
  CHECK(p2["segments"][0]["is_expandable"] == false);
  CHECK(p2["device_traces"][0].back()["action"] == "oom");
}

TEST_CASE("the pickle reader refuses what would run code, and says where a pickle is cut", "[snapshot]") {
  // GLOBAL 'os system': how a pickle names a function to call. The reader stops there.
  const std::string global = "\x80\x02" "cos\nsystem\n";
  try {
    an::read_pickle(global);
    FAIL("a GLOBAL opcode was accepted");
  } catch (const an::PickleError& error) {
    CHECK(std::string(error.what()).find("0x63") != std::string::npos);
    CHECK(std::string(error.what()).find("byte 2") != std::string::npos);
  }
  const std::string whole = read_bytes(kData + "snapshot_synthetic_p2.pickle");
  try {
    an::read_pickle(whole.substr(0, whole.size() / 2));
    FAIL("a truncated pickle was accepted");
  } catch (const an::PickleError& error) {
    CHECK(std::string(error.what()).find("truncated") != std::string::npos);
  }
  // Integers: negative BININT, LONG1 of 8 bytes with the sign bit, BINFLOAT.
  const unsigned char numbers_bytes[] = {
      0x80, 0x02, ']', 'q', 0x00, '(',                               // PROTO 2, EMPTY_LIST, BINPUT 0, MARK
      'J', 0xff, 0xff, 0xff, 0xff,                                   // BININT -1
      0x8a, 0x08, 0, 0, 0, 0, 0, 0, 0, 0x80,                         // LONG1 of 8 bytes: INT64_MIN
      'G', 0x3f, 0xf8, 0, 0, 0, 0, 0, 0,                             // BINFLOAT 1.5 (big-endian)
      'e', '.'};                                                     // APPENDS, STOP
  const std::string numbers(reinterpret_cast<const char*>(numbers_bytes), sizeof numbers_bytes);
  const auto values = an::read_pickle(numbers);
  REQUIRE(values.size() == 3);
  CHECK(values[0].get<int64_t>() == -1);
  CHECK(values[1].get<int64_t>() == INT64_MIN);
  CHECK(values[2].get<double>() == 1.5);
}

TEST_CASE("a snapshot's timeline, peak and OOM, named by the memory model", "[snapshot]") {
  auto summary = an::read_snapshot(kData + "snapshot_synthetic_p4.pickle");
  CHECK(summary.device == 0);
  CHECK(summary.trace_events == 8);
  CHECK(summary.segments == 2);
  // Inputs (8 + 12 + 12 + 8 KiB), probabilities, out and the backward's scores are alive at the end.
  CHECK(summary.allocated_at_end == 40960 + 24576 + 8192 + 24576);
  CHECK(summary.reserved_at_end == 2 * (2 << 20));
  REQUIRE(summary.timeline.size() == 8);
  CHECK(summary.timeline[0].allocated == 40960 + 24576);          // after the forward's scores
  CHECK(summary.timeline[3].allocated == 40960 + 24576);          // scores freed, probabilities kept
  CHECK(summary.timeline[4].reserved == 2 << 20);                 // before the second segment
  CHECK(summary.timeline[5].reserved == 2 * (2 << 20));
  CHECK(summary.peak_allocated == summary.allocated_at_end);
  CHECK(summary.largest_block == 24576);
  REQUIRE(summary.oom);
  CHECK(summary.oom->requested_bytes == 24576);
  CHECK(summary.oom->device_free_bytes == 4096);
  CHECK(summary.oom->live.size() == 7);
  CHECK(summary.oom->live.front().bytes == 24576);

  an::name_blocks(summary, dense_prediction());
  CHECK(summary.oom->live.front().name.find("scores") != std::string::npos);
  CHECK(summary.oom->name.find("scores") != std::string::npos);
  const std::string bars = an::render_snapshot_peak_svg(summary, 5, "dense at the OOM");
  CHECK(bars.find("<svg") == 0);
  CHECK(bars.find("scores") != std::string::npos);
  CHECK(bars.find("requested, failed") != std::string::npos);
  CHECK(bars.find("24.0 KiB") != std::string::npos);
  const std::string timeline = an::render_snapshot_timeline_svg(summary, "dense");
  CHECK(timeline.find("OOM: asked") != std::string::npos);
  CHECK(timeline.find("allocated") != std::string::npos);
}

TEST_CASE("a snapshot file that is not one is named in the error", "[snapshot]") {
  try {
    an::read_snapshot(kData + "make_synthetic_snapshot.py");
    FAIL("a Python file was read as a snapshot");
  } catch (const an::SnapshotError& error) {
    CHECK(std::string(error.what()).find("make_synthetic_snapshot.py") != std::string::npos);
  }
  CHECK_THROWS_AS(an::summarize_snapshot(nlohmann::json::object(), "x.pickle"), an::SnapshotError);
}

// Two snapshots recorded on the H200 (7d845ad) by `harness run anchor_scaling --device cuda:0
// --memory-limit 96GiB --memory-snapshot` (dev/gpu/gpu_check_evidence.sh): the dense trial at 128
// anchors x 1 layer (ok), and the founding OOM, the dense trial at 512 anchors x 5 layers, whose
// snapshot the allocator's out-of-memory observer took at the failing request, before the step
// unwound: the four layers' 16 GiB scores are alive in it and the fifth asks for 16 GiB more.
static harness::memory_model::Prediction anchor_scaling_dense(int64_t anchors, int64_t layers) {
  harness::spec::LoadOptions options;
  options.overrides = {"dims.anchors=" + std::to_string(anchors), "dims.layers=" + std::to_string(layers)};
  const auto spec = harness::spec::load_spec_file(std::string(HARNESS_TEST_DATA_DIR) + "/../experiments/anchor_scaling.json",
                                                  options);
  return harness::memory_model::predict(spec, "dense", "cuda");
}

TEST_CASE("the snapshots recorded on the H200 read, and the founding OOM's names its 16 GiB scores", "[snapshot]") {
  constexpr int64_t kScores512 = int64_t{1} * 32 * 8192 * 16384 * 4;  // B·H·Q·KV·4 at 512 anchors: 16 GiB
  auto ok = an::read_snapshot(kData + "snapshot_h200.pickle");
  CHECK(ok.trace_events == 124);
  CHECK(ok.largest_block == int64_t{1} * 32 * 2048 * 10240 * 4);  // the scores at 128 anchors: 2.50 GiB
  CHECK(ok.peak_allocated >= ok.largest_block);
  CHECK_FALSE(ok.oom);

  auto oom = an::read_snapshot(kData + "snapshot_h200_oom.pickle");
  CHECK(oom.trace_events == 108);
  CHECK(oom.largest_block == kScores512);
  REQUIRE(oom.oom);
  CHECK(oom.oom->requested_bytes == kScores512);
  // Taken at the OOM: the earlier layers' scores are live blocks, not freed ones.
  REQUIRE(oom.oom->live.size() >= 4);
  for (size_t i = 0; i < 4; ++i) CHECK(oom.oom->live[i].bytes == kScores512);
  CHECK(oom.allocated_at_end >= 4 * kScores512);

  an::name_blocks(oom, anchor_scaling_dense(512, 5));
  CHECK(oom.oom->live.front().name.find("scores") != std::string::npos);
  CHECK(oom.oom->name.find("scores") != std::string::npos);
  const std::string bars = an::render_snapshot_peak_svg(oom, 6, "dense 512 anchors x 5 layers at the OOM");
  CHECK(bars.find("<svg") == 0);
  CHECK(bars.find("16.0 GiB") != std::string::npos);
  CHECK(bars.find("requested, failed") != std::string::npos);
  CHECK(an::render_snapshot_timeline_svg(oom, "dense").find("<svg") == 0);
}
