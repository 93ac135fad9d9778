// sm90 backward, deterministic dQ on wgmma: one CTA a block of 128 query rows (64 a warpgroup),
// walking its key blocks in order, so that each dQ element is one CTA's sum in a fixed order. Per
// key block, in the forward's frame:
//
//   S  = Q K^T,  dP = dO V^T           (wgmma SS, K-major both)
//   P, dS = P (dP - D) scale            (registers: the accumulator layout is the A operand's;
//                                        soft-capped, S capped first and dS times the cap's slope)
//   dQ += dS K                          (wgmma RS, K MN-major)
//
// Key blocks are 64 keys at d64/d128/d192 and 32 at d256 (where 128 rows of Q and dO take 128 KB).
// Q, dO, D and the log2 LSE load once (TMA and bulk copies); K and V by TMA through a StepRing, the
// next block's while this one computes (three buffers, two at d192 and d256). The warpgroups share only K and V,
// so nothing else holds them together.
#pragma once

#include "fa4/numerics/exp2.h"
#include "ptx/wgmma.h"
#include "sm90/bwd_dkdv_wgmma.cuh"

namespace fa4::sm90::bwd {

inline constexpr int kDqRows = 128;  // query rows a CTA, 64 a warpgroup
template <int kD>
inline constexpr int kDqKeys = kD == 256 ? 32 : 64;  // keys a step

// kDv: dO's and V's head dim (kD's but at 192 / 128).
template <int kD, int kDv = kD>
struct DqWgSmem {
  static constexpr int kQBytes = kDqRows * kD * 2, kKVBytes = kDqKeys<kD> * kD * 2;
  static constexpr int kDoBytes = kDqRows * kDv * 2, kVBytes = kDqKeys<kD> * kDv * 2;
  static constexpr int kBufs = kD >= 192 ? 2 : 3;  // K, V
  static constexpr int kQ = 0, kDo = kQBytes, kK = kQBytes + kDoBytes, kV = kK + kBufs * kKVBytes;
  static constexpr int kLse = kV + kBufs * kVBytes, kDelta = kLse + kDqRows * 4;
  static constexpr int kBars = kDelta + kDqRows * 4;  // the ring's full and empty, then Q's
  static constexpr int kBytes = kBars + (2 * kBufs + 1) * 8 + 1024;
  static_assert(kBytes <= 227 * 1024, "the wgmma dQ kernel's shared memory");
};

// tm_q, tm_do: Q and dO as ptx::map_bshd_16bit_sw128 maps in boxes of 64 rows; tm_k, tm_v: K and V
// in boxes of kDqKeys<kD> rows. kPaired: the workspace's LSE and D interleaved (BwdConfig).
// kVarlen: the block's rows from its sequence's (seq_span), of maps over the packed rows (batch 0).
// kSoftcap: soft-capped scores (BwdConfig::kSoftcap), S capped before P and dS times the slope; the
// cap's reciprocal on the FMA pipe at d64, where S's elements are the most a tensor FLOP
// (softcap_score). kDv: dO's and V's head dim (BwdConfig::kDv), over which dP = dO V^T runs.
template <int kD, bool kBF16, bool kPaired = false, bool kVarlen = false, bool kSoftcap = false, int kDv = kD>
__global__ void __launch_bounds__(kThreads, 1)
    bwd_dq_wgmma_kernel(const detail::BwdParams p, const __grid_constant__ CUtensorMap tm_q,
                        const __grid_constant__ CUtensorMap tm_do, const __grid_constant__ CUtensorMap tm_k,
                        const __grid_constant__ CUtensorMap tm_v) {
  namespace wgmma = ptx::wgmma;
  using L = DqWgSmem<kD, kDv>;
  constexpr int kKeys = kDqKeys<kD>;
  constexpr auto kType = kBF16 ? wgmma::Type::kBF16 : wgmma::Type::kF16;
  char* smem = smem_1024();
  const int q0 = blockIdx.x * kDqRows, h = blockIdx.y, b = blockIdx.z, hk = h / (p.heads_q / p.heads_kv);
  const SeqSpan seq = seq_span<kVarlen>(p, b);
  if constexpr (kVarlen)
    if (q0 >= seq.q_len) return;  // rows past the sequence's last: nothing
  const int wg = threadIdx.x / 128, tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;
  const Visibility vis = kVarlen ? Visibility{seq.q_len, seq.k_len, p.window_left, p.window_right}
                                 : Visibility{p.seqlen_q, p.seqlen_k, p.window_left, p.window_right};
  const int tb = kVarlen ? 0 : b;  // the maps' batch (varlen: rows from q_off, k_off)

  // Keys some row of the block sees: [k_lo, k_hi), in blocks of kKeys.
  int k_lo, k_hi;
  if constexpr (kVarlen) {
    const int off = seq.k_len - seq.q_len, last_q = min(q0 + kDqRows, seq.q_len) - 1;
    k_lo = p.window_left >= 0 ? max(0, q0 + off - p.window_left) : 0;
    k_hi = p.window_right >= 0 ? min(seq.k_len, last_q + off + p.window_right + 1) : seq.k_len;
  } else {
    const int off = p.seqlen_k - p.seqlen_q, last_q = min(q0 + kDqRows, p.seqlen_q) - 1;
    k_lo = p.window_left >= 0 ? max(0, q0 + off - p.window_left) : 0;
    k_hi = p.window_right >= 0 ? min(p.seqlen_k, last_q + off + p.window_right + 1) : p.seqlen_k;
  }
  const int n_lo = k_lo / kKeys, steps = k_hi > k_lo ? (k_hi - 1) / kKeys + 1 - n_lo : 0;

  float* sLse = reinterpret_cast<float*>(smem + L::kLse);
  float* sDelta = reinterpret_cast<float*>(smem + L::kDelta);
  const auto stats = RowStats<kPaired>::template at<kDqRows>(sLse, sDelta, 0);
  const auto ring = StepRing<L::kBufs>::at(smem + L::kBars);
  uint64_t* q_full = ring.empty + L::kBufs;
  // Step s's K and V (rows past seqlen_k read as zeros).
  auto load_step = [&](int s) {
    const int buf = s % L::kBufs, k0 = (n_lo + s) * kKeys;
    uint64_t* bar = ring.claim(s, L::kKVBytes + L::kVBytes);
#pragma unroll
    for (int c = 0; c < kD / 64; ++c) {
      ptx::tma_load_4d(smem + L::kK + buf * L::kKVBytes + c * kKeys * 128, &tm_k, bar, 64 * c, seq.k_off + k0, hk, tb);
      if (c < kDv / 64)  // (V's blocks: all of them but at 192 / 128)
        ptx::tma_load_4d(smem + L::kV + buf * L::kVBytes + c * kKeys * 128, &tm_v, bar, 64 * c, seq.k_off + k0, hk, tb);
    }
  };
  if (threadIdx.x == 0) {
    ring.init();
    ptx::mbar_init(q_full, 1);
    ptx::fence_barrier_init();
  }
  // The block's Q and dO (boxes of 64 rows; rows past seqlen_q read as zeros), D and log2 LSE, if
  // any key is seen (the loop waits for them; nothing may be in flight when the CTA exits).
  if (threadIdx.x == 0 && steps > 0) {
    ptx::mbar_arrive_expect_tx(q_full, L::kQBytes + L::kDoBytes + 2 * kDqRows * 4);
#pragma unroll
    for (int c = 0; c < kD / 64; ++c)
#pragma unroll
      for (int r = 0; r < kDqRows; r += 64) {
        ptx::tma_load_4d(smem + L::kQ + c * kDqRows * 128 + r * 128, &tm_q, q_full, 64 * c, seq.q_off + q0 + r, h, tb);
        if (c < kDv / 64)
          ptx::tma_load_4d(smem + L::kDo + c * kDqRows * 128 + r * 128, &tm_do, q_full, 64 * c, seq.q_off + q0 + r, h, tb);
      }
    const int64_t row = (int64_t(b) * p.heads_q + h) * p.rows + q0;
    load_row_stats<kPaired, kDqRows>(p, row, sLse, sDelta, q_full);
    load_step(0);
  }
  __syncthreads();  // the barriers are initialised

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
    const int k0 = (n_lo + s) * kKeys, buf = s % L::kBufs;
    if (threadIdx.x == 0 && s + 1 < steps) load_step(s + 1);
    if (s == 0) {
      ptx::mbar_wait(q_full, 0);
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        const int r = wg * 64 + 16 * warp + g + 8 * hr;
        row_lse[hr] = stats.lse1(r);  // log2 units
        row_d[hr] = stats.d1(r);
      }
    }
    ring.wait(s);
    // Varlen: the step's K and V rows past the sequence (zero_tail_rows), before any GEMM reads
    // them (the last step; every thread is on it).
    if constexpr (kVarlen)
      if (k0 + kKeys > vis.seqlen_k) {
        zero_tail_rows<kKeys, kD, kThreads, kDv>(smem + L::kK + buf * L::kKVBytes, smem + L::kV + buf * L::kVBytes,
                                                 vis.seqlen_k - k0, kKeys, threadIdx.x);
        __syncthreads();
      }

    // acc = A B^T over 16 `steps` columns: A this warpgroup's rows of Q or dO, B the block's K or V
    // (buf_bytes a buffer).
    auto gemm = [&](int steps, uint32_t buf_bytes, float(&acc)[kKeys / 2], uint64_t a_desc, uint64_t b_desc) {
#pragma unroll
      for (int kk = 0; kk < steps; ++kk) {
        const uint32_t a_off = wgmma::kmajor_step(kk, kDqRows);
        const uint32_t b_off = buf * buf_bytes + wgmma::kmajor_step(kk, kKeys);
        wgmma::mma_ss<kKeys, kType>(acc, wgmma::desc_advance(a_desc, a_off), wgmma::desc_advance(b_desc, b_off), kk > 0);
      }
      wgmma::commit_group();
    };
    float sc[kKeys / 2], dp[kKeys / 2];
    wgmma::fence();
    gemm(kD / 16, L::kKVBytes, sc, q_desc, k_desc);
    gemm(kDv / 16, L::kVBytes, dp, do_desc, v_desc);

    // P: element 4j + e is row 16 warp + g (+ 8 for e >= 2), key 8j + 2t + (e & 1).
    const bool whole = vis.whole(q0 + wg * 64, 64, k0, kKeys);
    wgmma::wait_group<1>();
    wgmma::pin(sc);
    with_mask<true>(!whole, [&](auto masked) {
#pragma unroll
      for (int j = 0; j < kKeys / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = 4 * j + e, hr = e >> 1;
          [[maybe_unused]] float slope = 1.0f;
          if constexpr (kSoftcap) {
            const CappedScore c = softcap_score<kD == 64>(sc[i], p.softcap, softcap_two_log2e(p.softcap_in));
            sc[i] = c.score, slope = c.slope;
          }
          sc[i] = numerics::exp2_mufu(fmaf(sc[i], p.scale_log2, -row_lse[hr]));
          if (masked && !vis(q0 + wg * 64 + 16 * warp + g + 8 * hr, k0 + 8 * j + 2 * t + (e & 1))) sc[i] = 0.0f;
          if constexpr (kSoftcap) sc[i] *= slope;  // dS = P slope (dP - D) scale
        }
    });
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
      wgmma::mma_rs<kD, kType>(dq, a, wgmma::desc_advance(k_mn, buf * L::kKVBytes + wgmma::mn_step(kk)), 1);
    }
    wgmma::commit_group();
    wgmma::wait_group<0>();
    wgmma::pin(dq);
    wgmma::pin(dsf);
    ring.release(s);
  }

  // dQ of the block's real rows.
  const SeqSpan end_seq = seq_span<kVarlen>(p, b);  // (read again: not held through the steps)
  uint16_t* dqp = static_cast<uint16_t*>(p.dq) + b * p.dq_stride[0] + h * p.dq_stride[2];
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    const int q = q0 + wg * 64 + 16 * warp + g + 8 * hr;
    if (q >= (kVarlen ? end_seq.q_len : p.seqlen_q)) continue;
#pragma unroll
    for (int j = 0; j < kD / 8; ++j) {
      const int c = 8 * j + 2 * t, i = 4 * j + 2 * hr;
      if (c < p.qk_cols)  // (dq's columns: kD's, or the caller's at a head dim without a kernel)
        *reinterpret_cast<uint32_t*>(dqp + (end_seq.q_off + q) * p.dq_stride[1] + c) = pack2<kBF16>(dq[i], dq[i + 1]);
    }
  }
}

}  // namespace fa4::sm90::bwd
