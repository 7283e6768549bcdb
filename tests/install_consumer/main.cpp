// The fused CPU attention on a DFlash mask through the installed headers and library: forward and
// the three gradients against the dense reference. Exit 0 only when they agree.
#include <torch/torch.h>

#include <cstdio>

#include "kernels/attention.h"
#include "kernels/mask_desc.h"

namespace hk = harness::kernels;

int main() {
  hk::AttentionGeometry geometry;
  geometry.heads = 4;
  geometry.kv_heads = 2;
  geometry.head_dim = 32;
  geometry.anchors = 4;
  geometry.block_size = 8;
  geometry.context = 96;
  hk::MaskDesc desc;
  desc.kind = hk::MaskKind::dflash;
  desc.documents = 2;
  desc.seed = 7;
  hk::MaskContext mask(hk::resolve_mask(desc, geometry));

  torch::manual_seed(0);
  const auto options = torch::dtype(torch::kFloat32).requires_grad(true);
  auto q = torch::randn({1, geometry.heads, geometry.q_len(), geometry.head_dim}, options);
  auto k = torch::randn({1, geometry.kv_heads, geometry.kv_len(), geometry.head_dim}, options);
  auto v = torch::randn({1, geometry.kv_heads, geometry.kv_len(), geometry.head_dim}, options);
  auto grad = torch::randn({1, geometry.heads, geometry.q_len(), geometry.head_dim}, torch::kFloat32);

  auto run = [&](hk::AttentionImpl impl) {
    hk::AttentionOptions attention_options;
    attention_options.impl = impl;
    auto out = hk::attention(q, k, v, mask, attention_options);
    auto grads = torch::autograd::grad({out}, {q, k, v}, {grad});
    return std::vector<torch::Tensor>{out.detach(), grads[0], grads[1], grads[2]};
  };
  const auto fused = run(hk::AttentionImpl::fused);
  const auto dense = run(hk::AttentionImpl::dense);
  const char* names[] = {"out", "dq", "dk", "dv"};
  bool ok = true;
  for (size_t i = 0; i < fused.size(); ++i) {
    const double error = (fused[i] - dense[i]).abs().max().item<double>();
    std::printf("%s: max |fused - dense| = %.3g\n", names[i], error);
    ok = ok && error < 1e-5;  // both accumulate in fp32
  }
  std::printf("harness kernels from an installed prefix: %s\n", ok ? "ok" : "MISMATCH");
  return ok ? 0 : 1;
}
