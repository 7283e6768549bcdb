#include "kernels/attention.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <sstream>
#include <utility>

#include "kernels/fused_function.h"

#ifdef HARNESS_WITH_CUDA_KERNELS
#include "kernels/cuda/block_mask_cuda.h"
#include "kernels/cuda/fused_attention_cuda.h"
#endif

namespace harness::kernels {

MaskContext::MaskContext(ResolvedMask mask) : mask_(std::move(mask)) {}

const BlockMask& MaskContext::block_mask(int64_t block_m, int64_t block_n, const at::Device& device) {
#ifdef HARNESS_WITH_CUDA_KERNELS
  // On a GPU the BlockMask is built there from the mask arrays (build_block_mask_cuda) instead of
  // on the CPU and copied: the CPU build takes ~22 ms (one EPYC thread) at dflash Q 2048, KV 10240, block 128,
  // ~90 times one 0.25 ms forward. The arrays are fetched before taking mutex_, which anchors()
  // and doc_id() lock themselves; their cache entries never move, so the references stay valid.
  if (device.is_cuda()) {
    const at::Tensor& anchors_dev = anchors(device);
    const at::Tensor& doc_id_dev = doc_id(device);
    const at::Tensor& bits_dev = bits(device);
    std::lock_guard lock(mutex_);
    const auto key = std::make_tuple(block_m, block_n, device.str());
    auto found = block_masks_.find(key);
    if (found == block_masks_.end()) {
      found = block_masks_
                  .emplace(key, build_block_mask_cuda(mask_, block_m, block_n, device, anchors_dev, doc_id_dev, bits_dev))
                  .first;
    }
    return found->second;
  }
#endif
  std::lock_guard lock(mutex_);
  const auto key = std::make_tuple(block_m, block_n, device.str());
  auto found = block_masks_.find(key);
  if (found != block_masks_.end()) return found->second;
  // A device copy is made from the CPU one, which is then cached as well.
  const auto cpu_key = std::make_tuple(block_m, block_n, at::Device(at::kCPU).str());
  auto cpu = block_masks_.find(cpu_key);
  if (cpu == block_masks_.end()) cpu = block_masks_.emplace(cpu_key, build_block_mask(mask_, block_m, block_n)).first;
  if (device.is_cpu()) return cpu->second;
  return block_masks_.emplace(key, cpu->second.to(device)).first->second;
}

std::shared_ptr<MaskContext::KeptBuffer> MaskContext::kept_buffer(const std::string& key, int64_t bytes,
                                                                 const at::Device& device) {
  const std::string full_key = key + "@" + device.str();
  std::lock_guard lock(mutex_);
  std::shared_ptr<KeptBuffer>& kept = kept_[full_key];
  if (!kept || kept->tensor.numel() < bytes) {
    kept = std::make_shared<KeptBuffer>();
    kept->tensor = at::empty({std::max<int64_t>(bytes, 1)}, at::TensorOptions().dtype(at::kByte).device(device));
  }
  return kept;
}

namespace {

// One cached tensor per device string; std::map nodes never move, so references stay valid.
template <typename Make>
const at::Tensor& cached(std::map<std::string, at::Tensor>& cache, const at::Device& device, Make&& make) {
  auto found = cache.find(device.str());
  if (found == cache.end()) found = cache.emplace(device.str(), make().to(device)).first;
  return found->second;
}

at::Tensor int32_tensor(const std::vector<int64_t>& values) {
  at::Tensor tensor = at::empty({static_cast<int64_t>(values.size())}, at::kInt);
  auto* data = tensor.data_ptr<int32_t>();
  for (std::size_t i = 0; i < values.size(); ++i) data[i] = static_cast<int32_t>(values[i]);
  return tensor;
}

}  // namespace

const at::Tensor& MaskContext::anchors(const at::Device& device) {
  std::lock_guard lock(mutex_);
  return cached(anchors_, device, [&] { return int32_tensor(mask_.anchors); });
}

const at::Tensor& MaskContext::doc_id(const at::Device& device) {
  std::lock_guard lock(mutex_);
  return cached(doc_id_, device, [&] {
    return at::tensor(at::ArrayRef<int32_t>(mask_.doc_id), at::kInt);
  });
}

const at::Tensor& MaskContext::bits(const at::Device& device) {
  std::lock_guard lock(mutex_);
  return cached(bits_, device, [&] {
    if (mask_.kind != MaskKind::blockmask) return at::empty({0}, at::kInt);
    // The words of the slice visible() reads, as int32 (the same 32 bits), copied.
    auto* data = const_cast<uint32_t*>(mask_.bit_row(0));
    return at::from_blob(data, {mask_.q_len, mask_.bit_words}, at::kInt).clone();
  });
}

const at::Tensor& MaskContext::dense(const at::Device& device) {
  std::lock_guard lock(mutex_);
  return cached(dense_, device, [&] {
    if (!mask_.sliced()) return dense_mask(mask_);
    std::vector<at::Tensor> slices;
    for (int64_t batch = 0; batch < mask_.bit_batch; ++batch)
      for (int64_t head = 0; head < mask_.bit_heads; ++head) slices.push_back(dense_mask(mask_.slice(batch, head)));
    return at::stack(slices).view({mask_.bit_batch, mask_.bit_heads, mask_.q_len, mask_.kv_len});
  });
}

std::shared_ptr<MaskContext> MaskContext::slice(int64_t batch, int64_t head) {
  const int64_t index = (batch % mask_.bit_batch) * mask_.bit_heads + head % mask_.bit_heads;
  std::lock_guard lock(mutex_);
  std::shared_ptr<MaskContext>& context = slices_[index];
  if (!context) context = std::make_shared<MaskContext>(mask_.slice(batch, head));
  return context;
}

bool cuda_kernels_built() {
#ifdef HARNESS_WITH_CUDA_KERNELS
  return true;
#else
  return false;
#endif
}

namespace {

std::string shape_of(const at::Tensor& tensor) {
  std::ostringstream text;
  text << tensor.sizes();
  return text.str();
}

// The boundary checks: everything below assumes them.
void check_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const ResolvedMask& mask) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4,
              "attention: q, k, v must be 4-D [B, H, L, D] (got q ", shape_of(q), ", k ", shape_of(k), ", v ", shape_of(v), ")");
  TORCH_CHECK(q.scalar_type() == k.scalar_type() && q.scalar_type() == v.scalar_type(),
              "attention: q, k, v must share a dtype (got ", q.scalar_type(), ", ", k.scalar_type(), ", ", v.scalar_type(), ")");
  TORCH_CHECK(at::isFloatingType(q.scalar_type()), "attention: q, k, v must be floating point (got ", q.scalar_type(), ")");
  TORCH_CHECK(q.device() == k.device() && q.device() == v.device(),
              "attention: q, k, v must be on one device (got ", q.device(), ", ", k.device(), ", ", v.device(), ")");
  TORCH_CHECK(k.size(0) == v.size(0) && k.size(1) == v.size(1) && k.size(2) == v.size(2),
              "attention: k and v must have one batch, kv heads and KV_LEN (got k ", shape_of(k), ", v ", shape_of(v),
              "; only their head dims may differ)");
  TORCH_CHECK(q.size(0) == k.size(0), "attention: batch of q (", q.size(0), ") and k (", k.size(0), ") differ");
  TORCH_CHECK(k.size(1) > 0 && q.size(1) % k.size(1) == 0, "attention: heads of q (", q.size(1),
              ") must be a multiple of the kv heads (", k.size(1), ")");
  TORCH_CHECK(q.size(3) == k.size(3), "attention: head_dim of q (", q.size(3), ") and k (", k.size(3), ") differ");
  TORCH_CHECK(q.size(2) == mask.q_len && k.size(2) == mask.kv_len, "attention: sequence lengths q ", q.size(2), ", kv ",
              k.size(2), " do not match the mask's q_len ", mask.q_len, ", kv_len ", mask.kv_len);
  TORCH_CHECK((mask.bit_batch == 1 || mask.bit_batch == q.size(0)) && (mask.bit_heads == 1 || mask.bit_heads == q.size(1)),
              "attention: the blockmask has ", mask.bit_batch, " batch x ", mask.bit_heads, " head slices; each must be 1 ",
              "or the call's batch (", q.size(0), ") and heads (", q.size(1), ")");
}

// A sliced mask's calls: one per (batch element, query head) pattern, each on the narrowed inputs
// (k and v narrowed to the query head's kv head when the heads are sliced), in batch-major order.
struct SliceCall {
  int64_t batch, batch_count, head, head_count, kv_head, kv_count;
  std::shared_ptr<MaskContext> mask;
  at::Tensor rows(const at::Tensor& t) const { return t.narrow(0, batch, batch_count).narrow(1, head, head_count); }
  at::Tensor kv_rows(const at::Tensor& t) const { return t.narrow(0, batch, batch_count).narrow(1, kv_head, kv_count); }
};

std::vector<SliceCall> slice_calls(const at::Tensor& q, const at::Tensor& k, MaskContext& mask) {
  const ResolvedMask& m = mask.mask();
  const int64_t batch = q.size(0), heads = q.size(1), group = q.size(1) / k.size(1);
  const int64_t batch_steps = m.bit_batch > 1 ? batch : 1, head_steps = m.bit_heads > 1 ? heads : 1;
  std::vector<SliceCall> calls;
  for (int64_t b = 0; b < batch_steps; ++b) {
    for (int64_t h = 0; h < head_steps; ++h) {
      const bool per_head = head_steps > 1;
      calls.push_back({b, batch_steps > 1 ? 1 : batch, h, per_head ? 1 : heads, per_head ? h / group : 0,
                       per_head ? 1 : k.size(1), mask.slice(b, h)});
    }
  }
  return calls;
}

// Joins per-slice results [b, h, ...] in call order back into [B, H, ...].
at::Tensor join_slices(const std::vector<SliceCall>& calls, const std::vector<at::Tensor>& parts) {
  std::vector<at::Tensor> rows;  // one per batch step, its heads joined
  for (std::size_t i = 0; i < calls.size();) {
    std::vector<at::Tensor> heads;
    const int64_t batch = calls[i].batch;
    for (; i < calls.size() && calls[i].batch == batch; ++i) heads.push_back(parts[i]);
    rows.push_back(heads.size() == 1 ? heads[0] : at::cat(heads, 1));
  }
  return rows.size() == 1 ? rows[0] : at::cat(rows, 0);
}

// Runs a fused implementation. When it has no kernel for the call (dtype, head dim, device), the
// trace says so and why before the UnsupportedError goes on: no implementation ran, and a trial
// records the call "unsupported" with this record in its dispatch.
template <typename Run>
auto recording_unsupported(const AttentionOptions& options, const char* op, const at::Tensor& q, Run&& run)
    -> decltype(run()) {
  try {
    return run();
  } catch (const UnsupportedError& error) {
    if (options.trace) {
      options.trace->record({op, "unsupported", q.device().str(), std::string("no fused kernel ran: ") + error.what(), ""});
    }
    throw;
  }
}

//! A sliced mask's calls and the options they run with; kept with the autograd node.
struct SlicedCalls : torch::CustomClassHolder {
  std::vector<SliceCall> calls;
  AttentionOptions options;
  int64_t bit_batch = 1, bit_heads = 1;  //!< the whole mask's slice counts, for the trace

  void record(const char* op, const at::Tensor& q) const {
    if (!options.trace) return;
    const std::string varies = bit_batch > 1 && bit_heads > 1 ? "batch elements and heads"
                               : bit_batch > 1                ? "batch elements"
                                                              : "heads";
    options.trace->record({op, "sliced", q.device().str(),
                           "the blockmask differs between " + varies + ": " + std::to_string(calls.size()) +
                               " fused calls, one per slice (their records follow)",
                           "slices=" + std::to_string(bit_batch) + "x" + std::to_string(bit_heads)});
  }
};

c10::intrusive_ptr<SlicedCalls> sliced_calls(const at::Tensor& q, const at::Tensor& k, MaskContext& mask,
                                             const AttentionOptions& options) {
  auto sliced = c10::make_intrusive<SlicedCalls>();
  sliced->calls = slice_calls(q, k, mask);
  sliced->options = options;
  sliced->bit_batch = mask.mask().bit_batch;
  sliced->bit_heads = mask.mask().bit_heads;
  return sliced;
}

FusedForward sliced_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const SlicedCalls* sliced) {
  sliced->record("attention_fwd", q);
  std::vector<at::Tensor> outs, lses;
  for (const SliceCall& call : sliced->calls) {
    FusedForward part =
        fused_attention_forward(call.rows(q), call.kv_rows(k), call.kv_rows(v), *call.mask, sliced->options);
    outs.push_back(part.out);
    lses.push_back(part.lse);
  }
  return {join_slices(sliced->calls, outs), join_slices(sliced->calls, lses)};
}

FusedGradients sliced_backward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
                               const at::Tensor& lse, const at::Tensor& grad_out, const SlicedCalls* sliced) {
  sliced->record("attention_bwd", q);
  // Query heads of one kv head add into its gradient (GQA): summed in fp32, rounded once.
  const auto fp32 = at::TensorOptions().dtype(at::kFloat).device(q.device());
  at::Tensor grad_q = at::empty(q.sizes(), q.options());
  at::Tensor grad_k = at::zeros(k.sizes(), fp32), grad_v = at::zeros(v.sizes(), fp32);
  for (const SliceCall& call : sliced->calls) {
    const FusedGradients part = fused_attention_backward(call.rows(grad_out), call.rows(q), call.kv_rows(k), call.kv_rows(v),
                                                         call.rows(out), call.rows(lse), *call.mask, sliced->options);
    call.rows(grad_q).copy_(part.grad_q);
    call.kv_rows(grad_k).add_(part.grad_k);
    call.kv_rows(grad_v).add_(part.grad_v);
  }
  return {grad_q, grad_k.to(k.scalar_type()), grad_v.to(v.scalar_type())};
}

//! The fused attention of a sliced mask as one autograd node; the slices' contexts travel with it.
using SlicedAttention = FusedFunction<SlicedCalls, sliced_forward, sliced_backward>;

}  // namespace

at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, MaskContext& mask,
                     const AttentionOptions& options) {
  check_inputs(q, k, v, mask.mask());
  const double scale = options.scale != 0.0 ? options.scale : 1.0 / std::sqrt(static_cast<double>(q.size(3)));
  const std::string device = q.device().str();

  if (options.impl == AttentionImpl::dense) {
    if (options.trace) {
      options.trace->record({"attention_fwd", "dense_aten", device,
                             "impl=dense requested: materializes fp32 scores [B,H,Q,KV]", ""});
    }
    at::Tensor out = dense_attention(q, k, v, mask.dense(q.device()), scale);
    // The dense backward is ATen autograd; the hook records it when the gradient reaches it.
    if (options.trace && out.requires_grad()) {
      DispatchTrace* trace = options.trace;
      out.register_hook([trace, device](const at::Tensor&) {
        trace->record({"attention_bwd", "dense_aten", device,
                       "autograd through ATen ops: materializes dP and dS [B,H,Q,KV] in fp32", ""});
      });
    }
    return out;
  }

  if (mask.mask().sliced()) {
    AttentionOptions with_scale = options;
    with_scale.scale = scale;
    return SlicedAttention::apply(q, k, v, sliced_calls(q, k, mask, with_scale));
  }
  return recording_unsupported(options, "attention_fwd", q, [&]() -> at::Tensor {
    if (q.device().is_cpu()) return fused_attention_cpu(q, k, v, mask, scale, options.cpu_tiles, options.trace);
    if (q.device().is_cuda()) {
#ifdef HARNESS_WITH_CUDA_KERNELS
      return fused_attention_cuda(q, k, v, mask, scale, options.deterministic, options.trace, options.cuda_kernels);
#else
      throw UnsupportedError("fused attention on CUDA: this build has no CUDA kernels (configured without a CUDA "
                             "compiler or with HARNESS_WITH_CUDA=OFF)");
#endif
    }
    throw UnsupportedError("fused attention on " + device + ": only CPU and CUDA have fused kernels");
  });
}

namespace {

double resolved_scale(const at::Tensor& q, const AttentionOptions& options) {
  return options.scale != 0.0 ? options.scale : 1.0 / std::sqrt(static_cast<double>(q.size(3)));
}

[[noreturn]] void no_fused_kernel(const at::Tensor& q) {
#ifndef HARNESS_WITH_CUDA_KERNELS
  if (q.device().is_cuda()) {
    throw UnsupportedError("fused attention on CUDA: this build has no CUDA kernels (configured without a CUDA "
                           "compiler or with HARNESS_WITH_CUDA=OFF)");
  }
#endif
  throw UnsupportedError("fused attention on " + q.device().str() + ": only CPU and CUDA have fused kernels");
}

}  // namespace

FusedForward fused_attention_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, MaskContext& mask,
                                     const AttentionOptions& options) {
  check_inputs(q, k, v, mask.mask());
  if (mask.mask().sliced()) return sliced_forward(q, k, v, sliced_calls(q, k, mask, options).get());
  const double scale = resolved_scale(q, options);
  return recording_unsupported(options, "attention_fwd", q, [&]() -> FusedForward {
    if (q.device().is_cpu()) return fused_attention_cpu_forward(q, k, v, mask, scale, options.cpu_tiles, options.trace);
#ifdef HARNESS_WITH_CUDA_KERNELS
    if (q.device().is_cuda()) {
      return fused_attention_cuda_forward(q, k, v, mask, scale, options.deterministic, options.trace, options.cuda_kernels);
    }
#endif
    no_fused_kernel(q);
  });
}

FusedGradients fused_attention_backward(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
                                        const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                                        MaskContext& mask, const AttentionOptions& options) {
  check_inputs(q, k, v, mask.mask());
  TORCH_CHECK(grad_out.sizes() == out.sizes() && out.dim() == 4 && out.size(0) == q.size(0) && out.size(1) == q.size(1) &&
                  out.size(2) == q.size(2) && out.size(3) == v.size(3),
              "attention backward: grad_out ", shape_of(grad_out), " and out ", shape_of(out), " must be [B, H, Q_LEN, D_V] (q ",
              shape_of(q), ", v ", shape_of(v), ")");
  TORCH_CHECK(lse.dim() == 3 && lse.size(0) == q.size(0) && lse.size(1) == q.size(1) && lse.size(2) == q.size(2) &&
                  lse.scalar_type() == at::kFloat,
              "attention backward: lse must be fp32 [B, H, Q] (got ", shape_of(lse), " ", lse.scalar_type(), ")");
  TORCH_CHECK(grad_out.device() == q.device() && out.device() == q.device() && lse.device() == q.device(),
              "attention backward: grad_out, out and lse must be on q's device ", q.device());
  if (mask.mask().sliced()) return sliced_backward(q, k, v, out, lse, grad_out, sliced_calls(q, k, mask, options).get());
  const double scale = resolved_scale(q, options);
  return recording_unsupported(options, "attention_bwd", q, [&]() -> FusedGradients {
    if (q.device().is_cpu()) {
      return fused_attention_cpu_backward(grad_out, q, k, v, out, lse, mask, scale, options.cpu_tiles, options.trace);
    }
#ifdef HARNESS_WITH_CUDA_KERNELS
    if (q.device().is_cuda()) {
      return fused_attention_cuda_backward(grad_out, q, k, v, out, lse, mask, scale, options.deterministic, options.trace,
                                           options.cuda_kernels);
    }
#endif
    no_fused_kernel(q);
  });
}

}  // namespace harness::kernels
