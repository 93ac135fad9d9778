// sm90 backward at head dims 64 and 128: dK and dV of 128 keys a CTA on wgmma, two warpgroups of
// 64 keys each, and dQ's share of every step added into the fp32 accumulator in 16 KB pieces, by
// bulk reductions (cp.reduce.async.bulk; d128) or float4 atomics (d64). The math is
// bwd_kernel.cuh's; per query block of 64:
//
//   S^T  = K Q^T   (wgmma SS, K-major both)      dP^T = V dO^T (the same)
//   P^T, dS^T in registers (the accumulator layout is the A operand's)
//   dV  += P^T dO  (RS, dO MN-major)             dK  += dS^T Q (RS, Q MN-major)
//   dS^T to shared memory; dQ = dS K over the 128 keys (SS, both MN-major), a step late (below): at
//   d128 each warpgroup takes 64 of the columns, at d64 warpgroup s % 2 all of step s's dQ.
//   (BwdConfig::kDqByKeys, measured at d64 before: each warpgroup its own 64 keys, the two
//   partials summed in shared memory or added in L2.)
//
// Tiles lie in the 128-byte-swizzled layout wgmma reads (64-column blocks of rows x 128 bytes). K
// and V load once, by TMA. Each step's Q and dO come by TMA, and its rows of D and of the LSE
// (log2 units, both written by bwd_delta_kernel into the workspace) by bulk copies, one thread
// issuing them a step ahead with full/empty mbarriers (StepRing; three buffers at d64/d128, two
// at d192/d256): no CTA barrier opens or closes a step, so the warpgroups are held together only
// where one reads what the other wrote (d128: dQ reads both's dS^T; d192/d256: dV/dK read both's
// P^T and dS^T), and those tiles have two buffers so that a warpgroup may write the next step's
// while the other still reads this one's. At d192/d256 (bwd_dkdv_split_kernel, at the end of this
// file) a CTA barrier inside the step waits for both halves.
// dQ of step s is computed at the end of step s + 1 (BwdConfig::kDqLagBufs), behind the dS^T
// buffer's full and empty mbarriers, and warpgroup 1 starts its walk once warpgroup 0's first dP^T
// has landed (BwdConfig::kSkew): the warpgroups run apart, one's exponentials under the other's
// GEMMs, where a CTA barrier before dQ held them in lockstep (d128), or the hand-off of summed
// partials coupled them every step (d64).
#pragma once

#include <cuda/ptx>

#include "fa4/numerics/exp2.h"
#include "ptx/ldmatrix.h"
#include "ptx/tma.h"
#include "ptx/wgmma.h"
#include "sm90/bwd_kernel.cuh"

namespace fa4::sm90::bwd {

inline constexpr int kWgKeys = 128;  // keys a CTA, 64 a warpgroup

// Byte offset of element (r, c) in a 128-byte-swizzled tile of kRows rows.
template <int kRows>
__host__ __device__ __forceinline__ uint32_t sw128(int r, int c) {
  return uint32_t((c >> 6) * kRows * 128 + r * 128 + ((((c >> 3) & 7) ^ (r & 7)) << 4) + (c & 7) * 2);
}

// A warp's 16 rows x 16 kChunks columns of 16-bit pairs in the accumulator's layout (v[2j + h]:
// row row0 + 8h + g, columns col0 + 8j + 2t and + 1) into a 128-byte-swizzled tile of kRows rows
// by stmatrix, four 8 x 8 blocks an instruction (lanes 8i..8i+7 address block i's rows).
// Instruction j (j even) stores v[2j .. 2j + 3]: block i of it is v[2j + i], rows row0 + 8 (i % 2),
// columns col0 + 8 (j + i / 2); stsm_row_addr is the offset of the row that `lane` addresses.
template <int kRows>
__host__ __device__ __forceinline__ uint32_t stsm_row_addr(int j, int row0, int col0, int lane) {
  const int i = lane / 8;
  return sw128<kRows>(row0 + 8 * (i % 2) + lane % 8, col0 + 8 * (j + i / 2));
}
template <int kRows, int kChunks>
__device__ __forceinline__ void stsm_rows(uint32_t tile, const uint32_t (&v)[2 * kChunks], int row0, int col0, int lane) {
#pragma unroll
  for (int j = 0; j < kChunks; j += 2)
    ptx::stmatrix_x4(tile + stsm_row_addr<kRows>(j, row0, col0, lane), v[2 * j], v[2 * j + 1], v[2 * j + 2], v[2 * j + 3]);
}

// Rows [0, 64) of a warpgroup's fp32 accumulator `acc` of kCols columns (warp w's rows 16 w + g
// and + 8 in the wgmma layout: element 4j + 2h + e at row 16 w + g + 8h, column 8j + 2t + e)
// written to global memory, row r at dst + r * stride (rows from `valid` on skipped, and columns
// from `cols` on: BwdParams::qk_cols, v_cols; a multiple of 8), through rows
// [row0, row0 + 64) of the 128-byte-swizzled tile of kTileRows rows at `tile`, which no one else
// reads or writes any more: stmatrix in, then 16 bytes a thread out, consecutive threads along a
// row (the accumulator's own layout gives 4-byte stores whose every warp instruction touches eight
// rows). `bar`: a named barrier of the warpgroup's 128 threads; kReuse: the tile is written again
// afterwards, so the reads are waited for.
template <int kTileRows, int kCols, bool kBF16, bool kReuse = false>
__device__ __forceinline__ void store_rows_staged(char* tile, int row0, const float (&acc)[kCols / 2], uint16_t* dst,
                                                  int64_t stride, int valid, int cols, int tid, uint32_t bar) {
  const int warp = tid / 32, lane = tid % 32;
  uint32_t v[kCols / 4];
#pragma unroll
  for (int j = 0; j < kCols / 8; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h) v[2 * j + h] = pack2<kBF16>(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
  stsm_rows<kTileRows, kCols / 8>(ptx::smem_addr(tile), v, row0 + 16 * warp, 0, lane);
  ptx::named_bar_sync(bar, 128);
  constexpr int kRowChunks = kCols / 8;
#pragma unroll
  for (int i = 0; i < 64 * kRowChunks / 128; ++i) {
    const int idx = i * 128 + tid, r = idx / kRowChunks, c = idx % kRowChunks * 8;
    if (r < valid && c < cols)
      *reinterpret_cast<int4*>(dst + r * stride + c) =
          ptx::ld_shared_v4(reinterpret_cast<const int4*>(tile + sw128<kTileRows>(row0 + r, c)));
  }
  if constexpr (kReuse) ptx::named_bar_sync(bar, 128);
}

// The same rows straight from the accumulator layout: 4-byte stores, each of a warp's touching eight
// rows (BwdConfig::kStagedStores false).
template <int kCols, bool kBF16>
__device__ __forceinline__ void store_rows_direct(const float (&acc)[kCols / 2], uint16_t* dst, int64_t stride, int valid,
                                                  int cols, int tid) {
  const int warp = tid / 32, g = tid % 32 / 4, t = tid % 4;
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    const int r = 16 * warp + g + 8 * hr;
    if (r >= valid) continue;
#pragma unroll
    for (int j = 0; j < kCols / 8; ++j) {
      const int c = 8 * j + 2 * t, i = 4 * j + 2 * hr;
      if (c < cols) *reinterpret_cast<uint32_t*>(dst + r * stride + c) = pack2<kBF16>(acc[i], acc[i + 1]);
    }
  }
}

// P^T's pair of S^T elements s0, s1 (key `key`, queries q and q + 1 of 8-query chunk j), in place:
// 2^(s scale - LSE) from the two queries' log2 LSE l0, l1, zero where `masked` (with_mask) and the
// query does not see the key; returns the pair packed. Soft-capped (Cfg::kSoftcap) the scores are
// capped first (softcap_score, its reciprocal on MUFU: on the FMA pipe the capped backward lost
// 4-5 % at d64 and 1 % at d256, and spilled at d128), and s0, s1 are left as P times the cap's
// slope, so that dS^T = s (dP^T - D) scale as without the cap. p.scale_log2 is then log2(e).
template <class Cfg, class Masked>
__device__ __forceinline__ uint32_t p_pair(float& s0, float& s1, int j, float l0, float l1,
                                           const detail::BwdParams& p, Masked masked, const Visibility& vis, int q,
                                           int key) {
  [[maybe_unused]] float slope0 = 1.0f, slope1 = 1.0f;
  if constexpr (Cfg::kSoftcap) {
    const float two_log2e_in = softcap_two_log2e(p.softcap_in);
    const CappedScore c0 = softcap_score<false>(s0, p.softcap, two_log2e_in),
                      c1 = softcap_score<false>(s1, p.softcap, two_log2e_in);
    s0 = c0.score, s1 = c1.score, slope0 = c0.slope, slope1 = c1.slope;
  }
  s0 = exp2_share<Cfg::kPolyEvery>(j, fmaf(s0, p.scale_log2, -l0));
  s1 = exp2_share<Cfg::kPolyEvery>(j, fmaf(s1, p.scale_log2, -l1));
  if (masked) {
    if (!vis(q, key)) s0 = 0.0f;
    if (!vis(q + 1, key)) s1 = 0.0f;
  }
  const uint32_t packed = pack2<Cfg::kBF16>(s0, s1);
  if constexpr (Cfg::kSoftcap) s0 *= slope0, s1 *= slope1;
  return packed;
}

// Rows [0, kRows) of a [seq, kCols] slice into a swizzled tile; rows from `valid` on are zeros.
template <int kRows, int kCols, int kCtaThreads = kThreads>
__device__ __forceinline__ void load_sw128(char* tile, const uint16_t* src, int64_t row_stride, int valid) {
  constexpr int kChunks = kCols / 8;
  for (int i = threadIdx.x; i < kRows * kChunks; i += kCtaThreads) {
    const int r = i / kChunks, c = (i % kChunks) * 8;
    const bool ok = r < valid;
    __pipeline_memcpy_async(tile + sw128<kRows>(r, c), ok ? src + r * row_stride + c : src, 16, ok ? 0 : 16);
  }
}

// A step's query head and first query row: advanced a step at a time (Walk::first, next), so
// that the loop divides nothing, or (BwdConfig::kStepCursor false) found from the step's index
// (Walk::at; walk_step picks).
struct StepAt {
  int h, q0, left;  // left: the head's blocks after this one
};

// What a dK/dV CTA walks: every query head of KV head hk's group, each over the query blocks
// [lo, lo + count) that see the CTA's keys (query_blocks); step s is head s / count's block
// lo + s % count.
struct Walk {
  int b, hk, group, lo, count;
  // The sequence's first query and key rows in the tensors (variable-length batches; 0 without).
  int q_off = 0, k_off = 0;
  __host__ __device__ __forceinline__ int steps() const { return group * count; }
  __host__ __device__ __forceinline__ StepAt first() const { return {hk * group, lo * kBlock, count - 1}; }
  __host__ __device__ __forceinline__ StepAt next(StepAt at) const {
    return at.left > 0 ? StepAt{at.h, at.q0 + kBlock, at.left - 1} : StepAt{at.h + 1, lo * kBlock, count - 1};
  }
  __host__ __device__ __forceinline__ StepAt at(int s) const {
    return {hk * group + s / count, (lo + s % count) * kBlock, 0};
  }
};

// Walk w's step s, from the cursor `c` that has walked to it (Cfg::kStepCursor) or from s.
template <class Cfg>
__host__ __device__ __forceinline__ StepAt walk_step(const Walk& w, int s, StepAt c) {
  if constexpr (Cfg::kStepCursor) return c;
  else return w.at(s);
}

// The walk of the CTA (blockIdx: key block, KV head, batch) whose keys start at k0, in its
// sequence `seq` (seq_span).
template <bool kVarlen>
__device__ __forceinline__ Walk walk_of(const detail::BwdParams& p, const SeqSpan& seq, int k0, int keys) {
  if constexpr (kVarlen) {
    const auto [lo, count] = query_blocks(p, seq.q_len, seq.k_len, k0, keys);
    return {int(blockIdx.z), int(blockIdx.y), p.heads_q / p.heads_kv, lo, count, seq.q_off, seq.k_off};
  } else {
    const auto [lo, count] = query_blocks(p, k0, keys);
    return {int(blockIdx.z), int(blockIdx.y), p.heads_q / p.heads_kv, lo, count};
  }
}

// Rows [from, to) of a 128-byte-swizzled tile of kD / 64 column blocks of kRows rows set to zero
// by kBy threads (this one `tid`), a row's eight 16-byte pieces by eight of them: a row's 128
// bytes a block stay in that row, whatever the swizzle. The caller fences them for the async proxy
// and syncs whoever reads them.
template <int kRows, int kD, int kBy>
__device__ __forceinline__ void zero_rows(char* tile, int from, int to, int tid) {
  static_assert(kBy % 8 == 0, "eight threads a row");
  for (int r = from + tid / 8; r < to; r += kBy / 8)
#pragma unroll
    for (int c = 0; c < kD / 64; ++c)
      *reinterpret_cast<int4*>(tile + c * kRows * 128 + r * 128 + (tid % 8) * 16) = make_int4(0, 0, 0, 0);
}

// Varlen: rows [from, to) past the sequence (the next one's, or spare rows) of a pair of such
// tiles, K and V or a step's Q and dO, set to zero by kBy threads (this one `tid`) and fenced for
// the async proxy. Masked, they meet P = 0 or dS = 0, but the GEMMs still multiply them (P^T dO,
// dS^T Q, dS K; dS is NaN where V is), and 0 x NaN is NaN.
// (kDb: b's head dim where it differs from a's: V and dO at 192 / 128.)
template <int kRows, int kD, int kBy, int kDb = kD>
__device__ __forceinline__ void zero_tail_rows(char* a, char* b, int from, int to, int tid) {
  zero_rows<kRows, kD, kBy>(a, from, to, tid);
  zero_rows<kRows, kDb, kBy>(b, from, to, tid);
  ptx::fence_proxy_async_smem();
}

// The sequence of the dK/dV CTA whose keys start at k0 (blockIdx.z's); false when, with varlen,
// they start past its end: the CTA then has nothing to do, once past D's grid (which the dQ kernel
// reads).
template <class Cfg>
__device__ __forceinline__ bool cta_sequence(const detail::BwdParams& p, int k0, SeqSpan& seq);

// The dynamic shared memory, its start moved up to 1024 bytes (128-byte swizzle atoms; the layouts
// keep 1024 bytes of slack for it).
__device__ __forceinline__ char* smem_1024() {
  extern __shared__ uint8_t smem_raw[];
  return reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
}

// The CTA's K and V rows [k0, k0 + kKeys) into their tiles (rows past the sequence's k_len are
// zeros); V's kDv columns (kD's but at 192 / 128).
template <int kKeys, int kD, int kCtaThreads, int kDv = kD>
__device__ __forceinline__ void load_kv(const detail::BwdParams& p, const Walk& w, int k0, int k_len, char* k_tile,
                                        char* v_tile) {
  load_sw128<kKeys, kD, kCtaThreads>(k_tile, row0(p.k, p.k_stride, w.b, w.hk) + (w.k_off + k0) * p.k_stride[1],
                                     p.k_stride[1], k_len - k0);
  load_sw128<kKeys, kDv, kCtaThreads>(v_tile, row0(p.v, p.v_stride, w.b, w.hk) + (w.k_off + k0) * p.v_stride[1],
                                      p.v_stride[1], k_len - k0);
}

// A ring of kBufs buffers that one thread fills a step ahead: step s's loads go into buffer
// s % kBufs and land on full[buf]; every warp (kEveryThread: every thread) arrives on empty[buf]
// once done with it, and the buffer is refilled for step s + kBufs after that. Where no CTA barrier
// falls between a step's reads and the refill (BwdConfig::kDqLag), every thread arrives: its own
// release then orders its reads before the refill, as compute-sanitizer's racecheck follows it.
template <int kBufs, bool kEveryThread = false>
struct StepRing {
  uint64_t* full;   // [kBufs]: the step's loads have landed
  uint64_t* empty;  // [kBufs]: every warp is done with the buffer

  // The ring whose 2 kBufs barriers (full, then empty) start at `bars`.
  __device__ __forceinline__ static StepRing at(char* bars) {
    uint64_t* b = reinterpret_cast<uint64_t*>(bars);
    return {b, b + kBufs};
  }

  // Thread 0; the CTA syncs before anyone waits on them.
  __device__ __forceinline__ void init() const {
    for (int i = 0; i < kBufs; ++i) {
      ptx::mbar_init(&full[i], 1);
      ptx::mbar_init(&empty[i], kEveryThread ? kThreads : kThreads / 32);
    }
    ptx::fence_barrier_init();
  }
  // The loading thread: step s's buffer, once step s - kBufs has released it; its full barrier,
  // armed for `bytes`.
  __device__ __forceinline__ uint64_t* claim(int s, uint32_t bytes) const {
    const int buf = s % kBufs;
    if (s >= kBufs) ptx::mbar_wait(&empty[buf], (s / kBufs - 1) & 1);
    ptx::mbar_arrive_expect_tx(&full[buf], bytes);
    return &full[buf];
  }
  __device__ __forceinline__ void wait(int s) const { ptx::mbar_wait(&full[s % kBufs], (s / kBufs) & 1); }
  // Every thread of the warp is done with step s's buffer (its GEMMs retired, its reads done).
  __device__ __forceinline__ void release(int s) const {
    if constexpr (kEveryThread) {
      ptx::mbar_arrive(&empty[s % kBufs]);
    } else {
      __syncwarp();
      if (threadIdx.x % 32 == 0) ptx::mbar_arrive(&empty[s % kBufs]);
    }
  }
};

// Cfg::kPdl: every thread waits for D's kernel (its rows of D and the LSE, and the accumulator
// zeroed before it or by it).
// Cfg::kDqOverlap: then the deterministic dQ kernel may start once every CTA has come this far.
template <class Cfg>
__device__ __forceinline__ void wait_for_delta() {
  if constexpr (Cfg::kPdl) cudaGridDependencySynchronize();
  if constexpr (Cfg::kDqOverlap) cudaTriggerProgrammaticLaunchCompletion();
}

// The query side of a dK/dV step, into buffer s % L::kBufs of layout L: Q and dO (TMA, boxes of
// 64 rows) and the step's rows of D and of the LSE in log2 units (bulk copies from the
// workspace). Rows past seqlen_q read as zeros (TMA) and as D 0 and LSE +inf (bwd_delta_kernel);
// with varlen (Cfg::kVarlen: rows from q_off of maps over the packed rows, batch 0) rows past the
// sequence read the next one's, which the kernels zero once landed (zero_tail_rows).
template <class L, class Cfg>
__device__ __forceinline__ void load_q_step(const detail::BwdParams& p, const CUtensorMap* tm_q, const CUtensorMap* tm_do,
                                            int b, int q_off, int s, StepAt at, char* smem, const typename L::Ring& ring) {
  const int buf = s % L::kBufs, h = at.h, q0 = at.q0;
  const int tq = (Cfg::kVarlen ? q_off : 0) + q0, tb = Cfg::kVarlen ? 0 : b;  // the maps' row and batch
  uint64_t* bar = ring.claim(s, L::kQBytes + L::kDoBytes + 2 * kBlock * 4);
  if constexpr (Cfg::kFoldedBoxes) {
    ptx::tma_load_5d(smem + L::kQ + buf * L::kQBytes, tm_q, bar, 0, tq, 0, h, tb);
    ptx::tma_load_5d(smem + L::kDo + buf * L::kDoBytes, tm_do, bar, 0, tq, 0, h, tb);
  } else {
#pragma unroll
    for (int c = 0; c < Cfg::kD / 64; ++c) {
      ptx::tma_load_4d(smem + L::kQ + buf * L::kQBytes + c * kBlock * 128, tm_q, bar, 64 * c, tq, h, tb);
      if (c < Cfg::kDv / 64)  // (dO's blocks: all of them but at 192 / 128)
        ptx::tma_load_4d(smem + L::kDo + buf * L::kDoBytes + c * kBlock * 128, tm_do, bar, 64 * c, tq, h, tb);
    }
  }
  const int64_t row = (int64_t(b) * p.heads_q + h) * p.rows + q0;
  load_row_stats<Cfg::kPairedStats, kBlock>(p, row,
                                            reinterpret_cast<float*>(smem + L::kLse + buf * kBlock * (Cfg::kPairedStats ? 8 : 4)),
                                            reinterpret_cast<float*>(smem + L::kDelta + buf * kBlock * 4), bar);
}

template <class Cfg>
__device__ __forceinline__ bool cta_sequence(const detail::BwdParams& p, int k0, SeqSpan& seq) {
  seq = seq_span<Cfg::kVarlen>(p, blockIdx.z);
  if constexpr (Cfg::kVarlen)
    if (k0 >= seq.k_len) {
      wait_for_delta<Cfg>();
      return false;
    }
  return true;
}

// A dK/dV CTA's start: the ring's barriers, the CTA's K and V rows [k0, k0 + kKeys) (cp.async, or
// with Cfg::kKvTma by TMA), the first step's query side in flight, and every thread past K and V's
// landing. With Cfg::kPdl the CTA may have started before D's kernel ended: what it does before
// waiting for that grid (cudaGridDependencySynchronize) reads only K and V, which D's kernel does
// not write.
template <class L, int kKeys, class Cfg>
__device__ __forceinline__ typename L::Ring start_dkdv(const detail::BwdParams& p, const CUtensorMap* tm_q,
                                                         const CUtensorMap* tm_do, const CUtensorMap* tm_k,
                                                         const CUtensorMap* tm_v, const Walk& walk, int k0, int k_len,
                                                         char* smem) {
  const auto ring = L::Ring::at(smem + L::kBars);
  if constexpr (Cfg::kKvTma) {
    // Thread 0 issues K and V (kD / 64 boxes each, rows past seqlen_k read as zeros), then the first
    // step's loads; every thread waits for K and V on kv_bar.
    uint64_t* kv_bar = reinterpret_cast<uint64_t*>(smem + L::kKvBar);
    if (threadIdx.x == 0) {
      ring.init();
      ptx::mbar_init(kv_bar, 1);
      ptx::fence_barrier_init();
      ptx::mbar_arrive_expect_tx(kv_bar, uint32_t(kKeys * (Cfg::kD + Cfg::kDv) * 2));
#pragma unroll
      for (int c = 0; c < Cfg::kD / 64; ++c) {
        ptx::tma_load_4d(smem + L::kK + c * kKeys * 128, tm_k, kv_bar, 64 * c, (Cfg::kVarlen ? walk.k_off : 0) + k0,
                         walk.hk, Cfg::kVarlen ? 0 : walk.b);
        if (c < Cfg::kDv / 64)  // (V's blocks: all of them but at 192 / 128)
          ptx::tma_load_4d(smem + L::kV + c * kKeys * 128, tm_v, kv_bar, 64 * c, (Cfg::kVarlen ? walk.k_off : 0) + k0,
                           walk.hk, Cfg::kVarlen ? 0 : walk.b);
      }
    }
    wait_for_delta<Cfg>();
    if (threadIdx.x == 0 && walk.steps() > 0)
      load_q_step<L, Cfg>(p, tm_q, tm_do, walk.b, walk.q_off, 0, walk.first(), smem, ring);
    __syncthreads();  // the barriers are initialised
    ptx::mbar_wait(kv_bar, 0);
    // Varlen: the rows past the sequence, zeroed as load_kv's cp.async does (zero_tail_rows).
    if constexpr (Cfg::kVarlen)
      if (k_len - k0 < kKeys) {
        zero_tail_rows<kKeys, Cfg::kD, Cfg::kCtaThreads, Cfg::kDv>(smem + L::kK, smem + L::kV, k_len - k0, kKeys,
                                                                   threadIdx.x);
        __syncthreads();
      }
  } else {
    if (threadIdx.x == 0) ring.init();
    load_kv<kKeys, Cfg::kD, Cfg::kCtaThreads, Cfg::kDv>(p, walk, k0, k_len, smem + L::kK, smem + L::kV);
    __pipeline_commit();
    wait_for_delta<Cfg>();
    __syncthreads();  // the barriers are initialised
    if (threadIdx.x == 0 && walk.steps() > 0)
      load_q_step<L, Cfg>(p, tm_q, tm_do, walk.b, walk.q_off, 0, walk.first(), smem, ring);
    __pipeline_wait_prior(0);  // K and V have landed, for every thread
    ptx::fence_proxy_async_smem();
    __syncthreads();
  }
  return ring;
}

template <class Cfg>
struct WgSmem {
  static constexpr int kD = Cfg::kD;
  static constexpr int kKVBytes = kWgKeys * kD * 2, kQBytes = kBlock * kD * 2, kDoBytes = kQBytes;
  static constexpr int kK = 0, kV = kKVBytes;
  static constexpr int kBufs = Cfg::kStepBufs;  // Q, dO, LSE, D: loaded a step ahead (3 shipped)
  static constexpr int kQ = 2 * kKVBytes, kDo = kQ + kBufs * kQBytes;
  // dQ's 64 x 64 pieces a warpgroup a step: by keys every column block of its own keys, else one.
  static constexpr int kDqPieces = Cfg::kDqByKeys ? kD / 64 : 1;
  // dS^T [128 keys][64 queries]; two buffers where both warpgroups read all of it (dQ by columns),
  // Cfg::kDqLagBufs where dQ runs a step behind.
  static constexpr int kDsBufs = Cfg::kDqByKeys ? 1 : Cfg::kDqLag ? Cfg::kDqLagBufs : 2, kDsBytes = kWgKeys * kBlock * 2;
  static constexpr int kDs = kDo + kBufs * kQBytes;
  // fp32 pieces [64][64], kDqPieces a warpgroup; none where dQ is added by atomics.
  static constexpr int kStage = kDs + kDsBufs * kDsBytes;
  static constexpr int kStageBytes = Cfg::kDqAtomics ? 0 : 2 * kDqPieces * kBlock * 64 * 4;
  static constexpr int kLse = kStage + kStageBytes, kDelta = kLse + kBufs * kBlock * 4;
  static constexpr int kBars = kDelta + kBufs * kBlock * 4;         // StepRing's full and empty
  using Ring = StepRing<kBufs, Cfg::kDqLag>;
  static constexpr int kDsBars = kBars + 2 * kBufs * 8;             // Cfg::kDqLag: dS^T's full, empty
  static constexpr int kPairBars = kDsBars + (Cfg::kDqLag ? 2 * kDsBufs * 8 : 0);  // Cfg::kDqPairSum: half, free
  static constexpr int kKvBar = kPairBars + (Cfg::kDqPairSum ? 4 * 8 : 0);        // Cfg::kKvTma: K and V landed
  static constexpr int kZeroed = kKvBar + (Cfg::kKvTma ? 8 : 0);                  // Cfg::kVarlen: [kBufs]
  static constexpr int kBytes = kZeroed + (Cfg::kVarlen ? kBufs * 8 : 0) + 1024;  // + slack to align the base
  static_assert(kBytes <= 227 * 1024, "the wgmma dK/dV kernel's shared memory");
};

// tm_k, tm_v (Cfg::kKvTma): K and V as ptx::map_bshd_16bit_sw128 maps in boxes of the CTA's 128 rows.
// tm_q, tm_do: Q and dO as ptx::map_bshd_16bit_sw128 maps in boxes of 64 rows (the _folded maps
// with Cfg::kFoldedBoxes).
template <class Cfg>
__global__ void __launch_bounds__(Cfg::kCtaThreads, 1)
    bwd_dkdv_wgmma_kernel(const detail::BwdParams p, const __grid_constant__ CUtensorMap tm_q,
                          const __grid_constant__ CUtensorMap tm_do, const __grid_constant__ CUtensorMap tm_k,
                          const __grid_constant__ CUtensorMap tm_v) {
  constexpr int kD = Cfg::kD;
  constexpr bool kBF16 = Cfg::kBF16;
  static_assert(kD == 64 || kD == 128, "the wgmma dK/dV kernel covers head dims 64 and 128");
  namespace wgmma = ptx::wgmma;
  using L = WgSmem<Cfg>;
  constexpr auto kType = kBF16 ? wgmma::Type::kBF16 : wgmma::Type::kF16;
  [[maybe_unused]] const uint64_t t_entry = Cfg::kTrace ? clock64() : 0;
  char* smem = smem_1024();
  const int k0 = blockIdx.x * kWgKeys;
  SeqSpan seq;
  if (!cta_sequence<Cfg>(p, k0, seq)) return;
  const Walk walk = walk_of<Cfg::kVarlen>(p, seq, k0, kWgKeys);
  const int b = walk.b, hk = walk.hk, steps = walk.steps();
  const int wg = threadIdx.x / 128, tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;
  const Visibility vis = Cfg::kVarlen ? Visibility{seq.q_len, seq.k_len, p.window_left, p.window_right}
                                      : Visibility{p.seqlen_q, p.seqlen_k, p.window_left, p.window_right};

  const float* sLse = reinterpret_cast<const float*>(smem + L::kLse);
  const float* sDelta = reinterpret_cast<const float*>(smem + L::kDelta);
  // Cfg::kDqLag: dS^T buffer u is full once every warp has stored its rows of it, empty once every
  // warp's dQ GEMM has read it.
  uint64_t* ds_full = reinterpret_cast<uint64_t*>(smem + L::kDsBars);
  uint64_t* ds_empty = ds_full + L::kDsBufs;
  // Cfg::kDqPairSum: stage buffer u (the stage's two pieces, a step's parity each) holds warpgroup 0's
  // partial once pair_half[u] completes (every thread of warpgroup 0 arrives), and is free again
  // once warpgroup 1's reduction from it has read it (pair_free[u], warpgroup 1's thread 0).
  uint64_t* pair_half = reinterpret_cast<uint64_t*>(smem + L::kPairBars);
  uint64_t* pair_free = pair_half + 2;
  if constexpr (Cfg::kDqPairSum)
    if (threadIdx.x == 0)
      for (int i = 0; i < 2; ++i) {
        ptx::mbar_init(&pair_half[i], 128);
        ptx::mbar_init(&pair_free[i], 1);
      }
  if constexpr (Cfg::kDqLag) {
    if (threadIdx.x == 0)
      for (int i = 0; i < L::kDsBufs; ++i) {
        ptx::mbar_init(&ds_full[i], kThreads / 32);
        ptx::mbar_init(&ds_empty[i], Cfg::kDqAlternate ? 4 : kThreads / 32);
      }
  }
  // Varlen: zeroed[u], step buffer u's rows past the sequence zeroed by warpgroup 0 (each thread).
  uint64_t* zeroed = reinterpret_cast<uint64_t*>(smem + L::kZeroed);
  if constexpr (Cfg::kVarlen)
    if (threadIdx.x == 0)
      for (int i = 0; i < L::kBufs; ++i) ptx::mbar_init(&zeroed[i], 128);
  const auto ring = start_dkdv<L, kWgKeys, Cfg>(p, &tm_q, &tm_do, &tm_k, &tm_v, walk, k0, Cfg::kVarlen ? seq.k_len : p.seqlen_k, smem);  // fences the inits
  // Cfg::kLoadIssue 2: a third warpgroup gives its registers to the two (setmaxnreg), and its first
  // thread issues every later step's loads as soon as the ring frees a buffer; then it leaves.
  if constexpr (Cfg::kLoadIssue == 2) {
    if (threadIdx.x >= kThreads) {
      ptx::regs_decrease<Cfg::kLoaderRegs>();
      if (threadIdx.x == kThreads) {
        StepAt at = walk.first();
        for (int s = 1; s < steps; ++s) {
          at = walk.next(at);
          load_q_step<L, Cfg>(p, &tm_q, &tm_do, b, walk.q_off, s, at, smem, ring);
        }
      }
      return;
    }
    ptx::regs_increase<Cfg::kComputeRegs>();
  }

  // Descriptors (wgmma.h): K-major operands with LBO 16, MN-major ones with LBO = the bytes between
  // 64-column blocks; SBO 1024 (eight rows of 128 bytes) for both.
  using ptx::smem_addr;
  const uint64_t k_desc = wgmma::desc_sw128(smem_addr(smem + L::kK) + wg * 64 * 128, 16, 1024);
  const uint64_t v_desc = wgmma::desc_sw128(smem_addr(smem + L::kV) + wg * 64 * 128, 16, 1024);
  const uint64_t q_desc = wgmma::desc_sw128(smem_addr(smem + L::kQ), 16, 1024);
  const uint64_t do_desc = wgmma::desc_sw128(smem_addr(smem + L::kDo), 16, 1024);
  const uint64_t q_mn = wgmma::desc_sw128(smem_addr(smem + L::kQ), kBlock * 128, 1024);
  const uint64_t do_mn = wgmma::desc_sw128(smem_addr(smem + L::kDo), kBlock * 128, 1024);
  // dQ by columns (d128 shipped): all 128 keys and this warpgroup's 64 columns; by keys: this
  // warpgroup's 64 keys and every column, L::kDqPieces pieces of 64; by alternate warpgroups (d64
  // shipped, Cfg::kDqAlternate): all 128 keys and the one column block, every other step.
  constexpr bool kByKeys = Cfg::kDqByKeys;
  constexpr int kDqKeys = kByKeys ? 64 : kWgKeys;
  const uint32_t dq_key0 = kByKeys ? wg * 64 : 0, dq_col0 = kByKeys || Cfg::kDqAlternate ? 0 : wg * 64;
  const uint64_t ds_mn = wgmma::desc_sw128(smem_addr(smem + L::kDs) + dq_key0 * 128, kWgKeys * 128, 1024);
  const uint64_t kq_mn = wgmma::desc_sw128(smem_addr(smem + L::kK) + dq_key0 * 128 + (dq_col0 / 64) * kWgKeys * 128,
                                           kWgKeys * 128, 1024);
  float* stage = reinterpret_cast<float*>(smem + L::kStage) + wg * L::kDqPieces * kBlock * 64;

  // At d64 this warpgroup's rows of K and V stay in registers as the A operand of S^T and dP^T
  // (16 registers each), so that those two GEMMs read only Q and dO from shared memory.
  constexpr bool kKVInRegs = kD == 64;
  uint32_t kf[kKVInRegs ? kD / 16 : 1][4], vf[kKVInRegs ? kD / 16 : 1][4];
  if constexpr (kKVInRegs) {
    const int r = wg * 64 + 16 * warp + (lane & 15);
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      const int c = 16 * kk + (lane >> 4) * 8;
      ptx::ldmatrix_x4(kf[kk], smem_addr(smem + L::kK + sw128<kWgKeys>(r, c)));
      ptx::ldmatrix_x4(vf[kk], smem_addr(smem + L::kV + sw128<kWgKeys>(r, c)));
    }
  }

  [[maybe_unused]] StepTrace tr;
  if constexpr (Cfg::kTrace) {
    tr.open(p.trace, wg);
    tr.cta(0, t_entry);
  }

  // dQ's 64-column piece c of the dS^T buffer ds_buf into dq (this warpgroup's keys and columns),
  // and the wait that retires every GEMM of the warpgroup.
  auto dq_gemm = [&](float(&dq)[32], int ds_buf, int c) {
    wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < kDqKeys / 16; ++kk)
      wgmma::mma_ss_tt<64, kType>(dq, wgmma::desc_advance(ds_mn, ds_buf * L::kDsBytes + wgmma::mn_step(kk)),
                                  wgmma::desc_advance(kq_mn, c * kWgKeys * 128 + wgmma::mn_step(kk)), kk > 0);
    wgmma::commit_group();
    wgmma::wait_group<0>();
    wgmma::pin(dq);
  };
  // A 64 x 64 fp32 piece into shared memory at `piece` (this thread's first float4) in the piece's
  // order (dq_piece_offset): float4 j of every thread, one after another.
  auto store_piece = [&](uint32_t piece, const float(&dq)[32]) {
#pragma unroll
    for (int j = 0; j < 8; ++j)
      ptx::st_shared_v4_f32(piece + 16 * 128 * j, dq[4 * j], dq[4 * j + 1], dq[4 * j + 2], dq[4 * j + 3]);
  };

  // dQ of step sq (query head h, rows from q0) from its dS^T buffer, added into the fp32
  // accumulator: each piece's GEMM, its wait, then the stage's stores and the bulk reductions, or
  // (Cfg::kDqAtomics) float4 atomics (stamp: the step whose trace records it). With Cfg::kDqLag it
  // first waits for dS^T to be full and marks it empty once read; with Cfg::kDqPairSum (d64, dQ by
  // keys) the two warpgroups' partials are summed in the stage buffer of the step's parity and
  // reduced once.
  auto dq_of = [&](int sq, int h, int q0, [[maybe_unused]] int stamp) {
    const int ds_buf = sq % L::kDsBufs;
    if constexpr (Cfg::kDqPairSum) {
      float dq[32];
      dq_gemm(dq, ds_buf, 0);
      if constexpr (Cfg::kTrace) tr.stamp(stamp, 7);
      const int u = sq & 1;
      float* sum = reinterpret_cast<float*>(smem + L::kStage) + u * kBlock * 64;
      const uint32_t piece = smem_addr(sum) + 16 * tid;
      if (wg == 0) {
        if (sq >= 2) ptx::mbar_wait(&pair_free[u], ((sq >> 1) - 1) & 1);  // step sq - 2's reduction read it
        store_piece(piece, dq);
        ptx::mbar_arrive(&pair_half[u]);
      } else {
        ptx::mbar_wait(&pair_half[u], (sq >> 1) & 1);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const int4 w = ptx::ld_shared_v4(reinterpret_cast<const int4*>(sum) + 128 * j + tid);
          ptx::st_shared_v4_f32(piece + 16 * 128 * j, __int_as_float(w.x) + dq[4 * j], __int_as_float(w.y) + dq[4 * j + 1],
                                __int_as_float(w.z) + dq[4 * j + 2], __int_as_float(w.w) + dq[4 * j + 3]);
        }
        ptx::fence_proxy_async_smem();
        ptx::named_bar_sync(2, 128);
        if (tid == 0) {
          cuda::ptx::cp_reduce_async_bulk(cuda::ptx::space_global, cuda::ptx::space_shared, cuda::ptx::op_add,
                                          dq_piece_at<kD>(p, b, h, q0, 0), sum, uint32_t(kBlock * 64 * 4));
          cuda::ptx::cp_async_bulk_commit_group();
          // Step sq - 1's reduction has read its buffer: warpgroup 0 may store into it at step sq + 1.
          if (sq >= 1) {
            cuda::ptx::cp_async_bulk_wait_group_read(cuda::ptx::n32_t<1>{});
            ptx::mbar_arrive(&pair_free[(sq - 1) & 1]);
          }
        }
      }
    } else {
      if constexpr (Cfg::kDqLag) ptx::mbar_wait(&ds_full[ds_buf], (sq / L::kDsBufs) & 1);
      if constexpr (Cfg::kTrace) tr.stamp(stamp, 6);
#pragma unroll
      for (int c = 0; c < L::kDqPieces; ++c) {
        float dq[32];
        dq_gemm(dq, ds_buf, c);
        if (c == 0) {
          if constexpr (Cfg::kDqLag) {
            __syncwarp();
            if (lane == 0) ptx::mbar_arrive(&ds_empty[ds_buf]);
          }
          if constexpr (Cfg::kTrace) tr.stamp(stamp, 7);
          // The warpgroup's previous reductions have read its stage; then the stage is rewritten.
          if constexpr (!Cfg::kDqAtomics) {
            if (tid == 0) cuda::ptx::cp_async_bulk_wait_group_read(cuda::ptx::n32_t<0>{});
            ptx::named_bar_sync(1 + wg, 128);
          }
        }
        if constexpr (Cfg::kDqAtomics) {
          add_piece(dq_piece_at<kD>(p, b, h, q0, dq_col0 + 64 * c), dq, tid);  // straight from the registers
        } else {
          store_piece(smem_addr(stage + c * kBlock * 64) + 16 * tid, dq);
        }
      }
      if constexpr (Cfg::kDqAtomics) return;
      ptx::fence_proxy_async_smem();
      ptx::named_bar_sync(1 + wg, 128);
      if (tid == 0) {
#pragma unroll
        for (int c = 0; c < L::kDqPieces; ++c)
          cuda::ptx::cp_reduce_async_bulk(cuda::ptx::space_global, cuda::ptx::space_shared, cuda::ptx::op_add,
                                          dq_piece_at<kD>(p, b, h, q0, dq_col0 + 64 * c),
                                          stage + c * kBlock * 64, uint32_t(kBlock * 64 * 4));
        cuda::ptx::cp_async_bulk_commit_group();
      }
    }
  };

  float dk[kD / 2] = {}, dv[kD / 2] = {};
  [[maybe_unused]] int h_prev = 0, q0_prev = 0;  // Cfg::kDqLag: the previous step's
  // Varlen: bit u flips at each step on buffer u whose query rows run past the sequence (zeroed's
  // phase).
  [[maybe_unused]] uint32_t zero_phase = 0;
  // Cfg::kSkew: warpgroup 1 starts once warpgroup 0's first step has reached point Cfg::kSkew (named
  // barrier 5; skew_signal).
  if constexpr (Cfg::kSkew != 0)
    if (wg == 1 && steps > 0) ptx::named_bar_sync(5, kThreads);
  auto skew_signal = [&](int s, [[maybe_unused]] int point) {
    if constexpr (Cfg::kSkew != 0)
      if (wg == 0 && s == 0 && point == Cfg::kSkew) ptx::named_bar_arrive(5, kThreads);
  };
  StepAt at = walk.first(), at_next = walk.next(at);  // steps s and s + 1
  for (int s = 0; s < steps; ++s, at = at_next, at_next = walk.next(at_next)) {
    const StepAt here = walk_step<Cfg>(walk, s, at);
    const int h = here.h, q0 = here.q0, buf = s % L::kBufs;
    if constexpr (Cfg::kTrace) tr.stamp(s, 0);
    // Cfg::kLoadIssue 0: the next step's loads go out at the step's top (1: below).
    if (Cfg::kLoadIssue == 0 && threadIdx.x == 128 * Cfg::kLoadWg && s + 1 < steps)
      load_q_step<L, Cfg>(p, &tm_q, &tm_do, b, walk.q_off, s + 1, walk_step<Cfg>(walk, s + 1, at_next), smem, ring);
    if constexpr (step_warp_lag<Cfg>() > 0)  // (a test's config)
      if ((wg == 1 && s % 5 == 0) || (wg == 0 && s % 7 == 3)) spin_cycles(step_warp_lag<Cfg>());
    ring.wait(s);
    // Varlen, rows past the sequence: warpgroup 0 (the one ahead, Cfg::kSkew) zeroes them and
    // arrives on zeroed[buf]; both warpgroups wait for it there (each thread of warpgroup 0
    // arrives, so that racecheck sees every store ordered before the reads). The ring keeps
    // warpgroup 0 from reaching buffer buf again before warpgroup 1 has passed this phase. What it
    // costs: docs/perf-notes.md, "Varlen's rows past every sequence".
    if constexpr (Cfg::kVarlen)
      if (q0 + kBlock > vis.seqlen_q) {
        if (wg == 0) {
          zero_tail_rows<kBlock, kD, 128>(smem + L::kQ + buf * L::kQBytes, smem + L::kDo + buf * L::kQBytes,
                                          vis.seqlen_q - q0, kBlock, tid);
          ptx::mbar_arrive(&zeroed[buf]);
        }
        ptx::mbar_wait(&zeroed[buf], (zero_phase >> buf) & 1);
        zero_phase ^= 1u << buf;
      }
    if constexpr (Cfg::kTrace) tr.stamp(s, 1);

    // S^T and dP^T: this warpgroup's 64 keys x 64 queries, in two groups, so that P^T's
    // exponentials run while dP^T is computed, and dS^T's arithmetic while dV's GEMMs run.
    // acc = A B^T over the head dim: A this warpgroup's K or V (registers at d64), B step s's Q or dO.
    auto gemm = [&](float(&acc)[32], const uint32_t(&a_regs)[kKVInRegs ? kD / 16 : 1][4], uint64_t a_desc,
                    uint64_t b_desc) {
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk) {
        const uint64_t b = wgmma::desc_advance(b_desc, buf * L::kQBytes + wgmma::kmajor_step(kk, kBlock));
        if constexpr (kKVInRegs)
          wgmma::mma_rs_kb<64, kType>(acc, a_regs[kk], b, kk > 0);
        else
          wgmma::mma_ss<64, kType>(acc, wgmma::desc_advance(a_desc, wgmma::kmajor_step(kk, kWgKeys)), b, kk > 0);
      }
      wgmma::commit_group();
    };
    float st[32], dpt[32];
    wgmma::fence();
    gemm(st, kf, k_desc, q_desc);
    gemm(dpt, vf, v_desc, do_desc);
    // d64/d128: the next step's loads go out while this step's S^T and dP^T are computed, where
    // thread 0 would only wait; issued at the step's top, they held its warpgroup behind the other at
    // the lockstep configuration's CTA barrier before dQ (H100 A/B +2.2-2.7 %; d256 measured 0.96
    // this way, d64 with its partials summed 1.00).
    if (Cfg::kLoadIssue == 1 && threadIdx.x == 128 * Cfg::kLoadWg && s + 1 < steps)
      load_q_step<L, Cfg>(p, &tm_q, &tm_do, b, walk.q_off, s + 1, walk_step<Cfg>(walk, s + 1, at_next), smem, ring);

    // P^T: element 4j + e is key row 16 warp + g (+ 8 for e >= 2), query 8j + 2t + (e & 1).
    // This thread's queries' LSE (log2 units), read while S^T is computed (soft-capped: in the loop,
    // where the cap's arithmetic needs the registers; held, they made d128 spill).
    const auto stats = RowStats<Cfg::kPairedStats, Cfg::kStatsLds>::template at<kBlock>(sLse, sDelta, buf);
    float2 lse2[8];
    if constexpr (!Cfg::kSoftcap)
#pragma unroll
      for (int j = 0; j < 8; ++j) lse2[j] = stats.lse2(8 * j + 2 * t);
    const bool whole = vis.whole(q0, kBlock, k0, kWgKeys);
    wgmma::wait_group<1>();
    wgmma::pin(st);
    skew_signal(s, 1);
    if constexpr (Cfg::kTrace) tr.stamp(s, 2);
    uint32_t pf[16], dsf[16];
    with_mask<Cfg::kMaskHoist>(!whole, [&](auto masked) {
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int qc = 8 * j + 2 * t;
        const float2 lj = Cfg::kSoftcap ? stats.lse2(qc) : lse2[j];
        const float l0 = lj.x, l1 = lj.y;
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
          const int kr = wg * 64 + 16 * warp + g + 8 * hr, i = 4 * j + 2 * hr;
          pf[2 * j + hr] = p_pair<Cfg>(st[i], st[i + 1], j, l0, l1, p, masked, vis, q0 + qc, k0 + kr);
        }
      }
    });
    // dV += P^T dO over the 64 queries.
    wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < kBlock / 16; ++kk) {
      const uint32_t pa[4] = {pf[4 * kk], pf[4 * kk + 1], pf[4 * kk + 2], pf[4 * kk + 3]};
      wgmma::mma_rs<kD, kType>(dv, pa, wgmma::desc_advance(do_mn, buf * L::kQBytes + wgmma::mn_step(kk)), 1);
    }
    wgmma::commit_group();
    if constexpr (Cfg::kTrace) tr.stamp(s, 3);

    // dS^T = P^T (dP^T - D) scale, kept for dK and stored for dQ (D read while dP^T is computed).
    const uint32_t ds_tile = smem_addr(smem + L::kDs + (s % L::kDsBufs) * L::kDsBytes);
    float2 delta2[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) delta2[j] = stats.d2(8 * j + 2 * t);
    wgmma::wait_group<1>();
    wgmma::pin(dpt);
    skew_signal(s, 2);
    if constexpr (Cfg::kTrace) tr.stamp(s, 4);
    // dQ a step behind: the buffer's dQ of step s - kDsBufs has been read by both warpgroups.
    if constexpr (Cfg::kDqLag)
      if (!p.deterministic && s >= L::kDsBufs) ptx::mbar_wait(&ds_empty[s % L::kDsBufs], (s / L::kDsBufs - 1) & 1);
    if constexpr (step_warp_lag<Cfg>() > 0)  // (a test's config)
      if (warp == s % 4 && wg == (s / 4) % 2) spin_cycles(step_warp_lag<Cfg>());
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int qc = 8 * j + 2 * t;
      const float d0 = delta2[j].x, d1 = delta2[j].y;
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        const int kr = wg * 64 + 16 * warp + g + 8 * hr, i = 4 * j + 2 * hr;
        dsf[2 * j + hr] = pack2<kBF16>(st[i] * (dpt[i] - d0) * p.scale, st[i + 1] * (dpt[i + 1] - d1) * p.scale);
        if constexpr (!Cfg::kStMatrix) ptx::st_shared_b32(ds_tile + sw128<kWgKeys>(kr, qc), dsf[2 * j + hr]);
      }
    }
    if constexpr (Cfg::kStMatrix) stsm_rows<kWgKeys, 8>(ds_tile, dsf, wg * 64 + 16 * warp, 0, lane);
    // dK += dS^T Q over the 64 queries.
    wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < kBlock / 16; ++kk) {
      const uint32_t da[4] = {dsf[4 * kk], dsf[4 * kk + 1], dsf[4 * kk + 2], dsf[4 * kk + 3]};
      wgmma::mma_rs<kD, kType>(dk, da, wgmma::desc_advance(q_mn, buf * L::kQBytes + wgmma::mn_step(kk)), 1);
    }
    wgmma::commit_group();
    skew_signal(s, 3);
    if constexpr (Cfg::kTrace) tr.stamp(s, 5);
    if constexpr (Cfg::kDqLag) {
      // dS^T stored for both warpgroups' dQ in the next step; then the previous step's dQ.
      if (!p.deterministic) {
        ptx::fence_proxy_async_smem();
        __syncwarp();
        if (lane == 0) ptx::mbar_arrive(&ds_full[s % L::kDsBufs]);
        if (s > 0 && (!Cfg::kDqAlternate || ((s - 1) & 1) == wg)) dq_of(s - 1, h_prev, q0_prev, s);
      }
      wgmma::wait_group<0>();
      h_prev = h, q0_prev = q0;
    } else {
      // dS^T's stores, before the dQ wgmma reads them: by columns every key's (both warpgroups'), by
      // keys this warpgroup's own. (By columns this barrier also keeps a warpgroup from writing
      // dS^T two steps on, into this buffer, before the other's dQ has read it.)
      ptx::fence_proxy_async_smem();
      if constexpr (kByKeys)
        ptx::named_bar_sync(3 + wg, 128);
      else
        __syncthreads();
      if (!p.deterministic)
        dq_of(s, h, q0, s);
      else
        wgmma::wait_group<0>();
    }
    // Every GEMM of the step is done: its accumulators, and the registers it read (P^T, dS^T), may
    // be touched again.
    wgmma::pin(dk);
    wgmma::pin(dv);
    wgmma::pin(pf);
    wgmma::pin(dsf);
    if constexpr (Cfg::kTrace) tr.stamp(s, 8);
    ring.release(s);
  }
  if constexpr (Cfg::kDqLag)
    if (!p.deterministic && steps > 0 && (!Cfg::kDqAlternate || ((steps - 1) & 1) == wg))
      dq_of(steps - 1, h_prev, q0_prev, kTraceSteps);  // (no stamps)
  // dK, dV of the block's real keys.
  // (With varlen the sequence's length and first row read again here, not held through the steps.)
  const SeqSpan end_seq = seq_span<Cfg::kVarlen>(p, b);
  const int key0 = k0 + wg * 64, valid = end_seq.k_len - key0;
  const int qk_cols = qk_cols_of<Cfg>(p), v_cols = v_cols_of<Cfg>(p);  // (at d128 without kInPlace: 128)
  uint16_t* dk_rows = static_cast<uint16_t*>(p.dk) + b * p.dk_stride[0] + hk * p.dk_stride[2] +
                      int64_t(end_seq.k_off + key0) * p.dk_stride[1];
  uint16_t* dv_rows = static_cast<uint16_t*>(p.dv) + b * p.dv_stride[0] + hk * p.dv_stride[2] +
                      int64_t(end_seq.k_off + key0) * p.dv_stride[1];
  if constexpr (Cfg::kStagedStores) {
    // The warpgroup's last reductions have read its stage (their writes land without a wait).
    if (!Cfg::kDqAtomics && tid == 0) cuda::ptx::cp_async_bulk_wait_group_read(cuda::ptx::n32_t<0>{});
    // The warpgroup's rows of V's tile are read by its own dP^T GEMMs only (at d64 by none: V is
    // in registers), all retired: dV goes through them; dK through its stage (d128), past the
    // barrier that follows thread 0's wait, or (d64, or no stage) through the same rows again.
    if constexpr (kD == 64 || Cfg::kDqAtomics) {
      store_rows_staged<kWgKeys, kD, kBF16, true>(smem + L::kV, wg * 64, dv, dv_rows, p.dv_stride[1], valid, v_cols,
                                                  tid, 1 + wg);
      store_rows_staged<kWgKeys, kD, kBF16>(smem + L::kV, wg * 64, dk, dk_rows, p.dk_stride[1], valid, qk_cols, tid,
                                            1 + wg);
    } else {
      store_rows_staged<kWgKeys, kD, kBF16>(smem + L::kV, wg * 64, dv, dv_rows, p.dv_stride[1], valid, v_cols, tid,
                                            1 + wg);
      store_rows_staged<kBlock, kD, kBF16>(reinterpret_cast<char*>(stage), 0, dk, dk_rows, p.dk_stride[1], valid,
                                           qk_cols, tid, 1 + wg);
    }
  } else {
    if (tid == 0) cuda::ptx::cp_async_bulk_wait_group(cuda::ptx::n32_t<0>{});
    store_rows_direct<kD, kBF16>(dk, dk_rows, p.dk_stride[1], valid, qk_cols, tid);
    store_rows_direct<kD, kBF16>(dv, dv_rows, p.dv_stride[1], valid, v_cols, tid);
  }
  if constexpr (Cfg::kTrace) tr.cta(1, clock64());
}

// ---- d192 and d256: 64 keys a CTA, the warpgroups splitting every GEMM ------------------------------
// A warpgroup cannot hold dK and dV of 64 keys at these head dims (192 or 256 registers), so the
// two split the 64 keys' S^T and dP^T by queries (32 each): P^T and dS^T go through shared memory,
// where both warpgroups read them as the A operand (SS). P^T and dS^T have two buffers, so a step
// needs one CTA barrier (both warpgroups' halves of them written) and none at its end: a
// warpgroup writes them again two steps on, past the next step's barrier.
//   d256: the warpgroups split dK and dV by columns (128 each), and dQ = dS K is two 64-column
//   pieces a warpgroup, added into the fp32 accumulator by float4 atomics (the shared memory
//   holds no staging buffer beside double-buffered Q and dO).
//   d192: warpgroup 0 holds dV and warpgroup 1 dK, each all 192 columns (96 registers; columns
//   split in 96s would start a warpgroup's MN-major operand halfway through a 64-column swizzle
//   atom). dQ's three 64-column pieces go to the warpgroups in turn, piece c of step s to
//   warpgroup (s + c) % 2, two and one, swapped every step; each piece is staged in the
//   warpgroup's 16 KB of shared memory and added by a bulk reduction (cp.reduce.async.bulk), or
//   (Cfg::kDqAtomics) by float4 atomics as at d256.
//   192 / 128 (Cfg::kDv, DeepSeek's): V, dO and dV of 128 columns; dP^T over 128; warpgroup 0's
//   dV (64 registers of its 96) takes dQ's pieces 0 and 2 every step, warpgroup 1's dK piece 1.
template <class Cfg>
struct WgSmemSplit {
  static constexpr int kD = Cfg::kD, kTile = kBlock * kD * 2;  // K or Q: 64 rows
  static constexpr int kTileV = kBlock * Cfg::kDv * 2;         // V or dO (kTile but at 192 / 128)
  static constexpr int kQBytes = kTile, kDoBytes = kTileV, kBufs = Cfg::kStepBufs;  // 2 shipped
  static constexpr int kK = 0, kV = kTile, kQ = kTile + kTileV, kDo = kQ + kBufs * kTile;
  static constexpr int kPBytes = kBlock * kBlock * 2;  // P^T or dS^T: [64 keys][64 queries]
  static constexpr int kPt = kDo + kBufs * kTileV, kDst = kPt + 2 * kPBytes;
  // d192 without atomics: each warpgroup's fp32 pieces of dQ, [64][64] (Cfg::kDqStages of them),
  // for its bulk reductions.
  static constexpr bool kDqStage = kD == 192 && !Cfg::kDqAtomics;
  static constexpr int kDqStages = Cfg::kDqStages;
  static constexpr int kStage = kDst + 2 * kPBytes, kStageBytes = kDqStage ? 2 * kDqStages * kBlock * 64 * 4 : 0;
  static constexpr int kLse = kStage + kStageBytes, kDelta = kLse + kBufs * kBlock * 4;
  static constexpr int kBars = kDelta + kBufs * kBlock * 4;  // StepRing's full and empty
  using Ring = StepRing<kBufs>;
  static constexpr int kKvBar = kBars + 2 * kBufs * 8;  // Cfg::kKvTma: K and V landed
  static constexpr int kBytes = kKvBar + (Cfg::kKvTma ? 8 : 0) + 1024;
  static_assert(kBytes <= 227 * 1024, "the split dK/dV kernel's shared memory");
};

// A warpgroup's dK and dV accumulators: at d256 its 128 columns of each; at d192 all 192 columns
// of dV (warpgroup 0) or of dK (warpgroup 1); at 192 / 128 warpgroup 0's dV the first 64 floats
// (acc_view).
template <int kD>
struct SplitAcc {
  float dv[64] = {}, dk[64] = {};
};
template <>
struct SplitAcc<192> {
  float acc[96] = {};
};
template <int kCols>
__device__ __forceinline__ auto acc_view(float (&acc)[96]) -> float (&)[kCols / 2] {
  static_assert(kCols <= 192, "an accumulator of at most 192 columns");
  return reinterpret_cast<float(&)[kCols / 2]>(acc);
}

// tm_q, tm_do: Q and dO as ptx::map_bshd_16bit_sw128 maps in boxes of 64 rows (the _folded maps
// with Cfg::kFoldedBoxes); tm_k, tm_v (Cfg::kKvTma) K and V the same.
template <class Cfg>
__global__ void __launch_bounds__(kThreads, 1)
    bwd_dkdv_split_kernel(const detail::BwdParams p, const __grid_constant__ CUtensorMap tm_q,
                          const __grid_constant__ CUtensorMap tm_do, const __grid_constant__ CUtensorMap tm_k,
                          const __grid_constant__ CUtensorMap tm_v) {
  static_assert(Cfg::kD == 192 || Cfg::kD == 256, "the split dK/dV kernel covers head dims 192 and 256");
  namespace wgmma = ptx::wgmma;
  using L = WgSmemSplit<Cfg>;
  static_assert(L::kBufs == 2, "a step's Q/dO buffer is s & 1, as its P^T and dS^T buffer");
  constexpr int kD = Cfg::kD, kDv = Cfg::kDv;
  constexpr bool kByOperand = kD == 192;  // (else by columns)
  constexpr bool kBF16 = Cfg::kBF16;
  constexpr auto kType = kBF16 ? wgmma::Type::kBF16 : wgmma::Type::kF16;
  [[maybe_unused]] const uint64_t t_entry = Cfg::kTrace ? clock64() : 0;
  char* smem = smem_1024();
  const int k0 = blockIdx.x * kBlock;
  SeqSpan seq;
  if (!cta_sequence<Cfg>(p, k0, seq)) return;
  const Walk walk = walk_of<Cfg::kVarlen>(p, seq, k0, kBlock);
  const int b = walk.b, hk = walk.hk, steps = walk.steps();
  // The warpgroup, read through a shuffle from lane 0 so that ptxas knows it is uniform across the
  // warp: at d192 the warpgroups run different GEMMs (dV or dK, and their dQ pieces in turn), and
  // a branch on threadIdx.x / 128 it takes for divergent, inserting warpgroup arrives that
  // serialize the kernel's wgmma (ptxas C7520, "serialized due to program dependence on
  // compiler-inserted WG.AR in divergent path").
  // (d256's warpgroups run the same GEMMs: its index is left as it was.)
  const int wg = Cfg::kDivergentWg || !kByOperand ? int(threadIdx.x / 128)
                                                   : __shfl_sync(0xffffffffu, int(threadIdx.x / 128), 0);
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;
  const Visibility vis = Cfg::kVarlen ? Visibility{seq.q_len, seq.k_len, p.window_left, p.window_right}
                                      : Visibility{p.seqlen_q, p.seqlen_k, p.window_left, p.window_right};

  const float* sLse = reinterpret_cast<const float*>(smem + L::kLse);
  const float* sDelta = reinterpret_cast<const float*>(smem + L::kDelta);
  const auto ring = start_dkdv<L, kBlock, Cfg>(p, &tm_q, &tm_do, &tm_k, &tm_v, walk, k0, Cfg::kVarlen ? seq.k_len : p.seqlen_k, smem);

  using ptx::smem_addr;
  // S^T, dP^T: A = K or V (K-major), B = this warpgroup's 32 queries of Q or dO (K-major).
  const uint64_t k_desc = wgmma::desc_sw128(smem_addr(smem + L::kK), 16, 1024);
  const uint64_t v_desc = wgmma::desc_sw128(smem_addr(smem + L::kV), 16, 1024);
  const uint64_t q_desc = wgmma::desc_sw128(smem_addr(smem + L::kQ) + wg * 32 * 128, 16, 1024);
  const uint64_t do_desc = wgmma::desc_sw128(smem_addr(smem + L::kDo) + wg * 32 * 128, 16, 1024);
  // dV, dK: A = P^T or dS^T (K-major), B = this warpgroup's columns of dO or Q (MN-major): at d256
  // its 128, at d192 all.
  const uint64_t pt_desc = wgmma::desc_sw128(smem_addr(smem + L::kPt), 16, 1024);
  const uint64_t dst_desc = wgmma::desc_sw128(smem_addr(smem + L::kDst), 16, 1024);
  const uint32_t col_off = kByOperand ? 0 : 2 * wg * kBlock * 128;
  const uint64_t do_mn = wgmma::desc_sw128(smem_addr(smem + L::kDo) + col_off, kBlock * 128, 1024);
  const uint64_t q_mn = wgmma::desc_sw128(smem_addr(smem + L::kQ) + col_off, kBlock * 128, 1024);
  // dQ: A = dS (dS^T stored, so MN-major), B = K's 64-column block (MN-major).
  const uint64_t ds_mn = wgmma::desc_sw128(smem_addr(smem + L::kDst), kBlock * 128, 1024);
  const uint64_t kq_mn = wgmma::desc_sw128(smem_addr(smem + L::kK), kBlock * 128, 1024);
  // d192 (L::kDqStage): this warpgroup's stages, and how many pieces it has staged (the next
  // one's stage: turn % L::kDqStages).
  [[maybe_unused]] float* const stages = reinterpret_cast<float*>(smem + L::kStage) + wg * L::kDqStages * kBlock * 64;
  [[maybe_unused]] int turn = 0;

  [[maybe_unused]] StepTrace tr;
  if constexpr (Cfg::kTrace) {
    tr.open(p.trace, wg);
    tr.cta(0, t_entry);
  }
  SplitAcc<kD> a;
  StepAt at = walk.first(), at_next = walk.next(at);  // steps s and s + 1
  for (int s = 0; s < steps; ++s, at = at_next, at_next = walk.next(at_next)) {
    const StepAt here = walk_step<Cfg>(walk, s, at);
    const int h = here.h, q0 = here.q0, buf = s & 1;
    if constexpr (Cfg::kTrace) tr.stamp(s, 0);
    if (threadIdx.x == 0 && s + 1 < steps)
      load_q_step<L, Cfg>(p, &tm_q, &tm_do, b, walk.q_off, s + 1, walk_step<Cfg>(walk, s + 1, at_next), smem, ring);
    ring.wait(s);
    // Varlen, rows past the sequence: each warpgroup zeroes its own 32 rows, which its S^T and dP^T
    // read; the step's CTA barrier comes before the other's dV and dK read them.
    if (Cfg::kVarlen && q0 + kBlock > vis.seqlen_q) {
      zero_tail_rows<kBlock, kD, 128, kDv>(smem + L::kQ + buf * L::kQBytes, smem + L::kDo + buf * L::kDoBytes,
                                           max(vis.seqlen_q - q0, 32 * wg), 32 * wg + 32, tid);
      ptx::named_bar_sync(1 + wg, 128);
    }
    if constexpr (Cfg::kTrace) tr.stamp(s, 1);
    const uint32_t p_off = buf * L::kPBytes;  // this step's P^T and dS^T buffer
    const uint32_t pt_tile = smem_addr(smem + L::kPt) + p_off, dst_tile = smem_addr(smem + L::kDst) + p_off;

    // acc = A B^T over 16 `steps` columns: A the block's K or V, B this warpgroup's 32 queries of Q
    // or dO (buf_bytes a step buffer).
    auto gemm = [&](int steps, uint32_t buf_bytes, float(&acc)[16], uint64_t a_desc, uint64_t b_desc) {
#pragma unroll
      for (int kk = 0; kk < steps; ++kk)
        wgmma::mma_ss<32, kType>(acc, wgmma::desc_advance(a_desc, wgmma::kmajor_step(kk, kBlock)),
                                 wgmma::desc_advance(b_desc, buf * buf_bytes + wgmma::kmajor_step(kk, kBlock)), kk > 0);
      wgmma::commit_group();
    };
    float st[16], dpt[16];
    wgmma::fence();
    gemm(kD / 16, L::kQBytes, st, k_desc, q_desc);
    gemm(kDv / 16, L::kDoBytes, dpt, v_desc, do_desc);

    // Element 4j + e: key 16 warp + g (+ 8 for e >= 2), query 32 wg + 8j + 2t + (e & 1). This
    // thread's queries' LSE (log2 units) and D, read while S^T and dP^T are computed.
    // This warpgroup's 32 query rows of the step's buffer.
    const auto stats = RowStats<Cfg::kPairedStats, Cfg::kStatsLds>::template at<kBlock>(sLse, sDelta, buf).from(32 * wg);
    float2 lse2[4], delta2[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      lse2[j] = stats.lse2(8 * j + 2 * t);
      delta2[j] = stats.d2(8 * j + 2 * t);
    }
    const bool whole = vis.whole(q0, kBlock, k0, kBlock);
    wgmma::wait_group<1>();
    wgmma::pin(st);
    if constexpr (Cfg::kTrace) tr.stamp(s, 2);
    uint32_t pv[8];  // Cfg::kStMatrix: P^T's pairs, stored after the loop
    with_mask<Cfg::kMaskHoist>(!whole, [&](auto masked) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int qc = 32 * wg + 8 * j + 2 * t;
        const float l0 = lse2[j].x, l1 = lse2[j].y;
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
          const int kr = 16 * warp + g + 8 * hr, i = 4 * j + 2 * hr;
          pv[2 * j + hr] = p_pair<Cfg>(st[i], st[i + 1], j, l0, l1, p, masked, vis, q0 + qc, k0 + kr);
          if constexpr (!Cfg::kStMatrix) ptx::st_shared_b32(pt_tile + sw128<kBlock>(kr, qc), pv[2 * j + hr]);
        }
      }
    });
    if constexpr (Cfg::kStMatrix) stsm_rows<kBlock, 4>(pt_tile, pv, 16 * warp, 32 * wg, lane);
    if constexpr (Cfg::kTrace) tr.stamp(s, 3);
    wgmma::wait_group<0>();
    wgmma::pin(dpt);
    if constexpr (Cfg::kTrace) tr.stamp(s, 4);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int qc = 32 * wg + 8 * j + 2 * t;
      const float d0 = delta2[j].x, d1 = delta2[j].y;
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        const int kr = 16 * warp + g + 8 * hr, i = 4 * j + 2 * hr;
        pv[2 * j + hr] = pack2<kBF16>(st[i] * (dpt[i] - d0) * p.scale, st[i + 1] * (dpt[i + 1] - d1) * p.scale);
        if constexpr (!Cfg::kStMatrix) ptx::st_shared_b32(dst_tile + sw128<kBlock>(kr, qc), pv[2 * j + hr]);
      }
    }
    if constexpr (Cfg::kStMatrix) stsm_rows<kBlock, 4>(dst_tile, pv, 16 * warp, 32 * wg, lane);
    if constexpr (Cfg::kTrace) tr.stamp(s, 5);
    ptx::fence_proxy_async_smem();  // P^T and dS^T, before wgmma reads them
    __syncthreads();
    if constexpr (Cfg::kTrace) tr.stamp(s, 6);

    wgmma::fence();
    if constexpr (kByOperand) {
      // dV += P^T dO (warpgroup 0: kDv columns, its accumulator's first kDv / 2 floats) or
      // dK += dS^T Q (warpgroup 1: 192 columns), over the 64 queries.
      if (wg == 0) {
#pragma unroll
        for (int kk = 0; kk < kBlock / 16; ++kk)
          wgmma::mma_ss_tb<kDv, kType>(acc_view<kDv>(a.acc), wgmma::desc_advance(pt_desc, p_off + kk * 32),
                                       wgmma::desc_advance(do_mn, buf * L::kDoBytes + wgmma::mn_step(kk)), 1);
      } else {
#pragma unroll
        for (int kk = 0; kk < kBlock / 16; ++kk)
          wgmma::mma_ss_tb<kD, kType>(a.acc, wgmma::desc_advance(dst_desc, p_off + kk * 32),
                                      wgmma::desc_advance(q_mn, buf * L::kQBytes + wgmma::mn_step(kk)), 1);
      }
    } else {
      // dV += P^T dO, dK += dS^T Q: this warpgroup's 128 columns, over the 64 queries.
#pragma unroll
      for (int kk = 0; kk < kBlock / 16; ++kk) {
        const uint32_t b_off = buf * L::kTile + wgmma::mn_step(kk);
        wgmma::mma_ss_tb<128, kType>(a.dv, wgmma::desc_advance(pt_desc, p_off + kk * 32), wgmma::desc_advance(do_mn, b_off), 1);
        wgmma::mma_ss_tb<128, kType>(a.dk, wgmma::desc_advance(dst_desc, p_off + kk * 32), wgmma::desc_advance(q_mn, b_off), 1);
      }
    }
    wgmma::commit_group();

    // dQ += dS K: 64-column pieces into the fp32 accumulator, two a warpgroup at d256, piece c to
    // warpgroup (s + c) % 2 at d192, and to warpgroup c % 2 at 192 / 128 (pieces 0 and 2 to the
    // one whose dV has 128 columns: each warpgroup's step then holds the same GEMM work).
    if (!p.deterministic) {
      constexpr int kPieces = kByOperand ? kD / 64 : 2;  // (d256: this warpgroup's)
      [[maybe_unused]] int done = 0;                     // pieces of this warpgroup's so far
#pragma unroll
      for (int c = 0; c < kPieces; ++c) {
        if constexpr (kByOperand)
          if (((kDv == kD ? s + c : c) & 1) != wg) continue;
        const int col0 = kByOperand ? 64 * c : 128 * wg + 64 * c;
        float dq[32];
        wgmma::fence();
#pragma unroll
        for (int kk = 0; kk < kBlock / 16; ++kk)
          wgmma::mma_ss_tt<64, kType>(dq, wgmma::desc_advance(ds_mn, p_off + wgmma::mn_step(kk)),
                                      wgmma::desc_advance(kq_mn, (col0 / 64) * kBlock * 128 + wgmma::mn_step(kk)), kk > 0);
        wgmma::commit_group();
        wgmma::wait_group<0>();
        wgmma::pin(dq);
        if constexpr (Cfg::kTrace)
          if (done++ == 0) tr.stamp(s, 7);
        if constexpr (Cfg::kDqUnreduced) {
          // (Diagnostic: the piece is dropped.)
        } else if constexpr (L::kDqStage) {
          // The reduction that last read this stage is done reading (with two stages, the one
          // before the warpgroup's last: the last reads the other); then it is rewritten and
          // reduced.
          float* const stage = stages + (L::kDqStages > 1 ? (turn++ & 1) * kBlock * 64 : 0);
          if (tid == 0) {
            if constexpr (L::kDqStages > 1) cuda::ptx::cp_async_bulk_wait_group_read(cuda::ptx::n32_t<1>{});
            else cuda::ptx::cp_async_bulk_wait_group_read(cuda::ptx::n32_t<0>{});
          }
          ptx::named_bar_sync(1 + wg, 128);
          const uint32_t piece = smem_addr(stage) + 16 * tid;
#pragma unroll
          for (int j = 0; j < 8; ++j)
            ptx::st_shared_v4_f32(piece + 16 * 128 * j, dq[4 * j], dq[4 * j + 1], dq[4 * j + 2], dq[4 * j + 3]);
          ptx::fence_proxy_async_smem();
          ptx::named_bar_sync(1 + wg, 128);
          if (tid == 0) {
            cuda::ptx::cp_reduce_async_bulk(cuda::ptx::space_global, cuda::ptx::space_shared, cuda::ptx::op_add,
                                            dq_piece_at<kD>(p, b, h, q0, col0), stage, uint32_t(kBlock * 64 * 4));
            cuda::ptx::cp_async_bulk_commit_group();
          }
        } else {
          add_piece(dq_piece_at<kD>(p, b, h, q0, col0), dq, tid);
        }
      }
    }
    wgmma::wait_group<0>();
    if constexpr (kByOperand) {
      wgmma::pin(a.acc);
    } else {
      wgmma::pin(a.dk);
      wgmma::pin(a.dv);
    }
    if constexpr (Cfg::kTrace) tr.stamp(s, 8);
    ring.release(s);
  }

  // dK, dV: keys k0 + 16 warp + g (+ 8), this warpgroup's columns (d256: 128 wg + 8j + 2t).
  // (With varlen the sequence's length and first row read again here, not held through the steps.)
  const SeqSpan end_seq = seq_span<Cfg::kVarlen>(p, b);
  const int valid = end_seq.k_len - k0;
  const int out_col0 = kByOperand ? 0 : 128 * wg;
  uint16_t* dk_rows = static_cast<uint16_t*>(p.dk) + b * p.dk_stride[0] + hk * p.dk_stride[2] +
                      int64_t(end_seq.k_off + k0) * p.dk_stride[1] + out_col0;
  uint16_t* dv_rows = static_cast<uint16_t*>(p.dv) + b * p.dv_stride[0] + hk * p.dv_stride[2] +
                      int64_t(end_seq.k_off + k0) * p.dv_stride[1] + out_col0;
  if constexpr (L::kDqStage)  // the warpgroup's last reduction has read its stage before the CTA exits
    if (tid == 0) cuda::ptx::cp_async_bulk_wait_group_read(cuda::ptx::n32_t<0>{});
  // The columns stored: the tensors' (qk_cols_of, v_cols_of: kD's and kDv's but in place), from the
  // warpgroup's first (out_col0).
  // (Constants but in place, so that the other configurations' stores are as they were.)
  const int dk_cols = Cfg::kInPlace ? qk_cols_of<Cfg>(p) - out_col0 : kByOperand ? kD : 128;
  const int dv_cols = Cfg::kInPlace ? v_cols_of<Cfg>(p) - out_col0 : kByOperand ? kDv : 128;
  if constexpr (kByOperand) {
    // Warpgroup 0 writes dV (kDv columns) through the first dO buffer, warpgroup 1 dK through
    // the first Q buffer, once both are past their last step.
    if constexpr (Cfg::kStagedStores) __syncthreads();
    if (wg == 0) {
      if constexpr (Cfg::kStagedStores)
        store_rows_staged<kBlock, kDv, kBF16>(smem + L::kDo, 0, acc_view<kDv>(a.acc), dv_rows, p.dv_stride[1], valid,
                                              dv_cols, tid, 1);
      else
        store_rows_direct<kDv, kBF16>(acc_view<kDv>(a.acc), dv_rows, p.dv_stride[1], valid, dv_cols, tid);
    } else {
      if constexpr (Cfg::kStagedStores)
        store_rows_staged<kBlock, kD, kBF16>(smem + L::kQ, 0, a.acc, dk_rows, p.dk_stride[1], valid, dk_cols, tid, 2);
      else
        store_rows_direct<kD, kBF16>(a.acc, dk_rows, p.dk_stride[1], valid, dk_cols, tid);
    }
  } else if constexpr (Cfg::kStagedStores) {
    // Through the first Q and dO buffers, once both warpgroups are past their last step: the
    // warpgroup's 128 columns are 64-column blocks 2 wg and 2 wg + 1 of each.
    __syncthreads();
    store_rows_staged<kBlock, 128, kBF16>(smem + L::kQ + 2 * wg * kBlock * 128, 0, a.dk, dk_rows, p.dk_stride[1],
                                          valid, dk_cols, tid, 1 + wg);
    store_rows_staged<kBlock, 128, kBF16>(smem + L::kDo + 2 * wg * kBlock * 128, 0, a.dv, dv_rows, p.dv_stride[1],
                                          valid, dv_cols, tid, 1 + wg);
  } else {
    store_rows_direct<128, kBF16>(a.dk, dk_rows, p.dk_stride[1], valid, dk_cols, tid);
    store_rows_direct<128, kBF16>(a.dv, dv_rows, p.dv_stride[1], valid, dv_cols, tid);
  }
  if constexpr (Cfg::kTrace) tr.cta(1, clock64());
}

}  // namespace fa4::sm90::bwd
