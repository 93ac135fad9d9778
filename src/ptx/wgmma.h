// Warpgroup matrix multiply (wgmma) on sm_90a: shared-memory descriptors and the async protocol.
// The instructions themselves are in wgmma_ops.h (generated). PTX ISA 9.7.15.
#pragma once

#include <cstdint>

#include "ptx/wgmma_ops.h"

namespace fa4::ptx::wgmma {

// Matrix descriptor for a tile in shared memory with 128-byte swizzle (PTX ISA 9.7.15.5.1):
// bits [13:0] start address >> 4, [29:16] leading byte offset >> 4, [45:32] stride byte offset >> 4,
// [63:62] swizzle mode (1 = 128B). Tiles are 1024-byte aligned so the base offset stays 0.
//   K-major operand:  SBO = 1024 (eight 128-byte rows); LBO unused.
//   MN-major operand: LBO = bytes between 64-element column blocks, SBO = 1024 (eight K rows).
__device__ __forceinline__ uint64_t desc_sw128(uint32_t smem_addr, uint32_t lbo_bytes,
                                               uint32_t sbo_bytes) {
  uint64_t d = 0;
  d |= static_cast<uint64_t>((smem_addr & 0x3FFFF) >> 4);
  d |= static_cast<uint64_t>((lbo_bytes >> 4) & 0x3FFF) << 16;
  d |= static_cast<uint64_t>((sbo_bytes >> 4) & 0x3FFF) << 32;
  d |= static_cast<uint64_t>(1) << 62;
  return d;
}

// A descriptor with its low word (start address, leading byte offset) replaced, and one moved by a
// byte offset inside shared memory. Start addresses stay below 2^18, so
// the 14-bit address field never carries into the next: a 32-bit add on the low word is enough.
__device__ __forceinline__ uint64_t desc_with_low(uint64_t desc, uint32_t lo) {
  return (desc & 0xFFFFFFFF00000000ull) | lo;
}
__device__ __forceinline__ uint64_t desc_advance(uint64_t desc, uint32_t byte_offset) {
  return desc_with_low(desc, static_cast<uint32_t>(desc) + (byte_offset >> 4));
}

// Byte offsets of k-step kk (16 elements of K) in a tile with 128-byte swizzle, for desc_advance.
// K-major operand: 64-column swizzle atoms of `rows` rows, four 32-byte steps to an atom.
constexpr int kmajor_step(int kk, int rows) { return (kk / 4) * rows * 128 + (kk % 4) * 32; }
// MN-major operand: 16 K rows of 128 bytes a step.
constexpr int mn_step(int kk) { return kk * 16 * 128; }

// wgmma.fence: orders register writes before the wgmma that reads them (9.7.15.6.1).
__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
// Closes the wgmma issued so far into a group (9.7.15.6.2).
__device__ __forceinline__ void commit_group() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
// Waits until at most N groups are pending (9.7.15.6.3).
template <int N>
__device__ __forceinline__ void wait_group() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// Pins registers at this point of the program: the compiler may not move their reads or writes
// across it. Used on accumulators and operands of in-flight wgmma after a wait.
template <int N>
__device__ __forceinline__ void pin(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N>
__device__ __forceinline__ void pin(uint32_t (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+r"(r[i])::"memory");
}

}  // namespace fa4::ptx::wgmma
