// sm90 decoding: a KV head's few query rows (seqlen_q x the query group, at most 16) against its
// keys, on mma.sync tiles of 16 rows instead of wgmma's 64.
//
// A decoding call reads each KV head's K and V once and does little tensor work a byte. On the
// wgmma tiles a folded decoding tile is 64 rows of which 4-16 are real, and the softmax of all 64
// is paid a key block (docs/perf-notes.md, "d64 decoding on wider key blocks"). Here one m16n8k16
// tile holds the rows, so a thread's softmax is 4 scores a 16-key slice.
//
// Grid (batch x heads_kv, splits): CTA (pair, s) takes keys [s chunk, (s + 1) chunk) of its entry's
// (FwdParams::seqused_k, else seqlen_k; contiguous or on a paged cache's pages), cut to what its
// rows may see (causal or window bounds, bottom-right). Four warps; each key block of kBlockN keys is a stage of a cp.async ring (K and V
// rows, the 16-byte pieces of a row swizzled by the row's low three bits so ldmatrix reads are
// conflict-free; keys past the entry's read as zeros, never from memory), and warp w takes keys
// [16 w, 16 w + 16) of it: S = Q K^T by two m16n8k16 products a 16-column slice of the head dim,
// an online softmax of its rows, O += P V with P from registers and V by ldmatrix.trans. The four
// warps' (max, sum, O) meet in shared memory at the end. One split: O and the LSE written; more:
// each CTA's O (normalised) and LSE (log2) go to scratch, and decode_combine_kernel (a CTA a row)
// merges a pair's splits.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "fa4/numerics/online_softmax.h"
#include "ptx/ldmatrix.h"
#include "ptx/sync.h"
#include "sm90/decode_plan.h"

namespace fa4::sm90::decode {

constexpr int kRows = kDecodeRows;      // a KV head's query rows, one m16 tile (rows past the call's: zeros)
constexpr int kBlockN = kDecodeBlockKeys;  // keys a stage, 16 a warp
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
// Stages of the ring: d64 6 x 16 KB, d128 3 x 32 KB (two CTAs a multiprocessor each). d64 on 4 x 16 KB
// at three CTAs measured 7 % slower where a launch has fewer CTAs than its slots (32 x 4k: each
// CTA's in-flight bytes count), and no faster elsewhere (docs/perf-notes.md, "The decoding kernel's
// stages and loads").
template <int kD>
constexpr int kStages = kD == 64 ? 6 : 3;
template <int kD>
constexpr int kCtasPerSm = decode_ctas_per_sm(kD);
template <int kD>
constexpr int kStageBytes = 2 * kBlockN * kD * 2;  // K and V
template <int kD>
constexpr int kSmemBytes = kStages<kD> * kStageBytes<kD>;
static_assert(kSmemBytes<64> >= kWarps * kRows * (64 + 2) * 4 && kSmemBytes<128> >= kWarps * kRows * (128 + 2) * 4,
              "the warps' partial rows fit where the ring was");
static_assert(kCtasPerSm<64> * kSmemBytes<64> <= 227 * 1024 && kCtasPerSm<128> * kSmemBytes<128> <= 227 * 1024,
              "the CTAs a multiprocessor fit its shared memory");

struct DecodeParams {
  const void* q;
  const void* k;
  const void* v;
  void* o;
  float* lse;  // may be null; [batch, heads_q, seqlen_q], natural log
  int64_t q_stride[3], k_stride[3], v_stride[3], o_stride[3];  // elements: [batch, seq, head]
  // The 16-byte pieces a row of q and k (qk_pieces) and of v (v_pieces) holds (FwdParams::qk_cols,
  // v_cols over 8): the pieces past them load as zeros. kD / 8 where the tensors are whole.
  int qk_pieces, v_pieces;
  const int* seqused_k;  // entry b's keys end at seqused_k[b] (clamped to [0, seqlen_k]); null: seqlen_k
  // Batched caches: entry b's keys start at row leftpad_k[b] (clamped to [0, their end]); null: 0.
  const int* leftpad_k;
  // A paged cache (FwdParams::block_table): entry b's key j on page block_table[b table_stride + j >>
  // page_shift], row j & (2^page_shift - 1); k_stride[0] and v_stride[0] step pages. Null: batched.
  const int* block_table;
  int table_stride, page_shift;
  int seqlen_q, seqlen_k, heads_q, heads_kv, group;  // group = heads_q / heads_kv
  int window_left, window_right;                     // -1: unbounded; causal is right = 0
  float scale_log2;
  int splits, chunk;  // keys a split: a multiple of kBlockN
  float* part_o;      // splits > 1: [pair][split][kRows][kD], each CTA's O normalised
  float* part_lse;    // splits > 1: [pair][split][kRows], log2 units; -inf where a row saw no key
  const float* sink;  // FwdParams::sink: [heads_q], folded in by the CTA that writes O (null: none)
  int sink_group;     // FwdParams::sink_group, sink_mask: a folded query group's heads (sink_of)
  uint32_t sink_mask;
};

// Query row r of a KV head's rows: query r / group of query head hk * group + r % group.
struct RowAt {
  int q, h;
};
__host__ __device__ __forceinline__ RowAt row_at(const DecodeParams& p, int hk, int r) {
  return {r / p.group, hk * p.group + r % p.group};
}

// Row r's sink (p.sink not null), in log2 units: its query head's (a query group folded into rows
// by fold_query_groups comes as one head of group rows, row r taking head hk * group + r).
__device__ __forceinline__ float sink_of(const DecodeParams& p, int hk, int r) {
  const RowAt at = row_at(p, hk, r);
  return __ldg(p.sink + detail::sink_index(at.h, at.q, p.sink_group, p.sink_mask)) * numerics::kLog2e;
}

// The keys query q may see among an entry's `keys`: [lo, hi], bottom-right aligned.
struct KeyRange {
  int lo, hi;
};
__host__ __device__ __forceinline__ KeyRange key_range(const DecodeParams& p, int keys, int q) {
  const int shift = keys - p.seqlen_q;
  const int lo = p.window_left >= 0 ? q + shift - p.window_left : 0;
  const int hi = p.window_right >= 0 ? q + shift + p.window_right : keys - 1;
  return {lo < 0 ? 0 : lo, hi < keys - 1 ? hi : keys - 1};
}

template <bool kBF16>
__device__ __forceinline__ uint32_t pack2(float a, float b) {
  if constexpr (kBF16) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<const uint32_t*>(&h);
  } else {
    const __half2 h = __floats2half2_rn(a, b);
    return *reinterpret_cast<const uint32_t*>(&h);
  }
}
template <bool kBF16>
__device__ __forceinline__ float2 unpack2(uint32_t x) {
  if constexpr (kBF16) return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&x));
  else return __half22float2(*reinterpret_cast<const __half2*>(&x));
}

// c += a b: m16n8k16, 16-bit inputs, fp32 accumulators (PTX ISA 9.7.14.5.14).
template <bool kBF16>
__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (kBF16)
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// 16 bytes from global to shared, or zeros where `bytes` is 0 (cp.async, PTX ISA 9.7.9.25).
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// Byte offset of 16-byte piece c of row `row` in a tile of kD-column rows (the swizzle).
template <int kD>
__device__ __forceinline__ uint32_t tile_offset(int row, int c) {
  return uint32_t(row * kD * 2 + ((c ^ (row & 7)) << 4));
}

// Natural-log LSE of a row from its max and sum in log2 units (numerics::row_lse, MUFU's log2);
// -inf for a row without keys.
__device__ __forceinline__ float natural_lse(float m, float l) {
  return numerics::row_lse({m, l}, [](float x) { return __log2f(x); });
}

template <int kD, bool kBF16>
__global__ void __launch_bounds__(kThreads, kCtasPerSm<kD>) decode_kernel(const DecodeParams p) {
  constexpr int kChunks = kD / 8;  // 16-byte pieces a row
  extern __shared__ __align__(128) uint8_t smem[];
  cudaTriggerProgrammaticLaunchCompletion();  // the merge's CTAs may start; they wait for this grid
  // Launched as the programmatic dependent of the kernel before it in the stream (an append's,
  // which writes the keys, values, rotated queries and counts read here): nothing is read before
  // that grid has ended and its writes are visible. (A no-op where it was launched plainly.)
  cudaGridDependencySynchronize();
  const int pair = blockIdx.x, split = blockIdx.y;
  const int b = pair / p.heads_kv, hk = pair % p.heads_kv;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int rows = p.seqlen_q * p.group;
  const int end = p.seqused_k == nullptr ? p.seqlen_k : min(max(__ldg(p.seqused_k + b), 0), p.seqlen_k);
  const int pad = p.leftpad_k == nullptr ? 0 : min(max(__ldg(p.leftpad_k + b), 0), end);
  const int keys = end - pad;  // the entry's, rows [pad, end)
  // The CTA's keys: its split's, cut to what its first row may see from below and its last from
  // above (a row's range only moves right with its query).
  const KeyRange first = key_range(p, keys, 0), last = key_range(p, keys, p.seqlen_q - 1);
  const int k_begin = max(split * p.chunk, first.lo), k_end = min((split + 1) * p.chunk, last.hi + 1);
  const int blocks = k_end > k_begin ? (k_end - (k_begin / kBlockN) * kBlockN + kBlockN - 1) / kBlockN : 0;
  const int j_first = (k_begin / kBlockN) * kBlockN;

  const uint16_t* kbase = static_cast<const uint16_t*>(p.k) + hk * p.k_stride[2];
  const uint16_t* vbase = static_cast<const uint16_t*>(p.v) + hk * p.v_stride[2];
  const int* table = p.block_table != nullptr ? p.block_table + int64_t(b) * p.table_stride : nullptr;
  const uint32_t s_base = ptx::smem_addr(smem);
  // Block i's K and V rows into stage i % kStages; rows at or past k_end as zeros (never read: a
  // cache's rows past an entry's keys may hold anything). A thread copies one 16-byte piece c of
  // rows r0, r0 + kRowStep, ... of each block; on a batched cache its rows' addresses advance by a
  // block's rows a call (the blocks are loaded in order), so the copy's address math is a few adds:
  // with each row's offset computed afresh the loads took 310 of the loop's 574 instructions (d128).
  constexpr int kRowStep = kThreads / kChunks, kPieces = kBlockN / kRowStep;  // rows a thread, a block
  const int c = tid % kChunks, r0 = tid / kChunks;
  const uint32_t s_piece = tile_offset<kD>(r0, c);  // (its rows' swizzle is r0's: row & 7 is r0 & 7)
  const uint16_t* k_row = kbase + b * p.k_stride[0] + int64_t(pad + j_first + r0) * p.k_stride[1] + c * 8;
  const uint16_t* v_row = vbase + b * p.v_stride[0] + int64_t(pad + j_first + r0) * p.v_stride[1] + c * 8;
  const int64_t k_step = int64_t(kRowStep) * p.k_stride[1], v_step = int64_t(kRowStep) * p.v_stride[1];
  // The thread's piece inside the caller's columns of K and of V (past them: zeros).
  const bool k_live = c < p.qk_pieces, v_live = c < p.v_pieces;
  auto load = [&](int i) {
    const uint32_t st = s_base + uint32_t((i % kStages<kD>) * kStageBytes<kD>) + s_piece;
    const int j0 = j_first + i * kBlockN + r0;  // the thread's first row's key
    if (table == nullptr) {
#pragma unroll
      for (int x = 0; x < kPieces; ++x) {
        const bool in = j0 + x * kRowStep < k_end, kin = in && k_live, vin = in && v_live;
        const uint32_t at = st + uint32_t(x * kRowStep * kD * 2);
        cp_async_16(at, kin ? k_row + x * k_step : kbase, kin ? 16 : 0);
        cp_async_16(at + kBlockN * kD * 2, vin ? v_row + x * v_step : vbase, vin ? 16 : 0);
      }
      k_row += kPieces * k_step, v_row += kPieces * v_step;
      return;
    }
#pragma unroll
    for (int x = 0; x < kPieces; ++x) {
      const int j = j0 + x * kRowStep;
      const bool in = j < k_end;
      int64_t at = 0, vat = 0;  // the row's first element in K and in V
      if (in) {
        const int64_t page = __ldg(table + (j >> p.page_shift)), r = j & ((1 << p.page_shift) - 1);
        at = page * p.k_stride[0] + r * p.k_stride[1];
        vat = page * p.v_stride[0] + r * p.v_stride[1];
      }
      const uint32_t to = st + uint32_t(x * kRowStep * kD * 2);
      cp_async_16(to, in && k_live ? kbase + at + c * 8 : kbase, in && k_live ? 16 : 0);
      cp_async_16(to + kBlockN * kD * 2, in && v_live ? vbase + vat + c * 8 : vbase, in && v_live ? 16 : 0);
    }
  };
#pragma unroll
  for (int i = 0; i < kStages<kD> - 1; ++i) {
    if (i < blocks) load(i);
    cp_async_commit();
  }

  // Q's A fragments, rows g and g + 8, every 16-column slice; rows past the call's are zeros.
  uint32_t qa[kD / 16][4];
  {
    const uint16_t* qrow[2];
    bool real[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = g + 8 * h;
      real[h] = r < rows;
      const RowAt at = row_at(p, hk, real[h] ? r : 0);
      qrow[h] = static_cast<const uint16_t*>(p.q) + b * p.q_stride[0] + at.q * p.q_stride[1] + at.h * p.q_stride[2];
    }
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk)
#pragma unroll
      for (int x = 0; x < 4; ++x) {  // a0: row g, cols 2t; a1: row g + 8; a2, a3: cols 2t + 8
        const int h = x & 1, col = kk * 16 + 2 * t + (x >> 1) * 8;
        qa[kk][x] = real[h] && col < 8 * p.qk_pieces ? __ldg(reinterpret_cast<const uint32_t*>(qrow[h] + col)) : 0u;
      }
  }
  // The thread's rows' key ranges (rows past the call's take row 0's: finite, never written).
  KeyRange range[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = g + 8 * h;
    range[h] = key_range(p, keys, row_at(p, hk, r < rows ? r : 0).q);
    range[h].lo = max(range[h].lo, k_begin);
    range[h].hi = min(range[h].hi, k_end - 1);
  }

  float o[kD / 8][4];
#pragma unroll
  for (int n = 0; n < kD / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

  for (int i = 0; i < blocks; ++i) {
    cp_async_wait<kStages<kD> - 2>();
    __syncthreads();  // block i landed for every thread; every warp is past block i - 1
    if (i + kStages<kD> - 1 < blocks) load(i + kStages<kD> - 1);
    cp_async_commit();
    const uint32_t ks = s_base + uint32_t((i % kStages<kD>) * kStageBytes<kD>), vs = ks + kBlockN * kD * 2;
    const int kw = warp * 16;  // the warp's first key in the block
    float s[2][4] = {};
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      uint32_t kb[4];  // keys 0-7: pieces 2kk, 2kk + 1; keys 8-15: the same
      ptx::ldmatrix_x4(kb, ks + tile_offset<kD>(kw + (lane / 16) * 8 + lane % 8, 2 * kk + (lane / 8) % 2));
      mma16816<kBF16>(s[0], qa[kk], kb[0], kb[1]);
      mma16816<kBF16>(s[1], qa[kk], kb[2], kb[3]);
    }
    // Scores in log2 units, masked outside each row's keys; the rows' new maxima.
    const int j0 = j_first + i * kBlockN + kw;
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < 2; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int h = e >> 1, j = j0 + 8 * n + 2 * t + (e & 1);
        const float v = (j >= range[h].lo && j <= range[h].hi) ? s[n][e] * p.scale_log2 : -INFINITY;
        s[n][e] = v;
        mx[h] = fmaxf(mx[h], v);
      }
    float alpha[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
      const float m_new = fmaxf(m[h], mx[h]);
      const float base = m_new == -INFINITY ? 0.0f : m_new;
      alpha[h] = exp2f(m[h] - base);  // (0 while the row had no key)
      m[h] = m_new;
      l[h] *= alpha[h];
#pragma unroll
      for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float pe = exp2f(s[n][2 * h + e] - base);
          s[n][2 * h + e] = pe;
          l[h] += pe;
        }
    }
#pragma unroll
    for (int n = 0; n < kD / 8; ++n) {
      o[n][0] *= alpha[0];
      o[n][1] *= alpha[0];
      o[n][2] *= alpha[1];
      o[n][3] *= alpha[1];
    }
    // P as the A fragment of the warp's 16 keys: keys 0-7 from s[0], 8-15 from s[1].
    const uint32_t pa[4] = {pack2<kBF16>(s[0][0], s[0][1]), pack2<kBF16>(s[0][2], s[0][3]),
                            pack2<kBF16>(s[1][0], s[1][1]), pack2<kBF16>(s[1][2], s[1][3])};
#pragma unroll
    for (int n = 0; n < kD / 8; n += 2) {
      uint32_t vb[4];  // pieces n, n + 1 of keys 0-7 and 8-15, transposed
      ptx::ldmatrix_x4_trans(vb, vs + tile_offset<kD>(kw + (lane / 8) % 2 * 8 + lane % 8, n + lane / 16));
      mma16816<kBF16>(o[n], pa, vb[0], vb[1]);
      mma16816<kBF16>(o[n + 1], pa, vb[2], vb[3]);
    }
  }
  cp_async_wait<0>();
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
  }
  __syncthreads();  // every warp is done with the ring

  // The warps' rows meet: [warp][row] max and sum, [warp][row][kD] O.
  float* sm = reinterpret_cast<float*>(smem);
  float* sl = sm + kWarps * kRows;
  float* so = sl + kWarps * kRows;
  if (t == 0)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      sm[warp * kRows + g + 8 * h] = m[h];
      sl[warp * kRows + g + 8 * h] = l[h];
    }
#pragma unroll
  for (int n = 0; n < kD / 8; ++n)
#pragma unroll
    for (int h = 0; h < 2; ++h)
      *reinterpret_cast<float2*>(so + (warp * kRows + g + 8 * h) * kD + 8 * n + 2 * t) =
          make_float2(o[n][2 * h], o[n][2 * h + 1]);
  __syncthreads();

  // Thread (row tid / 8, columns (tid % 8) x kD / 8 ...): the CTA's row, normalised.
  constexpr int kCols = kD / 8;
  const int r = tid / 8, c0 = (tid % 8) * kCols;
  if (r >= rows) return;
  float mw[kWarps], mm = -INFINITY;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) mm = fmaxf(mm, mw[w] = sm[w * kRows + r]);
  const float base = mm == -INFINITY ? 0.0f : mm;
  float lsum = 0.0f, wt[kWarps];
#pragma unroll
  for (int w = 0; w < kWarps; ++w) lsum += sl[w * kRows + r] * (wt[w] = exp2f(mw[w] - base));
  // One CTA a row (splits 1) folds its query head's sink in here; with splits the merge does.
  float sink_c = 1.0f;
  if (p.sink != nullptr && p.splits == 1) {
    numerics::RowState st{mm, lsum};
    sink_c = numerics::fold_sink(st, sink_of(p, hk, r));
    mm = st.max, lsum = st.sum;
  }
  const float inv = lsum > 0.0f ? sink_c / lsum : 0.0f;
  float out[kCols];
#pragma unroll
  for (int c = 0; c < kCols; ++c) {
    float acc = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) acc += so[(w * kRows + r) * kD + c0 + c] * wt[w];
    out[c] = acc * inv;
  }
  if (p.splits > 1) {
    const int64_t at = (int64_t(pair) * p.splits + split) * kRows + r;
    float4* dst = reinterpret_cast<float4*>(p.part_o + at * kD + c0);
#pragma unroll
    for (int c = 0; c < kCols; c += 4) dst[c / 4] = make_float4(out[c], out[c + 1], out[c + 2], out[c + 3]);
    if (tid % 8 == 0) p.part_lse[at] = lsum > 0.0f && mm != -INFINITY ? mm + __log2f(lsum) : -INFINITY;
    return;
  }
  const RowAt at = row_at(p, hk, r);
  uint16_t* orow = static_cast<uint16_t*>(p.o) + b * p.o_stride[0] + at.q * p.o_stride[1] + at.h * p.o_stride[2] + c0;
#pragma unroll
  for (int c = 0; c < kCols; c += 8)
    if (c0 + c < 8 * p.v_pieces)  // (o is of v's width)
      *reinterpret_cast<uint4*>(orow + c) =
          make_uint4(pack2<kBF16>(out[c], out[c + 1]), pack2<kBF16>(out[c + 2], out[c + 3]),
                     pack2<kBF16>(out[c + 4], out[c + 5]), pack2<kBF16>(out[c + 6], out[c + 7]));
  if (p.lse != nullptr && tid % 8 == 0)
    p.lse[(int64_t(b) * p.heads_q + at.h) * p.seqlen_q + at.q] = natural_lse(mm, lsum);
}

// A pair's splits merged (grid: batch x heads_kv, the pair's rows; a CTA a row): O = the splits' O
// weighted by 2^(lse_s - lse), lse = log2 of the sum of 2^lse_s; splits whose row saw no key (lse_s
// -inf, O zero) weigh nothing. Launched as decode_kernel's programmatic dependent. Every split's
// loads are in flight at once: the threads first share the weights (one load a split), then each
// takes a float4 of columns over every kCombineThreads / (kD / 4)-th split (L2 loads, kAhead at a
// time), and the subsets are summed in a fixed order (deterministic). A loop over the splits in one
// thread a column cost 0.2 us a split after the decoding kernel's end (docs/perf-notes.md, "The
// splits' merge, split-parallel").
constexpr int kCombineThreads = 256;
constexpr int kCombineWarps = kCombineThreads / 32;
template <int kD, bool kBF16>
__global__ void __launch_bounds__(kCombineThreads, 1) decode_combine_kernel(const DecodeParams p) {
  constexpr int kGroups = kD / 4;                       // float4 columns
  constexpr int kSubsets = kCombineThreads / kGroups;  // splits each column's threads share out
  static_assert(kDecodeMaxSplits % kCombineThreads == 0 && kCombineThreads % kGroups == 0);
  __shared__ float w[kDecodeMaxSplits];
  __shared__ float4 part[kSubsets][kGroups];
  __shared__ float red[2][kCombineWarps];
  cudaGridDependencySynchronize();
  const int pair = blockIdx.x, r = blockIdx.y, tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int b = pair / p.heads_kv, hk = pair % p.heads_kv;
  const float* lse = p.part_lse + int64_t(pair) * p.splits * kRows + r;
  // The row's max over the splits, then each split's weight and their sum.
  float ls[kDecodeMaxSplits / kCombineThreads], mm = -INFINITY;
#pragma unroll
  for (int i = 0; i < kDecodeMaxSplits / kCombineThreads; ++i) {
    const int sp = tid + i * kCombineThreads;
    ls[i] = sp < p.splits ? __ldcg(lse + sp * kRows) : -INFINITY;
    mm = fmaxf(mm, ls[i]);
  }
#pragma unroll
  for (int x = 16; x > 0; x /= 2) mm = fmaxf(mm, __shfl_xor_sync(0xffffffffu, mm, x));
  if (lane == 0) red[0][warp] = mm;
  __syncthreads();
#pragma unroll
  for (int k = 0; k < kCombineWarps; ++k) mm = fmaxf(mm, red[0][k]);
  // The query head's sink (p.sink): one more split's LSE whose O is zero.
  const float sink = p.sink == nullptr ? -INFINITY : sink_of(p, hk, r);
  mm = fmaxf(mm, sink);
  float total = 0.0f;
#pragma unroll
  for (int i = 0; i < kDecodeMaxSplits / kCombineThreads; ++i) {
    const int sp = tid + i * kCombineThreads;
    const float wi = ls[i] == -INFINITY ? 0.0f : exp2f(ls[i] - mm);
    if (sp < p.splits) w[sp] = wi;
    total += wi;
  }
#pragma unroll
  for (int x = 16; x > 0; x /= 2) total += __shfl_xor_sync(0xffffffffu, total, x);
  if (lane == 0) red[1][warp] = total;
  __syncthreads();  // the weights and the warps' sums are in
  total = 0.0f;
#pragma unroll
  for (int k = 0; k < kCombineWarps; ++k) total += red[1][k];
  if (sink != -INFINITY) total += exp2f(sink - mm);
  // Column group cg over splits j, j + kSubsets, ...
  const int cg = tid % kGroups, j = tid / kGroups;
  const float* po = p.part_o + (int64_t(pair) * p.splits * kRows + r) * kD + 4 * cg;
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  constexpr int kAhead = 4;  // (32 splits at d128 and 64 at d64 in one round of loads)
  for (int s0 = j; s0 < p.splits; s0 += kAhead * kSubsets) {
    float4 x[kAhead];  // (past the last split: the last split's again, weighed 0; no predicates)
#pragma unroll
    for (int u = 0; u < kAhead; ++u)
      x[u] = __ldcg(reinterpret_cast<const float4*>(po + int64_t(min(s0 + u * kSubsets, p.splits - 1)) * kRows * kD));
#pragma unroll
    for (int u = 0; u < kAhead; ++u) {
      const int sp = s0 + u * kSubsets;
      const float ws = sp < p.splits ? w[sp] : 0.0f;
      acc.x += ws * x[u].x, acc.y += ws * x[u].y, acc.z += ws * x[u].z, acc.w += ws * x[u].w;
    }
  }
  part[j][cg] = acc;
  __syncthreads();
  if (tid >= kGroups) return;
  float4 sum = part[0][cg];
#pragma unroll
  for (int k = 1; k < kSubsets; ++k) {
    const float4 x = part[k][cg];
    sum.x += x.x, sum.y += x.y, sum.z += x.z, sum.w += x.w;
  }
  const float inv = total > 0.0f ? 1.0f / total : 0.0f;
  const RowAt at = row_at(p, hk, r);
  uint16_t* orow = static_cast<uint16_t*>(p.o) + b * p.o_stride[0] + at.q * p.o_stride[1] + at.h * p.o_stride[2];
  if (4 * cg < 8 * p.v_pieces)
    *reinterpret_cast<uint2*>(orow + 4 * cg) =
        make_uint2(pack2<kBF16>(sum.x * inv, sum.y * inv), pack2<kBF16>(sum.z * inv, sum.w * inv));
  if (p.lse != nullptr && tid == 0)
    p.lse[(int64_t(b) * p.heads_q + at.h) * p.seqlen_q + at.q] = natural_lse(mm, total);
}

}  // namespace fa4::sm90::decode
