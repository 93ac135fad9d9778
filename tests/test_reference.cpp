// What the float64 reference promises: the API's semantics on cases small enough to work out by
// hand, a backward that matches central differences of its own forward, a low-precision plain
// implementation that stays within its dtype's rounding, and exact 16-bit conversions.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <sstream>
#include <vector>

#include "convert.h"
#include "reference.h"
#include "test_support.h"

namespace {

using fa4::DType;
using fa4::Problem;
namespace ref = fa4::ref;

constexpr double kInf = std::numeric_limits<double>::infinity();

using fa4::test::make_problem;

// Uniform in [-1, -0.05] ∪ [0.05, 1]: random, and never zero or tiny.
std::vector<double> random_values(int64_t n, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> mag(0.05, 1.0);
  std::vector<double> x(n);
  for (auto& e : x) e = (gen() & 1) ? mag(gen) : -mag(gen);
  return x;
}

// The keys query i sees, in order.
std::vector<int64_t> visible_keys(const Problem& p, int64_t i) {
  std::vector<int64_t> keys;
  for (int64_t j = 0; j < p.seqlen_k; ++j)
    if (ref::visible(p, i, j)) keys.push_back(j);
  return keys;
}

using Keys = std::vector<int64_t>;

TEST(Reference, DefaultScaleIsInverseSqrtHeadDim) {
  Problem p = make_problem(1, 1, 1, 1, 1, 64);
  EXPECT_DOUBLE_EQ(ref::softmax_scale(p), 0.125);
  p.softmax_scale = 0.3f;
  EXPECT_DOUBLE_EQ(ref::softmax_scale(p), static_cast<double>(0.3f));
}

TEST(Reference, OneKeyGivesItsValueRow) {
  // With a single key the softmax is 1: O = V, LSE = the score itself.
  const Problem p = make_problem(2, 3, 1, 2, 2, 4);
  const auto q = random_values(ref::q_elems(p), 1);
  const auto k = random_values(ref::kv_elems(p), 2);
  const auto v = random_values(ref::kv_elems(p), 3);
  const auto out = ref::forward(p, q, k, v);
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t i = 0; i < 3; ++i)
      for (int64_t h = 0; h < 2; ++h) {
        double dot = 0;
        for (int64_t d = 0; d < 4; ++d)
          dot += q[((b * 3 + i) * 2 + h) * 4 + d] * k[(b * 2 + h) * 4 + d];
        EXPECT_NEAR(out.lse[(b * 2 + h) * 3 + i], 0.5 * dot, 1e-15);
        for (int64_t d = 0; d < 4; ++d)
          EXPECT_NEAR(out.o[((b * 3 + i) * 2 + h) * 4 + d], v[(b * 2 + h) * 4 + d], 1e-15);
      }
}

TEST(Reference, TwoKeysWorkedByHand) {
  // scale 1, q = (1, 0); k0 = (0, 0) scores 0, k1 = (ln 3, 5) scores ln 3: P = (1/4, 3/4).
  // v0 = (4, 8), v1 = (8, 0): O = (1 + 6, 2 + 0) = (7, 2); LSE = ln(1 + 3) = ln 4.
  Problem p = make_problem(1, 1, 2, 1, 1, 2);
  p.softmax_scale = 1.0f;
  const std::vector<double> q = {1, 0}, k = {0, 0, std::log(3.0), 5}, v = {4, 8, 8, 0};
  const auto out = ref::forward(p, q, k, v);
  EXPECT_NEAR(out.o[0], 7.0, 1e-14);
  EXPECT_NEAR(out.o[1], 2.0, 1e-14);
  EXPECT_NEAR(out.lse[0], std::log(4.0), 1e-15);
}

TEST(Reference, ScaleMultipliesScores) {
  // Scores 2 and 0 under scale 0.5 are 1 and 0: P = (e, 1) / (e + 1).
  Problem p = make_problem(1, 1, 2, 1, 1, 1);
  p.softmax_scale = 0.5f;
  const std::vector<double> q = {2}, k = {1, 0}, v = {1, 0};
  const auto out = ref::forward(p, q, k, v);
  const double e = std::exp(1.0);
  EXPECT_NEAR(out.o[0], e / (e + 1), 1e-15);
  EXPECT_NEAR(out.lse[0], std::log(e + 1), 1e-15);
}

TEST(Reference, CausalIsBottomRightAligned) {
  Problem p = make_problem(1, 2, 5, 1, 1, 1);
  p.causal = true;
  // sq < sk: the last query sees every key; each earlier one sees one fewer.
  EXPECT_EQ(visible_keys(p, 0), (Keys{0, 1, 2, 3}));
  EXPECT_EQ(visible_keys(p, 1), (Keys{0, 1, 2, 3, 4}));
  // sq > sk: the first sq - sk queries see nothing.
  p = make_problem(1, 5, 2, 1, 1, 1);
  p.causal = true;
  EXPECT_EQ(visible_keys(p, 0), Keys{});
  EXPECT_EQ(visible_keys(p, 2), Keys{});
  EXPECT_EQ(visible_keys(p, 3), Keys{0});
  EXPECT_EQ(visible_keys(p, 4), (Keys{0, 1}));
  // Square: the usual lower triangle.
  p = make_problem(1, 3, 3, 1, 1, 1);
  p.causal = true;
  EXPECT_EQ(visible_keys(p, 0), Keys{0});
  EXPECT_EQ(visible_keys(p, 2), (Keys{0, 1, 2}));
}

TEST(Reference, CausalForwardUsesOnlyVisibleKeys) {
  // sq = 5, sk = 2, causal: rows 0-2 are empty, row 3 sees key 0 alone (O = V0), row 4 both.
  Problem p = make_problem(1, 5, 2, 1, 1, 2);
  p.causal = true;
  p.softmax_scale = 1.0f;
  const std::vector<double> q = {1, 1, 1, 1, 1, 1, 1, 1, 0, 0};
  const std::vector<double> k = {3, -1, 0.5, 2}, v = {1, 2, 3, 4};
  const auto out = ref::forward(p, q, k, v);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(out.lse[i], -kInf) << "row " << i;
    EXPECT_EQ(out.o[2 * i], 0.0);
    EXPECT_EQ(out.o[2 * i + 1], 0.0);
  }
  EXPECT_DOUBLE_EQ(out.o[6], 1.0);
  EXPECT_DOUBLE_EQ(out.o[7], 2.0);
  EXPECT_DOUBLE_EQ(out.lse[3], 2.0);  // q3 · k0 = 3 - 1
  // Row 4: q = 0 scores both keys 0: the mean of the two values.
  EXPECT_DOUBLE_EQ(out.o[8], 2.0);
  EXPECT_DOUBLE_EQ(out.o[9], 3.0);
  EXPECT_DOUBLE_EQ(out.lse[4], std::log(2.0));
}

TEST(Reference, SlidingWindow) {
  Problem p = make_problem(1, 4, 4, 1, 1, 1);
  p.window_left = 1;
  p.window_right = 1;
  EXPECT_EQ(visible_keys(p, 0), (Keys{0, 1}));
  EXPECT_EQ(visible_keys(p, 2), (Keys{1, 2, 3}));
  EXPECT_EQ(visible_keys(p, 3), (Keys{2, 3}));
  // Only a left bound; only a right bound.
  p.window_right = -1;
  EXPECT_EQ(visible_keys(p, 1), (Keys{0, 1, 2, 3}));
  EXPECT_EQ(visible_keys(p, 3), (Keys{2, 3}));
  p.window_left = -1;
  p.window_right = 0;
  EXPECT_EQ(visible_keys(p, 1), (Keys{0, 1}));
  // The window is bottom-right aligned too: sq = 2, sk = 4, (0, 0) keeps only the diagonal key.
  p = make_problem(1, 2, 4, 1, 1, 1);
  p.window_left = 0;
  p.window_right = 0;
  EXPECT_EQ(visible_keys(p, 0), Keys{2});
  EXPECT_EQ(visible_keys(p, 1), Keys{3});
  // sq > sk: the diagonal runs left of key 0, so early rows may be empty.
  p = make_problem(1, 4, 2, 1, 1, 1);
  p.window_left = 0;
  p.window_right = 1;
  EXPECT_EQ(visible_keys(p, 0), Keys{});
  EXPECT_EQ(visible_keys(p, 1), Keys{0});
  EXPECT_EQ(visible_keys(p, 3), Keys{1});
}

TEST(Reference, CausalClampsTheWindowsRightEdgeToZero) {
  Problem p = make_problem(1, 4, 4, 1, 1, 1);
  p.causal = true;
  p.window_right = 2;  // causal wins: right = min(2, 0)
  EXPECT_EQ(visible_keys(p, 1), (Keys{0, 1}));
  p.window_left = 1;
  EXPECT_EQ(visible_keys(p, 3), (Keys{2, 3}));
  EXPECT_EQ(visible_keys(p, 0), Keys{0});
  p.window_right = -1;
  EXPECT_EQ(visible_keys(p, 2), (Keys{1, 2}));
}

TEST(Reference, GroupedQueryHeadsShareTheirKvHead) {
  // 6 query heads over 2 KV heads: heads 0-2 read KV head 0, heads 3-5 read KV head 1. With one
  // key, O is that head's V row.
  const Problem p = make_problem(1, 2, 1, 6, 2, 3);
  EXPECT_EQ(ref::kv_head(p, 0), 0);
  EXPECT_EQ(ref::kv_head(p, 2), 0);
  EXPECT_EQ(ref::kv_head(p, 3), 1);
  EXPECT_EQ(ref::kv_head(p, 5), 1);
  const auto q = random_values(ref::q_elems(p), 4);
  const auto k = random_values(ref::kv_elems(p), 5);
  const std::vector<double> v = {10, 11, 12, 20, 21, 22};  // [1][1][2][3]
  const auto out = ref::forward(p, q, k, v);
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t h = 0; h < 6; ++h)
      for (int64_t d = 0; d < 3; ++d)
        EXPECT_DOUBLE_EQ(out.o[(i * 6 + h) * 3 + d], v[(h / 3) * 3 + d]) << "h " << h;
}

TEST(Reference, GqaEqualsRepeatedKvHeads) {
  // GQA must equal plain multi-head attention with each KV head copied for its query heads.
  Problem p = make_problem(2, 3, 5, 4, 2, 3);
  p.causal = true;
  const auto q = random_values(ref::q_elems(p), 6);
  const auto k = random_values(ref::kv_elems(p), 7);
  const auto v = random_values(ref::kv_elems(p), 8);
  Problem mha = p;
  mha.heads_kv = 4;
  std::vector<double> k4(ref::kv_elems(mha)), v4(ref::kv_elems(mha));
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t j = 0; j < 5; ++j)
      for (int64_t h = 0; h < 4; ++h)
        for (int64_t d = 0; d < 3; ++d) {
          k4[((b * 5 + j) * 4 + h) * 3 + d] = k[((b * 5 + j) * 2 + h / 2) * 3 + d];
          v4[((b * 5 + j) * 4 + h) * 3 + d] = v[((b * 5 + j) * 2 + h / 2) * 3 + d];
        }
  const auto a = ref::forward(p, q, k, v), m = ref::forward(mha, q, k4, v4);
  EXPECT_EQ(a.o, m.o);
  EXPECT_EQ(a.lse, m.lse);
}

TEST(Reference, RowsWithNoVisibleKeyAreZeroWithMinusInfLse) {
  // sk = 0: nothing to attend anywhere.
  Problem p = make_problem(1, 2, 0, 1, 1, 2);
  auto out = ref::forward(p, {1, 2, 3, 4}, {}, {});
  EXPECT_EQ(out.o, std::vector<double>(4, 0.0));
  EXPECT_EQ(out.lse, std::vector<double>(2, -kInf));
  // A window that misses every key for some rows; their gradients are zero as well.
  p = make_problem(1, 4, 2, 1, 1, 2);
  p.window_left = 0;
  p.window_right = 0;  // query i sees key i - 2 only
  const auto q = random_values(ref::q_elems(p), 9);
  const auto k = random_values(ref::kv_elems(p), 10);
  const auto v = random_values(ref::kv_elems(p), 11);
  const auto dout = random_values(ref::q_elems(p), 12);
  out = ref::forward(p, q, k, v);
  const auto g = ref::backward(p, q, k, v, dout);
  for (int64_t i = 0; i < 2; ++i) {
    EXPECT_EQ(out.lse[i], -kInf);
    for (int64_t d = 0; d < 2; ++d) {
      EXPECT_EQ(out.o[i * 2 + d], 0.0);
      EXPECT_EQ(g.dq[i * 2 + d], 0.0);
    }
  }
  // Rows 2 and 3 each see one key: O is that V row, the softmax has no gradient (dq = dk = 0),
  // and dV of that key is dO of that row.
  for (int64_t i = 2; i < 4; ++i)
    for (int64_t d = 0; d < 2; ++d) {
      EXPECT_DOUBLE_EQ(out.o[i * 2 + d], v[(i - 2) * 2 + d]);
      EXPECT_NEAR(g.dq[i * 2 + d], 0.0, 1e-15);
      EXPECT_NEAR(g.dk[(i - 2) * 2 + d], 0.0, 1e-15);
      EXPECT_DOUBLE_EQ(g.dv[(i - 2) * 2 + d], dout[i * 2 + d]);
    }
}

TEST(Reference, LseIsLogSumExpOfScaledScores) {
  Problem p = make_problem(1, 3, 7, 2, 1, 5);
  p.softmax_scale = 0.7f;
  p.window_left = 2;
  const auto q = random_values(ref::q_elems(p), 13);
  const auto k = random_values(ref::kv_elems(p), 14);
  const auto v = random_values(ref::kv_elems(p), 15);
  const auto out = ref::forward(p, q, k, v);
  const double scale = static_cast<double>(0.7f);
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t i = 0; i < 3; ++i) {
      double sum = 0;
      for (int64_t j : visible_keys(p, i)) {
        double dot = 0;
        for (int64_t d = 0; d < 5; ++d) dot += q[(i * 2 + h) * 5 + d] * k[j * 5 + d];
        sum += std::exp(scale * dot);
      }
      EXPECT_NEAR(out.lse[h * 3 + i], std::log(sum), 1e-14);
    }
}

// ---- backward against central differences of the forward ----------------------------------

double loss(const Problem& p, const std::vector<double>& q, const std::vector<double>& k,
            const std::vector<double>& v, const std::vector<double>& dout) {
  const auto out = ref::forward(p, q, k, v);
  double s = 0;
  for (size_t n = 0; n < dout.size(); ++n) s += out.o[n] * dout[n];
  return s;
}

enum class Which { kQ, kK, kV };

// Checks every entry of the gradient of one input against a central difference of the loss.
void expect_gradient_matches(const Problem& p, Which which, uint64_t seed) {
  auto q = random_values(ref::q_elems(p), seed);
  auto k = random_values(ref::kv_elems(p), seed + 1);
  auto v = random_values(ref::v_elems(p), seed + 2);
  const auto dout = random_values(ref::o_elems(p), seed + 3);
  const auto g = ref::backward(p, q, k, v, dout);
  std::vector<double>& x = which == Which::kQ ? q : which == Which::kK ? k : v;
  const std::vector<double>& grad = which == Which::kQ ? g.dq : which == Which::kK ? g.dk : g.dv;
  const char* name = which == Which::kQ ? "dq" : which == Which::kK ? "dk" : "dv";
  ASSERT_EQ(grad.size(), x.size());
  const double h = 1e-5;
  double max_rel = 0;
  for (size_t n = 0; n < x.size(); ++n) {
    const double x0 = x[n];
    x[n] = x0 + h;
    const double up = loss(p, q, k, v, dout);
    x[n] = x0 - h;
    const double down = loss(p, q, k, v, dout);
    x[n] = x0;
    const double fd = (up - down) / (2 * h);
    // Central differences carry ~1e-10 of truncation and cancellation error here; the measured
    // agreement is a few 1e-9 relative.
    EXPECT_NEAR(grad[n], fd, 1e-7 * std::fabs(fd) + 1e-9) << name << "[" << n << "]";
    if (std::fabs(fd) > 1e-3) max_rel = std::max(max_rel, std::fabs(grad[n] - fd) / std::fabs(fd));
  }
  std::ostringstream text;
  text << std::scientific << max_rel;
  ::testing::Test::RecordProperty(std::string("max_rel_err_") + name, text.str());
}

struct GradCase {
  const char* name;
  Problem p;
};

void PrintTo(const GradCase& c, std::ostream* os) { *os << c.name; }

class ReferenceGradient : public ::testing::TestWithParam<GradCase> {};

TEST_P(ReferenceGradient, DqMatchesFiniteDifferences) {
  expect_gradient_matches(GetParam().p, Which::kQ, 100);
}
TEST_P(ReferenceGradient, DkMatchesFiniteDifferences) {
  expect_gradient_matches(GetParam().p, Which::kK, 200);
}
TEST_P(ReferenceGradient, DvMatchesFiniteDifferences) {
  expect_gradient_matches(GetParam().p, Which::kV, 300);
}

std::vector<GradCase> grad_cases() {
  std::vector<GradCase> cases;
  cases.push_back({"plain", make_problem(2, 3, 4, 2, 2, 3)});
  Problem p = make_problem(1, 3, 5, 2, 2, 4);
  p.causal = true;
  cases.push_back({"causal_sq_lt_sk", p});
  p = make_problem(1, 5, 3, 2, 2, 3);
  p.causal = true;  // rows 0 and 1 see nothing
  cases.push_back({"causal_sq_gt_sk", p});
  p = make_problem(1, 5, 6, 1, 1, 3);
  p.window_left = 1;
  p.window_right = 1;
  cases.push_back({"window", p});
  p = make_problem(1, 4, 6, 2, 1, 3);
  p.causal = true;
  p.window_left = 2;
  cases.push_back({"causal_window_mqa", p});
  p = make_problem(2, 3, 4, 4, 2, 3);
  p.softmax_scale = 1.3f;
  cases.push_back({"gqa_scale", p});
  p = make_problem(1, 4, 4, 6, 2, 2);
  p.causal = true;
  cases.push_back({"gqa_causal", p});
  // Soft-capped: scores well past the cap's bend (scale 1.3, cap 0.7), where the slope 1 - tanh^2
  // the backward takes is far from 1.
  p = make_problem(1, 4, 5, 2, 1, 3);
  p.softmax_scale = 1.3f;
  p.softcap = 0.7f;
  p.causal = true;
  cases.push_back({"softcap_causal_mqa", p});
  // Two head dims: v and o wider than q and k, and narrower.
  p = make_problem(1, 4, 5, 2, 1, 3);
  p.head_dim_v = 5;
  p.causal = true;
  cases.push_back({"value_dim_wider_mqa", p});
  p = make_problem(2, 3, 4, 2, 2, 4);
  p.head_dim_v = 2;
  cases.push_back({"value_dim_narrower", p});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Cases, ReferenceGradient, ::testing::ValuesIn(grad_cases()),
                         [](const ::testing::TestParamInfo<GradCase>& info) {
                           return std::string(info.param.name);
                         });

// ---- two head dims ------------------------------------------------------------------------------

// A problem with head_dim_v (v and o of their own width) is the one head dim problem of the larger
// width on inputs zero-padded to it, with the narrower's scale given explicitly: the identity the
// API's padded calls stand on (common/pad.h). O, LSE, dQ, dK and dV agree to rounding in float64,
// and exactly in the plain 16-bit implementation's fp32 (zero columns add exact zeros).
TEST(ReferenceTwoHeadDims, EqualsTheZeroPaddedProblem) {
  for (auto [d, dv] : {std::pair<int64_t, int64_t>{6, 3}, {3, 7}}) {
    Problem p = make_problem(2, 5, 7, 4, 2, d);
    p.head_dim_v = dv;
    p.causal = true;
    p.window_left = 3;
    const int64_t w = std::max(d, dv);
    Problem wide = make_problem(2, 5, 7, 4, 2, w);
    wide.causal = true;
    wide.window_left = 3;
    wide.softmax_scale = float(1.0 / std::sqrt(double(d)));
    p.softmax_scale = wide.softmax_scale;  // (the same float on both sides)
    const auto q = random_values(ref::q_elems(p), 31), k = random_values(ref::kv_elems(p), 32),
               v = random_values(ref::v_elems(p), 33), dout = random_values(ref::o_elems(p), 34);
    // [rows][cols] -> [rows][w], zeros past cols; and back.
    auto widen = [w](const std::vector<double>& x, int64_t cols) {
      std::vector<double> y(x.size() / size_t(cols) * size_t(w), 0.0);
      for (size_t r = 0; r < x.size() / size_t(cols); ++r)
        for (int64_t c = 0; c < cols; ++c) y[r * size_t(w) + size_t(c)] = x[r * size_t(cols) + size_t(c)];
      return y;
    };
    auto narrow = [w](const std::vector<double>& y, int64_t cols) {
      std::vector<double> x(y.size() / size_t(w) * size_t(cols));
      for (size_t r = 0; r < y.size() / size_t(w); ++r)
        for (int64_t c = 0; c < cols; ++c) x[r * size_t(cols) + size_t(c)] = y[r * size_t(w) + size_t(c)];
      return x;
    };
    const auto qw = widen(q, d), kw = widen(k, d), vw = widen(v, dv), dow = widen(dout, dv);
    SCOPED_TRACE("head_dim " + std::to_string(d) + ", head_dim_v " + std::to_string(dv));
    const auto f = ref::forward(p, q, k, v), fw = ref::forward(wide, qw, kw, vw);
    ASSERT_EQ(f.o.size(), size_t(ref::o_elems(p)));
    const auto fo = narrow(fw.o, dv);
    for (size_t n = 0; n < f.o.size(); ++n) EXPECT_NEAR(f.o[n], fo[n], 1e-14) << "o[" << n << "]";
    for (size_t n = 0; n < f.lse.size(); ++n) EXPECT_NEAR(f.lse[n], fw.lse[n], 1e-14) << "lse[" << n << "]";
    const auto g = ref::backward(p, q, k, v, dout), gw = ref::backward(wide, qw, kw, vw, dow);
    const struct {
      const char* name;
      const std::vector<double>& got;
      std::vector<double> want;
    } grads[] = {{"dq", g.dq, narrow(gw.dq, d)}, {"dk", g.dk, narrow(gw.dk, d)}, {"dv", g.dv, narrow(gw.dv, dv)}};
    for (const auto& x : grads) {
      ASSERT_EQ(x.got.size(), x.want.size()) << x.name;
      for (size_t n = 0; n < x.got.size(); ++n) EXPECT_NEAR(x.got[n], x.want[n], 1e-13) << x.name << "[" << n << "]";
    }
    p.dtype = wide.dtype = DType::kBF16;
    const auto l = ref::forward_lowp(p, q, k, v), lw = ref::forward_lowp(wide, qw, kw, vw);
    EXPECT_EQ(l.o, narrow(lw.o, dv));
    EXPECT_EQ(l.lse, lw.lse);
    const auto bl = ref::backward_lowp(p, q, k, v, dout), blw = ref::backward_lowp(wide, qw, kw, vw, dow);
    EXPECT_EQ(bl.dq, narrow(blw.dq, d));
    EXPECT_EQ(bl.dk, narrow(blw.dk, d));
    EXPECT_EQ(bl.dv, narrow(blw.dv, dv));
  }
}

// ---- attention sinks ---------------------------------------------------------------------------

// A sink is a score of sink[h] whose value row is 0: with it a row's LSE is logaddexp(its LSE
// without, sink[h]) and its O the one without times exp(LSE without - LSE); rows without keys then
// have O = 0 and LSE = sink; -inf is no sink.
TEST(ReferenceSink, ReweighsTheRowWithoutIt) {
  Problem p = make_problem(2, 5, 4, 4, 2, 3);
  p.causal = true;
  p.seqlen_q = 6;  // rows 0 and 1 see no key
  const auto q = random_values(ref::q_elems(p), 11), k = random_values(ref::kv_elems(p), 12),
             v = random_values(ref::kv_elems(p), 13);
  const std::vector<double> sink = {0.7, -kInf, -1.3, 2.5};
  const auto got = ref::forward(p, q, k, v, sink);
  const auto none = ref::forward(p, q, k, v);
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h)
      for (int64_t i = 0; i < p.seqlen_q; ++i) {
        const int64_t at = (b * p.heads_q + h) * p.seqlen_q + i;
        // The extra key's weight against the keys': logaddexp of the LSE without and the sink.
        const double l0 = none.lse[at], s = sink[size_t(h)];
        const double lse = l0 == -kInf ? s : s == -kInf ? l0 : std::max(l0, s) + std::log1p(std::exp(-std::fabs(l0 - s)));
        if (lse == -kInf) {
          EXPECT_EQ(got.lse[at], -kInf);
        } else {
          EXPECT_NEAR(got.lse[at], lse, 1e-13) << b << " " << h << " " << i;
        }
        const double w = lse == -kInf || l0 == -kInf ? 0.0 : std::exp(l0 - lse);
        for (int64_t d = 0; d < p.head_dim; ++d) {
          const int64_t n = ((b * p.seqlen_q + i) * p.heads_q + h) * p.head_dim + d;
          EXPECT_NEAR(got.o[n], none.o[n] * w, 1e-13);
        }
      }
  // The low-precision one keeps the same semantics within its rounding.
  const auto low = ref::forward_lowp(p, q, k, v, sink);
  EXPECT_LE(ref::error_stats(low.o, got.o).max_abs, 1e-2);
  EXPECT_LE(ref::error_stats(low.lse, got.lse).max_abs, 1e-2);  // (q and k rounded to bf16 there)
}

// dsink against central differences of the loss sum(O * dout), and dq, dk, dv with sinks as the
// other gradients are checked (every case of grad_cases with sinks).
TEST(ReferenceSink, GradientsMatchFiniteDifferences) {
  for (Problem p : {make_problem(2, 3, 4, 2, 2, 3), make_problem(1, 5, 3, 4, 2, 3)}) {
    p.causal = p.seqlen_q > p.seqlen_k;  // (the second: rows without keys)
    auto q = random_values(ref::q_elems(p), 21);
    auto k = random_values(ref::kv_elems(p), 22);
    auto v = random_values(ref::kv_elems(p), 23);
    const auto dout = random_values(ref::q_elems(p), 24);
    std::vector<double> sink = random_values(p.heads_q, 25);
    auto loss_of = [&] {
      const auto out = ref::forward(p, q, k, v, sink);
      double s = 0;
      for (size_t n = 0; n < dout.size(); ++n) s += out.o[n] * dout[n];
      return s;
    };
    const auto g = ref::backward(p, q, k, v, dout, sink);
    ASSERT_EQ(g.dsink.size(), sink.size());
    const double h = 1e-5;
    auto expect_fd = [&](std::vector<double>& x, const std::vector<double>& grad, const char* name) {
      ASSERT_EQ(grad.size(), x.size());
      for (size_t n = 0; n < x.size(); ++n) {
        const double x0 = x[n];
        x[n] = x0 + h;
        const double up = loss_of();
        x[n] = x0 - h;
        const double down = loss_of();
        x[n] = x0;
        const double fd = (up - down) / (2 * h);
        EXPECT_NEAR(grad[n], fd, 1e-7 * std::fabs(fd) + 1e-9) << name << "[" << n << "]";
      }
    };
    expect_fd(sink, g.dsink, "dsink");
    expect_fd(q, g.dq, "dq");
    expect_fd(k, g.dk, "dk");
    expect_fd(v, g.dv, "dv");
    // The plain low-precision backward's dsink within its rounding of the exact one.
    const auto plain = ref::backward_lowp(p, q, k, v, dout, sink);
    EXPECT_LE(ref::error_stats(plain.dsink, g.dsink).max_abs, 1e-2);
  }
}

// ---- the low-precision plain implementation ------------------------------------------------

TEST(ReferenceLowp, StaysWithinItsDtypesRoundingAndKeepsTheSemantics) {
  for (DType t : {DType::kBF16, DType::kFP16}) {
    Problem p = make_problem(2, 9, 7, 4, 2, 16);
    p.dtype = t;
    p.causal = true;  // sq > sk: two empty rows
    const auto q = random_values(ref::q_elems(p), 20);
    const auto k = random_values(ref::kv_elems(p), 21);
    const auto v = random_values(ref::kv_elems(p), 22);
    const auto dout = random_values(ref::q_elems(p), 23);
    // Compare with float64 on the same rounded inputs: what remains is the arithmetic's error.
    const auto qr = ref::rounded(t, q), kr = ref::rounded(t, k), vr = ref::rounded(t, v),
               dr = ref::rounded(t, dout);
    const auto exact = ref::forward(p, qr, kr, vr);
    const auto low = ref::forward_lowp(p, q, k, v);
    const double unit = t == DType::kBF16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
    const auto eo = ref::error_stats(low.o, exact.o);
    EXPECT_GT(eo.max_abs, 0.0) << "the rounding must show";
    EXPECT_LT(eo.max_abs, 2 * unit);
    EXPECT_LT(eo.rel_frobenius, unit);
    const auto el = ref::error_stats(low.lse, exact.lse);  // -inf rows compare equal
    EXPECT_LT(el.max_abs, 1e-5);
    for (double o : low.o) EXPECT_EQ(o, ref::round_to(t, static_cast<float>(o)));
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t h = 0; h < 4; ++h)
        for (int64_t i = 0; i < 2; ++i) EXPECT_EQ(low.lse[(b * 4 + h) * 9 + i], -kInf);

    const auto gx = ref::backward(p, qr, kr, vr, dr);
    const auto gl = ref::backward_lowp(p, q, k, v, dout);
    const std::vector<double>* pairs[3][2] = {{&gl.dq, &gx.dq}, {&gl.dk, &gx.dk}, {&gl.dv, &gx.dv}};
    for (auto& pr : pairs) {
      const auto e = ref::error_stats(*pr[0], *pr[1]);
      EXPECT_GT(e.max_abs, 0.0);
      EXPECT_LT(e.rel_frobenius, 4 * unit);
    }
  }
}

TEST(ReferenceLowp, ErrorStats) {
  const auto e = ref::error_stats({1, 2, -kInf, 4}, {1, 2.5, -kInf, 4});
  EXPECT_DOUBLE_EQ(e.max_abs, 0.5);
  EXPECT_DOUBLE_EQ(e.rel_frobenius, 0.5 / std::sqrt(1 + 6.25 + 16));
  EXPECT_TRUE(std::isnan(ref::error_stats({NAN}, {1}).max_abs));
  EXPECT_EQ(ref::error_stats({-kInf}, {0}).max_abs, kInf);
  EXPECT_EQ(ref::error_stats({0}, {0}).rel_frobenius, 0.0);
}

// ---- 16-bit conversions against CUDA's own host implementations ----------------------------

std::vector<float> conversion_probes() {
  std::vector<float> xs;
  // Every 251st bit pattern (hits every exponent, both signs), plus the values around each
  // half-way point of bf16 and fp16 in the ranges that matter.
  for (uint64_t u = 0; u <= 0xFFFFFFFFull; u += 251)
    xs.push_back(ref::bits_f32(static_cast<uint32_t>(u)));
  for (uint32_t h = 0; h < 0x10000; ++h) {
    for (float base : {ref::bf16_bits_to_float(static_cast<uint16_t>(h)),
                       ref::fp16_bits_to_float(static_cast<uint16_t>(h))}) {
      if (!std::isfinite(base)) continue;
      const uint32_t b = ref::f32_bits(base);
      for (uint32_t mid : {0x8000u, 0x1000u, 0x0800u, 0x0400u, 0x0200u})
        for (int d = -1; d <= 1; ++d) xs.push_back(ref::bits_f32(b + mid + d));
    }
  }
  for (float x : {0.0f, -0.0f, 65504.0f, 65519.99f, 65520.0f, 65536.0f, 5.96e-8f, 2.98e-8f,
                  2.9802322e-8f, 1e-45f, 3.0e38f, INFINITY, -INFINITY})
    xs.push_back(x);
  return xs;
}

TEST(Convert, Bf16MatchesCudaRoundToNearestEven) {
  for (float x : conversion_probes()) {
    const uint16_t ours = ref::float_to_bf16_bits(x);
    const __nv_bfloat16 theirs = __float2bfloat16_rn(x);
    const uint16_t tb = __bfloat16_as_ushort(theirs);
    if (std::isnan(x)) {
      EXPECT_TRUE(std::isnan(ref::bf16_bits_to_float(ours)));
      continue;
    }
    ASSERT_EQ(ours, tb) << "x = " << x << " bits 0x" << std::hex << ref::f32_bits(x);
  }
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float a = ref::bf16_bits_to_float(static_cast<uint16_t>(h));
    const float b = __bfloat162float(__ushort_as_bfloat16(static_cast<unsigned short>(h)));
    if (std::isnan(a)) {
      EXPECT_TRUE(std::isnan(b));
      continue;
    }
    ASSERT_EQ(ref::f32_bits(a), ref::f32_bits(b)) << "bf16 0x" << std::hex << h;
    ASSERT_EQ(ref::float_to_bf16_bits(a), h) << "round trip 0x" << std::hex << h;
  }
}

TEST(Convert, Fp16MatchesCudaRoundToNearestEven) {
  for (float x : conversion_probes()) {
    const uint16_t ours = ref::float_to_fp16_bits(x);
    const uint16_t theirs = __half_as_ushort(__float2half_rn(x));
    if (std::isnan(x)) {
      EXPECT_TRUE(std::isnan(ref::fp16_bits_to_float(ours)));
      continue;
    }
    ASSERT_EQ(ours, theirs) << "x = " << x << " bits 0x" << std::hex << ref::f32_bits(x);
  }
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float a = ref::fp16_bits_to_float(static_cast<uint16_t>(h));
    const float b = __half2float(__ushort_as_half(static_cast<unsigned short>(h)));
    if (std::isnan(a)) {
      EXPECT_TRUE(std::isnan(b));
      continue;
    }
    ASSERT_EQ(ref::f32_bits(a), ref::f32_bits(b)) << "fp16 0x" << std::hex << h;
    ASSERT_EQ(ref::float_to_fp16_bits(a), h) << "round trip 0x" << std::hex << h;
  }
}

TEST(Convert, VectorHelpersRoundTrip) {
  const std::vector<double> x = {1.0, 1.00390625, -3.14159, 1e-3, 70000.0};
  EXPECT_EQ(ref::from_bits(DType::kBF16, ref::to_bits(DType::kBF16, x)),
            ref::rounded(DType::kBF16, x));
  const auto h = ref::rounded(DType::kFP16, x);
  EXPECT_EQ(h[0], 1.0);
  EXPECT_EQ(h[1], 1.00390625);  // exact in fp16 (2^-8 step), not in bf16
  EXPECT_EQ(ref::rounded(DType::kBF16, x)[1], 1.0);
  EXPECT_EQ(h[4], kInf);
}

}  // namespace
