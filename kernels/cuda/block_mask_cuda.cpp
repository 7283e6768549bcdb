// LibTorch boundary of the GPU BlockMask builder: checks, one output allocation, the MaskParams
// the device predicate needs, and the launch on the device's current stream.

#include "kernels/cuda/block_mask_cuda.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>

#include "kernels/cuda/attention_params.h"
#include "kernels/cuda/boundary.h"
#include "kernels/cuda/block_mask_build.h"

namespace harness::kernels {

namespace {

namespace kc = harness::kernels::cuda;

// Bound to this file's name for error messages; the helpers live in kernels/cuda/boundary.h.
constexpr const char* kWho = "build_block_mask_cuda";
int32_t to_int32(int64_t value, const char* what) { return kc::to_int32(value, kWho, what); }

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

void check_int32_on(const at::Tensor& tensor, const at::Device& device, const char* name) {
  TORCH_CHECK(tensor.device() == device && tensor.scalar_type() == at::kInt && tensor.is_contiguous(),
              "build_block_mask_cuda: ", name, " must be a contiguous int32 tensor on ", device, " (got ",
              tensor.scalar_type(), " on ", tensor.device(), ")");
}

}  // namespace

BlockMask build_block_mask_cuda(const ResolvedMask& mask, int64_t block_m, int64_t block_n,
                                const at::Device& requested_device, const at::Tensor& anchors_dev,
                                const at::Tensor& doc_id_dev, const at::Tensor& bits_dev) {
  BlockMask block_mask = block_mask_geometry(mask, block_m, block_n, kWho);
  TORCH_CHECK(requested_device.is_cuda(), "build_block_mask_cuda: device must be CUDA (got ", requested_device, ")");
  // "cuda" without an index means the current device; the mask arrays carry an explicit index.
  const at::Device device = requested_device.has_index()
                                ? requested_device
                                : at::Device(at::kCUDA, c10::cuda::current_device());
  const c10::cuda::CUDAGuard guard(device);

  kc::BlockMaskBuildParams params;
  check_int32_on(anchors_dev, device, "anchors");
  check_int32_on(doc_id_dev, device, "doc_id");
  check_int32_on(bits_dev, device, "bits");
  params.mask = kc::mask_params(mask, anchors_dev, doc_id_dev, bits_dev, "build_block_mask_cuda");

  const int64_t num_q_blocks = block_mask.num_q_blocks;
  const int64_t num_kv_blocks = block_mask.num_kv_blocks;
  const int64_t pairs = num_q_blocks * num_kv_blocks;
  TORCH_CHECK(pairs <= std::numeric_limits<int32_t>::max(), "build_block_mask_cuda: ", num_q_blocks, " x ",
              num_kv_blocks, " block pairs exceed the builder's one-CTA-per-pair grid");
  params.block_m = to_int32(block_m, "block_m");
  params.block_n = to_int32(block_n, "block_n");
  params.num_q_blocks = static_cast<int32_t>(num_q_blocks);
  params.num_kv_blocks = static_cast<int32_t>(num_kv_blocks);

  // One allocation for the eight outputs and the state bytes (one caching-allocator call instead
  // of nine), each segment starting on a 64-element (256-byte) boundary as a separate tensor would.
  // The kernels write every element, so the buffer is not zeroed.
  constexpr int64_t kAlign = 64;
  const auto padded = [](int64_t elements) { return ceil_div(elements, kAlign) * kAlign; };
  const int64_t state_words = ceil_div(pairs, static_cast<int64_t>(sizeof(int32_t)));
  const int64_t span_words = 4 * mask.q_len;  // int4 per query row
  const int64_t total =
      4 * padded(num_q_blocks) + 4 * padded(num_kv_blocks) + 4 * padded(pairs) + padded(state_words) + padded(span_words);
  const at::Tensor buffer = at::empty({total}, at::TensorOptions().dtype(at::kInt).device(device));
  int64_t offset = 0;
  const auto take = [&](at::IntArrayRef shape) {
    int64_t elements = 1;
    for (const int64_t size : shape) elements *= size;
    at::Tensor view = buffer.narrow(0, offset, elements).view(shape);
    offset += padded(elements);
    return view;
  };
  block_mask.kv_num_blocks = take({1, 1, num_q_blocks});
  block_mask.kv_indices = take({1, 1, num_q_blocks, num_kv_blocks});
  block_mask.full_kv_num_blocks = take({1, 1, num_q_blocks});
  block_mask.full_kv_indices = take({1, 1, num_q_blocks, num_kv_blocks});
  block_mask.q_num_blocks = take({1, 1, num_kv_blocks});
  block_mask.q_indices = take({1, 1, num_kv_blocks, num_q_blocks});
  block_mask.full_q_num_blocks = take({1, 1, num_kv_blocks});
  block_mask.full_q_indices = take({1, 1, num_kv_blocks, num_q_blocks});
  int32_t* const states = buffer.data_ptr<int32_t>() + offset;
  params.pair_states = reinterpret_cast<uint8_t*>(states);
  offset += padded(state_words);
  params.row_spans = reinterpret_cast<int4*>(buffer.data_ptr<int32_t>() + offset);  // 256-byte aligned
  // A blockmask row is no pair of intervals: its pairs are classified element by element.
  params.docs_contiguous = mask.kind != MaskKind::blockmask && std::is_sorted(mask.doc_id.begin(), mask.doc_id.end());
  params.kv_num_blocks = block_mask.kv_num_blocks.data_ptr<int32_t>();
  params.kv_indices = block_mask.kv_indices.data_ptr<int32_t>();
  params.full_kv_num_blocks = block_mask.full_kv_num_blocks.data_ptr<int32_t>();
  params.full_kv_indices = block_mask.full_kv_indices.data_ptr<int32_t>();
  params.q_num_blocks = block_mask.q_num_blocks.data_ptr<int32_t>();
  params.q_indices = block_mask.q_indices.data_ptr<int32_t>();
  params.full_q_num_blocks = block_mask.full_q_num_blocks.data_ptr<int32_t>();
  params.full_q_indices = block_mask.full_q_indices.data_ptr<int32_t>();

  kc::run_block_mask_build(params, at::cuda::getCurrentCUDAStream(device.index()));
  return block_mask;
}

}  // namespace harness::kernels
