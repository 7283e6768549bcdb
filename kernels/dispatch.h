#pragma once
// Dispatch trace: every attention call records which implementation ran and why, the way the
// `sdpa_dense_backward` frame gave the founding bug away. Torch-free.

#include <mutex>
#include <string>
#include <vector>

namespace harness::kernels {

//! One decision: which implementation ran an op and why.
struct DispatchRecord {
  std::string op;      //!< "attention_fwd", "attention_bwd", "block_mask", ...
  std::string impl;    //!< "dense_aten", "fused_cpu", "fused_cuda", ...
  std::string device;  //!< "cpu", "cuda:0"
  std::string reason;  //!< why this implementation was chosen
  std::string config;  //!< tile config or other parameters ("block_m=64 block_n=64")
  std::string kernel = "";  //!< which of the implementation's kernels ran ("wgmma_m64_n64"), "" when it has one
};

//! Thread-safe append-only list of dispatch records.
class DispatchTrace {
 public:
  void record(DispatchRecord record);
  std::vector<DispatchRecord> records() const;
  void clear();

 private:
  mutable std::mutex mutex_;
  std::vector<DispatchRecord> records_;
};

}  // namespace harness::kernels
