// Helpers shared by the test files.
#pragma once

#include <cstdint>

#include "fa4/attention.h"

namespace fa4::test {

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

}  // namespace fa4::test
