// Tensor memory access (TMA): tiled tensor maps on the host, tile loads and stores on the device.
// Loads go through CCCL's cuda::ptx::cp_async_bulk_tensor (PTX ISA 9.7.9.25).
#pragma once

#include <cstdint>
#include <initializer_list>

#include <cuda.h>

#if defined(__CUDACC__)
#include <cuda/ptx>
#endif

namespace fa4::ptx {

// Encodes a map over a rank-`rank` tensor (2 to 5 dims, d0 contiguous) of 16-bit elements, read
// in boxes of box[0] x ... x box[rank - 1] with 128-byte swizzle; out-of-range elements read as
// zero. strides_bytes are those of dims 1..rank-1. Returns a CUDA driver error code (0 = success).
int make_tensor_map_16bit_sw128(CUtensorMap* map, const void* base, int rank, const uint64_t* dims,
                                const uint64_t* strides_bytes, const uint32_t* box);

// The same for 8-bit elements (fp8) with a swizzle of 64 or 128 bytes (the box's inner extent at
// most that many bytes).
int make_tensor_map_8bit(CUtensorMap* map, const void* base, int rank, const uint64_t* dims,
                         const uint64_t* strides_bytes, const uint32_t* box, int swizzle_bytes);
// A tiled map's geometry, before encoding: dims (innermost first), the byte strides of dims
// 1..rank-1 (dim 0's elements are 2 bytes apart), and the box. Kept apart from the encoding so
// that tests can check on the CPU which bytes a box covers.
struct TensorMapSpec {
  int rank = 0;
  uint64_t dims[5] = {};
  uint64_t strides_bytes[4] = {};
  uint32_t box[5] = {};
  // Byte offset from the base of the element at coordinates c (innermost first, rank of them).
  uint64_t offset(std::initializer_list<uint64_t> c) const {
    uint64_t off = 0;
    int i = 0;
    for (const uint64_t x : c) off += i == 0 ? x * 2 : x * strides_bytes[i - 1], ++i;
    return off;
  }
};

// A [batch][seq][heads][dim] tensor (element strides [batch, seq, head], dim contiguous) as a map
// over (dim, seq, heads, batch), read in boxes of 64 columns x box_rows rows.
inline TensorMapSpec bshd_spec(const int64_t stride[3], int batch, int seqlen, int heads, int head_dim, int box_rows) {
  return {4,
          {uint64_t(head_dim), uint64_t(seqlen), uint64_t(heads), uint64_t(batch)},
          {uint64_t(stride[1]) * 2, uint64_t(stride[2]) * 2, uint64_t(stride[0]) * 2},
          {64, uint32_t(box_rows), 1, 1}};
}

// The same tensor as a map over (64 columns, seq, head_dim / 64 column blocks, heads, batch), read in
// boxes of box_rows rows of box_blocks column blocks (0: all): one box lands as its column blocks
// one after another, each box_rows x 128 bytes, the layout of that many boxes of bshd_spec's, from
// one TMA operation. (The column blocks' stride, 128 bytes, is below the rows'.)
inline TensorMapSpec bshd_folded_spec(const int64_t stride[3], int batch, int seqlen, int heads, int head_dim,
                                      int box_rows, int box_blocks = 0) {
  return {5,
          {64, uint64_t(seqlen), uint64_t(head_dim / 64), uint64_t(heads), uint64_t(batch)},
          {uint64_t(stride[1]) * 2, 128, uint64_t(stride[2]) * 2, uint64_t(stride[0]) * 2},
          {64, uint32_t(box_rows), uint32_t(box_blocks > 0 ? box_blocks : head_dim / 64), 1, 1}};
}

// The same tensor with each query group of 2^fold heads folded into rows (FwdParams::fold): a map
// over (dim, heads, seq, batch) read in boxes of 64 columns x 2^fold heads x (box_rows >> fold)
// queries, so that box row r is query r >> fold of the group's head r & (2^fold - 1), the layout of
// bshd_spec's box of box_rows rows. Coordinates (column, group's first head, first query, batch).
// chunked: (64, heads, seq, head_dim / 64 column blocks, batch) instead, each box every column
// block (bshd_folded_spec's layout), at (0, first head, first query, 0, batch).
inline TensorMapSpec bshd_query_group_spec(const int64_t stride[3], int batch, int seqlen, int heads, int head_dim,
                                           int box_rows, int fold, bool chunked) {
  const uint32_t group = 1u << fold, queries = uint32_t(box_rows) >> fold;
  if (chunked)
    return {5,
            {64, uint64_t(heads), uint64_t(seqlen), uint64_t(head_dim / 64), uint64_t(batch)},
            {uint64_t(stride[2]) * 2, uint64_t(stride[1]) * 2, 128, uint64_t(stride[0]) * 2},
            {64, group, queries, uint32_t(head_dim / 64), 1}};
  return {4,
          {uint64_t(head_dim), uint64_t(heads), uint64_t(seqlen), uint64_t(batch)},
          {uint64_t(stride[2]) * 2, uint64_t(stride[1]) * 2, uint64_t(stride[0]) * 2},
          {64, group, queries, 1}};
}

inline int make_tensor_map_16bit_sw128(CUtensorMap* map, const void* base, const TensorMapSpec& m) {
  return make_tensor_map_16bit_sw128(map, base, m.rank, m.dims, m.strides_bytes, m.box);
}

inline int map_bshd_16bit_sw128(CUtensorMap* map, const void* base, const int64_t stride[3], int batch,
                                int seqlen, int heads, int head_dim, int box_rows) {
  return make_tensor_map_16bit_sw128(map, base, bshd_spec(stride, batch, seqlen, heads, head_dim, box_rows));
}
inline int map_bshd_16bit_sw128_folded(CUtensorMap* map, const void* base, const int64_t stride[3], int batch,
                                       int seqlen, int heads, int head_dim, int box_rows, int box_blocks = 0) {
  return make_tensor_map_16bit_sw128(
      map, base, bshd_folded_spec(stride, batch, seqlen, heads, head_dim, box_rows, box_blocks));
}

#if defined(__CUDACC__)
__device__ __forceinline__ void prefetch_tensor_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// Loads one box at coordinates (c0, c1, c2, c3) into shared memory; completes on `bar`.
__device__ __forceinline__ void tma_load_4d(void* smem_dst, const CUtensorMap* map, uint64_t* bar,
                                            int c0, int c1, int c2, int c3) {
  const int32_t coords[4] = {c0, c1, c2, c3};
  cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_shared, cuda::ptx::space_global, smem_dst, map,
                                  coords, bar);
}

// Loads one box of a rank-5 map at coordinates (c0, ..., c4); completes on `bar`.
__device__ __forceinline__ void tma_load_5d(void* smem_dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1,
                                            int c2, int c3, int c4) {
  const int32_t coords[5] = {c0, c1, c2, c3, c4};
  cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_shared, cuda::ptx::space_global, smem_dst, map,
                                  coords, bar);
}

// tma_load_5d into the same shared-memory offset of every CTA in `cta_mask` (as tma_load_4d_multicast).
__device__ __forceinline__ void tma_load_5d_multicast(void* smem_dst, const CUtensorMap* map, uint64_t* bar, int c0,
                                                      int c1, int c2, int c3, int c4, uint16_t cta_mask) {
  const int32_t coords[5] = {c0, c1, c2, c3, c4};
  cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_cluster, cuda::ptx::space_global, smem_dst, map,
                                  coords, bar, cta_mask);
}

// Loads one box into the same shared-memory offset of every CTA in `cta_mask` (cluster ranks);
// each destination's mbarrier at `bar`'s offset receives the box's bytes.
__device__ __forceinline__ void tma_load_4d_multicast(void* smem_dst, const CUtensorMap* map, uint64_t* bar,
                                                      int c0, int c1, int c2, int c3, uint16_t cta_mask) {
  const int32_t coords[4] = {c0, c1, c2, c3};
  cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_cluster, cuda::ptx::space_global, smem_dst, map,
                                  coords, bar, cta_mask);
}

// A policy of evict_first for every line of a transfer (PTX ISA 9.7.9.17, createpolicy), for the
// *_hint load and store below: lines read or written once go first, so those read again stay.
__device__ __forceinline__ uint64_t l2_policy_evict_first() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}

// tma_load_4d with an L2 eviction policy (`.L2::cache_hint`, which CCCL's wrapper does not take).
__device__ __forceinline__ void tma_load_4d_hint(void* smem_dst, const CUtensorMap* map, uint64_t* bar,
                                                 int c0, int c1, int c2, int c3, uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cta.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1, {%2, %3, %4, %5}], [%6], %7;"
      :
      : "r"(uint32_t(__cvta_generic_to_shared(smem_dst))), "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3),
        "r"(uint32_t(__cvta_generic_to_shared(bar))), "l"(policy)
      : "memory");
}

// tma_load_5d with an L2 eviction policy.
__device__ __forceinline__ void tma_load_5d_hint(void* smem_dst, const CUtensorMap* map, uint64_t* bar, int c0,
                                                 int c1, int c2, int c3, int c4, uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.5d.shared::cta.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1, {%2, %3, %4, %5, %6}], [%7], %8;"
      :
      : "r"(uint32_t(__cvta_generic_to_shared(smem_dst))), "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4),
        "r"(uint32_t(__cvta_generic_to_shared(bar))), "l"(policy)
      : "memory");
}

// Stores one box from shared memory at coordinates (c0, c1, c2, c3); joins the bulk group.
__device__ __forceinline__ void tma_store_4d(const CUtensorMap* map, const void* smem_src, int c0,
                                             int c1, int c2, int c3) {
  const int32_t coords[4] = {c0, c1, c2, c3};
  cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_global, cuda::ptx::space_shared, map, coords,
                                  smem_src);
}
// tma_store_4d with an L2 eviction policy.
__device__ __forceinline__ void tma_store_4d_hint(const CUtensorMap* map, const void* smem_src, int c0, int c1,
                                                  int c2, int c3, uint64_t policy) {
  asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.tile.bulk_group.L2::cache_hint"
               " [%0, {%1, %2, %3, %4}], [%5], %6;"
               :
               : "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(uint32_t(__cvta_generic_to_shared(smem_src))),
                 "l"(policy)
               : "memory");
}
// Stores one box of a rank-5 map from shared memory at coordinates (c0, ..., c4); joins the bulk group.
__device__ __forceinline__ void tma_store_5d(const CUtensorMap* map, const void* smem_src, int c0, int c1, int c2,
                                             int c3, int c4) {
  const int32_t coords[5] = {c0, c1, c2, c3, c4};
  cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_global, cuda::ptx::space_shared, map, coords,
                                  smem_src);
}
// tma_store_5d with an L2 eviction policy.
__device__ __forceinline__ void tma_store_5d_hint(const CUtensorMap* map, const void* smem_src, int c0, int c1,
                                                  int c2, int c3, int c4, uint64_t policy) {
  asm volatile("cp.async.bulk.tensor.5d.global.shared::cta.tile.bulk_group.L2::cache_hint"
               " [%0, {%1, %2, %3, %4, %5}], [%6], %7;"
               :
               : "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4),
                 "r"(uint32_t(__cvta_generic_to_shared(smem_src))), "l"(policy)
               : "memory");
}
__device__ __forceinline__ void tma_store_commit() { cuda::ptx::cp_async_bulk_commit_group(); }
// Waits until the committed stores have finished reading shared memory.
__device__ __forceinline__ void tma_store_wait_read() {
  cuda::ptx::cp_async_bulk_wait_group_read(cuda::ptx::n32_t<0>{});
}
// Waits until the committed stores are complete.
__device__ __forceinline__ void tma_store_wait() {
  cuda::ptx::cp_async_bulk_wait_group(cuda::ptx::n32_t<0>{});
}
#endif

}  // namespace fa4::ptx
