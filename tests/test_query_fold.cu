// Query groups folded into rows (detail::fold_query_rows, FwdParams::fold) on the CPU: where a call
// folds, and that every folded row reaches the elements of its own query and query head through
// each path the kernel takes: Q's and O's TMA boxes (ptx::bshd_query_group_spec at the coordinates
// of sm90::qo_map_row and chunked_at), O's per-thread stores (o_row_offset) and the LSE
// (lse_index), for BSHD, BHSD and padded strides, and the masks by each row's query (Window::fold)
// against the reference's rule.
#include <cstdint>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "common/validate.h"
#include "fa4/attention.h"
#include "mask_rule.h"
#include "reference.h"
#include "sm90/epilogue.cuh"
#include "sm90/fwd_configs.cuh"
#include "sm90/fwd_launch.cuh"
#include "sm90/mask.cuh"
#include "test_support.h"

namespace {

using fa4::sm90::Window;

fa4::ForwardArgs args_for(int64_t batch, int64_t sq, int64_t sk, int64_t hq, int64_t hkv, int64_t d) {
  return fa4::test::fake_forward(fa4::test::make_problem(batch, sq, sk, hq, hkv, d));
}

TEST(QueryFold, FoldsAGroupOfPowerOfTwoHeadsIntoATilesRows) {
  auto fold_of = [](const fa4::ForwardArgs& a) { return fa4::detail::make_fwd_params(a).fold; };
  for (const int64_t group : {2, 4, 8, 16, 32, 64})
    for (const int64_t sq : {2, 3, 5, 8}) {
      if (sq * group > fa4::detail::kFoldRowsMax) continue;
      fa4::ForwardArgs a = args_for(2, sq, 300, 2 * group, 2, 128);
      a.problem.causal = true;
      const fa4::detail::FwdParams f = fa4::detail::make_fwd_params(a);
      int log2 = 0;
      while ((int64_t(1) << log2) < group) ++log2;
      ASSERT_EQ(f.fold, log2) << "group " << group << " seqlen_q " << sq;
      EXPECT_EQ(f.seqlen_q, sq * group);
      EXPECT_EQ(f.heads_q, 2);
      EXPECT_EQ(f.window_right, 0);                    // causal kept: each row's own query bounds it
      EXPECT_EQ(f.q_stride[1], a.q.seq_stride);        // the tensors' own strides (the maps fold)
      EXPECT_EQ(f.o_stride[2], a.o.head_stride);
    }
  EXPECT_EQ(fold_of(args_for(2, 4, 300, 12, 4, 64)), 0);   // a group of 3
  EXPECT_EQ(fold_of(args_for(2, 4, 300, 8, 8, 64)), 0);    // no group
  EXPECT_EQ(fold_of(args_for(2, 33, 300, 8, 2, 64)), 0);   // 132 rows: more than a tile
  EXPECT_EQ(fold_of(args_for(2, 32, 300, 8, 2, 64)), 2);   // 128 rows
  EXPECT_EQ(fold_of(args_for(2, 1, 300, 8, 2, 64)), 0);    // one query: folded by strides instead
  EXPECT_EQ(fa4::detail::make_fwd_params(args_for(2, 1, 300, 8, 2, 64)).seqlen_q, 4);
  EXPECT_EQ(fold_of(args_for(2, 2, 300, 256, 2, 64)), 0);  // a group of 128
}

struct Layout {
  const char* name;
  bool bhsd;
  int64_t pad;  // extra elements a head (padded rows)
};

// Every row of a folded tile (first row `first`, kRows rows) through the map's box, the O row's
// offset and the LSE's index lands on its own query's and query head's element.
TEST(QueryFold, EveryRowReachesItsQueryAndHeadThroughBoxesStoresAndTheLse) {
  for (const Layout l : {Layout{"bshd", false, 0}, Layout{"bhsd", true, 0}, Layout{"padded bshd", false, 8}})
    for (const int fold : {1, 2, 3, 6})
      for (const int sq : {1, 3, 7}) {
        const int group = 1 << fold, hkv = 3, hq = hkv * group, d = 128, batch = 2;
        const int64_t hs = d + l.pad;  // a row's elements
        int64_t st[3];                  // batch, seq, head
        if (l.bhsd)
          st[2] = sq * hs, st[1] = hs, st[0] = hq * sq * hs;
        else
          st[2] = hs, st[1] = hq * hs, st[0] = sq * hq * hs;
        struct P {
          Window window;
          int64_t o_stride[3];
          int heads_q, seqlen_q;
        } p{Window{-1, -1, 0, fold}, {st[0], st[1], st[2]}, hkv, sq << fold};
        for (const bool chunked : {false, true})
          for (const int rows : {64, 128}) {
            const fa4::ptx::TensorMapSpec m =
                fa4::ptx::bshd_query_group_spec(st, batch, sq, hq, d, rows, fold, chunked);
            for (int i = 0; i < m.rank; ++i) ASSERT_LE(m.box[i], 256u);
            ASSERT_EQ(m.box[0] * 2, 128u);
            uint32_t box_rows = m.box[1] * m.box[2];
            ASSERT_EQ(int(box_rows), rows) << l.name;
            for (int i = 0; i < m.rank - 1; ++i) ASSERT_EQ(m.strides_bytes[i] % 16, 0u);
            for (const int first : {-64, 0, 64})
              for (int b = 0; b < batch; ++b)
                for (int hk = 0; hk < hkv; ++hk) {
                  const fa4::sm90::MapRow at = fa4::sm90::qo_map_row(p, first, hk);
                  const fa4::sm90::ChunkedAt ca = fa4::sm90::chunked_at<true>(p, at);
                  for (int r = 0; r < rows; ++r) {
                    const int row = first + r, q = row >> fold, h = hk * group + (row & (group - 1));
                    // Box element (e, r % group, r / group[, chunk]) from the kernel's coordinates
                    // (at, or ca for the chunked maps).
                    for (int e = 0; e < 64; e += 21)
                      for (int c = 0; c < d / 64; ++c) {
                        const int64_t box_q = int64_t(chunked ? ca.c2 : at.head) + r / group;
                        const uint64_t off =
                            chunked ? m.offset({uint64_t(e), uint64_t(ca.c1 + r % group), uint64_t(box_q),
                                                uint64_t(ca.c3 + c), uint64_t(b)})
                                    : m.offset({uint64_t(64 * c + e), uint64_t(at.row + r % group), uint64_t(box_q),
                                                uint64_t(b)});
                        if (q < 0 || q >= sq) {  // outside the tensor: TMA's zero fill, clipped stores
                          ASSERT_TRUE(box_q < 0 || box_q >= sq);
                          continue;
                        }
                        ASSERT_EQ(box_q, q);
                        ASSERT_EQ(off, uint64_t(b * st[0] + q * st[1] + h * st[2] + 64 * c + e) * 2)
                            << l.name << " fold " << fold << " row " << row;
                      }
                    if (q < 0 || q >= sq) continue;
                    ASSERT_EQ(fa4::sm90::o_row_offset(p, hk, row), q * st[1] + h * st[2]) << l.name;
                    fa4::sm90::Tile tl{b, hk, 0};
                    ASSERT_EQ(fa4::sm90::lse_index(p, tl, row), (int64_t(b) * hq + h) * sq + q) << l.name;
                  }
                }
          }
      }
}

// Unfolded (fold 0) the helpers are the plain row's: coordinates (row, head), the row's offset, the
// LSE's [batch, heads, seqlen] index.
TEST(QueryFold, UnfoldedRowsKeepTheirPlainIndices) {
  struct P {
    Window window;
    int64_t o_stride[3];
    int heads_q, seqlen_q;
  } p{Window{-1, 0, 64, 0}, {1000000, 512, 64}, 5, 300};
  for (const int row : {-64, 0, 17, 299}) {
    const fa4::sm90::MapRow at = fa4::sm90::qo_map_row(p, row, 3);
    EXPECT_EQ(at.row, row);
    EXPECT_EQ(at.head, 3);
    EXPECT_EQ(fa4::sm90::o_row_offset(p, 3, row), int64_t(row) * 512 + 3 * 64);
    fa4::sm90::Tile tl{1, 3, 0};
    EXPECT_EQ(fa4::sm90::lse_index(p, tl, row), (1 * 5 + 3) * 300 + row);
  }
}

using fa4::test::visible;

// The masks over folded rows: apply_mask (both paths) hides exactly the keys a row's query does not
// see, block_needs_mask is true exactly where some row misses a key of the block, and
// key_block_range covers every key some row sees, ending at the last row's last key.
TEST(QueryFold, MasksFollowEachRowsQuery) {
  std::mt19937 rng(29);
  std::uniform_int_distribution<int> pick(0, 4), keys(1, 700), fold_of(1, 6);
  for (int t = 0; t < 3000; ++t) {
    const int fold = fold_of(rng), group = 1 << fold;
    const int sq = std::uniform_int_distribution<int>(1, std::max(1, 128 / group))(rng), sk = keys(rng);
    auto bound = [&] {
      const int k = pick(rng);
      return k == 0 ? -1 : k == 1 ? 0 : std::uniform_int_distribution<int>(0, sk + 10)(rng);
    };
    const Window w{bound(), bound(), 0, fold};
    const Window plain{w.left, w.right, 0, 0};
    const int rows = sq * group;  // the folded seqlen_q
    const int row = 8 * std::uniform_int_distribution<int>(-8, rows / 8)(rng) + std::uniform_int_distribution<int>(0, 7)(rng);
    const int key = 128 * std::uniform_int_distribution<int>(0, sk / 128 + 1)(rng) + 2 * pick(rng) % 8;
    for (const bool one_sided : {true, false}) {
      float s[64];
      for (int e = 0; e < 64; ++e) s[e] = 1.0f + e;
      if (one_sided)
        fa4::sm90::apply_mask<128, true>(s, w, row, key, rows, sk);
      else
        fa4::sm90::apply_mask<128, false>(s, w, row, key, rows, sk);
      for (int j = 0; j < 16; ++j)
        for (int i = 0; i < 2; ++i)
          for (int c = 0; c < 2; ++c) {
            const bool vis = visible((row + 8 * i) >> fold, key + 8 * j + c, plain, sq, sk);
            ASSERT_EQ(s[4 * j + 2 * i + c] < -1e30f, !vis)
                << "fold " << fold << " window (" << w.left << ", " << w.right << ") sq " << sq << " sk " << sk
                << " row " << row + 8 * i << " key " << key + 8 * j + c;
          }
    }
    const int first = 64 * std::uniform_int_distribution<int>(-1, (rows - 1) / 64)(rng);
    const int n = std::uniform_int_distribution<int>(0, (sk - 1) / 128)(rng);
    bool hidden = false;
    for (int r = first; r < first + 64 && !hidden; ++r)
      for (int k = n * 128; k < n * 128 + 128 && !hidden; ++k) hidden = !visible(r >> fold, k, plain, sq, sk);
    ASSERT_EQ((fa4::sm90::block_needs_mask<64, 128>(n, w, first, rows, sk)), hidden)
        << "fold " << fold << " first " << first << " block " << n;
    // The tile of 128 rows from row 0 (m_block 0, no shift).
    const fa4::sm90::BlockRange range = fa4::sm90::key_block_range<128, 128>(w, 0, rows, sk);
    int lo = -1, hi = -1;
    for (int r = 0; r < std::min(rows, 128); ++r)
      for (int k = 0; k < sk; ++k)
        if (visible(r >> fold, k, plain, sq, sk)) {
          if (lo < 0 || k < lo) lo = k;
          hi = std::max(hi, k);
        }
    if (lo >= 0) {
      EXPECT_LE(range.lo, lo / 128) << "fold " << fold << " window (" << w.left << ", " << w.right << ")";
      EXPECT_GE(range.hi, hi / 128 + 1) << "fold " << fold << " window (" << w.left << ", " << w.right << ")";
    }
    // Without a left bound its last block is the one the last row's query sees last.
    if (lo >= 0 && w.left < 0) EXPECT_EQ(range.hi, hi / 128 + 1) << "fold " << fold;
    if (HasFatalFailure()) return;
  }
}

}  // namespace

namespace {

// A folded launch runs on the kernel with its bound at run time, the only one that reads the rows'
// fold: it is neither of one tile length (the unbounded kernels, stream-K, clusters) nor causal
// (the causal kernel), whatever its window.
TEST(QueryFold, FoldedLaunchesTakeTheKernelWithTheBoundAtRunTime) {
  for (const bool causal : {false, true}) {
    fa4::ForwardArgs a = args_for(2, 4, 300, 32, 8, 128);
    a.problem.causal = causal;
    const fa4::detail::FwdParams f = fa4::detail::make_fwd_params(a);
    ASSERT_EQ(f.fold, 2);
    EXPECT_FALSE(fa4::sm90::tiles_of_one_length(f));
    EXPECT_FALSE(fa4::sm90::causal_bound(f));
    EXPECT_NE(fa4::sm90::d256_block_keys(f), 128);  // not the serial step, which has no such kernel
    EXPECT_EQ(fa4::sm90::d64_consumers(f), 2);       // decoding's tiles' rule: 128 rows, as unfolded
    fa4::detail::FwdParams g = f;
    g.fold = 0;  // the same window unfolded
    EXPECT_EQ(fa4::sm90::tiles_of_one_length(g), !causal);
    EXPECT_EQ(fa4::sm90::causal_bound(g), causal);
  }
}

// With sinks a decoding call's query group folds at d256 too, each row reading its own head's sink,
// which d256's serial-step kernel does not: its short keys take the 80-key blocks instead, and the
// launch refuses the serial configuration for such rows. Soft-capped d256 calls with sinks stay
// unfolded (that kernel takes a tile's sink from its head).
TEST(QueryFold, SinksAtD256FoldButNotIntoTheSerialStepOrTheSoftCappedKernels) {
  static const float sinks[32] = {};
  fa4::ForwardArgs a = args_for(2, 1, 300, 16, 2, 256);  // short keys of one tile length
  const fa4::detail::FwdParams plain = fa4::detail::make_fwd_params(a);
  EXPECT_EQ(plain.sink_group, 8);  // (folded by strides without sinks too)
  EXPECT_EQ(fa4::sm90::d256_block_keys(plain), 128);
  a.sink = sinks;
  const fa4::detail::FwdParams f = fa4::detail::make_fwd_params(a);
  EXPECT_EQ(f.heads_q, 2);
  EXPECT_EQ(f.sink_group, 8);
  EXPECT_EQ(fa4::sm90::d256_block_keys(f), 80);
  EXPECT_FALSE(fa4::sm90::per_row_sinks<fa4::sm90::D256SerialConfig<true>>());
  EXPECT_FALSE((fa4::sm90::per_row_sinks<fa4::sm90::SoftcapConfig<fa4::sm90::D256Config<80, true>>>()));
  EXPECT_TRUE((fa4::sm90::per_row_sinks<fa4::sm90::D256Config<80, true>>()));
  EXPECT_TRUE(fa4::sm90::per_row_sinks<fa4::sm90::SoftcapConfig<fa4::sm90::D128Config<true>>>());
  a.problem.softcap = 10.0f;
  const fa4::detail::FwdParams capped = fa4::detail::make_fwd_params(a);
  EXPECT_EQ(capped.heads_q, 16);
  EXPECT_EQ(capped.sink_group, 1);
  a.problem.head_dim = 128;  // (soft-capped d128 folds with sinks)
  EXPECT_EQ(fa4::detail::make_fwd_params(a).sink_group, 8);
}

}  // namespace

namespace {

// The fold wherever its tiles may be cut into stream-K pieces (its one query block a head makes
// them alike: tiles_alike), and without pieces where the unfolded tiles (one a query head) take
// more than one round of the grid, as measured (fwd_launch.cuh, fold_pays); unfolding gives the
// tensors' own geometry back.
TEST(QueryFold, PaysWithPiecesOrPastOneRoundOfUnfoldedTiles) {
  auto params = [](int b, int sq, int hq, int hkv, int split = 0) {
    fa4::detail::FwdParams f = fa4::detail::make_fwd_params(args_for(b, sq, 8192, hq, hkv, 128));
    EXPECT_GT(f.fold, 0);
    EXPECT_TRUE(fa4::sm90::tiles_alike(f, (f.seqlen_q + 127) / 128));
    f.split = split;
    return f;
  };
  for (const int split : {0, 2}) {  // pieces where they pay, or always
    EXPECT_TRUE(fa4::sm90::fold_pays(params(1, 4, 32, 8, split), 132));
    EXPECT_TRUE(fa4::sm90::fold_pays(params(8, 4, 16, 4, split), 132));
  }
  // Without pieces (split 1), as measured on whole tiles.
  EXPECT_TRUE(fa4::sm90::fold_pays(params(8, 4, 32, 8, 1), 132));    // 256 query heads: 1.72 measured
  EXPECT_TRUE(fa4::sm90::fold_pays(params(32, 4, 32, 8, 1), 132));   // 2.07
  EXPECT_FALSE(fa4::sm90::fold_pays(params(1, 4, 32, 8, 1), 132));   // 32: 0.96
  EXPECT_FALSE(fa4::sm90::fold_pays(params(8, 4, 16, 4, 1), 132));   // 128: 0.99 (d256)
  EXPECT_TRUE(fa4::sm90::fold_pays(params(8, 4, 16, 4, 1), 114));    // the same past an H100 PCIe's SMs
  fa4::detail::FwdParams small_grid = params(1, 4, 32, 8, 1);
  small_grid.max_ctas = 16;  // a grid of 16 CTAs: 32 query heads take two rounds
  EXPECT_TRUE(fa4::sm90::fold_pays(small_grid, 132));
  fa4::detail::FwdParams whole_grid = params(1, 4, 32, 8);
  whole_grid.schedule = 2;  // one CTA a tile: no pieces
  EXPECT_FALSE(fa4::sm90::fold_pays(whole_grid, 132));
  fa4::detail::FwdParams own_keys = params(1, 4, 32, 8);
  own_keys.seqused_k = reinterpret_cast<const int32_t*>(256);  // batch entries' own keys: pieces
  EXPECT_TRUE(fa4::sm90::fold_pays(own_keys, 132));
  own_keys.window_left = 1000;  // under a left bound their tiles stay whole: 32 query heads fit one round
  EXPECT_FALSE(fa4::sm90::tiles_alike(own_keys, 1));
  EXPECT_FALSE(fa4::sm90::fold_pays(own_keys, 132));
  fa4::detail::FwdParams capped = params(1, 4, 16, 4);
  capped.softcap = 30.0f;  // soft-capped d256 under a bound has no stream-K kernel
  capped.head_dim = 256;
  EXPECT_FALSE(fa4::sm90::fold_pays(capped, 132));
  capped.head_dim = 128;
  EXPECT_TRUE(fa4::sm90::fold_pays(capped, 132));
  fa4::detail::FwdParams f = params(3, 5, 16, 2);
  fa4::sm90::unfold_query_rows(&f);
  EXPECT_EQ(f.fold, 0);
  EXPECT_EQ(f.seqlen_q, 5);
  EXPECT_EQ(f.heads_q, 16);
  EXPECT_FALSE(fa4::sm90::fold_pays(f, 1));
}

}  // namespace
