// Kernel-level probe of the sm90 forward, below the public API: checks a list of shapes against
// a float64 attention on the CPU (sampled rows for FA3-sized problems) and times configurations
// side by side. For kernel development (cmake -DFA4_BUILD_PROBE=ON):
//   sm90_fwd_probe [check|time|ablate|all]
//   sm90_fwd_probe variants    candidate configurations against the shipped one, same run
//                              (FA4_VARIANTS="NAME,..." keeps only those)
//   sm90_fwd_probe walks [ROUNDS]
//                              d256 causal FA3 shapes at 512, 768 and 1024: the launch's choice of
//                              the long tile's diagonal-last walk beside each walk forced
//                              (FwdParams::diagonal_last: never, the last round, every round),
//                              ROUNDS alternating rounds (default 6); first the device's memory
//                              clock, bus width and the DRAM bandwidth the launch decides by,
//                              last each walk's median (MEDIAN lines) and its ratio to the launch's
//   sm90_fwd_probe decode [ROUNDS]
//                              one query row a head (bench/decode.py's shapes, GQA folded): the
//                              launch beside the stream-K tail never / always taken and, at d64,
//                              two and three consumers forced, K and V read as BHSD; ROUNDS
//                              alternating rounds (default 5), the L2 flushed before every launch;
//                              medians in us and GB/s. FA4_DECODE_SHAPES="B,HQ,HKV,SK,D;..." takes
//                              other shapes
//   sm90_fwd_probe fold [ROUNDS]
//                              a few query rows a head under GQA (speculative decoding):
//                              each KV head's query group folded into a tile's rows
//                              (detail::fold_query_rows): the launch's way, which unfolds where
//                              sm90::fold_pays says no, beside the rows folded whatever it says
//                              and unfolded (a tile a query head); ROUNDS alternating rounds
//                              (default 5), the L2 flushed before every launch, medians in us.
//                              FA4_FOLD_SHAPES="B,SQ,HQ,HKV,SK,D[,CAUSAL];..." takes other shapes
//                              (CAUSAL 0: no bound; default 1)
//   sm90_fwd_probe trace DIR [variants]
//                              clock64 timeline of the first CTAs (csv in DIR, medians printed);
//                              with `variants` also the configurations measured and not shipped;
//                              FA4_TRACE_ONLY="NAME:SEQLEN:CAUSAL,..." keeps only those shapes
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "common/fwd_params.h"
#include "common/validate.h"
#include "reference.h"
#include "probe_util.cuh"
#include "sm90/fwd_configs.cuh"
#include "sm90/fwd_launch.cuh"

using fa4::detail::FwdParams;


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
  // The float64 reference over the checked rows, split across the host's cores (FA3-sized
  // problems take minutes on one).
  const fa4::Problem prob = problem_of(s);
  struct Acc { double max_err = 0, max_lse_err = 0, ref_norm = 0, err_norm = 0; };
  std::vector<std::array<int, 3>> work;  // (b, h, i) of every checked row
  for (int b = 0; b < s.b; ++b)
    for (int h = 0; h < s.hq; ++h)
      for (int i = (b * 7 + h * 3) % row_step; i < s.sq; i += row_step) work.push_back({b, h, i});
  const unsigned n_threads = std::max(1u, std::min<unsigned>(std::thread::hardware_concurrency(), 64));
  std::vector<Acc> acc(n_threads);
  // Element readers of the host copies (BSHD bf16) for fa4::ref::forward_row.
  auto reader = [&s](const std::vector<__nv_bfloat16>& x, int seq, int heads) {
    return [&x, &s, seq, heads](int64_t b, int64_t j, int64_t h, int64_t d) {
      return __bfloat162float(x[((size_t(b) * seq + j) * heads + h) * s.d + d]);
    };
  };
  const auto q_at = reader(hq, s.sq, s.hq);
  const auto k_at = reader(hk, s.sk, s.hkv);
  const auto v_at = reader(hv, s.sk, s.hkv);
  auto check_rows = [&](unsigned t) {
    Acc& a = acc[t];
    std::vector<double> ref_o(s.d);
    for (size_t w = t; w < work.size(); w += n_threads) {
      const int b = work[w][0], h = work[w][1], i = work[w][2];
      const double lse = fa4::ref::forward_row(prob, q_at, k_at, v_at, b, h, i, ref_o.data());
      const float glse = hlse[(size_t(b) * s.hq + h) * s.sq + i];
      if (std::isinf(lse)) { if (!(std::isinf(glse) && glse < 0)) a.max_lse_err = INFINITY; }
      else a.max_lse_err = std::max(a.max_lse_err, std::fabs(glse - lse));
      for (int t2 = 0; t2 < s.d; ++t2) {
        const double ref = ref_o[t2];
        const double got = __bfloat162float(ho[((size_t(b) * s.sq + i) * s.hq + h) * s.d + t2]);
        a.max_err = std::max(a.max_err, std::isnan(got) ? INFINITY : std::fabs(got - ref));
        a.ref_norm += ref * ref;
        a.err_norm += (std::isnan(got) ? 1e30 : (got - ref) * (got - ref));
      }
    }
  };
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < n_threads; ++t) pool.emplace_back(check_rows, t);
  for (std::thread& th : pool) th.join();
  double max_err = 0, max_lse_err = 0, ref_norm = 0, err_norm = 0;
  for (const Acc& a : acc) {
    max_err = std::max(max_err, a.max_err);
    max_lse_err = std::max(max_lse_err, a.max_lse_err);
    ref_norm += a.ref_norm;
    err_norm += a.err_norm;
  }
  const double rel = std::sqrt(err_norm / std::max(ref_norm, 1e-30));
  const bool ok = max_err < 2e-2 && rel < 1e-2 && max_lse_err < 1e-3;
  std::printf("%s%s b=%d hq=%d hkv=%d sq=%d sk=%d d=%d causal=%d win=(%d,%d): max|err|=%.3g rel=%.3g lse=%.3g\n",
              ok ? "PASS" : "FAIL", row_step > 1 ? "(sampled rows)" : "", s.b, s.hq, s.hkv, s.sq, s.sk, s.d, s.causal, s.left, s.right, max_err, rel, max_lse_err);
  cudaFree(dq); cudaFree(dk); cudaFree(dv); cudaFree(dout); cudaFree(dlse);
  return ok;
}

using Launcher = fa4::Status (*)(const FwdParams&, cudaStream_t);

// Launches timed from a cold L2 (decode and fold modes): median_us is the median of 20 launches
// of fn(p) in microseconds, after 3 warm-up ones, 256 MB written before each.
struct ColdTimer {
  const size_t flush_bytes = size_t(256) << 20;
  void* flush = nullptr;
  cudaEvent_t e0{}, e1{};
  ColdTimer() {
    CK(cudaMalloc(&flush, flush_bytes));
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
  }
  ~ColdTimer() {
    cudaFree(flush);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
  }
  double median_us(Launcher fn, const FwdParams& p) {
    std::vector<float> ms;
    for (int i = 0; i < 23; ++i) {
      cudaMemsetAsync(flush, i, flush_bytes);
      cudaEventRecord(e0);
      const fa4::Status st = fn(p, 0);
      if (!st.ok()) { std::printf("launch failed: %s\n", st.message.c_str()); std::exit(1); }
      cudaEventRecord(e1);
      cudaEventSynchronize(e1);
      float t; cudaEventElapsedTime(&t, e0, e1);
      if (i >= 3) ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    return 1e3 * ms[ms.size() / 2];
  }
};

struct Variant {
  int schedule;
  const char* name;
  int d;
  Launcher fn;
  float threshold;
  int diagonal_last = 0;  // FwdParams::diagonal_last: 0 the launch's choice
};

template <int D, int N, int S, int Poly, int C = 2, bool Sched = true, bool DoubleP = true,
          bool SoftmaxTurns = false, bool TensorRowSum = false, bool NoBlockMax = (D <= 128)>
fa4::Status run_cfg(const FwdParams& p, cudaStream_t s) {
  return fa4::sm90::launch_forward<fa4::sm90::FwdConfig<D, N, S, true, Poly, C, Sched, DoubleP, SoftmaxTurns,
                                                        TensorRowSum, false, false, 0, NoBlockMax>>(p, s);
}

// An FA3-sized problem (16k tokens, hidden 2048) on the device: independent random q, k and v
// (q = k would make every score row peak on its diagonal and lower the tensor cores' switching:
// both flatter the timing) and an output buffer.
struct Fa3Problem {
  Shape s;
  size_t n;
  void *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr;
  Fa3Problem(int d, int seqlen, bool causal, uint32_t seed)
      : s{16384 / seqlen, 2048 / d, 2048 / d, seqlen, seqlen, d, causal}, n(size_t(s.b) * seqlen * s.hq * d) {
    for (void** x : {&q, &k, &v, &o}) CK(cudaMalloc(x, n * 2));
    fill_device(q, n, seed); fill_device(k, n, seed + 1); fill_device(v, n, seed + 2);
  }
  ~Fa3Problem() { cudaFree(q); cudaFree(k); cudaFree(v); cudaFree(o); }
  FwdParams params(void* out) const { return make_params(s, q, k, v, out, nullptr); }
};

// The kernel parameters a variant runs with.
static void apply(const Variant& var, FwdParams& p) {
  p.rescale_threshold = var.threshold;
  p.schedule = var.schedule;
  p.diagonal_last = var.diagonal_last;
}

// Prints one TIME line; returns the median in ms.
static double time_shape(int d, int seqlen, bool causal, const Variant* var = nullptr) {
  const Fa3Problem pr(d, seqlen, causal, 1);
  const Shape& s = pr.s;
  FwdParams p = pr.params(pr.o);
  Launcher fn = fa4::detail::sm90_forward;
  if (var) {
    fn = var->fn;
    apply(*var, p);
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
  return ms[ms.size() / 2];
}

// The shipped kernel on one FA3-sized shape, back to back for `seconds` (for clock and power
// readings taken beside it, e.g. nvidia-smi): prints the TFLOP/s over the whole soak.
static void soak_shape(int d, int seqlen, bool causal, double seconds, int schedule, int64_t section_mb) {
  const Fa3Problem pr(d, seqlen, causal, 1);
  FwdParams p = pr.params(pr.o);
  p.schedule = schedule;
  p.l2_section_bytes = section_mb < 0 ? -1 : section_mb << 20;
  cudaEvent_t a, b;
  cudaEventCreate(&a); cudaEventCreate(&b);
  const double flops = 4.0 * pr.s.b * pr.s.hq * double(seqlen) * seqlen * d * (causal ? 0.5 : 1.0);
  int runs = 0, late_runs = 0;
  float total_ms = 0, late_ms = 0;  // late: the second half, once clock and power have settled
  while (total_ms < seconds * 1e3) {
    cudaEventRecord(a);
    for (int i = 0; i < 20; ++i) fa4::detail::sm90_forward(p, 0);
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float t; cudaEventElapsedTime(&t, a, b);
    if (total_ms >= seconds * 500) { late_ms += t; late_runs += 20; }
    total_ms += t;
    runs += 20;
  }
  CK(cudaGetLastError());
  std::printf("SOAK schedule=%d section_mb=%lld d=%d seqlen=%d causal=%d: %d runs, %.3f ms each, %.1f TFLOP/s (second half %.1f)\n",
              schedule, (long long)section_mb, d, seqlen, int(causal), runs, total_ms / runs,
              flops * runs / (total_ms * 1e-3) / 1e12, flops * late_runs / (late_ms * 1e-3) / 1e12);
}

// A candidate configuration's O against the shipped kernel's on the same inputs (which the tests
// check against float64): the largest difference, relative to the largest |O|.
static void compare_variant(const Variant& var, int seqlen, bool causal) {
  const int d = var.d;
  const Fa3Problem pr(d, seqlen, causal, 11);
  const size_t n = pr.n;
  void* o0 = pr.o;
  void* o1;
  CK(cudaMalloc(&o1, n * 2));
  CK(cudaMemset(o1, 0xFF, n * 2));
  FwdParams p0 = pr.params(o0), p1 = pr.params(o1);
  apply(var, p1);
  if (!fa4::detail::sm90_forward(p0, 0).ok() || !var.fn(p1, 0).ok()) { std::printf("launch failed\n"); std::exit(1); }
  CK(cudaDeviceSynchronize());
  std::vector<__nv_bfloat16> h0(n), h1(n);
  CK(cudaMemcpy(h0.data(), o0, n * 2, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(h1.data(), o1, n * 2, cudaMemcpyDeviceToHost));
  double diff = 0, mag = 0;
  for (size_t i = 0; i < n; ++i) {
    const double a = __bfloat162float(h0[i]), b = __bfloat162float(h1[i]);
    diff = std::max(diff, std::isnan(b) ? INFINITY : std::fabs(a - b));
    mag = std::max(mag, std::fabs(a));
  }
  std::printf("SAME %s d=%d seqlen=%d causal=%d: max|O_variant - O_shipped| = %.3g (max|O| %.3g) %s\n", var.name, d,
              seqlen, causal, diff, mag, diff <= 1e-2 * mag ? "ok" : "DIFFERS");
  cudaFree(o1);
}

// A configuration with K and V loaded as one TMA box a block (fwd_kernel.cuh, folded_kv).
template <class Base>
struct FoldedKV : Base {
  static constexpr bool kFoldedKV = true;
};
template <class Cfg>
fa4::Status run_folded(const FwdParams& p, cudaStream_t s) {
  return fa4::sm90::launch_forward<FoldedKV<Cfg>>(p, s);
}

// The shipped configuration with its development timeline switched on: the parts of it in
// kParts (fwd_kernel.cuh: kTraceStep, kTraceBound, kTraceCta).
template <class Base, int kParts = fa4::sm90::kTraceStep | fa4::sm90::kTraceBound | fa4::sm90::kTraceCta>
struct Traced : Base {
  static constexpr bool kTrace = true;
  static constexpr int kTraceParts = kParts;
};

// Record `step` of warpgroup slot `slot` of traced CTA `cta` in one region of the trace (steps or
// boundaries; fwd_kernel.cuh, TraceLog): kTraceEvents stamps.
static const uint64_t* trace_record(const uint64_t* log, int slots, int cta, int slot, int step) {
  using fa4::sm90::kTraceSteps, fa4::sm90::kTraceEvents;
  return log + ((size_t(cta) * slots + slot) * kTraceSteps + step) * kTraceEvents;
}

// One CSV of trace records (fwd_kernel.cuh, TraceLog): a row a record whose event `key` was
// stamped, from slot `first_slot` on, in cycles since the CTA's first producer stamp (`origin`:
// the steady-state log, whose slot 0 step 0 that is).
static void write_trace_csv(const char* path, const char* unit, const uint64_t* log, const uint64_t* origin, int slots,
                            int first_slot, int key) {
  using fa4::sm90::kTraceCtas, fa4::sm90::kTraceSteps, fa4::sm90::kTraceEvents;
  FILE* f = std::fopen(path, "w");
  if (f == nullptr) return;
  std::fprintf(f, "cta,slot,%s,e0,e1,e2,e3,e4,e5,e6,e7\n", unit);
  for (int c = 0; c < kTraceCtas; ++c) {
    const uint64_t t0 = trace_record(origin, slots, c, 0, 0)[0];
    for (int sl = first_slot; sl < slots; ++sl)
      for (int st = 0; st < kTraceSteps; ++st) {
        const uint64_t* r = trace_record(log, slots, c, sl, st);
        if (r[key] == 0) continue;
        std::fprintf(f, "%d,%d,%d", c, sl, st);
        for (int e = 0; e < kTraceEvents; ++e) std::fprintf(f, ",%lld", (long long)(r[e] ? r[e] - t0 : 0));
        std::fprintf(f, "\n");
      }
  }
  std::fclose(f);
}

// The trace buffer: steady-state steps and tile boundaries (`words` each), then the entry and end of
// up to kMaxCtas CTAs (fwd_kernel.cuh).
constexpr int kMaxCtas = 4096;
static size_t trace_words(size_t words) { return 2 * words + size_t(kMaxCtas) * fa4::sm90::kCtaStamps; }

// Waits for a traced launch (its end event `done`). One that has not finished in 20 s is reported
// and the probe exits: for each traced CTA and warpgroup slot, its records in each region and the
// events set in the last of them (a hang's place in the protocol), and how many CTAs have entered
// and ended. The copy runs on a stream of its own while the kernel still holds the SMs.
static void finish_or_report(cudaEvent_t done, const uint64_t* tr, size_t words, int slots, const char* name,
                             int seqlen, bool causal) {
  using fa4::sm90::kTraceCtas, fa4::sm90::kTraceSteps, fa4::sm90::kTraceEvents, fa4::sm90::kCtaStamps;
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    const cudaError_t q = cudaEventQuery(done);
    if (q == cudaSuccess) return;
    if (q != cudaErrorNotReady) CK(q);
    if (std::chrono::steady_clock::now() - start > std::chrono::seconds(20)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const size_t all = trace_words(words);
  std::vector<uint64_t> h(all);
  cudaStream_t side;
  CK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  CK(cudaMemcpyAsync(h.data(), tr, all * 8, cudaMemcpyDeviceToHost, side));
  CK(cudaStreamSynchronize(side));
  std::printf("HANG %s seqlen=%d causal=%d: the traced launch has not finished in 20 s\n", name, seqlen, int(causal));
  int entered = 0, ended = 0;
  for (int c = 0; c < kMaxCtas; ++c) {
    entered += h[2 * words + size_t(c) * kCtaStamps] != 0;
    ended += h[2 * words + size_t(c) * kCtaStamps + 1] != 0;
  }
  std::printf("HANG   CTAs entered %d, ended %d\n", entered, ended);
  for (int region = 0; region < 2; ++region)
    for (int c = 0; c < kTraceCtas; ++c)
      for (int sl = region; sl < slots; ++sl) {  // the boundary region has no producer records
        const uint64_t* base = trace_record(h.data() + region * words, slots, c, sl, 0);
        int n = 0;
        while (n < kTraceSteps && std::any_of(base + n * kTraceEvents, base + (n + 1) * kTraceEvents,
                                              [](uint64_t x) { return x != 0; }))
          ++n;
        std::printf("HANG   %s CTA %d slot %d: %d records; events set in the last:", region ? "bounds" : "steps", c,
                    sl, n);
        for (int e = 0; n > 0 && e < kTraceEvents; ++e)
          if (base[(n - 1) * kTraceEvents + e] != 0) std::printf(" %d", e);
        std::printf("\n");
      }
  std::exit(3);
}

// Runs one FA3-sized shape with a traced kernel and prints, per consumer of CTA 0, the median of
// each interval of a steady-state step (events in sm90/fwd_kernel.cuh) and of the step period,
// then the same of its tile boundaries.
template <class Cfg>
static void trace_shape(const char* dir, const char* name, int d, int seqlen, bool causal) {
  // FA4_TRACE_ONLY="NAME:SEQLEN:CAUSAL,...": only the shapes listed (e.g. "d256:512:1,d64:512:0").
  if (const char* only = std::getenv("FA4_TRACE_ONLY")) {
    const std::string list = "," + std::string(only) + ",";
    const std::string key = "," + std::string(name) + ":" + std::to_string(seqlen) + ":" + std::to_string(int(causal)) + ",";
    if (list.find(key) == std::string::npos) return;
  }
  const Fa3Problem pr(d, seqlen, causal, 1);
  using fa4::sm90::kTraceCtas, fa4::sm90::kTraceSteps, fa4::sm90::kTraceEvents;
  constexpr int kSlots = 1 + Cfg::kConsumers;
  const size_t words = size_t(fa4::sm90::kTraceRegionWords<Cfg::kConsumers>);
  uint64_t* tr;
  const size_t all = trace_words(words);
  // Steady-state steps, tile boundaries, then every CTA's entry and end (fwd_kernel.cuh).
  CK(cudaMalloc(&tr, all * 8));
  FwdParams p = pr.params(pr.o);
  cudaEvent_t ev[2];
  CK(cudaEventCreate(&ev[0]));
  CK(cudaEventCreate(&ev[1]));
  for (int it = 0; it < 4; ++it) {  // warm-up; the last run's timeline is kept
    CK(cudaMemset(tr, 0, all * 8));
    CK(cudaEventRecord(ev[0]));
    fa4::Status st = fa4::sm90::launch_forward<Cfg>(p, 0, tr);
    CK(cudaEventRecord(ev[1]));
    if (!st.ok()) { std::printf("launch failed: %s\n", st.message.c_str()); std::exit(1); }
    finish_or_report(ev[1], tr, words, kSlots, name, seqlen, causal);
    CK(cudaDeviceSynchronize());
  }
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, ev[0], ev[1]));
  std::vector<uint64_t> ht(all);
  CK(cudaMemcpy(ht.data(), tr, all * 8, cudaMemcpyDeviceToHost));
  {  // every CTA's entry and end: when they start and finish within the launch, and the SM clock
    constexpr int kW = fa4::sm90::kCtaStamps;  // entry ns, end ns, entry clock, end clock, SM
    const uint64_t* cs = ht.data() + 2 * words;
    std::vector<double> start, end, mhz, end_even, end_odd;
    uint64_t t0 = ~uint64_t(0);
    for (int c = 0; c < kMaxCtas && cs[c * kW] != 0; ++c) t0 = std::min(t0, cs[c * kW]);
    for (int c = 0; c < kMaxCtas && cs[c * kW] != 0; ++c) {
      const uint64_t* x = cs + c * kW;
      if (x[1] == 0) continue;
      start.push_back(double(x[0] - t0) * 1e-3);
      end.push_back(double(x[1] - t0) * 1e-3);
      (c % 2 == 0 ? end_even : end_odd).push_back(end.back());
      mhz.push_back(double(x[3] - x[2]) / double(x[1] - x[0]) * 1e3);
    }
    if (!end.empty()) {
      std::vector<double> e = end;
      std::sort(e.begin(), e.end());
      std::sort(start.begin(), start.end());
      std::sort(mhz.begin(), mhz.end());
      std::printf("CTAS %s d=%d seqlen=%d causal=%d: %zu CTAs; start spread %.1f us; end min / median / max %.1f / %.1f "
                  "/ %.1f us after the first start; SM clock %.0f-%.0f MHz; launch %.1f us (event to event)\n",
                  name, d, seqlen, int(causal), e.size(), start.back(), e.front(), e[e.size() / 2], e.back(),
                  mhz.front(), mhz.back(), ms * 1e3);
      // Even and odd CTAs apart: with paired tiles in static rounds on an even grid, CTA c takes
      // the pairs of parity c % 2 (tile_order.cuh), so a difference between them is the pairs'.
      auto mean = [](const std::vector<double>& v) {
        double t = 0;
        for (double x : v) t += x;
        return v.empty() ? 0.0 : t / double(v.size());
      };
      std::printf("CTAS %s d=%d seqlen=%d causal=%d: mean end of even CTAs %.1f us, of odd CTAs %.1f us\n", name, d,
                  seqlen, int(causal), mean(end_even), mean(end_odd));
    }
  }
  {  // CTA 0 from its producer's first stamp to its last O stored, against the launch's time
    const uint64_t* hb0 = ht.data() + words;
    const uint64_t first = ht[0];
    uint64_t last = 0;
    int tiles = 0;
    for (int sl = 1; sl < kSlots; ++sl)
      for (int st = 1; st < kTraceSteps; ++st) {  // record st holds the end of tile st - 1
        const uint64_t e3 = trace_record(hb0, kSlots, 0, sl, st)[3];
        if (e3 == 0) break;
        last = std::max(last, e3);
        if (sl == 1) ++tiles;
      }
    if (first != 0 && last > first)
      std::printf("SPAN %s d=%d seqlen=%d causal=%d: CTA 0 %d tiles in %llu cycles; launch %.1f us (%.0f MHz if the "
                  "CTA's cycles were all of it)\n", name, d, seqlen, int(causal), tiles,
                  (unsigned long long)(last - first), ms * 1e3, double(last - first) / (ms * 1e3));
  }
  char path[512];
  std::snprintf(path, sizeof path, "%s/trace-%s-d%d-s%d-c%d.csv", dir, name, d, seqlen, int(causal));
  write_trace_csv(path, "step", ht.data(), ht.data(), kSlots, 0, 0);
  auto median = [](std::vector<double> x) { std::sort(x.begin(), x.end()); return x.empty() ? 0.0 : x[x.size() / 2]; };
  for (int sl = 1; sl < kSlots; ++sl) {
    std::vector<double> iv[8];
    for (int st = 0; st + 1 < kTraceSteps; ++st) {
      const uint64_t* r = trace_record(ht.data(), kSlots, 0, sl, st);
      const uint64_t* rn = r + kTraceEvents;
      if (r[0] == 0 || rn[0] == 0) break;
      for (int e = 0; e < 7; ++e) iv[e].push_back(double(r[e + 1]) - double(r[e]));
      iv[7].push_back(double(rn[0]) - double(r[0]));
    }
    std::printf("TRACE %s d=%d seqlen=%d causal=%d consumer %d (%zu steps, medians in cycles): kv-wait %.0f  turn %.0f  "
                "issue %.0f  S-wait %.0f  softmax %.0f  PV-wait %.0f  rescale %.0f  | period %.0f\n",
                name, d, seqlen, int(causal), sl - 1, iv[7].size(), median(iv[0]), median(iv[1]), median(iv[2]),
                median(iv[3]), median(iv[4]), median(iv[5]), median(iv[6]), median(iv[7]));
  }
  // Tile boundaries (the second half of the buffer): a CSV beside the steps' and each consumer's
  // medians over CTA 0's boundaries.
  const uint64_t* hb = ht.data() + words;
  std::snprintf(path, sizeof path, "%s/bounds-%s-d%d-s%d-c%d.csv", dir, name, d, seqlen, int(causal));
  write_trace_csv(path, "boundary", hb, ht.data(), kSlots, 1, 4);
  for (int sl = 1; sl < kSlots; ++sl) {
    // `span`: from the tile's steady loop done to the later of O stored and the next tile's first
    // softmax done (the whole boundary, whatever order its events come in).
    // `tile`: from one tile's steady loop done to the next's (cycles a tile, all of it).
    std::vector<double> iv[9];
    for (int st = 1; st < kTraceSteps; ++st) {  // record 0 has no tile end before it
      const uint64_t* r = trace_record(hb, kSlots, 0, sl, st);
      if (r[0] == 0 || r[3] == 0 || r[7] == 0) break;
      for (int e = 0; e < 7; ++e) iv[e].push_back(double(r[e + 1]) - double(r[e]));
      iv[7].push_back(double(std::max(r[3], r[7])) - double(r[0]));
      if (st + 1 < kTraceSteps && r[kTraceEvents] != 0) iv[8].push_back(double(r[kTraceEvents]) - double(r[0]));
    }
    std::printf("BOUNDS %s d=%d seqlen=%d causal=%d consumer %d (%zu boundaries, medians in cycles): last-PV-issue %.0f  "
                "PV-wait %.0f  epilogue %.0f  Q-wait %.0f  S0-issue %.0f  S0-wait %.0f  softmax0 %.0f  | span %.0f  tile %.0f\n",
                name, d, seqlen, int(causal), sl - 1, iv[0].size(), median(iv[0]), median(iv[1]), median(iv[2]),
                median(iv[3]), median(iv[4]), median(iv[5]), median(iv[6]), median(iv[7]), median(iv[8]));
  }
  cudaFree(tr);
  cudaEventDestroy(ev[0]);
  cudaEventDestroy(ev[1]);
}

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // lines reach a pipe even if the run is cut short
  const char* mode = argc > 1 ? argv[1] : "all";
  int fails = 0;
  if (std::strcmp(mode, "soak") == 0) {  // soak D SEQLEN CAUSAL SECONDS [SCHEDULE [SECTION_MB]]
    const int d = argc > 2 ? std::atoi(argv[2]) : 128, seqlen = argc > 3 ? std::atoi(argv[3]) : 16384;
    const bool causal = argc > 4 && std::atoi(argv[4]) != 0;
    const double seconds = argc > 5 ? std::atof(argv[5]) : 5.0;
    soak_shape(d, seqlen, causal, seconds, argc > 6 ? std::atoi(argv[6]) : 0, argc > 7 ? std::atoll(argv[7]) : 0);
    return 0;
  }
  if (std::strcmp(mode, "trace") == 0) {
    const char* dir = argc > 2 ? argv[2] : ".";
    using namespace fa4::sm90;
    using D256 = FwdConfig<256, 80, 2, true, 0, 2, true, true, false, false, false, true>;  // shipped
    trace_shape<Traced<FwdConfig<128, 128, 2, true, 0>>>(dir, "d128", 128, 16384, false);
    trace_shape<Traced<FwdConfig<128, 128, 2, true, 0>>>(dir, "d128", 128, 4096, true);
    trace_shape<Traced<FwdConfig<64, 128, 4, true, 0, 3>>>(dir, "d64", 64, 16384, false);
    trace_shape<Traced<D256>>(dir, "d256", 256, 16384, false);
    // 4k non-causal: 32 key blocks a tile, so the tile boundaries show (the gap between a tile's
    // last steady-state step and the next tile's first).
    trace_shape<Traced<FwdConfig<128, 128, 2, true, 0>>>(dir, "d128", 128, 4096, false);
    trace_shape<Traced<FwdConfig<64, 128, 4, true, 0, 3>>>(dir, "d64", 64, 4096, false);
    trace_shape<Traced<D256>>(dir, "d256", 256, 4096, false);
    // 512: four key blocks a tile (80-wide at d256: seven), where the boundaries are most of a tile.
    trace_shape<Traced<FwdConfig<128, 128, 2, true, 0>>>(dir, "d128", 128, 512, false);
    trace_shape<Traced<D256>>(dir, "d256", 256, 512, false);
    // The rows once under the FA2 bar: d256 causal 512 (two to seven 80-key blocks a tile), d64 512
    // on three consumers (a third of the tiles with one idle; four consumers run it now), d128
    // causal 512 beside them.
    trace_shape<Traced<D256>>(dir, "d256", 256, 512, true);
    trace_shape<Traced<FwdConfig<64, 128, 4, true, 0, 3>>>(dir, "d64", 64, 512, false);
    trace_shape<Traced<FwdConfig<128, 128, 2, true, 0>>>(dir, "d128", 128, 512, true);
    // The shipped d256 causal 512 kernel (the serial step on 128-key blocks, d256_serial_step): only
    // each CTA's entry and end, where the launch's start and end go.
    trace_shape<Traced<D256SerialConfig<true>, kTraceCta>>(dir, "d256s", 256, 512, true);
    // d64 on two consumers (128-row tiles; shipped where fwd_launch.cuh's d64_consumers weighs them
    // cheapest), at the lengths where three consumers run instead, to compare their periods.
    trace_shape<Traced<FwdConfig<64, 128, 4, true, 0, 2>>>(dir, "d64c2", 64, 16384, false);
    trace_shape<Traced<FwdConfig<64, 128, 4, true, 0, 2>>>(dir, "d64c2", 64, 4096, false);
    if (argc > 3) {  // variants (`trace DIR variants`): configurations measured and not shipped
      // Turn modes (FwdConfig::kTurnMode): 1 the turn passes after S, 2 no turns.
      using D128T1 = FwdConfig<128, 128, 2, true, 0, 2, true, true, false, false, false, false, 1>;
      using D128T2 = FwdConfig<128, 128, 2, true, 0, 2, true, true, false, false, false, false, 2>;
      using D64T1 = FwdConfig<64, 128, 4, true, 0, 3, true, true, false, false, false, false, 1>;
      using D64T2 = FwdConfig<64, 128, 4, true, 0, 3, true, true, false, false, false, false, 2>;
      using D256T1 = FwdConfig<256, 80, 2, true, 0, 2, true, true, false, false, false, true, 1>;
      using D256T2 = FwdConfig<256, 80, 2, true, 0, 2, true, true, false, false, false, true, 2>;
      trace_shape<Traced<D128T1>>(dir, "d128t1", 128, 4096, false);
      trace_shape<Traced<D128T2>>(dir, "d128t2", 128, 4096, false);
      trace_shape<Traced<D64T1>>(dir, "d64t1", 64, 4096, false);
      trace_shape<Traced<D64T2>>(dir, "d64t2", 64, 4096, false);
      trace_shape<Traced<D256T1>>(dir, "d256t1", 256, 4096, false);
      trace_shape<Traced<D256T2>>(dir, "d256t2", 256, 4096, false);
      // d256 storing O from registers (before O was staged in shared memory): the boundaries' epilogue.
      using D256Direct = FwdConfig<256, 80, 2, true, 0>;
      trace_shape<Traced<D256Direct>>(dir, "d256direct", 256, 4096, false);
      trace_shape<Traced<D256Direct>>(dir, "d256direct", 256, 512, false);
      // P through shared memory (FwdConfig::kSmemP) at d64.
      using D64SmemP = FwdConfig<64, 128, 4, true, 0, 3, true, true, false, false, true>;
      trace_shape<Traced<D64SmemP>>(dir, "d64smemp", 64, 16384, false);
      trace_shape<Traced<D64SmemP>>(dir, "d64smemp", 64, 4096, false);
      trace_shape<Traced<FwdConfig<128, 128, 2, true, 0, 2, true, true, true>>>(dir, "d128turns", 128, 16384, false);
      trace_shape<Traced<FwdConfig<128, 128, 3, true, 0>>>(dir, "d128s3", 128, 16384, false);
      trace_shape<Traced<FwdConfig<128, 176, 2, true, 0>>>(dir, "d128n176", 128, 16384, false);
      // The d64 three-consumer kernel with parts of the timeline: each CTA's entry and end alone
      // (no spills), with the boundaries, with the steps.
      using D64 = FwdConfig<64, 128, 4, true, 0, 3>;
      using fa4::sm90::kTraceStep, fa4::sm90::kTraceBound, fa4::sm90::kTraceCta;
      trace_shape<Traced<D64, kTraceCta>>(dir, "d64cta", 64, 512, false);
      trace_shape<Traced<D64, kTraceCta | kTraceBound>>(dir, "d64bound", 64, 512, false);
      trace_shape<Traced<D64, kTraceCta | kTraceStep>>(dir, "d64step", 64, 512, false);
    }
    return 0;
  }
  if (std::strcmp(mode, "check") == 0 || std::strcmp(mode, "all") == 0) {
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
  if (std::strcmp(mode, "time") == 0 || std::strcmp(mode, "all") == 0) {
    for (int d : {64, 128, 256})
      for (bool causal : {false, true})
        for (int seqlen : {512, 1024, 2048, 4096, 8192, 16384}) time_shape(d, seqlen, causal);
  }
  if (std::strcmp(mode, "walks") == 0) {  // the diagonal-last walks of d256's causal pairs, same run
    int dev = 0, khz = 0, bits = 0;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&khz, cudaDevAttrMemoryClockRate, dev));
    CK(cudaDeviceGetAttribute(&bits, cudaDevAttrGlobalMemoryBusWidth, dev));
    std::printf("DRAM memory clock %d kHz, bus %d bits: %d GB/s (the launch walks every round from 4000)\n", khz, bits,
                fa4::sm90::dram_gbps(dev));
    static const Variant walks[] = {
        {0, "walk_never", 256, fa4::detail::sm90_forward, 8.0f, 1},
        {0, "walk_last_round", 256, fa4::detail::sm90_forward, 8.0f, 2},
        {0, "walk_every_round", 256, fa4::detail::sm90_forward, 8.0f, 3},
    };
    const int rounds = argc > 2 ? std::max(1, std::atoi(argv[2])) : 6;
    for (const Variant& w : walks) compare_variant(w, 512, true);
    // Each shape's rounds, then the median over rounds of each walk and its ratio to the launch's.
    for (int seqlen : {512, 768, 1024}) {
      std::vector<std::vector<double>> ms(4);  // the launch's choice, then walks[0..2]
      for (int r = 0; r < rounds; ++r) {
        ms[0].push_back(time_shape(256, seqlen, true));
        for (int w = 0; w < 3; ++w) ms[w + 1].push_back(time_shape(256, seqlen, true, &walks[w]));
      }
      auto median = [](std::vector<double> v) {
        std::sort(v.begin(), v.end());
        return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
      };
      const double chosen = median(ms[0]);
      std::printf("MEDIAN d=256 seqlen=%d causal=1 over %d rounds: default %.4f ms", seqlen, rounds, chosen);
      for (int w = 0; w < 3; ++w) {
        const double m = median(ms[w + 1]);
        std::printf(", %s %.4f ms (%.3f of the default's time)", walks[w].name, m, m / chosen);
      }
      std::printf("\n");
    }
    return 0;
  }
  if (std::strcmp(mode, "decode") == 0) {  // decoding shapes: the stream-K tail and d64's consumers
    struct Dec { int b, hq, hkv, sk, d; };
    std::vector<Dec> shapes = {{1, 32, 8, 32768, 128}, {8, 32, 8, 8192, 128}, {32, 32, 8, 4096, 128},
                               {64, 64, 8, 2048, 128}, {16, 16, 1, 8192, 128}, {8, 32, 4, 8192, 64},
                               {8, 16, 4, 8192, 256},  {8, 32, 32, 8192, 128}};
    if (const char* list = std::getenv("FA4_DECODE_SHAPES")) {  // "B,HQ,HKV,SK,D;..." in their place
      shapes.clear();
      for (const char* c = list; *c;) {
        Dec x{};
        if (std::sscanf(c, "%d,%d,%d,%d,%d", &x.b, &x.hq, &x.hkv, &x.sk, &x.d) == 5) shapes.push_back(x);
        c = std::strchr(c, ';');
        if (!c) break;
        ++c;
      }
    }
    // decode: FwdParams::decode (1: the tile kernels, 2: the decoding kernel wherever it runs).
    struct Way { const char* name; Launcher fn; int split, d; bool bhsd = false; int decode = 1; };
    static const Way ways[] = {
        {"launch", fa4::detail::sm90_forward, 0, 0},      {"split_never", fa4::detail::sm90_forward, 1, 0},
        {"split_always", fa4::detail::sm90_forward, 2, 0}, {"d64_two", run_cfg<64, 128, 4, 0, 2>, 0, 64},
        {"d64_three", run_cfg<64, 128, 4, 0, 3>, 0, 64},
        // K and V read as [batch, heads, seq, dim] (other values, the same bytes): each head's keys
        // contiguous instead of interleaved with the other heads' rows
        {"launch_kv_bhsd", fa4::detail::sm90_forward, 0, 0, true}, {"split_never_kv_bhsd", fa4::detail::sm90_forward, 1, 0, true},
        // The decoding kernel (sm90/decode_kernel.cuh) where it runs (head dims 64 and 128).
        {"decode_kernel", fa4::detail::sm90_forward, 0, 0, false, 2}, {"decode_kernel_kv_bhsd", fa4::detail::sm90_forward, 0, 0, true, 2},
    };
    const int rounds = argc > 2 ? std::max(1, std::atoi(argv[2])) : 5;
    ColdTimer timer;
    for (const Dec& x : shapes) {
      const Shape sh{x.b, x.hq, x.hkv, 1, x.sk, x.d, false};
      const size_t nq = size_t(x.b) * x.hq * x.d, nkv = size_t(x.b) * x.sk * x.hkv * x.d;
      void *q, *k, *v, *o;
      CK(cudaMalloc(&q, nq * 2)); CK(cudaMalloc(&o, nq * 2)); CK(cudaMalloc(&k, nkv * 2)); CK(cudaMalloc(&v, nkv * 2));
      fill_device(q, nq, 7); fill_device(k, nkv, 8); fill_device(v, nkv, 9);
      FwdParams p = make_params(sh, q, k, v, o, nullptr);
      std::vector<std::vector<double>> us(std::size(ways));
      for (int r = 0; r < rounds; ++r)
        for (size_t w = 0; w < std::size(ways); ++w) {
          if ((ways[w].d != 0 && ways[w].d != x.d) || (ways[w].decode == 2 && x.d == 256)) continue;
          FwdParams pw = p;
          pw.split = ways[w].split;
          pw.decode = ways[w].decode;
          if (ways[w].bhsd)
            for (int64_t* st : {pw.k_stride, pw.v_stride}) st[1] = x.d, st[2] = int64_t(x.sk) * x.d;
          us[w].push_back(timer.median_us(ways[w].fn, pw));
        }
      const double bytes = 2.0 * (2.0 * nq + 2.0 * nkv);
      std::printf("DECODE b=%d hq=%d hkv=%d sk=%d d=%d (folded: %d rows of %d heads)", x.b, x.hq, x.hkv, x.sk, x.d,
                  p.seqlen_q, p.heads_q);
      for (size_t w = 0; w < std::size(ways); ++w) {
        if (us[w].empty()) continue;
        std::sort(us[w].begin(), us[w].end());
        const double m = us[w][us[w].size() / 2];
        std::printf(", %s %.1f us %.0f GB/s [%.1f-%.1f]", ways[w].name, m, bytes / (m * 1e-6) / 1e9, us[w].front(),
                    us[w].back());
      }
      std::printf("\n");
      cudaFree(q); cudaFree(o); cudaFree(k); cudaFree(v);
    }
    return 0;
  }
  if (std::strcmp(mode, "fold") == 0) {  // query groups folded into rows against a tile a query head
    struct Spec { int b, sq, hq, hkv, sk, d, causal = 1; };
    std::vector<Spec> shapes = {{1, 4, 32, 8, 8192, 128},  {8, 4, 32, 8, 8192, 128}, {8, 2, 32, 8, 8192, 128},
                                {8, 8, 32, 8, 8192, 128},  {32, 4, 32, 8, 4096, 128}, {8, 16, 64, 8, 8192, 128},
                                {16, 4, 16, 1, 8192, 128}, {8, 4, 32, 4, 8192, 64},  {8, 4, 16, 4, 8192, 256}};
    if (const char* list = std::getenv("FA4_FOLD_SHAPES")) {
      shapes.clear();
      for (const char* c = list; *c;) {
        Spec x{};
        const int got = std::sscanf(c, "%d,%d,%d,%d,%d,%d,%d", &x.b, &x.sq, &x.hq, &x.hkv, &x.sk, &x.d, &x.causal);
        if (got == 6) x.causal = 1;
        if (got >= 6) shapes.push_back(x);
        c = std::strchr(c, ';');
        if (!c) break;
        ++c;
      }
    }
    const int rounds = argc > 2 ? std::max(1, std::atoi(argv[2])) : 5;
    ColdTimer timer;
    for (const Spec& x : shapes) {
      const Shape sh{x.b, x.hq, x.hkv, x.sq, x.sk, x.d, x.causal != 0};
      const size_t nq = size_t(x.b) * x.sq * x.hq * x.d, nkv = size_t(x.b) * x.sk * x.hkv * x.d;
      void *q, *k, *v, *o;
      float* lse;
      CK(cudaMalloc(&q, nq * 2)); CK(cudaMalloc(&o, nq * 2)); CK(cudaMalloc(&k, nkv * 2)); CK(cudaMalloc(&v, nkv * 2));
      CK(cudaMalloc(&lse, size_t(x.b) * x.hq * x.sq * 4));
      fill_device(q, nq, 7); fill_device(k, nkv, 8); fill_device(v, nkv, 9);
      const FwdParams folded = make_params(sh, q, k, v, o, lse);
      int dev = 0;
      CK(cudaGetDevice(&dev));
      const bool kept = fa4::sm90::fold_pays(folded, fa4::detail::multiprocessors(dev));  // else the launch unfolds
      FwdParams plain = folded;  // the fold undone: a tile a query head
      if (plain.fold > 0) fa4::sm90::unfold_query_rows(&plain);
      // The launch (its rule), the rows folded whatever the rule says, and unfolded.
      const Launcher fns[3] = {fa4::detail::sm90_forward, fa4::detail::sm90_forward_rows, fa4::detail::sm90_forward_rows};
      const FwdParams* ways[3] = {&folded, &folded, &plain};
      std::vector<double> us[3];
      for (int r = 0; r < rounds; ++r)
        for (int w = 0; w < 3; ++w) us[w].push_back(timer.median_us(fns[w], *ways[w]));
      for (auto& u : us) std::sort(u.begin(), u.end());
      const double l = us[0][us[0].size() / 2], f = us[1][us[1].size() / 2], u = us[2][us[2].size() / 2];
      const double bytes = 2.0 * (2.0 * nq + 2.0 * nkv);
      std::printf("FOLD b=%d sq=%d hq=%d hkv=%d sk=%d d=%d %s (fold %d: %d rows of %d heads; the launch %s): "
                  "launch %.1f us %.0f GB/s [%.1f-%.1f], folded %.1f us [%.1f-%.1f], unfolded %.1f us [%.1f-%.1f], "
                  "unfolded / folded %.2f\n",
                  x.b, x.sq, x.hq, x.hkv, x.sk, x.d, x.causal ? "causal" : "non-causal", folded.fold, folded.seqlen_q,
                  folded.heads_q, kept ? "keeps it" : "unfolds (fold_pays)", l, bytes / (l * 1e-6) / 1e9,
                  us[0].front(), us[0].back(), f, us[1].front(), us[1].back(), u, us[2].front(), us[2].back(), u / f);
      cudaFree(q); cudaFree(o); cudaFree(k); cudaFree(v); cudaFree(lse);
    }
    return 0;
  }
  if (std::strcmp(mode, "variants") == 0) {  // candidates against the shipped kernel, same run
    // Candidates against the shipped kernel, each timed twice in turn: the earlier tile order
    // (schedule 3: static rounds, one section of every head; 4: the counter over that section).
    static const Variant variants[] = {
        // Row sums of P on the tensor cores (FwdConfig::kTensorRowSum), d64: +1...+5 % in fa4-bench
        // A/B, LSE from 16-bit P sums (docs/perf-notes.md).
        {0, "d64_tensor_row_sum", 64, run_cfg<64, 128, 4, 0, 3, true, true, false, true>, 8.0f},
        // The exact step on every block (FwdConfig::kNoBlockMax off): the shipped kernels before
        // the row-max-free step, d64 -7...-11 % and d128 -3...-5 % in fa4-bench A/B.
        {0, "d64_exact_step", 64, run_cfg<64, 128, 4, 0, 3, true, true, false, false, false>, 8.0f},
        {0, "d128_exact_step", 128, run_cfg<128, 128, 2, 0, 2, true, true, false, false, false>, 8.0f},
        // K and V as one TMA box a block (FoldedKV), the shipped configurations otherwise: the
        // calibration's per-box cost (343 cycles whatever the size) puts d256's eight boxes a
        // block at 2744 cycles against 2560 of GEMMs (docs/perf-notes.md).
        {0, "d128_folded_kv", 128,
         run_folded<fa4::sm90::FwdConfig<128, 128, fa4::sched::sm90_fwd::kKVStages, true, 0>>, 8.0f},
        {0, "d256_folded_kv", 256,
         run_folded<fa4::sm90::FwdConfig<256, 80, 2, true, 0, 2, true, true, false, false, false, true>>, 8.0f},
        {3, "d128_old_order", 128, fa4::detail::sm90_forward, 8.0f},
        {4, "d128_dynamic_one_section", 128, fa4::detail::sm90_forward, 8.0f},
        {3, "d256_old_order", 256, fa4::detail::sm90_forward, 8.0f},
        {4, "d256_dynamic_one_section", 256, fa4::detail::sm90_forward, 8.0f},
    };
    // FA4_VARIANTS="d256_folded_kv,..." keeps only the variants named.
    auto wanted = [](const Variant& v) {
      const char* only = std::getenv("FA4_VARIANTS");
      return !only || (std::string(",") + only + ",").find(std::string(",") + v.name + ",") != std::string::npos;
    };
    for (const Variant& v : variants)
      if (wanted(v))
        for (bool causal : {false, true}) compare_variant(v, 4096, causal);
    for (const Variant& v : variants) {
      if (!wanted(v)) continue;
      for (bool causal : {true, false})
        for (int seqlen : {512, 1024, 4096, 16384}) {
          for (int rep = 0; rep < 2; ++rep) {
            time_shape(v.d, seqlen, causal);
            time_shape(v.d, seqlen, causal, &v);
          }
        }
    }
    return 0;
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
