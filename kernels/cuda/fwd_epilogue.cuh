#pragma once
// The Hopper forward's epilogue (device code only): a consumer warpgroup's end of a work item. Each
// row's LSE straight from registers (finish_rows), O / rowsum in the element type into the item's O tile (a
// tile of its own with persistent CTAs at one per SM, else the item's Q rows, no longer read), one
// TMA store of the warpgroup's 64 rows.

#include <cstdint>

#include "kernels/cuda/attention_params.h"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/cuda/fwd_mainloop.cuh"
#include "kernels/cuda/hopper_utils.cuh"
#include "kernels/cuda/kernel_common.cuh"

namespace harness::kernels::cuda::device {

template <class Cfg>
struct FwdEpilogue {
  static constexpr int kHeadDimV = Cfg::kHeadDimV;
  static constexpr int kOutDimV = Cfg::kOutDimV;  //!< the columns acc_o holds
  static constexpr int kBlockM = Cfg::kBlockM;

  //! The item of `tile` (its packed rows and batch) out: LSE and O. With an O tile of its own the
  //! item's Q buffer is released first (every wgmma of this warp is done); else the staged O's
  //! store releases it once read.
  static __device__ __forceinline__ void store(const FwdParams& p, const FwdTensorMaps& maps, const FwdSharedStorage<Cfg>& smem,
                                               const FwdConsumerThread& thread, int tile, const PackedRows& rows, int batch,
                                               const float (&acc_o)[kOutDimV / 8][4], const float (&row_max)[2],
                                               const float (&row_sum)[2], float scale_log2) {
    const int consumer = thread.consumer, lane = thread.lane;
    const uint32_t s_o = smem.s_o(tile);
    if (smem.own_o) mbarrier_arrive_if(smem.q_empty(tile), lane == 0);  // every wgmma of this warp is done: Q is free
    float inv_sum[2];
    finish_rows(p, rows, batch, thread.my_row, row_max, row_sum, scale_log2, inv_sum);
    // The O tile of the previous item has been read by its store (own O tile), or every warp of
    // this warpgroup is past its last wgmma (O staged in the Q rows).
    if (smem.own_o && thread.storer) tma_store_wait_read();
    named_barrier_sync(1 + consumer, 128);
#pragma unroll
    for (int j = 0; j < kOutDimV / 8; ++j) {
      const int col = j * 8 + (lane & 3) * 2;
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const uint32_t packed = pack2<Cfg::kElement>(acc_o[j][2 * i] * inv_sum[i], acc_o[j][2 * i + 1] * inv_sum[i]);
        asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(s_o + swizzled_offset(kBlockM, thread.my_row[i], col)), "r"(packed)
                     : "memory");
      }
    }
    fence_async_shared();
    named_barrier_sync(1 + consumer, 128);
    if (thread.storer) {
      // The O map's box is this warpgroup's 64 rows: 64 positions of one head when block_m >= 64,
      // else 64 / block_m heads x block_m positions.
      const int row0 = consumer * 64;
      const int head = rows.head(row0);
      const int q0 = rows.query(row0);
#pragma unroll
      for (int half = 0; half < kHeadDimV / 64; ++half) {
        tma_store_4d(&maps.o, s_o + consumer * 64 * 128 + half * kBlockM * 128, half * 64, q0, head, batch);
      }
      tma_store_commit();
      if (!smem.own_o) {
        tma_store_wait_read();  // the next item's Q may overwrite the staged O now
        mbarrier_arrive(smem.q_empty(tile));
      }
    }
  }

  //! After the CTA's last item: its shared memory must outlive the last store's reads.
  static __device__ __forceinline__ void finish(const FwdConsumerThread& thread) {
    if (thread.storer) tma_store_wait_read();
  }
};

}  // namespace harness::kernels::cuda::device
