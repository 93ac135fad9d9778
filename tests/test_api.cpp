// What the public entry points promise beyond validation: names, packers, defaults, workspace
// sizes, the device rule, the C ABI, and the cases no attention kernel runs for (empty batch or
// query, no keys). The GPU tests skip without a Hopper GPU and say why.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include "common/fwd_params.h"
#include "common/per_device.h"
#include "common/validate.h"
#include "fa4/attention.h"
#include "gpu_guard.h"
#include "test_support.h"

namespace {

using fa4::BackwardArgs;
using fa4::DType;
using fa4::ForwardArgs;
using fa4::Problem;
using fa4::Status;
using fa4::StatusCode;
using fa4::TensorRef;

using fa4::test::fake;
using fa4::test::fake_forward;
using fa4::test::make_problem;

BackwardArgs fake_backward(const Problem& p) {
  BackwardArgs a;
  a.problem = p;
  a.q = fa4::bshd(fake(0), p.seqlen_q, p.heads_q, p.head_dim);
  a.k = fa4::bshd(fake(1), p.seqlen_k, p.heads_kv, p.head_dim);
  a.v = fa4::bshd(fake(2), p.seqlen_k, p.heads_kv, p.head_dim);
  a.o = fa4::bshd(fake(3), p.seqlen_q, p.heads_q, p.head_dim);
  a.dout = fa4::bshd(fake(5), p.seqlen_q, p.heads_q, p.head_dim);
  a.dq = fa4::bshd(fake(6), p.seqlen_q, p.heads_q, p.head_dim);
  a.dk = fa4::bshd(fake(7), p.seqlen_k, p.heads_kv, p.head_dim);
  a.dv = fa4::bshd(fake(8), p.seqlen_k, p.heads_kv, p.head_dim);
  a.lse = static_cast<const float*>(fake(4));
  a.workspace = fake(9);
  EXPECT_TRUE(fa4::backward_workspace_size(a, &a.workspace_bytes).ok());
  return a;
}

fa4_tensor to_c(const TensorRef& t) { return {t.data, t.batch_stride, t.seq_stride, t.head_stride}; }

fa4_problem to_c(const Problem& p) {
  fa4_problem c{};
  c.dtype = static_cast<int>(p.dtype);
  c.batch = p.batch;
  c.seqlen_q = p.seqlen_q;
  c.seqlen_k = p.seqlen_k;
  c.heads_q = p.heads_q;
  c.heads_kv = p.heads_kv;
  c.head_dim = p.head_dim;
  c.softmax_scale = p.softmax_scale;
  c.causal = p.causal;
  c.window_left = p.window_left;
  c.window_right = p.window_right;
  c.softcap = p.softcap;
  c.head_dim_v = p.head_dim_v;
  return c;
}

int c_forward(const ForwardArgs& a, char* msg, size_t len) {
  const fa4_problem p = to_c(a.problem);
  return fa4_forward(&p, to_c(a.q), to_c(a.k), to_c(a.v), to_c(a.o), a.lse, a.workspace,
                     a.workspace_bytes, nullptr, msg, len);
}

int c_backward(const BackwardArgs& a, char* msg, size_t len) {
  const fa4_problem p = to_c(a.problem);
  return fa4_backward(&p, to_c(a.q), to_c(a.k), to_c(a.v), to_c(a.o), to_c(a.dout), to_c(a.dq),
                      to_c(a.dk), to_c(a.dv), a.lse, a.deterministic, a.workspace,
                      a.workspace_bytes, nullptr, msg, len);
}

// ---------------------------------------------------------------------------------------------
// Names, packers, defaults.

TEST(Api, ToString) {
  EXPECT_STREQ(fa4::to_string(StatusCode::kOk), "ok");
  EXPECT_STREQ(fa4::to_string(StatusCode::kInvalidArgument), "invalid argument");
  EXPECT_STREQ(fa4::to_string(StatusCode::kNotSupported), "not supported");
  EXPECT_STREQ(fa4::to_string(StatusCode::kCudaError), "CUDA error");
  EXPECT_STREQ(fa4::to_string(StatusCode::kNoDevice), "no device");
  EXPECT_STREQ(fa4::to_string(static_cast<StatusCode>(42)), "unknown status");
  EXPECT_STREQ(fa4::to_string(DType::kBF16), "bf16");
  EXPECT_STREQ(fa4::to_string(DType::kFP16), "fp16");
  EXPECT_STREQ(fa4::to_string(static_cast<DType>(9)), "unknown dtype");
}

TEST(Api, BshdStrides) {
  const TensorRef t = fa4::bshd(fake(0), 1000, 12, 64);
  EXPECT_EQ(t.data, fake(0));
  EXPECT_EQ(t.batch_stride, 1000 * 12 * 64);
  EXPECT_EQ(t.seq_stride, 12 * 64);
  EXPECT_EQ(t.head_stride, 64);
}

TEST(Api, BhsdStrides) {
  const TensorRef t = fa4::bhsd(fake(1), 1000, 12, 64);
  EXPECT_EQ(t.data, fake(1));
  EXPECT_EQ(t.batch_stride, 12 * 1000 * 64);
  EXPECT_EQ(t.seq_stride, 64);
  EXPECT_EQ(t.head_stride, 1000 * 64);
}

TEST(Api, EffectiveScale) {
  for (int d : {8, 64, 96, 128, 192, 256}) {  // the caller's head dim, with a kernel of its own or not
    Problem p = make_problem(1, 1, 1, 1, 1, d);
    EXPECT_FLOAT_EQ(fa4::effective_scale(p), 1.0f / std::sqrt(float(d))) << "d" << d;
    p.softmax_scale = 0.3f;
    EXPECT_EQ(fa4::effective_scale(p), 0.3f);
  }
  EXPECT_EQ(fa4::effective_scale(make_problem(1, 1, 1, 1, 1, 64)), 0.125f);
}

TEST(Api, WorkspaceSizes) {
  ForwardArgs f;  // tensors need not exist yet
  f.problem = make_problem(2, 200, 300, 8, 2, 128);
  size_t bytes = 123;
  Status s = fa4::forward_workspace_size(f, &bytes);
  ASSERT_TRUE(s.ok()) << s.message;
  EXPECT_EQ(bytes, 0u);

  BackwardArgs b;
  b.problem = f.problem;
  s = fa4::backward_workspace_size(b, &bytes);
  ASSERT_TRUE(s.ok()) << s.message;
  // dQ in fp32 and two floats a row (rowsum(dO * O), LSE in log2 units); seqlen_q 200 rounds up to
  // 256 rows
  EXPECT_EQ(bytes, size_t{2} * 256 * 8 * (128 + 2) * 4);

  b.problem.seqlen_q = 256;  // already a multiple of the row tile
  ASSERT_TRUE(fa4::backward_workspace_size(b, &bytes).ok());
  EXPECT_EQ(bytes, size_t{2} * 256 * 8 * (128 + 2) * 4);

  b.problem.seqlen_q = 0;
  ASSERT_TRUE(fa4::backward_workspace_size(b, &bytes).ok());
  EXPECT_EQ(bytes, 0u);

  b.problem.head_dim = 100;
  s = fa4::backward_workspace_size(b, &bytes);
  EXPECT_EQ(s.code, StatusCode::kInvalidArgument);
  EXPECT_NE(s.message.find("head_dim = 100"), std::string::npos) << s.message;

  // A head dim without a kernel (80, on 128's): no zero-padded copies, forward or backward (their
  // kernels read and write the tensors in place); 200 (on 256's): the forward's copies, each
  // [rows, 256] bf16, and none in the backward (in place on every kernel).
  f.problem.head_dim = 80;
  ASSERT_TRUE(fa4::forward_workspace_size(f, &bytes).ok());
  const size_t q_rows = 2 * 200 * 8, kv_rows = 2 * 300 * 2;
  EXPECT_EQ(bytes, 0u);
  ForwardArgs wide = f;  // 200, on 256's kernels: q, k, v and o
  wide.problem.head_dim = 200;
  ASSERT_TRUE(fa4::forward_workspace_size(wide, &bytes).ok());
  EXPECT_EQ(bytes, (2 * q_rows + 2 * kv_rows) * 256 * 2);
  b.problem = f.problem;
  ASSERT_TRUE(fa4::backward_workspace_size(b, &bytes).ok());
  EXPECT_EQ(bytes, size_t{2} * 256 * 8 * (128 + 2) * 4);  // the kernels' dQ accumulator at 128 columns
  b.problem = wide.problem;
  {
    const fa4::test::BackwardD192 off(false);  // (the default routing: 200 on 256's kernels)
    ASSERT_TRUE(fa4::backward_workspace_size(b, &bytes).ok());
  }
  EXPECT_EQ(bytes, size_t{2} * 256 * 8 * (256 + 2) * 4);  // the accumulator at 256 columns alone
  b.problem = f.problem;
  // Packed sequences: the copies of total_q and total_k rows (each rounded up to 256 bytes).
  f.varlen.cu_seqlens_q = f.varlen.cu_seqlens_k = reinterpret_cast<const int32_t*>(uintptr_t{4096});
  f.varlen.total_q = 333, f.varlen.total_k = 77;
  ASSERT_TRUE(fa4::forward_workspace_size(f, &bytes).ok());
  EXPECT_EQ(bytes, 0u);
  wide.varlen = f.varlen;
  ASSERT_TRUE(fa4::forward_workspace_size(wide, &bytes).ok());
  EXPECT_EQ(bytes, (2 * 333 * 8 + 2 * 77 * 2) * 256 * 2);
  EXPECT_EQ(fa4::backward_workspace_size(b, nullptr).code, StatusCode::kInvalidArgument);
  EXPECT_EQ(fa4::forward_workspace_size(f, nullptr).code, StatusCode::kInvalidArgument);
}

// ---------------------------------------------------------------------------------------------
// The device rule, as a pure function.

TEST(Api, ContextIdFollowsTheCurrentContext) {
  // detail::current_context_id keys what fa4 keeps a context (PerDevice, the stream counters).
  // Without a GPU no context is current: 0, and those keep their values as before. With one, the
  // primary context's id is nonzero and stable, and a device reset's next context has another.
  // (With a GPU this test resets the device; ctest runs each test in a process of its own.)
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();
    EXPECT_EQ(fa4::detail::current_context_id(), 0u);
    return;
  }
  ASSERT_EQ(cudaFree(nullptr), cudaSuccess);  // the primary context, current
  const unsigned long long first = fa4::detail::current_context_id();
  EXPECT_NE(first, 0u);
  EXPECT_EQ(fa4::detail::current_context_id(), first);
  ASSERT_EQ(cudaDeviceReset(), cudaSuccess);
  ASSERT_EQ(cudaFree(nullptr), cudaSuccess);
  const unsigned long long second = fa4::detail::current_context_id();
  EXPECT_NE(second, 0u);
  EXPECT_NE(second, first);
}

TEST(Api, ComputeCapabilityBelowHopperRefused) {
  for (auto [major, minor] : {std::pair{8, 0}, std::pair{8, 9}, std::pair{7, 5}}) {
    const Status s = fa4::detail::check_compute_capability(major, minor);
    EXPECT_EQ(s.code, StatusCode::kNoDevice);
    const std::string found = std::to_string(major) + "." + std::to_string(minor);
    EXPECT_NE(s.message.find("compute capability " + found + " found"), std::string::npos)
        << s.message;
    EXPECT_NE(s.message.find("9.0"), std::string::npos) << s.message;
  }
  EXPECT_EQ(fa4::detail::check_compute_capability(8, 0).message,
            "compute capability 8.0 found, fa4 needs 9.0 (Hopper, sm_90a)");
}

TEST(Api, ComputeCapabilityHopperAccepted) {
  const Status s = fa4::detail::check_compute_capability(9, 0);
  EXPECT_TRUE(s.ok()) << s.message;
}

TEST(Api, ComputeCapabilityAfterHopperRefused) {
  // sm_90a code is architecture-specific: it does not run on Blackwell.
  for (int major : {10, 12}) {
    const Status s = fa4::detail::check_compute_capability(major, 0);
    EXPECT_EQ(s.code, StatusCode::kNoDevice);
    EXPECT_NE(s.message.find(std::to_string(major) + ".0 found"), std::string::npos) << s.message;
  }
}

// ---------------------------------------------------------------------------------------------
// What dispatch hands the kernel.

// What FwdParams and BwdParams share (detail::set_problem), for make_problem(3, 100, 200, 8, 2, 64)
// at the default scale 1/sqrt(64).
template <class Params>
void expect_resolved_sizes(const Params& k) {
  EXPECT_EQ(k.batch, 3);
  EXPECT_EQ(k.seqlen_q, 100);
  EXPECT_EQ(k.seqlen_k, 200);
  EXPECT_EQ(k.heads_q, 8);
  EXPECT_EQ(k.heads_kv, 2);
  EXPECT_EQ(k.head_dim, 64);
  EXPECT_EQ(k.scale, 0.125f);
  EXPECT_FLOAT_EQ(k.scale_log2, 0.125f * 1.44269504f);
}

TEST(Api, FwdParamsCarryResolvedArguments) {
  ForwardArgs a = fake_forward(make_problem(3, 100, 200, 8, 2, 64));
  a.problem.dtype = DType::kFP16;
  a.q = fa4::bhsd(fake(0), 100, 8, 64);
  const fa4::detail::FwdParams f = fa4::detail::make_fwd_params(a);
  EXPECT_EQ(f.dtype, DType::kFP16);
  EXPECT_EQ(f.q, fake(0));
  EXPECT_EQ(f.k, fake(1));
  EXPECT_EQ(f.v, fake(2));
  EXPECT_EQ(f.o, fake(3));
  EXPECT_EQ(f.lse, fake(4));
  EXPECT_EQ(f.q_stride[0], a.q.batch_stride);
  EXPECT_EQ(f.q_stride[1], a.q.seq_stride);
  EXPECT_EQ(f.q_stride[2], a.q.head_stride);
  EXPECT_EQ(f.k_stride[1], 2 * 64);
  EXPECT_EQ(f.v_stride[0], 200 * 2 * 64);
  EXPECT_EQ(f.o_stride[2], 64);
  expect_resolved_sizes(f);
  EXPECT_EQ(f.window_left, -1);
  EXPECT_EQ(f.window_right, -1);
}

// One query row a head under GQA/MQA (decoding): the group of each KV head folds into rows of one
// head by strides alone. Every (batch, query head) of Q and O lands on the same element as before,
// the LSE's layout is the same, and it folds only where every folded row sees every key.
TEST(Api, DecodingQueryGroupsFoldIntoRows) {
  for (const bool bhsd : {false, true})
    for (const int64_t hkv : {1, 2, 3})
      for (const int64_t group : {2, 4, 8}) {
        const int64_t hq = hkv * group, d = 128, batch = 3;
        ForwardArgs a = fake_forward(make_problem(batch, 1, 77, hq, hkv, d));
        if (bhsd) a.q = fa4::bhsd(fake(0), 1, hq, d), a.o = fa4::bhsd(fake(3), 1, hq, d);
        a.problem.causal = bhsd;  // a causal single query sees every key
        const fa4::detail::FwdParams f = fa4::detail::make_fwd_params(a);
        ASSERT_EQ(f.seqlen_q, group);
        ASSERT_EQ(f.heads_q, hkv);
        EXPECT_EQ(f.heads_kv, hkv);
        EXPECT_EQ(f.seqlen_k, 77);
        EXPECT_EQ(f.window_left, -1);
        EXPECT_EQ(f.window_right, -1);
        EXPECT_EQ(f.lse, a.lse);
        for (int64_t b = 0; b < batch; ++b)
          for (int64_t h = 0; h < hq; ++h) {
            const int64_t hk = h / group, g = h % group;
            EXPECT_EQ(b * f.q_stride[0] + g * f.q_stride[1] + hk * f.q_stride[2], b * a.q.batch_stride + h * a.q.head_stride);
            EXPECT_EQ(b * f.o_stride[0] + g * f.o_stride[1] + hk * f.o_stride[2], b * a.o.batch_stride + h * a.o.head_stride);
            EXPECT_EQ((b * f.heads_q + hk) * f.seqlen_q + g, b * hq + h);  // the LSE's index, folded and not
          }
        EXPECT_EQ(f.k_stride[2], a.k.head_stride);
      }
  auto folds = [](Problem p) { return fa4::detail::make_fwd_params(fake_forward(p)).seqlen_q != p.seqlen_q; };
  Problem p = make_problem(2, 1, 100, 8, 2, 64);
  EXPECT_TRUE(folds(p));
  p.window_left = 99;  // seqlen_k - 1: the one query still sees key 0
  p.window_right = 0;
  EXPECT_TRUE(folds(p));
  p.window_left = 98;  // key 0 not seen: the folded rows would each see other keys
  EXPECT_FALSE(folds(p));
  EXPECT_FALSE(folds(make_problem(2, 1, 100, 8, 8, 64)));  // no group to fold
  // Two query rows a head: not by strides, but into rows the kernel reads by query (fold_query_rows).
  const fa4::detail::FwdParams two = fa4::detail::make_fwd_params(fake_forward(make_problem(2, 2, 100, 8, 2, 64)));
  EXPECT_EQ(two.fold, 2);
  EXPECT_EQ(two.seqlen_q, 8);
  EXPECT_EQ(two.q_stride[1], 8 * 64);  // the tensor's own
}

// The backward's parameters: every tensor, the resolved problem, and the workspace split into the
// fp32 dQ accumulator, D and the log2 LSE (one float a row each, rows rounded up to
// kDqAccumRowAlign) exactly as backward_workspace_size counts it.
TEST(Api, BwdParamsCarryResolvedArgumentsAndSplitTheWorkspace) {
  BackwardArgs a = fake_backward(make_problem(3, 100, 200, 8, 2, 64));
  a.problem.dtype = DType::kFP16;
  a.problem.causal = true;
  a.problem.window_left = 17;
  a.deterministic = true;
  a.dout = fa4::bhsd(fake(5), 100, 8, 64);
  const fa4::detail::BwdParams b = fa4::detail::make_bwd_params(a);
  EXPECT_EQ(b.dtype, DType::kFP16);
  const void* data[] = {b.q, b.k, b.v, b.o, b.dout, b.dq, b.dk, b.dv};
  for (int i = 0; i < 4; ++i) EXPECT_EQ(data[i], fake(i)) << "tensor " << i;
  for (int i = 4; i < 8; ++i) EXPECT_EQ(data[i], fake(i + 1)) << "tensor " << i;
  EXPECT_EQ(b.lse, fake(4));
  EXPECT_EQ(b.do_stride[0], a.dout.batch_stride);
  EXPECT_EQ(b.do_stride[1], a.dout.seq_stride);
  EXPECT_EQ(b.do_stride[2], a.dout.head_stride);
  EXPECT_EQ(b.dk_stride[1], 2 * 64);
  EXPECT_EQ(b.dq_stride[0], 100 * 8 * 64);
  expect_resolved_sizes(b);
  EXPECT_EQ(b.window_left, 17);
  EXPECT_EQ(b.window_right, 0);  // causal
  EXPECT_TRUE(b.deterministic);
  EXPECT_EQ(b.rows, 128);  // 100 rounded up to kDqAccumRowAlign
  EXPECT_EQ(static_cast<void*>(b.dq_accum), a.workspace);
  const int64_t accum_floats = int64_t{3} * 8 * 128 * 64;
  EXPECT_EQ(b.delta, b.dq_accum + accum_floats);
  EXPECT_EQ(b.lse_log2, b.delta + 3 * 8 * 128);
  // The log2 LSE's last float is the workspace's last.
  EXPECT_EQ(static_cast<size_t>(reinterpret_cast<const char*>(b.lse_log2 + 3 * 8 * 128) -
                                static_cast<const char*>(a.workspace)),
            a.workspace_bytes);
}

TEST(Api, CausalFoldsIntoWindowRight) {
  Problem p = make_problem(1, 64, 64, 1, 1, 64);
  int64_t l = 0, r = 0;
  p.causal = true;
  fa4::detail::resolve_window(p, &l, &r);
  EXPECT_EQ(l, -1);
  EXPECT_EQ(r, 0);
  p.window_right = 5;  // causal wins over a wider right window
  fa4::detail::resolve_window(p, &l, &r);
  EXPECT_EQ(r, 0);
  p.window_left = 7;  // and keeps the left one
  fa4::detail::resolve_window(p, &l, &r);
  EXPECT_EQ(l, 7);
  EXPECT_EQ(r, 0);
  p.causal = false;
  fa4::detail::resolve_window(p, &l, &r);
  EXPECT_EQ(l, 7);
  EXPECT_EQ(r, 5);
}

TEST(Api, WindowsThatCannotBindBecomeUnbounded) {
  Problem p = make_problem(1, 100, 300, 1, 1, 64);
  int64_t l = 0, r = 0;
  p.window_left = 300;  // >= seqlen_k
  p.window_right = 100;  // >= seqlen_q
  fa4::detail::resolve_window(p, &l, &r);
  EXPECT_EQ(l, -1);
  EXPECT_EQ(r, -1);
  p.window_left = 299;
  p.window_right = 99;
  fa4::detail::resolve_window(p, &l, &r);
  EXPECT_EQ(l, 299);
  EXPECT_EQ(r, 99);
  p.window_left = std::numeric_limits<int64_t>::max();
  p.window_right = int64_t{1} << 40;
  const fa4::detail::FwdParams f = fa4::detail::make_fwd_params(fake_forward(p));
  EXPECT_EQ(f.window_left, -1);
  EXPECT_EQ(f.window_right, -1);
}

// The resolved window sees exactly the keys the user's arguments describe (DESIGN.md §4).
TEST(Api, ResolvedWindowKeepsEveryVisibility) {
  auto visible = [](int64_t i, int64_t j, int64_t sq, int64_t sk, bool causal, int64_t left,
                    int64_t right) {
    const int64_t diag = i + sk - sq;
    if (causal && j > diag) return false;
    if (left >= 0 && j < diag - left) return false;
    if (right >= 0 && j > diag + right) return false;
    return true;
  };
  for (int64_t sq = 1; sq <= 6; ++sq)
    for (int64_t sk = 1; sk <= 6; ++sk)
      for (bool causal : {false, true})
        for (int64_t left = -1; left <= 8; ++left)
          for (int64_t right = -1; right <= 8; ++right) {
            Problem p = make_problem(1, sq, sk, 1, 1, 64);
            p.causal = causal;
            p.window_left = left;
            p.window_right = right;
            int64_t l = 0, r = 0;
            fa4::detail::resolve_window(p, &l, &r);
            for (int64_t i = 0; i < sq; ++i)
              for (int64_t j = 0; j < sk; ++j)
                ASSERT_EQ(visible(i, j, sq, sk, causal, left, right),
                          visible(i, j, sq, sk, false, l, r))
                    << "sq " << sq << " sk " << sk << " causal " << causal << " window (" << left
                    << ", " << right << ") -> (" << l << ", " << r << ") at i " << i << " j " << j;
          }
}

// ---------------------------------------------------------------------------------------------
// Entry points without a kernel to run. These hold with or without a GPU.

TEST(Api, EmptyBatchOrQueryIsANoOpEverywhere) {
  ForwardArgs f;  // no tensors at all, null stream
  f.problem = make_problem(0, 128, 128, 4, 4, 128);
  Status s = fa4::forward(f, nullptr);
  EXPECT_TRUE(s.ok()) << s.message;
  f.problem = make_problem(2, 0, 128, 4, 4, 128);
  f.k = fa4::bshd(fake(1), 128, 4, 128);
  f.v = fa4::bshd(fake(2), 128, 4, 128);
  s = fa4::forward(f, nullptr);
  EXPECT_TRUE(s.ok()) << s.message;

  BackwardArgs b;
  b.problem = make_problem(0, 128, 128, 4, 4, 128);
  s = fa4::backward(b, nullptr);
  EXPECT_TRUE(s.ok()) << s.message;
  b.problem = make_problem(3, 0, 0, 4, 4, 128);
  s = fa4::backward(b, nullptr);
  EXPECT_TRUE(s.ok()) << s.message;
}

// Without a usable GPU, valid backward work is refused with kNoDevice before any pointer is
// reached; on the GPU machine the BackwardGpu tests run it.
TEST(Api, BackwardChecksTheDevice) {
  const std::string missing = fa4_test::gpu_missing_reason();
  if (missing.empty()) GTEST_SKIP() << "a GPU is present: BackwardGpu.* runs the backward";
  for (bool deterministic : {false, true}) {
    BackwardArgs b = fake_backward(make_problem(2, 128, 128, 4, 2, 128));
    b.deterministic = deterministic;
    const Status s = fa4::backward(b, nullptr);
    EXPECT_EQ(s.code, StatusCode::kNoDevice) << s.message;
    EXPECT_FALSE(s.message.empty());
  }
}

// Without a usable GPU, valid work is refused with kNoDevice (the pointers are fake and never
// reached). With one, forward either runs or reports no kernel for the shape, and never leaves a
// CUDA error behind.
TEST(Api, ForwardChecksTheDevice) {
  const std::string missing = fa4_test::gpu_missing_reason();
  const Problem p = make_problem(2, 128, 256, 4, 2, 128);
  if (!missing.empty()) {
    const Status s = fa4::forward(fake_forward(p), nullptr);
    EXPECT_EQ(s.code, StatusCode::kNoDevice) << s.message;
    EXPECT_FALSE(s.message.empty());
    Problem empty_keys = p;
    empty_keys.seqlen_k = 0;
    EXPECT_EQ(fa4::forward(fake_forward(empty_keys), nullptr).code, StatusCode::kNoDevice);
    return;
  }
  const size_t q_bytes = size_t(2) * 128 * 4 * 128 * 2, kv_bytes = size_t(2) * 256 * 2 * 128 * 2;
  void *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr, *lse = nullptr;
  ASSERT_EQ(cudaMalloc(&q, q_bytes), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&k, kv_bytes), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&v, kv_bytes), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&o, q_bytes), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&lse, size_t(2) * 4 * 128 * sizeof(float)), cudaSuccess);
  cudaMemset(q, 0, q_bytes);
  cudaMemset(k, 0, kv_bytes);
  cudaMemset(v, 0, kv_bytes);
  ForwardArgs a;
  a.problem = p;
  a.q = fa4::bshd(q, 128, 4, 128);
  a.k = fa4::bshd(k, 256, 2, 128);
  a.v = fa4::bshd(v, 256, 2, 128);
  a.o = fa4::bshd(o, 128, 4, 128);
  a.lse = static_cast<float*>(lse);
  const Status s = fa4::forward(a, nullptr);
  EXPECT_TRUE(s.code == StatusCode::kOk || s.code == StatusCode::kNotSupported)
      << fa4::to_string(s.code) << ": " << s.message;
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  for (void* ptr : {q, k, v, o, lse}) cudaFree(ptr);
}

// ---------------------------------------------------------------------------------------------
// The C ABI carries the same codes and messages.

TEST(CApi, ErrorsComeBackWithCodeAndMessage) {
  ForwardArgs a = fake_forward(make_problem(2, 128, 128, 4, 2, 100));
  const Status expected = fa4::validate(a);
  ASSERT_EQ(expected.code, StatusCode::kInvalidArgument);

  char msg[256];
  std::memset(msg, 'x', sizeof msg);
  EXPECT_EQ(c_forward(a, msg, sizeof msg), int(StatusCode::kInvalidArgument));
  EXPECT_EQ(std::string(msg), expected.message);

  std::memset(msg, 'x', sizeof msg);  // truncated, still NUL-terminated
  EXPECT_EQ(c_forward(a, msg, 8), int(StatusCode::kInvalidArgument));
  EXPECT_EQ(std::string(msg), expected.message.substr(0, 7));
  EXPECT_EQ(msg[8], 'x');  // nothing written past message_len

  EXPECT_EQ(c_forward(a, nullptr, 0), int(StatusCode::kInvalidArgument));  // no message wanted
  EXPECT_EQ(c_forward(a, msg, 0), int(StatusCode::kInvalidArgument));
  EXPECT_EQ(msg[0], expected.message[0]);  // untouched by a zero-length buffer

  BackwardArgs b = fake_backward(make_problem(2, 128, 128, 4, 2, 128));
  b.dk.head_stride = 3;
  const Status bexp = fa4::validate(b);
  ASSERT_EQ(bexp.code, StatusCode::kInvalidArgument);
  EXPECT_EQ(c_backward(b, msg, sizeof msg), int(StatusCode::kInvalidArgument));
  EXPECT_EQ(std::string(msg), bexp.message);
  EXPECT_NE(std::string(msg).find("dk.head_stride = 3"), std::string::npos);
}

TEST(CApi, SuccessAndNotSupportedRoundTrip) {
  char msg[64];
  std::memset(msg, 'x', sizeof msg);
  ForwardArgs f = fake_forward(make_problem(0, 128, 128, 4, 2, 128));  // no-op
  EXPECT_EQ(c_forward(f, msg, sizeof msg), int(StatusCode::kOk));
  EXPECT_STREQ(msg, "");

  // A grid the backward cannot launch (batch past 65535): kNotSupported on a GPU, kNoDevice
  // without one; either way the message arrives whole.
  char text[256];
  BackwardArgs b = fake_backward(make_problem(70000, 128, 128, 4, 2, 128));
  b.deterministic = true;
  const int code = c_backward(b, text, sizeof text);
  if (fa4_test::gpu_missing_reason().empty()) {
    EXPECT_EQ(code, int(StatusCode::kNotSupported));
    EXPECT_STREQ(text, "batch = 70000, heads_q = 4: the sm90 backward takes at most 65535 of each");
  } else {
    EXPECT_EQ(code, int(StatusCode::kNoDevice));
    EXPECT_GT(std::strlen(text), 0u);
  }
}

TEST(CApi, FieldsArriveIntact) {
  // Each field of fa4_problem reaches validation: break one at a time through the C ABI.
  const ForwardArgs good = fake_forward(make_problem(2, 128, 128, 4, 2, 128));
  const fa4_problem base = to_c(good.problem);
  char msg[256];
  const struct {
    void (*breaker)(fa4_problem&);
    const char* needle;
  } cases[] = {
      {[](fa4_problem& p) { p.dtype = 5; }, "dtype = 5"},
      {[](fa4_problem& p) { p.batch = -2; }, "batch = -2"},
      {[](fa4_problem& p) { p.seqlen_q = -3; }, "seqlen_q = -3"},
      {[](fa4_problem& p) { p.seqlen_k = -4; }, "seqlen_k = -4"},
      {[](fa4_problem& p) { p.heads_q = 5; }, "heads_q = 5"},
      {[](fa4_problem& p) { p.heads_kv = 3; }, "heads_kv = 3"},
      {[](fa4_problem& p) { p.head_dim = 36; }, "head_dim = 36"},
      {[](fa4_problem& p) { p.head_dim_v = 36; }, "head_dim_v = 36"},
      {[](fa4_problem& p) { p.softmax_scale = -1.0f; }, "softmax_scale = -1"},
      {[](fa4_problem& p) { p.window_left = -7; }, "window_left = -7"},
      {[](fa4_problem& p) { p.window_right = -8; }, "window_right = -8"},
  };
  for (const auto& c : cases) {
    fa4_problem p = base;
    c.breaker(p);
    const int code = fa4_forward(&p, to_c(good.q), to_c(good.k), to_c(good.v), to_c(good.o),
                                 good.lse, nullptr, 0, nullptr, msg, sizeof msg);
    EXPECT_EQ(code, int(StatusCode::kInvalidArgument)) << c.needle;
    EXPECT_NE(std::string(msg).find(c.needle), std::string::npos) << msg;
  }
}

TEST(CApi, NullProblem) {
  char msg[64];
  const fa4_tensor t{};
  EXPECT_EQ(fa4_forward(nullptr, t, t, t, t, nullptr, nullptr, 0, nullptr, msg, sizeof msg),
            int(StatusCode::kInvalidArgument));
  EXPECT_NE(std::string(msg).find("problem = null"), std::string::npos);
  EXPECT_EQ(fa4_backward(nullptr, t, t, t, t, t, t, t, t, nullptr, 0, nullptr, 0, nullptr, msg,
                         sizeof msg),
            int(StatusCode::kInvalidArgument));
  EXPECT_NE(std::string(msg).find("problem = null"), std::string::npos);
}

TEST(CApi, BackwardWorkspaceSizeAsTheCppOne) {
  char msg[160];
  BackwardArgs a;
  a.problem = fa4::test::make_problem(3, 100, 200, 8, 2, 128);
  size_t cpp = 0, c = 0;
  ASSERT_TRUE(fa4::backward_workspace_size(a, &cpp).ok());
  const fa4_problem p = to_c(a.problem);
  EXPECT_EQ(fa4_backward_workspace_size(&p, &c, msg, sizeof msg), int(StatusCode::kOk));
  EXPECT_EQ(c, cpp);
  EXPECT_EQ(c, size_t(3) * 128 * 8 * (128 + 2) * 4);  // batch x round_up(100, 128) x heads_q x (d + 2) x 4
  EXPECT_EQ(fa4_backward_workspace_size(nullptr, &c, msg, sizeof msg), int(StatusCode::kInvalidArgument));
  EXPECT_NE(std::string(msg).find("problem = null"), std::string::npos) << msg;
  EXPECT_EQ(fa4_backward_workspace_size(&p, nullptr, msg, sizeof msg), int(StatusCode::kInvalidArgument));
  EXPECT_NE(std::string(msg).find("bytes = null"), std::string::npos) << msg;
  fa4_problem bad = p;
  bad.head_dim = 100;
  EXPECT_EQ(fa4_backward_workspace_size(&bad, &c, msg, sizeof msg), int(StatusCode::kInvalidArgument));
  EXPECT_NE(std::string(msg).find("head_dim = 100"), std::string::npos) << msg;
}

// ---------------------------------------------------------------------------------------------
// On a GPU: the outputs of the kernel-free cases, written exactly where the strides say.

constexpr uint16_t kPoison = 0xFFFF;  // a NaN in bf16 and fp16

struct DeviceBuffer {
  void* ptr = nullptr;
  size_t bytes = 0;
  explicit DeviceBuffer(size_t n) : bytes(n) {
    EXPECT_EQ(cudaMalloc(&ptr, n), cudaSuccess);
    EXPECT_EQ(cudaMemset(ptr, 0xFF, n), cudaSuccess);  // poison
  }
  ~DeviceBuffer() { cudaFree(ptr); }
  std::vector<uint16_t> halves() const {
    std::vector<uint16_t> h(bytes / 2);
    EXPECT_EQ(cudaMemcpy(h.data(), ptr, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }
};

// Padded layout [b][s][h][d] with head_stride = d + 8 and an extra 16 elements per sequence row:
// the padding must stay poisoned, the tensor's own elements become 0.
TensorRef padded(void* data, int64_t s, int64_t h, int64_t d) {
  const int64_t hs = d + 8, ss = h * hs + 16;
  return {data, s * ss, ss, hs};
}

void expect_zero_inside_poison_outside(const std::vector<uint16_t>& buf, const TensorRef& t,
                                       int64_t b, int64_t s, int64_t h, int64_t d) {
  std::vector<char> inside(buf.size(), 0);
  for (int64_t ib = 0; ib < b; ++ib)
    for (int64_t is = 0; is < s; ++is)
      for (int64_t ih = 0; ih < h; ++ih)
        for (int64_t id = 0; id < d; ++id)
          inside[ib * t.batch_stride + is * t.seq_stride + ih * t.head_stride + id] = 1;
  int64_t wrong_inside = 0, wrong_outside = 0;
  for (size_t i = 0; i < buf.size(); ++i) {
    if (inside[i] && buf[i] != 0) ++wrong_inside;
    if (!inside[i] && buf[i] != kPoison) ++wrong_outside;
  }
  EXPECT_EQ(wrong_inside, 0) << "elements of the tensor not zeroed";
  EXPECT_EQ(wrong_outside, 0) << "bytes outside the tensor overwritten";
}

TEST(ApiGpu, NoKeysGiveZeroOutputAndMinusInfLse) {
  FA4_REQUIRE_GPU();
  const int64_t b = 2, sq = 37, hq = 4, hkv = 2, d = 64;
  for (bool pad : {false, true}) {
    const TensorRef o_shape = pad ? padded(nullptr, sq, hq, d) : fa4::bshd(nullptr, sq, hq, d);
    DeviceBuffer o(size_t(b * o_shape.batch_stride) * 2);
    DeviceBuffer lse(size_t(b * hq * sq) * sizeof(float) + 64);  // + a poisoned tail
    ForwardArgs a;
    a.problem = make_problem(b, sq, 0, hq, hkv, d);
    a.problem.causal = true;
    a.o = o_shape;
    a.o.data = o.ptr;
    a.q = fa4::bshd(o.ptr, sq, hq, d);  // read by nobody; any valid tensor will do
    a.lse = static_cast<float*>(lse.ptr);
    const Status s = fa4::forward(a, nullptr);
    ASSERT_TRUE(s.ok()) << s.message;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

    expect_zero_inside_poison_outside(o.halves(), a.o, b, sq, hq, d);
    std::vector<float> l(lse.bytes / sizeof(float));
    ASSERT_EQ(cudaMemcpy(l.data(), lse.ptr, lse.bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    for (int64_t i = 0; i < b * hq * sq; ++i)
      ASSERT_TRUE(std::isinf(l[i]) && l[i] < 0) << "lse[" << i << "] = " << l[i];
    for (size_t i = size_t(b * hq * sq); i < l.size(); ++i)
      ASSERT_TRUE(std::isnan(l[i])) << "lse tail overwritten at " << i;
  }
}

// With sinks a row without keys has LSE = its head's sink (O = 0 still), and the sinks' gradient
// where no attention runs (no keys, no queries, an empty batch) is 0.
TEST(ApiGpu, NoKeysWithSinksGiveTheSinksAsLseAndNoSinkGradient) {
  FA4_REQUIRE_GPU();
  const int64_t b = 2, sq = 37, hq = 4, hkv = 2, d = 64;
  const float sinks[hq] = {0.5f, -INFINITY, -2.25f, 7.0f};
  DeviceBuffer sink(sizeof sinks), o(size_t(b * sq * hq * d) * 2), lse(size_t(b * hq * sq) * sizeof(float));
  ASSERT_EQ(cudaMemcpy(sink.ptr, sinks, sizeof sinks, cudaMemcpyHostToDevice), cudaSuccess);
  ForwardArgs a;
  a.problem = make_problem(b, sq, 0, hq, hkv, d);
  a.o = a.q = fa4::bshd(o.ptr, sq, hq, d);
  a.lse = static_cast<float*>(lse.ptr);
  a.sink = static_cast<const float*>(sink.ptr);
  Status s = fa4::forward(a, nullptr);
  ASSERT_TRUE(s.ok()) << s.message;
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  expect_zero_inside_poison_outside(o.halves(), a.o, b, sq, hq, d);
  std::vector<float> l(size_t(b * hq * sq));
  ASSERT_EQ(cudaMemcpy(l.data(), lse.ptr, l.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  for (int64_t i = 0; i < b * hq * sq; ++i)
    ASSERT_EQ(l[size_t(i)], sinks[(i / sq) % hq]) << "lse[" << i << "]";

  const std::tuple<int64_t, int64_t, int64_t> empties[] = {{45, 0, 2}, {0, 45, 2}, {45, 45, 0}};  // sq, sk, batch
  for (const auto& [sq_b, sk_b, batch] : empties) {
    DeviceBuffer dsink(sizeof sinks), qs(size_t(2 * 45 * hq * d) * 2), grads(size_t(2 * 45 * hq * d) * 2),
        lse_b(size_t(2 * hq * 45) * sizeof(float));
    BackwardArgs g;
    g.problem = make_problem(batch, sq_b, sk_b, hq, hkv, d);
    g.q = g.o = g.dout = fa4::bshd(qs.ptr, sq_b, hq, d);
    g.k = g.v = fa4::bshd(qs.ptr, sk_b, hkv, d);
    g.dq = fa4::bshd(grads.ptr, sq_b, hq, d);
    g.dk = g.dv = fa4::bshd(grads.ptr, sk_b, hkv, d);
    g.lse = static_cast<const float*>(lse_b.ptr);
    g.sink = static_cast<const float*>(sink.ptr);
    g.dsink = static_cast<float*>(dsink.ptr);
    size_t ws = 0;
    ASSERT_TRUE(fa4::backward_workspace_size(g, &ws).ok());
    DeviceBuffer workspace(std::max<size_t>(ws, 16));
    g.workspace = workspace.ptr;
    g.workspace_bytes = ws;
    s = fa4::backward(g, nullptr);
    ASSERT_TRUE(s.ok()) << s.message;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    float got[hq];
    ASSERT_EQ(cudaMemcpy(got, dsink.ptr, sizeof got, cudaMemcpyDeviceToHost), cudaSuccess);
    for (int64_t h = 0; h < hq; ++h)
      EXPECT_EQ(got[h], 0.0f) << "dsink[" << h << "], batch " << batch << ", seqlen_q " << sq_b << ", seqlen_k " << sk_b;
  }
}

TEST(ApiGpu, BackwardWithAnEmptySideZeroesTheOtherGradients) {
  FA4_REQUIRE_GPU();
  const int64_t b = 2, s = 45, hq = 4, hkv = 2, d = 128;
  {  // no queries: dK = dV = 0
    const TensorRef shape = padded(nullptr, s, hkv, d);
    DeviceBuffer dk(size_t(b * shape.batch_stride) * 2), dv(size_t(b * shape.batch_stride) * 2);
    DeviceBuffer kv(size_t(b * s * hkv * d) * 2);
    BackwardArgs a;
    a.problem = make_problem(b, 0, s, hq, hkv, d);
    a.k = a.v = fa4::bshd(kv.ptr, s, hkv, d);
    a.dk = shape;
    a.dk.data = dk.ptr;
    a.dv = shape;
    a.dv.data = dv.ptr;
    const Status st = fa4::backward(a, nullptr);
    ASSERT_TRUE(st.ok()) << st.message;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    expect_zero_inside_poison_outside(dk.halves(), a.dk, b, s, hkv, d);
    expect_zero_inside_poison_outside(dv.halves(), a.dv, b, s, hkv, d);
  }
  {  // no keys: dQ = 0
    const TensorRef shape = fa4::bhsd(nullptr, s, hq, d);
    DeviceBuffer dq(size_t(b * shape.batch_stride) * 2), qs(size_t(b * s * hq * d) * 2);
    DeviceBuffer lse(size_t(b * hq * s) * sizeof(float));
    BackwardArgs a;
    a.problem = make_problem(b, s, 0, hq, hkv, d);
    a.q = a.o = a.dout = fa4::bshd(qs.ptr, s, hq, d);
    a.dq = shape;
    a.dq.data = dq.ptr;
    a.lse = static_cast<const float*>(lse.ptr);
    size_t ws = 0;
    ASSERT_TRUE(fa4::backward_workspace_size(a, &ws).ok());
    DeviceBuffer workspace(ws);
    a.workspace = workspace.ptr;
    a.workspace_bytes = ws;
    const Status st = fa4::backward(a, nullptr);
    ASSERT_TRUE(st.ok()) << st.message;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    expect_zero_inside_poison_outside(dq.halves(), a.dq, b, s, hq, d);
  }
}

}  // namespace
