#pragma once
// Hopper (sm_90a) device helpers of the warp-specialized kernels: mbarriers, the bulk tensor copy
// engine (TMA), wgmma fences and shared-memory matrix descriptors, register reallocation and named
// barriers. The tile layout every operand uses is the "128-byte swizzle" canonical layout of
// wgmma (PTX ISA, "Shared Memory Matrix Layout"): a tile of R rows x 64 bf16 (128 bytes a row) is
// R * 128 contiguous bytes whose 16-byte chunk c of row r sits at chunk c ^ (r % 8); a head dim of
// 128 is two such tiles one after the other ("halves"). TMA writes exactly this layout when its
// tensor map says CU_TENSOR_MAP_SWIZZLE_128B and the destination is 1024-byte aligned.

#include <cuda.h>

#include <cstdint>

namespace harness::kernels::cuda::device {

// ---- mbarrier -------------------------------------------------------------------------------

__device__ __forceinline__ void mbarrier_init(uint32_t bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(arrivals) : "memory");
}
//! Makes initialized barriers visible to the async proxy (TMA) before anyone uses them.
__device__ __forceinline__ void fence_barrier_init() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
//! One arrival that also announces `bytes` of transactions (TMA copies completing on this barrier).
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbarrier_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
//! mbarrier_arrive by the threads with `arrive` set, predicated (no branch: a branch between two
//! wgmma waits moves where ptxas puts the second, see fwd_wgmma_kernel.cuh).
__device__ __forceinline__ void mbarrier_arrive_if(uint32_t bar, bool arrive) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.u32 p, %1, 0;\n @p mbarrier.arrive.shared::cta.b64 _, [%0];\n}\n" ::"r"(bar),
      "r"(static_cast<uint32_t>(arrive))
      : "memory");
}
//! Whether the phase of parity `parity` has completed (a fresh barrier reports parity 1 complete,
//! so producers start waiting on "empty" with parity 1 and pass at once).
__device__ __forceinline__ bool mbarrier_try_wait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(bar), "r"(parity)
      : "memory");
  return done != 0;
}
__device__ __forceinline__ void mbarrier_wait(uint32_t bar, uint32_t parity) {
  while (!mbarrier_try_wait(bar, parity)) {
  }
}

// ---- TMA ------------------------------------------------------------------------------------

//! Loads the box at coordinates (c0 innermost .. c3) of `map` into shared memory at `dst`,
//! completing `bytes` (the whole box, out-of-bounds parts zero-filled) on barrier `bar`.
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0, int c1, int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6}], [%2];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}
//! Stores the box at (c0 .. c3) of `map` from shared memory at `src`; out-of-bounds parts are
//! not written. Completes in the calling thread's bulk group (tma_store_commit / _wait_read).
__device__ __forceinline__ void tma_store_4d(const CUtensorMap* map, uint32_t src, int c0, int c1, int c2, int c3) {
  asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(src), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
               : "memory");
}
__device__ __forceinline__ void tma_store_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
//! Waits until every committed store has finished reading shared memory (the CTA may then exit).
__device__ __forceinline__ void tma_store_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }
__device__ __forceinline__ void prefetch_tensor_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}
//! Orders this thread's ordinary shared-memory writes before later async-proxy (TMA, wgmma) reads.
__device__ __forceinline__ void fence_async_shared() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// ---- wgmma ----------------------------------------------------------------------------------

//! Before the first wgmma that reads or writes registers the warp changed since the last one.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
//! Waits until at most kPending committed wgmma groups of this warpgroup are still running.
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
//! Keeps the compiler from moving accesses of an accumulator across wgmma fences and waits (the
//! asynchronous MMA writes registers behind the compiler's back).
template <int kRows>
__device__ __forceinline__ void fence_registers(float (&acc)[kRows][4]) {
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(acc[i][e])::"memory");
  }
}

//! Shared-memory matrix descriptor of a 128-byte-swizzled operand starting at `address` (bytes):
//! `leading_bytes` is the stride between 64-element column blocks of an N-major operand (unused
//! for K-major ones), `stride_bytes` the stride between 8-row groups (1024 in a dense tile).
__device__ __forceinline__ uint64_t smem_descriptor(uint32_t address, uint32_t leading_bytes, uint32_t stride_bytes) {
  uint64_t desc = (address & 0x3FFFFu) >> 4;
  desc |= static_cast<uint64_t>((leading_bytes & 0x3FFFFu) >> 4) << 16;
  desc |= static_cast<uint64_t>((stride_bytes & 0x3FFFFu) >> 4) << 32;
  desc |= uint64_t{1} << 62;  // 128-byte swizzle; base offset 0 (tiles are 1024-byte aligned)
  return desc;
}

//! This thread's warpgroup (threadIdx.x / 128), broadcast from lane 0: ptxas then knows it is the
//! same in every lane and keeps what derives from it (a consumer's rows of a tile, so its wgmma
//! descriptors) in uniform registers, rather than moving each descriptor into them with R2UR
//! before every wgmma (SASS: R2UR 119 -> 55 in the atomic backward at D = 128; none
//! left between a forward's wgmma, which CTest kernel_sass checks).
__device__ __forceinline__ int warpgroup_index() {
  return __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x) / 128, 0);
}

//! The descriptor of the tile `bytes` (a multiple of 16) past the one `desc` describes: its start
//! address field (bits 0-13, address / 16) plus bytes / 16, added to the low word only. No carry
//! leaves the field: every shared-memory address is below 256 KB (2^14 x 16). A kernel builds a
//! tile's descriptor once and advances it per k-slice and stage: built per wgmma, ptxas masked,
//! shifted and moved each one into uniform registers anew (sm_90a SASS: ~10 instructions per
//! wgmma, a third of the forward's inner loop).
__device__ __forceinline__ uint64_t smem_descriptor_advance(uint64_t desc, uint32_t bytes) {
  const uint32_t lo = static_cast<uint32_t>(desc) + (bytes >> 4);
  return (desc & 0xFFFFFFFF00000000ull) | lo;
}

//! Byte offset of element (row, col) of a swizzled tile of `rows` rows x kHeadDim bf16, stored as
//! kHeadDim / 64 halves of rows x 128 bytes (see the file comment).
__device__ __forceinline__ uint32_t swizzled_offset(int rows, int row, int col) {
  const int half = col >> 6;
  const int chunk = (col >> 3) & 7;
  return static_cast<uint32_t>(half * rows * 128 + row * 128 + ((chunk ^ (row & 7)) << 4) + (col & 7) * 2);
}

// ---- Registers and barriers -----------------------------------------------------------------

//! setmaxnreg: every warp of the warpgroup must execute it; takes effect only under a register cap
//! at entry (__launch_bounds__(threads, 1)).
template <int kRegisters>
__device__ __forceinline__ void warpgroup_registers_decrease() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}
template <int kRegisters>
__device__ __forceinline__ void warpgroup_registers_increase() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}
//! Barrier among `threads` threads on hardware barrier `id` (0 is __syncthreads's).
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

}  // namespace harness::kernels::cuda::device
