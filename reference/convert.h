// Host-side bf16 / fp16 conversions (round to nearest even), bit for bit what cuda_bf16.h and
// cuda_fp16.h do on the device, without needing those headers. Shared by the reference, tools and
// tests to build inputs and to emulate low-precision arithmetic.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "fa4/attention.h"

namespace fa4::ref {

inline uint32_t f32_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}

inline float bits_f32(uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

// float -> bf16 bits, round to nearest even; NaN stays a (quiet) NaN, overflow goes to +-inf.
inline uint16_t float_to_bf16_bits(float x) {
  const uint32_t u = f32_bits(x);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  const uint32_t rounded = u + 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(rounded >> 16);
}

inline float bf16_bits_to_float(uint16_t b) { return bits_f32(static_cast<uint32_t>(b) << 16); }

// float -> fp16 bits, round to nearest even, with subnormals; overflow goes to +-inf.
inline uint16_t float_to_fp16_bits(float x) {
  const uint32_t u = f32_bits(x);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u | ((a >> 13) & 0x3FFu));  // NaN
  if (a >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // rounds to >= 2^16: inf
  const int exp = static_cast<int>(a >> 23) - 127;                     // unbiased float exponent
  if (exp >= -14) {
    // Normal half: keep 10 mantissa bits, round the 13 dropped ones to nearest even. A carry out
    // of the mantissa correctly bumps the exponent.
    const uint32_t h = ((static_cast<uint32_t>(exp + 15) << 10) | ((a >> 13) & 0x3FFu));
    const uint32_t rest = a & 0x1FFFu;
    const uint32_t up = (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ? 1u : 0u;
    return static_cast<uint16_t>(sign | (h + up));
  }
  if (exp < -25) return sign;  // below half the smallest subnormal (2^-25): rounds to zero
  // Subnormal half: value = m * 2^-24 with m = round(|x| * 2^24). Full significand with the
  // implicit bit, shifted right by the amount that leaves units of 2^-24.
  const uint32_t sig = (a & 0x7FFFFFu) | 0x800000u;  // |x| = sig * 2^(exp - 23)
  const int shift = -exp - 1;                        // (exp - 23) - (-24) = exp + 1 <= -1
  const uint32_t m = sig >> shift;
  const uint32_t rest = sig & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  const uint32_t up = (rest > half || (rest == half && (m & 1u))) ? 1u : 0u;
  return static_cast<uint16_t>(sign | (m + up));  // m + up == 0x400 is the smallest normal: fine
}

inline float fp16_bits_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1Fu;
  const uint32_t m = h & 0x3FFu;
  if (e == 0x1Fu) return bits_f32(sign | 0x7F800000u | (m << 13));  // inf / NaN
  if (e != 0) return bits_f32(sign | ((e + 112u) << 23) | (m << 13));
  const float mag = std::ldexp(static_cast<float>(m), -24);  // zero or subnormal, exact
  return sign ? -mag : mag;
}

inline uint16_t float_to_bits(DType t, float x) {
  return t == DType::kBF16 ? float_to_bf16_bits(x) : float_to_fp16_bits(x);
}

inline float bits_to_float(DType t, uint16_t b) {
  return t == DType::kBF16 ? bf16_bits_to_float(b) : fp16_bits_to_float(b);
}

// x rounded to the dtype (through float: exactly what storing a float to a 16-bit tensor does).
inline float round_to(DType t, float x) { return bits_to_float(t, float_to_bits(t, x)); }

inline std::vector<uint16_t> to_bits(DType t, const std::vector<double>& x) {
  std::vector<uint16_t> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = float_to_bits(t, static_cast<float>(x[i]));
  return out;
}

inline std::vector<double> from_bits(DType t, const std::vector<uint16_t>& b) {
  std::vector<double> out(b.size());
  for (size_t i = 0; i < b.size(); ++i) out[i] = bits_to_float(t, b[i]);
  return out;
}

// Each value rounded to the dtype and back: the numbers a 16-bit tensor actually holds.
inline std::vector<double> rounded(DType t, const std::vector<double>& x) {
  std::vector<double> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = round_to(t, static_cast<float>(x[i]));
  return out;
}

}  // namespace fa4::ref
