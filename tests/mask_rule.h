// The float64 reference's visibility rule as the sm90 masks' tests ask it (test_mask.cu,
// test_query_fold.cu): query q sees key k.
#pragma once

#include <cstdint>

#include "reference.h"
#include "sm90/mask.cuh"

namespace fa4::test {

// Key k inside the sequence and visible to query q under window w's bounds (its left and right;
// q a query, not a folded row), seqlen_q queries against seqlen_k keys.
inline bool visible(int64_t q, int64_t k, sm90::Window w, int seqlen_q, int seqlen_k) {
  fa4::Problem p;
  p.seqlen_q = seqlen_q;
  p.seqlen_k = seqlen_k;
  p.window_left = w.left;
  p.window_right = w.right;
  return k >= 0 && k < seqlen_k && fa4::ref::visible(p, q, k);
}

}  // namespace fa4::test
