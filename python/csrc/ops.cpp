// The torch ops of the Python package (library "harness"), loaded by harness/ops.py with
// torch.ops.load_library:
//   fused_attention(q, k, v, mask...) -> (out, lse)              CPU and CUDA kernels
//   fused_attention_backward(grad_out, q, k, v, out, lse, mask...) -> (grad_q, grad_k, grad_v)
//   release_mask(uid), mask_cache_size()                          the mask cache
// Autograd (register_autograd) and the fake kernels (register_fake) are registered in Python,
// beside the checks that name the argument (harness/ops.py).
//
// A mask reaches the op as its description: a kind code, five ints (context, block_size, window,
// context_rule, in_block), the anchor, document-id and bits tensors (bits: a blockmask's words,
// int32 [bit_batch, bit_heads, Q_LEN, ceil(KV_LEN / 32)]), and a uid that the Python mask object
// owns. The first call of a (uid, q_len, kv_len) resolves it into a MaskContext, which
// then caches its BlockMasks and device arrays; later calls only look the uid up, so a mask built
// once outside a training loop costs a map lookup per step, and nothing here synchronizes the
// device after that first call (CUDA-graph capture needs that).

#include <ATen/ATen.h>
#include <torch/library.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/attention.h"
#include "kernels/mask_desc.h"

namespace harness::python_ops {
namespace {

namespace hk = harness::kernels;

// The order of kernels::MaskKind, as harness/masks.py's KIND_CODES spells it.
constexpr hk::MaskKind kKinds[] = {hk::MaskKind::dflash, hk::MaskKind::causal, hk::MaskKind::document_causal,
                                   hk::MaskKind::sliding_window, hk::MaskKind::full, hk::MaskKind::blockmask};

struct MaskKey {
  int64_t uid, q_len, kv_len;
  bool operator<(const MaskKey& other) const {
    return std::tie(uid, q_len, kv_len) < std::tie(other.uid, other.q_len, other.kv_len);
  }
};

std::mutex cache_mutex;
std::map<MaskKey, std::shared_ptr<hk::MaskContext>> mask_cache;

std::vector<int64_t> int64_values(const at::Tensor& tensor) {
  const at::Tensor cpu = tensor.to(at::kCPU, at::kLong).contiguous();
  return {cpu.data_ptr<int64_t>(), cpu.data_ptr<int64_t>() + cpu.numel()};
}

std::vector<int32_t> int32_values(const at::Tensor& tensor) {
  const at::Tensor cpu = tensor.to(at::kCPU, at::kInt).contiguous();
  return {cpu.data_ptr<int32_t>(), cpu.data_ptr<int32_t>() + cpu.numel()};
}

// The mask as ResolvedMask for these lengths, checked again here (Python checks first, with the
// argument names; this keeps a direct torch.ops call from reading out of bounds).
// A blockmask's bits: int32 [bit_batch, bit_heads, q_len, ceil(kv_len / 32)].
hk::ResolvedMask resolve_bits(const at::Tensor& bits, int64_t q_len, int64_t kv_len) {
  const int64_t words = hk::blockmask_words(kv_len);
  TORCH_CHECK(bits.scalar_type() == at::kInt && bits.dim() == 4 && bits.size(2) == q_len && bits.size(3) == words,
              "harness.fused_attention: a blockmask's bits must be int32 [batch, heads, Q_LEN ", q_len, ", ceil(KV_LEN / 32) ",
              words, "] (got ", bits.scalar_type(), " ", bits.sizes(), ")");
  const at::Tensor cpu = bits.to(at::kCPU).contiguous();
  const auto* data = reinterpret_cast<const uint32_t*>(cpu.data_ptr<int32_t>());
  try {
    return hk::blockmask_mask(q_len, kv_len, std::vector<uint32_t>(data, data + cpu.numel()), bits.size(0), bits.size(1));
  } catch (const std::invalid_argument& error) {
    TORCH_CHECK(false, "harness.fused_attention: ", error.what());
  }
}

hk::ResolvedMask resolve(int64_t kind_code, at::IntArrayRef params, const at::Tensor& anchors, const at::Tensor& doc_id,
                         const at::Tensor& bits, int64_t q_len, int64_t kv_len) {
  TORCH_CHECK(kind_code >= 0 && kind_code < static_cast<int64_t>(std::size(kKinds)), "harness.fused_attention: mask kind ",
              kind_code, " is not one of 0..", std::size(kKinds) - 1);
  if (kKinds[kind_code] == hk::MaskKind::blockmask) return resolve_bits(bits, q_len, kv_len);
  TORCH_CHECK(params.size() == 5, "harness.fused_attention: mask_params must be [context, block_size, window, "
              "context_rule, in_block] (got ", params.size(), " values)");
  TORCH_CHECK(!anchors.is_floating_point() && !doc_id.is_floating_point(),
              "harness.fused_attention: anchors and doc_id must be integer tensors");
  hk::ResolvedMask mask;
  mask.kind = kKinds[kind_code];
  mask.q_len = q_len;
  mask.kv_len = kv_len;
  mask.context_rule = params[3] == 1 ? hk::ContextRule::through_anchor : hk::ContextRule::before_anchor;
  mask.in_block = params[4] == 1 ? hk::InBlock::causal : hk::InBlock::bidirectional;
  mask.window = params[2];
  mask.doc_id = int32_values(doc_id);
  switch (mask.kind) {
    case hk::MaskKind::dflash: {
      mask.context = params[0];
      mask.block_size = params[1];
      mask.anchors = int64_values(anchors);
      const auto blocks = static_cast<int64_t>(mask.anchors.size());
      TORCH_CHECK(mask.block_size >= 1 && blocks >= 1 && q_len == blocks * mask.block_size,
                  "harness.fused_attention: q_len ", q_len, " is not anchors (", blocks, ") x block_size (",
                  mask.block_size, ")");
      TORCH_CHECK(kv_len == mask.context + q_len, "harness.fused_attention: kv_len ", kv_len, " is not context (",
                  mask.context, ") + q_len (", q_len, ")");
      TORCH_CHECK(static_cast<int64_t>(mask.doc_id.size()) == mask.context, "harness.fused_attention: doc_id has ",
                  mask.doc_id.size(), " entries, the context ", mask.context);
      for (int64_t anchor : mask.anchors) {
        TORCH_CHECK(anchor >= 0 && anchor < mask.context, "harness.fused_attention: anchor ", anchor,
                    " lies outside the context [0, ", mask.context, ")");
      }
      break;
    }
    case hk::MaskKind::document_causal:
      TORCH_CHECK(static_cast<int64_t>(mask.doc_id.size()) == kv_len, "harness.fused_attention: doc_id has ",
                  mask.doc_id.size(), " entries, KV_LEN is ", kv_len);
      break;
    case hk::MaskKind::sliding_window:
      TORCH_CHECK(mask.window >= 1, "harness.fused_attention: window must be >= 1 (got ", mask.window, ")");
      break;
    case hk::MaskKind::causal:
    case hk::MaskKind::full:
    case hk::MaskKind::blockmask:
      break;
  }
  return mask;
}

std::shared_ptr<hk::MaskContext> mask_context(const at::Tensor& q, const at::Tensor& k, int64_t kind_code,
                                              at::IntArrayRef params, const at::Tensor& anchors, const at::Tensor& doc_id,
                                              const at::Tensor& bits, int64_t uid) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4, "harness.fused_attention: q and k must be 4-D [B, H, L, D]");
  const MaskKey key{uid, q.size(2), k.size(2)};
  {
    std::lock_guard lock(cache_mutex);
    auto found = mask_cache.find(key);
    if (found != mask_cache.end()) return found->second;
  }
  // Resolved outside the lock: the first call copies the arrays to the CPU.
  auto context = std::make_shared<hk::MaskContext>(resolve(kind_code, params, anchors, doc_id, bits, key.q_len, key.kv_len));
  std::lock_guard lock(cache_mutex);
  return mask_cache.emplace(key, std::move(context)).first->second;  // a racing first call's entry wins
}

hk::AttentionOptions options_for(double scale) {
  hk::AttentionOptions options;
  options.impl = hk::AttentionImpl::fused;
  options.scale = scale;
  // No buffer kept past a call: under torch.compile(mode="reduce-overhead") the first call may
  // run inside a CUDA graph pool (CudaKernelChoice::keep_schedules).
  options.cuda_kernels.keep_schedules = false;
  return options;
}

std::tuple<at::Tensor, at::Tensor> fused_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                   int64_t mask_kind, at::IntArrayRef mask_params,
                                                   const at::Tensor& anchors, const at::Tensor& doc_id, const at::Tensor& bits,
                                                   int64_t mask_uid, double scale) {
  auto mask = mask_context(q, k, mask_kind, mask_params, anchors, doc_id, bits, mask_uid);
  try {
    hk::FusedForward result = hk::fused_attention_forward(q, k, v, *mask, options_for(scale));
    return {result.out, result.lse};
  } catch (const hk::UnsupportedError& error) {
    TORCH_CHECK_NOT_IMPLEMENTED(false, "harness.fused_attention: ", error.what());
  }
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_attention_backward(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
    const at::Tensor& lse, int64_t mask_kind, at::IntArrayRef mask_params, const at::Tensor& anchors,
    const at::Tensor& doc_id, const at::Tensor& bits, int64_t mask_uid, double scale) {
  auto mask = mask_context(q, k, mask_kind, mask_params, anchors, doc_id, bits, mask_uid);
  try {
    hk::FusedGradients grads = hk::fused_attention_backward(grad_out, q, k, v, out, lse, *mask, options_for(scale));
    return {grads.grad_q, grads.grad_k, grads.grad_v};
  } catch (const hk::UnsupportedError& error) {
    TORCH_CHECK_NOT_IMPLEMENTED(false, "harness.fused_attention_backward: ", error.what());
  }
}

void release_mask(int64_t uid) {
  std::lock_guard lock(cache_mutex);
  for (auto it = mask_cache.begin(); it != mask_cache.end();) {
    it = it->first.uid == uid ? mask_cache.erase(it) : std::next(it);
  }
}

int64_t mask_cache_size() {
  std::lock_guard lock(cache_mutex);
  return static_cast<int64_t>(mask_cache.size());
}

bool cuda_kernels_built() { return hk::cuda_kernels_built(); }

}  // namespace

TORCH_LIBRARY(harness, m) {
  m.def("fused_attention(Tensor q, Tensor k, Tensor v, int mask_kind, int[] mask_params, Tensor anchors, "
        "Tensor doc_id, Tensor bits, int mask_uid, float scale) -> (Tensor, Tensor)");
  m.def("fused_attention_backward(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, "
        "int mask_kind, int[] mask_params, Tensor anchors, Tensor doc_id, Tensor bits, int mask_uid, float scale) "
        "-> (Tensor, Tensor, Tensor)");
  m.def("release_mask(int mask_uid) -> ()", &release_mask);
  m.def("mask_cache_size() -> int", &mask_cache_size);
  m.def("cuda_kernels_built() -> bool", &cuda_kernels_built);
}

TORCH_LIBRARY_IMPL(harness, CPU, m) {
  m.impl("fused_attention", &fused_attention);
  m.impl("fused_attention_backward", &fused_attention_backward);
}

TORCH_LIBRARY_IMPL(harness, CUDA, m) {
  m.impl("fused_attention", &fused_attention);
  m.impl("fused_attention_backward", &fused_attention_backward);
}

}  // namespace harness::python_ops
