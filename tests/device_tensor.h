// Device tensors of 16-bit values for the GPU tests, in the layouts the API accepts.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "convert.h"
#include "fa4/attention.h"

#define CUDA_OK(x) ASSERT_EQ((x), cudaSuccess) << #x

namespace fa4_test {

inline constexpr uint16_t kPoison = 0xFFFF;  // NaN in both 16-bit types

enum class Layout { kBSHD, kBHSD, kPadded };  // kPadded: BSHD with a spare head and spare rows

// Device memory freed on scope exit.
struct DeviceBuffer {
  void* ptr = nullptr;
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { cudaFree(ptr); }
};

// A device tensor [batch][seq][heads][dim] of 16-bit values in one of the layouts.
struct DeviceTensor {
  DeviceBuffer buffer;
  fa4::TensorRef ref;
  int64_t b = 0, s = 0, h = 0, d = 0, elems = 0;  // elems: the whole allocation, padding included

  void make(Layout layout, int64_t b_, int64_t s_, int64_t h_, int64_t d_) {
    b = b_, s = s_, h = h_, d = d_;
    int64_t hs = h, ss = s;
    if (layout == Layout::kPadded) hs = h + 1, ss = s + 3;
    elems = b * ss * hs * d;
    CUDA_OK(cudaMalloc(&buffer.ptr, std::max<int64_t>(elems, 1) * 2));
    if (layout == Layout::kBHSD)
      ref = {buffer.ptr, hs * ss * d, d, ss * d};
    else
      ref = {buffer.ptr, ss * hs * d, hs * d, d};
  }
  int64_t offset(int64_t i, int64_t j, int64_t k) const {
    return i * ref.batch_stride + j * ref.seq_stride + k * ref.head_stride;
  }
  // Fills the tensor from contiguous BSHD values; padding holds NaN, so reading it would show.
  void upload(fa4::DType t, const std::vector<double>& bshd) {
    const std::vector<uint16_t> bits = fa4::ref::to_bits(t, bshd);
    std::vector<uint16_t> host(elems, 0x7FC0);
    for (int64_t i = 0; i < b; ++i)
      for (int64_t j = 0; j < s; ++j)
        for (int64_t k = 0; k < h; ++k) std::memcpy(&host[offset(i, j, k)], &bits[((i * s + j) * h + k) * d], d * 2);
    CUDA_OK(cudaMemcpy(buffer.ptr, host.data(), elems * 2, cudaMemcpyHostToDevice));
  }
  void poison() { CUDA_OK(cudaMemset(buffer.ptr, 0xFF, elems * 2)); }
  // The tensor as contiguous BSHD values, and the number of padding slots that lost their poison.
  void download(fa4::DType t, std::vector<double>* bshd, int64_t* padding_written) const {
    std::vector<uint16_t> host(elems);
    CUDA_OK(cudaMemcpy(host.data(), buffer.ptr, elems * 2, cudaMemcpyDeviceToHost));
    std::vector<char> inside(elems, 0);
    bshd->assign(b * s * h * d, 0.0);
    for (int64_t i = 0; i < b; ++i)
      for (int64_t j = 0; j < s; ++j)
        for (int64_t k = 0; k < h; ++k)
          for (int64_t x = 0; x < d; ++x) {
            inside[offset(i, j, k) + x] = 1;
            (*bshd)[((i * s + j) * h + k) * d + x] = fa4::ref::bits_to_float(t, host[offset(i, j, k) + x]);
          }
    *padding_written = 0;
    for (int64_t n = 0; n < elems; ++n) *padding_written += !inside[n] && host[n] != kPoison;
  }
};

}  // namespace fa4_test
