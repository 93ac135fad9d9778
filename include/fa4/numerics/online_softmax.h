// Online softmax with FlashAttention-4's conditional rescaling, shared by host and device.
//
// Scores are kept in log2 units (x = s * scale * log2(e)). A row carries the running max m that
// its exponentials were taken against and the running sum l. A new block with max m_blk moves m
// only when m_blk - m exceeds the threshold; otherwise the stale m stays, exponentials reach at
// most 2^threshold, and since the final normalisation O / l uses the same m the result is exact.
#pragma once

#include "fa4/numerics/exp2.h"

namespace fa4::numerics {

// 2^8 fits 16-bit P (bf16/fp16) with room; fp8 P would need 0.
inline constexpr float kRescaleThresholdLog2 = 8.0f;

struct RowState {
  float max;  // running max in log2 units (-inf before any unmasked score)
  float sum;  // sum of 2^(x - max) over the row so far
};

FA4_HD RowState row_state_init() { return {-INFINITY, 0.0f}; }

// The outcome of folding one block's max into a row.
struct RescaleStep {
  float max;         // the max to take this block's exponentials against
  float correction;  // factor for the row's O and sum (1 when no rescale happened)
  bool rescaled;
};

// The two exp2 implementations as function objects, for code that takes the exp as a parameter.
struct Exp2Mufu {
  FA4_HD float operator()(float x) const { return exp2_mufu(x); }
};
struct Exp2Poly {
  FA4_HD float operator()(float x) const { return exp2_poly(x); }
};

// Decides whether the row's max moves for a block whose max is `block_max`.
// threshold = 0 gives the classic always-rescale online softmax. `exp2_fn` computes the
// correction: MUFU by default; Exp2Poly makes the step bit-identical between host and device.
template <class Exp2Fn = Exp2Mufu>
FA4_HD RescaleStep rescale_step(float running_max, float block_max, float threshold,
                                Exp2Fn exp2_fn = {}) {
  if (block_max - running_max > threshold || (running_max == -INFINITY && block_max != -INFINITY)) {
    // running_max == -inf: correction 2^-inf = 0 multiplies an all-zero O and sum.
    return {block_max, running_max == -INFINITY ? 0.0f : exp2_fn(running_max - block_max), true};
  }
  return {running_max, 1.0f, false};
}

// The value to subtract before exp2: a row still at -inf has only masked scores (-inf), and
// subtracting 0 keeps 2^-inf = 0 instead of NaN.
FA4_HD float exp_offset(float max) { return max == -INFINITY ? 0.0f : max; }

struct Log2Std {
  FA4_HD float operator()(float x) const { return log2f(x); }
};

inline constexpr float kLog2e = 1.44269504088896341f;

// A sink logit (ForwardArgs::sink, in log2 units: times kLog2e) folded into a finished row: one more term of its
// sum, 2^(sink - max), with no value. The row's max becomes max(max, sink); returns the factor its
// O (taken against the old max) needs beside 1 / sum. A sink of -inf leaves the row as it is.
template <class Exp2Fn = Exp2Mufu>
FA4_HD float fold_sink(RowState& s, float sink_log2, Exp2Fn exp2_fn = {}) {
  if (sink_log2 == -INFINITY) return 1.0f;
  const float m = fmaxf(s.max, sink_log2);
  const float c = s.max == -INFINITY ? 0.0f : exp2_fn(s.max - m);
  s.sum = s.sum * c + exp2_fn(sink_log2 - m);
  s.max = m;
  return c;
}

// Natural-log LSE of a finished row; -inf for a row that saw no key. `log2_fn` takes the log2 of
// the row's sum (log2f by default; the sm90 epilogue passes MUFU's).
template <class Log2Fn = Log2Std>
FA4_HD float row_lse(RowState s, Log2Fn log2_fn = {}) {
  constexpr float kLn2 = 0.693147180559945309f;
  return (s.sum == 0.0f || s.max == -INFINITY) ? -INFINITY : (s.max + log2_fn(s.sum)) * kLn2;
}

}  // namespace fa4::numerics
