#pragma once
// exp for fp32 as plain arithmetic the compiler vectorizes (no library call, no branch), for the
// CPU fused attention's tiles (kernels/fused_cpu.cpp says why not Tensor::exp_()).
//   x = n ln2 + r, |r| <= ln2/2, with ln2 in two parts (Cody-Waite) so r is exact to ~1 ulp;
//   exp(r) by its Taylor polynomial to degree 7 (truncation 4e-9 relative); 2^n built in the
//   exponent bits, as 2^(n/2) * 2^(n - n/2) so that n = 128 still gives a finite result.
// Max error against exp in double over [-87.3, 88.7]: 1.20 ulp (tests/test_attention_cpu.cpp measures
// it over every 61st float and requires <= 2).
// Below -87.33 (where exp leaves the normal floats) it returns 0, -inf included; above 88.72 +inf;
// NaN stays NaN.

#include <bit>
#include <cstdint>

namespace harness::kernels {

inline float exp_f32(float x) {
  constexpr float kLow = -87.33654f;  // log(FLT_MIN)
  constexpr float kHigh = 88.72283f;  // log(FLT_MAX)
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f;  // ln2 = kLn2Hi + kLn2Lo, kLn2Hi with 9 significant bits
  constexpr float kLn2Lo = -2.12194440e-4f;
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding and subtracting it rounds to an integer
  // NaN compares false: it takes kLow here (no undefined float-to-int conversion) and is put back below.
  const float xc = x > kLow ? (x < kHigh ? x : kHigh) : kLow;
  const float n = (xc * kLog2e + kRound) - kRound;
  const float r = (xc - n * kLn2Hi) - n * kLn2Lo;
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const auto ni = static_cast<int32_t>(n);
  const int32_t half = ni / 2;
  const float scale_a = std::bit_cast<float>((half + 127) << 23);
  const float scale_b = std::bit_cast<float>((ni - half + 127) << 23);
  const float result = p * scale_a * scale_b;
  return x != x ? x : (x < kLow ? 0.0f : (x > kHigh ? __builtin_inff() : result));
}

}  // namespace harness::kernels
