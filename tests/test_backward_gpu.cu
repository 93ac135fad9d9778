// The attention backward against the float64 reference, through the public API.
//
// Criterion (DESIGN.md §3), for dQ, dK and dV each: max|out - ref64| <= 2 max|plain16 - ref64| + 1e-3,
// where plain16 is the plain backward in the same 16-bit type (fa4::ref::backward_lowp), and
// ||out - ref64|| / ||ref64|| <= 1e-2. The O and LSE handed to the backward are the float64
// forward's (O rounded to the dtype, LSE to float), so the backward is checked on its own.
// Gradients and the workspace are poisoned (NaN) before every run: an element never written fails,
// and padding around a gradient must still hold its poison afterwards.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "convert.h"
#include "device_tensor.h"
#include "fa4/attention.h"
#include "common/pad.h"
#include "common/validate.h"
#include "gpu_guard.h"
#include "lagged_kernels.h"
#include "test_support.h"
#include "reference.h"

namespace {

constexpr double kAtol = 1e-3;          // the criterion's absolute slack, as in the forward tests
constexpr double kRelFrobenius = 1e-2;  // ||out - ref64|| / ||ref64||
using fa4_test::DeviceBuffer;
using fa4_test::DeviceTensor;
using fa4_test::Layout;

struct Case {
  fa4::DType dtype;
  int64_t batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim;
  bool causal;
  int64_t left = -1, right = -1;
  Layout layout = Layout::kBSHD;
  float scale = 0.0f;  // 0: the default 1/sqrt(head_dim)
  bool deterministic = false;
  // Set: the launch in the public API's place (through BwdParams, after the same validation).
  fa4::Status (*launch)(const fa4::detail::BwdParams&, cudaStream_t) = nullptr;
  // The public call captured into a CUDA graph on a stream of its own, and the graph launched
  // twice, the gradients and the workspace poisoned before each launch (the second one's checked).
  bool captured = false;
  // Problem::softcap (0: off), and K's entries scaled by key_scale so that many scores reach the
  // cap's bend.
  float softcap = 0.0f;
  double key_scale = 1.0;
  // Attention sinks (BackwardArgs::sink, dsink): each query head's drawn from N(0, 1), -inf for head
  // 1 where heads_q > 1 (no sink: its gradient 0).
  bool sink = false;
  // The workspace only as large as the kernels need (detail::backward_pad_offset): at a head dim
  // without a kernel the zero-padded copies then come from cudaMallocAsync, not the workspace.
  bool copies_allocated = false;
  int64_t head_dim_v = 0;  // Problem::head_dim_v (0: head_dim's)

  fa4::Problem problem() const {
    fa4::Problem p = fa4::test::make_problem(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, dtype);
    p.softmax_scale = scale;
    p.causal = causal;
    p.window_left = left;
    p.window_right = right;
    p.softcap = softcap;
    p.head_dim_v = head_dim_v;
    return p;
  }
  std::string name() const {
    static const char* kLayouts[] = {"bshd", "bhsd", "padded"};
    return std::string(fa4::to_string(dtype)) + " b" + std::to_string(batch) + " sq" + std::to_string(seqlen_q) +
           " sk" + std::to_string(seqlen_k) + " h" + std::to_string(heads_q) + "/" + std::to_string(heads_kv) +
           " d" + std::to_string(head_dim) + (causal ? " causal" : "") + " win(" + std::to_string(left) + "," +
           std::to_string(right) + ") " + kLayouts[int(layout)] +
           (scale != 0.0f ? " scale " + std::to_string(scale) : "") + (deterministic ? " deterministic" : "") +
           (softcap > 0 ? " softcap " + std::to_string(softcap) + " keys x" + std::to_string(key_scale) : "") +
           (sink ? " sink" : "") + (captured ? " captured" : "") + (copies_allocated ? " copies allocated" : "") +
           (head_dim_v > 0 ? " dv" + std::to_string(head_dim_v) : "");
  }
};

// One case's inputs and float64 answers, all contiguous BSHD (LSE [batch][heads_q][seqlen_q]).
struct Reference {
  fa4::Problem p;
  std::vector<double> q, k, v, o, dout;  // values of the dtype; o from the float64 forward, rounded
  std::vector<float> lse;                // the float64 forward's, as float (-inf: no visible key)
  std::vector<double> sink;              // [heads_q] (Case::sink), else empty
  fa4::ref::Backward64 exact, plain;     // float64, and the plain 16-bit backward
};

Reference make_reference(const Case& c, uint32_t seed) {
  Reference r;
  r.p = c.problem();
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  auto random = [&](int64_t n) {
    std::vector<double> x(n);
    for (double& e : x) e = fa4::ref::round_to(c.dtype, float(normal(rng)));
    return x;
  };
  r.q = random(fa4::ref::q_elems(r.p));
  r.k = random(fa4::ref::kv_elems(r.p));
  for (double& e : r.k) e = fa4::ref::round_to(c.dtype, float(e * c.key_scale));
  r.v = random(fa4::ref::v_elems(r.p));
  r.dout = random(fa4::ref::o_elems(r.p));
  if (c.sink)
    for (int64_t h = 0; h < c.heads_q; ++h) r.sink.push_back(h == 1 ? -INFINITY : double(float(normal(rng))));
  const fa4::ref::Forward64 f = fa4::ref::forward(r.p, r.q, r.k, r.v, r.sink);
  r.o = fa4::ref::rounded(c.dtype, f.o);
  r.lse.assign(f.lse.begin(), f.lse.end());
  r.exact = fa4::ref::backward(r.p, r.q, r.k, r.v, r.dout, r.sink);
  r.plain = fa4::ref::backward_lowp(r.p, r.q, r.k, r.v, r.dout, r.sink);
  return r;
}

struct Gradients {
  std::vector<double> dq, dk, dv;  // contiguous BSHD
  std::vector<double> dsink;       // [heads_q] with Case::sink
};

// Runs the backward of case c on r's inputs once, gradients and workspace poisoned first. Fails
// when a padding slot around a gradient was written.
void run_backward(const Case& c, const Reference& r, Gradients* g) {
  const fa4::Problem& p = r.p;
  DeviceTensor q, k, v, o, dout, dq, dk, dv;
  for (DeviceTensor* t : {&q, &dq}) ASSERT_NO_FATAL_FAILURE(t->make(c.layout, p.batch, p.seqlen_q, p.heads_q, p.head_dim));
  for (DeviceTensor* t : {&o, &dout})
    ASSERT_NO_FATAL_FAILURE(t->make(c.layout, p.batch, p.seqlen_q, p.heads_q, p.value_dim()));
  for (DeviceTensor* t : {&k, &dk}) ASSERT_NO_FATAL_FAILURE(t->make(c.layout, p.batch, p.seqlen_k, p.heads_kv, p.head_dim));
  for (DeviceTensor* t : {&v, &dv})
    ASSERT_NO_FATAL_FAILURE(t->make(c.layout, p.batch, p.seqlen_k, p.heads_kv, p.value_dim()));
  ASSERT_NO_FATAL_FAILURE(q.upload(p.dtype, r.q));
  ASSERT_NO_FATAL_FAILURE(k.upload(p.dtype, r.k));
  ASSERT_NO_FATAL_FAILURE(v.upload(p.dtype, r.v));
  ASSERT_NO_FATAL_FAILURE(o.upload(p.dtype, r.o));
  ASSERT_NO_FATAL_FAILURE(dout.upload(p.dtype, r.dout));
  for (DeviceTensor* t : {&dq, &dk, &dv}) ASSERT_NO_FATAL_FAILURE(t->poison());
  DeviceBuffer lse;
  CUDA_OK(cudaMalloc(&lse.ptr, std::max<size_t>(r.lse.size(), 1) * 4));
  CUDA_OK(cudaMemcpy(lse.ptr, r.lse.data(), r.lse.size() * 4, cudaMemcpyHostToDevice));

  DeviceBuffer sink, dsink;  // (dsink poisoned: NaN)
  if (!r.sink.empty()) {
    const std::vector<float> s32(r.sink.begin(), r.sink.end());
    CUDA_OK(cudaMalloc(&sink.ptr, s32.size() * 4));
    CUDA_OK(cudaMemcpy(sink.ptr, s32.data(), s32.size() * 4, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMalloc(&dsink.ptr, s32.size() * 4));
    CUDA_OK(cudaMemset(dsink.ptr, 0xFF, s32.size() * 4));
  }

  fa4::BackwardArgs a;
  a.problem = p;
  a.q = q.ref, a.k = k.ref, a.v = v.ref, a.o = o.ref, a.dout = dout.ref;
  a.sink = static_cast<const float*>(sink.ptr);
  a.dsink = static_cast<float*>(dsink.ptr);
  a.dq = dq.ref, a.dk = dk.ref, a.dv = dv.ref;
  a.lse = static_cast<const float*>(lse.ptr);
  a.deterministic = c.deterministic;
  size_t bytes = 0;
  fa4::Status st = fa4::backward_workspace_size(a, &bytes);
  ASSERT_TRUE(st.ok()) << st.message;
  if (c.copies_allocated) bytes = std::min<size_t>(bytes, size_t(fa4::detail::backward_pad_offset(p)));
  DeviceBuffer workspace;  // its contents on entry must not matter: it starts as NaN
  if (bytes > 0) {
    CUDA_OK(cudaMalloc(&workspace.ptr, bytes));
    CUDA_OK(cudaMemset(workspace.ptr, 0xFF, bytes));
  }
  a.workspace = workspace.ptr;
  a.workspace_bytes = bytes;
  if (c.launch != nullptr) {
    st = fa4::validate(a);
    ASSERT_TRUE(st.ok()) << st.message;
    st = c.launch(fa4::detail::make_bwd_params(a), nullptr);
  } else if (c.captured) {
    cudaStream_t s;
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CUDA_OK(cudaStreamCreate(&s));
    CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    st = fa4::backward(a, s);
    CUDA_OK(cudaStreamEndCapture(s, &graph));
    ASSERT_TRUE(st.ok()) << fa4::to_string(st.code) << ": " << st.message;
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    for (int replay = 0; replay < 2; ++replay) {
      for (DeviceTensor* t : {&dq, &dk, &dv}) ASSERT_NO_FATAL_FAILURE(t->poison());
      if (bytes > 0) CUDA_OK(cudaMemset(workspace.ptr, 0xFF, bytes));
      CUDA_OK(cudaGraphLaunch(exec, s));
      CUDA_OK(cudaStreamSynchronize(s));
    }
    CUDA_OK(cudaGraphExecDestroy(exec));
    CUDA_OK(cudaGraphDestroy(graph));
    CUDA_OK(cudaStreamDestroy(s));
  } else {
    st = fa4::backward(a, nullptr);
  }
  ASSERT_TRUE(st.ok()) << fa4::to_string(st.code) << ": " << st.message;
  fa4_test::finish_or_exit(c.name());
  CUDA_OK(cudaDeviceSynchronize());
  CUDA_OK(cudaGetLastError());

  int64_t written = 0;
  ASSERT_NO_FATAL_FAILURE(dq.download(p.dtype, &g->dq, &written));
  EXPECT_EQ(written, 0) << "dq: padding slots written";
  ASSERT_NO_FATAL_FAILURE(dk.download(p.dtype, &g->dk, &written));
  EXPECT_EQ(written, 0) << "dk: padding slots written";
  ASSERT_NO_FATAL_FAILURE(dv.download(p.dtype, &g->dv, &written));
  EXPECT_EQ(written, 0) << "dv: padding slots written";
  if (!r.sink.empty()) {
    std::vector<float> d32(r.sink.size());
    CUDA_OK(cudaMemcpy(d32.data(), dsink.ptr, d32.size() * 4, cudaMemcpyDeviceToHost));
    g->dsink.assign(d32.begin(), d32.end());
  }
}

// The criterion for one gradient. One that is 0 in exact arithmetic (seqlen_k = 1: a softmax over
// one key is constant, so dQ = dK = 0) has no relative error; the absolute bound still holds it.
void check_gradient(const char* name, const std::vector<double>& out, const std::vector<double>& exact,
                    const std::vector<double>& plain) {
  const fa4::ref::ErrorStats e = fa4::ref::error_stats(out, exact);
  const fa4::ref::ErrorStats e_plain = fa4::ref::error_stats(plain, exact);
  EXPECT_FALSE(std::isnan(e.max_abs)) << "NaN in " << name << ": an element was not written or the math broke";
  EXPECT_LE(e.max_abs, 2.0 * e_plain.max_abs + kAtol) << name << ": plain 16-bit max error " << e_plain.max_abs;
  const bool exact_zero = std::all_of(exact.begin(), exact.end(), [](double x) { return x == 0.0; });
  if (!exact_zero) EXPECT_LE(e.rel_frobenius, kRelFrobenius) << name;
}

// The criterion for dQ, dK, dV; and exact zeros where nothing flows: dQ on query rows that see no
// key, dK and dV on keys that no query sees.
void check(const Reference& r, const Gradients& g) {
  check_gradient("dq", g.dq, r.exact.dq, r.plain.dq);
  check_gradient("dk", g.dk, r.exact.dk, r.plain.dk);
  check_gradient("dv", g.dv, r.exact.dv, r.plain.dv);
  if (!r.sink.empty()) check_gradient("dsink", g.dsink, r.exact.dsink, r.plain.dsink);

  const fa4::Problem& p = r.p;
  std::vector<char> row_sees(p.seqlen_q, 0), key_seen(p.seqlen_k, 0);
  for (int64_t i = 0; i < p.seqlen_q; ++i)
    for (int64_t j = 0; j < p.seqlen_k; ++j)
      if (fa4::ref::visible(p, i, j)) row_sees[i] = key_seen[j] = 1;
  const int64_t q_row = p.heads_q * p.head_dim, kv_row = p.heads_kv * p.head_dim, v_row = p.heads_kv * p.value_dim();
  int64_t dq_bad = 0, dkv_bad = 0;
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t i = 0; i < p.seqlen_q; ++i)
      if (!row_sees[i])
        for (int64_t x = 0; x < q_row; ++x) dq_bad += g.dq[(b * p.seqlen_q + i) * q_row + x] != 0.0;
    for (int64_t j = 0; j < p.seqlen_k; ++j)
      if (!key_seen[j]) {
        for (int64_t x = 0; x < kv_row; ++x) dkv_bad += g.dk[(b * p.seqlen_k + j) * kv_row + x] != 0.0;
        for (int64_t x = 0; x < v_row; ++x) dkv_bad += g.dv[(b * p.seqlen_k + j) * v_row + x] != 0.0;
      }
  }
  EXPECT_EQ(dq_bad, 0) << "dq elements not 0 on query rows that see no key";
  EXPECT_EQ(dkv_bad, 0) << "dk/dv elements not 0 on keys that no query sees";
}

void run_and_check(const Case& c, const Reference& r) {
  SCOPED_TRACE(c.name());
  Gradients g;
  ASSERT_NO_FATAL_FAILURE(run_backward(c, r, &g));
  check(r, g);
}

// Builds the cases' references on the host's cores at once (case n from seed + n), then runs and
// checks the cases on the GPU one after another.
void run_cases(const std::vector<Case>& cases, uint32_t seed) {
  std::vector<std::future<Reference>> refs;
  for (size_t n = 0; n < cases.size(); ++n)
    refs.push_back(std::async(std::launch::async, make_reference, cases[n], seed + uint32_t(n)));
  for (size_t n = 0; n < cases.size(); ++n) run_and_check(cases[n], refs[n].get());
}

using fa4::DType;
constexpr auto BF16 = DType::kBF16;
constexpr auto FP16 = DType::kFP16;

TEST(BackwardGpu, OddSizesEveryHeadDim) {
  FA4_REQUIRE_GPU();
  // Sequence lengths off the tile sizes, equal and unequal both ways, one-row and one-key problems
  // (causal with seqlen_q > seqlen_k leaves rows that see no key).
  const std::pair<int64_t, int64_t> lengths[] = {{1, 1},    {17, 17},  {128, 128}, {239, 239}, {1, 300},
                                                 {300, 1},  {17, 303}, {303, 17},  {128, 239}, {239, 128}};
  std::vector<Case> cases;
  for (int64_t d : {64, 128, 256})
    for (auto [sq, sk] : lengths)
      for (bool causal : {false, true}) cases.push_back({BF16, 2, sq, sk, 2, 2, d, causal});
  run_cases(cases, 1);
}

// Head dims without a kernel of their own, on the next one's (common/pad.h): on 64's and 128's
// in place (BwdParams::qk_cols, v_cols: maps of the caller's columns, D's reads and every store
// bounded), on 256's over zero-padded copies: each kernel head dim's range, tails both ways, causal
// rows without keys, gradients between spare heads and rows (Layout::kPadded: neither the stores
// in place nor the copies back may write past head_dim's columns), GQA and MQA, fp16, BHSD,
// windows, the deterministic mode, sinks (dsink), a soft cap, a CUDA graph; the copies in the
// workspace and from cudaMallocAsync (also under capture).
TEST(BackwardGpu, PaddedHeadDims) {
  FA4_REQUIRE_GPU();
  std::vector<Case> cases;
  for (int64_t d : {8, 40, 72, 96, 136, 192, 248})
    for (bool causal : {false, true}) {
      Case c{BF16, 2, 239, 128, 4, 2, d, causal};
      c.layout = Layout::kPadded;
      c.copies_allocated = causal;
      cases.push_back(c);
    }
  cases.push_back({FP16, 1, 303, 17, 2, 1, 96, true});  // rows without keys
  Case bhsd{FP16, 2, 130, 300, 8, 1, 80, false};
  bhsd.layout = Layout::kBHSD;
  cases.push_back(bhsd);
  cases.push_back({BF16, 1, 300, 300, 2, 2, 160, false, 100, 0});
  for (int64_t d : {96, 192}) {
    Case det{BF16, 2, 200, 333, 4, 2, d, true};
    det.deterministic = true;
    cases.push_back(det);
    // (Bottom-right causal with more keys than queries, as BackwardGpu.Sinks: on square causal
    // shapes the first rows see one or two keys beside the sink, and D = rowsum(dO o O) carries the
    // stored O's rounding into dsink past the plain bound whatever the head dim; docs/perf-notes.md,
    // "Attention sinks".)
    Case sinks{BF16, 2, 150, 300, 4, 2, d, true};
    sinks.sink = true;
    cases.push_back(sinks);
    Case capped{FP16, 1, 257, 257, 2, 2, d, false};
    capped.softcap = 7.5f, capped.key_scale = 6.0;
    cases.push_back(capped);
    for (bool allocated : {false, true}) {
      Case graph{BF16, 1, 129, 200, 2, 1, d, true};
      graph.captured = true, graph.copies_allocated = allocated;
      cases.push_back(graph);
    }
  }
  // Two head dims (Problem::head_dim_v): a wider value side (64 / 128), both without a kernel of
  // their own (40 / 72); rows without keys, the deterministic mode. Then DeepSeek's 192 / 128 over
  // copies on 256's (detail::set_backward_v128 off; on, it has kernels of its own: D192Kernels).
  std::vector<Case> deepseek;
  for (auto [d, dv] : {std::pair<int64_t, int64_t>{192, 128}, {64, 128}, {40, 72}}) {
    Case c{BF16, 2, 239, 128, 4, 2, d, true};
    c.head_dim_v = dv, c.layout = Layout::kPadded;
    (d == 192 ? deepseek : cases).push_back(c);
    Case det{FP16, 1, 300, 120, 2, 1, d, true};
    det.head_dim_v = dv, det.deterministic = true;
    (d == 192 ? deepseek : cases).push_back(det);
  }
  run_cases(cases, 5000);
  const fa4::test::BackwardV128 off(false);
  const fa4::test::BackwardD192 d192_off(false);
  run_cases(deepseek, 5100);
}

// Attention sinks: dq, dk and dv through the forward's LSE with the sinks, and dsink (the sinks'
// own kernel, from D's workspace: unpaired and paired statistics, as each head dim's configuration
// keeps them) against float64; every head dim, causal rows without keys (seqlen_q > seqlen_k),
// GQA, fp16, BHSD, windows, deterministic mode, soft-capped scores, a CUDA graph.
TEST(BackwardGpu, Sinks) {
  FA4_REQUIRE_GPU();
  std::vector<Case> cases;
  for (int64_t d : {64, 128, 256}) {
    cases.push_back({BF16, 2, 300, 300, 4, 2, d, false});
    cases.push_back({FP16, 1, 257, 700, 6, 3, d, true, -1, -1, Layout::kBHSD});
    cases.push_back({BF16, 1, 100, 33, 4, 4, d, true});  // rows without keys
    Case det{BF16, 2, 200, 500, 4, 1, d, false, 100, 0};
    det.deterministic = true;
    cases.push_back(det);
    Case capped{BF16, 1, 300, 400, 4, 2, d, true};
    capped.softcap = 20.0f;
    cases.push_back(capped);
  }
  Case graph{BF16, 2, 200, 300, 4, 2, 128, true};
  graph.captured = true;
  cases.push_back(graph);
  for (Case& c : cases) c.sink = true;
  run_cases(cases, 4100);
}

// A small shape a head dim with sinks, for the sanitizers (bench/results: the sinks' kernel reads
// D's workspace, unpaired or paired, and reduces through shared memory).
TEST(BackwardGpu, SinksSmall) {
  FA4_REQUIRE_GPU();
  std::vector<Case> cases;
  for (int64_t d : {64, 128, 256}) cases.push_back({BF16, 1, 130, 200, 4, 2, d, true});
  for (Case& c : cases) c.sink = true;
  run_cases(cases, 4200);
}

TEST(BackwardGpu, Fp16) {
  FA4_REQUIRE_GPU();
  std::vector<Case> cases;
  for (int64_t d : {64, 128, 256})
    for (bool causal : {false, true}) cases.push_back({FP16, 2, 239, 333, 2, 1, d, causal});
  cases.push_back({FP16, 1, 333, 100, 2, 2, 128, true});
  run_cases(cases, 100);
}

TEST(BackwardGpu, GqaAndMqa) {
  FA4_REQUIRE_GPU();
  // dK and dV of a KV head sum over every query head of its group.
  std::vector<Case> cases;
  for (auto [hq, hkv] : {std::pair<int64_t, int64_t>{4, 1}, {4, 4}, {8, 2}, {8, 1}})
    for (bool causal : {false, true}) cases.push_back({BF16, 1, 200, 257, hq, hkv, 128, causal});
  cases.push_back({BF16, 2, 129, 300, 4, 1, 64, true});
  cases.push_back({FP16, 1, 129, 300, 4, 1, 256, false});
  run_cases(cases, 200);
}

TEST(BackwardGpu, StridedLayouts) {
  FA4_REQUIRE_GPU();
  // Every tensor, gradients included, in BHSD or in BSHD with a spare head and spare rows; the
  // gradients' padding keeps its poison.
  std::vector<Case> cases;
  for (Layout l : {Layout::kBHSD, Layout::kPadded})
    for (int64_t d : {64, 128, 256}) cases.push_back({BF16, 2, 190, 260, 4, 2, d, d == 128, -1, -1, l});
  cases.push_back({FP16, 1, 300, 129, 2, 1, 64, true, -1, -1, Layout::kPadded});  // rows without keys
  cases.push_back({BF16, 1, 100, 300, 2, 2, 128, false, 0, 10, Layout::kPadded});  // keys no query sees
  run_cases(cases, 300);
}

TEST(BackwardGpu, CausalAndWindows) {
  FA4_REQUIRE_GPU();
  // Bottom-right causal both ways of the seqlen mismatch, local windows, and both at once. Where
  // seqlen_q > seqlen_k (or a window cuts them off) query rows see no key: their dQ is 0; where a
  // window leaves keys unseen, their dK and dV are 0.
  const std::vector<Case> cases = {
      {BF16, 1, 100, 300, 2, 2, 64, true},
      {BF16, 1, 300, 100, 2, 2, 64, true},
      {FP16, 1, 128, 300, 2, 1, 128, true},
      {BF16, 2, 300, 128, 2, 1, 128, true},
      {BF16, 1, 239, 100, 2, 2, 256, true},
      {BF16, 1, 300, 300, 2, 2, 128, false, 32, 0},
      {BF16, 1, 257, 200, 2, 1, 64, false, 17, 5},
      {FP16, 1, 200, 257, 2, 2, 128, false, 0, -1},
      {BF16, 1, 400, 100, 2, 2, 64, false, 10, 0},
      {BF16, 1, 100, 400, 2, 2, 256, false, 17, 5},
      {BF16, 1, 300, 300, 2, 2, 64, true, 32, -1},
  };
  run_cases(cases, 400);
}

TEST(BackwardGpu, DeterministicIsBitIdenticalRunToRun) {
  FA4_REQUIRE_GPU();
  // With deterministic set, the same inputs give the same bits every run (GQA: many query heads
  // add into each dK/dV); both modes pass the criterion.
  Case c{BF16, 1, 511, 511, 8, 2, 128, true};
  const Reference r = make_reference(c, 500);
  c.deterministic = true;
  SCOPED_TRACE(c.name());
  Gradients first;
  ASSERT_NO_FATAL_FAILURE(run_backward(c, r, &first));
  check(r, first);
  auto same = [](const std::vector<double>& x, const std::vector<double>& y) {
    return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(double)) == 0;
  };
  for (int run = 1; run < 3; ++run) {
    Gradients again;
    ASSERT_NO_FATAL_FAILURE(run_backward(c, r, &again));
    EXPECT_TRUE(same(first.dq, again.dq)) << "dq differs between run 0 and run " << run;
    EXPECT_TRUE(same(first.dk, again.dk)) << "dk differs between run 0 and run " << run;
    EXPECT_TRUE(same(first.dv, again.dv)) << "dv differs between run 0 and run " << run;
  }
  c.deterministic = false;
  run_and_check(c, r);
}

TEST(BackwardGpu, CapturedInACudaGraph) {
  FA4_REQUIRE_GPU();
  // Under stream capture, with its programmatic launches (d64, d128: the dK/dV kernel as D's
  // dependent; deterministic: the dQ kernel as the dK/dV kernel's), every head dim, causal and
  // not, GQA, and the deterministic mode.
  std::vector<Case> cases;
  for (int64_t d : {64, 128, 256}) {
    cases.push_back({BF16, 2, 300, 257, 4, 2, d, true});
    cases.push_back({BF16, 1, 129, 200, 2, 2, d, false});
  }
  cases.push_back({BF16, 1, 200, 200, 4, 2, 128, true});
  cases.back().deterministic = true;
  for (Case& c : cases) c.captured = true;
  run_cases(cases, 650);
}

TEST(BackwardGpu, DeterministicEveryHeadDimAndMask) {
  FA4_REQUIRE_GPU();
  // The deterministic dQ kernels (wgmma at d64/d128 on 128-row blocks, mma.sync at d256) on tails
  // of both lengths, causal both ways, a window, GQA and fp16.
  std::vector<Case> cases;
  for (int64_t d : {64, 128, 256}) {
    cases.push_back({BF16, 1, 239, 300, 4, 2, d, false});
    cases.push_back({BF16, 1, 300, 130, 2, 2, d, true});  // rows that see no key
    cases.push_back({FP16, 2, 129, 257, 2, 1, d, true});
    cases.push_back({BF16, 1, 257, 200, 2, 2, d, false, 17, 5});
  }
  for (Case& c : cases) c.deterministic = true;
  run_cases(cases, 700);
}

TEST(BackwardGpu, EveryStepCountAtD64AndD128) {
  FA4_REQUIRE_GPU();
  // d64's and d128's dQ run a step behind their dK/dV step, on four and two dS^T buffers, four and
  // three step buffers and warpgroup 1 started late; d64's dQ of each step is warpgroup s % 2's
  // alone. Walks of 1 to 10 steps (query blocks of 64; one query head a KV head) reach the last
  // step's dQ after the loop by either warpgroup, the first and second reuse of each buffer and
  // the ring's first refills; then short walks over a GQA group of three.
  std::vector<Case> cases;
  for (int64_t d : {64, 128}) {
    for (int64_t steps = 1; steps <= 10; ++steps) cases.push_back({BF16, 1, 64 * steps - 5, 150, 2, 2, d, false});
    for (int64_t steps : {1, 2, 3}) cases.push_back({BF16, 1, 64 * steps - 5, 150, 3, 1, d, false});
  }
  run_cases(cases, 800);
}

TEST(BackwardGpu, WarpsSkewed) {
  FA4_REQUIRE_GPU();
  // A test-only build of the d64/d128 dK/dV kernels (tests/lagged_kernels.cu) holds, every step,
  // one warp ~3 us before its dS^T stores (another warp each step, in either warpgroup), and a
  // whole warpgroup at the top of some steps, so the warpgroups run more than a step apart: every
  // refill of the step ring, every reuse of a dS^T buffer and every dQ a step behind (d128 each
  // warpgroup's columns, d64 each step's whole dQ by one warpgroup in turn) must wait for what it
  // needs. GQA, causal both ways, tails, a window, and the deterministic dQ.
  std::vector<Case> cases;
  for (int64_t d : {64, 128}) {
    cases.push_back({BF16, 2, 700, 650, 8, 2, d, false});
    cases.push_back({BF16, 1, 1000, 900, 4, 1, d, true});
    cases.push_back({BF16, 1, 600, 1000, 3, 3, d, true});
    cases.push_back({BF16, 1, 500, 500, 4, 2, d, false, 100, 30});
    Case det{BF16, 1, 700, 650, 4, 2, d, true};
    det.deterministic = true;
    cases.push_back(det);
  }
  for (Case& c : cases) c.launch = fa4::test::backward_warps_skewed;
  run_cases(cases, 900);
}

TEST(BackwardGpu, ScaleNotDefault) {
  FA4_REQUIRE_GPU();
  // softmax_scale = 0.3 instead of 1/sqrt(head_dim), in P and in dQ = scale dS K, dK = scale dS^T Q.
  std::vector<Case> cases = {
      {BF16, 2, 239, 300, 2, 1, 64, false},
      {BF16, 1, 300, 239, 4, 2, 128, true},
      {FP16, 1, 200, 200, 2, 2, 256, false},
      {BF16, 1, 257, 200, 2, 2, 128, false, 17, 5},
  };
  for (Case& c : cases) c.scale = 0.3f;
  run_cases(cases, 600);
}

TEST(BackwardGpu, Softcap) {
  FA4_REQUIRE_GPU();
  // Soft-capped scores (Problem::softcap) on every head dim, dtype and bound, both dQ paths, keys
  // scaled so that many scores reach the cap's bend: the float64 reference caps each score and
  // takes dS times the slope 1 - tanh^2, so a kernel that skipped the cap, or its slope, fails.
  std::vector<Case> cases;
  for (int64_t d : {64, 128, 256})
    for (bool det : {false, true}) {
      Case c{BF16, 2, 239, 300, 4, 2, d, true};
      c.deterministic = det;
      cases.push_back(c);
      Case w{FP16, 1, 300, 257, 2, 1, d, false, 40, 3};
      w.deterministic = det;
      cases.push_back(w);
    }
  cases.push_back({BF16, 1, 1, 333, 4, 1, 128, true});  // one query row, MQA
  cases.push_back({BF16, 2, 129, 128, 2, 2, 64, false, -1, -1, Layout::kPadded, 0.3f});  // scale not default
  for (Case& c : cases) c.softcap = c.scale != 0.0f ? 2.0f : 7.5f, c.key_scale = 4.0;
  run_cases(cases, 1000);
}

// The backward's d192 kernels (detail::set_backward_d192, on for this test only; 192 / 128's by
// set_backward_v128, on by default): d192 itself, the head dims padded to it (136-184) and
// DeepSeek's 192 / 128, through the public API, as the
// tests above run the other kernel head dims: odd lengths both ways, causal rows without keys,
// GQA and MQA, fp16, BHSD and strided views, windows, a scale, the deterministic mode, soft caps,
// sinks, a CUDA graph, the copies in the workspace and from cudaMallocAsync.
TEST(BackwardGpu, D192Kernels) {
  FA4_REQUIRE_GPU();
  const fa4::test::BackwardD192 on(true);
  const fa4::test::BackwardV128 v128(true);  // (192 / 128's, on by default)
  std::vector<Case> cases;
  const std::pair<int64_t, int64_t> lengths[] = {{1, 1},    {17, 17},  {128, 128}, {239, 239}, {1, 300},
                                                 {300, 1},  {17, 303}, {303, 17},  {128, 239}, {239, 128}};
  for (auto [sq, sk] : lengths)
    for (bool causal : {false, true}) cases.push_back({BF16, 2, sq, sk, 2, 2, 192, causal});
  for (bool causal : {false, true}) cases.push_back({FP16, 2, 239, 333, 2, 1, 192, causal});
  for (auto [hq, hkv] : {std::pair<int64_t, int64_t>{4, 1}, {8, 2}})
    cases.push_back({BF16, 1, 200, 257, hq, hkv, 192, true});
  for (Layout l : {Layout::kBHSD, Layout::kPadded}) cases.push_back({BF16, 2, 190, 260, 4, 2, 192, false, -1, -1, l});
  cases.push_back({BF16, 1, 300, 300, 2, 2, 192, false, 100, 0});   // a window
  cases.push_back({BF16, 1, 100, 300, 2, 2, 192, false, 0, 10});    // keys no query sees
  cases.push_back({BF16, 1, 129, 128, 2, 2, 192, false, -1, -1, Layout::kBSHD, 0.3f});
  for (bool causal : {false, true}) {
    Case det{BF16, 2, 200, 333, 4, 2, 192, causal};
    det.deterministic = true;
    cases.push_back(det);
  }
  for (bool det : {false, true}) {
    Case capped{BF16, 2, 239, 300, 4, 2, 192, true};
    capped.softcap = 7.5f, capped.key_scale = 4.0, capped.deterministic = det;
    cases.push_back(capped);
  }
  Case sinks{BF16, 2, 150, 300, 4, 2, 192, true};
  sinks.sink = true;
  cases.push_back(sinks);
  Case graph{BF16, 1, 129, 200, 2, 1, 192, true};
  graph.captured = true;
  cases.push_back(graph);
  // Padded to 192: the copies in the workspace and from cudaMallocAsync; 192 / 128.
  for (int64_t d : {136, 160, 184})
    for (bool causal : {false, true}) {
      Case c{BF16, 2, 239, 128, 4, 2, d, causal};
      c.layout = Layout::kPadded;
      c.copies_allocated = causal;
      cases.push_back(c);
    }
  // DeepSeek's 192 / 128 on kernels of its own (no copies): tails both ways, rows without keys,
  // GQA, fp16, BHSD and strided views, a window, soft caps, sinks, both dQ paths, a CUDA graph.
  for (bool det : {false, true}) {
    Case c{BF16, 2, 239, 128, 4, 2, 192, true};
    c.head_dim_v = 128, c.layout = Layout::kPadded, c.deterministic = det;
    cases.push_back(c);
    Case odd{FP16, 1, 17, 303, 8, 2, 192, false};
    odd.head_dim_v = 128, odd.deterministic = det;
    cases.push_back(odd);
    Case capped{BF16, 1, 300, 257, 2, 1, 192, true};
    capped.head_dim_v = 128, capped.softcap = 7.5f, capped.key_scale = 4.0, capped.deterministic = det;
    cases.push_back(capped);
  }
  Case rows_without_keys{BF16, 2, 303, 17, 2, 2, 192, true, -1, -1, Layout::kBHSD};
  rows_without_keys.head_dim_v = 128;
  cases.push_back(rows_without_keys);
  Case window{BF16, 1, 300, 300, 4, 4, 192, false, 100, 0};
  window.head_dim_v = 128;
  cases.push_back(window);
  Case sinks_v{BF16, 2, 150, 300, 4, 2, 192, true};
  sinks_v.head_dim_v = 128, sinks_v.sink = true;
  cases.push_back(sinks_v);
  Case graph_v{BF16, 1, 129, 200, 2, 1, 192, true};
  graph_v.head_dim_v = 128, graph_v.captured = true;
  cases.push_back(graph_v);
  run_cases(cases, 9200);
}

// Small d192 and 192 / 128 shapes for the sanitizers (racecheck and synccheck take minutes on the
// cases above): the split kernel's P^T / dS^T exchange and staged dQ reductions over tails and a
// causal diagonal, and the deterministic dQ kernel.
TEST(BackwardGpu, D192KernelsSmall) {
  FA4_REQUIRE_GPU();
  const fa4::test::BackwardD192 on(true);
  const fa4::test::BackwardV128 v128(true);
  std::vector<Case> cases{{BF16, 1, 130, 200, 4, 2, 192, true}};
  Case det{FP16, 1, 100, 150, 2, 1, 192, false};
  det.deterministic = true;
  cases.push_back(det);
  for (bool d : {false, true}) {  // 192 / 128
    Case v{BF16, 1, 130, 200, 4, 2, 192, !d};
    v.head_dim_v = 128, v.deterministic = d;
    cases.push_back(v);
  }
  run_cases(cases, 9300);
}

}  // namespace
