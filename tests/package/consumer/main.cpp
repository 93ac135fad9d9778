// Calls fa4 through its installed header and library without touching a GPU: argument checks and
// the backward's workspace size. Prints what it got; exit status 0 when both are as documented.
#include <cstdint>
#include <cstdio>

#include "fa4/attention.h"

int main() {
  void* fake = reinterpret_cast<void*>(uintptr_t{0x7f0000000000});
  fa4::ForwardArgs a;
  a.problem.dtype = fa4::DType::kBF16;
  a.problem.batch = 2, a.problem.seqlen_q = 100, a.problem.seqlen_k = 100;
  a.problem.heads_q = 8, a.problem.heads_kv = 2, a.problem.head_dim = 100;
  a.q = fa4::bshd(fake, 100, 8, 100), a.k = fa4::bshd(fake, 100, 2, 100), a.v = fa4::bshd(fake, 100, 2, 100);
  a.o = fa4::bshd(fake, 100, 8, 100);
  const fa4::Status bad = fa4::validate(a);
  std::printf("validate: %s: %s\n", fa4::to_string(bad.code), bad.message.c_str());

  fa4::BackwardArgs b;
  b.problem = a.problem;
  b.problem.head_dim = 128;
  for (fa4::TensorRef* t : {&b.q, &b.o, &b.dout, &b.dq}) *t = fa4::bshd(fake, 100, 8, 128);
  for (fa4::TensorRef* t : {&b.k, &b.v, &b.dk, &b.dv}) *t = fa4::bshd(fake, 100, 2, 128);
  b.lse = static_cast<float*>(fake);
  size_t bytes = 0;
  const fa4::Status ws = fa4::backward_workspace_size(b, &bytes);
  std::printf("backward_workspace_size: %s, %zu bytes\n", fa4::to_string(ws.code), bytes);
  // batch x round_up(seqlen_q, 128) x heads_q x (kernel head dim + 2) x 4 (README, "Using it from C++")
  const size_t expect = size_t(2) * 128 * 8 * (128 + 2) * 4;
  return bad.code == fa4::StatusCode::kInvalidArgument && ws.ok() && bytes == expect ? 0 : 1;
}
