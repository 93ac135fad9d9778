// Hopper calibration microbenchmarks for the scheduler's sm90 graphs (scheduler/graphs/sm90_*.graph).
//
// Measures, in SM clock cycles (clock64 inside the kernels):
//   wgmma m64nNk16 bf16 (N = 64, 128, 256): latency of one dependent wgmma, the issue rate of one
//     warpgroup chaining into one accumulator, and the tensor-core rate with two warpgroups;
//   TMA 2D tile loads (64x64 and 128x64 bf16, 128B swizzle): latency from L2 and from DRAM, and
//     bytes per clock for one SM alone and per SM with every SM loading the same (L2-resident) data;
//   the backward's TMA traffic (scheduler/graphs/sm90_bwd*.graph): the cost of one box of 8 to
//     64 KB, rank 2 or with the 64-column blocks folded into a third box dimension; bulk copies of
//     256 B to 1 KB; bulk reductions (.add.f32) of a 16 KB stage; and one dK/dV step's mix of
//     them as each head dim issues it, shipped and with folded boxes and one bulk copy;
//   exp2 throughput per SM per clock: MUFU ex2.approx, fa4's polynomial (include/fa4/numerics/
//     exp2.h), and mixes, each with one FADD per element as in DESIGN.md §3; the packed forms
//     ex2.approx.f16x2 and ex2.approx.ftz.bf16x2 (elements per clock) and their largest relative
//     error over every 16-bit argument in [-24, 0];
//   the latency of one warpgroup's online softmax of a 64x128 block of S held in registers (the
//     forward kernel's: row max, rescale decision, 2^x on MUFU, row sums, P packed to bf16);
//   hand-off latency between two warps: mbarrier arrive -> try_wait, and named barrier
//     bar.arrive -> bar.sync;
//   the SM clock under sustained tensor-core load (to turn a kernel's time into cycles);
//   with `fp8`: e4m3 wgmma m64nNk32 (S's SS form at N = 64 and 128, P V's RS form with A from
//     registers at N = 64, 128, 256) beside bf16's m64n128k16 SS and RS in the same run, for
//     scheduler/graphs/sm90_fwd_fp8.graph (whose GEMM figures are assumed until this runs).
// Prints one JSON object on stdout.
//
// Build: nvcc -O3 -std=c++20 -gencode=arch=compute_90a,code=sm_90a -Iinclude -Isrc \
//          bench/calibrate/calibrate_sm90.cu -o calibrate_sm90
// Run:   ./calibrate_sm90 > bench/results/calibrate_sm90_<gpu>.json   (`./calibrate_sm90 exp2`, `bwd` or `fp8`: that section only)
#include <cuda.h>  // CUtensorMap and its enums only: the encoder comes through the runtime
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cuda/ptx>
#include <string>
#include <utility>
#include <vector>

#include <cuda_bf16.h>

#include "fa4/numerics/exp2.h"
#include "ptx/sync.h"
#include "ptx/wgmma.h"
#include "sm90/softmax.cuh"

#define CHECK(call)                                                                       \
  do {                                                                                    \
    cudaError_t e_ = (call);                                                              \
    if (e_ != cudaSuccess) {                                                              \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,                   \
                   cudaGetErrorString(e_));                                               \
      std::exit(1);                                                                       \
    }                                                                                     \
  } while (0)

namespace cptx = cuda::ptx;
namespace fptx = fa4::ptx;
namespace wg = fa4::ptx::wgmma;

// ------------------------------------------------------------------------------------------------
// Device helpers
// ------------------------------------------------------------------------------------------------

// Dynamic shared memory rounded up to 1024 bytes (128B-swizzled tiles need it).
__device__ __forceinline__ unsigned char* smem_base() {
  extern __shared__ unsigned char dyn_smem[];
  const uint32_t a = fptx::smem_addr(dyn_smem);
  return dyn_smem + ((1024 - (a & 1023)) & 1023);
}

// The kernel's wgmma wrappers (src/ptx/wgmma.h): a K-major, 128B-swizzled operand descriptor.
__device__ __forceinline__ uint64_t smem_desc(const void* p) {
  return wg::desc_sw128(fptx::smem_addr(p), 16, 1024);
}

// PTX ISA, "Special Registers: %globaltimer": nanoseconds, to turn cycles into a clock rate.
__device__ __forceinline__ long long globaltimer_ns() {
  long long t;
  asm volatile("mov.u64 %0, %globaltimer;\n" : "=l"(t));
  return t;
}

// ------------------------------------------------------------------------------------------------
// wgmma
// ------------------------------------------------------------------------------------------------

constexpr int kWgmmaSmem = 8192 + 256 * 128 + 1024;  // A 64x64, B 256x64 (bf16, 128 B rows)

__device__ void fill_operands(unsigned char* base, int bytes) {
  uint16_t* p = reinterpret_cast<uint16_t*>(base);
  for (int i = threadIdx.x; i < bytes / 2; i += blockDim.x)
    p[i] = 0x3C00 + static_cast<uint16_t>((i * 37) & 0x3F);  // bf16 values near 0.008..0.01
  cptx::fence_proxy_async(cptx::space_shared);  // generic-proxy writes, read by the async proxy
  __syncthreads();
}

template <int N>
__device__ float acc_sum(const float (&d)[N / 2]) {
  float s = 0;
#pragma unroll
  for (int i = 0; i < N / 2; ++i) s += d[i];
  return s;
}

// One wgmma of each form, accumulating: S's (A and B from shared memory, K-major; bf16 m64nNk16,
// the default) and P V's (A from registers, B K-major for e4m3, MN-major for bf16 as the 16-bit
// kernels' V), bf16 or e4m3 (m64nNk32). kFlop: its multiply-adds x 2.
template <int N, bool kRs = false, bool kE4M3 = false>
struct WgmmaForm {
  static constexpr int kN = N;
  static constexpr double kFlop = 2.0 * 64 * N * (kE4M3 ? 32 : 16);
  __device__ static void issue(float (&d)[N / 2], uint64_t a, const uint32_t (&ar)[4], uint64_t b) {
    if constexpr (kE4M3) {
      if constexpr (kRs) wg::mma_rs_kb<N, wg::Type::kE4M3>(d, ar, b, 1);
      else wg::mma_ss<N, wg::Type::kE4M3>(d, a, b, 1);
    } else {
      if constexpr (kRs) wg::mma_rs<N, wg::Type::kBF16>(d, ar, b, 1);
      else wg::mma_ss<N, wg::Type::kBF16>(d, a, b, 1);
    }
  }
};

// The A registers of the forms from registers: finite in both types.
__device__ __forceinline__ void fill_a_regs(uint32_t (&ar)[4]) {
  ar[0] = 0x3C3C3C3Cu ^ threadIdx.x, ar[1] = 0x3C3C3C3Cu, ar[2] = 0x3B3C3B3Cu, ar[3] = 0x3C3B3C3Bu;
}

// One warpgroup. out[0]: cycles of `iters` wgmmas each waited for (latency);
// out[1]: cycles of `iters` wgmmas chained into one accumulator, one wait at the end (issue rate).
template <class F>
__global__ void __launch_bounds__(128, 1) wgmma_latency(long long* out, float* sink, int iters) {
  unsigned char* base = smem_base();
  fill_operands(base, 8192 + F::kN * 128);
  const uint64_t a = smem_desc(base), b = smem_desc(base + 8192);
  uint32_t ar[4];
  fill_a_regs(ar);
  float d[F::kN / 2];
#pragma unroll
  for (int i = 0; i < F::kN / 2; ++i) d[i] = 0.f;
  wg::fence();
  for (int i = 0; i < 8; ++i) {  // warm-up
    F::issue(d, a, ar, b);
    wg::commit_group();
    wg::wait_group<0>();
  }
  const long long t0 = clock64();
  for (int i = 0; i < iters; ++i) {
    F::issue(d, a, ar, b);
    wg::commit_group();
    wg::wait_group<0>();
  }
  const long long t1 = clock64();
  for (int i = 0; i < iters; ++i) F::issue(d, a, ar, b);
  wg::commit_group();
  wg::wait_group<0>();
  const long long t2 = clock64();
  if (threadIdx.x == 0) {
    out[0] = t1 - t0;
    out[1] = t2 - t1;
  }
  sink[threadIdx.x] = acc_sum<F::kN>(d);
}

// kWarpgroups warpgroups per CTA, one CTA per SM, each chaining `iters` wgmmas in groups of 16
// with at most two groups in flight. out[block]: cycles from the first issue to the last result;
// ns[block]: the same interval in nanoseconds (the SM clock under tensor load = cycles / ns).
template <class F, int kWarpgroups>
__global__ void __launch_bounds__(128 * kWarpgroups, 1)
    wgmma_throughput(long long* out, long long* ns, float* sink, int iters) {
  unsigned char* base = smem_base();
  fill_operands(base, 8192 + F::kN * 128);
  const uint64_t a = smem_desc(base), b = smem_desc(base + 8192);
  uint32_t ar[4];
  fill_a_regs(ar);
  float d[F::kN / 2];
#pragma unroll
  for (int i = 0; i < F::kN / 2; ++i) d[i] = 0.f;
  wg::fence();
  __syncthreads();
  const long long n0 = globaltimer_ns();
  const long long t0 = clock64();
  for (int i = 0; i < iters; i += 16) {
#pragma unroll
    for (int k = 0; k < 16; ++k) F::issue(d, a, ar, b);
    wg::commit_group();
    wg::wait_group<1>();
  }
  wg::wait_group<0>();
  __syncthreads();
  const long long t1 = clock64();
  const long long n1 = globaltimer_ns();
  if (threadIdx.x == 0) {
    out[blockIdx.x] = t1 - t0;
    ns[blockIdx.x] = n1 - n0;
  }
  sink[blockIdx.x * blockDim.x + threadIdx.x] = acc_sum<F::kN>(d);
}

// ------------------------------------------------------------------------------------------------
// The forward kernel's d128 GEMMs per 128x128 K/V block, by operand path
// ------------------------------------------------------------------------------------------------

// What each warpgroup issues per K/V block (two warpgroups, 64 query rows each, as in the kernel):
enum GemmMix : int {
  // The S chains of the first mixes start from zero and are overwritten before anything reads
  // them; they time faster than the tensor core's peak (s_ss_x2 ~531 cycles, not 2048), so part of
  // that work is not done (ptxas drops one chain of s_ss_x2 outright). Kept as the warning; the
  // *_accumulating mixes below keep every result live and are the ones to compare.
  kMixS2 = 0,    // S = Q K^T twice (SS, both K-major)
  kMixSPvRs,     // S, then O += P V with P from registers and V MN-major: the kernel's pair
  kMixPvRs2,     // P V from registers twice
  kMixSPvSs,     // S, then P V with P from shared memory (K-major) and V MN-major
  kMixPvSs2,     // P V from shared memory twice
  kMixPvRsKb2,   // P from registers against a K-major B, twice (is it the transposed B?)
  kMixSAcc2,     // S twice, every wgmma accumulating (no chain starts from zero)
  kMixSAccPvRs,  // S accumulating, then P V from registers
  kMixSAccPvSs,  // S accumulating, then P V from shared memory
  kMixCount
};
constexpr const char* kMixNames[kMixCount] = {"s_ss_x2", "s_ss_then_pv_rs", "pv_rs_x2", "s_ss_then_pv_ss", "pv_ss_x2",
                                              "pv_rs_kmajor_b_x2", "s_ss_accumulating_x2", "s_ss_accumulating_then_pv_rs",
                                              "s_ss_accumulating_then_pv_ss"};
// Q [2 chunks][128][64], K and V likewise, P [2 warpgroups][2 chunks][64][64]: 128 KB.
constexpr int kMixSmem = 4 * 32768 + 1024;

// Random bf16 in [-1, 1) (switching as in attention, not the near-constant operands above).
__device__ void fill_random(unsigned char* base, int bytes) {
  uint16_t* p = reinterpret_cast<uint16_t*>(base);
  for (int i = threadIdx.x; i < bytes / 2; i += blockDim.x) {
    uint32_t h = uint32_t(i) * 0x9E3779B1u;
    h ^= h >> 15; h *= 0x2C1B3C6Du; h ^= h >> 12;
    const __nv_bfloat16 v = __float2bfloat16(float(h >> 8) * (2.0f / 16777216.0f) - 1.0f);
    p[i] = *reinterpret_cast<const uint16_t*>(&v);
  }
  cptx::fence_proxy_async(cptx::space_shared);
  __syncthreads();
}

// One K/V block's GEMMs of warpgroup `w` into s / o (the kernel's descriptors and offsets).
template <int kMix>
__device__ __forceinline__ void mix_block(unsigned char* base, int w, float (&s)[64], float (&o)[64],
                                          const uint32_t (&pf)[32]) {
  const uint64_t q = wg::desc_sw128(fptx::smem_addr(base) + w * 64 * 128, 16, 1024);
  const uint64_t k = wg::desc_sw128(fptx::smem_addr(base + 32768), 16, 1024);
  const uint64_t v = wg::desc_sw128(fptx::smem_addr(base + 65536), 128 * 128, 1024);
  const uint64_t pk = wg::desc_sw128(fptx::smem_addr(base + 98304 + w * 16384), 16, 1024);
  constexpr bool kAcc = kMix == kMixSAcc2 || kMix == kMixSAccPvRs || kMix == kMixSAccPvSs;
  auto gemm_s = [&] {
#pragma unroll
    for (int kk = 0; kk < 8; ++kk)
      wg::mma_ss<128, wg::Type::kBF16>(s, wg::desc_advance(q, (kk / 4) * 128 * 128 + (kk % 4) * 32),
                                       wg::desc_advance(k, (kk / 4) * 128 * 128 + (kk % 4) * 32), kAcc || kk > 0);
  };
  auto gemm_pv_rs = [&] {
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) {
      const uint32_t a[4] = {pf[4 * kk], pf[4 * kk + 1], pf[4 * kk + 2], pf[4 * kk + 3]};
      wg::mma_rs<128, wg::Type::kBF16>(o, a, wg::desc_advance(v, kk * 16 * 128), 1);
    }
  };
  auto gemm_pv_ss = [&] {
#pragma unroll
    for (int kk = 0; kk < 8; ++kk)
      wg::mma_ss_tb<128, wg::Type::kBF16>(o, wg::desc_advance(pk, (kk / 4) * 64 * 128 + (kk % 4) * 32),
                                          wg::desc_advance(v, kk * 16 * 128), 1);
  };
  auto gemm_pv_rs_kb = [&] {
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) {
      const uint32_t a[4] = {pf[4 * kk], pf[4 * kk + 1], pf[4 * kk + 2], pf[4 * kk + 3]};
      wg::mma_rs_kb<128, wg::Type::kBF16>(o, a, wg::desc_advance(k, (kk / 4) * 128 * 128 + (kk % 4) * 32), 1);
    }
  };
  if constexpr (kMix == kMixS2) { gemm_s(); gemm_s(); }
  if constexpr (kMix == kMixSPvRs) { gemm_s(); gemm_pv_rs(); }
  if constexpr (kMix == kMixPvRs2) { gemm_pv_rs(); gemm_pv_rs(); }
  if constexpr (kMix == kMixSPvSs) { gemm_s(); gemm_pv_ss(); }
  if constexpr (kMix == kMixPvSs2) { gemm_pv_ss(); gemm_pv_ss(); }
  if constexpr (kMix == kMixPvRsKb2) { gemm_pv_rs_kb(); gemm_pv_rs_kb(); }
  if constexpr (kMix == kMixSAcc2) { gemm_s(); gemm_s(); }
  if constexpr (kMix == kMixSAccPvRs) { gemm_s(); gemm_pv_rs(); }
  if constexpr (kMix == kMixSAccPvSs) { gemm_s(); gemm_pv_ss(); }
}

// A warpgroup's registers for mix_block: S and O zeroed, P a fixed pattern of bf16 pairs near 1.
__device__ __forceinline__ void mix_operands(float (&s)[64], float (&o)[64], uint32_t (&pf)[32]) {
#pragma unroll
  for (int i = 0; i < 64; ++i) s[i] = o[i] = 0.f;
#pragma unroll
  for (int i = 0; i < 32; ++i) pf[i] = 0x3C003C00u ^ (uint32_t(threadIdx.x * 977 + i * 131) & 0x007F007Fu);
}

// Two warpgroups a CTA, one CTA an SM, each issuing `iters` K/V blocks of its mix, two blocks in
// flight. out[block]: cycles for all of them (ideal: 2 x 16 x 64 = 2048 a block for every mix).
template <int kMix>
__global__ void __launch_bounds__(256, 1) gemm_mix(long long* out, float* sink, int iters) {
  unsigned char* base = smem_base();
  fill_random(base, 4 * 32768);
  const int w = threadIdx.x / 128;
  float s[64], o[64];
  uint32_t pf[32];
  mix_operands(s, o, pf);
  wg::fence();
  __syncthreads();
  const long long t0 = clock64();
  for (int i = 0; i < iters; ++i) {
    mix_block<kMix>(base, w, s, o, pf);
    wg::commit_group();
    wg::wait_group<1>();
  }
  wg::wait_group<0>();
  __syncthreads();
  const long long t1 = clock64();
  if (threadIdx.x == 0) out[blockIdx.x] = t1 - t0;
  sink[blockIdx.x * blockDim.x + threadIdx.x] = acc_sum<128>(s) + acc_sum<128>(o);
}

// ------------------------------------------------------------------------------------------------
// TMA
// ------------------------------------------------------------------------------------------------

// One thread loads `iters` tiles one at a time: out[i] = cycles from issue to the mbarrier phase
// completing. Tile i is at row (i * row_step) % rows: row_step 0 re-reads one tile (L2 after the
// first), a large step walks a tensor bigger than L2 (DRAM).
__global__ void tma_latency(const __grid_constant__ CUtensorMap map, int box_rows, int bytes,
                            int rows, int row_step, long long* out, int iters) {
  __shared__ __align__(8) uint64_t bar;
  unsigned char* tile = smem_base();
  if (threadIdx.x != 0) return;
  cptx::mbarrier_init(&bar, 1);
  cptx::fence_mbarrier_init(cptx::sem_release, cptx::scope_cluster);
  uint32_t phase = 0;
  for (int i = 0; i < iters; ++i) {
    const int32_t coords[2] = {0, static_cast<int32_t>((static_cast<long long>(i) * row_step) % rows)};
    const long long t0 = clock64();
    cptx::mbarrier_arrive_expect_tx(cptx::sem_release, cptx::scope_cta, cptx::space_shared, &bar, bytes);
    cptx::cp_async_bulk_tensor(cptx::space_shared, cptx::space_global, tile, &map, coords, &bar);
    fptx::mbar_wait(&bar, phase);
    const long long t1 = clock64();
    phase ^= 1;
    out[i] = t1 - t0;
  }
  (void)box_rows;
}

// One thread per CTA keeps `ring` loads in flight (128 KB of tiles): each CTA reads `iters` tiles
// from the first `rows` rows (every CTA the same rows: after the first pass they sit in L2, as K/V
// do for the CTAs of one head). out[block]: cycles for all of them.
constexpr int kRingBytes = 128 * 1024, kMaxRing = 16;
__global__ void tma_throughput(const __grid_constant__ CUtensorMap map, int box_rows, int bytes,
                               int rows, long long* out, int iters) {
  __shared__ __align__(8) uint64_t bars[kMaxRing];
  const int depth = kRingBytes / bytes < kMaxRing ? kRingBytes / bytes : kMaxRing;
  unsigned char* tiles = smem_base();
  if (threadIdx.x != 0) return;
  for (int s = 0; s < depth; ++s) cptx::mbarrier_init(&bars[s], 1);
  cptx::fence_mbarrier_init(cptx::sem_release, cptx::scope_cluster);
  const long long t0 = clock64();
  for (int i = 0; i < iters; ++i) {
    const int s = i % depth;
    if (i >= depth) fptx::mbar_wait(&bars[s], ((i / depth) - 1) & 1);  // slot free again
    const int32_t coords[2] = {0, (i * box_rows) % rows};
    cptx::mbarrier_arrive_expect_tx(cptx::sem_release, cptx::scope_cta, cptx::space_shared, &bars[s], bytes);
    cptx::cp_async_bulk_tensor(cptx::space_shared, cptx::space_global, tiles + s * bytes, &map, coords,
                              &bars[s]);
  }
  for (int i = iters > depth ? iters - depth : 0; i < iters; ++i)
    fptx::mbar_wait(&bars[i % depth], (i / depth) & 1);
  out[blockIdx.x] = clock64() - t0;
}

// ------------------------------------------------------------------------------------------------
// The backward's TMA traffic (scheduler/graphs/sm90_bwd*.graph): boxes of every size the kernels
// could use, bulk copies, bulk reductions, and a step's mix of them
// ------------------------------------------------------------------------------------------------

// Coordinates of row `row` in a map of rank 2 ({64 columns, rows}) or 3 ({64 columns, rows, column
// blocks}: one box holds its rows of every 64-column block, one block after another, the layout
// wgmma reads, as one TMA operation).
template <int kRank>
__device__ __forceinline__ void tma_box(unsigned char* dst, const CUtensorMap* map, int row, uint64_t* bar) {
  if constexpr (kRank == 2) {
    const int32_t c[2] = {0, row};
    cptx::cp_async_bulk_tensor(cptx::space_shared, cptx::space_global, dst, map, c, bar);
  } else {
    const int32_t c[3] = {0, row, 0};
    cptx::cp_async_bulk_tensor(cptx::space_shared, cptx::space_global, dst, map, c, bar);
  }
}

// One thread keeps up to `depth` transfers of `bytes` in flight, one an mbarrier: issue(i, dst, bar)
// starts transfer i into dst, completing on bar. Returns when every transfer has landed.
template <class Issue>
__device__ __forceinline__ void transfer_ring(uint64_t* bars, unsigned char* buf, int bytes, int depth, int iters,
                                              Issue issue) {
  for (int s = 0; s < depth; ++s) cptx::mbarrier_init(&bars[s], 1);
  cptx::fence_mbarrier_init(cptx::sem_release, cptx::scope_cluster);
  for (int i = 0; i < iters; ++i) {
    const int s = i % depth;
    if (i >= depth) fptx::mbar_wait(&bars[s], ((i / depth) - 1) & 1);  // slot free again
    cptx::mbarrier_arrive_expect_tx(cptx::sem_release, cptx::scope_cta, cptx::space_shared, &bars[s], bytes);
    issue(i, buf + s * bytes, &bars[s]);
  }
  for (int i = iters > depth ? iters - depth : 0; i < iters; ++i) fptx::mbar_wait(&bars[i % depth], (i / depth) & 1);
}

// Boxes of `bytes` over the first `rows` rows (L2-resident after the first pass), up to `depth` in
// flight; depth 1 gives the latency. out[block]: cycles for all `iters`.
template <int kRank>
__global__ void tma_box_ring(const __grid_constant__ CUtensorMap map, int box_rows, int bytes, int rows, int depth,
                             long long* out, int iters) {
  __shared__ __align__(8) uint64_t bars[kMaxRing];
  if (threadIdx.x != 0) return;
  const long long t0 = clock64();
  transfer_ring(bars, smem_base(), bytes, depth, iters, [&](int i, unsigned char* dst, uint64_t* bar) {
    tma_box<kRank>(dst, &map, (i * box_rows) % rows, bar);
  });
  out[blockIdx.x] = clock64() - t0;
}

// Bulk copies (cp.async.bulk, global -> shared, not a tensor) of `bytes` from consecutive chunks of
// a `region`-byte window (L2-resident), up to `depth` in flight; depth 1 gives the latency.
// out[block]: cycles for all `iters`.
__global__ void bulk_copy_ring(const unsigned char* src, int bytes, int region, int depth, long long* out, int iters) {
  __shared__ __align__(8) uint64_t bars[kMaxRing];
  if (threadIdx.x != 0) return;
  const long long t0 = clock64();
  transfer_ring(bars, smem_base(), bytes, depth, iters, [&](int i, unsigned char* dst, uint64_t* bar) {
    cptx::cp_async_bulk(cptx::space_shared, cptx::space_global, dst, src + (int64_t(i) * bytes) % region,
                        uint32_t(bytes), bar);
  });
  out[blockIdx.x] = clock64() - t0;
}

// One thread issues `iters` bulk reductions (cp.reduce.async.bulk .add.f32) of a `bytes` stage in
// shared memory into `slots` destinations of its CTA's own (L2-resident), at most kInFlight of
// them not yet done reading the stage (kInFlight 1: the latency until the stage may be rewritten,
// what the backward's next dQ stage waits for). out[block]: cycles for all of them and the writes.
template <int kInFlight>
__global__ void bulk_reduce_ring(float* dst, int bytes, int slots, long long* out, int iters) {
  unsigned char* stage = smem_base();
  for (int i = threadIdx.x; i < bytes / 4; i += blockDim.x) reinterpret_cast<float*>(stage)[i] = 1e-3f * (i % 7);
  fptx::fence_proxy_async_smem();
  __syncthreads();
  if (threadIdx.x != 0) return;
  float* mine = dst + int64_t(blockIdx.x) * slots * (bytes / 4);
  const long long t0 = clock64();
  for (int i = 0; i < iters; ++i) {
    cptx::cp_reduce_async_bulk(cptx::space_global, cptx::space_shared, cptx::op_add, mine + (i % slots) * (bytes / 4),
                               reinterpret_cast<const float*>(stage), uint32_t(bytes));
    cptx::cp_async_bulk_commit_group();
    cptx::cp_async_bulk_wait_group_read(cptx::n32_t<kInFlight - 1>{});
  }
  cptx::cp_async_bulk_wait_group(cptx::n32_t<0>{});
  out[blockIdx.x] = clock64() - t0;
}

// One dK/dV step's TMA traffic, issued by one thread as the backward kernels do: into step buffer
// i % 3, once step i - 3 has landed, `boxes` boxes of Q and dO (rank-kRank map, `box_bytes` each)
// and `bulks` bulk copies of `bulk_bytes` (the LSE and D rows) on one mbarrier; then `reds` 16 KB
// bulk reductions (dQ's stage), the previous step's having read the stage. out[block]: cycles for
// all `iters` steps.
template <int kRank>
__global__ void step_mix(const __grid_constant__ CUtensorMap map, int box_rows, int box_bytes, int rows, int boxes,
                         const unsigned char* rows_src, int bulks, int bulk_bytes, float* dst, int reds,
                         long long* out, int iters) {
  constexpr int kBufs = 3, kRedBytes = 16384;
  __shared__ __align__(8) uint64_t bars[kBufs];
  unsigned char* base = smem_base();
  unsigned char* stage = base;  // reductions' source, then the step buffers
  unsigned char* bufs = base + kRedBytes;
  const int step_bytes = boxes * box_bytes + bulks * bulk_bytes;
  for (int i = threadIdx.x; i < kRedBytes / 4; i += blockDim.x) reinterpret_cast<float*>(stage)[i] = 1e-3f;
  fptx::fence_proxy_async_smem();
  __syncthreads();
  if (threadIdx.x != 0) return;
  for (int s = 0; s < kBufs; ++s) cptx::mbarrier_init(&bars[s], 1);
  cptx::fence_mbarrier_init(cptx::sem_release, cptx::scope_cluster);
  float* mine = dst + int64_t(blockIdx.x) * 2 * (kRedBytes / 4);
  const long long t0 = clock64();
  for (int i = 0; i < iters; ++i) {
    const int s = i % kBufs;
    if (i >= kBufs) fptx::mbar_wait(&bars[s], ((i / kBufs) - 1) & 1);
    cptx::mbarrier_arrive_expect_tx(cptx::sem_release, cptx::scope_cta, cptx::space_shared, &bars[s], step_bytes);
    unsigned char* b = bufs + s * step_bytes;
    for (int k = 0; k < boxes; ++k) tma_box<kRank>(b + k * box_bytes, &map, ((i * boxes + k) * box_rows) % rows, &bars[s]);
    for (int k = 0; k < bulks; ++k)
      cptx::cp_async_bulk(cptx::space_shared, cptx::space_global, b + boxes * box_bytes + k * bulk_bytes,
                          rows_src + (int64_t(i * bulks + k) * bulk_bytes) % (1 << 20), uint32_t(bulk_bytes), &bars[s]);
    if (reds > 0) {
      cptx::cp_async_bulk_wait_group_read(cptx::n32_t<0>{});
      for (int k = 0; k < reds; ++k)
        cptx::cp_reduce_async_bulk(cptx::space_global, cptx::space_shared, cptx::op_add, mine + (k % 2) * (kRedBytes / 4),
                                   reinterpret_cast<const float*>(stage), uint32_t(kRedBytes));
      cptx::cp_async_bulk_commit_group();
    }
  }
  for (int i = iters > kBufs ? iters - kBufs : 0; i < iters; ++i) fptx::mbar_wait(&bars[i % kBufs], (i / kBufs) & 1);
  cptx::cp_async_bulk_wait_group(cptx::n32_t<0>{});
  out[blockIdx.x] = clock64() - t0;
}

// ------------------------------------------------------------------------------------------------
// exp2
// ------------------------------------------------------------------------------------------------

// 1024 threads, one CTA per SM. Each thread runs 8 independent chains x <- 2^x - 1.5 (which stays
// in [-1, -0.5]); kPoly of the 8 use the polynomial, the rest MUFU. out[block]: cycles.
template <int kPoly>
__global__ void __launch_bounds__(1024, 1) exp2_throughput(long long* out, float* sink, int iters) {
  float v[8];
#pragma unroll
  for (int k = 0; k < 8; ++k) v[k] = -0.5f - 0.06f * k - 1e-6f * threadIdx.x;
  __syncthreads();
  const long long t0 = clock64();
  for (int i = 0; i < iters; ++i) {
#pragma unroll
    for (int k = 0; k < 8; ++k)
      v[k] = (k < kPoly ? fa4::numerics::exp2_poly(v[k]) : fa4::numerics::exp2_mufu(v[k])) - 1.5f;
  }
  __syncthreads();
  const long long t1 = clock64();
  if (threadIdx.x == 0) out[blockIdx.x] = t1 - t0;
  float s = 0;
#pragma unroll
  for (int k = 0; k < 8; ++k) s += v[k];
  sink[blockIdx.x * blockDim.x + threadIdx.x] = s;
}

// The packed forms: 8 chains of two 16-bit elements, x <- 2^x - 1.5 in packed arithmetic (one
// packed add per pair beside the exponential). kBF16 picks ex2.approx.ftz.bf16x2 over
// ex2.approx.f16x2. Elements (two per instruction) per clock come out of the host side.
template <bool kBF16>
__device__ __forceinline__ uint32_t ex2_packed(uint32_t x) {
  uint32_t y;
  if constexpr (kBF16) {
    asm volatile("ex2.approx.ftz.bf16x2 %0, %1;\n" : "=r"(y) : "r"(x));
  } else {
    asm volatile("ex2.approx.f16x2 %0, %1;\n" : "=r"(y) : "r"(x));
  }
  return y;
}
template <bool kBF16>
__global__ void __launch_bounds__(1024, 1) exp2_packed_throughput(long long* out, float* sink, int iters) {
  uint32_t v[8];
  const uint32_t minus_1_5 = kBF16 ? 0xbfc0bfc0u : 0xbe00be00u;  // -1.5 in both halves
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const float a = -0.5f - 0.06f * k - 1e-6f * threadIdx.x;
    v[k] = fa4::sm90::pack2<kBF16>(a, a - 0.01f);
  }
  __syncthreads();
  const long long t0 = clock64();
  for (int i = 0; i < iters; ++i) {
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const uint32_t e = ex2_packed<kBF16>(v[k]);
      if constexpr (kBF16) {
        asm volatile("add.rn.bf16x2 %0, %1, %2;\n" : "=r"(v[k]) : "r"(e), "r"(minus_1_5));
      } else {
        asm volatile("add.rn.f16x2 %0, %1, %2;\n" : "=r"(v[k]) : "r"(e), "r"(minus_1_5));
      }
    }
  }
  __syncthreads();
  const long long t1 = clock64();
  if (threadIdx.x == 0) out[blockIdx.x] = t1 - t0;
  uint32_t s = 0;
#pragma unroll
  for (int k = 0; k < 8; ++k) s ^= v[k];
  sink[blockIdx.x * blockDim.x + threadIdx.x] = __uint_as_float(s);
}

// Accuracy of the packed exponentials: for every 16-bit code whose value x lies in [lo, hi] (both
// halves of a word hold it), the relative error of the packed 2^x against 2^x in double, the
// argument taken as given (its own rounding is the caller's). atomicMax on the bits of
// non-negative floats; *out must start at zero.
template <bool kBF16>
__device__ __forceinline__ void packed_err(unsigned short c, float lo, float hi, unsigned* out) {
  auto value = [](unsigned short h) {
    return kBF16 ? __bfloat162float(__ushort_as_bfloat16(h)) : __half2float(__ushort_as_half(h));
  };
  const float x = value(c);
  if (!(x >= lo && x <= hi)) return;
  const uint32_t y = ex2_packed<kBF16>(uint32_t(c) | uint32_t(c) << 16);
  const double ref = exp2(static_cast<double>(x));
  const float err = static_cast<float>(fabs(value(static_cast<unsigned short>(y & 0xffffu)) - ref) / ref);
  atomicMax(out, __float_as_uint(err));
}
// out: f16x2 on [-14, 0] (results normal in f16) and on [-24, -14) (subnormal results), bf16x2 on
// [-24, 0].
__global__ void exp2_packed_accuracy(unsigned* out) {
  const unsigned code = blockIdx.x * blockDim.x + threadIdx.x;  // 0 .. 65535
  if (code >= 65536) return;
  const unsigned short c = static_cast<unsigned short>(code);
  packed_err<false>(c, -14.0f, 0.0f, &out[0]);
  packed_err<false>(c, -24.0f, -14.000001f, &out[1]);
  packed_err<true>(c, -24.0f, 0.0f, &out[2]);
}

// ------------------------------------------------------------------------------------------------
// Softmax latency
// ------------------------------------------------------------------------------------------------

// Clock read that the compiler keeps in place relative to memory accesses.
__device__ __forceinline__ long long clock_fenced() {
  long long t;
  asm volatile("mov.u64 %0, %%clock64;\n" : "=l"(t)::"memory");
  return t;
}

// kWarpgroups warpgroups, each thread holding 2 rows x 32 columns of a 64x128 fp32 S block (the
// wgmma accumulator layout). Per iteration: clock, S from shared memory, the forward kernel's
// softmax step itself (src/sm90/softmax.cuh: max in four partial chains, two quad shuffles,
// rescale step, 2^(x*scale - max) on MUFU, sums in four partial chains) and P packed to bf16
// (kFull), P to shared memory, clock.
// !kFull keeps only the loads and stores: the baseline to subtract. out[iteration]: warp 0's
// cycles; the host takes the median.
// One timed iteration of the softmax on a thread's slice of S in shared memory (my_s; P to my_p),
// as laid out above; returns warp 0's cycles through `out` when it is thread 0's.
template <bool kFull>
__device__ __forceinline__ long long softmax_iteration(const float* my_s, uint32_t* my_p, int stride, int it,
                                                       fa4::numerics::RowState (&rows)[2]) {
  const float scale_log2 = 0.127f;
  const long long t0 = clock_fenced();
  float s[64];
#pragma unroll
  for (int c = 0; c < 64; c += 4) {
    const float4 v = *reinterpret_cast<const float4*>(my_s + (c / 4) * stride);
    s[c] = v.x + it;  // a slightly different block each time
    s[c + 1] = v.y;
    s[c + 2] = v.z;
    s[c + 3] = v.w;
  }
  float corr[2] = {1.0f, 1.0f};
  if constexpr (kFull) fa4::sm90::softmax_step<128, 0>(s, rows, scale_log2, 8.0f, corr);
#pragma unroll
  for (int c = 0; c < 32; c += 4) {
    uint32_t w[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      __nv_bfloat162 v = __floats2bfloat162_rn(s[2 * (c + k)] * corr[0], s[2 * (c + k) + 1]);
      w[k] = *reinterpret_cast<uint32_t*>(&v);
    }
    *reinterpret_cast<uint4*>(my_p + (c / 4) * stride) = make_uint4(w[0], w[1], w[2], w[3]);
  }
  return clock_fenced() - t0;
}

// S of `threads` threads in shared memory at `sm_s`: 64 floats of S per thread, then 32 words of
// P, interleaved by 16 bytes between threads so that the vector loads and stores are free of bank
// conflicts: element c of a thread sits at (c / 4) * threads * 4 + thread * 4 + c % 4.
__device__ __forceinline__ void softmax_operands(float* sm_s, int threads, int thread, const float** my_s,
                                                 uint32_t** my_p) {
  const int stride = threads * 4;
  float* s = sm_s + thread * 4;
  for (int c = 0; c < 64; ++c) s[(c / 4) * stride + c % 4] = 0.37f * ((thread * 7 + c * 13) % 29) - 5.0f;
  *my_s = s;
  *my_p = reinterpret_cast<uint32_t*>(sm_s + threads * 64) + thread * 4;
}

// kWarpgroups warpgroups, each thread holding 2 rows x 32 columns of a 64x128 fp32 S block (the
// wgmma accumulator layout). Per iteration: clock, S from shared memory, the forward kernel's
// softmax step itself (src/sm90/softmax.cuh: max as a tree, two quad shuffles, rescale step,
// 2^(x*scale - max) on MUFU, sums in four partial chains) and P packed to bf16 (kFull), P to
// shared memory, clock. !kFull keeps only the loads and stores: the baseline to subtract.
// out[iteration]: warp 0's cycles; the host takes the median.
template <int kWarpgroups, bool kFull>
__global__ void __launch_bounds__(128 * kWarpgroups, 1) softmax_latency(long long* out, int iters) {
  extern __shared__ float sm_s[];
  const float* my_s;
  uint32_t* my_p;
  softmax_operands(sm_s, blockDim.x, threadIdx.x, &my_s, &my_p);
  __syncthreads();
  fa4::numerics::RowState rows[2] = {fa4::numerics::row_state_init(), fa4::numerics::row_state_init()};
  for (int it = 0; it < iters; ++it) {
    const long long c = softmax_iteration<kFull>(my_s, my_p, blockDim.x * 4, it, rows);
    if (threadIdx.x == 0) out[it] = c;
  }
  if (rows[0].sum == 12345.0f) my_p[0] = 0;  // keep the row state alive
}

// The same softmax on warpgroup 0 while warpgroup 1 keeps the tensor cores busy with a GEMM mix
// (above) on the same SM: does the tensor work slow the softmax down (register file, issue)?
// One CTA on one SM; out[iteration] as above.
template <bool kFull, int kMix>
__global__ void __launch_bounds__(256, 1) softmax_beside_gemm(long long* out, float* sink, int iters) {
  unsigned char* base = smem_base();
  float* sm_s = reinterpret_cast<float*>(base + 4 * 32768);
  __shared__ volatile int done;
  if (threadIdx.x == 0) done = 0;
  fill_random(base, 4 * 32768);
  // Warpgroup index made warp-uniform (a shuffle): ptxas then keeps warpgroup 1's wgmma pipelined.
  const int w = __shfl_sync(0xffffffff, int(threadIdx.x / 128), 0);
  if (w == 0) {
    const float* my_s;
    uint32_t* my_p;
    softmax_operands(sm_s, 128, threadIdx.x, &my_s, &my_p);
    fa4::numerics::RowState rows[2] = {fa4::numerics::row_state_init(), fa4::numerics::row_state_init()};
    for (int it = 0; it < 16; ++it) softmax_iteration<kFull>(my_s, my_p, 512, it, rows);  // GEMMs ramp up
    for (int it = 0; it < iters; ++it) {
      const long long c = softmax_iteration<kFull>(my_s, my_p, 512, it, rows);
      if (threadIdx.x == 0) out[it] = c;
    }
    if (rows[0].sum == 12345.0f) my_p[0] = 0;
    __syncwarp();
    if (threadIdx.x == 0) done = 1;
  } else {
    float s[64], o[64];
    uint32_t pf[32];
    mix_operands(s, o, pf);
    wg::fence();
    for (int i = 0; i < (1 << 24); ++i) {  // until warpgroup 0 is done (bounded all the same)
      mix_block<kMix>(base, 1, s, o, pf);
      wg::commit_group();
      wg::wait_group<1>();
      if ((i & 15) == 15 && done) break;
    }
    wg::wait_group<0>();
    sink[threadIdx.x] = acc_sum<128>(s) + acc_sum<128>(o);
  }
}

// ------------------------------------------------------------------------------------------------
// Hand-offs between two warps
// ------------------------------------------------------------------------------------------------

// Warp 0 and warp 1 pass a token back and forth `iters` times; out[0]: cycles on warp 0 for all
// round trips (two hand-offs each). kNamed: named barriers, else mbarriers (lane 0 of each warp).
template <bool kNamed>
__global__ void handoff(long long* out, int iters) {
  __shared__ __align__(8) uint64_t bars[2];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (threadIdx.x == 0) {
    cptx::mbarrier_init(&bars[0], 1);
    cptx::mbarrier_init(&bars[1], 1);
  }
  __syncthreads();
  long long t0 = clock64();
  if (kNamed) {
    for (int i = 0; i < iters; ++i) {
      if (warp == 0) {
        fptx::named_bar_arrive(1, 64);
        fptx::named_bar_sync(2, 64);
      } else {
        fptx::named_bar_sync(1, 64);
        fptx::named_bar_arrive(2, 64);
      }
    }
  } else if (lane == 0) {
    uint32_t phase = 0;
    for (int i = 0; i < iters; ++i, phase ^= 1) {
      if (warp == 0) {
        cptx::mbarrier_arrive(&bars[0]);
        fptx::mbar_wait(&bars[1], phase);
      } else {
        fptx::mbar_wait(&bars[0], phase);
        cptx::mbarrier_arrive(&bars[1]);
      }
    }
  }
  if (threadIdx.x == 0) out[0] = clock64() - t0;
}

// ------------------------------------------------------------------------------------------------
// Host
// ------------------------------------------------------------------------------------------------

struct Json {
  std::string s;
  void key(const std::string& k) { s += (s.empty() || s.back() == '{' ? "" : ", ") + ("\"" + k + "\": "); }
  void num(const std::string& k, double v) {
    char b[64];
    std::snprintf(b, sizeof b, "%.6g", v);
    key(k);
    s += b;
  }
  void str(const std::string& k, const std::string& v) {
    key(k);
    s += "\"" + v + "\"";
  }
  void open(const std::string& k) {
    key(k);
    s += "{";
  }
  void close() { s += "}"; }
};

double median(std::vector<long long> v) {
  std::sort(v.begin(), v.end());
  return static_cast<double>(v[v.size() / 2]);
}

int g_sms = 0;

double g_clock_mhz_tensor_load = 0;

template <class F>
void bench_wgmma(Json& j, const std::string& name) {
  const int lat_iters = 256, thr_iters = 4096;
  long long *d_out, *d_ns;
  float* d_sink;
  CHECK(cudaMalloc(&d_out, sizeof(long long) * std::max(g_sms, 2)));
  CHECK(cudaMalloc(&d_ns, sizeof(long long) * g_sms));
  CHECK(cudaMalloc(&d_sink, sizeof(float) * g_sms * 256));
  long long lat[2];
  wgmma_latency<F><<<1, 128, kWgmmaSmem>>>(d_out, d_sink, lat_iters);
  CHECK(cudaGetLastError());
  CHECK(cudaMemcpy(lat, d_out, sizeof lat, cudaMemcpyDeviceToHost));
  auto run = [&](auto kernel, int threads) {
    kernel<<<g_sms, threads, kWgmmaSmem>>>(d_out, d_ns, d_sink, thr_iters);
    CHECK(cudaGetLastError());
    std::vector<long long> cyc(g_sms), ns(g_sms);
    CHECK(cudaMemcpy(cyc.data(), d_out, sizeof(long long) * g_sms, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(ns.data(), d_ns, sizeof(long long) * g_sms, cudaMemcpyDeviceToHost));
    g_clock_mhz_tensor_load = 1e3 * median(cyc) / median(ns);
    return median(cyc);
  };
  run(wgmma_throughput<F, 2>, 256);  // warm-up
  const double one_wg = run(wgmma_throughput<F, 1>, 128);
  const double two_wg = run(wgmma_throughput<F, 2>, 256);
  const double flop = F::kFlop;
  j.open(name);
  j.num("latency_cycles", static_cast<double>(lat[0]) / lat_iters);
  j.num("chained_issue_cycles_1wg", static_cast<double>(lat[1]) / lat_iters);
  j.num("cycles_per_wgmma_1wg_all_sms", one_wg / thr_iters);
  j.num("cycles_per_wgmma_2wg_all_sms", two_wg / (2.0 * thr_iters));
  j.num("flop_per_clk_per_sm_2wg", flop * 2.0 * thr_iters / two_wg);
  j.num("sm_clock_mhz_2wg", g_clock_mhz_tensor_load);
  j.close();
  CHECK(cudaFree(d_ns));
  CHECK(cudaFree(d_out));
  CHECK(cudaFree(d_sink));
}

// ------------------------------------------------------------------------------------------------
// wgmma by operand form and type (the fp8 forward's GEMMs beside bf16's)
// ------------------------------------------------------------------------------------------------

void bench_fp8(Json& j) {
  j.open("wgmma_forms");
  bench_wgmma<WgmmaForm<128>>(j, "bf16_ss_m64n128k16");
  bench_wgmma<WgmmaForm<128, true>>(j, "bf16_rs_m64n128k16");
  bench_wgmma<WgmmaForm<64, false, true>>(j, "e4m3_ss_m64n64k32");
  bench_wgmma<WgmmaForm<128, false, true>>(j, "e4m3_ss_m64n128k32");
  bench_wgmma<WgmmaForm<64, true, true>>(j, "e4m3_rs_m64n64k32");
  bench_wgmma<WgmmaForm<128, true, true>>(j, "e4m3_rs_m64n128k32");
  bench_wgmma<WgmmaForm<256, true, true>>(j, "e4m3_rs_m64n256k32");
  j.close();
}

PFN_cuTensorMapEncodeTiled_v12000 get_encoder() {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q{};
  CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q));
  if (q != cudaDriverEntryPointSuccess || !fn) {
    std::fprintf(stderr, "cuTensorMapEncodeTiled not available\n");
    std::exit(1);
  }
  return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
}

// A [rows x 64] bf16 tensor (128 B per row) read in boxes of [box_rows x 64], 128B swizzle.
CUtensorMap make_map(void* base, uint64_t rows, uint32_t box_rows) {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = get_encoder();
  CUtensorMap m;
  const cuuint64_t dims[2] = {64, rows};
  const cuuint64_t strides[1] = {128};
  const cuuint32_t box[2] = {64, box_rows};
  const cuuint32_t elem[2] = {1, 1};
  const CUresult r = encode(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, base, dims, strides, box, elem,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    std::fprintf(stderr, "cuTensorMapEncodeTiled failed (%d)\n", static_cast<int>(r));
    std::exit(1);
  }
  return m;
}

void bench_tma(Json& j, void* big, uint64_t big_rows, int box_rows) {
  const int bytes = box_rows * 128, lat_iters = 64, thr_iters = 2048;
  const CUtensorMap map = make_map(big, big_rows, box_rows);
  long long* d_out;
  CHECK(cudaMalloc(&d_out, sizeof(long long) * std::max(g_sms, lat_iters)));
  std::vector<long long> v(lat_iters);
  const int smem1 = bytes + 1024, smem_ring = kRingBytes + 1024;
  CHECK(cudaFuncSetAttribute(tma_latency, cudaFuncAttributeMaxDynamicSharedMemorySize, smem1));
  CHECK(cudaFuncSetAttribute(tma_throughput, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_ring));
  // L2: the same tile again and again (the first load warms it; the median ignores it).
  tma_latency<<<1, 32, smem1>>>(map, box_rows, bytes, static_cast<int>(big_rows), 0, d_out, lat_iters);
  CHECK(cudaGetLastError());
  CHECK(cudaMemcpy(v.data(), d_out, sizeof(long long) * lat_iters, cudaMemcpyDeviceToHost));
  const double lat_l2 = median(v);
  // DRAM: tiles 1 MB apart over a tensor several times the L2, each touched once.
  const int step = (1 << 20) / 128;
  tma_latency<<<1, 32, smem1>>>(map, box_rows, bytes, static_cast<int>(big_rows), step, d_out, lat_iters);
  CHECK(cudaGetLastError());
  CHECK(cudaMemcpy(v.data(), d_out, sizeof(long long) * lat_iters, cudaMemcpyDeviceToHost));
  const double lat_dram = median(v);
  // Throughput over a 4 MB region (L2-resident), one SM alone, then every SM at once.
  const int region_rows = (4 << 20) / 128;
  tma_throughput<<<1, 32, smem_ring>>>(map, box_rows, bytes, region_rows, d_out, thr_iters);  // warm
  tma_throughput<<<1, 32, smem_ring>>>(map, box_rows, bytes, region_rows, d_out, thr_iters);
  CHECK(cudaGetLastError());
  long long one;
  CHECK(cudaMemcpy(&one, d_out, sizeof one, cudaMemcpyDeviceToHost));
  tma_throughput<<<g_sms, 32, smem_ring>>>(map, box_rows, bytes, region_rows, d_out, thr_iters);
  CHECK(cudaGetLastError());
  std::vector<long long> all(g_sms);
  CHECK(cudaMemcpy(all.data(), d_out, sizeof(long long) * g_sms, cudaMemcpyDeviceToHost));
  j.open("tile_" + std::to_string(box_rows) + "x64_bf16");
  j.num("bytes", bytes);
  j.num("tiles_in_flight", std::min(kRingBytes / bytes, kMaxRing));
  j.num("latency_l2_cycles", lat_l2);
  j.num("latency_dram_cycles", lat_dram);
  j.num("bytes_per_clk_one_sm", static_cast<double>(bytes) * thr_iters / one);
  j.num("bytes_per_clk_per_sm_all_sms", static_cast<double>(bytes) * thr_iters / median(all));
  j.num("cycles_per_tile_all_sms", median(all) / thr_iters);
  j.close();
  CHECK(cudaFree(d_out));
}

// The L2-resident window the backward's traffic is measured over (every CTA reads the same).
constexpr int kBwdRegion = 4 << 20;

// A map over kBwdRegion bytes of bf16: rank 2, rows of 128 bytes ({64, rows}); or rank 3, rows of
// `blocks` 64-column blocks ({64, rows, blocks}, strides {blocks * 128, 128} bytes), a box taking
// `box_rows` rows of every block. Returns the driver's error code (0: `m` is valid): whether the
// driver takes a map whose strides do not grow with the dimension is itself a result.
int make_bwd_map(CUtensorMap& m, void* base, int rank, uint32_t box_rows, uint32_t blocks) {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = get_encoder();
  const uint64_t row_bytes = rank == 2 ? 128 : 128ull * blocks;
  const cuuint64_t dims[3] = {64, kBwdRegion / row_bytes, blocks};
  const cuuint64_t strides[2] = {row_bytes, 128};
  const cuuint32_t box[3] = {64, box_rows, blocks};
  const cuuint32_t elem[3] = {1, 1, 1};
  return static_cast<int>(encode(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, rank, base, dims, strides, box, elem,
                                 CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                 CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
}

// Median over the SMs of a kernel's per-CTA cycle counts, divided by `per`.
double per_op(long long* d_out, int blocks, int per) {
  CHECK(cudaGetLastError());
  std::vector<long long> v(blocks);
  CHECK(cudaMemcpy(v.data(), d_out, sizeof(long long) * blocks, cudaMemcpyDeviceToHost));
  return median(v) / per;
}

void bench_bwd_traffic(Json& j) {
  const int smem = kRingBytes + 1024, iters = 1024;
  void* region;
  float* red_dst;
  long long* d_out;
  CHECK(cudaMalloc(&region, kBwdRegion));
  CHECK(cudaMemset(region, 0x3c, kBwdRegion));
  CHECK(cudaMalloc(&red_dst, size_t(g_sms) * 4 * 16384));
  CHECK(cudaMemset(red_dst, 0, size_t(g_sms) * 4 * 16384));
  CHECK(cudaMalloc(&d_out, sizeof(long long) * g_sms));
  for (auto k : {(const void*)tma_box_ring<2>, (const void*)tma_box_ring<3>, (const void*)bulk_copy_ring,
                 (const void*)bulk_reduce_ring<1>, (const void*)bulk_reduce_ring<4>})
    CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));

  // Boxes: 64-column boxes of 64, 128 and 256 rows (rank 2), and boxes of 64 or 128 rows of 2 or 4
  // column blocks (rank 3, the d128 / d256 Q and dO tiles as one operation).
  j.open("boxes");
  struct Box { int rank, rows, blocks; };
  for (const Box b : {Box{2, 64, 1}, Box{2, 128, 1}, Box{2, 256, 1}, Box{3, 64, 2}, Box{3, 64, 4}, Box{3, 128, 4}}) {
    const int bytes = b.rows * 128 * b.blocks;
    const int depth = std::max(2, std::min(kMaxRing, kRingBytes / bytes));
    CUtensorMap m;
    const std::string name = (b.rank == 2 ? "rows" : "folded_rows") + std::to_string(b.rows) + "_blocks" +
                             std::to_string(b.blocks);
    j.open(name);
    j.num("bytes", bytes);
    if (const int err = make_bwd_map(m, region, b.rank, b.rows, b.blocks); err != 0) {
      j.num("encode_error", err);
      j.close();
      continue;
    }
    auto run = [&](int grid, int rows, int d) {
      if (b.rank == 2) tma_box_ring<2><<<grid, 32, smem>>>(m, b.rows, bytes, rows, d, d_out, iters);
      else tma_box_ring<3><<<grid, 32, smem>>>(m, b.rows, bytes, rows, d, d_out, iters);
      return per_op(d_out, grid, iters);
    };
    const int rows = kBwdRegion / (128 * b.blocks);
    run(g_sms, rows, depth);  // warm the window into L2
    j.num("latency_l2_cycles", run(1, b.rows, 1));
    j.num("in_flight", depth);
    j.num("cycles_per_box_one_sm", run(1, rows, depth));
    j.num("cycles_per_box_all_sms", run(g_sms, rows, depth));
    j.close();
  }
  j.close();

  // Bulk copies of the sizes the LSE and D rows take (64 floats; both in one: 128).
  j.open("bulk_copies");
  for (const int bytes : {256, 512, 1024}) {
    auto run = [&](int grid, int d) {
      bulk_copy_ring<<<grid, 32, smem>>>(static_cast<const unsigned char*>(region), bytes, 1 << 20, d, d_out, iters);
      return per_op(d_out, grid, iters);
    };
    run(g_sms, kMaxRing);
    j.open("bytes" + std::to_string(bytes));
    j.num("latency_l2_cycles", run(1, 1));
    j.num("cycles_per_copy_one_sm", run(1, kMaxRing));
    j.num("cycles_per_copy_all_sms", run(g_sms, kMaxRing));
    j.close();
  }
  j.close();

  // Bulk reductions of a 16 KB fp32 stage (dQ's piece) into four destinations a CTA.
  j.open("bulk_reduce_16k");
  {
    const int bytes = 16384, red_iters = 512;
    auto run = [&](auto kernel, int grid) {
      kernel<<<grid, 128, smem>>>(red_dst, bytes, 4, d_out, red_iters);
      return per_op(d_out, grid, red_iters);
    };
    run(bulk_reduce_ring<4>, g_sms);
    j.num("read_latency_cycles", run(bulk_reduce_ring<1>, 1));
    j.num("cycles_per_reduction_one_sm", run(bulk_reduce_ring<4>, 1));
    j.num("cycles_per_reduction_all_sms", run(bulk_reduce_ring<4>, g_sms));
  }
  j.close();

  // A dK/dV step's traffic from one thread, every SM at once: the shipped loads (64-row boxes of
  // 64 columns, the LSE and D rows as two bulk copies), and the same with folded boxes and one
  // bulk copy. Cycles per step.
  j.open("step_mix_cycles_per_step_all_sms");
  struct Mix { const char* name; int rank, blocks, boxes, bulks, bulk_bytes, reds; };
  for (const Mix x : {Mix{"d64", 2, 1, 2, 2, 256, 2}, Mix{"d64_one_bulk", 2, 1, 2, 1, 512, 2},
                      Mix{"d128", 2, 1, 4, 2, 256, 2}, Mix{"d128_folded_one_bulk", 3, 2, 2, 1, 512, 2},
                      Mix{"d256", 2, 1, 8, 2, 256, 0}, Mix{"d256_folded_one_bulk", 3, 4, 2, 1, 512, 0}}) {
    CUtensorMap m;
    if (const int err = make_bwd_map(m, region, x.rank, 64, x.blocks); err != 0) {
      j.num(x.name, -err);
      continue;
    }
    const int box_bytes = 64 * 128 * x.blocks, rows = kBwdRegion / (128 * x.blocks);
    const int mix_smem = 1024 + 16384 + 3 * (x.boxes * box_bytes + x.bulks * x.bulk_bytes);
    const int steps = 512;
    auto kernel = x.rank == 2 ? step_mix<2> : step_mix<3>;
    CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, mix_smem));
    for (int rep = 0; rep < 2; ++rep)  // the first run warms L2
      kernel<<<g_sms, 32, mix_smem>>>(m, 64, box_bytes, rows, x.boxes, static_cast<const unsigned char*>(region),
                                      x.bulks, x.bulk_bytes, red_dst, x.reds, d_out, steps);
    j.num(x.name, per_op(d_out, g_sms, steps));
  }
  j.close();
  CHECK(cudaFree(d_out));
  CHECK(cudaFree(red_dst));
  CHECK(cudaFree(region));
}

// Exponentials per clock per SM of one exp2 throughput kernel (one CTA of 1024 threads an SM),
// `per_iter` elements a thread an iteration.
template <class Kernel>
double exp2_rate(Kernel kernel, int per_iter, long long* d_out, float* d_sink, int iters) {
  kernel<<<g_sms, 1024>>>(d_out, d_sink, iters);
  CHECK(cudaGetLastError());
  std::vector<long long> cyc(g_sms);
  CHECK(cudaMemcpy(cyc.data(), d_out, sizeof(long long) * g_sms, cudaMemcpyDeviceToHost));
  return 1024.0 * per_iter * iters / median(cyc);
}

void bench_exp2(Json& j) {
  const int iters = 2048;
  long long* d_out;
  float* d_sink;
  CHECK(cudaMalloc(&d_out, sizeof(long long) * g_sms));
  CHECK(cudaMalloc(&d_sink, sizeof(float) * g_sms * 1024));
  exp2_rate(exp2_throughput<0>, 8, d_out, d_sink, iters);  // warm-up
  j.open("exp2_per_clk_per_sm");
  j.num("mufu", exp2_rate(exp2_throughput<0>, 8, d_out, d_sink, iters));
  j.num("poly", exp2_rate(exp2_throughput<8>, 8, d_out, d_sink, iters));
  j.num("poly_12_5_percent", exp2_rate(exp2_throughput<1>, 8, d_out, d_sink, iters));
  j.num("poly_25_percent", exp2_rate(exp2_throughput<2>, 8, d_out, d_sink, iters));
  j.num("poly_50_percent", exp2_rate(exp2_throughput<4>, 8, d_out, d_sink, iters));
  // Eight chains of two elements a word.
  j.num("mufu_f16x2", exp2_rate(exp2_packed_throughput<false>, 16, d_out, d_sink, iters));
  j.num("mufu_bf16x2", exp2_rate(exp2_packed_throughput<true>, 16, d_out, d_sink, iters));
  j.close();
  unsigned* d_err;
  CHECK(cudaMalloc(&d_err, 3 * sizeof(unsigned)));
  CHECK(cudaMemset(d_err, 0, 3 * sizeof(unsigned)));
  exp2_packed_accuracy<<<256, 256>>>(d_err);
  CHECK(cudaGetLastError());
  unsigned err[3];
  CHECK(cudaMemcpy(err, d_err, sizeof err, cudaMemcpyDeviceToHost));
  float e[3];
  std::memcpy(e, err, sizeof e);
  j.open("exp2_packed_max_rel_err");
  j.num("f16x2_args_minus14_0", e[0]);
  j.num("f16x2_args_minus24_minus14", e[1]);
  j.num("bf16x2_args_minus24_0", e[2]);
  j.close();
  CHECK(cudaFree(d_err));
  CHECK(cudaFree(d_out));
  CHECK(cudaFree(d_sink));
}

void bench_softmax(Json& j) {
  const int iters = 64;
  long long* d_out;
  CHECK(cudaMalloc(&d_out, sizeof(long long) * iters));
  std::vector<long long> v(iters);
  auto run = [&](auto kernel, int threads) {
    const int smem = threads * (64 + 32) * 4;
    CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    kernel<<<1, threads, smem>>>(d_out, iters);
    CHECK(cudaGetLastError());
    CHECK(cudaMemcpy(v.data(), d_out, sizeof(long long) * iters, cudaMemcpyDeviceToHost));
    return median(v);
  };
  const double base1 = run(softmax_latency<1, false>, 128), full1 = run(softmax_latency<1, true>, 128);
  const double base2 = run(softmax_latency<2, false>, 256), full2 = run(softmax_latency<2, true>, 256);
  j.open("softmax_64x128_block");
  j.num("latency_cycles_1wg", full1 - base1);
  j.num("latency_cycles_2wg_together", full2 - base2);
  j.num("baseline_cycles_subtracted_1wg", base1);
  j.num("baseline_cycles_subtracted_2wg", base2);
  j.close();
  CHECK(cudaFree(d_out));
}

// The SM clock while every SM keeps the tensor cores busy for ~0.1 s (long enough for power
// management to settle): cycles over nanoseconds of wgmma m64n128k16 with two warpgroups per SM.
// Converts a kernel's measured time into cycles.
// f(std::integral_constant<int, m>) for each mix m of the sequence, in order.
template <int... kMixes, class F>
void for_each_mix(std::integer_sequence<int, kMixes...>, F f) {
  (f(std::integral_constant<int, kMixes>{}), ...);
}

template <int kMix>
double run_gemm_mix(long long* d_out, float* d_sink, int iters) {
  CHECK(cudaFuncSetAttribute(gemm_mix<kMix>, cudaFuncAttributeMaxDynamicSharedMemorySize, kMixSmem));
  std::vector<long long> cyc(g_sms);
  for (int rep = 0; rep < 2; ++rep) {  // the first run warms up
    gemm_mix<kMix><<<g_sms, 256, kMixSmem>>>(d_out, d_sink, iters);
    CHECK(cudaGetLastError());
    CHECK(cudaMemcpy(cyc.data(), d_out, sizeof(long long) * g_sms, cudaMemcpyDeviceToHost));
  }
  return median(cyc) / iters;
}

template <int kMix>
double run_softmax_beside(long long* d_out, float* d_sink, int iters, bool full) {
  auto kernel = full ? softmax_beside_gemm<true, kMix> : softmax_beside_gemm<false, kMix>;
  const int smem = kMixSmem + 128 * 96 * 4;
  CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  kernel<<<1, 256, smem>>>(d_out, d_sink, iters);
  CHECK(cudaGetLastError());
  std::vector<long long> v(iters);
  CHECK(cudaMemcpy(v.data(), d_out, sizeof(long long) * iters, cudaMemcpyDeviceToHost));
  return median(v);
}

// Cycles a K/V block of the d128 GEMM pair by operand path (both warpgroups; ideal 2048), and one
// warpgroup's softmax while the other keeps the tensor cores busy.
void bench_gemm_mix(Json& j) {
  const int iters = 2048;
  long long* d_out;
  float* d_sink;
  CHECK(cudaMalloc(&d_out, sizeof(long long) * std::max(g_sms, iters)));
  CHECK(cudaMalloc(&d_sink, sizeof(float) * g_sms * 256));
  j.open("gemm_mix_d128_cycles_per_kv_block_2wg");
  for_each_mix(std::make_integer_sequence<int, kMixCount>{},
               [&](auto mix) { j.num(kMixNames[mix], run_gemm_mix<mix>(d_out, d_sink, iters)); });
  j.close();
  const int sm_iters = 256;
  // One mix's softmax cycles beside it: the load/store baseline, then the full softmax.
  auto beside = [&](auto mix) {
    const double b = run_softmax_beside<mix>(d_out, d_sink, sm_iters, false);
    return std::pair<double, double>{b, run_softmax_beside<mix>(d_out, d_sink, sm_iters, true)};
  };
  j.open("softmax_64x128_beside_gemm_1sm");
  const auto [base, full] = beside(std::integral_constant<int, kMixS2>{});
  j.num("baseline_cycles_subtracted_beside_s_ss", base);
  j.num("beside_s_ss_x2", full - base);
  const auto [base_rs, full_rs] = beside(std::integral_constant<int, kMixSPvRs>{});
  j.num("baseline_cycles_subtracted_beside_s_pv_rs", base_rs);
  j.num("beside_s_ss_then_pv_rs", full_rs - base_rs);
  for_each_mix(std::integer_sequence<int, kMixPvRs2, kMixSPvSs>{}, [&](auto mix) {
    const auto [b, f] = beside(mix);
    j.num(std::string("beside_") + kMixNames[mix], f - b);
  });
  // Every GEMM result live (the chains above that start from zero let the hardware drop work: see
  // s_ss_x2 against s_ss_accumulating_x2). Raw cycles too: the baseline moves with shared-memory load.
  for_each_mix(std::integer_sequence<int, kMixSAcc2, kMixSAccPvRs, kMixSAccPvSs, kMixPvRs2, kMixPvSs2>{},
               [&](auto mix) {
                 const auto [b, f] = beside(mix);
                 j.num(std::string("live_beside_") + kMixNames[mix] + "_full", f);
                 j.num(std::string("live_beside_") + kMixNames[mix] + "_baseline", b);
               });
  j.close();
  CHECK(cudaFree(d_out));
  CHECK(cudaFree(d_sink));
}

void bench_sustained_clock(Json& j) {
  long long *d_out, *d_ns;
  float* d_sink;
  CHECK(cudaMalloc(&d_out, sizeof(long long) * g_sms));
  CHECK(cudaMalloc(&d_ns, sizeof(long long) * g_sms));
  CHECK(cudaMalloc(&d_sink, sizeof(float) * g_sms * 256));
  const int iters = 3 << 20;
  std::vector<long long> cyc(g_sms), ns(g_sms);
  for (int rep = 0; rep < 2; ++rep) {  // the first run warms the GPU up
    wgmma_throughput<WgmmaForm<128>, 2><<<g_sms, 256, kWgmmaSmem>>>(d_out, d_ns, d_sink, iters);
    CHECK(cudaGetLastError());
    CHECK(cudaMemcpy(cyc.data(), d_out, sizeof(long long) * g_sms, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(ns.data(), d_ns, sizeof(long long) * g_sms, cudaMemcpyDeviceToHost));
  }
  j.open("sustained_tensor_load");
  j.num("seconds", median(ns) * 1e-9);
  j.num("sm_clock_mhz", 1e3 * median(cyc) / median(ns));
  j.num("flop_per_clk_per_sm", 2.0 * 64 * 128 * 16 * 2.0 * iters / median(cyc));
  j.num("tflops", 2.0 * 64 * 128 * 16 * 2.0 * iters * g_sms / median(ns) * 1e-3);
  j.close();
  CHECK(cudaFree(d_out));
  CHECK(cudaFree(d_ns));
  CHECK(cudaFree(d_sink));
}

void bench_handoff(Json& j) {
  const int iters = 10000;
  long long* d_out;
  CHECK(cudaMalloc(&d_out, sizeof(long long)));
  long long mb, nb;
  handoff<false><<<1, 64>>>(d_out, 100);
  handoff<false><<<1, 64>>>(d_out, iters);
  CHECK(cudaGetLastError());
  CHECK(cudaMemcpy(&mb, d_out, sizeof mb, cudaMemcpyDeviceToHost));
  handoff<true><<<1, 64>>>(d_out, iters);
  CHECK(cudaGetLastError());
  CHECK(cudaMemcpy(&nb, d_out, sizeof nb, cudaMemcpyDeviceToHost));
  j.open("handoff_cycles");
  j.num("mbarrier_arrive_to_wait", static_cast<double>(mb) / (2.0 * iters));
  j.num("named_barrier_arrive_to_sync", static_cast<double>(nb) / (2.0 * iters));
  j.close();
  CHECK(cudaFree(d_out));
}

int main(int argc, char** argv) {
  // `calibrate_sm90 exp2`: the exponential section only.
  const bool only_exp2 = argc > 1 && std::strcmp(argv[1], "exp2") == 0;
  const bool only_bwd = argc > 1 && std::strcmp(argv[1], "bwd") == 0;
  const bool only_fp8 = argc > 1 && std::strcmp(argv[1], "fp8") == 0;
  int dev = 0, clock_khz = 0;
  CHECK(cudaGetDevice(&dev));
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, dev));
  CHECK(cudaDeviceGetAttribute(&g_sms, cudaDevAttrMultiProcessorCount, dev));
  CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, dev));
  if (prop.major != 9) {
    std::fprintf(stderr, "needs an sm_90 GPU, found %s (sm_%d%d)\n", prop.name, prop.major, prop.minor);
    return 1;
  }
  Json j;
  j.s = "{";
  j.str("device", prop.name);
  j.num("sms", g_sms);
  j.num("max_clock_khz", clock_khz);
  j.str("unit", "SM clock cycles (clock64)");
  if (only_fp8) {
    bench_fp8(j);
    j.close();
    std::printf("%s\n", j.s.c_str());
    return 0;
  }
  if (only_exp2 || only_bwd) {
    if (only_exp2) bench_exp2(j);
    if (only_bwd) {
      j.open("bwd_traffic");
      bench_bwd_traffic(j);
      j.close();
    }
    j.close();
    std::printf("%s\n", j.s.c_str());
    return 0;
  }
  j.open("wgmma_bf16");
  bench_wgmma<WgmmaForm<64>>(j, "m64n64k16");
  bench_wgmma<WgmmaForm<128>>(j, "m64n128k16");
  bench_wgmma<WgmmaForm<256>>(j, "m64n256k16");
  j.close();
  // 256 MB of bf16 rows (several times the L2) for the DRAM latency.
  const uint64_t rows = (256ull << 20) / 128;
  void* big;
  CHECK(cudaMalloc(&big, rows * 128));
  CHECK(cudaMemset(big, 0x3c, rows * 128));
  j.open("tma");
  bench_tma(j, big, rows, 64);
  bench_tma(j, big, rows, 128);
  j.close();
  CHECK(cudaFree(big));
  j.open("bwd_traffic");
  bench_bwd_traffic(j);
  j.close();
  bench_exp2(j);
  bench_softmax(j);
  bench_gemm_mix(j);
  bench_handoff(j);
  bench_sustained_clock(j);
  j.close();
  std::printf("%s\n", j.s.c_str());
  return 0;
}
