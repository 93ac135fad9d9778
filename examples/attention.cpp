// fa4 from C++, start to finish: a causal GQA forward with its LSE, then the backward, on device
// memory from cudaMalloc, with every status checked. The forward's output is compared on a few rows
// with attention computed here in double precision.
//
//   build/fa4-example     exit 0: checked; 77: no Hopper GPU here (skipped); 1: failed
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <tuple>
#include <utility>
#include <vector>

#include <cuda_runtime.h>

#include "fa4/attention.h"

namespace {

constexpr int kSkip = 77;  // ctest's "skipped"

// bf16 <-> float (round to nearest even), so the example needs no CUDA header beyond the runtime.
uint16_t to_bf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return uint16_t((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
float from_bf16(uint16_t b) {
  const uint32_t u = uint32_t(b) << 16;
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

bool cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
  return e == cudaSuccess;
}

}  // namespace

int main() {
  const int batch = 2, seqlen_q = 256, seqlen_k = 256, heads_q = 8, heads_kv = 2, head_dim = 128;
  const size_t nq = size_t(batch) * seqlen_q * heads_q * head_dim, nk = size_t(batch) * seqlen_k * heads_kv * head_dim;

  // Random inputs, as bf16 bits on the host.
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<uint16_t> q(nq), k(nk), v(nk), dout(nq);
  for (auto* x : {&q, &dout})
    for (uint16_t& e : *x) e = to_bf16(normal(rng));
  for (auto* x : {&k, &v})
    for (uint16_t& e : *x) e = to_bf16(normal(rng));

  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("skipped: no CUDA device here (this example needs a Hopper GPU)\n");
    return kSkip;
  }
  // Device buffers: BSHD tensors, the LSE, gradients.
  void *d_q = nullptr, *d_k = nullptr, *d_v = nullptr, *d_o = nullptr, *d_dout = nullptr;
  void *d_dq = nullptr, *d_dk = nullptr, *d_dv = nullptr;
  float* d_lse = nullptr;
  for (auto [p, n] : {std::pair{&d_q, nq}, {&d_o, nq}, {&d_dout, nq}, {&d_dq, nq}, {&d_k, nk}, {&d_v, nk},
                      {&d_dk, nk}, {&d_dv, nk}})
    if (!cuda_ok(cudaMalloc(p, n * 2), "cudaMalloc")) return 1;
  if (!cuda_ok(cudaMalloc(&d_lse, size_t(batch) * heads_q * seqlen_q * 4), "cudaMalloc")) return 1;
  for (auto [dst, src, n] : {std::tuple{d_q, &q, nq}, {d_k, &k, nk}, {d_v, &v, nk}, {d_dout, &dout, nq}})
    if (!cuda_ok(cudaMemcpy(dst, src->data(), n * 2, cudaMemcpyHostToDevice), "cudaMemcpy")) return 1;

  // Forward.
  fa4::ForwardArgs args;
  args.problem.dtype = fa4::DType::kBF16;
  args.problem.batch = batch;
  args.problem.seqlen_q = seqlen_q;
  args.problem.seqlen_k = seqlen_k;
  args.problem.heads_q = heads_q;
  args.problem.heads_kv = heads_kv;  // GQA: 4 query heads a KV head
  args.problem.head_dim = head_dim;
  args.problem.causal = true;
  args.q = fa4::bshd(d_q, seqlen_q, heads_q, head_dim);
  args.k = fa4::bshd(d_k, seqlen_k, heads_kv, head_dim);
  args.v = fa4::bshd(d_v, seqlen_k, heads_kv, head_dim);
  args.o = fa4::bshd(d_o, seqlen_q, heads_q, head_dim);
  args.lse = d_lse;
  fa4::Status s = fa4::forward(args, nullptr);
  if (s.code == fa4::StatusCode::kNoDevice) {  // a GPU, but not a Hopper one
    std::printf("fa4: %s: %s\nskipped: this example needs a Hopper GPU\n", fa4::to_string(s.code), s.message.c_str());
    return kSkip;
  }
  if (!s.ok()) {
    std::fprintf(stderr, "fa4::forward: %s: %s\n", fa4::to_string(s.code), s.message.c_str());
    return 1;
  }

  // Backward: the forward's O and LSE in, dQ, dK, dV out, with the workspace it asks for.
  fa4::BackwardArgs b;
  b.problem = args.problem;
  b.q = args.q, b.k = args.k, b.v = args.v, b.o = args.o, b.lse = d_lse;
  b.dout = fa4::bshd(d_dout, seqlen_q, heads_q, head_dim);
  b.dq = fa4::bshd(d_dq, seqlen_q, heads_q, head_dim);
  b.dk = fa4::bshd(d_dk, seqlen_k, heads_kv, head_dim);
  b.dv = fa4::bshd(d_dv, seqlen_k, heads_kv, head_dim);
  s = fa4::backward_workspace_size(b, &b.workspace_bytes);
  if (s.ok() && !cuda_ok(cudaMalloc(&b.workspace, b.workspace_bytes), "workspace")) return 1;
  if (s.ok()) s = fa4::backward(b, nullptr);
  if (!s.ok()) {
    std::fprintf(stderr, "fa4::backward: %s: %s\n", fa4::to_string(s.code), s.message.c_str());
    return 1;
  }
  if (!cuda_ok(cudaDeviceSynchronize(), "synchronize")) return 1;

  // O on a few rows against attention in double precision (bottom-right causal: seqlen_q ==
  // seqlen_k, so query i sees keys 0..i); every gradient finite.
  std::vector<uint16_t> o(nq), dq(nq), dk(nk), dv(nk);
  for (auto [dst, src] : {std::pair{&o, d_o}, {&dq, d_dq}, {&dk, d_dk}, {&dv, d_dv}})
    if (!cuda_ok(cudaMemcpy(dst->data(), src, dst->size() * 2, cudaMemcpyDeviceToHost), "cudaMemcpy")) return 1;
  const double scale = 1.0 / std::sqrt(double(head_dim));
  double max_err = 0;
  for (int bi = 0; bi < batch; ++bi)
    for (int h = 0; h < heads_q; h += 3)
      for (int i : {0, 1, 100, seqlen_q - 1}) {
        const int hk = h / (heads_q / heads_kv);
        auto at = [&](const std::vector<uint16_t>& t, int seq, int heads, int row, int head, int d) {
          return double(from_bf16(t[((size_t(bi) * seq + row) * heads + head) * head_dim + d]));
        };
        std::vector<double> p(i + 1);
        double m = -INFINITY, sum = 0;
        for (int j = 0; j <= i; ++j) {
          double dot = 0;
          for (int d = 0; d < head_dim; ++d) dot += at(q, seqlen_q, heads_q, i, h, d) * at(k, seqlen_k, heads_kv, j, hk, d);
          p[j] = dot * scale;
          m = std::max(m, p[j]);
        }
        for (double& x : p) sum += (x = std::exp(x - m));
        for (int d = 0; d < head_dim; ++d) {
          double ref = 0;
          for (int j = 0; j <= i; ++j) ref += p[j] / sum * at(v, seqlen_k, heads_kv, j, hk, d);
          max_err = std::max(max_err, std::fabs(at(o, seqlen_q, heads_q, i, h, d) - ref));
        }
      }
  bool finite = true;
  for (const auto* t : {&dq, &dk, &dv})
    for (uint16_t x : *t) finite = finite && std::isfinite(from_bf16(x));
  std::printf("forward: max |O - O_ref| = %.3g on the rows checked (bf16 output); backward: gradients %s\n",
              max_err, finite ? "finite" : "NOT FINITE");
  for (void* p : {d_q, d_k, d_v, d_o, d_dout, d_dq, d_dk, d_dv, b.workspace}) cudaFree(p);
  cudaFree(d_lse);
  return max_err < 2e-2 && finite ? 0 : 1;
}
