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

// One block: takes each row's max, decides the rescale, exponentiates S in place (2^(s * scale -
// max), scores in log2 units) and adds the row sums. corr gets each row's factor for O.
template <int kBlockN, int kPolyEvery>
__device__ __forceinline__ void softmax_step(float (&s)[kBlockN / 2], numerics::RowState (&rows)[2],
                                             float scale_log2, float threshold, float (&corr)[2]) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    // Four partial maxima and sums: short dependency chains instead of one of kBlockN / 4.
    float mx4[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < kBlockN / 8; ++j) mx4[j % 4] = fmaxf(mx4[j % 4], fmaxf(s[4 * j + 2 * i], s[4 * j + 2 * i + 1]));
    float mx = fmaxf(fmaxf(mx4[0], mx4[1]), fmaxf(mx4[2], mx4[3]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 2));
    const numerics::RescaleStep step = numerics::rescale_step(rows[i].max, mx * scale_log2, threshold);
    rows[i].max = step.max;
    corr[i] = step.correction;
    const float offset = numerics::exp_offset(step.max);
    float sum4[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int j = 0; j < kBlockN / 8; ++j) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const float x = fmaf(s[4 * j + 2 * i + c], scale_log2, -offset);
        float e;
        if constexpr (kPolyEvery > 0) {
          e = (j % kPolyEvery == kPolyEvery - 1) ? numerics::exp2_poly(x) : numerics::exp2_mufu(x);
        } else {
          e = numerics::exp2_mufu(x);
        }
        s[4 * j + 2 * i + c] = e;
        sum4[j % 4] += e;
      }
    }
    rows[i].sum = rows[i].sum * step.correction + ((sum4[0] + sum4[1]) + (sum4[2] + sum4[3]));
  }
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
