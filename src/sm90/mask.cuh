// Which keys a query tile sees (bottom-right aligned causal / local window, sequence tails), and
// the mask applied to the few key blocks that need one.
#pragma once

#include <cstdint>

namespace fa4::sm90 {

// Query i sees keys [i + offset - left, i + offset + right], offset = seqlen_k - seqlen_q;
// -1 = unbounded on that side (causal is right = 0). Query tile m holds rows
// [m * kBlockM - shift, (m + 1) * kBlockM - shift): with a right bound a tile's keys grow with
// its rows, and the launch (row_shift) sets shift so a partial tile's padding rows lie before
// row 0, in the first and shortest tile, not past the last row in the longest.
//
// fold: with a query group folded into rows (FwdParams::fold), row r is query r >> fold of query
// head (r & (2^fold - 1)) of the group; seqlen_q counts rows (queries << fold), so the offset is
// seqlen_k - (seqlen_q >> fold). 0 elsewhere: rows are queries.
struct Window {
  int left, right;
  int shift = 0;
  int fold = 0;
};

// Row r's query (Window::fold), and the offset of the bounds: query i sees keys from
// i + offset - left to i + offset + right.
__host__ __device__ __forceinline__ int row_query(Window w, int row) { return row >> w.fold; }
__host__ __device__ __forceinline__ int key_offset(Window w, int seqlen_q, int seqlen_k) {
  return seqlen_k - (seqlen_q >> w.fold);
}

// The first query row of tile m_block (negative in a first tile that starts before row 0).
template <int kBlockM>
__host__ __device__ __forceinline__ int tile_first_row(Window w, int m_block) {
  return m_block * kBlockM - w.shift;
}

// Key blocks [lo, hi) that a query tile touches.
struct BlockRange {
  int lo, hi;
};

// True when key block n holds a key some row of the query tile from first_row (tile_first_row)
// must not see: the sequence tail, or the window's edge passing through the block. A first tile's
// rows before row 0 count too: their scores are masked as the real rows' are, so they never take
// the row-max-free step (softmax.cuh) against keys past their bound. (Also on the host, for the
// tests.)
template <int kBlockM, int kBlockN>
__host__ __device__ __forceinline__ bool block_needs_mask(int n, Window w, int first_row, int seqlen_q,
                                                 int seqlen_k) {
  const int offset = key_offset(w, seqlen_q, seqlen_k);
  const int first_key = n * kBlockN, last_key = n * kBlockN + kBlockN - 1;
  const int first_query = row_query(w, first_row), last_query = row_query(w, first_row + kBlockM - 1);
  if (last_key >= seqlen_k) return true;
  if (w.right >= 0 && last_key > first_query + offset + w.right) return true;
  if (w.left >= 0 && first_key < last_query + offset - w.left) return true;
  return false;
}

// (Also on the host: the launch weighs tile shapes by the key blocks they would compute.)
template <int kBlockM, int kBlockN>
__host__ __device__ __forceinline__ BlockRange key_block_range(Window w, int m_block, int seqlen_q,
                                                               int seqlen_k) {
  const int offset = key_offset(w, seqlen_q, seqlen_k);
  // The tile's real rows: from row 0 at the earliest (tile_first_row), to seqlen_q - 1 at the latest.
  const int start = tile_first_row<kBlockM>(w, m_block);
  const int first = row_query(w, start > 0 ? start : 0);
  const int last = row_query(w, (seqlen_q < start + kBlockM ? seqlen_q : start + kBlockM) - 1);
  // Keys [lo_key, hi_key) are seen by at least one row of the tile.
  const int lo_key = w.left >= 0 && first + offset - w.left > 0 ? first + offset - w.left : 0;
  const int hi_key = w.right >= 0 && last + offset + w.right + 1 < seqlen_k ? last + offset + w.right + 1 : seqlen_k;
  if (hi_key <= lo_key) return {0, 0};
  return {lo_key / kBlockN, (hi_key + kBlockN - 1) / kBlockN};
}

// Sets S to -inf where this thread's (row, key) pairs are not visible. `row` is the first of the
// thread's two rows (the second is row + 8); `key` its first key (then + 8 * chunk + {0, 1}).
//
// kOneSided: a launch without a left bound (causal, or a window open to the left) takes a branch,
// uniform over the launch, where each row's right bound is taken relative to `key`, so that an
// element costs one ISETP against its column's constant offset and the FSEL, not an add and two
// compares. (In d64's three-consumer kernel that branch makes ptxas spill; it keeps one path.)
// Also on the host, for the tests.
template <int kBlockN, bool kOneSided = true>
__host__ __device__ __forceinline__ void apply_mask(float (&s)[kBlockN / 2], Window w, int row, int key,
                                           int seqlen_q, int seqlen_k) {
  const int offset = key_offset(w, seqlen_q, seqlen_k);
  if (kOneSided && w.left < 0) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int diag = row_query(w, row + 8 * i) + offset - key;  // row i's own key, relative to key
      const int hi = w.right >= 0 ? min(seqlen_k - key, diag + w.right + 1) : seqlen_k - key;
#pragma unroll
      for (int j = 0; j < kBlockN / 8; ++j)
#pragma unroll
        for (int c = 0; c < 2; ++c)
          if (8 * j + c >= hi) s[4 * j + 2 * i + c] = -INFINITY;
    }
    return;
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int q = row_query(w, row + 8 * i);
    const int hi = w.right >= 0 ? min(seqlen_k, q + offset + w.right + 1) : seqlen_k;  // exclusive
    const int lo = w.left >= 0 ? q + offset - w.left : INT32_MIN;
#pragma unroll
    for (int j = 0; j < kBlockN / 8; ++j) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int k = key + 8 * j + c;
        if (k >= hi || k < lo) s[4 * j + 2 * i + c] = -INFINITY;
      }
    }
  }
}

}  // namespace fa4::sm90
