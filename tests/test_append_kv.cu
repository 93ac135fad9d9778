// fa4::append_kv on the GPU: every new row lands where the cache's lengths and pages say, the keys
// and queries turned by rotary embedding as a float64 rotation of the same 16-bit inputs says
// (within one rounding), v and the dims past rotary_dim copied bit for bit, rows past the cache
// dropped, and every other byte of the caches left as it was.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "convert.h"
#include "fa4/attention.h"
#include "gpu_guard.h"

namespace {

using fa4::DType;

#define CUDA_OK(x) ASSERT_EQ((x), cudaSuccess) << #x

struct Case {
  std::string name;
  DType dtype = DType::kBF16;
  int batch = 2, heads_q = 4, heads_kv = 2, d = 128, capacity = 300, seqlen_new = 1, seqlen_q = 1;
  std::vector<int> lengths;  // per entry (a device array); empty: `length` for every entry
  int length = 0;
  int rotary_dim = 0;        // 0: no rotary
  bool interleaved = false;
  bool causal = false;
  int page_size = 0;         // 0: contiguous caches
  bool bhsd_new = false;     // k_new and v_new as BHSD
  bool seqused = true;
};

// Device memory freed on scope exit.
struct Buf {
  void* p = nullptr;
  ~Buf() { cudaFree(p); }
};

std::vector<uint16_t> random_bits(DType t, size_t n, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = fa4::ref::float_to_bits(t, dist(rng));
  return v;
}

void run_case(const Case& c) {
  SCOPED_TRACE(c.name);
  const DType t = c.dtype;
  const int B = c.batch, Hkv = c.heads_kv, Hq = c.heads_q, D = c.d, S = c.seqlen_new, Sq = c.seqlen_q;
  std::mt19937 rng(1234 + D + S);
  const bool paged = c.page_size > 0;
  const int pages_per_entry = paged ? (c.capacity + c.page_size - 1) / c.page_size : 0;
  const int num_pages = paged ? B * pages_per_entry + 3 : 0;  // spare pages nobody owns
  // Caches: [batch, capacity, Hkv, D] or pools [num_pages, page_size, Hkv, D], BSHD.
  const int64_t cache_rows = paged ? int64_t{num_pages} * c.page_size : int64_t{B} * c.capacity;
  const int64_t cache_elems = cache_rows * Hkv * D;
  const std::vector<uint16_t> k0 = random_bits(t, cache_elems, rng), v0 = random_bits(t, cache_elems, rng);
  const std::vector<uint16_t> kn = random_bits(t, size_t(B) * S * Hkv * D, rng);
  const std::vector<uint16_t> vn = random_bits(t, size_t(B) * S * Hkv * D, rng);
  const std::vector<uint16_t> q = random_bits(t, size_t(B) * Sq * Hq * D, rng);
  // A table of pages shuffled across entries (entry b's page i at table[b * stride + i]).
  std::vector<int32_t> table(size_t(B) * std::max(pages_per_entry, 1));
  for (size_t i = 0; i < table.size(); ++i) table[i] = int32_t(i) + 2;
  std::shuffle(table.begin(), table.end(), rng);
  // cos and sin of pos * theta_j, rounded to the dtype.
  const int seqlen_ro = c.capacity + 5, half = c.rotary_dim / 2;
  std::vector<uint16_t> cosb(size_t(seqlen_ro) * std::max(half, 1)), sinb(cosb.size());
  for (int pos = 0; pos < seqlen_ro; ++pos)
    for (int j = 0; j < half; ++j) {
      const double theta = pos * std::pow(10000.0, -2.0 * j / c.rotary_dim);
      cosb[size_t(pos) * half + j] = fa4::ref::float_to_bits(t, float(std::cos(theta)));
      sinb[size_t(pos) * half + j] = fa4::ref::float_to_bits(t, float(std::sin(theta)));
    }

  Buf dk, dv, dkn, dvn, dq, dqr, dcos, dsin, dtable, dlens, dused;
  auto up = [](Buf& b, const void* src, size_t bytes) {
    ASSERT_EQ(cudaMalloc(&b.p, std::max<size_t>(bytes, 16)), cudaSuccess);
    if (src != nullptr) ASSERT_EQ(cudaMemcpy(b.p, src, bytes, cudaMemcpyHostToDevice), cudaSuccess);
  };
  up(dk, k0.data(), k0.size() * 2);
  up(dv, v0.data(), v0.size() * 2);
  up(dkn, kn.data(), kn.size() * 2);
  up(dvn, vn.data(), vn.size() * 2);
  up(dq, q.data(), q.size() * 2);
  up(dqr, nullptr, q.size() * 2);
  CUDA_OK(cudaMemset(dqr.p, 0xFF, q.size() * 2));  // poisoned: NaN in both dtypes
  up(dcos, cosb.data(), cosb.size() * 2);
  up(dsin, sinb.data(), sinb.size() * 2);
  up(dtable, table.data(), table.size() * 4);
  up(dlens, c.lengths.data(), c.lengths.size() * 4);
  up(dused, nullptr, size_t(B) * 4);
  CUDA_OK(cudaMemset(dused.p, 0xFF, size_t(B) * 4));

  fa4::AppendArgs a;
  a.problem.dtype = t;
  a.problem.batch = B;
  a.problem.seqlen_q = Sq;
  a.problem.seqlen_k = c.capacity;
  a.problem.heads_q = Hq;
  a.problem.heads_kv = Hkv;
  a.problem.head_dim = D;
  a.problem.causal = c.causal;
  a.seqlen_new = S;
  // The new rows' layout: BSHD, or BHSD ([batch, heads, seq, dim]) read in place.
  auto new_ref = [&](void* p) { return c.bhsd_new ? fa4::bhsd(p, S, Hkv, D) : fa4::bshd(p, S, Hkv, D); };
  a.k_new = new_ref(dkn.p);
  a.v_new = new_ref(dvn.p);
  const int64_t cache_seq = paged ? c.page_size : c.capacity;
  a.k_cache = fa4::bshd(dk.p, cache_seq, Hkv, D);
  a.v_cache = fa4::bshd(dv.p, cache_seq, Hkv, D);
  if (paged) a.paged = {static_cast<int32_t*>(dtable.p), pages_per_entry, c.page_size, num_pages};
  if (!c.lengths.empty()) a.cache_seqlens = static_cast<int32_t*>(dlens.p);
  a.cache_seqlen = c.length;
  if (c.seqused) a.seqused_k = static_cast<int32_t*>(dused.p);
  if (c.rotary_dim > 0) {
    a.rotary = {dcos.p, dsin.p, seqlen_ro, c.rotary_dim, c.interleaved};
    a.q = fa4::bshd(dq.p, Sq, Hq, D);
    a.q_rotated = fa4::bshd(dqr.p, Sq, Hq, D);
  }
  const fa4::Status s = fa4::append_kv(a, nullptr);
  ASSERT_TRUE(s.ok()) << s.message;
  fa4_test::finish_or_exit(c.name);
  CUDA_OK(cudaGetLastError());

  std::vector<uint16_t> k1(k0.size()), v1(v0.size()), qr(q.size());
  std::vector<int32_t> used(B);
  CUDA_OK(cudaMemcpy(k1.data(), dk.p, k1.size() * 2, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(v1.data(), dv.p, v1.size() * 2, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(qr.data(), dqr.p, qr.size() * 2, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(used.data(), dused.p, used.size() * 4, cudaMemcpyDeviceToHost));

  // The expected caches: the old ones with each new row placed; -1 where a rotated value goes.
  const double eps = t == DType::kBF16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
  auto f = [&](uint16_t b) { return double(fa4::ref::bits_to_float(t, b)); };
  // Rotates `row` (D values) at pos into out (doubles); dims past rotary_dim as they are.
  auto rotate = [&](const uint16_t* row, int64_t pos, std::vector<double>& out, std::vector<double>& scale) {
    out.assign(D, 0.0);
    scale.assign(D, 0.0);
    for (int x = 0; x < D; ++x) out[x] = f(row[x]);
    pos = std::min<int64_t>(pos, seqlen_ro - 1);
    for (int j = 0; j < half; ++j) {
      const int i1 = c.interleaved ? 2 * j : j, i2 = c.interleaved ? 2 * j + 1 : j + half;
      const double co = f(cosb[pos * half + j]), si = f(sinb[pos * half + j]);
      const double x1 = f(row[i1]), x2 = f(row[i2]);
      out[i1] = x1 * co - x2 * si;
      out[i2] = x1 * si + x2 * co;
      scale[i1] = scale[i2] = std::fabs(x1) + std::fabs(x2);
    }
  };
  auto near = [&](double got, double ref, double scale) {
    return std::fabs(got - ref) <= eps * std::fabs(ref) + 1e-5 * scale;
  };
  auto new_index = [&](int b, int s, int h) -> int64_t {
    return c.bhsd_new ? ((int64_t(b) * Hkv + h) * S + s) * D : ((int64_t(b) * S + s) * Hkv + h) * D;
  };
  auto cache_index = [&](int b, int64_t pos, int h) -> int64_t {
    const int64_t row = paged ? int64_t(table[size_t(b) * pages_per_entry + pos / c.page_size]) * c.page_size +
                                    pos % c.page_size
                              : int64_t(b) * c.capacity + pos;
    return (row * Hkv + h) * D;
  };
  std::vector<char> written(cache_elems, 0);
  int64_t bad_k = 0, bad_v = 0, bad_q = 0, bad_other = 0, bad_used = 0;
  std::vector<double> ref, scale;
  for (int b = 0; b < B; ++b) {
    const int64_t start = c.lengths.empty() ? c.length : std::max(c.lengths[b], 0);
    const int64_t expect_used = std::min<int64_t>(start + S, c.capacity);
    if (c.seqused && used[b] != expect_used) {
      ++bad_used;
      ADD_FAILURE() << "seqused_k[" << b << "] = " << used[b] << ", expected " << expect_used;
    }
    for (int s = 0; s < S; ++s) {
      const int64_t pos = start + s;
      if (pos >= c.capacity) continue;
      for (int h = 0; h < Hkv; ++h) {
        const int64_t ci = cache_index(b, pos, h), ni = new_index(b, s, h);
        rotate(&kn[ni], pos, ref, scale);
        for (int x = 0; x < D; ++x) {
          written[ci + x] = 1;
          bad_v += v1[ci + x] != vn[ni + x];
          if (x >= c.rotary_dim)
            bad_k += k1[ci + x] != kn[ni + x];
          else
            bad_k += !near(f(k1[ci + x]), ref[x], scale[x]);
        }
      }
    }
    if (c.rotary_dim > 0)
      for (int s = 0; s < Sq; ++s)
        for (int h = 0; h < Hq; ++h) {
          const int64_t qi = ((int64_t(b) * Sq + s) * Hq + h) * D;
          const bool per_row = c.causal;
          rotate(&q[qi], start + (per_row ? s : 0), ref, scale);
          for (int x = 0; x < D; ++x)
            bad_q += x >= c.rotary_dim ? qr[qi + x] != q[qi + x] : !near(f(qr[qi + x]), ref[x], scale[x]);
        }
  }
  for (int64_t i = 0; i < cache_elems; ++i)
    if (!written[i]) bad_other += (k1[i] != k0[i]) + (v1[i] != v0[i]);
  EXPECT_EQ(bad_k, 0) << "new keys wrong (rotated beyond one rounding, or not copied bit for bit)";
  EXPECT_EQ(bad_v, 0) << "new values not copied bit for bit";
  EXPECT_EQ(bad_q, 0) << "rotated queries wrong";
  EXPECT_EQ(bad_other, 0) << "cache elements outside the new rows changed";
  EXPECT_EQ(bad_used, 0);
}

TEST(AppendKvGpu, DecodingStepGptNeoxRotary) {
  FA4_REQUIRE_GPU();
  Case c;
  c.name = "bf16 d128, one new row, lengths 0 / 17 / 299 (the last row), rotary 128, causal";
  c.batch = 3, c.heads_q = 8, c.heads_kv = 2, c.d = 128, c.capacity = 300;
  c.lengths = {0, 17, 299};
  c.rotary_dim = 128;
  c.causal = true;
  run_case(c);
}

TEST(AppendKvGpu, RowsPastTheCacheDroppedInterleavedRotary) {
  FA4_REQUIRE_GPU();
  Case c;
  c.name = "fp16 d64, four new rows, lengths 5 / 298 / 1000 / -3, rotary 32 interleaved, not causal";
  c.dtype = DType::kFP16;
  c.batch = 4, c.heads_q = 4, c.heads_kv = 4, c.d = 64, c.capacity = 300, c.seqlen_new = 4, c.seqlen_q = 4;
  c.lengths = {5, 298, 1000, -3};
  c.rotary_dim = 32;
  c.interleaved = true;
  run_case(c);
}

TEST(AppendKvGpu, PagedAcrossPagesOneLengthNoRotary) {
  FA4_REQUIRE_GPU();
  Case c;
  c.name = "bf16 d256, pages of 16, 20 new rows from 37 (three pages), BHSD new rows, no rotary";
  c.batch = 2, c.heads_kv = 3, c.heads_q = 3, c.d = 256, c.capacity = 200, c.seqlen_new = 20, c.seqlen_q = 20;
  c.length = 37;
  c.page_size = 16;
  c.bhsd_new = true;
  run_case(c);
}

TEST(AppendKvGpu, PagedRotaryPartOfTheHeadMoreQueriesThanNewRows) {
  FA4_REQUIRE_GPU();
  Case c;
  c.name = "bf16 d128, pages of 64, rotary 64 of 128, 2 new rows, 3 query rows each at its own position";
  c.batch = 3, c.heads_q = 6, c.heads_kv = 2, c.d = 128, c.capacity = 256, c.seqlen_new = 2, c.seqlen_q = 3;
  c.lengths = {63, 0, 254};
  c.rotary_dim = 64;
  c.causal = true;
  c.page_size = 64;
  run_case(c);
}

// Head dims that are not 64, 128 or 256 (fa4/attention.h's kMaxHeadDim rule): the append works on
// 16-byte units of the caller's head dim, rotary pairs within it.
TEST(AppendKvGpu, OtherHeadDims) {
  FA4_REQUIRE_GPU();
  Case c;
  c.name = "bf16 d96, rotary 96 (GPT-NeoX), 3 new rows, lengths 0 / 40 / 298";
  c.batch = 3, c.heads_q = 4, c.heads_kv = 2, c.d = 96, c.capacity = 300, c.seqlen_new = 3, c.seqlen_q = 3;
  c.lengths = {0, 40, 298};
  c.rotary_dim = 96;
  c.causal = true;
  run_case(c);
  Case i;
  i.name = "fp16 d40, rotary 32 interleaved, pages of 16, one new row";
  i.dtype = DType::kFP16;
  i.batch = 2, i.heads_q = 2, i.heads_kv = 2, i.d = 40, i.capacity = 100, i.page_size = 16;
  i.lengths = {15, 64};
  i.rotary_dim = 32;
  i.interleaved = true;
  run_case(i);
}

TEST(AppendKvGpu, NothingNewOnlyTheCounts) {
  FA4_REQUIRE_GPU();
  Case c;
  c.name = "no new rows: seqused_k the clamped lengths, the caches untouched";
  c.batch = 3, c.seqlen_new = 0, c.capacity = 100;
  c.lengths = {-4, 50, 101};
  run_case(c);
}

}  // namespace
