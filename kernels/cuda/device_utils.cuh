#pragma once
// Device helpers of the fused attention kernels: the sm_80+ PTX they are built on (cp.async,
// ldmatrix, mma.sync m16n8k16 bf16 -> fp32, ex2.approx), the swizzled shared-memory tile layout, and
// sm_90's grid dependency control (programmatic dependent launch).

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/cuda/attention_config.h"

namespace harness::kernels::cuda::device {

//! 16-byte asynchronous global->shared copy; when `valid` is false the 16 bytes are zero-filled
//! (src-size 0), which is how rows past Q_LEN / KV_LEN become zeros (never garbage: a NaN in a
//! masked V row would survive P = 0 as 0 * NaN).
__device__ __forceinline__ void cp_async_16(uint32_t smem_addr, const void* gmem, bool valid) {
  const int src_size = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr), "l"(gmem), "r"(src_size));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

//! Programmatic dependent launch (PTX griddepcontrol, sm_90): a kernel launched with
//! cudaLaunchAttributeProgrammaticStreamSerialization (launch_kernel_after, attention_launch.cu)
//! may be scheduled before the kernel ahead of it in the stream has completed. grid_dependency_wait()
//! holds the calling thread until that kernel has completed and its writes are visible, so every
//! thread that reads what it wrote or writes memory it may still read (a fresh output can reuse a
//! block it still reads) calls this first, and so does at least one thread of every CTA (the grid
//! must never complete before the kernel ahead); in a kernel launched the plain way it returns at
//! once. None of this folder's kernels signals its dependents early (griddepcontrol.launch_dependents):
//! in the atomic backward's main kernel that instruction cost 0.8% (H200, causal-128), so the
//! kernel after one may start once its last CTA has exited.
__device__ __forceinline__ void grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

//! A 16-byte global load of data read once (the backward prep's O and dO rows), which L1 does not
//! keep (`L1::no_allocate`). Coherent (not `.nc`): the prep is launched programmatically and may
//! read what the kernel ahead wrote. Measured on the H200 (bench/prep_bandwidth.cu at 11fa271, the
//! 8k masks' 128 MB of O and dO, events): the prep's read 41.4 -> 36.8 us (3.2 -> 3.6 TB/s); an L2
//! prefetch size (`.L2::256B`) adds nothing, and alone gains nothing. Not for the atomic
//! backward's dQ convert (reads 128 MB, writes 64): there the same load was slower, 52.9 -> 55.0 us.
__device__ __forceinline__ uint4 load_once_16(const void* gmem) {
  uint4 r;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("ld.global.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(gmem));
#else
  r = *static_cast<const uint4*>(gmem);
#endif
  return r;
}

__device__ __forceinline__ uint32_t smem_address(const void* pointer) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(pointer));
}

//! Four 8x8 b16 matrices; lanes 8i..8i+7 give the row addresses of matrix i.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t smem_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr));
}
//! Same, each 8x8 matrix transposed on the way (B operands stored k-major).
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t smem_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr));
}

//! c += a * b for one m16n8k16 tile: a row-major (4 regs), b column-major (2 regs), both of the
//! element type, c fp32.
template <ElementType kElement>
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (kElement == ElementType::fp16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

//! Two floats as one register of two elements (round to nearest even), `lo` in the low half (the
//! lower column of an MMA fragment). fp16 saturates nothing: a value past 65504 becomes inf, as in
//! every fp16 flash kernel (P is at most 1 after the row's max, and O, dS are the caller's scale).
template <ElementType kElement>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (kElement == ElementType::fp16) {
    const __half2 packed = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&packed);
  } else {
    const __nv_bfloat162 packed = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&packed);
  }
}

//! The two floats of a register of two elements (low half first).
template <ElementType kElement>
__device__ __forceinline__ float2 unpack2(uint32_t packed) {
  if constexpr (kElement == ElementType::fp16) {
    return __half22float2(*reinterpret_cast<const __half2*>(&packed));
  } else {
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&packed));
  }
}

//! 2^x with the special-function unit (ex2.approx: 2 ulp, -inf -> 0), as every flash kernel does;
//! the softmax scale is folded into log2 units so one FFMA + EX2 makes each probability.
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

//! Shared-memory tile of `kRows` x `kHeadDim` bf16 stored as 16-byte chunks with chunk c of row r
//! at c ^ (r % 8). ldmatrix reads 8 rows of one logical chunk at a time; rows are 128 or 256 bytes,
//! so without the XOR all 8 would hit the same 4 banks (8-way conflict); with it they hit 8
//! distinct chunk slots, covering all 32 banks.
template <int kRows, int kHeadDim>
struct SmemTile {
  static constexpr int kChunks = kHeadDim / 8;  // 16-byte chunks per row
  static constexpr int kBytes = kRows * kHeadDim * 2;
  static_assert(kHeadDim % 64 == 0, "the XOR swizzle needs at least 8 chunks per row");
  __device__ __forceinline__ static uint32_t offset(int row, int chunk) {
    return static_cast<uint32_t>((row * kChunks + (chunk ^ (row & 7))) * 16);
  }
};

//! Issues the cp.async copies of a [kRows x kHeadDim] tile into `smem_base` (a SmemTile). Row r comes
//! from `row_pointer(r)`, which returns nullptr for rows to zero-fill; those copies still name a
//! valid address (`fallback`) although they read nothing. kThreads threads share the tile.
template <int kRows, int kHeadDim, int kThreads, typename RowPointer>
__device__ __forceinline__ void load_tile_async(uint32_t smem_base, const void* fallback, RowPointer row_pointer) {
  using Tile = SmemTile<kRows, kHeadDim>;
  constexpr int kTotal = kRows * Tile::kChunks;
  static_assert(kTotal % kThreads == 0, "tile chunks must divide evenly among the threads");
#pragma unroll
  for (int i = 0; i < kTotal / kThreads; ++i) {
    const int index = static_cast<int>(threadIdx.x) + i * kThreads;
    const int row = index / Tile::kChunks;
    const int chunk = index % Tile::kChunks;
    const __nv_bfloat16* source = row_pointer(row);
    cp_async_16(smem_base + Tile::offset(row, chunk), source ? static_cast<const void*>(source + chunk * 8) : fallback,
                source != nullptr);
  }
}

}  // namespace harness::kernels::cuda::device
