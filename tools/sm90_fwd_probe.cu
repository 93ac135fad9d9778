// Kernel-level probe of the sm90 forward, below the public API: checks a list of shapes against
// a float64 attention on the CPU (sampled rows for FA3-sized problems) and times configurations
// side by side. For kernel development (cmake -DFA4_BUILD_PROBE=ON):
//   sm90_fwd_probe [check|time|ablate|all]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "common/fwd_params.h"
#include "common/validate.h"
#include "reference.h"
#include "sm90/fwd_launch.cuh"

using fa4::detail::FwdParams;

#define CK(x)                                                                  \
  do {                                                                         \
    cudaError_t e_ = (x);                                                      \
    if (e_ != cudaSuccess) {                                                   \
      std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
      std::exit(1);                                                            \
    }                                                                          \
  } while (0)

struct Shape {
  int b, hq, hkv, sq, sk, d;
  bool causal;
  int left = -1, right = -1;
};

static fa4::Problem problem_of(const Shape& s) {
  fa4::Problem p;
  p.dtype = fa4::DType::kBF16;
  p.batch = s.b;
  p.seqlen_q = s.sq;
  p.seqlen_k = s.sk;
  p.heads_q = s.hq;
  p.heads_kv = s.hkv;
  p.head_dim = s.d;
  p.causal = s.causal;
  p.window_left = s.left;
  p.window_right = s.right;
  return p;
}

// The kernel parameters the API would build for contiguous BSHD tensors (scale, window resolved).
static FwdParams make_params(const Shape& s, void* q, void* k, void* v, void* o, float* lse) {
  fa4::ForwardArgs a;
  a.problem = problem_of(s);
  a.q = fa4::bshd(q, s.sq, s.hq, s.d);
  a.k = fa4::bshd(k, s.sk, s.hkv, s.d);
  a.v = fa4::bshd(v, s.sk, s.hkv, s.d);
  a.o = fa4::bshd(o, s.sq, s.hq, s.d);
  a.lse = lse;
  return fa4::detail::make_fwd_params(a);
}

static bool check(const Shape& s, int row_step = 1) {
  const size_t nq = size_t(s.b) * s.sq * s.hq * s.d, nk = size_t(s.b) * s.sk * s.hkv * s.d;
  std::mt19937 rng(1234 + s.sq * 7 + s.sk);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<__nv_bfloat16> hq(nq), hk(nk), hv(nk), ho(nq);
  for (auto& x : hq) x = __float2bfloat16(nd(rng));
  for (auto& x : hk) x = __float2bfloat16(nd(rng));
  for (auto& x : hv) x = __float2bfloat16(nd(rng));
  void *dq, *dk, *dv, *dout;
  float* dlse;
  CK(cudaMalloc(&dq, nq * 2)); CK(cudaMalloc(&dk, nk * 2)); CK(cudaMalloc(&dv, nk * 2)); CK(cudaMalloc(&dout, nq * 2));
  CK(cudaMalloc(&dlse, size_t(s.b) * s.hq * s.sq * 4));
  CK(cudaMemcpy(dq, hq.data(), nq * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dk, hk.data(), nk * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dv, hv.data(), nk * 2, cudaMemcpyHostToDevice));
  CK(cudaMemset(dout, 0xFF, nq * 2));  // NaN poison
  CK(cudaMemset(dlse, 0xFF, size_t(s.b) * s.hq * s.sq * 4));
  FwdParams p = make_params(s, dq, dk, dv, dout, dlse);
  fa4::Status st = fa4::detail::sm90_forward(p, 0);
  if (!st.ok()) { std::printf("launch failed: %s\n", st.message.c_str()); return false; }
  CK(cudaDeviceSynchronize());
  std::vector<float> hlse(size_t(s.b) * s.hq * s.sq);
  CK(cudaMemcpy(ho.data(), dout, nq * 2, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(hlse.data(), dlse, hlse.size() * 4, cudaMemcpyDeviceToHost));
  double max_err = 0, max_lse_err = 0, ref_norm = 0, err_norm = 0;
  const fa4::Problem prob = problem_of(s);
  std::vector<double> sc(s.sk);
  for (int b = 0; b < s.b; ++b)
    for (int h = 0; h < s.hq; ++h) {
      const int hk_ = h / (s.hq / s.hkv);
      for (int i = (b * 7 + h * 3) % row_step; i < s.sq; i += row_step) {
        double mx = -INFINITY;
        for (int j = 0; j < s.sk; ++j) {
          if (!fa4::ref::visible(prob, i, j)) { sc[j] = -INFINITY; continue; }
          double acc = 0;
          for (int t = 0; t < s.d; ++t)
            acc += double(__bfloat162float(hq[((size_t(b) * s.sq + i) * s.hq + h) * s.d + t])) *
                   double(__bfloat162float(hk[((size_t(b) * s.sk + j) * s.hkv + hk_) * s.d + t]));
          sc[j] = acc / std::sqrt(double(s.d));
          mx = std::max(mx, sc[j]);
        }
        double sum = 0;
        for (int j = 0; j < s.sk; ++j) sum += (sc[j] == -INFINITY) ? 0.0 : std::exp(sc[j] - mx);
        const double lse = sum > 0 ? mx + std::log(sum) : -INFINITY;
        const float glse = hlse[(size_t(b) * s.hq + h) * s.sq + i];
        if (std::isinf(lse)) { if (!(std::isinf(glse) && glse < 0)) max_lse_err = INFINITY; }
        else max_lse_err = std::max(max_lse_err, std::fabs(glse - lse));
        for (int t = 0; t < s.d; ++t) {
          double acc = 0;
          for (int j = 0; j < s.sk; ++j)
            if (sc[j] != -INFINITY)
              acc += std::exp(sc[j] - mx) * double(__bfloat162float(hv[((size_t(b) * s.sk + j) * s.hkv + hk_) * s.d + t]));
          const double ref = sum > 0 ? acc / sum : 0.0;
          const double got = __bfloat162float(ho[((size_t(b) * s.sq + i) * s.hq + h) * s.d + t]);
          const double e = std::isnan(got) ? INFINITY : std::fabs(got - ref);
          max_err = std::max(max_err, e);
          ref_norm += ref * ref;
          err_norm += (std::isnan(got) ? 1e30 : (got - ref) * (got - ref));
        }
      }
    }
  const double rel = std::sqrt(err_norm / std::max(ref_norm, 1e-30));
  const bool ok = max_err < 2e-2 && rel < 1e-2 && max_lse_err < 1e-3;
  std::printf("%s%s b=%d hq=%d hkv=%d sq=%d sk=%d d=%d causal=%d win=(%d,%d): max|err|=%.3g rel=%.3g lse=%.3g\n",
              ok ? "PASS" : "FAIL", row_step > 1 ? "(sampled rows)" : "", s.b, s.hq, s.hkv, s.sq, s.sk, s.d, s.causal, s.left, s.right, max_err, rel, max_lse_err);
  cudaFree(dq); cudaFree(dk); cudaFree(dv); cudaFree(dout); cudaFree(dlse);
  return ok;
}

using Launcher = fa4::Status (*)(const FwdParams&, cudaStream_t);

struct Variant {
  int schedule;
  const char* name;
  int d;
  Launcher fn;
  float threshold;
};

template <int D, int N, int S, int Poly, int C = 2, bool Sched = true, bool DoubleP = true>
fa4::Status run_cfg(const FwdParams& p, cudaStream_t s) {
  return fa4::sm90::launch_forward<fa4::sm90::FwdConfig<D, N, S, true, Poly, C, Sched, DoubleP>>(p, s);
}

static void time_shape(int d, int seqlen, bool causal, const Variant* var = nullptr) {
  Shape s{16384 / seqlen, 2048 / d, 2048 / d, seqlen, seqlen, d, causal};
  const size_t n = size_t(s.b) * seqlen * s.hq * d;
  void *q, *k, *v, *o;
  CK(cudaMalloc(&q, n * 2)); CK(cudaMalloc(&k, n * 2)); CK(cudaMalloc(&v, n * 2)); CK(cudaMalloc(&o, n * 2));
  // Independent random q, k and v (q = k would make every score row peak on its diagonal and
  // lower the tensor cores' switching: both flatter the timing).
  std::vector<__nv_bfloat16> h(n);
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  for (void* dst : {q, k, v}) {
    for (auto& x : h) x = __float2bfloat16(nd(rng));
    CK(cudaMemcpy(dst, h.data(), n * 2, cudaMemcpyHostToDevice));
  }
  FwdParams p = make_params(s, q, k, v, o, nullptr);
  Launcher fn = fa4::detail::sm90_forward;
  if (var) {
    fn = var->fn;
    p.rescale_threshold = var->threshold;
    p.schedule = var->schedule;
  }
  cudaEvent_t a, bev;
  cudaEventCreate(&a); cudaEventCreate(&bev);
  for (int i = 0; i < 5; ++i) fn(p, 0);
  std::vector<float> ms;
  for (int i = 0; i < 30; ++i) {
    cudaEventRecord(a);
    fn(p, 0);
    cudaEventRecord(bev);
    cudaEventSynchronize(bev);
    float t; cudaEventElapsedTime(&t, a, bev); ms.push_back(t);
  }
  CK(cudaGetLastError());
  std::sort(ms.begin(), ms.end());
  const double flops = 4.0 * s.b * s.hq * double(seqlen) * seqlen * d * (causal ? 0.5 : 1.0);
  std::printf("TIME %s d=%d seqlen=%d causal=%d: %.3f ms  %.1f TFLOP/s\n", var ? var->name : "default", d, seqlen, causal, ms[ms.size() / 2],
              flops / (ms[ms.size() / 2] * 1e-3) / 1e12);
  cudaFree(q); cudaFree(k); cudaFree(v); cudaFree(o);
}

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "all";
  int fails = 0;
  if (std::strcmp(mode, "time") != 0) {
    const Shape shapes[] = {
        {1, 1, 1, 128, 128, 128, false}, {1, 2, 1, 128, 256, 64, false}, {1, 2, 2, 200, 333, 128, false},
        {2, 4, 1, 17, 239, 256, false},  {1, 2, 2, 256, 256, 128, true}, {1, 2, 1, 239, 1000, 64, true},
        {1, 2, 2, 1000, 239, 128, true}, {1, 1, 1, 1, 1, 64, false},     {1, 8, 2, 300, 300, 256, true},
        {1, 2, 2, 513, 700, 128, false, 100, 20}, {1, 3, 3, 129, 4097, 64, false},
        {2, 16, 4, 700, 900, 64, true}, {3, 12, 12, 333, 333, 128, false},
    };
    for (const Shape& s : shapes) fails += !check(s);
    // FA3-sized problems, every 97th query row checked.
    for (int d : {64, 128, 256})
      for (bool causal : {false, true}) fails += !check(Shape{1, 2, 2, 16384, 16384, d, causal}, 97);
  }
  if (std::strcmp(mode, "check") != 0 && std::strcmp(mode, "ablate") != 0) {
    for (int d : {64, 128, 256})
      for (bool causal : {false, true})
        for (int seqlen : {512, 1024, 2048, 4096, 8192, 16384}) time_shape(d, seqlen, causal);
  }
  if (std::strcmp(mode, "ablate") == 0 || std::strcmp(mode, "all") == 0) {
    static const Variant variants[] = {
        {1, "d64_s_first", 64, run_cfg<64, 128, 4, 0, 3, false>, 8.0f},
        {1, "d128_s_first_1p", 128, run_cfg<128, 128, 2, 0, 2, false, false>, 8.0f},
        {1, "d128_s_first_2p", 128, run_cfg<128, 128, 2, 0, 2, false, true>, 8.0f},
        {1, "d256_s_first", 256, run_cfg<256, 80, 2, 0, 2, false>, 8.0f},
    };
    for (const Variant& v : variants)
      for (bool causal : {false, true})
        for (int seqlen : {512, 2048, 4096, 16384}) time_shape(v.d, seqlen, causal, &v);
  }
  std::printf("%d failed\n", fails);
  return fails ? 1 : 0;
}
