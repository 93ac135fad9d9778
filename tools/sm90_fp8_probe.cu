// The fp8 forward's variants, measured: FA3's shapes (16k tokens a batch, hidden 2048), head dims
// 64, 128 and 256, causal and not: the shipped kernel, the same with the row max's other form
// (FwdParams::fp8_raw_max: over the raw scores scaled once, or over the scaled scores), and each
// other built software exp2 share (FwdParams::exp2_poly_every: 0 = every exponential on MUFU, n =
// every n-th 8-key chunk of a thread's S on the FMA pipe), timed in alternating rounds in one
// process (CUDA events, median of each variant's rounds), each variant's output compared with the
// first's.
//
//   sm90_fp8_probe [seqlens, default 1024,4096,16384] [rounds, default 5]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include "common/fwd_params.h"
#include "common/validate.h"
#include "probe_util.cuh"

namespace {

__global__ void to_e4m3(const __nv_bfloat16* x, __nv_fp8_e4m3* y, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    y[i] = __nv_fp8_e4m3(__bfloat162float(x[i]));
}

double max_diff(const std::vector<__nv_bfloat16>& a, const std::vector<__nv_bfloat16>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i)
    m = std::max(m, std::abs(double(__bfloat162float(a[i])) - double(__bfloat162float(b[i]))));
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> seqlens = {1024, 4096, 16384};
  if (argc > 1) {
    seqlens.clear();
    for (std::string s = argv[1]; !s.empty();) {
      const size_t c = s.find(',');
      seqlens.push_back(std::stoi(s.substr(0, c)));
      s = c == std::string::npos ? "" : s.substr(c + 1);
    }
  }
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 5;
  struct Variant {
    int share;
    bool static_tiles;
    int raw_max = -1;  // FwdParams::fp8_raw_max
  };
  std::printf("d,seqlen,causal,share,static_tiles,raw_max,ms,tflops,max_diff_vs_first\n");
  for (int d : {64, 128, 256})
    for (int s : seqlens)
      for (bool causal : {false, true}) {
        const int b = std::max(1, 16384 / s), h = 2048 / d;
        const size_t n = size_t(b) * s * h * d;
        __nv_bfloat16* tmp;
        __nv_fp8_e4m3 *q, *k, *v;
        __nv_bfloat16* o;
        CK(cudaMalloc(&tmp, n * 2));
        CK(cudaMalloc(&q, n));
        CK(cudaMalloc(&k, n));
        CK(cudaMalloc(&v, n));
        CK(cudaMalloc(&o, n * 2));
        for (int i = 0; i < 3; ++i) {
          fill_device(tmp, n, 17u + i + 3u * s + d);
          to_e4m3<<<1024, 256>>>(tmp, i == 0 ? q : i == 1 ? k : v, n);
          CK(cudaGetLastError());
        }
        fa4::ForwardArgs a = bshd_forward_args(b, h, s, d, causal, q, k, v, o);
        a.problem.dtype = fa4::DType::kE4M3;
        const fa4::Status st = fa4::validate(a);
        if (!st.ok()) {
          std::printf("invalid: %s\n", st.message.c_str());
          return 1;
        }
        fa4::detail::FwdParams p = fa4::detail::make_fwd_params(a);
        // The shipped kernel first (the reference for max_diff), then the row max's other form,
        // then each other share.
        const int shipped = d == 256 ? 0 : 4;
        std::vector<Variant> shares = {{shipped, false, -1}, {shipped, false, d == 128 ? 0 : 1}};
        for (int every : {0, 4, 8})
          if (every != shipped && (every != 8 || d != 256)) shares.push_back({every, false});
        auto set = [&](const Variant& x) {
          p.exp2_poly_every = x.share, p.fp8_static_tiles = x.static_tiles, p.fp8_raw_max = x.raw_max;
        };
        std::vector<std::vector<__nv_bfloat16>> outs;
        for (const Variant& every : shares) {
          set(every);
          CK(cudaMemset(o, 0xFF, n * 2));
          const fa4::Status r = fa4::detail::sm90_forward_fp8(p, nullptr);
          if (!r.ok()) {
            std::printf("share %d: %s\n", every.share, r.message.c_str());
            return 1;
          }
          CK(cudaDeviceSynchronize());
          outs.emplace_back(n);
          CK(cudaMemcpy(outs.back().data(), o, n * 2, cudaMemcpyDeviceToHost));
        }
        std::vector<std::vector<float>> ms(std::size(shares));
        cudaEvent_t e0, e1;
        CK(cudaEventCreate(&e0));
        CK(cudaEventCreate(&e1));
        for (int r = 0; r < rounds; ++r)
          for (size_t i = 0; i < std::size(shares); ++i) {
            set(shares[(i + r) % std::size(shares)]);
            for (int w = 0; w < 3; ++w) fa4::detail::sm90_forward_fp8(p, nullptr);
            const int reps = 10;
            CK(cudaEventRecord(e0));
            for (int w = 0; w < reps; ++w) fa4::detail::sm90_forward_fp8(p, nullptr);
            CK(cudaEventRecord(e1));
            CK(cudaEventSynchronize(e1));
            float t = 0;
            CK(cudaEventElapsedTime(&t, e0, e1));
            ms[(i + r) % std::size(shares)].push_back(t / reps);
          }
        const double flops = 4.0 * b * h * double(s) * s * d / (causal ? 2 : 1);
        for (size_t i = 0; i < std::size(shares); ++i) {
          std::sort(ms[i].begin(), ms[i].end());
          const double med = ms[i][ms[i].size() / 2];
          std::printf("%d,%d,%d,%d,%d,%d,%.4f,%.1f,%.3g\n", d, s, int(causal), shares[i].share, int(shares[i].static_tiles),
                      shares[i].raw_max < 0 ? int(d == 128) : shares[i].raw_max, med, flops / (med * 1e-3) / 1e12,
                      max_diff(outs[i], outs[0]));
        }
        std::fflush(stdout);
        CK(cudaFree(tmp));
        CK(cudaFree(q));
        CK(cudaFree(k));
        CK(cudaFree(v));
        CK(cudaFree(o));
      }
  return 0;
}
