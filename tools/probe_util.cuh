// What the kernel probes share (tools/sm90_fwd_probe.cu, sm90_bwd_probe.cu, sm90_section_sweep.cu,
// sm90_cta_ends.cu): a CUDA call that exits on failure, FA3-sized random inputs made on the device,
// and the forward's arguments for BSHD tensors.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "fa4/attention.h"

#define CK(x)                                                                                  \
  do {                                                                                         \
    const cudaError_t e_ = (x);                                                                \
    if (e_ != cudaSuccess) {                                                                   \
      std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__);     \
      std::exit(1);                                                                            \
    }                                                                                          \
  } while (0)

// Roughly standard-normal bf16 values from a hash (sum of four uniforms, rescaled), made on the
// device: timing runs need FA3-sized inputs, which the host would take seconds to draw.
__global__ inline void fill_normal_bf16(__nv_bfloat16* x, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 0x9E3779B1u ^ seed * 0x85EBCA77u ^ uint32_t(i >> 32) * 0xC2B2AE3Du;
    float acc = 0.0f;
    for (int k = 0; k < 4; ++k) {
      h ^= h >> 15; h *= 0x2C1B3C6Du; h ^= h >> 12; h *= 0x297A2D39u; h ^= h >> 15;
      acc += float(h >> 8) * (1.0f / 16777216.0f);
    }
    x[i] = __float2bfloat16((acc - 2.0f) * 1.7320508f);  // variance of the sum of 4 uniforms is 1/3
  }
}
inline void fill_device(void* dst, size_t n, uint32_t seed) {
  fill_normal_bf16<<<1024, 256>>>(static_cast<__nv_bfloat16*>(dst), n, seed);
  CK(cudaGetLastError());
}

// The forward's arguments for contiguous BSHD bf16 tensors of b x s x h x d (MHA, seqlen_q =
// seqlen_k = s), as the API takes them from a caller.
inline fa4::ForwardArgs bshd_forward_args(int b, int h, int s, int d, bool causal, void* q, void* k, void* v,
                                          void* o) {
  fa4::ForwardArgs a;
  a.problem.dtype = fa4::DType::kBF16;
  a.problem.batch = b;
  a.problem.seqlen_q = s;
  a.problem.seqlen_k = s;
  a.problem.heads_q = h;
  a.problem.heads_kv = h;
  a.problem.head_dim = d;
  a.problem.causal = causal;
  a.q = fa4::bshd(q, s, h, d);
  a.k = fa4::bshd(k, s, h, d);
  a.v = fa4::bshd(v, s, h, d);
  a.o = fa4::bshd(o, s, h, d);
  return a;
}
