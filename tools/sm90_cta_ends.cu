// Where each CTA of the shipped d256 causal 512 launch runs and ends, over many launches
// (bench/cta_ends.py reads what it prints). The kernel is the shipped one (the serial step's
// configuration) with only each CTA's entry, end and SM recorded (fwd_kernel.cuh, kTraceCta).
// Mode 0 runs the launches back to back; mode 1 writes 256 MB before each, as do_bench's flush
// does. Prints CSV: mode,launch,cta,sm,start_us,end_us,launch_us (times from the launch's first
// CTA entry; launch_us from the events around the launch).
//
//   sm90_cta_ends [LAUNCHES (default 20)] [B H S (default 32 8 512, the FA3 shape)]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <cuda_runtime.h>

#include "common/fwd_params.h"
#include "common/validate.h"
#include "probe_util.cuh"
#include "sm90/fwd_configs.cuh"
#include "sm90/fwd_launch.cuh"

namespace {

template <class Base>
struct CtaTraced : Base {
  static constexpr bool kTrace = true;
  static constexpr int kTraceParts = fa4::sm90::kTraceCta;
};
using Cfg = CtaTraced<fa4::sm90::D256SerialConfig<true>>;

}  // namespace

int main(int argc, char** argv) {
  const int launches = argc > 1 ? std::atoi(argv[1]) : 20;
  const int b = argc > 4 ? std::atoi(argv[2]) : 32, h = argc > 4 ? std::atoi(argv[3]) : 8,
            s = argc > 4 ? std::atoi(argv[4]) : 512, d = 256;
  if (launches < 1 || b < 1 || h < 1 || s < 1) {
    std::fprintf(stderr, "usage: sm90_cta_ends [LAUNCHES >= 1] [B H S >= 1]\n");
    return 2;
  }
  const size_t n = size_t(b) * s * h * d;
  constexpr size_t kFlushBytes = size_t(256) << 20;
  void *q, *k, *v, *o, *flush;
  for (void** x : {&q, &k, &v, &o}) CK(cudaMalloc(x, n * 2));
  CK(cudaMalloc(&flush, kFlushBytes));
  fill_device(q, n, 1);
  fill_device(k, n, 2);
  fill_device(v, n, 3);
  const fa4::ForwardArgs a = bshd_forward_args(b, h, s, d, true, q, k, v, o);
  if (const fa4::Status st = fa4::validate(a); !st.ok()) {
    std::fprintf(stderr, "%s\n", st.message.c_str());
    return 2;
  }
  const fa4::detail::FwdParams p = fa4::detail::make_fwd_params(a);
  constexpr int kMaxCtas = 4096, kW = fa4::sm90::kCtaStamps;
  const size_t words = size_t(fa4::sm90::kTraceRegionWords<Cfg::kConsumers>);
  const size_t all = 2 * words + size_t(kMaxCtas) * kW;
  uint64_t* tr;
  CK(cudaMalloc(&tr, all * 8));
  std::vector<uint64_t> ht(all);
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  std::printf("mode,launch,cta,sm,start_us,end_us,launch_us\n");
  for (int mode = 0; mode < 2; ++mode)
    for (int it = -3; it < launches; ++it) {  // three warm-up launches a mode
      CK(cudaMemset(tr, 0, all * 8));
      if (mode == 1) CK(cudaMemsetAsync(flush, 0, kFlushBytes));
      CK(cudaEventRecord(e0));
      const fa4::Status st = fa4::sm90::launch_forward<Cfg>(p, 0, tr);
      CK(cudaEventRecord(e1));
      if (!st.ok()) {
        std::fprintf(stderr, "launch failed: %s\n", st.message.c_str());
        return 1;
      }
      CK(cudaDeviceSynchronize());
      if (it < 0) continue;
      float ms = 0;
      CK(cudaEventElapsedTime(&ms, e0, e1));
      CK(cudaMemcpy(ht.data(), tr, all * 8, cudaMemcpyDeviceToHost));
      const uint64_t* cs = ht.data() + 2 * words;
      int ctas = 0;
      uint64_t t0 = ~uint64_t(0);
      while (ctas < kMaxCtas && cs[size_t(ctas) * kW] != 0) t0 = std::min(t0, cs[size_t(ctas++) * kW]);
      for (int c = 0; c < ctas; ++c) {
        const uint64_t* x = cs + size_t(c) * kW;
        std::printf("%d,%d,%d,%d,%.3f,%.3f,%.2f\n", mode, it, c, int(x[4]), double(x[0] - t0) * 1e-3,
                    double(x[1] - t0) * 1e-3, ms * 1e3);
      }
    }
  return 0;
}
