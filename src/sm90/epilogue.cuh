// Epilogue of the sm90 forward: a consumer's share of O normalised and stored, and its LSE.
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda/atomic>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/fwd_params.h"
#include "fa4/numerics/online_softmax.h"
#include "ptx/sync.h"
#include "ptx/tma.h"
#include "sm90/softmax.cuh"
#include "sm90/tile_order.cuh"

namespace fa4::sm90 {

// A consumer warpgroup's own named barrier (its 128 threads), after the turn barriers 1..kConsumers:
// the epilogue's syncs and the row-max-free step's vote.
template <class Cfg>
__device__ __forceinline__ uint32_t own_barrier(int consumer) {
  return 1 + Cfg::kConsumers + consumer;
}

// MUFU's reciprocal and log2 alone: a finished row's sum is 0 (no key) or at least 1 (its max
// term), never subnormal, so the range scaling of __fdividef / __log2f is not needed.
__device__ __forceinline__ float rcp_approx(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
// MUFU's log2 (absolute error about 2^-22 in log2 units), for numerics::row_lse.
struct Lg2Approx {
  __device__ __forceinline__ float operator()(float x) const {
    float y;
    asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
  }
};

// A consumer's 64 x kCols accumulator tile (fp32 in the wgmma layout), each row times its
// factor (rows r and r + 8 of the thread: scale[0], scale[1]; kScaled false: as is), as 16-bit
// values into a shared tile laid out as Q is: [kCols / 64 atoms][kRows][64 columns], rows of
// 128 bytes with the 128-byte swizzle, the consumer's rows from consumer * 64. stmatrix x4 covers
// 16 rows x 16 columns a step: matrices (rows 0-7 | 8-15) x (columns c | c + 8).
template <int kCols, int kRows, bool kBF16, bool kScaled>
__device__ __forceinline__ void stmatrix_tile(uint32_t base, int consumer, int t, const float (&acc)[kCols / 2],
                                              const float (&scale)[2]) {
  const int lane = t % 32, mi = lane / 8;
  const int row = consumer * 64 + (t / 32) * 16 + (mi % 2) * 8 + lane % 8;
  auto v = [&](int i, int half) { return kScaled ? acc[i] * scale[half] : acc[i]; };
#pragma unroll
  for (int j = 0; j < kCols / 8; j += 2) {
    const int col = 8 * j + (mi / 2) * 8;
    const int atom = col / 64, chunk = (col % 64) / 8;
    const uint32_t addr = base + atom * kRows * 128 + row * 128 + ((chunk ^ (row % 8)) << 4);
    ptx::stmatrix_x4(addr, pack2<kBF16>(v(4 * j, 0), v(4 * j + 1, 0)), pack2<kBF16>(v(4 * j + 2, 1), v(4 * j + 3, 1)),
                     pack2<kBF16>(v(4 * j + 4, 0), v(4 * j + 5, 0)), pack2<kBF16>(v(4 * j + 6, 1), v(4 * j + 7, 1)));
  }
}

// Row q of tile tl's head as Q's and O's maps and strides place it. With a query group folded
// into rows (Window::fold = f) tl.head is the KV head, whose query heads (head << f) + m hold the
// group, and row q is query q >> f of query head (head << f) + (q & (2^f - 1)): the maps run over
// (dim, heads_q, seq, batch), their rows coordinate then a head's and their heads coordinate a
// query's (MapRow; the launch builds them so, ptx::bshd_query_group_spec).
struct MapRow {
  int row, head;
};
// kFold false (kernels that never run a folded launch: fwd_kernel's kFoldable): rows are queries
// at compile time.
template <bool kFold = true, class Params>
__host__ __device__ __forceinline__ MapRow qo_map_row(const Params& p, int row, int head) {
  if constexpr (!kFold) return {row, head};
  const int f = p.window.fold;
  return f == 0 ? MapRow{row, head} : MapRow{head << f, row >> f};
}
// The coordinates 1 to 3 of `at` in the chunked 5-D maps (FwdConfig::kFoldedQO): (row, 0, head)
// in bshd_folded_spec's (64, seq, chunks, heads, batch), (head, query, 0) in a folded group's (64,
// heads_q, seq, chunks, batch).
struct ChunkedAt {
  int c1, c2, c3;
};
template <bool kFold, class Params>
__host__ __device__ __forceinline__ ChunkedAt chunked_at(const Params& p, MapRow at) {
  const bool fold = kFold && p.window.fold != 0;
  return {at.row, fold ? at.head : 0, fold ? 0 : at.head};
}
// Row q's element offset from the (batch, head) start of a folded launch's O (rows are queries
// where fold is 0), and the LSE's index ([batch, heads_q, seqlen_q]; folded: [batch, heads_kv,
// 2^f, seqlen_q >> f]).
template <class Params>
__host__ __device__ __forceinline__ int64_t o_row_offset(const Params& p, int head, int q) {
  const int f = p.window.fold;
  return int64_t(q >> f) * p.o_stride[1] + int64_t((head << f) + (q & ((1 << f) - 1))) * p.o_stride[2];
}
template <bool kFold = true, class Params>
__host__ __device__ __forceinline__ int64_t lse_index(const Params& p, const Tile& tl, int q) {
  if constexpr (!kFold) return (int64_t(tl.batch) * p.heads_q + tl.head) * p.seqlen_q + q;
  const int f = p.window.fold;
  return (int64_t(tl.batch) * p.heads_q + tl.head) * p.seqlen_q + (q & ((1 << f) - 1)) * (p.seqlen_q >> f) + (q >> f);
}

// Row q of O for tile tl's (batch, head), in elements of Elem.
template <class Elem, bool kFold, class Params>
__device__ __forceinline__ Elem* o_row(const Params& p, const Tile& tl, int q) {
  if constexpr (!kFold)
    return static_cast<Elem*>(p.o) + tl.batch * p.o_stride[0] + int64_t(q) * p.o_stride[1] + tl.head * p.o_stride[2];
  return static_cast<Elem*>(p.o) + tl.batch * p.o_stride[0] + o_row_offset(p, tl.head, q);
}
// Packed row q (a variable-length batch's: no batch term) of head tl.head.
template <class Elem, class Params>
__device__ __forceinline__ Elem* o_packed_row(const Params& p, const Tile& tl, int q) {
  return static_cast<Elem*>(p.o) + int64_t(q) * p.o_stride[1] + tl.head * p.o_stride[2];
}

// A consumer's rows at a tile's start: empty, or with the query head's sink
// (FwdKernelParams::sink) as a first score of no value, {sink, 1} in log2 units, which the online
// softmax then carries as any key's (rescaled, merged across stream-K pieces, taken into the LSE).
// `with_sink` false (a stream-K piece past its tile's first): empty. The sink is folded in here,
// where O is not yet live, and not in the epilogue, whose register peak holds O (d256's
// serial-step kernel serialized its wgmma with it there). q: this thread's first row in the
// tile's (folded) rows, q + 8 its second; each takes its own query head's sink (sink_index). But in
// d256's soft-capped and serial-step kernels (per_row_sinks false), which take the tile's head's:
// each row's head spilled 8 bytes in the first and serialized the second's wgmma (C7511), so folded
// launches with sinks do not reach them (soft-capped d256 calls with sinks stay unfolded; the
// serial step is not taken for folded ones).
// A row's sum is held as partials across its quad of threads (finish_rows adds them; each holds
// the whole with kTensorRowSum): the sink's term goes to one of them, lane % 4 == 0.
template <class Cfg>
constexpr bool per_row_sinks() {
  return Cfg::kHeadDim <= 128 || !(Cfg::kSerialStep || requires { requires Cfg::kSoftcap; });
}
template <class Cfg, class Params>
__device__ __forceinline__ void start_rows(const Params& p, const Tile& tl, bool with_sink, int q, int lane,
                                           numerics::RowState (&rows)[2]) {
  rows[0] = rows[1] = numerics::row_state_init();
  if (p.sink == nullptr || !with_sink) return;
  const float one = Cfg::kTensorRowSum || lane % 4 == 0 ? 1.0f : 0.0f;
  if constexpr (per_row_sinks<Cfg>()) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const float s = __ldg(p.sink + detail::sink_index(tl.head, q + 8 * i, p.sink_group, p.sink_mask)) * numerics::kLog2e;
      if (s != -INFINITY) rows[i] = {s, one};
    }
  } else {  // (folded launches with sinks never come here: make_fwd_params, d256_block_keys, launch_forward)
    const float s = __ldg(p.sink + tl.head) * numerics::kLog2e;
    if (s != -INFINITY) rows[0] = rows[1] = {s, one};
  }
}

// A consumer's rows finished: each row's whole sum (from the quad's partials unless
// kTensorRowSum), its LSE written for rows inside the sequence, and 1 / sum in inv (0 for a row
// without keys). first: the tile's first row; row0: this thread's first row in the tile. The LSE
// is [batch, heads_q, seqlen_q], or with kVarlen [heads_q, total_q] (the sequence's rows from
// sp.q_off).
template <class Cfg, bool kVarlen, class Params, bool kFold = false>
__device__ __forceinline__ void finish_rows(const Params& p, const Tile& tl, const SeqSpan& sp,
                                            numerics::RowState (&rows)[2], int first, int row0, int lane,
                                            float (&inv)[2]) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float l = rows[i].sum;
    if constexpr (!Cfg::kTensorRowSum) {  // a quad's partial sums (with kTensorRowSum each holds the whole)
      l += __shfl_xor_sync(0xffffffff, l, 1);
      l += __shfl_xor_sync(0xffffffff, l, 2);
    }
    rows[i].sum = l;
    // MUFU's reciprocal and log2 (above): the IEEE division and log2f carried range checks and
    // branches on each tile's path to the next.
    inv[i] = l > 0.0f ? rcp_approx(l) : 0.0f;
    const int q = first + row0 + 8 * i;
    if constexpr (kVarlen) {
      if (p.lse != nullptr && lane % 4 == 0 && q >= 0 && q < sp.q_len)
        p.lse[int64_t(tl.head) * p.total_q + sp.q_off + q] = numerics::row_lse(rows[i], Lg2Approx{});
    } else {
      if (p.lse != nullptr && lane % 4 == 0 && q >= 0 && q < p.seqlen_q)
        p.lse[lse_index<kFold>(p, tl, q)] = numerics::row_lse(rows[i], Lg2Approx{});
    }
  }
}

// The columns of O a thread may store from registers: FwdKernelParams::o_cols in the kernels of head
// dim 64 and 128 (a call at a head dim without a kernel of its own writes the caller's o, of fewer
// columns, in place), the head dim in the others (a constant: their code as it was).
template <class Cfg, class Params>
__device__ __forceinline__ int o_cols_of(const Params& p) {
  if constexpr (Cfg::kHeadDim <= 128) return p.o_cols;
  else return Cfg::kHeadDimV;
}

// Epilogue: O / l and LSE. kStaged: the consumer writes its 64 x d share of O into a swizzled
// shared tile by stmatrix and one thread sends it out by TMA (rows past seqlen_q are clipped). The
// tile holds kStageRows rows: the CTA tile's (this consumer's from row consumer * 64), or 64, this
// consumer's alone (d256: a K/V slot);
// otherwise each thread stores its pairs of O straight to global memory: with kWide as 16-byte
// stores after a transpose inside each quad (H100, d64 three consumers: 512 +1.3 %, 1k +0.6 %,
// causal 1k +1.7 %, 4k unchanged; docs/perf-notes.md), else as the 4-byte pairs themselves.
//
// kVarlen: rows from sp.q_off of maps over the packed sequences; a staged consumer share that
// reaches past its sequence's last row is copied out by its 128 threads, row by row, where a box
// would write into the next sequence.
template <class Cfg, bool kStaged, class Params, bool kWide = false, int kStageRows = Cfg::kBlockM,
          bool kVarlen = false, bool kFold = false>
__device__ __forceinline__ void store_output(const Params& p, const Tile& tl, const SeqSpan& sp,
                                             float (&o)[Cfg::kHeadDimV / 2],
                                             numerics::RowState (&rows)[2], int consumer, int t,
                                             uint8_t* s_o) {
  static_assert(kStageRows == Cfg::kBlockM || kStageRows == 64, "a staged tile holds the CTA's rows or a consumer's");
  using Elem = std::conditional_t<Cfg::kBF16, __nv_bfloat16, __half>;
  const int lane = t % 32;
  const int row0 = consumer * 64 + (t / 32) * 16 + lane / 4;
  const int col0 = 2 * (lane % 4);
  // The tile's first row: negative in a first tile that starts before row 0 (Window::shift, a
  // multiple of 64: a consumer's 64 rows lie all before row 0 or none).
  const int first = tile_first_row<Cfg::kBlockM>(p.window, tl.m_block);
  const int o_cols = o_cols_of<Cfg>(p);
  float inv[2];
  finish_rows<Cfg, kVarlen, Params, kFold>(p, tl, sp, rows, first, row0, lane, inv);
  if constexpr (kStaged) {
    constexpr bool kOwn = kStageRows != Cfg::kBlockM;  // a tile of this consumer's rows alone
    const uint32_t bar_id = own_barrier<Cfg>(consumer);
    if (t == 0) ptx::tma_store_wait_read();  // the previous tile's store has left the buffer
    ptx::named_bar_sync(bar_id, 128);
    stmatrix_tile<Cfg::kHeadDimV, kStageRows, Cfg::kBF16, true>(ptx::smem_addr(s_o), kOwn ? 0 : consumer, t, o, inv);
    ptx::fence_proxy_async_smem();
    ptx::named_bar_sync(bar_id, 128);
    if (kVarlen && first + consumer * 64 + 64 > sp.q_len) {
      // Each thread 16-byte vectors of the share's rows inside the sequence, read back through the
      // swizzle stmatrix_tile wrote them in; the barrier after keeps the buffer until all are read.
      constexpr int kVecs = Cfg::kHeadDimV / 8;
      const int base_row = kOwn ? 0 : consumer * 64;
      for (int i = t; i < 64 * kVecs; i += 128) {
        const int r = i / kVecs, vec = i % kVecs;
        const int q = first + consumer * 64 + r;
        if (q < 0 || q >= sp.q_len || 8 * vec >= o_cols) continue;
        const int srow = base_row + r, atom = vec / 8, chunk = vec % 8;
        const uint4 x = *reinterpret_cast<const uint4*>(s_o + atom * kStageRows * 128 + srow * 128 +
                                                        ((chunk ^ (srow % 8)) << 4));
        *reinterpret_cast<uint4*>(o_packed_row<Elem>(p, tl, sp.q_off + q) + 8 * vec) = x;
      }
      ptx::named_bar_sync(bar_id, 128);
    } else if (t == 0 && first + consumer * 64 >= 0) {
      const MapRow at = kVarlen ? MapRow{sp.q_off + first + consumer * 64, tl.head}
                                : qo_map_row<kFold>(p, first + consumer * 64, tl.head);
      const int batch = kVarlen ? 0 : tl.batch;
      if constexpr (kOwn && Cfg::kFoldedQO) {  // the consumer's rows as one box of every chunk
        const ChunkedAt c = chunked_at<kFold>(p, at);
        if constexpr (Cfg::kQOEvictFirst)
          ptx::tma_store_5d_hint(&p.tm_o, s_o, 0, c.c1, c.c2, c.c3, batch, ptx::l2_policy_evict_first());
        else
          ptx::tma_store_5d(&p.tm_o, s_o, 0, c.c1, c.c2, c.c3, batch);
      } else {
#pragma unroll
        for (int c = 0; c < Cfg::kVChunks; ++c) {
          const uint8_t* src = s_o + c * kStageRows * 128 + (kOwn ? 0 : consumer * 64 * 128);
          if constexpr (Cfg::kQOEvictFirst)  // O is written once: evict_first in L2
            ptx::tma_store_4d_hint(&p.tm_o, src, c * 64, at.row, at.head, batch, ptx::l2_policy_evict_first());
          else
            ptx::tma_store_4d(&p.tm_o, src, c * 64, at.row, at.head, batch);
        }
      }
      ptx::tma_store_commit();
    }
  } else {
    if constexpr (kWide && Cfg::kHeadDimV % 32 == 0) {
      // A quad holds one row: lane k the pair at columns 8j + 2k of every 8-column chunk j.
      // Transposed within the quad (two shuffle rounds), lane k holds all of chunk 4g + k of each
      // group g of four chunks and stores it as 16 bytes.
      const int k = lane & 3;
      const bool b0 = k & 1, b1 = k & 2;
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int q = first + row0 + 8 * i;
        bool store;
        Elem* out;
        if constexpr (kVarlen) {
          store = q >= 0 && q < sp.q_len;
          out = o_packed_row<Elem>(p, tl, sp.q_off + (store ? q : 0));
        } else {
          store = q >= 0 && q < p.seqlen_q;
          out = o_row<Elem, kFold>(p, tl, store ? q : 0);
        }
#pragma unroll
        for (int g = 0; g < Cfg::kHeadDimV / 32; ++g) {
          uint32_t a[4];
#pragma unroll
          for (int m = 0; m < 4; ++m)
            a[m] = pack2<Cfg::kBF16>(o[4 * (4 * g + m) + 2 * i] * inv[i], o[4 * (4 * g + m) + 2 * i + 1] * inv[i]);
          // Round 1 (lanes k, k ^ 1): keep the chunks whose index has k's bit 0, send the others.
          const uint32_t keep0 = b0 ? a[1] : a[0], keep2 = b0 ? a[3] : a[2];
          const uint32_t r0 = __shfl_xor_sync(0xffffffff, b0 ? a[0] : a[1], 1);
          const uint32_t r2 = __shfl_xor_sync(0xffffffff, b0 ? a[2] : a[3], 1);
          // Now chunk (k & 1) + {0, 2} from lanes k (keep) and k ^ 1 (r). Round 2 (lanes k, k ^ 2):
          // keep chunk k's, send chunk (k ^ 2)'s.
          const uint32_t u0 = __shfl_xor_sync(0xffffffff, b1 ? keep0 : keep2, 2);
          const uint32_t u1 = __shfl_xor_sync(0xffffffff, b1 ? r0 : r2, 2);
          const uint32_t own = b1 ? keep2 : keep0, nb = b1 ? r2 : r0;
          // Chunk 4g + k's pairs from lanes k, k ^ 1, k ^ 2, k ^ 3 (own, nb, u0, u1), put in lane
          // order 0..3 by selects (an array indexed by lane would go to local memory).
          const uint32_t lo0 = b0 ? nb : own, lo1 = b0 ? own : nb, hi0 = b0 ? u1 : u0, hi1 = b0 ? u0 : u1;
          uint4 w;
          w.x = b1 ? hi0 : lo0;
          w.y = b1 ? hi1 : lo1;
          w.z = b1 ? lo0 : hi0;
          w.w = b1 ? lo1 : hi1;
          if (store && 8 * (4 * g + k) < o_cols) *reinterpret_cast<uint4*>(out + 8 * (4 * g + k)) = w;
        }
      }
    } else {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int q = first + row0 + 8 * i;
        if (q < 0 || q >= (kVarlen ? sp.q_len : p.seqlen_q)) continue;
        // o_row written out: through the helper ptxas orders this address arithmetic differently
        // in the d256 stream-K kernels of clusters (SASS of the shipped, measured form kept).
        Elem* out;
        if constexpr (kVarlen)
          out = o_packed_row<Elem>(p, tl, sp.q_off + q);
        else if constexpr (!kFold)
          out = static_cast<Elem*>(p.o) + tl.batch * p.o_stride[0] + int64_t(q) * p.o_stride[1] +
                tl.head * p.o_stride[2];
        else
          out = static_cast<Elem*>(p.o) + tl.batch * p.o_stride[0] + o_row_offset(p, tl.head, q);
#pragma unroll
        for (int j = 0; j < Cfg::kHeadDimV / 8; ++j)
          if (8 * j < o_cols)
            *reinterpret_cast<uint32_t*>(out + 8 * j + col0) =
                pack2<Cfg::kBF16>(o[4 * j + 2 * i] * inv[i], o[4 * j + 2 * i + 1] * inv[i]);
      }
    }
  }
}

// The epilogue of a tile whose key range is empty: its rows saw no key, O = 0 (16-byte stores of
// zeros, each thread every 128th of the consumer's 64 x d) and their LSE, with no staging.
template <class Cfg, bool kVarlen, class Params, bool kFold = false>
__device__ __forceinline__ void store_keyless(const Params& p, const Tile& tl, const SeqSpan& sp,
                                              numerics::RowState (&rows)[2], int consumer, int t) {
  using Elem = std::conditional_t<Cfg::kBF16, __nv_bfloat16, __half>;
  const int lane = t % 32;
  const int first = tile_first_row<Cfg::kBlockM>(p.window, tl.m_block);
  float inv[2];
  finish_rows<Cfg, kVarlen, Params, kFold>(p, tl, sp, rows, first, consumer * 64 + (t / 32) * 16 + lane / 4, lane, inv);
  constexpr int kVecs = Cfg::kHeadDimV / 8;  // 16-byte vectors a row
  const int o_cols = o_cols_of<Cfg>(p);
  for (int i = t; i < 64 * kVecs; i += 128) {
    const int q = first + consumer * 64 + i / kVecs;
    if (8 * (i % kVecs) >= o_cols) continue;
    if constexpr (kVarlen) {
      if (q >= 0 && q < sp.q_len)
        *reinterpret_cast<uint4*>(o_packed_row<Elem>(p, tl, sp.q_off + q) + 8 * (i % kVecs)) = make_uint4(0, 0, 0, 0);
    } else {
      if (q >= 0 && q < p.seqlen_q)
        *reinterpret_cast<uint4*>(o_row<Elem, kFold>(p, tl, q) + 8 * (i % kVecs)) = make_uint4(0, 0, 0, 0);
    }
  }
}

// A stream-K piece (tile_order.cuh) leaves its unnormalised O and row stats as partials; the
// consumer whose piece arrives last at its tile's counter merges every piece's, in piece order, into
// o and rows (returns true in all its threads: it then stores them as a whole tile does); the
// others return false. Each thread writes and reads only its own accumulator slots, in float4
// columns across the consumer's 128 threads. Uses the consumer's epilogue barrier.
template <class Cfg, int kCluster, class Params>
__device__ __forceinline__ bool merge_pieces(const Params& p, const Tile& tl, float (&o)[Cfg::kHeadDimV / 2],
                                             numerics::RowState (&rows)[2], int consumer, int t, int rank) {
  constexpr int kVec = Cfg::kHeadDimV / 8 + 1;  // float4s a thread: O, then max0, max1, sum0, sum1
  const uint32_t bar_id = own_barrier<Cfg>(consumer);
  const int64_t slot = (int64_t(tl.tail) * kCluster + rank) * Cfg::kConsumers + consumer;
  auto partial = [&](int piece) {
    const int64_t block = (int64_t(tl.tail) * p.tiles.max_pieces + piece) * kCluster * Cfg::kConsumers +
                          int64_t(rank) * Cfg::kConsumers + consumer;
    return reinterpret_cast<float4*>(p.partials) + block * kVec * 128 + t;
  };
  float4* mine = partial(tl.piece);
#pragma unroll
  for (int j = 0; j < Cfg::kHeadDimV / 8; ++j)
    __stcg(mine + 128 * j, make_float4(o[4 * j], o[4 * j + 1], o[4 * j + 2], o[4 * j + 3]));
  __stcg(mine + 128 * (kVec - 1), make_float4(rows[0].max, rows[1].max, rows[0].sum, rows[1].sum));
  // Each thread's partials are released (fence) before the barrier that precedes thread 0's
  // arrival; the last arrival acquires the other pieces', and every thread fences after the
  // barrier's reduction that tells it so.
  cuda::atomic_thread_fence(cuda::memory_order_release, cuda::thread_scope_device);
  ptx::named_bar_sync(bar_id, 128);
  bool last = false;
  if (t == 0) {
    cuda::atomic_ref<int, cuda::thread_scope_device> counter(p.piece_counters[slot]);
    last = counter.fetch_add(1, cuda::memory_order_acq_rel) == tl.pieces - 1;
    // Every piece of the tile has arrived: the counter is zero again for the stream's next launch
    // (detail::stream_counters), which runs after this one.
    if (last) counter.store(0, cuda::memory_order_relaxed);
  }
  if (!ptx::named_bar_any(bar_id, 128, last)) return false;
  cuda::atomic_thread_fence(cuda::memory_order_acquire, cuda::thread_scope_device);

  float mx[2] = {-INFINITY, -INFINITY};
  for (int i = 0; i < tl.pieces; ++i) {
    const float4 st = __ldcg(partial(i) + 128 * (kVec - 1));
    mx[0] = fmaxf(mx[0], st.x);
    mx[1] = fmaxf(mx[1], st.y);
  }
  float sum[2] = {0.0f, 0.0f};
#pragma unroll
  for (int j = 0; j < Cfg::kHeadDimV / 2; ++j) o[j] = 0.0f;
  for (int i = 0; i < tl.pieces; ++i) {
    const float4* src = partial(i);
    const float4 st = __ldcg(src + 128 * (kVec - 1));
    // A piece whose rows saw no key (max -inf) adds nothing.
    const float w0 = st.x == -INFINITY ? 0.0f : exp2f(st.x - mx[0]);
    const float w1 = st.y == -INFINITY ? 0.0f : exp2f(st.y - mx[1]);
    sum[0] += w0 * st.z;
    sum[1] += w1 * st.w;
#pragma unroll
    for (int j = 0; j < Cfg::kHeadDimV / 8; ++j) {
      const float4 v = __ldcg(src + 128 * j);
      o[4 * j] += w0 * v.x;
      o[4 * j + 1] += w0 * v.y;
      o[4 * j + 2] += w1 * v.z;
      o[4 * j + 3] += w1 * v.w;
    }
  }
  for (int i = 0; i < 2; ++i) rows[i] = {mx[i], sum[i]};
  return true;
}

}  // namespace fa4::sm90
