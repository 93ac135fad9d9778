// The order in which a persistent grid walks (batch, head, query block) tiles.
//
// Heads are taken in sections small enough that their K and V stay in L2; inside a section the
// query blocks go from the last to the first (with a causal mask the last see the most keys, so the
// longest tiles start first) and the heads of the section alternate fastest. A persistent grid of G
// CTAs starts on tiles 0..G-1. Tiles of one length then go in static rounds of G: CTA i takes the
// i-th of even rounds and the (G-1-i)-th of odd ones (a snake). Tiles whose lengths vary go
// dynamically instead (FwdKernelParams::tile_counter): a CTA that finishes takes the next, so the
// longest-first order inside each section keeps the grid even to the end.
#pragma once

namespace fa4::sm90 {

struct Tile {
  int batch, head, m_block;
};

struct TileOrder {
  int count;        // batch * heads_q * m_blocks
  int m_blocks;     // query blocks per head
  int batch_heads;  // batch * heads_q
  int heads_q;
  int section;      // heads per section

  // The tile CTA `cta` of `grid` takes in round `round`; >= count when it has no more.
  __host__ __device__ int nth(int round, int cta, int grid) const {
    return round * grid + ((round & 1) ? grid - 1 - cta : cta);
  }

  __host__ __device__ Tile decode(int t) const {
    const int per_section = section * m_blocks;
    const int sec = t / per_section;
    const int r = t - sec * per_section;
    const int first = sec * section;
    const int width = min(section, batch_heads - first);
    const int m_idx = r / width;
    const int bh = first + (r - m_idx * width);
    return {bh / heads_q, bh % heads_q, m_blocks - 1 - m_idx};
  }
};

}  // namespace fa4::sm90
