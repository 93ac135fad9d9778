// The CUDA oracle against the float64 reference: same semantics (scale, causal, window, GQA,
// empty rows), any strided layout, and fp32-level agreement, far inside the low-precision
// implementation's error.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "convert.h"
#include "gpu_guard.h"
#include "reference.h"
#include "reference_gpu.h"
#include "test_support.h"

namespace {

using fa4::DType;
using fa4::Problem;
namespace ref = fa4::ref;

#define FA4_CUDA_OK(expr) ASSERT_EQ(cudaSuccess, (expr)) << #expr

struct DeviceBytes {
  void* ptr = nullptr;
  explicit DeviceBytes(size_t bytes) {
    if (cudaMalloc(&ptr, bytes ? bytes : 1) != cudaSuccess) ptr = nullptr;
  }
  ~DeviceBytes() { cudaFree(ptr); }
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;
};

enum class Layout { kBSHD, kBHSD, kPadded };

// Element strides of a [batch][seq][heads][dim] tensor stored in `layout`, and its span.
struct Strides {
  int64_t batch, seq, head, span;
};

Strides strides_for(Layout layout, int64_t batch, int64_t seq, int64_t heads, int64_t dim) {
  switch (layout) {
    case Layout::kBSHD:
      return {seq * heads * dim, heads * dim, dim, batch * seq * heads * dim};
    case Layout::kBHSD:
      return {heads * seq * dim, dim, seq * dim, batch * heads * seq * dim};
    case Layout::kPadded: {  // gaps after each head, each token and each sequence
      const int64_t head = dim + 8, s = heads * head + 24, b = seq * s + 40;
      return {b, s, head, batch * b};
    }
  }
  return {};
}

// Puts contiguous BSHD values (rounded to the dtype) into a device tensor with `layout`.
struct DeviceTensor {
  DeviceBytes mem;
  fa4::TensorRef ref;
  DeviceTensor(DType t, Layout layout, const std::vector<double>& bshd, int64_t batch, int64_t seq,
               int64_t heads, int64_t dim)
      : mem(2 * static_cast<size_t>(strides_for(layout, batch, seq, heads, dim).span)) {
    const Strides st = strides_for(layout, batch, seq, heads, dim);
    std::vector<uint16_t> host(st.span, ref::float_to_bits(t, NAN));  // gaps hold NaN
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t s = 0; s < seq; ++s)
        for (int64_t h = 0; h < heads; ++h)
          for (int64_t d = 0; d < dim; ++d)
            host[b * st.batch + s * st.seq + h * st.head + d] = ref::float_to_bits(
                t, static_cast<float>(bshd[((b * seq + s) * heads + h) * dim + d]));
    if (mem.ptr) cudaMemcpy(mem.ptr, host.data(), 2 * host.size(), cudaMemcpyHostToDevice);
    ref = {mem.ptr, st.batch, st.seq, st.head};
  }
};

std::vector<double> random_values(int64_t n, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> mag(0.05, 1.0);
  std::vector<double> x(n);
  for (auto& e : x) e = (gen() & 1) ? mag(gen) : -mag(gen);
  return x;
}

struct OracleCase {
  const char* name;
  Problem p;
  Layout layout;
};

void PrintTo(const OracleCase& c, std::ostream* os) { *os << c.name; }

using fa4::test::make_problem;

// Runs the oracle on `p` and returns O (contiguous BSHD) and LSE as double.
void run_oracle(const Problem& p, Layout layout, const std::vector<double>& q,
                const std::vector<double>& k, const std::vector<double>& v, ref::Forward64* out) {
  DeviceTensor dq(p.dtype, layout, q, p.batch, p.seqlen_q, p.heads_q, p.head_dim);
  DeviceTensor dk(p.dtype, layout, k, p.batch, p.seqlen_k, p.heads_kv, p.head_dim);
  DeviceTensor dv(p.dtype, layout, v, p.batch, p.seqlen_k, p.heads_kv, p.head_dim);
  DeviceBytes o(sizeof(float) * ref::q_elems(p)), lse(sizeof(float) * ref::lse_elems(p));
  ASSERT_TRUE(dq.mem.ptr && dk.mem.ptr && dv.mem.ptr && o.ptr && lse.ptr);
  fa4::ForwardArgs args;
  args.problem = p;
  args.q = dq.ref;
  args.k = dk.ref;
  args.v = dv.ref;
  const fa4::Status s =
      ref::gpu_forward(args, static_cast<float*>(o.ptr), static_cast<float*>(lse.ptr), nullptr);
  ASSERT_TRUE(s.ok()) << s.message;
  FA4_CUDA_OK(cudaDeviceSynchronize());
  std::vector<float> o32(ref::q_elems(p)), lse32(ref::lse_elems(p));
  FA4_CUDA_OK(cudaMemcpy(o32.data(), o.ptr, sizeof(float) * o32.size(), cudaMemcpyDeviceToHost));
  FA4_CUDA_OK(
      cudaMemcpy(lse32.data(), lse.ptr, sizeof(float) * lse32.size(), cudaMemcpyDeviceToHost));
  out->o.assign(o32.begin(), o32.end());
  out->lse.assign(lse32.begin(), lse32.end());
}

class ReferenceGpu : public ::testing::TestWithParam<OracleCase> {};

TEST_P(ReferenceGpu, MatchesTheFloat64Reference) {
  FA4_REQUIRE_GPU();
  const Problem& p = GetParam().p;
  const auto q = random_values(ref::q_elems(p), 1), k = random_values(ref::kv_elems(p), 2),
             v = random_values(ref::kv_elems(p), 3);
  ref::Forward64 gpu;
  ASSERT_NO_FATAL_FAILURE(run_oracle(p, GetParam().layout, q, k, v, &gpu));
  // The oracle sees the rounded inputs: so does the float64 reference it is held to.
  const auto exact =
      ref::forward(p, ref::rounded(p.dtype, q), ref::rounded(p.dtype, k), ref::rounded(p.dtype, v));
  const auto eo = ref::error_stats(gpu.o, exact.o), el = ref::error_stats(gpu.lse, exact.lse);
  const auto low = ref::error_stats(ref::forward_lowp(p, q, k, v).o, exact.o);
  std::cout << "[ oracle ] " << GetParam().name << ": O max abs " << eo.max_abs << ", rel frob "
            << eo.rel_frobenius << ", LSE max abs " << el.max_abs << " (plain "
            << (p.dtype == DType::kBF16 ? "bf16" : "fp16") << " implementation: " << low.max_abs
            << ")\n";
  EXPECT_LT(eo.max_abs, 2e-6);
  EXPECT_LT(el.max_abs, 2e-6 * (1 + std::log(static_cast<double>(p.seqlen_k + 1))));
  EXPECT_LE(eo.max_abs, low.max_abs / 20) << "the oracle must be far more accurate than 16-bit";
  // Empty rows exactly: O = 0, LSE = -inf.
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h)
      for (int64_t i = 0; i < p.seqlen_q; ++i) {
        bool any = false;
        for (int64_t j = 0; j < p.seqlen_k && !any; ++j) any = ref::visible(p, i, j);
        if (any) continue;
        EXPECT_EQ(gpu.lse[(b * p.heads_q + h) * p.seqlen_q + i], -INFINITY);
        for (int64_t d = 0; d < p.head_dim; ++d)
          ASSERT_EQ(gpu.o[((b * p.seqlen_q + i) * p.heads_q + h) * p.head_dim + d], 0.0);
      }
}

std::vector<OracleCase> oracle_cases() {
  std::vector<OracleCase> c;
  Problem p = make_problem(2, 37, 53, 4, 2, 64, DType::kBF16);
  p.causal = true;
  c.push_back({"bf16_causal_gqa_d64", p, Layout::kBSHD});
  p = make_problem(1, 64, 17, 3, 1, 128, DType::kFP16);
  p.window_left = 5;
  p.window_right = 3;
  c.push_back({"fp16_window_mqa_d128_bhsd", p, Layout::kBHSD});
  p = make_problem(1, 5, 300, 2, 2, 256, DType::kBF16);
  p.softmax_scale = 0.2f;
  c.push_back({"bf16_long_keys_d256_padded", p, Layout::kPadded});
  p = make_problem(2, 70, 40, 2, 2, 64, DType::kFP16);
  p.causal = true;  // 30 empty rows per head
  c.push_back({"fp16_causal_sq_gt_sk", p, Layout::kPadded});
  p = make_problem(3, 9, 1, 4, 4, 40, DType::kBF16);
  c.push_back({"bf16_one_key_d40", p, Layout::kBSHD});
  p = make_problem(1, 33, 130, 8, 2, 128, DType::kBF16);
  p.causal = true;
  p.window_left = 20;
  c.push_back({"bf16_causal_window_gqa", p, Layout::kBHSD});
  return c;
}

INSTANTIATE_TEST_SUITE_P(Cases, ReferenceGpu, ::testing::ValuesIn(oracle_cases()),
                         [](const ::testing::TestParamInfo<OracleCase>& info) {
                           return std::string(info.param.name);
                         });

TEST(ReferenceGpuArgs, RejectsWhatItCannotRunAndSkipsEmptyWork) {
  // No GPU work happens on these paths.
  fa4::ForwardArgs args;
  args.problem = make_problem(1, 4, 4, 3, 2, 64, DType::kBF16);
  float dummy = 0;
  EXPECT_EQ(ref::gpu_forward(args, &dummy, nullptr, nullptr).code,
            fa4::StatusCode::kInvalidArgument);
  args.problem.heads_kv = 3;
  EXPECT_EQ(ref::gpu_forward(args, &dummy, nullptr, nullptr).code,
            fa4::StatusCode::kInvalidArgument)
      << "null q";
  args.problem.head_dim = 8192;
  EXPECT_EQ(ref::gpu_forward(args, &dummy, nullptr, nullptr).code, fa4::StatusCode::kNotSupported);
  args.problem = make_problem(0, 4, 4, 1, 1, 64, DType::kBF16);
  EXPECT_TRUE(ref::gpu_forward(args, nullptr, nullptr, nullptr).ok()) << "no rows: nothing to do";
}

TEST(ReferenceGpuArgs, NoKeysGivesZeroAndMinusInf) {
  FA4_REQUIRE_GPU();
  const Problem p = make_problem(2, 3, 0, 2, 1, 16, DType::kFP16);
  ref::Forward64 gpu;
  ASSERT_NO_FATAL_FAILURE(
      run_oracle(p, Layout::kBSHD, random_values(ref::q_elems(p), 4), {}, {}, &gpu));
  for (double o : gpu.o) EXPECT_EQ(o, 0.0);
  for (double l : gpu.lse) EXPECT_EQ(l, -INFINITY);
}

// Not run by default (--gtest_also_run_disabled_tests): how long the oracle takes on the
// benchmark's shapes, for whoever verifies large problems with it.
TEST(ReferenceGpuTiming, DISABLED_LargeShapes) {
  FA4_REQUIRE_GPU();
  for (int64_t seq : {1024, 4096, 16384}) {
    for (bool causal : {false, true}) {
      Problem p = make_problem(16384 / seq, seq, seq, 16, 16, 128, DType::kBF16);
      p.causal = causal;
      DeviceBytes q(2 * ref::q_elems(p)), k(2 * ref::kv_elems(p)), v(2 * ref::kv_elems(p));
      DeviceBytes o(4 * ref::q_elems(p)), lse(4 * ref::lse_elems(p));
      ASSERT_TRUE(q.ptr && k.ptr && v.ptr && o.ptr && lse.ptr);
      FA4_CUDA_OK(cudaMemset(q.ptr, 0x3C, 2 * ref::q_elems(p)));  // bf16 0x3C3C, about 0.0115
      FA4_CUDA_OK(cudaMemset(k.ptr, 0x3C, 2 * ref::kv_elems(p)));
      FA4_CUDA_OK(cudaMemset(v.ptr, 0x3C, 2 * ref::kv_elems(p)));
      fa4::ForwardArgs args;
      args.problem = p;
      args.q = {q.ptr, seq * 16 * 128, 16 * 128, 128};
      args.k = {k.ptr, seq * 16 * 128, 16 * 128, 128};
      args.v = {v.ptr, seq * 16 * 128, 16 * 128, 128};
      const auto t0 = std::chrono::steady_clock::now();
      ASSERT_TRUE(
          ref::gpu_forward(args, static_cast<float*>(o.ptr), static_cast<float*>(lse.ptr), nullptr)
              .ok());
      FA4_CUDA_OK(cudaDeviceSynchronize());
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::cout << "[ oracle timing ] b " << p.batch << " h 16 s " << seq << " d 128"
                << (causal ? " causal" : "") << ": " << s << " s\n";
    }
  }
}

}  // namespace
