// Float64 CPU reference: the textbook formulas, one (batch, head, query row) at a time.
#include "reference.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "convert.h"

namespace fa4::ref {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Offsets into contiguous BSHD tensors.
int64_t q_index(const Problem& p, int64_t b, int64_t i, int64_t h) {
  return ((b * p.seqlen_q + i) * p.heads_q + h) * p.head_dim;
}
int64_t kv_index(const Problem& p, int64_t b, int64_t j, int64_t hk) {
  return ((b * p.seqlen_k + j) * p.heads_kv + hk) * p.head_dim;
}
// The same on the value side: o and dout, v and dv (value_dim() columns).
int64_t o_index(const Problem& p, int64_t b, int64_t i, int64_t h) {
  return ((b * p.seqlen_q + i) * p.heads_q + h) * p.value_dim();
}
int64_t v_index(const Problem& p, int64_t b, int64_t j, int64_t hk) {
  return ((b * p.seqlen_k + j) * p.heads_kv + hk) * p.value_dim();
}
int64_t lse_index(const Problem& p, int64_t b, int64_t h, int64_t i) {
  return (b * p.heads_q + h) * p.seqlen_q + i;
}

// One query row's softmax over the keys (and head h's sink logit, where sink is not empty): P (0
// where a key is invisible) and the natural-log LSE. Returns false, with P all 0 and LSE -inf, when
// the row sees no key and has no sink (with a sink alone: P all 0, LSE the sink).
bool softmax_row64(const Problem& p, const std::vector<double>& q, const std::vector<double>& k,
                   int64_t b, int64_t h, int64_t i, std::vector<double>& prob, double& lse,
                   const std::vector<double>& sink) {
  const double scale = softmax_scale(p);
  const int64_t hk = kv_head(p, h);
  const double* qi = &q[q_index(p, b, i, h)];
  prob.assign(p.seqlen_k, 0.0);
  std::vector<double> s(p.seqlen_k, -kInf);
  double m = -kInf;
  for (int64_t j = 0; j < p.seqlen_k; ++j) {
    if (!visible(p, i, j)) continue;
    const double* kj = &k[kv_index(p, b, j, hk)];
    double dot = 0.0;
    for (int64_t d = 0; d < p.head_dim; ++d) dot += qi[d] * kj[d];
    s[j] = capped_score(p, scale * dot);
    m = std::max(m, s[j]);
  }
  if (!sink.empty()) m = std::max(m, sink[size_t(h)]);
  if (m == -kInf) {
    lse = -kInf;
    return false;
  }
  double l = sink.empty() ? 0.0 : std::exp(sink[size_t(h)] - m);
  for (int64_t j = 0; j < p.seqlen_k; ++j)
    if (s[j] != -kInf) l += std::exp(s[j] - m);
  for (int64_t j = 0; j < p.seqlen_k; ++j)
    if (s[j] != -kInf) prob[j] = std::exp(s[j] - m) / l;
  lse = m + std::log(l);
  return true;
}

}  // namespace

double softmax_scale(const Problem& p) {
  return p.softmax_scale == 0.0f ? 1.0 / std::sqrt(static_cast<double>(p.head_dim))
                                 : static_cast<double>(p.softmax_scale);
}

bool visible(const Problem& p, int64_t i, int64_t j) {
  const int64_t diag = i + p.seqlen_k - p.seqlen_q;  // the key on query i's bottom-right diagonal
  int64_t right = p.window_right;
  if (p.causal) right = right < 0 ? 0 : std::min<int64_t>(right, 0);
  if (right >= 0 && j > diag + right) return false;
  if (p.window_left >= 0 && j < diag - p.window_left) return false;
  return true;
}

Forward64 forward(const Problem& p, const std::vector<double>& q, const std::vector<double>& k,
                  const std::vector<double>& v, const std::vector<double>& sink) {
  Forward64 out;
  out.o.assign(o_elems(p), 0.0);
  out.lse.assign(lse_elems(p), -kInf);
  std::vector<double> prob;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h)
      for (int64_t i = 0; i < p.seqlen_q; ++i) {
        double lse;
        if (!softmax_row64(p, q, k, b, h, i, prob, lse, sink)) continue;  // O row stays 0
        out.lse[lse_index(p, b, h, i)] = lse;
        double* oi = &out.o[o_index(p, b, i, h)];
        for (int64_t j = 0; j < p.seqlen_k; ++j) {
          if (prob[j] == 0.0) continue;
          const double* vj = &v[v_index(p, b, j, kv_head(p, h))];
          for (int64_t d = 0; d < p.value_dim(); ++d) oi[d] += prob[j] * vj[d];
        }
      }
  return out;
}

Backward64 backward(const Problem& p, const std::vector<double>& q, const std::vector<double>& k,
                    const std::vector<double>& v, const std::vector<double>& dout,
                    const std::vector<double>& sink) {
  const double scale = softmax_scale(p);
  const int64_t dim = p.head_dim, dim_v = p.value_dim();
  Backward64 g;
  g.dq.assign(q_elems(p), 0.0);
  g.dk.assign(kv_elems(p), 0.0);
  g.dv.assign(v_elems(p), 0.0);
  if (!sink.empty()) g.dsink.assign(size_t(p.heads_q), 0.0);
  std::vector<double> prob, o(dim_v), dp(p.seqlen_k);
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h)
      for (int64_t i = 0; i < p.seqlen_q; ++i) {
        double lse;
        if (!softmax_row64(p, q, k, b, h, i, prob, lse, sink)) continue;  // no key: no gradient
        const int64_t hk = kv_head(p, h);
        const double* qi = &q[q_index(p, b, i, h)];
        const double* doi = &dout[o_index(p, b, i, h)];
        // O_i, then D_i = rowsum(dO_i ∘ O_i).
        std::fill(o.begin(), o.end(), 0.0);
        for (int64_t j = 0; j < p.seqlen_k; ++j) {
          const double* vj = &v[v_index(p, b, j, hk)];
          for (int64_t d = 0; d < dim_v; ++d) o[d] += prob[j] * vj[d];
        }
        double D = 0.0;
        for (int64_t d = 0; d < dim_v; ++d) D += doi[d] * o[d];
        // The sink's score: dS_sink = P_sink (0 - D), its value being 0.
        if (!sink.empty()) g.dsink[size_t(h)] -= std::exp(sink[size_t(h)] - lse) * D;
        double* dqi = &g.dq[q_index(p, b, i, h)];
        for (int64_t j = 0; j < p.seqlen_k; ++j) {
          if (!visible(p, i, j)) continue;
          const int64_t kvo = kv_index(p, b, j, hk), vo = v_index(p, b, j, hk);
          double dpj = 0.0, qk = 0.0;  // dP_ij = dO_i · V_j
          for (int64_t d = 0; d < dim_v; ++d) dpj += doi[d] * v[vo + d];
          for (int64_t d = 0; d < dim; ++d) qk += qi[d] * k[kvo + d];
          // dS_ij = P_ij (dP_ij - D_i), through the soft cap's tanh where there is one
          const double ds = prob[j] * (dpj - D) * capped_slope(p, scale * qk);
          for (int64_t d = 0; d < dim_v; ++d) g.dv[vo + d] += prob[j] * doi[d];  // dV_j += P_ij dO_i
          for (int64_t d = 0; d < dim; ++d) {
            dqi[d] += scale * ds * k[kvo + d];    // dQ_i += scale dS_ij K_j
            g.dk[kvo + d] += scale * ds * qi[d];  // dK_j += scale dS_ij Q_i
          }
        }
      }
  return g;
}

namespace {

// One row of the low-precision plain implementation: P rounded to the dtype (0 where invisible),
// the fp32 LSE. Inputs are already rounded. Returns false when the row sees no key.
bool softmax_row_lowp(const Problem& p, const std::vector<float>& q, const std::vector<float>& k,
                      int64_t b, int64_t h, int64_t i, std::vector<float>& prob, float& lse,
                      const std::vector<double>& sink) {
  const float scale = static_cast<float>(softmax_scale(p));
  const int64_t hk = kv_head(p, h);
  const float* qi = &q[q_index(p, b, i, h)];
  prob.assign(p.seqlen_k, 0.0f);
  std::vector<float> s(p.seqlen_k, -INFINITY);
  float m = -INFINITY;
  for (int64_t j = 0; j < p.seqlen_k; ++j) {
    if (!visible(p, i, j)) continue;
    const float* kj = &k[kv_index(p, b, j, hk)];
    float dot = 0.0f;  // 16-bit products are exact in fp32; the sum rounds in fp32
    for (int64_t d = 0; d < p.head_dim; ++d) dot += qi[d] * kj[d];
    s[j] = capped_score(p, dot * scale);
    m = std::max(m, s[j]);
  }
  const float sk = sink.empty() ? -INFINITY : static_cast<float>(sink[size_t(h)]);
  m = std::max(m, sk);
  if (m == -INFINITY) {
    lse = -INFINITY;
    return false;
  }
  float l = sink.empty() ? 0.0f : std::exp(sk - m);
  for (int64_t j = 0; j < p.seqlen_k; ++j)
    if (s[j] != -INFINITY) l += std::exp(s[j] - m);
  for (int64_t j = 0; j < p.seqlen_k; ++j)
    if (s[j] != -INFINITY) prob[j] = round_to(p.dtype, std::exp(s[j] - m) / l);
  lse = m + std::log(l);
  return true;
}

std::vector<float> rounded_f32(DType t, const std::vector<double>& x) {
  std::vector<float> out(x.size());
  for (size_t n = 0; n < x.size(); ++n) out[n] = round_to(t, static_cast<float>(x[n]));
  return out;
}

}  // namespace

Forward64 forward_lowp(const Problem& p, const std::vector<double>& q64,
                       const std::vector<double>& k64, const std::vector<double>& v64,
                       const std::vector<double>& sink) {
  const std::vector<float> q = rounded_f32(p.dtype, q64), k = rounded_f32(p.dtype, k64),
                           v = rounded_f32(p.dtype, v64);
  Forward64 out;
  out.o.assign(o_elems(p), 0.0);
  out.lse.assign(lse_elems(p), -kInf);
  std::vector<float> prob, acc(p.value_dim());
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h)
      for (int64_t i = 0; i < p.seqlen_q; ++i) {
        float lse;
        if (!softmax_row_lowp(p, q, k, b, h, i, prob, lse, sink)) continue;
        out.lse[lse_index(p, b, h, i)] = lse;
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (int64_t j = 0; j < p.seqlen_k; ++j) {
          if (prob[j] == 0.0f) continue;
          const float* vj = &v[v_index(p, b, j, kv_head(p, h))];
          for (int64_t d = 0; d < p.value_dim(); ++d) acc[d] += prob[j] * vj[d];
        }
        double* oi = &out.o[o_index(p, b, i, h)];
        for (int64_t d = 0; d < p.value_dim(); ++d) oi[d] = round_to(p.dtype, acc[d]);
      }
  return out;
}

Backward64 backward_lowp(const Problem& p, const std::vector<double>& q64,
                         const std::vector<double>& k64, const std::vector<double>& v64,
                         const std::vector<double>& dout64, const std::vector<double>& sink) {
  const DType t = p.dtype;
  const std::vector<float> q = rounded_f32(t, q64), k = rounded_f32(t, k64),
                           v = rounded_f32(t, v64), dout = rounded_f32(t, dout64);
  const std::vector<float> o = rounded_f32(t, forward_lowp(p, q64, k64, v64, sink).o);
  const float scale = static_cast<float>(softmax_scale(p));
  const int64_t dim = p.head_dim, dim_v = p.value_dim();
  std::vector<float> dq(q.size(), 0.0f), dk(k.size(), 0.0f), dv(v.size(), 0.0f), prob;
  std::vector<float> dsink(sink.size(), 0.0f);
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h)
      for (int64_t i = 0; i < p.seqlen_q; ++i) {
        float lse;
        if (!softmax_row_lowp(p, q, k, b, h, i, prob, lse, sink)) continue;
        const int64_t hk = kv_head(p, h);
        const int64_t qo = q_index(p, b, i, h), oo = o_index(p, b, i, h);
        float D = 0.0f;
        for (int64_t d = 0; d < dim_v; ++d) D += dout[oo + d] * o[oo + d];
        if (!sink.empty()) dsink[size_t(h)] -= std::exp(static_cast<float>(sink[size_t(h)]) - lse) * D;
        for (int64_t j = 0; j < p.seqlen_k; ++j) {
          if (!visible(p, i, j)) continue;
          const int64_t kvo = kv_index(p, b, j, hk), vo = v_index(p, b, j, hk);
          float dpj = 0.0f, qk = 0.0f;
          for (int64_t d = 0; d < dim_v; ++d) dpj += dout[oo + d] * v[vo + d];
          for (int64_t d = 0; d < dim; ++d) qk += q[qo + d] * k[kvo + d];
          const float ds = round_to(t, prob[j] * (dpj - D) * capped_slope(p, qk * scale));
          for (int64_t d = 0; d < dim_v; ++d) dv[vo + d] += prob[j] * dout[oo + d];
          for (int64_t d = 0; d < dim; ++d) {
            dq[qo + d] += scale * ds * k[kvo + d];
            dk[kvo + d] += scale * ds * q[qo + d];
          }
        }
      }
  Backward64 g;
  auto finish = [t](const std::vector<float>& x) {
    std::vector<double> out(x.size());
    for (size_t n = 0; n < x.size(); ++n) out[n] = round_to(t, x[n]);
    return out;
  };
  g.dq = finish(dq);
  g.dk = finish(dk);
  g.dv = finish(dv);
  g.dsink.assign(dsink.begin(), dsink.end());
  return g;
}

ErrorStats error_stats(const std::vector<double>& out, const std::vector<double>& ref) {
  if (out.size() != ref.size()) return {kInf, kInf};
  ErrorStats e;
  double diff2 = 0.0, ref2 = 0.0;
  for (size_t n = 0; n < out.size(); ++n) {
    if (std::isnan(out[n]) || std::isnan(ref[n])) {
      const double nan = std::numeric_limits<double>::quiet_NaN();
      return {nan, nan};
    }
    if (std::isfinite(ref[n])) ref2 += ref[n] * ref[n];
    if (out[n] == ref[n]) continue;  // also the same infinity on both sides
    const double d = std::fabs(out[n] - ref[n]);
    if (d > e.max_abs) e.max_abs = d, e.max_at = n;
    diff2 += d * d;
  }
  e.rel_frobenius = diff2 == 0.0 ? 0.0 : (ref2 == 0.0 ? kInf : std::sqrt(diff2 / ref2));
  return e;
}

}  // namespace fa4::ref
