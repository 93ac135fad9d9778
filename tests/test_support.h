// Helpers shared by the test files.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/validate.h"
#include "fa4/attention.h"
#include "reference.h"

namespace fa4::test {

// Element n of a BSHD output of problem p (value_dim columns) as "b B row I head H col C".
inline std::string where_in_o(const Problem& p, size_t n) {
  const int64_t dv = p.value_dim(), c = int64_t(n) % dv, h = int64_t(n) / dv % p.heads_q,
                i = int64_t(n) / dv / p.heads_q % p.seqlen_q, b = int64_t(n) / dv / p.heads_q / p.seqlen_q;
  return "b " + std::to_string(b) + " row " + std::to_string(i) + " head " + std::to_string(h) + " col " +
         std::to_string(c);
}

// DESIGN.md §3's criterion for a forward's O (`got`) against the float64 reference of problem p
// on these inputs: no NaN, the largest error within twice the plain 16-bit forward's (+ 1e-3), the
// relative Frobenius error at most 1e-2. Returns the reference (its LSE for the caller's rows).
inline fa4::ref::Forward64 expect_forward_matches(const Problem& p, const std::vector<double>& q,
                                                  const std::vector<double>& k, const std::vector<double>& v,
                                                  const std::vector<double>& got,
                                                  const std::vector<double>& sink = {}) {
  fa4::ref::Forward64 ref = fa4::ref::forward(p, q, k, v, sink);
  const fa4::ref::Forward64 low = fa4::ref::forward_lowp(p, q, k, v, sink);
  const fa4::ref::ErrorStats e = fa4::ref::error_stats(got, ref.o);
  const fa4::ref::ErrorStats e_low = fa4::ref::error_stats(low.o, ref.o);
  EXPECT_FALSE(std::isnan(e.max_abs)) << "NaN in O: an element was not written or the math broke";
  EXPECT_LE(e.max_abs, 2.0 * e_low.max_abs + 1e-3) << "plain 16-bit max error " << e_low.max_abs << "; worst "
                                                    << where_in_o(p, e.max_at) << ": got " << got[e.max_at]
                                                    << ", float64 " << ref.o[e.max_at] << ", plain 16-bit "
                                                    << low.o[e.max_at];
  EXPECT_LE(e.rel_frobenius, 1e-2);
  return ref;
}

// A forward's LSE rows against the float64 reference's: `mismatch` counts the rows -inf in one and
// finite (or NaN) in the other, `max_err` is the largest difference among the rest.
struct LseCompare {
  int64_t mismatch = 0;
  double max_err = 0.0;
  void add(double ref, double got) {
    if (std::isinf(ref) || std::isinf(got) || std::isnan(got))
      mismatch += !(std::isinf(ref) && std::isinf(got) && ref < 0 && got < 0);
    else
      max_err = std::max(max_err, std::fabs(got - ref));
  }
};

// A distinct 16-byte-aligned address per tensor; never dereferenced (argument checks only).
inline void* fake(int i) { return reinterpret_cast<void*>(uintptr_t{0x7f0000000000} + uintptr_t(i) * 0x10000000); }

// A problem of these sizes and dtype; mask, window and scale keep Problem's defaults.
inline Problem make_problem(int64_t batch, int64_t sq, int64_t sk, int64_t hq, int64_t hkv, int64_t dim,
                            DType dtype = Problem{}.dtype) {
  Problem p;
  p.dtype = dtype;
  p.batch = batch;
  p.seqlen_q = sq;
  p.seqlen_k = sk;
  p.heads_q = hq;
  p.heads_kv = hkv;
  p.head_dim = dim;
  return p;
}

// Forward arguments of p over contiguous BSHD tensors at fake addresses (fake(0..3): q, k, v, o;
// fake(4): the LSE), for argument checks and parameter building on the host.
inline ForwardArgs fake_forward(const Problem& p) {
  ForwardArgs a;
  a.problem = p;
  a.q = bshd(fake(0), p.seqlen_q, p.heads_q, p.head_dim);
  a.k = bshd(fake(1), p.seqlen_k, p.heads_kv, p.head_dim);
  a.v = bshd(fake(2), p.seqlen_k, p.heads_kv, p.head_dim);
  a.o = bshd(fake(3), p.seqlen_q, p.heads_q, p.head_dim);
  a.lse = static_cast<float*>(fake(4));
  return a;
}

// A process-wide kernel switch (kGet / kSet: validate.h's) set to `on` for a scope; the setting
// before it (its environment variable's, or a test's) comes back at its end.
template <bool (*kGet)(), void (*kSet)(bool)>
class ScopedSwitch {
 public:
  explicit ScopedSwitch(bool on) : before_(kGet()) { kSet(on); }
  ~ScopedSwitch() { kSet(before_); }
  ScopedSwitch(const ScopedSwitch&) = delete;
  ScopedSwitch& operator=(const ScopedSwitch&) = delete;

 private:
  bool before_;
};
using BackwardD192 = ScopedSwitch<&fa4::detail::backward_d192, &fa4::detail::set_backward_d192>;
using ForwardV128 = ScopedSwitch<&fa4::detail::forward_v128, &fa4::detail::set_forward_v128>;
using BackwardV128 = ScopedSwitch<&fa4::detail::backward_v128, &fa4::detail::set_backward_v128>;

}  // namespace fa4::test
