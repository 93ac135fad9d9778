// The order in which a persistent grid walks (batch, head, query block) tiles.
//
// Heads are taken in sections small enough that their K and V stay in L2; inside a section the
// query blocks go from the last to the first (with a causal mask the last see the most keys, so the
// longest tiles start first) and the heads of the section alternate fastest. Tiles of one length
// go from the first block to the last (`rising`): a head's last block, partial where seqlen_q is
// not a multiple of the tile height, is the cheapest (idle consumers skip it), and taken last in
// each section it evens the grid out, from the counter or in static rounds (d64 on 192-row tiles,
// 132 CTAs in static rounds: the busiest CTA has 20 whole tiles at 1k against 22 last to first,
// 16 against 17 at 512).
//
// A persistent grid of G CTAs starts on tiles 0..G-1. Past those, a CTA that finishes takes the
// next tile from a counter (FwdKernelParams::tile_counter), so the cheapest tiles of each section
// come last and keep the grid even to the end. Clusters and stream-K tails (tiles of one length)
// go in static rounds of G instead: CTA i takes the i-th of even rounds and the (G-1-i)-th of odd
// ones (a snake).
//
// With clusters of two CTAs (uniform tiles) a tile is a pair of neighbouring query blocks of one
// head, whose K and V the two CTAs share by TMA multicast: cluster rank r takes query block
// 2m + r of pair m. When a head has an odd number of query blocks its last pair's rank 1 gets
// block m_blocks (past seqlen_q): it loads and computes nothing that is stored, but it loads its
// half of every K/V block for its partner.
//
// Paired causal tiles (static rounds): under a causal bound with as many keys as queries, query
// blocks m and M - 1 - m of a head see m + 1 and M - m blocks' worth of keys, M + 1 together for
// every m, so pairs are units of equal work. A CTA takes a pair whole, the longer tile first, in
// two consecutive rounds; a head's pairs are neighbouring units, so in each round its
// tiles run side by side on neighbouring CTAs and read its K/V blocks close together. H100 d256
// causal 512, ncu: 13 % fewer L2 sectors (fewer crossings between the L2's two partitions), the L2
// at 75 % of its peak instead of 87 %, and 3 % fewer DRAM reads than the sections' longest-first
// order on the dynamic grid; d256 causal +2.4...+6.1 % from 512 to 16k. d64 and d128 keep that
// order (fwd_launch.cuh, use_paired_tiles; docs/perf-notes.md, "Paired causal tiles").
//
// Stream-K tail (tiles of one length, static rounds): when the last round would leave many CTAs
// idle, only `full` tiles (whole rounds) go as tiles; the key blocks of the remaining ones are laid
// end to end and cut into one equal run a CTA (a unit), so every CTA ends at the same time. A run
// is shorter than a tile and may cross a tile border, so a unit takes one or two pieces (tile,
// key-block sub-range); each piece leaves its unnormalised O, row max and row sum as partials, and
// the last piece of a tile to finish merges them in piece order (deterministic) and stores O and
// LSE (epilogue.cuh). The launch runs the whole rounds and the tail as two kernels (fwd_launch.cuh).
#pragma once

#include <climits>
#include <cstdint>

#include "sm90/seq_span.cuh"  // a tile's sequence

namespace fa4::sm90 {

struct Tile {
  int batch, head, m_block;
  // A piece of a stream-K tail tile: key blocks [lo, hi) of the tile's range, counted from its
  // first; hi < 0 for a whole tile. `piece` of `pieces` in key order; `tail` the tail tile's index.
  int lo = 0, hi = -1;
  int piece = 0, pieces = 1;
  int tail = 0;
};

// The pieces of the stream-K tail: `tails` tiles of `blocks` key blocks each, laid end to end
// (L = tails * blocks) and cut at b_c = c * L / units, unit c taking [b_c, b_{c+1}). In 32-bit
// unsigned arithmetic (a 64-bit division is a call on the GPU): the launch splits only where
// (units + 1) * (L + 1) < 2^32 (kMaxProduct).
struct TailSplit {
  static constexpr uint64_t kMaxProduct = 0xFFFFFFFFull;
  int units = 1;
  int blocks = 0;  // key blocks a tile
  int total = 0;   // L; 0 = no tail split

  // Cuts b_c (c >= 0) at or below x, for 0 <= x < L.
  __host__ __device__ int cuts_at_or_below(int x) const {
    return int((unsigned(units) * unsigned(x + 1) + unsigned(total) - 1) / unsigned(total));
  }
  __host__ __device__ int cut(int c) const { return int(unsigned(c) * unsigned(total) / unsigned(units)); }
  // The k-th piece of unit c (k < 2): its tail tile, key blocks and place among the tile's pieces;
  // false when the unit has fewer.
  __host__ __device__ bool piece(int c, int k, Tile& out) const {
    if (unsigned(c) >= unsigned(units)) return false;
    const unsigned nb = unsigned(blocks), b0 = unsigned(cut(c)), b1 = unsigned(cut(c + 1));
    const unsigned u = b0 / nb + unsigned(k);
    const unsigned first = u * nb;
    if (b0 >= b1 || first >= b1) return false;
    const unsigned s = b0 > first ? b0 : first, e = b1 < first + nb ? b1 : first + nb;
    out.tail = int(u);
    out.lo = int(s - first);
    out.hi = int(e - first);
    out.piece = cuts_at_or_below(int(s)) - cuts_at_or_below(int(first));
    out.pieces = cuts_at_or_below(int(first + nb - 1)) - cuts_at_or_below(int(first)) + 1;
    return true;
  }
};

// The head dims whose causal tiles may go in pairs: the launch's rule (fwd_launch.cuh,
// use_paired_tiles) and the kernels that carry the pairs' decode (fwd_kernel.cuh, kPairs) both ask
// this, so they cannot disagree.
__host__ __device__ constexpr bool pairs_at_head_dim(int head_dim) { return head_dim == 256; }

struct TileOrder {
  int count;        // batch * heads_q * m_blocks
  int m_blocks;     // tiles per head: query blocks, or pairs of them with clusters
  int batch_heads;  // batch * heads_q
  int heads_q;
  int section;      // heads per section
  int cluster = 1;  // CTAs a tile (1, or 2: a pair of query blocks)
  // Query blocks first to last inside a section (tiles of one length), or last to first (false:
  // longest first under a causal or window bound).
  bool rising = false;
  // Stream-K tail: tiles [0, full) go whole in rounds 0..full/units-1 (full is a multiple of the
  // units, or count without a split); tiles [full, count) as pieces (TailSplit), item
  // full + 2 c + k being unit c's k-th piece (a unit's run is shorter than a tile, as there are
  // fewer tail tiles than units, so it spans two tiles at most). max_pieces bounds the pieces of
  // one tail tile.
  int full = INT_MAX;
  TailSplit split{};
  int max_pieces = 1;
  // The launch of the tail alone (the whole rounds went to a launch of their own): items start at
  // the pieces.
  bool tail_only = false;
  // Paired causal tiles in static rounds (m_blocks even, cluster 1): item 2u + k is unit u's k-th
  // tile, unit u being pair u % (m_blocks / 2) of head u / (m_blocks / 2). A head's pairs go to
  // neighbouring CTAs, which the hardware places on one TPC: half the grid apart they ran H100
  // d256 causal 512 6 % slower (docs/perf-notes.md, "Where each CTA of d256 causal 512 ends").
  bool paired = false;
  // Paired tiles from this unit on (0, or the launch's last round; fwd_launch.cuh) walk a head's
  // longest tile with its diagonal block last: 2, 1, 0, 3 for four blocks, where the others walk
  // down from their diagonal. The head's last DRAM read is then the block that only this step
  // reads, and less compute is left after it (docs/perf-notes.md, "The long tile's diagonal read
  // last").
  int diagonal_last_from = INT_MAX;

  static constexpr int kEnd = INT_MAX;  // no more work for this CTA

  bool has_tail() const { return split.total > 0; }

  // The whole rounds alone, as an order of their own (a stream-K tail's first launch): every field
  // as it is but the tail's.
  TileOrder whole_rounds() const {
    TileOrder o = *this;
    o.count = full;
    o.full = INT_MAX;
    o.split = TailSplit{};
    o.max_pieces = 1;
    o.tail_only = false;
    return o;
  }

  // The tile CTA `cta` of `grid` takes in round `round`; >= count when it has no more.
  // (kMayPair: whether this order may be paired; false in kernels that never run pairs, which then
  // keep none of its code.)
  template <bool kMayPair = true>
  __host__ __device__ int nth(int round, int cta, int grid) const {
    if (kMayPair && paired) return 2 * ((round >> 1) * grid + cta) + (round & 1);
    return round * grid + ((round & 1) ? grid - 1 - cta : cta);
  }

  // The work item unit `unit` of `units` takes in round `round`: a tile of the static rounds, or
  // with a tail split its pieces after them. May be past the end: see decode_valid.
  __host__ __device__ int item(int round, int unit, int units) const {
    if (split.total == 0) return nth<false>(round, unit, units);
    const int whole_rounds = tail_only ? 0 : full / units;
    if (round < whole_rounds) return nth<false>(round, unit, units);
    return round - whole_rounds < 2 ? full + 2 * unit + (round - whole_rounds) : kEnd;
  }
  // Item t (valid) as seen by cluster rank `rank` (0 without clusters).
  __host__ __device__ Tile decode(int t, int rank = 0) const {
    Tile tl;
    decode_valid(t, rank, tl);
    return tl;
  }
  // Whether item t exists, and if so decode(t) into tl.
  __host__ __device__ bool decode_valid(int t, int rank, Tile& tl) const {
    return decode_with(t, rank, tl, [&](int c, int k, Tile& piece) { return split.piece(c, k, piece); });
  }
  // The same, with unit c's k-th piece from piece_of(c, k, Tile&) -> bool: the kernel looks its
  // unit's pieces up in shared memory instead of computing them (fwd_kernel.cuh, decode_item).
  template <bool kMayPair = true, class PieceOf>
  __host__ __device__ bool decode_with(int t, int rank, Tile& tl, PieceOf piece_of) const {
    if (t < 0 || t == kEnd) return false;
    if (split.total > 0 && t >= full) {
      Tile piece;
      if (!piece_of(int(unsigned(t - full) >> 1), (t - full) & 1, piece)) return false;
      tl = decode_tile<kMayPair>(full + piece.tail, rank);
      tl.lo = piece.lo;
      tl.hi = piece.hi;
      tl.piece = piece.piece;
      tl.pieces = piece.pieces;
      tl.tail = piece.tail;
      return true;
    }
    if (t >= count) return false;
    tl = decode_tile<kMayPair>(t, rank);
    return true;
  }

  // Whether paired tile t, of query block m_block, walks its diagonal block last.
  __host__ __device__ bool diagonal_last(int t, int m_block) const {
    return paired && (t >> 1) >= diagonal_last_from && m_block == m_blocks - 1;
  }
  // The first unit of the first head that starts in the last of the static rounds of `grid` units
  // over `units` (paired tiles: a head is head_units = m_blocks / 2 units; units > 0).
  static int last_round_first_head(int64_t units, int64_t grid, int64_t head_units) {
    const int64_t last_round = (units - 1) / grid * grid;
    return int((last_round + head_units - 1) / head_units * head_units);
  }
  // The key block at walk position n (counting down from hi - 1 to lo, as every walk does) of a
  // tile over blocks [lo, hi): n itself, or with the diagonal last hi - 2, ..., lo, hi - 1.
  __host__ __device__ static int walk_block(bool diagonal_last, int n, int lo, int hi) {
    return !diagonal_last ? n : n == lo ? hi - 1 : n - 1;
  }

  // Tile t (< count) as seen by cluster rank `rank`.
  template <bool kMayPair = true>
  __host__ __device__ Tile decode_tile(int t, int rank = 0) const {
    if (kMayPair && paired) {
      const int half = m_blocks >> 1, unit = t >> 1;
      const int bh = unit / half, pair = unit - bh * half;
      Tile tl;
      tl.batch = bh / heads_q;
      tl.head = bh % heads_q;
      tl.m_block = (t & 1) ? pair : m_blocks - 1 - pair;
      return tl;
    }
    const int per_section = section * m_blocks;
    const int sec = t / per_section;
    const int r = t - sec * per_section;
    const int first = sec * section;
    const int width = min(section, batch_heads - first);
    const int m_idx = r / width;
    const int bh = first + (r - m_idx * width);
    Tile tl;
    tl.batch = bh / heads_q;
    tl.head = bh % heads_q;
    tl.m_block = (rising ? m_idx : m_blocks - 1 - m_idx) * cluster + rank;
    return tl;
  }
};

}  // namespace fa4::sm90
