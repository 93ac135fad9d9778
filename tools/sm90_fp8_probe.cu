// The fp8 forward's variants, measured: FA3's shapes (16k tokens a batch, hidden 2048), head dims
// 64, 128 and 256, causal and not: the shipped kernel, the same with the row max's other form
// (FwdParams::fp8_raw_max: over the raw scores scaled once, or over the scaled scores), at d64 the
// other consumer count (FwdParams::fp8_consumers: two without a bound, where three ship; three under
// one), P V's wait at the next step's start
// (FwdParams::fp8_defer_pv), and each other built software exp2 share (FwdParams::exp2_poly_every:
// 0 = every exponential on MUFU, n = every n-th 8-key chunk of a thread's S on the FMA pipe), timed
// in alternating rounds in one
// process (CUDA events, median of each variant's rounds), each variant's output compared with the
// first's.
//
//   sm90_fp8_probe [seqlens, default 1024,4096,16384] [rounds, default 5]
//   sm90_fp8_probe trace DIR
//
// `trace`: the shipped configuration of each head dim built with Fp8Config::kTrace (clock stamps of
// each consumer's steady steps, sm90/fp8_fwd_kernel.cuh, Fp8Trace) at FA3's 16k non-causal and
// d128 4k causal, and at d64 and d128 16k the same with P V's wait deferred (Fp8Config::kDeferPv);
// prints per head dim the median cycles of each part of a step and of the period over the first
// traced CTAs' consumers, and writes the records to DIR/fp8-trace-d<d>-s<s>-c<c>[-defer-pv].csv.
// The stamps move ptxas's schedule (d256's traced kernel takes a 24-byte stack frame the shipped one
// does not): compare traced with traced, and decide by untraced A/Bs.
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
#include "sm90/fp8_fwd_launch.cuh"

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

// Inputs of FA3's shape (16k tokens a batch, hidden 2048) as e4m3, and their forward's arguments.
struct Fp8Inputs {
  int b, h, s, d;
  size_t n;
  __nv_fp8_e4m3 *q = nullptr, *k = nullptr, *v = nullptr;
  __nv_bfloat16* o = nullptr;
  Fp8Inputs(int d_, int s_) : b(std::max(1, 16384 / s_)), h(2048 / d_), s(s_), d(d_), n(size_t(b) * s * h * d) {
    __nv_bfloat16* tmp;
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
    CK(cudaFree(tmp));
  }
  ~Fp8Inputs() {
    cudaFree(q);
    cudaFree(k);
    cudaFree(v);
    cudaFree(o);
  }
  // The forward's parameters over them (validated); false, having said why, when invalid.
  bool params(bool causal, fa4::detail::FwdParams& p) const {
    fa4::ForwardArgs a = bshd_forward_args(b, h, s, d, causal, q, k, v, o);
    a.problem.dtype = fa4::DType::kE4M3;
    if (const fa4::Status st = fa4::validate(a); !st.ok()) {
      std::printf("invalid: %s\n", st.message.c_str());
      return false;
    }
    p = fa4::detail::make_fwd_params(a);
    return true;
  }
};

// The library's shipped exp2 share and row-max form of head dim d (sm90/fp8_fwd_launch.cuh).
int shipped_poly(int d) {
  namespace f8 = fa4::detail::fp8;
  return d == 64 ? f8::kShippedPoly<64> : d == 128 ? f8::kShippedPoly<128> : f8::kShippedPoly<256>;
}
bool shipped_raw_max(int d) {
  namespace f8 = fa4::detail::fp8;
  return d == 64 ? f8::kShippedRawMax<64> : d == 128 ? f8::kShippedRawMax<128> : f8::kShippedRawMax<256>;
}

// One traced launch of head dim kD's shipped configuration; prints the medians (cycles) of each part
// of a step and of the period (entry to the next step's entry within a tile) over the traced
// consumers, and writes the records.
template <int kD, bool kDeferPv = false>
int trace_shape(const char* dir, int s, bool causal) {
  namespace f8 = fa4::detail::fp8;
  using Cfg = f8::Fp8Cfg<kD, f8::kShippedPoly<kD>, f8::kShippedRawMax<kD>, true, 2, false, kDeferPv>;
  using Trace = fa4::sm90::fp8::Fp8Trace;
  const Fp8Inputs in(kD, s);
  fa4::detail::FwdParams p;
  if (!in.params(causal, p)) return 1;
  const int64_t words = Trace::words(Cfg::kConsumers);
  unsigned long long* dtrace;
  CK(cudaMalloc(&dtrace, size_t(words) * 8));
  for (int rep = 0; rep < 2; ++rep) {  // the first warms up
    CK(cudaMemset(dtrace, 0, size_t(words) * 8));
    const fa4::Status r = fa4::detail::fp8::launch_fp8_cfg<Cfg>(p, nullptr, dtrace);
    if (!r.ok()) {
      std::printf("traced launch: %s\n", r.message.c_str());
      return 1;
    }
    CK(cudaDeviceSynchronize());
  }
  std::vector<unsigned long long> h(static_cast<size_t>(words));
  CK(cudaMemcpy(h.data(), dtrace, size_t(words) * 8, cudaMemcpyDeviceToHost));
  CK(cudaFree(dtrace));
  char path[512];
  std::snprintf(path, sizeof path, "%s/fp8-trace-d%d-s%d-c%d%s.csv", dir, kD, s, int(causal), kDeferPv ? "-defer-pv" : "");
  FILE* f = std::fopen(path, "w");
  if (f == nullptr) {
    std::printf("cannot write %s\n", path);
    return 1;
  }
  std::fprintf(f, "cta,consumer,step,e0,e1,e2,e3,e4,e5,e6,e7\n");
  constexpr int kE = Trace::kEvents;
  std::vector<std::vector<double>> parts(kE);  // parts[e]: e_{e+1} - e_e for e < 7; parts[7]: the period
  for (int c = 0; c < Trace::kCtas; ++c)
    for (int w = 0; w < Cfg::kConsumers; ++w) {
      const unsigned long long* r = h.data() + (int64_t(c) * Cfg::kConsumers + w) * Trace::kSteps * kE;
      const unsigned long long t0 = r[0];
      for (int n = 0; n < Trace::kSteps && r[n * kE] != 0; ++n) {
        const unsigned long long* x = r + n * kE;
        std::fprintf(f, "%d,%d,%d", c, w, n);
        for (int e = 0; e < kE; ++e) std::fprintf(f, ",%lld", (long long)(x[e] - t0));
        std::fprintf(f, "\n");
        for (int e = 0; e + 1 < kE; ++e) parts[size_t(e)].push_back(double(x[e + 1] - x[e]));
        // The period: to the next record's entry, where it follows in the same tile (a gap of more
        // than three steps' span is a tile boundary, left out).
        if (n + 1 < Trace::kSteps && x[kE] != 0 && x[kE] - x[0] < 3 * (x[7] - x[0])) parts[7].push_back(double(x[kE] - x[0]));
      }
    }
  std::fclose(f);
  auto median = [](std::vector<double> v) {
    if (v.empty()) return 0.0;
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  std::printf("d%d s%d causal %d%s: %zu steps; median cycles: landed %.0f, turn %.0f, issue %.0f, S wait %.0f, softmax %.0f, "
              "P V wait %.0f, rescale %.0f; period %.0f  (%s)\n",
              kD, s, int(causal), kDeferPv ? " defer_pv" : "", parts[0].size(), median(parts[0]), median(parts[1]), median(parts[2]), median(parts[3]),
              median(parts[4]), median(parts[5]), median(parts[6]), median(parts[7]), path);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "trace") {
    const char* dir = argc > 2 ? argv[2] : ".";
    int rc = trace_shape<64>(dir, 16384, false);
    rc |= trace_shape<64, true>(dir, 16384, false);
    rc |= trace_shape<128>(dir, 16384, false);
    rc |= trace_shape<128, true>(dir, 16384, false);
    rc |= trace_shape<256>(dir, 16384, false);
    rc |= trace_shape<128>(dir, 4096, true);
    return rc;
  }
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
    int raw_max = -1;    // FwdParams::fp8_raw_max
    int consumers = 0;   // FwdParams::fp8_consumers
    bool defer_pv = false;  // FwdParams::fp8_defer_pv
  };
  // consumers: FwdParams::fp8_consumers (0: the shipped choice, three at d64 without a bound, else two)
  std::printf("d,seqlen,causal,share,static_tiles,raw_max,consumers,defer_pv,ms,tflops,max_diff_vs_first\n");
  for (int d : {64, 128, 256})
    for (int s : seqlens)
      for (bool causal : {false, true}) {
        const Fp8Inputs in(d, s);
        const size_t n = in.n;
        fa4::detail::FwdParams p;
        if (!in.params(causal, p)) return 1;
        // The shipped kernel first (the reference for max_diff), then the row max's other form,
        // then each other share.
        const int shipped = shipped_poly(d);
        std::vector<Variant> shares = {{shipped, false, -1}, {shipped, false, !shipped_raw_max(d)}};
        for (int every : {0, 4, 8})
          if (every != shipped && (every != 8 || d != 256)) shares.push_back({every, false});
        if (d == 64) shares.push_back({shipped, false, -1, causal ? 3 : 2});  // (the shipped: 3 without a bound)
        shares.push_back({shipped, false, -1, 0, true});
        auto set = [&](const Variant& x) {
          p.exp2_poly_every = x.share, p.fp8_static_tiles = x.static_tiles, p.fp8_raw_max = x.raw_max;
          p.fp8_consumers = x.consumers, p.fp8_defer_pv = x.defer_pv;
        };
        std::vector<std::vector<__nv_bfloat16>> outs;
        for (const Variant& every : shares) {
          set(every);
          CK(cudaMemset(in.o, 0xFF, n * 2));
          const fa4::Status r = fa4::detail::sm90_forward_fp8(p, nullptr);
          if (!r.ok()) {
            std::printf("share %d: %s\n", every.share, r.message.c_str());
            return 1;
          }
          CK(cudaDeviceSynchronize());
          outs.emplace_back(n);
          CK(cudaMemcpy(outs.back().data(), in.o, n * 2, cudaMemcpyDeviceToHost));
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
        CK(cudaEventDestroy(e0));
        CK(cudaEventDestroy(e1));
        const double flops = 4.0 * in.b * in.h * double(s) * s * d / (causal ? 2 : 1);
        for (size_t i = 0; i < std::size(shares); ++i) {
          std::sort(ms[i].begin(), ms[i].end());
          const double med = ms[i][ms[i].size() / 2];
          std::printf("%d,%d,%d,%d,%d,%d,%d,%d,%.4f,%.1f,%.3g\n", d, s, int(causal), shares[i].share,
                      int(shares[i].static_tiles), shares[i].raw_max < 0 ? int(shipped_raw_max(d)) : shares[i].raw_max,
                      shares[i].consumers, int(shares[i].defer_pv), med, flops / (med * 1e-3) / 1e12,
                      max_diff(outs[i], outs[0]));
        }
        std::fflush(stdout);
      }
  return 0;
}
