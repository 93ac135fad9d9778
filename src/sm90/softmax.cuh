// Online softmax on a consumer's register tile of S (64 rows x kBlockN, wgmma accumulator layout:
// each thread holds two rows, r and r + 8, and in 8-column chunk j the pairs s[4j..4j+1] of row r
// and s[4j+2..4j+3] of row r + 8; the four threads of a quad share a row).
//
// FlashAttention-4's two numerics ideas live here: conditional rescaling (the row max moves only
// when a block's max exceeds it by more than the threshold; numerics/online_softmax.h) and the
// software exp2 (every kPolyEvery-th chunk on the FMA pipe; numerics/exp2.h).
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "fa4/numerics/online_softmax.h"
#include "fa4/numerics/softcap.h"

namespace fa4::sm90 {

template <bool kBF16>
__device__ __forceinline__ uint32_t pack2(float a, float b) {
  if constexpr (kBF16) {
    __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<uint32_t*>(&v);
  } else {
    __half2 v = __floats2half2_rn(a, b);
    return *reinterpret_cast<uint32_t*>(&v);
  }
}

// 2^x for an element of 8-column chunk j: on the FMA pipe (polynomial) for every kPolyEvery-th
// chunk, on MUFU otherwise (kPolyEvery = 0: always MUFU).
template <int kPolyEvery>
__device__ __forceinline__ float exp2_share(int j, float x) {
  if constexpr (kPolyEvery > 0) {
    if (j % kPolyEvery == kPolyEvery - 1) return numerics::exp2_poly(x);
  }
  return numerics::exp2_mufu(x);
}

// Soft-capping of one score: s -> cap * tanh(s * in), in = scale / cap (Problem::softcap), with
// the slope 1 - tanh^2 that the backward's dS takes (d(cap tanh(x)) / dx; the scale apart): about
// 2e-7 (FMA reciprocal, measured on the host) or 1e-6 (MUFU's) absolute in tanh, where
// tanh.approx's 2^-11 relative error would move a score near the cap by cap / 2048; the slope as
// 4 e r^2 (= (1 - t)(1 + t)) keeps its relative accuracy where tanh nears +-1, where 1 - t^2 would
// cancel.
//  - kFmaRecip: e = e^(-2|x|) by MUFU's 2^x and r = 1 / (1 + e) on the FMA pipe
//    (numerics/softcap.h): one MUFU op a score, six FMAs more, and s live until its sign is put
//    back (the kernels at the edge of their registers spill with it: d256's forward, d128's dK/dV).
//  - otherwise tanh(x) = 1 - 2 r, r = 1 / (e + 1), e = e^2x, from MUFU's 2^x and reciprocal, the
//    exponent clamped (tanh(15) is 1 in fp32) so that the reciprocal never sees infinity.
// two_log2e_in = softcap_two_log2e(in).
using numerics::CappedScore;
using numerics::softcap_two_log2e;
template <bool kFmaRecip>
__device__ __forceinline__ CappedScore softcap_score(float s, float cap, float two_log2e_in) {
  if constexpr (kFmaRecip) {
    return numerics::softcap_from_exp(s, numerics::exp2_mufu(-fabsf(s) * two_log2e_in), cap);
  } else {
    const float e = numerics::exp2_mufu(fminf(s * two_log2e_in, 43.0f));
    float r;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(e + 1.0f));
    return {fmaf(-2.0f * cap, r, cap), 4.0f * e * (r * r)};
  }
}

// A tile of S capped before its mask and softmax (the softmax then scales by log2(e) alone).
template <bool kFmaRecip, int kN>
__device__ __forceinline__ void softcap_scores(float (&s)[kN], float cap, float in) {
  const float two_log2e_in = softcap_two_log2e(in);
#pragma unroll
  for (int i = 0; i < kN; ++i) s[i] = softcap_score<kFmaRecip>(s[i], cap, two_log2e_in).score;
}

// The max over the four threads of a quad (they hold one row between them).
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffff, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffff, x, 2));
}

// Row i of S exponentiated in place against `offset` (2^(s * scale - offset), scores in log2
// units); returns its sum, taken in four partial chains (short dependency chains instead of one of
// kBlockN / 4). kClampPoly: the inputs of the polynomial's share are clamped below 128, the end of
// its domain (numerics/exp2.h), for callers whose inputs are not bounded by a threshold; a score far
// above the offset (or a NaN, which fminf drops) then still gives 2^127.
template <int kBlockN, int kPolyEvery, bool kClampPoly = false>
__device__ __forceinline__ float exp_row(float (&s)[kBlockN / 2], int i, float scale_log2, float offset) {
  float sum4[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
  for (int j = 0; j < kBlockN / 8; ++j) {
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const float x = fmaf(s[4 * j + 2 * i + c], scale_log2, -offset);
      const bool poly = kPolyEvery > 0 && j % (kPolyEvery > 0 ? kPolyEvery : 1) == kPolyEvery - 1;
      const float e = exp2_share<kPolyEvery>(j, kClampPoly && poly ? fminf(x, 127.0f) : x);
      s[4 * j + 2 * i + c] = e;
      sum4[j % 4] += e;
    }
  }
  return (sum4[0] + sum4[1]) + (sum4[2] + sum4[3]);
}

// One block: takes each row's max, decides the rescale, exponentiates S in place (2^(s * scale -
// max), scores in log2 units) and adds the row sums (unless kSums is false: the caller takes them
// elsewhere). corr gets each row's factor for O.
template <int kBlockN, int kPolyEvery, bool kSums = true>
__device__ __forceinline__ void softmax_step(float (&s)[kBlockN / 2], numerics::RowState (&rows)[2],
                                             float scale_log2, float threshold, float (&corr)[2]) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    // The row max as a balanced tree (depth log2(kBlockN / 4)), not a chain.
    constexpr int kPairs = kBlockN / 8;
    float mt[kPairs];
#pragma unroll
    for (int j = 0; j < kPairs; ++j) mt[j] = fmaxf(s[4 * j + 2 * i], s[4 * j + 2 * i + 1]);
#pragma unroll
    for (int w = 1; w < kPairs; w *= 2)
#pragma unroll
      for (int j = 0; j + w < kPairs; j += 2 * w) mt[j] = fmaxf(mt[j], mt[j + w]);
    const float mx = quad_max(mt[0]);
    const numerics::RescaleStep step = numerics::rescale_step(rows[i].max, mx * scale_log2, threshold);
    rows[i].max = step.max;
    corr[i] = step.correction;
    const float sum = exp_row<kBlockN, kPolyEvery>(s, i, scale_log2, numerics::exp_offset(step.max));
    if constexpr (kSums) rows[i].sum = rows[i].sum * step.correction + sum;
  }
}

// The largest partial row sum softmax_step_no_max accepts: 2^15, so every exponential it lets
// through fits fp16 P (largest finite 65504) as well as bf16.
inline constexpr float kNoMaxSumLimit = 32768.0f;
static_assert(kNoMaxSumLimit < 65504.0f, "every P the row-max-free step lets through must fit fp16");

// The step without the block's row max: exponentials against the running max as it stands, and
// the row sums. Each thread's partial sum of a row bounds every one of its exponentials, so when
// both partial sums are at most `limit` no element exceeded it, and the max may stay: the values
// are exact against it for the reason conditional rescaling's are (O / l divides by a sum taken
// against the same max), with the bound on P at 2^15 instead of 2^threshold. Returns false
// otherwise (a score far above the running max, a row still at -inf, which makes every
// exponential +inf, or a NaN): S is gone then, and the caller computes it again and runs
// softmax_step. bsum gets the partial sums, for the caller to add once its warpgroup agrees.
//
// Why it pays: the max (a compare per element, a tree, two shuffles, the rescale decision) stood
// between S landing and the first exponential; here the exp unit starts at once, and the
// instructions a step issues fall by about a sixth at d64 (SASS: ~515 to ~425 a step).
template <int kBlockN, int kPolyEvery>
__device__ __forceinline__ bool softmax_step_no_max(float (&s)[kBlockN / 2], float (&bsum)[2],
                                                    const numerics::RowState (&rows)[2], float scale_log2,
                                                    float limit) {
  // The raw max as the offset (not exp_offset): a row still at -inf gives +inf, which fails the
  // check. The polynomial's inputs are clamped, so a score far above the max fails it too.
#pragma unroll
  for (int i = 0; i < 2; ++i) bsum[i] = exp_row<kBlockN, kPolyEvery, true>(s, i, scale_log2, rows[i].max);
  return bsum[0] <= limit && bsum[1] <= limit;
}

// P as packed 16-bit pairs in the A-operand layout of the P V wgmma, which for k16 chunks is the
// accumulator layout of S: consecutive pairs.
template <bool kBF16, int kN>
__device__ __forceinline__ void pack_p(const float (&s)[kN], uint32_t (&pv)[kN / 2]) {
#pragma unroll
  for (int i = 0; i < kN / 2; ++i) pv[i] = pack2<kBF16>(s[2 * i], s[2 * i + 1]);
}

// O's rows times their correction factors; skipped when no row of the warp moved its max (the
// common case with conditional rescaling).
template <int kN>
__device__ __forceinline__ void rescale_o(float (&o)[kN], const float (&corr)[2]) {
  if (!__any_sync(0xffffffff, corr[0] != 1.0f || corr[1] != 1.0f)) return;
#pragma unroll
  for (int j = 0; j < kN / 4; ++j) {
    o[4 * j + 0] *= corr[0];
    o[4 * j + 1] *= corr[0];
    o[4 * j + 2] *= corr[1];
    o[4 * j + 3] *= corr[1];
  }
}

}  // namespace fa4::sm90
