// Float64 CPU reference for fa4's exact semantics (scale, bottom-right causal, window, GQA, empty
// rows), a low-precision "plain implementation" for the correctness criterion of DESIGN.md §3, and
// (reference_gpu.h) a plain CUDA oracle (fp32 accumulation) for shapes too large for the CPU.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "fa4/attention.h"

namespace fa4::ref {

// Tensors are contiguous BSHD: [batch][seq][heads][dim]. LSE is [batch][heads_q][seqlen_q].
struct Forward64 {
  std::vector<double> o;    // [batch][seqlen_q][heads_q][value_dim()]
  std::vector<double> lse;  // natural log; -inf for a row with no visible key (its O row is 0)
};

struct Backward64 {
  std::vector<double> dq, dk, dv;  // shaped like q, k, v (dv: value_dim() columns)
  std::vector<double> dsink;       // [heads_q] with a sink, else empty
};

// The scale applied to q·k: problem.softmax_scale, or 1/sqrt(head_dim) when that is 0.
double softmax_scale(const Problem& p);

// A scaled score as the softmax takes it: with p.softcap > 0, softcap * tanh(scaled / softcap),
// in T's arithmetic (double for the float64 reference, float for the plain 16-bit one).
template <class T>
T capped_score(const Problem& p, T scaled) {
  return p.softcap > 0.0f ? T(p.softcap) * std::tanh(scaled / T(p.softcap)) : scaled;
}
// d capped_score / d scaled: 1 - tanh^2 soft-capped, else 1.
template <class T>
T capped_slope(const Problem& p, T scaled) {
  if (!(p.softcap > 0.0f)) return T(1);
  const T t = std::tanh(scaled / T(p.softcap));
  return T(1) - t * t;
}

// Whether query i may attend key j under p's causal/window rules (bottom-right aligned): with
// shift = seqlen_k - seqlen_q, j >= i + shift - window_left (if window_left >= 0) and
// j <= i + shift + right, right = window_right (-1: unbounded), min(right, 0) when causal.
bool visible(const Problem& p, int64_t i, int64_t j);

// The KV head that query head h reads (GQA/MQA).
inline int64_t kv_head(const Problem& p, int64_t h) { return h / (p.heads_q / p.heads_kv); }

// Element counts of the contiguous tensors: q (and dq), k (dk); with value_dim() columns o (dout)
// and v (dv), which are q's and k's where head_dim_v is 0.
inline int64_t q_elems(const Problem& p) { return p.batch * p.seqlen_q * p.heads_q * p.head_dim; }
inline int64_t kv_elems(const Problem& p) { return p.batch * p.seqlen_k * p.heads_kv * p.head_dim; }
inline int64_t o_elems(const Problem& p) { return p.batch * p.seqlen_q * p.heads_q * p.value_dim(); }
inline int64_t v_elems(const Problem& p) { return p.batch * p.seqlen_k * p.heads_kv * p.value_dim(); }
inline int64_t lse_elems(const Problem& p) { return p.batch * p.heads_q * p.seqlen_q; }

// sink (optional: empty, or [heads_q]): each query head's sink logit (ForwardArgs::sink), a
// score every row of the head has beside its keys with no value (its P adds to the sum, not to O).
Forward64 forward(const Problem& p, const std::vector<double>& q, const std::vector<double>& k,
                  const std::vector<double>& v, const std::vector<double>& sink = {});

// One query row of forward() for problems too large to take whole (checks of sampled rows):
// float64 attention of query i of batch b, head h, under p's rules, from element readers
// q(b, s, h, d), k(b, s, kv_head, d), v(b, s, kv_head, d) of any layout and type. Writes
// value_dim() outputs to o and returns the row's natural-log LSE; -inf (o all 0) when no key is
// visible.
template <class Q, class K, class V>
double forward_row(const Problem& p, const Q& q, const K& k, const V& v, int64_t b, int64_t h, int64_t i,
                   double* o) {
  const int64_t hk = kv_head(p, h), dim = p.head_dim, dv = p.value_dim();
  const double scale = softmax_scale(p);
  std::vector<double> s(size_t(p.seqlen_k), -INFINITY);
  double m = -INFINITY;
  for (int64_t j = 0; j < p.seqlen_k; ++j) {
    if (!visible(p, i, j)) continue;
    double acc = 0;
    for (int64_t d = 0; d < dim; ++d) acc += double(q(b, i, h, d)) * double(k(b, j, hk, d));
    s[size_t(j)] = capped_score(p, acc * scale);
    m = std::max(m, s[size_t(j)]);
  }
  std::fill(o, o + dv, 0.0);
  if (m == -INFINITY) return -INFINITY;
  double sum = 0;
  for (int64_t j = 0; j < p.seqlen_k; ++j) {
    if (s[size_t(j)] == -INFINITY) continue;
    const double e = std::exp(s[size_t(j)] - m);
    sum += e;
    for (int64_t d = 0; d < dv; ++d) o[d] += e * double(v(b, j, hk, d));
  }
  for (int64_t d = 0; d < dv; ++d) o[d] /= sum;
  return m + std::log(sum);
}

// dout is shaped like o. The LSE is recomputed, not taken from a caller. With a sink, dsink[h] =
// -sum over the head's rows (every batch entry) of P_sink * D, D = rowsum(dO ∘ O).
Backward64 backward(const Problem& p, const std::vector<double>& q, const std::vector<double>& k,
                    const std::vector<double>& v, const std::vector<double>& dout,
                    const std::vector<double>& sink = {});

// The plain low-precision implementation (p.dtype): q, k, v rounded to the dtype; S = q·k summed
// in fp32 and scaled in fp32; softmax in fp32; P normalised and rounded to the dtype; O = P·V
// accumulated in fp32 and rounded to the dtype. LSE stays fp32. Values are returned as double.
Forward64 forward_lowp(const Problem& p, const std::vector<double>& q, const std::vector<double>& k,
                       const std::vector<double>& v, const std::vector<double>& sink = {});

// The same for the backward: inputs and dout rounded to the dtype, P as in forward_lowp (fp32,
// then rounded), O from forward_lowp; dV = Pᵀ·dO and dP = dO·Vᵀ in fp32; D = rowsum(dO∘O) in fp32;
// dS = P∘(dP − D) rounded to the dtype; dQ = scale·dS·K and dK = scale·dSᵀ·Q in fp32; dQ, dK, dV
// rounded to the dtype.
Backward64 backward_lowp(const Problem& p, const std::vector<double>& q,
                         const std::vector<double>& k, const std::vector<double>& v,
                         const std::vector<double>& dout, const std::vector<double>& sink = {});

// How far `out` is from `ref` (same size): max |out - ref| and ||out - ref|| / ||ref||. Entries
// where both are the same infinity count as equal; a NaN anywhere makes both NaN.
struct ErrorStats {
  double max_abs = 0.0;
  double rel_frobenius = 0.0;
  size_t max_at = 0;  // the index of an element at max_abs (0 where none differs)
};
ErrorStats error_stats(const std::vector<double>& out, const std::vector<double>& ref);

}  // namespace fa4::ref
