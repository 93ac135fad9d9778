// The order in which a persistent grid walks (batch, head, query block) tiles.
//
// Heads are taken in sections small enough that their K and V stay in L2; inside a section the
// query blocks go from the last to the first (with a causal mask the last see the most keys, so the
// longest tiles start first) and the heads of the section alternate fastest. A persistent grid of G
// CTAs starts on tiles 0..G-1. Tiles of one length then go in static rounds of G: CTA i takes the
// i-th of even rounds and the (G-1-i)-th of odd ones (a snake). Tiles whose lengths vary go
// dynamically instead (FwdKernelParams::tile_counter): a CTA that finishes takes the next, so the
// longest-first order inside each section keeps the grid even to the end.
//
// With clusters of two CTAs (uniform tiles) a tile is a pair of neighbouring query blocks of one
// head, whose K and V the two CTAs share by TMA multicast: cluster rank r takes query block
// 2m + r of pair m. When a head has an odd number of query blocks its last pair's rank 1 gets
// block m_blocks (past seqlen_q): it loads and computes nothing that is stored, but it loads its
// half of every K/V block for its partner.
#pragma once

namespace fa4::sm90 {

struct Tile {
  int batch, head, m_block;
};

struct TileOrder {
  int count;        // batch * heads_q * m_blocks
  int m_blocks;     // tiles per head: query blocks, or pairs of them with clusters
  int batch_heads;  // batch * heads_q
  int heads_q;
  int section;      // heads per section
  int cluster = 1;  // CTAs a tile (1, or 2: a pair of query blocks)

  // The tile CTA `cta` of `grid` takes in round `round`; >= count when it has no more.
  __host__ __device__ int nth(int round, int cta, int grid) const {
    return round * grid + ((round & 1) ? grid - 1 - cta : cta);
  }

  // Tile t as seen by cluster rank `rank` (0 without clusters).
  __host__ __device__ Tile decode(int t, int rank = 0) const {
    const int per_section = section * m_blocks;
    const int sec = t / per_section;
    const int r = t - sec * per_section;
    const int first = sec * section;
    const int width = min(section, batch_heads - first);
    const int m_idx = r / width;
    const int bh = first + (r - m_idx * width);
    return {bh / heads_q, bh % heads_q, (m_blocks - 1 - m_idx) * cluster + rank};
  }
};

}  // namespace fa4::sm90
