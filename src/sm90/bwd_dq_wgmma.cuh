// sm90 backward, deterministic dQ on wgmma: one CTA a block of 128 query rows (64 a warpgroup),
// walking its key blocks in order, so that each dQ element is one CTA's sum in a fixed order. Per
// key block, in the forward's frame:
//
//   S  = Q K^T,  dP = dO V^T           (wgmma SS, K-major both)
//   P, dS = P (dP - D) scale            (registers: the accumulator layout is the A operand's)
//   dQ += dS K                          (wgmma RS, K MN-major)
//
// Key blocks are 64 keys at d64/d128 and 32 at d256 (where 128 rows of Q and dO take 128 KB); K and
// V are loaded by cp.async into two buffers each, the next block's while this one computes.
#pragma once

#include "fa4/numerics/exp2.h"
#include "ptx/wgmma.h"
#include "sm90/bwd_dkdv_wgmma.cuh"

namespace fa4::sm90::bwd {

inline constexpr int kDqRows = 128;  // query rows a CTA, 64 a warpgroup
template <int kD>
inline constexpr int kDqKeys = kD == 256 ? 32 : 64;  // keys a step

template <int kD>
struct DqWgSmem {
  static constexpr int kQBytes = kDqRows * kD * 2, kKVBytes = kDqKeys<kD> * kD * 2;
  static constexpr int kQ = 0, kDo = kQBytes, kK = 2 * kQBytes, kV = kK + 2 * kKVBytes;  // K, V: two buffers
  static constexpr int kLse = kV + 2 * kKVBytes, kDelta = kLse + kDqRows * 4;
  static constexpr int kBytes = kDelta + kDqRows * 4 + 1024;
  static_assert(kBytes <= 227 * 1024, "the wgmma dQ kernel's shared memory");
};

template <int kD, bool kBF16>
__global__ void __launch_bounds__(kThreads, 1) bwd_dq_wgmma_kernel(const detail::BwdParams p) {
  namespace wgmma = ptx::wgmma;
  using L = DqWgSmem<kD>;
  constexpr int kKeys = kDqKeys<kD>;
  constexpr auto kType = kBF16 ? wgmma::Type::kBF16 : wgmma::Type::kF16;
  char* smem = smem_1024();
  const int q0 = blockIdx.x * kDqRows, h = blockIdx.y, b = blockIdx.z, hk = h / (p.heads_q / p.heads_kv);
  const int wg = threadIdx.x / 128, tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;
  const Visibility vis{p.seqlen_q, p.seqlen_k, p.window_left, p.window_right};

  // Keys some row of the block sees: [k_lo, k_hi), in blocks of kKeys.
  const int off = p.seqlen_k - p.seqlen_q, last_q = min(q0 + kDqRows, p.seqlen_q) - 1;
  const int k_lo = p.window_left >= 0 ? max(0, q0 + off - p.window_left) : 0;
  const int k_hi = p.window_right >= 0 ? min(p.seqlen_k, last_q + off + p.window_right + 1) : p.seqlen_k;
  const int n_lo = k_lo / kKeys, steps = k_hi > k_lo ? (k_hi - 1) / kKeys + 1 - n_lo : 0;

  float* sLse = reinterpret_cast<float*>(smem + L::kLse);
  float* sDelta = reinterpret_cast<float*>(smem + L::kDelta);
  const int valid = p.seqlen_q - q0;
  load_sw128<kDqRows, kD>(smem + L::kQ, row0(p.q, p.q_stride, b, h) + q0 * p.q_stride[1], p.q_stride[1], valid);
  load_sw128<kDqRows, kD>(smem + L::kDo, row0(p.dout, p.do_stride, b, h) + q0 * p.do_stride[1], p.do_stride[1], valid);
  for (int r = threadIdx.x; r < kDqRows; r += kThreads) {
    const bool ok = r < valid;
    const int64_t row = (int64_t(b) * p.heads_q + h);
    __pipeline_memcpy_async(sLse + r, ok ? p.lse + row * p.seqlen_q + q0 + r : p.lse, 4, ok ? 0 : 4);
    __pipeline_memcpy_async(sDelta + r, ok ? p.delta + row * p.rows + q0 + r : p.delta, 4, ok ? 0 : 4);
  }
  __pipeline_commit();
  const Walk walk{b, hk, 1, 0, 1};  // load_kv reads only b and hk
  auto load_step = [&](int s) {
    const int buf = s & 1;
    load_kv<kKeys, kD, kBF16>(p, walk, (n_lo + s) * kKeys, smem + L::kK + buf * L::kKVBytes, smem + L::kV + buf * L::kKVBytes);
  };
  if (steps > 0) load_step(0);
  __pipeline_commit();

  using ptx::smem_addr;
  const uint64_t q_desc = wgmma::desc_sw128(smem_addr(smem + L::kQ) + wg * 64 * 128, 16, 1024);
  const uint64_t do_desc = wgmma::desc_sw128(smem_addr(smem + L::kDo) + wg * 64 * 128, 16, 1024);
  const uint64_t k_desc = wgmma::desc_sw128(smem_addr(smem + L::kK), 16, 1024);
  const uint64_t v_desc = wgmma::desc_sw128(smem_addr(smem + L::kV), 16, 1024);
  const uint64_t k_mn = wgmma::desc_sw128(smem_addr(smem + L::kK), kKeys * 128, 1024);

  // This thread's two rows (16 warp + g, + 8) of the warpgroup's 64: their LSE (log2) and D.
  float row_lse[2] = {}, row_d[2] = {};
  float dq[kD / 2] = {};
  for (int s = 0; s < steps; ++s) {
    const int k0 = (n_lo + s) * kKeys, buf = s & 1;
    if (s + 1 < steps) load_step(s + 1);
    __pipeline_commit();
    __pipeline_wait_prior(1);
    ptx::fence_proxy_async_smem();
    __syncthreads();
    if (s == 0)
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        const int r = wg * 64 + 16 * warp + g + 8 * hr;
        row_lse[hr] = lse_log2(sLse[r]);
        row_d[hr] = sDelta[r];
      }

    // acc = A B^T over the head dim: A this warpgroup's rows of Q or dO, B the block's K or V.
    auto gemm = [&](float(&acc)[kKeys / 2], uint64_t a_desc, uint64_t b_desc) {
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk) {
        const uint32_t a_off = (kk / 4) * kDqRows * 128 + (kk % 4) * 32;
        const uint32_t b_off = buf * L::kKVBytes + (kk / 4) * kKeys * 128 + (kk % 4) * 32;
        wgmma::mma_ss<kKeys, kType>(acc, wgmma::desc_advance(a_desc, a_off), wgmma::desc_advance(b_desc, b_off), kk > 0);
      }
      wgmma::commit_group();
    };
    float sc[kKeys / 2], dp[kKeys / 2];
    wgmma::fence();
    gemm(sc, q_desc, k_desc);
    gemm(dp, do_desc, v_desc);

    // P: element 4j + e is row 16 warp + g (+ 8 for e >= 2), key 8j + 2t + (e & 1).
    const bool whole = vis.whole(q0 + wg * 64, 64, k0, kKeys);
    wgmma::wait_group<1>();
    wgmma::pin(sc);
#pragma unroll
    for (int j = 0; j < kKeys / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = 4 * j + e, hr = e >> 1;
        sc[i] = numerics::exp2_mufu(fmaf(sc[i], p.scale_log2, -row_lse[hr]));
        if (!whole && !vis(q0 + wg * 64 + 16 * warp + g + 8 * hr, k0 + 8 * j + 2 * t + (e & 1))) sc[i] = 0.0f;
      }
    wgmma::wait_group<0>();
    wgmma::pin(dp);
    uint32_t dsf[kKeys / 4];
#pragma unroll
    for (int i = 0; i < kKeys / 4; ++i) {
      const float d = row_d[i & 1];  // pair i: elements 2i, 2i + 1, of row g for even i, g + 8 for odd
      dsf[i] = pack2<kBF16>(sc[2 * i] * (dp[2 * i] - d) * p.scale, sc[2 * i + 1] * (dp[2 * i + 1] - d) * p.scale);
    }

    // dQ += dS K over the block's keys.
    wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) {
      const uint32_t a[4] = {dsf[4 * kk], dsf[4 * kk + 1], dsf[4 * kk + 2], dsf[4 * kk + 3]};
      wgmma::mma_rs<kD, kType>(dq, a, wgmma::desc_advance(k_mn, buf * L::kKVBytes + kk * 16 * 128), 1);
    }
    wgmma::commit_group();
    wgmma::wait_group<0>();
    wgmma::pin(dq);
    wgmma::pin(dsf);
    __syncthreads();  // this block's K and V may be refilled
  }

  // dQ of the block's real rows.
  uint16_t* dqp = static_cast<uint16_t*>(p.dq) + b * p.dq_stride[0] + h * p.dq_stride[2];
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    const int q = q0 + wg * 64 + 16 * warp + g + 8 * hr;
    if (q >= p.seqlen_q) continue;
#pragma unroll
    for (int j = 0; j < kD / 8; ++j) {
      const int c = 8 * j + 2 * t, i = 4 * j + 2 * hr;
      *reinterpret_cast<uint32_t*>(dqp + q * p.dq_stride[1] + c) = pack2<kBF16>(dq[i], dq[i + 1]);
    }
  }
}

}  // namespace fa4::sm90::bwd
