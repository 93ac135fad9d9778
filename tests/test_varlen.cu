// Variable-length batches (fa4::Varlen): the checks on the CPU, and on the GPU each packed sequence
// against the float64 reference of that sequence alone, with DESIGN.md §3's criterion. O and the
// LSE are poisoned first: rows inside a sequence that the kernel leaves unwritten fail the check,
// and rows outside every sequence must keep their poison.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "common/fwd_params.h"
#include "common/validate.h"
#include "convert.h"
#include "device_tensor.h"
#include "fa4/attention.h"
#include "gpu_guard.h"
#include "reference.h"
#include "test_support.h"

namespace {

using fa4::DType;
using fa4::ForwardArgs;
using fa4::Status;
using fa4::StatusCode;
using fa4::test::fake;

// A valid varlen call's arguments (pointers never dereferenced): 3 sequences packed into 100 query
// and 120 key rows, d128, 8/2 heads.
ForwardArgs valid_varlen() {
  ForwardArgs a;
  a.problem = fa4::test::make_problem(3, 50, 60, 8, 2, 128);
  a.q = {fake(1), 0, 8 * 128, 128};
  a.o = {fake(2), 0, 8 * 128, 128};
  a.k = {fake(3), 0, 2 * 128, 128};
  a.v = {fake(4), 0, 2 * 128, 128};
  a.varlen.cu_seqlens_q = static_cast<const int32_t*>(fake(5));
  a.varlen.cu_seqlens_k = static_cast<const int32_t*>(fake(6));
  a.varlen.total_q = 100;
  a.varlen.total_k = 120;
  return a;
}

// The backward of valid_varlen(): dout, dq, dk, dv packed as q and k, an LSE, no workspace yet.
fa4::BackwardArgs valid_varlen_backward() {
  const ForwardArgs f = valid_varlen();
  fa4::BackwardArgs b;
  b.problem = f.problem;
  b.q = f.q, b.k = f.k, b.v = f.v, b.o = f.o;
  b.dout = {fake(8), 0, 8 * 128, 128};
  b.dq = {fake(9), 0, 8 * 128, 128};
  b.dk = {fake(10), 0, 2 * 128, 128};
  b.dv = {fake(11), 0, 2 * 128, 128};
  b.lse = static_cast<const float*>(fake(12));
  b.varlen = f.varlen;
  return b;
}

void expect_refused(const ForwardArgs& a, const std::string& needle) {
  const Status s = fa4::validate(a);
  EXPECT_EQ(s.code, StatusCode::kInvalidArgument) << needle;
  EXPECT_NE(s.message.find(needle), std::string::npos) << "message: " << s.message << "\nexpected: " << needle;
}

TEST(Varlen, ValidArgumentsPass) {
  const Status s = fa4::validate(valid_varlen());
  EXPECT_TRUE(s.ok()) << s.message;
}

TEST(Varlen, RefusalsNameTheArgumentAndTheRule) {
  ForwardArgs a = valid_varlen();
  a.varlen.cu_seqlens_k = nullptr;
  expect_refused(a, "varlen.cu_seqlens_k = null: a variable-length batch needs both");
  a = valid_varlen();
  a.varlen.cu_seqlens_q = nullptr;
  expect_refused(a, "varlen.cu_seqlens_q = null");
  a = valid_varlen();
  a.varlen.cu_seqlens_q = reinterpret_cast<const int32_t*>(static_cast<const char*>(fake(5)) + 2);
  expect_refused(a, "varlen.cu_seqlens_q = 0x7f0050000002: must be a multiple of 4 bytes (int32)");
  a = valid_varlen();
  a.varlen.total_q = -1;
  expect_refused(a, "varlen.total_q = -1: must be >= 0");
  a = valid_varlen();
  a.varlen.total_k = int64_t{1} << 31;
  expect_refused(a, "varlen.total_k = 2147483648: must fit in int32");
  a = valid_varlen();
  a.k.seq_stride = 2 * 128 + 4;  // 8 bytes
  expect_refused(a, "k.seq_stride = 260: must be a multiple of 8 elements");
  a = valid_varlen();
  a.q.head_stride = int64_t{1} << 62;
  expect_refused(a, "the largest offset");
  a = valid_varlen();
  a.lse = reinterpret_cast<float*>(static_cast<char*>(fake(7)) + 2);
  expect_refused(a, "lse = 0x7f0070000002: must be a multiple of 4 bytes (float)");
  a = valid_varlen();
  a.o.data = nullptr;
  expect_refused(a, "o.data = null");
  // The problem's own rules still come first.
  a = valid_varlen();
  a.problem.head_dim = 100;
  expect_refused(a, "head_dim = 100: must be a multiple of 8 in [8, 256]");
  // Soft-capping runs with varlen too; a bad cap is still named.
  a = valid_varlen();
  a.problem.softcap = 20.0f;
  const fa4::Status s = fa4::validate(a);
  EXPECT_TRUE(s.ok()) << s.message;
  EXPECT_EQ(fa4::detail::make_fwd_params(a).softcap, 20.0f);
  a.problem.softcap = -2.0f;
  expect_refused(a, "softcap = -2: must be finite and >= 0");
}

TEST(Varlen, BackwardRefusalsNameTheArgument) {
  fa4::BackwardArgs b = valid_varlen_backward();
  ASSERT_TRUE(fa4::backward_workspace_size(b, &b.workspace_bytes).ok());
  // batch x round_up(longest query sequence, 128) x heads_q x (head_dim + 2) x 4
  EXPECT_EQ(b.workspace_bytes, size_t(3) * 128 * 8 * (128 + 2) * 4);
  b.workspace = fake(13);
  Status s = fa4::validate(b);
  EXPECT_TRUE(s.ok()) << s.message;
  fa4::BackwardArgs x = b;
  x.lse = nullptr;
  s = fa4::validate(x);
  EXPECT_NE(s.message.find("lse = null: backward needs the forward pass's log-sum-exp [heads_q, total_q]"),
            std::string::npos) << s.message;
  x = b;
  x.dk.seq_stride = 2 * 128 + 4;
  s = fa4::validate(x);
  EXPECT_NE(s.message.find("dk.seq_stride = 260: must be a multiple of 8 elements"), std::string::npos) << s.message;
  x = b;
  x.workspace_bytes = 100;
  s = fa4::validate(x);
  EXPECT_NE(s.message.find("workspace_bytes = 100: backward needs at least"), std::string::npos) << s.message;
  x = b;
  x.problem.softcap = 20.0f;  // soft-capping runs with varlen, backward as forward
  s = fa4::validate(x);
  EXPECT_TRUE(s.ok()) << s.message;
  EXPECT_EQ(fa4::detail::make_bwd_params(x).softcap, 20.0f);
  x = b;
  x.varlen.cu_seqlens_k = nullptr;
  s = fa4::validate(x);
  EXPECT_NE(s.message.find("varlen.cu_seqlens_k = null"), std::string::npos) << s.message;
  // No query row: a no-op before any GPU call.
  x = b;
  x.varlen.total_q = 0;
  x.varlen.total_k = 0;
  s = fa4::backward(x, nullptr);
  EXPECT_TRUE(s.ok()) << s.message;
}

// seqused_k (the filled part of each sequence's key span): forward only, int32-aligned; with
// cu_seqlens it narrows each span, without them each batch entry's keys (a KV cache's cache_seqlens);
// it reaches the kernel's parameters either way.
TEST(Varlen, SequsedKeysForwardOnly) {
  ForwardArgs a = valid_varlen();
  a.varlen.seqused_k = static_cast<const int32_t*>(fake(14));
  Status s = fa4::validate(a);
  EXPECT_TRUE(s.ok()) << s.message;
  EXPECT_EQ(fa4::detail::make_fwd_params(a).seqused_k, a.varlen.seqused_k);
  a.varlen.seqused_k = reinterpret_cast<const int32_t*>(static_cast<const char*>(fake(14)) + 2);
  expect_refused(a, "varlen.seqused_k = 0x7f00e0000002: must be a multiple of 4 bytes (int32)");
  ForwardArgs batched;
  batched.problem = fa4::test::make_problem(2, 50, 60, 8, 2, 128);
  batched.q = fa4::bshd(fake(1), 50, 8, 128);
  batched.o = fa4::bshd(fake(2), 50, 8, 128);
  batched.k = batched.v = fa4::bshd(fake(3), 60, 2, 128);
  ASSERT_TRUE(fa4::validate(batched).ok());
  batched.varlen.seqused_k = static_cast<const int32_t*>(fake(14));
  s = fa4::validate(batched);
  EXPECT_TRUE(s.ok()) << s.message;
  const fa4::detail::FwdParams fb = fa4::detail::make_fwd_params(batched);
  EXPECT_FALSE(fb.varlen());
  EXPECT_EQ(fb.seqused_k, batched.varlen.seqused_k);
  EXPECT_EQ(fb.seqlen_q, 50);
  ForwardArgs decode = batched;  // one query a head: its group of 4 heads still folds into rows
  decode.problem.seqlen_q = 1;
  ASSERT_TRUE(fa4::validate(decode).ok());
  const fa4::detail::FwdParams fd = fa4::detail::make_fwd_params(decode);
  EXPECT_EQ(fd.seqlen_q, 4);
  EXPECT_EQ(fd.heads_q, 2);
  EXPECT_EQ(fd.seqused_k, decode.varlen.seqused_k);
  batched.varlen.seqused_k = reinterpret_cast<const int32_t*>(static_cast<const char*>(fake(14)) + 2);
  expect_refused(batched, "varlen.seqused_k = 0x7f00e0000002: must be a multiple of 4 bytes (int32)");
  fa4::BackwardArgs b = valid_varlen_backward();
  ASSERT_TRUE(fa4::backward_workspace_size(b, &b.workspace_bytes).ok());
  b.workspace = fake(13);
  ASSERT_TRUE(fa4::validate(b).ok());
  b.varlen.seqused_k = static_cast<const int32_t*>(fake(14));
  s = fa4::validate(b);
  EXPECT_EQ(s.code, StatusCode::kNotSupported) << s.message;
  EXPECT_NE(s.message.find("varlen.seqused_k = 0x7f00e0000000: the backward takes each sequence's keys"),
            std::string::npos) << s.message;
  fa4::BackwardArgs bb;
  bb.problem = batched.problem;
  bb.q = bb.o = bb.dout = bb.dq = batched.q;
  bb.k = bb.v = bb.dk = bb.dv = batched.k;
  bb.lse = static_cast<const float*>(fake(15));
  bb.varlen.seqused_k = static_cast<const int32_t*>(fake(14));
  s = fa4::validate(bb);
  EXPECT_EQ(s.code, StatusCode::kNotSupported) << s.message;
  EXPECT_NE(s.message.find("varlen.seqused_k = 0x7f00e0000000: the backward takes every key of seqlen_k"),
            std::string::npos) << s.message;
}

// leftpad_k (each sequence's keys starting past a left pad): forward only, int32-aligned, not with
// a paged cache; with cu_seqlens or batched it reaches the kernel's parameters.
TEST(Varlen, LeftPadForwardOnlyNotPaged) {
  ForwardArgs a = valid_varlen();
  a.varlen.leftpad_k = static_cast<const int32_t*>(fake(16));
  Status s = fa4::validate(a);
  EXPECT_TRUE(s.ok()) << s.message;
  EXPECT_EQ(fa4::detail::make_fwd_params(a).leftpad_k, a.varlen.leftpad_k);
  a.varlen.leftpad_k = reinterpret_cast<const int32_t*>(static_cast<const char*>(fake(16)) + 2);
  expect_refused(a, "varlen.leftpad_k = 0x7f0100000002: must be a multiple of 4 bytes (int32)");
  ForwardArgs batched;
  batched.problem = fa4::test::make_problem(2, 1, 60, 8, 2, 128);
  batched.q = fa4::bshd(fake(1), 1, 8, 128);
  batched.o = fa4::bshd(fake(2), 1, 8, 128);
  batched.k = batched.v = fa4::bshd(fake(3), 60, 2, 128);
  batched.varlen.leftpad_k = static_cast<const int32_t*>(fake(16));
  s = fa4::validate(batched);
  EXPECT_TRUE(s.ok()) << s.message;
  const fa4::detail::FwdParams fb = fa4::detail::make_fwd_params(batched);
  EXPECT_FALSE(fb.varlen());
  EXPECT_EQ(fb.leftpad_k, batched.varlen.leftpad_k);
  EXPECT_EQ(fb.seqlen_q, 4);  // the query group still folds into rows
  ForwardArgs paged = batched;
  paged.k = paged.v = fa4::bshd(fake(3), 64, 2, 128);
  paged.paged = {static_cast<const int32_t*>(fake(5)), 1, 64, 4};
  s = fa4::validate(paged);
  EXPECT_EQ(s.code, StatusCode::kNotSupported) << s.message;
  EXPECT_NE(s.message.find("varlen.leftpad_k = 0x7f0100000000: not with a paged cache"), std::string::npos)
      << s.message;
  paged.varlen.leftpad_k = nullptr;
  EXPECT_TRUE(fa4::validate(paged).ok()) << fa4::validate(paged).message;
  fa4::BackwardArgs b = valid_varlen_backward();
  ASSERT_TRUE(fa4::backward_workspace_size(b, &b.workspace_bytes).ok());
  b.workspace = fake(13);
  b.varlen.leftpad_k = static_cast<const int32_t*>(fake(16));
  s = fa4::validate(b);
  EXPECT_EQ(s.code, StatusCode::kNotSupported) << s.message;
  EXPECT_NE(s.message.find("varlen.leftpad_k = 0x7f0100000000: the backward takes each sequence's keys from row 0"),
            std::string::npos) << s.message;
}

TEST(Varlen, BatchStrideIsNotRead) {
  ForwardArgs a = valid_varlen();
  a.q.batch_stride = 12345;  // misaligned, and never used
  const Status s = fa4::validate(a);
  EXPECT_TRUE(s.ok()) << s.message;
}

TEST(Varlen, ParamsCarryTheSequencesAndNeverFold) {
  ForwardArgs a = valid_varlen();
  a.problem.seqlen_q = 1;  // decoding: the batched call would fold the query groups
  const fa4::detail::FwdParams f = fa4::detail::make_fwd_params(a);
  EXPECT_TRUE(f.varlen());
  EXPECT_EQ(f.cu_seqlens_q, a.varlen.cu_seqlens_q);
  EXPECT_EQ(f.cu_seqlens_k, a.varlen.cu_seqlens_k);
  EXPECT_EQ(f.total_q, 100);
  EXPECT_EQ(f.total_k, 120);
  EXPECT_EQ(f.heads_q, 8);
  EXPECT_EQ(f.seqlen_q, 1);
  EXPECT_EQ(f.q_stride[1], 8 * 128);
}

TEST(Varlen, NoQueryRowsIsANoOpWithoutTheGpu) {
  ForwardArgs a = valid_varlen();
  a.varlen.total_q = 0;
  const Status s = fa4::forward(a, nullptr);
  EXPECT_TRUE(s.ok()) << s.message;
}

// ---------------------------------------------------------------------------------------------
// On the GPU.

struct VarlenCase {
  DType dtype;
  int64_t heads_q, heads_kv, head_dim;
  std::vector<int> len_q, len_k;
  bool causal = false;
  int64_t left = -1, right = -1;
  int spare_rows = 5;     // rows after the last sequence: the forward never writes them, the backward zeroes them
  int spare_heads = 0;    // a head stride past the heads (strided views)
  int schedule = 0;       // FwdParams::schedule / max_ctas through the sm90 launch where set
  int max_ctas = 0;
  float softcap = 0.0f;   // Problem::softcap, with K's entries scaled by key_scale (the cap's bend)
  double key_scale = 1.0;
  // Varlen::seqused_k where not empty (forward only): sequence b's keys the first used[b] of its
  // span (clamped to [0, len_k[b]]), the span's rows after them NaN (a cache's unwritten rows).
  std::vector<int> used;
  // Varlen::leftpad_k where not empty (forward only): sequence b's keys from row pad[b] of its span
  // (clamped to [0, their end]), the rows before them NaN.
  std::vector<int> pad;
  // Rows set to NaN in every input (q, k, v and dout): those of the sequences listed, whose own
  // outputs are then not checked, and with nan_spare the spare rows after the last sequence. The
  // other sequences' outputs must not see them.
  std::vector<int> nan_seqs;
  bool nan_spare = false;
  int64_t head_dim_v = 0;  // Problem::head_dim_v (0: head_dim's): v's, o's and dout's columns
  int64_t dv() const { return head_dim_v > 0 ? head_dim_v : head_dim; }
  bool is_nan_seq(int64_t b) const { return std::find(nan_seqs.begin(), nan_seqs.end(), int(b)) != nan_seqs.end(); }

  std::string name() const {
    std::string s = std::string(fa4::to_string(dtype)) + " h" + std::to_string(heads_q) + "/" +
                    std::to_string(heads_kv) + " d" + std::to_string(head_dim) + (causal ? " causal" : "") +
                    " win(" + std::to_string(left) + "," + std::to_string(right) + ") q{";
    for (int x : len_q) s += std::to_string(x) + ",";
    s += "} k{";
    for (int x : len_k) s += std::to_string(x) + ",";
    s += "}";
    if (spare_heads) s += " strided";
    if (schedule || max_ctas) s += " schedule " + std::to_string(schedule) + " ctas " + std::to_string(max_ctas);
    if (!used.empty()) {
      s += " used{";
      for (int x : used) s += std::to_string(x) + ",";
      s += "}";
    }
    if (!pad.empty()) {
      s += " pad{";
      for (int x : pad) s += std::to_string(x) + ",";
      s += "}";
    }
    if (softcap > 0) s += " softcap " + std::to_string(softcap) + " keys x" + std::to_string(key_scale);
    if (head_dim_v > 0) s += " dv" + std::to_string(head_dim_v);
    return s;
  }
};

std::vector<int32_t> prefix(const std::vector<int>& lens) {
  std::vector<int32_t> cu(lens.size() + 1, 0);
  for (size_t i = 0; i < lens.size(); ++i) cu[i + 1] = cu[i] + lens[i];
  return cu;
}

// Packed rows [rows][heads + spare][d] of 16-bit values; element (r, h, x) at (r * hs + h) * d + x.
struct Packed {
  fa4_test::DeviceBuffer buf;
  int64_t rows = 0, heads = 0, hs = 0, d = 0;
  fa4::TensorRef ref;
  void make(int64_t rows_, int64_t heads_, int64_t spare, int64_t d_) {
    rows = rows_, heads = heads_, hs = heads_ + spare, d = d_;
    CUDA_OK(cudaMalloc(&buf.ptr, std::max<int64_t>(rows * hs * d, 1) * 2));
    CUDA_OK(cudaMemset(buf.ptr, 0xFF, std::max<int64_t>(rows * hs * d, 1) * 2));  // poison
    ref = {buf.ptr, 0, hs * d, d};
  }
  int64_t at(int64_t r, int64_t h, int64_t x) const { return (r * hs + h) * d + x; }
  // Rows [first, first + n) set to NaN (0xFFFF in bf16 and fp16): a cache's never-written rows.
  void nan_rows(int64_t first, int64_t n) const {
    CUDA_OK(cudaMemset(static_cast<uint16_t*>(buf.ptr) + first * hs * d, 0xFF, size_t(n * hs * d) * 2));
  }
};

// A case's inputs on the device: q, k, v random (and dout for the backward), o poisoned, the
// LSE poisoned, the cu_seqlens, and the forward's arguments.
struct VarlenRun {
  std::vector<int32_t> cu_q, cu_k;
  int64_t batch = 0, total_q = 0, total_k = 0;
  Packed q, k, v, o, dout;
  std::vector<double> hq, hk, hv, hdo;
  fa4_test::DeviceBuffer dcu_q, dcu_k, dlse, dused, dpad;
  ForwardArgs args;
  // Where sequence b's keys end in its span: len_k[b], or used[b] clamped to it; where they start:
  // pad[b] clamped to [0, end] (0 without pad); their count.
  static int end_of(const VarlenCase& c, int64_t b) {
    const int len = c.len_k[size_t(b)];
    return c.used.empty() ? len : std::clamp(c.used[size_t(b)], 0, len);
  }
  static int first_of(const VarlenCase& c, int64_t b) {
    return c.pad.empty() ? 0 : std::clamp(c.pad[size_t(b)], 0, end_of(c, b));
  }
  static int keys_of(const VarlenCase& c, int64_t b) { return end_of(c, b) - first_of(c, b); }

  void setup(const VarlenCase& c, uint32_t seed, bool with_dout) {
    batch = int64_t(c.len_q.size());
    ASSERT_EQ(c.len_k.size(), c.len_q.size());
    cu_q = prefix(c.len_q), cu_k = prefix(c.len_k);
    total_q = cu_q.back() + c.spare_rows, total_k = cu_k.back() + c.spare_rows;
    const int max_q = *std::max_element(c.len_q.begin(), c.len_q.end());
    const int max_k = *std::max_element(c.len_k.begin(), c.len_k.end());
    const int64_t d = c.head_dim;
    std::mt19937 rng(seed);
    std::normal_distribution<double> normal(0.0, 1.0);
    auto fill = [&](const Packed& t, std::vector<double>& vals, double scale = 1.0) {
      vals.assign(size_t(t.rows * t.hs * t.d), 0.0);
      for (double& x : vals) x = fa4::ref::round_to(c.dtype, float(scale * normal(rng)));
      const std::vector<uint16_t> bits = fa4::ref::to_bits(c.dtype, vals);
      CUDA_OK(cudaMemcpy(t.buf.ptr, bits.data(), bits.size() * 2, cudaMemcpyHostToDevice));
    };
    ASSERT_NO_FATAL_FAILURE(q.make(total_q, c.heads_q, c.spare_heads, d));
    ASSERT_NO_FATAL_FAILURE(k.make(total_k, c.heads_kv, c.spare_heads, d));
    ASSERT_NO_FATAL_FAILURE(v.make(total_k, c.heads_kv, c.spare_heads, c.dv()));
    ASSERT_NO_FATAL_FAILURE(o.make(total_q, c.heads_q, c.spare_heads, c.dv()));
    ASSERT_NO_FATAL_FAILURE(fill(q, hq));
    ASSERT_NO_FATAL_FAILURE(fill(k, hk, c.key_scale));
    ASSERT_NO_FATAL_FAILURE(fill(v, hv));
    if (with_dout) {
      ASSERT_NO_FATAL_FAILURE(dout.make(total_q, c.heads_q, c.spare_heads, c.dv()));
      ASSERT_NO_FATAL_FAILURE(fill(dout, hdo));
    }
    CUDA_OK(cudaMalloc(&dcu_q.ptr, cu_q.size() * 4));
    CUDA_OK(cudaMalloc(&dcu_k.ptr, cu_k.size() * 4));
    CUDA_OK(cudaMemcpy(dcu_q.ptr, cu_q.data(), cu_q.size() * 4, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dcu_k.ptr, cu_k.data(), cu_k.size() * 4, cudaMemcpyHostToDevice));
    const int64_t n_lse = std::max<int64_t>(c.heads_q * total_q, 1);
    CUDA_OK(cudaMalloc(&dlse.ptr, n_lse * 4));
    CUDA_OK(cudaMemset(dlse.ptr, 0xFF, n_lse * 4));
    args.problem = fa4::test::make_problem(batch, max_q, max_k, c.heads_q, c.heads_kv, d, c.dtype);
    args.problem.causal = c.causal;
    args.problem.window_left = c.left;
    args.problem.window_right = c.right;
    args.problem.softcap = c.softcap;
    args.problem.head_dim_v = c.head_dim_v;
    args.q = q.ref, args.k = k.ref, args.v = v.ref, args.o = o.ref;
    args.lse = static_cast<float*>(dlse.ptr);
    args.varlen = {static_cast<const int32_t*>(dcu_q.ptr), static_cast<const int32_t*>(dcu_k.ptr), total_q, total_k};
    // NaN in every input's rows: query rows [q_first, + q_rows) of q (and dout), key rows
    // [k_first, + k_rows) of k and v.
    auto nan_inputs = [&](int64_t q_first, int64_t q_rows, int64_t k_first, int64_t k_rows) {
      for (const Packed* t : {&k, &v}) t->nan_rows(k_first, k_rows);
      q.nan_rows(q_first, q_rows);
      if (with_dout) dout.nan_rows(q_first, q_rows);
    };
    for (int b : c.nan_seqs) nan_inputs(cu_q[size_t(b)], c.len_q[size_t(b)], cu_k[size_t(b)], c.len_k[size_t(b)]);
    if (c.nan_spare) nan_inputs(cu_q.back(), total_q - cu_q.back(), cu_k.back(), total_k - cu_k.back());
    if (!c.used.empty()) {
      ASSERT_EQ(c.used.size(), c.len_k.size());
      CUDA_OK(cudaMalloc(&dused.ptr, c.used.size() * 4));
      CUDA_OK(cudaMemcpy(dused.ptr, c.used.data(), c.used.size() * 4, cudaMemcpyHostToDevice));
      args.varlen.seqused_k = static_cast<const int32_t*>(dused.ptr);
      for (int64_t b = 0; b < batch; ++b)  // the span's rows past the used keys
        for (const Packed* t : {&k, &v}) t->nan_rows(cu_k[size_t(b)] + end_of(c, b), c.len_k[size_t(b)] - end_of(c, b));
    }
    if (!c.pad.empty()) {
      ASSERT_EQ(c.pad.size(), c.len_k.size());
      CUDA_OK(cudaMalloc(&dpad.ptr, c.pad.size() * 4));
      CUDA_OK(cudaMemcpy(dpad.ptr, c.pad.data(), c.pad.size() * 4, cudaMemcpyHostToDevice));
      args.varlen.leftpad_k = static_cast<const int32_t*>(dpad.ptr);
      for (int64_t b = 0; b < batch; ++b)  // the span's rows before the keys
        for (const Packed* t : {&k, &v}) t->nan_rows(cu_k[size_t(b)], first_of(c, b));
    }
  }
  // Sequence b's problem alone (a batch of one), over its keys (keys_of).
  fa4::Problem problem_of(const VarlenCase& c, int64_t b) const {
    fa4::Problem p = fa4::test::make_problem(1, c.len_q[size_t(b)], keys_of(c, b), c.heads_q, c.heads_kv,
                                             c.head_dim, c.dtype);
    p.causal = c.causal;
    p.window_left = c.left;
    p.window_right = c.right;
    p.softcap = c.softcap;
    p.head_dim_v = c.head_dim_v;
    return p;
  }
};

// Rows [first, first + rows) of a packed tensor's host values (or of its downloaded bits) as a
// contiguous [rows][heads][d] sequence.
std::vector<double> gather(const Packed& t, const std::vector<double>& vals, int64_t first, int64_t rows) {
  std::vector<double> x(size_t(rows * t.heads * t.d));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t h = 0; h < t.heads; ++h)
      for (int64_t e = 0; e < t.d; ++e) x[size_t((r * t.heads + h) * t.d + e)] = vals[size_t(t.at(first + r, h, e))];
  return x;
}
std::vector<double> gather_bits(const Packed& t, const std::vector<uint16_t>& bits, DType dtype, int64_t first,
                                int64_t rows) {
  std::vector<double> vals(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) vals[i] = fa4::ref::bits_to_float(dtype, bits[i]);
  return gather(t, vals, first, rows);
}
std::vector<uint16_t> download(const Packed& t) {
  std::vector<uint16_t> bits(size_t(t.rows * t.hs * t.d));
  EXPECT_EQ(cudaMemcpy(bits.data(), t.buf.ptr, bits.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  return bits;
}
// Elements of t outside its first rows_used rows and its heads that lost their poison.
int64_t written_outside(const Packed& t, const std::vector<uint16_t>& bits, int64_t rows_used) {
  int64_t n = 0;
  for (int64_t r = 0; r < t.rows; ++r)
    for (int64_t h = 0; h < t.hs; ++h)
      for (int64_t x = 0; x < t.d; ++x)
        n += (r >= rows_used || h >= t.heads) && bits[size_t(t.at(r, h, x))] != fa4_test::kPoison;
  return n;
}

// The backward's rule outside every sequence: rows past the last sequence hold 0 (their
// gradient) in every head; head slots past the tensor's heads (a strided view's spare ones) stay
// poisoned. Returns the elements that break it.
int64_t wrong_outside_grad(const Packed& t, const std::vector<uint16_t>& bits, int64_t rows_used) {
  int64_t n = 0;
  for (int64_t r = 0; r < t.rows; ++r)
    for (int64_t h = 0; h < t.hs; ++h)
      for (int64_t x = 0; x < t.d; ++x) {
        const uint16_t b = bits[size_t(t.at(r, h, x))];
        n += h >= t.heads ? b != fa4_test::kPoison : r >= rows_used && b != 0;
      }
  return n;
}

// One sequence's O (`got`, [rows][heads_q][d]) against the float64 reference of it alone with
// DESIGN.md §3's criterion, or all 0 where it has no key; returns the reference's LSE
// ([heads_q][rows], -inf without keys).
std::vector<double> expect_o_of(const fa4::Problem& p, const std::vector<double>& q, const std::vector<double>& k,
                                const std::vector<double>& v, const std::vector<double>& got) {
  if (p.seqlen_k == 0) {  // no key: O = 0, LSE = -inf
    EXPECT_EQ(std::count_if(got.begin(), got.end(), [](double g) { return g != 0.0; }), 0)
        << "a row without keys must be 0";
    return std::vector<double>(size_t(p.heads_q * p.seqlen_q), -INFINITY);
  }
  return fa4::test::expect_forward_matches(p, q, k, v, got).lse;
}

// The forward of `a`: fa4::forward, or the sm90 launch with FwdParams' split, schedule and
// max_ctas where any is set; then waits for it (a hang or a fault ends the process, naming `name`).
void run_forward_with(const ForwardArgs& a, int split, int schedule, int max_ctas, const std::string& name) {
  Status st;
  if (split == 0 && schedule == 0 && max_ctas == 0) {
    st = fa4::forward(a, nullptr);
  } else {
    st = fa4::validate(a);
    ASSERT_TRUE(st.ok()) << st.message;
    fa4::detail::FwdParams fp = fa4::detail::make_fwd_params(a);
    fp.split = split;
    fp.schedule = schedule;
    fp.max_ctas = max_ctas;
    fp.decode = 1;  // (these knobs are the tile kernels')
    st = fa4::detail::sm90_forward(fp, nullptr);
  }
  ASSERT_TRUE(st.ok()) << st.message;
  fa4_test::finish_or_exit(name);
  CUDA_OK(cudaDeviceSynchronize());
}

void run_varlen(const VarlenCase& c, uint32_t seed) {
  SCOPED_TRACE(c.name());
  VarlenRun run;
  ASSERT_NO_FATAL_FAILURE(run.setup(c, seed, false));
  ASSERT_NO_FATAL_FAILURE(run_forward_with(run.args, 0, c.schedule, c.max_ctas, c.name()));

  const std::vector<uint16_t> out_bits = download(run.o);
  const int64_t n_lse = std::max<int64_t>(c.heads_q * run.total_q, 1);
  std::vector<uint32_t> lse_bits(static_cast<size_t>(n_lse));
  CUDA_OK(cudaMemcpy(lse_bits.data(), run.dlse.ptr, lse_bits.size() * 4, cudaMemcpyDeviceToHost));

  // Every O element outside the sequences' rows and heads keeps its poison; so does each LSE row
  // past the last sequence.
  EXPECT_EQ(written_outside(run.o, out_bits, run.cu_q.back()), 0) << "O elements written outside every sequence";
  int64_t lse_written_outside = 0;
  for (int64_t h = 0; h < c.heads_q; ++h)
    for (int64_t r = run.cu_q.back(); r < run.total_q; ++r)
      lse_written_outside += lse_bits[size_t(h * run.total_q + r)] != 0xFFFFFFFFu;
  EXPECT_EQ(lse_written_outside, 0) << "LSE rows written past the last sequence";

  for (int64_t b = 0; b < run.batch; ++b) {
    const int sq = c.len_q[size_t(b)], sk = VarlenRun::keys_of(c, b);
    if (sq == 0 || c.is_nan_seq(b)) continue;
    SCOPED_TRACE("sequence " + std::to_string(b) + " (" + std::to_string(sq) + " x " + std::to_string(sk) + ")");
    const fa4::Problem p = run.problem_of(c, b);
    const int64_t q0 = run.cu_q[size_t(b)], k0 = run.cu_k[size_t(b)] + VarlenRun::first_of(c, b);
    const std::vector<double> sq_q = gather(run.q, run.hq, q0, sq), sk_k = gather(run.k, run.hk, k0, sk),
                              sk_v = gather(run.v, run.hv, k0, sk);
    const std::vector<double> ref_lse =
        expect_o_of(p, sq_q, sk_k, sk_v, gather_bits(run.o, out_bits, c.dtype, q0, sq));
    fa4::test::LseCompare lse_cmp;
    for (int64_t h = 0; h < c.heads_q; ++h)
      for (int64_t r = 0; r < sq; ++r) {
        float g;
        std::memcpy(&g, &lse_bits[size_t(h * run.total_q + q0 + r)], 4);
        lse_cmp.add(ref_lse[size_t(h * sq + r)], g);
      }
    EXPECT_EQ(lse_cmp.mismatch, 0) << "LSE rows -inf in one and finite (or NaN) in the other";
    EXPECT_LE(lse_cmp.max_err, 1e-3);
  }
}

// The backward of a varlen case: forward for O and the LSE, then dQ, dK, dV (poisoned first) of
// each sequence against the float64 backward of that sequence alone (DESIGN.md §3's criterion
// against the plain 16-bit backward); rows outside every sequence keep their poison.
void run_varlen_backward(const VarlenCase& c, uint32_t seed, bool deterministic) {
  SCOPED_TRACE(c.name() + (deterministic ? " deterministic" : ""));
  VarlenRun run;
  ASSERT_NO_FATAL_FAILURE(run.setup(c, seed, true));
  Status st = fa4::forward(run.args, nullptr);
  ASSERT_TRUE(st.ok()) << st.message;

  Packed dq, dk, dv;
  ASSERT_NO_FATAL_FAILURE(dq.make(run.total_q, c.heads_q, c.spare_heads, c.head_dim));
  ASSERT_NO_FATAL_FAILURE(dk.make(run.total_k, c.heads_kv, c.spare_heads, c.head_dim));
  ASSERT_NO_FATAL_FAILURE(dv.make(run.total_k, c.heads_kv, c.spare_heads, c.dv()));
  fa4::BackwardArgs b;
  b.problem = run.args.problem;
  b.q = run.q.ref, b.k = run.k.ref, b.v = run.v.ref, b.o = run.o.ref, b.dout = run.dout.ref;
  b.dq = dq.ref, b.dk = dk.ref, b.dv = dv.ref;
  b.lse = run.args.lse;
  b.deterministic = deterministic;
  b.varlen = run.args.varlen;
  st = fa4::backward_workspace_size(b, &b.workspace_bytes);
  ASSERT_TRUE(st.ok()) << st.message;
  fa4_test::DeviceBuffer ws;
  CUDA_OK(cudaMalloc(&ws.ptr, std::max<size_t>(b.workspace_bytes, 16)));
  // Poisoned (NaN): the backward must clear whatever of the dQ accumulator it adds into.
  CUDA_OK(cudaMemset(ws.ptr, 0xff, std::max<size_t>(b.workspace_bytes, 16)));
  b.workspace = ws.ptr;
  st = fa4::backward(b, nullptr);
  ASSERT_TRUE(st.ok()) << st.message;
  fa4_test::finish_or_exit(c.name());
  CUDA_OK(cudaDeviceSynchronize());

  const std::vector<uint16_t> gq = download(dq), gk = download(dk), gv = download(dv);
  EXPECT_EQ(wrong_outside_grad(dq, gq, run.cu_q.back()), 0) << "dq outside every sequence: not 0, or a spare head written";
  EXPECT_EQ(wrong_outside_grad(dk, gk, run.cu_k.back()), 0) << "dk outside every sequence: not 0, or a spare head written";
  EXPECT_EQ(wrong_outside_grad(dv, gv, run.cu_k.back()), 0) << "dv outside every sequence: not 0, or a spare head written";

  for (int64_t s = 0; s < run.batch; ++s) {
    const int sq = c.len_q[size_t(s)], sk = c.len_k[size_t(s)];
    if ((sq == 0 && sk == 0) || c.is_nan_seq(s)) continue;
    SCOPED_TRACE("sequence " + std::to_string(s) + " (" + std::to_string(sq) + " x " + std::to_string(sk) + ")");
    const fa4::Problem p = run.problem_of(c, s);
    const int64_t q0 = run.cu_q[size_t(s)], k0 = run.cu_k[size_t(s)];
    const std::vector<double> sq_q = gather(run.q, run.hq, q0, sq), sk_k = gather(run.k, run.hk, k0, sk),
                              sk_v = gather(run.v, run.hv, k0, sk), s_do = gather(run.dout, run.hdo, q0, sq);
    const std::vector<double> out_q = gather_bits(dq, gq, c.dtype, q0, sq), out_k = gather_bits(dk, gk, c.dtype, k0, sk),
                              out_v = gather_bits(dv, gv, c.dtype, k0, sk);
    fa4::ref::Backward64 exact, plain;
    if (sq > 0 && sk > 0) {
      exact = fa4::ref::backward(p, sq_q, sk_k, sk_v, s_do);
      plain = fa4::ref::backward_lowp(p, sq_q, sk_k, sk_v, s_do);
    } else {  // one side empty: the other's gradients are 0
      exact.dq.assign(out_q.size(), 0.0), exact.dk.assign(out_k.size(), 0.0), exact.dv.assign(out_v.size(), 0.0);
      plain = exact;
    }
    const struct {
      const char* name;
      const std::vector<double>&out, &ex, &pl;
    } grads[] = {{"dq", out_q, exact.dq, plain.dq}, {"dk", out_k, exact.dk, plain.dk}, {"dv", out_v, exact.dv, plain.dv}};
    for (const auto& g : grads) {
      if (g.out.empty()) continue;
      const fa4::ref::ErrorStats e = fa4::ref::error_stats(g.out, g.ex);
      const fa4::ref::ErrorStats e_plain = fa4::ref::error_stats(g.pl, g.ex);
      EXPECT_FALSE(std::isnan(e.max_abs)) << g.name << ": NaN (an element not written, or the math broke)";
      EXPECT_LE(e.max_abs, 2.0 * e_plain.max_abs + 1e-3) << g.name << ": plain 16-bit max error " << e_plain.max_abs;
      const bool exact_zero = std::all_of(g.ex.begin(), g.ex.end(), [](double x) { return x == 0.0; });
      if (!exact_zero) EXPECT_LE(e.rel_frobenius, 1e-2) << g.name;
    }
  }
}

constexpr auto BF16 = DType::kBF16;
constexpr auto FP16 = DType::kFP16;

TEST(VarlenGpu, EveryHeadDimOddLengthsAndEmptySequences) {
  FA4_REQUIRE_GPU();
  uint32_t seed = 71;
  for (int64_t d : {64, 128, 192, 256})
    for (DType t : {BF16, FP16}) {
      run_varlen({t, 4, 4, d, {17, 239, 0, 1000, 128, 1}, {17, 239, 0, 1000, 128, 1}}, seed++);
      run_varlen({t, 4, 2, d, {1, 300, 64}, {513, 17, 0}}, seed++);  // seqlen_q != seqlen_k both ways, no keys
    }
}

TEST(VarlenGpu, CausalBottomRightPerSequence) {
  FA4_REQUIRE_GPU();
  uint32_t seed = 171;
  for (int64_t d : {64, 128, 192, 256}) {
    VarlenCase c{BF16, 4, 4, d, {239, 1, 513, 64, 300}, {300, 17, 513, 64, 100}};
    c.causal = true;
    run_varlen(c, seed++);
    c.dtype = FP16;
    c.heads_q = 8, c.heads_kv = 2;  // GQA
    c.len_q = {777, 5, 200, 0};
    c.len_k = {777, 5, 1000, 9};
    run_varlen(c, seed++);
  }
}

TEST(VarlenGpu, WindowsGqaMqaAndStridedViews) {
  FA4_REQUIRE_GPU();
  uint32_t seed = 271;
  for (int64_t d : {64, 128, 192, 256}) {
    VarlenCase c{BF16, 8, 1, d, {500, 1000, 33}, {700, 1000, 90}};  // MQA
    c.left = 100;
    c.right = 20;
    run_varlen(c, seed++);
    c.heads_kv = 4;
    c.left = 64;
    c.right = 0;
    c.causal = false;
    c.spare_heads = 1;  // head-padded rows: seq_stride (heads + 1) * d
    run_varlen(c, seed++);
  }
}

TEST(VarlenGpu, LongSequencesAmongShortOnes) {
  FA4_REQUIRE_GPU();
  // d64 at these lengths takes 192-row tiles (three consumers); many tiles past short sequences'
  // ends are passed by.
  run_varlen({BF16, 2, 2, 64, {2000, 190, 3000, 7}, {2000, 190, 3000, 7}}, 401);
  run_varlen({BF16, 2, 1, 128, {4097, 1, 129}, {4097, 2000, 129}}, 402);
}

TEST(VarlenGpu, StaticRoundsAndOneCtaATile) {
  FA4_REQUIRE_GPU();
  // Without the tile counter (schedule 3: static rounds of a few CTAs; schedule 2: a CTA a tile)
  // a CTA passes by its own tiles past a sequence's end.
  uint32_t seed = 501;
  for (int schedule : {2, 3})
    for (bool causal : {false, true}) {
      VarlenCase c{BF16, 3, 3, 128, {400, 5, 0, 260}, {400, 90, 8, 260}};
      c.causal = causal;
      c.schedule = schedule;
      c.max_ctas = schedule == 3 ? 4 : 0;
      run_varlen(c, seed++);
    }
}

}  // namespace

namespace {

TEST(VarlenGpu, BackwardEveryHeadDimAgainstEachSequence) {
  FA4_REQUIRE_GPU();
  uint32_t seed = 601;
  for (int64_t d : {64, 128, 256})
    for (bool deterministic : {false, true}) {
      // odd lengths, an empty sequence, a sequence without keys and one without queries, GQA
      run_varlen_backward({BF16, 4, 2, d, {17, 239, 0, 300, 5, 0}, {40, 239, 9, 0, 130, 0}}, seed++, deterministic);
      VarlenCase c{FP16, 4, 4, d, {200, 1, 333}, {200, 64, 400}};
      c.causal = true;
      run_varlen_backward(c, seed++, deterministic);
    }
}

// The backward's d192 kernels (detail::set_backward_d192, on for this test only) on packed
// sequences: d192 and d160 (padded to 192), odd lengths, empty sequences and sequences without keys
// or queries, causal, MQA with a window and strided views, a soft cap, both dQ paths.
TEST(VarlenGpu, BackwardD192Kernels) {
  FA4_REQUIRE_GPU();
  const fa4::test::BackwardD192 on(true);
  const fa4::test::BackwardV128 v128(true);  // (192 / 128's, on by default)
  uint32_t seed = 9601;
  for (int64_t d : {192, 160})
    for (bool deterministic : {false, true}) {
      run_varlen_backward({BF16, 4, 2, d, {17, 239, 0, 300, 5, 0}, {40, 239, 9, 0, 130, 0}}, seed++, deterministic);
      VarlenCase c{FP16, 4, 4, d, {200, 1, 333}, {200, 64, 400}};
      c.causal = true;
      run_varlen_backward(c, seed++, deterministic);
    }
  VarlenCase w{BF16, 4, 1, 192, {260, 129}, {300, 700}};
  w.left = 50, w.right = 10, w.spare_heads = 1;
  run_varlen_backward(w, seed++, false);
  VarlenCase capped{BF16, 4, 2, 192, {17, 239, 0, 300, 1}, {40, 239, 9, 300, 700}};
  capped.softcap = 7.5f, capped.key_scale = 4.0;
  run_varlen_backward(capped, seed++, false);
  for (bool deterministic : {false, true}) {  // 192 / 128 (BwdConfig's value head dim)
    VarlenCase v{BF16, 4, 2, 192, {17, 239, 0, 300, 5, 0}, {40, 239, 9, 0, 130, 0}};
    v.head_dim_v = 128, v.causal = deterministic;
    run_varlen_backward(v, seed++, deterministic);
  }
}

// The forward's 192 / 128 kernels (detail::set_forward_v128, on for this test only) on packed
// sequences: odd lengths, empty sequences and sequences without keys or queries, causal, MQA with a
// window and strided views, an entry's used keys (the zeroed V tail past them), NaN in other
// sequences' rows; a soft-capped case beside them runs over copies.
TEST(VarlenGpu, ForwardD192V128Kernels) {
  FA4_REQUIRE_GPU();
  const fa4::test::ForwardV128 on(true);
  uint32_t seed = 9651;
  VarlenCase odd{BF16, 4, 2, 192, {17, 239, 0, 300, 5, 0}, {40, 239, 9, 0, 130, 0}};
  VarlenCase causal{FP16, 4, 4, 192, {200, 1, 333}, {200, 64, 400}};
  causal.causal = true;
  VarlenCase w{BF16, 4, 1, 192, {260, 129}, {300, 700}};
  w.left = 50, w.right = 10, w.spare_heads = 1;
  VarlenCase used{BF16, 8, 2, 192, {1, 1, 130}, {700, 333, 300}};
  used.used = {517, 0, 200};
  VarlenCase nan{FP16, 4, 2, 192, {70, 33, 200, 5}, {150, 40, 77, 3}};
  nan.causal = true, nan.nan_seqs = {1}, nan.nan_spare = true;
  VarlenCase rounds{BF16, 4, 2, 192, {1000, 17, 700}, {1000, 1500, 3}};
  rounds.schedule = 3, rounds.max_ctas = 3;
  VarlenCase capped{BF16, 4, 2, 192, {17, 239, 0, 300, 1}, {40, 239, 9, 300, 700}};
  capped.softcap = 7.5f, capped.key_scale = 4.0;
  for (VarlenCase c : {odd, causal, w, used, nan, rounds, capped}) {
    c.head_dim_v = 128;
    run_varlen(c, seed++);
  }
}

TEST(VarlenGpu, BackwardWindowsMqaAndStrided) {
  FA4_REQUIRE_GPU();
  uint32_t seed = 701;
  for (int64_t d : {64, 128, 256}) {
    VarlenCase c{BF16, 4, 1, d, {260, 129}, {300, 700}};
    c.left = 50;
    c.right = 10;
    c.spare_heads = 1;
    run_varlen_backward(c, seed++, false);
  }
}

TEST(VarlenGpu, SoftcapForwardAndBackward) {
  FA4_REQUIRE_GPU();
  // Soft-capped scores on packed sequences, every head dim, keys scaled so that most scores sit in
  // the cap's bend: each sequence against the float64 reference (with the cap, and its slope in the
  // backward) of that sequence alone.
  uint32_t seed = 801;
  for (int64_t d : {64, 128, 192, 256}) {
    VarlenCase c{BF16, 4, 2, d, {17, 239, 0, 300, 1}, {40, 239, 9, 300, 700}};
    c.softcap = 7.5f, c.key_scale = 4.0;
    run_varlen(c, seed++);
    run_varlen_backward(c, seed++, d == 128);
    VarlenCase w{FP16, 4, 1, d, {260, 129}, {300, 700}};  // MQA, a window, strided views
    w.left = 50, w.right = 10, w.spare_heads = 1;
    w.softcap = 2.0f, w.key_scale = 4.0;
    run_varlen(w, seed++);
    run_varlen_backward(w, seed++, d != 128);
  }
  // Gemma 2's cap, 30, which scores of std 2.5 bend little: the slope near 1. (Keys x 6 here, scores
  // of std 6 over few keys, left P nearly one-hot and dS to cancellation: there the plain bf16
  // backward's own relative error is 0.01-0.02, past the criterion's 1e-2, in float64 on the CPU.)
  VarlenCase causal{BF16, 8, 2, 128, {777, 5, 200}, {777, 5, 1000}};
  causal.causal = true, causal.softcap = 30.0f, causal.key_scale = 2.5;
  run_varlen(causal, seed++);
  run_varlen_backward(causal, seed++, false);
}

// Rows past a sequence are the next one's (or spare rows): NaN there, in a sequence of its own or
// in the spare rows, reaches no other sequence's O or gradients. Every head dim, causal and not,
// decoding rows and longer ones, the backward deterministic and not.
TEST(VarlenGpu, NaNInOtherSequencesRowsStaysThere) {
  FA4_REQUIRE_GPU();
  uint32_t seed = 1301;
  for (int64_t d : {64, 128, 192, 256})
    for (bool causal : {false, true}) {
      VarlenCase c{BF16, 8, 2, d, {1, 0, 3, 1}, {300, 77, 129, 65}};
      c.causal = causal;
      c.nan_seqs = {1};
      c.nan_spare = true;
      run_varlen(c, seed++);
      VarlenCase rows{FP16, 4, 4, d, {200, 50, 130}, {333, 64, 700}};
      rows.causal = causal;
      rows.nan_seqs = {1};
      rows.nan_spare = true;
      run_varlen(rows, seed++);
      // The backward: query and key rows run past sequences 0 and 2 into NaN.
      VarlenCase grads{BF16, 4, 2, d, {70, 33, 200, 5}, {150, 40, 77, 3}};
      grads.causal = causal;
      grads.nan_seqs = {1, 3};
      grads.nan_spare = true;
      run_varlen_backward(grads, seed++, causal);
      grads.dtype = FP16;
      run_varlen_backward(grads, seed++, !causal);
    }
}

// seqused_k on packed sequences (a KV cache's filled part of each span), the rest of each span
// NaN: every head dim, causal and not, decoding rows and longer ones, a sequence without keys
// and one whose count is clamped to its span.
TEST(VarlenGpu, SequsedKeysWithNaNPastThem) {
  FA4_REQUIRE_GPU();
  uint32_t seed = 1201;
  for (int64_t d : {64, 128, 192, 256})
    for (bool causal : {false, true}) {
      VarlenCase c{BF16, 8, 2, d, {1, 1, 1, 1}, {700, 333, 129, 64}};
      c.causal = causal;
      c.used = {517, 0, 200, 64};
      run_varlen(c, seed++);
      VarlenCase rows{FP16, 4, 4, d, {130, 7, 300}, {900, 500, 300}};
      rows.causal = causal;
      rows.used = {777, 129, 1};
      run_varlen(rows, seed++);
    }
}

// leftpad_k on packed sequences: each sequence's keys from a row of its span on (the rows before it
// NaN), with seqused_k or to the span's end; every head dim, causal and not, decoding rows and
// longer ones, a pad that swallows every key (clamped to the end: no keys) and a negative one.
TEST(VarlenGpu, LeftPaddedKeysWithNaNBeforeThem) {
  FA4_REQUIRE_GPU();
  uint32_t seed = 1251;
  for (int64_t d : {64, 128, 192, 256})
    for (bool causal : {false, true}) {
      VarlenCase c{BF16, 8, 2, d, {1, 1, 1, 1}, {700, 333, 129, 64}};
      c.causal = causal;
      c.used = {517, 300, 200, 64};
      c.pad = {100, 400, -5, 63};
      run_varlen(c, seed++);
      VarlenCase rows{FP16, 4, 4, d, {130, 7, 300}, {900, 500, 300}};
      rows.causal = causal;
      rows.pad = {129, 1, 0};
      run_varlen(rows, seed++);
    }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Batched tensors whose entries have keys of their own (Varlen::seqused_k without cu_seqlens: a KV
// cache's filled part). Each entry's O and LSE against the float64 reference of that entry with its
// first used[b] keys alone; O and the LSE poisoned first, so every row must be written, and the
// keys past used[b] NaN (a cache's unfilled rows), so none of them may reach O.

namespace {

struct EntryKeysCase {
  DType dtype;
  int64_t heads_q, heads_kv, head_dim, seqlen_q, seqlen_k;
  std::vector<int> used;  // per entry, as the caller passes them (clamped to [0, seqlen_k])
  bool causal = false;
  int64_t left = -1, right = -1;
  float softcap = 0.0f;
  int split = 0, schedule = 0, max_ctas = 0;  // FwdParams' through the sm90 launch where set
  // A paged cache (fa4::PagedKV) where > 0: the entries' keys on pages of this many rows, placed
  // at shuffled page ids of a pool with NaN pages between them; each table row with spare columns
  // that name a NaN page; used empty: no seqused_k (every entry seqlen_k keys).
  int64_t page = 0;
  int64_t spare = 2;  // (paged) the table rows' spare columns
  // (paged) Packed queries where not empty (fa4::Varlen's cu_seqlens_q: vLLM's prefill and mixed
  // batches): entry b's len_q[b] rows (seqlen_q their longest); with cu_k each entry's key count
  // also as cu_seqlens_k (its offsets, which the kernels do not read, those of the batched rows).
  std::vector<int> len_q;
  std::vector<int> cu_k;
  // Varlen::leftpad_k where not empty (unpaged): entry b's keys from row pad[b] (clamped to [0, its
  // end]) to its end; the rows before them NaN.
  std::vector<int> pad;

  std::string name() const {
    std::string s = std::string(fa4::to_string(dtype)) + " h" + std::to_string(heads_q) + "/" +
                    std::to_string(heads_kv) + " d" + std::to_string(head_dim) + " " + std::to_string(seqlen_q) +
                    " x " + std::to_string(seqlen_k) + (causal ? " causal" : "") + " win(" + std::to_string(left) +
                    "," + std::to_string(right) + ") used{";
    for (int x : used) s += std::to_string(x) + ",";
    s += "}";
    if (softcap > 0) s += " softcap " + std::to_string(softcap);
    if (split || schedule || max_ctas)
      s += " split " + std::to_string(split) + " schedule " + std::to_string(schedule) + " ctas " +
           std::to_string(max_ctas);
    if (page > 0) s += " pages of " + std::to_string(page) + " spare " + std::to_string(spare);
    if (!len_q.empty()) {
      s += " packed q{";
      for (int x : len_q) s += std::to_string(x) + ",";
      s += "} cu_k{";
      for (int x : cu_k) s += std::to_string(x) + ",";
      s += "}";
    }
    if (!pad.empty()) {
      s += " pad{";
      for (int x : pad) s += std::to_string(x) + ",";
      s += "}";
    }
    return s;
  }
};

// The paged form of batched k and v ([batch * sk] rows, entry b's from row b * sk): pools of
// pages of c.page rows, every row NaN first, entry b's page j copied to a shuffled id; table rows
// of `stride` columns (c.spare past an entry's pages), those naming NaN pages.
struct PagedPools {
  Packed k, v;
  fa4_test::DeviceBuffer table;
  int64_t num_pages = 0, stride = 0;
  void make(const EntryKeysCase& c, const Packed& kk, const Packed& vv, int64_t batch, std::mt19937& rng) {
    const int64_t sk = c.seqlen_k, pages = (sk + c.page - 1) / c.page;
    stride = pages + c.spare;
    num_pages = 2 * batch * pages + 3;  // half of them never named but by the spare columns
    for (Packed* t : {&k, &v}) ASSERT_NO_FATAL_FAILURE(t->make(num_pages * c.page, kk.heads, kk.hs - kk.heads, kk.d));
    std::vector<int32_t> ids(static_cast<size_t>(num_pages));
    for (int64_t i = 0; i < num_pages; ++i) ids[size_t(i)] = int32_t(i);
    std::shuffle(ids.begin(), ids.end(), rng);
    std::vector<int32_t> rows(static_cast<size_t>(batch * stride));
    size_t next = 0;
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t j = 0; j < stride; ++j) {
        const int32_t id = ids[next++];
        rows[size_t(b * stride + j)] = id;
        if (j >= pages) continue;  // a spare column: its page stays NaN
        const int64_t n = std::min(c.page, sk - j * c.page), row_elems = kk.hs * kk.d;
        for (auto [dst, src] : {std::pair{&k, &kk}, std::pair{&v, &vv}})
          CUDA_OK(cudaMemcpy(static_cast<uint16_t*>(dst->buf.ptr) + id * c.page * row_elems,
                             static_cast<const uint16_t*>(src->buf.ptr) + (b * sk + j * c.page) * row_elems,
                             size_t(n * row_elems) * 2, cudaMemcpyDeviceToDevice));
      }
    CUDA_OK(cudaMalloc(&table.ptr, rows.size() * 4));
    CUDA_OK(cudaMemcpy(table.ptr, rows.data(), rows.size() * 4, cudaMemcpyHostToDevice));
  }
};

void run_entry_keys(const EntryKeysCase& c, uint32_t seed) {
  SCOPED_TRACE(c.name());
  const bool packed = !c.len_q.empty();
  const int64_t batch = packed             ? int64_t(c.len_q.size())
                        : !c.used.empty()  ? int64_t(c.used.size())
                        : !c.pad.empty()   ? int64_t(c.pad.size())
                        : c.page > 0       ? 3
                                           : 0;
  ASSERT_GT(batch, 0) << "a case needs entries: used, pad, len_q or pages";
  const int64_t sq = c.seqlen_q, sk = c.seqlen_k, d = c.head_dim;
  // Where each entry's keys end: used[b] clamped, or seqlen_k without used; at most cu_k[b] with
  // cu_k. Where they start: pad[b] clamped to [0, end] (0 without pad). Their count.
  auto end_of = [&](int64_t b) {
    int n = c.used.empty() ? int(sk) : std::clamp<int>(c.used[size_t(b)], 0, int(sk));
    return c.cu_k.empty() ? n : std::min(n, std::clamp<int>(c.cu_k[size_t(b)], 0, int(sk)));
  };
  auto first_key = [&](int64_t b) { return c.pad.empty() ? 0 : std::clamp<int>(c.pad[size_t(b)], 0, end_of(b)); };
  auto keys_of = [&](int64_t b) { return end_of(b) - first_key(b); };
  // Each entry's query rows and its first in q and o: batched, sq from row b * sq; packed, len_q[b]
  // from cu_seqlens_q[b].
  const std::vector<int32_t> cu_q = packed ? prefix(c.len_q) : std::vector<int32_t>{};
  auto rows_of = [&](int64_t b) { return packed ? int64_t(c.len_q[size_t(b)]) : sq; };
  auto first_of = [&](int64_t b) { return packed ? int64_t(cu_q[size_t(b)]) : b * sq; };
  const int64_t total_q = packed ? int64_t(cu_q.back()) : batch * sq;
  Packed q, k, v, o;  // [batch * seq] rows: entry b's from row b * seq (packed q and o: first_of)
  ASSERT_NO_FATAL_FAILURE(q.make(total_q, c.heads_q, 0, d));
  ASSERT_NO_FATAL_FAILURE(k.make(batch * sk, c.heads_kv, 0, d));
  ASSERT_NO_FATAL_FAILURE(v.make(batch * sk, c.heads_kv, 0, d));
  ASSERT_NO_FATAL_FAILURE(o.make(total_q, c.heads_q, 0, d));
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<double> hq, hk, hv;
  auto fill = [&](const Packed& t, std::vector<double>& vals) {
    vals.assign(size_t(t.rows * t.hs * t.d), 0.0);
    for (double& x : vals) x = fa4::ref::round_to(c.dtype, float(normal(rng)));
    const std::vector<uint16_t> bits = fa4::ref::to_bits(c.dtype, vals);
    CUDA_OK(cudaMemcpy(t.buf.ptr, bits.data(), bits.size() * 2, cudaMemcpyHostToDevice));
  };
  ASSERT_NO_FATAL_FAILURE(fill(q, hq));
  ASSERT_NO_FATAL_FAILURE(fill(k, hk));
  ASSERT_NO_FATAL_FAILURE(fill(v, hv));
  // Rows past each entry's keys hold NaN, as a cache's never-written part may, and so do the rows
  // before them (a left pad): none may reach O.
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t end = end_of(b), first = first_key(b);
    for (const Packed* t : {&k, &v}) t->nan_rows(b * sk + end, sk - end), t->nan_rows(b * sk, first);
  }
  PagedPools pools;
  if (c.page > 0) ASSERT_NO_FATAL_FAILURE(pools.make(c, k, v, batch, rng));
  fa4_test::DeviceBuffer dused, dlse, dcu_q, dcu_k, dpad;
  if (!c.used.empty()) {
    CUDA_OK(cudaMalloc(&dused.ptr, c.used.size() * 4));
    CUDA_OK(cudaMemcpy(dused.ptr, c.used.data(), c.used.size() * 4, cudaMemcpyHostToDevice));
  }
  auto upload = [](fa4_test::DeviceBuffer& buf, const std::vector<int32_t>& vals) {
    CUDA_OK(cudaMalloc(&buf.ptr, vals.size() * 4));
    CUDA_OK(cudaMemcpy(buf.ptr, vals.data(), vals.size() * 4, cudaMemcpyHostToDevice));
  };
  if (packed) ASSERT_NO_FATAL_FAILURE(upload(dcu_q, cu_q));
  if (!c.pad.empty()) ASSERT_NO_FATAL_FAILURE(upload(dpad, std::vector<int32_t>(c.pad.begin(), c.pad.end())));
  if (!c.cu_k.empty()) ASSERT_NO_FATAL_FAILURE(upload(dcu_k, prefix(c.cu_k)));  // entry b's count: a difference
  const int64_t n_lse = c.heads_q * total_q;
  CUDA_OK(cudaMalloc(&dlse.ptr, n_lse * 4));
  CUDA_OK(cudaMemset(dlse.ptr, 0xFF, n_lse * 4));

  ForwardArgs a;
  a.problem = fa4::test::make_problem(batch, sq, sk, c.heads_q, c.heads_kv, d, c.dtype);
  a.problem.causal = c.causal;
  a.problem.window_left = c.left;
  a.problem.window_right = c.right;
  a.problem.softcap = c.softcap;
  auto batched = [](const Packed& t, int64_t seq) { return fa4::TensorRef{t.buf.ptr, seq * t.hs * t.d, t.hs * t.d, t.d}; };
  a.q = batched(q, sq), a.k = batched(k, sk), a.v = batched(v, sk), a.o = batched(o, sq);
  a.lse = static_cast<float*>(dlse.ptr);
  a.varlen.seqused_k = static_cast<const int32_t*>(dused.ptr);
  a.varlen.leftpad_k = static_cast<const int32_t*>(dpad.ptr);
  if (packed) {  // q and o as packed rows (batch_stride not read), the LSE [heads_q, total_q]
    a.q = q.ref, a.o = o.ref;
    a.varlen.cu_seqlens_q = static_cast<const int32_t*>(dcu_q.ptr);
    a.varlen.cu_seqlens_k = static_cast<const int32_t*>(dcu_k.ptr);
    a.varlen.total_q = total_q;
  }
  if (c.page > 0) {
    a.k = batched(pools.k, c.page), a.v = batched(pools.v, c.page);
    a.paged = {static_cast<const int32_t*>(pools.table.ptr), pools.stride, c.page, pools.num_pages};
  }
  const Status st = fa4::validate(a);
  ASSERT_TRUE(st.ok()) << st.message;
  ASSERT_NO_FATAL_FAILURE(run_forward_with(a, c.split, c.schedule, c.max_ctas, c.name()));

  const std::vector<uint16_t> out_bits = download(o);
  std::vector<float> lse(static_cast<size_t>(n_lse));
  CUDA_OK(cudaMemcpy(lse.data(), dlse.ptr, lse.size() * 4, cudaMemcpyDeviceToHost));
  for (int64_t b = 0; b < batch; ++b) {
    const int len = keys_of(b);
    SCOPED_TRACE("entry " + std::to_string(b) + " (" + std::to_string(len) + " keys)");
    fa4::Problem p = a.problem;
    p.batch = 1;
    p.seqlen_q = rows_of(b);
    p.seqlen_k = len;
    const int64_t rows = rows_of(b), first = first_of(b);
    const std::vector<double> ref_lse =
        expect_o_of(p, gather(q, hq, first, rows), gather(k, hk, b * sk + first_key(b), len),
                    gather(v, hv, b * sk + first_key(b), len), gather_bits(o, out_bits, c.dtype, first, rows));
    fa4::test::LseCompare lse_cmp;
    for (int64_t h = 0; h < c.heads_q; ++h)
      for (int64_t r = 0; r < rows; ++r)
        lse_cmp.add(ref_lse[size_t(h * rows + r)],
                    lse[size_t(packed ? h * total_q + first + r : (b * c.heads_q + h) * sq + r)]);
    EXPECT_EQ(lse_cmp.mismatch, 0) << "LSE rows -inf in one and finite (or NaN) in the other";
    EXPECT_LE(lse_cmp.max_err, 1e-3);
  }
}

// Decoding (one query a head): query groups folded into rows, causal and not, every head dim; the
// entries' keys cut into stream-K pieces along the longest (the default: 5 x 2 tiles), whole
// tiles (split 1), and pieces of many tiles over 3 CTAs. Lengths clamp: -3 to 0, 5000 to seqlen_k.
TEST(EntryKeysGpu, DecodingEveryHeadDimPiecesAndWholeTiles) {
  FA4_REQUIRE_GPU();
  uint32_t seed = 901;
  for (int64_t d : {64, 128, 192, 256})
    for (bool causal : {false, true}) {
      EntryKeysCase c{BF16, 8, 2, d, 1, 1000, {1000, 1, 0, 517, 999}};
      c.causal = causal;
      run_entry_keys(c, seed++);
      c.used = {-3, 5000, 129, 64, 65};
      c.split = 1;
      run_entry_keys(c, seed++);
      c.dtype = FP16;
      c.split = 2, c.max_ctas = 3;
      run_entry_keys(c, seed++);
    }
}

// A few query rows a head: their group folded (4 x 4 rows) or not (MHA); causal rows that see none
// of a short entry's keys (LSE -inf); longer rows (two query blocks and more) on whole tiles.
TEST(EntryKeysGpu, FewRowsLongRowsAndCausalRowsWithoutKeys) {
  FA4_REQUIRE_GPU();
  uint32_t seed = 951;
  for (int64_t d : {64, 128, 192, 256}) {
    EntryKeysCase c{BF16, 8, 2, d, 4, 777, {300, 2, 777, 0, 45}};
    c.causal = true;
    run_entry_keys(c, seed++);
    EntryKeysCase mha{FP16, 4, 4, d, 1, 640, {640, 17, 300}};
    run_entry_keys(mha, seed++);
    EntryKeysCase tall{BF16, 4, 1, d, 200, 900, {900, 150, 1, 613}};
    tall.causal = true;
    run_entry_keys(tall, seed++);
    tall.causal = false;
    run_entry_keys(tall, seed++);
  }
}

// Entries whose keys start past a left pad (Varlen::leftpad_k; flash-attn's cache_leftpad), the rows
// before them NaN: decoding (the decoding kernel where the launch takes it, the tile kernels'
// pieces and whole tiles), a few rows causal, longer rows, a window; with seqused_k and without;
// pads clamped (negative, past the end); every head dim.
TEST(EntryKeysGpu, LeftPaddedDecodingFewRowsLongRows) {
  FA4_REQUIRE_GPU();
  uint32_t seed = 1701;
  for (int64_t d : {64, 128, 192, 256})
    for (bool causal : {false, true}) {
      EntryKeysCase c{BF16, 8, 2, d, 1, 1000, {1000, 700, 0, 517, 999}};
      c.causal = causal;
      c.pad = {3, 650, 0, 517, -2};
      run_entry_keys(c, seed++);  // (the decoding kernel for d64 and d128)
      c.split = 1;
      run_entry_keys(c, seed++);
      c.dtype = FP16, c.split = 2, c.max_ctas = 3;
      c.used = {};  // to seqlen_k
      c.pad = {1, 999, 1500, 128, 257};
      run_entry_keys(c, seed++);
      EntryKeysCase few{BF16, 8, 2, d, 4, 777, {300, 20, 777, 0, 45}, causal};
      few.pad = {17, 19, 700, 0, 5};
      run_entry_keys(few, seed++);
      EntryKeysCase tall{FP16, 4, 1, d, 200, 900, {900, 150, 700, 613}, causal};
      tall.pad = {100, 0, 699, 13};
      run_entry_keys(tall, seed++);
    }
  EntryKeysCase w{BF16, 8, 2, 128, 16, 1000, {1000, 333, 0, 700}};
  w.left = 64, w.right = 8, w.pad = {900, 30, 0, 1};
  run_entry_keys(w, seed++);
}

// A paged cache (fa4::PagedKV): the same checks with the keys on shuffled pages of a pool whose
// other pages and spare table columns are NaN. Decoding (folded groups, pieces and whole tiles),
// a few rows causal, longer rows (whole tiles), pages of 128 to 1024 rows, seqused_k or none, a
// window and the soft cap; every head dim.
TEST(PagedGpu, DecodingFewRowsLongRowsEveryHeadDim) {
  FA4_REQUIRE_GPU();
  uint32_t seed = 1401;
  for (int64_t d : {64, 128, 192, 256})
    for (int64_t page : {128, 256}) {
      EntryKeysCase c{BF16, 8, 2, d, 1, 1000, {1000, 1, 0, 517, 999}};
      c.page = page;
      run_entry_keys(c, seed++);
      c.causal = true, c.split = 1;
      run_entry_keys(c, seed++);
      c.dtype = FP16, c.causal = false;
      c.split = 2, c.max_ctas = 3;
      run_entry_keys(c, seed++);
      EntryKeysCase few{BF16, 8, 2, d, 4, 777, {300, 2, 777, 0, 45}};
      few.causal = true, few.page = page;
      run_entry_keys(few, seed++);
      EntryKeysCase tall{FP16, 4, 1, d, 200, 900, {900, 150, 1, 613}};
      tall.causal = page == 128, tall.page = page;
      run_entry_keys(tall, seed++);
      EntryKeysCase all{BF16, 4, 4, d, 33, 640, {}};  // no seqused_k: every entry's 640 keys
      all.page = page * 4;
      run_entry_keys(all, seed++);
      EntryKeysCase w{BF16, 8, 2, d, 16, 1000, {1000, 333, 0, 70}};
      w.left = 64, w.right = 8, w.page = page, w.softcap = page == 256 ? 30.0f : 0.0f;
      run_entry_keys(w, seed++);
    }
}

// Pages smaller than a key block (vLLM's 16 rows; fa4::PagedKV): a block on whole pages, a box a
// page. Lengths whose last block runs past seqlen_k's pages (1000 keys: the table's columns past
// ceil(1000 / page) are not read, nor past table_stride for the last entry); decoding in pieces
// and whole tiles, a few causal rows, longer rows, no seqused_k, a window with the soft cap.
TEST(PagedGpu, PagesSmallerThanAKeyBlock) {
  FA4_REQUIRE_GPU();
  uint32_t seed = 1501;
  for (int64_t d : {64, 128, 192, 256})
    for (int64_t page : {16, 32, 64}) {
      EntryKeysCase c{BF16, 8, 2, d, 1, 1000, {1000, 1, 0, 517, 999}};
      c.page = page;
      run_entry_keys(c, seed++);
      c.dtype = FP16, c.causal = true;
      c.split = 1;
      run_entry_keys(c, seed++);
      EntryKeysCase few{BF16, 8, 2, d, 4, 777, {300, 2, 777, 0, 45}};
      few.causal = true, few.page = page;
      few.split = 2, few.max_ctas = 3;
      run_entry_keys(few, seed++);
      EntryKeysCase tall{FP16, 4, 1, d, 200, 900, {900, 150, 1, 613}};
      tall.causal = page == 32, tall.page = page;
      run_entry_keys(tall, seed++);
      // No seqused_k (every entry's 200 keys) and no spare columns: the last block's pages past
      // 200 keys would lie past the last entry's table row (memcheck).
      EntryKeysCase all{BF16, 4, 4, d, 33, 200, {}};
      all.page = page, all.spare = 0;
      run_entry_keys(all, seed++);
      EntryKeysCase w{BF16, 8, 2, d, 16, 1000, {1000, 333, 0, 70}};
      w.left = 64, w.right = 8, w.page = page, w.softcap = page == 32 ? 30.0f : 0.0f;
      run_entry_keys(w, seed++);
    }
}

// A paged cache with packed queries (cu_seqlens_q; vLLM's prefill and mixed batches): sequences of
// 1 to 300 query rows over their own key counts (seqused_k, cu_seqlens_k's differences, or both),
// causal (bottom-right) and not, a window, the soft cap, pages of 16 to 256 rows; every head dim.
TEST(PagedGpu, PackedQueriesEveryHeadDim) {
  FA4_REQUIRE_GPU();
  uint32_t seed = 1601;
  for (int64_t d : {64, 128, 192, 256})
    for (int64_t page : {16, 64, 256}) {
      EntryKeysCase c{BF16, 8, 2, d, 300, 1000, {1000, 517, 0, 999, 40}};
      c.page = page, c.len_q = {1, 300, 7, 129, 40};
      c.causal = true;
      run_entry_keys(c, seed++);
      c.causal = false, c.dtype = FP16;
      c.used = {}, c.cu_k = {1000, 1, 640, 333, 5};  // counts from cu_seqlens_k alone
      run_entry_keys(c, seed++);
      c.used = {900, 1000, 0, 64, 2000}, c.cu_k = {1000, 17, 640, 333, 5};  // both: the smaller
      c.left = 100, c.right = 0, c.softcap = page == 64 ? 30.0f : 0.0f;
      run_entry_keys(c, seed++);
    }
}

// Head dims without a kernel of their own (common/pad.h) on packed sequences and KV caches: the
// copies of total rows (o copied in and back, so rows outside every sequence keep their poison, as
// run_varlen checks), NaN in other sequences' and spare rows, strided views, the backward with
// its zeroed rows; batched entries with keys of their own and a left pad; a paged cache's pools,
// decoding and packed queries.
TEST(VarlenGpu, PaddedHeadDims) {
  FA4_REQUIRE_GPU();
  uint32_t seed = 1701;
  for (int64_t d : {40, 96, 160, 192}) {  // (192: the forward on its own kernels, the backward padded)
    VarlenCase c{BF16, 4, 2, d, {17, 239, 0, 300, 5}, {40, 239, 9, 300, 130}};
    c.causal = d != 96;
    c.spare_heads = 1;
    run_varlen(c, seed++);
    run_varlen_backward(c, seed++, d == 96);
    VarlenCase nan{FP16, 4, 2, d, {70, 33, 200, 5}, {150, 40, 77, 3}};
    nan.causal = true, nan.nan_seqs = {1}, nan.nan_spare = true;
    run_varlen(nan, seed++);
    run_varlen_backward(nan, seed++, false);
    VarlenCase used{BF16, 8, 2, d, {1, 1, 130}, {700, 333, 300}};
    used.used = {517, 0, 200};
    run_varlen(used, seed++);
    EntryKeysCase entries{BF16, 8, 2, d, 1, 1000, {1000, 1, 0, 517, 999}};
    run_entry_keys(entries, seed++);
    EntryKeysCase padded{FP16, 8, 2, d, 4, 777, {300, 20, 777, 0, 45}, true};
    padded.pad = {17, 19, 700, 0, 5};
    run_entry_keys(padded, seed++);
    for (int64_t page : {16, 256}) {
      EntryKeysCase paged{BF16, 8, 2, d, 1, 1000, {1000, 1, 0, 517, 999}};
      paged.page = page;
      run_entry_keys(paged, seed++);
      EntryKeysCase packed{FP16, 8, 2, d, 300, 1000, {1000, 517, 0, 999, 40}};
      packed.page = page, packed.len_q = {1, 300, 7, 129, 40};
      packed.causal = true;
      run_entry_keys(packed, seed++);
    }
  }
}

// Windows (whole tiles: an entry's range may start off the pieces' grid), and the soft cap.
TEST(EntryKeysGpu, WindowsAndSoftcap) {
  FA4_REQUIRE_GPU();
  uint32_t seed = 981;
  for (int64_t d : {64, 128, 192, 256}) {
    EntryKeysCase w{BF16, 8, 2, d, 1, 1000, {1000, 333, 0, 70}};
    w.left = 100, w.right = 0;
    run_entry_keys(w, seed++);
    w.seqlen_q = 16;
    w.left = 64, w.right = 8;
    run_entry_keys(w, seed++);
    EntryKeysCase cap{FP16, 8, 2, d, 1, 800, {800, 1, 411}};
    cap.softcap = 30.0f;
    cap.causal = true;
    run_entry_keys(cap, seed++);
  }
}

}  // namespace
