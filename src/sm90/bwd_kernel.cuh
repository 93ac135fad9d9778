// sm90 backward: the gradients of attention, recomputing P from Q, K and the forward's LSE.
//
//   D    = rowsum(dO * O)                                   bwd_delta_kernel (one warp a row)
//   per key block (bwd_dkdv_wgmma.cuh, one CTA), over every query block of 64 that sees it and every
//   query head of its KV head's group:
//     S^T  = K Q^T,  P^T = exp2(S^T * scale * log2 e - LSE * log2 e)       (masked: 0)
//     dP^T = V dO^T, dS^T = P^T * (dP^T - D) * scale
//     dV  += P^T dO,  dK += dS^T Q                                         (fp32 in registers)
//     dQ  += dS K     fp32 reductions into the workspace, converted by bwd_dq_convert_kernel;
//   or, deterministic, dQ by a kernel of its own (bwd_dq_wgmma.cuh): one CTA a block of query rows
//   walking its key blocks in order (S and dP computed a second time), so no sum depends on the
//   order CTAs run in.
//
// This file holds what the kernels share (sizes, masks, packing, the workspace's layout) and the
// two small kernels around them: D and the dQ conversion.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_pipeline.h>

#include <cstdint>

#include "common/bwd_params.h"
#include "fa4/numerics/exp2.h"
#include "ptx/sync.h"
#include "sm90/softmax.cuh"  // pack2

namespace fa4::sm90::bwd {

inline constexpr int kBlock = 64;  // query rows of a dK/dV step (and keys of a d256 dK/dV CTA)
inline constexpr int kThreads = 256;

// kBlock floats from `src` (zero past `valid`).
__device__ __forceinline__ void load_row_floats(float* dst, const float* src, int valid) {
  const int r = threadIdx.x;
  if (r < kBlock) __pipeline_memcpy_async(dst + r, r < valid ? src + r : src, 4, r < valid ? 0 : 4);
}

template <bool kBF16>
__device__ __forceinline__ float to_float(uint16_t bits) {
  if constexpr (kBF16) return __uint_as_float(uint32_t(bits) << 16);
  else return __half2float(__ushort_as_half(bits));
}

// Which (query, key) pairs count. Query i sees keys [i + off - left, i + off + right].
struct Visibility {
  int seqlen_q, seqlen_k, left, right;
  __device__ __forceinline__ bool operator()(int q, int key) const {
    const int d = key - q - (seqlen_k - seqlen_q);
    return q < seqlen_q && key < seqlen_k && (right < 0 || d <= right) && (left < 0 || d >= -left);
  }
  // Every pair of query rows [q0, q0 + rows) and keys [k0, k0 + keys) counts (the corners decide:
  // the first row's last key and the last row's first key).
  __device__ __forceinline__ bool whole(int q0, int rows, int k0, int keys) const {
    return (*this)(q0, k0 + keys - 1) && (*this)(q0 + rows - 1, k0);
  }
};

// The query blocks of kBlock rows that see a key of [k0, k0 + keys): [lo, lo + count).
struct QueryBlocks {
  int lo, count;
};
__device__ __forceinline__ QueryBlocks query_blocks(const detail::BwdParams& p, int k0, int keys) {
  const int off = p.seqlen_k - p.seqlen_q, last_key = min(k0 + keys, p.seqlen_k) - 1;
  const int q_lo = p.window_right >= 0 ? max(0, k0 - off - p.window_right) : 0;
  const int q_hi = p.window_left >= 0 ? min(p.seqlen_q, last_key - off + p.window_left + 1) : p.seqlen_q;
  const int lo = q_lo / kBlock;
  return {lo, q_hi > q_lo ? (q_hi - 1) / kBlock + 1 - lo : 0};
}

// The fp32 dQ accumulator of (batch b, query head h): [head_dim / 64][rows][64], so that 64
// query rows of 64 columns are one contiguous 16 KB piece (a bulk reduction's unit, bwd_dkdv_wgmma.cuh).
template <int kD>
__device__ __forceinline__ float* dq_accum_at(const detail::BwdParams& p, int b, int h, int q, int col) {
  return p.dq_accum + ((int64_t(b) * p.heads_q + h) * (kD / 64) + col / 64) * p.rows * 64 + int64_t(q) * 64 + col % 64;
}

// The forward's LSE in log2 units; a row that saw no key (LSE = -inf) gives +inf, so exp2 of
// (score - it) is 0 rather than inf.
__device__ __forceinline__ float lse_log2(float lse) {
  return lse == -INFINITY ? INFINITY : lse * 1.4426950408889634f;
}

// Row 0 of (batch b, head h) of a [batch, seq, head, dim] tensor of 16-bit elements.
__device__ __forceinline__ const uint16_t* row0(const void* base, const int64_t (&stride)[3], int b, int h) {
  return static_cast<const uint16_t*>(base) + b * stride[0] + h * stride[2];
}

// ---- D = rowsum(dO * O), one warp a row; rows past seqlen_q get 0 -------------------------------
template <int kD, bool kBF16>
__global__ void __launch_bounds__(kThreads) bwd_delta_kernel(const detail::BwdParams p) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int i = blockIdx.x * (kThreads / 32) + warp, h = blockIdx.y, b = blockIdx.z;
  if (i >= p.rows) return;
  float sum = 0.0f;
  if (i < p.seqlen_q) {
    const uint16_t* o = row0(p.o, p.o_stride, b, h) + i * p.o_stride[1];
    const uint16_t* d = row0(p.dout, p.do_stride, b, h) + i * p.do_stride[1];
    for (int c = lane * 8; c < kD; c += 32 * 8) {
      const uint4 ov = *reinterpret_cast<const uint4*>(o + c), dv = *reinterpret_cast<const uint4*>(d + c);
      const uint16_t* oe = reinterpret_cast<const uint16_t*>(&ov);
      const uint16_t* de = reinterpret_cast<const uint16_t*>(&dv);
#pragma unroll
      for (int e = 0; e < 8; ++e) sum += to_float<kBF16>(oe[e]) * to_float<kBF16>(de[e]);
    }
  }
#pragma unroll
  for (int s = 16; s > 0; s >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, s);
  if (lane == 0) p.delta[(int64_t(b) * p.heads_q + h) * p.rows + i] = sum;
}

// ---- dQ from the fp32 accumulator ------------------------------------------------------------------
template <int kD, bool kBF16>
__global__ void __launch_bounds__(kThreads) bwd_dq_convert_kernel(const detail::BwdParams p) {
  const int64_t idx = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  const int h = blockIdx.y, b = blockIdx.z;
  if (idx >= int64_t(p.seqlen_q) * (kD / 8)) return;
  const int i = int(idx / (kD / 8)), c = int(idx % (kD / 8)) * 8;
  const float* acc = dq_accum_at<kD>(p, b, h, i, c);
  const float4 a = *reinterpret_cast<const float4*>(acc), e = *reinterpret_cast<const float4*>(acc + 4);
  const uint4 v{pack2<kBF16>(a.x, a.y), pack2<kBF16>(a.z, a.w), pack2<kBF16>(e.x, e.y), pack2<kBF16>(e.z, e.w)};
  uint16_t* dq = static_cast<uint16_t*>(p.dq) + b * p.dq_stride[0] + i * p.dq_stride[1] + h * p.dq_stride[2] + c;
  *reinterpret_cast<uint4*>(dq) = v;
}

}  // namespace fa4::sm90::bwd
