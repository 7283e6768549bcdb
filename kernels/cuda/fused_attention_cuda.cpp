// LibTorch boundary of the CUDA fused attention: every shape / dtype / device check happens here
// (TORCH_CHECK for misuse, UnsupportedError for what has no kernel); below this file the kernels
// take plain structs (attention_params.h) and trust them.

#include "kernels/cuda/fused_attention_cuda.h"
#include "kernels/fused_function.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>
#include <ATen/record_function.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "build_info.h"
#include "git_info.h"
#include "kernels/autotune.h"
#include "kernels/cuda/attention_params.h"
#include "kernels/cuda/boundary.h"
#include "kernels/cuda/cuda_check.h"

namespace harness::kernels {

namespace {

namespace kc = harness::kernels::cuda;

//! What the backward needs besides the saved tensors. The BlockMask tensors and mask arrays are
//! held here (reference counted), so the graph stays valid even if the MaskContext goes away.
struct FusedCudaState : torch::CustomClassHolder {
  kc::FwdKernel fwd_kernel = kc::kDefaultFwdKernel;  //!< set by the forward's pick
  std::string fwd_how;        //!< how the forward kernel was chosen (for the dispatch record)
  std::string requested_fwd;  //!< CudaKernelChoice::fwd of the call ("" = autotune)
  std::string requested_bwd;  //!< CudaKernelChoice::bwd of the call ("" = autotune)
  //! The call's mask, for the forward's candidates' BlockMasks; valid during the forward only
  //! (apply() runs it inside fused_attention_cuda), null afterwards.
  MaskContext* forward_mask = nullptr;
  std::string mask_kind;      //!< for the autotuner's key
  kc::AttentionShape shape;
  kc::MaskParams mask;
  at::Tensor anchors, doc_id, bits;
  BlockMask dq_blocks, dkdv_blocks;
  //! The backward's CTA schedules kept with the mask (null under CUDA graph capture): the merged
  //! dK/dV + dQ one of wgmma and mma, and wgmma_atomic's.
  std::shared_ptr<MaskContext::KeptBuffer> bwd_schedule_merged, bwd_schedule_atomic;
  cudaStream_t schedule_stream = nullptr;  //!< the stream they are built and read on
  bool keep_schedules = true;              //!< CudaKernelChoice::keep_schedules of the call
  kc::LaunchOptions launch;                //!< the call's launch options (launch_options)
  int32_t fwd_ctas = kc::kFwdCtasKernelDefault;  //!< FwdParams::max_ctas of the call
  float scale = 1.f;
  bool deterministic = false;
  DispatchTrace* trace = nullptr;
};

// Bound to this file's name for error messages; the helpers live in kernels/cuda/boundary.h.
constexpr const char* kWho = "fused_cuda attention";
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

//! What a forward's and a backward's parameters share: the shape, q, k, v, the forward's output
//! and LSE, the scale and the mask.
template <typename Params>
void set_step_params(Params& params, const FusedCudaState& state, const at::Tensor& q, const at::Tensor& k,
                     const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse) {
  params.shape = state.shape;
  params.q = tensor_ref(q);
  params.k = tensor_ref(k);
  params.v = tensor_ref(v);
  params.o = tensor_ref(out);
  params.lse = lse.data_ptr<float>();
  params.scale = state.scale;
  params.mask = state.mask;
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

// ---- Kernel choice: forced, default, or autotuned ------------------------------------------------

//! Which kernel runs and how it was chosen (for the dispatch record).
struct KernelPick {
  std::string name;
  std::string how;
};

//! HARNESS_AUTOTUNE=off (or 0) turns timing off: every call then runs the default kernels.
bool autotune_enabled() {
  const char* value = std::getenv("HARNESS_AUTOTUNE");
  return value == nullptr || (std::string(value) != "off" && std::string(value) != "0");
}

std::string environment(const char* name) {
  const char* value = std::getenv(name);
  return value ? value : "";
}

//! The launch options of a call (CudaKernelChoice's, or where it leaves one at its default the
//! documented environment override: HARNESS_SCHEDULE_ORDER, HARNESS_CUDA_PDL=0,
//! HARNESS_CUDA_FWD_PERSISTENT = 0 | 1 | grid:N) into `state`.
void set_launch_options(const CudaKernelChoice& choice, FusedCudaState& state) {
  const std::string order = choice.schedule_order.empty() ? environment("HARNESS_SCHEDULE_ORDER") : choice.schedule_order;
  state.launch.schedule_order = kc::ScheduleOrder::kernel_default;
  if (!order.empty()) {
    bool known = false;
    for (const kc::ScheduleOrder candidate :
         {kc::ScheduleOrder::interleaved, kc::ScheduleOrder::batch, kc::ScheduleOrder::kv_head}) {
      if (order == kc::schedule_order_label(candidate)) {
        state.launch.schedule_order = candidate;
        known = true;
      }
    }
    TORCH_CHECK(known, kWho, ": schedule order \"", order, "\" (",
                choice.schedule_order.empty() ? "HARNESS_SCHEDULE_ORDER" : "the call's options",
                "); expected interleaved, batch or kv_head");
  }
  state.launch.programmatic = choice.programmatic_launch && environment("HARNESS_CUDA_PDL") != "0";
  state.fwd_ctas = choice.fwd_ctas;
  const std::string ctas = environment("HARNESS_CUDA_FWD_PERSISTENT");
  if (choice.fwd_ctas == kc::kFwdCtasKernelDefault && !ctas.empty()) {
    const bool grid = ctas.rfind("grid:", 0) == 0 && ctas.size() > 5 &&
                      ctas.find_first_not_of("0123456789", 5) == std::string::npos && std::stol(ctas.substr(5)) > 0;
    TORCH_CHECK(ctas == "0" || ctas == "1" || grid, kWho, ": HARNESS_CUDA_FWD_PERSISTENT=\"", ctas,
                "\"; expected 0 (one CTA per work item), 1 (one per SM slot) or grid:N");
    state.fwd_ctas = ctas == "0"   ? kc::kFwdCtasPerItem
                     : ctas == "1" ? kc::kFwdCtasPerSmSlot
                                   : to_int32(std::stol(ctas.substr(5)), "HARNESS_CUDA_FWD_PERSISTENT grid:N");
  }
  TORCH_CHECK(state.fwd_ctas >= kc::kFwdCtasPerSmSlot, kWho, ": fwd_ctas ", state.fwd_ctas,
              "; expected 0 (the kernel's default), -1 (one per work item), -2 (one per SM slot) or N > 0");
}

//! The call's launch options that differ from the defaults, for the dispatch record ("" when none).
std::string launch_text(const FusedCudaState& state, bool forward) {
  std::string text;
  const std::string order = kc::schedule_order_label(state.launch.schedule_order);
  if (!order.empty()) text += ", CTA order " + order;
  if (!state.launch.programmatic) text += ", plain launches (no programmatic dependent launch)";
  if (forward && state.fwd_ctas != kc::kFwdCtasKernelDefault) {
    text += state.fwd_ctas == kc::kFwdCtasPerItem     ? ", one CTA per work item"
            : state.fwd_ctas == kc::kFwdCtasPerSmSlot ? ", persistent CTAs, one per SM slot"
                                                      : ", at most " + std::to_string(state.fwd_ctas) + " persistent CTAs";
  }
  return text.empty() ? text : "; launch options" + text;
}

//! One autotuner per device for the process, keyed by the GPU and this build, with the disk cache
//! of default_autotune_cache_path() (memory only when there is no HOME and no HARNESS_AUTOTUNE_CACHE).
Autotuner& device_autotuner(int device) {
  static std::mutex mutex;
  static std::map<int, std::unique_ptr<Autotuner>> tuners;
  const std::lock_guard<std::mutex> lock(mutex);
  std::unique_ptr<Autotuner>& tuner = tuners[device];
  if (!tuner) {
    const auto* properties = at::cuda::getDeviceProperties(device);
    AutotuneOptions options;
    options.device_identity = std::string(properties->name) + "|sm" + std::to_string(properties->major) +
                              std::to_string(properties->minor) + "|" + std::to_string(properties->multiProcessorCount) +
                              " SMs";
    options.build_identity = std::string("harness ") + HARNESS_GIT_COMMIT + "|nvcc " + HARNESS_NVCC_VERSION + "|sm " +
                             HARNESS_CUDA_ARCHS;
    try {
      options.cache_path = default_autotune_cache_path();
    } catch (const std::exception&) {
      options.use_disk_cache = false;
    }
    tuner = std::make_unique<Autotuner>(options);
  }
  return *tuner;
}

//! Median of 5 timed launches after one warm-up (module load, tensor-map encoding), CUDA events on
//! `stream`; +inf for a candidate the launcher has no configuration for (the autotuner skips it).
//! Candidates are timed on the call's own inputs, writing its own outputs. Each timed launch is
//! enqueued while the stream is held (kc::hold_stream), so its kernels run back to back and the
//! events time the GPU's work: timed from an idle stream, a candidate with more launches also paid
//! the host's work between them. (That host work does not explain the deterministic backward's
//! pick over the atomic one at dflash 512 anchors, which the self-test times 10% faster: timed this
//! way the pick stands, 1.040 against 1.054 ms on the H200; why the atomic path takes longer in the
//! op than in the self-test, 1.012 ms with the same memset and convert, is open.)
double time_candidate_ms(cudaStream_t stream, const std::function<void()>& launch) {
  // Longer than the host needs to enqueue one call (40-70 us at the real dims, H200).
  constexpr unsigned kHoldMicroseconds = 500;
  try {
    launch();
  } catch (const kc::UnsupportedConfig&) {
    return std::numeric_limits<double>::infinity();
  }
  cudaEvent_t start = nullptr, stop = nullptr;
  HARNESS_CUDA_CHECK(cudaEventCreate(&start));
  HARNESS_CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<float> times;
  for (int i = 0; i < 5; ++i) {
    kc::hold_stream(stream, kHoldMicroseconds);
    HARNESS_CUDA_CHECK(cudaEventRecord(start, stream));
    launch();
    HARNESS_CUDA_CHECK(cudaEventRecord(stop, stream));
    HARNESS_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0.f;
    HARNESS_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    times.push_back(ms);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

std::string timings_text(const Choice& choice) {
  std::vector<CandidateTiming> sorted = choice.timings;
  std::stable_sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.time_ms < b.time_ms; });
  std::string text;
  for (const CandidateTiming& timing : sorted) {
    char ms[32];
    std::snprintf(ms, sizeof ms, " %.3f ms", timing.time_ms);
    text += (text.empty() ? "" : ", ") + timing.config + (std::isfinite(timing.time_ms) ? std::string(ms) : " cannot run");
  }
  return text;
}

//! The candidates' names, in the kernels' order (the autotuner's candidate list).
template <typename Kernel>
std::vector<std::string> kernel_names(const std::vector<Kernel>& kernels, const char* (*name)(Kernel)) {
  std::vector<std::string> names;
  for (const Kernel kernel : kernels) names.push_back(name(kernel));
  return names;
}

std::string joined(const std::vector<std::string>& names) {
  std::string text;
  for (const std::string& name : names) text += (text.empty() ? "" : ", ") + name;
  return text;
}

//! The kernel named by the call's options, else by `env_name`, else the autotuner's choice among
//! `names` (the kernels that run at the call's shape, of `known`; `shape_text` names the shape) for
//! `key` (timed by `time`), else (autotuning off) `fallback`.
KernelPick pick_kernel(const std::string& requested, const char* env_name, const std::vector<std::string>& known,
                       const std::vector<std::string>& names, const std::string& shape_text, const std::string& fallback,
                       const AutotuneKey& key, const TimingFunction& time, int device) {
  std::string forced = requested;
  std::string source = "the call's options";
  if (forced.empty()) {
    forced = environment(env_name);
    source = env_name;
  }
  if (!forced.empty()) {
    if (std::find(known.begin(), known.end(), forced) == known.end()) {
      throw UnsupportedError(std::string(kWho) + ": unknown kernel \"" + forced + "\" (" + source + "); known: " + joined(known));
    }
    if (std::find(names.begin(), names.end(), forced) == names.end()) {
      throw UnsupportedError(std::string(kWho) + ": kernel \"" + forced + "\" (" + source + ") does not run at " + shape_text +
                             "; the kernels that do: " + joined(names));
    }
    return {forced, "forced by " + source};
  }
  if (!autotune_enabled()) return {fallback, "default (HARNESS_AUTOTUNE=off)"};
  // Hot path: a key seen before in this process gets the pick the autotuner already made, with the
  // text it would give (source "memory"), without asking it again or formatting the timings anew.
  static std::mutex memo_mutex;
  static std::map<std::pair<std::string, int>, KernelPick> memo;
  auto memo_key = std::make_pair(key.canonical(), device);
  {
    const std::lock_guard<std::mutex> lock(memo_mutex);
    const auto found = memo.find(memo_key);
    if (found != memo.end()) return found->second;
  }
  Choice choice = device_autotuner(device).choose(key, names, time);
  const std::string head = ", key " + memo_key.first + "): " + timings_text(choice);
  KernelPick pick{choice.config, std::string("autotuned (") + choice_source_name(choice.source) + head};
  {
    const std::lock_guard<std::mutex> lock(memo_mutex);
    memo.emplace(std::move(memo_key),
                 KernelPick{choice.config, std::string("autotuned (") + choice_source_name(ChoiceSource::memory) + head});
  }
  return pick;
}

//! Whether `stream` is capturing a CUDA graph: then nothing is kept between calls (a graph may be
//! replayed after the MaskContext that would hold it is gone), the schedules are built in the
//! call's scratch as part of the graph.
bool capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  HARNESS_CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
  return status != cudaStreamCaptureStatusNone;
}

//! The key of a kept schedule: what it depends on besides the mask (the launch shape, the kernel),
//! and the stream it is built and read on (so that no launch reads it before it is written).
std::string schedule_key(const char* what, const FusedCudaState& state, cudaStream_t stream) {
  const kc::AttentionShape& s = state.shape;
  const std::string order = kc::schedule_order_label(state.launch.schedule_order);
  return std::string(what) + " b" + std::to_string(s.batch) + " h" + std::to_string(s.heads) + " kv" +
         std::to_string(s.kv_heads) + " d" + std::to_string(s.head_dim) + (order.empty() ? "" : " order " + order) +
         " stream " + std::to_string(reinterpret_cast<uintptr_t>(stream));
}

//! Points `cache` at a kept schedule (or leaves it empty without one).
void use_schedule(const std::shared_ptr<MaskContext::KeptBuffer>& kept, kc::ScheduleCache& cache) {
  cache = {};
  if (!kept) return;
  cache.items = static_cast<kc::WorkItem*>(kept->tensor.data_ptr());
  cache.written = kept->written.load();
}

//! "head dims 192/128 bf16": what decides which kernels a shape has.
std::string dims_text(const kc::AttentionShape& s) {
  return "head dims " + std::to_string(s.head_dim) + "/" + std::to_string(kc::value_head_dim_of(s)) + " " +
         kc::element_type_label(s.dtype);
}

//! The autotuner's key of a call: op with the head counts (and the v head dim where it differs
//! from q·k's), head dim, dtype, mask kind, lengths.
AutotuneKey tuning_key(const char* op, const FusedCudaState& state) {
  const kc::AttentionShape& s = state.shape;
  const int32_t v_head_dim = kc::value_head_dim_of(s);
  const std::string name = std::string(op) + "_h" + std::to_string(s.heads) + "_kv" + std::to_string(s.kv_heads) + "_b" +
                           std::to_string(s.batch) + (v_head_dim != s.head_dim ? "_dv" + std::to_string(v_head_dim) : "");
  return AutotuneKey::attention(name, s.head_dim, kc::element_type_label(s.dtype), state.mask_kind, s.q_len, s.kv_len);
}

//! The forward kernels: out and the LSE, without autograd (picks state->fwd_kernel).
FusedForward run_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, FusedCudaState* state) {
  RECORD_FUNCTION("harness::fused_cuda forward (host)", std::vector<c10::IValue>());
  const c10::cuda::CUDAGuard device_guard(q.device());
  at::Tensor out = at::empty({q.size(0), q.size(1), q.size(2), v.size(3)}, q.options());
  at::Tensor lse = at::empty({q.size(0), q.size(1), q.size(2)}, q.options().dtype(at::kFloat));
  TORCH_CHECK(state->forward_mask != nullptr, "fused_cuda attention: forward without its mask");
  MaskContext& mask = *state->forward_mask;
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream(q.device().index()).stream();
  const bool keep_schedules = state->keep_schedules && !capturing(stream);
  // The parameters of kernel `kernel` at its own tiling (its BlockMask, cached in the MaskContext)
  // writing `out` and `lse`, with `scratch` sized for it and its schedule kept with the mask.
  auto params_for = [&](kc::FwdKernel kernel, at::Tensor& scratch, std::shared_ptr<MaskContext::KeptBuffer>& kept) {
    const kc::TileShape tile = kc::fwd_tile_shape(state->shape, kernel);
    kc::FwdParams params;
    params.kernel = kernel;
    set_step_params(params, *state, q, k, v, out, lse);
    params.max_ctas = state->fwd_ctas;
    params.blocks = block_list(mask.block_mask(tile.block_m, tile.block_n, q.device()));
    scratch = at::empty({static_cast<int64_t>(kc::fwd_scratch_bytes(params.shape, params.blocks, kernel))},
                        q.options().dtype(at::kByte));
    params.scratch = scratch.data_ptr();
    params.scratch_bytes = static_cast<size_t>(scratch.numel());
    if (keep_schedules) {
      kept = mask.kept_buffer(schedule_key(kc::fwd_kernel_name(kernel), *state, stream),
                              static_cast<int64_t>(kc::fwd_schedule_bytes(params.shape, params.blocks, kernel)), q.device());
    }
    use_schedule(kept, params.schedule);
    return params;
  };
  auto run = [&](const kc::FwdParams& params, const std::shared_ptr<MaskContext::KeptBuffer>& kept) {
    kc::run_attention_fwd(params, stream, state->launch);
    if (kept) kept->written = true;
  };
  launch([&] {
    static const std::vector<std::string> known = kernel_names(kc::fwd_kernels(), kc::fwd_kernel_name);
    const std::vector<std::string> names = kernel_names(kc::fwd_candidates(state->shape), kc::fwd_kernel_name);
    // Candidates write the real out and lse (the chosen kernel overwrites them below), so tuning
    // adds no output-sized memory to the step; what stays is each candidate's BlockMask.
    const TimingFunction time = [&](const std::string& name) {
      kc::FwdKernel kernel;
      kc::parse_fwd_kernel(name, &kernel);
      at::Tensor scratch;
      std::shared_ptr<MaskContext::KeptBuffer> kept;
      kc::FwdParams params = params_for(kernel, scratch, kept);  // shapes were checked above: no UnsupportedConfig here
      return time_candidate_ms(stream, [&] {
        run(params, kept);
        use_schedule(kept, params.schedule);  // the first launch built it; the timed ones reuse it
      });
    };
    KernelPick pick;
    {
      RECORD_FUNCTION("harness::fused_cuda pick", std::vector<c10::IValue>());
      pick = pick_kernel(state->requested_fwd, "HARNESS_CUDA_FWD_KERNEL", known, names, dims_text(state->shape),
                         kc::fwd_kernel_name(kc::default_fwd_kernel(state->shape)), tuning_key("attention_fwd", *state),
                         time, q.device().index());
    }
    kc::parse_fwd_kernel(pick.name, &state->fwd_kernel);
    state->fwd_how = pick.how;
    at::Tensor scratch;
    std::shared_ptr<MaskContext::KeptBuffer> kept;
    RECORD_FUNCTION("harness::fused_cuda params + launch", std::vector<c10::IValue>());
    const kc::FwdParams params = params_for(state->fwd_kernel, scratch, kept);
    run(params, kept);
  });
  return {out, lse};
}

//! With deterministic=true, a backward kernel forced by the call's options or HARNESS_CUDA_BWD_KERNEL
//! must be a deterministic one: anything else is refused (before any work, from the forward).
void require_deterministic_choice(const FusedCudaState& state) {
  if (!state.deterministic) return;
  const std::string forced = state.requested_bwd.empty() ? environment("HARNESS_CUDA_BWD_KERNEL") : state.requested_bwd;
  kc::BwdKernel kernel;
  if (kc::parse_bwd_kernel(forced, &kernel) && !kc::bwd_kernel_is_deterministic(kernel)) {
    throw UnsupportedError(std::string(kWho) + ": backward kernel \"" + forced + "\" (" +
                           (state.requested_bwd.empty() ? "HARNESS_CUDA_BWD_KERNEL" : "the call's options") +
                           ") is not deterministic, but deterministic=true was asked; deterministic kernels: " +
                           joined(kernel_names(kc::deterministic_bwd_kernels(), kc::bwd_kernel_name)));
  }
}

//! The backward kernels from the forward's out and LSE, without autograd.
FusedGradients run_backward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
                            const at::Tensor& lse, const at::Tensor& grad_out, const FusedCudaState* state) {
  RECORD_FUNCTION("harness::fused_cuda backward (host)", std::vector<c10::IValue>());
  const c10::cuda::CUDAGuard device_guard(q.device());
  TORCH_CHECK(grad_out.sizes() == out.sizes(), "fused_cuda attention backward: expected one gradient shaped like the output");
  const at::Tensor dout = kernel_layout(grad_out.to(q.scalar_type()));
  at::Tensor dq = at::empty(q.sizes(), q.options());
  at::Tensor dk = at::empty(k.sizes(), k.options());
  at::Tensor dv = at::empty(v.sizes(), v.options());

  kc::BwdParams params;
  set_step_params(params, *state, q, k, v, out, lse);
  params.dout = tensor_ref(dout);
  params.dq = tensor_ref(dq);
  params.dk = tensor_ref(dk);
  params.dv = tensor_ref(dv);
  params.dq_blocks = block_list(state->dq_blocks);
  params.dkdv_blocks = block_list(state->dkdv_blocks);
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream(q.device().index()).stream();
  at::Tensor scratch;
  KernelPick pick;
  // Scratch sized for `kernel` (wgmma_atomic adds its fp32 dQ accumulator), grown when needed,
  // and the kernel's kept schedule (none under CUDA graph capture).
  const bool keep_schedules = state->keep_schedules && !capturing(stream) && stream == state->schedule_stream;
  auto kept_for = [&](kc::BwdKernel kernel) {
    return !keep_schedules                         ? nullptr
           : kc::bwd_kernel_is_deterministic(kernel) ? state->bwd_schedule_merged
                                                     : state->bwd_schedule_atomic;
  };
  auto with_scratch = [&](kc::BwdParams& trial) {
    const auto need = static_cast<int64_t>(kc::bwd_scratch_bytes(trial.shape, trial.dq_blocks, trial.dkdv_blocks, trial.kernel));
    if (!scratch.defined() || scratch.numel() < need) scratch = at::empty({need}, q.options().dtype(at::kByte));
    trial.scratch = scratch.data_ptr();
    trial.scratch_bytes = static_cast<size_t>(scratch.numel());
    use_schedule(kept_for(trial.kernel), trial.schedule);
  };
  auto run = [&](const kc::BwdParams& trial) {
    kc::run_attention_bwd(trial, stream, state->launch);
    if (const auto kept = kept_for(trial.kernel)) kept->written = true;
  };
  launch([&] {
    // deterministic=true: only the bitwise-reproducible kernels are candidates (own tuning key).
    static const std::vector<std::string> all_names = kernel_names(kc::bwd_kernels(), kc::bwd_kernel_name);
    static const std::vector<std::string> deterministic_names =
        kernel_names(kc::deterministic_bwd_kernels(), kc::bwd_kernel_name);
    const std::vector<std::string>& known = state->deterministic ? deterministic_names : all_names;
    const std::vector<std::string> names =
        kernel_names(kc::bwd_candidates(state->shape, state->deterministic), kc::bwd_kernel_name);
    require_deterministic_choice(*state);  // checked in the forward already; the environment may have changed
    // Candidates write the real gradients (the chosen kernel overwrites them below), so tuning
    // adds no gradient-sized memory to the step.
    const TimingFunction time = [&](const std::string& name) {
      kc::BwdParams trial = params;
      kc::parse_bwd_kernel(name, &trial.kernel);
      with_scratch(trial);
      return time_candidate_ms(stream, [&] {
        run(trial);
        use_schedule(kept_for(trial.kernel), trial.schedule);  // the first launch built it
      });
    };
    {
      RECORD_FUNCTION("harness::fused_cuda pick", std::vector<c10::IValue>());
      pick = pick_kernel(state->requested_bwd, "HARNESS_CUDA_BWD_KERNEL", known, names, dims_text(state->shape),
                         kc::bwd_kernel_name(kc::default_bwd_kernel(state->shape, state->deterministic)),
                         tuning_key(state->deterministic ? "attention_bwd_deterministic" : "attention_bwd", *state), time,
                         q.device().index());
    }
    kc::parse_bwd_kernel(pick.name, &params.kernel);
    RECORD_FUNCTION("harness::fused_cuda params + launch", std::vector<c10::IValue>());
    with_scratch(params);
    run(params);
  });
  if (state->trace) {
    RECORD_FUNCTION("harness::fused_cuda dispatch record", std::vector<c10::IValue>());
    const bool bitwise = kc::bwd_kernel_is_deterministic(params.kernel);
    state->trace->record(
        {"attention_bwd", "fused_cuda", q.device().str(),
         std::string("fused backward: P recomputed from the LSE, dK/dV per kv block over the GQA group's heads; ") +
             (bitwise ? "dQ per q block, no atomics: bitwise deterministic"
                      : "dQ (and dK/dV where a kv block is split over CTAs) summed in fp32 by atomic bulk adds (5 GEMMs "
                        "per pair): NOT bitwise deterministic") +
             " (deterministic=" + (state->deterministic ? "true" : "false") + " asked); kernel " + pick.name + " " +
             pick.how,
         kc::describe_bwd_config(state->shape, params.kernel) + launch_text(*state, false), pick.name});
  }
  return {dq, dk, dv};
}

using FusedAttentionCuda = FusedFunction<FusedCudaState, run_forward, run_backward>;

//! Checked inputs in the kernels' layout and the state of one call.
struct PreparedCall {
  at::Tensor q, k, v;
  c10::intrusive_ptr<FusedCudaState> state;
};


PreparedCall prepare_call(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in, MaskContext& mask,
                          double scale, bool deterministic, DispatchTrace* trace, const CudaKernelChoice& kernels) {
  // Host work before the first launch shows in a Kineto trace (`harness run --trace`) as these ranges.
  RECORD_FUNCTION("harness::fused_cuda prepare", std::vector<c10::IValue>());
  TORCH_CHECK(q_in.dim() == 4 && k_in.dim() == 4 && v_in.dim() == 4, "fused_cuda attention: q, k, v must be 4-D [B, H, L, D]");
  if (!q_in.is_cuda()) {
    throw UnsupportedError("fused_cuda attention: tensors are on " + q_in.device().str() + ", the kernels need a CUDA device");
  }
  TORCH_CHECK(k_in.device() == q_in.device() && v_in.device() == q_in.device(),
              "fused_cuda attention: q, k, v must be on one device (got ", q_in.device(), ", ", k_in.device(), ", ",
              v_in.device(), ")");
  const at::ScalarType dtype = q_in.scalar_type();
  if ((dtype != at::kBFloat16 && dtype != at::kHalf) || k_in.scalar_type() != dtype || v_in.scalar_type() != dtype) {
    throw UnsupportedError(std::string("fused_cuda attention: dtypes q ") + c10::toString(dtype) + ", k " +
                           c10::toString(k_in.scalar_type()) + ", v " + c10::toString(v_in.scalar_type()) +
                           " have no kernel (q, k and v all bf16 or all fp16 do)");
  }
  const int64_t head_dim = q_in.size(3);
  const auto* properties = at::cuda::getDeviceProperties(q_in.device().index());
  if (properties->major != 9) {
    throw UnsupportedError("fused_cuda attention: " + std::string(properties->name) + " is sm_" +
                           std::to_string(properties->major) + std::to_string(properties->minor) +
                           "; the kernels are built for sm_90a (Hopper)");
  }
  TORCH_CHECK(k_in.size(0) == v_in.size(0) && k_in.size(1) == v_in.size(1) && k_in.size(2) == v_in.size(2),
              "fused_cuda attention: k and v must have one batch, kv head count and length (got ", k_in.sizes(), " and ",
              v_in.sizes(), ")");
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
                                    to_int32(head_dim, "head_dim"), to_int32(v.size(3), "v head_dim"),
                                    dtype == at::kHalf ? kc::ElementType::fp16 : kc::ElementType::bf16};
  // The head dims and dtype the kernels cover (attention_config.h); the reason names them.
  if (!kc::shape_supported(state->shape)) throw UnsupportedError(kc::unsupported_shape_reason(state->shape));
  state->scale = static_cast<float>(scale);
  state->deterministic = deterministic;
  state->trace = trace;
  state->requested_bwd = kernels.bwd;
  require_deterministic_choice(*state);
  state->mask_kind = std::string(mask_kind_name(resolved.kind));
  state->anchors = mask.anchors(q.device());
  state->doc_id = mask.doc_id(q.device());
  state->bits = mask.bits(q.device());
  state->mask = kc::mask_params(resolved, state->anchors, state->doc_id, state->bits, kWho);

  kc::TileShape dq_tile, dkdv_tile;
  launch([&] {
    dq_tile = kc::bwd_dq_tile_shape(state->shape);
    dkdv_tile = kc::bwd_dkdv_tile_shape(state->shape);
  });
  // The backward kernels read the BlockMasks at their own tilings (MaskContext builds each once
  // and caches it; equal tilings share one); the forward picks its kernel, and so its tiling, in
  // FusedAttentionCuda::forward.
  state->dq_blocks = mask.block_mask(dq_tile.block_m, dq_tile.block_n, q.device());
  state->dkdv_blocks = mask.block_mask(dkdv_tile.block_m, dkdv_tile.block_n, q.device());
  // The backward's schedules, kept with the mask (its block lists fix them, with the shape).
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream(q.device().index()).stream();
  state->keep_schedules = kernels.keep_schedules;
  set_launch_options(kernels, *state);
  if (kernels.keep_schedules && !capturing(stream)) {
    state->schedule_stream = stream;
    const kc::BlockListParams dq = block_list(state->dq_blocks), dkdv = block_list(state->dkdv_blocks);
    const auto bytes = [&](kc::BwdKernel kernel) {
      return static_cast<int64_t>(kc::bwd_schedule_bytes(state->shape, dq, dkdv, kernel));
    };
    state->bwd_schedule_merged =
        mask.kept_buffer(schedule_key("bwd merged", *state, stream), bytes(kc::BwdKernel::wgmma), q.device());
    state->bwd_schedule_atomic =
        mask.kept_buffer(schedule_key("bwd atomic", *state, stream), bytes(kc::BwdKernel::wgmma_atomic), q.device());
  }

  state->requested_fwd = kernels.fwd;
  return {q, k, v, state};
}

void record_forward(const FusedCudaState& state, const at::Device& device) {
  if (!state.trace) return;
  RECORD_FUNCTION("harness::fused_cuda dispatch record", std::vector<c10::IValue>());
  state.trace->record({"attention_fwd", "fused_cuda", device.str(),
                       "impl=fused on CUDA: block-sparse flash attention (" + dims_text(state.shape) +
                           ", online softmax, LSE saved), empty blocks skipped, full blocks without mask work; kernel " +
                           std::string(kc::fwd_kernel_name(state.fwd_kernel)) +
                           " " + state.fwd_how,
                       kc::describe_fwd_config(state.shape, state.fwd_kernel) + launch_text(state, true),
                       kc::fwd_kernel_name(state.fwd_kernel)});
}

}  // namespace

at::Tensor fused_attention_cuda(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in, MaskContext& mask,
                                double scale, bool deterministic, DispatchTrace* trace, const CudaKernelChoice& kernels) {
  PreparedCall call = prepare_call(q_in, k_in, v_in, mask, scale, deterministic, trace, kernels);
  call.state->forward_mask = &mask;
  at::Tensor out = FusedAttentionCuda::apply(call.q, call.k, call.v, call.state);
  call.state->forward_mask = nullptr;
  record_forward(*call.state, call.q.device());
  return out;
}

FusedForward fused_attention_cuda_forward(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
                                          MaskContext& mask, double scale, bool deterministic, DispatchTrace* trace,
                                          const CudaKernelChoice& kernels) {
  PreparedCall call = prepare_call(q_in, k_in, v_in, mask, scale, deterministic, trace, kernels);
  call.state->forward_mask = &mask;
  FusedForward result = run_forward(call.q, call.k, call.v, call.state.get());
  call.state->forward_mask = nullptr;
  record_forward(*call.state, call.q.device());
  return result;
}

FusedGradients fused_attention_cuda_backward(const at::Tensor& grad_out, const at::Tensor& q_in, const at::Tensor& k_in,
                                             const at::Tensor& v_in, const at::Tensor& out, const at::Tensor& lse,
                                             MaskContext& mask, double scale, bool deterministic, DispatchTrace* trace,
                                             const CudaKernelChoice& kernels) {
  PreparedCall call = prepare_call(q_in, k_in, v_in, mask, scale, deterministic, trace, kernels);
  return run_backward(call.q, call.k, call.v, kernel_layout(out), lse.contiguous(), grad_out, call.state.get());
}

}  // namespace harness::kernels
