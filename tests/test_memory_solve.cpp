// Solving the memory model for a free dim (experiments/memory_solve.h): the founding message
// "Tried to allocate 15.09 GiB" at 512 anchors and 32 heads implies a context near 7 260; the
// printed size's rounding interval; pinned and impossible dims.

#include <cmath>
#include <string>

#include "experiments/memory_model.h"
#include "experiments/memory_solve.h"
#include "experiments/spec.h"
#include "experiments/sweep.h"
#include "tests/catch.h"
#include "tests/test_paths.h"

namespace {

namespace mm = harness::memory_model;

constexpr int64_t kGiB = int64_t{1} << 30;

std::vector<std::pair<nlohmann::json, harness::spec::Spec>> anchor_scaling(const std::vector<std::string>& overrides) {
  harness::spec::LoadOptions options;
  options.overrides = overrides;
  const auto spec = harness::spec::load_spec_file(std::string(HARNESS_EXPERIMENTS_DIR) + "/anchor_scaling.json", options);
  std::vector<std::pair<nlohmann::json, harness::spec::Spec>> points;
  for (const auto& point : harness::spec::sweep_points(spec)) points.emplace_back(point, harness::spec::spec_at_point(spec, point));
  return points;
}

const mm::Solution* find_solution(const mm::DimSolve& solve, const std::string& tensor) {
  for (const auto& s : solve.solutions)
    if (s.tensor == tensor) return &s;
  return nullptr;
}

}  // namespace

TEST_CASE("a printed size stands for the interval its last digit rounds", "[memory_solve]") {
  const auto interval = mm::request_interval("CUDA out of memory. Tried to allocate 15.09 GiB. GPU 0 has ...", 0);
  // [15.085, 15.095) GiB
  CHECK(interval.low == static_cast<int64_t>(std::ceil(15.085 * kGiB)));
  CHECK(interval.high == static_cast<int64_t>(std::ceil(15.095 * kGiB)) - 1);
  CHECK(interval.nominal == static_cast<int64_t>(std::llround(15.09 * kGiB)));
  CHECK(interval.printed == "15.09 GiB");
  // Exact byte counts stay exact.
  const auto exact = mm::request_interval("requested 17179869184 bytes", 17179869184);
  CHECK(exact.low == 17179869184);
  CHECK(exact.high == 17179869184);
  const auto bare = mm::request_interval("", 4096);
  CHECK(bare.low == 4096);
  CHECK(bare.high == 4096);
  const auto one_digit = mm::request_interval("16 GiB", 16 * kGiB);
  CHECK(one_digit.low == 15 * kGiB + kGiB / 2);
}

TEST_CASE("explain-oom --solve: 15.09 GiB at 512 anchors and 32 heads is a context near 7260", "[memory_solve]") {
  const auto points = anchor_scaling({"dims.anchors=512", "dims.layers=5"});
  REQUIRE(points.size() == 1);
  const auto interval = mm::request_interval("Tried to allocate 15.09 GiB", 0);
  const auto solves = mm::solve(points, {"dims.context"}, {}, interval, "cuda");
  REQUIRE(solves.size() == 1);
  const mm::Solution* scores = find_solution(solves[0], "scores");
  REQUIRE(scores != nullptr);
  // scores = 1·32·8192·KV·4 B = KV MiB; KV = context + 8192; PyTorch asks for whole 2 MiB and
  // prints "15.09 GiB" for 15447.04..15457.28 MiB, so KV in 15447..15456 (rounded up to even).
  CHECK(scores->variants == "dense");
  CHECK(scores->first == 15447 - 8192);
  CHECK(scores->last == 15456 - 8192);
  CHECK(scores->best >= 7255);
  CHECK(scores->best <= 7265);
  CHECK(scores->best_shape == std::vector<int64_t>{1, 32, 8192, scores->best + 8192});
  CHECK(scores->best_request_bytes >= interval.low);
  CHECK(scores->best_request_bytes <= interval.high);
  CHECK(scores->best_request_bytes == mm::cuda_request_bytes(scores->best_tensor_bytes));
  CHECK(scores->invalid.empty());
  CHECK(scores->spec_value == 8192);
  const std::vector<std::string> expected_set = {"dims.context=" + std::to_string(scores->best)};
  CHECK(scores->set_args == expected_set);
  // The replayed point asks for a request that prints as the message did.
  auto at = points[0].second;
  at.dims.context = scores->best;
  const auto prediction = mm::predict(at, "dense", "cuda");
  bool found = false;
  for (const auto& a : prediction.allocations)
    if (a.tensor == "scores") found = mm::cuda_request_bytes(a.bytes) == scores->best_request_bytes;
  CHECK(found);
}

TEST_CASE("explain-oom --solve every free dim: pinned ones are skipped, impossible ones say so", "[memory_solve]") {
  const auto points = anchor_scaling({"dims.anchors=512", "dims.layers=5"});
  const auto interval = mm::request_interval("Tried to allocate 15.09 GiB", 0);
  const auto solves = mm::solve(points, mm::solvable_dims(), {"dims.anchors"}, interval, "cuda");
  REQUIRE(solves.size() == 4);
  CHECK(solves[0].dim == "dims.context");
  CHECK(find_solution(solves[0], "scores") != nullptr);
  CHECK(solves[1].dim == "dims.anchors");
  CHECK(solves[1].skipped == "pinned by --set");
  // heads: scores are 512 MiB per head at this point, so 30.2 heads; no whole head count asks for 15.09 GiB.
  CHECK(solves[2].dim == "dims.heads");
  CHECK(find_solution(solves[2], "scores") == nullptr);
  CHECK_THROWS_AS(mm::solve(points, {"dims.head_dim"}, {}, interval, "cuda"), std::invalid_argument);
}

TEST_CASE("explain-oom --solve at every sweep point lists the --set that replays each", "[memory_solve]") {
  const auto points = anchor_scaling({});
  REQUIRE(points.size() == 6);
  const auto interval = mm::request_interval("", 16 * kGiB);
  const auto solves = mm::solve(points, {"context"}, {}, interval, "cuda");
  REQUIRE(solves.size() == 1);
  // At 512 anchors the spec's own context (8192) asks for exactly 16 GiB.
  bool spec_point = false;
  for (const auto& s : solves[0].solutions) {
    if (s.tensor != "scores" || s.point.value("dims.anchors", 0) != 512) continue;
    CHECK(s.first <= 8192);
    CHECK(s.last >= 8192);
    CHECK(s.best == 8192);
    CHECK(s.set_args.front() == "dims.anchors=512");
    CHECK(s.set_args.back() == "dims.context=8192");
    spec_point = true;
  }
  CHECK(spec_point);
}
