// Helpers shared by the test files.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "fa4/attention.h"

namespace fa4::test {

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

}  // namespace fa4::test
