// Kernel-level probe of the sm90 backward, below the public API: the shipped dK/dV configuration
// of each head dim beside candidate ones (sm90::bwd::BwdConfig), each checked against float64 and
// timed in alternating rounds in one process. For kernel development (cmake -DFA4_BUILD_PROBE=ON):
//   sm90_bwd_probe check           every configuration on small shapes (odd lengths, GQA, causal,
//                                  windows, deterministic) against the float64 backward, with the
//                                  GPU tests' criterion
//   sm90_bwd_probe time [ROUNDS]   FA3 shapes (16k tokens, hidden 2048, bf16, seqlen 512..16k,
//                                  causal and not): each candidate's dK and dV must equal the
//                                  shipped configuration's bit for bit and its dQ agree to the
//                                  atomics' rounding, then all are timed in ROUNDS rounds (default
//                                  5), the order rotating, L2 flushed before every launch; medians,
//                                  and ratios against the shipped configuration. `RESULT {json}`
//                                  lines carry every number for bench/results.
//   sm90_bwd_probe trace DIR [SEQLEN]
//                                  the shipped configurations with clock64 stamps (BwdConfig::kTrace,
//                                  StepTrace in sm90/bwd_kernel.cuh) on the FA3 shape of SEQLEN
//                                  (default 4096, non-causal): per warpgroup the median cycles
//                                  between consecutive stamps (where both exist) and the step's
//                                  period, over all steps and by step parity (d64's warpgroups take
//                                  dQ in turn), the offset between the two warpgroups, the cycles
//                                  from the CTA's entry to its first step and from its last step to
//                                  its end; every stamp in DIR/bwd-trace-dD.csv
//   FA4_PROBE_ONLY="128,256"       keeps only those head dims (64, 128, 192, 192/128, 256; "shipped"
//                                  at 192 and 192/128 is the d192 kernel the API takes with
//                                  detail::set_backward_d192; diagnostics, wrong by design, are timed
//                                  and never checked or compared)
//   FA4_PROBE_CONFIGS="shipped"    keeps only the configurations named (time: and the shipped one)
//   FA4_PROBE_SEQLENS="4096"       time: keeps only those sequence lengths
//   FA4_PROBE_DETERMINISTIC=1      time: the deterministic mode
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "common/validate.h"
#include "convert.h"
#include "fa4/attention.h"
#include "probe_util.cuh"
#include "reference.h"
#include "sm90/bwd_launch.cuh"

namespace {

using fa4::detail::BwdParams;
using fa4::sm90::bwd::BwdConfig;

using Launcher = fa4::Status (*)(const BwdParams&, cudaStream_t);
template <class Cfg>
fa4::Status run_cfg(const BwdParams& p, cudaStream_t s) {
  return fa4::detail::launch_backward<Cfg>(p, s);
}

struct Config {
  const char* name;
  int d;
  Launcher fn;
  int dv = 0;               // v's, o's, dout's and dv's head dim where not d's (192 / 128)
  bool diagnostic = false;  // wrong results by design (timed, never compared or checked)
  int value_dim() const { return dv > 0 ? dv : d; }
};

// The shipped configuration first for each head dim, then candidates (BwdKnobs): dS^T (d256: P^T
// and dS^T) stored a pair at a time by st.shared, as before stmatrix (`stmatrix`); the
// configurations shipped before a step's LSE and D rows were read by ld.shared (`stats_lds`; d64
// and d128) and P^T's exponentials were split into a loop with the mask's tests and one without
// (`mask_hoist`); d256 with ld.shared; d64's loads issued by a warpgroup of their own (`load_issue`
// 2, measured and not kept; here so that it builds and checks); d64 as shipped before its dQ went
// to alternate warpgroups (`pair-sum`), and that form on three step and dS^T buffers or with the
// loads at the step's top, and with its dQ staged and bulk-reduced (`staged`); d128's dQ added by
// atomics (`dq_atomics`); d64's and d128's loads issued by warpgroup 1 (`load_wg`); dK and dV
// stored straight from the accumulator layout (`direct-stores`, `staged_stores` false); K and V
// loaded by cp.async (`cp-async-kv`, `kv_tma` false); the memset and the kernels one after the
// other (`serial`; `pdl` at d256); the deterministic dQ kernel after the dK/dV kernel
// (`dq-after-dkdv`). Candidates measured before (step-ring depths, folded boxes, paired row
// statistics, dQ by keys at d128, the d128 lockstep and dQ-lag forms, d64's reduction of each
// partial, shares of the exponentials on the FMA pipe, the load issue after the first GEMMs, the
// other form of the walk's step) are recorded in docs/perf-notes.md and bench/results/; BwdKnobs
// still builds them. Those measured and removed (a walk rotated by key block among them) are
// patches in bench/results/.
using fa4::sm90::bwd::bwd_knobs;
using fa4::sm90::bwd::BwdKnobs;
constexpr auto kStShared = [](BwdKnobs& k) { k.stmatrix = false; };
constexpr auto kPerElementMask = [](BwdKnobs& k) { k.stats_lds = k.mask_hoist = k.stmatrix = false; };
constexpr BwdKnobs kStShared64 = bwd_knobs(64, kStShared), kStShared128 = bwd_knobs(128, kStShared),
                   kStShared256 = bwd_knobs(256, kStShared);
constexpr BwdKnobs kPerElementMask64 = bwd_knobs(64, kPerElementMask), kPerElementMask128 = bwd_knobs(128, kPerElementMask),
                   kPerElementMask256 = bwd_knobs(256, kPerElementMask);
constexpr BwdKnobs kLoadingWarp64 = bwd_knobs(64, [](BwdKnobs& k) { k.load_issue = 2; });
constexpr BwdKnobs kStatsLds256 = bwd_knobs(256, [](BwdKnobs& k) { k.stats_lds = true; });
// d64 as shipped before dQ by alternate warpgroups: dQ by keys, the two partials summed in shared
// memory, in lockstep (no lag, no skew), the loads at the step's top, the step from its index.
constexpr BwdKnobs kPairSum64 = bwd_knobs(64, [](BwdKnobs& k) {
  k.dq_alternate = k.dq_atomics = false;
  k.dq_by_keys = k.dq_pair_sum = true;
  k.dq_lag_bufs = k.skew = k.load_issue = 0;
  k.step_cursor = false;
});
// d64 by alternate warpgroups on three step buffers and three dS^T buffers (shipped at 999974a),
// and with the loads at the step's top.
constexpr BwdKnobs kAlternateThreeBufs64 = bwd_knobs(64, [](BwdKnobs& k) { k.step_bufs = k.dq_lag_bufs = 3; });
constexpr BwdKnobs kAlternateLoadsAtTop64 = bwd_knobs(64, [](BwdKnobs& k) { k.load_issue = 0; });
// d64's dQ staged and bulk-reduced (shipped at 978fd41), and d128's added by atomics (dq_atomics).
constexpr BwdKnobs kStaged64 = bwd_knobs(64, [](BwdKnobs& k) { k.dq_atomics = false; });
constexpr BwdKnobs kDqAtomics128 = bwd_knobs(128, [](BwdKnobs& k) { k.dq_atomics = true; });
// The step's loads issued by warpgroup 1's first thread (load_wg), measured and not kept.
constexpr auto kLoadsWg1 = [](BwdKnobs& k) { k.load_wg = 1; };
constexpr BwdKnobs kLoadsWg1_64 = bwd_knobs(64, kLoadsWg1), kLoadsWg1_128 = bwd_knobs(128, kLoadsWg1);
// dK and dV stored straight from the accumulator layout, d128's last reductions waited for to
// completion (`staged_stores` false), as before.
constexpr auto kDirectStores = [](BwdKnobs& k) { k.staged_stores = false; };
constexpr BwdKnobs kDirectStores64 = bwd_knobs(64, kDirectStores), kDirectStores128 = bwd_knobs(128, kDirectStores),
                   kDirectStores256 = bwd_knobs(256, kDirectStores);
// K and V loaded by every thread's cp.async, as before (`kv_tma` false).
constexpr auto kCpAsyncKv = [](BwdKnobs& k) { k.kv_tma = false; };
constexpr BwdKnobs kCpAsyncKv64 = bwd_knobs(64, kCpAsyncKv), kCpAsyncKv128 = bwd_knobs(128, kCpAsyncKv),
                   kCpAsyncKv256 = bwd_knobs(256, kCpAsyncKv);
// The accumulator zeroed by a memset and D's kernel and the dK/dV kernel launched one after the
// other (`serial`, `pdl` false; d64, d128), and at d256 as d64 and d128 ship them (`pdl`).
constexpr auto kSerial = [](BwdKnobs& k) { k.pdl = false; };
constexpr BwdKnobs kSerial64 = bwd_knobs(64, kSerial), kSerial128 = bwd_knobs(128, kSerial),
                   kPdl256 = bwd_knobs(256, [](BwdKnobs& k) { k.pdl = true; });
// The deterministic dQ kernel launched after the dK/dV kernel, as before (`dq-after-dkdv`,
// `dq_overlap` false; time it with FA4_PROBE_DETERMINISTIC=1).
constexpr auto kDqAfter = [](BwdKnobs& k) { k.dq_overlap = false; };
constexpr BwdKnobs kDqAfter64 = bwd_knobs(64, kDqAfter), kDqAfter128 = bwd_knobs(128, kDqAfter),
                   kDqAfter256 = bwd_knobs(256, kDqAfter);
// d192 (the split kernel's by-operand form): its dQ pieces added by atomics from the registers, as
// d256 adds them (`dq_atomics`), against the staged bulk reductions; and with st.shared.
constexpr BwdKnobs kDqAtomics192 = bwd_knobs(192, [](BwdKnobs& k) { k.dq_atomics = true; }),
                   kStShared192 = bwd_knobs(192, kStShared);
// d192 and 192 / 128: dQ's pieces computed and not added (`dq-unreduced`, a diagnostic: the step
// without its reductions); 192 / 128, whose narrower V and dO leave the room, on two 16 KB stages
// a warpgroup (`dq-two-stages`: a piece staged while the last one's reduction still reads).
constexpr BwdKnobs kDqUnreduced192 = bwd_knobs(192, [](BwdKnobs& k) { k.dq_unreduced = true; }),
                   kDqTwoStages192 = bwd_knobs(192, [](BwdKnobs& k) { k.dq_stages = 2; });
// d192 and 192 / 128 as shipped before the warpgroup index went through a shuffle (`divergent-wg`:
// every wgmma serialized, ptxas C7520).
constexpr BwdKnobs kDivergentWg192 = bwd_knobs(192, [](BwdKnobs& k) { k.divergent_wg = true; });
const Config kConfigs[] = {
    {"shipped", 64, run_cfg<BwdConfig<64, true>>},
    {"serial", 64, run_cfg<BwdConfig<64, true, kSerial64>>},
    {"dq-after-dkdv", 64, run_cfg<BwdConfig<64, true, kDqAfter64>>},
    {"direct-stores", 64, run_cfg<BwdConfig<64, true, kDirectStores64>>},
    {"cp-async-kv", 64, run_cfg<BwdConfig<64, true, kCpAsyncKv64>>},
    {"st-shared", 64, run_cfg<BwdConfig<64, true, kStShared64>>},
    {"per-element-mask", 64, run_cfg<BwdConfig<64, true, kPerElementMask64>>},
    {"loading-warp", 64, run_cfg<BwdConfig<64, true, kLoadingWarp64>>},
    {"pair-sum", 64, run_cfg<BwdConfig<64, true, kPairSum64>>},
    {"alternate-three-bufs", 64, run_cfg<BwdConfig<64, true, kAlternateThreeBufs64>>},
    {"alternate-loads-at-top", 64, run_cfg<BwdConfig<64, true, kAlternateLoadsAtTop64>>},
    {"loads-from-warpgroup-1", 64, run_cfg<BwdConfig<64, true, kLoadsWg1_64>>},
    {"staged", 64, run_cfg<BwdConfig<64, true, kStaged64>>},
    {"shipped", 128, run_cfg<BwdConfig<128, true>>},
    {"serial", 128, run_cfg<BwdConfig<128, true, kSerial128>>},
    {"dq-after-dkdv", 128, run_cfg<BwdConfig<128, true, kDqAfter128>>},
    {"direct-stores", 128, run_cfg<BwdConfig<128, true, kDirectStores128>>},
    {"cp-async-kv", 128, run_cfg<BwdConfig<128, true, kCpAsyncKv128>>},
    {"loads-from-warpgroup-1", 128, run_cfg<BwdConfig<128, true, kLoadsWg1_128>>},
    {"dq-atomics", 128, run_cfg<BwdConfig<128, true, kDqAtomics128>>},
    {"st-shared", 128, run_cfg<BwdConfig<128, true, kStShared128>>},
    {"per-element-mask", 128, run_cfg<BwdConfig<128, true, kPerElementMask128>>},
    {"shipped", 192, run_cfg<BwdConfig<192, true>>},
    {"dq-atomics", 192, run_cfg<BwdConfig<192, true, kDqAtomics192>>},
    {"st-shared", 192, run_cfg<BwdConfig<192, true, kStShared192>>},
    {"dq-unreduced", 192, run_cfg<BwdConfig<192, true, kDqUnreduced192>>, 0, true},
    {"divergent-wg", 192, run_cfg<BwdConfig<192, true, kDivergentWg192>>},
    {"shipped", 192, run_cfg<BwdConfig<192, true, bwd_knobs(192), 128>>, 128},
    {"dq-atomics", 192, run_cfg<BwdConfig<192, true, kDqAtomics192, 128>>, 128},
    {"dq-two-stages", 192, run_cfg<BwdConfig<192, true, kDqTwoStages192, 128>>, 128},
    {"dq-unreduced", 192, run_cfg<BwdConfig<192, true, kDqUnreduced192, 128>>, 128, true},
    {"divergent-wg", 192, run_cfg<BwdConfig<192, true, kDivergentWg192, 128>>, 128},
    {"shipped", 256, run_cfg<BwdConfig<256, true>>},
    {"pdl", 256, run_cfg<BwdConfig<256, true, kPdl256>>},
    {"dq-after-dkdv", 256, run_cfg<BwdConfig<256, true, kDqAfter256>>},
    {"direct-stores", 256, run_cfg<BwdConfig<256, true, kDirectStores256>>},
    {"cp-async-kv", 256, run_cfg<BwdConfig<256, true, kCpAsyncKv256>>},
    {"st-shared", 256, run_cfg<BwdConfig<256, true, kStShared256>>},
    {"per-element-mask", 256, run_cfg<BwdConfig<256, true, kPerElementMask256>>},
    {"stats-lds", 256, run_cfg<BwdConfig<256, true, kStatsLds256>>},
};

// Whether `item` is in the comma-separated list of environment variable `env` (unset: every item).
bool listed(const char* env, const std::string& item) {
  const char* only = std::getenv(env);
  if (!only) return true;
  const std::string s = std::string(",") + only + ",";
  return s.find("," + item + ",") != std::string::npos;
}
// Head dims by name: "192", or "192/128" where v's differs.
std::string dims_name(int d, int dv) { return dv == d || dv == 0 ? std::to_string(d) : std::to_string(d) + "/" + std::to_string(dv); }
bool wanted(int d, int dv = 0) { return listed("FA4_PROBE_ONLY", dims_name(d, dv)); }
// The head dims the modes walk: each kernel head dim, and DeepSeek's 192 / 128.
constexpr std::pair<int, int> kDims[] = {{64, 64}, {128, 128}, {192, 192}, {192, 128}, {256, 256}};
// check: FA4_PROBE_CONFIGS="shipped,lockstep" keeps only the configurations named.
bool wanted_config(const char* name) { return listed("FA4_PROBE_CONFIGS", name); }

struct Shape {
  int b, hq, hkv, sq, sk, d;
  bool causal;
  int left = -1, right = -1;
  bool deterministic = false;
  int dv = 0;  // (0: d's)
  int value_dim() const { return dv > 0 ? dv : d; }
};

fa4::Problem problem_of(const Shape& s) {
  fa4::Problem p;
  p.dtype = fa4::DType::kBF16;
  p.batch = s.b, p.seqlen_q = s.sq, p.seqlen_k = s.sk, p.heads_q = s.hq, p.heads_kv = s.hkv;
  p.head_dim = s.d, p.causal = s.causal, p.window_left = s.left, p.window_right = s.right;
  p.head_dim_v = s.value_dim() == s.d ? 0 : s.value_dim();
  return p;
}

// One problem's device buffers (contiguous BSHD bf16; LSE fp32 [b][hq][sq]) and its parameters.
struct Device {
  size_t nq, nk, nqv, nkv;  // elements of q (dq), k (dk), o (dout), v (dv)
  void *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr, *dout = nullptr;
  void *dq = nullptr, *dk = nullptr, *dv = nullptr, *ws = nullptr;
  float* lse = nullptr;
  BwdParams p{};
  explicit Device(const Shape& s)
      : nq(size_t(s.b) * s.sq * s.hq * s.d), nk(size_t(s.b) * s.sk * s.hkv * s.d),
        nqv(size_t(s.b) * s.sq * s.hq * s.value_dim()), nkv(size_t(s.b) * s.sk * s.hkv * s.value_dim()) {
    for (void** x : {&q, &dq}) CK(cudaMalloc(x, std::max<size_t>(nq, 1) * 2));
    for (void** x : {&o, &dout}) CK(cudaMalloc(x, std::max<size_t>(nqv, 1) * 2));
    for (void** x : {&k, &dk}) CK(cudaMalloc(x, std::max<size_t>(nk, 1) * 2));
    for (void** x : {&v, &dv}) CK(cudaMalloc(x, std::max<size_t>(nkv, 1) * 2));
    CK(cudaMalloc(&lse, std::max<size_t>(size_t(s.b) * s.hq * s.sq, 1) * 4));
    const int dvv = s.value_dim();
    fa4::BackwardArgs a;
    a.problem = problem_of(s);
    a.q = fa4::bshd(q, s.sq, s.hq, s.d), a.k = fa4::bshd(k, s.sk, s.hkv, s.d), a.v = fa4::bshd(v, s.sk, s.hkv, dvv);
    a.o = fa4::bshd(o, s.sq, s.hq, dvv), a.dout = fa4::bshd(dout, s.sq, s.hq, dvv), a.lse = lse;
    a.dq = fa4::bshd(dq, s.sq, s.hq, s.d), a.dk = fa4::bshd(dk, s.sk, s.hkv, s.d), a.dv = fa4::bshd(dv, s.sk, s.hkv, dvv);
    a.deterministic = s.deterministic;
    size_t bytes = 0;
    fa4::Status st = fa4::backward_workspace_size(a, &bytes);
    if (!st.ok()) { std::printf("workspace: %s\n", st.message.c_str()); std::exit(1); }
    CK(cudaMalloc(&ws, bytes));
    a.workspace = ws, a.workspace_bytes = bytes;
    st = fa4::validate(a);
    if (!st.ok()) { std::printf("validate: %s\n", st.message.c_str()); std::exit(1); }
    p = fa4::detail::make_bwd_params(a);
  }
  ~Device() {
    for (void* x : {q, k, v, o, dout, dq, dk, dv, ws}) cudaFree(x);
    cudaFree(lse);
  }
  // Gradients poisoned (NaN), then the configuration's backward.
  void run(const Config& c) {
    CK(cudaMemset(dq, 0xFF, nq * 2));
    CK(cudaMemset(dk, 0xFF, nk * 2));
    CK(cudaMemset(dv, 0xFF, nkv * 2));
    const fa4::Status st = c.fn(p, 0);
    if (!st.ok()) { std::printf("%s d%s: %s\n", c.name, dims_name(c.d, c.value_dim()).c_str(), st.message.c_str()); std::exit(1); }
    CK(cudaDeviceSynchronize());
  }
};

std::vector<uint16_t> download(const void* x, size_t n) {
  std::vector<uint16_t> h(n);
  CK(cudaMemcpy(h.data(), x, n * 2, cudaMemcpyDeviceToHost));
  return h;
}
void upload(void* dst, const std::vector<double>& x) {
  const std::vector<uint16_t> h = fa4::ref::to_bits(fa4::DType::kBF16, x);
  CK(cudaMemcpy(dst, h.data(), h.size() * 2, cudaMemcpyHostToDevice));
}

// DESIGN.md §3 for one gradient, as tests/test_backward_gpu.cu's check_gradient: max|out - exact| <=
// 2 max|plain - exact| + 1e-3, and ||out - exact|| / ||exact|| <= 1e-2 unless the gradient is 0 in
// exact arithmetic; NaN (an element never written) fails. Its largest error into *max_err.
bool within(const std::vector<uint16_t>& out_bits, const std::vector<double>& exact, const std::vector<double>& plain,
            double* max_err) {
  const fa4::ref::ErrorStats e = fa4::ref::error_stats(fa4::ref::from_bits(fa4::DType::kBF16, out_bits), exact);
  const fa4::ref::ErrorStats e_plain = fa4::ref::error_stats(plain, exact);
  *max_err = e.max_abs;
  const bool exact_zero = std::all_of(exact.begin(), exact.end(), [](double x) { return x == 0.0; });
  return !std::isnan(e.max_abs) && e.max_abs <= 2.0 * e_plain.max_abs + 1e-3 &&
         (exact_zero || e.rel_frobenius <= 1e-2);
}

int check_all() {
  const Shape shapes[] = {
      {1, 2, 2, 239, 300, 0, false},          {2, 4, 2, 300, 239, 0, true},
      {1, 8, 1, 17, 128, 0, false, 40, 7},    {1, 2, 2, 1, 1, 0, false},
      {1, 4, 2, 200, 200, 0, true, -1, 0, true}, {2, 4, 2, 200, 520, 0, false},
  };
  int fails = 0;
  for (const auto [d, dv] : kDims) {
    if (!wanted(d, dv)) continue;
    for (Shape s : shapes) {
      s.d = d, s.dv = dv;
      const fa4::Problem p = problem_of(s);
      std::mt19937 rng(1234 + s.sq * 7 + s.sk + d + dv);
      std::normal_distribution<double> normal(0.0, 1.0);
      auto random = [&](int64_t n) {
        std::vector<double> x(n);
        for (double& e : x) e = fa4::ref::round_to(p.dtype, float(normal(rng)));
        return x;
      };
      const std::vector<double> q = random(fa4::ref::q_elems(p)), k = random(fa4::ref::kv_elems(p)),
                                v = random(fa4::ref::v_elems(p)), dout = random(fa4::ref::o_elems(p));
      const fa4::ref::Forward64 f = fa4::ref::forward(p, q, k, v);
      const fa4::ref::Backward64 exact = fa4::ref::backward(p, q, k, v, dout);
      const fa4::ref::Backward64 plain = fa4::ref::backward_lowp(p, q, k, v, dout);
      Device dev(s);
      upload(dev.q, q), upload(dev.k, k), upload(dev.v, v), upload(dev.dout, dout);
      upload(dev.o, fa4::ref::rounded(p.dtype, f.o));
      std::vector<float> lse(f.lse.begin(), f.lse.end());
      CK(cudaMemcpy(dev.lse, lse.data(), lse.size() * 4, cudaMemcpyHostToDevice));
      for (const Config& c : kConfigs) {
        if (c.d != d || c.value_dim() != dv || c.diagnostic || !wanted_config(c.name)) continue;
        dev.run(c);
        double eq = 0, ek = 0, ev = 0;
        const bool ok_q = within(download(dev.dq, dev.nq), exact.dq, plain.dq, &eq);
        const bool ok_k = within(download(dev.dk, dev.nk), exact.dk, plain.dk, &ek);
        const bool ok_v = within(download(dev.dv, dev.nkv), exact.dv, plain.dv, &ev);
        const bool ok = ok_q && ok_k && ok_v;
        fails += !ok;
        std::printf("%s %-24s d=%s b=%d hq=%d hkv=%d sq=%d sk=%d causal=%d win=(%d,%d) det=%d: max|err| dq %.3g dk %.3g "
                    "dv %.3g\n",
                    ok ? "PASS" : "FAIL", c.name, dims_name(d, dv).c_str(), s.b, s.hq, s.hkv, s.sq, s.sk, int(s.causal),
                    s.left, s.right, int(s.deterministic), eq, ek, ev);
      }
    }
  }
  std::printf("%s: %d failed\n", fails ? "FAIL" : "PASS", fails);
  return fails ? 1 : 0;
}

// Random Q, K, V and dO on the device, and O and the LSE from fa4's forward (exits on failure).
void fa3_inputs(const Shape& s, Device& dev) {
  fill_device(dev.q, dev.nq, 1);
  fill_device(dev.k, dev.nk, 2);
  fill_device(dev.v, dev.nkv, 3);
  fill_device(dev.dout, dev.nqv, 4);
  fa4::ForwardArgs fw;
  fw.problem = problem_of(s);
  fw.q = fa4::bshd(dev.q, s.sq, s.hq, s.d), fw.k = fa4::bshd(dev.k, s.sk, s.hkv, s.d);
  fw.v = fa4::bshd(dev.v, s.sk, s.hkv, s.value_dim()), fw.o = fa4::bshd(dev.o, s.sq, s.hq, s.value_dim());
  fw.lse = dev.lse;
  if (const fa4::Status st = fa4::forward(fw, 0); !st.ok()) {
    std::printf("forward: %s\n", st.message.c_str());
    std::exit(1);
  }
}

// Whether `out` is within rounding of `ref` elementwise: 2^-7 relative, plus 2^-7 of the largest
// |ref| (NaN fails).
bool near(const std::vector<uint16_t>& out, const std::vector<uint16_t>& ref) {
  double amax = 0;
  for (uint16_t x : ref) amax = std::max(amax, std::fabs(double(fa4::ref::bf16_bits_to_float(x))));
  for (size_t i = 0; i < out.size(); ++i) {
    const double a = fa4::ref::bf16_bits_to_float(out[i]), b = fa4::ref::bf16_bits_to_float(ref[i]);
    if (!(std::fabs(a - b) <= 0x1p-7 * (std::max(std::fabs(a), std::fabs(b)) + amax))) return false;
  }
  return true;
}

// Candidate against the shipped outputs: dK and dV bit for bit (the same sums in the same order),
// dQ within the rounding that the order of its fp32 atomics leaves.
bool agrees(const std::vector<uint16_t>& ref_dq, const std::vector<uint16_t>& ref_dk, const std::vector<uint16_t>& ref_dv,
            Device& dev) {
  if (download(dev.dk, dev.nk) != ref_dk || download(dev.dv, dev.nkv) != ref_dv) return false;
  return near(download(dev.dq, dev.nq), ref_dq);
}

int time_all(int rounds) {
  constexpr int kIters = 10;
  void* flush = nullptr;
  const size_t flush_bytes = size_t(256) << 20;
  CK(cudaMalloc(&flush, flush_bytes));
  cudaEvent_t t0, t1;
  CK(cudaEventCreate(&t0));
  CK(cudaEventCreate(&t1));
  int fails = 0;
  const bool deterministic = std::getenv("FA4_PROBE_DETERMINISTIC") != nullptr;
  for (const auto [d, dv] : kDims) {
    if (!wanted(d, dv)) continue;
    std::vector<const Config*> cfgs;
    for (const Config& c : kConfigs)
      if (c.d == d && c.value_dim() == dv && (cfgs.empty() || wanted_config(c.name))) cfgs.push_back(&c);  // the shipped one first
    for (const int seqlen : {512, 1024, 2048, 4096, 8192, 16384})
      for (const bool causal : {false, true}) {
        if (!listed("FA4_PROBE_SEQLENS", std::to_string(seqlen))) continue;
        Shape s{16384 / seqlen, 2048 / d, 2048 / d, seqlen, seqlen, d, causal};
        s.deterministic = deterministic, s.dv = dv;
        Device dev(s);
        fa3_inputs(s, dev);
        dev.run(*cfgs[0]);
        const auto ref_dq = download(dev.dq, dev.nq), ref_dk = download(dev.dk, dev.nk), ref_dv = download(dev.dv, dev.nkv);
        std::vector<bool> ok(cfgs.size(), true);
        for (size_t c = 1; c < cfgs.size(); ++c) {
          if (cfgs[c]->diagnostic) continue;  // (timed, not compared)
          dev.run(*cfgs[c]);
          ok[c] = agrees(ref_dq, ref_dk, ref_dv, dev);
          if (!ok[c]) {
            ++fails;
            std::printf("MISMATCH %s d=%d seqlen=%d causal=%d: outputs differ from the shipped configuration's\n",
                        cfgs[c]->name, d, seqlen, int(causal));
          }
        }
        // Rounds: each configuration kIters launches, L2 flushed before each; the order rotates.
        std::vector<std::vector<double>> med(cfgs.size());
        for (int r = 0; r < rounds; ++r)
          for (size_t i = 0; i < cfgs.size(); ++i) {
            const size_t c = (i + r) % cfgs.size();
            if (!ok[c]) continue;
            std::vector<double> ms;
            for (int it = 0; it < kIters; ++it) {
              CK(cudaMemsetAsync(flush, it & 0xFF, flush_bytes));
              CK(cudaEventRecord(t0));
              const fa4::Status rs = cfgs[c]->fn(dev.p, 0);
              CK(cudaEventRecord(t1));
              CK(cudaEventSynchronize(t1));
              if (!rs.ok()) { std::printf("%s: %s\n", cfgs[c]->name, rs.message.c_str()); return 1; }
              float t;
              CK(cudaEventElapsedTime(&t, t0, t1));
              ms.push_back(t);
            }
            std::sort(ms.begin(), ms.end());
            med[c].push_back(ms[ms.size() / 2]);
          }
        // (2 (d + dv) a query-key pair forward, 2.5 times that backward, as bench/side_by_side.py counts)
        const double flop = 2.5 * 2.0 * s.b * s.hq * double(s.sq) * s.sk * (d + dv) * (causal ? 0.5 : 1.0);
        double base = 0;
        for (size_t c = 0; c < cfgs.size(); ++c) {
          if (!ok[c]) continue;
          std::vector<double> m = med[c];
          std::sort(m.begin(), m.end());
          const double ms = m[m.size() / 2];
          if (c == 0) base = ms;
          std::printf("RESULT {\"d\": %d, \"dv\": %d, \"seqlen\": %d, \"causal\": %s, \"deterministic\": %s, "
                      "\"config\": \"%s\", \"diagnostic\": %s, \"ms\": %.4f, \"round_ms_min\": %.4f, "
                      "\"round_ms_max\": %.4f, \"tflops\": %.1f, \"vs_shipped\": %.4f}\n",
                      d, dv, seqlen, causal ? "true" : "false", deterministic ? "true" : "false", cfgs[c]->name,
                      cfgs[c]->diagnostic ? "true" : "false", ms, m.front(), m.back(), flop / (ms * 1e-3) / 1e12,
                      base / ms);
        }
      }
  }
  cudaFree(flush);
  std::printf("%s: %d candidates disagreed with the shipped outputs\n", fails ? "FAIL" : "PASS", fails);
  return fails ? 1 : 0;
}

// The traced twins of the shipped configurations, and of candidates (their CSV named after them).
constexpr auto kWithTrace = [](BwdKnobs& k) { k.trace = true; };
constexpr BwdKnobs kTraced64 = bwd_knobs(64, kWithTrace), kTraced128 = bwd_knobs(128, kWithTrace),
                   kTraced192 = bwd_knobs(192, kWithTrace), kTraced256 = bwd_knobs(256, kWithTrace),
                   kTracedTwoStages192 = bwd_knobs(192, [](BwdKnobs& k) { k.trace = true, k.dq_stages = 2; }),
                   kTracedUnreduced192 = bwd_knobs(192, [](BwdKnobs& k) { k.trace = true, k.dq_unreduced = true; });
constexpr auto kCpAsyncTraced = [](BwdKnobs& k) { k.trace = true, k.kv_tma = false; };
constexpr BwdKnobs kCpAsyncTraced64 = bwd_knobs(64, kCpAsyncTraced), kCpAsyncTraced128 = bwd_knobs(128, kCpAsyncTraced),
                   kCpAsyncTraced256 = bwd_knobs(256, kCpAsyncTraced);
const Config kTraced[] = {
    {"shipped-traced", 64, run_cfg<BwdConfig<64, true, kTraced64>>},
    {"shipped-traced", 128, run_cfg<BwdConfig<128, true, kTraced128>>},
    {"shipped-traced", 192, run_cfg<BwdConfig<192, true, kTraced192>>},
    {"dq-unreduced-traced", 192, run_cfg<BwdConfig<192, true, kTracedUnreduced192>>},
    {"shipped-traced", 192, run_cfg<BwdConfig<192, true, kTraced192, 128>>, 128},
    {"dq-two-stages-traced", 192, run_cfg<BwdConfig<192, true, kTracedTwoStages192, 128>>, 128},
    {"dq-unreduced-traced", 192, run_cfg<BwdConfig<192, true, kTracedUnreduced192, 128>>, 128},
    {"shipped-traced", 256, run_cfg<BwdConfig<256, true, kTraced256>>},
    {"cp-async-kv-traced", 64, run_cfg<BwdConfig<64, true, kCpAsyncTraced64>>},
    {"cp-async-kv-traced", 128, run_cfg<BwdConfig<128, true, kCpAsyncTraced128>>},
    {"cp-async-kv-traced", 256, run_cfg<BwdConfig<256, true, kCpAsyncTraced256>>},
};

double median_of(std::vector<double> x) {
  if (x.empty()) return 0;
  std::sort(x.begin(), x.end());
  return x[x.size() / 2];
}

int trace_all(const std::string& dir, int seqlen) {
  using fa4::sm90::bwd::kTraceCtas;
  using fa4::sm90::bwd::kTraceEvents;
  using fa4::sm90::bwd::kTraceSteps;
  using fa4::sm90::bwd::kTraceWords;
  static const char* kIntervals[kTraceEvents] = {"loads-wait", "S-ready", "exp+dV-issue", "dP-ready",
                                                 "dS+dK-issue", "barrier", "dQ-ready", "stage+reduce", "to-next-top"};
  uint64_t* trace = nullptr;
  CK(cudaMalloc(&trace, kTraceWords * 8));
  for (const Config& c : kTraced) {
    if (!wanted(c.d, c.value_dim())) continue;
    const int d = c.d;
    Shape s{16384 / seqlen, 2048 / d, 2048 / d, seqlen, seqlen, d, false};
    s.dv = c.value_dim();
    Device dev(s);
    fa3_inputs(s, dev);
    dev.p.trace = trace;
    for (int rep = 0; rep < 3; ++rep) {  // the last run's stamps are kept (warm L2 and clocks)
      CK(cudaMemset(trace, 0, kTraceWords * 8));
      dev.run(c);
    }
    std::vector<uint64_t> h(kTraceWords);
    CK(cudaMemcpy(h.data(), trace, kTraceWords * 8, cudaMemcpyDeviceToHost));
    const std::string tag = std::string(c.name) == "shipped-traced" ? "" : "-" + std::string(c.name);
    const std::string path = dir + "/bwd-trace-d" + std::to_string(d) + (c.value_dim() != d ? "-dv" + std::to_string(c.value_dim()) : "") + tag + ".csv";
    FILE* csv = std::fopen(path.c_str(), "w");
    if (!csv) { std::printf("cannot write %s\n", path.c_str()); return 1; }
    std::fprintf(csv, "cta,wg,step");
    for (int e = 0; e < kTraceEvents; ++e) std::fprintf(csv, ",t%d", e);
    std::fprintf(csv, "\n");
    auto at = [&](int cta, int wg, int step, int e) {
      return h[((int64_t(cta) * 2 + wg) * kTraceSteps + step) * kTraceEvents + e];
    };
    std::vector<double> skew;
    for (int cta = 0; cta < kTraceCtas; ++cta)
      for (int wg = 0; wg < 2; ++wg) {
        std::vector<std::vector<double>> iv(kTraceEvents + 1), period_by_parity(2);
        int steps = 0;
        while (steps < kTraceSteps - 1 && at(cta, wg, steps, 0) != 0) ++steps;
        for (int st = 0; st < steps; ++st) {
          std::fprintf(csv, "%d,%d,%d", cta, wg, st);
          for (int e = 0; e < kTraceEvents; ++e) std::fprintf(csv, ",%llu", (unsigned long long)at(cta, wg, st, e));
          std::fprintf(csv, "\n");
          if (st == 0 || st + 1 >= steps) continue;  // steady steps only
          for (int e = 0; e + 1 < kTraceEvents; ++e)
            if (at(cta, wg, st, e + 1) != 0 && at(cta, wg, st, e) != 0)
              iv[e].push_back(double(at(cta, wg, st, e + 1)) - double(at(cta, wg, st, e)));
          iv[kTraceEvents - 1].push_back(double(at(cta, wg, st + 1, 0)) - double(at(cta, wg, st, kTraceEvents - 1)));
          iv[kTraceEvents].push_back(double(at(cta, wg, st + 1, 0)) - double(at(cta, wg, st, 0)));
          period_by_parity[st % 2].push_back(iv[kTraceEvents].back());
          if (wg == 1) skew.push_back(double(at(cta, 1, st, 0)) - double(at(cta, 0, st, 0)));
        }
        std::printf("TRACE %s d=%s seqlen=%d cta %d wg %d (%d steps, medians in cycles):", c.name,
                    dims_name(d, c.value_dim()).c_str(), seqlen, cta, wg, steps);
        for (int e = 0; e < kTraceEvents; ++e) std::printf(" %s %.0f", kIntervals[e], median_of(iv[e]));
        // Where the warpgroups take dQ in turn (d64), a step's dQ stamps (6, 7) exist only in every
        // other step of each warpgroup, and its steps alternate long and short: the periods by parity.
        std::printf("  period %.0f (even steps %.0f, odd steps %.0f)\n", median_of(iv[kTraceEvents]),
                    median_of(period_by_parity[0]), median_of(period_by_parity[1]));
        // The CTA's whole life against its steps: entry to the first step's top, the last step's
        // end to the CTA's end (past the dK/dV stores), and entry to end.
        const double entry = double(at(cta, wg, kTraceSteps - 1, 0)), end = double(at(cta, wg, kTraceSteps - 1, 1));
        if (steps > 0 && entry != 0 && end != 0)
          std::printf("TRACE %s d=%s seqlen=%d cta %d wg %d: entry to step 0 %.0f, steps %.0f, last step's end to CTA "
                      "end %.0f, whole %.0f cycles\n",
                      c.name, dims_name(d, c.value_dim()).c_str(), seqlen, cta, wg, double(at(cta, wg, 0, 0)) - entry,
                      double(at(cta, wg, steps - 1, kTraceEvents - 1)) - double(at(cta, wg, 0, 0)),
                      end - double(at(cta, wg, steps - 1, kTraceEvents - 1)), end - entry);
      }
    std::printf("TRACE %s d=%s seqlen=%d: warpgroup 1's step top after warpgroup 0's, median %.0f cycles\n", c.name,
                dims_name(d, c.value_dim()).c_str(), seqlen, median_of(skew));
    std::fclose(csv);
  }
  cudaFree(trace);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // lines in order with compute-sanitizer's reports
  int dev = 0;
  cudaDeviceProp prop;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess || prop.major != 9) {
    std::printf("sm90_bwd_probe: needs an sm_90 GPU\n");
    return 1;
  }
  const std::string mode = argc > 1 ? argv[1] : "check";
  if (mode == "check") return check_all();
  if (mode == "time") return time_all(argc > 2 ? std::max(1, std::atoi(argv[2])) : 5);
  if (mode == "trace" && argc > 2) return trace_all(argv[2], argc > 3 ? std::atoi(argv[3]) : 4096);
  std::printf("usage: sm90_bwd_probe [check | time [ROUNDS] | trace DIR [SEQLEN]]\n");
  return 2;
}
