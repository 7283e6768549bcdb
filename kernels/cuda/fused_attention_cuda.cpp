// LibTorch boundary of the CUDA fused attention: every shape / dtype / device check happens here
// (TORCH_CHECK for misuse, UnsupportedError for what has no kernel); below this file the kernels
// take plain structs (attention_params.h) and trust them.

#include "kernels/cuda/fused_attention_cuda.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>

#include "kernels/cuda/attention_params.h"
#include "kernels/cuda/boundary.h"

namespace harness::kernels {

namespace {

namespace kc = harness::kernels::cuda;

//! What the backward needs besides the saved tensors. The BlockMask tensors and mask arrays are
//! held here (reference counted), so the graph stays valid even if the MaskContext goes away.
struct FusedCudaState : torch::CustomClassHolder {
  kc::AttentionShape shape;
  kc::MaskParams mask;
  at::Tensor anchors, doc_id;
  BlockMask fwd_blocks, dq_blocks, dkdv_blocks;
  float scale = 1.f;
  bool deterministic = false;
  DispatchTrace* trace = nullptr;
};

// Bound to this file's name for error messages; the helpers live in kernels/cuda/boundary.h.
constexpr const char* kWho = "fused_cuda attention";
using kc::mask_code;
int32_t to_int32(int64_t value, const char* what) { return kc::to_int32(value, kWho, what); }

//! The kernels read rows with 16-byte loads: last dim contiguous, other strides and the base
//! 16-byte aligned. Anything else is copied to a contiguous tensor once, here.
at::Tensor kernel_layout(const at::Tensor& t) {
  const bool ok = t.stride(3) == 1 && t.stride(0) % 8 == 0 && t.stride(1) % 8 == 0 && t.stride(2) % 8 == 0 &&
                  reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
  return ok ? t : t.contiguous();
}

kc::TensorRef tensor_ref(const at::Tensor& t) {
  kc::TensorRef ref;
  ref.data = t.data_ptr();
  ref.stride_batch = t.stride(0);
  ref.stride_head = t.stride(1);
  ref.stride_row = t.stride(2);
  return ref;
}

kc::BlockListParams block_list(const BlockMask& b) {
  kc::BlockListParams p;
  p.block_m = static_cast<int32_t>(b.block_m);
  p.block_n = static_cast<int32_t>(b.block_n);
  p.num_q_blocks = static_cast<int32_t>(b.num_q_blocks);
  p.num_kv_blocks = static_cast<int32_t>(b.num_kv_blocks);
  auto pointer = [](const at::Tensor& t, const char* name) {
    TORCH_CHECK(t.scalar_type() == at::kInt && t.is_contiguous() && t.is_cuda(), "fused_cuda attention: BlockMask ", name,
                " must be a contiguous int32 CUDA tensor");
    return t.data_ptr<int32_t>();
  };
  p.kv_num_blocks = pointer(b.kv_num_blocks, "kv_num_blocks");
  p.kv_indices = pointer(b.kv_indices, "kv_indices");
  p.full_kv_num_blocks = pointer(b.full_kv_num_blocks, "full_kv_num_blocks");
  p.full_kv_indices = pointer(b.full_kv_indices, "full_kv_indices");
  p.q_num_blocks = pointer(b.q_num_blocks, "q_num_blocks");
  p.q_indices = pointer(b.q_indices, "q_indices");
  p.full_q_num_blocks = pointer(b.full_q_num_blocks, "full_q_num_blocks");
  p.full_q_indices = pointer(b.full_q_indices, "full_q_indices");
  return p;
}

//! Runs a launcher, turning the kernels' "no such configuration" into the harness's UnsupportedError.
template <typename Launch>
void launch(Launch&& body) {
  try {
    body();
  } catch (const kc::UnsupportedConfig& error) {
    throw UnsupportedError(error.what());
  }
}

class FusedAttentionCuda : public torch::autograd::Function<FusedAttentionCuda> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, const c10::intrusive_ptr<FusedCudaState>& state) {
    const c10::cuda::CUDAGuard guard(q.device());
    at::Tensor out = at::empty(q.sizes(), q.options());
    at::Tensor lse = at::empty({q.size(0), q.size(1), q.size(2)}, q.options().dtype(at::kFloat));
    kc::FwdParams params;
    params.shape = state->shape;
    params.q = tensor_ref(q);
    params.k = tensor_ref(k);
    params.v = tensor_ref(v);
    params.o = tensor_ref(out);
    params.lse = lse.data_ptr<float>();
    params.scale = state->scale;
    params.mask = state->mask;
    params.blocks = block_list(state->fwd_blocks);
    at::Tensor scratch;
    launch([&] {
      scratch = at::empty({static_cast<int64_t>(kc::fwd_scratch_bytes(params.shape, params.blocks))},
                          q.options().dtype(at::kByte));
      params.scratch = scratch.data_ptr();
      params.scratch_bytes = static_cast<size_t>(scratch.numel());
      kc::run_attention_fwd(params, at::cuda::getCurrentCUDAStream(q.device().index()).stream());
    });
    ctx->save_for_backward({q, k, v, out, lse});
    // saved_data holds IValues only; a capsule carries the state without registering a class.
    ctx->saved_data["state"] = c10::IValue::make_capsule(state);
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &out = saved[3], &lse = saved[4];
    const auto state = c10::static_intrusive_pointer_cast<FusedCudaState>(ctx->saved_data["state"].toCapsule());
    const c10::cuda::CUDAGuard guard(q.device());
    TORCH_CHECK(grad_outputs.size() == 1 && grad_outputs[0].sizes() == out.sizes(),
                "fused_cuda attention backward: expected one gradient shaped like the output");
    const at::Tensor dout = kernel_layout(grad_outputs[0].to(at::kBFloat16));
    at::Tensor dq = at::empty(q.sizes(), q.options());
    at::Tensor dk = at::empty(k.sizes(), k.options());
    at::Tensor dv = at::empty(v.sizes(), v.options());

    kc::BwdParams params;
    params.shape = state->shape;
    params.q = tensor_ref(q);
    params.k = tensor_ref(k);
    params.v = tensor_ref(v);
    params.o = tensor_ref(out);
    params.dout = tensor_ref(dout);
    params.dq = tensor_ref(dq);
    params.dk = tensor_ref(dk);
    params.dv = tensor_ref(dv);
    params.lse = lse.data_ptr<float>();
    params.scale = state->scale;
    params.mask = state->mask;
    params.dq_blocks = block_list(state->dq_blocks);
    params.dkdv_blocks = block_list(state->dkdv_blocks);
    at::Tensor scratch;
    launch([&] {
      scratch = at::empty({static_cast<int64_t>(kc::bwd_scratch_bytes(params.shape, params.dq_blocks, params.dkdv_blocks))},
                          q.options().dtype(at::kByte));
      params.scratch = scratch.data_ptr();
      params.scratch_bytes = static_cast<size_t>(scratch.numel());
      kc::run_attention_bwd(params, at::cuda::getCurrentCUDAStream(q.device().index()).stream());
    });
    if (state->trace) {
      state->trace->record({"attention_bwd", "fused_cuda", q.device().str(),
                            std::string("fused backward: P recomputed from the LSE, dK/dV per kv block over the GQA "
                                        "group's heads, dQ per q block; no atomics, bitwise deterministic (deterministic=") +
                                (state->deterministic ? "true" : "false") + " costs nothing)",
                            kc::describe_bwd_config(state->shape)});
    }
    return {dq, dk, dv, at::Tensor()};
  }
};

}  // namespace

at::Tensor fused_attention_cuda(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in, MaskContext& mask,
                                double scale, bool deterministic, DispatchTrace* trace) {
  TORCH_CHECK(q_in.dim() == 4 && k_in.dim() == 4 && v_in.dim() == 4, "fused_cuda attention: q, k, v must be 4-D [B, H, L, D]");
  if (!q_in.is_cuda()) {
    throw UnsupportedError("fused_cuda attention: tensors are on " + q_in.device().str() + ", the kernels need a CUDA device");
  }
  TORCH_CHECK(k_in.device() == q_in.device() && v_in.device() == q_in.device(),
              "fused_cuda attention: q, k, v must be on one device (got ", q_in.device(), ", ", k_in.device(), ", ",
              v_in.device(), ")");
  if (q_in.scalar_type() != at::kBFloat16 || k_in.scalar_type() != at::kBFloat16 || v_in.scalar_type() != at::kBFloat16) {
    throw UnsupportedError(std::string("fused_cuda attention: dtype ") + c10::toString(q_in.scalar_type()) +
                           " has no kernel (bf16 only)");
  }
  const int64_t head_dim = q_in.size(3);
  if (!kc::head_dim_supported(static_cast<int>(head_dim))) {
    throw UnsupportedError("fused_cuda attention: head_dim " + std::to_string(head_dim) + " has no kernel (64 and 128 do)");
  }
  const auto* properties = at::cuda::getDeviceProperties(q_in.device().index());
  if (properties->major != 9) {
    throw UnsupportedError("fused_cuda attention: " + std::string(properties->name) + " is sm_" +
                           std::to_string(properties->major) + std::to_string(properties->minor) +
                           "; the kernels are built for sm_90a (Hopper)");
  }
  TORCH_CHECK(k_in.sizes() == v_in.sizes(), "fused_cuda attention: k and v must have one shape");
  TORCH_CHECK(q_in.size(0) == k_in.size(0), "fused_cuda attention: batch of q (", q_in.size(0), ") and k (", k_in.size(0),
              ") differ");
  TORCH_CHECK(k_in.size(1) > 0 && q_in.size(1) % k_in.size(1) == 0, "fused_cuda attention: heads (", q_in.size(1),
              ") must be a multiple of kv heads (", k_in.size(1), ")");
  TORCH_CHECK(k_in.size(3) == head_dim, "fused_cuda attention: head_dim of q (", head_dim, ") and k (", k_in.size(3),
              ") differ");
  const ResolvedMask& resolved = mask.mask();
  TORCH_CHECK(q_in.size(2) == resolved.q_len && k_in.size(2) == resolved.kv_len, "fused_cuda attention: lengths q ",
              q_in.size(2), ", kv ", k_in.size(2), " do not match the mask's q_len ", resolved.q_len, ", kv_len ",
              resolved.kv_len);
  TORCH_CHECK(scale > 0.0 && std::isfinite(scale), "fused_cuda attention: scale must be positive and finite (got ", scale, ")");

  const at::Tensor q = kernel_layout(q_in), k = kernel_layout(k_in), v = kernel_layout(v_in);
  auto state = c10::make_intrusive<FusedCudaState>();
  state->shape = kc::AttentionShape{to_int32(q.size(0), "batch"), to_int32(q.size(1), "heads"), to_int32(k.size(1), "kv_heads"),
                                    to_int32(q.size(2), "q_len"), to_int32(k.size(2), "kv_len"),
                                    static_cast<int32_t>(head_dim)};
  state->scale = static_cast<float>(scale);
  state->deterministic = deterministic;
  state->trace = trace;
  state->anchors = mask.anchors(q.device());
  state->doc_id = mask.doc_id(q.device());
  state->mask.kind = mask_code(resolved.kind);
  state->mask.through_anchor = resolved.context_rule == ContextRule::through_anchor;
  state->mask.in_block_causal = resolved.in_block == InBlock::causal;
  state->mask.q_len = to_int32(resolved.q_len, "q_len");
  state->mask.kv_len = to_int32(resolved.kv_len, "kv_len");
  state->mask.context = to_int32(resolved.context, "context");
  state->mask.block_size = to_int32(resolved.block_size, "block_size");
  state->mask.window = to_int32(resolved.window, "window");
  state->mask.anchors = state->anchors.numel() ? state->anchors.data_ptr<int32_t>() : nullptr;
  state->mask.doc_id = state->doc_id.numel() ? state->doc_id.data_ptr<int32_t>() : nullptr;
  TORCH_CHECK(resolved.kind != MaskKind::dflash ||
                  (state->anchors.numel() * resolved.block_size >= resolved.q_len && state->doc_id.numel() >= resolved.context),
              "fused_cuda attention: the dflash mask needs an anchor per draft block and a document id per context position");
  TORCH_CHECK(resolved.kind != MaskKind::document_causal || state->doc_id.numel() >= resolved.kv_len,
              "fused_cuda attention: the document_causal mask needs a document id per KV position");

  kc::TileShape fwd_tile, dq_tile, dkdv_tile;
  launch([&] {
    fwd_tile = kc::fwd_tile_shape(state->shape);
    dq_tile = kc::bwd_dq_tile_shape(state->shape);
    dkdv_tile = kc::bwd_dkdv_tile_shape(state->shape);
  });
  // Each kernel reads the BlockMask at its own tiling (MaskContext builds each once and caches it;
  // equal tilings share one).
  state->fwd_blocks = mask.block_mask(fwd_tile.block_m, fwd_tile.block_n, q.device());
  state->dq_blocks = mask.block_mask(dq_tile.block_m, dq_tile.block_n, q.device());
  state->dkdv_blocks = mask.block_mask(dkdv_tile.block_m, dkdv_tile.block_n, q.device());

  at::Tensor out = FusedAttentionCuda::apply(q, k, v, state);
  if (trace) {
    trace->record({"attention_fwd", "fused_cuda", q.device().str(),
                   "impl=fused on CUDA: block-sparse flash attention (bf16, online softmax, LSE saved), empty blocks "
                   "skipped, full blocks without mask work",
                   kc::describe_fwd_config(state->shape)});
  }
  return out;
}

}  // namespace harness::kernels
