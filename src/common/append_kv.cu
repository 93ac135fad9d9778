// fa4::append_kv's kernel: new keys and values into a KV cache (contiguous or paged), the keys and
// the queries turned by rotary embedding on the way. A few MB at most a decoding step, so one
// grid-stride pass of 16-byte units: a unit is 8 elements of a row, or with GPT-NeoX rotary a pair
// of them half the rotary dims apart (one thread writes both, so a row rotated in place is safe).
#include "common/append_kv.h"

#include <algorithm>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace fa4::detail {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 4096;
constexpr int kUnit = 8;  // elements a 16-byte unit

template <class T>
struct Bits;
template <>
struct Bits<__nv_bfloat16> {
  using T2 = __nv_bfloat162;
  static __device__ float2 up(T2 x) { return __bfloat1622float2(x); }
  static __device__ T2 down(float2 x) { return __float22bfloat162_rn(x); }
};
template <>
struct Bits<__half> {
  using T2 = __half2;
  static __device__ float2 up(T2 x) { return __half22float2(x); }
  static __device__ T2 down(float2 x) { return __float22half2_rn(x); }
};

// 16 bytes as 4 pairs of floats, and back; 8 bytes as 2 pairs.
template <class T>
__device__ void unpack8(const uint4& u, float2 (&x)[4]) {
  const auto* h = reinterpret_cast<const typename Bits<T>::T2*>(&u);
#pragma unroll
  for (int m = 0; m < 4; ++m) x[m] = Bits<T>::up(h[m]);
}
template <class T>
__device__ uint4 pack8(const float2 (&x)[4]) {
  uint4 u;
  auto* h = reinterpret_cast<typename Bits<T>::T2*>(&u);
#pragma unroll
  for (int m = 0; m < 4; ++m) h[m] = Bits<T>::down(x[m]);
  return u;
}
template <class T>
__device__ void load4(const T* p, float2 (&x)[2]) {
  const uint2 u = *reinterpret_cast<const uint2*>(p);
  const auto* h = reinterpret_cast<const typename Bits<T>::T2*>(&u);
  x[0] = Bits<T>::up(h[0]);
  x[1] = Bits<T>::up(h[1]);
}

// x1' = x1 cos - x2 sin, x2' = x1 sin + x2 cos.
__device__ void turn(float& x1, float& x2, float c, float s) {
  const float a = x1, b = x2;
  x1 = a * c - b * s;
  x2 = a * s + b * c;
}

// A unit of a row, read before its position is known, so the read overlaps the lengths' (and the
// pages') loads: its first element c, its 8 elements, and with GPT-NeoX rotary its partner's.
struct Unit {
  int c;
  bool pair;
  uint4 x, y;
};

// Unit u of the row at src (half: the rotary dims' units a half, 0 for interleaved pairs, no
// rotary, or a value row).
template <class T>
__device__ Unit read_unit(const AppendParams& p, const T* src, int u, int half) {
  Unit w;
  w.c = (u < half ? u : u + half) * kUnit;
  w.pair = u < half;
  w.x = *reinterpret_cast<const uint4*>(src + w.c);
  if (w.pair) w.y = *reinterpret_cast<const uint4*>(src + w.c + p.rotary_dim / 2);
  return w;
}

// The unit into the row at dst, turned at position pos where it lies in the rotary dims (rotate:
// a key or query row).
template <class T>
__device__ void write_unit(const AppendParams& p, const Unit& w, T* dst, int64_t pos, bool rotate) {
  if (!rotate || w.c >= p.rotary_dim) {
    *reinterpret_cast<uint4*>(dst + w.c) = w.x;
    return;
  }
  pos = min(pos, int64_t(p.seqlen_ro) - 1);
  const int64_t row = pos * (p.rotary_dim / 2);
  const T* cs = static_cast<const T*>(p.cos) + row;
  const T* sn = static_cast<const T*>(p.sin) + row;
  float2 x[4];
  unpack8<T>(w.x, x);
  if (!w.pair) {  // interleaved pairs (2j, 2j + 1): j from c / 2
    float2 co[2], si[2];
    load4(cs + w.c / 2, co);
    load4(sn + w.c / 2, si);
    const float cf[4] = {co[0].x, co[0].y, co[1].x, co[1].y}, sf[4] = {si[0].x, si[0].y, si[1].x, si[1].y};
#pragma unroll
    for (int m = 0; m < 4; ++m) turn(x[m].x, x[m].y, cf[m], sf[m]);
  } else {  // pairs (j, j + rotary_dim / 2): this unit and the one half the rotary dims on
    float2 y[4], co[4], si[4];
    unpack8<T>(w.y, y);
    unpack8<T>(*reinterpret_cast<const uint4*>(cs + w.c), co);
    unpack8<T>(*reinterpret_cast<const uint4*>(sn + w.c), si);
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      turn(x[m].x, y[m].x, co[m].x, si[m].x);
      turn(x[m].y, y[m].y, co[m].y, si[m].y);
    }
    *reinterpret_cast<uint4*>(dst + w.c + p.rotary_dim / 2) = pack8<T>(y);
  }
  *reinterpret_cast<uint4*>(dst + w.c) = pack8<T>(x);
}

__device__ int64_t first_new_row(const AppendParams& p, int64_t b) {
  return p.cache_seqlens != nullptr ? max(p.cache_seqlens[b], 0) : p.cache_seqlen;
}

// The cache row of entry b's key at pos (pos < capacity).
template <class T>
__device__ T* cache_row(const AppendParams& p, void* base, const int64_t (&st)[3], int64_t b, int64_t pos, int h) {
  if (p.block_table == nullptr) return static_cast<T*>(base) + b * st[0] + pos * st[1] + h * st[2];
  int page = p.block_table[b * p.table_stride + pos / p.page_size];
  page = min(max(page, 0), p.num_pages - 1);
  return static_cast<T*>(base) + page * st[0] + (pos % p.page_size) * st[1] + h * st[2];
}

// Items [0, n_k): the new keys' units; [n_k, n_k + n_v): the values'; then the queries' (rotary).
// Each item reads its unit first, then the entry's length (the two loads in flight together),
// then the cos and sin rows and the page its position needs, then writes.
template <class T>
__global__ void __launch_bounds__(kThreads) append_kv_kernel(const AppendParams p, int64_t n_k, int64_t n_v,
                                                              int64_t n_all) {
  // The attention after it may launch now (the decoding kernel, its programmatic dependent, waits
  // for this grid to end before it reads anything: sm90/decode_kernel.cuh).
  cudaTriggerProgrammaticLaunchCompletion();
  const int64_t first = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (p.seqused_k != nullptr)
    for (int64_t b = first; b < p.batch; b += int64_t{gridDim.x} * blockDim.x)
      p.seqused_k[b] = int32_t(min(first_new_row(p, b) + p.seqlen_new, int64_t(p.capacity)));
  const int units_row = p.head_dim / kUnit;
  const int half = p.interleaved ? 0 : p.rotary_dim / (2 * kUnit);
  const int units_turned = units_row - half;  // units a row of k or q
  for (int64_t i = first; i < n_all; i += int64_t{gridDim.x} * blockDim.x) {
    if (i < n_k + n_v) {
      const bool value = i >= n_k;
      const int per_row = value ? units_row : units_turned;
      int64_t r = value ? i - n_k : i;
      const int u = int(r % per_row);
      r /= per_row;
      const int h = int(r % p.heads_kv);
      r /= p.heads_kv;
      const int64_t s = r % p.seqlen_new, b = r / p.seqlen_new;
      const int64_t* ns = value ? p.vn_stride : p.kn_stride;
      const T* src = static_cast<const T*>(value ? p.v_new : p.k_new) + b * ns[0] + s * ns[1] + h * ns[2];
      const Unit w = read_unit<T>(p, src, u, value ? 0 : half);
      const int64_t pos = first_new_row(p, b) + s;
      if (pos >= p.capacity) continue;
      T* dst = value ? cache_row<T>(p, p.v_cache, p.vc_stride, b, pos, h)
                     : cache_row<T>(p, p.k_cache, p.kc_stride, b, pos, h);
      write_unit<T>(p, w, dst, pos, !value);
    } else {
      int64_t r = i - n_k - n_v;
      const int u = int(r % units_turned);
      r /= units_turned;
      const int h = int(r % p.heads_q);
      r /= p.heads_q;
      const int64_t s = r % p.seqlen_q, b = r / p.seqlen_q;
      const T* src = static_cast<const T*>(p.q) + b * p.q_stride[0] + s * p.q_stride[1] + h * p.q_stride[2];
      const Unit w = read_unit<T>(p, src, u, half);
      T* dst = static_cast<T*>(p.q_rotated) + b * p.qr_stride[0] + s * p.qr_stride[1] + h * p.qr_stride[2];
      write_unit<T>(p, w, dst, first_new_row(p, b) + (p.q_per_row ? s : 0), true);
    }
  }
}

}  // namespace

cudaError_t launch_append_kv(const AppendParams& p, cudaStream_t stream) {
  const int64_t units_row = p.head_dim / kUnit;
  const int64_t units_turned = units_row - (p.interleaved ? 0 : p.rotary_dim / (2 * kUnit));
  const int64_t rows_kv = int64_t{p.batch} * p.seqlen_new * p.heads_kv;
  const int64_t n_k = rows_kv * units_turned, n_v = rows_kv * units_row;
  const int64_t n_q = p.rotary_dim > 0 ? int64_t{p.batch} * p.seqlen_q * p.heads_q * units_turned : 0;
  const int64_t n_all = n_k + n_v + n_q;
  const int64_t work = std::max<int64_t>(n_all, p.seqused_k != nullptr ? p.batch : 0);
  if (work == 0) return cudaSuccess;
  const auto blocks = static_cast<unsigned>(std::min((work + kThreads - 1) / kThreads, kMaxBlocks));
  if (p.dtype == DType::kFP16)
    append_kv_kernel<__half><<<blocks, kThreads, 0, stream>>>(p, n_k, n_v, n_all);
  else
    append_kv_kernel<__nv_bfloat16><<<blocks, kThreads, 0, stream>>>(p, n_k, n_v, n_all);
  return cudaGetLastError();
}

}  // namespace fa4::detail
