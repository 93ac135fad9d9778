// The fp8 forward (DType::kE4M3) against float64, through the public API.
//
// Inputs are drawn in fp32, rounded to e4m3 and decoded exactly, so the float64 reference sees the
// numbers the kernel sees (times the descales). The plain low-precision implementation it is judged
// against (DESIGN.md §3's criterion) does what an fp8 attention must: scores in fp32, P rounded to
// e4m3 (unnormalised, as 2^(x - m + 8)), P V in fp32 over the same rounded P, divided by the fp32 row
// sum, O rounded to bf16. Criterion: max|out - ref64| <= 2 max|plain - ref64| + 2e-3 and
// ||out - ref64|| / ||ref64|| <= 3e-2 (P's 3-bit mantissa). O is poisoned (NaN) first.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "fa4/attention.h"
#include "gpu_guard.h"
#include "reference.h"

#define FP8_CUDA_OK(x) ASSERT_EQ((x), cudaSuccess) << #x

namespace {

struct Fp8Case {
  int64_t batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim;
  bool causal;
  int64_t left = -1, right = -1;
  bool bhsd = false;      // q, k, v (and o) stored [batch, heads, seq, dim]
  bool descales = true;   // random descales a (batch, KV head); else null
  double spread = 1.0;    // inputs ~ N(0, spread^2) before rounding to e4m3
};

std::string name_of(const Fp8Case& c) {
  return "b" + std::to_string(c.batch) + " sq" + std::to_string(c.seqlen_q) + " sk" + std::to_string(c.seqlen_k) +
         " h" + std::to_string(c.heads_q) + "/" + std::to_string(c.heads_kv) + " d" + std::to_string(c.head_dim) +
         (c.causal ? " causal" : "") + " window(" + std::to_string(c.left) + "," + std::to_string(c.right) + ")" +
         (c.bhsd ? " bhsd" : "") + (c.descales ? " descales" : "");
}

struct Buffer {
  void* p = nullptr;
  ~Buffer() { cudaFree(p); }
};

// Strides of a [b, s, h, d] tensor in BSHD or BHSD (elements).
fa4::TensorRef layout(void* data, const Fp8Case& c, int64_t s, int64_t h) {
  return c.bhsd ? fa4::bhsd(data, s, h, c.head_dim) : fa4::bshd(data, s, h, c.head_dim);
}
int64_t at(const fa4::TensorRef& t, int64_t b, int64_t s, int64_t h, int64_t d) {
  return b * t.batch_stride + s * t.seq_stride + h * t.head_stride + d;
}

double e4m3_round(float x) { return double(float(__nv_fp8_e4m3(x))); }
float bf16_round(double x) { return __bfloat162float(__float2bfloat16(float(x))); }

void run_case(const Fp8Case& c) {
  SCOPED_TRACE(name_of(c));
  fa4::Problem p;
  p.dtype = fa4::DType::kE4M3;
  p.batch = c.batch, p.seqlen_q = c.seqlen_q, p.seqlen_k = c.seqlen_k;
  p.heads_q = c.heads_q, p.heads_kv = c.heads_kv, p.head_dim = c.head_dim;
  p.causal = c.causal, p.window_left = c.left, p.window_right = c.right;
  const int64_t D = c.head_dim, nq = c.batch * c.seqlen_q * c.heads_q * D, nk = c.batch * c.seqlen_k * c.heads_kv * D;

  std::mt19937 gen(uint32_t(c.seqlen_q * 7919 + c.seqlen_k * 31 + c.head_dim + c.heads_kv));
  std::normal_distribution<float> normal(0.0f, float(c.spread));
  std::uniform_real_distribution<float> uni(0.5f, 2.0f);
  // BSHD values as e4m3 bytes and their exact decodings.
  auto draw = [&](int64_t n, std::vector<uint8_t>& bytes, std::vector<double>& vals) {
    bytes.resize(size_t(n)), vals.resize(size_t(n));
    for (int64_t i = 0; i < n; ++i) {
      const __nv_fp8_e4m3 x(normal(gen));
      std::memcpy(&bytes[size_t(i)], &x, 1);
      vals[size_t(i)] = double(float(x));
    }
  };
  std::vector<uint8_t> qb, kb, vb;
  std::vector<double> q8, k8, v8;
  draw(nq, qb, q8), draw(nk, kb, k8), draw(nk, vb, v8);
  std::vector<float> qd(size_t(c.batch * c.heads_kv), 1.0f), kd = qd, vd = qd;
  if (c.descales)
    for (size_t i = 0; i < qd.size(); ++i) qd[i] = uni(gen), kd[i] = uni(gen), vd[i] = uni(gen);

  // The values the inputs stand for (e4m3 times descale), BSHD, for float64.
  auto scaled = [&](const std::vector<double>& x, const std::vector<float>& ds, int64_t s, int64_t h) {
    std::vector<double> y(x.size());
    const int64_t group = h == c.heads_q ? c.heads_q / c.heads_kv : 1;
    for (int64_t b = 0; b < c.batch; ++b)
      for (int64_t j = 0; j < s; ++j)
        for (int64_t hh = 0; hh < h; ++hh)
          for (int64_t d = 0; d < D; ++d) {
            const size_t i = size_t(((b * s + j) * h + hh) * D + d);
            y[i] = x[i] * double(ds[size_t(b * c.heads_kv + hh / group)]);
          }
    return y;
  };
  const std::vector<double> qs = scaled(q8, qd, c.seqlen_q, c.heads_q), ks = scaled(k8, kd, c.seqlen_k, c.heads_kv),
                            vs = scaled(v8, vd, c.seqlen_k, c.heads_kv);
  fa4::Problem p64 = p;
  p64.dtype = fa4::DType::kBF16;  // (the float64 reference reads no dtype)
  const fa4::ref::Forward64 ref = fa4::ref::forward(p64, qs, ks, vs);

  // The plain fp8 implementation; and a row's largest sum of |products| over its visible keys, in
  // the scaled scores' units (what the tensor core's fp8 accumulation, about 2^-13 relative, is
  // relative to).
  std::vector<double> plain(static_cast<size_t>(nq));
  std::vector<double> abs_scores(size_t(c.batch * c.heads_q * c.seqlen_q), 0.0);
  {
    const double scale = fa4::ref::softmax_scale(p64) * 1.4426950408889634;
    std::vector<float> x(size_t(c.seqlen_k));
    for (int64_t b = 0; b < c.batch; ++b)
      for (int64_t h = 0; h < c.heads_q; ++h) {
        const int64_t hk = h / (c.heads_q / c.heads_kv), ds = b * c.heads_kv + hk;
        for (int64_t i = 0; i < c.seqlen_q; ++i) {
          float m = -INFINITY;
          for (int64_t j = 0; j < c.seqlen_k; ++j) {
            x[size_t(j)] = -INFINITY;
            if (!fa4::ref::visible(p64, i, j)) continue;
            float acc = 0.0f;
            double mag = 0.0;
            for (int64_t d = 0; d < D; ++d) {
              const double pr = q8[size_t(((b * c.seqlen_q + i) * c.heads_q + h) * D + d)] *
                                k8[size_t(((b * c.seqlen_k + j) * c.heads_kv + hk) * D + d)];
              acc += float(pr);
              mag += std::abs(pr);
            }
            x[size_t(j)] = acc * float(scale * qd[size_t(ds)] * kd[size_t(ds)]);
            double& a = abs_scores[size_t((b * c.heads_q + h) * c.seqlen_q + i)];
            a = std::max(a, mag * fa4::ref::softmax_scale(p64) * qd[size_t(ds)] * kd[size_t(ds)]);
            m = std::max(m, x[size_t(j)]);
          }
          double* o = &plain[size_t(((b * c.seqlen_q + i) * c.heads_q + h) * D)];
          std::vector<float> acc(size_t(D), 0.0f);
          float l = 0.0f;
          if (m != -INFINITY)
            for (int64_t j = 0; j < c.seqlen_k; ++j) {
              if (x[size_t(j)] == -INFINITY) continue;
              const float e = std::exp2(x[size_t(j)] - m + 8.0f);
              l += e;
              const float pe = float(e4m3_round(e));
              for (int64_t d = 0; d < D; ++d) acc[size_t(d)] += pe * float(v8[size_t(((b * c.seqlen_k + j) * c.heads_kv + hk) * D + d)]);
            }
          for (int64_t d = 0; d < D; ++d) o[d] = l > 0.0f ? bf16_round(double(acc[size_t(d)]) / l * vd[size_t(ds)]) : 0.0;
        }
      }
  }

  // Device tensors in the case's layout.
  Buffer dq, dk, dv, dout, dlse, ddq, ddk, ddv;
  FP8_CUDA_OK(cudaMalloc(&dq.p, size_t(nq)));
  FP8_CUDA_OK(cudaMalloc(&dk.p, size_t(nk)));
  FP8_CUDA_OK(cudaMalloc(&dv.p, size_t(nk)));
  FP8_CUDA_OK(cudaMalloc(&dout.p, size_t(nq) * 2));
  FP8_CUDA_OK(cudaMalloc(&dlse.p, size_t(c.batch * c.heads_q * c.seqlen_q) * 4));
  FP8_CUDA_OK(cudaMalloc(&ddq.p, qd.size() * 4));
  FP8_CUDA_OK(cudaMalloc(&ddk.p, qd.size() * 4));
  FP8_CUDA_OK(cudaMalloc(&ddv.p, qd.size() * 4));
  fa4::ForwardArgs a;
  a.problem = p;
  a.q = layout(dq.p, c, c.seqlen_q, c.heads_q);
  a.k = layout(dk.p, c, c.seqlen_k, c.heads_kv);
  a.v = layout(dv.p, c, c.seqlen_k, c.heads_kv);
  a.o = layout(dout.p, c, c.seqlen_q, c.heads_q);
  a.lse = static_cast<float*>(dlse.p);
  auto upload = [&](const std::vector<uint8_t>& bshd, const fa4::TensorRef& t, int64_t s, int64_t h) {
    std::vector<uint8_t> host(bshd.size());
    for (int64_t b = 0; b < c.batch; ++b)
      for (int64_t j = 0; j < s; ++j)
        for (int64_t hh = 0; hh < h; ++hh)
          std::memcpy(&host[size_t(at(t, b, j, hh, 0))], &bshd[size_t(((b * s + j) * h + hh) * D)], size_t(D));
    return cudaMemcpy(t.data, host.data(), host.size(), cudaMemcpyHostToDevice);
  };
  FP8_CUDA_OK(upload(qb, a.q, c.seqlen_q, c.heads_q));
  FP8_CUDA_OK(upload(kb, a.k, c.seqlen_k, c.heads_kv));
  FP8_CUDA_OK(upload(vb, a.v, c.seqlen_k, c.heads_kv));
  if (c.descales) {
    FP8_CUDA_OK(cudaMemcpy(ddq.p, qd.data(), qd.size() * 4, cudaMemcpyHostToDevice));
    FP8_CUDA_OK(cudaMemcpy(ddk.p, kd.data(), kd.size() * 4, cudaMemcpyHostToDevice));
    FP8_CUDA_OK(cudaMemcpy(ddv.p, vd.data(), vd.size() * 4, cudaMemcpyHostToDevice));
    a.q_descale = static_cast<float*>(ddq.p), a.k_descale = static_cast<float*>(ddk.p);
    a.v_descale = static_cast<float*>(ddv.p);
  }
  FP8_CUDA_OK(cudaMemset(dout.p, 0xFF, size_t(nq) * 2));  // NaN in bf16
  FP8_CUDA_OK(cudaMemset(dlse.p, 0xFF, size_t(c.batch * c.heads_q * c.seqlen_q) * 4));
  const fa4::Status st = fa4::forward(a, nullptr);
  ASSERT_TRUE(st.ok()) << st.message;
  fa4_test::finish_or_exit(name_of(c));
  FP8_CUDA_OK(cudaGetLastError());

  std::vector<uint16_t> ob(static_cast<size_t>(nq));
  FP8_CUDA_OK(cudaMemcpy(ob.data(), dout.p, size_t(nq) * 2, cudaMemcpyDeviceToHost));
  std::vector<double> out(static_cast<size_t>(nq));
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t i = 0; i < c.seqlen_q; ++i)
      for (int64_t h = 0; h < c.heads_q; ++h)
        for (int64_t d = 0; d < D; ++d) {
          __nv_bfloat16 x;
          std::memcpy(&x, &ob[size_t(at(a.o, b, i, h, d))], 2);
          out[size_t(((b * c.seqlen_q + i) * c.heads_q + h) * D + d)] = double(__bfloat162float(x));
        }
  const fa4::ref::ErrorStats e = fa4::ref::error_stats(out, ref.o), e_plain = fa4::ref::error_stats(plain, ref.o);
  EXPECT_LE(e.max_abs, 2.0 * e_plain.max_abs + 2e-3) << "plain fp8 max error " << e_plain.max_abs;
  EXPECT_LE(e.rel_frobenius, 3e-2) << "plain fp8 relative error " << e_plain.rel_frobenius;

  std::vector<float> lse(size_t(c.batch * c.heads_q * c.seqlen_q));
  FP8_CUDA_OK(cudaMemcpy(lse.data(), dlse.p, lse.size() * 4, cudaMemcpyDeviceToHost));
  // P's rounding leaves the sum alone (it is taken in fp32); what moves the LSE is the scores'
  // accumulation on the tensor core (fp8 products summed with about 2^-13 of the sum of their
  // magnitudes: measured up to 0.079 here, at scores spread by tens of log2 units) and the
  // exponentials' approximation: |lse - ref| <= 5e-3 + 2^-12 * the row's largest sum of |products|.
  double worst = 0.0;
  size_t worst_at = 0;
  for (size_t i = 0; i < lse.size(); ++i) {
    const double r = ref.lse[i];
    if (std::isinf(r)) {
      EXPECT_TRUE(std::isinf(lse[i]) && lse[i] < 0) << "lse[" << i << "] = " << lse[i] << ", expected -inf";
      continue;
    }
    const double excess = std::abs(double(lse[i]) - r) - (5e-3 + std::ldexp(abs_scores[i], -12));
    if (i == 0 || excess > worst) worst = excess, worst_at = i;
  }
  EXPECT_LE(worst, 0.0) << "LSE row " << worst_at << ": " << lse[worst_at] << " against " << ref.lse[worst_at]
                        << " (sum of |products| " << abs_scores[worst_at] << ")";
}

TEST(Fp8Gpu, AgainstFloat64) {
  FA4_REQUIRE_GPU();
  const Fp8Case cases[] = {
      {1, 128, 128, 2, 2, 128, false},
      {2, 239, 1000, 4, 1, 128, false},
      {1, 1000, 239, 4, 2, 128, true},
      {2, 17, 17, 2, 2, 64, true},
      {1, 1, 4097, 8, 1, 128, false},
      {1, 4097, 300, 2, 1, 64, false, -1, -1, true},
      {2, 300, 300, 4, 4, 64, true, -1, -1, true, false},
      {1, 1000, 1000, 2, 1, 128, false, 100, 0},
      {1, 513, 700, 2, 2, 64, false, 30, 10, false, true, 3.0},
      {1, 640, 640, 2, 1, 128, true, -1, -1, false, true, 4.0},  // scores spread by tens of log2 units
      {2, 300, 1000, 4, 2, 256, true},
      {2, 300, 700, 4, 2, 256, true},
      // A window of (0, 0): each row sees its own key alone, so O is that key's V exactly (P = 1),
      // and a key V^T lacks shows whole. Keys past 128 but not past 192: d256's 64-key blocks end
      // before the transpose's 128-key block does.
      {1, 150, 150, 2, 1, 256, false, 0, 0},
      {1, 150, 150, 2, 1, 128, false, 0, 0},
      {1, 150, 150, 2, 1, 64, false, 0, 0},
      {1, 1000, 239, 2, 1, 256, false, -1, -1, true},
      {1, 513, 513, 2, 2, 256, false, 70, 5, false, true, 3.0},
  };
  for (const Fp8Case& c : cases) ASSERT_NO_FATAL_FAILURE(run_case(c));
}

// Head dims without an fp8 kernel of their own (multiples of 16: e4m3 rows of whole 16-byte
// units), on the next one's over zero-padded copies (common/pad.h; zero is an e4m3 number, and
// the bf16 o copied back): 16 and 48 on d64's kernel, 80 and 112 on d128's, 160 and 240 on d256's;
// causal, GQA, windows, descales and spread scores as above.
TEST(Fp8Gpu, PaddedHeadDims) {
  FA4_REQUIRE_GPU();
  const Fp8Case cases[] = {
      {2, 239, 300, 4, 2, 16, true},
      {1, 300, 700, 2, 1, 48, false, -1, -1, true},
      {2, 239, 1000, 4, 1, 80, false},
      {1, 1000, 239, 4, 2, 112, true, -1, -1, true, false},
      {1, 513, 700, 2, 2, 160, false, 30, 10, false, true, 3.0},
      {2, 300, 300, 4, 2, 240, true},
  };
  for (const Fp8Case& c : cases) ASSERT_NO_FATAL_FAILURE(run_case(c));
}

// More tiles than a grid has CTAs, twice in a row on one stream: the tiles past the grid's first
// come from the stream's counter, which each launch's last CTA must leave at zero for the next
// (a counter left standing hands the second launch no tiles past its grid's, and its O stays NaN).
TEST(Fp8Gpu, TileCounterAcrossLaunches) {
  FA4_REQUIRE_GPU();
  const Fp8Case cases[] = {
      {3, 1100, 300, 8, 2, 64, true},       // 9 x 8 x 3 = 216 tiles of 128 rows
      {3, 1100, 300, 8, 2, 64, true},
      {2, 1000, 260, 16, 4, 128, false},   // 256 tiles
  };
  for (const Fp8Case& c : cases) ASSERT_NO_FATAL_FAILURE(run_case(c));
}

// Small and tail-heavy, for compute-sanitizer (memcheck, racecheck, synccheck): several tiles a
// CTA's walk would not reach on a full grid are still few here, so these also take the ring around.
TEST(Fp8Gpu, SmallForSanitizers) {
  FA4_REQUIRE_GPU();
  const Fp8Case cases[] = {
      {1, 130, 300, 2, 1, 64, true},
      {1, 200, 300, 2, 1, 64, false},  // d64 without a bound: three consumers
      {2, 257, 129, 2, 2, 128, false, 40, 3, true},
      {1, 200, 330, 2, 1, 256, true},
  };
  for (const Fp8Case& c : cases) ASSERT_NO_FATAL_FAILURE(run_case(c));
}

}  // namespace
