// Software exp2 on the FMA pipe (FlashAttention-4's method), shared by host and device.
//
// 2^x = 2^j * 2^f with j = floor(x), f = x - j in [0, 1). 2^f comes from a degree-3 polynomial in
// Horner form; 2^j is added straight into the exponent bits. floor is one add in round-toward-
// minus-infinity mode of 1.5 * 2^23 (FRND is slow on Hopper), the same on host and device so the
// two agree bit for bit.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define FA4_HD __host__ __device__ __forceinline__
#else
#define FA4_HD inline
#endif

namespace fa4::numerics {

// Coefficients of p(f) ~ 2^f on [0, 1) (FlashAttention-4's). p(0) = 1 is pinned: it makes the
// result exact at integers and the clamp below land on exactly +0. Measured (tests/
// test_numerics.cpp): max relative error of exp2_poly where the result is a normal float
// 8.77e-5 = 2^-13.48, 2^4.5 below bf16's rounding (2^-9). The relative-error minimax with p(0) = 1
// (four-point Remez; level 8.559e-5) is c1 = 0.6951167583465576171875, c2 =
// 0.22764499485492706298828125, c3 = 0.077067039906978607177734375: 8.57e-5 = 2^-13.51 measured
// in fp32, only 2.3 % lower, so FA4's are kept. (Dropping p(0) = 1 would reach 7.48e-5 but lose
// exactness at integers and the exact zero for -inf.)
inline constexpr float kExp2C0 = 1.0f;
inline constexpr float kExp2C1 = 0.695146143436431884765625f;
inline constexpr float kExp2C2 = 0.227564394474029541015625f;
inline constexpr float kExp2C3 = 0.077119089663028717041015625f;
// Inputs below this are clamped. At -127 the result is exactly +0 (so 2^-inf = 0 for masked
// scores); in [-127, -126) it is a subnormal (p(f) - 1) * 2^-126, below 2^-126 but not 2^x.
inline constexpr float kExp2MinInput = -127.0f;
// 1.5 * 2^23: adding it rounds a float in [-2^22, 2^22] to an integer held in the low mantissa bits.
inline constexpr float kRoundMagic = 12582912.0f;

FA4_HD uint32_t float_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
#endif
}

FA4_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, 4);
  return x;
#endif
}

FA4_HD float fma_f32(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

// x + kRoundMagic rounded toward minus infinity; its low bits hold floor(x) as an integer.
FA4_HD float add_round_down(float x) {
#if defined(__CUDA_ARCH__)
  return __fadd_rd(x, kRoundMagic);
#else
  // Host: emulate round-toward-minus-infinity for this add. The exact sum x + 1.5*2^23 of a float
  // x in [-128, 1) is x + M; the float result rounds it down to an integer.
  const float r = x + kRoundMagic;  // round to nearest
  return (r - kRoundMagic > x) ? r - 1.0f : r;
#endif
}

// Software 2^x. Exact agreement between host and device (same operation order, FMA on both),
// measured bit for bit on an H200 over 16.9 million inputs in [-130, 1] (tests/
// test_numerics_gpu.cu). Domain: x < 128, not NaN; the softmax uses x <= threshold (8). A NaN
// input stays NaN on the host, but on the device the canonical NaN's bits reach the exponent add
// and the result is 0x7F7FFFFF (FLT_MAX): keep NaN out.
FA4_HD float exp2_poly(float x) {
  x = x < kExp2MinInput ? kExp2MinInput : x;  // also maps -inf to the clamp
  const float jr = add_round_down(x);
  const float j = jr - kRoundMagic;  // floor(x), exact
  // In [0, 1), exact, except for x in (-1/2, 0): there x + 1 rounds (by <= 2^-25) and reaches 1
  // when |x| < 2^-25; p(1) < 2, so the result stays within the polynomial's error.
  const float f = x - j;
  float p = fma_f32(kExp2C3, f, kExp2C2);
  p = fma_f32(p, f, kExp2C1);
  p = fma_f32(p, f, kExp2C0);
  // jr's low 23 mantissa bits hold j + 2^22 (two's complement for j < 0); shift into the exponent.
  const uint32_t jbits = float_bits(jr) << 23;
  return bits_float(float_bits(p) + jbits);
}

// Hardware 2^x on the device (MUFU.EX2, flush-to-zero), the library's exp2 on the host.
FA4_HD float exp2_mufu(float x) {
#if defined(__CUDA_ARCH__)
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  return std::exp2(x);
#endif
}

}  // namespace fa4::numerics
