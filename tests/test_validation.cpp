// What validate() promises: every rule of DESIGN.md §4 refuses arguments that break it, with a
// message naming the argument and its value. Each test starts from arguments that pass, breaks one
// thing, and checks the refusal, so removing a check makes its test fail. No GPU needed: validate
// never dereferences a pointer, so the tensors here are fake, aligned addresses.
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/validate.h"
#include "fa4/attention.h"
#include "test_support.h"

namespace {

using fa4::BackwardArgs;
using fa4::DType;
using fa4::ForwardArgs;
using fa4::Problem;
using fa4::Status;
using fa4::StatusCode;
using fa4::TensorRef;

constexpr int64_t kB = 2, kSq = 256, kSk = 384, kHq = 8, kHkv = 2, kD = 128;

using fa4::test::fake;

void* offset_bytes(void* p, int bytes) { return static_cast<char*>(p) + bytes; }

Problem valid_problem() { return fa4::test::make_problem(kB, kSq, kSk, kHq, kHkv, kD, DType::kBF16); }

ForwardArgs valid_forward() {
  ForwardArgs a;
  a.problem = valid_problem();
  a.q = fa4::bshd(fake(0), kSq, kHq, kD);
  a.k = fa4::bshd(fake(1), kSk, kHkv, kD);
  a.v = fa4::bshd(fake(2), kSk, kHkv, kD);
  a.o = fa4::bshd(fake(3), kSq, kHq, kD);
  a.lse = static_cast<float*>(fake(4));
  return a;
}

BackwardArgs valid_backward() {
  BackwardArgs a;
  a.problem = valid_problem();
  a.q = fa4::bshd(fake(0), kSq, kHq, kD);
  a.k = fa4::bshd(fake(1), kSk, kHkv, kD);
  a.v = fa4::bshd(fake(2), kSk, kHkv, kD);
  a.o = fa4::bshd(fake(3), kSq, kHq, kD);
  a.dout = fa4::bshd(fake(5), kSq, kHq, kD);
  a.dq = fa4::bshd(fake(6), kSq, kHq, kD);
  a.dk = fa4::bshd(fake(7), kSk, kHkv, kD);
  a.dv = fa4::bshd(fake(8), kSk, kHkv, kD);
  a.lse = static_cast<const float*>(fake(4));
  a.workspace = fake(9);
  EXPECT_TRUE(fa4::backward_workspace_size(a, &a.workspace_bytes).ok());
  return a;
}

// kInvalidArgument, and a message holding every one of `needles`.
::testing::AssertionResult Refused(const Status& s, const std::vector<std::string>& needles) {
  if (s.code != StatusCode::kInvalidArgument)
    return ::testing::AssertionFailure()
           << "code " << fa4::to_string(s.code) << " (message \"" << s.message
           << "\"), expected invalid argument";
  for (const std::string& n : needles)
    if (s.message.find(n) == std::string::npos)
      return ::testing::AssertionFailure()
             << "message \"" << s.message << "\" lacks \"" << n << "\"";
  return ::testing::AssertionSuccess() << s.message;
}

// Breaks `problem` one way and expects both validate() overloads to refuse it.
void expect_problem_refused(const std::function<void(Problem&)>& breaker,
                            const std::vector<std::string>& needles) {
  ForwardArgs f = valid_forward();
  breaker(f.problem);
  EXPECT_TRUE(Refused(fa4::validate(f), needles)) << "forward";
  BackwardArgs b = valid_backward();
  breaker(b.problem);
  EXPECT_TRUE(Refused(fa4::validate(b), needles)) << "backward";
}

// ---------------------------------------------------------------------------------------------
// The baselines pass: otherwise every refusal below would prove nothing.

TEST(Validation, BaselinesPass) {
  const Status f = fa4::validate(valid_forward());
  EXPECT_TRUE(f.ok()) << f.message;
  const Status b = fa4::validate(valid_backward());
  EXPECT_TRUE(b.ok()) << b.message;
}

TEST(Validation, EveryHeadDimOfWholeSixteenByteUnitsAndDTypePasses) {
  for (DType t : {DType::kBF16, DType::kFP16, DType::kE4M3}) {
    const int step = t == DType::kE4M3 ? 16 : 8;
    for (int d = step; d <= fa4::kMaxHeadDim; d += step) {
      ForwardArgs a = valid_forward();
      a.problem.dtype = t;
      a.problem.head_dim = d;
      a.q = fa4::bshd(fake(0), kSq, kHq, d);
      a.k = fa4::bshd(fake(1), kSk, kHkv, d);
      a.v = fa4::bshd(fake(2), kSk, kHkv, d);
      a.o = fa4::bshd(fake(3), kSq, kHq, d);
      const Status s = fa4::validate(a);
      EXPECT_TRUE(s.ok()) << fa4::to_string(t) << " d" << d << ": " << s.message;
    }
  }
}

TEST(Validation, OtherValidShapesPass) {
  ForwardArgs a = valid_forward();
  a.problem.heads_kv = 1;  // MQA
  a.k = fa4::bshd(fake(1), kSk, 1, kD);
  a.v = fa4::bshd(fake(2), kSk, 1, kD);
  a.problem.causal = true;
  a.problem.window_left = 0;
  a.problem.window_right = 0;
  a.problem.softmax_scale = 0.125f;
  a.lse = nullptr;  // optional in forward
  Status s = fa4::validate(a);
  EXPECT_TRUE(s.ok()) << s.message;

  a = valid_forward();  // BHSD is just other strides
  a.q = fa4::bhsd(fake(0), kSq, kHq, kD);
  a.o = fa4::bhsd(fake(3), kSq, kHq, kD);
  a.k.batch_stride = 0;  // the same K/V for every batch
  a.v.batch_stride = 0;
  s = fa4::validate(a);
  EXPECT_TRUE(s.ok()) << s.message;
}

// ---------------------------------------------------------------------------------------------
// Problem rules.

TEST(Validation, DTypeOutOfRange) {
  expect_problem_refused([](Problem& p) { p.dtype = static_cast<DType>(7); },
                         {"dtype = 7", "0 (bf16)", "1 (fp16)"});
  expect_problem_refused([](Problem& p) { p.dtype = static_cast<DType>(-1); }, {"dtype = -1"});
}

TEST(Validation, HeadDimOutsideTheRuleSaysTheRule) {
  const std::string kernels = "64, 128, 256 run kernels of their own (the 16-bit forward also 192)";
  expect_problem_refused([](Problem& p) { p.head_dim = 100; },
                         {"head_dim = 100: must be a multiple of 8 in [8, 256] for bf16", "16-byte units", kernels});
  expect_problem_refused([](Problem& p) { p.head_dim = 264; }, {"head_dim = 264", "[8, 256]"});
  expect_problem_refused([](Problem& p) { p.head_dim = 4; }, {"head_dim = 4", "[8, 256]"});
  expect_problem_refused([](Problem& p) { p.head_dim = 0; }, {"head_dim = 0", kernels});
  expect_problem_refused([](Problem& p) { p.head_dim = -128; }, {"head_dim = -128", kernels});
  expect_problem_refused([](Problem& p) { p.head_dim = 128 + (int64_t{1} << 32); }, {"head_dim = 4294967424"});
  // e4m3's rows of whole 16-byte units: multiples of 16.
  expect_problem_refused([](Problem& p) { p.dtype = DType::kE4M3; p.head_dim = 72; },
                         {"head_dim = 72: must be a multiple of 16 in [16, 256] for e4m3"});
}

TEST(Validation, HeadDimVTakesTheSameRuleAndSizesTheValueSide) {
  expect_problem_refused([](Problem& p) { p.head_dim_v = 100; },
                         {"head_dim_v = 100: must be a multiple of 8 in [8, 256] for bf16, or 0 for head_dim's"});
  expect_problem_refused([](Problem& p) { p.head_dim_v = -8; }, {"head_dim_v = -8"});
  expect_problem_refused([](Problem& p) { p.head_dim_v = 512; }, {"head_dim_v = 512"});
  // v and o (and dout, dv) of head_dim_v columns, q and k (dq, dk) of head_dim: DeepSeek's 192 / 128.
  ForwardArgs a = valid_forward();
  a.problem.head_dim = 192, a.problem.head_dim_v = 128;
  a.q = fa4::bshd(fake(0), kSq, kHq, 192);
  a.k = fa4::bshd(fake(1), kSk, kHkv, 192);
  a.v = fa4::bshd(fake(2), kSk, kHkv, 128);
  a.o = fa4::bshd(fake(3), kSq, kHq, 128);
  Status s = fa4::validate(a);
  EXPECT_TRUE(s.ok()) << s.message;
  // The messages name the value side's head dim.
  ForwardArgs no_v = a;
  no_v.v.data = nullptr;
  EXPECT_TRUE(Refused(fa4::validate(no_v), {"v.data = null", "[batch, seqlen_k, heads_kv, head_dim_v]"}));
  ForwardArgs no_k = a;
  no_k.k.data = nullptr;
  EXPECT_TRUE(Refused(fa4::validate(no_k), {"k.data = null", "[batch, seqlen_k, heads_kv, head_dim]"}));
  BackwardArgs b = valid_backward();
  b.problem = a.problem;
  b.q = b.dq = a.q;
  b.k = b.dk = a.k;
  b.v = b.dv = a.v;
  b.o = b.dout = a.o;
  ASSERT_TRUE(fa4::backward_workspace_size(b, &b.workspace_bytes).ok());
  s = fa4::validate(b);
  EXPECT_TRUE(s.ok()) << s.message;
  b.dout.data = nullptr;
  EXPECT_TRUE(Refused(fa4::validate(b), {"dout.data = null", "heads_q, head_dim_v]"}));
  b.dout = a.o;
  b.dv.data = nullptr;
  EXPECT_TRUE(Refused(fa4::validate(b), {"dv.data = null", "heads_kv, head_dim_v]"}));

  // Packed sequences and a paged cache check the value side at head_dim_v too.
  ForwardArgs packed = a;
  packed.varlen = {static_cast<const int32_t*>(fake(10)), static_cast<const int32_t*>(fake(11)), 500, 700};
  packed.q.batch_stride = packed.k.batch_stride = packed.v.batch_stride = packed.o.batch_stride = 0;
  s = fa4::validate(packed);
  EXPECT_TRUE(s.ok()) << s.message;
  packed.o.data = nullptr;
  EXPECT_TRUE(Refused(fa4::validate(packed), {"o.data = null", "[batch, varlen.total_q, heads_q, head_dim_v]"}));
  ForwardArgs paged = a;
  paged.paged = {static_cast<const int32_t*>(fake(12)), 24, 16, 100};
  paged.k = fa4::bshd(fake(1), 16, kHkv, 192);
  paged.v = fa4::bshd(fake(2), 16, kHkv, 128);
  s = fa4::validate(paged);
  EXPECT_TRUE(s.ok()) << s.message;
  paged.v.data = nullptr;
  EXPECT_TRUE(Refused(fa4::validate(paged), {"v.data = null", "[batch, paged.page_size, heads_kv, head_dim_v]"}));
  // e4m3: both head dims in 16s.
  ForwardArgs fp8 = a;
  fp8.problem.dtype = DType::kE4M3;
  s = fa4::validate(fp8);
  EXPECT_TRUE(s.ok()) << s.message;
  fp8.problem.head_dim_v = 136;
  EXPECT_TRUE(Refused(fa4::validate(fp8), {"head_dim_v = 136: must be a multiple of 16 in [16, 256] for e4m3"}));
}

TEST(Validation, KernelHeadDimIsTheNextWithAKernelInThatPass) {
  // (the routing with the switches off; FA4_BACKWARD_D192, FA4_BACKWARD_V128 and FA4_FORWARD_V128
  // aside)
  const fa4::test::BackwardD192 off(false);
  const fa4::test::ForwardV128 v128_off(false);
  const fa4::test::BackwardV128 bwd_v128_off(false);
  using fa4::detail::Pass;
  // head dim, the 16-bit forward's kernel head dim, the backward's (and e4m3's forward's)
  const std::array<int64_t, 3> cases[] = {{8, 64, 64},     {56, 64, 64},    {64, 64, 64},   {72, 128, 128},
                                          {96, 128, 128},  {128, 128, 128}, {136, 192, 256}, {184, 192, 256},
                                          {192, 192, 256}, {200, 256, 256}, {256, 256, 256}, {264, 0, 0}};
  for (const auto& [d, fwd, bwd] : cases) {
    Problem p;
    p.dtype = DType::kBF16;
    p.head_dim = d;
    EXPECT_EQ(fa4::detail::kernel_head_dim(p, Pass::kForward), fwd) << "head_dim " << d;
    EXPECT_EQ(fa4::detail::kernel_head_dim(p, Pass::kBackward), bwd) << "head_dim " << d;
    EXPECT_EQ(fa4::detail::padded(p, Pass::kForward), fwd != d) << "head_dim " << d;
    EXPECT_EQ(fa4::detail::padded(p, Pass::kBackward), bwd != d) << "head_dim " << d;
    p.dtype = DType::kFP16;
    EXPECT_EQ(fa4::detail::kernel_head_dim(p, Pass::kForward), fwd) << "head_dim " << d;
    p.dtype = DType::kE4M3;
    EXPECT_EQ(fa4::detail::kernel_head_dim(p, Pass::kForward), bwd) << "e4m3, head_dim " << d;
  }
  // Two head dims: the larger's kernel, and over copies (with the switches off).
  Problem p;
  p.dtype = DType::kBF16;
  p.head_dim = 192;
  p.head_dim_v = 128;
  EXPECT_EQ(fa4::detail::kernel_head_dim(p, Pass::kForward), 192);
  EXPECT_EQ(fa4::detail::kernel_head_dim(p, Pass::kBackward), 256);
  EXPECT_TRUE(fa4::detail::padded(p, Pass::kForward));
  p.head_dim = 128;
  p.head_dim_v = 160;
  EXPECT_EQ(fa4::detail::kernel_head_dim(p, Pass::kForward), 192);
  EXPECT_TRUE(fa4::detail::padded(p, Pass::kForward));
  p.head_dim_v = 128;  // == head_dim
  EXPECT_FALSE(fa4::detail::padded(p, Pass::kForward));
}

// detail::set_backward_d192: the backward's head dims 136-192 on the d192 kernels, the workspace
// sized for them; off again, 256's. The forward and e4m3 do not follow it. 192 / 128 follows
// set_backward_v128 (BackwardV128SwitchKeepsDeepSeeksValueSide).
TEST(Validation, BackwardD192SwitchMovesTheBackwardsKernelHeadDim) {
  using fa4::detail::Pass;
  for (bool by_default : {false, true}) {
    EXPECT_TRUE(fa4::detail::kernel_switch_from_env("1", by_default));
    EXPECT_FALSE(fa4::detail::kernel_switch_from_env("0", by_default));
    for (const char* v : {static_cast<const char*>(nullptr), "", "yes", "10", " 1", "00"})
      EXPECT_EQ(fa4::detail::kernel_switch_from_env(v, by_default), by_default) << (v ? v : "(unset)");
  }
  if (std::getenv("FA4_BACKWARD_D192") == nullptr)
    ASSERT_EQ(fa4::detail::backward_d192(), fa4::detail::kBackwardD192ByDefault) << "the default";
  Problem p = valid_problem();
  p.head_dim = 160;
  int64_t off_bytes = 0, on_bytes = 0;
  {
    const fa4::test::BackwardD192 off(false);
    ASSERT_TRUE(fa4::detail::dq_accum_bytes(p, &off_bytes));
  }
  const fa4::test::BackwardD192 on(true);
  ASSERT_TRUE(fa4::detail::dq_accum_bytes(p, &on_bytes));
  EXPECT_EQ(off_bytes / (256 + 2) * (192 + 2), on_bytes);
  const std::array<int64_t, 2> cases[] = {{128, 128}, {136, 192}, {184, 192}, {192, 192}, {200, 256}, {256, 256}};
  for (const auto& [d, bwd] : cases) {
    p.head_dim = d;
    p.dtype = DType::kBF16;
    EXPECT_EQ(fa4::detail::kernel_head_dim(p, Pass::kBackward), bwd) << "head_dim " << d;
    EXPECT_EQ(fa4::detail::padded(p, Pass::kBackward), bwd != d) << "head_dim " << d;
    p.dtype = DType::kE4M3;
    EXPECT_EQ(fa4::detail::kernel_head_dim(p, Pass::kForward), d <= 128 ? 128 : 256) << "e4m3, head_dim " << d;
  }
  // DeepSeek's 192 / 128 on kernels of its own (native_value_dim); other pairs over copies.
  const fa4::test::BackwardV128 v128(true);
  p.dtype = DType::kBF16;
  p.head_dim = 192;
  p.head_dim_v = 128;
  EXPECT_EQ(fa4::detail::kernel_head_dim(p, Pass::kBackward), 192);
  EXPECT_TRUE(fa4::detail::native_value_dim(p, Pass::kBackward));
  EXPECT_FALSE(fa4::detail::padded(p, Pass::kBackward));
  {
    const fa4::test::ForwardV128 off(false);
    EXPECT_TRUE(fa4::detail::padded(p, Pass::kForward));  // (the forward pads v and o to 192)
  }
  EXPECT_EQ(fa4::detail::make_bwd_params(fa4::BackwardArgs{.problem = p}).head_dim_v, 128);
  for (auto [d, dv] : {std::pair<int64_t, int64_t>{160, 128}, {192, 64}, {128, 192}, {192, 160}}) {
    p.head_dim = d, p.head_dim_v = dv;
    EXPECT_FALSE(fa4::detail::native_value_dim(p, Pass::kBackward)) << d << " / " << dv;
    EXPECT_TRUE(fa4::detail::padded(p, Pass::kBackward)) << d << " / " << dv;
  }
  {  // (192 / 128 stays on its own kernels with the d192 switch off: set_backward_v128's)
    const fa4::test::BackwardD192 off(false);
    p.head_dim = 192, p.head_dim_v = 128;
    EXPECT_TRUE(fa4::detail::native_value_dim(p, Pass::kBackward));
    EXPECT_EQ(fa4::detail::kernel_head_dim(p, Pass::kBackward), 192);
    p.head_dim = 160;  // (but 136-184 go back to 256's)
    EXPECT_EQ(fa4::detail::kernel_head_dim(p, Pass::kBackward), 256);
  }
}

// detail::set_backward_v128 (on by default): the backward's 192 / 128 on the d192 kernels with a
// 128-column value side, nothing copied, the workspace the d192 accumulator's; off, over copies
// padded to 256 (or, with the d192 switch on, to 192); no other pair follows it, nor the forward.
TEST(Validation, BackwardV128SwitchKeepsDeepSeeksValueSide) {
  using fa4::detail::Pass;
  if (std::getenv("FA4_BACKWARD_V128") == nullptr)
    ASSERT_EQ(fa4::detail::backward_v128(), fa4::detail::kBackwardV128ByDefault) << "the default";
  Problem p = valid_problem();
  p.head_dim = 192, p.head_dim_v = 128;
  const fa4::test::BackwardD192 d192_off(false);
  int64_t on_bytes = 0, off_bytes = 0;
  {
    const fa4::test::BackwardV128 on(true);
    EXPECT_TRUE(fa4::detail::native_value_dim(p, Pass::kBackward));
    EXPECT_FALSE(fa4::detail::padded(p, Pass::kBackward));
    EXPECT_EQ(fa4::detail::kernel_head_dim(p, Pass::kBackward), 192);
    ASSERT_TRUE(fa4::detail::dq_accum_bytes(p, &on_bytes));
    size_t bytes = 0;
    ASSERT_TRUE(fa4::backward_workspace_size(fa4::BackwardArgs{.problem = p}, &bytes).ok());
    EXPECT_EQ(int64_t(bytes), on_bytes) << "no copies";
    EXPECT_EQ(fa4::detail::make_bwd_params(fa4::BackwardArgs{.problem = p}).head_dim_v, 128);
    for (auto [d, dv] : {std::pair<int64_t, int64_t>{160, 128}, {192, 64}, {128, 192}, {192, 160}}) {
      Problem o = p;
      o.head_dim = d, o.head_dim_v = dv;
      EXPECT_FALSE(fa4::detail::native_value_dim(o, Pass::kBackward)) << d << " / " << dv;
      EXPECT_EQ(fa4::detail::kernel_head_dim(o, Pass::kBackward), 256) << d << " / " << dv;
    }
    const fa4::test::ForwardV128 fwd_off(false);
    EXPECT_TRUE(fa4::detail::padded(p, Pass::kForward)) << "the forward follows its own switch";
  }
  {
    const fa4::test::BackwardV128 off(false);
    EXPECT_FALSE(fa4::detail::native_value_dim(p, Pass::kBackward));
    EXPECT_TRUE(fa4::detail::padded(p, Pass::kBackward));
    EXPECT_EQ(fa4::detail::kernel_head_dim(p, Pass::kBackward), 256);
    ASSERT_TRUE(fa4::detail::dq_accum_bytes(p, &off_bytes));
    EXPECT_EQ(off_bytes / (256 + 2) * (192 + 2), on_bytes);
    const fa4::test::BackwardD192 d192_on(true);
    EXPECT_EQ(fa4::detail::kernel_head_dim(p, Pass::kBackward), 192);
    EXPECT_TRUE(fa4::detail::padded(p, Pass::kBackward)) << "v, o, dout and dv padded to 192";
  }
}

// detail::set_forward_v128: the 16-bit forward's 192 / 128 on kernels of a 128-column value side
// (nothing copied, v_cols 128 in the kernels' parameters); soft-capped, paged and e4m3 calls still
// over copies; no other pair of head dims; off again, copies.
TEST(Validation, ForwardV128SwitchKeepsDeepSeeksValueSide) {
  using fa4::detail::Pass;
  if (std::getenv("FA4_FORWARD_V128") == nullptr)
    ASSERT_EQ(fa4::detail::forward_v128(), fa4::detail::kForwardV128ByDefault) << "the default";
  Problem p = valid_problem();
  p.head_dim = 192, p.head_dim_v = 128;
  {
    const fa4::test::ForwardV128 off(false);
    EXPECT_FALSE(fa4::detail::native_value_dim(p, Pass::kForward));
    EXPECT_TRUE(fa4::detail::padded(p, Pass::kForward));
  }
  const fa4::test::ForwardV128 on(true);
  EXPECT_EQ(fa4::detail::kernel_head_dim(p, Pass::kForward), 192);
  EXPECT_TRUE(fa4::detail::native_value_dim(p, Pass::kForward));
  EXPECT_FALSE(fa4::detail::padded(p, Pass::kForward));
  EXPECT_TRUE(fa4::detail::padded(p, Pass::kForward, true)) << "a paged cache's kernels have one head dim";
  fa4::ForwardArgs a = fa4::test::fake_forward(p);
  a.v = fa4::bshd(fake(2), p.seqlen_k, p.heads_kv, 128);
  a.o = fa4::bshd(fake(3), p.seqlen_q, p.heads_q, 128);
  ASSERT_TRUE(fa4::validate(a).ok());
  const fa4::detail::FwdParams f = fa4::detail::make_fwd_params(a);
  EXPECT_EQ(f.head_dim, 192);
  EXPECT_EQ(f.v_cols, 128);
  EXPECT_EQ(f.qk_cols, 0);
  size_t bytes = 1;
  ASSERT_TRUE(fa4::forward_workspace_size(a, &bytes).ok());
  EXPECT_EQ(bytes, 0u);
  p.softcap = 7.5f;
  EXPECT_FALSE(fa4::detail::native_value_dim(p, Pass::kForward)) << "soft-capped";
  EXPECT_TRUE(fa4::detail::padded(p, Pass::kForward));
  p.softcap = 0.0f;
  p.dtype = DType::kE4M3;
  EXPECT_TRUE(fa4::detail::padded(p, Pass::kForward)) << "e4m3";
  p.dtype = DType::kBF16;
  for (auto [d, dv] : {std::pair<int64_t, int64_t>{160, 128}, {192, 64}, {128, 192}, {192, 160}, {64, 128}}) {
    p.head_dim = d, p.head_dim_v = dv;
    EXPECT_FALSE(fa4::detail::native_value_dim(p, Pass::kForward)) << d << " / " << dv;
    EXPECT_TRUE(fa4::detail::padded(p, Pass::kForward)) << d << " / " << dv;
  }
}

TEST(Validation, HeadsQMustBeAMultipleOfHeadsKv) {
  expect_problem_refused([](Problem& p) { p.heads_q = 6; p.heads_kv = 4; },
                         {"heads_q = 6", "multiple of heads_kv = 4"});
  expect_problem_refused([](Problem& p) { p.heads_q = 2; p.heads_kv = 8; },
                         {"heads_q = 2", "heads_kv = 8"});
}

TEST(Validation, HeadsMustBePositive) {
  expect_problem_refused([](Problem& p) { p.heads_kv = 0; }, {"heads_kv = 0", ">= 1"});
  expect_problem_refused([](Problem& p) { p.heads_kv = -2; }, {"heads_kv = -2", ">= 1"});
  expect_problem_refused([](Problem& p) { p.heads_q = 0; }, {"heads_q = 0", ">= 1"});
  expect_problem_refused([](Problem& p) { p.heads_q = -8; }, {"heads_q = -8", ">= 1"});
}

TEST(Validation, NegativeSizes) {
  expect_problem_refused([](Problem& p) { p.batch = -1; }, {"batch = -1", ">= 0"});
  expect_problem_refused([](Problem& p) { p.seqlen_q = -3; }, {"seqlen_q = -3", ">= 0"});
  expect_problem_refused([](Problem& p) { p.seqlen_k = -384; }, {"seqlen_k = -384", ">= 0"});
}

TEST(Validation, SizesMustFitInInt32) {
  const int64_t big = int64_t{1} << 31;  // INT32_MAX + 1
  const std::string max = std::to_string(std::numeric_limits<int32_t>::max());
  expect_problem_refused([=](Problem& p) { p.batch = big; }, {"batch = 2147483648", "int32", max});
  expect_problem_refused([=](Problem& p) { p.seqlen_q = big; }, {"seqlen_q = 2147483648", "int32"});
  expect_problem_refused([](Problem& p) { p.seqlen_k = int64_t{1} << 40; },
                         {"seqlen_k = 1099511627776", "int32"});
  expect_problem_refused([=](Problem& p) { p.heads_q = big; }, {"heads_q = 2147483648", "int32"});
  expect_problem_refused([=](Problem& p) { p.heads_kv = big; p.heads_q = big; },
                         {"heads_q = 2147483648", "int32"});
  expect_problem_refused([=](Problem& p) { p.heads_kv = big; }, {"heads_kv = 2147483648", "int32"});
}

TEST(Validation, SoftmaxScaleMustBeFiniteAndNonNegative) {
  expect_problem_refused([](Problem& p) { p.softmax_scale = std::numeric_limits<float>::quiet_NaN(); },
                         {"softmax_scale = nan", "finite"});
  expect_problem_refused([](Problem& p) { p.softmax_scale = std::numeric_limits<float>::infinity(); },
                         {"softmax_scale = inf", "finite"});
  expect_problem_refused([](Problem& p) { p.softmax_scale = -std::numeric_limits<float>::infinity(); },
                         {"softmax_scale = -inf"});
  expect_problem_refused([](Problem& p) { p.softmax_scale = -0.5f; },
                         {"softmax_scale = -0.5", ">= 0"});
}

TEST(Validation, SoftcapMustBeFiniteAndNonNegative) {
  expect_problem_refused([](Problem& p) { p.softcap = std::numeric_limits<float>::quiet_NaN(); },
                         {"softcap = nan", "finite"});
  expect_problem_refused([](Problem& p) { p.softcap = std::numeric_limits<float>::infinity(); },
                         {"softcap = inf", "finite"});
  expect_problem_refused([](Problem& p) { p.softcap = -1.0f; }, {"softcap = -1", ">= 0"});
}

// A soft-capped forward and backward are valid, and the cap reaches the kernels' parameters: S ->
// softcap * tanh(S * softcap_in), softcap_in = scale / softcap, the softmax's own factor log2(e).
TEST(Validation, SoftcapForwardAndBackward) {
  ForwardArgs f = valid_forward();
  f.problem.softcap = 30.0f;
  const Status fs = fa4::validate(f);
  EXPECT_TRUE(fs.ok()) << fs.message;
  BackwardArgs b = valid_backward();
  b.problem.softcap = 30.0f;
  const Status bs = fa4::validate(b);
  EXPECT_TRUE(bs.ok()) << bs.message;
  const fa4::detail::BwdParams k = fa4::detail::make_bwd_params(b);
  const float scale = float(1.0 / std::sqrt(double(b.problem.head_dim)));
  EXPECT_EQ(k.softcap, 30.0f);
  EXPECT_FLOAT_EQ(k.softcap_in, scale / 30.0f);
  EXPECT_FLOAT_EQ(k.scale, scale);  // dS's factor: the softmax scale, the cap's slope apart
  EXPECT_FLOAT_EQ(k.scale_log2, 1.4426950408889634f);
  b.problem.softcap = 0.0f;
  const fa4::detail::BwdParams plain = fa4::detail::make_bwd_params(b);
  EXPECT_EQ(plain.softcap, 0.0f);
  EXPECT_FLOAT_EQ(plain.scale_log2, float(scale * 1.4426950408889634));
}

TEST(Validation, WindowBoundsBelowMinusOne) {
  expect_problem_refused([](Problem& p) { p.window_left = -2; }, {"window_left = -2", "-1"});
  expect_problem_refused([](Problem& p) { p.window_right = -5; }, {"window_right = -5", "-1"});
}

TEST(Validation, HugeWindowsAreValid) {
  ForwardArgs a = valid_forward();
  a.problem.window_left = int64_t{1} << 40;
  a.problem.window_right = std::numeric_limits<int64_t>::max();
  const Status s = fa4::validate(a);
  EXPECT_TRUE(s.ok()) << s.message;
}

// ---------------------------------------------------------------------------------------------
// Tensor rules, for every tensor of both passes.

struct TensorCase {
  const char* name;
  std::function<TensorRef&(ForwardArgs&)> fwd;    // null when the tensor is backward-only
  std::function<TensorRef&(BackwardArgs&)> bwd;
};

std::vector<TensorCase> tensor_cases() {
  return {
      {"q", [](ForwardArgs& a) -> TensorRef& { return a.q; }, [](BackwardArgs& a) -> TensorRef& { return a.q; }},
      {"k", [](ForwardArgs& a) -> TensorRef& { return a.k; }, [](BackwardArgs& a) -> TensorRef& { return a.k; }},
      {"v", [](ForwardArgs& a) -> TensorRef& { return a.v; }, [](BackwardArgs& a) -> TensorRef& { return a.v; }},
      {"o", [](ForwardArgs& a) -> TensorRef& { return a.o; }, [](BackwardArgs& a) -> TensorRef& { return a.o; }},
      {"dout", nullptr, [](BackwardArgs& a) -> TensorRef& { return a.dout; }},
      {"dq", nullptr, [](BackwardArgs& a) -> TensorRef& { return a.dq; }},
      {"dk", nullptr, [](BackwardArgs& a) -> TensorRef& { return a.dk; }},
      {"dv", nullptr, [](BackwardArgs& a) -> TensorRef& { return a.dv; }},
  };
}

// Breaks one tensor and expects the refusal from each pass that has it. `needles` may use the
// tensor's name; `breaker` returns extra needles computed from the tensor (e.g. a pointer value).
void expect_tensor_refused(
    const std::function<std::vector<std::string>(const std::string& name, TensorRef&)>& breaker) {
  for (const TensorCase& c : tensor_cases()) {
    if (c.fwd) {
      ForwardArgs a = valid_forward();
      const std::vector<std::string> needles = breaker(c.name, c.fwd(a));
      EXPECT_TRUE(Refused(fa4::validate(a), needles)) << "forward, tensor " << c.name;
    }
    BackwardArgs b = valid_backward();
    const std::vector<std::string> needles = breaker(c.name, c.bwd(b));
    EXPECT_TRUE(Refused(fa4::validate(b), needles)) << "backward, tensor " << c.name;
  }
}

TEST(Validation, NullTensorPointers) {
  expect_tensor_refused([](const std::string& name, TensorRef& t) -> std::vector<std::string> {
    t.data = nullptr;
    return {name + ".data = null"};
  });
}

TEST(Validation, MisalignedBasePointers) {
  for (int shift : {2, 8, fa4::kAlignmentBytes - 2}) {
    expect_tensor_refused([&](const std::string& name, TensorRef& t) -> std::vector<std::string> {
      t.data = offset_bytes(t.data, shift);
      return {name + ".data = " + fa4::detail::format_pointer(t.data),
              std::to_string(fa4::kAlignmentBytes) + " bytes"};
    });
  }
}

TEST(Validation, MisalignedStrides) {
  const int64_t elems = fa4::kAlignmentBytes / 2;  // bf16
  const std::string rule = "multiple of " + std::to_string(elems) + " elements (" +
                           std::to_string(fa4::kAlignmentBytes) + " bytes of bf16)";
  const struct {
    const char* field;
    int64_t TensorRef::*member;
  } fields[] = {{"batch_stride", &TensorRef::batch_stride},
                {"seq_stride", &TensorRef::seq_stride},
                {"head_stride", &TensorRef::head_stride}};
  for (const auto& f : fields) {
    for (int64_t bump : {int64_t{1}, elems / 2}) {
      expect_tensor_refused([&](const std::string& name, TensorRef& t) -> std::vector<std::string> {
        t.*f.member += bump;
        return {name + "." + f.field + " = " + std::to_string(t.*f.member), rule};
      });
    }
  }
}

TEST(Validation, MisalignedStridesFp16) {
  ForwardArgs a = valid_forward();
  a.problem.dtype = DType::kFP16;
  a.v.seq_stride += 4;
  EXPECT_TRUE(Refused(fa4::validate(a), {"v.seq_stride = " + std::to_string(a.v.seq_stride),
                                         "bytes of fp16"}));
}

TEST(Validation, NegativeStrides) {
  expect_tensor_refused([](const std::string& name, TensorRef& t) -> std::vector<std::string> {
    t.head_stride = -t.head_stride;
    return {name + ".head_stride = " + std::to_string(t.head_stride), ">= 0"};
  });
}

TEST(Validation, LargestElementOffsetOverflowsInt64) {
  // (seq-1) * seq_stride alone exceeds 2^63 (seq is 256 or 384).
  expect_tensor_refused([](const std::string& name, TensorRef& t) -> std::vector<std::string> {
    t.seq_stride = int64_t{1} << 61;
    return {name + ".seq_stride = 2305843009213693952", "int64"};
  });
}

TEST(Validation, OffsetSumOverflowsInt64) {
  // Each product fits in int64; their sum does not.
  ForwardArgs a = valid_forward();
  ASSERT_EQ(a.problem.batch, 2);
  a.o.batch_stride = int64_t{1} << 62;
  a.o.seq_stride = (int64_t{1} << 62) / (kSq - 1) / 8 * 8 + 8;
  EXPECT_TRUE(Refused(fa4::validate(a), {"o.batch_stride = 4611686018427387904", "o.seq_stride",
                                         "int64"}));
}

// Overflows that wrap around to a small, plausible offset in unchecked arithmetic: each case
// passes unless its own step of the offset sum is checked.
TEST(Validation, OffsetOverflowThatWrapsBackIsCaught) {
  constexpr int64_t P = int64_t{1} << 60;
  const struct {
    const char* what;
    int64_t batch, seqlen_q, heads_q, bs, ss, hs;
  } cases[] = {
      {"(batch-1)*batch_stride = 2^64", 5, 8, 4, 4 * P, 0, 0},
      {"(heads_q-1)*head_stride = 2^64", 1, 8, 5, 0, 0, 4 * P},
      {"head_dim-1 + batch term", 2, 5, 4, (P - 1) * 8, P, 2 * P},
      {"+ seq term", 2, 5, 4, 7 * P, P, 2 * P},
      {"+ head term", 2, 5, 4, 4 * P, P / 2, 2 * P},
  };
  for (const auto& c : cases) {
    ForwardArgs a = valid_forward();
    a.problem.batch = c.batch;
    a.problem.seqlen_q = c.seqlen_q;
    a.problem.heads_q = c.heads_q;
    a.problem.heads_kv = 1;
    a.k = fa4::bshd(fake(1), kSk, 1, kD);
    a.v = fa4::bshd(fake(2), kSk, 1, kD);
    a.q = {fake(0), c.bs, c.ss, c.hs};
    EXPECT_TRUE(Refused(fa4::validate(a), {"q.batch_stride = " + std::to_string(c.bs), "int64"}))
        << c.what;
  }
}

TEST(Validation, ByteCountOverflowsInt64) {
  // With batch = 2 the element offset is 2^62 plus a little, which fits; times 2 bytes it does not.
  ASSERT_EQ(valid_problem().batch, 2);
  expect_tensor_refused([](const std::string& name, TensorRef& t) -> std::vector<std::string> {
    t.batch_stride = int64_t{1} << 62;
    return {name + ".batch_stride = 4611686018427387904", "in bytes", "int64"};
  });
}

TEST(Validation, EmptyTensorsMayBeNull) {
  ForwardArgs f;  // batch 0: every tensor is empty
  f.problem = valid_problem();
  f.problem.batch = 0;
  Status s = fa4::validate(f);
  EXPECT_TRUE(s.ok()) << s.message;
  BackwardArgs b;
  b.problem = f.problem;
  s = fa4::validate(b);
  EXPECT_TRUE(s.ok()) << s.message;

  f = valid_forward();  // seqlen_k 0: k and v are empty, q and o are not
  f.problem.seqlen_k = 0;
  f.k = {nullptr, 3, 5, 7};
  f.v = {};
  s = fa4::validate(f);
  EXPECT_TRUE(s.ok()) << s.message;
  f.q.data = nullptr;
  EXPECT_TRUE(Refused(fa4::validate(f), {"q.data = null"}));

  f = valid_forward();  // seqlen_q 0: q, o and lse are empty
  f.problem.seqlen_q = 0;
  f.q = {};
  f.o = {};
  f.lse = nullptr;
  s = fa4::validate(f);
  EXPECT_TRUE(s.ok()) << s.message;
  f.k.data = nullptr;
  EXPECT_TRUE(Refused(fa4::validate(f), {"k.data = null"}));
}

// ---------------------------------------------------------------------------------------------
// LSE and workspace rules.

TEST(Validation, LseMisaligned) {
  ForwardArgs f = valid_forward();
  f.lse = reinterpret_cast<float*>(offset_bytes(f.lse, 2));
  EXPECT_TRUE(Refused(fa4::validate(f), {"lse = " + fa4::detail::format_pointer(f.lse), "4 bytes"}));
  BackwardArgs b = valid_backward();
  b.lse = reinterpret_cast<const float*>(offset_bytes(const_cast<float*>(b.lse), 1));
  EXPECT_TRUE(Refused(fa4::validate(b), {"lse = " + fa4::detail::format_pointer(b.lse)}));
}

// Attention sinks: fp32-aligned, forward and backward; dsink only with the sinks it is the
// gradient of; both reach the kernels' parameters.
TEST(Validation, SinkArguments) {
  ForwardArgs f = valid_forward();
  f.sink = static_cast<const float*>(fake(20));
  Status s = fa4::validate(f);
  EXPECT_TRUE(s.ok()) << s.message;
  EXPECT_EQ(fa4::detail::make_fwd_params(f).sink, f.sink);
  // A decoding call's query groups fold into rows with sinks as without, each row taking its own
  // query head's sink (sink_index): row g of KV head hk is query head hk * group + g, where the
  // folded strides put it.
  ForwardArgs one = valid_forward();
  one.problem.seqlen_q = 1;
  one.sink = f.sink;
  const fa4::detail::FwdParams g1 = fa4::detail::make_fwd_params(one);
  constexpr int kGroup = kHq / kHkv;
  EXPECT_EQ(g1.heads_q, kHkv);  // (a KV head's group as its rows)
  EXPECT_EQ(g1.seqlen_q, kGroup);
  EXPECT_EQ(g1.sink_group, kGroup);
  const int64_t head_stride = one.q.head_stride;
  for (int hk = 0; hk < kHkv; ++hk)
    for (int g = 0; g < kGroup; ++g)
      EXPECT_EQ(fa4::detail::sink_index(hk, g, g1.sink_group, g1.sink_mask),
                (hk * g1.q_stride[2] + g * g1.q_stride[1]) / head_stride);
  // A few rows a head: fold_query_rows, row r of KV head hk query head (hk << fold) + (r & (2^fold - 1)).
  one.problem.seqlen_q = 4;
  const fa4::detail::FwdParams r4 = fa4::detail::make_fwd_params(one);
  ASSERT_GT(r4.fold, 0);
  EXPECT_EQ(r4.sink_group, 1 << r4.fold);
  for (int hk = 0; hk < kHkv; ++hk)
    for (int r = 0; r < r4.seqlen_q; ++r)
      EXPECT_EQ(fa4::detail::sink_index(hk, r, r4.sink_group, r4.sink_mask), (hk << r4.fold) + (r & ((1 << r4.fold) - 1)));
  // Unfolded rows take their head's; a padding row of a folded group (past its rows, or before row
  // 0) the group's last head's: in bounds.
  EXPECT_EQ(fa4::detail::make_fwd_params(f).sink_group, 1);
  EXPECT_EQ(fa4::detail::sink_index(5, 77, 1, 0), 5);
  EXPECT_EQ(fa4::detail::sink_index(3, 5, 6, ~0u), 23);
  EXPECT_EQ(fa4::detail::sink_index(3, 6, 6, ~0u), 23);
  EXPECT_EQ(fa4::detail::sink_index(3, 127, 6, ~0u), 23);
  EXPECT_EQ(fa4::detail::sink_index(3, -1, 6, ~0u), 23);
  EXPECT_EQ(fa4::detail::sink_index(2, 7, 4, 3u), 11);
  f.sink = reinterpret_cast<const float*>(offset_bytes(fake(20), 2));
  EXPECT_TRUE(Refused(fa4::validate(f), {"sink = " + fa4::detail::format_pointer(f.sink), "4 bytes", "fp32"}));

  BackwardArgs b = valid_backward();
  b.sink = static_cast<const float*>(fake(20));
  b.dsink = static_cast<float*>(fake(21));
  s = fa4::validate(b);
  EXPECT_TRUE(s.ok()) << s.message;
  EXPECT_EQ(fa4::detail::make_bwd_params(b).dsink, b.dsink);
  EXPECT_EQ(fa4::detail::make_bwd_params(b).sink, b.sink);
  b.dsink = reinterpret_cast<float*>(offset_bytes(fake(21), 1));
  EXPECT_TRUE(Refused(fa4::validate(b), {"dsink = " + fa4::detail::format_pointer(b.dsink), "4 bytes"}));
  b.dsink = static_cast<float*>(fake(21));
  b.sink = nullptr;
  EXPECT_TRUE(Refused(fa4::validate(b), {"dsink = " + fa4::detail::format_pointer(b.dsink), "sink is null"}));
  // Sinks without dsink: the gradients of q, k and v alone (the LSE carries the sinks); the
  // kernels are handed neither.
  b.sink = static_cast<const float*>(fake(20));
  b.dsink = nullptr;
  s = fa4::validate(b);
  EXPECT_TRUE(s.ok()) << s.message;
  EXPECT_EQ(fa4::detail::make_bwd_params(b).sink, nullptr);
}

TEST(Validation, LseByteCountOverflowsInt64) {
  // The q/o tensors use zero strides so that only the lse extent overflows.
  ForwardArgs a = valid_forward();
  const int64_t big = std::numeric_limits<int32_t>::max();
  a.problem.batch = big;
  a.problem.seqlen_q = big;
  a.problem.heads_q = big;
  a.problem.heads_kv = 1;
  a.q = {fake(0), 0, 0, 0};
  a.o = {fake(3), 0, 0, 0};
  a.k = {fake(1), 0, 0, 0};
  a.v = {fake(2), 0, 0, 0};
  EXPECT_TRUE(Refused(fa4::validate(a), {"lse", "batch = 2147483647", "heads_q = 2147483647",
                                         "seqlen_q = 2147483647", "int64"}));
  a.lse = nullptr;  // nothing to index then
  const Status s = fa4::validate(a);
  EXPECT_TRUE(s.ok()) << s.message;
}

TEST(Validation, BackwardNeedsLse) {
  BackwardArgs b = valid_backward();
  b.lse = nullptr;
  EXPECT_TRUE(Refused(fa4::validate(b), {"lse = null", "backward"}));
}

TEST(Validation, BackwardWorkspace) {
  BackwardArgs b = valid_backward();
  const std::string need = std::to_string(b.workspace_bytes);
  ASSERT_GT(b.workspace_bytes, 0u);

  BackwardArgs x = b;
  x.workspace = nullptr;
  EXPECT_TRUE(Refused(fa4::validate(x), {"workspace = null", need}));

  x = b;
  x.workspace_bytes -= 1;
  EXPECT_TRUE(Refused(fa4::validate(x), {"workspace_bytes = " + std::to_string(x.workspace_bytes),
                                         "at least " + need}));

  x = b;
  x.workspace = offset_bytes(x.workspace, 8);
  EXPECT_TRUE(Refused(fa4::validate(x), {"workspace = " + fa4::detail::format_pointer(x.workspace),
                                         std::to_string(fa4::kAlignmentBytes) + " bytes"}));

  x = b;
  x.workspace_bytes += 1000;  // more is fine
  const Status s = fa4::validate(x);
  EXPECT_TRUE(s.ok()) << s.message;
}

TEST(Validation, BackwardDqAccumulatorOverflowsInt64) {
  // lse (batch*heads_q*seqlen_q*4 = 2^61 bytes) fits; the dQ accumulator (times head_dim) does not.
  // Zero strides keep the q-shaped tensors' offsets small.
  BackwardArgs b = valid_backward();
  b.problem.batch = int64_t{1} << 20;
  b.problem.heads_q = int64_t{1} << 20;
  b.problem.heads_kv = 1;
  b.problem.seqlen_q = int64_t{1} << 19;
  b.problem.seqlen_k = 8;
  for (TensorRef* t : {&b.q, &b.o, &b.dout, &b.dq}) *t = {t->data, 0, 0, 0};
  for (TensorRef* t : {&b.k, &b.v, &b.dk, &b.dv}) *t = {t->data, 0, 0, 0};
  EXPECT_TRUE(Refused(fa4::validate(b), {"dQ accumulator", "batch = 1048576", "int64"}));
  size_t bytes = 0;
  EXPECT_TRUE(Refused(fa4::backward_workspace_size(b, &bytes), {"dQ accumulator"}));
}

// ---------------------------------------------------------------------------------------------
// A paged KV cache (fa4::PagedKV): k and v as pools [num_pages, page_size, heads_kv, head_dim].

constexpr int64_t kPage = 256, kPages = 7;

ForwardArgs valid_paged() {
  ForwardArgs a = valid_forward();
  a.k = fa4::bshd(fake(1), kPage, kHkv, kD);
  a.v = fa4::bshd(fake(2), kPage, kHkv, kD);
  a.paged = {static_cast<const int32_t*>(fake(5)), (kSk + kPage - 1) / kPage, kPage, kPages};
  return a;
}

::testing::AssertionResult NotSupported(const Status& s, const std::vector<std::string>& needles) {
  if (s.code != StatusCode::kNotSupported)
    return ::testing::AssertionFailure() << "code " << fa4::to_string(s.code) << " (message \"" << s.message
                                         << "\"), expected not supported";
  for (const std::string& n : needles)
    if (s.message.find(n) == std::string::npos)
      return ::testing::AssertionFailure() << "message \"" << s.message << "\" lacks \"" << n << "\"";
  return ::testing::AssertionSuccess() << s.message;
}

TEST(Validation, PagedCacheArguments) {
  ASSERT_TRUE(fa4::validate(valid_paged()).ok()) << fa4::validate(valid_paged()).message;
  ForwardArgs a = valid_paged();
  a.varlen.seqused_k = static_cast<const int32_t*>(fake(6));
  EXPECT_TRUE(fa4::validate(a).ok()) << fa4::validate(a).message;

  a = valid_paged();
  a.paged.page_size = 384;
  EXPECT_TRUE(Refused(fa4::validate(a), {"paged.page_size = 384", "power of two"}));
  a.paged.page_size = 8;
  EXPECT_TRUE(NotSupported(fa4::validate(a), {"paged.page_size = 8", "16"}));
  a = valid_paged();
  a.paged.page_size = 16;  // 384 keys on 24 pages of 16
  a.k = fa4::bshd(fake(1), 16, kHkv, kD);
  a.v = fa4::bshd(fake(2), 16, kHkv, kD);
  a.paged.table_stride = 23;
  EXPECT_TRUE(Refused(fa4::validate(a), {"paged.table_stride = 23", "= 24"}));
  a.paged.table_stride = 24;
  EXPECT_TRUE(fa4::validate(a).ok()) << fa4::validate(a).message;
  a = valid_paged();
  a.paged.page_size = 0;
  EXPECT_TRUE(Refused(fa4::validate(a), {"paged.page_size = 0"}));

  a = valid_paged();
  a.paged.table_stride = 1;  // 384 keys need two pages of 256
  EXPECT_TRUE(Refused(fa4::validate(a), {"paged.table_stride = 1", "= 2"}));
  a = valid_paged();
  a.paged.num_pages = 0;
  EXPECT_TRUE(Refused(fa4::validate(a), {"paged.num_pages = 0"}));
  a = valid_paged();
  a.paged.block_table = reinterpret_cast<const int32_t*>(offset_bytes(fake(5), 2));
  EXPECT_TRUE(Refused(fa4::validate(a), {"paged.block_table", "int32"}));
  a = valid_paged();
  a.k.data = nullptr;
  EXPECT_TRUE(Refused(fa4::validate(a), {"k.data = null"}));
  a = valid_paged();
  a.v.batch_stride += 1;  // a page's stride off TMA's 16 bytes
  EXPECT_TRUE(Refused(fa4::validate(a), {"v.batch_stride = " + std::to_string(a.v.batch_stride)}));

  // Packed queries (cu_seqlens_q) over the pages: q and o of total_q rows; cu_seqlens_k optional
  // (each sequence's key count), cu_seqlens_q not.
  a = valid_paged();
  a.varlen.cu_seqlens_q = static_cast<const int32_t*>(fake(6));
  a.varlen.total_q = 3 * kSq;
  a.q = fa4::bshd(fake(0), 3 * kSq, kHq, kD);
  a.o = fa4::bshd(fake(3), 3 * kSq, kHq, kD);
  EXPECT_TRUE(fa4::validate(a).ok()) << fa4::validate(a).message;
  a.varlen.cu_seqlens_k = static_cast<const int32_t*>(fake(7));
  a.varlen.seqused_k = static_cast<const int32_t*>(fake(8));
  EXPECT_TRUE(fa4::validate(a).ok()) << fa4::validate(a).message;
  a.o.data = nullptr;
  EXPECT_TRUE(Refused(fa4::validate(a), {"o.data = null"}));
  a.o = fa4::bshd(fake(3), 3 * kSq, kHq, kD);
  a.varlen.cu_seqlens_k = reinterpret_cast<const int32_t*>(offset_bytes(fake(7), 2));
  EXPECT_TRUE(Refused(fa4::validate(a), {"varlen.cu_seqlens_k", "int32"}));
  a.varlen.cu_seqlens_k = static_cast<const int32_t*>(fake(7));
  a.varlen.cu_seqlens_q = nullptr;  // cu_seqlens_k alone
  EXPECT_TRUE(Refused(fa4::validate(a), {"varlen.cu_seqlens_q = null"}));
}

// ---------------------------------------------------------------------------------------------
// Appending to a KV cache (AppendArgs): the new rows, the caches (contiguous or paged), the
// lengths and the rotary embedding.

constexpr int64_t kNew = 3, kRo = 512;

fa4::AppendArgs valid_append() {
  fa4::AppendArgs a;
  a.problem = valid_problem();  // seqlen_k: the cache's rows an entry
  a.problem.causal = true;
  a.seqlen_new = kNew;
  a.k_new = fa4::bshd(fake(10), kNew, kHkv, kD);
  a.v_new = fa4::bhsd(fake(11), kNew, kHkv, kD);
  a.k_cache = fa4::bshd(fake(1), kSk, kHkv, kD);
  a.v_cache = fa4::bshd(fake(2), kSk, kHkv, kD);
  a.cache_seqlens = static_cast<const int32_t*>(fake(12));
  a.seqused_k = static_cast<int32_t*>(fake(13));
  a.rotary = {fake(14), fake(15), kRo, 64, false};
  a.q = fa4::bshd(fake(0), kSq, kHq, kD);
  a.q_rotated = fa4::bshd(fake(3), kSq, kHq, kD);
  return a;
}

TEST(Validation, AppendArguments) {
  using fa4::AppendArgs;
  ASSERT_TRUE(fa4::validate(valid_append()).ok()) << fa4::validate(valid_append()).message;
  AppendArgs a = valid_append();
  a.rotary = {};  // no rotary: q and q_rotated are not read
  a.q = a.q_rotated = {};
  EXPECT_TRUE(fa4::validate(a).ok()) << fa4::validate(a).message;
  a.cache_seqlens = nullptr;  // one length for every entry, checked here: the new rows must fit
  a.cache_seqlen = kSk - kNew;
  EXPECT_TRUE(fa4::validate(a).ok()) << fa4::validate(a).message;
  a.cache_seqlen = kSk - kNew + 1;
  EXPECT_TRUE(Refused(fa4::validate(a), {"cache_seqlen = " + std::to_string(kSk - kNew + 1), "seqlen_k = 384"}));
  a.cache_seqlen = -1;
  EXPECT_TRUE(Refused(fa4::validate(a), {"cache_seqlen = -1"}));

  a = valid_append();
  a.seqlen_new = -2;
  EXPECT_TRUE(Refused(fa4::validate(a), {"seqlen_new = -2"}));
  a = valid_append();
  a.problem.head_dim = 100;
  EXPECT_TRUE(Refused(fa4::validate(a), {"head_dim = 100"}));
  a = valid_append();
  a.problem.head_dim_v = 64;
  const Status two = fa4::validate(a);
  EXPECT_EQ(two.code, StatusCode::kNotSupported);
  EXPECT_NE(two.message.find("head_dim_v = 64: append_kv takes keys and values of one head dim"), std::string::npos)
      << two.message;
  a = valid_append();
  a.cache_seqlens = reinterpret_cast<const int32_t*>(offset_bytes(fake(12), 2));
  EXPECT_TRUE(Refused(fa4::validate(a), {"cache_seqlens", "int32"}));
  a = valid_append();
  a.seqused_k = reinterpret_cast<int32_t*>(offset_bytes(fake(13), 1));
  EXPECT_TRUE(Refused(fa4::validate(a), {"seqused_k", "int32"}));
  a = valid_append();
  a.seqused_k = const_cast<int32_t*>(a.cache_seqlens);
  EXPECT_TRUE(Refused(fa4::validate(a), {"seqused_k", "must not be cache_seqlens"}));
  a = valid_append();
  a.k_new.data = nullptr;
  EXPECT_TRUE(Refused(fa4::validate(a), {"k_new.data = null", "seqlen_new"}));
  a = valid_append();
  a.v_new.seq_stride += 4;
  EXPECT_TRUE(Refused(fa4::validate(a), {"v_new.seq_stride = " + std::to_string(a.v_new.seq_stride)}));
  a = valid_append();
  a.v_cache.data = offset_bytes(a.v_cache.data, 8);
  EXPECT_TRUE(Refused(fa4::validate(a), {"v_cache.data", "16 bytes"}));
  a = valid_append();
  a.seqlen_new = 0;  // nothing new: the new tensors may be null
  a.k_new = a.v_new = {};
  EXPECT_TRUE(fa4::validate(a).ok()) << fa4::validate(a).message;

  // Rotary: both tables, aligned; rotary_dim in 16s up to head_dim; a row for every cache position.
  a = valid_append();
  a.rotary.sin = nullptr;
  EXPECT_TRUE(Refused(fa4::validate(a), {"rotary.sin = null", "both"}));
  a = valid_append();
  a.rotary.cos = offset_bytes(fake(14), 8);
  EXPECT_TRUE(Refused(fa4::validate(a), {"rotary.cos", "16 bytes"}));
  for (int64_t rd : {int64_t{0}, int64_t{8}, int64_t{24}, 2 * kD}) {
    a = valid_append();
    a.rotary.rotary_dim = rd;
    EXPECT_TRUE(Refused(fa4::validate(a), {"rotary.rotary_dim = " + std::to_string(rd), "multiple of 16"})) << rd;
  }
  a = valid_append();
  a.rotary.rotary_dim = kD;
  a.rotary.interleaved = true;
  EXPECT_TRUE(fa4::validate(a).ok()) << fa4::validate(a).message;
  a.rotary.seqlen_ro = kSk - 1;
  EXPECT_TRUE(Refused(fa4::validate(a), {"rotary.seqlen_ro = " + std::to_string(kSk - 1), "seqlen_k = 384"}));
  a = valid_append();
  a.q_rotated.data = nullptr;
  EXPECT_TRUE(Refused(fa4::validate(a), {"q_rotated.data = null"}));
  a = valid_append();
  a.q.head_stride = 3;
  EXPECT_TRUE(Refused(fa4::validate(a), {"q.head_stride = 3"}));

  // A paged cache: the pools and table as the forward's.
  a = valid_append();
  a.k_cache = fa4::bshd(fake(1), kPage, kHkv, kD);
  a.v_cache = fa4::bshd(fake(2), kPage, kHkv, kD);
  a.paged = {static_cast<const int32_t*>(fake(5)), (kSk + kPage - 1) / kPage, kPage, kPages};
  EXPECT_TRUE(fa4::validate(a).ok()) << fa4::validate(a).message;
  a.paged.table_stride = 1;
  EXPECT_TRUE(Refused(fa4::validate(a), {"paged.table_stride = 1"}));
  a.paged.table_stride = 2;
  a.paged.page_size = 100;
  EXPECT_TRUE(Refused(fa4::validate(a), {"paged.page_size = 100"}));
  a.paged.page_size = kPage;
  a.k_cache.data = nullptr;
  EXPECT_TRUE(Refused(fa4::validate(a), {"k_cache.data = null"}));

  // The entry point validates first.
  a = valid_append();
  a.rotary.rotary_dim = 24;
  EXPECT_TRUE(Refused(fa4::append_kv(a, nullptr), {"rotary.rotary_dim = 24"}));
}

// ---------------------------------------------------------------------------------------------
// The same rules reach the entry points: forward()/backward() refuse before touching the GPU.

TEST(Validation, EntryPointsValidateFirst) {
  ForwardArgs f = valid_forward();
  f.problem.head_dim = 100;
  EXPECT_TRUE(Refused(fa4::forward(f, nullptr), {"head_dim = 100"}));
  BackwardArgs b = valid_backward();
  b.dv.data = nullptr;
  EXPECT_TRUE(Refused(fa4::backward(b, nullptr), {"dv.data = null"}));
  size_t bytes = 0;
  EXPECT_TRUE(Refused(fa4::forward_workspace_size(f, &bytes), {"head_dim = 100"}));
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// fp8 (DType::kE4M3): forward only, on what its kernel runs; o is bf16; descales with fp8 only.

ForwardArgs valid_fp8_forward() {
  ForwardArgs a = valid_forward();
  a.problem.dtype = DType::kE4M3;
  a.q_descale = static_cast<const float*>(fake(10));
  a.k_descale = static_cast<const float*>(fake(11));
  a.v_descale = static_cast<const float*>(fake(12));
  return a;
}

// (Every head dim passes in EverySupportedHeadDimAndDTypePasses.)
TEST(Validation, Fp8ForwardBaselineWithDescalesAndBounds) {
  const Status base = fa4::validate(valid_fp8_forward());
  EXPECT_TRUE(base.ok()) << base.message;
  ForwardArgs causal = valid_fp8_forward();
  causal.problem.causal = true, causal.problem.window_left = 100;
  EXPECT_TRUE(fa4::validate(causal).ok());
}

TEST(Validation, Fp8StridesInBytesOfEachTensor) {
  // q, k, v are 1-byte elements: a seq stride of 16 elements is 16 bytes (allowed), 8 is not; o is
  // bf16: 8 elements are 16 bytes.
  ForwardArgs a = valid_fp8_forward();
  a.q.seq_stride = 16 * kHq, a.q.head_stride = 16;  // (rows overlap; validate reads no data)
  EXPECT_TRUE(fa4::validate(a).ok());
  a = valid_fp8_forward();
  a.k.seq_stride = kHkv * kD + 8;
  EXPECT_TRUE(Refused(fa4::validate(a), {"k.seq_stride", "multiple of 16 elements", "e4m3"}));
  a = valid_fp8_forward();
  a.o.seq_stride = kHq * kD + 8;
  EXPECT_TRUE(fa4::validate(a).ok()) << "o is bf16: 8 elements are 16 bytes";
  a.o.seq_stride = kHq * kD + 4;
  EXPECT_TRUE(Refused(fa4::validate(a), {"o.seq_stride", "multiple of 8 elements", "bf16"}));
}

TEST(Validation, Fp8DescalesOnlyWithFp8) {
  ForwardArgs a = valid_forward();
  a.k_descale = static_cast<const float*>(fake(11));
  EXPECT_TRUE(Refused(fa4::validate(a), {"k_descale", "dtype = 2 (e4m3)", "dtype = 0 (bf16)"}));
  a = valid_fp8_forward();
  a.v_descale = static_cast<const float*>(offset_bytes(fake(12), 2));
  EXPECT_TRUE(Refused(fa4::validate(a), {"v_descale", "multiple of 4 bytes"}));
  a = valid_fp8_forward();
  a.q_descale = a.k_descale = a.v_descale = nullptr;  // null: 1
  EXPECT_TRUE(fa4::validate(a).ok());
}

TEST(Validation, Fp8RefusesWhatItsKernelDoesNotRun) {
  ForwardArgs a = valid_fp8_forward();
  a.problem.softcap = 30.0f;
  EXPECT_TRUE(NotSupported(fa4::validate(a), {"softcap = 30", "fp8 forward"}));
  a = valid_fp8_forward();
  a.sink = static_cast<const float*>(fake(13));
  EXPECT_TRUE(NotSupported(fa4::validate(a), {"sink = ", "sinks"}));
  a = valid_fp8_forward();
  a.varlen.seqused_k = static_cast<const int32_t*>(fake(14));
  EXPECT_TRUE(NotSupported(fa4::validate(a), {"varlen.seqused_k"}));
  a = valid_fp8_forward();
  a.varlen.cu_seqlens_q = static_cast<const int32_t*>(fake(14));
  a.varlen.cu_seqlens_k = static_cast<const int32_t*>(fake(15));
  EXPECT_TRUE(NotSupported(fa4::validate(a), {"varlen.cu_seqlens_q"}));
  a = valid_fp8_forward();
  a.paged.block_table = static_cast<const int32_t*>(fake(14));
  EXPECT_TRUE(NotSupported(fa4::validate(a), {"paged.block_table"}));
  BackwardArgs b = valid_backward();
  b.problem.dtype = DType::kE4M3;
  EXPECT_TRUE(NotSupported(fa4::validate(b), {"dtype = 2 (e4m3)", "the backward", "forward only"}));
}
