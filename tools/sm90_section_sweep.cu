// FA3 shapes, causal or not (bf16, batch 16384 / seqlen, heads 2048 / d) timed with several heads a
// section (FwdParams::l2_section_bytes; 0 = the launch's own choice), the budgets interleaved in
// rounds; medians of 20-launch timings after a clock warm-up. For the tile order's section rule
// (sm90/fwd_launch.cuh; cmake -DFA4_BUILD_PROBE=ON):
//   sm90_section_sweep [ROUNDS [CAUSAL=1 [FLUSH=0 [ONLY]]]]
// FLUSH=1 times each launch alone after 256 MB written (as triton's do_bench, and so the harness,
// flushes the L2), instead of 20 back to back; ONLY: the shapes to run, as D:S pairs ("256:512,
// 128:512"; all when absent).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include "common/fwd_params.h"
#include "common/validate.h"
#include "probe_util.cuh"
using fa4::detail::FwdParams;


__global__ void fill(__nv_bfloat16* x, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed * 0x9E3779B9u; h ^= h >> 15; h *= 0x2C1B3C6Du; h ^= h >> 12;
    x[i] = __float2bfloat16((float(h & 0xFFFF) / 65536.f - 0.5f) * 3.f);
  }
}
int main(int argc, char** argv) {
  const int rounds = argc > 1 ? atoi(argv[1]) : 3;
  const bool causal = argc > 2 ? atoi(argv[2]) != 0 : true;
  const bool flush = argc > 3 && atoi(argv[3]) != 0;
  const std::string only = argc > 4 ? argv[4] : "";
  auto wanted = [&](int d, int s) {
    const std::string pair = "," + std::to_string(d) + ":" + std::to_string(s) + ",";
    return only.empty() || ("," + only + ",").find(pair) != std::string::npos;
  };
  void* scratch = nullptr;
  constexpr size_t kFlushBytes = size_t(256) << 20;
  if (flush) CK(cudaMalloc(&scratch, kFlushBytes));
  if (rounds < 1) {
    std::fprintf(stderr, "ROUNDS = %s: must be an integer >= 1\n", argv[1]);
    return 2;
  }
  const long secs[] = {0, 128, 64, 32, 16, 8, 4};  // heads a section (0 = the launch's own choice)
  const int nsec = sizeof(secs) / sizeof(secs[0]);
  {  // warm the clocks
    const int n = 1 << 26; void* x; CK(cudaMalloc(&x, n * 2));
    for (int i = 0; i < 400; ++i) fill<<<1024, 256>>>((__nv_bfloat16*)x, n, i);
    CK(cudaDeviceSynchronize()); CK(cudaFree(x));
  }
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  for (int d : {64, 128, 256}) for (int s : {512, 1024, 2048, 4096}) {
    if (!wanted(d, s)) continue;
    const int b = 16384 / s, h = 2048 / d;
    const size_t n = size_t(b) * s * h * d;
    void *q, *k, *v, *o;
    for (void** x : {&q, &k, &v, &o}) CK(cudaMalloc(x, n * 2));
    fill<<<1024, 256>>>((__nv_bfloat16*)q, n, 1); fill<<<1024, 256>>>((__nv_bfloat16*)k, n, 2); fill<<<1024, 256>>>((__nv_bfloat16*)v, n, 3);
    FwdParams p = fa4::detail::make_fwd_params(bshd_forward_args(b, h, s, d, causal, q, k, v, o));
    std::vector<std::vector<float>> ms(nsec);
    for (int r = 0; r < rounds; ++r)
      for (int i = 0; i < nsec; ++i) {
        p.l2_section_bytes = secs[i] * 4ll * s * d;
        for (int w = 0; w < 5; ++w) fa4::detail::sm90_forward(p, 0);
        if (flush) {
          for (int it = 0; it < 20; ++it) {
            CK(cudaMemsetAsync(scratch, 0, kFlushBytes));
            cudaEventRecord(e0);
            if (const fa4::Status st = fa4::detail::sm90_forward(p, 0); !st.ok()) {
              std::fprintf(stderr, "sm90_forward failed: %s\n", st.message.c_str());
              return 1;
            }
            cudaEventRecord(e1); cudaEventSynchronize(e1);
            float t; cudaEventElapsedTime(&t, e0, e1); ms[i].push_back(t);
          }
          continue;
        }
        for (int it = 0; it < 5; ++it) {
          cudaEventRecord(e0);
          for (int j = 0; j < 20; ++j)
            if (const fa4::Status st = fa4::detail::sm90_forward(p, 0); !st.ok()) {
              std::fprintf(stderr, "sm90_forward failed: %s\n", st.message.c_str());
              return 1;
            }
          cudaEventRecord(e1); cudaEventSynchronize(e1);
          float t; cudaEventElapsedTime(&t, e0, e1); ms[i].push_back(t / 20);
        }
      }
    CK(cudaGetLastError());
    float base = 0;
    for (int i = 0; i < nsec; ++i) {
      std::sort(ms[i].begin(), ms[i].end());
      const float med = ms[i][ms[i].size() / 2];
      if (i == 0) base = med;
      printf("SECTION%s d=%d s=%d causal=%d heads=%ld: %.1f us  base/this %.3f  (p10 %.1f p90 %.1f)\n",
             flush ? " flushed" : "", d, s, int(causal), secs[i], med * 1e3, base / med,
             ms[i][ms[i].size() / 10] * 1e3, ms[i][ms[i].size() * 9 / 10] * 1e3);
    }
    for (void* x : {q, k, v, o}) CK(cudaFree(x));
  }
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  if (scratch != nullptr) CK(cudaFree(scratch));
  return 0;
}
