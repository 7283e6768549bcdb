// Standalone self-test and timing driver of the fused attention kernels: no LibTorch, so it
// builds with nvcc alone on the GPU machine. It builds masks and BlockMasks on the host from its
// own straightforward mask predicate and runs every kernel that exists at each case's head dims
// (64, 96, 128, 192, 256 and q·k 192 with v 128) and element type (bf16, fp16). Each output must
// meet one rule against the high-precision reference (float64 on the CPU for the small cases, else
// an fp32 reference made of plain tiled GEMMs and row kernels on the GPU, itself checked against
// float64): relative L2 error at most twice that of a flash-style low-precision reference (the same
// GEMMs with P and dS rounded to the element type, as the kernels round them) plus 1e-3; two
// planted faults must break that rule. It also poisons outputs to catch unwritten elements, checks
// the deterministic backwards are bitwise reproducible (wgmma_atomic: dK and dV bitwise, dQ to
// rounding; dK and dV too where it splits kv blocks) and every forward's launch modes give the same
// bits, then times every kernel at the real dims with CUDA events.
//
//   cmake --build BUILD --target harness_attention_selftest    (or, from the repository root:)
//   nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -I. bench/attention_selftest.cu
//        kernels/cuda/attention_launch*.cu kernels/cuda/tile_scheduler.cu kernels/cuda/mask_bits.cu
//        -o attention_selftest      (one command line)
//   ./attention_selftest [--quick | --small | --tiny] [--only TEXT] [--schedule-order ORDER]
//                        [--plain-launches] [--log FILE]
// --quick skips the real-dims cases but the first, --small every real-dims case (for
// compute-sanitizer), --tiny runs the first small case only, --only the cases whose name contains
// TEXT (e.g. "REAL causal", to profile one case's kernels under Nsight Compute).
// --schedule-order (interleaved, batch, kv_head) and --plain-launches set every launch's
// LaunchOptions (attention_params.h), for A/B runs.
// Exit status 0 only when every check passes.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "kernels/cuda/attention_config.h"
#include "kernels/cuda/attention_params.h"
#include "kernels/cuda/cuda_check.h"

namespace {

using namespace harness::kernels::cuda;

FILE* g_log = nullptr;
LaunchOptions g_launch;  // every launch's (--schedule-order, --plain-launches)
void say(const char* text) {
  std::fputs(text, stdout);
  std::fflush(stdout);
  if (g_log) {
    std::fputs(text, g_log);
    std::fflush(g_log);
  }
}
template <typename... Args>
void say(const char* format, Args... args) {
  std::printf(format, args...);
  std::fflush(stdout);
  if (g_log) {
    std::fprintf(g_log, format, args...);
    std::fflush(g_log);
  }
}

// ---- Host mask: written straight from the definition in kernels/mask_desc.h ------------------

struct HostMask {
  MaskCode kind = MaskCode::full;
  bool through_anchor = false;
  bool in_block_causal = false;
  int q_len = 0, kv_len = 0, context = 0, block_size = 16, window = 0;
  std::vector<int32_t> anchors;
  std::vector<int32_t> doc_id;

  bool visible(int q, int kv) const {
    const int q_abs = q + kv_len - q_len;
    switch (kind) {
      case MaskCode::dflash: {
        const int block = q / block_size;
        const int anchor = anchors[block];
        if (kv < context) {
          const bool before = through_anchor ? kv <= anchor : kv < anchor;
          return before && doc_id[kv] == doc_id[anchor];
        }
        const int draft = kv - context;
        if (draft / block_size != block) return false;
        return in_block_causal ? kv <= context + q : true;
      }
      case MaskCode::causal: return kv <= q_abs;
      case MaskCode::document_causal: return q_abs >= 0 && kv <= q_abs && doc_id[kv] == doc_id[q_abs];
      case MaskCode::sliding_window: return kv <= q_abs && kv > q_abs - window;
      case MaskCode::full: return true;
      case MaskCode::blockmask: return false;  // not among the self-test's masks (tests/test_attention_cuda.cpp has them)
    }
    return false;
  }
};

std::vector<int32_t> split_documents(const std::vector<int>& lengths) {
  std::vector<int32_t> ids;
  for (size_t d = 0; d < lengths.size(); ++d) ids.insert(ids.end(), lengths[d], static_cast<int32_t>(d));
  return ids;
}

std::vector<int> equal_docs(int length, int documents) {
  std::vector<int> lengths(documents, length / documents);
  lengths.back() += length % documents;
  return lengths;
}

HostMask make_dflash(int anchors, int block_size, const std::vector<int>& doc_lengths, bool through, bool causal_block,
                     uint64_t seed) {
  HostMask m;
  m.kind = MaskCode::dflash;
  m.through_anchor = through;
  m.in_block_causal = causal_block;
  m.context = std::accumulate(doc_lengths.begin(), doc_lengths.end(), 0);
  m.block_size = block_size;
  m.q_len = anchors * block_size;
  m.kv_len = m.context + m.q_len;
  m.doc_id = split_documents(doc_lengths);
  std::vector<int32_t> valid;
  int start = 0;
  for (int length : doc_lengths) {
    for (int a = start + 1; a <= start + length - block_size; ++a) valid.push_back(a);
    start += length;
  }
  std::mt19937_64 rng(seed);
  std::shuffle(valid.begin(), valid.end(), rng);
  m.anchors.assign(valid.begin(), valid.begin() + anchors);
  std::sort(m.anchors.begin(), m.anchors.end());
  return m;
}

HostMask make_simple(MaskCode kind, int q_len, int kv_len, const std::vector<int>& doc_lengths, int window) {
  HostMask m;
  m.kind = kind;
  m.q_len = q_len;
  m.kv_len = kv_len;
  m.window = window;
  if (!doc_lengths.empty()) m.doc_id = split_documents(doc_lengths);
  return m;
}

int64_t count_pairs(const HostMask& m) {
  int64_t pairs = 0;
  for (int q = 0; q < m.q_len; ++q)
    for (int kv = 0; kv < m.kv_len; ++kv) pairs += m.visible(q, kv);
  return pairs;
}

// ---- Host BlockMask (FlexAttention layout) ----------------------------------------------------

struct HostBlocks {
  int block_m = 0, block_n = 0, nq = 0, nkv = 0;
  std::vector<int32_t> kv_num, kv_idx, full_kv_num, full_kv_idx, q_num, q_idx, full_q_num, full_q_idx;
  int64_t partial = 0, full = 0;
};

HostBlocks build_blocks(const HostMask& m, int block_m, int block_n) {
  HostBlocks b;
  b.block_m = block_m;
  b.block_n = block_n;
  b.nq = (m.q_len + block_m - 1) / block_m;
  b.nkv = (m.kv_len + block_n - 1) / block_n;
  std::vector<int> state(static_cast<size_t>(b.nq) * b.nkv);  // 0 empty, 1 partial, 2 full
  std::vector<char> row(m.kv_len);
  std::vector<int> visible_count(static_cast<size_t>(b.nq) * b.nkv, 0);
  for (int q = 0; q < m.q_len; ++q) {
    for (int kv = 0; kv < m.kv_len; ++kv) {
      if (m.visible(q, kv)) ++visible_count[static_cast<size_t>(q / block_m) * b.nkv + kv / block_n];
    }
  }
  for (int qb = 0; qb < b.nq; ++qb) {
    const int rows = std::min(block_m, m.q_len - qb * block_m);
    for (int kb = 0; kb < b.nkv; ++kb) {
      const int cols = std::min(block_n, m.kv_len - kb * block_n);
      const int count = visible_count[static_cast<size_t>(qb) * b.nkv + kb];
      state[static_cast<size_t>(qb) * b.nkv + kb] = count == 0 ? 0 : (count == rows * cols ? 2 : 1);
    }
  }
  b.kv_num.assign(b.nq, 0);
  b.full_kv_num.assign(b.nq, 0);
  b.kv_idx.assign(static_cast<size_t>(b.nq) * b.nkv, 0);
  b.full_kv_idx.assign(static_cast<size_t>(b.nq) * b.nkv, 0);
  b.q_num.assign(b.nkv, 0);
  b.full_q_num.assign(b.nkv, 0);
  b.q_idx.assign(static_cast<size_t>(b.nkv) * b.nq, 0);
  b.full_q_idx.assign(static_cast<size_t>(b.nkv) * b.nq, 0);
  for (int qb = 0; qb < b.nq; ++qb) {
    for (int kb = 0; kb < b.nkv; ++kb) {
      const int s = state[static_cast<size_t>(qb) * b.nkv + kb];
      if (s == 1) {
        b.kv_idx[static_cast<size_t>(qb) * b.nkv + b.kv_num[qb]++] = kb;
        b.q_idx[static_cast<size_t>(kb) * b.nq + b.q_num[kb]++] = qb;
        ++b.partial;
      } else if (s == 2) {
        b.full_kv_idx[static_cast<size_t>(qb) * b.nkv + b.full_kv_num[qb]++] = kb;
        b.full_q_idx[static_cast<size_t>(kb) * b.nq + b.full_q_num[kb]++] = qb;
        ++b.full;
      }
    }
  }
  return b;
}

// ---- Device buffers -----------------------------------------------------------------------------

template <typename T>
struct DeviceBuffer {
  T* ptr = nullptr;
  size_t count = 0;
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t n) : count(n) { HARNESS_CUDA_CHECK(cudaMalloc(&ptr, std::max<size_t>(n, 1) * sizeof(T))); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr(o.ptr), count(o.count) { o.ptr = nullptr; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(ptr, o.ptr);
    std::swap(count, o.count);
    return *this;
  }
  ~DeviceBuffer() {
    if (ptr) cudaFree(ptr);
  }
  void upload(const std::vector<T>& host) {
    if (!host.empty()) HARNESS_CUDA_CHECK(cudaMemcpy(ptr, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const {
    std::vector<T> host(count);
    if (count) HARNESS_CUDA_CHECK(cudaMemcpy(host.data(), ptr, count * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }
};

template <typename T>
DeviceBuffer<T> to_device(const std::vector<T>& host) {
  DeviceBuffer<T> d(host.size());
  d.upload(host);
  return d;
}

struct DeviceBlocks {
  DeviceBuffer<int32_t> kv_num, kv_idx, full_kv_num, full_kv_idx, q_num, q_idx, full_q_num, full_q_idx;
  BlockListParams params;
  explicit DeviceBlocks(const HostBlocks& h)
      : kv_num(to_device(h.kv_num)), kv_idx(to_device(h.kv_idx)), full_kv_num(to_device(h.full_kv_num)),
        full_kv_idx(to_device(h.full_kv_idx)), q_num(to_device(h.q_num)), q_idx(to_device(h.q_idx)),
        full_q_num(to_device(h.full_q_num)), full_q_idx(to_device(h.full_q_idx)) {
    params.block_m = h.block_m;
    params.block_n = h.block_n;
    params.num_q_blocks = h.nq;
    params.num_kv_blocks = h.nkv;
    params.kv_num_blocks = kv_num.ptr;
    params.kv_indices = kv_idx.ptr;
    params.full_kv_num_blocks = full_kv_num.ptr;
    params.full_kv_indices = full_kv_idx.ptr;
    params.q_num_blocks = q_num.ptr;
    params.q_indices = q_idx.ptr;
    params.full_q_num_blocks = full_q_num.ptr;
    params.full_q_indices = full_q_idx.ptr;
  }
};

// ---- Reference kernels (fp32, simple) -----------------------------------------------------------

__device__ __forceinline__ float load_as_float(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float load_as_float(const __nv_bfloat16* p, int64_t i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ float load_as_float(const __half* p, int64_t i) { return __half2float(p[i]); }

//! C[z] (M x N, fp32, ldc) = alpha * sum_{r < reduce} A[z, r] (M x K) * B[z, r] (K x N) with arbitrary
//! element strides; z = b * heads_out + h, and the operands of reduction step r belong to head
//! h * reduce + r (or h / a_div for a GQA-shared operand).
struct RefGemm {
  int M, N, K, reduce;
  int heads_out;
  const void* a;
  int64_t a_sb, a_sh, a_sm, a_sk;
  int a_div;  // operand head = (h * reduce + r) / a_div
  const void* b;
  int64_t b_sb, b_sh, b_sk, b_sn;
  int b_div;
  float* c;
  int64_t c_sb, c_sh, c_sm;
  float alpha;
};

template <typename TA, typename TB>
__global__ void ref_gemm_kernel(RefGemm g) {
  constexpr int kTile = 64, kK = 16;
  __shared__ float sa[kK][kTile + 1];
  __shared__ float sb[kK][kTile + 1];
  const int z = blockIdx.z;
  const int batch = z / g.heads_out, h = z % g.heads_out;
  const int m0 = blockIdx.y * kTile, n0 = blockIdx.x * kTile;
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  float acc[4][4] = {};
  for (int r = 0; r < g.reduce; ++r) {
    const int head = h * g.reduce + r;
    const TA* a = static_cast<const TA*>(g.a) + batch * g.a_sb + (head / g.a_div) * g.a_sh;
    const TB* b = static_cast<const TB*>(g.b) + batch * g.b_sb + (head / g.b_div) * g.b_sh;
    for (int k0 = 0; k0 < g.K; k0 += kK) {
      for (int i = threadIdx.x; i < kK * kTile; i += 256) {
        const int kk = i / kTile, mm = i % kTile;
        const int m = m0 + mm, k = k0 + kk;
        sa[kk][mm] = (m < g.M && k < g.K) ? load_as_float(a, m * g.a_sm + k * g.a_sk) : 0.f;
        const int n = n0 + mm;
        sb[kk][mm] = (n < g.N && k < g.K) ? load_as_float(b, k * g.b_sk + n * g.b_sn) : 0.f;
      }
      __syncthreads();
      for (int kk = 0; kk < kK; ++kk) {
        float av[4], bv[4];
        for (int i = 0; i < 4; ++i) av[i] = sa[kk][ty + 16 * i];
        for (int j = 0; j < 4; ++j) bv[j] = sb[kk][tx + 16 * j];
        for (int i = 0; i < 4; ++i)
          for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
      }
      __syncthreads();
    }
  }
  float* c = g.c + batch * g.c_sb + h * g.c_sh;
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 4; ++j) {
      const int m = m0 + ty + 16 * i, n = n0 + tx + 16 * j;
      if (m < g.M && n < g.N) c[m * g.c_sm + n] = g.alpha * acc[i][j];
    }
}

template <typename TA, typename TB>
void ref_gemm(const RefGemm& g, int batch) {
  const dim3 grid((g.N + 63) / 64, (g.M + 63) / 64, batch * g.heads_out);
  ref_gemm_kernel<TA, TB><<<grid, 256>>>(g);
  HARNESS_CUDA_LAUNCH_CHECK("ref_gemm_kernel");
}

//! In place on S rows [rows, kv_len]: mask, softmax -> P; lse per row (-inf when nothing visible).
__global__ void ref_softmax_kernel(float* s, float* lse, const uint8_t* mask, int q_len, int kv_len, float scale) {
  const int64_t row = blockIdx.x;
  const int q = static_cast<int>(row % q_len);
  float* x = s + row * kv_len;
  const uint8_t* mrow = mask + static_cast<int64_t>(q) * kv_len;
  __shared__ float red[32];
  float mx = -INFINITY;
  for (int i = threadIdx.x; i < kv_len; i += blockDim.x) {
    const float v = mrow[i] ? x[i] * scale : -INFINITY;
    x[i] = v;
    mx = fmaxf(mx, v);
  }
  for (int o = 16; o; o /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = mx;
  __syncthreads();
  if (threadIdx.x < 32) {
    float v = threadIdx.x < blockDim.x / 32 ? red[threadIdx.x] : -INFINITY;
    for (int o = 16; o; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    if (threadIdx.x == 0) red[0] = v;
  }
  __syncthreads();
  mx = red[0];
  __syncthreads();
  float sum = 0.f;
  for (int i = threadIdx.x; i < kv_len; i += blockDim.x) {
    const float e = mx == -INFINITY ? 0.f : expf(x[i] - mx);
    x[i] = e;
    sum += e;
  }
  for (int o = 16; o; o /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = sum;
  __syncthreads();
  if (threadIdx.x < 32) {
    float v = threadIdx.x < blockDim.x / 32 ? red[threadIdx.x] : 0.f;
    for (int o = 16; o; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (threadIdx.x == 0) red[0] = v;
  }
  __syncthreads();
  sum = red[0];
  const float inv = sum > 0.f ? 1.f / sum : 0.f;
  for (int i = threadIdx.x; i < kv_len; i += blockDim.x) x[i] *= inv;
  if (threadIdx.x == 0) lse[row] = sum > 0.f ? mx + logf(sum) : -INFINITY;
}

//! In place on dP rows: dS = P * (dP - rowsum(P * dP)).
__global__ void ref_ds_kernel(const float* p, float* dp, int kv_len) {
  const int64_t row = blockIdx.x;
  const float* prow = p + row * kv_len;
  float* drow = dp + row * kv_len;
  __shared__ float red[32];
  float sum = 0.f;
  for (int i = threadIdx.x; i < kv_len; i += blockDim.x) sum += prow[i] * drow[i];
  for (int o = 16; o; o /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = sum;
  __syncthreads();
  if (threadIdx.x < 32) {
    float v = threadIdx.x < blockDim.x / 32 ? red[threadIdx.x] : 0.f;
    for (int o = 16; o; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (threadIdx.x == 0) red[0] = v;
  }
  __syncthreads();
  sum = red[0];
  for (int i = threadIdx.x; i < kv_len; i += blockDim.x) drow[i] = prow[i] * (drow[i] - sum);
}

//! x = float(T(x)) in place: a value rounded to the element type, as the kernels round P, dS and
//! their outputs (the low-precision reference).
template <typename T>
__global__ void ref_round_kernel(float* x, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    if constexpr (std::is_same_v<T, __half>) {
      x[i] = __half2float(__float2half_rn(x[i]));
    } else {
      x[i] = __bfloat162float(__float2bfloat16_rn(x[i]));
    }
  }
}

// ---- Problem ------------------------------------------------------------------------------------

struct Problem {
  std::string name;
  int batch = 1, heads = 1, kv_heads = 1, head_dim = 128;
  int v_head_dim = 0;  // 0: head_dim
  ElementType dtype = ElementType::bf16;
  HostMask mask;
  int dv() const { return v_head_dim > 0 ? v_head_dim : head_dim; }
  bool cpu_check = false;  // also compare with the float64 CPU reference
  bool timed = false;
};

uint16_t bf16_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  u += 0x7fff + ((u >> 16) & 1);  // round to nearest even (inputs are finite)
  return static_cast<uint16_t>(u >> 16);
}
float bf16_value(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

//! The bits of x rounded to the element type, and back.
uint16_t element_bits(float x, ElementType type) {
  if (type == ElementType::bf16) return bf16_bits(x);
  const __half_raw raw = __float2half_rn(x);
  return raw.x;
}
float element_value(uint16_t b, ElementType type) {
  if (type == ElementType::bf16) return bf16_value(b);
  __half_raw raw;
  raw.x = b;
  return __half2float(__half(raw));
}

std::vector<uint16_t> random_elements(size_t n, std::mt19937_64& rng, float stddev, ElementType type) {
  std::normal_distribution<float> dist(0.f, stddev);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = element_bits(dist(rng), type);
  return v;
}

struct Errors {
  double rel_l2 = 0, max_abs = 0, ref_max = 0;
  int64_t nonfinite = 0;
};

Errors compare(const std::vector<float>& ours, const std::vector<float>& ref) {
  Errors e;
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(ours[i])) {
      ++e.nonfinite;
      continue;
    }
    const double d = static_cast<double>(ours[i]) - ref[i];
    num += d * d;
    den += static_cast<double>(ref[i]) * ref[i];
    e.max_abs = std::max(e.max_abs, std::abs(d));
    e.ref_max = std::max(e.ref_max, std::abs(static_cast<double>(ref[i])));
  }
  e.rel_l2 = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  return e;
}

std::vector<float> to_float(const std::vector<uint16_t>& v, ElementType type) {
  std::vector<float> f(v.size());
  for (size_t i = 0; i < v.size(); ++i) f[i] = element_value(v[i], type);
  return f;
}

struct Outputs {
  std::vector<float> o, lse, dq, dk, dv;
};

//! float64 CPU reference (small shapes only).
Outputs cpu_reference(const Problem& pr, const std::vector<float>& q, const std::vector<float>& k,
                      const std::vector<float>& v, const std::vector<float>& dout, float scale) {
  const HostMask& m = pr.mask;
  const int D = pr.head_dim, DV = pr.dv(), Q = m.q_len, KV = m.kv_len, H = pr.heads, G = pr.heads / pr.kv_heads;
  Outputs out;
  out.o.assign(static_cast<size_t>(pr.batch) * H * Q * DV, 0.f);
  out.lse.assign(static_cast<size_t>(pr.batch) * H * Q, 0.f);
  out.dq.assign(static_cast<size_t>(pr.batch) * H * Q * D, 0.f);
  std::vector<double> dk(static_cast<size_t>(pr.batch) * pr.kv_heads * KV * D, 0.0),
      dv(static_cast<size_t>(pr.batch) * pr.kv_heads * KV * DV, 0.0);
  std::vector<double> s(KV), p(KV), dp(KV);
  for (int b = 0; b < pr.batch; ++b)
    for (int h = 0; h < H; ++h) {
      const int hk = h / G;
      for (int i = 0; i < Q; ++i) {
        const float* qi = &q[((static_cast<size_t>(b) * H + h) * Q + i) * D];
        double mx = -INFINITY;
        for (int j = 0; j < KV; ++j) {
          if (!m.visible(i, j)) {
            s[j] = -INFINITY;
            continue;
          }
          const float* kj = &k[((static_cast<size_t>(b) * pr.kv_heads + hk) * KV + j) * D];
          double acc = 0;
          for (int d = 0; d < D; ++d) acc += static_cast<double>(qi[d]) * kj[d];
          s[j] = acc * scale;
          mx = std::max(mx, s[j]);
        }
        double sum = 0;
        for (int j = 0; j < KV; ++j) {
          p[j] = std::isinf(mx) ? 0.0 : std::exp(s[j] - mx);
          sum += p[j];
        }
        for (int j = 0; j < KV; ++j) p[j] = sum > 0 ? p[j] / sum : 0.0;
        const size_t row = (static_cast<size_t>(b) * H + h) * Q + i;
        out.lse[row] = sum > 0 ? static_cast<float>(mx + std::log(sum)) : -INFINITY;
        const float* doi = &dout[row * DV];
        double rowdot = 0;
        for (int j = 0; j < KV; ++j) {
          if (p[j] == 0) {
            dp[j] = 0;
            continue;
          }
          const float* vj = &v[((static_cast<size_t>(b) * pr.kv_heads + hk) * KV + j) * DV];
          double acc = 0;
          for (int d = 0; d < DV; ++d) {
            acc += static_cast<double>(doi[d]) * vj[d];
            out.o[row * DV + d] += static_cast<float>(p[j] * vj[d]);
          }
          dp[j] = acc;
          rowdot += p[j] * acc;
        }
        for (int j = 0; j < KV; ++j) {
          if (p[j] == 0) continue;
          const double ds = p[j] * (dp[j] - rowdot);
          const size_t krow = (static_cast<size_t>(b) * pr.kv_heads + hk) * KV + j;
          for (int d = 0; d < D; ++d) {
            out.dq[row * D + d] += static_cast<float>(scale * ds * k[krow * D + d]);
            dk[krow * D + d] += scale * ds * qi[d];
          }
          for (int d = 0; d < DV; ++d) dv[krow * DV + d] += p[j] * doi[d];
        }
      }
    }
  out.dk.assign(dk.begin(), dk.end());
  out.dv.assign(dv.begin(), dv.end());
  return out;
}

bool same_tiling(FwdKernelTiling a, FwdKernelTiling b) { return a.rows == b.rows && a.block_n == b.block_n; }

//! The BlockMask of one forward tiling, shared by every kernel of that tiling.
struct FwdBlocks {
  FwdKernelTiling tiling;
  HostBlocks host;
  DeviceBlocks* device;
};

struct Case {
  Problem pr;
  std::vector<uint16_t> q, k, v, dout;
  float scale;
  DeviceBuffer<uint16_t> dq_in, dk_in, dv_in, ddo, d_o, d_dq, d_dk, d_dv;
  DeviceBuffer<float> d_lse;
  DeviceBuffer<unsigned char> fwd_scratch, bwd_scratch;
  DeviceBuffer<int32_t> d_anchors, d_doc;
  HostBlocks dq_blocks_host, dkdv_blocks_host;
  // One BlockMask per forward tiling of the candidates (fwd_blocks_of).
  std::vector<FwdBlocks> fwd_blocks;
  DeviceBlocks* dq_blocks = nullptr;
  DeviceBlocks* dkdv_blocks = nullptr;
  FwdParams fwd;  // set for the kernel under test by use_fwd_kernel()
  BwdParams bwd;
  std::vector<FwdKernel> fwd_list;  // the forward kernels at the case's head dims (fwd_candidates)
  std::vector<BwdKernel> bwd_list;  // the backward ones (bwd_candidates)
  int64_t pairs = 0;
  //! The BlockMask forward kernel `kernel` reads (that of its tiling).
  const FwdBlocks& fwd_blocks_of(FwdKernel kernel) const {
    for (const FwdBlocks& b : fwd_blocks) {
      if (same_tiling(b.tiling, fwd_kernel_tiling(kernel))) return b;
    }
    throw std::runtime_error(std::string("no BlockMask built for the tiling of ") + fwd_kernel_name(kernel));
  }
  ~Case() {
    for (FwdBlocks& b : fwd_blocks) delete b.device;
    delete dq_blocks;
    delete dkdv_blocks;
  }
};

TensorRef contiguous_ref(void* data, int heads, int rows, int head_dim) {
  TensorRef t;
  t.data = data;
  t.stride_row = head_dim;
  t.stride_head = static_cast<int64_t>(rows) * head_dim;
  t.stride_batch = t.stride_head * heads;
  return t;
}

AttentionShape shape_of(const Problem& pr) {
  return AttentionShape{pr.batch, pr.heads, pr.kv_heads, pr.mask.q_len, pr.mask.kv_len, pr.head_dim, pr.dv(), pr.dtype};
}

void setup(Case& c, uint64_t seed) {
  const Problem& pr = c.pr;
  const HostMask& m = pr.mask;
  const int D = pr.head_dim, DV = pr.dv();
  std::mt19937_64 rng(seed);
  const size_t nq = static_cast<size_t>(pr.batch) * pr.heads * m.q_len * D;
  const size_t no = static_cast<size_t>(pr.batch) * pr.heads * m.q_len * DV;
  const size_t nk = static_cast<size_t>(pr.batch) * pr.kv_heads * m.kv_len * D;
  const size_t nv = static_cast<size_t>(pr.batch) * pr.kv_heads * m.kv_len * DV;
  c.q = random_elements(nq, rng, 1.f, pr.dtype);
  c.k = random_elements(nk, rng, 1.f, pr.dtype);
  c.v = random_elements(nv, rng, 1.f, pr.dtype);
  c.dout = random_elements(no, rng, 1.f, pr.dtype);
  c.scale = 1.f / std::sqrt(static_cast<float>(D));
  c.dq_in = to_device(c.q);
  c.dk_in = to_device(c.k);
  c.dv_in = to_device(c.v);
  c.ddo = to_device(c.dout);
  c.d_o = DeviceBuffer<uint16_t>(no);
  c.d_dq = DeviceBuffer<uint16_t>(nq);
  c.d_dk = DeviceBuffer<uint16_t>(nk);
  c.d_dv = DeviceBuffer<uint16_t>(nv);
  c.d_lse = DeviceBuffer<float>(static_cast<size_t>(pr.batch) * pr.heads * m.q_len);
  c.d_anchors = to_device(m.anchors);
  c.d_doc = to_device(m.doc_id);

  const AttentionShape shape = shape_of(pr);
  const TileShape qt = bwd_dq_tile_shape(shape);
  const TileShape bt = bwd_dkdv_tile_shape(shape);
  c.fwd_list = fwd_candidates(shape);
  c.bwd_list = bwd_candidates(shape, false);
  for (FwdKernel kernel : c.fwd_list) {
    const FwdKernelTiling tiling = fwd_kernel_tiling(kernel);
    if (std::any_of(c.fwd_blocks.begin(), c.fwd_blocks.end(), [&](const FwdBlocks& b) { return same_tiling(b.tiling, tiling); })) {
      continue;
    }
    const TileShape ft = fwd_tile_shape(shape, kernel);
    HostBlocks host = build_blocks(m, ft.block_m, ft.block_n);
    DeviceBlocks* device = new DeviceBlocks(host);
    c.fwd_blocks.push_back(FwdBlocks{tiling, std::move(host), device});
  }
  c.dq_blocks_host = build_blocks(m, qt.block_m, qt.block_n);
  c.dkdv_blocks_host = build_blocks(m, bt.block_m, bt.block_n);
  c.dq_blocks = new DeviceBlocks(c.dq_blocks_host);
  c.dkdv_blocks = new DeviceBlocks(c.dkdv_blocks_host);

  MaskParams mp;
  mp.kind = m.kind;
  mp.through_anchor = m.through_anchor;
  mp.in_block_causal = m.in_block_causal;
  mp.q_len = m.q_len;
  mp.kv_len = m.kv_len;
  mp.context = m.context;
  mp.block_size = m.block_size;
  mp.window = m.window;
  mp.anchors = c.d_anchors.ptr;
  mp.doc_id = c.d_doc.ptr;

  c.fwd.shape = shape;
  c.fwd.q = contiguous_ref(c.dq_in.ptr, pr.heads, m.q_len, D);
  c.fwd.k = contiguous_ref(c.dk_in.ptr, pr.kv_heads, m.kv_len, D);
  c.fwd.v = contiguous_ref(c.dv_in.ptr, pr.kv_heads, m.kv_len, DV);
  c.fwd.o = contiguous_ref(c.d_o.ptr, pr.heads, m.q_len, DV);
  c.fwd.lse = c.d_lse.ptr;
  c.fwd.scale = c.scale;
  c.fwd.mask = mp;
  size_t fwd_scratch = 0;
  for (FwdKernel kernel : c.fwd_list) {
    fwd_scratch = std::max(fwd_scratch, fwd_scratch_bytes(shape, c.fwd_blocks_of(kernel).device->params, kernel));
  }
  c.fwd_scratch = DeviceBuffer<unsigned char>(fwd_scratch);
  c.fwd.scratch = c.fwd_scratch.ptr;
  c.fwd.scratch_bytes = c.fwd_scratch.count;

  c.bwd.shape = shape;
  c.bwd.q = c.fwd.q;
  c.bwd.k = c.fwd.k;
  c.bwd.v = c.fwd.v;
  c.bwd.o = c.fwd.o;
  c.bwd.dout = contiguous_ref(c.ddo.ptr, pr.heads, m.q_len, DV);
  c.bwd.dq = contiguous_ref(c.d_dq.ptr, pr.heads, m.q_len, D);
  c.bwd.dk = contiguous_ref(c.d_dk.ptr, pr.kv_heads, m.kv_len, D);
  c.bwd.dv = contiguous_ref(c.d_dv.ptr, pr.kv_heads, m.kv_len, DV);
  c.bwd.lse = c.d_lse.ptr;
  c.bwd.scale = c.scale;
  c.bwd.mask = mp;
  c.bwd.dq_blocks = c.dq_blocks->params;
  c.bwd.dkdv_blocks = c.dkdv_blocks->params;
  size_t bwd_scratch = 0;
  c.bwd.kernel = default_bwd_kernel(shape, false);
  for (BwdKernel kernel : c.bwd_list) {
    bwd_scratch = std::max(bwd_scratch, bwd_scratch_bytes(shape, c.bwd.dq_blocks, c.bwd.dkdv_blocks, kernel));
  }
  c.bwd_scratch = DeviceBuffer<unsigned char>(bwd_scratch);
  c.bwd.scratch = c.bwd_scratch.ptr;
  c.bwd.scratch_bytes = c.bwd_scratch.count;
}

template <typename T>
void round_to(DeviceBuffer<float>& x) {
  ref_round_kernel<T><<<1024, 256>>>(x.ptr, x.count);
  HARNESS_CUDA_LAUNCH_CHECK("ref_round_kernel");
}

//! Reference on the GPU in fp32: S = QK^T, masked softmax, O = PV, dP = dO V^T, dS, dQ, dK, dV.
//! `low_precision` makes it a flash-style low-precision one: P and dS rounded to the element type
//! before the products that take them (as the kernels round them), and O, dQ, dK, dV rounded to it.
template <typename T>
Outputs gpu_reference_as(Case& c, bool low_precision) {
  const Problem& pr = c.pr;
  const HostMask& m = pr.mask;
  const int B = pr.batch, H = pr.heads, HK = pr.kv_heads, G = H / HK, D = pr.head_dim, DV = pr.dv(), Q = m.q_len,
            KV = m.kv_len;
  std::vector<uint8_t> mask(static_cast<size_t>(Q) * KV);
  for (int i = 0; i < Q; ++i)
    for (int j = 0; j < KV; ++j) mask[static_cast<size_t>(i) * KV + j] = m.visible(i, j);
  DeviceBuffer<uint8_t> d_mask = to_device(mask);
  const size_t score_count = static_cast<size_t>(B) * H * Q * KV;
  DeviceBuffer<float> p(score_count), ds(score_count);
  DeviceBuffer<float> o(static_cast<size_t>(B) * H * Q * DV), lse(static_cast<size_t>(B) * H * Q);
  DeviceBuffer<float> dq(static_cast<size_t>(B) * H * Q * D), dk(static_cast<size_t>(B) * HK * KV * D),
      dv(static_cast<size_t>(B) * HK * KV * DV);
  const int64_t qh = static_cast<int64_t>(Q) * D, oh = static_cast<int64_t>(Q) * DV, kh = static_cast<int64_t>(KV) * D,
                vh = static_cast<int64_t>(KV) * DV, sh = static_cast<int64_t>(Q) * KV;

  // S[b,h] = Q[b,h] K[b,h/G]^T, then P in place
  ref_gemm<T, T>(RefGemm{Q, KV, D, 1, H, c.dq_in.ptr, H * qh, qh, D, 1, 1, c.dk_in.ptr, HK * kh, kh, 1, D, G, p.ptr, H * sh,
                         sh, KV, 1.f},
                 B);
  ref_softmax_kernel<<<static_cast<unsigned>(B * H * Q), 256>>>(p.ptr, lse.ptr, d_mask.ptr, Q, KV, c.scale);
  HARNESS_CUDA_LAUNCH_CHECK("ref_softmax_kernel");
  // dP = dO V^T, then dS in place (from P in fp32)
  ref_gemm<T, T>(RefGemm{Q, KV, DV, 1, H, c.ddo.ptr, H * oh, oh, DV, 1, 1, c.dv_in.ptr, HK * vh, vh, 1, DV, G, ds.ptr,
                         H * sh, sh, KV, 1.f},
                 B);
  ref_ds_kernel<<<static_cast<unsigned>(B * H * Q), 256>>>(p.ptr, ds.ptr, KV);
  HARNESS_CUDA_LAUNCH_CHECK("ref_ds_kernel");
  if (low_precision) {
    round_to<T>(p);
    round_to<T>(ds);
  }
  // O = P V
  ref_gemm<float, T>(
      RefGemm{Q, DV, KV, 1, H, p.ptr, H * sh, sh, KV, 1, 1, c.dv_in.ptr, HK * vh, vh, DV, 1, G, o.ptr, H * oh, oh, DV, 1.f},
      B);
  // dQ = scale dS K
  ref_gemm<float, T>(
      RefGemm{Q, D, KV, 1, H, ds.ptr, H * sh, sh, KV, 1, 1, c.dk_in.ptr, HK * kh, kh, D, 1, G, dq.ptr, H * qh, qh, D, c.scale},
      B);
  // dK[b,hk] = scale sum_g dS[b,hk*G+g]^T Q ; dV = sum_g P^T dO
  ref_gemm<float, T>(
      RefGemm{KV, D, Q, G, HK, ds.ptr, H * sh, sh, 1, KV, 1, c.dq_in.ptr, H * qh, qh, D, 1, 1, dk.ptr, HK * kh, kh, D, c.scale},
      B);
  ref_gemm<float, T>(
      RefGemm{KV, DV, Q, G, HK, p.ptr, H * sh, sh, 1, KV, 1, c.ddo.ptr, H * oh, oh, DV, 1, 1, dv.ptr, HK * vh, vh, DV, 1.f}, B);
  if (low_precision) {
    for (DeviceBuffer<float>* out : {&o, &dq, &dk, &dv}) round_to<T>(*out);
  }
  HARNESS_CUDA_CHECK(cudaDeviceSynchronize());
  return Outputs{o.download(), lse.download(), dq.download(), dk.download(), dv.download()};
}

Outputs gpu_reference(Case& c, bool low_precision) {
  return c.pr.dtype == ElementType::fp16 ? gpu_reference_as<__half>(c, low_precision)
                                         : gpu_reference_as<__nv_bfloat16>(c, low_precision);
}

//! Points c.fwd at forward kernel `index` of c.fwd_list and its BlockMask.
void use_fwd_kernel(Case& c, size_t index) {
  c.fwd.kernel = c.fwd_list[index];
  c.fwd.blocks = c.fwd_blocks_of(c.fwd.kernel).device->params;
}

//! Index in c.fwd_list of the kernel the launcher runs when nothing was tuned.
size_t default_fwd_index(const Case& c) {
  const FwdKernel kernel = default_fwd_kernel(c.fwd.shape);
  for (size_t i = 0; i < c.fwd_list.size(); ++i) {
    if (c.fwd_list[i] == kernel) return i;
  }
  throw std::runtime_error("default forward kernel is not among the case's candidates");
}

void poison(Case& c) {
  HARNESS_CUDA_CHECK(cudaMemset(c.d_o.ptr, 0xff, c.d_o.count * 2));  // 0xffff is a NaN in bf16 and fp16
  HARNESS_CUDA_CHECK(cudaMemset(c.d_dq.ptr, 0xff, c.d_dq.count * 2));
  HARNESS_CUDA_CHECK(cudaMemset(c.d_dk.ptr, 0xff, c.d_dk.count * 2));
  HARNESS_CUDA_CHECK(cudaMemset(c.d_dv.ptr, 0xff, c.d_dv.count * 2));
  HARNESS_CUDA_CHECK(cudaMemset(c.d_lse.ptr, 0xff, c.d_lse.count * 4));
}

//! The default forward kernel, then the backward.
Outputs run_ours(Case& c) {
  poison(c);
  use_fwd_kernel(c, default_fwd_index(c));
  run_attention_fwd(c.fwd, nullptr, g_launch);
  run_attention_bwd(c.bwd, nullptr, g_launch);
  HARNESS_CUDA_CHECK(cudaDeviceSynchronize());
  const ElementType t = c.pr.dtype;
  return Outputs{to_float(c.d_o.download(), t), c.d_lse.download(), to_float(c.d_dq.download(), t),
                 to_float(c.d_dk.download(), t), to_float(c.d_dv.download(), t)};
}

//! Compares lse treating equal infinities as equal (rows that see nothing).
Errors compare_lse(const std::vector<float>& ours, const std::vector<float>& ref) {
  Errors e;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (std::isinf(ref[i]) && ours[i] == ref[i]) continue;
    if (!std::isfinite(ours[i])) {
      ++e.nonfinite;
      continue;
    }
    e.max_abs = std::max(e.max_abs, std::abs(static_cast<double>(ours[i]) - ref[i]));
  }
  return e;
}

int g_failures = 0;

//! The rule every kernel output meets: its relative L2 error against the high-precision reference
//! at most twice that of the flash-style low-precision reference (the rounding any flash kernel
//! of this element type makes) plus kAtol, and nothing non-finite.
constexpr double kAtol = 1e-3;
bool within_rule(const Errors& e, const Errors& low) { return e.nonfinite == 0 && e.rel_l2 <= 2 * low.rel_l2 + kAtol; }

bool check(const char* what, const char* against, const Errors& e, const Errors& low) {
  const bool ok = within_rule(e, low);
  say("    %-4s vs %-4s rel_l2 %.2e <= 2 x %.2e (low precision) + %.0e  max_abs %.2e (|ref| max %.2e)  nonfinite %lld  %s\n",
      what, against, e.rel_l2, low.rel_l2, kAtol, e.max_abs, e.ref_max, static_cast<long long>(e.nonfinite), ok ? "ok" : "FAIL");
  if (!ok) ++g_failures;
  return ok;
}

//! The references of a case: `high` (float64 on the CPU where the case has it, else fp32 on the
//! GPU) and the low-precision reference's errors against it, which bound the kernels' (within_rule).
struct References {
  const char* against;
  Outputs high;
  Errors o, dq, dk, dv;
};

void check_forward(const std::vector<float>& o, const std::vector<float>& lse_values, const References& ref) {
  check("out", ref.against, compare(o, ref.high.o), ref.o);
  const Errors lse = compare_lse(lse_values, ref.high.lse);
  const bool lse_ok = lse.nonfinite == 0 && lse.max_abs < 1e-2;
  say("    lse  vs %-4s max_abs %.2e  nonfinite %lld  %s\n", ref.against, lse.max_abs, static_cast<long long>(lse.nonfinite),
      lse_ok ? "ok" : "FAIL");
  if (!lse_ok) ++g_failures;
}

void check_gradients(const std::vector<float>& dq, const std::vector<float>& dk, const std::vector<float>& dv,
                     const References& ref) {
  check("dq", ref.against, compare(dq, ref.high.dq), ref.dq);
  check("dk", ref.against, compare(dk, ref.high.dk), ref.dk);
  check("dv", ref.against, compare(dv, ref.high.dv), ref.dv);
}

//! The rule must be able to fail: two outputs with planted faults, the last real column of every
//! row zeroed (a head dim's tail dropped) and every element 1/64 too large (a scale slip), must
//! both break it.
void check_planted_faults(const std::vector<float>& o, int v_head_dim, const References& ref) {
  std::vector<float> tail = o, scaled = o;
  for (size_t i = v_head_dim - 1; i < tail.size(); i += v_head_dim) tail[i] = 0.f;
  for (float& x : scaled) x *= 1.f + 1.f / 64;
  const bool tail_caught = !within_rule(compare(tail, ref.high.o), ref.o);
  const bool scale_caught = !within_rule(compare(scaled, ref.high.o), ref.o);
  say("    planted faults in out break the rule: last column zeroed %s, scaled by 1 + 1/64 %s\n",
      tail_caught ? "yes" : "NO", scale_caught ? "yes" : "NO");
  if (!tail_caught || !scale_caught) ++g_failures;
}

// ---- Timing -------------------------------------------------------------------------------------

struct BwdTiming {
  double bwd_ms = 0, prep_dkdv_dq_ms[3] = {0, 0, 0};
};
struct Timing {
  std::vector<double> fwd_ms;  //!< per forward kernel, the case's fwd_list order
  std::vector<BwdTiming> bwd;  //!< per backward kernel, the case's bwd_list order
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

Timing time_case(Case& c, int reps) {
  DeviceBuffer<uint8_t> flush(size_t{256} << 20);  // larger than the 60 MB L2: every rep starts cold
  cudaEvent_t e0, e1;
  HARNESS_CUDA_CHECK(cudaEventCreate(&e0));
  HARNESS_CUDA_CHECK(cudaEventCreate(&e1));
  auto time_one = [&](auto&& body) {
    std::vector<double> ms;
    for (int r = 0; r < reps + 3; ++r) {
      HARNESS_CUDA_CHECK(cudaMemsetAsync(flush.ptr, r & 0xff, flush.count));
      HARNESS_CUDA_CHECK(cudaEventRecord(e0));
      body();
      HARNESS_CUDA_CHECK(cudaEventRecord(e1));
      HARNESS_CUDA_CHECK(cudaEventSynchronize(e1));
      float t = 0;
      HARNESS_CUDA_CHECK(cudaEventElapsedTime(&t, e0, e1));
      if (r >= 3) ms.push_back(t);
    }
    return median(ms);
  };
  Timing t;
  for (size_t i = 0; i < c.fwd_list.size(); ++i) {
    use_fwd_kernel(c, i);
    t.fwd_ms.push_back(time_one([&] { run_attention_fwd(c.fwd, nullptr, g_launch); }));
  }
  use_fwd_kernel(c, default_fwd_index(c));
  for (BwdKernel kernel : c.bwd_list) {
    BwdTiming b;
    BwdParams params = c.bwd;
    params.kernel = kernel;
    b.bwd_ms = time_one([&] { run_attention_bwd(params, nullptr, g_launch); });
    // Breakdown: an empty block list contributes no CTA to the merged launch (see launch_bwd), so
    // these are prep alone, then prep + dK/dV CTAs; the dQ share is the rest.
    BwdParams only_prep = params, prep_dkdv = params;
    only_prep.dq_blocks.num_q_blocks = 0;
    only_prep.dkdv_blocks.num_kv_blocks = 0;
    prep_dkdv.dq_blocks.num_q_blocks = 0;
    const double prep_ms = time_one([&] { run_attention_bwd(only_prep, nullptr, g_launch); });
    const double prep_dkdv_ms = time_one([&] { run_attention_bwd(prep_dkdv, nullptr, g_launch); });
    b.prep_dkdv_dq_ms[0] = prep_ms;
    b.prep_dkdv_dq_ms[1] = prep_dkdv_ms - prep_ms;
    b.prep_dkdv_dq_ms[2] = b.bwd_ms - prep_dkdv_ms;
    t.bwd.push_back(b);
  }
  HARNESS_CUDA_CHECK(cudaEventDestroy(e0));
  HARNESS_CUDA_CHECK(cudaEventDestroy(e1));
  return t;
}

// ---- Main ---------------------------------------------------------------------------------------

Problem problem(const std::string& name, int batch, int heads, int kv_heads, int head_dim, HostMask mask, bool cpu = false,
                bool timed = false) {
  Problem p;
  p.name = name;
  p.batch = batch;
  p.heads = heads;
  p.kv_heads = kv_heads;
  p.head_dim = head_dim;
  p.mask = std::move(mask);
  p.cpu_check = cpu;
  p.timed = timed;
  return p;
}

//! The same problem at other head dims and element type.
Problem with_dims(Problem p, int v_head_dim, ElementType dtype) {
  p.v_head_dim = v_head_dim;
  p.dtype = dtype;
  return p;
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false, small = false, tiny = false;
  const char* only = nullptr;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--quick")) quick = true;
    if (!std::strcmp(argv[i], "--small")) small = true;
    if (!std::strcmp(argv[i], "--tiny")) tiny = true;
    if (!std::strcmp(argv[i], "--only") && i + 1 < argc) only = argv[++i];
    if (!std::strcmp(argv[i], "--plain-launches")) g_launch.programmatic = false;
    if (!std::strcmp(argv[i], "--schedule-order") && i + 1 < argc) {
      const std::string order = argv[++i];
      for (ScheduleOrder known : {ScheduleOrder::interleaved, ScheduleOrder::batch, ScheduleOrder::kv_head}) {
        if (order == schedule_order_label(known)) g_launch.schedule_order = known;
      }
      if (g_launch.schedule_order == ScheduleOrder::kernel_default) {
        std::fprintf(stderr, "--schedule-order %s: expected interleaved, batch or kv_head\n", order.c_str());
        return 2;
      }
    }
    if (!std::strcmp(argv[i], "--log") && i + 1 < argc) g_log = std::fopen(argv[++i], "w");
  }
  try {
    cudaDeviceProp prop{};
    HARNESS_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    say("device: %s, %d SMs, cc %d.%d\n", prop.name, prop.multiProcessorCount, prop.major, prop.minor);

    std::vector<Problem> problems;
    // Small shapes, checked against float64 on the CPU too.
    problems.push_back(problem("dflash tiny D64 G2 docs40/60", 1, 2, 1, 64,
                               make_dflash(3, 16, {40, 60}, false, false, 1), true));
    problems.push_back(problem("dflash B2 D128 G4 docs300/450/250 through+causal-block", 2, 8, 2, 128,
                               make_dflash(5, 16, {300, 450, 250}, true, true, 2), true));
    problems.push_back(problem("causal q>kv (empty rows) D64 G1", 1, 2, 2, 64,
                               make_simple(MaskCode::causal, 64, 40, {}, 0), true));
    problems.push_back(problem("one q block dflash ctx1000 D128 G4", 1, 4, 1, 128,
                               make_dflash(1, 16, {1000}, false, false, 3), true));
    problems.push_back(problem("document_causal G3 D128 q160 kv1160", 1, 6, 2, 128,
                               make_simple(MaskCode::document_causal, 160, 1160, {500, 333, 327}, 0), true));
    problems.push_back(problem("sliding_window w100 G4 D64 q112 kv412", 1, 4, 1, 64,
                               make_simple(MaskCode::sliding_window, 112, 412, {}, 100), true));
    problems.push_back(problem("full G1 D128 q48 kv118", 1, 2, 2, 128, make_simple(MaskCode::full, 48, 118, {}, 0), true));
    problems.push_back(problem("causal B3 G4 D64 H8 KV2 q200 kv333", 3, 8, 2, 64,
                               make_simple(MaskCode::causal, 200, 333, {}, 0), true));
    problems.push_back(problem("dflash G8 D128 H16 KV2 anchors20 ctx2000", 1, 16, 2, 128,
                               make_dflash(20, 16, {700, 1300}, false, false, 4)));
    problems.push_back(problem("causal G1 D128 H4 q1000 kv3000", 1, 4, 4, 128, make_simple(MaskCode::causal, 1000, 3000, {}, 0)));
    // The other head dims and fp16 (FlashAttention-3's set, and q·k 192 with v 128), small enough
    // for the float64 reference: 96 runs the 128 kernels with 32 zero columns, 192 and 256 the
    // backward that splits columns.
    const ElementType bf16 = ElementType::bf16, fp16 = ElementType::fp16;
    problems.push_back(with_dims(problem("dflash D64 G2 fp16 docs200/150", 1, 4, 2, 64,
                                         make_dflash(6, 16, {200, 150}, false, true, 7), true), 0, fp16));
    problems.push_back(with_dims(problem("causal B2 D128 G4 fp16 q200 kv330", 2, 8, 2, 128,
                                         make_simple(MaskCode::causal, 200, 330, {}, 0), true), 0, fp16));
    problems.push_back(with_dims(problem("causal D96 G2 q130 kv200", 1, 4, 2, 96,
                                         make_simple(MaskCode::causal, 130, 200, {}, 0), true), 0, bf16));
    problems.push_back(with_dims(problem("dflash D96 G4 fp16 docs300/200", 1, 8, 2, 96,
                                         make_dflash(5, 16, {300, 200}, true, false, 8), true), 0, fp16));
    problems.push_back(with_dims(problem("document_causal D192 G2 q200 kv330", 1, 4, 2, 192,
                                         make_simple(MaskCode::document_causal, 200, 330, {150, 180}, 0), true), 0, bf16));
    problems.push_back(with_dims(problem("causal D192 G1 fp16 q150 kv150", 1, 2, 2, 192,
                                         make_simple(MaskCode::causal, 150, 150, {}, 0), true), 0, fp16));
    problems.push_back(with_dims(problem("causal D256 G2 q150 kv260", 1, 4, 2, 256,
                                         make_simple(MaskCode::causal, 150, 260, {}, 0), true), 0, bf16));
    problems.push_back(with_dims(problem("dflash D256 G4 fp16 docs250/170", 1, 8, 2, 256,
                                         make_dflash(4, 16, {250, 170}, false, false, 9), true), 0, fp16));
    problems.push_back(with_dims(problem("sliding_window w90 D192/128 G4 q140 kv300", 1, 8, 2, 192,
                                         make_simple(MaskCode::sliding_window, 140, 300, {}, 90), true), 128, bf16));
    problems.push_back(with_dims(problem("dflash D192/128 G2 fp16 docs260/140", 1, 4, 2, 192,
                                         make_dflash(5, 16, {260, 140}, false, true, 10), true), 128, fp16));
    problems.push_back(with_dims(problem("full D256 G1 q70 kv190", 1, 2, 2, 256, make_simple(MaskCode::full, 70, 190, {}, 0), true),
                                 0, bf16));
    if (tiny) problems.resize(1);
    if (small || tiny) quick = true;
    // Real dims.
    if (!small && !tiny) problems.push_back(problem("REAL dflash 128 anchors", 1, 32, 8, 128,
                               make_dflash(128, 16, equal_docs(8192, 4), false, false, 5), false, true));
    if (!quick) {
      problems.push_back(problem("REAL dflash 512 anchors", 1, 32, 8, 128,
                                 make_dflash(512, 16, equal_docs(8192, 4), false, false, 6), false, true));
      problems.push_back(problem("REAL causal 128 anchors", 1, 32, 8, 128,
                                 make_simple(MaskCode::causal, 2048, 8192 + 2048, {}, 0), false, true));
      problems.push_back(problem("REAL-D64 dflash 512 anchors", 1, 32, 8, 64,
                                 make_dflash(512, 16, equal_docs(8192, 4), false, false, 6), false, true));
      // The other head dims and fp16 at the real masks (issue goals: causal and dflash).
      for (const auto& [label, head_dim, v_head_dim, dtype] :
           {std::tuple<const char*, int, int, ElementType>{"REAL-D96", 96, 0, ElementType::bf16},
            {"REAL-D192-128", 192, 128, ElementType::bf16},
            {"REAL-D192", 192, 0, ElementType::bf16},
            {"REAL-D256", 256, 0, ElementType::bf16},
            {"REAL-D128-fp16", 128, 0, ElementType::fp16}}) {
        problems.push_back(with_dims(problem(std::string(label) + " causal 128 anchors", 1, 32, 8, head_dim,
                                             make_simple(MaskCode::causal, 2048, 8192 + 2048, {}, 0), false, true),
                                     v_head_dim, dtype));
        problems.push_back(with_dims(problem(std::string(label) + " dflash 512 anchors", 1, 32, 8, head_dim,
                                             make_dflash(512, 16, equal_docs(8192, 4), false, false, 6), false, true),
                                     v_head_dim, dtype));
      }
    }
    if (only) {
      problems.erase(std::remove_if(problems.begin(), problems.end(),
                                    [&](const Problem& pr) { return pr.name.find(only) == std::string::npos; }),
                     problems.end());
      if (problems.empty()) {
        std::fprintf(stderr, "--only %s: no case's name contains it\n", only);
        return 2;
      }
    }

    struct Row {
      std::string name;
      int64_t pairs;
      Timing t;
      std::vector<FwdKernel> fwd_list;
      std::vector<BwdKernel> bwd_list;
      std::vector<double> fwd_tflops, bwd_tflops;
    };
    std::vector<Row> table;
    for (const Problem& pr : problems) {
      Case c;
      c.pr = pr;
      setup(c, 1234);
      c.pairs = count_pairs(pr.mask);
      const AttentionShape shape = shape_of(pr);
      say("== %s: B%d H%d KV%d D%d/%d %s q%d kv%d pairs %lld (%.1f%%), blocks dkdv %lld partial %lld full\n   %s\n",
          pr.name.c_str(), pr.batch, pr.heads, pr.kv_heads, pr.head_dim, pr.dv(), element_type_label(pr.dtype),
          pr.mask.q_len, pr.mask.kv_len,
          static_cast<long long>(c.pairs), 100.0 * c.pairs / (static_cast<double>(pr.mask.q_len) * pr.mask.kv_len),
          static_cast<long long>(c.dkdv_blocks_host.partial), static_cast<long long>(c.dkdv_blocks_host.full),
          describe_bwd_config(shape, c.bwd.kernel).c_str());
      for (const FwdKernel kernel : c.fwd_list) {
        say("   %s | blocks %lld partial %lld full\n", describe_fwd_config(shape, kernel).c_str(),
            static_cast<long long>(c.fwd_blocks_of(kernel).host.partial),
            static_cast<long long>(c.fwd_blocks_of(kernel).host.full));
      }
      const Outputs ours = run_ours(c);
      // Bitwise reproducibility of the backward. Deterministic kernels (no atomics) must give the
      // same bits for every gradient; wgmma_atomic for dK and dV (summed in registers by one CTA),
      // while its dQ may differ in the last bits (fp32 adds in arrival order): reported, not failed.
      auto check_reproducible = [&](const BwdParams& params) {
        const std::vector<uint16_t> dk1 = c.d_dk.download(), dv1 = c.d_dv.download(), dq1 = c.d_dq.download();
        run_attention_bwd(params, nullptr, g_launch);
        HARNESS_CUDA_CHECK(cudaDeviceSynchronize());
        const std::vector<uint16_t> dq2 = c.d_dq.download();
        const bool same_kv = dk1 == c.d_dk.download() && dv1 == c.d_dv.download();
        const bool same_q = dq1 == dq2;
        if (bwd_kernel_is_deterministic(params.kernel)) {
          say("    %s backward bitwise reproducible: %s\n", bwd_kernel_name(params.kernel), same_kv && same_q ? "yes" : "NO");
          if (!(same_kv && same_q)) ++g_failures;
        } else {
          const Errors dq_diff = compare(to_float(dq2, pr.dtype), to_float(dq1, pr.dtype));
          size_t differing = 0;
          for (size_t i = 0; i < dq1.size(); ++i) differing += dq1[i] != dq2[i];
          // With split kv blocks (few kv heads) dK and dV are summed by fp32 adds across CTAs too:
          // then they must agree to rounding, else bitwise.
          const int64_t splits = bwd_dkdv_splits(params.shape, params.kernel);
          const Errors dk_diff = compare(to_float(c.d_dk.download(), pr.dtype), to_float(dk1, pr.dtype));
          const Errors dv_diff = compare(to_float(c.d_dv.download(), pr.dtype), to_float(dv1, pr.dtype));
          const bool kv_ok = splits > 1 ? dk_diff.nonfinite == 0 && dv_diff.nonfinite == 0 && dk_diff.rel_l2 <= 1e-2 &&
                                              dv_diff.rel_l2 <= 1e-2
                                        : same_kv;
          say("    %s backward (not deterministic): dK, dV bitwise reproducible: %s%s; dQ run to run: %zu of %zu "
              "elements differ, rel_l2 %.2e\n",
              bwd_kernel_name(params.kernel), same_kv ? "yes" : "NO", splits > 1 ? " (kv blocks split: need not be)" : "",
              differing, dq1.size(), dq_diff.rel_l2);
          if (!kv_ok || dq_diff.nonfinite != 0 || dq_diff.rel_l2 > 1e-2) ++g_failures;
        }
      };
      check_reproducible(c.bwd);
      // The references: float64 on the CPU where the case has it (the fp32 GPU one checked against
      // it), else fp32 on the GPU; and the low-precision one's errors, which bound ours.
      const Outputs gpu = gpu_reference(c, false);
      References ref;
      ref.against = pr.cpu_check ? "cpu" : "gpu";
      if (pr.cpu_check) {
        ref.high = cpu_reference(pr, to_float(c.q, pr.dtype), to_float(c.k, pr.dtype), to_float(c.v, pr.dtype),
                                 to_float(c.dout, pr.dtype), c.scale);
        say("    (reference check: gpu fp32 reference vs float64 cpu, rel_l2 <= 1e-4)\n");
        for (const auto& [what, ours_values, cpu_values] :
             {std::tuple<const char*, const std::vector<float>*, const std::vector<float>*>{"out", &gpu.o, &ref.high.o},
              {"dq", &gpu.dq, &ref.high.dq},
              {"dk", &gpu.dk, &ref.high.dk},
              {"dv", &gpu.dv, &ref.high.dv}}) {
          const Errors e = compare(*ours_values, *cpu_values);
          const bool ok = e.nonfinite == 0 && e.rel_l2 <= 1e-4;
          say("    %-4s gpu vs cpu rel_l2 %.2e  %s\n", what, e.rel_l2, ok ? "ok" : "FAIL");
          if (!ok) ++g_failures;
        }
      } else {
        ref.high = gpu;
      }
      {
        const Outputs low = gpu_reference(c, true);
        ref.o = compare(low.o, ref.high.o);
        ref.dq = compare(low.dq, ref.high.dq);
        ref.dk = compare(low.dk, ref.high.dk);
        ref.dv = compare(low.dv, ref.high.dv);
      }
      say("    [%s forward, %s backward]\n", fwd_kernel_name(c.fwd.kernel), bwd_kernel_name(c.bwd.kernel));
      check_forward(ours.o, ours.lse, ref);
      check_gradients(ours.dq, ours.dk, ours.dv, ref);
      check_planted_faults(ours.o, pr.dv(), ref);
      // Every other backward kernel on the default forward's outputs, gradients poisoned first.
      for (BwdKernel kernel : c.bwd_list) {
        if (kernel == c.bwd.kernel) continue;
        BwdParams params = c.bwd;
        params.kernel = kernel;
        HARNESS_CUDA_CHECK(cudaMemset(c.d_dq.ptr, 0xff, c.d_dq.count * 2));
        HARNESS_CUDA_CHECK(cudaMemset(c.d_dk.ptr, 0xff, c.d_dk.count * 2));
        HARNESS_CUDA_CHECK(cudaMemset(c.d_dv.ptr, 0xff, c.d_dv.count * 2));
        run_attention_bwd(params, nullptr, g_launch);
        HARNESS_CUDA_CHECK(cudaDeviceSynchronize());
        say("    [%s backward]\n", bwd_kernel_name(kernel));
        check_gradients(to_float(c.d_dq.download(), pr.dtype), to_float(c.d_dk.download(), pr.dtype),
                        to_float(c.d_dv.download(), pr.dtype), ref);
        check_reproducible(params);
      }
      // Every other forward kernel: output and LSE against the same reference, poisoned first.
      for (size_t i = 0; i < c.fwd_list.size(); ++i) {
        if (i == default_fwd_index(c)) continue;
        poison(c);
        use_fwd_kernel(c, i);
        run_attention_fwd(c.fwd, nullptr, g_launch);
        HARNESS_CUDA_CHECK(cudaDeviceSynchronize());
        say("    [%s forward]\n", fwd_kernel_name(c.fwd.kernel));
        check_forward(to_float(c.d_o.download(), pr.dtype), c.d_lse.download(), ref);
      }
      // The launch modes of the forward kernel in c.fwd give the same bits: one CTA per work item,
      // and 3 persistent CTAs taking every item in turn (the K/V ring and the work item handshake
      // run across many items), against the kernel's default launch (mma_m128_n64 has one mode).
      auto check_launch_modes = [&] {
        std::vector<uint16_t> o_default;
        std::vector<float> lse_default;
        bool same = true;
        for (const int32_t max_ctas : {0, -1, 3}) {
          poison(c);
          c.fwd.max_ctas = max_ctas;
          run_attention_fwd(c.fwd, nullptr, g_launch);
          HARNESS_CUDA_CHECK(cudaDeviceSynchronize());
          if (max_ctas == 0) {
            o_default = c.d_o.download();
            lse_default = c.d_lse.download();
          } else {
            same = same && c.d_o.download() == o_default && c.d_lse.download() == lse_default;
          }
        }
        c.fwd.max_ctas = 0;
        say("    %s forward, one CTA per work item and 3 persistent CTAs, bitwise the default launch: %s\n",
            fwd_kernel_name(c.fwd.kernel), same ? "yes" : "NO");
        if (!same) ++g_failures;
      };
      for (size_t i = 0; i < c.fwd_list.size(); ++i) {
        use_fwd_kernel(c, i);
        check_launch_modes();
      }
      use_fwd_kernel(c, default_fwd_index(c));
      if (pr.timed) {
        Row row;
        row.name = pr.name;
        row.pairs = c.pairs * pr.batch * pr.heads;
        row.t = time_case(c, 20);
        row.fwd_list = c.fwd_list;
        row.bwd_list = c.bwd_list;
        // Products per visible pair: forward Q K^T (D) and P V (DV); backward S (D), dP (DV), dV
        // (DV), dK (D), dQ (D).
        const double fwd_flops = 2.0 * row.pairs * (pr.head_dim + pr.dv());
        const double bwd_flops = 2.0 * row.pairs * (3 * pr.head_dim + 2 * pr.dv());
        for (double ms : row.t.fwd_ms) row.fwd_tflops.push_back(fwd_flops / (ms * 1e-3) / 1e12);
        for (const BwdTiming& b : row.t.bwd) row.bwd_tflops.push_back(bwd_flops / (b.bwd_ms * 1e-3) / 1e12);
        table.push_back(row);
      }
    }
    say("\nTiming (H200, median of 20, L2 flushed before each rep; TFLOP/s of visible pairs only:\n"
        "fwd 2*pairs*(D+DV), bwd 2*pairs*(3D+2DV), that is 4*pairs*D and 10*pairs*D at DV = D, pairs summed over heads)\n");
    say("| case | forward kernel | fwd ms | fwd TFLOP/s |\n|---|---|---|---|\n");
    for (const Row& r : table) {
      for (size_t i = 0; i < r.t.fwd_ms.size(); ++i) {
        const FwdKernel kernel = r.fwd_list[i];
        say("| %s | %s | %.3f | %.0f |\n", r.name.c_str(), fwd_kernel_name(kernel), r.t.fwd_ms[i], r.fwd_tflops[i]);
      }
    }
    say("\n(wgmma_atomic: prep = prep (which zeroes the accumulator) + dQ convert, +dkdv = its one main kernel, +dq ~ 0)\n");
    say("| case | backward kernel | bwd ms | bwd: prep / +dkdv / +dq ms | bwd TFLOP/s |\n|---|---|---|---|---|\n");
    for (const Row& r : table) {
      for (size_t i = 0; i < r.t.bwd.size(); ++i) {
        const BwdTiming& b = r.t.bwd[i];
        say("| %s | %s | %.3f | %.3f / %.3f / %.3f | %.0f |\n", r.name.c_str(), bwd_kernel_name(r.bwd_list[i]), b.bwd_ms,
            b.prep_dkdv_dq_ms[0], b.prep_dkdv_dq_ms[1], b.prep_dkdv_dq_ms[2], r.bwd_tflops[i]);
      }
    }
    say("\n%s: %d failed checks\n", g_failures ? "FAILED" : "PASSED", g_failures);
  } catch (const std::exception& error) {
    say("ERROR: %s\n", error.what());
    return 2;
  }
  if (g_log) std::fclose(g_log);
  return g_failures ? 1 : 0;
}
