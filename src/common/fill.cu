// Grid-stride fill kernels behind fill.h: rare paths, written for clarity, not speed.
#include "common/fill.h"

#include <algorithm>

namespace fa4::detail {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 4096;

// One thread stores 16 zero bytes; rows are [batch, seq, heads] in that order.
__global__ void zero_rows(char* base, int64_t batch_stride, int64_t seq_stride,
                          int64_t head_stride, int64_t seq, int64_t heads, int64_t vecs_per_row,
                          int64_t total) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    int64_t r = i / vecs_per_row;
    const int64_t vec = i - r * vecs_per_row;
    const int64_t h = r % heads;
    r /= heads;
    const int64_t s = r % seq;
    const int64_t b = r / seq;
    char* p = base + b * batch_stride + s * seq_stride + h * head_stride + vec * 16;
    *reinterpret_cast<uint4*>(p) = make_uint4(0, 0, 0, 0);
  }
}

// The same, over the rows of [0, cu[0]) and [cu[batch], total) (as `total` rows of [heads, dim]).
__global__ void zero_rows_outside_kernel(char* base, int64_t row_stride, int64_t head_stride, const int* cu,
                                         int64_t batch, int64_t total, int64_t heads, int64_t vecs_per_row) {
  const int64_t lo = std::min<int64_t>(std::max(__ldg(cu), 0), total);
  const int64_t hi = std::min<int64_t>(std::max<int64_t>(__ldg(cu + batch), lo), total);
  const int64_t n = (lo + total - hi) * heads * vecs_per_row;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    int64_t r = i / vecs_per_row;
    const int64_t vec = i - r * vecs_per_row;
    const int64_t h = r % heads;
    r /= heads;
    if (r >= lo) r += hi - lo;
    *reinterpret_cast<uint4*>(base + r * row_stride + h * head_stride + vec * 16) = make_uint4(0, 0, 0, 0);
  }
}

// Element (o, h, i) of [outer, heads, inner] floats: per_head[h] (-inf where per_head is null).
__global__ void set_floats_by_head(float* data, int64_t outer, int64_t heads, int64_t inner, const float* per_head) {
  const int64_t n = outer * heads * inner;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    data[i] = per_head == nullptr ? -INFINITY : per_head[(i / inner) % heads];
}

unsigned blocks_for(int64_t work) {
  return static_cast<unsigned>(std::min((work + kThreads - 1) / kThreads, kMaxBlocks));
}

}  // namespace

cudaError_t zero_tensor(void* data, int elem_size, const int64_t stride[3], int64_t batch,
                        int64_t seq, int64_t heads, int64_t dim, cudaStream_t stream) {
  if (batch <= 0 || seq <= 0 || heads <= 0 || dim <= 0) return cudaSuccess;
  const int64_t row_bytes = dim * elem_size;
  const int64_t bs = stride[0] * elem_size, ss = stride[1] * elem_size, hs = stride[2] * elem_size;
  if (data == nullptr || reinterpret_cast<uintptr_t>(data) % 16 != 0 || row_bytes % 16 != 0 ||
      bs % 16 != 0 || ss % 16 != 0 || hs % 16 != 0)
    return cudaErrorInvalidValue;
  const int64_t vecs_per_row = row_bytes / 16;
  int64_t total = 0;
  if (__builtin_mul_overflow(batch, seq, &total) || __builtin_mul_overflow(total, heads, &total) ||
      __builtin_mul_overflow(total, vecs_per_row, &total))
    return cudaErrorInvalidValue;
  zero_rows<<<blocks_for(total), kThreads, 0, stream>>>(static_cast<char*>(data), bs, ss, hs, seq,
                                                        heads, vecs_per_row, total);
  return cudaGetLastError();
}

cudaError_t zero_rows_outside(void* data, int elem_size, const int64_t stride[3], const int* cu_seqlens, int64_t batch,
                              int64_t total, int64_t heads, int64_t dim, cudaStream_t stream) {
  if (batch <= 0 || total <= 0 || heads <= 0 || dim <= 0) return cudaSuccess;
  const int64_t row_bytes = dim * elem_size, ss = stride[1] * elem_size, hs = stride[2] * elem_size;
  if (data == nullptr || cu_seqlens == nullptr || reinterpret_cast<uintptr_t>(data) % 16 != 0 || row_bytes % 16 != 0 ||
      ss % 16 != 0 || hs % 16 != 0)
    return cudaErrorInvalidValue;
  int64_t work = 0;  // at most every row outside
  if (__builtin_mul_overflow(total, heads, &work) || __builtin_mul_overflow(work, row_bytes / 16, &work))
    return cudaErrorInvalidValue;
  // Usually no row is outside: a few blocks find that out; a grid-stride loop does the rest.
  zero_rows_outside_kernel<<<std::min(blocks_for(work), 264u), kThreads, 0, stream>>>(
      static_cast<char*>(data), ss, hs, cu_seqlens, batch, total, heads, row_bytes / 16);
  return cudaGetLastError();
}

cudaError_t fill_lse_by_head(float* lse, int64_t outer, int64_t heads, int64_t inner, const float* per_head,
                             cudaStream_t stream) {
  const int64_t n = outer * heads * inner;
  if (n <= 0) return cudaSuccess;
  if (lse == nullptr) return cudaErrorInvalidValue;
  set_floats_by_head<<<blocks_for(n), kThreads, 0, stream>>>(lse, outer, heads, inner, per_head);
  return cudaGetLastError();
}

}  // namespace fa4::detail
