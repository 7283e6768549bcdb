// harness_bench_prep_bandwidth: the backward prep's streaming read (delta = rowsum(dO * O) and the
// log2 LSE per query row; bwd_kernels.cuh) in the load forms we tried, beside two reads of
// the same bytes. Prints a markdown table; every row is checked against the plain form.
//
//   harness_bench_prep_bandwidth [--heads 32] [--q-len 8192] [--reps 50]
//
// O and dO are [1, heads, q_len, 128] bf16 (the 8k masks' 128 MB); a 512 MB memset before every
// launch leaves L2 cold, and CUDA events around the launch alone time it (the "empty launch" row is
// what events and a launch cost by themselves: subtract it for the kernel's own time).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_utils.cuh"

namespace {

constexpr int kHeadDim = 128;
constexpr int kThreadsPerRow = kHeadDim / 8;
constexpr int kThreads = 256;
constexpr int kRowsPerCta = kThreads / kThreadsPerRow;
constexpr float kLog2e = 1.4426950408889634f;

enum class Load { plain, once, once_256, l2_256 };

template <Load kLoad>
__device__ __forceinline__ uint4 load16(const void* p) {
  uint4 r;
  if constexpr (kLoad == Load::plain) {
    r = *static_cast<const uint4*>(p);
  } else if constexpr (kLoad == Load::once) {
    r = harness::kernels::cuda::device::load_once_16(p);  // what the prep kernel uses
  } else if constexpr (kLoad == Load::once_256) {
    asm volatile("ld.global.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
  } else {
    asm volatile("ld.global.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
  }
  return r;
}

__device__ __forceinline__ float dot8(uint4 o, uint4 d) {
  const auto* o2 = reinterpret_cast<const __nv_bfloat162*>(&o);
  const auto* d2 = reinterpret_cast<const __nv_bfloat162*>(&d);
  float sum = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 a = __bfloat1622float2(o2[i]);
    const float2 b = __bfloat1622float2(d2[i]);
    sum = fmaf(a.x, b.x, fmaf(a.y, b.y, sum));
  }
  return sum;
}

//! The prep kernel's read and reduction, as bwd_kernels.cuh runs them (16 threads a row, one
//! 16-byte load of O and of dO each, the LSE read by the row's first thread after the reduction).
template <Load kLoad>
__global__ void __launch_bounds__(kThreads) prep(const __nv_bfloat16* o, const __nv_bfloat16* dout, const float* lse,
                                                 float2* stats, int64_t rows) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerCta + threadIdx.x / kThreadsPerRow;
  const int chunk = static_cast<int>(threadIdx.x) % kThreadsPerRow;
  harness::kernels::cuda::device::grid_dependency_wait();
  float sum = 0.f;
  if (row < rows) {
    sum = dot8(load16<kLoad>(o + row * kHeadDim + chunk * 8), load16<kLoad>(dout + row * kHeadDim + chunk * 8));
  }
#pragma unroll
  for (int offset = kThreadsPerRow / 2; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (chunk != 0 || row >= rows) return;
  const float l = lse[row];
  stats[row] = make_float2(l == -INFINITY ? INFINITY : l * kLog2e, sum);
}

//! The atomic backward's dQ conversion (bwd_wgmma_atomic_kernel.cuh), unswizzled: a row's 128 fp32
//! sums read as two 16-byte loads a thread, scaled, written as bf16.
template <Load kLoad>
__global__ void __launch_bounds__(kThreads) convert(const float* accum, float scale, __nv_bfloat16* out, int64_t rows) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerCta + threadIdx.x / kThreadsPerRow;
  const int col = (static_cast<int>(threadIdx.x) % kThreadsPerRow) * 8;
  harness::kernels::cuda::device::grid_dependency_wait();
  if (row >= rows) return;
  const uint4 a = load16<kLoad>(accum + row * kHeadDim + col);
  const uint4 b = load16<kLoad>(accum + row * kHeadDim + col + 4);
  const float f[8] = {__uint_as_float(a.x), __uint_as_float(a.y), __uint_as_float(a.z), __uint_as_float(a.w),
                      __uint_as_float(b.x), __uint_as_float(b.y), __uint_as_float(b.z), __uint_as_float(b.w)};
  uint4 packed;
  uint32_t* words = &packed.x;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const __nv_bfloat162 pair = __floats2bfloat162_rn(f[2 * i] * scale, f[2 * i + 1] * scale);
    words[i] = *reinterpret_cast<const uint32_t*>(&pair);
  }
  *reinterpret_cast<uint4*>(out + row * kHeadDim + col) = packed;
}

//! Both tensors read by a grid-stride loop, four 16-byte loads of each in flight a thread.
__global__ void __launch_bounds__(kThreads) read_both(const uint4* a, const uint4* b, int64_t chunks, float* sink) {
  float sum = 0.f;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < chunks; i += 4 * stride) {
    uint4 x[4], y[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const bool in = i + u * stride < chunks;
      x[u] = in ? load16<Load::once>(a + i + u * stride) : make_uint4(0, 0, 0, 0);
      y[u] = in ? load16<Load::once>(b + i + u * stride) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) sum += __uint_as_float(x[u].x ^ y[u].w);
  }
  if (sum == 1.2345f) *sink = sum;  // keeps the loads; never true for these inputs in practice
}

int parse_int(int argc, char** argv, const char* flag, int fallback) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], flag) == 0) {
      char* end = nullptr;
      const long value = std::strtol(argv[i + 1], &end, 10);
      if (*end != '\0' || value <= 0 || value > (1 << 24)) {
        std::fprintf(stderr, "harness_bench_prep_bandwidth: %s %s: expected a positive integer\n", flag, argv[i + 1]);
        std::exit(2);
      }
      return static_cast<int>(value);
    }
  }
  return fallback;
}

int run(int argc, char** argv) {
  for (int i = 1; i < argc; i += 2) {
    const std::string flag = argv[i];
    if ((flag != "--heads" && flag != "--q-len" && flag != "--reps") || i + 1 >= argc) {
      std::fprintf(stderr, "harness_bench_prep_bandwidth: unknown or incomplete argument '%s' (--heads N --q-len N --reps N)\n",
                   argv[i]);
      return 2;
    }
  }
  const int heads = parse_int(argc, argv, "--heads", 32);
  const int q_len = parse_int(argc, argv, "--q-len", 8192);
  const int reps = parse_int(argc, argv, "--reps", 50);
  const int64_t rows = static_cast<int64_t>(heads) * q_len;
  const size_t bytes = static_cast<size_t>(rows) * kHeadDim * sizeof(__nv_bfloat16);
  const size_t flush_bytes = size_t{512} << 20;

  __nv_bfloat16 *o = nullptr, *dout = nullptr;
  float *lse = nullptr, *flush = nullptr;
  float2 *stats = nullptr, *reference = nullptr;
  HARNESS_CUDA_CHECK(cudaMalloc(&o, bytes));
  HARNESS_CUDA_CHECK(cudaMalloc(&dout, bytes));
  HARNESS_CUDA_CHECK(cudaMalloc(&lse, rows * sizeof(float)));
  HARNESS_CUDA_CHECK(cudaMalloc(&stats, rows * sizeof(float2)));
  HARNESS_CUDA_CHECK(cudaMalloc(&reference, rows * sizeof(float2)));
  HARNESS_CUDA_CHECK(cudaMalloc(&flush, flush_bytes));
  {
    std::vector<__nv_bfloat16> host(static_cast<size_t>(rows) * kHeadDim);
    for (size_t i = 0; i < host.size(); ++i) host[i] = __float2bfloat16(static_cast<float>((i * 2654435761u) % 1000) / 1000.f - 0.5f);
    HARNESS_CUDA_CHECK(cudaMemcpy(o, host.data(), bytes, cudaMemcpyHostToDevice));
    for (size_t i = 0; i < host.size(); ++i) host[i] = __float2bfloat16(static_cast<float>((i * 40503u + 7) % 997) / 997.f - 0.5f);
    HARNESS_CUDA_CHECK(cudaMemcpy(dout, host.data(), bytes, cudaMemcpyHostToDevice));
    std::vector<float> l(static_cast<size_t>(rows));
    for (int64_t i = 0; i < rows; ++i) l[static_cast<size_t>(i)] = (i % 97 == 0) ? -INFINITY : static_cast<float>(i % 100) * 0.1f;
    HARNESS_CUDA_CHECK(cudaMemcpy(lse, l.data(), rows * sizeof(float), cudaMemcpyHostToDevice));
  }
  int sms = 0;
  HARNESS_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaDeviceProp prop{};
  HARNESS_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  const auto ctas = static_cast<unsigned>((rows + kRowsPerCta - 1) / kRowsPerCta);
  prep<Load::plain><<<ctas, kThreads>>>(o, dout, lse, reference, rows);
  HARNESS_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<float2> want(static_cast<size_t>(rows)), got(static_cast<size_t>(rows));
  HARNESS_CUDA_CHECK(cudaMemcpy(want.data(), reference, rows * sizeof(float2), cudaMemcpyDeviceToHost));

  cudaEvent_t start, stop;
  HARNESS_CUDA_CHECK(cudaEventCreate(&start));
  HARNESS_CUDA_CHECK(cudaEventCreate(&stop));
  std::printf("%s, %d SMs; O and dO [1, %d, %d, 128] bf16 (%.0f MB together), cold L2, %d launches each\n\n", prop.name, sms,
              heads, q_len, 2.0 * bytes / 1e6, reps);
  std::printf("| form | us median (p10-p90) | TB/s of O + dO (median) | rows match the plain form |\n|---|---|---|---|\n");
  // `moved`: the bytes the launch reads and writes, for the bandwidth column.
  auto time = [&](const char* name, auto launch, bool compare, double moved) {
    std::vector<float> ms;
    for (int it = 0; it < reps + 5; ++it) {
      HARNESS_CUDA_CHECK(cudaMemsetAsync(flush, it & 0xff, flush_bytes));
      HARNESS_CUDA_CHECK(cudaMemsetAsync(stats, 0, rows * sizeof(float2)));
      HARNESS_CUDA_CHECK(cudaEventRecord(start));
      launch();
      HARNESS_CUDA_CHECK(cudaEventRecord(stop));
      HARNESS_CUDA_CHECK(cudaEventSynchronize(stop));
      float t = 0;
      HARNESS_CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
      if (it >= 5) ms.push_back(t * 1e3f);
    }
    HARNESS_CUDA_CHECK(cudaGetLastError());
    std::sort(ms.begin(), ms.end());
    const double median = ms[ms.size() / 2];
    const char* verdict = "-";
    if (compare) {
      HARNESS_CUDA_CHECK(cudaMemcpy(got.data(), stats, rows * sizeof(float2), cudaMemcpyDeviceToHost));
      verdict = std::memcmp(got.data(), want.data(), got.size() * sizeof(float2)) == 0 ? "yes (bitwise)" : "NO";
    }
    std::printf("| %s | %.1f (%.1f-%.1f) | %.2f | %s |\n", name, median, ms[ms.size() / 10], ms[ms.size() * 9 / 10],
                moved / median / 1e6, verdict);
  };
  time("empty launch (events + launch alone)", [&] { prep<Load::plain><<<1, kThreads>>>(o, dout, lse, stats, 0); }, false, 2.0 * bytes);
  time("read both, grid-stride, 4 loads of each in flight", [&] {
    read_both<<<sms * 8, kThreads>>>(reinterpret_cast<const uint4*>(o), reinterpret_cast<const uint4*>(dout), bytes / 16, flush);
  }, false, 2.0 * bytes);
  time("cudaMemcpy D2D of O (reads half, writes half)", [&] {
    HARNESS_CUDA_CHECK(cudaMemcpyAsync(flush, o, bytes, cudaMemcpyDeviceToDevice));
  }, false, 2.0 * bytes);
  time("prep, plain 16-byte loads", [&] { prep<Load::plain><<<ctas, kThreads>>>(o, dout, lse, stats, rows); }, true, 2.0 * bytes);
  time("prep, load_once_16: L1::no_allocate (kept)", [&] { prep<Load::once><<<ctas, kThreads>>>(o, dout, lse, stats, rows); }, true, 2.0 * bytes);
  time("prep, L1::no_allocate.L2::256B", [&] { prep<Load::once_256><<<ctas, kThreads>>>(o, dout, lse, stats, rows); }, true, 2.0 * bytes);
  time("prep, L2::256B alone", [&] { prep<Load::l2_256><<<ctas, kThreads>>>(o, dout, lse, stats, rows); }, true, 2.0 * bytes);
  // The convert kernel's traffic: fp32 sums of O's shape read, bf16 written (into dO's buffer).
  float* accum = nullptr;
  HARNESS_CUDA_CHECK(cudaMalloc(&accum, static_cast<size_t>(rows) * kHeadDim * sizeof(float)));
  HARNESS_CUDA_CHECK(cudaMemset(accum, 0x3c, static_cast<size_t>(rows) * kHeadDim * sizeof(float)));
  std::printf("\n| dQ convert form (fp32 %.0f MB read, bf16 %.0f MB written) | us median (p10-p90) | TB/s moved (median) | - |\n"
              "|---|---|---|---|\n", 2.0 * bytes / 1e6, bytes / 1e6);
  time("convert, plain 16-byte loads (kept)",
       [&] { convert<Load::plain><<<ctas, kThreads>>>(accum, 0.088f, dout, rows); }, false, 3.0 * bytes);
  time("convert, load_once_16 (tried, not kept)", [&] { convert<Load::once><<<ctas, kThreads>>>(accum, 0.088f, dout, rows); }, false,
       3.0 * bytes);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& error) {  // a failed CUDA call (HARNESS_CUDA_CHECK)
    std::fprintf(stderr, "harness_bench_prep_bandwidth: %s\n", error.what());
    return 1;
  }
}
