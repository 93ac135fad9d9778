// The persistent grid's tile order (src/sm90/tile_order.cuh) and its L2 sections
// (src/sm90/fwd_launch.cuh), on the host: every tile once, longest first inside each section,
// sections that divide the heads and fit the L2 budget; clusters of two CTAs taking pairs of
// query blocks, and where the launch uses them.
#include <algorithm>
#include <array>
#include <vector>

#include <gtest/gtest.h>

#include "common/validate.h"
#include "lagged_kernels.h"
#include "sm90/fwd_launch.cuh"
#include "test_support.h"

namespace {

using fa4::sm90::TileOrder;

TEST(TileOrder, SectionsFitTheBudgetAndDivideTheHeadsForTheDynamicGrid) {
  for (int64_t budget : {fa4::sm90::kL2SectionBytes, fa4::sm90::kL2SectionBytesVarying})
    for (int64_t heads : {1, 2, 7, 12, 16, 64, 96, 128, 1024})
      for (int64_t kv : {int64_t(1) << 10, int64_t(1) << 20, int64_t(3) << 20, int64_t(8) << 20, int64_t(64) << 20}) {
        const int64_t s = fa4::sm90::section_heads(heads, kv, budget, true);
        // Without the divisor rule: as many heads as fit, which the divisor never exceeds.
        const int64_t most = fa4::sm90::section_heads(heads, kv, budget, false);
        EXPECT_TRUE(most == 1 || most * kv <= budget);
        EXPECT_TRUE(most == heads || (most + 1) * kv > budget);
        EXPECT_LE(s, most);
        ASSERT_GE(s, 1);
        EXPECT_EQ(heads % s, 0) << heads << " heads, " << kv << " bytes a head";
        EXPECT_TRUE(s == 1 || s * kv <= budget) << heads << " heads, " << kv << " bytes a head";
        // The largest such divisor: the next larger divisor breaks the budget or the head count.
        for (int64_t t = s + 1; t <= heads; ++t)
          if (heads % t == 0) {
            EXPECT_GT(t * kv, budget) << heads << " heads: " << t << " would fit too";
            break;
          }
      }
}

// Taken in index order (the dynamic grid's order), the tiles cover every (batch, head, query
// block) once, and inside a section the query blocks never rise (causal: longest first), or with
// `rising` (tiles of one length) never fall.
TEST(TileOrder, EveryTileOnceLongestFirstInEachSection) {
  for (bool rising : {false, true})
  for (auto [batch, heads, m_blocks, section] :
       std::vector<std::array<int, 4>>{{1, 1, 1, 1}, {2, 3, 5, 2}, {2, 3, 5, 3}, {4, 16, 32, 8}, {1, 7, 40, 7}, {3, 4, 9, 12}, {4, 5, 6, 3}}) {
    const int bh = batch * heads;
    const TileOrder order{bh * m_blocks, m_blocks, bh, heads, std::min(section, bh), 1, rising};
    std::vector<int> seen(size_t(bh) * m_blocks, 0);
    int last_section = -1, last_m = 0;
    for (int t = 0; t < order.count; ++t) {
      const fa4::sm90::Tile tl = order.decode(t);
      ASSERT_GE(tl.batch, 0); ASSERT_LT(tl.batch, batch);
      ASSERT_GE(tl.head, 0); ASSERT_LT(tl.head, heads);
      ASSERT_GE(tl.m_block, 0); ASSERT_LT(tl.m_block, m_blocks);
      ++seen[(size_t(tl.batch) * heads + tl.head) * m_blocks + tl.m_block];
      const int sec = (tl.batch * heads + tl.head) / order.section;
      if (sec == last_section && !rising) EXPECT_LE(tl.m_block, last_m) << "tile " << t;
      if (sec == last_section && rising) EXPECT_GE(tl.m_block, last_m) << "tile " << t;
      last_section = sec;
      last_m = tl.m_block;
    }
    for (int c : seen) EXPECT_EQ(c, 1);
  }
}

// The static rounds (equal lengths): CTAs of a grid of G together take every tile once.
TEST(TileOrder, StaticRoundsCoverEveryTileOnce) {
  const TileOrder order{5 * 37, 37, 5, 5, 5};
  for (int grid : {1, 7, 132, 185, 300}) {
    std::vector<int> seen(order.count, 0);
    for (int cta = 0; cta < std::min(grid, order.count); ++cta)
      for (int round = 0, t; (t = order.nth(round, cta, grid)) < order.count; ++round) ++seen[t];
    for (int c : seen) EXPECT_EQ(c, 1) << "grid " << grid;
  }
}

// Kernel parameters of a problem of these sizes (non-causal, no window), as the API resolves them.
fa4::detail::FwdParams fwd_params(int batch, int heads_q, int heads_kv, int seqlen_q, int seqlen_k, int head_dim) {
  fa4::ForwardArgs args;
  args.problem = fa4::test::make_problem(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim);
  return fa4::detail::make_fwd_params(args);
}

// Under a causal or window bound a section holds at most grid / share heads (longest first, so its heads'
// tiles of one length start together; fwd_launch.cuh, kVaryingSectionGridShare and its Tall twin
// for three consumers), below what the L2 budget alone allows at short lengths; tiles of one
// length and an explicit budget are not capped.
TEST(TileOrder, CausalSectionsHoldAShareOfTheGridsHeads) {
  for (auto [d, seqlen, budget_heads] : std::vector<std::array<int, 3>>{
           {64, 512, 256}, {128, 512, 128}, {256, 512, 64}, {128, 1024, 64}, {128, 4096, 16}, {256, 4096, 8}}) {
    fa4::detail::FwdParams a = fwd_params(16384 / seqlen, 2048 / d, 2048 / d, seqlen, seqlen, d);
    const int m_blocks = (seqlen + 127) / 128;
    for (int left : {-1, 100}) {  // causal, and a sliding window
      a.window_left = left;
      a.window_right = 0;
      for (int share : {fa4::sm90::kVaryingSectionGridShare, fa4::sm90::kVaryingSectionGridShareTall})
        for (int64_t units : {132, 64, 8, 3}) {
          const TileOrder order = fa4::sm90::make_tile_order(a, m_blocks, 1, false, units, share);
          int64_t cap = std::max<int64_t>(1, units / share);
          while (order.batch_heads % cap != 0) --cap;  // the largest divisor at or below it
          EXPECT_EQ(order.section, std::min<int64_t>(budget_heads, cap)) << d << " " << seqlen << " " << units;
        }
    }
    a.window_left = -1;
    // The FA3 shapes on 132 CTAs: 32 heads a section, 64 with three consumers.
    EXPECT_EQ(fa4::sm90::make_tile_order(a, m_blocks, 1, false, 132, fa4::sm90::kVaryingSectionGridShare).section,
              std::min(budget_heads, 32));
    EXPECT_EQ(fa4::sm90::make_tile_order(a, m_blocks, 1, false, 132, fa4::sm90::kVaryingSectionGridShareTall).section,
              std::min(budget_heads, 64));
    a.l2_section_bytes = int64_t(budget_heads) * 4 * seqlen * d;  // explicit: as given
    EXPECT_EQ(fa4::sm90::make_tile_order(a, m_blocks, 1, false, 132, 4).section, budget_heads);
    a.l2_section_bytes = 0;
    a.window_right = -1;  // tiles of one length: the 6 MB budget alone
    const int64_t kv = 4ll * seqlen * d;
    EXPECT_EQ(fa4::sm90::make_tile_order(a, m_blocks, 1, false, 132, 4).section,
              std::min<int64_t>(int64_t(a.batch) * a.heads_q, fa4::sm90::kL2SectionBytes / kv));
  }
}

// Tiles of one length rise (a head's partial last block last in each section), tiles under a
// bound fall (longest first). In static rounds on 132 CTAs, rising gives the busiest CTA fewer
// whole tiles at the d64 FA3 shapes whose 192-row tiles end partial (512: 3 blocks a head, the
// last of 128 rows; 1k: 6, the last of 64), the count tile_order.cuh states.
TEST(TileOrder, TilesOfOneLengthRiseAndSpreadTheirPartialBlocks) {
  auto busiest_whole = [](const TileOrder& order, int seqlen_q, int grid) {
    int most = 0;
    for (int cta = 0; cta < grid; ++cta) {
      int whole = 0;
      for (int round = 0, t; (t = order.nth(round, cta, grid)) < order.count; ++round)
        whole += (order.decode(t).m_block + 1) * 192 <= seqlen_q ? 1 : 0;
      most = std::max(most, whole);
    }
    return most;
  };
  for (auto [batch, seqlen, rising_most, falling_most] :
       std::vector<std::array<int, 4>>{{32, 512, 16, 17}, {16, 1024, 20, 22}}) {
    fa4::detail::FwdParams a = fwd_params(batch, 32, 32, seqlen, seqlen, 64);
    const int m_blocks = (seqlen + 191) / 192;
    TileOrder order = fa4::sm90::make_tile_order(a, m_blocks, 1, false, 132, 4);
    EXPECT_TRUE(order.rising);
    EXPECT_EQ(busiest_whole(order, seqlen, 132), rising_most) << seqlen;
    order.rising = false;
    EXPECT_EQ(busiest_whole(order, seqlen, 132), falling_most) << seqlen;
    a.window_right = 0;  // causal: longest first
    EXPECT_FALSE(fa4::sm90::make_tile_order(a, m_blocks, 1, false, 132, 4).rising);
  }
}

// Which launches take tiles from the counter: tiles whose lengths vary, and tiles of one length on
// single CTAs (their partial last blocks even out from it); not clusters, stream-K tails (bounded
// or not), one CTA a tile, the static rounds' ablation, nor a grid as large as the tiles.
TEST(TileOrder, TileCounterWhereTilesVaryOrOnSingleCtas) {
  using fa4::sm90::use_tile_counter;
  for (int schedule : {0, 1, 4}) {
    EXPECT_TRUE(use_tile_counter(false, 1, false, schedule, 132, 3072));  // causal
    EXPECT_TRUE(use_tile_counter(true, 1, false, schedule, 132, 3072));   // d64 non-causal
    EXPECT_FALSE(use_tile_counter(true, 2, false, schedule, 132, 3072));  // clusters: static rounds
    EXPECT_FALSE(use_tile_counter(true, 1, true, schedule, 132, 3072));   // a stream-K tail
    EXPECT_FALSE(use_tile_counter(false, 1, true, schedule, 132, 3072));  // one under a bound (tiles_alike)
    EXPECT_FALSE(use_tile_counter(false, 1, false, schedule, 132, 132));  // a CTA for every tile
    EXPECT_FALSE(use_tile_counter(true, 1, false, schedule, 132, 100));
  }
  for (int schedule : {2, 3}) {
    EXPECT_FALSE(use_tile_counter(false, 1, false, schedule, 132, 3072));
    EXPECT_FALSE(use_tile_counter(true, 1, false, schedule, 132, 3072));
  }
}

// The paired launch's grid (fwd_launch.cuh, paired_grid): the rounds of a grid of at most `slots`
// CTAs, filled; never more CTAs than units or slots.
TEST(TileOrder, PairedGridFillsItsRounds) {
  using fa4::sm90::paired_grid;
  EXPECT_EQ(paired_grid(512, 132), 128);  // FA3 shapes at d256: four whole rounds
  EXPECT_EQ(paired_grid(528, 132), 132);
  EXPECT_EQ(paired_grid(529, 132), 106);  // five rounds, the last one short by a unit
  EXPECT_EQ(paired_grid(133, 132), 67);
  EXPECT_EQ(paired_grid(100, 132), 100);
  EXPECT_EQ(paired_grid(1, 132), 1);
  EXPECT_EQ(paired_grid(7, 1), 1);
  EXPECT_EQ(paired_grid(0, 132), 0);
  for (int64_t slots : {1, 5, 78, 114, 132})
    for (int64_t units = 1; units <= 2000; ++units) {
      const int64_t g = paired_grid(units, slots), rounds = (units + slots - 1) / slots;
      ASSERT_GE(g, 1);
      ASSERT_LE(g, std::min(units, slots)) << units << " units, " << slots << " slots";
      ASSERT_EQ((units + g - 1) / g, rounds) << units << " units, " << slots << " slots";
    }
}

// The walk's order of key blocks (TileOrder::walk_block): every block of [lo, hi) once, down from
// the diagonal block (hi - 1), or with it last (hi - 2, ..., lo, hi - 1); and which paired tiles
// take that order (TileOrder::diagonal_last: a head's longest tile, from diagonal_last_from on).
TEST(TileOrder, DiagonalLastWalkTakesEveryBlockOnce) {
  for (auto [lo, hi] : std::vector<std::array<int, 2>>{{0, 4}, {0, 1}, {0, 2}, {3, 9}}) {
    for (bool last : {false, true}) {
      std::vector<int> walk;
      for (int n = hi - 1; n >= lo; --n) walk.push_back(TileOrder::walk_block(last, n, lo, hi));
      std::vector<int> sorted = walk;
      std::sort(sorted.begin(), sorted.end());
      for (int i = 0; i < hi - lo; ++i) EXPECT_EQ(sorted[size_t(i)], lo + i) << lo << ".." << hi << " last " << last;
      EXPECT_EQ(walk.front(), last && hi - lo > 1 ? hi - 2 : hi - 1);
      EXPECT_EQ(walk.back(), last ? hi - 1 : lo);
    }
  }
  EXPECT_EQ((std::vector<int>{TileOrder::walk_block(true, 3, 0, 4), TileOrder::walk_block(true, 2, 0, 4),
                              TileOrder::walk_block(true, 1, 0, 4), TileOrder::walk_block(true, 0, 0, 4)}),
            (std::vector<int>{2, 1, 0, 3}));
  TileOrder order{256 * 4, 4, 256, 256, 256, 1, false};
  order.paired = true;
  EXPECT_FALSE(order.diagonal_last(2 * 384, 3));  // off unless the launch sets where it starts
  order.diagonal_last_from = 384;
  EXPECT_TRUE(order.diagonal_last(2 * 384, 3));       // unit 384's first tile: query block 3
  EXPECT_TRUE(order.diagonal_last(2 * 511, 3));
  EXPECT_FALSE(order.diagonal_last(2 * 384 + 1, 0));  // the unit's short tile
  EXPECT_FALSE(order.diagonal_last(2 * 385, 2));      // the head's other pair
  EXPECT_FALSE(order.diagonal_last(2 * 383, 3));      // the round before
  order.paired = false;
  EXPECT_FALSE(order.diagonal_last(2 * 384, 3));
  // Where the last round's walk starts: the first whole head of the last round.
  EXPECT_EQ(TileOrder::last_round_first_head(512, 132, 2), 396);  // 256 heads of 4 blocks: round at 396
  EXPECT_EQ(TileOrder::last_round_first_head(528, 132, 2), 396);  // 528 units: four whole rounds
  EXPECT_EQ(TileOrder::last_round_first_head(264, 131, 2), 262);  // round at 262, a head boundary
  EXPECT_EQ(TileOrder::last_round_first_head(300, 131, 3), 264);  // 100 heads of 6 blocks: round at 262
  EXPECT_EQ(TileOrder::last_round_first_head(512, 132, 4), 396);  // 128 heads of 8 blocks
  EXPECT_EQ(TileOrder::last_round_first_head(512, 131, 4), 396);  // round at 393
  EXPECT_EQ(TileOrder::last_round_first_head(10, 132, 2), 0);     // one round: every head
}

// Paired causal tiles (tile_order.cuh): in static rounds of G CTAs every tile comes once; a CTA
// takes a head's query blocks M - 1 - m and m in two consecutive rounds, the longer first; and the
// launch pairs the tiles exactly where the pairs' key ranges are even (d256 causal, an even count).
TEST(TileOrder, PairedCausalTilesCoverEveryTileOnceInEvenPairs) {
  for (auto [batch_heads, m_blocks] : std::vector<std::array<int, 2>>{{256, 4}, {128, 8}, {7, 2}, {3, 16}, {1, 6}}) {
    TileOrder order{batch_heads * m_blocks, m_blocks, batch_heads, batch_heads, batch_heads, 1, false};
    order.paired = true;
    for (int grid : {1, 5, 128, 132, 1000}) {
      std::vector<int> seen(size_t(order.count), 0);
      for (int cta = 0; cta < grid; ++cta)
        for (int round = 0;; round += 2) {
          const int first = order.nth(round, cta, grid), second = order.nth(round + 1, cta, grid);
          if (first >= order.count) {
            EXPECT_GE(second, order.count);
            break;
          }
          ASSERT_LT(second, order.count);
          const fa4::sm90::Tile a = order.decode(first), b = order.decode(second);
          EXPECT_EQ(a.batch * batch_heads + a.head, b.batch * batch_heads + b.head);
          EXPECT_EQ(a.m_block + b.m_block, m_blocks - 1);
          EXPECT_GT(a.m_block, b.m_block);
          ++seen[size_t(a.head) * m_blocks + a.m_block];
          ++seen[size_t(b.head) * m_blocks + b.m_block];
        }
      for (int c : seen) EXPECT_EQ(c, 1) << batch_heads << " heads, " << m_blocks << " blocks, grid " << grid;
    }
  }
  auto paired = [](int seqlen_q, int seqlen_k, int left, int right, int head_dim = 256) {
    fa4::detail::FwdParams a = fwd_params(2, 4, 4, seqlen_q, seqlen_k, head_dim);
    a.window_left = left;
    a.window_right = right;
    const fa4::sm90::Window w{left, right, fa4::sm90::row_shift<128>(a)};
    return fa4::sm90::use_paired_tiles<128, 64>(a, w, (seqlen_q + 127) / 128, 1);
  };
  EXPECT_TRUE(paired(512, 512, -1, 0));
  EXPECT_TRUE(paired(2048, 2048, -1, 0));
  EXPECT_TRUE(paired(1000, 1000, -1, 0));    // 8 blocks, the last partial (shifted first)
  EXPECT_FALSE(paired(384, 384, -1, 0));     // an odd count
  EXPECT_FALSE(paired(512, 512, 100, 0));    // a window
  EXPECT_FALSE(paired(512, 512, -1, -1));    // no bound
  EXPECT_TRUE(paired(512, 4096, -1, 0));     // bottom-right: every tile sees 28 blocks more
  EXPECT_FALSE(paired(4096, 512, -1, 0));    // rows without keys: pairs of uneven sums
  EXPECT_FALSE(paired(512, 512, -1, 0, 128));  // d256 only
  EXPECT_FALSE(paired(512, 512, -1, 0, 64));
}

// The paired order's rereads, with every CTA taken a key block a step (the rounds in lockstep) and
// each tile walked as the kernels walk it, from its diagonal block down: a head's K/V block is read
// again one 128-key block's worth of steps after its previous read, never later (one step on
// 128-key blocks, two on 64-key ones). At d256 causal 512 the L2 keeps a block for about two
// 128-key steps: a walk that reread block 2 three steps later read 16 MB more from DRAM and lost
// 9 % (docs/perf-notes.md, "The head's last tile walking its low blocks first").
template <int kBlockN>
int paired_reread_gap(int batch_heads, int seqlen, int grid) {
  constexpr int kBlockM = 128;
  const int m_blocks = seqlen / kBlockM, key_blocks = seqlen / kBlockN;
  TileOrder order{batch_heads * m_blocks, m_blocks, batch_heads, batch_heads, batch_heads, 1, false};
  order.paired = true;
  const fa4::sm90::Window causal{-1, 0, 0};
  std::vector<std::vector<int>> reads(size_t(batch_heads) * key_blocks);  // the steps of each block's reads
  for (int cta = 0; cta < grid; ++cta) {
    int step = 0;
    for (int round = 0;; ++round) {
      const int t = order.nth(round, cta, grid);
      if (t >= order.count) break;
      const fa4::sm90::Tile tl = order.decode(t);
      const fa4::sm90::BlockRange r =
          fa4::sm90::key_block_range<kBlockM, kBlockN>(causal, tl.m_block, seqlen, seqlen);
      for (int n = r.hi - 1; n >= r.lo; --n) reads[size_t(tl.batch * order.heads_q + tl.head) * key_blocks + n].push_back(step++);
    }
  }
  int gap = 0;
  for (std::vector<int>& steps : reads) {
    std::sort(steps.begin(), steps.end());
    for (size_t i = 1; i < steps.size(); ++i) gap = std::max(gap, steps[i] - steps[i - 1]);
  }
  return gap;
}

TEST(TileOrder, PairedCausalTilesRereadEachBlockWithinABlockStep) {
  EXPECT_EQ(paired_reread_gap<128>(256, 512, 128), 1);  // d256 causal 512 (the serial step), FA3's shape
  EXPECT_EQ(paired_reread_gap<128>(512, 256, 128), 1);  // causal 256
  EXPECT_EQ(paired_reread_gap<64>(128, 1024, 128), 2);  // 1k, 2k, 16k on 64-key blocks
  EXPECT_EQ(paired_reread_gap<64>(64, 2048, 128), 2);
  EXPECT_EQ(paired_reread_gap<64>(8, 16384, 64), 2);
  EXPECT_EQ(paired_reread_gap<128>(256, 512, 132), 1);  // on any grid that keeps a head's pairs side by side
}

// The causal kernel (fwd_kernel's kCausal) takes causal launches and the window that equals
// causal, and nothing else: every other window keeps the bounded kernel's runtime bound.
TEST(TileOrder, CausalKernelForTheCausalBoundOnly) {
  auto params = [](bool causal, int64_t left, int64_t right) {
    fa4::ForwardArgs a;
    a.problem = fa4::test::make_problem(1, 300, 500, 2, 2, 64);
    a.problem.causal = causal;
    a.problem.window_left = left;
    a.problem.window_right = right;
    a.q = fa4::bshd(reinterpret_cast<void*>(256), 300, 2, 64);
    a.k = a.v = fa4::bshd(reinterpret_cast<void*>(256), 500, 2, 64);
    a.o = fa4::bshd(reinterpret_cast<void*>(256), 300, 2, 64);
    EXPECT_TRUE(fa4::validate(a).ok()) << fa4::validate(a).message;
    return fa4::detail::make_fwd_params(a);
  };
  using fa4::sm90::causal_bound;
  using fa4::sm90::tiles_of_one_length;
  EXPECT_TRUE(causal_bound(params(true, -1, -1)));
  EXPECT_TRUE(causal_bound(params(false, -1, 0)));
  EXPECT_TRUE(causal_bound(params(true, -1, 5)));  // causal clips the right bound to 0
  EXPECT_FALSE(causal_bound(params(false, -1, -1)));
  EXPECT_TRUE(tiles_of_one_length(params(false, -1, -1)));
  EXPECT_FALSE(causal_bound(params(false, -1, 1)));
  EXPECT_FALSE(causal_bound(params(false, 0, 0)));
  EXPECT_FALSE(causal_bound(params(true, 64, -1)));
  EXPECT_FALSE(causal_bound(params(false, 100, 20)));
}

// Tiles alike (fwd_launch.cuh, tiles_alike): tiles of one length, or one query block a head under
// any bound (a few query rows, folded or not), whose tiles all see tile 0's key range; not two
// query blocks under a bound, nor variable-length batches. Their static rounds and pieces cover
// every tile's key blocks once.
TEST(TileOrder, TilesOfOneQueryBlockAlikeUnderAnyBound) {
  using fa4::sm90::tiles_alike;
  for (auto [sq, left, right, alike] : std::vector<std::array<int, 4>>{
           {4, -1, 0, 1}, {128, -1, 0, 1}, {129, -1, 0, 0}, {50, 700, 0, 1}, {30, -1, 5, 1}, {64, 900, 900, 1},
           {1000, -1, -1, 1}, {300, 100, 20, 0}}) {
    fa4::detail::FwdParams a = fwd_params(3, 6, 6, sq, 1500, 128);
    a.window_left = left;
    a.window_right = right;
    const int64_t m_blocks = (sq + 127) / 128;
    SCOPED_TRACE("seqlen_q " + std::to_string(sq) + " window (" + std::to_string(left) + ", " + std::to_string(right) + ")");
    EXPECT_EQ(tiles_alike(a, m_blocks), alike != 0);
    if (!alike || fa4::sm90::tiles_of_one_length(a)) continue;
    const fa4::sm90::Window w = fa4::sm90::tile_window<128>(a);
    const fa4::sm90::BlockRange r = fa4::sm90::key_block_range<128, 128>(w, 0, a.seqlen_q, a.seqlen_k);
    TileOrder order = fa4::sm90::make_tile_order(a, m_blocks, 1, false, 5, fa4::sm90::kVaryingSectionGridShare);
    ASSERT_TRUE(fa4::sm90::plan_tail_split(order, 5, r.hi - r.lo, true));
    EXPECT_EQ(order.full, 15);  // 18 tiles: three whole rounds of 5, then 3 cut into pieces
    std::vector<int> covered(size_t(order.count) * (r.hi - r.lo), 0);
    for (int unit = 0; unit < 5; ++unit)
      for (int round = 0;; ++round) {
        fa4::sm90::Tile tl;
        const int t = order.item(round, unit, 5);
        if (!order.decode_valid(t, 0, tl)) break;
        ASSERT_EQ(tl.m_block, 0);
        const int tile = t < order.full ? t : order.full + tl.tail;
        const int lo = tl.hi < 0 ? 0 : tl.lo, hi = tl.hi < 0 ? r.hi - r.lo : tl.hi;
        for (int b = lo; b < hi; ++b) ++covered[size_t(tile) * (r.hi - r.lo) + b];
      }
    for (int c : covered) ASSERT_EQ(c, 1);
  }
  fa4::detail::FwdParams v = fwd_params(3, 6, 6, 4, 1500, 128);
  v.window_right = 0;
  v.cu_seqlens_q = reinterpret_cast<const int32_t*>(256);  // varlen: whole tiles
  EXPECT_FALSE(tiles_alike(v, 1));
}

// Batch entries with keys of their own (Varlen::seqused_k without cu_seqlens; fwd_launch.cuh,
// entry_keys) go as a bound goes: to the kernels that read it at run time, never the unbounded or
// the causal one; one query block a head is still alike (cut into pieces) but under a left bound;
// decoding's rows keep their tile height (d64 two consumers, whose stream-K kernel reads the keys).
// Pieces cut along the longest range and clamped to an entry's own (piece_range<true>) walk each of
// that entry's blocks once, and none past them, for every entry length.
TEST(TileOrder, EntriesOwnKeysRunAsABoundAndTheirPiecesCoverTheirBlocks) {
  using fa4::sm90::tiles_alike;
  const auto* used = reinterpret_cast<const int32_t*>(256);
  for (const int right : {-1, 0}) {
    fa4::detail::FwdParams a = fwd_params(3, 6, 6, 4, 1500, 128);
    a.window_right = right;
    a.seqused_k = used;
    EXPECT_TRUE(fa4::sm90::entry_keys(a));
    EXPECT_FALSE(fa4::sm90::tiles_of_one_length(a));
    EXPECT_FALSE(fa4::sm90::causal_bound(a));
    EXPECT_TRUE(tiles_alike(a, 1));
    EXPECT_FALSE(tiles_alike(a, 2));
    fa4::detail::FwdParams d64 = a;
    d64.head_dim = 64;
    EXPECT_EQ(fa4::sm90::d64_consumers(d64), 2);
    EXPECT_NE(fa4::sm90::d256_block_keys(a), 128);  // not the serial step (no bounded kernel)
    a.window_left = 100;
    EXPECT_FALSE(tiles_alike(a, 1));  // an entry's range may start off the pieces' grid
  }
  fa4::detail::FwdParams v = fwd_params(3, 6, 6, 4, 1500, 128);
  v.seqused_k = used;
  v.cu_seqlens_q = reinterpret_cast<const int32_t*>(512);  // varlen's seqused_k: its own kernels
  EXPECT_FALSE(fa4::sm90::entry_keys(v));

  for (const int right : {-1, 0})
    for (const int units : {2, 5, 7, 16}) {  // (at least two blocks a unit: 36 blocks)
      const int seqlen_q = 4, seqlen_k = 1500;
      const fa4::sm90::Window w{-1, right, 0, 0};
      const fa4::sm90::BlockRange longest = fa4::sm90::key_block_range<128, 128>(w, 0, seqlen_q, seqlen_k);
      const int blocks = longest.hi - longest.lo;
      TileOrder order{3, 1, 3, 3, 3, 1, false};
      ASSERT_TRUE(fa4::sm90::plan_tail_split(order, units, blocks, true));
      for (const int len : {0, 1, 127, 128, 129, 700, 1499, 1500}) {
        SCOPED_TRACE("right " + std::to_string(right) + ", " + std::to_string(units) + " units, entry of " +
                     std::to_string(len) + " keys");
        const fa4::sm90::BlockRange own = fa4::sm90::key_block_range<128, 128>(w, 0, seqlen_q, len);
        ASSERT_EQ(own.lo, longest.lo);
        ASSERT_LE(own.hi, longest.hi);
        std::vector<int> walked(size_t(blocks) + 1, 0);
        for (int unit = 0; unit < units; ++unit)
          for (int round = 0;; ++round) {
            fa4::sm90::Tile tl;
            const int t = order.item(round, unit, units);
            if (!order.decode_valid(t, 0, tl)) break;
            if ((t < order.full ? t : order.full + tl.tail) != 1) continue;  // the tile of entry 1
            const fa4::sm90::BlockRange r = fa4::sm90::piece_range<true>(own, tl);
            for (int n = r.hi - 1; n >= r.lo; --n) ++walked[size_t(n)];
          }
        for (int n = 0; n <= blocks; ++n) ASSERT_EQ(walked[size_t(n)], n >= own.lo && n < own.hi ? 1 : 0) << n;
      }
    }
}

// With clusters each tile is a pair: over every tile and both ranks, each (batch, head, query
// block) comes once, both ranks of a tile share batch and head (so K and V), and the only extra
// is block m_blocks (past seqlen_q) as rank 1 of a head's last pair when m_blocks is odd.
TEST(TileOrder, ClusterPairsCoverEveryQueryBlockOnce) {
  for (auto [batch, heads, heads_kv, m_blocks] :
       std::vector<std::array<int, 4>>{{1, 1, 1, 2}, {1, 1, 1, 3}, {2, 3, 3, 5}, {4, 16, 4, 32}, {3, 12, 1, 43}, {2, 8, 8, 86}}) {
    const fa4::detail::FwdParams a = fwd_params(batch, heads, heads_kv, m_blocks * 128, 4096, 128);
    const TileOrder order = fa4::sm90::make_tile_order(a, m_blocks, 2, false, 66, 4);
    ASSERT_EQ(order.count, batch * heads * ((m_blocks + 1) / 2));
    std::vector<int> seen(size_t(batch) * heads * (m_blocks + 1), 0);
    for (int t = 0; t < order.count; ++t) {
      const fa4::sm90::Tile r0 = order.decode(t, 0), r1 = order.decode(t, 1);
      ASSERT_EQ(r0.batch, r1.batch);
      ASSERT_EQ(r0.head, r1.head);
      ASSERT_EQ(r1.m_block, r0.m_block + 1);
      ASSERT_EQ(r0.m_block % 2, 0);
      for (const fa4::sm90::Tile& tl : {r0, r1}) {
        ASSERT_GE(tl.m_block, 0);
        ASSERT_LE(tl.m_block, m_blocks);
        ++seen[(size_t(tl.batch) * heads + tl.head) * (m_blocks + 1) + tl.m_block];
      }
    }
    for (int bh = 0; bh < batch * heads; ++bh)
      for (int m = 0; m <= m_blocks; ++m)
        EXPECT_EQ(seen[size_t(bh) * (m_blocks + 1) + m], m < m_blocks ? 1 : m_blocks % 2)
            << "head " << bh << " block " << m << " of " << m_blocks;
  }
}

// Clusters only where every tile has one key range (no causal or window bound), never for one
// CTA a tile (schedule 2) or when switched off; on their own only at head_dim 128 and 256 and
// where the padding of an odd query-block count is small.
TEST(TileOrder, ClusterPairsOnlyForTilesOfOneLength) {
  using fa4::sm90::use_cluster_pairs;
  fa4::detail::FwdParams a = fwd_params(2, 16, 16, 4096, 4096, 64);
  EXPECT_FALSE(use_cluster_pairs(a, 22));  // d64: measured slower
  a.cluster = 2;
  EXPECT_TRUE(use_cluster_pairs(a, 22));
  a = fwd_params(2, 16, 16, 4096, 4096, 256);
  EXPECT_TRUE(use_cluster_pairs(a, 32));
  a = fwd_params(2, 16, 16, 4096, 4096, 128);
  EXPECT_TRUE(use_cluster_pairs(a, 32));
  EXPECT_TRUE(use_cluster_pairs(a, 2));
  EXPECT_FALSE(use_cluster_pairs(a, 1));
  EXPECT_FALSE(use_cluster_pairs(a, 3));   // a third of the work would be padding
  EXPECT_FALSE(use_cluster_pairs(a, 11));
  EXPECT_TRUE(use_cluster_pairs(a, 43));   // one block in 44
  a.cluster = 2;
  EXPECT_TRUE(use_cluster_pairs(a, 3));    // asked for
  EXPECT_FALSE(use_cluster_pairs(a, 1));
  a.cluster = 1;
  EXPECT_FALSE(use_cluster_pairs(a, 32));
  a.cluster = 0;
  a.schedule = 2;
  EXPECT_FALSE(use_cluster_pairs(a, 32));
  a.schedule = 0;
  a.window_right = 0;  // causal
  EXPECT_FALSE(use_cluster_pairs(a, 32));
  a.cluster = 2;
  EXPECT_FALSE(use_cluster_pairs(a, 32));
  a.window_right = -1;
  a.window_left = 100;
  EXPECT_FALSE(use_cluster_pairs(a, 32));
}

// The d256 key-block width: 64-key blocks under a causal or window bound where 80-key ones
// compute at least 1.02 times their scores; 80 otherwise and always without a bound.
TEST(TileOrder, D256KeyBlockWidthFollowsTheComputedScores) {
  fa4::detail::FwdParams a = fwd_params(1, 1, 1, 512, 512, 256);
  EXPECT_FALSE(fa4::sm90::d256_narrow_blocks(a));  // 7 blocks of 80 against 8 of 64: 1.094, no bound
  a.window_right = 0;
  // Causal 512: 2 + 4 + 5 + 7 blocks of 80 keys against 2 + 4 + 6 + 8 of 64.
  EXPECT_EQ((fa4::sm90::computed_scores<128, 80>(a)), 18.0 * 128 * 80);
  EXPECT_EQ((fa4::sm90::computed_scores<128, 64>(a)), 20.0 * 128 * 64);
  EXPECT_TRUE(fa4::sm90::d256_narrow_blocks(a));  // 1.125
  for (auto [s, narrow] : {std::pair{1024, true}, {2048, true}, {4096, false}, {16384, false}}) {
    a = fwd_params(1, 1, 1, s, s, 256);
    EXPECT_FALSE(fa4::sm90::d256_narrow_blocks(a)) << s;
    a.window_right = 0;
    const double ratio = fa4::sm90::computed_scores<128, 80>(a) / fa4::sm90::computed_scores<128, 64>(a);
    EXPECT_EQ(fa4::sm90::d256_narrow_blocks(a), narrow) << s << " causal, " << ratio;
    EXPECT_EQ(ratio >= fa4::sm90::kD256WideBlocksWorse, narrow) << s;
  }
  // ForwardGpu.D256CausalBothKeyBlockWidths's shapes.
  a = fwd_params(2, 2, 1, 300, 300, 256);
  a.window_right = 0;
  EXPECT_TRUE(fa4::sm90::d256_narrow_blocks(a));
  a = fwd_params(1, 2, 2, 250, 4000, 256);
  a.window_right = 0;
  EXPECT_FALSE(fa4::sm90::d256_narrow_blocks(a));
  // A short window's tiles overrun both of its edges.
  a = fwd_params(1, 1, 1, 4096, 4096, 256);
  a.window_left = 200;
  a.window_right = 0;
  EXPECT_TRUE(fa4::sm90::d256_narrow_blocks(a));
}

// d256's serial step on 128-key blocks: causal launches whose 128-row tiles see at most three
// 128-key blocks on average (causal 512: 1 + 2 + 3 + 4 over four tiles) and go in pairs (an even
// query-block count); without a bound, at most 512 keys; never under a window. The shapes of
// ForwardGpu.D256SerialStep and of the lagged tests on it take it; those of D256CausalPairs,
// D256CausalBothKeyBlockWidths and the odd query-block counts do not.
TEST(TileOrder, D256SerialStepOnTheShortCausalRows) {
  auto causal = [](int b, int h, int sq, int sk) {
    fa4::detail::FwdParams a = fwd_params(b, h, h, sq, sk, 256);
    a.window_right = 0;
    return a;
  };
  fa4::detail::FwdParams a = causal(32, 8, 512, 512);
  EXPECT_EQ((fa4::sm90::computed_scores<128, 128>(a)), 10.0 * 128 * 128);
  EXPECT_TRUE(fa4::sm90::d256_serial_step(a));
  EXPECT_FALSE(fa4::sm90::d256_serial_step(causal(16, 8, 1024, 1024)));  // 36 blocks over 8 tiles
  EXPECT_FALSE(fa4::sm90::d256_serial_step(causal(8, 8, 2048, 2048)));
  a = fwd_params(32, 8, 8, 512, 512, 256);
  EXPECT_TRUE(fa4::sm90::d256_serial_step(a));  // no bound: four key blocks
  for (auto [sq, sk] : {std::pair{1, 1}, {256, 256}, {384, 384}, {4096, 512}, {512, 300}})
    EXPECT_TRUE(fa4::sm90::d256_serial_step(fwd_params(2, 4, 4, sq, sk, 256))) << sq << " x " << sk << ", no bound";
  for (auto [sq, sk] : {std::pair{512, 513}, {640, 640}, {1024, 1024}, {4096, 4096}, {256, 4000}})
    EXPECT_FALSE(fa4::sm90::d256_serial_step(fwd_params(2, 4, 4, sq, sk, 256))) << sq << " x " << sk << ", no bound";
  a.window_left = 100;
  a.window_right = 0;
  EXPECT_FALSE(fa4::sm90::d256_serial_step(a));  // a window
  for (auto [sq, sk] : {std::pair{512, 512}, {500, 500}, {192, 192}, {256, 300}, {129, 230}})
    EXPECT_TRUE(fa4::sm90::d256_serial_step(causal(2, 4, sq, sk))) << sq << " x " << sk;
  for (auto [sq, sk] : {std::pair{300, 300}, {65, 65}, {128, 308}, {170, 300}, {130, 130}, {1000, 300}, {1000, 1000}, {512, 700}, {250, 4000}})
    EXPECT_FALSE(fa4::sm90::d256_serial_step(causal(2, 4, sq, sk))) << sq << " x " << sk;
}

// d256's key-block width over causal, windowed and unbounded shapes: 128 without a bound on keys
// <= 512; otherwise 80 where the narrow blocks' rule does not hold, 64 or, under the causal bound
// with tiles in pairs and at most three 128-key blocks a tile on average, 128 (the serial step,
// whose causal shapes D256SerialStepOnTheShortCausalRows names) where it does; each of the three
// somewhere, and the causal serial step too.
TEST(TileOrder, D256BlockKeysFollowTheRules) {
  int seen[3] = {0, 0, 0}, causal_serial = 0;
  for (int sq : {1, 65, 129, 192, 300, 500, 512, 1000, 1024, 2048, 4097})
    for (int sk : {1, 128, 300, 512, 1024, 4000})
      for (int bound = 0; bound < 3; ++bound) {
        fa4::detail::FwdParams a = fwd_params(2, 4, 4, sq, sk, 256);
        if (bound >= 1) a.window_right = 0;
        if (bound == 2) a.window_left = 100;
        const int keys = fa4::sm90::d256_block_keys(a);
        // The causal serial step's rule from its inputs: tiles in pairs, at most three 128-key
        // blocks a tile on average.
        const int64_t m_blocks = (sq + 127) / 128;
        const bool serial_causal =
            bound == 1 &&
            fa4::sm90::use_paired_tiles<128, 128>(a, fa4::sm90::tile_window<128>(a), m_blocks, 1) &&
            fa4::sm90::computed_scores<128, 128>(a) / (128.0 * 128.0) <= 3.0 * double(m_blocks);
        const int want = bound == 0 && sk <= 512            ? 128
                         : !fa4::sm90::d256_narrow_blocks(a) ? 80
                         : serial_causal                     ? 128
                                                             : 64;
        EXPECT_EQ(keys, want) << sq << " x " << sk << ", bound " << bound;
        ++seen[keys == 128 ? 0 : keys == 64 ? 1 : 2];
        if (serial_causal) ++causal_serial;
      }
  EXPECT_GT(seen[0], 0);
  EXPECT_GT(seen[1], 0);
  EXPECT_GT(seen[2], 0);
  EXPECT_GT(causal_serial, 0);
}

// The serial step has no kernel for a window other than the causal one (d256_block_keys never
// gives it one): a launch of it with such a window is refused by name before any device work.
TEST(TileOrder, SerialStepRefusesAWindow) {
  fa4::detail::FwdParams a = fwd_params(2, 4, 4, 512, 512, 256);
  a.window_left = 100;
  a.window_right = 0;
  EXPECT_NE(fa4::sm90::d256_block_keys(a), 128);
  const fa4::Status s = fa4::test::forward_idle_warps_late_d256_serial(a, nullptr);
  EXPECT_EQ(s.code, fa4::StatusCode::kNotSupported) << s.message;
  EXPECT_NE(s.message.find("window = (100, 0)"), std::string::npos) << s.message;
}

// The d64 tile height: scores each height computes (padding and partial blocks included), and the
// rule that weighs them: without a bound 128-row tiles at 1.15, 192-row ones at 1, 256-row ones (on
// 64-key blocks) at 1.075; with a causal or window bound 128-row tiles at 1.25, 192-row ones at 1,
// and 256-row ones at 1.12 of what their consumers walk (each the blocks its rows see:
// four_consumer_scores); the cheapest taken, 192 rows on a tie.
TEST(TileOrder, D64TileHeightFollowsTheComputedScores) {
  using fa4::sm90::d64_consumers;
  fa4::detail::FwdParams a = fwd_params(1, 1, 1, 512, 512, 64);
  EXPECT_EQ((fa4::sm90::computed_scores<128, 128>(a)), 4.0 * 4 * 128 * 128);  // 4 tiles x 4 blocks
  EXPECT_EQ((fa4::sm90::computed_scores<192, 128>(a)), 3.0 * 4 * 192 * 128);  // 3 tiles, the last padded
  EXPECT_EQ((fa4::sm90::computed_scores<256, 64>(a)), 2.0 * 8 * 256 * 64);    // 2 tiles x 8 blocks
  EXPECT_EQ(d64_consumers(a), 4);  // 1.125 x 192-row, 1.075 x 256-row
  // Causal: 1 + 2 + 3 + 4 blocks against 1 + 3 + 4 (192-row tiles from row -64: row_shift).
  a.window_right = 0;
  EXPECT_EQ(fa4::sm90::row_shift<128>(a), 0);
  EXPECT_EQ(fa4::sm90::row_shift<192>(a), 64);
  EXPECT_EQ((fa4::sm90::computed_scores<128, 128>(a)), 10.0 * 128 * 128);
  EXPECT_EQ((fa4::sm90::computed_scores<192, 128>(a)), 8.0 * 192 * 128);
  // Four consumers walk 1 + 2 + 3 + 4 blocks of 64 keys in the first tile, 5 + 6 + 7 + 8 in the
  // second: 36 against three's 8 x 3 (1.33 times) and two's 10 x 4 (1.11).
  EXPECT_EQ(fa4::sm90::four_consumer_scores(a), 36.0 * 64 * 64);
  EXPECT_EQ(d64_consumers(a), 4);
  a.window_right = -1;
  a.seqlen_q = a.seqlen_k = 640;  // 768 rows against 640: 1.2; 256-row tiles 768 rows too
  EXPECT_EQ(d64_consumers(a), 2);
  a.window_right = 0;
  EXPECT_EQ(d64_consumers(a), 4);
  a.seqlen_q = a.seqlen_k = 384;  // causal 2 + 3 blocks of 192 rows against 1 + 2 + 3 of 128: 1.25
  EXPECT_EQ((fa4::sm90::computed_scores<192, 128>(a)), 5.0 * 192 * 128);
  EXPECT_EQ(fa4::sm90::four_consumer_scores(a), 21.0 * 64 * 64);  // 1 + 2 + 3 + 4, then 5 + 6 (two idle)
  EXPECT_EQ(d64_consumers(a), 4);
  a.window_left = 500;  // a window wider than the keys: the causal-free walk of every height
  a.window_right = 1000;
  EXPECT_EQ(d64_consumers(a), 3);
  a.window_left = 150;  // each consumer walks 4 blocks of 64 keys at most, against 3 of 128
  a.window_right = 30;
  a.seqlen_q = a.seqlen_k = 777;
  EXPECT_EQ(d64_consumers(a), 4);
  a = fwd_params(1, 1, 1, 4096, 4096, 64);
  a.window_left = 256;  // 5 blocks of 64 a consumer (of the tile's 9), fewer in the first tile
  a.window_right = 0;
  EXPECT_EQ(fa4::sm90::four_consumer_scores(a), (15.0 * 4 * 5 + 1 + 2 + 3 + 4) * 64 * 64);
  EXPECT_EQ(d64_consumers(a), 4);
  a.window_left = 4096;  // (4096, 0) at 16k: three compute 1.05 times four's count
  a.seqlen_q = a.seqlen_k = 16384;
  EXPECT_EQ(d64_consumers(a), 3);
  a = fwd_params(1, 1, 1, 256, 256, 64);
  a.window_left = -1;
  a.window_right = 0;
  a.seqlen_q = a.seqlen_k = 256;  // causal 1 + 2 blocks of 192 rows (from row -128) against 1 + 2: 1.5
  EXPECT_EQ(fa4::sm90::four_consumer_scores(a), 10.0 * 64 * 64);
  EXPECT_EQ(d64_consumers(a), 4);
  a.window_right = -1;  // one 256-row tile against two of 128 rows and two of 192
  EXPECT_EQ(d64_consumers(a), 4);
  a.seqlen_q = 2048;  // causal against 128 keys: most rows see every key
  a.seqlen_k = 128;
  a.window_right = 0;
  EXPECT_EQ(d64_consumers(a), 2);
  for (int s : {1000, 1024}) {  // 1152 rows against 1024
    a = fwd_params(1, 1, 1, s, s, 64);
    EXPECT_EQ(d64_consumers(a), 4) << s;
    a.window_right = 0;
    EXPECT_EQ(fa4::sm90::four_consumer_scores(a), 136.0 * 64 * 64) << s;
    EXPECT_EQ(d64_consumers(a), 4) << s << " causal";  // 1.19 times
  }
  for (int s : {1536, 2048, 4096, 16384}) {  // 192-row tiles: 1, 1.031, 1.031, 1.008 x 256-row ones
    a = fwd_params(1, 1, 1, s, s, 64);
    EXPECT_EQ(d64_consumers(a), 3) << s;
    a.window_right = 0;
    EXPECT_EQ(d64_consumers(a), 3) << s << " causal";
  }
  // Causal 4k in 192-row tiles: the padding in the first tile, 363 key-block steps, not 384.
  a = fwd_params(1, 1, 1, 4096, 4096, 64);
  a.window_right = 0;
  EXPECT_EQ(fa4::sm90::row_shift<192>(a), 128);
  EXPECT_EQ((fa4::sm90::computed_scores<192, 128>(a)), 363.0 * 192 * 128);
  a = fwd_params(2, 4, 4, 17, 239, 64);  // one tile any way: 192 or 256 rows against 128
  EXPECT_EQ(d64_consumers(a), 2);
  a = fwd_params(2, 4, 4, 4096, 239, 64);  // 4224 rows against 4096: 1.031
  EXPECT_EQ(d64_consumers(a), 3);
  // A long sequence counts a sample of its blocks and still gives the exact count when all are alike.
  a = fwd_params(1, 1, 1, 1 << 20, 1 << 20, 64);
  EXPECT_EQ((fa4::sm90::computed_scores<128, 128>(a)), 8192.0 * 8192 * 128 * 128);
  // The heights the GPU tests name (ForwardGpu.D64EveryTileHeight, WarpsSkewedEveryTile,
  // ManyTilesPersistentGrid, ClusterPairsMatchOneCtaBitForBit, StreamKTailMatchesTheReference).
  for (auto [sq, sk, n] : {std::array<int, 3>{100, 333, 2}, {17, 1000, 2}, {1050, 239, 3}, {700, 1000, 3},
                           {450, 333, 4}, {512, 512, 4}, {200, 1111, 4}, {1000, 1, 4}, {420, 700, 4},
                           {450, 1111, 4}, {512, 1111, 4}, {1000, 650, 4}, {1050, 650, 3}, {1000, 300, 4},
                           {1050, 256, 3}, {1050, 700, 3}, {500, 1000, 4}, {100, 1500, 2}, {450, 2049, 4}})
    EXPECT_EQ(d64_consumers(fwd_params(1, 2, 1, sq, sk, 64)), n) << sq << " x " << sk;
  // With a bound (window left, right; -1, 0 causal).
  for (auto [sq, sk, left, right, n] :
       {std::array<int, 5>{512, 512, -1, 0, 4}, {1000, 300, -1, 0, 4}, {384, 384, -1, 0, 4}, {250, 4000, -1, 0, 4},
        {600, 900, -1, 70, 4}, {333, 500, -1, 0, 3}, {2048, 128, -1, 0, 2}, {777, 777, 150, 30, 4},
        {700, 900, -1, 0, 4}, {333, 1111, -1, 0, 3}, {256, 256, -1, 0, 4}, {500, 200, -1, 0, 4},
        {513, 700, 64, -1, 4}, {400, 100, 10, 0, 4}, {384, 384, 500, 1000, 3}}) {
    a = fwd_params(1, 2, 1, sq, sk, 64);
    a.window_left = left;
    a.window_right = right;
    EXPECT_EQ(d64_consumers(a), n) << sq << " x " << sk << " window " << left << ", " << right;
  }
}


// Query tiles placed by row_shift (Window::shift): the tiles' real rows cover [0, seqlen_q) once,
// the shift is a multiple of 64 below the tile height, no tile is padding alone, and each tile's
// key blocks are exactly those its real rows see (brute force over rows and keys).
template <int kBlockM>
void check_shifted_tiles(int seqlen_q, int seqlen_k, int left, int right) {
  constexpr int kBlockN = 128;
  fa4::detail::FwdParams a = fwd_params(1, 1, 1, seqlen_q, seqlen_k, 64);
  a.window_left = left;
  a.window_right = right;
  const fa4::sm90::Window w{left, right, fa4::sm90::row_shift<kBlockM>(a)};
  SCOPED_TRACE(std::to_string(kBlockM) + " rows, sq " + std::to_string(seqlen_q) + ", sk " + std::to_string(seqlen_k) +
               ", window " + std::to_string(left) + "," + std::to_string(right) + ", shift " + std::to_string(w.shift));
  EXPECT_EQ(w.shift % 64, 0);
  EXPECT_GE(w.shift, 0);
  EXPECT_LT(w.shift, kBlockM);
  if (right < 0) EXPECT_EQ(w.shift, 0);
  const int m_blocks = (seqlen_q + kBlockM - 1) / kBlockM;
  std::vector<int> seen(seqlen_q, 0);
  const int offset = seqlen_k - seqlen_q;
  for (int m = 0; m < m_blocks; ++m) {
    const int first = fa4::sm90::tile_first_row<kBlockM>(w, m);
    int real = 0, lo_key = INT32_MAX, hi_key = -1;
    for (int q = std::max(first, 0); q < std::min(first + kBlockM, seqlen_q); ++q) {
      ++seen[q];
      ++real;
      for (int k = 0; k < seqlen_k; ++k) {
        if ((right >= 0 && k > q + offset + right) || (left >= 0 && k < q + offset - left)) continue;
        lo_key = std::min(lo_key, k);
        hi_key = std::max(hi_key, k);
      }
    }
    EXPECT_GT(real, 0) << "tile " << m << " holds no row";
    const fa4::sm90::BlockRange r = fa4::sm90::key_block_range<kBlockM, kBlockN>(w, m, seqlen_q, seqlen_k);
    if (hi_key < 0) {
      EXPECT_EQ(r.hi, r.lo) << "tile " << m;
    } else {
      EXPECT_EQ(r.lo, lo_key / kBlockN) << "tile " << m;
      EXPECT_EQ(r.hi, hi_key / kBlockN + 1) << "tile " << m;
    }
  }
  EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](int c) { return c == 1; }));
}

TEST(TileOrder, ShiftedTilesCoverEveryRowOnceAndSeeTheirKeys) {
  for (auto [sq, sk] : std::vector<std::array<int, 2>>{{512, 512}, {1000, 4097}, {4096, 4096}, {777, 300}, {300, 300},
                                                       {1, 1}, {17, 239}, {4097, 3000}, {129, 129}, {191, 1000}}) {
    for (auto [left, right] : std::vector<std::array<int, 2>>{{-1, 0}, {-1, -1}, {100, 20}, {64, 0}, {-1, 5}}) {
      check_shifted_tiles<192>(sq, sk, left, right);
      check_shifted_tiles<128>(sq, sk, left, right);
    }
  }
}

// The stream-K tail: whole rounds, then the last partial round's tiles cut into one equal run of
// key blocks a unit. Walked as the kernel walks it (item, decode_valid), every whole tile comes
// once, every key block of every tail tile once, each tail tile's pieces are numbered 0..pieces-1
// in key order with the count they all agree on, and no unit's run is a block longer than another's.
TEST(TileOrder, TailSplitCoversEveryKeyBlockOnce) {
  using fa4::sm90::Tile;
  for (auto [count, units, blocks] : std::vector<std::array<int, 3>>{
           {2048, 132, 32}, {2048, 132, 4}, {2816, 132, 22}, {1024, 66, 64}, {13, 5, 7}, {12, 5, 2}, {7, 3, 100},
           {100, 99, 2}, {101, 50, 3}, {257, 128, 1000}, {9, 8, 16}}) {
    TileOrder order{count, count, 1, 1, 1};
    if (!fa4::sm90::plan_tail_split(order, units, blocks, true)) {
      // Only when the last round is full or the tail has under two key blocks a unit.
      EXPECT_TRUE(count % units == 0 || int64_t(count % units) * blocks < 2 * units) << count << " " << units;
      continue;
    }
    SCOPED_TRACE(std::to_string(count) + " tiles, " + std::to_string(units) + " units, " + std::to_string(blocks) + " blocks");
    ASSERT_EQ(order.full, count / units * units);
    const int tails = count - order.full;
    std::vector<int> whole(count, 0), covered(size_t(tails) * blocks, 0);
    std::vector<std::vector<std::array<int, 3>>> pieces(tails);  // (lo, piece, pieces) per tail tile
    int shortest = INT32_MAX, longest = 0;
    for (int unit = 0; unit < units; ++unit) {
      int run = 0;
      for (int round = 0;; ++round) {
        Tile tl;
        if (!order.decode_valid(order.item(round, unit, units), 0, tl)) break;
        const int t = order.item(round, unit, units);
        if (t < order.full) {
          ASSERT_EQ(tl.pieces, 1);
          ASSERT_LT(tl.hi, 0);
          ++whole[t];
          continue;
        }
        ASSERT_GE(tl.tail, 0);
        ASSERT_LT(tl.tail, tails);
        ASSERT_LE(0, tl.lo);
        ASSERT_LT(tl.lo, tl.hi);
        ASSERT_LE(tl.hi, blocks);
        // The tile it belongs to, as the kernel finds its rows.
        const Tile base = order.decode_tile(order.full + tl.tail);
        ASSERT_EQ(tl.m_block, base.m_block);
        for (int b = tl.lo; b < tl.hi; ++b) ++covered[size_t(tl.tail) * blocks + b];
        pieces[tl.tail].push_back({tl.lo, tl.piece, tl.pieces});
        run += tl.hi - tl.lo;
      }
      shortest = std::min(shortest, run);
      longest = std::max(longest, run);
    }
    for (int t = 0; t < order.full; ++t) EXPECT_EQ(whole[t], 1) << "tile " << t;
    // The whole rounds' own launch: the same tiles in the same rounds, and nothing past them.
    const TileOrder rounds = order.whole_rounds();
    EXPECT_FALSE(rounds.has_tail());
    EXPECT_EQ(rounds.count, order.full);
    for (int unit = 0; unit < units; ++unit)
      for (int round = 0; round <= order.full / units; ++round) {
        const int t = rounds.item(round, unit, units);
        Tile a, b;
        ASSERT_EQ(rounds.decode_valid(t, 0, a), t < order.full);
        if (t < order.full) {
          ASSERT_EQ(t, order.item(round, unit, units));
          ASSERT_TRUE(order.decode_valid(t, 0, b));
          EXPECT_EQ(a.m_block, b.m_block);
          EXPECT_EQ(a.head, b.head);
          EXPECT_EQ(a.batch, b.batch);
          EXPECT_LT(a.hi, 0);
        }
      }
    // The tail's own launch (tail_only) starts at the pieces: the same ones, in round order.
    TileOrder tail = order;
    tail.tail_only = true;
    for (int unit = 0; unit < units; ++unit)
      for (int k = 0; k < 2; ++k)
        EXPECT_EQ(tail.item(k, unit, units), order.item(order.full / units + k, unit, units));
    for (int c : covered) ASSERT_EQ(c, 1);
    EXPECT_LE(longest - shortest, 1);
    for (auto& list : pieces) {
      std::sort(list.begin(), list.end());
      for (size_t i = 0; i < list.size(); ++i) {
        EXPECT_EQ(list[i][1], int(i));
        EXPECT_EQ(list[i][2], int(list.size()));
      }
      EXPECT_LE(int(list.size()), order.max_pieces);
    }
  }
}

// Tiles of a few rows (decoding): the tail is cut where the pieces' measured costs leave it
// faster. The cases are the H200 runs the costs come from (`sm90_fwd_probe decode`,
// bench/results/2026-12-02-sm90-fwd-decode-tiles-h200.txt and, for 8 tiles of 256 blocks,
// -decode-split-probe-h200.txt; d64 from -0255-sm90-fwd-decode-tiles-skip-idle-6f715ca-h200.txt,
// with the idle consumer skipping the pieces), one query row a head folded into 4 rows, on 132
// SMs, where cutting and not differed by more than 5 %.
TEST(TileOrder, ShortTilesTailSplitWhereItMeasuredFaster) {
  using fa4::sm90::short_tail_split_pays;
  struct Measured { int tails, blocks, head_dim; bool cut_faster; };
  const Measured runs[] = {
      {16, 64, 128, true},  {24, 64, 128, true},   {32, 64, 128, true},   {40, 64, 128, true},
      {48, 64, 128, true},  {64, 64, 128, false},  {72, 64, 128, false},  {80, 64, 128, false},
      {96, 64, 128, false}, {112, 64, 128, false}, {32, 16, 128, false},  {48, 16, 128, false},
      {64, 16, 128, false}, {96, 16, 128, false},  {16, 64, 64, true},    {24, 64, 64, true},
      {32, 64, 64, true},   {40, 64, 64, true},    {48, 64, 64, true},    {64, 64, 64, false},
      {96, 64, 64, false},  {128, 64, 64, false},  {16, 103, 256, true},  {32, 103, 256, true},
      {48, 103, 256, false}, {64, 103, 256, false}, {8, 256, 128, true},
  };
  for (const Measured& m : runs)
    EXPECT_EQ(short_tail_split_pays(m.tails, m.blocks, 132, m.head_dim), m.cut_faster)
        << m.tails << " tiles of " << m.blocks << " blocks, d" << m.head_dim;
  // Fewer tail tiles never make a cut less worth it; more keys a tile never do either.
  for (int d : {64, 128, 256})
    for (int blocks : {4, 16, 64, 256}) {
      bool pays = true;
      for (int tails = 1; tails < 132; ++tails) {
        const bool now = short_tail_split_pays(tails, blocks, 132, d);
        EXPECT_FALSE(now && !pays) << d << " " << blocks << " " << tails;
        pays = now;
        EXPECT_FALSE(now && !short_tail_split_pays(tails, 2 * blocks, 132, d)) << d << " " << blocks << " " << tails;
      }
    }
}

// Where the launch cuts the tail: when the idle part of the last round, less the pieces' cost of
// three key blocks a unit, is at least 2.5 % of the run; never when the last round is full, and
// not where units would get under two key blocks.
TEST(TileOrder, TailSplitWhereTheLastRoundIsMostlyIdle) {
  using fa4::sm90::plan_tail_split;
  auto split = [](int count, int units, int blocks) {
    TileOrder order{count, count, 1, 1, 1};
    return plan_tail_split(order, units, blocks, false);
  };
  EXPECT_FALSE(split(2048, 132, 32));  // d128 non-causal 4k: 15 rounds and 68 tiles, 2.4 %
  EXPECT_FALSE(split(1024, 66, 32));   // the same in clusters of two
  EXPECT_TRUE(split(1024, 66, 64));    // d128 8k in clusters: 2.7 %
  EXPECT_TRUE(split(1024, 66, 128));   // d128 16k in clusters: 2.9 %
  EXPECT_FALSE(split(512, 66, 52));    // d256 4k in clusters: 7 rounds and 50 pairs, 2.3 %
  EXPECT_TRUE(split(2816, 132, 32));   // d64 4k: 21 rounds and 44 tiles, 2.6 %
  EXPECT_FALSE(split(2816, 132, 16));  // d64 2k: 2.2 %
  EXPECT_TRUE(split(300, 132, 64));    // two rounds and 36 tiles: 23 %
  EXPECT_TRUE(split(500, 132, 64));    // three rounds and 104 tiles: 4.1 %
  EXPECT_FALSE(split(510, 132, 64));   // three rounds and 114 tiles: 2.2 %
  EXPECT_TRUE(split(200, 132, 64));    // one round and 68 tiles: 23 %
  EXPECT_FALSE(split(2752, 132, 64));  // d64 8k: 20 rounds and 112 tiles, 0.5 %
  EXPECT_FALSE(split(1320, 132, 32));  // every round full
  EXPECT_FALSE(split(133, 132, 1));    // one tile left, one block: under two blocks a unit
  EXPECT_TRUE(split(100, 132, 32));    // fewer tiles than units: all cut (keys over every SM)
  EXPECT_TRUE(split(16, 132, 256));    // 16 heads of a short query against 32k keys
  // The scratch: a counter and max_pieces partials (O and two row stats a thread) per tail tile,
  // rank and consumer.
  TileOrder order{2048, 2048, 1, 1, 1};
  ASSERT_TRUE(plan_tail_split(order, 132, 32, true));
  using Cfg = fa4::sm90::FwdConfig<128, 128, 2, true, 0>;
  const auto layout = fa4::sm90::tail_scratch_layout<Cfg>(order);
  EXPECT_EQ(layout.counter_bytes, size_t(68 * 2 * 4));
  EXPECT_EQ(layout.partial_bytes, size_t(68) * 2 * order.max_pieces * 128 * (64 + 4) * 4);
  EXPECT_EQ(layout.partial_offset() % 256, 0u);
  EXPECT_GE(layout.partial_offset(), layout.counter_bytes);
}


TEST(TileOrder, TailPieceCountersFitTheStreamsOwnSet) {
  // A stream-K tail takes its piece counters from the stream's own set (detail::stream_counters)
  // where they fit in kStreamPieceCounters: one a consumer of each tail tile (and cluster rank),
  // with fewer tail tiles than units. On a 132-SM H100 the most is 131 tiles x 4 consumers (d64's
  // 256-row tiles), 524; 66 clusters of two d128 CTAs take at most 65 x 2 x 2. Every tile count
  // that takes a tail there, and on single CTAs of a 256-SM GPU, fits.
  using fa4::sm90::plan_tail_split;
  using fa4::sm90::tail_scratch_layout;
  using D64Four = fa4::sm90::FwdConfig<64, 64, 8, true, 0, 4>;
  using D128 = fa4::sm90::FwdConfig<128, 128, 2, true, 0>;
  constexpr size_t kFit = fa4::detail::kStreamPieceCounters * sizeof(int);
  size_t most = 0;
  for (int units : {132, 256})
    for (int count = 1; count <= 4 * units; ++count) {
      TileOrder order{count, count, 1, 1, 1};
      if (!plan_tail_split(order, units, 64, true)) continue;
      const size_t bytes = tail_scratch_layout<D64Four>(order).counter_bytes;
      EXPECT_LE(bytes, kFit) << units << " units, " << count << " tiles";
      if (units == 132) most = std::max(most, bytes);
    }
  EXPECT_EQ(most, 524 * sizeof(int));
  most = 0;
  for (int count = 1; count <= 4 * 66; ++count) {
    TileOrder order{count, count, 1, 1, 1};
    order.cluster = 2;
    if (!plan_tail_split(order, 66, 64, true)) continue;
    most = std::max(most, tail_scratch_layout<D128>(order).counter_bytes);
  }
  EXPECT_EQ(most, size_t(65 * 2 * 2) * sizeof(int));
}

}  // namespace
