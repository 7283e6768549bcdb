// The CTA table's kernel (tile_scheduler.cuh describes the scheduling) and its launch.

#include <cuda_runtime.h>

#include "kernels/cuda/attention_config.h"
#include "kernels/cuda/attention_launch.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/tile_scheduler.cuh"

namespace harness::kernels::cuda {
namespace device {

//! Items of `first` come before those of `second` in the item numbering (WorkItem::block).
//! With `ranked` false (too many items for the O(n^2) ranking in shared memory) the order is
//! the item numbering itself. One CTA; dynamic shared memory: schedule_smem_bytes(items) when
//! ranked.
//! `groups` > 1 (every class's copies a multiple of it, the group the outermost factor of a copy):
//! the whole longest-first order of group 0, then of group 1, ...; each group's order still ends on
//! its cheapest items. Groups of one batch (ScheduleOrder::batch): the CTAs running at once read
//! one batch's K/V instead of all of them; dflash-512 at batch 2 ran 5% faster so (H200), likely
//! the L2, which holds one batch's context K/V (32 MiB) but not two. Groups of one or a few kv
//! heads within a batch (ScheduleOrder::kv_head, the `_kv_major` forwards): one kv head's K/V.
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

}  // namespace device

namespace launch {

void launch_schedule(const device::WorkClass& first, const device::WorkClass& second, const AttentionShape& shape,
                     ScheduleOrder order, ScheduleOrder requested, WorkItem* schedule, cudaStream_t stream) {
  const int items = first.count + second.count;
  const bool ranked = items <= ScheduleConfig::kMaxRankedItems;
  const int smem = ranked ? device::schedule_smem_bytes(items) : 0;
  const int groups =
      scheduling::schedule_groups(requested != ScheduleOrder::kernel_default ? requested : order, shape, first, second);
  device::build_schedule_kernel<<<1, ScheduleConfig::kThreads, smem, stream>>>(first, second, groups, ranked, schedule);
  HARNESS_CUDA_LAUNCH_CHECK("build_schedule_kernel");
}

}  // namespace launch
}  // namespace harness::kernels::cuda
