// The sm90 forward's masks (src/sm90/mask.cuh) on the host, against the float64 reference's
// visibility rule (fa4::ref::visible) for keys inside the sequence. Both mask paths (one compare
// without a left bound, two otherwise), a block's lower half as the first-block cut takes it, and
// which blocks need a mask for a consumer's 64 rows and for a tile's.
#include <cmath>
#include <cstdint>
#include <random>

#include <gtest/gtest.h>

#include "mask_rule.h"
#include "reference.h"
#include "sm90/mask.cuh"

namespace {

using fa4::sm90::Window;

using fa4::test::visible;

// One thread's slice of S (accumulator layout: rows row and row + 8, keys key + 8 * chunk + {0, 1})
// masked by apply_mask; every element must be -inf exactly where its pair is not visible.
template <int kN, bool kOneSided>
void expect_mask_matches(Window w, int row, int key, int seqlen_q, int seqlen_k) {
  float s[kN / 2];
  for (int e = 0; e < kN / 2; ++e) s[e] = 0.25f + e;  // finite, never -inf
  fa4::sm90::apply_mask<kN, kOneSided>(s, w, row, key, seqlen_q, seqlen_k);
  for (int j = 0; j < kN / 8; ++j)
    for (int i = 0; i < 2; ++i)
      for (int c = 0; c < 2; ++c) {
        const int e = 4 * j + 2 * i + c;
        const bool vis = visible(row + 8 * i, key + 8 * j + c, w, seqlen_q, seqlen_k);
        ASSERT_EQ(std::isinf(s[e]) && s[e] < 0, !vis)
            << "N " << kN << (kOneSided ? " one-sided" : " two-sided") << " window (" << w.left << ", "
            << w.right << ") sq " << seqlen_q << " sk " << seqlen_k << " row " << row + 8 * i << " key "
            << key + 8 * j + c;
        if (vis) ASSERT_EQ(s[e], 0.25f + e);
      }
}

Window random_window(std::mt19937& rng, int seqlen_k) {
  std::uniform_int_distribution<int> pick(0, 5), width(0, seqlen_k + 10);
  auto bound = [&] {
    const int k = pick(rng);
    return k == 0 ? -1 : k == 1 ? 0 : width(rng);
  };
  return Window{bound(), bound(), 0};
}

TEST(Mask, BothPathsMatchTheVisibilityRule) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> len(1, 700);
  for (int t = 0; t < 4000; ++t) {
    const int seqlen_q = len(rng), seqlen_k = len(rng);
    const Window w = random_window(rng, seqlen_k);
    // A thread's first row anywhere in (or just before) the sequence, its first key at a block's
    // start plus the quad's column offset, the block anywhere around the keys.
    const int row = std::uniform_int_distribution<int>(-64, seqlen_q + 8)(rng);
    const int key = 128 * std::uniform_int_distribution<int>(0, seqlen_k / 128 + 1)(rng) +
                    2 * std::uniform_int_distribution<int>(0, 3)(rng);
    expect_mask_matches<128, true>(w, row, key, seqlen_q, seqlen_k);
    expect_mask_matches<128, false>(w, row, key, seqlen_q, seqlen_k);
    expect_mask_matches<64, true>(w, row, key, seqlen_q, seqlen_k);  // a block's lower half
    expect_mask_matches<80, false>(w, row, key, seqlen_q, seqlen_k);  // d256's blocks
    if (HasFatalFailure()) return;
  }
  // Causal, seqlen_q = seqlen_k, the diagonal block: row r sees keys up to r.
  for (int row = 0; row < 128; row += 8)
    for (int quad = 0; quad < 4; ++quad) expect_mask_matches<128, true>(Window{-1, 0, 0}, row, 2 * quad, 512, 512);
}

// block_needs_mask<kRows, kN>: true exactly when some row of kRows from first_row does not see
// some key of block n (brute force over every pair), for a consumer's 64 rows and a tile's 192.
template <int kRows>
void expect_needs_mask_exact(int n, Window w, int first_row, int seqlen_q, int seqlen_k) {
  bool hidden = false;
  for (int r = first_row; r < first_row + kRows && !hidden; ++r)
    for (int k = n * 128; k < n * 128 + 128 && !hidden; ++k) hidden = !visible(r, k, w, seqlen_q, seqlen_k);
  EXPECT_EQ((fa4::sm90::block_needs_mask<kRows, 128>(n, w, first_row, seqlen_q, seqlen_k)), hidden)
      << kRows << " rows from " << first_row << ", block " << n << ", window (" << w.left << ", " << w.right
      << ") sq " << seqlen_q << " sk " << seqlen_k;
}

TEST(Mask, BlocksNeedTheMaskExactlyWhereARowMissesAKey) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> len(1, 600);
  for (int t = 0; t < 1500; ++t) {
    const int seqlen_q = len(rng), seqlen_k = len(rng);
    const Window w = random_window(rng, seqlen_k);
    const int first_row = std::uniform_int_distribution<int>(-128, seqlen_q)(rng);
    const int n = std::uniform_int_distribution<int>(0, (seqlen_k - 1) / 128)(rng);
    expect_needs_mask_exact<64>(n, w, first_row, seqlen_q, seqlen_k);
    expect_needs_mask_exact<192>(n, w, first_row, seqlen_q, seqlen_k);
  }
  // A consumer's rows can see a block whole that the tile's diagonal crosses: causal 384, rows
  // 128..191 against keys 0..127 (the tile's rows 0..63 do not see all of them).
  const Window causal{-1, 0, 0};
  EXPECT_FALSE((fa4::sm90::block_needs_mask<64, 128>(0, causal, 128, 384, 384)));
  EXPECT_TRUE((fa4::sm90::block_needs_mask<192, 128>(0, causal, 0, 384, 384)));
}

}  // namespace
