#include "experiments/memory_model.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <deque>
#include <functional>
#include <iterator>
#include <limits>
#include <map>
#include <numeric>
#include <set>
#include <stdexcept>
#include <thread>
#include <tuple>

#include "core/byte_size.h"
#include "kernels/cuda/tiling.h"
#include "kernels/mask_desc.h"

namespace harness::memory_model {
namespace {

constexpr int64_t kMiB = 1024 * 1024;

// PyTorch's CUDA caching allocator with its defaults (c10/cuda/CUDACachingAllocator.cpp, no
// expandable segments, no max_split_size): what its statistics count and how it takes segments.
constexpr int64_t kCudaMinBlock = 512;             // every block is a multiple of 512 B
constexpr int64_t kCudaSmallSize = 1 * kMiB;       // blocks up to 1 MiB come from the small pool
constexpr int64_t kCudaSmallBuffer = 2 * kMiB;     // a small-pool segment
constexpr int64_t kCudaMinLargeAlloc = 10 * kMiB;  // large requests below this share a 20 MiB segment
constexpr int64_t kCudaLargeBuffer = 20 * kMiB;
constexpr int64_t kCudaRoundLarge = 2 * kMiB;      // larger requests get their own, rounded up to 2 MiB

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

int64_t element_bytes(const std::string& dtype) {
  if (dtype == "bf16" || dtype == "fp16") return 2;
  if (dtype == "fp32" || dtype == "int32") return 4;
  if (dtype == "bool" || dtype == "uint8") return 1;
  throw std::invalid_argument("memory model: unknown dtype \"" + dtype + "\"");
}

int64_t product(const std::vector<int64_t>& shape) {
  return std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>());
}

std::string join_shape(const std::vector<int64_t>& shape, const char* separator) {
  std::string text;
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? separator : "") + std::to_string(shape[i]);
  return text;
}


// ---- The trace: tensor kinds, and the allocations and frees of a step in program order --------

struct Kind {
  std::string name;
  std::vector<int64_t> shape;
  std::string dtype;
  int64_t bytes = 0;
  std::string formula;  //!< size formula, e.g. "B·H·Q·KV·4"
  std::string note;
};

struct Tensor {
  int kind = 0;
  int64_t layer = -1;
  std::vector<int64_t> parts;  //!< allocations it is made of (one, or a BlockMask's eight)
};

struct Event {
  enum class Type { alloc, free, phase } type = Type::alloc;
  int tensor = -1;
  std::string phase;  //!< Type::phase: inputs, fwd, bwd, end
  int iteration = 0;
};

class Trace {
 public:
  //! The kind named `name`, registered on first use.
  int kind(const std::string& name, std::vector<int64_t> shape, const std::string& dtype, const std::string& formula,
           const std::string& note) {
    for (size_t i = 0; i < kinds_.size(); ++i)
      if (kinds_[i].name == name) return static_cast<int>(i);
    Kind k{name, std::move(shape), dtype, 0, formula, note};
    k.bytes = product(k.shape) * element_bytes(dtype);
    kinds_.push_back(std::move(k));
    return static_cast<int>(kinds_.size() - 1);
  }
  int alloc(int kind, int64_t layer = -1) { return alloc_parts(kind, {kinds_[kind].bytes}, layer); }
  int alloc_parts(int kind, std::vector<int64_t> parts, int64_t layer = -1) {
    tensors_.push_back({kind, layer, std::move(parts)});
    events_.push_back({Event::Type::alloc, static_cast<int>(tensors_.size() - 1), "", iteration_});
    return static_cast<int>(tensors_.size() - 1);
  }
  void free(int tensor) {
    if (tensor < 0) return;
    events_.push_back({Event::Type::free, tensor, "", iteration_});
  }
  void phase(const std::string& name, int iteration) {
    iteration_ = iteration;
    events_.push_back({Event::Type::phase, -1, name, iteration});
  }
  const std::vector<Kind>& kinds() const { return kinds_; }
  const std::vector<Tensor>& tensors() const { return tensors_; }
  const std::vector<Event>& events() const { return events_; }

 private:
  std::vector<Kind> kinds_;
  std::vector<Tensor> tensors_;
  std::vector<Event> events_;
  int iteration_ = 0;
};

//! Several threads' copies of one tile buffer, allocated and freed together (CPU fused kernel).
using Each = std::vector<int>;
Each alloc_each(Trace& trace, int kind, int copies, int64_t layer) {
  Each ids;
  for (int i = 0; i < copies; ++i) ids.push_back(trace.alloc(kind, layer));
  return ids;
}
void free_each(Trace& trace, const Each& ids) {
  for (int id : ids) trace.free(id);
}

// ---- Geometry --------------------------------------------------------------------------------

struct Dims {
  int64_t batch = 0, heads = 0, kv_heads = 0, head_dim = 0, q_len = 0, kv_len = 0, context = 0, group = 0;
  std::string dtype;
  int64_t v_head_dim = 0;  //!< of v and the output (and so of grad_out, dv)
  int64_t elem = 0;
  int64_t layers = 0;
  kernels::cuda::FwdKernel cuda_fwd = kernels::cuda::kDefaultFwdKernel;  //!< the CUDA forward kernel that runs
  kernels::cuda::BwdKernel cuda_bwd = kernels::cuda::kDefaultBwdKernel;  //!< the CUDA backward kernel that runs
};

Dims dims_of(const spec::Spec& spec) {
  const auto& g = spec.dims;
  if (g.kv_heads <= 0 || g.heads % g.kv_heads != 0)
    throw std::invalid_argument("memory model: heads (" + std::to_string(g.heads) + ") must be a multiple of kv_heads (" +
                                std::to_string(g.kv_heads) + ")");
  // Within the spec's bounds every size below fits int64 and the trace grows with layers no
  // further than kMaxLayers (a spec the solver moves past them is refused here, not overflowed).
  if (const std::string problem = spec::dims_product_problem(g); !problem.empty())
    throw std::invalid_argument("memory model: " + problem);
  if (spec.layers < 1 || spec.layers > spec::kMaxLayers)
    throw std::invalid_argument("memory model: " + std::to_string(spec.layers) + " layers; at most " +
                                std::to_string(spec::kMaxLayers));
  Dims d;
  d.batch = g.batch;
  d.heads = g.heads;
  d.kv_heads = g.kv_heads;
  d.head_dim = g.head_dim;
  d.q_len = g.q_len();
  d.kv_len = g.kv_len();
  d.context = g.context;
  d.group = g.heads / g.kv_heads;
  d.dtype = spec.dtype;
  d.v_head_dim = g.value_head_dim();
  d.elem = element_bytes(spec.dtype);
  d.layers = spec.layers;
  return d;
}

// The CUDA kernels' tiles and scratch come from kernels/cuda/tiling.h, the table the launcher
// sizes them with; the BlockMask of a tiling has ceil(q_len / block_m) q blocks and
// ceil(kv_len / block_n) kv blocks.
namespace tiling = kernels::cuda::tiling;
using CudaTile = tiling::Tile;
CudaTile cuda_fwd_tile(const Dims& d) { return tiling::fwd_tile(d.heads, d.kv_heads, d.cuda_fwd); }
CudaTile cuda_dq_tile(const Dims& d) { return tiling::bwd_dq_tile(d.heads, d.kv_heads, d.head_dim); }
CudaTile cuda_dkdv_tile(const Dims& d) { return tiling::bwd_dkdv_tile(d.heads, d.kv_heads, d.head_dim); }

int64_t cuda_fwd_scratch(const Dims& d) {
  return tiling::fwd_scratch_bytes(d.batch, d.heads, d.kv_heads, ceil_div(d.q_len, cuda_fwd_tile(d).block_m), d.cuda_fwd);
}
int64_t cuda_bwd_scratch(const Dims& d) {
  // wgmma_atomic sums dQ in an fp32 accumulator [B, H, Q_pad, D] at the end of the scratch.
  return tiling::bwd_scratch(d.batch, d.heads, d.kv_heads, d.q_len, d.head_dim, ceil_div(d.q_len, cuda_dq_tile(d).block_m),
                             ceil_div(d.kv_len, cuda_dkdv_tile(d).block_n),
                             d.cuda_bwd == kernels::cuda::BwdKernel::wgmma_atomic)
      .bytes;
}

//! The backward's kept CTA schedule (kernels/cuda/fused_attention_cuda.cpp keeps two with the
//! mask: the merged one of wgmma and mma, and wgmma_atomic's), 8 bytes per CTA.
int64_t cuda_bwd_schedule(const Dims& d) {
  const auto layout = tiling::bwd_scratch(d.batch, d.heads, d.kv_heads, d.q_len, d.head_dim,
                                          ceil_div(d.q_len, cuda_dq_tile(d).block_m),
                                          ceil_div(d.kv_len, cuda_dkdv_tile(d).block_n), false);
  return layout.kept_bytes;
}

//! The eight int32 tensors of a BlockMask (kernels/block_mask.h): counts per q block and per kv
//! block, and the index lists, each [blocks, other blocks].
std::vector<int64_t> block_mask_parts(int64_t q_blocks, int64_t kv_blocks) {
  const int64_t lists = q_blocks * kv_blocks * 4;
  return {q_blocks * 4, lists, q_blocks * 4, lists, kv_blocks * 4, lists, kv_blocks * 4, lists};
}

// ---- What each variant allocates, in program order -------------------------------------------

//! Per layer: what the forward leaves for the backward (tensor ids, -1 where none is allocated).
struct Saved {
  int q = -1, k = -1, v = -1, hidden = -1, probabilities = -1, out = -1, lse = -1;
};
struct Grads {
  int dq = -1, dk = -1, dv = -1;
};

class StepBuilder {
 public:
  StepBuilder(const spec::Spec& spec, const std::string& impl, const std::string& device_kind, int cpu_threads,
              kernels::cuda::FwdKernel cuda_fwd, kernels::cuda::BwdKernel cuda_bwd)
      : spec_(spec), d_(dims_of(spec)), impl_(impl), cuda_(device_kind == "cuda"), threads_(cpu_threads) {
    // A kernel that does not run at the head dim (wgmma_atomic above 128, say) is replaced by the
    // first that does, the one the launcher's default would be (kernels/cuda/attention_config.h).
    namespace kc = kernels::cuda;
    const int head_dim = static_cast<int>(d_.head_dim);
    d_.cuda_fwd = cuda_fwd;
    for (const kc::FwdKernel kernel : kc::kFwdKernels) {
      if (kc::fwd_kernel_supports(d_.cuda_fwd, head_dim, head_dim)) break;
      if (kc::fwd_kernel_supports(kernel, head_dim, head_dim)) d_.cuda_fwd = kernel;
    }
    d_.cuda_bwd = kc::bwd_kernel_supports(cuda_bwd, head_dim, head_dim) ? cuda_bwd : kc::BwdKernel::wgmma;
  }

  Trace build(int iterations) {
    trace_.phase("inputs", 0);
    inputs();
    for (int iteration = 0; iteration < iterations; ++iteration) {
      std::vector<Saved> saved(static_cast<size_t>(d_.layers));
      std::vector<Grads> grads(static_cast<size_t>(d_.layers));
      trace_.phase("fwd", iteration);
      for (int64_t layer = 0; layer < d_.layers; ++layer) saved[layer] = forward(layer);
      trace_.phase("bwd", iteration);
      // The autograd engine runs the node with the highest sequence number first; every node of a
      // later layer was created after every node of an earlier one, so the layers' backwards run
      // one after the other, last layer first, each releasing its saved tensors when it ends.
      for (int64_t layer = d_.layers - 1; layer >= 0; --layer) grads[layer] = backward(layer, saved[layer]);
      trace_.phase("end", iteration);
      // attention_step.cpp: the step's vectors go out of scope in reverse order of declaration
      // (outs, then the leaves vs, ks, qs with their .grad).
      for (const Saved& s : saved) trace_.free(s.out);
      for (const Grads& g : grads) trace_.free(g.dv);
      for (const Grads& g : grads) trace_.free(g.dk);
      for (const Grads& g : grads) trace_.free(g.dq);
    }
    return std::move(trace_);
  }

 private:
  std::vector<int64_t> q_shape() const { return {d_.batch, d_.heads, d_.q_len, d_.head_dim}; }
  std::vector<int64_t> kv_shape() const { return {d_.batch, d_.kv_heads, d_.kv_len, d_.head_dim}; }
  std::vector<int64_t> kv_expanded_shape() const { return {d_.batch, d_.heads, d_.kv_len, d_.head_dim}; }
  std::vector<int64_t> v_shape() const { return {d_.batch, d_.kv_heads, d_.kv_len, d_.v_head_dim}; }
  std::vector<int64_t> v_expanded_shape() const { return {d_.batch, d_.heads, d_.kv_len, d_.v_head_dim}; }
  std::vector<int64_t> out_shape() const { return {d_.batch, d_.heads, d_.q_len, d_.v_head_dim}; }
  std::vector<int64_t> scores_shape() const { return {d_.batch, d_.heads, d_.q_len, d_.kv_len}; }
  bool low_precision() const { return d_.elem != 4; }
  bool gqa() const { return d_.group > 1; }
  const std::string& dt() const { return d_.dtype; }

  void inputs() {
    const std::string e = std::to_string(d_.elem);
    const int q = trace_.kind("q", q_shape(), dt(), "B·H·Q·D·" + e, "query input of one layer");
    const int k = trace_.kind("k", kv_shape(), dt(), "B·H_KV·KV·D·" + e, "key input of one layer");
    const int v = trace_.kind("v", v_shape(), dt(), "B·H_KV·KV·D_V·" + e, "value input of one layer");
    const int grad_out = trace_.kind("grad_out", out_shape(), dt(), "B·H·Q·D_V·" + e, "gradient of one layer's output (backward input)");
    for (int64_t layer = 0; layer < d_.layers; ++layer) {
      trace_.alloc(q, layer);
      trace_.alloc(k, layer);
      trace_.alloc(v, layer);
      trace_.alloc(grad_out, layer);
    }
    if (impl_ == "dense") {
      // MaskContext::dense(): built once, on the first call of the warm-up step, and cached.
      trace_.alloc(trace_.kind("dense mask", {d_.q_len, d_.kv_len}, "bool", "Q·KV",
                               "the mask as a dense boolean matrix (cached for the trial)"));
      return;
    }
    if (cuda_) {
      // fused_attention_cuda(): the mask arrays and one BlockMask per kernel tiling, cached.
      const auto& mask = spec_.mask;
      const int64_t anchors = mask.kind == kernels::MaskKind::dflash ? spec_.dims.anchors : 0;
      // doc_id is filled for every kind but blockmask (kernels/mask_desc.h).
      const int64_t doc_ids = mask.kind == kernels::MaskKind::dflash      ? d_.context
                              : mask.kind == kernels::MaskKind::blockmask ? 0
                                                                          : d_.kv_len;
      trace_.alloc(trace_.kind("anchors", {anchors}, "int32", "anchors·4", "anchor positions on the device"));
      trace_.alloc(trace_.kind("doc_id", {doc_ids}, "int32", "positions·4", "document of each position on the device"));
      if (mask.kind == kernels::MaskKind::blockmask) {
        trace_.alloc(trace_.kind("mask bits", {d_.q_len, kernels::blockmask_words(d_.kv_len)}, "int32", "Q·ceil(KV/32)·4",
                                 "a blockmask's bits on the device (one slice)"));
      }
      std::set<std::pair<int64_t, int64_t>> built;
      for (const CudaTile& tile : {cuda_fwd_tile(d_), cuda_dq_tile(d_), cuda_dkdv_tile(d_)}) {
        if (!built.insert({tile.block_m, tile.block_n}).second) continue;
        block_mask(tile.block_m, tile.block_n);
      }
      // The CTA schedules, kept with the mask after the first call builds them: the forward's
      // kernel's, and the backward's two (merged, atomic).
      trace_.alloc(trace_.kind("fwd schedule", {cuda_fwd_scratch(d_)}, "uint8", "CTAs·8 + mask bits, 256-aligned",
                               "the forward's CTA schedule and partial blocks' mask bits (kept with the mask)"));
      const int bwd_schedule = trace_.kind("bwd schedule", {cuda_bwd_schedule(d_)}, "uint8", "CTAs·8 + KV·128, 256-aligned",
                                           "a backward CTA schedule and key mask bits (two kept with the mask: merged and atomic)");
      trace_.alloc(bwd_schedule);
      trace_.alloc(bwd_schedule);
      return;
    }
    block_mask(spec_.mask_block, spec_.mask_block);
  }

  void block_mask(int64_t block_m, int64_t block_n) {
    const int64_t q_blocks = ceil_div(d_.q_len, block_m), kv_blocks = ceil_div(d_.kv_len, block_n);
    const std::string name = "BlockMask " + std::to_string(block_m) + "x" + std::to_string(block_n);
    const int kind = trace_.kind(name, {q_blocks, kv_blocks}, "int32", "8 int32 tensors, 4 of [q blocks, kv blocks]",
                                 "block lists of the mask at this tiling (cached for the trial)");
    trace_.alloc_parts(kind, block_mask_parts(q_blocks, kv_blocks));
  }

  Saved forward(int64_t layer) {
    if (impl_ == "dense") return dense_forward(layer);
    return cuda_ ? fused_cuda_forward(layer) : fused_cpu_forward(layer);
  }
  Grads backward(int64_t layer, const Saved& saved) {
    if (impl_ == "dense") return dense_backward(layer, saved);
    return cuda_ ? fused_cuda_backward(layer, saved) : fused_cpu_backward(layer, saved);
  }

  // kernels/dense_attention.cpp, op by op. Autograd saves what each op's backward reads: the two
  // matmuls (bmm) their fp32 operands, masked_fill its mask, softmax its output.
  Saved dense_forward(int64_t layer) {
    const std::string e = std::to_string(d_.elem);
    const bool low = low_precision();
    Saved s;
    int k_expanded = -1, v_expanded = -1;
    if (gqa()) {
      k_expanded = trace_.alloc(trace_.kind("k expanded", kv_expanded_shape(), dt(), "B·H·KV·D·" + e,
                                            "keys repeated to the query heads (repeat_interleave)"), layer);
      v_expanded = trace_.alloc(trace_.kind("v expanded", v_expanded_shape(), dt(), "B·H·KV·D_V·" + e,
                                            "values repeated to the query heads (repeat_interleave)"), layer);
    }
    // .to(kFloat) copies only from a lower precision; in fp32 the operands are the tensors themselves.
    s.k = k_expanded;
    if (low)
      s.k = trace_.alloc(trace_.kind("k fp32", kv_expanded_shape(), "fp32", "B·H·KV·D·4",
                                     "keys in fp32 (saved by the q·kᵀ matmul)"), layer);
    if (low)
      s.q = trace_.alloc(trace_.kind("q fp32", q_shape(), "fp32", "B·H·Q·D·4", "queries in fp32 (saved by the q·kᵀ matmul)"),
                         layer);
    const int scores = trace_.alloc(scores_kind("scores", "fp32 attention scores q·kᵀ of one layer"), layer);
    const int scaled = trace_.alloc(scores_kind("scaled scores", "scores × softmax scale"), layer);
    trace_.free(scores);
    const int row_visible = trace_.alloc(
        trace_.kind("row has visible", {d_.q_len, 1}, "bool", "Q", "whether a query row sees any key"), layer);
    s.hidden = trace_.alloc(trace_.kind("hidden mask", {d_.q_len, d_.kv_len}, "bool", "Q·KV",
                                        "logical_not of the mask (saved by masked_fill)"),
                            layer);
    const int masked = trace_.alloc(scores_kind("masked scores", "scores with hidden keys at -inf (softmax input)"), layer);
    trace_.free(scaled);
    s.probabilities = trace_.alloc(scores_kind("probabilities", "softmax output (saved for the backward)"), layer);
    s.v = v_expanded;
    if (low)
      s.v = trace_.alloc(trace_.kind("v fp32", v_expanded_shape(), "fp32", "B·H·KV·D_V·4",
                                     "values in fp32 (saved by the probabilities·v matmul)"), layer);
    if (low) {
      const int out_fp32 = trace_.alloc(trace_.kind("output fp32", out_shape(), "fp32", "B·H·Q·D_V·4", "probabilities·v in fp32"), layer);
      s.out = trace_.alloc(trace_.kind("output", out_shape(), dt(), "B·H·Q·D_V·" + e, "the layer's output (kept by the step)"), layer);
      trace_.free(out_fp32);
    } else {
      s.out = trace_.alloc(trace_.kind("output", out_shape(), dt(), "B·H·Q·D_V·" + e, "the layer's output (kept by the step)"), layer);
    }
    // Locals of dense_attention() go at its return; the fp32 copies of the expanded keys and
    // values are saved, the expanded bf16 ones are not (unless they are the fp32 operands).
    trace_.free(masked);
    trace_.free(row_visible);
    if (low) {
      trace_.free(v_expanded);
      trace_.free(k_expanded);
    }
    return s;
  }

  Grads dense_backward(int64_t layer, const Saved& s) {
    const std::string e = std::to_string(d_.elem);
    const bool low = low_precision();
    Grads g;
    // ToCopy backward of the output: the incoming gradient in fp32.
    const int grad_out_fp32 =
        low ? trace_.alloc(trace_.kind("grad_out fp32", out_shape(), "fp32", "B·H·Q·D_V·4", "output gradient in fp32"), layer) : -1;
    // probabilities·v: dV then dP, then the node releases v (the softmax still holds the probabilities).
    const int dv_wide = trace_.alloc(trace_.kind(low ? "dv expanded fp32" : "dv expanded", v_expanded_shape(), "fp32",
                                                 "B·H·KV·D_V·4", "gradient of the expanded values"), layer);
    const int grad_probabilities = trace_.alloc(scores_kind("dP", "gradient of the probabilities, dO·vᵀ"), layer);
    trace_.free(grad_out_fp32);
    trace_.free(s.v);
    int dv_expanded = dv_wide;
    if (low) {
      dv_expanded = trace_.alloc(trace_.kind("dv expanded", v_expanded_shape(), dt(), "B·H·KV·D_V·" + e,
                                             "gradient of the expanded values, waiting for the repeat's backward"), layer);
      trace_.free(dv_wide);
    }
    // Softmax backward. CUDA's kernel first forms grad·output in a tensor of its own (measured on
    // the H200: two score-sized allocations for one call); the CPU kernel fuses it.
    const int grad_masked_in = trace_.alloc(scores_kind("dS", "softmax backward: gradient of the masked scores"), layer);
    if (cuda_) {
      const int product_tmp = trace_.alloc(scores_kind("softmax-backward temporary", "grad·output, CUDA only"), layer);
      trace_.free(product_tmp);
    }
    trace_.free(s.probabilities);
    trace_.free(grad_probabilities);
    const int grad_scaled = trace_.alloc(scores_kind("dS masked", "masked_fill backward: dS with hidden keys zeroed"), layer);
    trace_.free(s.hidden);
    trace_.free(grad_masked_in);
    const int grad_scores = trace_.alloc(scores_kind("dS scaled", "mul backward: dS × softmax scale"), layer);
    trace_.free(grad_scaled);
    // q·kᵀ: dKᵀ then dQ, then the node releases q and k.
    const int dk_wide = trace_.alloc(trace_.kind(low ? "dk expanded fp32" : "dk expanded", {d_.batch, d_.heads, d_.head_dim, d_.kv_len},
                                                 "fp32", "B·H·D·KV·4", "gradient of the expanded keys (transposed)"), layer);
    const int dq_wide = trace_.alloc(trace_.kind(low ? "dq fp32" : "dq", q_shape(), "fp32", "B·H·Q·D·4", "gradient of q"), layer);
    trace_.free(s.q);
    trace_.free(s.k);
    trace_.free(grad_scores);
    g.dq = dq_wide;
    if (low) {
      g.dq = trace_.alloc(trace_.kind("dq", q_shape(), dt(), "B·H·Q·D·" + e, "gradient of q (q.grad)"), layer);
      trace_.free(dq_wide);
    }
    int dk_expanded = dk_wide;
    if (low) {
      dk_expanded = trace_.alloc(trace_.kind("dk expanded", kv_expanded_shape(), dt(), "B·H·KV·D·" + e,
                                             "gradient of the expanded keys"), layer);
      trace_.free(dk_wide);
    }
    g.dk = dk_expanded;
    g.dv = dv_expanded;
    if (gqa()) {
      // repeat_interleave's backward sums each group of query heads into its kv head.
      g.dk = trace_.alloc(trace_.kind("dk", kv_shape(), dt(), "B·H_KV·KV·D·" + e, "gradient of k (k.grad)"), layer);
      trace_.free(dk_expanded);
      g.dv = trace_.alloc(trace_.kind("dv", v_shape(), dt(), "B·H_KV·KV·D_V·" + e, "gradient of v (v.grad)"), layer);
      trace_.free(dv_expanded);
    }
    return g;
  }

  int scores_kind(const std::string& name, const std::string& note) {
    return trace_.kind(name, scores_shape(), "fp32", "B·H·Q·KV·4", note);
  }

  // kernels/cuda/fused_attention_cuda.cpp: the output and the LSE are all a layer keeps; the
  // kernels' scratch lives for one launch.
  Saved fused_cuda_forward(int64_t layer) {
    Saved s;
    s.out = trace_.alloc(output_kind(), layer);
    s.lse = trace_.alloc(lse_kind(), layer);
    const int scratch = trace_.alloc(trace_.kind("fwd scratch", {cuda_fwd_scratch(d_)}, "uint8", "CTAs·8 + mask bits, 256-aligned",
                                                 "the forward's CTA schedule and partial blocks' mask bits"), layer);
    trace_.free(scratch);
    return s;
  }
  Grads fused_cuda_backward(int64_t layer, const Saved& s) {
    Grads g;
    g.dq = trace_.alloc(grad_kind("dq", q_shape(), "B·H·Q·D·"), layer);
    g.dk = trace_.alloc(grad_kind("dk", kv_shape(), "B·H_KV·KV·D·"), layer);
    g.dv = trace_.alloc(grad_kind("dv", v_shape(), "B·H_KV·KV·D_V·"), layer);
    const int scratch = trace_.alloc(trace_.kind("bwd scratch", {cuda_bwd_scratch(d_)}, "uint8",
                                                 "B·H·Q_pad·8 + Q_pad·32 + CTAs·8 + KV·128 (+ B·H·Q_pad·D·4), each 256-aligned",
                                                 "per-row (lse, delta), per-query mask rows, CTA schedule, key mask bits "
                                                 "(and wgmma_atomic's fp32 dQ accumulator)"), layer);
    trace_.free(scratch);
    trace_.free(s.lse);
    return g;
  }

  int output_kind() {
    return trace_.kind("output", out_shape(), dt(), "B·H·Q·D_V·" + std::to_string(d_.elem), "the layer's output (saved and kept by the step)");
  }
  int lse_kind() {
    return trace_.kind("lse", {d_.batch, d_.heads, d_.q_len}, "fp32", "B·H·Q·4", "log-sum-exp per query row (saved)");
  }
  int grad_kind(const std::string& name, std::vector<int64_t> shape, const std::string& formula) {
    return trace_.kind(name, std::move(shape), dt(), formula + std::to_string(d_.elem), "gradient (" + name.substr(1) + ".grad)");
  }

  // kernels/fused_cpu.cpp: the whole-tensor buffers, plus each worker thread's fp32 tile buffers
  // (a q tile holds every head of a GQA group: G·block_m rows).
  struct CpuTiles {
    int64_t block_m, block_n, rows;
    int q_tile, kv_tile, score_tile, row_vector, hidden_tile;
    int o_tile, v_tile;  //!< the tiles of dO, O and V (with v_head_dim; q_tile and kv_tile when it is head_dim)
  };
  CpuTiles cpu_tiles() {
    CpuTiles t;
    t.block_m = std::min(spec_.mask_block, d_.q_len);
    t.block_n = std::min(spec_.mask_block, d_.kv_len);
    t.rows = d_.group * t.block_m;
    const std::vector<int64_t> grouped{d_.batch, d_.kv_heads, t.rows, d_.head_dim};
    t.q_tile = trace_.kind("q-block tile", grouped, "fp32", "B·H·block_m·D·4",
                           "a q block of q, dO, O, the accumulator or a matmul result, fp32 (per thread)");
    t.kv_tile = trace_.kind("kv-block tile", {d_.batch, d_.kv_heads, t.block_n, d_.head_dim}, "fp32", "B·H_KV·block_n·D·4",
                            "a kv block of k, v or a dK/dV accumulator, fp32 (per thread)");
    t.score_tile = trace_.kind("score tile", {d_.batch, d_.kv_heads, t.rows, t.block_n}, "fp32", "B·H·block_m·block_n·4",
                               "scores / P or dS of one tile, fp32 (per thread)");
    t.row_vector = trace_.kind("row vector", {d_.batch, d_.kv_heads, t.rows, 1}, "fp32", "B·H·block_m·4",
                               "a per-row statistic of one q block (max, sum, lse, delta; per thread)");
    t.hidden_tile = trace_.kind("hidden tile", {t.block_m, t.block_n}, "bool", "block_m·block_n",
                                "the mask of a partial tile (per thread)");
    t.o_tile = t.q_tile;
    t.v_tile = t.kv_tile;
    if (d_.v_head_dim != d_.head_dim) {
      t.o_tile = trace_.kind("q-block value tile", {d_.batch, d_.kv_heads, t.rows, d_.v_head_dim}, "fp32", "B·H·block_m·D_V·4",
                             "a q block of dO, O, the accumulator or P·v, fp32 (per thread)");
      t.v_tile = trace_.kind("kv-block value tile", {d_.batch, d_.kv_heads, t.block_n, d_.v_head_dim}, "fp32",
                             "B·H_KV·block_n·D_V·4", "a kv block of v or the dV accumulator, fp32 (per thread)");
    }
    return t;
  }
  bool has_partial_tiles() const { return spec_.mask.kind != kernels::MaskKind::full; }
  int threads_for(int64_t tasks) const { return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(threads_, tasks))); }

  // kv_tile_fp32(): keys (or, with `values`, values) of one tile converted to fp32; in fp32 the
  // slice itself, no copy.
  Each kv_tiles(const CpuTiles& t, int n, int64_t layer, bool values = false) {
    return low_precision() ? alloc_each(trace_, values ? t.v_tile : t.kv_tile, n, layer) : Each{};
  }

  // One tile of the score matmul (tile_scores()): the kv tile lives until the scores exist, the
  // mask tile only while it is applied.
  Each score_tiles(const CpuTiles& t, int n, int64_t layer) {
    const Each kv = kv_tiles(t, n, layer);
    const Each scores = alloc_each(trace_, t.score_tile, n, layer);
    if (has_partial_tiles()) free_each(trace_, alloc_each(trace_, t.hidden_tile, n, layer));
    free_each(trace_, kv);
    return scores;
  }

  Saved fused_cpu_forward(int64_t layer) {
    Saved s;
    s.out = trace_.alloc(output_kind(), layer);
    s.lse = trace_.alloc(lse_kind(), layer);
    const CpuTiles t = cpu_tiles();
    const int n = threads_for(ceil_div(d_.q_len, t.block_m));
    // One q block with one visible kv block: everything a thread holds at its busiest.
    const Each q_tile = alloc_each(trace_, t.q_tile, n, layer);
    const Each row_max = alloc_each(trace_, t.row_vector, n, layer);
    const Each row_sum = alloc_each(trace_, t.row_vector, n, layer);
    const Each acc = alloc_each(trace_, t.o_tile, n, layer);
    const Each probabilities = score_tiles(t, n, layer);
    const Each block_max = alloc_each(trace_, t.row_vector, n, layer);
    const Each new_max = alloc_each(trace_, t.row_vector, n, layer);
    free_each(trace_, block_max);
    const Each correction = alloc_each(trace_, t.row_vector, n, layer);
    free_each(trace_, alloc_each(trace_, t.row_vector, n, layer));  // probabilities.sum()
    const Each v_tile = kv_tiles(t, n, layer, /*values=*/true);
    free_each(trace_, alloc_each(trace_, t.o_tile, n, layer));  // probabilities·v
    free_each(trace_, v_tile);
    free_each(trace_, row_max);
    free_each(trace_, correction);
    free_each(trace_, probabilities);
    free_each(trace_, alloc_each(trace_, t.row_vector, n, layer));  // row_sum.clamp_min()
    free_each(trace_, q_tile);
    free_each(trace_, new_max);
    free_each(trace_, row_sum);
    free_each(trace_, acc);
    return s;
  }

  Grads fused_cpu_backward(int64_t layer, const Saved& s) {
    Grads g;
    const std::vector<int64_t> rows{d_.batch, d_.heads, d_.q_len};
    const int lse_is_inf = trace_.alloc(trace_.kind("lse == -inf", rows, "bool", "B·H·Q", "rows that see nothing"), layer);
    const int lse_for_p = trace_.alloc(trace_.kind("lse for P", rows, "fp32", "B·H·Q·4", "LSE with +inf for empty rows"), layer);
    trace_.free(lse_is_inf);
    const int delta = trace_.alloc(trace_.kind("delta", {d_.batch, d_.heads, d_.q_len, 1}, "fp32", "B·H·Q·4", "rowsum(dO·O)"), layer);
    g.dq = trace_.alloc(grad_kind("dq", q_shape(), "B·H·Q·D·"), layer);
    g.dk = trace_.alloc(grad_kind("dk", kv_shape(), "B·H_KV·KV·D·"), layer);
    g.dv = trace_.alloc(grad_kind("dv", v_shape(), "B·H_KV·KV·D_V·"), layer);
    const CpuTiles t = cpu_tiles();
    // dQ pass, one q block and one kv block per thread: the q block's operands (q, dO, lse, and
    // delta from a copy of O), the dQ accumulator, then P and dS of the tile, then dS·k.
    {
      const int n = threads_for(ceil_div(d_.q_len, t.block_m));
      const Each q_scaled = alloc_each(trace_, t.q_tile, n, layer);
      const Each grad_out = alloc_each(trace_, t.o_tile, n, layer);
      const Each lse = alloc_each(trace_, t.row_vector, n, layer);
      const Each out_copy = alloc_each(trace_, t.o_tile, n, layer);
      const Each row_delta = alloc_each(trace_, t.row_vector, n, layer);
      free_each(trace_, out_copy);
      const Each grad_q_acc = alloc_each(trace_, t.q_tile, n, layer);
      const Each probabilities = score_tiles(t, n, layer);
      const Each v_tile = kv_tiles(t, n, layer, /*values=*/true);
      const Each grad_scores = alloc_each(trace_, t.score_tile, n, layer);
      free_each(trace_, v_tile);
      free_each(trace_, probabilities);
      const Each k_tile = kv_tiles(t, n, layer);
      free_each(trace_, alloc_each(trace_, t.q_tile, n, layer));  // dS·k
      free_each(trace_, k_tile);
      for (const Each& each : {grad_scores, q_scaled, grad_out, lse, row_delta, grad_q_acc}) free_each(trace_, each);
    }
    // dK/dV pass, one kv block and one q block per thread: the two accumulators, the q block's
    // operands, P and dS (both kept), then Pᵀ·dO and dSᵀ·q.
    {
      const int n = threads_for(ceil_div(d_.kv_len, t.block_n));
      const Each grad_k_acc = alloc_each(trace_, t.kv_tile, n, layer);
      const Each grad_v_acc = alloc_each(trace_, t.v_tile, n, layer);
      const Each q_scaled = alloc_each(trace_, t.q_tile, n, layer);
      const Each grad_out = alloc_each(trace_, t.o_tile, n, layer);
      const Each lse = alloc_each(trace_, t.row_vector, n, layer);
      const Each row_delta = alloc_each(trace_, t.row_vector, n, layer);
      const Each probabilities = score_tiles(t, n, layer);
      const Each v_tile = kv_tiles(t, n, layer, /*values=*/true);
      const Each grad_scores = alloc_each(trace_, t.score_tile, n, layer);
      free_each(trace_, v_tile);
      free_each(trace_, alloc_each(trace_, t.v_tile, n, layer));  // Pᵀ·dO
      free_each(trace_, alloc_each(trace_, t.kv_tile, n, layer));  // dSᵀ·q
      for (const Each& each : {grad_scores, probabilities, q_scaled, grad_out, lse, row_delta, grad_k_acc, grad_v_acc})
        free_each(trace_, each);
    }
    trace_.free(delta);
    trace_.free(lse_for_p);
    trace_.free(s.lse);
    return g;
  }

  const spec::Spec& spec_;
  Dims d_;
  std::string impl_;
  bool cuda_;
  int threads_;
  Trace trace_;
};

const spec::Variant& find_variant(const spec::Spec& spec, const std::string& variant) {
  if (spec.kind != "attention_step")
    throw std::invalid_argument("memory model: spec " + spec.name + " is of kind " + spec.kind +
                                "; the model covers attention_step specs only");
  for (const auto& v : spec.variants)
    if (v.name == variant) return v;
  throw std::invalid_argument("memory model: spec " + spec.name + " has no variant \"" + variant + "\"");
}

void check_device_kind(const std::string& device_kind) {
  if (device_kind != "cpu" && device_kind != "cuda")
    throw std::invalid_argument("memory model: device kind \"" + device_kind + "\" is neither cpu nor cuda");
}

int resolve_threads(const ModelOptions& options) {
  if (options.cpu_threads > 0) return options.cpu_threads;
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

//! A kernel label of the dispatch trace as the kernels' enum ("" is the untuned default);
//! std::invalid_argument naming the known labels otherwise.
template <typename Kernel, size_t kCount>
Kernel cuda_kernel(const std::string& label, const Kernel (&candidates)[kCount], const char* (*name)(Kernel),
                   Kernel untuned, const char* which) {
  if (label.empty()) return untuned;
  Kernel kernel{};
  if (kernels::cuda::kernel_from_label(label, candidates, name, &kernel)) return kernel;
  std::string known;
  for (const Kernel k : candidates) known += (known.empty() ? "" : ", ") + std::string(name(k));
  throw std::invalid_argument("memory model: unknown CUDA " + std::string(which) + " kernel \"" + label + "\"; known: " + known);
}

Trace build_trace(const spec::Spec& spec, const std::string& impl, const std::string& device_kind, const ModelOptions& options,
                  int iterations) {
  if (impl != "dense" && impl != "fused") throw std::invalid_argument("memory model: unknown impl \"" + impl + "\"");
  namespace kc = kernels::cuda;
  const kc::FwdKernel fwd =
      cuda_kernel(options.cuda_fwd_kernel, kc::kFwdKernels, kc::fwd_kernel_label, kc::kDefaultFwdKernel, "forward");
  const kc::BwdKernel bwd =
      cuda_kernel(options.cuda_bwd_kernel, kc::kBwdKernels, kc::bwd_kernel_label, kc::kDefaultBwdKernel, "backward");
  return StepBuilder(spec, impl, device_kind, resolve_threads(options), fwd, bwd).build(iterations);
}

// ---- Replays -----------------------------------------------------------------------------------

int64_t tensor_bytes(const Tensor& tensor, const std::string& device_kind) {
  int64_t total = 0;
  for (int64_t part : tensor.parts) total += allocated_bytes(part, device_kind);
  return total;
}

//! Allocated bytes over the first iteration, with the event index of each phase's peak.
struct PhasePeaks {
  size_t fwd_begin = 0, bwd_begin = 0;
  size_t fwd_peak_at = 0, bwd_peak_at = 0;
  int64_t baseline = 0, fwd_peak = 0, bwd_peak = 0, saved = 0;
};

PhasePeaks phase_peaks(const Trace& trace, const std::string& device_kind) {
  PhasePeaks p;
  int64_t current = 0, phase_start = 0;
  std::string phase;
  const auto& events = trace.events();
  for (size_t i = 0; i < events.size(); ++i) {
    const Event& e = events[i];
    if (e.type == Event::Type::phase) {
      if (e.iteration > 0) break;
      phase = e.phase;
      phase_start = current;
      if (phase == "fwd") {
        p.fwd_begin = i;
        p.baseline = current;
        p.fwd_peak_at = i;
      } else if (phase == "bwd") {
        p.bwd_begin = i;
        p.saved = current - p.baseline;
        p.bwd_peak_at = i;
      }
      continue;
    }
    const int64_t bytes = tensor_bytes(trace.tensors()[e.tensor], device_kind);
    current += e.type == Event::Type::alloc ? bytes : -bytes;
    if (phase == "fwd" && current - phase_start > p.fwd_peak) {
      p.fwd_peak = current - phase_start;
      p.fwd_peak_at = i;
    }
    if (phase == "bwd" && current - phase_start > p.bwd_peak) {
      p.bwd_peak = current - phase_start;
      p.bwd_peak_at = i;
    }
  }
  return p;
}

//! What is alive at event `at` that the phase beginning at `begin` allocated (positive), and what
//! was alive at `begin` and freed by `at` (negative), per kind.
std::vector<PeakTerm> peak_terms(const Trace& trace, const std::string& device_kind, size_t begin, size_t at) {
  std::set<int> allocated, freed;
  const auto& events = trace.events();
  for (size_t i = begin; i <= at && i < events.size(); ++i) {
    const Event& e = events[i];
    if (e.type == Event::Type::phase) continue;
    if (e.type == Event::Type::alloc) {
      allocated.insert(e.tensor);
    } else if (!allocated.erase(e.tensor)) {
      freed.insert(e.tensor);
    }
  }
  std::vector<PeakTerm> terms;
  const auto add = [&](int tensor, int sign) {
    const Tensor& t = trace.tensors()[tensor];
    const std::string& name = trace.kinds()[t.kind].name;
    auto found = std::find_if(terms.begin(), terms.end(),
                              [&](const PeakTerm& term) { return term.tensor == name && (term.bytes < 0) == (sign < 0); });
    if (found == terms.end()) {
      terms.push_back({name, 0, 0});
      found = terms.end() - 1;
    }
    ++found->count;
    found->bytes += sign * tensor_bytes(t, device_kind);
  };
  for (int tensor : allocated) add(tensor, 1);
  for (int tensor : freed) add(tensor, -1);
  std::stable_sort(terms.begin(), terms.end(), [](const PeakTerm& a, const PeakTerm& b) {
    if ((a.bytes < 0) != (b.bytes < 0)) return a.bytes > 0;
    return std::abs(a.bytes) > std::abs(b.bytes);
  });
  return terms;
}

//! The allocation list: each kind once, its count and phase from the first iteration.
std::vector<Allocation> allocation_list(const Trace& trace) {
  const auto& events = trace.events();
  std::map<int, int64_t> count;
  std::map<int, std::string> phase_of;
  std::vector<int> order;
  std::set<int> alive;
  std::string phase;
  for (size_t i = 0; i < events.size(); ++i) {
    const Event& e = events[i];
    if (e.type == Event::Type::phase) {
      if (e.iteration > 0) break;
      phase = e.phase;
      if (phase == "bwd") {
        // Forward allocations still alive when the backward starts are the saved ones.
        for (int tensor : alive) {
          const int kind = trace.tensors()[tensor].kind;
          if (phase_of[kind] == "fwd") phase_of[kind] = "saved";
        }
      }
      continue;
    }
    const int kind = trace.tensors()[e.tensor].kind;
    if (e.type == Event::Type::free) {
      alive.erase(e.tensor);
      continue;
    }
    alive.insert(e.tensor);
    if (!count.count(kind)) {
      order.push_back(kind);
      phase_of[kind] = phase;
    }
    ++count[kind];
  }
  std::vector<Allocation> list;
  for (int kind : order) {
    const Kind& k = trace.kinds()[kind];
    list.push_back({k.name, k.shape, k.dtype, k.bytes, phase_of[kind], k.note + " (" + k.formula + ")", count[kind]});
  }
  return list;
}

// ---- The CUDA caching allocator, for where a cap is hit ----------------------------------------

class CachingAllocatorModel {
 public:
  explicit CachingAllocatorModel(int64_t limit) : limit_(limit) {}

  struct Result {
    bool ok = true;
    int64_t request = 0;  //!< segment size asked for when it failed
  };

  //! Allocates `bytes` for handle `id`: the best-fitting free block of its pool (the smallest,
  //! ties broken by segment and offset), else a new segment, split when the rest is large enough.
  Result malloc(int64_t id, int64_t bytes) {
    const int64_t size = round_size(bytes);
    const bool small = size <= kCudaSmallSize;
    int best = -1;
    const auto fit = free_.lower_bound({small, size, std::numeric_limits<int>::min(), std::numeric_limits<int64_t>::min(), -1});
    if (fit != free_.end() && fit->small == small) best = fit->index;
    if (best < 0) {
      const int64_t segment_bytes = cuda_request_bytes(size);
      if (limit_ > 0 && reserved_ + segment_bytes > limit_) release_free_segments();
      if (limit_ > 0 && reserved_ + segment_bytes > limit_) return {false, segment_bytes};
      blocks_.push_back({next_segment_++, 0, segment_bytes, small, false, true});
      reserved_ += segment_bytes;
      best = static_cast<int>(blocks_.size() - 1);
      segments_[blocks_[best].segment][0] = best;
    } else {
      free_.erase(fit);
    }
    const int64_t remaining = blocks_[best].size - size;
    if (small ? remaining >= kCudaMinBlock : remaining > kCudaSmallSize) {
      Block rest = blocks_[best];
      rest.offset += size;
      rest.size = remaining;
      blocks_[best].size = size;
      blocks_.push_back(rest);
      const int rest_index = static_cast<int>(blocks_.size() - 1);
      segments_[rest.segment][rest.offset] = rest_index;
      free_.insert(key(rest_index));
    }
    blocks_[best].allocated = true;
    allocated_ += blocks_[best].size;
    handles_[id].push_back(best);
    return {};
  }

  void free(int64_t id) {
    for (int index : handles_[id]) {
      Block& b = blocks_[index];
      b.allocated = false;
      allocated_ -= b.size;
      merge(index);
      free_.insert(key(index));
    }
    handles_.erase(id);
    if (dead_blocks() > 64 && dead_blocks() > blocks_.size() / 2) compact();
  }

  int64_t allocated() const { return allocated_; }
  int64_t reserved() const { return reserved_; }

  //! The allocator's state in a comparable form: its live blocks (segment, offset, size, pool,
  //! allocated) and which block each live tensor holds, each tensor named by `label` (which names
  //! a step's tensors relative to the iteration, so that the same state in another iteration
  //! compares equal).
  //! Blocks are listed by (segment, offset) and handles name their blocks the same way, not by
  //! their place in blocks_ (which depends on the order of earlier splits and merges): two equal
  //! states compare equal however they were reached, and what the allocator does next depends on
  //! nothing else (best fit breaks ties by segment and offset).
  std::string state(const std::function<std::string(int64_t)>& label) {
    compact();
    std::vector<size_t> order(blocks_.size());
    std::iota(order.begin(), order.end(), size_t{0});
    const auto place = [this](size_t i) { return std::make_pair(blocks_[i].segment, blocks_[i].offset); };
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return place(a) < place(b); });
    std::string text = std::to_string(allocated_) + "/" + std::to_string(reserved_) + "/" + std::to_string(next_segment_) + ":";
    for (size_t i : order) {
      const Block& b = blocks_[i];
      text += std::to_string(b.segment) + "," + std::to_string(b.offset) + "," + std::to_string(b.size) + (b.small ? "s" : "l") +
              (b.allocated ? "a;" : "f;");
    }
    // Sorted by label: the map's order of ids is not the same from one iteration to the next.
    std::vector<std::string> handles;
    for (const auto& [id, indices] : handles_) {
      std::string handle = label(id) + "=";
      for (int index : indices) {
        const auto [segment, offset] = place(static_cast<size_t>(index));
        handle += std::to_string(segment) + "@" + std::to_string(offset) + ",";
      }
      handles.push_back(std::move(handle));
    }
    std::sort(handles.begin(), handles.end());
    for (const std::string& handle : handles) text += handle + ";";
    return text;
  }

 private:
  struct Block {
    int segment;
    int64_t offset;
    int64_t size;
    bool small;
    bool allocated;
    bool live;  //!< false once merged into a neighbour or released
  };

  static int64_t round_size(int64_t bytes) { return std::max(kCudaMinBlock, round_up(bytes, kCudaMinBlock)); }

  //! A free block in best-fit order: its pool, then the smallest, then the first by segment and
  //! offset (what a scan over every block chose).
  struct FreeKey {
    bool small;
    int64_t size;
    int segment;
    int64_t offset;
    int index;
    bool operator<(const FreeKey& other) const {
      return std::tie(small, size, segment, offset, index) <
             std::tie(other.small, other.size, other.segment, other.offset, other.index);
    }
  };
  FreeKey key(int index) const {
    const Block& b = blocks_[static_cast<size_t>(index)];
    return {b.small, b.size, b.segment, b.offset, index};
  }

  //! Merges a freed block (not yet in free_) with the free blocks before and after it in its
  //! segment (the merged-away ones die).
  void merge(int index) {
    auto& segment = segments_[blocks_[index].segment];
    auto at = segment.find(blocks_[index].offset);
    if (at != segment.begin()) {
      const auto before = std::prev(at);
      Block& other = blocks_[before->second];
      Block& b = blocks_[index];
      if (!other.allocated && other.offset + other.size == b.offset) {
        free_.erase(key(before->second));
        b.offset = other.offset;
        b.size += other.size;
        other.live = false;
        ++dead_;
        segment.erase(at);
        before->second = index;  // the merged block starts where the one before did
        at = before;
      }
    }
    const auto after = std::next(at);
    if (after != segment.end()) {
      Block& other = blocks_[after->second];
      Block& b = blocks_[index];
      if (!other.allocated && b.offset + b.size == other.offset) {
        free_.erase(key(after->second));
        b.size += other.size;
        other.live = false;
        ++dead_;
        segment.erase(after);
      }
    }
  }

  //! release_cached_blocks(): segments with nothing allocated in them go back to the device.
  void release_free_segments() {
    for (auto segment = segments_.begin(); segment != segments_.end();) {
      bool in_use = false;
      for (const auto& [offset, index] : segment->second) in_use = in_use || blocks_[index].allocated;
      if (in_use) {
        ++segment;
        continue;
      }
      for (const auto& [offset, index] : segment->second) {
        free_.erase(key(index));
        reserved_ -= blocks_[index].size;
        blocks_[index].live = false;
        ++dead_;
      }
      segment = segments_.erase(segment);
    }
  }

  size_t dead_blocks() const { return dead_; }

  //! Drops the blocks merged away or released (they only slowed every search) and renumbers the
  //! handles' and indexes' block indices.
  void compact() {
    std::vector<int> renumbered(blocks_.size(), -1);
    std::vector<Block> live;
    for (size_t i = 0; i < blocks_.size(); ++i) {
      if (!blocks_[i].live) continue;
      renumbered[i] = static_cast<int>(live.size());
      live.push_back(blocks_[i]);
    }
    for (auto& [id, indices] : handles_)
      for (int& index : indices) index = renumbered[static_cast<size_t>(index)];
    blocks_ = std::move(live);
    dead_ = 0;
    free_.clear();
    segments_.clear();
    for (size_t i = 0; i < blocks_.size(); ++i) {
      const int index = static_cast<int>(i);
      segments_[blocks_[i].segment][blocks_[i].offset] = index;
      if (!blocks_[i].allocated) free_.insert(key(index));
    }
  }

  int64_t limit_;
  int64_t allocated_ = 0, reserved_ = 0;
  int next_segment_ = 0;
  std::vector<Block> blocks_;
  size_t dead_ = 0;  // blocks no longer live
  std::map<int64_t, std::vector<int>> handles_;
  std::set<FreeKey> free_;                          // the live blocks not allocated
  std::map<int, std::map<int64_t, int>> segments_;  // each segment's live blocks by offset
};

}  // namespace

// ---- Public ------------------------------------------------------------------------------------

int64_t allocated_bytes(int64_t bytes, const std::string& device_kind) {
  if (device_kind == "cuda") return bytes <= 0 ? 0 : std::max(kCudaMinBlock, round_up(bytes, kCudaMinBlock));
  return bytes;
}

int64_t cuda_request_bytes(int64_t bytes) {
  const int64_t size = std::max(kCudaMinBlock, round_up(bytes, kCudaMinBlock));
  if (size <= kCudaSmallSize) return kCudaSmallBuffer;
  if (size < kCudaMinLargeAlloc) return kCudaLargeBuffer;
  return round_up(size, kCudaRoundLarge);
}

Prediction predict(const spec::Spec& spec, const std::string& variant, const std::string& device_kind) {
  return predict(spec, variant, device_kind, ModelOptions{});
}

Prediction predict(const spec::Spec& spec, const std::string& variant, const std::string& device_kind,
                   const ModelOptions& options) {
  check_device_kind(device_kind);
  const spec::Variant& v = find_variant(spec, variant);
  const int threads = resolve_threads(options);
  const Trace trace = build_trace(spec, v.impl, device_kind, options, 1);
  const PhasePeaks peaks = phase_peaks(trace, device_kind);
  Prediction p;
  p.variant = variant;
  p.impl = v.impl;
  p.device_kind = device_kind;
  p.allocations = allocation_list(trace);
  p.fwd_peak_bytes = peaks.fwd_peak;
  p.bwd_peak_bytes = peaks.bwd_peak;
  p.baseline_bytes = peaks.baseline;
  p.saved_bytes = peaks.saved;
  p.fwd_peak_terms = peak_terms(trace, device_kind, peaks.fwd_begin, peaks.fwd_peak_at);
  p.bwd_peak_terms = peak_terms(trace, device_kind, peaks.bwd_begin, peaks.bwd_peak_at);
  p.cpu_threads = v.impl == "fused" && device_kind == "cpu" ? threads : 1;
  return p;
}

nlohmann::json to_json(const Prediction& p) {
  nlohmann::json allocations = nlohmann::json::array();
  for (const Allocation& a : p.allocations)
    allocations.push_back({{"tensor", a.tensor}, {"shape", a.shape}, {"dtype", a.dtype}, {"bytes", a.bytes},
                           {"phase", a.phase}, {"note", a.note}, {"count", a.count}});
  const auto terms = [](const std::vector<PeakTerm>& list) {
    nlohmann::json json = nlohmann::json::array();
    for (const PeakTerm& t : list) json.push_back({{"tensor", t.tensor}, {"count", t.count}, {"bytes", t.bytes}});
    return json;
  };
  return {{"variant", p.variant},
          {"impl", p.impl},
          {"device_kind", p.device_kind},
          {"fwd_peak_bytes", p.fwd_peak_bytes},
          {"bwd_peak_bytes", p.bwd_peak_bytes},
          {"baseline_bytes", p.baseline_bytes},
          {"saved_bytes", p.saved_bytes},
          {"fwd_peak_terms", terms(p.fwd_peak_terms)},
          {"bwd_peak_terms", terms(p.bwd_peak_terms)},
          {"cpu_threads", p.cpu_threads},
          {"allocations", allocations}};
}

std::optional<OomPrediction> predict_oom(const spec::Spec& spec, const std::string& variant, const std::string& device_kind,
                                         int64_t limit_bytes, const ModelOptions& options) {
  check_device_kind(device_kind);
  const spec::Variant& v = find_variant(spec, variant);
  // One step's events (the inputs, then one iteration), replayed once per warm-up and repeat: the
  // iterations are the same code, so the trace of one stands for all (what grows with the count is
  // the replay's time, not the parent's memory). Each iteration's tensors get ids of their own.
  const Trace trace = build_trace(spec, v.impl, device_kind, options, 1);
  const auto& events = trace.events();
  size_t first_step_event = events.size();
  for (size_t i = 0; i < events.size(); ++i)
    if (events[i].type == Event::Type::phase && events[i].phase == "fwd") {
      first_step_event = i;
      break;
    }
  const int64_t ids_per_iteration = static_cast<int64_t>(trace.tensors().size());
  CachingAllocatorModel cuda(limit_bytes);
  int64_t cpu_in_use = 0;
  std::string phase = "inputs";
  // Replays events [begin, end) as iteration `iteration`; the OOM, if one happens.
  const auto replay = [&](size_t begin, size_t end, int iteration) -> std::optional<OomPrediction> {
    const int64_t id_offset = iteration * ids_per_iteration;
    for (size_t i = begin; i < end; ++i) {
      const Event& e = events[i];
      if (e.type == Event::Type::phase) {
        phase = e.phase == "end" ? "bwd" : e.phase;
        continue;
      }
      const Tensor& t = trace.tensors()[e.tensor];
      const int64_t id = i < first_step_event ? e.tensor : e.tensor + id_offset;
      if (e.type == Event::Type::free) {
        if (device_kind == "cuda") cuda.free(id);
        else cpu_in_use -= tensor_bytes(t, device_kind);
        continue;
      }
      if (device_kind == "cpu") {
        // The tracking allocator refuses an allocation that would take the bytes in use past the cap.
        for (int64_t part : t.parts) {
          if (limit_bytes > 0 && cpu_in_use + part > limit_bytes)
            return OomPrediction{trace.kinds()[t.kind].name, std::max<int64_t>(0, t.layer), phase, iteration, part,
                                 cpu_in_use, cpu_in_use};
          cpu_in_use += part;
        }
        continue;
      }
      for (int64_t part : t.parts) {
        const int64_t allocated_before = cuda.allocated(), reserved_before = cuda.reserved();
        const auto result = cuda.malloc(id, part);
        if (!result.ok)
          return OomPrediction{trace.kinds()[t.kind].name, std::max<int64_t>(0, t.layer), phase, iteration, result.request,
                               allocated_before, reserved_before};
      }
    }
    return std::nullopt;
  };
  if (auto oom = replay(0, first_step_event, 0)) return oom;
  // An iteration that ends in a state an earlier one ended in (the same bytes in use; on CUDA the
  // same segments, blocks and live tensors) starts a cycle the rest of the iterations repeat
  // exactly, and that cycle had no OOM: the replay ends there (after two iterations, in practice).
  // A tensor is named by what it is in the trace and, for a step's, by the iteration it belongs
  // to relative to the one just ended ("7@-1": tensor 7 of the iteration before).
  std::vector<bool> is_input(static_cast<size_t>(ids_per_iteration), false);
  for (size_t i = 0; i < first_step_event; ++i)
    if (events[i].type != Event::Type::phase) is_input[static_cast<size_t>(events[i].tensor)] = true;
  std::deque<std::string> recent_ends;
  for (int iteration = 0; iteration < spec.warmup + spec.repeats; ++iteration) {
    if (auto oom = replay(first_step_event, events.size(), iteration)) return oom;
    const auto label = [&](int64_t id) {
      const int64_t tensor = id % ids_per_iteration;
      if (id < ids_per_iteration && is_input[static_cast<size_t>(tensor)]) return "in" + std::to_string(tensor);
      return std::to_string(tensor) + "@" + std::to_string(id / ids_per_iteration - iteration);
    };
    std::string end_state = device_kind == "cuda" ? cuda.state(label) : std::to_string(cpu_in_use);
    if (std::find(recent_ends.begin(), recent_ends.end(), end_state) != recent_ends.end()) break;
    recent_ends.push_back(std::move(end_state));
    if (recent_ends.size() > 8) recent_ends.pop_front();
  }
  return std::nullopt;
}

// ---- explain -----------------------------------------------------------------------------------

namespace {

struct Candidate {
  size_t point = 0;
  std::string variant;
  Allocation allocation;
};

//! "1·32·8192·16384·4 B = 16.00 GiB"
std::string numbers_of(const Allocation& a) {
  return join_shape(a.shape, "·") + "·" + std::to_string(element_bytes(a.dtype)) + " B = " + format_bytes_as_pytorch(a.bytes);
}

std::string describe_occurrence(const OomPrediction& oom, const spec::Spec& spec, int64_t cap) {
  std::string text = "the replay under the " + format_bytes_as_pytorch(cap) + " cap fails here: " + oom.tensor + " of layer " +
                     std::to_string(oom.layer) + " (of " + std::to_string(spec.layers) + "), " + oom.phase + ", " +
                     (oom.iteration < spec.warmup ? "warm-up" : "measured") + " step " + std::to_string(oom.iteration) + ", with " +
                     format_bytes_as_pytorch(oom.allocated_bytes) + " allocated";
  if (oom.reserved_bytes != oom.allocated_bytes) text += " and " + format_bytes_as_pytorch(oom.reserved_bytes) + " reserved";
  return text;
}

}  // namespace

std::vector<Match> explain(const std::vector<std::pair<nlohmann::json, spec::Spec>>& point_specs, int64_t bytes,
                           size_t limit) {
  OomMessage message;
  message.requested_bytes = bytes;
  return explain(point_specs, message, ExplainOptions{}, limit);
}

std::vector<Match> explain(const std::vector<std::pair<nlohmann::json, spec::Spec>>& point_specs, const OomMessage& message,
                           const ExplainOptions& options, size_t limit) {
  check_device_kind(options.device_kind);
  if (message.requested_bytes <= 0) throw std::invalid_argument("explain: the byte count must be positive");
  const double asked = static_cast<double>(message.requested_bytes);
  const bool cuda = options.device_kind == "cuda";

  // Every tensor kind of every variant at every point; same shape and dtype at one point is one
  // row, naming the variants and the other tensors of that size.
  struct Group {
    size_t point;
    Allocation first;
    std::vector<std::string> variants;
    std::vector<std::string> others;
    double error;
    bool by_segment;
  };
  std::vector<Group> groups;
  for (size_t p = 0; p < point_specs.size(); ++p) {
    const spec::Spec& spec = point_specs[p].second;
    if (spec.kind != "attention_step") continue;
    for (const spec::Variant& variant : spec.variants) {
      const Prediction prediction = predict(spec, variant.name, options.device_kind, options.model);
      for (const Allocation& a : prediction.allocations) {
        auto found = std::find_if(groups.begin(), groups.end(), [&](const Group& g) {
          return g.point == p && g.first.shape == a.shape && g.first.dtype == a.dtype;
        });
        if (found == groups.end()) {
          const double exact = std::abs(asked - static_cast<double>(a.bytes)) / asked;
          const double segment =
              cuda ? std::abs(asked - static_cast<double>(cuda_request_bytes(a.bytes))) / asked : exact;
          groups.push_back({p, a, {variant.name}, {}, std::min(exact, segment), segment < exact});
          continue;
        }
        if (std::find(found->variants.begin(), found->variants.end(), variant.name) == found->variants.end())
          found->variants.push_back(variant.name);
        if (a.tensor != found->first.tensor &&
            std::find(found->others.begin(), found->others.end(), a.tensor) == found->others.end())
          found->others.push_back(a.tensor);
      }
    }
  }

  std::vector<Match> matches;
  for (const Group& g : groups) {
    const bool within = g.error <= options.tolerance;
    if (!within && !options.nearest_when_none) continue;
    Match m;
    m.tensor = g.first.tensor;
    for (const std::string& v : g.variants) m.variant += (m.variant.empty() ? "" : ",") + v;
    m.point = point_specs[g.point].first;
    m.shape = g.first.shape;
    m.dtype = g.first.dtype;
    m.bytes = g.first.bytes;
    m.relative_error = g.error;
    m.phase = g.first.phase;
    m.within_tolerance = within;
    m.explanation = g.first.note + ": " + numbers_of(g.first);
    if (g.by_segment) m.explanation += " (the allocator asks for " + format_bytes_as_pytorch(cuda_request_bytes(g.first.bytes)) + ")";
    if (!g.others.empty()) {
      std::string others;
      for (const std::string& o : g.others) others += (others.empty() ? "" : ", ") + o;
      m.explanation += "; same size: " + others;
    }
    matches.push_back(std::move(m));
  }
  const bool any_within = std::any_of(matches.begin(), matches.end(), [](const Match& m) { return m.within_tolerance; });
  if (any_within) {
    matches.erase(std::remove_if(matches.begin(), matches.end(), [](const Match& m) { return !m.within_tolerance; }),
                  matches.end());
  }

  // With a cap in the message, replay each matching variant under it: where the replay fails on a
  // tensor of this group, say which one.
  if (message.capacity_bytes) {
    for (Match& m : matches) {
      if (!m.within_tolerance) continue;
      const size_t point = static_cast<size_t>(std::find_if(point_specs.begin(), point_specs.end(), [&](const auto& ps) {
                                                 return ps.first == m.point;
                                               }) - point_specs.begin());
      const spec::Spec& spec = point_specs[point].second;
      size_t start = 0;
      while (start < m.variant.size()) {
        const size_t comma = m.variant.find(',', start);
        const std::string variant = m.variant.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
        start = comma == std::string::npos ? m.variant.size() : comma + 1;
        const auto oom = predict_oom(spec, variant, options.device_kind, *message.capacity_bytes, options.model);
        if (!oom) continue;
        const auto prediction = predict(spec, variant, options.device_kind, options.model);
        const auto kind = std::find_if(prediction.allocations.begin(), prediction.allocations.end(),
                                       [&](const Allocation& a) { return a.tensor == oom->tensor; });
        if (kind == prediction.allocations.end() || kind->shape != m.shape || kind->dtype != m.dtype) continue;
        m.occurrence = variant + ": " + describe_occurrence(*oom, spec, *message.capacity_bytes);
        break;
      }
    }
  }

  std::stable_sort(matches.begin(), matches.end(), [](const Match& a, const Match& b) {
    if (a.relative_error != b.relative_error) return a.relative_error < b.relative_error;
    return !a.occurrence.empty() && b.occurrence.empty();
  });
  if (matches.size() > limit) matches.resize(limit);
  return matches;
}

}  // namespace harness::memory_model
