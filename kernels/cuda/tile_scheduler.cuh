#pragma once
// Tile scheduling, in one place: which CTA runs which work item, and in which order (device code,
// and the host side that sets it up for the launcher).
//   Work items. A forward item is one packed tile of query rows: (q block, head pack, batch). A
//   backward item is a kv block (dK/dV: per kv head and batch, and in wgmma_atomic per split of the
//   GQA group's head packs) or a q block (dQ: per head pack and batch). WorkItem::block numbers the
//   item, WorkItem::copy which of its copies; every kernel numbers a copy batch-major, then by head
//   (pack) or kv head, then by split. The decoders below turn a WorkItem into what a CTA computes.
//   Cost. Block-sparse items differ widely (dflash: 1 to 33 kv blocks per q block) and the hardware
//   starts CTAs in grid order, so a costly CTA started last leaves most SMs idle at the end. An
//   item costs (num_a + num_b) * weight + overhead (WorkClass), in units of one 64x128x128 GEMM.
//   Order. One small CTA (build_schedule_kernel, tile_scheduler.cu) ranks the items by cost and
//   writes the CTA table, longest first (greedy LPT order), group by group (ScheduleOrder).
//   Launch. One CTA per item (blockIdx.x is the table's index), or for the persistent forwards one
//   CTA per SM slot whose producer draws the next item from a counter (FwdTileScheduler) and hands
//   it to the consumers through shared memory (WorkItemHandoff).

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <numeric>

#include "kernels/cuda/attention_config.h"
#include "kernels/cuda/attention_params.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/hopper_utils.cuh"
#include "kernels/cuda/kernel_common.cuh"

namespace harness::kernels::cuda {
namespace device {

// ---- Work items ---------------------------------------------------------------------------------

//! What a forward CTA computes: work item (q block, head pack + batch) of the longest-first
//! schedule, as the packed rows of a tile of `tile_rows` rows.
struct FwdWork {
  int q_block;
  int batch;
  PackedRows rows;
  int kv_head;
};
__device__ __forceinline__ FwdWork fwd_work(const FwdParams& p, WorkItem work, int tile_rows) {
  const int block_m = p.blocks.block_m;
  const int heads_packed = tile_rows / block_m;
  const int num_packs = p.shape.heads / heads_packed;
  const PackedRows rows{__ffs(block_m) - 1, (work.copy % num_packs) * heads_packed, work.block * block_m};
  return {work.block, work.copy / num_packs, rows, rows.head0 / (p.shape.heads / p.shape.kv_heads)};
}

//! A backward dK/dV item: kv block of (kv head, batch), and which of the `splits` shares of the GQA
//! group's head packs it runs (0 of 1 where kv blocks are not split).
struct DkdvWork {
  int kv_block;
  int kv_head;
  int batch;
  int split;
};
__device__ __forceinline__ DkdvWork dkdv_work(WorkItem work, int kv_heads, int splits) {
  return {work.block, (work.copy / splits) % kv_heads, (work.copy / splits) / kv_heads, work.copy % splits};
}

//! A backward dQ item of the merged launch: q block `work.block - num_kv_blocks` of head pack
//! `pack` and batch.
struct DqWork {
  int q_block;
  int pack;
  int batch;
};
__device__ __forceinline__ DqWork dq_work(WorkItem work, int num_kv_blocks, int num_packs) {
  return {work.block - num_kv_blocks, work.copy % num_packs, work.copy / num_packs};
}
//! The wgmma dQ tile runs two head packs of its q block where the packs are even (2 tiles per CTA,
//! else 1): the table writes an item's copies in a row, so the CTA of an even pack runs the odd one
//! after it and the odd one's CTA has nothing to do (pack % 2 == 1 where 2 tiles).
__device__ __forceinline__ int dq_tiles_per_cta(int num_packs) { return num_packs % 2 == 0 ? 2 : 1; }

// ---- The CTA table: longest first ---------------------------------------------------------------

//! Shared memory of the ranking: one int per item, padded by 4 ints. ptxas hoists the loads of the
//! ranking loop's 4-way unrolled remainder above its branches (compute-sanitizer memcheck saw a
//! 12-byte read past 1 item); the values are never used, but the reads must stay in bounds.
__host__ __device__ constexpr int schedule_smem_bytes(int items) { return (items + 4) * 4; }

//! One class of work items: item i costs (num_a[i] + num_b[i]) * weight + overhead and runs as
//! `copies` CTAs (head packs or kv heads, times batch).
struct WorkClass {
  int32_t count = 0;
  const int32_t* num_a = nullptr;
  const int32_t* num_b = nullptr;
  int32_t weight = 1;
  int32_t overhead = 0;
  int32_t copies = 1;
};

//! Writes the CTA table (tile_scheduler.cu): items of `first` before those of `second` in the item
//! numbering (WorkItem::block), longest first, in `groups` groups.
__global__ void build_schedule_kernel(WorkClass first, WorkClass second, int groups, bool ranked,
                                      WorkItem* __restrict__ schedule);

// ---- Persistent CTAs ----------------------------------------------------------------------------

//! Hands a CTA's next work item (WorkItem block and copy, and its kv list's partial and total
//! counts; block -1: no more) from the producer thread to the consumer warps through a 16-byte
//! shared-memory slot: the producer writes it once every consumer warp has read the last one
//! (`empty`, one arrival per warp) and arrives on `full`, before any copy of the item, so the
//! consumers set the item up (its rows' masks: global loads) while its Q is still on the way.
struct WorkItemHandoff {
  uint32_t slot;   //!< 16 bytes of shared memory
  uint32_t full;   //!< mbarrier, 1 arrival (the producer)
  uint32_t empty;  //!< mbarrier, one arrival per consumer warp
  //! Producer: no more items.
  __device__ __forceinline__ void publish_end() const {
    asm volatile("st.shared.v4.s32 [%0], {%1, %1, %1, %1};\n" ::"r"(slot), "r"(-1) : "memory");
    mbarrier_arrive(full);
  }
  __device__ __forceinline__ void publish(WorkItem item, int num_partial, int num_blocks) const {
    asm volatile("st.shared.v4.s32 [%0], {%1, %2, %3, %4};\n" ::"r"(slot), "r"(item.block), "r"(item.copy), "r"(num_partial),
                 "r"(num_blocks)
                 : "memory");
    mbarrier_arrive(full);
  }
  //! Consumer: the `tile`-th item; false when there is none.
  __device__ __forceinline__ bool receive(int tile, int lane, WorkItem& item, int& num_partial, int& num_blocks) const {
    mbarrier_wait(full, tile & 1);
    asm volatile("ld.shared.v4.s32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(item.block), "=r"(item.copy), "=r"(num_partial), "=r"(num_blocks)
                 : "r"(slot)
                 : "memory");
    mbarrier_arrive_if(empty, lane == 0);
    return item.block >= 0;
  }
};

//! The forward's work items for one CTA. Persistent (`counter` set): the grid's G CTAs start with
//! items 0..G-1 of the table, and each takes the next with one atomicAdd when its producer is done
//! issuing the last one's copies: greedy longest-first across the SMs, as the hardware's CTA
//! dispatch does, without a CTA launch, barrier setup and empty pipeline per item. Without a
//! counter each CTA runs item blockIdx.x, the plain launch.
struct FwdTileScheduler {
  const WorkItem* schedule;
  int num_items;
  int* counter;
  //! Producer: this CTA's `tile`-th item (called once per tile, in order) into `item`; false when
  //! there is none. Returns once the consumers have taken item tile - 1 from `handoff` (the draw's
  //! latency hides behind that wait). Every CTA draws until it gets no item: num_items - G draws
  //! that give one and G that do not, values 0..num_items-1. The last draw resets the counter
  //! (every other draw of this launch is done by then), so a counter kept between launches is
  //! zeroed only once.
  __device__ __forceinline__ bool next(int tile, const WorkItemHandoff& handoff, WorkItem& item) const {
    int index = static_cast<int>(blockIdx.x);
    if (tile > 0 && counter) {
      const int drawn = atomicAdd(counter, 1);
      if (drawn == num_items - 1) atomicExch(counter, 0);
      index = static_cast<int>(gridDim.x) + drawn;
    } else if (tile > 0) {
      index = num_items;
    }
    if (tile > 0) mbarrier_wait(handoff.empty, (tile - 1) & 1);
    if (index >= num_items) return false;
    item = schedule[index];
    return true;
  }
};

}  // namespace device

// ---- Host side: the launcher's scheduling --------------------------------------------------------

namespace scheduling {

//! The current device's SM count, asked once per device in the process.
inline int sm_count() {
  int device = 0;
  HARNESS_CUDA_CHECK(cudaGetDevice(&device));
  static std::mutex mutex;
  static std::map<int, int> counts;
  const std::lock_guard<std::mutex> lock(mutex);
  auto found = counts.find(device);
  if (found != counts.end()) return found->second;
  int count = 0;
  HARNESS_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
  counts.emplace(device, count);
  return count;
}

//! The grid of a wgmma forward of `items` work items at `per_sm` CTAs per SM, for FwdParams::max_ctas
//! (kFwdCtasKernelDefault: `persistent` or not, as the kernel's configuration says).
inline int64_t fwd_grid(int64_t items, int per_sm, bool persistent, int32_t max_ctas) {
  const int32_t ctas = max_ctas != kFwdCtasKernelDefault ? max_ctas : persistent ? kFwdCtasPerSmSlot : kFwdCtasPerItem;
  if (ctas == kFwdCtasPerItem) return items;
  return std::min<int64_t>(items, ctas > 0 ? ctas : int64_t{sm_count()} * per_sm);
}

//! The forward's items: a q block costs its kv blocks plus about one block's worth of Q load and
//! epilogue, and runs as `ctas / num_q_blocks` copies (head packs x batch).
inline device::WorkClass fwd_items(const BlockListParams& blocks, int64_t ctas) {
  return device::WorkClass{blocks.num_q_blocks, blocks.kv_num_blocks, blocks.full_kv_num_blocks, 1, 1,
                           static_cast<int32_t>(ctas / blocks.num_q_blocks)};
}

//! The merged backward's two classes (dK/dV first, then dQ), in units of one 64x128x128 GEMM: a
//! dK/dV step is 4 of them for each head pack of the group, a dQ step 3 (of 128x64x128); one
//! step's worth each for loading and storing the tile.
inline device::WorkClass bwd_dkdv_items(const BwdParams& p, const TileShape& dkdv_tile) {
  const int dkdv_packs = (p.shape.heads / p.shape.kv_heads) / dkdv_tile.heads_packed;
  return device::WorkClass{p.dkdv_blocks.num_kv_blocks, p.dkdv_blocks.q_num_blocks, p.dkdv_blocks.full_q_num_blocks,
                           4 * dkdv_packs, 4, p.shape.kv_heads * p.shape.batch};
}
inline device::WorkClass bwd_dq_items(const BwdParams& p, const TileShape& dq_tile) {
  return device::WorkClass{p.dq_blocks.num_q_blocks, p.dq_blocks.kv_num_blocks, p.dq_blocks.full_kv_num_blocks, 3, 3,
                           (p.shape.heads / dq_tile.heads_packed) * p.shape.batch};
}

//! wgmma_atomic's items: a kv block's CTA costs 5 GEMMs per step times its head packs (all of the
//! group's, or their share when the kv blocks are split over `splits` CTAs).
inline device::WorkClass bwd_atomic_items(const BwdParams& p, const TileShape& dkdv_tile, int splits) {
  const int packs = (p.shape.heads / p.shape.kv_heads) / dkdv_tile.heads_packed / splits;
  return device::WorkClass{p.dkdv_blocks.num_kv_blocks, p.dkdv_blocks.q_num_blocks, p.dkdv_blocks.full_q_num_blocks,
                           5 * packs, 4, p.shape.kv_heads * p.shape.batch * splits};
}

//! The groups of the CTA table in `order`: the batch, times (kv_head order) the largest number of
//! kv-head groups that divides every class's copies per batch (the copies of one group then cover
//! whole kv heads' heads).
inline int schedule_groups(ScheduleOrder order, const AttentionShape& shape, const device::WorkClass& first,
                           const device::WorkClass& second) {
  switch (order) {
    case ScheduleOrder::kernel_default:
    case ScheduleOrder::interleaved:
      return 1;
    case ScheduleOrder::batch:
      return shape.batch;
    case ScheduleOrder::kv_head: {
      int per_batch = shape.kv_heads;
      for (const device::WorkClass* c : {&first, &second}) {
        if (c->count > 0) per_batch = std::gcd(per_batch, c->copies / shape.batch);
      }
      return shape.batch * per_batch;
    }
  }
  return 1;
}

}  // namespace scheduling
}  // namespace harness::kernels::cuda
