#pragma once
// Longest-first schedule (device code only). Block-sparse CTAs differ widely in cost (dflash:
// 1 to 33 kv blocks per q block), and the hardware starts CTAs in grid order, so a costly CTA
// started last leaves most SMs idle at the end. One small CTA ranks the work items by their
// block counts and writes the CTA -> item table the attention kernels read (greedy LPT order).

#include <cstdint>

#include "kernels/cuda/attention_params.h"

namespace harness::kernels::cuda::device {

//! One class of work items: item i costs (num_a[i] + num_b[i]) * weight + overhead and runs as
//! `copies` CTAs (head packs or kv heads, times batch).
//! Shared memory of the ranking: one int per item, padded by 4 ints. ptxas hoists the loads of the
//! ranking loop's 4-way unrolled remainder above its branches (compute-sanitizer memcheck saw a
//! 12-byte read past 1 item); the values are never used, but the reads must stay in bounds.
__host__ __device__ constexpr int schedule_smem_bytes(int items) { return (items + 4) * 4; }

struct WorkClass {
  int32_t count = 0;
  const int32_t* num_a = nullptr;
  const int32_t* num_b = nullptr;
  int32_t weight = 1;
  int32_t overhead = 0;
  int32_t copies = 1;
};

//! Items of `first` come before those of `second` in the item numbering (WorkItem::block).
//! With `ranked` false (too many items for the O(n^2) ranking in shared memory) the order is
//! the item numbering itself. One CTA; dynamic shared memory: schedule_smem_bytes(items) when
//! ranked.
//! `groups` > 1 (every class's copies a multiple of it, the group the outermost factor of a copy,
//! as every kernel numbers them: batch, then head or kv head): the whole longest-first order of
//! group 0, then of group 1, ...; each group's order still ends on its cheapest items. Groups of
//! one batch (ScheduleOrder::batch): the CTAs running at once read one batch's K/V instead of all
//! of them; dflash-512 at batch 2 ran 5% faster so (H200, kernels/cuda/README.md), likely the L2,
//! which holds one batch's context K/V (32 MiB) but not two. Groups of one or a few kv heads within
//! a batch (ScheduleOrder::kv_head, the `_kv_major` forwards): one kv head's K/V.
__global__ void build_schedule_kernel(WorkClass first, WorkClass second, int groups, bool ranked,
                                      WorkItem* __restrict__ schedule) {
  extern __shared__ int32_t cost[];
  const int n = first.count + second.count;
  auto cost_of = [&](int item) {
    if (item < first.count) return (__ldg(first.num_a + item) + __ldg(first.num_b + item)) * first.weight + first.overhead;
    const int i = item - first.count;
    return (__ldg(second.num_a + i) + __ldg(second.num_b + i)) * second.weight + second.overhead;
  };
  if (ranked) {
    for (int item = static_cast<int>(threadIdx.x); item < n; item += static_cast<int>(blockDim.x)) cost[item] = cost_of(item);
    __syncthreads();
  }
  for (int item = static_cast<int>(threadIdx.x); item < n; item += static_cast<int>(blockDim.x)) {
    // rank: items before this one in the order (costlier, or as costly with a smaller number).
    int rank = item;
    int first_before = min(item, first.count);
    if (ranked) {
      const int mine = cost[item];
      rank = 0;
      first_before = 0;
      for (int other = 0; other < n; ++other) {
        const int c = cost[other];
        if (c > mine || (c == mine && other < item)) {
          ++rank;
          first_before += other < first.count;
        }
      }
    }
    const int first_copies = first.copies / groups, second_copies = second.copies / groups;
    const int per_group = first.count * first_copies + second.count * second_copies;
    const int start = first_before * first_copies + (rank - first_before) * second_copies;
    const int copies = item < first.count ? first_copies : second_copies;
    for (int group = 0; group < groups; ++group) {
      for (int copy = 0; copy < copies; ++copy) {
        schedule[group * per_group + start + copy] = WorkItem{item, group * copies + copy};
      }
    }
  }
}

}  // namespace harness::kernels::cuda::device
