// sm90 backward: the gradients of attention, recomputing P from Q, K and the forward's LSE.
//
//   D    = rowsum(dO * O)                                   bwd_delta_kernel (one warp a row)
//   per key block (bwd_dkdv_wgmma.cuh, one CTA), over every query block of 64 that sees it and every
//   query head of its KV head's group:
//     S^T  = K Q^T,  P^T = exp2(S^T * scale * log2 e - LSE * log2 e)       (masked: 0)
//     dP^T = V dO^T, dS^T = P^T * (dP^T - D) * scale
//     dV  += P^T dO,  dK += dS^T Q                                         (fp32 in registers)
//     dQ  += dS K     fp32 reductions into the workspace, converted by bwd_dq_convert_kernel;
//   or, deterministic, dQ by a kernel of its own: one CTA a query block walking its key blocks in
//   order (S and dP computed a second time), so no sum depends on the order CTAs run in
//   (bwd_dq_wgmma.cuh at d64/d128; bwd_dq_kernel here at d256).
//
// This file holds the pieces around the wgmma kernels: D, the dQ conversion, and d256's
// deterministic dQ kernel. That one is warp-level mma.sync (m16n8k16, fp32 accumulate) with every operand in
// shared memory, read as rows or as columns through ldmatrix (.trans); tiles are loaded by
// cp.async, the next key block's while this one computes. Eight warps; a GEMM's 64-row output is
// four warps of 16 rows times two column halves.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_pipeline.h>

#include <cstdint>

#include "common/bwd_params.h"
#include "fa4/numerics/exp2.h"
#include "ptx/mma_sync.h"
#include "ptx/sync.h"

namespace fa4::sm90::bwd {

inline constexpr int kBlock = 64;  // keys of a dK/dV CTA, queries of a step or of a dQ CTA
inline constexpr int kThreads = 256;

// A [kBlock][kCols] tile of 16-bit elements in shared memory. Each row's 16-byte chunks are
// XOR-swizzled by the row's low three bits, so that the eight rows an ldmatrix phase reads, and
// the eight rows a fragment store writes, fall in different banks.
template <int kCols>
struct Tile {
  static_assert(kCols % 64 == 0, "a row must hold a multiple of eight 16-byte chunks");
  static constexpr int kBytes = kBlock * kCols * 2;
  char* ptr;
  __device__ __forceinline__ uint32_t offset(int r, int c) const {
    return uint32_t(r * kCols * 2 + ((((c >> 3) ^ r) & 7) | ((c >> 3) & ~7)) * 16 + (c & 7) * 2);
  }
  __device__ __forceinline__ uint32_t addr(int r, int c) const { return ptx::smem_addr(ptr) + offset(r, c); }
  __device__ __forceinline__ void store2(int r, int c, uint32_t v) const {
    *reinterpret_cast<uint32_t*>(ptr + offset(r, c)) = v;
  }
};

// Rows [0, kBlock) of a [seq, kCols] slice of global memory, starting at `src` with `row_stride`
// elements between rows; rows from `valid` on are zero-filled.
template <int kCols>
__device__ __forceinline__ void load_tile(Tile<kCols> t, const uint16_t* src, int64_t row_stride, int valid) {
  constexpr int kChunks = kCols / 8;
  for (int i = threadIdx.x; i < kBlock * kChunks; i += kThreads) {
    const int r = i / kChunks, c = (i % kChunks) * 8;
    const bool ok = r < valid;
    __pipeline_memcpy_async(t.ptr + t.offset(r, c), ok ? src + r * row_stride + c : src, 16, ok ? 0 : 16);
  }
}

// kBlock floats from `src` (zero past `valid`).
__device__ __forceinline__ void load_row_floats(float* dst, const float* src, int valid) {
  const int r = threadIdx.x;
  if (r < kBlock) __pipeline_memcpy_async(dst + r, r < valid ? src + r : src, 4, r < valid ? 0 : 4);
}

// acc[16 x 8 kN] += A[16 x kK] B[kK x 8 kN] for this warp. A's rows m0.., columns k0.. of a tile
// stored [m][k] (kATrans false) or [k][m] (true); B's columns n0.., rows k0.. of a tile stored
// [n][k] (kBRowsK false) or [k][n] (true).
template <bool kBF16, int kK, int kN, bool kATrans, bool kBRowsK, int kACols, int kBCols>
__device__ __forceinline__ void warp_mma(float (&acc)[kN][4], Tile<kACols> a, int m0, int ak0,
                                         Tile<kBCols> b, int n0, int bk0) {
  static_assert(kN % 2 == 0, "B is loaded two 8-column tiles at a time");
  const int l = threadIdx.x & 31;
#pragma unroll
  for (int k = 0; k < kK; k += 16) {
    uint32_t af[4];
    if constexpr (!kATrans)
      ptx::ldmatrix_x4(af, a.addr(m0 + (l & 15), ak0 + k + (l >> 4) * 8));
    else
      ptx::ldmatrix_x4_trans(af, a.addr(ak0 + k + (l & 7) + (l >> 4) * 8, m0 + ((l >> 3) & 1) * 8));
#pragma unroll
    for (int n = 0; n < kN; n += 2) {
      uint32_t bf[4];
      if constexpr (!kBRowsK)
        ptx::ldmatrix_x4(bf, b.addr(n0 + n * 8 + (l & 7) + (l >> 4) * 8, bk0 + k + ((l >> 3) & 1) * 8));
      else
        ptx::ldmatrix_x4_trans(bf, b.addr(bk0 + k + (l & 15), n0 + n * 8 + (l >> 4) * 8));
      ptx::mma_16816<kBF16>(acc[n], af, bf[0], bf[1]);
      ptx::mma_16816<kBF16>(acc[n + 1], af, bf[2], bf[3]);
    }
  }
}

template <bool kBF16>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (kBF16) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  } else {
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  }
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

template <int kD, bool kBF16>
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
    const uint16_t* o = row0<kD, kBF16>(p.o, p.o_stride, b, h) + i * p.o_stride[1];
    const uint16_t* d = row0<kD, kBF16>(p.dout, p.do_stride, b, h) + i * p.do_stride[1];
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

// ---- deterministic dQ: one query block, its key blocks in order ------------------------------------
template <int kD>
struct DqSmem {
  static constexpr int kTile = Tile<kD>::kBytes, kSquare = Tile<kBlock>::kBytes;
  static constexpr int kQ = 0, kDo = kTile, kK = 2 * kTile, kV = 4 * kTile;  // K, V: two buffers each
  static constexpr int kDs = 6 * kTile, kLse = kDs + kSquare, kDelta = kLse + kBlock * 4;
  static constexpr int kBytes = kDelta + kBlock * 4;
};

template <int kD, bool kBF16>
__global__ void __launch_bounds__(kThreads, kD <= 128 ? 2 : 1) bwd_dq_kernel(const detail::BwdParams p) {
  using L = DqSmem<kD>;
  extern __shared__ __align__(128) char smem[];
  const int m_block = blockIdx.x, h = blockIdx.y, b = blockIdx.z, hk = h / (p.heads_q / p.heads_kv);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int wm = warp & 3, wn = warp >> 2;
  const int q0 = m_block * kBlock, off = p.seqlen_k - p.seqlen_q;
  const Visibility vis{p.seqlen_q, p.seqlen_k, p.window_left, p.window_right};

  // Keys some row of the block sees: [k_lo, k_hi).
  const int last_q = min(q0 + kBlock, p.seqlen_q) - 1;
  const int k_lo = p.window_left >= 0 ? max(0, q0 + off - p.window_left) : 0;
  const int k_hi = p.window_right >= 0 ? min(p.seqlen_k, last_q + off + p.window_right + 1) : p.seqlen_k;
  const int n_lo = k_lo / kBlock, steps = k_hi > k_lo ? (k_hi - 1) / kBlock + 1 - n_lo : 0;

  const Tile<kD> sQ{smem + L::kQ}, sDo{smem + L::kDo};
  const Tile<kBlock> sDs{smem + L::kDs};
  auto sK = [&](int buf) { return Tile<kD>{smem + L::kK + buf * L::kTile}; };
  auto sV = [&](int buf) { return Tile<kD>{smem + L::kV + buf * L::kTile}; };
  float* sLse = reinterpret_cast<float*>(smem + L::kLse);
  float* sDelta = reinterpret_cast<float*>(smem + L::kDelta);

  const int valid = p.seqlen_q - q0;
  load_tile(sQ, row0<kD, kBF16>(p.q, p.q_stride, b, h) + q0 * p.q_stride[1], p.q_stride[1], valid);
  load_tile(sDo, row0<kD, kBF16>(p.dout, p.do_stride, b, h) + q0 * p.do_stride[1], p.do_stride[1], valid);
  load_row_floats(sLse, p.lse + (int64_t(b) * p.heads_q + h) * p.seqlen_q + q0, valid);
  load_row_floats(sDelta, p.delta + (int64_t(b) * p.heads_q + h) * p.rows + q0, valid);
  __pipeline_commit();
  auto load_step = [&](int s) {
    const int k0 = (n_lo + s) * kBlock, buf = s & 1;
    load_tile(sK(buf), row0<kD, kBF16>(p.k, p.k_stride, b, hk) + k0 * p.k_stride[1], p.k_stride[1], p.seqlen_k - k0);
    load_tile(sV(buf), row0<kD, kBF16>(p.v, p.v_stride, b, hk) + k0 * p.v_stride[1], p.v_stride[1], p.seqlen_k - k0);
  };
  if (steps > 0) load_step(0);
  __pipeline_commit();

  float acc[kD / 16][4] = {};
  for (int s = 0; s < steps; ++s) {
    const int k0 = (n_lo + s) * kBlock, buf = s & 1;
    if (s + 1 < steps) load_step(s + 1);
    __pipeline_commit();
    __pipeline_wait_prior(1);
    __syncthreads();

    // S and dP: this warp's 16 queries x 32 keys.
    float sc[4][4] = {}, dp[4][4] = {};
    warp_mma<kBF16, kD, 4, false, false>(sc, sQ, wm * 16, 0, sK(buf), wn * 32, 0);
    warp_mma<kBF16, kD, 4, false, false>(dp, sDo, wm * 16, 0, sV(buf), wn * 32, 0);
    const bool whole = vis.whole(q0, kBlock, k0, kBlock);
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      const int qr = wm * 16 + g + 8 * hr;
      const float l = lse_log2(sLse[qr]), d = sDelta[qr];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int kc = wn * 32 + j * 8 + 2 * t;
        float p0 = numerics::exp2_mufu(fmaf(sc[j][2 * hr], p.scale_log2, -l)),
              p1 = numerics::exp2_mufu(fmaf(sc[j][2 * hr + 1], p.scale_log2, -l));
        if (!whole) {
          if (!vis(q0 + qr, k0 + kc)) p0 = 0.0f;
          if (!vis(q0 + qr, k0 + kc + 1)) p1 = 0.0f;
        }
        sDs.store2(qr, kc, pack2<kBF16>(p0 * (dp[j][2 * hr] - d) * p.scale, p1 * (dp[j][2 * hr + 1] - d) * p.scale));
      }
    }
    __syncthreads();
    // dQ += dS K: this warp's 16 queries x kD / 2 columns.
    warp_mma<kBF16, kBlock, kD / 16, false, true>(acc, sDs, wm * 16, 0, sK(buf), wn * (kD / 2), 0);
    __syncthreads();
  }

  uint16_t* dq = static_cast<uint16_t*>(p.dq) + b * p.dq_stride[0] + h * p.dq_stride[2];
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    const int q = q0 + wm * 16 + g + 8 * hr;
    if (q >= p.seqlen_q) continue;
#pragma unroll
    for (int j = 0; j < kD / 16; ++j) {
      const int c = wn * (kD / 2) + j * 8 + 2 * t;
      *reinterpret_cast<uint32_t*>(dq + q * p.dq_stride[1] + c) = pack2<kBF16>(acc[j][2 * hr], acc[j][2 * hr + 1]);
    }
  }
}

}  // namespace fa4::sm90::bwd
