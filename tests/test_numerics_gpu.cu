// The shared numerics on the device: exp2_poly and the conditional-rescale softmax step (with the
// software exp2) must give the host's results bit for bit. exp2_mufu is MUFU.EX2 on the device
// and std::exp2 on the host by design; its accuracy is measured, not compared bit for bit.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <limits>
#include <random>
#include <vector>

#include "fa4/numerics/exp2.h"
#include "fa4/numerics/online_softmax.h"
#include "fa4/numerics/softcap.h"
#include "gpu_guard.h"

namespace {

namespace nx = fa4::numerics;

#define FA4_CUDA_OK(expr) ASSERT_EQ(cudaSuccess, (expr)) << #expr

// A device array that frees itself.
template <class T>
struct DeviceArray {
  T* ptr = nullptr;
  size_t n = 0;
  explicit DeviceArray(size_t count) : n(count) {
    if (cudaMalloc(&ptr, sizeof(T) * (count ? count : 1)) != cudaSuccess) ptr = nullptr;
  }
  ~DeviceArray() { cudaFree(ptr); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  cudaError_t upload(const std::vector<T>& h) {
    return cudaMemcpy(ptr, h.data(), sizeof(T) * h.size(), cudaMemcpyHostToDevice);
  }
  cudaError_t download(std::vector<T>& h) const {
    h.resize(n);
    return cudaMemcpy(h.data(), ptr, sizeof(T) * n, cudaMemcpyDeviceToHost);
  }
};

unsigned grid_for(size_t n, unsigned threads) {
  return static_cast<unsigned>(std::min<size_t>((n + threads - 1) / threads, 1u << 16));
}

__global__ void exp2_poly_kernel(const float* x, uint32_t* out, size_t n) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x)
    out[i] = nx::float_bits(nx::exp2_poly(x[i]));
}

__global__ void exp2_mufu_kernel(const float* x, float* out, size_t n) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x)
    out[i] = nx::exp2_mufu(x[i]);
}

// Inputs over [-130, 1]: an even grid, every 257th float bit pattern, random bit patterns, and
// the special points.
std::vector<float> exp2_inputs() {
  std::vector<float> xs;
  constexpr int kGrid = 1 << 22;
  for (int i = 0; i <= kGrid; ++i) xs.push_back(static_cast<float>(-130.0 + 131.0 * i / kGrid));
  const uint32_t neg_end = nx::float_bits(-130.0f), pos_end = nx::float_bits(1.0f);
  for (uint64_t u = 0x80000000u; u <= neg_end; u += 257)
    xs.push_back(nx::bits_float(static_cast<uint32_t>(u)));
  for (uint32_t u = 0; u <= pos_end; u += 257) xs.push_back(nx::bits_float(u));
  std::mt19937 gen(11);
  for (int i = 0; i < (1 << 22); ++i) {
    const uint32_t u = gen();
    const uint32_t bits =
        (u & 1) ? 0x80000000u + u % (neg_end - 0x80000000u + 1) : (u >> 1) % (pos_end + 1);
    xs.push_back(nx::bits_float(bits));
  }
  const float inf = std::numeric_limits<float>::infinity();
  for (float x :
       {-inf, 0.0f, -0.0f, -126.5f, -127.0f, -127.5f, -128.0f, -126.0f, -1e30f, 1e-30f, -1e-30f,
        -std::numeric_limits<float>::max(), std::numeric_limits<float>::denorm_min(),
        -std::numeric_limits<float>::denorm_min(), 8.0f, 0.5f, -0.5f})
    xs.push_back(x);
  for (int j = -130; j <= 8; ++j) {
    const float x = static_cast<float>(j);
    xs.push_back(x);
    xs.push_back(std::nextafter(x, -inf));
    xs.push_back(std::nextafter(x, inf));
  }
  return xs;
}

TEST(NumericsGpu, Exp2PolyIsBitIdenticalToTheHost) {
  FA4_REQUIRE_GPU();
  const std::vector<float> xs = exp2_inputs();
  DeviceArray<float> dx(xs.size());
  DeviceArray<uint32_t> dy(xs.size());
  ASSERT_NE(dx.ptr, nullptr);
  ASSERT_NE(dy.ptr, nullptr);
  FA4_CUDA_OK(dx.upload(xs));
  exp2_poly_kernel<<<grid_for(xs.size(), 256), 256>>>(dx.ptr, dy.ptr, xs.size());
  FA4_CUDA_OK(cudaGetLastError());
  std::vector<uint32_t> dev;
  FA4_CUDA_OK(dy.download(dev));
  size_t mismatches = 0, first = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    if (nx::float_bits(nx::exp2_poly(xs[i])) != dev[i] && mismatches++ == 0) first = i;
  }
  std::cout << "[ exp2_poly gpu ] " << xs.size() << " inputs, " << mismatches << " mismatches\n";
  RecordProperty("inputs", std::to_string(xs.size()));
  EXPECT_EQ(mismatches, 0u) << "first at x = " << xs[first] << " (bits 0x" << std::hex
                            << nx::float_bits(xs[first]) << "): host 0x"
                            << nx::float_bits(nx::exp2_poly(xs[first])) << ", device 0x"
                            << dev[first];
}

TEST(NumericsGpu, Exp2PolyNanInputOnTheDevice) {
  // Outside the domain, documented rather than relied on: the device's canonical NaN
  // (0x7FFFFFFF) carries low exponent bits into the integer add, so NaN comes out as a large
  // finite number there, while the host keeps its NaN.
  FA4_REQUIRE_GPU();
  const std::vector<float> xs = {std::numeric_limits<float>::quiet_NaN()};
  DeviceArray<float> dx(1);
  DeviceArray<uint32_t> dy(1);
  FA4_CUDA_OK(dx.upload(xs));
  exp2_poly_kernel<<<1, 32>>>(dx.ptr, dy.ptr, 1);
  FA4_CUDA_OK(cudaGetLastError());
  std::vector<uint32_t> dev;
  FA4_CUDA_OK(dy.download(dev));
  std::cout << "[ exp2_poly gpu ] exp2_poly(NaN) on the device: bits 0x" << std::hex << dev[0]
            << std::dec << " = " << nx::bits_float(dev[0]) << "\n";
  RecordProperty("nan_result_bits", std::to_string(dev[0]));
  EXPECT_TRUE(std::isnan(nx::exp2_poly(xs[0])));
  EXPECT_EQ(dev[0], 0x7F7FFFFFu) << "exp2.h documents this value: update it";
}

TEST(NumericsGpu, Exp2MufuAccuracy) {
  // MUFU.EX2 (ex2.approx.ftz.f32) against float64, where the result is a normal float.
  FA4_REQUIRE_GPU();
  std::vector<float> xs;
  for (uint64_t u = 0x80000000u; u <= nx::float_bits(-126.0f); u += 61)
    xs.push_back(nx::bits_float(static_cast<uint32_t>(u)));
  for (uint32_t u = 0; u <= nx::float_bits(8.0f); u += 61) xs.push_back(nx::bits_float(u));
  DeviceArray<float> dx(xs.size()), dy(xs.size());
  FA4_CUDA_OK(dx.upload(xs));
  exp2_mufu_kernel<<<grid_for(xs.size(), 256), 256>>>(dx.ptr, dy.ptr, xs.size());
  FA4_CUDA_OK(cudaGetLastError());
  std::vector<float> dev;
  FA4_CUDA_OK(dy.download(dev));
  double worst = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    const double want = std::exp2(static_cast<double>(xs[i]));
    worst = std::max(worst, std::fabs(dev[i] - want) / want);
  }
  std::cout << "[ exp2_mufu gpu ] max relative error " << worst << " = 2^" << std::log2(worst)
            << "\n";
  RecordProperty("mufu_max_rel_err", std::to_string(worst));
  EXPECT_LT(worst, std::ldexp(1.0, -20));
}

// ---- one softmax row, the same code on host and device ---------------------------------------

// Products and sums that the device compiler must not fuse into FMAs (the host does not).
FA4_HD float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

FA4_HD float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

struct RowOut {
  float max, sum, acc, lse;
  int rescales;
};

// The kernel's recipe on one row of scores (log2 units) with the software exp2 throughout: fold
// each block's max, correct sum and O, add the block's exponentials.
FA4_HD RowOut softmax_row(const float* x, const float* v, int n, int block, float threshold) {
  nx::RowState st = nx::row_state_init();
  float acc = 0.0f;
  int rescales = 0;
  for (int c = 0; c < n; c += block) {
    const int end = c + block < n ? c + block : n;
    float bmax = -INFINITY;
    for (int j = c; j < end; ++j) bmax = x[j] > bmax ? x[j] : bmax;
    const nx::RescaleStep step = nx::rescale_step(st.max, bmax, threshold, nx::Exp2Poly{});
    rescales += step.rescaled ? 1 : 0;
    st.max = step.max;
    st.sum = mul_rn(st.sum, step.correction);
    acc = mul_rn(acc, step.correction);
    const float off = nx::exp_offset(st.max);
    for (int j = c; j < end; ++j) {
      const float p = nx::exp2_poly(x[j] - off);
      st.sum = add_rn(st.sum, p);
      acc = nx::fma_f32(p, v[j], acc);
    }
  }
  return {st.max, st.sum, acc, nx::row_lse(st), rescales};
}

struct Rows {
  std::vector<float> x, v, threshold;
  std::vector<int> begin, block;  // begin has one entry more than there are rows
};

__global__ void softmax_rows_kernel(const float* x, const float* v, const int* begin,
                                    const int* block, const float* threshold, RowOut* out,
                                    int rows) {
  for (int r = blockIdx.x * blockDim.x + threadIdx.x; r < rows; r += gridDim.x * blockDim.x)
    out[r] =
        softmax_row(x + begin[r], v + begin[r], begin[r + 1] - begin[r], block[r], threshold[r]);
}

Rows random_rows(int count) {
  Rows rows;
  std::mt19937_64 gen(21);
  std::normal_distribution<float> normal(0.0f, 4.0f);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  const int blocks[] = {1, 7, 16, 64, 128};
  rows.begin.push_back(0);
  for (int r = 0; r < count; ++r) {
    const int n = 1 + static_cast<int>(gen() % 300);
    const int kind = r % 6;
    for (int j = 0; j < n; ++j) {
      float x = normal(gen);
      if (kind == 1) x += 0.2f * j;                     // rising maxima
      if (kind == 2 && j == n / 2) x += 50.0f;          // a big jump
      if (kind == 3 && gen() % 10 == 0) x = -INFINITY;  // masked keys
      if (kind == 4) x = 1e4f * unit(gen);              // a huge range
      if (kind == 5 && r % 12 == 5) x = -INFINITY;      // fully masked rows
      rows.x.push_back(x);
      rows.v.push_back(unit(gen));
    }
    rows.begin.push_back(rows.begin.back() + n);
    rows.block.push_back(blocks[gen() % 5]);
    rows.threshold.push_back((r / 6) % 2 ? 0.0f : nx::kRescaleThresholdLog2);
  }
  return rows;
}

TEST(NumericsGpu, SoftmaxStepWithSoftwareExp2IsBitIdenticalToTheHost) {
  FA4_REQUIRE_GPU();
  const int count = 20000;
  const Rows rows = random_rows(count);
  DeviceArray<float> dx(rows.x.size()), dv(rows.v.size()), dt(rows.threshold.size());
  DeviceArray<int> db(rows.begin.size()), dblk(rows.block.size());
  DeviceArray<RowOut> dout(count);
  FA4_CUDA_OK(dx.upload(rows.x));
  FA4_CUDA_OK(dv.upload(rows.v));
  FA4_CUDA_OK(dt.upload(rows.threshold));
  FA4_CUDA_OK(db.upload(rows.begin));
  FA4_CUDA_OK(dblk.upload(rows.block));
  softmax_rows_kernel<<<grid_for(count, 128), 128>>>(dx.ptr, dv.ptr, db.ptr, dblk.ptr, dt.ptr,
                                                     dout.ptr, count);
  FA4_CUDA_OK(cudaGetLastError());
  std::vector<RowOut> dev;
  FA4_CUDA_OK(dout.download(dev));
  size_t mismatches = 0, lse_exact = 0, rescales = 0;
  for (int r = 0; r < count; ++r) {
    const int b = rows.begin[r];
    const RowOut h = softmax_row(&rows.x[b], &rows.v[b], rows.begin[r + 1] - b, rows.block[r],
                                 rows.threshold[r]);
    const RowOut& d = dev[r];
    const bool same = nx::float_bits(h.max) == nx::float_bits(d.max) &&
                      nx::float_bits(h.sum) == nx::float_bits(d.sum) &&
                      nx::float_bits(h.acc) == nx::float_bits(d.acc) && h.rescales == d.rescales;
    if (!same && mismatches++ == 0) {
      ADD_FAILURE() << "row " << r << ": host max/sum/acc/rescales " << h.max << " " << h.sum << " "
                    << h.acc << " " << h.rescales << ", device " << d.max << " " << d.sum << " "
                    << d.acc << " " << d.rescales;
    }
    rescales += h.rescales;
    // row_lse goes through log2f, whose host and device versions may differ in the last place.
    if (nx::float_bits(h.lse) == nx::float_bits(d.lse))
      ++lse_exact;
    else
      EXPECT_NEAR(h.lse, d.lse, 1e-6 * std::max(1.0f, std::fabs(h.lse))) << "row " << r;
  }
  std::cout << "[ softmax gpu ] " << count << " rows, " << rows.x.size() << " scores, " << rescales
            << " rescales: " << mismatches << " mismatches; LSE bit-identical in " << lse_exact
            << " rows\n";
  EXPECT_EQ(mismatches, 0u);
}

// softcap_from_exp (FMAs and a sign copy only) gives the host's score and slope bit for bit from
// the same e; e itself comes from MUFU on the device, so the kernels' capped scores differ from the
// host's only by MUFU.EX2's error, measured above.
__global__ void softcap_kernel(const float* x, const float* e, uint32_t* out, size_t n, float cap) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    const nx::CappedScore c = nx::softcap_from_exp(x[i], e[i], cap);
    out[2 * i] = nx::float_bits(c.score);
    out[2 * i + 1] = nx::float_bits(c.slope);
  }
}

TEST(NumericsGpu, SoftcapFromExpIsBitIdenticalToTheHost) {
  FA4_REQUIRE_GPU();
  std::vector<float> xs, es;
  constexpr int kGrid = 1 << 22;
  const float k = nx::softcap_two_log2e(0.125f / 50.0f);
  for (int i = 0; i <= kGrid; ++i) {
    const float x = static_cast<float>(-10000.0 + 20000.0 * i / kGrid);
    xs.push_back(x);
    es.push_back(std::exp2(-std::fabs(x) * k));
  }
  // e over every 61st float bit pattern of [0, 1], with both signs of x.
  for (uint32_t u = 0; u <= nx::float_bits(1.0f); u += 61) {
    xs.push_back((u & 1) ? -1.0f : 1.0f);
    es.push_back(nx::bits_float(u));
  }
  const float inf = std::numeric_limits<float>::infinity();
  for (float x : {inf, -inf, 0.0f, -0.0f}) xs.push_back(x), es.push_back(std::exp2(-std::fabs(x) * k));
  const size_t n = xs.size();
  DeviceArray<float> dx(n), de(n);
  DeviceArray<uint32_t> dy(2 * n);
  ASSERT_NE(dx.ptr, nullptr);
  ASSERT_NE(de.ptr, nullptr);
  ASSERT_NE(dy.ptr, nullptr);
  FA4_CUDA_OK(dx.upload(xs));
  FA4_CUDA_OK(de.upload(es));
  softcap_kernel<<<grid_for(n, 256), 256>>>(dx.ptr, de.ptr, dy.ptr, n, 50.0f);
  FA4_CUDA_OK(cudaGetLastError());
  std::vector<uint32_t> dev;
  FA4_CUDA_OK(dy.download(dev));
  size_t mismatches = 0, first = 0;
  for (size_t i = 0; i < n; ++i) {
    const nx::CappedScore h = nx::softcap_from_exp(xs[i], es[i], 50.0f);
    if ((nx::float_bits(h.score) != dev[2 * i] || nx::float_bits(h.slope) != dev[2 * i + 1]) && mismatches++ == 0)
      first = i;
  }
  std::cout << "[ softcap gpu ] " << n << " inputs, " << mismatches << " mismatches\n";
  EXPECT_EQ(mismatches, 0u) << "first at x = " << xs[first] << ", e = " << es[first];
}

}  // namespace
