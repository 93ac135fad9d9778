// Host launch of one sm90 forward configuration: tensor maps, persistent grid, tile order.
#pragma once

#include <algorithm>
#include <climits>
#include <string>

#include "common/fwd_params.h"
#include "common/launch.cuh"
#include "common/per_device.h"
#include "common/stream_counters.h"
#include "sm90/fwd_kernel.cuh"

namespace fa4::sm90 {

using detail::LaunchScratch;

// K and V of this many bytes per section of heads are meant to stay in L2 (H100/H200: 50 MB).
// Tiles of one length: 6 MB. With 24 MB (a round in flight over 12 heads at d128 4k) ncu counted
// 2.5 times the compulsory DRAM reads (L2 hit rate 69 %); at 6 MB they are the compulsory ones and
// every non-causal FA3 shape measured 0-4 % faster (docs/perf-notes.md, "fa4 and cuDNN under the
// profiler, and what the DRAM reads said").
// Tiles whose lengths vary (causal) read on average half of their section's K and V, and measure
// best with a larger budget: 12 and 24 MB read less from DRAM but lost 2-9 % against 48 MB
// (docs/perf-notes.md, "L2 sections for causal" and the section above).
inline constexpr int64_t kL2SectionBytes = 6ll << 20;
inline constexpr int64_t kL2SectionBytesVarying = 48ll << 20;

// Heads per section: as many as fit `budget` (at least 1). For the dynamic grid (`divisor`) the
// largest divisor of batch_heads that fits, so the last section is as long as the others and the
// grid ends on the short tiles of a full section, not on the long tiles of a partial one. Static
// rounds of equal tiles need no divisor (a partial last section costs them nothing).
inline int64_t section_heads(int64_t batch_heads, int64_t kv_bytes_per_q_head, int64_t budget, bool divisor) {
  const int64_t most = std::clamp<int64_t>(budget / std::max<int64_t>(1, kv_bytes_per_q_head), 1, batch_heads);
  if (!divisor) return most;
  for (int64_t s = most; s > 1; --s)
    if (batch_heads % s == 0) return s;
  return 1;
}

// The least share of the run time a stream-K tail must save (plan_tail_split), and what its
// pieces cost a unit in key blocks' time. At the FA3 shapes the model's 2.2-2.9 % tails sit near
// the threshold; three A/Bs on an H100 found the cut paying where the model says >= 2.5 % (d128
// 8k / 16k +1.5...+3.3 %, d64 4k +0.5...+1.7 %, d256 8k / 16k within noise) and not below it
// (d128 4k +0.6 / -1.2 %, d256 4k -0.7 / -1.3 %): the pieces cost more than the model's three blocks
// (docs/perf-notes.md, "Stream-K tail" and "The stream-K tail, measured again").
inline constexpr double kTailSplitGain = 0.025;
inline constexpr double kTailSplitCostBlocks = 3.0;

// Tiles of at most one consumer's rows (seqlen_q <= 64: decoding, whose query groups fold into a
// few rows) do little tensor work a key block, so the stream-K tail's pieces cost what they are
// measured to, not kTailSplitCostBlocks. H200, one query row against 2k-8k keys, 16 to 128 tiles
// (docs/perf-notes.md, "Decoding's stream-K tail"), at d64 / d128 / d256: a whole tile's block
// 0.92 / 1.16 / 1.13 us; a unit's block with every SM streaming pieces 1.5 / 2.0 / 2.3 us; and
// 19 / 21 / 39 us more that a launch of pieces pays once (their fills, the last piece's merge of
// the others' partials). d64's pieces cost 2.9 us a block and 11 us once before their idle
// consumer skipped them (kSkipIdle; "Decoding's idle consumer in stream-K pieces"); d128's and
// d256's fits still hold. The tail is cut only where that model has the tail round
// kTailSplitGain faster cut, which the launch asks after plan_tail_split.
inline constexpr int kShortTileRows = 64;
struct ShortTileCosts {
  double block_us, piece_block_us, cut_us;
};
inline constexpr ShortTileCosts short_tile_costs(int head_dim) {
  return head_dim == 64 ? ShortTileCosts{0.92, 1.5, 19.0}
         : head_dim == 256 ? ShortTileCosts{1.13, 2.3, 39.0}
                           : ShortTileCosts{1.16, 2.0, 21.0};
}
inline bool short_tail_split_pays(int tails, int blocks, int units, int head_dim) {
  const ShortTileCosts c = short_tile_costs(head_dim);
  const double cut = c.cut_us + double(tails) * blocks / units * c.piece_block_us;
  return cut < (1.0 - kTailSplitGain) * blocks * c.block_us;
}

// The stream-K tail for `units` CTAs (or clusters) in static rounds over `order` (tiles of one
// length, `blocks` key blocks each): whole rounds, then the last partial round's tiles cut into
// one equal run of key blocks a unit. Without one (returns false) the order stays as it is.
// `force`: whenever the last round is partial; otherwise where it pays (below).
inline bool plan_tail_split(TileOrder& order, int units, int blocks, bool force) {
  // Tail tiles < units: 12 bits (pack_place); items up to full + 2 units (TileOrder::item).
  if (units < 2 || units > 4096 || blocks < 1 || order.count > INT_MAX - 2 * units) return false;
  const int rounds = order.count / units, tails = order.count - rounds * units;
  const int64_t total = int64_t(tails) * blocks;
  // Each unit at least two key blocks (a piece's pipeline fill and drain cost about one).
  if (tails == 0 || total < 2ll * units || uint64_t(units + 1) * uint64_t(total + 1) > TailSplit::kMaxProduct) return false;
  // What it saves: the idle part of the last round, (1 - tails / units) of a tile's blocks, less
  // what the pieces cost (kTailSplitCostBlocks: a unit's one or two pieces each fill and drain
  // the pipeline once, and the last merges), out of the rounds + 1 tiles a unit ran before.
  const double saved = double(blocks) * (1.0 - double(tails) / units) - kTailSplitCostBlocks;
  const double gain = saved / (double(rounds + 1) * blocks);
  if (!force && gain < kTailSplitGain) return false;
  const TailSplit split{units, blocks, int(total)};
  int most = 1;
  Tile tl;
  for (int c = 0; c < units; ++c)
    for (int k = 0; split.piece(c, k, tl); ++k) most = std::max(most, tl.pieces);
  if (most >= 1024) return false;  // the kernel holds piece and pieces in 10 bits each (pack_place)
  order.full = rounds * units;
  order.split = split;
  order.max_pieces = most;
  return true;
}

// Bytes of the stream-K scratch: counters (zeroed), then the partials (16-byte aligned).
struct TailScratchLayout {
  size_t counter_bytes, partial_bytes;
  size_t partial_offset() const { return (counter_bytes + 255) / 256 * 256; }
  size_t total() const { return partial_offset() + partial_bytes; }
};
template <class Cfg>
TailScratchLayout tail_scratch_layout(const TileOrder& order) {
  const int64_t tails = order.count - order.full;
  const int64_t consumers = tails * order.cluster * Cfg::kConsumers;
  return {size_t(consumers) * sizeof(int),
          size_t(consumers) * order.max_pieces * 128 * (Cfg::kHeadDimV / 2 + 4) * sizeof(float)};
}

// Whether batched tensors' entries have keys of their own, the first seqused_k[b] of seqlen_k
// (Varlen::seqused_k without cu_seqlens: a KV cache's filled part). The launch takes them as a
// bound: the kernels with a bound at run time read each entry's (fwd_kernel's kEntryKeys), the
// others keep none of it.
// A paged KV cache (FwdParams::block_table) runs on the same kernels (its entries' keys seqlen_k
// where seqused_k is null).
// So do entries whose keys start past a left pad (FwdParams::leftpad_k).
inline bool entry_keys(const detail::FwdParams& a) {
  return (a.seqused_k != nullptr || a.leftpad_k != nullptr || a.block_table != nullptr) && !a.varlen();
}

// Whether every query tile sees the same key blocks (no causal or window bound): only such tiles
// may go to clusters (in static rounds) or take a stream-K tail.
// (A folded query group, FwdParams::fold, is neither this nor causal_bound's: its launches take the
// kernel with the bound at run time, the one that reads each row's query, fwd_kernel's kFoldable.)
// (Nor are batch entries with keys of their own, entry_keys.)
inline bool tiles_of_one_length(const detail::FwdParams& a) {
  return a.fold == 0 && !entry_keys(a) && a.window_right < 0 && a.window_left < 0;
}

// Whether the bound is causal, (-1, 0) however it was asked for (causal, or that window): such
// launches run the kernel with the bound at compile time (fwd_kernel's kCausal).
inline bool causal_bound(const detail::FwdParams& a) {
  return a.fold == 0 && !entry_keys(a) && a.window_left < 0 && a.window_right == 0;
}

// Whether every query tile sees the same key blocks: tiles of one length, or one query block a head
// (seqlen_q within a tile: decoding's few rows, folded or not) under any bound, where each head's
// one tile has tile 0's key range. Such tiles may take a stream-K tail (the bounded ones on single
// CTAs: fwd_kernel's kSplitBound).
// With batch entries' own keys (entry_keys) the pieces are cut along the longest range, tile 0's
// at seqlen_k, and each entry's tile walks those of its pieces that fall in its own range
// (fwd_kernel.cuh, piece_range). Without a left bound an entry's range starts at block 0 and ends
// at or below the longest one's end; with one it may start a block off the pieces' grid, so such
// tiles stay whole.
inline bool tiles_alike(const detail::FwdParams& a, int64_t m_blocks) {
  return tiles_of_one_length(a) || (m_blocks == 1 && !a.varlen() && !(entry_keys(a) && a.window_left >= 0));
}

// Whether a launch of `grid` units over `tiles` tiles takes each CTA's tiles past its first from
// the tile counter (FwdKernelParams::tile_counter): where tile lengths vary, and for tiles of one
// length on single CTAs; never with a stream-K tail (static rounds), for one CTA a tile (schedule
// 2), the static rounds' ablation (schedule 3), or a grid with a CTA for every tile.
inline bool use_tile_counter(bool uniform, int cluster, bool stream_k_tail, int schedule, int64_t grid, int64_t tiles) {
  return (!uniform || cluster == 1) && !stream_k_tail && schedule != 2 && schedule != 3 && grid < tiles;
}

// Whether a problem's tiles go to clusters of two CTAs sharing K and V (fwd_kernel.cuh): tiles of
// one length only (no causal or window bound; the pair walks one key range). On their own only
// where they measured faster (head_dim 128 and 256: +2...+6 % at FA3 shapes of 512-2k, -1...+2 %
// at 4k and 16k, 8k within noise; d64 -1...-3 %; docs/perf-notes.md) and where the padding of an
// odd query-block count (one idle block a head) costs little.
inline bool use_cluster_pairs(const detail::FwdParams& a, int64_t m_blocks) {
  if (!tiles_of_one_length(a) || a.schedule == 2 || a.cluster == 1 || m_blocks < 2) return false;
  return a.cluster == 2 || (a.head_dim >= 128 && (m_blocks % 2 == 0 || m_blocks >= 16));
}

// Whether a causal launch takes its tiles in pairs (tile_order.cuh, "Paired causal tiles"): d256,
// an even number of query blocks a head whose pairs m, M - 1 - m see key ranges summing to within
// one block of each other, so the static rounds stay even. H100 against the sections' dynamic grid
// (four rounds; docs/perf-notes.md): d256 causal 512 / 1k / 2k / 4k / 8k / 16k +3.4 / +2.4 / +2.5 /
// +4.4 / +5.6 / +6.1 %; d128 512 -1.5 %, 1k-16k -1.2...+0.3 %; d64 512 -1.0 %, 1k / 2k 0, 16k -4.9 %.
template <int kBlockM, int kBlockN>
bool use_paired_tiles(const detail::FwdParams& a, Window w, int64_t m_blocks, int cluster) {
  if (!pairs_at_head_dim(a.head_dim) || !causal_bound(a) || cluster != 1 || a.schedule != 0 || a.l2_section_bytes != 0) return false;
  if (m_blocks < 2 || m_blocks % 2 != 0 || m_blocks > 4096) return false;
  if (int64_t(a.batch) * a.heads_q * m_blocks > (int64_t(1) << 30)) return false;  // nth's 2 (r / 2 G + c) in int
  int lo = INT_MAX, hi = 0;
  for (int m = 0; m < int(m_blocks / 2); ++m) {
    const BlockRange x = key_block_range<kBlockM, kBlockN>(w, m, a.seqlen_q, a.seqlen_k);
    const BlockRange y = key_block_range<kBlockM, kBlockN>(w, int(m_blocks) - 1 - m, a.seqlen_q, a.seqlen_k);
    const int sum = std::max(0, x.hi - x.lo) + std::max(0, y.hi - y.lo);
    lo = std::min(lo, sum);
    hi = std::max(hi, sum);
  }
  return hi - lo <= 1;
}

// CTAs for `units` paired units (two tiles each) in static rounds over at most `slots` CTAs: as
// many rounds as `slots` CTAs would take, but every round full where the units allow, so no CTA
// of the last round sits idle while the others run one more unit. The busiest CTA runs as many units
// either way; fewer CTAs share the DRAM and L2 in the rounds before. FA3 shapes have 512 units at
// d256 (128 CTAs on 132 SMs). H100 / H200 against min(units, slots), four rounds: d256 causal 512 /
// 1k / 2k / 4k +0.4 / +0.6 / +0.8 / +0.5 % and +0.7 / +0.6 / +1.1 / +0.8 % (docs/perf-notes.md,
// "Whole rounds of pairs").
inline int64_t paired_grid(int64_t units, int64_t slots) {
  if (units <= 0 || slots <= 0) return 0;
  const int64_t rounds = (units + slots - 1) / slots;
  return (units + rounds - 1) / rounds;
}

// Under a causal or window bound a section's tiles go longest first, so its heads' tiles of one
// query block (one length) are taken together: with as many heads as the grid has CTAs, whole
// rounds run on long tiles (reading every head's K and V at once: DRAM-bound on an H100), then
// whole rounds on short ones. Sections of at most grid / share heads keep long and short tiles in
// flight together. Measured against 48 MB sections (64-256 heads at 512; H100 / H200):
// - share 4 (132 CTAs: 32 heads): d128 causal 512 +15 / +5 %, 1k +5 / +1 %; d256 512 +4 / +2 %;
// - three consumers (d64 on 192-row tiles, whose blocks ask two thirds of d128's DRAM bytes a
//   FLOP) do best with share 2 (64 heads): causal 512 +8 / 0 %, 1k +3.4 / -0.4 %, 2k 0 / 0, where
//   share 4 read +6.7 / -1.0 %, +2.8 / -1.1 %, -1.3 / -1.5 % (docs/perf-notes.md, "Causal sections
//   of at most a quarter of the grid").
inline constexpr int kVaryingSectionGridShare = 4;
inline constexpr int kVaryingSectionGridShareTall = 2;

// The persistent grid's tile order: heads in L2-sized sections, longest tiles first inside each;
// with clusters a tile is a pair of query blocks. `one_section`: every head in one section.
// `units_at_once`: the CTAs (or clusters) the grid runs at once; `grid_share`: under a bound a
// section holds at most units_at_once / grid_share heads.
inline TileOrder make_tile_order(const detail::FwdParams& a, int64_t m_blocks, int cluster, bool one_section,
                                 int64_t units_at_once, int grid_share) {
  const bool uniform = tiles_of_one_length(a);
  const int64_t units = (m_blocks + cluster - 1) / cluster;  // tiles a head
  const int64_t batch_heads = int64_t(a.batch) * a.heads_q;
  const int head_ratio = a.heads_q / a.heads_kv;
  const int64_t kv_bytes_per_q_head = std::max<int64_t>(1, 4ll * a.seqlen_k * a.head_dim / head_ratio);
  int64_t budget = a.l2_section_bytes > 0 ? a.l2_section_bytes : uniform ? kL2SectionBytes : kL2SectionBytesVarying;
  if (!uniform && a.l2_section_bytes == 0)
    budget = std::min(budget, std::max<int64_t>(1, units_at_once / grid_share) * kv_bytes_per_q_head);
  const int64_t section = one_section || a.l2_section_bytes < 0
                              ? batch_heads
                              : section_heads(batch_heads, kv_bytes_per_q_head, budget, !uniform);
  return TileOrder{int(units * batch_heads), int(units), int(batch_heads), a.heads_q, int(section), cluster, uniform};
}

// Window::shift for tiles of kBlockM rows: with a right bound (causal, or a window), tiles later in
// the sequence see more keys, and a partial tile is cheapest first. The shift is a multiple of 64
// (a consumer's rows are all before row 0 or none: O's stores skip the former whole), the most
// that leaves no tile of padding alone. d64 causal 4k, 192-row tiles: 363 key-block steps a head
// instead of 384.
template <int kBlockM>
int row_shift(const detail::FwdParams& a) {
  if (a.window_right < 0) return 0;
  return (kBlockM - a.seqlen_q % kBlockM) % kBlockM / 64 * 64;
}

// The launch's bound as tiles of kBlockM rows see it (shifted by row_shift).
template <int kBlockM>
Window tile_window(const detail::FwdParams& a) {
  // (Variable-length batches: each sequence's tiles from its row 0, the shift being per sequence.)
  return Window{a.window_left, a.window_right, a.varlen() ? 0 : row_shift<kBlockM>(a), a.fold};
}

// The sum over a head's query tiles of kBlockM rows (placed by row_shift) of f(window, m_block,
// key block range). Beyond 2048 query blocks every stride-th is counted and the sum scaled (a
// heuristic's input; the loop stays short).
template <int kBlockM, int kBlockN, class F>
double sum_over_tiles(const detail::FwdParams& a, F&& f) {
  const Window w = tile_window<kBlockM>(a);
  const int m_blocks = int((int64_t(a.seqlen_q) + kBlockM - 1) / kBlockM);
  const int stride = m_blocks > 2048 ? m_blocks / 2048 : 1;
  double sum = 0;
  for (int m = 0; m < m_blocks; m += stride)
    sum += double(f(w, m, key_block_range<kBlockM, kBlockN>(w, m, a.seqlen_q, a.seqlen_k))) * stride;
  return sum;
}

// Score elements a head's tiles of kBlockM x kBlockN compute (padding rows and masked keys of
// partial blocks included): what the tile height costs a problem.
template <int kBlockM, int kBlockN>
double computed_scores(const detail::FwdParams& a) {
  return sum_over_tiles<kBlockM, kBlockN>(a, [](const Window&, int, BlockRange r) { return r.hi - r.lo; }) *
         kBlockM * kBlockN;
}

// Score elements four consumers (256-row tiles, 64-key blocks) compute under a causal or window
// bound: each consumer's 64 rows walk the blocks of the tile's key range that those rows see
// (fwd_kernel's kSkipLeading passes the others over; at least one), and an idle consumer (rows
// all outside the sequence) none.
inline double four_consumer_scores(const detail::FwdParams& a) {
  constexpr int kBlockM = 256, kBlockN = 64;
  auto walked = [&](const Window& w, int m, BlockRange r) {
    int blocks = 0;
    for (int c = 0; c < kBlockM / 64 && r.hi > r.lo; ++c) {
      const int first = tile_first_row<kBlockM>(w, m) + 64 * c;
      if (first >= a.seqlen_q || first + 64 <= 0) continue;
      int hi = r.hi, lo = r.lo;
      if (w.right >= 0) {
        // The keys [0, seen_end) its last row sees; at least the range's first block.
        const int64_t seen_end = int64_t(row_query(w, first + 63)) + 1 + key_offset(w, a.seqlen_q, a.seqlen_k) + w.right;
        hi = seen_end <= int64_t(r.lo + 1) * kBlockN
                 ? r.lo + 1
                 : int(std::min<int64_t>(r.hi, (seen_end + kBlockN - 1) / kBlockN));
      }
      if (w.left >= 0) {  // from the lowest block its first row sees, at most its last
        const int64_t lo_key = int64_t(row_query(w, first)) + key_offset(w, a.seqlen_q, a.seqlen_k) - w.left;
        if (lo_key > int64_t(r.lo) * kBlockN) lo = int(std::min<int64_t>(hi - 1, lo_key / kBlockN));
      }
      blocks += hi - lo;
    }
    return blocks;
  };
  return sum_over_tiles<kBlockM, kBlockN>(a, walked) * 64 * kBlockN;
}

// d64 has three tile heights: two, three or four consumers of 64 query rows. Three consumers
// (192 rows) do 16-25 % more a computed score than two (128 rows), but compute more padding where
// queries are few or causal tiles short. Two when the 192-row tiles would compute more than
// kD64TallTilesWorse times the 128-row ones' scores (measured on an H100 with tiles placed by
// row_shift: causal 1k, 1.125 times the scores with 192 rows, three consumers +1.6 %; causal 512,
// 1.2 times, two +3.4 %; docs/perf-notes.md). With a causal or window bound three consumers cut
// each block to their own rows (fwd_kernel's kConsumerMask, kSkipFirst), which the count does not
// see: there the bar is 1.25 (H100, 4fa857c: causal 384 at 1.25 three +7.2 %, 512 at 1.2
// +1.2…1.9 %, 640 at 1.2 −1.3 %; 256 at 1.5 two +6.3 %, 256 x 2048 +12 %; docs/perf-notes.md).
//
// Four consumers (256 rows; their 112 registers hold S of 64-key blocks only) compute no padding
// where seqlen_q is a multiple of 256 and do 2-7 % less a computed score than three: H100 against
// three, 512 (1.125 times the scores on 192-row tiles) +4.2 %, 1000 and 1k (1.125) +2.3…2.6 %, 2k
// and 4k (1.031) −1.5…−2.3 %, 16k (1.008) −1.7 % (docs/perf-notes.md, "Four consumers at d64").
// Under a bound four consumers pass over the blocks above each one's diagonal
// (four_consumer_scores counts what is left): H100 against two or three, causal 512 (three
// compute 1.33 times the 64-row strips' scores) +8.6 %, 1k (1.19) +5.9 %, 2k (1.09) −0.8 %, 4k
// (1.05) −2.4 %, 16k −4.1 %. With a left bound each also ends its walk on the lowest block its
// rows see: windows (256, 0) and (1024, 0) at 4k +18.7 / +10.4 %, (128, 128) at 2k +19.2 %,
// (4096, 0) at 16k (three compute 1.05 times four's count) +0.6 % (docs/perf-notes.md, "Four
// consumers at d64 under a bound", "... and a window's left edge").
// So a height costs its computed scores times its weight (two 1.15, or 1.25 under a bound, where
// three cut their diagonal finer than the count sees; three 1; four kD64WideTilesWorse, or
// kD64WideTilesWorseBounded on four_consumer_scores), and the cheapest is taken, three on a tie.
inline constexpr double kD64TallTilesWorse = 1.15;
inline constexpr double kD64TallTilesWorseBounded = 1.25;
inline constexpr double kD64WideTilesWorse = 1.075;
inline constexpr double kD64WideTilesWorseBounded = 1.12;
inline int d64_consumers(const detail::FwdParams& a) {
  if (a.block_table != nullptr) return 2;  // a paged cache: the kernels on two consumers read pages
  const double three = computed_scores<192, 128>(a);
  // (A folded query group, whose one tile a head sees every key block, takes the rule of tiles of
  // one length, the one its unfolded decoding tiles were measured under; so do decoding's few rows
  // against batch entries' own keys (entry_keys), whose tiles differ in their keys alone: under the
  // bounded rule four consumers, which count only the one with rows, won, and their stream-K kernel
  // reads no entry's keys (split_reads_entry_keys), so 8 x 32/4 heads x 8k keys ran on whole tiles
  // in 2.08 times the time of the same call without the lengths; H200, 71306b7.)
  const bool uniform = tiles_of_one_length(a) || a.fold > 0 || (entry_keys(a) && a.seqlen_q <= kShortTileRows);
  const double two = (uniform ? kD64TallTilesWorse : kD64TallTilesWorseBounded) * computed_scores<128, 128>(a);
  const double four = uniform ? kD64WideTilesWorse * computed_scores<256, 64>(a)
                              : kD64WideTilesWorseBounded * four_consumer_scores(a);
  if (three <= two && three <= four) return 3;
  return two < four ? 2 : 4;
}

// d256 has two key-block widths: 80 keys, the widest that two K/V stages leave room for beside one
// Q buffer, and 64. Under a causal or window bound a tile's last blocks overrun its diagonal, and
// 80-key blocks overrun it more: at causal 512 they compute 1.125 times the scores of 64-key ones,
// at 1k 1.059, 2k 1.029, 4k 1.015. A 64-key block costs more a score (a block's fixed costs are
// the same), so the 64-key blocks only where the 80-key ones compute at least
// kD256WideBlocksWorse times their scores (H200, four rounds: causal 512 +4.0 %, 1k +2.1 %, 2k
// +0.8 %, 4k +0.3 %, 16k -3.1 %; without a bound 512 (1.094) -0.4 %, 1k -2.3 %, so never there;
// docs/perf-notes.md, "d256 on 64-key blocks under a causal bound").
inline constexpr double kD256WideBlocksWorse = 1.02;
inline bool d256_narrow_blocks(const detail::FwdParams& a) {
  return !tiles_of_one_length(a) && computed_scores<128, 80>(a) >= kD256WideBlocksWorse * computed_scores<128, 64>(a);
}

// Under a causal bound where a head's 128-row tiles see at most kD256SerialMaxBlocks 128-key
// blocks on average (causal 512: 2.5; 1k: 4.5) and go in pairs (use_paired_tiles, on 128-key
// blocks), d256 runs on 128-key blocks with one K and one V slot and the serial step
// (FwdConfig::kSerialStep), cuDNN's design point there: the tile boundary waits on fewer, larger
// loads, and consumer 0's O leaves through a buffer of its own. Four rounds against the 64-key
// blocks, H100 / H200: causal 512 +3.5 / +2.4 %, 256 +0.5 / +2.4 %; where it is not taken, H100:
// 1k -1.1 %, 2k -4.5 %, and causal 300 (three query blocks: no pairs) -2.6 % (docs/perf-notes.md,
// "The serial step on 128-key blocks at d256").
inline constexpr double kD256SerialMaxBlocks = 3.0;
// Without a bound, where every tile sees at most kD256SerialMaxKeys keys (four 128-key blocks), the
// serial step too, in the launch's clusters as the 80-key blocks would be. Four rounds against the
// 80-key blocks, H100 (seqlen_q = seqlen_k but where given): 256 +4.4 %, 384 +0.1 %, 512 +2.6 / +3.1
// %, 512 with one K/V head +3.9 %, 4096 x 512 keys +4.2 %; where it is not taken, 640 -2.4 %, 768
// -0.4 %, 1k -2.7 %, 2k -4.6 %, 4k -5.5 % (docs/perf-notes.md, "The serial step without a bound").
inline constexpr int kD256SerialMaxKeys = 512;

// The key-block width a d256 launch takes, each rule above asked once: 128 (the serial step) for
// short keys without a bound; otherwise 80, 64 where d256_narrow_blocks holds, and 128 where the
// serial step's causal conditions hold too.
inline int d256_block_keys(const detail::FwdParams& a) {
  if (a.block_table != nullptr) return 64;  // a paged cache: a block on one page or on whole pages
  // (Folded rows with sinks: not the serial step, whose kernel takes a tile's sink from its head.)
  const bool serial_ok = a.sink == nullptr || a.sink_group == 1;
  if (tiles_of_one_length(a) && a.seqlen_k <= kD256SerialMaxKeys) return serial_ok ? 128 : 80;
  if (!d256_narrow_blocks(a)) return 80;
  if (!causal_bound(a)) return 64;
  const int64_t m_blocks = (int64_t(a.seqlen_q) + 127) / 128;
  const bool serial = use_paired_tiles<128, 128>(a, tile_window<128>(a), m_blocks, 1) &&
                      computed_scores<128, 128>(a) / (128.0 * 128.0) <= kD256SerialMaxBlocks * double(m_blocks);
  return serial && serial_ok ? 128 : 64;
}
inline bool d256_serial_step(const detail::FwdParams& a) { return d256_block_keys(a) == 128; }

using detail::PerDevice;

// Lets fwd_kernel<Cfg, kCluster, kSplit, kBounded, kCausal> use Cfg::kSmemBytes of dynamic shared
// memory on `device` (once a device: detail::allow_dynamic_smem).
template <class Cfg, int kCluster, bool kSplit = false, bool kBounded = false, bool kCausal = false>
cudaError_t allow_smem(int device) {
  return detail::allow_dynamic_smem<fwd_kernel<Cfg, kCluster, kSplit, kBounded, kCausal>>(device, Cfg::kSmemBytes);
}

// Calls f.template operator()<kernel>() with the whole-tile kernel on single CTAs that a launch's
// bound takes: none (`uniform`), the causal one with (-1, 0) at compile time (`causal`), or any
// other at run time. The one place that choice is made, for the shared-memory attribute and the
// launch alike.
// The serial step has no kernel for other bounds (d256_block_keys never takes it there; launch_forward
// refuses them), so none is built.
// (kVarlen: the kernels with_varlen_config picks, and no others: d256's 80-key blocks without a
// bound, its 64-key ones under one.)
// (Soft-capped configs, softcapped<Cfg>(), take the same subset.)
// (A paged cache's configs, paged_config<Cfg>(): the kernel with a bound at run time only, for
// every bound: batched, the one that reads entries' keys; varlen, the causal bound and none too.)
template <class Cfg, bool kVarlen = false, class F>
cudaError_t with_whole_tile_kernel(bool uniform, bool causal, F&& f) {
  if constexpr (paged_config<Cfg>()) {
    if (!kVarlen && (uniform || causal)) return cudaErrorNotSupported;  // (entry_keys: neither)
    return f.template operator()<fwd_kernel<Cfg, 1, false, true, false, kVarlen>>();
  } else {
    constexpr bool kSubset = kVarlen || softcapped<Cfg>();
    constexpr bool kUnbounded = !kSubset || Cfg::kHeadDim != 256 || Cfg::kBlockN == 80;
    constexpr bool kBounds = !kSubset || Cfg::kHeadDim != 256 || Cfg::kBlockN == 64;
    if (uniform) {
      if constexpr (kUnbounded)
        return f.template operator()<fwd_kernel<Cfg, 1, false, false, false, kVarlen>>();
      else
        return cudaErrorNotSupported;
    }
    if constexpr (!kBounds) {
      return cudaErrorNotSupported;
    } else {
      if (causal) return f.template operator()<fwd_kernel<Cfg, 1, false, true, true, kVarlen>>();
      if constexpr (Cfg::kSerialStep)
        return cudaErrorNotSupported;
      else
        return f.template operator()<fwd_kernel<Cfg, 1, false, true, false, kVarlen>>();
    }
  }
}

// A launch of `grid` CTAs of Cfg in clusters of two: the config and its one attribute (the
// config points at the attribute, so both live in this struct).
template <class Cfg>
struct PairLaunch {
  cudaLaunchConfig_t cfg{};
  cudaLaunchAttribute cluster_dim{};
  PairLaunch(int grid, cudaStream_t stream) {
    cluster_dim.id = cudaLaunchAttributeClusterDimension;
    cluster_dim.val.clusterDim.x = 2;
    cluster_dim.val.clusterDim.y = 1;
    cluster_dim.val.clusterDim.z = 1;
    cfg.gridDim = dim3(grid);
    cfg.blockDim = dim3(Cfg::kThreads);
    cfg.dynamicSmemBytes = Cfg::kSmemBytes;
    cfg.stream = stream;
    cfg.attrs = &cluster_dim;
    cfg.numAttrs = 1;
  }
  PairLaunch(const PairLaunch&) = delete;
};

// Clusters of two of this kernel that fit on the device at once (0 when none or the query fails).
template <class Cfg>
int max_cluster_pairs(int device) {
  static PerDevice pairs;
  return pairs.get(device, [] {
    const PairLaunch<Cfg> launch(2, nullptr);
    int n = 0;
    if (cudaOccupancyMaxActiveClusters(&n, fwd_kernel<Cfg, 2>, &launch.cfg) != cudaSuccess) {
      cudaGetLastError();
      n = 0;
    }
    return n;
  });
}

// A folded query group (FwdParams::fold) reads each KV head's K and V once a tile instead of once a
// query head's tile. Where the unfolded tiles (one a query head: at most 64 rows) fit in one round
// of the grid, each already streams its keys beside the others and the fold only leaves
// multiprocessors idle; there the launch runs unfolded. H200, fa4-bench against the unfolded
// build, causal: past one round 1.71-2.51 (d128 b 8 x 32/8 heads x 4 queries x 8k keys 1.72, b 32
// x 4k 2.07, 8 queries 1.71; d64 b 8 x 32/4 2.51); within one, b 1 x 32/8 d128 (32 tiles) 0.96 and
// d256 b 8 x 16/4 (128 tiles) 0.99 (docs/perf-notes.md, "A few query rows a head").
// Those were whole tiles. A folded launch's tiles (one query block a head) now also take the
// stream-K tail (tiles_alike), which spreads even a few of them over every multiprocessor: there
// the fold reads each KV head's K and V once for the whole grid, where unfolded tiles read them
// once a query head. So the fold is undone only where its tiles stay whole by the ablations'
// choice (FwdParams::split 1, schedule 2) or for want of a stream-K kernel (soft-capped d256 under a
// bound, which a fold is: launch_forward's kSplits) and fit in one round unfolded.
// sms: the multiprocessors, of which the grid takes at most FwdParams::max_ctas where set.
inline bool fold_pays(const detail::FwdParams& a, int sms) {
  const int grid = a.max_ctas > 0 && a.max_ctas < sms ? a.max_ctas : sms;
  if (a.fold == 0) return false;
  // (A fold's rows are one query block a head: pieces where such tiles are alike, tiles_alike.)
  const bool pieces =
      a.split != 1 && a.schedule != 2 && !(a.softcap > 0.0f && a.head_dim == 256) && tiles_alike(a, 1);
  return pieces || int64_t(a.batch) * (int64_t(a.heads_q) << a.fold) > grid;
}
inline void unfold_query_rows(detail::FwdParams* a) {
  if (a->fold == 0) return;  // (rows not folded, or a query group folded by strides: kept)
  a->seqlen_q >>= a->fold;
  a->heads_q <<= a->fold;
  a->fold = 0;
  a->sink_group = 1, a->sink_mask = 0;
}

// The device's peak DRAM bandwidth in GB/s by its memory clock and bus width (double data rate);
// 0 where the query fails (asked again next launch), at least 1 where it answers. Kept once a
// device: the memory clock's query took about 0.7 ms a call on an H200, several times the launch
// it decides (docs/perf-notes.md, "The long tile's diagonal read last, built").
inline int dram_gbps(int device) {
  static PerDevice gbps;
  return gbps.get(device, [device] {
    int khz = 0, bits = 0;
    if (cudaDeviceGetAttribute(&khz, cudaDevAttrMemoryClockRate, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&bits, cudaDevAttrGlobalMemoryBusWidth, device) != cudaSuccess) {
      cudaGetLastError();
      return 0;
    }
    // A clock or width of 0 still answers: kept as 1 (slow DRAM), so it is not asked every launch.
    return std::max(1, int(int64_t(khz) * bits * 2 / 8 / 1000000));
  });
}

// The stream-K kernel's shared-memory attribute, for single CTAs or clusters of two (kSingleCtas:
// configs that form no cluster, whose cluster kernels are not built).
template <class Cfg, bool kSingleCtas>
cudaError_t split_smem_allowed(int device, int cluster) {
  if constexpr (kSingleCtas)
    return allow_smem<Cfg, 1, true>(device);
  else
    return cluster == 1 ? allow_smem<Cfg, 1, true>(device) : allow_smem<Cfg, 2, true>(device);
}

// kVarlen: a variable-length batch (a.varlen()), on single CTAs walking whole tiles: the grid's
// tiles are those of the longest sequence (a.seqlen_q) in each (batch, head), and the maps run
// over the packed rows (batch extent 1).
// Soft-capped configs (softcapped<Cfg>()) run on single CTAs too, without clusters, so that few of
// their kernels are built: the whole-tile ones, and the stream-K one where tiles of one length can
// be cut (decoding's few folded tiles need it: one CTA a tile cannot draw DRAM's bandwidth).
template <class Cfg, bool kVarlen = false>
Status launch_forward(const detail::FwdParams& a, cudaStream_t stream, uint64_t* trace = nullptr) {
  constexpr bool kWholeTiles = kVarlen;
  constexpr bool kSingleCtas = kVarlen || softcapped<Cfg>() || paged_config<Cfg>();
  // Cut tails run on tiles of one length, which the soft-capped d256 configs take on 80-key blocks.
  constexpr bool kSplits = !kVarlen && (!softcapped<Cfg>() || Cfg::kHeadDim != 256 || Cfg::kBlockN == 80);
  if (a.varlen() != kVarlen)
    return {StatusCode::kNotSupported, kVarlen ? "the varlen launch needs cu_seqlens" : "varlen goes to its own launch"};
  if ((a.softcap > 0.0f) != softcapped<Cfg>())
    return {StatusCode::kNotSupported, a.softcap > 0.0f ? "softcap > 0 needs a soft-capped configuration"
                                                        : "a soft-capped configuration needs softcap > 0"};
  if ((a.block_table != nullptr) != paged_config<Cfg>())
    return {StatusCode::kNotSupported, a.block_table != nullptr ? "a paged cache needs a paged configuration"
                                                                : "a paged configuration needs a paged cache"};
  if (a.sink != nullptr && a.sink_group > 1 && !per_row_sinks<Cfg>())
    return {StatusCode::kNotSupported, "folded rows with sinks need a configuration that reads each row's sink "
                                       "(not d256's soft-capped or serial-step ones)"};
  // With a causal or window bound the whole-tile kernel that carries it (fwd_kernel's kBounded),
  // the causal one with that bound at compile time (kCausal).
  const bool uniform = tiles_of_one_length(a);
  const bool causal = causal_bound(a);
  if constexpr (Cfg::kSerialStep)
    if (!uniform && !causal)
      return {StatusCode::kNotSupported, "window = (" + std::to_string(a.window_left) + ", " +
                                             std::to_string(a.window_right) +
                                             "): the serial step runs without a bound or under a causal one"};
  FwdKernelParams k{};
  k.trace = trace;
  int device = 0, sms = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (e != cudaSuccess) return {StatusCode::kCudaError, std::string("device query: ") + cudaGetErrorString(e)};
  const cudaError_t attr = with_whole_tile_kernel<Cfg, kVarlen>(
      uniform, causal, [&]<auto kKernel>() { return detail::allow_dynamic_smem<kKernel>(device, Cfg::kSmemBytes); });
  if (attr != cudaSuccess) return {StatusCode::kCudaError, std::string("cudaFuncSetAttribute: ") + cudaGetErrorString(attr)};

  const int64_t m_blocks = (a.seqlen_q + Cfg::kBlockM - 1) / Cfg::kBlockM;
  // Clusters of two where the problem suits them and the device runs them.
  int pair_clusters = 0;
  if constexpr (!kSingleCtas)
    pair_clusters =
        use_cluster_pairs(a, m_blocks) && allow_smem<Cfg, 2>(device) == cudaSuccess ? max_cluster_pairs<Cfg>(device) : 0;
  const int cluster = pair_clusters > 0 ? 2 : 1;
  // A paged cache: a key block on one page or on whole pages (pages of a power of two >= 16 rows),
  // on the kernels that read entries' keys (entry_keys), single CTAs, boxes of the block's rows or
  // of a page's where pages are smaller.
  const bool paged = a.block_table != nullptr;
  if (paged && (a.page_size < 16 || (a.page_size & (a.page_size - 1)) != 0))
    return {StatusCode::kNotSupported, "paged.page_size = " + std::to_string(a.page_size) +
                                           ": this configuration takes pages of a power of two >= 16 rows"};
  // With clusters each CTA loads half of a block.
  const int kv_box = paged ? int(std::min<int64_t>(a.page_size, Cfg::kBlockN)) : Cfg::kBlockN / cluster;

  // The maps' geometry: with varlen one batch of the packed rows (its stride, never stepped, one
  // TMA takes: the rows').
  detail::FwdParams mp = a;
  if constexpr (kVarlen) {
    mp.batch = 1;
    mp.seqlen_q = a.total_q;
    mp.seqlen_k = a.total_k;
    for (int64_t* st : {mp.q_stride, mp.k_stride, mp.v_stride, mp.o_stride})
      if (!paged || st == mp.q_stride || st == mp.o_stride) st[0] = std::max<int64_t>(st[1], 8);  // (pages: theirs)
  }
  // A paged cache's K and V maps run over the pools: a page a batch entry, its rows a sequence.
  // (Q and O keep the batch's.)
  const int kv_batches = paged ? a.num_pages : mp.batch, kv_rows = paged ? a.page_size : mp.seqlen_k;
  // With O staged in K/V slots (one Q buffer; FwdConfig::kFoldedQO) Q loads as each consumer's 64 rows
  // of every 64-column chunk in one box (fwd_kernel's Q loaders), and O leaves the same way; otherwise
  // a box is a tile's rows of one chunk.
  // A folded query group (a.fold): Q and O over (dim, heads_q, seq, batch), a box row a query's
  // head in the group (ptx::bshd_query_group_spec; the kernel's coordinates: epilogue.cuh, MapRow).
  // `cols`: the columns the tensor holds (FwdParams::qk_cols, v_cols), the maps' extent: TMA fills
  // a box's columns past it with zeros. A folded box (of every 64-column chunk) would read the
  // next head's columns there, so those maps take only whole tensors.
  const int qk_cols = a.qk_cols > 0 ? a.qk_cols : a.head_dim, v_cols = a.v_cols > 0 ? a.v_cols : a.head_dim;
  // A configuration of a narrower value side (ValueDimConfig: Cfg::kHeadDimV) takes v and o of
  // exactly that many columns, the others v_cols of at most head_dim.
  if (v_cols > a.head_dim || (Cfg::kHeadDimV != Cfg::kHeadDim && v_cols != Cfg::kHeadDimV))
    return {StatusCode::kNotSupported, "v_cols = " + std::to_string(v_cols) + ": this configuration's value side is " +
                                           std::to_string(Cfg::kHeadDimV) + " columns"};
  const int v_dim = Cfg::kHeadDimV != Cfg::kHeadDim ? Cfg::kHeadDimV : a.head_dim;  // (v's and o's whole tensors)
  if ((Cfg::kFoldedQO || folded_kv<Cfg>() || Cfg::kHeadDim > 128) && (qk_cols != a.head_dim || v_cols != v_dim))
    return {StatusCode::kNotSupported, "qk_cols = " + std::to_string(qk_cols) + ", v_cols = " + std::to_string(v_cols) +
                                           ": this configuration's folded boxes take tensors of head_dim = " +
                                           std::to_string(a.head_dim) + " columns (v and o " + std::to_string(v_dim) + ")"};
  // `whole`: the folded map's columns (a tensor's whole row: head_dim for q, v_dim for o).
  auto map_qo = [&](CUtensorMap* map, const void* base, const int64_t(&stride)[3], int rows, int cols, int whole) {
    if (a.fold > 0)
      return ptx::make_tensor_map_16bit_sw128(
          map, base, ptx::bshd_query_group_spec(stride, a.batch, a.seqlen_q >> a.fold, a.heads_q << a.fold,
                                                Cfg::kFoldedQO ? whole : cols, rows, a.fold, Cfg::kFoldedQO));
    return Cfg::kFoldedQO
               ? ptx::map_bshd_16bit_sw128_folded(map, base, stride, mp.batch, mp.seqlen_q, a.heads_q, whole, rows)
               : ptx::map_bshd_16bit_sw128(map, base, stride, mp.batch, mp.seqlen_q, a.heads_q, cols, rows);
  };
  const int rq = map_qo(&k.tm_q, a.q, mp.q_stride, Cfg::kFoldedQO ? 64 : Cfg::kBlockM, qk_cols, a.head_dim);
  // K or V; folded (folded_kv): boxes of the whole block's rows, of every chunk or, with clusters,
  // of this CTA's half of them.
  auto map_kv = [&](CUtensorMap* map, const void* base, const int64_t(&stride)[3], int cols) {
    return folded_kv<Cfg>() ? ptx::map_bshd_16bit_sw128_folded(map, base, stride, mp.batch, mp.seqlen_k, a.heads_kv,
                                                               a.head_dim, Cfg::kBlockN, Cfg::kChunks / cluster)
                            : ptx::map_bshd_16bit_sw128(map, base, stride, kv_batches, kv_rows, a.heads_kv, cols, kv_box);
  };
  const int rk = map_kv(&k.tm_k, a.k, mp.k_stride, qk_cols), rv = map_kv(&k.tm_v, a.v, mp.v_stride, v_cols);
  const int ro = Cfg::kTmaStoreO ? map_qo(&k.tm_o, a.o, mp.o_stride, 64, v_cols, v_dim) : 0;
  if (rq || rk || rv || ro)
    return {StatusCode::kNotSupported, "cuTensorMapEncodeTiled refused a tensor (driver error " +
                                           std::to_string(rq ? rq : rk ? rk : rv ? rv : ro) + ")"};
  k.o = a.o;
  k.o_cols = v_cols;  // (o is of the value side's width)
  k.lse = a.lse;
  k.sink = a.sink;
  k.sink_group = a.sink_group;
  k.sink_mask = a.sink_mask;
  for (int i = 0; i < 3; ++i) k.o_stride[i] = a.o_stride[i];
  if constexpr (kVarlen) {  // rows from each sequence's first (seq_span), batch 0 of the maps
    k.o_stride[0] = 0;
    k.cu_seqlens_q = a.cu_seqlens_q;
    k.cu_seqlens_k = a.cu_seqlens_k;
    k.total_q = a.total_q;
    k.total_k = a.total_k;
    k.seqused_k = a.seqused_k;
    k.leftpad_k = a.leftpad_k;
  }
  if (entry_keys(a)) k.seqused_k = a.seqused_k, k.leftpad_k = a.leftpad_k;  // (the kernels with a bound at run time)
  if (paged) {  // (those kernels too)
    k.block_table = a.block_table;
    k.table_stride = a.table_stride;
    k.num_pages = a.num_pages;
    while ((1 << k.page_shift) < a.page_size) ++k.page_shift;
  }
  k.batch = a.batch;
  k.seqlen_q = a.seqlen_q;
  k.seqlen_k = a.seqlen_k;
  k.heads_q = a.heads_q;
  k.head_ratio = a.heads_q / a.heads_kv;
  k.scale_log2 = a.scale_log2;
  k.rescale_threshold = a.rescale_threshold;
  k.softcap = a.softcap;
  k.softcap_in = a.softcap_in;
  k.window = tile_window<Cfg::kBlockM>(a);

  const int64_t batch_heads = int64_t(a.batch) * a.heads_q;
  const int64_t tiles = (m_blocks + cluster - 1) / cluster * batch_heads;
  if (tiles > INT32_MAX)
    return {StatusCode::kNotSupported, "batch * heads_q * ceil(seqlen_q / " + std::to_string(Cfg::kBlockM) +
                                           ") = " + std::to_string(tiles) + " tiles: at most 2^31 - 1"};
  // Past its first tile a CTA takes its next from a counter when it finishes one: tiles whose
  // length varies, and tiles of one length on single CTAs without a stream-K tail, where a head's
  // last block is cheaper when partial (idle consumers; d64 on an H100 +1.2...+2.2 % over static
  // rounds of the same rising order, docs/perf-notes.md). Clusters and stream-K tails go in static
  // rounds. schedule 2 (ablation): one CTA per tile; schedule 3 (ablation, the earlier order):
  // static rounds, and one section of every head where lengths vary; schedule 4 (ablation): the
  // dynamic grid over one such section.
  int64_t slots = cluster > 1 ? pair_clusters : sms;  // units (CTAs or clusters) at once
  if (a.max_ctas > 0) slots = std::max<int64_t>(1, std::min<int64_t>(slots, a.max_ctas / cluster));
  constexpr int kShare = Cfg::kConsumers >= 3 ? kVaryingSectionGridShareTall : kVaryingSectionGridShare;
  // Paired causal tiles go in static rounds of pairs; their decode reads no sections, so they take
  // one section of every head.
  const bool paired = !kVarlen && use_paired_tiles<Cfg::kBlockM, Cfg::kBlockN>(a, k.window, m_blocks, cluster);
  k.tiles = make_tile_order(a, m_blocks, cluster, paired || ((a.schedule == 3 || a.schedule == 4) && !uniform), slots,
                            kShare);
  k.tiles.paired = paired;
  int grid = int(a.schedule == 2       ? tiles
                 : k.tiles.paired ? paired_grid(tiles / 2, slots)
                                  : cluster * std::min<int64_t>(tiles, slots));
  // Pairs of four or more query blocks under the plain causal bound (as many keys as queries): a
  // head's longest tile walks its diagonal block last (TileOrder::diagonal_last_from). Where DRAM
  // is fast (4 TB/s or more by its clock and width: an H200) in every round, which measured 1 %
  // faster there at four blocks, 0.1-0.5 % at six to sixteen. Otherwise (an H100) in the last
  // round only, from its first whole head: in every round the load order alone measured 1.8 %
  // slower on an H100, in the last round 0.5 % faster (docs/perf-notes.md, "The long tile's
  // diagonal read last").
  if (k.tiles.paired && m_blocks >= 4 && a.seqlen_q == a.seqlen_k && a.diagonal_last != 1) {
    const bool every_round = a.diagonal_last == 3 || (a.diagonal_last == 0 && dram_gbps(device) >= 4000);
    k.tiles.diagonal_last_from = every_round ? 0 : TileOrder::last_round_first_head(tiles / 2, grid, m_blocks / 2);
  }
  LaunchScratch scratch;
  if constexpr (kSplits) {  // (no stream-K kernel is built for whole-tile configs)
    if ((uniform || (split_reads_bound<Cfg>() && tiles_alike(a, m_blocks))) &&
        (!entry_keys(a) || split_reads_entry_keys<Cfg>()) && a.schedule != 2 && a.split != 1) {
      // Every unit takes part, also when there are fewer tiles than units (then every tile is cut).
      const BlockRange kr = key_block_range<Cfg::kBlockM, Cfg::kBlockN>(k.window, 0, a.seqlen_q, a.seqlen_k);
      TileOrder order = k.tiles;
      if (plan_tail_split(order, int(slots), kr.hi - kr.lo, a.split == 2) &&
          (a.split == 2 || a.seqlen_q > kShortTileRows ||
           short_tail_split_pays(order.count - order.full, kr.hi - kr.lo, int(slots), a.head_dim)) &&
          split_smem_allowed<Cfg, kSingleCtas>(device, cluster) == cudaSuccess) {
        // The piece counters: the stream's own, zero from its last launch, where they fit; else
        // zeroed scratch before the partials. The partials need no zeroing.
        const TailScratchLayout layout = tail_scratch_layout<Cfg>(order);
        int* own = layout.counter_bytes <= detail::kStreamPieceCounters * sizeof(int)
                       ? detail::stream_counters(device, stream)
                       : nullptr;
        e = own != nullptr ? scratch.make(stream, layout.partial_bytes, 0)
                           : scratch.make(stream, layout.total(), layout.counter_bytes);
        if (e == cudaSuccess) {
          k.tiles = order;
          grid = int(slots) * cluster;
          k.piece_counters = own != nullptr ? own + detail::kStreamTileCounterInts : reinterpret_cast<int*>(scratch.ptr);
          k.partials = reinterpret_cast<float*>(own != nullptr ? scratch.ptr : scratch.ptr + layout.partial_offset());
        } else if (!LaunchScratch::unavailable(e)) {  // (when unavailable: whole tiles only)
          return {StatusCode::kCudaError, std::string("stream-K scratch: ") + cudaGetErrorString(e)};
        }
      }
    }
  }
  if (!k.tiles.paired && use_tile_counter(uniform, cluster, k.tiles.has_tail(), a.schedule, grid, tiles)) {
    // The stream's own counter, zero from its last launch; else scratch zeroed for this one.
    constexpr size_t kCounterBytes = detail::kStreamTileCounterInts * sizeof(int);
    int* counter = detail::stream_counters(device, stream);
    e = counter != nullptr ? cudaSuccess : scratch.make(stream, kCounterBytes, kCounterBytes);
    if (e == cudaSuccess) {
      k.tile_counter = counter != nullptr ? counter : reinterpret_cast<int*>(scratch.ptr);
    } else if (LaunchScratch::unavailable(e)) {
      // The static rounds; where lengths vary, over one section of every head so their
      // longest-first order keeps the grid even.
      if (!uniform) k.tiles = make_tile_order(a, m_blocks, cluster, true, slots, kShare);
    } else {
      return {StatusCode::kCudaError, std::string("tile counter: ") + cudaGetErrorString(e)};
    }
  }
  auto launch = [&](const FwdKernelParams& kp, bool split) -> cudaError_t {
    if constexpr (kWholeTiles) {
      return with_whole_tile_kernel<Cfg, kVarlen>(uniform, causal, [&]<auto kKernel>() {
        kKernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(kp);
        return cudaGetLastError();
      });
    } else {
      if (cluster == 1) {
        if constexpr (kSplits)
          if (split) {
            fwd_kernel<Cfg, 1, true><<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(kp);
            return cudaGetLastError();
          }
        return with_whole_tile_kernel<Cfg>(uniform, causal, [&]<auto kKernel>() {
          kKernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(kp);
          return cudaGetLastError();
        });
      }
      if constexpr (kSingleCtas) {
        return cudaErrorNotSupported;  // (no cluster is formed for these configs)
      } else {
        const PairLaunch<Cfg> pairs(grid, stream);
        return cudaLaunchKernelEx(&pairs.cfg, split ? fwd_kernel<Cfg, 2, true> : fwd_kernel<Cfg, 2, false>, kp);
      }
    }
  };
  const bool split = k.tiles.has_tail();
  if (split && k.tiles.full > 0) {
    // The whole rounds by the whole-tile kernel (its code, not the stream-K kernel's, runs them),
    // then the tail alone, spread over every unit, on the same stream.
    FwdKernelParams whole = k;
    whole.tiles = k.tiles.whole_rounds();
    whole.piece_counters = nullptr;
    whole.partials = nullptr;
    e = launch(whole, false);
    if (e != cudaSuccess) return {StatusCode::kCudaError, std::string("sm90 forward launch: ") + cudaGetErrorString(e)};
    k.tiles.tail_only = true;
  }
  e = launch(k, split);
  if (e != cudaSuccess) return {StatusCode::kCudaError, std::string("sm90 forward launch: ") + cudaGetErrorString(e)};
  return Status::Ok();
}

}  // namespace fa4::sm90
