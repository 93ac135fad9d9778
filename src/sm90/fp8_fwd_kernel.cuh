// sm90 attention forward in fp8 (e4m3 Q, K, V; bf16 O): the same warp-specialized pipeline as the
// 16-bit kernels (fwd_kernel.cuh), with what 8-bit operands change.
//
//   warpgroup 0   producer   one thread: each tile's Q, then K_j and V^T_j into rings of stages
//                            (full/empty mbarriers), by TMA
//   warpgroups 1, 2 consumers  64 query rows each; named barriers pass the turn at the tensor cores
//                            (ping-pong): one's softmax runs while the other's GEMMs do
//
// Per key block j, a consumer: S_j = Q K_j^T and O += P_{j-1} V_{j-1} in its turn -> wait S_j, free
// K_j -> softmax(S_j) into P_j (fp8, registers) while P V runs -> wait P V, free V_{j-1} -> rescale O
// where a row's max moved. Blocks walk from the last down, so the masked ones (the causal diagonal,
// the keys' tail) come first.
//
// What fp8 changes:
// - wgmma on 8-bit types takes both operands K-major (no transpose), so O += P V needs V with the
//   keys contiguous: a pre-pass (fp8_transpose_v) writes V^T [batch, heads_kv, head_dim, keys
//   rounded up to 128], zero past the keys.
// - P from registers: the S accumulator gives a thread keys {2c, 2c+1, 2c+8, 2c+9} (+16) of each 32,
//   the A operand of an m64nNk32 e4m3 wgmma wants {4c .. 4c+3} (+16) (c = lane % 4). Rather than
//   move bytes between lanes, each 32-key group of V^T is stored in that order (key_perm): A's key
//   k holds S's key perm(k), and V^T's column k holds V's key perm(k), so P V sums the same products.
// - P = 2^(x - m + kPOffset) with kPOffset = 8: P in (0, 256] uses e4m3's range (448 at most) and
//   keeps small weights above its smallest subnormal (2^-9) down to x - m = -17. The rescaling
//   threshold is then 0 (DESIGN.md §3: P may not grow past 2^8), and every block takes its row max
//   (the 16-bit kernels' step without it needs room above the max that e4m3 does not have:
//   docs/perf-notes.md, "The fp8 step without the row max").
// - Scores carry the descales: x = s * softmax_scale * q_descale * k_descale * log2(e); O leaves
//   multiplied by v_descale / l.
#pragma once

#include <cstdint>

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include "fa4/numerics/exp2.h"
#include "sm90/mask.cuh"
#include "ptx/sync.h"
#include "ptx/tma.h"
#include "ptx/wgmma.h"

namespace fa4::sm90::fp8 {

namespace wg = ::fa4::ptx::wgmma;

// The key order of a 32-key group of V^T (see the header): position k holds key perm(k).
__host__ __device__ constexpr int key_perm(int k) {
  const int half = k / 16, c = (k % 16) / 4, b = k % 4;
  return 16 * half + 8 * (b / 2) + 2 * c + (b % 2);
}

inline constexpr int kKeyGroup = 32;  // keys of one k32 step
inline constexpr float kPOffset = 8.0f;

template <int kHeadDim_, int kStages_, int kPolyEvery_, int kBlockN_ = 128, int kConsumers_ = 2, bool kRawMax_ = true,
          bool kTrace_ = false, bool kOneP_ = false, bool kDeferPv_ = false>
struct Fp8Config {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kConsumers = kConsumers_;  // of 64 rows each
  static constexpr int kBlockM = 64 * kConsumers;
  // Keys a block: one swizzle row of V^T (128 bytes; 64 at d256, where O's 128 registers a thread
  // leave room for S of 64 keys only).
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kVSwizzle = kBlockN;
  static_assert(kBlockN == 64 || kBlockN == 128, "V^T rows of one 64- or 128-byte swizzle row");
  static constexpr int kStages = kStages_;
  static constexpr int kThreads = 128 * (kConsumers + 1);
  // Registers a consumer thread: the 16-bit kernels' split (the producer keeps 24).
  static constexpr int kConsumerRegs = kConsumers == 2 ? 240 : 160;
  // Every kPolyEvery-th 8-key chunk of a thread's S on the FMA pipe (numerics/exp2.h); 0 = none.
  static constexpr int kPolyEvery = kPolyEvery_;
  // The row max over the raw scores in two chains a row, scaled once (where qk_scale > 0), rather
  // than over the scaled scores in one.
  static constexpr bool kRawMax = kRawMax_;
  // Clock stamps of each consumer's steps into Fp8Params::trace (Fp8Trace; tools/sm90_fp8_probe
  // trace). Never in the library's kernels.
  static constexpr bool kTrace = kTrace_;
  // One P register buffer: a step waits for P_{j-1} V (and S_j) before its softmax writes P_j over
  // P_{j-1}, instead of running the softmax under P V with a second buffer. 16 registers a thread
  // fewer at 128-key blocks: what three consumers at d64 need to fit the 128 a thread of a
  // 512-thread launch (ptxas allocates for the whole kernel, whatever setmaxnreg gives).
  static constexpr bool kOneP = kOneP_;
  // P V's wait (and V's release and O's rescale) at the start of the next step instead of after
  // the softmax: ptxas otherwise hoists that wait above the exponentials (every MUFU of the shipped
  // step issues after it, cuobjdump), so the softmax never runs under the warpgroup's own P V.
  // In the next step, behind the loop's branch, the wait stays below them.
  static constexpr bool kDeferPv = kDeferPv_;
  static_assert(!(kDeferPv && kOneP), "one P buffer waits for P V before its softmax");
  // Q and K rows: d bytes, in swizzle atoms of 64 (d64) or 128 bytes.
  static constexpr int kSwizzle = kHeadDim >= 128 ? 128 : 64;
  static constexpr int kAtoms = kHeadDim / kSwizzle;
  static constexpr int kQBytes = kBlockM * kHeadDim;
  static constexpr int kKBytes = kBlockN * kHeadDim;
  static constexpr int kVBytes = kHeadDim * kBlockN;
  static constexpr int kQOffset = 0;
  static constexpr int kKOffset = kQOffset + kQBytes;
  static constexpr int kVOffset = kKOffset + kStages * kKBytes;
  static constexpr int kBarOffset = kVOffset + kStages * kVBytes;
  // Barriers: Q full, Q empty, K full/empty and V full/empty a stage, tile full/empty of two slots;
  // then the two slots' tile indices.
  static constexpr int kBarBytes = 8 * (2 + 4 * kStages + 4) + 8;
  static constexpr int kSmemBytes = kBarOffset + kBarBytes + 1024;  // + alignment slack
  static_assert(kSmemBytes <= 227 * 1024, "shared memory over the sm90 limit");
  static_assert(kQBytes % 1024 == 0 && kKBytes % 1024 == 0 && kVBytes % 1024 == 0, "1024-byte aligned tiles");
};

struct Fp8Params {
  CUtensorMap q_map, k_map, vt_map;
  __nv_bfloat16* o;
  int64_t o_stride[3];  // elements: batch, seq, head
  float* lse;           // [batch, heads_q, seqlen_q] or null
  const float *q_descale, *k_descale, *v_descale;  // [batch, heads_kv] or null (1)
  // Zero at the launch, and again at its end (the last CTA): the tiles handed out past the grid's
  // first, then the CTAs finished (null: the static walk).
  int* tile_counter;
  int batch, seqlen_q, seqlen_k, heads_q, heads_kv;
  int window_left, window_right;  // -1 = unbounded
  float scale_log2;               // softmax_scale * log2(e)
  int m_blocks, tiles;
  unsigned long long* trace;  // Cfg::kTrace: Fp8Trace's records (else unused)
};

// The traced kernels' stamps: thread 0 of each consumer of the first kCtas CTAs writes clock64() at
// kEvents points of each of its first kSteps steady steps (the step lambda's, key blocks after a
// tile's first), record [cta][consumer][step][event]:
//   0 entry   1 K_j and V_{j-1} landed   2 the turn had   3 S_j and P V issued, the turn passed
//   4 S_j landed   5 softmax done   6 P V done   7 O rescaled (the step's end)
// (With kDeferPv, 0 -> 1 also holds the wait for the last step's P V, and 5 = 6.)
// The stamps are clock reads in the code ptxas schedules, so a traced step is a neighbour of the
// shipped one, not the same: compare traced with traced.
struct Fp8Trace {
  static constexpr int kCtas = 4, kSteps = 1024, kEvents = 8;
  static constexpr int64_t words(int consumers) { return int64_t(kCtas) * consumers * kSteps * kEvents; }
  unsigned long long* rec = nullptr;
  int n = 0;
  __device__ void open(unsigned long long* base, int consumers, int consumer, bool writer) {
    if (base != nullptr && writer && blockIdx.x < kCtas)
      rec = base + (int64_t(blockIdx.x) * consumers + consumer) * kSteps * kEvents;
  }
  __device__ void stamp(int e) {
    if (rec != nullptr && n < kSteps) rec[n * kEvents + e] = clock64();
  }
  __device__ void next() { ++n; }
};

// Swizzle mode field of a descriptor (PTX ISA 9.7.15.5.1): 1 = 128-byte, 2 = 64-byte.
template <int kSwizzle>
__device__ __forceinline__ uint64_t desc_kmajor(uint32_t addr) {
  uint64_t d = uint64_t((addr & 0x3FFFF) >> 4);
  d |= uint64_t(1) << 16;                       // leading byte offset (unused for swizzled K-major)
  d |= uint64_t((8 * kSwizzle) >> 4) << 32;     // stride byte offset: eight rows
  d |= uint64_t(kSwizzle == 128 ? 1 : 2) << 62;
  return d;
}

// Byte offset of k-step kk (32 bytes of K) in a K-major tile of `rows` rows in atoms of kSwizzle bytes.
template <int kSwizzle>
__host__ __device__ constexpr int kstep_offset(int kk, int rows) {
  return (kk * 32 / kSwizzle) * rows * kSwizzle + (kk * 32) % kSwizzle;
}

// Two floats to two e4m3 bytes (x in the low byte), rounded to nearest, saturating.
__device__ __forceinline__ uint32_t pack_e4m3x2(float x, float y) {
  return uint32_t(__nv_cvt_float2_to_fp8x2(make_float2(x, y), __NV_SATFINITE, __NV_E4M3));
}

// The tile a work index names: query block (longest first within a head) and head of a batch entry.
// Heads outermost so that the CTAs at work share each head's K and V in L2. Work indices are handed
// out in order (the grid's first, then one at a time from a counter as CTAs finish), so the
// shortest tiles (causal) come last, where they even out the CTAs' ends.
struct Fp8Tile {
  int m_block, head, batch;
};
__device__ __forceinline__ Fp8Tile fp8_tile(const Fp8Params& p, int t) {
  const int hb = t / p.m_blocks, j = t % p.m_blocks;
  return {p.m_blocks - 1 - j, hb % p.heads_q, hb / p.heads_q};
}

// Key blocks [lo, hi) that rows [m0, m0 + kBlockM) may see.
template <class Cfg>
__device__ __forceinline__ void fp8_block_range(const Fp8Params& p, int m0, int& lo, int& hi) {
  const int off = p.seqlen_k - p.seqlen_q;
  int klo = 0, khi = p.seqlen_k;
  if (p.window_left >= 0) klo = max(0, m0 + off - p.window_left);
  if (p.window_right >= 0) khi = min(khi, m0 + Cfg::kBlockM - 1 + off + p.window_right + 1);
  lo = klo / Cfg::kBlockN;
  hi = khi <= klo ? lo : (khi + Cfg::kBlockN - 1) / Cfg::kBlockN;
}

// P = 2^(s * qk_scale - base) of each element as fp8 into the A operand's registers of the k32
// steps; the sums of each row's exponentials (fp32, before rounding) into sum.
template <class Cfg>
__device__ __forceinline__ void fp8_exp_pack(const float (&s)[Cfg::kBlockN / 2], float qk_scale, const float (&base)[2],
                                             float (&sum)[2], uint32_t (&pk)[Cfg::kBlockN / 32][4]) {
  constexpr int kN = Cfg::kBlockN;
  sum[0] = sum[1] = 0.0f;
#pragma unroll
  for (int i = 0; i < kN / 8; ++i) {
    float e[4];
#pragma unroll
    for (int x = 0; x < 4; ++x) {
      const float arg = fmaf(s[4 * i + x], qk_scale, -base[x >> 1]);
      if constexpr (Cfg::kPolyEvery > 0) {
        e[x] = (i % Cfg::kPolyEvery == Cfg::kPolyEvery - 1) ? numerics::exp2_poly(arg) : numerics::exp2_mufu(arg);
      } else {
        e[x] = numerics::exp2_mufu(arg);
      }
    }
    sum[0] += e[0] + e[1];
    sum[1] += e[2] + e[3];
    // Chunk i = 4 kk + g: its (row, keys 2c, 2c + 1) bytes go to register (g / 2) * 2 of step kk
    // (row r; + 1 for row r + 8), in half g % 2.
    const int kk = i / 4, g = i % 4;
    const uint32_t lo_row = pack_e4m3x2(e[0], e[1]), hi_row = pack_e4m3x2(e[2], e[3]);
    if (g % 2 == 0) {
      pk[kk][(g / 2) * 2] = lo_row;
      pk[kk][(g / 2) * 2 + 1] = hi_row;
    } else {
      pk[kk][(g / 2) * 2] |= lo_row << 16;
      pk[kk][(g / 2) * 2 + 1] |= hi_row << 16;
    }
  }
}

// Whether some key of the block [k0, k0 + kBlockN) is hidden from some row of the tile at m0: keys
// past seqlen_k, or outside the window of a row. (mask.cuh's block_needs_mask is the same rule; its
// early returns and row_query fold compiled to three more branches and ~40 more instructions in
// each kernel here, so the fp8 step keeps this one-expression form.)
template <class Cfg>
__device__ __forceinline__ bool fp8_block_masked(const Fp8Params& p, int k0, int m0, int off) {
  constexpr int kN = Cfg::kBlockN;
  const bool tail = k0 + kN > p.seqlen_k;
  const bool right = p.window_right >= 0 && k0 + kN - 1 > m0 + off + p.window_right;
  const bool left = p.window_left >= 0 && k0 < m0 + Cfg::kBlockM - 1 + off - p.window_left;
  return tail || right || left;
}

// One block's softmax: masks S (keys past seqlen_k, the window's bounds) where the block is cut,
// takes the rows' new max (the running max and row_sum move to it; alpha is the factor O takes),
// and packs P = 2^(x - m + kPOffset) as fp8 into the A operand's registers of the k32 steps.
template <class Cfg>
__device__ __forceinline__ void fp8_softmax(const Fp8Params& p, float (&s)[Cfg::kBlockN / 2], int k0, int m0, int row0,
                                            int quad, int off, float qk_scale, float (&row_max)[2],
                                            float (&row_sum)[2], float (&alpha)[2],
                                            uint32_t (&pk)[Cfg::kBlockN / 32][4]) {
  constexpr int kN = Cfg::kBlockN;
  // The 16-bit kernels' mask, whose S layout this is: one compare and a select an element on the
  // causal diagonal, where the per-element test below compiles to a branch an element. With three
  // consumers (128 registers a thread) apply_mask spills, 16 bytes one-sided and 44 two-sided, so
  // they keep the test.
  if (fp8_block_masked<Cfg>(p, k0, m0, off)) {
    if constexpr (Cfg::kConsumers < 3) {
      apply_mask<kN>(s, Window{p.window_left, p.window_right}, row0, k0 + 2 * quad, p.seqlen_q, p.seqlen_k);
    } else {
#pragma unroll
      for (int i = 0; i < kN / 8; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = k0 + 8 * i + 2 * quad + (e & 1);
          const int q = row0 + 8 * (e >> 1);
          const bool out = key >= p.seqlen_k || (p.window_right >= 0 && key > q + off + p.window_right) ||
                           (p.window_left >= 0 && key < q + off - p.window_left);
          if (out) s[4 * i + e] = -INFINITY;
        }
    }
  }
  // Row max over the block (a row lives in the four lanes of a quad), in log2 units: over the raw
  // scores in two chains a row, scaled once, where qk_scale > 0 (a zero or negative descale would
  // turn the max into a min).
  float new_max[2] = {row_max[0], row_max[1]};
  if (Cfg::kRawMax && qk_scale > 0.0f) {
    float mx[2][2] = {{s[0], s[4]}, {s[2], s[6]}};
#pragma unroll
    for (int i = 0; i < kN / 8; ++i)
#pragma unroll
      for (int r = 0; r < 2; ++r) mx[r][i % 2] = fmaxf(mx[r][i % 2], fmaxf(s[4 * i + 2 * r], s[4 * i + 2 * r + 1]));
#pragma unroll
    for (int r = 0; r < 2; ++r) new_max[r] = fmaxf(new_max[r], fmaxf(mx[r][0], mx[r][1]) * qk_scale);
  } else {
#pragma unroll
    for (int i = 0; i < kN / 8; ++i) {
      new_max[0] = fmaxf(new_max[0], fmaxf(s[4 * i], s[4 * i + 1]) * qk_scale);
      new_max[1] = fmaxf(new_max[1], fmaxf(s[4 * i + 2], s[4 * i + 3]) * qk_scale);
    }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    new_max[r] = fmaxf(new_max[r], __shfl_xor_sync(0xffffffffu, new_max[r], 1));
    new_max[r] = fmaxf(new_max[r], __shfl_xor_sync(0xffffffffu, new_max[r], 2));
  }
  const float base[2] = {(new_max[0] == -INFINITY ? 0.0f : new_max[0]) - kPOffset,
                         (new_max[1] == -INFINITY ? 0.0f : new_max[1]) - kPOffset};
  float sum[2];
  fp8_exp_pack<Cfg>(s, qk_scale, base, sum, pk);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    alpha[r] = new_max[r] == row_max[r] ? 1.0f : numerics::exp2_mufu(row_max[r] - new_max[r]);
    row_sum[r] = row_sum[r] * alpha[r] + sum[r];
    row_max[r] = new_max[r];
  }
}

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 1) fp8_fwd_kernel(const __grid_constant__ Fp8Params p) {
  constexpr int kD = Cfg::kHeadDim, kN = Cfg::kBlockN, kS = Cfg::kStages;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + Cfg::kBarOffset);
  uint64_t* q_full = bars;
  uint64_t* q_empty = bars + 1;
  uint64_t* k_full = bars + 2;
  uint64_t* k_empty = k_full + kS;
  uint64_t* v_full = k_empty + kS;
  uint64_t* v_empty = v_full + kS;
  uint64_t* tile_full = v_empty + kS;  // [2]
  uint64_t* tile_empty = tile_full + 2;  // [2]
  int* tile_slot = reinterpret_cast<int*>(tile_empty + 2);  // [2]

  const int warpgroup = threadIdx.x / 128;
  if (threadIdx.x == 0) {
    ptx::mbar_init(q_full, 1);
    ptx::mbar_init(q_empty, Cfg::kConsumers);
    for (int s = 0; s < kS; ++s) {
      ptx::mbar_init(&k_full[s], 1);
      ptx::mbar_init(&k_empty[s], Cfg::kConsumers);
      ptx::mbar_init(&v_full[s], 1);
      ptx::mbar_init(&v_empty[s], Cfg::kConsumers);
    }
    for (int s = 0; s < 2; ++s) {
      ptx::mbar_init(&tile_full[s], 1);
      ptx::mbar_init(&tile_empty[s], 128 * Cfg::kConsumers);
    }
    ptx::fence_barrier_init();
  }
  __syncthreads();

  if (warpgroup == 0) {  // ---------------------------------------------------------- producer
    ptx::regs_decrease<24>();
    if (threadIdx.x != 0) return;
    ptx::prefetch_tensor_map(&p.q_map);
    ptx::prefetch_tensor_map(&p.k_map);
    ptx::prefetch_tensor_map(&p.vt_map);
    int stage = 0, q_loads = 0, slot = 0;
    uint32_t phase = 0, slot_phase = 0;
    int handed = 0;  // (the static walk's count)
    for (int t = blockIdx.x;;
         t = p.tile_counter ? int(gridDim.x) + atomicAdd(p.tile_counter, 1) : int(blockIdx.x) + handed * int(gridDim.x)) {
      ++handed;
      // The tile to the consumers (-1: none left).
      ptx::mbar_wait(&tile_empty[slot], slot_phase ^ 1);
      tile_slot[slot] = t < p.tiles ? t : -1;
      ptx::mbar_arrive(&tile_full[slot]);
      if (++slot == 2) slot = 0, slot_phase ^= 1;
      if (t >= p.tiles) {
        // This CTA's last claim is made: the one that finds every other CTA finished zeroes the
        // counter for the stream's next launch (detail::stream_counters).
        if (p.tile_counter != nullptr) {
          __threadfence();
          if (atomicAdd(p.tile_counter + 1, 1) == int(gridDim.x) - 1) {
            atomicExch(p.tile_counter, 0);
            atomicExch(p.tile_counter + 1, 0);
          }
        }
        break;
      }
      const Fp8Tile tl = fp8_tile(p, t);
      const int m0 = tl.m_block * Cfg::kBlockM, hk = tl.head / (p.heads_q / p.heads_kv);
      int lo, hi;
      fp8_block_range<Cfg>(p, m0, lo, hi);
      if (hi <= lo) continue;  // the consumers skip it too
      // The previous Q's last S has read it (the (q_loads - 1)-th completion of q_empty).
      if (q_loads > 0) ptx::mbar_wait(q_empty, uint32_t(q_loads - 1) & 1u);
      ++q_loads;
      ptx::mbar_arrive_expect_tx(q_full, Cfg::kQBytes);
#pragma unroll
      for (int a = 0; a < Cfg::kAtoms; ++a)
        ptx::tma_load_4d(smem + Cfg::kQOffset + a * Cfg::kBlockM * Cfg::kSwizzle, &p.q_map, q_full,
                         a * Cfg::kSwizzle, m0, tl.head, tl.batch);
      for (int j = hi - 1; j >= lo; --j) {
        ptx::mbar_wait(&k_empty[stage], phase ^ 1);
        ptx::mbar_arrive_expect_tx(&k_full[stage], Cfg::kKBytes);
#pragma unroll
        for (int a = 0; a < Cfg::kAtoms; ++a)
          ptx::tma_load_4d(smem + Cfg::kKOffset + stage * Cfg::kKBytes + a * kN * Cfg::kSwizzle, &p.k_map,
                           &k_full[stage], a * Cfg::kSwizzle, j * kN, hk, tl.batch);
        ptx::mbar_wait(&v_empty[stage], phase ^ 1);
        ptx::mbar_arrive_expect_tx(&v_full[stage], Cfg::kVBytes);
        ptx::tma_load_4d(smem + Cfg::kVOffset + stage * Cfg::kVBytes, &p.vt_map, &v_full[stage], j * kN, 0, hk,
                         tl.batch);
        if (++stage == kS) stage = 0, phase ^= 1;
      }
    }
    return;
  }

  // ---------------------------------------------------------------------------------- consumers
  ptx::regs_increase<Cfg::kConsumerRegs>();
  const int consumer = warpgroup - 1;
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
  const int row_in_tile = consumer * 64 + warp * 16 + lane / 4;  // and + 8
  const int quad = lane % 4;
  constexpr uint32_t kTurnBar = 1;  // named barriers 1..kConsumers: consumer c's turn, passed round
  auto turn_wait = [&] { ptx::named_bar_sync(kTurnBar + consumer, 256); };
  auto turn_pass = [&] { ptx::named_bar_arrive(kTurnBar + (consumer + 1) % Cfg::kConsumers, 256); };
  if (consumer == Cfg::kConsumers - 1) turn_pass();  // consumer 0 goes first

  [[maybe_unused]] Fp8Trace tr;
  if constexpr (Cfg::kTrace) tr.open(p.trace, Cfg::kConsumers, consumer, tid == 0);
  auto stamp = [&](int e) {
    if constexpr (Cfg::kTrace) tr.stamp(e);
  };

  const uint32_t q_base = ptx::smem_addr(smem + Cfg::kQOffset) + consumer * 64 * Cfg::kSwizzle;
  const uint32_t k_base = ptx::smem_addr(smem + Cfg::kKOffset);
  const uint32_t v_base = ptx::smem_addr(smem + Cfg::kVOffset);

  int stage = 0, slot = 0;
  uint32_t phase = 0, q_phase = 0, slot_phase = 0;
  for (;;) {
    ptx::mbar_wait(&tile_full[slot], slot_phase);
    const int t = tile_slot[slot];
    ptx::mbar_arrive(&tile_empty[slot]);
    if (++slot == 2) slot = 0, slot_phase ^= 1;
    if (t < 0) break;
    const Fp8Tile tl = fp8_tile(p, t);
    const int m0 = tl.m_block * Cfg::kBlockM, hk = tl.head / (p.heads_q / p.heads_kv);
    int lo, hi;
    fp8_block_range<Cfg>(p, m0, lo, hi);
    const int row0 = m0 + row_in_tile;  // this thread's rows: row0, row0 + 8
    const int dsc = tl.batch * p.heads_kv + hk;
    const float qk_scale = p.scale_log2 * (p.q_descale ? p.q_descale[dsc] : 1.0f) *
                           (p.k_descale ? p.k_descale[dsc] : 1.0f);
    float o[kD / 2];
    float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.0f, 0.0f};
    if (hi > lo) {
      ptx::mbar_wait(q_full, q_phase);
      q_phase ^= 1;
      // P in two register buffers, alternated by the loop (register arrays need constant indices):
      // a step packs P_j into the one P V of block j + 1 is not reading.
      // (With one P buffer pa and pb are the same registers.)
      uint32_t pbuf[Cfg::kOneP ? 1 : 2][kN / 32][4];
      auto& pa = pbuf[0];
      auto& pb = pbuf[Cfg::kOneP ? 0 : 1];
      const int off = p.seqlen_k - p.seqlen_q;
      auto issue_s = [&](float (&sc)[kN / 2], int st) {
        const uint32_t kb = k_base + st * Cfg::kKBytes;
#pragma unroll
        for (int kk = 0; kk < kD / 32; ++kk)
          wg::mma_ss<kN, wg::Type::kE4M3>(sc, desc_kmajor<Cfg::kSwizzle>(q_base + kstep_offset<Cfg::kSwizzle>(kk, Cfg::kBlockM)),
                                          desc_kmajor<Cfg::kSwizzle>(kb + kstep_offset<Cfg::kSwizzle>(kk, kN)), kk > 0);
      };
      auto issue_pv = [&](int st, const uint32_t (&pr)[kN / 32][4], bool accumulate) {
        const uint32_t vb = v_base + st * Cfg::kVBytes;
#pragma unroll
        for (int kk = 0; kk < kN / 32; ++kk)
          wg::mma_rs_kb<kD, wg::Type::kE4M3>(o, pr[kk], desc_kmajor<Cfg::kVSwizzle>(vb + kk * 32),
                                             accumulate || kk > 0);
      };

      // The first block: S alone.
      int j = hi - 1;
      {
        float sc[kN / 2];
        ptx::mbar_wait(&k_full[stage], phase);
        turn_wait();
        wg::fence();
        issue_s(sc, stage);
        wg::commit_group();
        turn_pass();
        wg::wait_group<0>();
        wg::pin(sc);
        if (lane == 0 && warp == 0) ptx::mbar_arrive(&k_empty[stage]);
        if (j == lo && lane == 0 && warp == 0) ptx::mbar_arrive(q_empty);  // Q's last read
        float alpha[2];
        fp8_softmax<Cfg>(p, sc, j * kN, m0, row0, quad, off, qk_scale, row_max, row_sum, alpha, pa);
      }
      int prev_stage = stage;
      uint32_t prev_phase = phase;
      if (++stage == kS) stage = 0, phase ^= 1;
      bool o_started = false;
      // Rows' max moves O still owes its rescale (kDeferPv), and the V stage of the P V in flight.
      [[maybe_unused]] float owed[2] = {1.0f, 1.0f};
      [[maybe_unused]] int pending_v = -1;
      auto rescale_o = [&](const float (&alpha)[2]) {  // where a row's max moved (threshold 0)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          if (alpha[r] != 1.0f) {
#pragma unroll
            for (int i = 0; i < kD / 8; ++i) o[4 * i + 2 * r] *= alpha[r], o[4 * i + 2 * r + 1] *= alpha[r];
          }
        }
      };
      // The P V in flight (its P in pbuf) done: O and that P held in their registers until then.
      auto pv_done = [&](uint32_t (&pbuf)[kN / 32][4]) {
        wg::wait_group<0>();
        wg::pin(o);
#pragma unroll
        for (int kk = 0; kk < kN / 32; ++kk) wg::pin(pbuf[kk]);
      };
      // kDeferPv: the P V in flight done, its V released, O rescaled.
      auto settle = [&](uint32_t (&pbuf)[kN / 32][4]) {
        pv_done(pbuf);
        if (pending_v >= 0 && lane == 0 && warp == 0) ptx::mbar_arrive(&v_empty[pending_v]);
        pending_v = -1;
        rescale_o(owed);
        owed[0] = owed[1] = 1.0f;
      };
      // Block j: S_j and P_{j+1} V_{j+1} (P in pr) in one turn, then the softmax of S_j into pw.
      auto step = [&](int jj, uint32_t (&pr)[kN / 32][4], uint32_t (&pw)[kN / 32][4]) {
        float sc[kN / 2];
        stamp(0);
        if constexpr (Cfg::kDeferPv) settle(pw);  // the last step's P V read pw
        ptx::mbar_wait(&k_full[stage], phase);
        ptx::mbar_wait(&v_full[prev_stage], prev_phase);
        stamp(1);
        turn_wait();
        stamp(2);
        wg::fence();
        issue_s(sc, stage);
        wg::commit_group();
        issue_pv(prev_stage, pr, o_started);
        wg::commit_group();
        turn_pass();
        stamp(3);
        // S_j landed (kOneP: and P V, before the softmax writes over its P); then the softmax; then,
        // unless deferred (kDeferPv) or done, P V's wait.
        if constexpr (Cfg::kOneP) pv_done(pr);
        else wg::wait_group<1>();
        wg::pin(sc);
        stamp(4);
        if (lane == 0 && warp == 0) ptx::mbar_arrive(&k_empty[stage]);
        if (jj == lo && lane == 0 && warp == 0) ptx::mbar_arrive(q_empty);  // Q's last read
        if (Cfg::kOneP && lane == 0 && warp == 0) ptx::mbar_arrive(&v_empty[prev_stage]);
        float alpha[2];
        fp8_softmax<Cfg>(p, sc, jj * kN, m0, row0, quad, off, qk_scale, row_max, row_sum, alpha, pw);
        stamp(5);
        if constexpr (Cfg::kDeferPv) {
          owed[0] = alpha[0], owed[1] = alpha[1];
          pending_v = prev_stage;
        } else if constexpr (!Cfg::kOneP) {
          pv_done(pr);
          if (lane == 0 && warp == 0) ptx::mbar_arrive(&v_empty[prev_stage]);
        }
        stamp(6);
        o_started = true;
        if constexpr (!Cfg::kDeferPv) rescale_o(alpha);
        stamp(7);
        if constexpr (Cfg::kTrace) tr.next();
        prev_stage = stage, prev_phase = phase;
        if (++stage == kS) stage = 0, phase ^= 1;
      };
      bool last_in_b = false;
      for (--j; j >= lo; --j) {
        step(j, pa, pb);
        last_in_b = true;
        if (--j < lo) break;
        step(j, pb, pa);
        last_in_b = false;
      }
      // The last block's P V, in one more turn.
      if constexpr (Cfg::kDeferPv) {
        if (last_in_b) settle(pa);
        else settle(pb);
      }
      ptx::mbar_wait(&v_full[prev_stage], prev_phase);
      turn_wait();
      wg::fence();
      if (last_in_b) issue_pv(prev_stage, pb, o_started);
      else issue_pv(prev_stage, pa, o_started);
      wg::commit_group();
      turn_pass();
      wg::wait_group<0>();
      wg::pin(o);
      if (lane == 0 && warp == 0) ptx::mbar_arrive(&v_empty[prev_stage]);
    }

    // Epilogue: O * v_descale / l as bf16, straight from registers; LSE.
    const float vd = p.v_descale && hi > lo ? p.v_descale[dsc] : 1.0f;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float l = row_sum[r];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const int q = row0 + 8 * r;
      if (q >= p.seqlen_q) continue;
      const float inv = l > 0.0f ? vd / l : 0.0f;
      __nv_bfloat16* out = p.o + tl.batch * p.o_stride[0] + int64_t(q) * p.o_stride[1] + tl.head * p.o_stride[2];
      if (hi > lo) {
#pragma unroll
        for (int i = 0; i < kD / 8; ++i) {
          const __nv_bfloat162 v = __floats2bfloat162_rn(o[4 * i + 2 * r] * inv, o[4 * i + 2 * r + 1] * inv);
          *reinterpret_cast<__nv_bfloat162*>(out + 8 * i + 2 * quad) = v;
        }
      } else {
#pragma unroll
        for (int i = 0; i < kD / 8; ++i)
          *reinterpret_cast<__nv_bfloat162*>(out + 8 * i + 2 * quad) = __floats2bfloat162_rn(0.0f, 0.0f);
      }
      if (p.lse != nullptr && quad == 0) {
        // sum of 2^x over the row = 2^(m - kPOffset) * l, in natural log.
        const float m = row_max[r] == -INFINITY ? 0.0f : row_max[r];
        p.lse[(int64_t(tl.batch) * p.heads_q + tl.head) * p.seqlen_q + q] =
            l > 0.0f ? (__log2f(l) + m - kPOffset) * 0.69314718055994531f : -INFINITY;
      }
    }
  }
  if (consumer == 0) ptx::named_bar_sync(kTurnBar, 256);  // the last consumer's last pass
}

// V [batch, seqlen_k, heads_kv, d] (byte strides) into V^T [batch, heads_kv, d, keys] with keys
// rounded up to 128 (zeros past seqlen_k), each 32-key group in key_perm's order. One CTA a
// 128-key block of one head.
struct TransposeParams {
  const uint8_t* v;
  int64_t v_stride[3];  // bytes: batch, seq, head
  uint8_t* vt;
  int seqlen_k, keys;  // keys: seqlen_k rounded up to 128
};

template <int kD>
__global__ void __launch_bounds__(256) fp8_transpose_v(const TransposeParams p) {
  constexpr int kKeys = 128, kPitch = kD + 16;  // + 16: rows start on different banks
  __shared__ __align__(16) uint8_t tile[kKeys * kPitch];
  const int k0 = blockIdx.x * kKeys, h = blockIdx.y, b = blockIdx.z;
  const uint8_t* src = p.v + b * p.v_stride[0] + h * p.v_stride[2];
  for (int i = threadIdx.x; i < kKeys * (kD / 16); i += blockDim.x) {
    const int key = i / (kD / 16), c = i % (kD / 16);
    uint4 x = make_uint4(0, 0, 0, 0);
    if (k0 + key < p.seqlen_k) x = *reinterpret_cast<const uint4*>(src + int64_t(k0 + key) * p.v_stride[1] + 16 * c);
    *reinterpret_cast<uint4*>(&tile[key * kPitch + 16 * c]) = x;
  }
  __syncthreads();
  uint8_t* dst = p.vt + ((int64_t(b) * gridDim.y + h) * kD) * p.keys + k0;
  for (int i = threadIdx.x; i < kD * (kKeys / 16); i += blockDim.x) {
    const int d = i / (kKeys / 16), chunk = i % (kKeys / 16);  // 16 positions of a 128-key row
    uint32_t w[4];
#pragma unroll
    for (int x = 0; x < 4; ++x) {
      uint32_t v = 0;
#pragma unroll
      for (int y = 0; y < 4; ++y) {
        const int pos = 16 * chunk + 4 * x + y;
        const int key = (pos / kKeyGroup) * kKeyGroup + key_perm(pos % kKeyGroup);
        v |= uint32_t(tile[key * kPitch + d]) << (8 * y);
      }
      w[x] = v;
    }
    *reinterpret_cast<uint4*>(dst + int64_t(d) * p.keys + 16 * chunk) = make_uint4(w[0], w[1], w[2], w[3]);
  }
}

}  // namespace fa4::sm90::fp8
