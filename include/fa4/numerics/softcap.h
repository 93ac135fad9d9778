// Soft-capping of a score, cap * tanh(x), with its slope 1 - tanh(x)^2, shared by host and device.
//
// tanh|x| = (1 - e) / (1 + e) = 2 r - 1 with e = e^(-2|x|) in [0, 1] and r = 1 / (1 + e) in
// [1/2, 1]. The caller brings e (the device from MUFU's 2^x, the host from std::exp2); r comes
// from FMAs alone, so a capped score costs one MUFU op, not two (a hardware reciprocal besides the
// 2^x): the cap's MUFU work is what bounds the capped forward (docs/perf-notes.md, "A cheaper
// soft cap"). The slope 1 - t^2 = (1 - t)(1 + t) = 4 e r^2 keeps its relative accuracy where tanh
// nears +-1, where 1 - t^2 would cancel. Negative exponents only: no overflow and no clamp; x = inf
// gives e = 0 and t = 1, a NaN stays NaN.
#pragma once

#include <cmath>

#include "fa4/numerics/exp2.h"

namespace fa4::numerics {

// 1 / (1 + e) for e in [0, 1]: Chebyshev's cubic T3 on d = 1 + e in [1, 2] gives the quadratic
// start q(d) = (210 - 144 d + 32 d^2) / 99 with relative error at most 1 / |T3(-3)| = 1 / 99;
// written in e, (98 - 80 e + 32 e^2) / 99. Two Newton steps r <- r + r (1 - d r) square the error
// twice: 1.0e-4, then 1.1e-8, under fp32's rounding. Measured on the host over every e of a
// fine grid (tests/test_numerics.cpp, Softcap.*): the result within 2 ulps of 1 / (1 + e).
inline constexpr float kRecipC0 = 98.0f / 99.0f;
inline constexpr float kRecipC1 = -80.0f / 99.0f;
inline constexpr float kRecipC2 = 32.0f / 99.0f;

FA4_HD float recip_one_plus(float e) {
  const float d = 1.0f + e;
  float r = fma_f32(fma_f32(kRecipC2, e, kRecipC1), e, kRecipC0);
  r = fma_f32(r, fma_f32(-d, r, 1.0f), r);
  return fma_f32(r, fma_f32(-d, r, 1.0f), r);
}

struct CappedScore {
  float score, slope;
};

// cap * tanh(x) and 1 - tanh(x)^2 from x (its sign) and e = e^(-2|x|).
FA4_HD CappedScore softcap_from_exp(float x, float e, float cap) {
  const float r = recip_one_plus(e);
  const float t = fma_f32(2.0f * cap, r, -cap);  // cap * tanh|x|
#if defined(__CUDA_ARCH__)
  return {copysignf(t, x), 4.0f * e * (r * r)};
#else
  return {std::copysign(t, x), 4.0f * e * (r * r)};
#endif
}

// 2 log2(e) k: the factor that turns a score s into -2|x| log2(e) for x = s k (k > 0), the input
// of 2^x that gives e.
FA4_HD float softcap_two_log2e(float k) { return 2.8853900817779268f * k; }

}  // namespace fa4::numerics
