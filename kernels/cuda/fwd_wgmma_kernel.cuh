#pragma once
// Forward kernel for Hopper (device code only): warp-specialized block-sparse flash attention with
// TMA loads and wgmma, composed as FlashAttention-3 composes its forward: a tile scheduler
// (tile_scheduler.cuh: which work items this CTA runs), a mainloop (fwd_mainloop.cuh: the
// producer's loads and the consumers' products of one item) and an epilogue (fwd_epilogue.cuh: the
// item's O and LSE out).
//
// CTA = one producer warpgroup + kConsumers consumer warpgroups of 64 query rows each. The rows
// are packed like the mma.sync forward's (fwd_kernel.cuh: heads_packed query heads of one GQA
// group x block_m positions), so every K/V tile a CTA loads serves all of them. A work item is one
// such tile of rows; a CTA runs one item, or (persistent, FwdWgmmaConfig::kPersistent) one SM
// slot's CTA runs items until the scheduler's counter says none is left. The producer thread takes
// the next item, hands it to the consumers and issues its copies; the consumers run the item's
// products and store its output, while the producer already loads the next item into the ring.
// The producer warpgroup gives registers back (setmaxnreg) so the consumers can hold O (64 fp32 at
// D = 128), S (kBlockN / 2 fp32) and P in registers.

#include <cstdint>

#include "kernels/cuda/attention_config.h"
#include "kernels/cuda/attention_params.h"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/cuda/fwd_epilogue.cuh"
#include "kernels/cuda/fwd_mainloop.cuh"
#include "kernels/cuda/hopper_utils.cuh"
#include "kernels/cuda/kernel_common.cuh"
#include "kernels/cuda/tile_scheduler.cuh"

namespace harness::kernels::cuda::device {

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocksPerSm)
    attention_fwd_wgmma_kernel(const __grid_constant__ FwdParams p, const __grid_constant__ FwdTensorMaps maps,
                               const WorkItem* __restrict__ schedule, const int num_items, int* item_counter,
                               const bool own_o, const uint64_t* __restrict__ mask_bits) {
  extern __shared__ unsigned char smem_raw[];
  const FwdSharedStorage<Cfg> smem(smem_raw, own_o);
  const FwdTileScheduler scheduler{schedule, num_items, item_counter};
  const WorkItemHandoff handoff = smem.item_handoff();
  KvRing<Cfg::kStages> ring;
  if (threadIdx.x == 0) smem.init_barriers();
  __syncthreads();
  // Launched programmatically when its schedule is an earlier call's (attention_launch.cu): the
  // launch and the setup above overlap the kernel ahead, whatever it is; everything below reads
  // inputs it may have written, or writes memory it may still read, so every thread waits first.
  grid_dependency_wait();

  const int warpgroup = warpgroup_index();
  if (warpgroup == 0) {
    // ---- producer ----
    warpgroup_registers_decrease<Cfg::kProducerRegisters>();
    if (threadIdx.x != 0) return;
    prefetch_tensor_map(&maps.q);
    prefetch_tensor_map(&maps.k);
    prefetch_tensor_map(&maps.v);
    for (int tile = 0;; ++tile) {
      WorkItem scheduled;
      if (!scheduler.next(tile, handoff, scheduled)) {
        handoff.publish_end();
        break;
      }
      const FwdWork work = fwd_work(p, scheduled, Cfg::kBlockM);
      const VisitList kv_list = kv_blocks_of(p.blocks, work.q_block);
      handoff.publish(scheduled, kv_list.num_partial, kv_list.count);
      fwd_load_item<Cfg>(maps, smem, ring, tile, work, kv_list);
      ring.advance(kv_list.count);
    }
    return;
  }

  // ---- consumers ----
  warpgroup_registers_increase<Cfg::kConsumerRegisters>();
  const FwdConsumerThread thread(warpgroup - 1);
  for (int tile = 0;; ++tile) {
    WorkItem scheduled;
    int num_partial, num_blocks;
    if (!handoff.receive(tile, thread.lane, scheduled, num_partial, num_blocks)) break;
    const FwdWork work = fwd_work(p, scheduled, Cfg::kBlockM);
    float acc_o[Cfg::kOutDimV / 8][4] = {};
    float row_max[2] = {-INFINITY, -INFINITY};  // raw scores (unscaled)
    float row_sum[2] = {0.f, 0.f};              // this thread's columns only; quad-reduced at the end
    FwdConsumerItem<Cfg> item(p, smem, ring, thread, mask_bits, work, num_partial, num_blocks, acc_o, row_max, row_sum);
    item.run(tile);
    FwdEpilogue<Cfg>::store(p, maps, smem, thread, tile, work.rows, work.batch, acc_o, row_max, row_sum, item.scale_log2);
    ring.advance(num_blocks);
  }
  FwdEpilogue<Cfg>::finish(thread);
}

}  // namespace harness::kernels::cuda::device
