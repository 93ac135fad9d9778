// sm90 attention forward: a warp-specialized TMA / wgmma pipeline on a persistent grid.
//
//   warpgroup 0     producer   TMA: each tile's Q (a ring of 1-2 buffers), then K_j and V_j into
//                              rings of stages with full/empty mbarriers; with two consumers one
//                              thread loads Q and K and a thread of another warp V (d256, one Q
//                              buffer: a thread a consumer loads that consumer's rows of Q once
//                              its last S has read them, and O leaves through the tile's last K/V
//                              slots)
//   warpgroups 1..  consumers  64 query rows each (two, or three at d64); named barriers pass the
//                              right to issue GEMMs around them (ping-pong), so one's softmax runs
//                              while another's GEMMs hold the tensor cores (a tile's first S, which
//                              waits on no softmax, goes out without its turn except at d256)
//
// Clusters of two CTAs (kCluster = 2, tiles of one length): the two take neighbouring query
// blocks of one head and share every K/V block, each loading half of it by TMA multicast into
// both; a slot is free when the consumers of both CTAs have released it (their arrives go to both
// CTAs' empty barriers). Halves the K/V traffic from L2 to the SMs.
//
// Stream-K pieces (kSplit, tiles of one length, or on single CTAs tiles of one query block a head
// under a bound, whose key ranges are alike): where the last round would leave much of the
// grid idle, the launch cuts the remaining tiles' key blocks into one equal run a unit
// (tile_order.cuh); a piece runs the same pipeline over its sub-range of key blocks and, unless it
// is its tile's only piece, hands its unnormalised O and row stats to the tile's last piece, which
// merges them (epilogue.cuh, merge_pieces). A separate instantiation: whole-tile launches keep
// their code.
//
// Each consumer, per K/V block j (intra-warpgroup overlap; order from the generated schedule):
//   issue S_j = Q K_j^T, then O += P_{j-1} V_{j-1}  ->  wait S_j, free K_j  ->  softmax(S_j) while
//   P V runs  ->  pack P_j (second register buffer)  ->  wait P V, free V_{j-1}  ->  rescale O
//   only if a row max moved. The next step's K and V barriers are tested (non-blocking) during the
//   softmax, so a step whose tiles have landed goes straight to its turn; wgmma descriptors are
//   built once and moved by constant offsets.
// Or, with FwdConfig::kSerialStep (d256's short causal rows, 128-key blocks, one K and one V slot):
//   P_{j-1} V_{j-1} in one turn  ->  wait it, free V_{j-1}  ->  S_j in the next turn  ->  wait S_j,
//   free K_j  ->  softmax(S_j), rescale O, pack P_j. The consumers' turns alternate one GEMM each,
//   so one's softmax runs under the other's GEMM and K_{j+1} lands under both P V.
//
// Where each idea lives: softmax.cuh (conditional rescaling, software exp2 share), mask.cuh
// (causal / window / tails), tile_order.cuh (persistent tile walk, stream-K pieces), epilogue.cuh
// (O and LSE out, the pieces' merge),
// scheduler/generated/sm90_fwd_schedule.h (ring depth, GEMM order), ptx/ (the instructions).
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "fa4/numerics/online_softmax.h"
#include "ptx/sync.h"
#include "ptx/tma.h"
#include "ptx/wgmma.h"
#include "sm90/epilogue.cuh"
#include "sm90/mask.cuh"
#include "sm90/softmax.cuh"
#include "sm90/tile_order.cuh"
#include "sm90_fwd_schedule.h"

namespace fa4::sm90 {

// Whether consumer h issues P V of block j-1 before S of block j in the solver's schedule
// (scheduler/graphs/sm90_fwd.graph): op a of iteration i starts at kStart[a] + i * kII, so P V of
// j-1 comes first when kStart[O_h] - kII < kStart[S_h]. Consumers beyond two repeat them.
namespace sched_fwd = sched::sm90_fwd;
inline constexpr bool kSchedPvFirst0 =
    sched_fwd::kStart[int(sched_fwd::Op::O0)] - sched_fwd::kII < sched_fwd::kStart[int(sched_fwd::Op::S0)];
inline constexpr bool kSchedPvFirst1 =
    sched_fwd::kStart[int(sched_fwd::Op::O1)] - sched_fwd::kII < sched_fwd::kStart[int(sched_fwd::Op::S1)];
__device__ __forceinline__ bool sched_pv_first(int consumer) {
  return consumer % 2 == 0 ? kSchedPvFirst0 : kSchedPvFirst1;
}

// A stream-K piece's place in one word: piece and pieces (10 bits each), tail tile (12 bits).
__device__ __forceinline__ uint32_t pack_place(const Tile& tl) {
  return uint32_t(tl.piece) | uint32_t(tl.pieces) << 10 | uint32_t(tl.tail) << 20;
}
__device__ __forceinline__ void unpack_place(uint32_t w, Tile& tl) {
  tl.piece = int(w & 1023u);
  tl.pieces = int(w >> 10 & 1023u);
  tl.tail = int(w >> 20);
}

// The key blocks a work item covers: its tile's range, or a stream-K piece's part of it.
// kShort: pieces cut along the launch's longest key range, of a tile whose range may be shorter
// (a batch entry with fewer keys, FwdKernelParams::seqused_k): those past its own range are empty
// or cut short.
template <bool kShort = false>
__host__ __device__ __forceinline__ BlockRange piece_range(BlockRange r, const Tile& tl) {
  return tl.hi < 0 ? r : BlockRange{r.lo + tl.lo, kShort ? min(r.hi, r.lo + tl.hi) : r.lo + tl.hi};
}

// Tile shape and shared-memory layout of one forward configuration.
template <int kHeadDim_, int kBlockN_, int kStages_, bool kBF16_, int kPolyEvery_, int kConsumers_ = 2,
          bool kScheduledOrder_ = true, bool kAllowDoubleP_ = true, bool kSoftmaxTurns_ = false,
          bool kTensorRowSum_ = false, bool kSmemP_ = false, bool kStageOInKV_ = false, int kTurnMode_ = 0,
          bool kNoBlockMax_ = (kHeadDim_ <= 128), bool kSerial_ = false>
struct FwdConfig {
  // A step without the overlap inside a warpgroup (d256 on 128-key blocks, one K and one V slot):
  // P_{j-1} V_{j-1} in one turn, S_j in the next, then the softmax of S_j while the other
  // consumer's GEMMs run. S_j is issued only once P_{j-1} V_{j-1} is done, so S and P never hold
  // registers together (O 128 + S 64 a thread), and K_{j+1} loads under both consumers' P V.
  // Consumer 0's O is staged in a buffer of its own, so the next tile's first K need not wait for
  // its store (FwdConfig::kStageO0Apart).
  static constexpr bool kSerialStep = kSerial_;
  // Steady-state steps on unmasked key blocks take no row max (softmax.cuh, softmax_step_no_max):
  // the exponentials run against the running max as it stands and each thread's partial row sums
  // bound them; a warpgroup whose check fails computes S again and takes the exact step. On an
  // H100 +7.5...+12 % at d64, +3...+5 % at d128 (docs/perf-notes.md). Not at d256: a step that
  // may compute S again keeps Q to the tile's end, so it would turn off the early Q free
  // (fwd_kernel's kEarlyQFree; ptxas used to spill 84-136 bytes with it and no longer does, but it
  // has not been timed against that).
  static constexpr bool kNoBlockMax = kNoBlockMax_ && !kTensorRowSum_ && !kSmemP_;
  // How consumers take turns at the tensor cores: 0 ping-pong (a consumer issues S_j and
  // P_{j-1} V_{j-1}, then passes the turn); 1 the turn passes right after S_j, so the next
  // consumer's S can go out beside this one's P V; 2 no turns (each consumer issues when ready).
  static constexpr int kTurnMode = kTurnMode_;
  // P through shared memory: the softmax writes P_j by stmatrix into a swizzled tile beside K and V
  // and P V reads it from there (SS wgmma) instead of from registers. Tried at d64 (FA3's operand
  // path there): correct, 8-11 % slower, the issue no shorter (docs/perf-notes.md); off everywhere.
  static constexpr bool kSmemP = kSmemP_;
  // The row sums of P taken on the tensor cores instead of in the softmax: each k-step of P V also
  // multiplies P by a 16 x 8 tile of ones in shared memory (m64n8k16), so the softmax drops its
  // FADD per element and the sums (of the 16-bit P that P V uses) rescale with O.
  static constexpr bool kTensorRowSum = kTensorRowSum_;
  // Consumers take their softmaxes in turn too (a second ring of named barriers), so two never
  // share a sub-partition's issue slots and exp unit. Measured: no shorter softmax, the period
  // 1-2 % longer at d128 (docs/perf-notes.md); off everywhere.
  static constexpr bool kSoftmaxTurns = kSoftmaxTurns_;
  // Q and K from one producer thread, V from a thread of another warp, so K_{j+1} never waits
  // behind V_j's slot. With three consumers the second spinning producer warp costs issue slots
  // the softmax needs, and one thread loads everything.
  static constexpr bool kSplitLoads = kConsumers_ == 2;
  // Steady-state GEMM order from the generated schedule (true) or S first for every consumer
  // (false). The graph now states the intra-warpgroup overlap's issue order (S_j before
  // P_{j-1}V_{j-1}), so both give S first; an earlier schedule with P V first for consumer 0
  // measured 10-15 % slower (docs/perf-notes.md).
  static constexpr bool kScheduledOrder = kScheduledOrder_;
  // Two P register buffers where O, S and both P (kHeadDim / 2 + kBlockN / 2 + 2 x kBlockN / 4
  // registers) take at most 192 of a consumer's 240 (two consumers) or 128 of its 160 (three):
  // d64 and d128 with 128-wide blocks and two consumers, d128 with 64-wide blocks and three (the
  // shipped d64, three consumers and 128-wide blocks, has one; d256 with 80-wide blocks would need
  // 208: ptxas spills). Four consumers (112 registers) hold one.
  static constexpr bool kDoubleP = kAllowDoubleP_ && !kSmemP_ && kConsumers_ <= 3 &&
                                   kHeadDim_ / 2 + kBlockN_ <= (kConsumers_ == 2 ? 192 : 128);
  static_assert(!(kSmemP_ && kTensorRowSum_), "P in shared memory: no register A operand");
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kConsumers = kConsumers_;  // consumer warpgroups, 64 query rows each
  static_assert(kConsumers >= 2 && kConsumers <= 4, "two to four consumers");
  static constexpr int kBlockM = 64 * kConsumers;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kStages = kStages_;
  static constexpr bool kBF16 = kBF16_;
  // Every kPolyEvery-th 8-column chunk of S takes its exp2 on the FMA pipe (0: none).
  static constexpr int kPolyEvery = kPolyEvery_;
  static constexpr int kThreads = 128 * (1 + kConsumers);
  // setmaxnreg: the producer gives its registers to the consumers. The pool is what the CTA got at
  // launch, kThreads x kLaunchRegs (65536 / kThreads rounded down to 8: 168 for two consumers, 128
  // for three, 96 for four), not the register file: asking for more than it holds blocks
  // setmaxnreg.inc for ever.
  static constexpr int kLaunchRegs = 65536 / kThreads / 8 * 8;
  static constexpr int kConsumerRegs = kConsumers == 2 ? 240 : kConsumers == 3 ? 160 : 112;
  static constexpr int kProducerRegs = 24;
  // The stream-K kernel's producer walks pieces too: with three or four consumers it takes the 8
  // the pool has to spare.
  static constexpr int kProducerRegsSplit = kConsumers == 2 ? 24 : 32;
  static_assert(kProducerRegsSplit + kConsumers * kConsumerRegs <= (1 + kConsumers) * kLaunchRegs,
                "setmaxnreg would ask for more registers than the CTA's pool");
  static constexpr int kAtomCols = 64;  // a 128-byte swizzle atom holds 64 16-bit columns
  static constexpr int kChunks = kHeadDim / kAtomCols;
  // The value side (V, O): head_dim's here; ValueDimConfig (fwd_configs.cuh) narrows it. A V block
  // loads kVChunks chunks (kVBytes) into a slot of kKVBytes, so the shared layout stays the same.
  static constexpr int kHeadDimV = kHeadDim;
  static constexpr int kVChunks = kChunks;
  static constexpr int kVBytes = kBlockN_ * kHeadDim * 2;

  // Shared memory: Q tile, K ring, V ring (each as [chunk][row][64], 1024-byte aligned), barriers.
  static constexpr int kQBytes = kBlockM * kHeadDim * 2;
  static constexpr int kKVBytes = kBlockN * kHeadDim * 2;
  // Two Q buffers where they fit: the next tile's Q loads while this tile still reads its own.
  static constexpr int kBarBytes = 512;      // FwdBarriers, rounded up
  static constexpr int kAlignSlack = 1024;   // the dynamic shared base is aligned up to 1024 bytes
  static constexpr int kSmemLimit = 227 * 1024;
  static constexpr int kPBytes = kSmemP ? kBlockM * kBlockN * 2 : 0;  // laid out as Q is: [chunk][row][64]
  static constexpr int kQStages =
      2 * kQBytes + 2 * kStages * kKVBytes + kPBytes + kBarBytes + kAlignSlack <= kSmemLimit ? 2 : 1;
  static constexpr int kQOffset = 0;
  static constexpr int kKOffset = kQOffset + kQStages * kQBytes;
  static constexpr int kVOffset = kKOffset + kStages * kKVBytes;
  static constexpr int kPOffset = kVOffset + kStages * kKVBytes;
  static constexpr int kOOffset = kPOffset + kPBytes;
  // O leaves through a shared-memory tile of its own and a TMA store where shared memory allows
  // (not at d256, which stages it in K/V slots: kStageOInKV below); with three consumers H100
  // d64 512 +4.9 %, 1k +1.0 % (docs/perf-notes.md, "O staged at three consumers").
  static constexpr bool kStageO = kOOffset + kQBytes + kBarBytes + kAlignSlack <= kSmemLimit;
  // Where no shared memory is left for O (d256: one Q buffer), O staged in the K/V slots of the
  // tile's last key block, consumer 0's in the K slot and consumer 1's in the V slot (a slot of
  // 64 keys or more holds a consumer's 64 rows of O), each held from the loader until its TMA
  // store has read it (FwdBarriers::kv_read); each consumer's rows of Q go back to its Q loader
  // once its last S is done (FwdBarriers::q_free), so the next tile's Q loads under the last
  // softmax, the last P V and the epilogue.
  // Storing 128 accumulators a thread straight to global memory took 5300-8000 cycles a tile,
  // staged 2800: +2...+9 % at d256 on an H100; staged in the Q buffer instead, the next Q waited
  // for the store (2.5-4.5k cycles at 512): H100 d256 512 +2.2 %, 1k +1.8 %, causal 512 +1.0 %
  // (docs/perf-notes.md, "d256: O staged in the last K/V slots"). Whole-tile kernels only
  // (fwd_kernel's kOInKV).
  static constexpr bool kStageOInKV = kStageOInKV_ && !kStageO && kQStages == 1 && kConsumers == 2;
  static constexpr bool kTmaStoreO = kStageO || kStageOInKV;
  // With O staged in K/V slots each consumer's 64 rows of Q and of O move as one TMA box of every
  // 64-column chunk (ptx::map_bshd_16bit_sw128_folded), not a box a chunk, so Q's buffer is laid
  // out a consumer's rows at a time ([consumer][chunk][64 rows][64]). The engine takes about as
  // long for a box of 32 KB as for one of 8 KB; with the serial step's K/V folded too, H100 d256
  // causal 512 +0.5 %, 512 +0.7 % (docs/perf-notes.md, "Folded boxes at d256").
  static constexpr bool kFoldedQO = kStageOInKV;
  static_assert(!kStageOInKV || kBlockN >= 64, "O staged in K/V slots: a slot holds a consumer's 64 rows of O");
  // Q's TMA loads and O's TMA stores carry an L2 evict_first policy (each line is read or written
  // once), so the K and V that a head's other tiles read again stay in L2. H100, four rounds:
  // d256 causal 512 +1.5 %, causal 1k +0.8 %, d128 causal 512 +0.6 %, other rows 0.997-1.004; d64
  // causal 512 0.997, so not at d64 (docs/perf-notes.md, "L2 eviction priorities").
  static constexpr bool kQOEvictFirst = kHeadDim >= 128;
  // 1 KB of ones (eight 128-byte rows): the B operand of the row-sum wgmma.
  // With the serial step consumer 0's 64 rows of O are staged in a buffer of their own after the
  // K/V slots (kOOffset), consumer 1's still in the tile's last V slot.
  static constexpr bool kStageO0Apart = kSerialStep && kStageOInKV;
  static constexpr int kOnesOffset = kOOffset + (kStageO ? kQBytes : kStageO0Apart ? kQBytes / 2 : 0);
  static constexpr int kBarOffset = kOnesOffset + (kTensorRowSum ? 1024 : 0);
  static constexpr int kSmemBytes = kBarOffset + kBarBytes + kAlignSlack;

  static_assert(kHeadDim % kAtomCols == 0, "head_dim must be a multiple of 64");
  static_assert(kBlockN % 16 == 0 && kBlockN <= 256, "wgmma N");
  static_assert(kQBytes % 1024 == 0 && kKVBytes % 1024 == 0, "tiles must keep 1024-byte alignment");
  static_assert(kSmemBytes <= kSmemLimit, "shared memory over the sm90 limit");
  static_assert(kStages >= 2 || kSerialStep, "S_{j+1} is issued while V_j is still read: two stages at least");
  static_assert(kStages <= 8, "FwdBarriers holds eight stages");
};

struct FwdKernelParams {
  CUtensorMap tm_q, tm_k, tm_v;  // [batch][heads][seq][dim] maps, dim contiguous
  CUtensorMap tm_o;              // O in boxes of 64 rows (one consumer's share)
  void* o;
  float* lse;
  int64_t o_stride[3];  // batch, seq, head (elements)
  int batch, seqlen_q, seqlen_k, heads_q, head_ratio;
  float scale_log2;
  float rescale_threshold;  // log2 units; 0 = always rescale
  Window window;
  TileOrder tiles;
  // Tiles past each CTA's first come from this counter (atomicAdd; zero at launch), so a CTA that
  // finishes early takes the next (whole tiles on single CTAs); null: the static rounds of
  // TileOrder::nth (clusters, stream-K tails). tile_counter[1] counts the CTAs that have made their
  // last claim (zero at launch); the last one zeroes both.
  int* tile_counter;
  // Stream-K tail (TileOrder::split): each piece's unnormalised O and row stats, per consumer in
  // the accumulator layout, and a counter per (tail tile, rank, consumer), zero at launch.
  float* partials;
  int* piece_counters;
  uint64_t* trace;  // development timeline (a config with kTrace = true); null otherwise
  // Variable-length batches (the kVarlen kernels): sequence b's query and key rows start at
  // cu_seqlens_q[b] and cu_seqlens_k[b] of maps over total_q and total_k rows (batch extent 1),
  // and seqlen_q, seqlen_k bound every sequence's lengths. Null in the others.
  const int* cu_seqlens_q;
  const int* cu_seqlens_k;
  int total_q, total_k;
  // Soft-capping (FwdParams::softcap), read by softcapped<Cfg>() kernels only. Last, so that the
  // other kernels' parameters keep their offsets (d256's serial-step kernel sits at the edge of
  // its registers, and a shift of the fields above moved ptxas to serialize its wgmma).
  float softcap, softcap_in;
  // Varlen::seqused_k (null: each sequence's whole key span): in the kVarlen kernels; without
  // varlen each batch entry's keys, read by the kernels with a bound at run time (fwd_kernel's
  // kEntryKeys; seq_span.cuh, entry_keys). After the soft cap for the same reason.
  const int* seqused_k;
  // A paged KV cache (FwdParams::block_table), read by the kEntryKeys kernels: tm_k and tm_v run
  // over the pools' pages (batch: page, seq: the page's row), pages of 2^page_shift rows (16 or
  // more), boxes of min(page, kBlockN) rows: a key block lies on one page or on whole pages; entry
  // b's key j is on page block_table[b * table_stride + (j >> page_shift)], clamped to
  // [0, num_pages). Null: K and V are batched tensors.
  const int* block_table;
  int table_stride, page_shift, num_pages;
  // Varlen::leftpad_k (never with block_table): in the kVarlen kernels through seq_span, and in
  // the kEntryKeys ones entry b's keys from row leftpad_k[b] (seq_span.cuh, entry_first). Null
  // without. Last, for the offsets above.
  const int* leftpad_k;
  // FwdParams::sink (null: none): each row's first score (epilogue.cuh, start_rows), row q of
  // head h taking sink[sink_index(h, q, sink_group, sink_mask)] (folded query groups).
  const float* sink;
  int sink_group;
  uint32_t sink_mask;
  // The columns O holds (FwdParams::v_cols; head_dim where O is whole): the kernels of head dim
  // 64 and 128 store no column past them from registers (epilogue.cuh, o_cols_of); TMA stores clip
  // at tm_o's extent. Last, for the offsets above.
  int o_cols;
};

// Soft-capped scores (Problem::softcap): a config that derives from a shipped one and sets
// kSoftcap = true (fwd_configs.cuh, SoftcapConfig) turns each block of S into softcap * tanh(S *
// softcap_in) before its mask and softmax (softmax.cuh, softcap_scores).
template <class Cfg>
constexpr bool softcapped() {
  return requires { requires Cfg::kSoftcap; };
}

// A paged KV cache's configuration (fwd_configs.cuh, PagedConfig): its kernels' loaders look each
// key block's pages up (FwdKernelParams::block_table, never null in them); the other kernels keep
// none of that code.
template <class Cfg>
constexpr bool paged_config() {
  return requires { requires Cfg::kPagedKV; };
}
template <class Cfg>
constexpr bool page_lanes() {
  return requires { requires Cfg::kPageLanes; };
}
template <class Cfg>
constexpr int paged_loads_offset() {
  if constexpr (paged_config<Cfg>())
    return Cfg::kPagedOffset;
  else
    return 0;
}

// Whether a soft-capped kernel takes the cap's reciprocal on the FMA pipe (softcap_score): where
// its config asks (SoftcapConfig::kCapFmaRecip) and the kernel walks whole tiles without a causal
// or window bound (kSplitOrBounded false). H200 against MUFU's reciprocal: unbounded d64 +15-17 %,
// d128 +8 %; causal d64 512 / 1k / 2k / 4k -14 / -5 / +0.5 / +6 %, d128 1k / 2k / 4k -3 / -0.4 /
// -0.4 %; decoding's stream-K pieces (d128) -2 % (docs/perf-notes.md, "A cheaper soft cap").
template <class Cfg, bool kSplitOrBounded>
constexpr bool cap_recip_on_fma() {
  if constexpr (softcapped<Cfg>())
    return Cfg::kCapFmaRecip && !kSplitOrBounded;
  else
    return false;
}

// K and V loaded as one TMA box a block, the 64-column chunks folded into a box dimension
// (ptx::map_bshd_16bit_sw128_folded), instead of a box a chunk: a config that derives from
// FwdConfig and sets kFoldedKV = true (tools/sm90_fwd_probe variants). The shipped ones do not.
template <class Cfg>
constexpr bool folded_kv() {
  if constexpr (requires { Cfg::kFoldedKV; })
    return Cfg::kFoldedKV;
  else
    return false;
}

// Development timeline: a config that derives from FwdConfig and sets kTrace = true records clock64
// stamps of its first kTraceCtas CTAs into FwdKernelParams::trace (tools/sm90_fwd_probe trace):
// per warpgroup (slot 0 the producer, 1.. the consumers) kTraceSteps records of kTraceEvents.
// After them, as many again: each consumer's tile boundaries, one record a boundary (events 0-3
// the end of a tile: steady loop done, last P V issued, done, O stored; 4-7 the next tile's
// start: Q landed, S_0 issued, done, softmax and P done). Last, every CTA's entry and end (its
// first consumer's last store issued): %globaltimer and clock64 of each, then the SM it ran on
// (%smid, from the K loader: read in stamp_cta it made ptxas serialize the traced causal serial
// kernel's wgmma), kCtaStamps words a CTA.
// The stamps are not free of the schedule: ptxas does not move the wait for P_{j-1} V_{j-1} above
// the "softmax done" clock read, so a traced kernel waits after all its exponentials, where the
// shipped one waits after ~10 (d64), ~39 (d128) or ~22 (d256) of them; at d64 every later placement
// measured 3-7 % slower (docs/perf-notes.md, "Where the single-P kernels wait for P V"). Without
// that stamp ptxas places the wait elsewhere again (d64 after 34, d128 after 2): traces show a
// neighbouring schedule, and decisions rest on A/Bs of untraced builds.
inline constexpr int kTraceCtas = 4, kTraceSteps = 512, kTraceEvents = 8, kCtaStamps = 5;
// Words of one of the first two regions (steps, boundaries) with kConsumers consumers.
template <int kConsumers>
inline constexpr int64_t kTraceRegionWords = int64_t(kTraceCtas) * (1 + kConsumers) * kTraceSteps * kTraceEvents;
// This CTA's kCtaStamps words of the last region.
template <int kConsumers>
__device__ __forceinline__ uint64_t* cta_stamps(uint64_t* trace) {
  return trace + 2 * kTraceRegionWords<kConsumers> + int64_t(blockIdx.x) * kCtaStamps;
}
// This CTA's entry (end = 0) or end (1) into the last region: %globaltimer, then clock64.
template <int kConsumers>
__device__ __forceinline__ void stamp_cta(uint64_t* trace, int end) {
  uint64_t* cs = cta_stamps<kConsumers>(trace);
  uint64_t ns;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
  cs[end] = ns;
  cs[2 + end] = clock64();
}
// The parts of the timeline a traced config records (Cfg::kTraceParts, all when it names none): the
// steps' and loads' stamps, the tile boundaries', each CTA's entry and end.
inline constexpr int kTraceStep = 1, kTraceBound = 2, kTraceCta = 4;
template <class Cfg>
constexpr bool traced(int part) {
  if constexpr (requires { Cfg::kTrace; }) {
    if constexpr (requires { Cfg::kTraceParts; })
      return Cfg::kTrace && (Cfg::kTraceParts & part) != 0;
    else
      return Cfg::kTrace;
  } else {
    return false;
  }
}
// Tests' hooks (tests/lagged_kernels.cu), absent from FwdConfig: a config with kIdleWarpLag holds
// warps 1-3 of an idle consumer that many cycles before its walk, so they reach K's first wait
// late; one with kTileWarpLag holds one warp of every consumer (another each tile) that many cycles
// once its tile's Q has landed, so the warps of a consumer and the consumers of a CTA run skewed,
// and each loader thread (K, V, Q: every third tile, in turn; the CTAs of a cluster apart) as it
// takes a tile; one with kStepWarpLag holds warp 1 or 2 of every consumer between its turn and its
// GEMM issue in each steady step.
struct TestLags {
  long long idle = 0, tile = 0, step = 0;  // cycles; 0: none
};
template <class Cfg>
constexpr TestLags test_lags() {
  TestLags l;
  if constexpr (requires { Cfg::kIdleWarpLag; }) l.idle = Cfg::kIdleWarpLag;
  if constexpr (requires { Cfg::kTileWarpLag; }) l.tile = Cfg::kTileWarpLag;
  if constexpr (requires { Cfg::kStepWarpLag; }) l.step = Cfg::kStepWarpLag;
  return l;
}
__device__ __forceinline__ void spin_cycles(long long n) {
  for (const long long t0 = clock64(); clock64() - t0 < n;) {
  }
}
struct TraceLog {
  uint64_t* rec = nullptr;
  int n = 0;
  __device__ void open(uint64_t* base, int slots, int slot) {
    if (base != nullptr && blockIdx.x < kTraceCtas)
      rec = base + (int64_t(blockIdx.x) * slots + slot) * kTraceSteps * kTraceEvents;
  }
  __device__ void stamp(int e) {
    if (rec != nullptr && n < kTraceSteps) rec[n * kTraceEvents + e] = clock64();
  }
  __device__ void next() { ++n; }
};

// Full barriers complete when TMA has landed a tile; empty barriers when both consumers are done
// with it. K and V have their own, so K_{j+2} loads as soon as S_j is done. The Q producer writes
// each tile's index beside its Q buffer before q_full's arrive (release), and every other role
// reads it after its q_full wait (acquire): one source of the tile sequence, static or dynamic.
struct alignas(16) FwdBarriers {
  // Per Q buffer: {work item, batch, head, m_block}. x is the item (TileOrder::kEnd, or a tile
  // index >= count, when the CTA has no more); in whole-tile kernels y..w are the tile decoded once
  // by the K loader, so the consumers read it in one load instead of dividing (three integer
  // divisions on each consumer's path from Q landed to S_0). With the epilogue's MUFU reciprocal
  // and log2, H100: d64 +2.2...+4.9 %, d128 512 +5.2 % (docs/perf-notes.md, "Boundary trims").
  // Stream-K pieces look theirs up (decode_item) and use x alone.
  int4 item[2];
  uint64_t q_full[2], q_empty[2];
  uint64_t k_full[8], k_empty[8];
  uint64_t v_full[8], v_empty[8];
  // This CTA's (cluster's) stream-K pieces, k = 0 and 1 (pieces == 0: none), found once at the start
  // where registers are plentiful, so the loaders' and consumers' decode is a look-up.
  Tile unit_pieces[2];
  // With one Q buffer and a Q loader a consumer (FwdConfig::kStageOInKV, whole tiles): consumer
  // c's warps arrive on q_free[c] once every S of theirs has read its rows of the buffer, and the
  // loader of consumer c's rows of the next Q waits for it (q_full[c] then tells consumer c they
  // landed). tile_pub: the K loader has published the next work item (item[0]); the V and Q
  // loaders wait for it.
  uint64_t q_free[2];
  uint64_t tile_pub;
  // There O is staged in the tile's last K/V slot: consumer 0's in the K slot, once consumer 1
  // has read its last K (kv_read[0]), consumer 1's in the V slot, once consumer 0's last P V has
  // read it (kv_read[1]); each holds its slot (no empty arrive) until its O store has read it.
  uint64_t kv_read[2];
  // The V block that holds the rows past a sequence's own keys (fwd_kernel's kZeroTail) lands on
  // v_tail instead of v_full, and the zeroing lanes take it from there: v_tail_at is {its stage,
  // the sequence's keys, the tensor's rows from the sequence's first} (x < 0: no more), posted by
  // the V loader once v_tail_free says the last one is taken. v_tail_next, the V loader's own:
  // {this tile's keys (INT_MIN: no rows to zero), the tensor's rows, -, v_tail_free's phase}.
  // v_zeroed: each zeroing lane has read v_tail_at and zeroed its rows (31 arrivals), so that lane 0
  // completes v_full and v_tail_free after all of them (an mbarrier chain, which racecheck follows
  // where __syncwarp left it 12-24 hazards).
  uint64_t v_tail, v_tail_free, v_zeroed;
  int4 v_tail_at, v_tail_next;
  // The K loader's claims so far (the static rounds' index), kept here by the kernels that read
  // entries' keys (fwd_kernel's kEntryKeys): held in a register through the tile loop it spilled
  // beside a paged cache's look-up.
  int k_round;
};
static_assert(sizeof(FwdBarriers) <= 512, "FwdConfig::kBarBytes must hold the barriers");

// A paged cache's loads (fwd_kernel's kPaged): a key block lies on one page or on up to
// kBlockN / 16 whole pages, each a TMA box a chunk. The K loader (k = 0) and the V loader (k = 1)
// hand each block to page lanes of their own warps (lanes 1 to kBlockN / 16): req[k] is {the
// block's first key, the entry's table offset (batch * table_stride), the head (varlen: the query
// head), the ring stage | 256 where V lands on v_tail} (key < 0: no more), posted on req_full[k]
// once req_empty[k] says every page lane has read the last; page lane i looks up page i of the
// block and loads it. In the loaders (24 registers a thread) the look-up and a box a page spilled
// 16-100 bytes. (Batched, a block on one page loads in the loader itself: fwd_kernel's load_kv.)
struct alignas(16) PagedLoads {
  int4 req[2];
  uint64_t req_full[2], req_empty[2];
  int sent[2];  // the loader's requests so far (req_empty's phase)
};
static_assert(sizeof(PagedLoads) <= 128, "PagedConfig's shared memory must hold the hand-over");

// A ring position as one count of the slots taken (stage and phase derived from it): one register
// where that matters (the consumers' Q ring, held through the main loop).
template <int kStages>
struct RingCount {
  static_assert(kStages == 1 || kStages == 2, "derived by shifts");
  uint32_t n = 0;
  __device__ int stage() const { return kStages == 1 ? 0 : int(n & 1u); }
  __device__ uint32_t phase() const { return kStages == 1 ? n & 1u : (n >> 1) & 1u; }
  __device__ void advance() { ++n; }
};

// Work item t of this CTA (valid or not; decoded into tl when valid): a whole tile, or one of
// the unit's stream-K pieces from the table in shared memory (FwdBarriers::unit_pieces; there,
// pieces == 0 marks none).
__device__ __forceinline__ bool decode_item(const TileOrder& order, const FwdBarriers& bar, int t, int rank, Tile& tl) {
  return order.template decode_with<false>(t, rank, tl, [&](int, int k, Tile& piece) {
    piece = bar.unit_pieces[k];
    return piece.pieces != 0;
  });
}

// Ring position shared by producer and consumers.
template <int kStages>
struct RingPos {
  int stage = 0;
  uint32_t phase = 0;
  __device__ void advance() {
    if (++stage == kStages) {
      stage = 0;
      phase ^= 1;
    }
  }
};


// Named barriers 1..kConsumers pass the right to issue GEMMs around the consumers in a ring, so
// one's softmax runs while another's GEMMs use the tensor cores (0 is __syncthreads).
__device__ __forceinline__ void wait_my_turn(int consumer) { ptx::named_bar_sync(1 + consumer, 256); }
template <int kConsumers, bool kTwoAsSub = false>
__device__ __forceinline__ void pass_turn(int consumer) {
  // kTwoAsSub: two consumers' next id as 2 - consumer, which ptxas rebuilds at each use rather
  // than holding (FwdConfig::kStageOInKV, whose epilogue peak otherwise spilled it).
  if constexpr (kTwoAsSub && kConsumers == 2)
    ptx::named_bar_arrive(2 - consumer, 256);
  else
    ptx::named_bar_arrive(1 + (consumer + 1) % kConsumers, 256);
}
// The softmax ring (FwdConfig::kSoftmaxTurns): barriers after the turn ring's and the epilogue's.
template <int kConsumers>
__device__ __forceinline__ void wait_softmax_turn(int consumer) {
  ptx::named_bar_sync(1 + 2 * kConsumers + consumer, 256);
}
template <int kConsumers>
__device__ __forceinline__ void pass_softmax_turn(int consumer) {
  ptx::named_bar_arrive(1 + 2 * kConsumers + (consumer + 1) % kConsumers, 256);
}

// Whether the stream-K kernel of single CTAs reads the launch's bound and fold (fwd_kernel's
// kSplitBound), so that tiles of one query block a head under a bound may be cut (fwd_launch.cuh,
// tiles_alike). Not the serial step's (d256 on 128-key blocks), which no such launch takes
// (d256_block_keys) and whose kernel spilled 84 bytes with it.
template <class Cfg>
constexpr bool split_reads_bound() {
  return !Cfg::kSerialStep;
}
// Whether that kernel also reads batch entries' own key lengths (fwd_kernel's kEntryKeys): not
// d64's on three or four consumers, where the entry's key count held through the loop spilled 4
// bytes (ptxas -v). Launches with such lengths keep whole tiles there (fwd_launch.cuh); d64's
// decoding rows take two consumers (d64_consumers).
template <class Cfg>
constexpr bool split_reads_entry_keys() {
  return split_reads_bound<Cfg>() && !(Cfg::kHeadDim == 64 && Cfg::kConsumers >= 3);
}

// kSplit: the kernel for a stream-K tail (TileOrder::split): work items are whole tiles or
// pieces, and pieces merge (epilogue.cuh). Without it the kernel walks whole tiles only: a separate
// instantiation, so the pieces' bookkeeping costs the other launches nothing.
// kBounded: the launch has a causal or window bound (FwdKernelParams::window). Only such launches
// run the mask's finer cuts (kConsumerMask, kHalfFirst, kSkipFirst, kSkipLeading), in their own
// instantiation, so the kernels without a bound carry none of that code: ptxas schedules them as
// before (d64's three-consumer kernel instruction for instruction). Clusters run tiles of one
// length only (fwd_launch.cuh), so they never have a bound; stream-K pieces on single CTAs may
// (tiles alike: one query block a head), and read it at run time without the finer cuts
// (kSplitBound below).
// kCausal: a bounded kernel whose bound is causal (window (-1, 0)) at compile time; only the row
// shift comes from the launch. The mask's and the key ranges' window tests become constants
// (d64's three-consumer kernel 3200 -> 2776 instructions, d128's 5072 -> 4112). H100, against the
// bounded kernel: d64 causal 512 / 1k / 2k / 4k +3.1 / +3.6 / +2.8 / +1.5 %, d128 causal 1k / 4k
// +1.4 / +1.6 %, d256 +0.7…1.3 % (docs/perf-notes.md, "Causal known at compile time").
// kVarlen: variable-length batches (FwdKernelParams::cu_seqlens_q), on single CTAs walking whole
// tiles. The grid's tiles are those of the longest sequence in every (batch, head); the CTA that
// takes one past its sequence's last row takes the next, so no role sees it. Tiles start at row
// 0 of their sequence (Window::shift is 0).
template <class Cfg, int kCluster = 1, bool kSplit = false, bool kBounded = false, bool kCausal = false,
          bool kVarlen = false>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    fwd_kernel(const __grid_constant__ FwdKernelParams p) {
  static_assert(kCluster == 1 || kCluster == 2, "clusters of one or two CTAs");
  static_assert(!kVarlen || (kCluster == 1 && !kSplit), "variable-length batches run on whole tiles, one CTA a unit");
  static_assert(!kBounded || (kCluster == 1 && !kSplit),
                "bounds run on whole tiles, one CTA a unit (stream-K pieces read theirs at run time: kSplitBound)");
  static_assert(!kCausal || kBounded, "the causal kernel is a bounded one");
  static_assert(kCluster == 1 || Cfg::kBlockN / 2 * 128 % 1024 == 0, "a K/V half must keep 1024-byte alignment");
  using namespace fa4::ptx;
  constexpr int kBlockM = Cfg::kBlockM, kBlockN = Cfg::kBlockN, kHeadDim = Cfg::kHeadDim, kHeadDimV = Cfg::kHeadDimV;
  // O staged in the last K/V slots (FwdConfig::kStageOInKV) in whole-tile kernels; stream-K pieces
  // store from registers. With one CTA a unit the next turn's id is rebuilt at each use. Both keep
  // ptxas from spilling around the epilogue's register peak (ptxas -v, docs/perf-notes.md).
  constexpr bool kOInKV = Cfg::kStageOInKV && !kSplit;
  // The row-max-free steps (FwdConfig::kNoBlockMax) in whole-tile kernels: in the stream-K ones
  // ptxas spills (d64 72 bytes).
  constexpr bool kNoMaxHere = Cfg::kNoBlockMax && !kSplit;
  constexpr bool kTurnSub = kOInKV && kCluster == 1;
  // The soft cap's reciprocal on the FMA pipe (SoftcapConfig::kCapFmaRecip) in whole tiles without
  // a bound; on MUFU in bounded and stream-K kernels (cap_recip_on_fma).
  constexpr bool kCapFma = cap_recip_on_fma<Cfg, kBounded || kSplit>();
  // A consumer's rows of Q go back to their loader (q_free) as soon as the tile's last S is done,
  // inside its step, rather than after that step's softmax, P V wait and rescale: the next tile's Q
  // (the boundary's longest wait with one Q buffer) loads that much earlier. H200, d256: causal 512
  // +4.2 %, 512 +4.0 %, 1k +2.7 %, 4k +1.3 %, 16k unchanged (docs/perf-notes.md, "The next Q
  // freed in the last S's step"). Not where a step may compute S again from Q (kNoMaxHere).
  constexpr bool kEarlyQFree = kOInKV && !kNoMaxHere;
  // Consumers with no row of the sequence skip a tile's work. d64 on 192-row tiles, H100:
  // non-causal 512 +4.7 %, 1k +3.2 %, longer rows and causal unchanged (docs/perf-notes.md).
  // One CTA a tile with the turn ring only: with clusters the partner's consumers, which no turn
  // of this CTA orders, release the same slots (an idle consumer there once arrived a ring ahead
  // of them: a launch failure); without turns nothing holds an idle consumer back at all. In a
  // stream-K piece an idle consumer also leaves the merge out: every piece of the tile has the
  // same idle consumers, so none of them writes a partial or counts on the tile's counter. H200,
  // decoding (4-row folded tiles, consumer 1 idle): the pieces 5-15 % faster, d256 8 x 16/4 heads
  // x 8k (cut) 98.8 -> 92.6 us (docs/perf-notes.md, "Decoding's idle consumer in stream-K pieces").
  constexpr bool kSkipIdle = kCluster == 1 && Cfg::kTurnMode != 2;
  // A tile's first key block with a right bound (the causal diagonal), cut to what each consumer's
  // rows see (the consumer loop): the lower half alone (kHalfFirst), or nothing (kSkipFirst: three
  // consumers, where 192-row tiles over 128-key blocks leave a consumer without a key in the
  // block). d64 causal 512 / 1k / 2k / 4k +4.4 / +6.3 / +5.1 / +3.4 % with kConsumerMask below,
  // H100 (docs/perf-notes.md, "The causal diagonal cut to each consumer's rows"). Not with two
  // consumers' softmax skipped alone, where ptxas spilled.
  constexpr bool kHalfFirst = kBounded && kBlockN == 128;
  constexpr bool kSkipFirst = kBounded && Cfg::kConsumers == 3 && kBlockN == 128;
  // With the serial step (FwdConfig::kSerialStep) the first block's S and P V over its lower half
  // alone where the consumer's rows see no more of it.
  constexpr bool kHalfGemms = kHalfFirst && Cfg::kSerialStep;
  // d256 (kOInKV) with a bound: a consumer whose rows see no key of the tile's first block skips
  // it whole, S and P V with the softmax. It takes that block's turn without issuing (the turn ring
  // counts one turn a block for each consumer) and frees its K and V slots; its walk then starts
  // on the next block. On 64-key blocks that is consumer 0 in every causal tile (rows 128i ...
  // 128i + 63, keys 128i + 64 ... 128i + 127): at causal 512 4 of its 20 blocks a head; on 80-key
  // blocks four tiles in five. H100, four rounds: causal 512 / 1k / 2k / 4k / 16k +0.4 / +1.2 /
  // +0.8 / +0.9 / +0.7 %; the rows that wait on DRAM gain least (docs/perf-notes.md, "A first
  // block passed over").
  constexpr bool kSkipFirstWhole = kBounded && kOInKV;
  // Four consumers with a bound (d64 on 256-row tiles over 64-key blocks): a consumer's rows see
  // none of the last 3 - consumer key blocks of a causal tile (the diagonal's upper blocks), and
  // it passes them all over as an idle consumer passes blocks (K landed, a turn, K's slot freed,
  // the V slot of the block before freed), then starts its walk on the block its diagonal crosses.
  // With a left bound it ends its walk on the lowest block its rows see, and passes the tile's
  // blocks below over the same way.
  constexpr bool kSkipLeading = kBounded && Cfg::kConsumers == 4 && !kOInKV;
  // Paired causal tiles (tile_order.cuh) run on d256's causal kernel alone (fwd_launch.cuh,
  // use_paired_tiles); every other kernel keeps none of their decode.
  constexpr bool kPairs = kCausal && kCluster == 1 && !kSplit && pairs_at_head_dim(kHeadDim);
  // The mask's one-compare path for a launch without a left bound (mask.cuh): where ptxas keeps
  // it without spilling, which is not d64's three-consumer kernel or d256's with a runtime
  // window; in the causal kernel it is the only path, no branch, and spill-free in all.
  constexpr bool kOneSidedMask = (Cfg::kConsumers == 2 && kHeadDim <= 128) || kCausal;
  // O out by stmatrix and TMA (epilogue.cuh) wherever shared memory allows (FwdConfig::kStageO).
  constexpr bool kStaged = Cfg::kStageO || kOInKV;
  // Otherwise O in 16-byte stores, on one CTA (in clusters of two ptxas spilled 4 bytes at d64).
  constexpr bool kWideO = kCluster == 1;
  constexpr auto kType = Cfg::kBF16 ? wgmma::Type::kBF16 : wgmma::Type::kF16;
  // A steady step's wgmma descriptors made before its waits and turn (StepDescs below): in d64's
  // three-consumer kernel with a bound only (the causal rows). H100, against making them at issue:
  // causal 512 / 1k / 2k / 4k +1.2 / +1.3 / +0.7 / +1.3 %; the same kernel without a bound 512
  // +1.7 % but 16k -3.7 %; d128 and d256 within noise (docs/perf-notes.md, "Descriptors before
  // the turn").
  // Query groups folded into rows (FwdParams::fold) run on the kernel with a bound at run time
  // (the launch's tiles_of_one_length and causal_bound say no to them), so that only it reads each
  // row's query and query head at run time (Window::fold; epilogue.cuh, MapRow); in the others
  // rows are queries at compile time.
  // The stream-K kernel of single CTAs also cuts tiles that see alike key ranges under a bound
  // (one query block a head: decoding's few rows, causal or in a window, folded or not;
  // fwd_launch.cuh, tiles_alike): it reads the launch's bound and fold at run time (kSplitBound).
  // Its clusters run tiles of one length only, unbounded and unfolded at compile time, as does
  // the serial step's (split_reads_bound).
  constexpr bool kSplitBound = kSplit && kCluster == 1 && split_reads_bound<Cfg>();
  constexpr bool kFoldable = (kBounded && !kCausal && !kVarlen) || kSplitBound;
  // Batch entries with keys of their own (FwdKernelParams::seqused_k without varlen): read by the
  // kernels that read the fold (but split_reads_entry_keys), the launch taking such keys as it
  // takes a bound (fwd_launch.cuh, entry_keys), so the kernels without a bound or with the causal
  // one at compile time keep none of it.
  constexpr bool kEntryKeys = (kBounded && !kCausal && !kVarlen) || (kSplitBound && split_reads_entry_keys<Cfg>());
  // Keys past a sequence's own count (Varlen::seqused_k, batched or varlen: a KV cache's filled
  // part) that lie inside the tensor hold whatever the caller's cache holds there: memory never
  // written may read as NaN. Their scores are masked (P = 0), but 0 * NaN in P V is NaN, so the
  // rows of the V block that holds the last key are zeroed before the consumers read it, as TMA's
  // fill does for rows past the tensor (flash-attn's FA2 zeroes them in its loads; its TMA kernels
  // do not). The V loader hands that block to 31 lanes of warp 3, which zero it once it lands: the
  // loader zeroing it alone stalled its ring (up to 1.56 times the decoding call's time at --fill
  // 0.5; docs/perf-notes.md, "A KV cache's unwritten rows").
  constexpr bool kZeroTail = kEntryKeys || kVarlen;
  // A paged KV cache (FwdKernelParams::block_table): its configurations' kernels (paged_config),
  // those that read entries' keys, on two consumers (with three or four the page's look-up spilled
  // 16 bytes in the producer; the launch takes d64's paged caches on two, d64_consumers).
  constexpr bool kPaged = paged_config<Cfg>();
  static_assert(!kPaged || ((kEntryKeys || kVarlen) && Cfg::kConsumers == 2 && !folded_kv<Cfg>() && kCluster == 1),
                "a paged cache's kernels read entries' (sequences') keys, on two consumers and single CTAs");
  // (kPaged) Pages of 16 rows or more: the page lanes a loader has (PagedLoads), where the config
  // takes them (page_lanes: pages smaller than a key block, and packed queries); otherwise a key
  // block lies on one page, which the loaders look up themselves.
  constexpr bool kPageLanes = kPaged && page_lanes<Cfg>();
  static_assert(!kPaged || kPageLanes || !kVarlen, "a paged cache's varlen kernels hand the pages to page lanes");
  constexpr int kMaxPages = Cfg::kBlockN / 16;
  static_assert(!kPaged || (kMaxPages <= 31 && (Cfg::kBlockN & (Cfg::kBlockN - 1)) == 0),
                "a paged cache's key blocks: a power of two, 16 rows a page lane");
  // Whether this launch can have such a block: varlen (rows past a sequence are the next one's, or
  // spare rows up to total_k) or seqused_k. A parameter's test, uniform, evaluated where used.
  // (Paged, the rows of an entry's last page past its keys: whatever the cache holds there.)
  const auto tails_possible = [&p] { return kVarlen || p.seqused_k != nullptr || p.block_table != nullptr; };
  constexpr bool kDescsAhead =
      kBounded && Cfg::kConsumers == 3 && kHeadDim == 64 && !Cfg::kSmemP && !Cfg::kTensorRowSum;
  // The window as the key ranges and the mask see it: in a kernel without a bound, unbounded at
  // compile time, so each step's mask test and a masked block's mask are the key tail's alone and
  // the window's runtime tests drop out (d64 non-causal: 512 +1.1 %, 1000 +3.2 %, H200;
  // docs/perf-notes.md, "The window known unbounded at compile time"). Rows still come from
  // p.window (its shift). Read afresh at each use: one copy held from here spilled (ptxas -v).
  // The launch's window with the rows' fold where this kernel runs folded launches (kFoldable),
  // without it (0 at compile time) elsewhere.
  auto window = [&p]() -> Window {
    if constexpr (kFoldable) return p.window;
    return Window{p.window.left, p.window.right, p.window.shift};
  };
  auto bound = [&p, &window]() -> Window {
    if constexpr (kCausal) return Window{-1, 0, p.window.shift};
    return kBounded || kSplitBound ? window() : Window{-1, -1, 0};
  };

  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  auto& bar = *reinterpret_cast<FwdBarriers*>(smem + Cfg::kBarOffset);
  [[maybe_unused]] auto& pl = *reinterpret_cast<PagedLoads*>(smem + paged_loads_offset<Cfg>());
  uint8_t* sQ = smem + Cfg::kQOffset;
  uint8_t* sK = smem + Cfg::kKOffset;
  uint8_t* sV = smem + Cfg::kVOffset;

  const int wg = threadIdx.x / 128;
  if constexpr (traced<Cfg>(kTraceCta))
    if (threadIdx.x == 0 && p.trace != nullptr) stamp_cta<Cfg::kConsumers>(p.trace, 0);
  // Cluster rank and the cluster's index in the grid (the CTA's own without clusters).
  const int rank = kCluster == 1 ? 0 : int(cluster_rank());
  const int unit = int(blockIdx.x) / kCluster, units = int(gridDim.x) / kCluster;
  if (threadIdx.x == 0) {
    for (int s = 0; s < Cfg::kQStages; ++s) {
      mbar_init(&bar.q_full[s], 1);
      // Lane 0 of every consumer warp (each reads the tile index beside Q, then arrives itself, so
      // its read is ordered before the index is rewritten), the V loader when it is its own
      // thread, and with kOInKV the two Q loaders.
      mbar_init(&bar.q_empty[s], 4 * Cfg::kConsumers + (Cfg::kSplitLoads ? 1 : 0) + (kOInKV ? 2 : 0));
    }
    for (int s = 0; s < Cfg::kStages; ++s) {
      mbar_init(&bar.k_full[s], 1);
      mbar_init(&bar.v_full[s], 1);
      mbar_init(&bar.k_empty[s], Cfg::kConsumers * kCluster);  // every CTA's consumers
      mbar_init(&bar.v_empty[s], Cfg::kConsumers * kCluster);
    }
    if constexpr (kEntryKeys || kPaged) bar.k_round = 0;
    if constexpr (kPageLanes)
      for (int k = 0; k < 2; ++k) {
        mbar_init(&pl.req_full[k], 1);
        mbar_init(&pl.req_empty[k], kMaxPages);
        pl.sent[k] = 0;
      }
    if constexpr (kZeroTail) {
      mbar_init(&bar.v_tail, 1);
      mbar_init(&bar.v_tail_free, 1);
      mbar_init(&bar.v_zeroed, 31);
      bar.v_tail_next.w = 0;  // v_tail_free's phase (the tile's .x and .y are set at each tile)
    }
    if constexpr (kOInKV) {  // one Q loader a consumer (rows 64c..64c+63); q_full[1] is free with one Q buffer
      static_assert(Cfg::kQStages == 1 && Cfg::kConsumers == 2, "O staged in K/V slots: one Q buffer, two consumers");
      mbar_init(&bar.q_full[1], 1);
      for (int c = 0; c < 2; ++c) {
        mbar_init(&bar.q_free[c], 4);  // the consumer's four warps
        mbar_init(&bar.kv_read[c], 1);
      }
      mbar_init(&bar.tile_pub, 1);
    }
    fence_barrier_init();
    if constexpr (kSplit)
      for (int k = 0; k < 2; ++k) {
        Tile pc;
        if (p.tiles.split.total == 0 || !p.tiles.split.piece(unit, k, pc)) pc.pieces = 0;
        bar.unit_pieces[k] = pc;
      }
  }
  if constexpr (Cfg::kTensorRowSum) {
    if (threadIdx.x < 256)  // 1.0 in both halves, bf16 or fp16
      reinterpret_cast<uint32_t*>(smem + Cfg::kOnesOffset)[threadIdx.x] = Cfg::kBF16 ? 0x3F803F80u : 0x3C003C00u;
    fence_proxy_async_smem();  // the wgmma (async proxy) reads what these stores wrote
  }
  if constexpr (kCluster > 1)
    cluster_sync();  // the partner's barriers exist before any multicast or arrive reaches them
  else
    __syncthreads();

  if (wg == 0) {
    // ---------------- producer ----------------
    // (The varlen kernels' loaders pass tiles by: the stream-K kernels' count, 32 where there are
    // three consumers.)
    // (kZeroTail: the hand-over spilled at 24 with three consumers, who leave 32.)
    regs_decrease<kSplit || kVarlen || kZeroTail ? Cfg::kProducerRegsSplit : Cfg::kProducerRegs>();
    // Consumer c's 64 rows of tile tl's Q (FwdConfig::kStageOInKV, whose Q is folded:
    // FwdConfig::kFoldedQO) as one TMA box of every 64-column chunk, on `full`, whose expected bytes
    // the caller has set.
    // (With varlen the map's rows are the packed sequences', its batch extent 1: sp.q_off's row.)
    [[maybe_unused]] auto load_q_rows = [&](int c, const Tile& tl, const SeqSpan& sp, uint64_t* full) {
      if constexpr (Cfg::kFoldedQO) {
        const int row = tile_first_row<kBlockM>(p.window, tl.m_block) + c * 64;
        // (A folded query group's map: epilogue.cuh, MapRow and chunked_at.)
        const MapRow at = kVarlen ? MapRow{sp.q_off + row, tl.head} : qo_map_row<kFoldable>(p, row, tl.head);
        const ChunkedAt ca = chunked_at<kFoldable>(p, at);
        const int batch = kVarlen ? 0 : tl.batch;
        uint8_t* dst = sQ + c * (Cfg::kQBytes / 2);
        if constexpr (Cfg::kQOEvictFirst)
          tma_load_5d_hint(dst, &p.tm_q, full, 0, ca.c1, ca.c2, ca.c3, batch, l2_policy_evict_first());
        else
          tma_load_5d(dst, &p.tm_q, full, 0, ca.c1, ca.c2, ca.c3, batch);
      }
    };
    if constexpr (kPageLanes) {
      // The page lanes (PagedLoads): lanes 1 to kMaxPages of warp 0 load K's pages, of warp 1 V's.
      const int k = int(threadIdx.x) / 32, i = int(threadIdx.x) % 32 - 1;
      if (k < 2 && i >= 0 && i < kMaxPages) {
        const CUtensorMap* map = k == 0 ? &p.tm_k : &p.tm_v;
        for (uint32_t phase = 0;; phase ^= 1u) {
          mbar_wait(&pl.req_full[k], phase);
          const int4 q = ld_shared_v4(&pl.req[k]);
          mbar_arrive(&pl.req_empty[k]);  // read: the loader may post the next
          if (q.x < 0) break;
          // The block's pages: one at the block's row in it where pages hold kBlockN rows or more,
          // else kBlockN >> page_shift, the map's boxes a page's rows. The table's column at most
          // the last that seqlen_k's keys name (a block's pages past them load that page again:
          // rows past the entry's keys are masked, V's zeroed); the map's batch is the page.
          // q.w: the stage, 256 where V lands on v_tail, the empty barrier's parity << 9. Each lane
          // waits for the slot; lane 0 expects its bytes before any lane's box is issued.
          const int shift = p.page_shift, rows = min(1 << min(shift, 30), kBlockN), r = i * rows;
          const int stage = q.w & 255;
          uint64_t* full = (q.w & 256) != 0 ? &bar.v_tail : k == 0 ? &bar.k_full[stage] : &bar.v_full[stage];
          mbar_wait(k == 0 ? &bar.k_empty[stage] : &bar.v_empty[stage], uint32_t(q.w >> 9) & 1u);
          if (i == 0) mbar_arrive_expect_tx(full, Cfg::kKVBytes);
          __syncwarp(((1u << kMaxPages) - 1u) << 1);
          if (r >= kBlockN) continue;
          const int row = q.x + r;
          const int page = min(max(__ldg(p.block_table + q.y + min(row >> shift, (p.seqlen_k - 1) >> shift)), 0),
                               p.num_pages - 1);
          uint8_t* dst = (k == 0 ? sK : sV) + stage * Cfg::kKVBytes + r * 128;
#pragma unroll
          for (int c = 0; c < Cfg::kChunks; ++c)
            tma_load_4d(dst + c * kBlockN * 128, map, full, c * 64, row & ((1 << shift) - 1),
                        kVarlen ? q.z / p.head_ratio : q.z, page);
        }
        return;
      }
    }
    if constexpr (kOInKV) {
      // Consumer c's 64 rows of each tile's Q, loaded by a thread of warp 2 + c once that
      // consumer's last S has read them (q_free[c]), so one consumer's next Q never waits for the
      // other consumer, nor K and V for either.
      if (threadIdx.x == 64 || threadIdx.x == 96) {
        const int c = int(threadIdx.x) / 32 - 2;
        for (int round = 0;; ++round) {
          mbar_wait(&bar.tile_pub, uint32_t(round) & 1u);
          if constexpr (test_lags<Cfg>().tile > 0)  // (a test's config)
            if ((round + c) % 3 == 0) spin_cycles(test_lags<Cfg>().tile);
          const int tile = ld_shared(&bar.item[0].x);
          mbar_arrive(&bar.q_empty[0]);  // the index is read
          if (tile >= p.tiles.count) {
            mbar_arrive(&bar.q_full[c]);  // no Q: the phase completes on the arrive alone
            break;
          }
          const Tile tl = p.tiles.template decode_tile<kPairs>(tile, rank);
          SeqSpan sp{};
          if constexpr (kVarlen) sp = seq_span<kVarlen, kPaged>(p, tl.batch);
          if (round > 0) mbar_wait(&bar.q_free[c], uint32_t(round - 1) & 1u);
          // One box lands every chunk on q_full, which the consumer waits for before its first S.
          mbar_arrive_expect_tx(&bar.q_full[c], Cfg::kQBytes / 2);
          load_q_rows(c, tl, sp, &bar.q_full[c]);
        }
        return;
      }
    }
    if constexpr (kZeroTail) {
      // Lanes 1-31 of warp 3 zero the rows of V blocks past a sequence's keys (v_tail_at) once
      // their TMA has landed, then complete the block's v_full for the consumers. Without
      // seqused_k (batched) there is no such block: they leave at once, and lane 0 (a Q loader
      // where O is staged in K/V slots) no longer shares its warp with their waits.
      if (threadIdx.x > 96) {
        if (!tails_possible()) return;
        const int lane = int(threadIdx.x) - 97;
        for (uint32_t phase = 0;; phase ^= 1u) {
          mbar_wait(&bar.v_tail, phase);
          const int4 at = ld_shared_v4(&bar.v_tail_at);  // {stage, keys, end}
          if (at.x < 0) break;
          const uint32_t base = smem_addr(sV + at.x * Cfg::kKVBytes);
          const int first = at.y / kBlockN * kBlockN;  // the block's first key
          // Rows [keys, min(end, the block's end)) of the block, whole 128-byte rows of each chunk:
          // the swizzle stays inside each.
          const int hi = min(kBlockN, at.z - first) * 128;
          for (int b = (at.y - first) * 128 + lane * 16; b < hi; b += 31 * 16)
#pragma unroll
            for (int c = 0; c < Cfg::kVChunks; ++c) st_shared_v4_f32(base + c * kBlockN * 128 + b, 0.f, 0.f, 0.f, 0.f);
          fence_proxy_async_smem();  // the consumers' wgmma (async proxy) reads these stores
          mbar_arrive(&bar.v_zeroed);
          if (lane == 0) {
            mbar_wait(&bar.v_zeroed, phase);  // (one phase a block, as v_tail's)
            mbar_arrive(&bar.v_full[at.x]);
            mbar_arrive(&bar.v_tail_free);
          }
        }
        return;
      }
    }
    // One thread of warp 0 loads Q and K, one of warp 1 loads V: K_{j+1} never waits behind the
    // slot of V_j (freed only when both consumers' P V of two blocks back are done).
    const bool loads_k = threadIdx.x == 0, loads_v = Cfg::kSplitLoads ? threadIdx.x == 32 : threadIdx.x == 0;
    if (loads_k || loads_v) {
      [[maybe_unused]] TraceLog tr;
      if constexpr (traced<Cfg>(kTraceStep)) tr.open(p.trace, 1 + Cfg::kConsumers, 0);
      if (loads_k) {
        if constexpr (traced<Cfg>(kTraceCta))  // the SM, beside the CTA's entry and end
          if (p.trace != nullptr) {
            uint32_t sm;
            asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
            cta_stamps<Cfg::kConsumers>(p.trace)[4] = sm;
          }
        prefetch_tensor_map(&p.tm_q);
        prefetch_tensor_map(&p.tm_k);
        if constexpr (Cfg::kTmaStoreO) prefetch_tensor_map(&p.tm_o);
      }
      if (loads_v) prefetch_tensor_map(&p.tm_v);
      // One tile by TMA: its 64-column chunks, `rows` rows each, from row `row` of (head, batch);
      // with `once` (Q: FwdConfig::kQOEvictFirst) its lines are marked evict_first in L2. The policy
      // is made at each use: held through the loop it spilled in the producer's registers.
      // `chunks`: the tile's (Cfg::kChunks, or a V block's Cfg::kVChunks).
      auto load_tile = [&](uint8_t* dst, const CUtensorMap* map, uint64_t* full, uint32_t bytes, int rows,
                           int row, int head, int batch, bool once, int chunks = Cfg::kChunks) {
        mbar_arrive_expect_tx(full, bytes);
#pragma unroll
        for (int c = 0; c < chunks; ++c) {
          if (once)
            tma_load_4d_hint(dst + c * rows * 128, map, full, c * 64, row, head, batch, l2_policy_evict_first());
          else
            tma_load_4d(dst + c * rows * 128, map, full, c * 64, row, head, batch);
        }
      };
      // A K or V block: with clusters this CTA's half of its rows, multicast to both CTAs (each
      // CTA's full barrier expects the whole block: its own half and its partner's). Folded
      // (folded_kv): the block as one box, or with clusters this CTA's half of its column chunks.
      RingPos<Cfg::kStages> w;
      // (kPaged) A request to loader k's page lanes (PagedLoads), once they have all read the last.
      [[maybe_unused]] auto post_pages = [&](int k, int row, int table_row, int head, int where) {
        const int n = ld_shared(&pl.sent[k]);
        mbar_wait(&pl.req_empty[k], uint32_t(n & 1) ^ 1u);
        st_shared_v4_b32(smem_addr(&pl.req[k]), row, table_row, head, where);
        st_shared_b32(smem_addr(&pl.sent[k]), uint32_t(n + 1));
        mbar_arrive(&pl.req_full[k]);  // (release: the request before it)
      };
      // v: a V block (Cfg::kVChunks of its slot's chunks, Cfg::kVBytes), else a K block.
      auto load_kv = [&](uint8_t* dst, const CUtensorMap* map, uint64_t* full, int row, int head, int batch, bool v) {
        const int chunks = v ? Cfg::kVChunks : Cfg::kChunks;
        const uint32_t bytes = v ? Cfg::kVBytes : Cfg::kKVBytes;
        if constexpr (kPaged) {
          // Paged: the block to the page lanes (PagedLoads), its bytes expected here; without
          // them (kPageLanes false) the block lies on one page (pages of kBlockN rows or more),
          // loaded here from the page's row. (Both in one loader spilled 8 bytes at d64 and d128.)
          if constexpr (!kPageLanes) {
            const int page = min(max(__ldg(p.block_table + batch * p.table_stride + (row >> p.page_shift)), 0),
                                 p.num_pages - 1);
            load_tile(dst, map, full, bytes, kBlockN, row & ((1 << p.page_shift) - 1), head, page, false, chunks);
            return;
          }
          // (The slot's empty wait and the bytes expected are the page lanes': the request goes
          // out while the slot is still read, so the hand-over's latency passes under that.)
          const int k = dst >= sV ? 1 : 0;
          const int stage = int((dst - (k == 0 ? sK : sV)) / Cfg::kKVBytes);
          post_pages(k, row, batch * p.table_stride, head,
                     stage | (full == &bar.v_tail ? 256 : 0) | int(w.phase ^ 1u) << 9);
          return;
        }
        if constexpr (folded_kv<Cfg>()) {
          static_assert(Cfg::kHeadDimV == Cfg::kHeadDim, "folded K/V: one box of every chunk of either");
          mbar_arrive_expect_tx(full, Cfg::kKVBytes);
          if constexpr (kCluster == 1) {
            tma_load_5d(dst, map, full, 0, row, 0, head, batch);
          } else {
            static_assert(Cfg::kChunks % 2 == 0, "folded K/V in clusters: each CTA loads half of the chunks");
            constexpr int kHalfChunks = Cfg::kChunks / 2;
            tma_load_5d_multicast(dst + rank * kHalfChunks * kBlockN * 128, map, full, 0, row, rank * kHalfChunks,
                                  head, batch, uint16_t(0b11));
          }
        } else if constexpr (kCluster == 1) {
          load_tile(dst, map, full, bytes, kBlockN, row, head, batch, false, chunks);
        } else {
          constexpr int kHalf = kBlockN / 2;
          mbar_arrive_expect_tx(full, bytes);
#pragma unroll
          for (int c = 0; c < chunks; ++c)
            tma_load_4d_multicast(dst + c * kBlockN * 128 + rank * kHalf * 128, map, full, c * 64, row + rank * kHalf,
                                  head, batch, uint16_t(0b11));
        }
      };
      auto wait_empty = [&](uint64_t* empty, uint32_t phase) {
        if constexpr (kCluster == 1)
          mbar_wait(empty, phase);
        else
          mbar_wait_cluster(empty, phase);  // the partner's consumers arrive on it too
      };
      RingPos<Cfg::kQStages> qw;
      // The K loader's next work item (it also loads Q, unless kOInKV): the first is the CTA's (or
      // cluster's) own.
      int next = kSplit ? p.tiles.item(0, unit, units) : p.tiles.template nth<kPairs>(0, unit, units);
      // Whether the CTA has no more work (a tile index >= count, or no such piece).
      auto done = [&](int t) { return kSplit ? t == TileOrder::kEnd : t >= p.tiles.count; };
      [[maybe_unused]] auto tile_past_end = [&](int t) {
        const Tile x = p.tiles.template decode_tile<kPairs>(t, rank);
        return x.m_block * kBlockM >= seq_span<kVarlen, kPaged>(p, x.batch).q_len;
      };
      // The CTA's unit, read afresh at each claim where kEntryKeys: what ptxas derived from it once
      // before the tile loop spilled (d128's stream-K kernel, 4 bytes).
      auto unit_now = [&] {
        if constexpr (kEntryKeys || kPaged) {
          uint32_t x;
          asm volatile("mov.u32 %0, %%ctaid.x;" : "=r"(x));
          return int(x) / kCluster;
        }
        return unit;
      };
      // The grid's CTAs likewise, read afresh where kPaged: held through the tile loop beside the
      // hand-over to the page lanes it spilled (d256 soft-capped, 4 bytes).
      auto grid_now = [&] {
        if constexpr (kPaged) {
          uint32_t x;
          asm volatile("mov.u32 %0, %%nctaid.x;" : "=r"(x));
          return int(x);
        }
        return int(gridDim.x);
      };
      // The next claim's round: round + 1 (kEntryKeys, kPaged: counted in bar.k_round).
      auto next_round = [&](int round) {
        if constexpr (kEntryKeys || kPaged) {
          const int r = ld_shared(&bar.k_round) + 1;
          st_shared_b32(smem_addr(&bar.k_round), uint32_t(r));
          return r;
        }
        return round + 1;
      };
      for (int round = 0;; ++round) {
        int tile;
        Tile tl;
        SeqSpan sp{};
        if (loads_k) {  // takes the tile, publishes it beside its Q buffer, loads Q
          if constexpr (kSplit)
            tile = decode_item(p.tiles, bar, next, rank, tl) ? next : TileOrder::kEnd;
          else
            tile = next;
          // Varlen: a tile past its sequence's last row is passed by at once, for the next claim
          // (the K loader's `round` then counts its claims, the static rounds' index).
          if constexpr (kVarlen)
            while (!done(tile) && tile_past_end(tile)) {
              if constexpr (kPaged)  // (the count in bar.k_round, the unit and grid read afresh)
                tile = p.tile_counter ? grid_now() + atomicAdd(p.tile_counter, 1)
                                      : p.tiles.template nth<kPairs>(next_round(round), unit_now(), grid_now());
              else
                tile = p.tile_counter ? int(gridDim.x) + atomicAdd(p.tile_counter, 1)
                                      : p.tiles.template nth<kPairs>(++round, unit, units);
            }
          mbar_wait(&bar.q_empty[qw.stage], qw.phase ^ 1);
          if constexpr (kSplit) {  // before the arrive that publishes it (release)
            bar.item[qw.stage].x = tile;
          } else {
            if (!done(tile)) tl = p.tiles.template decode_tile<kPairs>(tile, rank);
            bar.item[qw.stage] = done(tile) ? make_int4(tile, 0, 0, 0) : make_int4(tile, tl.batch, tl.head, tl.m_block);
          }
          if constexpr (kVarlen)
            if (!done(tile)) sp = seq_span<kVarlen, kPaged>(p, tl.batch);
          if constexpr (kOInKV) mbar_arrive(&bar.tile_pub);  // the Q loaders take it from here
          if (done(tile)) {
            if constexpr (!kOInKV) mbar_arrive(&bar.q_full[qw.stage]);  // no Q: the phase completes on the arrive alone
            break;
          }
          if constexpr (kOInKV) {
            // The Q loaders take Q.
          } else if constexpr (Cfg::kStageOInKV) {  // the stream-K kernel of such a config: both halves here
            mbar_arrive_expect_tx(&bar.q_full[qw.stage], Cfg::kQBytes);
            for (int c = 0; c < 2; ++c) load_q_rows(c, tl, sp, &bar.q_full[qw.stage]);
          } else {
            // Rows before row 0 (a first tile with Window::shift) land as zeros (TMA's out-of-bounds
            // fill); with varlen, rows past the sequence are the next one's (the consumers' key mask
            // and row tests leave them out).
            // (A folded query group's rows: epilogue.cuh, MapRow.)
            const int first = tile_first_row<kBlockM>(p.window, tl.m_block);
            const MapRow at = kVarlen ? MapRow{sp.q_off + first, tl.head} : qo_map_row<kFoldable>(p, first, tl.head);
            load_tile(sQ + qw.stage * Cfg::kQBytes, &p.tm_q, &bar.q_full[qw.stage], Cfg::kQBytes, kBlockM, at.row,
                      at.head, kVarlen ? 0 : tl.batch, Cfg::kQOEvictFirst);
          }
          // The next tile now, so the atomic's latency passes under this tile's K/V loads.
          next = p.tile_counter ? grid_now() + atomicAdd(p.tile_counter, 1)
                      : kSplit ? p.tiles.item(next_round(round), unit_now(), grid_now() / kCluster)
                               : p.tiles.template nth<kPairs>(next_round(round), unit_now(), grid_now() / kCluster);
        } else {  // the V loader: the tile the K loader published, then frees its slot
          if constexpr (kOInKV)
            mbar_wait(&bar.tile_pub, qw.phase);
          else
            mbar_wait(&bar.q_full[qw.stage], qw.phase);
          tile = ld_shared(&bar.item[qw.stage].x);
          if (done(tile)) break;
          mbar_arrive(&bar.q_empty[qw.stage]);
          if constexpr (kSplit)
            decode_item(p.tiles, bar, tile, rank, tl);
          else
            tl = p.tiles.template decode_tile<kPairs>(tile, rank);
          if constexpr (kVarlen) sp = seq_span<kVarlen, kPaged>(p, tl.batch);
        }
        qw.advance();
        if constexpr (test_lags<Cfg>().tile > 0)  // (a test's config: the loaders held in turn too)
          if ((round + int(threadIdx.x) / 32 + rank) % 3 == 0) spin_cycles(test_lags<Cfg>().tile);
        // (kEntryKeys) The entry's keys, rows [first, end) of its tensor (leftpad_k, seqused_k).
        int entry_first_row = 0, entry_count = p.seqlen_k;
        if constexpr (kEntryKeys) {
          const int end = entry_end(p, tl.batch);
          if constexpr (!kPaged) entry_first_row = entry_first(p, tl.batch, end);
          entry_count = end - entry_first_row;
        }
        BlockRange range =
            kVarlen ? key_block_range<kBlockM, kBlockN>(bound(), tl.m_block, sp.q_len, sp.k_len)
                    : key_block_range<kBlockM, kBlockN>(bound(), tl.m_block, p.seqlen_q, entry_count);
        if constexpr (kSplit) range = piece_range<kEntryKeys>(range, tl);
        // (kPaged with varlen: the query head, which the page lanes divide: the division's registers
        // in the loaders spilled 8 bytes there.)
        const int h_kv = kPaged && kVarlen ? tl.head : tl.head / p.head_ratio;
        // With varlen the sequence's first key row, batch 0 of the maps (paged: the sequence's
        // table row, from its key 0).
        // Batched, the entry's first key row (leftpad_k).
        const int kv_row = kVarlen && !kPaged ? sp.k_off : entry_first_row, kv_batch = kVarlen && !kPaged ? 0 : tl.batch;
        // (kZeroTail) The sequence's keys where rows after its last one, in the same block, lie
        // inside the tensor (else INT_MIN), and the tensor's rows. Kept in shared memory
        // (bar.v_tail_next), read at each V load, written by st.shared: held in registers, or
        // written through the generic address, they spilled.
        if constexpr (kZeroTail)
          if (loads_v) {
            int keys = INT_MIN, end = 0;  // (INT_MIN / kBlockN is no block)
            if (tails_possible()) {
              keys = kVarlen ? sp.k_len : entry_count;
              // The tensor's rows from the first key's; paged, no end: a block lies on one page,
              // whose rows past the entry's keys may hold anything.
              end = kPaged ? INT_MAX : kVarlen ? p.total_k - sp.k_off : p.seqlen_k - entry_first_row;
              if (keys % kBlockN == 0 || keys >= end) keys = INT_MIN;
            }
            const uint32_t at = smem_addr(&bar.v_tail_next);  // (.w, the phase, kept)
            st_shared_b32(at, uint32_t(keys));
            st_shared_b32(at + 4, uint32_t(end));
          }
        // Trace events of a load: 0/1 before/after K's empty wait, 2/3 the same for V.
        // The walk's order of key blocks (TileOrder::walk_block), as the consumers take it.
        const bool diag_last = kPairs && p.tiles.diagonal_last(tile, tl.m_block);
        for (int n = range.hi - 1; n >= range.lo; --n) {
          const int nb = TileOrder::walk_block(diag_last, n, range.lo, range.hi);
          if (loads_k) {
            if constexpr (traced<Cfg>(kTraceStep)) tr.stamp(0);
            if constexpr (!kPageLanes) wait_empty(&bar.k_empty[w.stage], w.phase ^ 1);  // (else the lanes')
            if constexpr (traced<Cfg>(kTraceStep)) tr.stamp(1);
            load_kv(sK + w.stage * Cfg::kKVBytes, &p.tm_k, &bar.k_full[w.stage], kv_row + nb * kBlockN, h_kv, kv_batch,
                    false);
          }
          if (loads_v) {
            if constexpr (traced<Cfg>(kTraceStep)) tr.stamp(2);
            if constexpr (!kPageLanes) wait_empty(&bar.v_empty[w.stage], w.phase ^ 1);  // (else the lanes')
            if constexpr (traced<Cfg>(kTraceStep)) tr.stamp(3);
            uint8_t* dst = sV + w.stage * Cfg::kKVBytes;
            uint64_t* full = &bar.v_full[w.stage];
            // (Without seqused_k or pages a batched launch has no tail block: the test is a
            // parameter's, uniform.)
            if (kZeroTail && tails_possible() && nb == ld_shared(&bar.v_tail_next.x) / kBlockN) {  // to the zeroing lanes, on v_tail
              const uint32_t free_phase = uint32_t(ld_shared(&bar.v_tail_next.w));
              mbar_wait(&bar.v_tail_free, free_phase ^ 1u);
              st_shared_b32(smem_addr(&bar.v_tail_next.w), free_phase ^ 1u);
              st_shared_b32(smem_addr(&bar.v_tail_at.x), uint32_t(w.stage));
              st_shared_b32(smem_addr(&bar.v_tail_at.y), uint32_t(ld_shared(&bar.v_tail_next.x)));
              st_shared_b32(smem_addr(&bar.v_tail_at.z), uint32_t(ld_shared(&bar.v_tail_next.y)));
              full = &bar.v_tail;  // (the load's arrive releases these stores)
            }
            load_kv(dst, &p.tm_v, full, kv_row + nb * kBlockN, h_kv, kv_batch, true);
          }
          if constexpr (traced<Cfg>(kTraceStep)) tr.next();
          w.advance();
        }
      }
      if constexpr (kZeroTail)
        if (loads_v && tails_possible()) {  // the zeroing lanes' end
          mbar_wait(&bar.v_tail_free, uint32_t(ld_shared(&bar.v_tail_next.w)) ^ 1u);
          st_shared_b32(smem_addr(&bar.v_tail_at.x), uint32_t(-1));
          mbar_arrive(&bar.v_tail);
        }
      if constexpr (kPageLanes) {  // the page lanes' end
        if (loads_k) post_pages(0, -1, 0, 0, 0);
        if (loads_v) post_pages(1, -1, 0, 0, 0);
      }
      // The tile counter and its finish count go back to zero with the launch's last CTA, ready for
      // the stream's next launch (detail::stream_counters): each CTA counts itself finished once
      // its last claim is made, and the one that finds all the others finished zeroes both.
      if constexpr (!kSplit)
        if (loads_k && p.tile_counter != nullptr) {
          __threadfence();  // this CTA's claims before its finish
          if (atomicAdd(p.tile_counter + 1, 1) == grid_now() - 1) {
            atomicExch(p.tile_counter, 0);
            atomicExch(p.tile_counter + 1, 0);
          }
        }
      // With clusters the partner's consumers arrive on this CTA's empty barriers until they have
      // released the last blocks: this CTA stays until every slot is free again.
      if constexpr (kCluster > 1)
        for (int s = 0; s < Cfg::kStages; ++s) {
          if (loads_k) wait_empty(&bar.k_empty[w.stage], w.phase ^ 1);
          if (loads_v) wait_empty(&bar.v_empty[w.stage], w.phase ^ 1);
          w.advance();
        }
    }
    return;
  }

  // ---------------- consumers ----------------
  regs_increase<Cfg::kConsumerRegs>();
  // Broadcast from lane 0 so the compiler sees it warp-uniform: descriptors built from it stay in
  // uniform registers.
  const int consumer = __shfl_sync(0xffffffff, wg, 0) - 1;
  const int t = threadIdx.x % 128;
  const int lane = t % 32;
  // This thread's two rows of the tile (wgmma accumulator layout, PTX ISA 9.7.15.5.1.1).
  const int row0 = consumer * 64 + (t / 32) * 16 + lane / 4;
  const int col0 = 2 * (lane % 4);  // + 8 * chunk + {0, 1}
  // Which rows decide whether a key block needs the mask: with kConsumerMask this consumer's 64
  // (a block that the tile's diagonal crosses but these rows see whole takes the unmasked,
  // row-max-free step), otherwise the tile's. At d256 on 64-key blocks (consumer 1 of a causal
  // tile sees the block below the diagonal whole): H100, with kSkipFirstWhole, causal 512 / 1k /
  // 2k +0.4 / +0.5 / +0.2 % more (docs/perf-notes.md, "A first block passed over"). Not timed on
  // 80-key blocks (ptxas spilled 8-12 bytes there once; now it does not).
  constexpr bool kConsumerMask = kBounded && (kHeadDim <= 128 || kBlockN <= 64);
  constexpr int kMaskRows = kConsumerMask ? 64 : kBlockM;
  const int mask_rows_at = kConsumerMask ? consumer * 64 : 0;

  float o[kHeadDimV / 2];
  float s[kBlockN / 2];
  // With kTensorRowSum: P times ones, the row sums (rows r and r + 8 in [0] and [2], all columns alike).
  float lsum[4];
  // P as packed 16-bit pairs, the A operand of P V. Two buffers where registers allow: P_j is
  // packed while P_{j-1} V_{j-1} still reads the other, off the path to the next GEMM issue.
  uint32_t pf[kBlockN / 4];
  uint32_t pf2[Cfg::kDoubleP ? kBlockN / 4 : 1];
  numerics::RowState rows[2];
  [[maybe_unused]] TraceLog tr;
  if constexpr (traced<Cfg>(kTraceStep))
    if (t == 0) tr.open(p.trace, 1 + Cfg::kConsumers, 1 + consumer);
  [[maybe_unused]] TraceLog tb;  // tile boundaries
  if constexpr (traced<Cfg>(kTraceBound))
    if (t == 0 && p.trace != nullptr)
      tb.open(p.trace + kTraceRegionWords<Cfg::kConsumers>, 1 + Cfg::kConsumers, 1 + consumer);
  auto stamp = [&](int e) {
    if constexpr (traced<Cfg>(kTraceStep)) tr.stamp(e);
  };
  auto stamp_b = [&](int e) {
    if constexpr (traced<Cfg>(kTraceBound)) {
      tb.stamp(e);
      if (e == 7) tb.next();
    }
  };

  // wgmma descriptors: one base each, moved by constant offsets (stage, k step) at issue.
  uint64_t q_desc = 0;  // this consumer's rows of the current tile's Q buffer
  const uint64_t k_desc = wgmma::desc_sw128(smem_addr(sK), 16, 1024);
  const uint64_t v_desc = wgmma::desc_sw128(smem_addr(sV), kBlockN * 128, 1024);
  const uint64_t ones_desc = wgmma::desc_sw128(smem_addr(smem + Cfg::kOnesOffset), 16, 1024);
  // With kSmemP: this consumer's rows of the P tile, the A operand of P V.
  const uint64_t p_desc = wgmma::desc_sw128(smem_addr(smem + Cfg::kPOffset) + consumer * 64 * 128, 16, 1024);

  // Byte offsets of k-step kk in this consumer's rows of Q, in a K slot and in a V slot (64-column
  // swizzle atoms of kBlockM or kBlockN rows; V's steps are 16 keys of 128 bytes).
  auto q_step = [](int kk) { return wgmma::kmajor_step(kk, Cfg::kFoldedQO ? 64 : kBlockM); };
  auto k_step = [](int kk) { return wgmma::kmajor_step(kk, kBlockN); };
  auto v_step = [](int kk) { return wgmma::mn_step(kk); };
  // k-step kk of S = Q K^T, K from the slot at byte `slot` of the K ring (the slot's index times
  // Cfg::kKVBytes).
  // keys (a std::integral_constant) < kBlockN: over the block's first keys.value keys alone, into
  // the first keys.value / 2 accumulators of s (the accumulator layout puts 8-column chunk c in
  // s[4c ... 4c + 3]).
  auto s_step = [&](int kk, int slot, auto keys) {
    constexpr int kN = decltype(keys)::value;
    const uint64_t a = wgmma::desc_advance(q_desc, q_step(kk));
    const uint64_t b = wgmma::desc_advance(k_desc, slot + k_step(kk));
    wgmma::mma_ss<kN, kType>(reinterpret_cast<float(&)[kN / 2]>(s), a, b, kk > 0);
  };
  // S from the K slot at byte `slot`; kLower (kHalfGemms below): over the block's first
  // kBlockN / 2 keys alone.
  auto issue_s_at = [&]<bool kLower = false>(int slot) {
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk)
      s_step(kk, slot, std::integral_constant<int, kLower ? kBlockN / 2 : kBlockN>{});
  };
  auto issue_s = [&](int stage) { issue_s_at(stage * Cfg::kKVBytes); };
  // k-step kk of O += P V, with V's descriptor b for that step.
  auto pv_step = [&](int kk, uint64_t b, const uint32_t(&pv)[kBlockN / 4]) {
    if constexpr (Cfg::kSmemP) {
      wgmma::mma_ss_tb<kHeadDimV, kType>(o, wgmma::desc_advance(p_desc, (kk / 4) * kBlockM * 128 + (kk % 4) * 32), b, 1);
    } else {
      const uint32_t a[4] = {pv[4 * kk], pv[4 * kk + 1], pv[4 * kk + 2], pv[4 * kk + 3]};
      wgmma::mma_rs<kHeadDimV, kType>(o, a, b, 1);
      if constexpr (Cfg::kTensorRowSum) wgmma::mma_rs_kb<8, kType>(lsum, a, ones_desc, 1);
    }
  };
  // O += P V from the V slot at byte `slot` of the V ring; over the block's first `keys` keys alone
  // where fewer are given (a constant at the call; P of the rest is zero).
  auto issue_pv_at = [&](int slot, const uint32_t(&pv)[kBlockN / 4], int keys = Cfg::kBlockN) {
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk)
      if (kk < keys / 16) pv_step(kk, wgmma::desc_advance(v_desc, slot + v_step(kk)), pv);
  };
  auto issue_pv = [&](int stage, const uint32_t(&pv)[kBlockN / 4]) { issue_pv_at(stage * Cfg::kKVBytes, pv); };
  // The same over the block's first half alone where `lower`.
  auto issue_pv_maybe_lower = [&](int slot, const uint32_t(&pv)[kBlockN / 4], bool lower) {
    if (lower)
      issue_pv_at(slot, pv, kBlockN / 2);
    else
      issue_pv_at(slot, pv);
  };
  // A steady step's descriptors, made before the step's waits and its turn (kDescsAhead): the low
  // words of Q's and K_j's for S_j, V_{j-1}'s for P V (their high words are constants). Made at
  // issue, their address arithmetic sits between the turn's wait and the last GEMM issue, where
  // every consumer waits on it in turn (SASS: 98 instructions from the turn's wait to its pass in
  // d64's three-consumer kernel without a bound, 75 with them made ahead; 73 made at issue from
  // the warp-uniform slot offsets of the step below, which that kernel now uses).
  struct StepDescs {
    uint32_t a[kHeadDim / 16], b[kHeadDim / 16], v[kBlockN / 16];
  };
  auto step_descs = [&](int s_stage, int v_stage, StepDescs& d) {
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
      d.a[kk] = uint32_t(q_desc) + uint32_t(q_step(kk) >> 4);
      d.b[kk] = uint32_t(k_desc) + uint32_t(s_stage) * uint32_t(Cfg::kKVBytes >> 4) + uint32_t(k_step(kk) >> 4);
      asm volatile("" : "+r"(d.a[kk]), "+r"(d.b[kk]));
    }
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      d.v[kk] = uint32_t(v_desc) + uint32_t(v_stage) * uint32_t(Cfg::kKVBytes >> 4) + uint32_t(v_step(kk) >> 4);
      asm volatile("" : "+r"(d.v[kk]));
    }
  };
  auto issue_s_d = [&](const StepDescs& d) {
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk)
      wgmma::mma_ss<kBlockN, kType>(s, wgmma::desc_with_low(q_desc, d.a[kk]), wgmma::desc_with_low(k_desc, d.b[kk]), kk > 0);
  };
  auto issue_pv_d = [&](const StepDescs& d, const uint32_t(&pv)[kBlockN / 4]) {
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) pv_step(kk, wgmma::desc_with_low(v_desc, d.v[kk]), pv);
  };
  auto pin_o = [&] {  // O and, with kTensorRowSum, its row sums
    wgmma::pin(o);
    if constexpr (Cfg::kTensorRowSum) wgmma::pin(lsum);
  };
  // The current tile's sequence (seq_span): with varlen its own; otherwise the launch's lengths,
  // read at each use (len_q, len_k) as before there was varlen, but for the keys of a batch
  // entry's own (kEntryKeys: sp.k_len).
  SeqSpan sp{};
  auto len_q = [&] {
    if constexpr (kVarlen)
      return sp.q_len;
    else
      return p.seqlen_q;
  };
  auto len_k = [&] {
    if constexpr (kVarlen || kEntryKeys)
      return sp.k_len;
    else
      return p.seqlen_k;
  };
  // Masks S of key block n where the block needs it (mask.cuh); first_row: the tile's first row.
  auto mask = [&](int n, int first_row) {
    if (block_needs_mask<kMaskRows, kBlockN>(n, bound(), first_row + mask_rows_at, len_q(), len_k()))
      apply_mask<kBlockN, kOneSidedMask>(s, bound(), first_row + row0, n * kBlockN + col0, len_q(), len_k());
  };
  // The mask, then the online-softmax step (sm90/softmax.cuh).
  auto softmax = [&](int n, int first_row, float (&corr)[2]) {
    if constexpr (softcapped<Cfg>()) softcap_scores<kCapFma>(s, p.softcap, p.softcap_in);
    mask(n, first_row);
    softmax_step<kBlockN, Cfg::kPolyEvery, !Cfg::kTensorRowSum>(s, rows, p.scale_log2, p.rescale_threshold, corr);
  };
  // The same on the block's lower half (its first kBlockN / 2 keys: the first quarter of s, one
  // 8-column chunk in two), the upper half's P zero: a first block whose upper half none of this
  // consumer's rows see (kHalfFirst).
  auto softmax_lower_half = [&](int n, int first_row, float (&corr)[2]) {
    float(&lower)[kBlockN / 4] = reinterpret_cast<float(&)[kBlockN / 4]>(s);
    if constexpr (softcapped<Cfg>()) softcap_scores<kCapFma>(lower, p.softcap, p.softcap_in);
    apply_mask<kBlockN / 2>(lower, bound(), first_row + row0, n * kBlockN + col0, len_q(), len_k());
    softmax_step<kBlockN / 2, Cfg::kPolyEvery, !Cfg::kTensorRowSum>(lower, rows, p.scale_log2, p.rescale_threshold,
                                                                  corr);
#pragma unroll
    for (int i = kBlockN / 4; i < kBlockN / 2; ++i) s[i] = 0.0f;
  };
  // P_j as 16-bit pairs: in registers, or with kSmemP into the shared P tile (stmatrix, the
  // swizzle of Q's layout). Called only once P_{j-1} V_{j-1} has completed (no P buffer is read
  // while it is written); each thread's fence orders its stores before the async proxy's reads,
  // and the turn barrier before the next issue gathers the warpgroup's four warps.
  auto to_p = [&](uint32_t(&pv)[kBlockN / 4]) {
    if constexpr (Cfg::kSmemP) {
      const float unscaled[2] = {1.0f, 1.0f};
      stmatrix_tile<kBlockN, kBlockM, Cfg::kBF16, false>(smem_addr(smem + Cfg::kPOffset), consumer, t, s, unscaled);
      fence_proxy_async_smem();
    } else {
      pack_p<Cfg::kBF16>(s, pv);
    }
  };
  auto softmax_turn_begin = [&] {
    if constexpr (Cfg::kSoftmaxTurns) wait_softmax_turn<Cfg::kConsumers>(consumer);
  };
  auto softmax_turn_end = [&] {
    if constexpr (Cfg::kSoftmaxTurns) pass_softmax_turn<Cfg::kConsumers>(consumer);
  };
  auto release = [&](uint64_t* empty) {  // K/V slots: with clusters, in both CTAs
    if (t == 0) {
      mbar_arrive(empty);
      // The partner's barrier with arrive's default CTA-scope release: a cluster-scope release
      // here cost a third of the throughput (docs/perf-notes.md, "Clusters of two").
      if constexpr (kCluster > 1) mbar_arrive_remote(empty, rank ^ 1);
    }
  };
  auto release_q = [&](uint64_t* empty) {  // one arrive a warp: see q_empty's count
    if (lane == 0) {
      mbar_arrive(empty);
      if constexpr (kOInKV) mbar_arrive(&bar.q_free[consumer]);  // this consumer's rows of Q are free
    }
  };

  // The turn ring (FwdConfig::kTurnMode); without turns a consumer's own four warps still meet
  // before each issue (every slot release follows a barrier over all of them).
  auto turn_wait = [&] {
    if constexpr (Cfg::kTurnMode == 2)
      ptx::named_bar_sync(1 + consumer, 128);
    else
      wait_my_turn(consumer);
  };
  auto turn_pass = [&] {
    if constexpr (Cfg::kTurnMode != 2) pass_turn<Cfg::kConsumers, kTurnSub>(consumer);
  };
  // The turns a working consumer's steady step takes, for a consumer that passes a block over:
  // one, or two with the serial step (P V, then S).
  auto step_turns = [&] {
    turn_wait();
    turn_pass();
    if constexpr (Cfg::kSerialStep) {
      turn_wait();
      turn_pass();
    }
  };
  // Steady-state issue order of this consumer's two GEMMs, from the generated modulo schedule.
  // (A constant false when the schedule puts S first everywhere: the other path folds away.)
  constexpr bool kAnyPvFirst = Cfg::kScheduledOrder && (kSchedPvFirst0 || kSchedPvFirst1);
  const bool pv_first = kAnyPvFirst && sched_pv_first(consumer);
  // A tile's first S without a turn: it goes out as soon as its K has landed, under the other
  // consumers' last softmax and P V of the tile before, rather than after them. Not with kOInKV,
  // whose kv_read hand-over counts on the turns to keep either consumer within a tile of the
  // other.
  constexpr bool kTurnFirstS = kOInKV;
  // Consumer 0 issues first; the token then circulates (both rings).
  if (consumer == Cfg::kConsumers - 1) {
    turn_pass();
    softmax_turn_end();
  }
  RingPos<Cfg::kStages> r;
  // The Q ring: one counter (one register fewer through the main loop) in the stream-K kernel, and
  // where three or four consumers stage O (with stage and phase apart ptxas spilled the phase at
  // three, 8 bytes).
  constexpr bool kQCount = kSplit || (Cfg::kConsumers >= 3 && kStaged);
  std::conditional_t<kQCount, RingCount<Cfg::kQStages>, RingPos<Cfg::kQStages>> qr;
  auto q_stage = [&] {
    if constexpr (kQCount)
      return qr.stage();
    else
      return qr.stage;
  };
  auto q_phase = [&] {
    if constexpr (kQCount)
      return qr.phase();
    else
      return qr.phase;
  };
  // With kOInKV: the parity of the next kv_read hand-over (one a tile with keys).
  [[maybe_unused]] uint32_t kv_phase = 0;
  [[maybe_unused]] int lagged_warp = consumer;  // (kTileWarpLag: the warp held this tile, mod 4)
  for (;;) {
    // Q (with kOInKV this consumer's rows of it), and the tile index beside it.
    mbar_wait(&bar.q_full[kOInKV ? consumer : q_stage()], q_phase());
    if constexpr (test_lags<Cfg>().tile > 0) {  // (a test's config: FwdConfig has none)
      if (t / 32 == lagged_warp % 4) spin_cycles(test_lags<Cfg>().tile);
      ++lagged_warp;
    }
    stamp_b(4);
    // Read by lane 0 (the lane that later frees this Q buffer for the warp) and shuffled to the
    // warp: warp-uniform to the compiler, so what derives from it (tile, key range, masks) stays
    // in uniform registers and the wgmma around it in straight-line code.
    const auto uniform = [&](int x) { return __shfl_sync(0xffffffff, x, 0); };
    Tile tl;
    uint32_t place = 0;
    // The walk's order of key blocks (TileOrder::walk_block): n counts walk positions down from
    // range.hi - 1 to range.lo, and blk(n) is the key block at position n (for masks and softmax;
    // the rings, turns and frees go by position).
    bool diag_last = false;
    if constexpr (kSplit) {
      const int tile = uniform(lane == 0 ? ld_shared(&bar.item[q_stage()].x) : 0);
      if (tile == TileOrder::kEnd) break;
      decode_item(p.tiles, bar, tile, rank, tl);
      // Shuffled from lane 0 like the tile index: a piece's fields come from shared memory, and
      // the compiler keeps what it knows to be warp-uniform (key range, masks, descriptors) in
      // uniform registers.
      tl.batch = uniform(tl.batch);
      tl.head = uniform(tl.head);
      tl.m_block = uniform(tl.m_block);
      tl.lo = uniform(tl.lo);
      tl.hi = uniform(tl.hi);
      // The piece's place (piece, pieces, tail tile) held through the main loop in one register
      // (each well under 2^10 and 2^12: the launch's limits).
      place = uniform(int(pack_place(tl)));
    } else {  // the tile as the K loader decoded it (FwdBarriers::item)
      const int4 item = lane == 0 ? ld_shared_v4(&bar.item[q_stage()]) : make_int4(0, 0, 0, 0);
      if (uniform(item.x) >= p.tiles.count) break;
      tl.batch = uniform(item.y);
      tl.head = uniform(item.z);
      tl.m_block = uniform(item.w);
      if constexpr (kPairs) diag_last = p.tiles.diagonal_last(uniform(item.x), tl.m_block);
    }
    if constexpr (kVarlen) {  // from lane 0, as the tile (uniform registers)
      sp = seq_span<kVarlen, kPaged>(p, tl.batch);
      sp.q_off = uniform(sp.q_off);
      sp.q_len = uniform(sp.q_len);
      sp.k_len = uniform(sp.k_len);
    }
    if constexpr (kEntryKeys) sp.k_len = uniform(entry_keys(p, tl.batch));
    const int first_row = tile_first_row<kBlockM>(p.window, tl.m_block);
    // (window(), not bound(), except in the causal kernel: with bound() the d64 kernel without a
    // bound spilled 4 bytes)
    BlockRange range = key_block_range<kBlockM, kBlockN>(kCausal ? bound() : window(), tl.m_block, len_q(), len_k());
    if constexpr (kSplit) range = piece_range<kEntryKeys>(range, tl);
    auto blk = [&](int n) {
      if constexpr (kPairs)
        return TileOrder::walk_block(diag_last, n, range.lo, range.hi);
      else
        return n;
    };
#pragma unroll
    for (int i = 0; i < kHeadDimV / 2; ++i) o[i] = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; ++i) lsum[i] = 0.0f;
    // (with the query heads' sinks, where given, in a tile's first piece)
    start_rows<Cfg>(p, tl, !kSplit || (place & 1023u) == 0, first_row + row0, lane, rows);
    q_desc = wgmma::desc_sw128(
        smem_addr(sQ + q_stage() * Cfg::kQBytes) + consumer * (Cfg::kFoldedQO ? Cfg::kQBytes / 2 : 64 * 128), 16, 1024);
    // A consumer whose 64 rows all lie outside the sequence (a partial last tile's padding, or a
    // first tile's rows before row 0) computes nothing: it takes its turns at the tensor cores and
    // frees each K/V slot once it has landed, as the others do, so the ring runs at the working
    // consumers' pace.
    const int my_first = first_row + consumer * 64;
    const bool idle = kSkipIdle && (my_first >= len_q() || my_first + 64 <= 0);
    // K_n's slot back to the loader once S_n is done. With kOInKV the tile's last K (n == range.lo)
    // is where consumer 0 stages its O: consumer 1 tells it when it has read it, and consumer 0,
    // unless idle, keeps it until its O store has read it (the epilogue below). With
    // FwdConfig::kStageO0Apart consumer 0's O has a buffer of its own: the slot goes back now, and
    // there is no hand-over.
    auto release_k = [&](int n, int stage) {
      if (kOInKV && !Cfg::kStageO0Apart && n == range.lo) {
        if (consumer == 0 && !idle) return;
        if (consumer == 1 && t == 0) mbar_arrive(&bar.kv_read[0]);
      }
      release(&bar.k_empty[stage]);
    };
    // The same for the tile's last V after its P V, where consumer 1 stages its O.
    auto release_v_last = [&](int stage) {
      if constexpr (kOInKV) {
        if (consumer == 1 && !idle) return;
        if (consumer == 0 && t == 0) mbar_arrive(&bar.kv_read[1]);
      }
      release(&bar.v_empty[stage]);
    };
    int last_slot = 0;  // the ring slot of the tile's last K/V block

    // The idle consumer's walk below repeats, per key block, what the working path after it asks of
    // the rings and the turns: K_n landed, V of the block before landed (past the first), a turn
    // (past the first unless kTurnFirstS; there the consumer's own barrier), K_n's slot and the
    // earlier V slot freed; then Q freed and, for the tile's last V, one more turn and
    // release_v_last. A change to the working path's waits, turns or frees must be made here too: a
    // mismatch hangs the CTA or frees a slot early (ForwardGpu.ManyTilesPersistentGrid and
    // TilesWithoutKeysAmongTilesWithKeys run idle consumers beside working ones;
    // ForwardGpu.IdleConsumersWarpsLate* hold three warps back). Running the working path with its
    // GEMMs and softmax skipped instead would put an idle test into every step of the main loop.
    if (idle && range.hi > range.lo) {
      if constexpr (test_lags<Cfg>().idle > 0)  // (a test's config: FwdConfig has none)
        if (t >= 32) spin_cycles(test_lags<Cfg>().idle);
      int prev = 0;
      uint32_t prev_phase = 0;
      for (int n = range.hi - 1; n >= range.lo; --n) {
        mbar_wait(&bar.k_full[r.stage], r.phase);
        if (n < range.hi - 1) mbar_wait(&bar.v_full[prev], prev_phase);
        if (n < range.hi - 1) {  // the turns the working consumers take
          step_turns();
        } else if (kTurnFirstS) {  // (their first S takes one)
          turn_wait();
          turn_pass();
        } else {
          // Every warp has seen K_n land before thread 0 frees its slot, as before the working
          // path's first S. Without this a warp that reached its wait only after the slot had been
          // refilled waited on a parity the barrier had passed twice, and the CTA hung (the traced
          // d64 three-consumer kernel at 512 and 4k, whose stamps delay warps unevenly).
          named_bar_sync(own_barrier<Cfg>(consumer), 128);
        }
        release_k(n, r.stage);
        if (n < range.hi - 1) release(&bar.v_empty[prev]);
        prev = r.stage;
        prev_phase = r.phase;
        r.advance();
      }
      release_q(&bar.q_empty[q_stage()]);
      mbar_wait(&bar.v_full[prev], prev_phase);
      turn_wait();
      turn_pass();
      release_v_last(prev);
    } else if (range.hi > range.lo) {
      int n = range.hi - 1;
      float corr[2];
      // With a right bound (causal), past the last key this consumer's last row sees.
      // (Rows are queries but for a folded query group: Window::fold.)
      const int seen_end = row_query(bound(), my_first + 63) + 1 + key_offset(bound(), len_q(), len_k()) + p.window.right;
      // The V slot of the last block passed over (kSkipLeading, kSkipFirstWhole), freed after the
      // first S.
      [[maybe_unused]] int skipped_v = -1;
      [[maybe_unused]] uint32_t skipped_phase = 0;
      if constexpr (kSkipLeading || kSkipFirstWhole) {
        // The blocks none of these rows see before the first S, all of them (kSkipLeading) or the
        // first alone (kSkipFirstWhole), always leaving a block to walk. Each is seen landed and
        // takes a turn, as the working path's steps do: the turn orders the free after the other
        // consumers' free of the slot's earlier use, and gathers this consumer's four warps past
        // their waits before thread 0 frees K's slot. A block's V slot is freed with the next
        // block's K, the last one's after the first S: with kSkipLeading once the first S's
        // barrier has gathered the warps past its wait (below), with kSkipFirstWhole after the S,
        // seen landed there (an O staged in that slot included).
        while (bound().right >= 0 && seen_end <= blk(n) * kBlockN && n > range.lo) {
          mbar_wait(&bar.k_full[r.stage], r.phase);
          if (skipped_v >= 0) mbar_wait(&bar.v_full[skipped_v], skipped_phase);
          step_turns();
          release_k(n, r.stage);
          if (skipped_v >= 0) release(&bar.v_empty[skipped_v]);
          skipped_v = r.stage;
          skipped_phase = r.phase;
          r.advance();
          --n;
          if constexpr (kSkipFirstWhole) break;
        }
        if constexpr (kSkipLeading)
          if (skipped_v >= 0) mbar_wait(&bar.v_full[skipped_v], skipped_phase);
      }
      // With a left bound, the lowest block this consumer's first row sees (at most the first it
      // walks): the blocks below it are passed over after the last P V (kSkipLeading).
      int my_lo = range.lo;
      if constexpr (kSkipLeading) {
        const int lo_key = row_query(bound(), my_first) + key_offset(bound(), len_q(), len_k()) - bound().left;
        if (bound().left >= 0 && lo_key > range.lo * kBlockN) my_lo = min(n, lo_key / kBlockN);
      }
      // First block: S_0 alone. With the serial step, where these rows see only the block's lower
      // half, S_0 and its P V cover that half alone (kHalfGemms).
      [[maybe_unused]] const bool lower_first =
          kHalfGemms && p.window.right >= 0 && seen_end <= blk(n) * kBlockN + kBlockN / 2;
      [[maybe_unused]] bool pv_lower = lower_first;
      const int first_slot = uniform(r.stage * Cfg::kKVBytes);
      mbar_wait(&bar.k_full[r.stage], r.phase);
      // With one V slot the block after a passed-over one loads its V into that block's slot as
      // soon as it is freed (after this S): every warp sees the passed-over V land before the turn
      // below gathers them, so none waits on its parity after the refill.
      if constexpr (kSkipFirstWhole && Cfg::kStages == 1)
        if (skipped_v >= 0) mbar_wait(&bar.v_full[skipped_v], skipped_phase);
      if constexpr (kTurnFirstS)
        turn_wait();
      else  // the consumer's four warps meet before an issue whose slot thread 0 then frees
        named_bar_sync(own_barrier<Cfg>(consumer), 128);
      wgmma::fence();
      if constexpr (kHalfGemms) {
        if (lower_first)
          issue_s_at.template operator()<true>(first_slot);
        else
          issue_s_at(first_slot);
      } else {
        issue_s_at(first_slot);
      }
      wgmma::commit_group();
      if constexpr (kTurnFirstS) turn_pass();
      stamp_b(5);
      wgmma::wait_group<0>();
      wgmma::pin(s);
      stamp_b(6);
      if (kEarlyQFree && n == range.lo) release_q(&bar.q_empty[q_stage()]);
      release_k(n, r.stage);
      if constexpr (kSkipLeading || kSkipFirstWhole)
        if (skipped_v >= 0) {
          // (With one V slot every warp saw it land before the turn above; a second wait here could
          // come after the slot's refill, on a parity the barrier had passed twice: a hang.)
          if constexpr (kSkipFirstWhole && Cfg::kStages > 1) mbar_wait(&bar.v_full[skipped_v], skipped_phase);
          release(&bar.v_empty[skipped_v]);
        }
      softmax_turn_begin();
      // With a right bound (causal), how much of the first block this consumer's rows see: none
      // (their keys all lie in lower blocks; P is zero and the rows stay as they were, as the
      // whole step would leave them), the lower half (the step on it, the upper half's P zero;
      // its mask takes the one-compare path where there is no left bound), or more (the whole
      // step).
      if (kSkipFirst && p.window.right >= 0 && seen_end <= blk(n) * kBlockN) {
#pragma unroll
        for (int i = 0; i < kBlockN / 2; ++i) s[i] = 0.0f;
        corr[0] = corr[1] = 1.0f;
      } else if (kHalfFirst && p.window.right >= 0 && seen_end <= blk(n) * kBlockN + kBlockN / 2) {
        softmax_lower_half(blk(n), first_row, corr);
      } else {
        softmax(blk(n), first_row, corr);
      }
      softmax_turn_end();
      to_p(pf);
      stamp_b(7);
      int prev = r.stage;
      uint32_t prev_phase = r.phase;
      r.advance();
      // Steady state, one K/V block: S_j with P_{j-1} V_{j-1} in flight. `p_prev` holds P_{j-1};
      // P_j goes to `p_next` (the same array when registers allow only one).
      // Trace events of a step: 0 start, 1 K and V landed, 2 turn taken, 3 GEMMs issued, 4 S ready,
      // 5 softmax done, 6 P V done, 7 end.
      // Whether K_j and V_{j-1} were seen landed by the probe of the step before (issued right after
      // that step's S, so its latency hides under the softmax).
      bool k_landed = false, v_landed = false;
      auto step = [&](int n, uint32_t(&p_prev)[kBlockN / 4], uint32_t(&p_next)[kBlockN / 4]) {
        stamp(0);
        // The slots' byte offsets shuffled from lane 0, read by the descriptors alone: warp-uniform
        // to ptxas, so it builds those descriptors on the uniform datapath instead of in registers
        // moved over by R2UR between the turn's wait and its pass.
        const int s_slot = uniform(r.stage * Cfg::kKVBytes), v_slot = uniform(prev * Cfg::kKVBytes);
        if constexpr (Cfg::kSerialStep) {
          // P_{j-1} V_{j-1} in one turn; S_j in the next once it is done (P's registers free).
          mbar_wait(&bar.v_full[prev], prev_phase);
          turn_wait();
          wgmma::fence();
          issue_pv_maybe_lower(v_slot, p_prev, pv_lower);
          pv_lower = false;
          wgmma::commit_group();
          turn_pass();
#pragma unroll
          for (int i = 0; i < kBlockN / 2; ++i) s[i] = 0.0f;  // S's old values dead: its registers may be P's
          wgmma::wait_group<0>();
          pin_o();
          wgmma::pin(p_prev);
          release(&bar.v_empty[prev]);
          mbar_wait(&bar.k_full[r.stage], r.phase);
          turn_wait();
          wgmma::fence();
          issue_s_at(s_slot);
          wgmma::commit_group();
          turn_pass();
          wgmma::wait_group<0>();
          wgmma::pin(s);
          if (kEarlyQFree && n == range.lo) release_q(&bar.q_empty[q_stage()]);
          release_k(n, r.stage);
          softmax(blk(n), first_row, corr);
          rescale_o(o, corr);
          to_p(p_next);
          prev = r.stage;
          prev_phase = r.phase;
          r.advance();
          return;
        }
        [[maybe_unused]] StepDescs d;
        if constexpr (kDescsAhead) step_descs(r.stage, prev, d);
        if (!k_landed) mbar_wait(&bar.k_full[r.stage], r.phase);
        if (!v_landed) mbar_wait(&bar.v_full[prev], prev_phase);
        stamp(1);
        turn_wait();
        stamp(2);
        if constexpr (test_lags<Cfg>().step > 0)  // (a test's config: one warp late to the step's issue)
          if (t / 32 == 1 + (n & 1)) spin_cycles(test_lags<Cfg>().step);
        wgmma::fence();
        if (pv_first) {  // P_{j-1} V_{j-1}, then S_j; softmax after both
          issue_pv(prev, p_prev);
          wgmma::commit_group();
          issue_s(r.stage);
          wgmma::commit_group();
          turn_pass();
          wgmma::wait_group<0>();
          wgmma::pin(s);
          pin_o();
          wgmma::pin(p_prev);
          if (kEarlyQFree && n == range.lo) release_q(&bar.q_empty[q_stage()]);
          release_k(n, r.stage);
          release(&bar.v_empty[prev]);
          softmax_turn_begin();
          softmax(blk(n), first_row, corr);
          softmax_turn_end();
        } else {  // S_j first: its softmax runs while P_{j-1} V_{j-1} is on the tensor cores
          if constexpr (kDescsAhead) issue_s_d(d); else issue_s_at(s_slot);
          wgmma::commit_group();
          if constexpr (Cfg::kTurnMode == 1) turn_pass();
          if constexpr (kDescsAhead) issue_pv_d(d, p_prev); else issue_pv_at(v_slot, p_prev);
          wgmma::commit_group();
          if constexpr (Cfg::kTurnMode != 1) turn_pass();
          stamp(3);
          wgmma::wait_group<1>();
          wgmma::pin(s);
          stamp(4);
          if (kEarlyQFree && n == range.lo) release_q(&bar.q_empty[q_stage()]);
          // With the row-max-free step K_j is held until its check has stood (below).
          if constexpr (!kNoMaxHere) release_k(n, r.stage);
          {
            RingPos<Cfg::kStages> nx = r;
            nx.advance();
            k_landed = mbar_test(&bar.k_full[nx.stage], nx.phase);
            v_landed = mbar_test(&bar.v_full[r.stage], r.phase);
          }
          softmax_turn_begin();
          if constexpr (kNoMaxHere) {
            // An unmasked block takes the step without the row max (softmax.cuh); when any
            // thread's check fails, the warpgroup computes S again from K_j, still held, and takes
            // the exact step (decided together: bar.red.or on this consumer's own barrier). Decided
            // here, before P V's wait: ptxas then keeps that wait among the exponentials, where it
            // measured best.
            bool exact = block_needs_mask<kMaskRows, kBlockN>(blk(n), bound(), first_row + mask_rows_at, len_q(), len_k());
            if (!exact) {
              if constexpr (softcapped<Cfg>()) softcap_scores<kCapFma>(s, p.softcap, p.softcap_in);
              float bsum[2];
              const bool ok = softmax_step_no_max<kBlockN, Cfg::kPolyEvery>(s, bsum, rows, p.scale_log2,
                                                                          kNoMaxSumLimit);
              if (named_bar_any(own_barrier<Cfg>(consumer), 128, !ok)) {
                wgmma::fence();
                issue_s(r.stage);
                wgmma::commit_group();
                wgmma::wait_group<0>();
                wgmma::pin(s);
                exact = true;
              } else {
                corr[0] = corr[1] = 1.0f;
                rows[0].sum += bsum[0];
                rows[1].sum += bsum[1];
              }
            }
            if (exact) softmax(blk(n), first_row, corr);
            release_k(n, r.stage);
            if constexpr (Cfg::kDoubleP) to_p(p_next);
          } else {
            softmax(blk(n), first_row, corr);
            if constexpr (Cfg::kDoubleP) to_p(p_next);
          }
          softmax_turn_end();
          {  // a second look for what had not landed at the first
            RingPos<Cfg::kStages> nx = r;
            nx.advance();
            if (!k_landed) k_landed = mbar_test(&bar.k_full[nx.stage], nx.phase);
            if (!v_landed) v_landed = mbar_test(&bar.v_full[r.stage], r.phase);
          }
          stamp(5);
          wgmma::wait_group<0>();
          pin_o();
          wgmma::pin(p_prev);
          stamp(6);
          release(&bar.v_empty[prev]);
        }
        rescale_o(o, corr);
        if constexpr (Cfg::kTensorRowSum) rescale_o(lsum, corr);
        if (!Cfg::kDoubleP || pv_first) to_p(p_next);
        stamp(7);
        if constexpr (traced<Cfg>(kTraceStep)) tr.next();
        prev = r.stage;
        prev_phase = r.phase;
        r.advance();
      };
      // With two P buffers the loop alternates them (register arrays need constant indices).
      bool last_in_pf2 = false;
      if constexpr (Cfg::kDoubleP) {
        for (--n; n >= my_lo; --n) {
          step(n, pf, pf2);
          last_in_pf2 = true;
          if (--n < my_lo) break;
          step(n, pf2, pf);
          last_in_pf2 = false;
        }
      } else {
        for (--n; n >= my_lo; --n) step(n, pf, pf);
      }
      stamp_b(0);
      // (The idle consumer's walk above mirrors this path's waits, turns and frees.)
      // Every S of this tile is done: its Q buffer is free (with kOInKV this consumer's rows, to
      // its Q loader: q_free), unless the last S's step freed it (kEarlyQFree).
      if constexpr (!kEarlyQFree) release_q(&bar.q_empty[q_stage()]);
      // Last P V.
      const int last_v_slot = uniform(prev * Cfg::kKVBytes);
      mbar_wait(&bar.v_full[prev], prev_phase);
      turn_wait();
      wgmma::fence();
      if constexpr (Cfg::kDoubleP) {
        if (last_in_pf2)
          issue_pv_at(last_v_slot, pf2);
        else
          issue_pv_at(last_v_slot, pf);
      } else if constexpr (kHalfGemms) {
        issue_pv_maybe_lower(last_v_slot, pf, pv_lower);
      } else {
        issue_pv_at(last_v_slot, pf);
      }
      wgmma::commit_group();
      turn_pass();
      stamp_b(1);
      wgmma::wait_group<0>();
      pin_o();
      stamp_b(2);
      release_v_last(prev);
      last_slot = prev;
      if constexpr (kSkipLeading) {
        // The tile's blocks below this consumer's rows (a left bound): each landed, a turn (which
        // gathers the four warps past their waits), both slots freed.
        for (n = my_lo - 1; n >= range.lo; --n) {
          mbar_wait(&bar.k_full[r.stage], r.phase);
          mbar_wait(&bar.v_full[r.stage], r.phase);
          turn_wait();
          turn_pass();
          release(&bar.k_empty[r.stage]);
          release(&bar.v_empty[r.stage]);
          r.advance();
        }
      }
    } else {
      release_q(&bar.q_empty[q_stage()]);
    }
    if constexpr (Cfg::kTensorRowSum)
      for (int i = 0; i < 2; ++i) rows[i].sum = lsum[2 * i];  // the whole row's sum in every thread
    uint8_t* s_o = smem + Cfg::kOOffset;
    // In the bounded and stream-K kernels of three or four consumers the epilogue's thread index
    // is read afresh: its per-thread shared-memory addresses are loop-invariant, and from `t` ptxas
    // hoists them out of the tile loop, where they spilled 140-168 bytes through the main loop.
    // Elsewhere the fresh read cost 0.4-1 % (d64 512, 1k) (docs/perf-notes.md).
    const int te = Cfg::kConsumers >= 3 && (kBounded || kSplit) ? ptx::fresh_thread_index() % 128 : t;
    if constexpr (kOInKV) {
      if (range.hi <= range.lo) {
        store_keyless<Cfg, kVarlen, FwdKernelParams, kFoldable>(p, tl, sp, rows, consumer, t);
      } else {
        // The other consumer has read the slot. An idle consumer waits too, so every phase of
        // kv_read is observed: skipped, it left a phase no thread waited on before the other
        // consumer arrived again (synccheck's "missing wait", d256 causal with consumer 0 idle in
        // each head's first tile, ForwardGpu.WarpsSkewedEveryTile).
        // Consumer 0's O in a buffer of its own (kStageO0Apart): no hand-over, nothing to give back.
        const bool own_buffer = Cfg::kStageO0Apart && consumer == 0;
        if (!own_buffer) mbar_wait(&bar.kv_read[consumer], kv_phase);
        if (!idle) {  // O through the tile's last K (consumer 0) or V (consumer 1) slot
          uint8_t* slot = (consumer == 0 ? sK : sV) + last_slot * Cfg::kKVBytes;
          if constexpr (Cfg::kStageO0Apart)
            if (own_buffer) slot = s_o;
          store_output<Cfg, true, FwdKernelParams, kWideO, 64, kVarlen, kFoldable>(p, tl, sp, o, rows, consumer, te, slot);
          if (!own_buffer) {
            if (t == 0) tma_store_wait_read();  // the store has read the slot: back to the loader
            release(consumer == 0 ? &bar.k_empty[last_slot] : &bar.v_empty[last_slot]);
          }
        }
        kv_phase ^= 1u;
      }
    } else if constexpr (kSplit) {
      unpack_place(place, tl);
      // A stream-K piece stores only when it is its tile's last and has merged the others; an idle
      // consumer has nothing to merge or store.
      if (!idle && (tl.pieces == 1 || merge_pieces<Cfg, kCluster>(p, tl, o, rows, consumer, t, rank)))
        store_output<Cfg, kStaged, FwdKernelParams, kWideO, Cfg::kBlockM, false, kFoldable>(p, tl, sp, o, rows, consumer, te, s_o);
    } else {
      store_output<Cfg, kStaged, FwdKernelParams, kWideO, Cfg::kBlockM, kVarlen, kFoldable>(p, tl, sp, o, rows, consumer, te, s_o);
    }
    stamp_b(3);
    qr.advance();
  }
  if (kStaged && t == 0) tma_store_wait();  // shared memory must outlive the last store
  if constexpr (traced<Cfg>(kTraceCta))
    if (threadIdx.x == 128 && p.trace != nullptr) stamp_cta<Cfg::kConsumers>(p.trace, 1);
}

}  // namespace fa4::sm90
