// sm90 backward: the gradients of attention, recomputing P from Q, K and the forward's LSE.
//
//   D    = rowsum(dO * O), and LSE * log2 e               bwd_delta_kernel
//   per key block (bwd_dkdv_wgmma.cuh, one CTA), over every query block of 64 that sees it and every
//   query head of its KV head's group:
//     S^T  = K Q^T,  P^T = exp2(S^T * scale * log2 e - LSE * log2 e)       (masked: 0)
//     dP^T = V dO^T, dS^T = P^T * (dP^T - D) * scale
//     (soft-capped, BwdKnobs::softcap: S^T capped before P^T, dS^T times the cap's slope 1 - tanh^2)
//     dV  += P^T dO,  dK += dS^T Q                                         (fp32 in registers)
//     dQ  += dS K     fp32 reductions into the workspace, converted by bwd_dq_convert_kernel;
//   or, deterministic, dQ by a kernel of its own (bwd_dq_wgmma.cuh): one CTA a block of query rows
//   walking its key blocks in order (S and dP computed a second time), so no sum depends on the
//   order CTAs run in.
//
// This file holds what the kernels share (sizes, masks, packing, the workspace's layout) and the
// two small kernels around them: D and the dQ conversion.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_pipeline.h>

#include <cuda/ptx>

#include <cstdint>
#include <type_traits>

#include "common/bwd_params.h"
#include "fa4/numerics/exp2.h"
#include "fa4/numerics/online_softmax.h"  // (kLog2e)
#include "ptx/sync.h"
#include "sm90/seq_span.cuh"
#include "sm90/softmax.cuh"  // pack2
#include "sm90_bwd_d192_schedule.h"  // (scheduler/generated: the d192 step ring's depth)

namespace fa4::sm90::bwd {

inline constexpr int kBlock = 64;  // query rows of a dK/dV step (and keys of a d256 dK/dV CTA)
inline constexpr int kThreads = 256;

// A dK/dV kernel's knobs (BwdConfig's third argument): the shipped ones by default (bwd_knobs,
// sm90_bwd.cu), others for tools/sm90_bwd_probe.cu, which times them against those. Shipped: d64
// four step buffers, 64-column boxes, dQ whole by alternate warpgroups a step behind on four dS^T
// buffers and added by atomics, warpgroup 1 started behind warpgroup 0; d128 three step buffers,
// folded boxes, dQ a step behind on two dS^T buffers and warpgroup 1 started behind warpgroup 0;
// d192 and d256 two step buffers and folded boxes; at every head dim K and V by TMA and dK and dV
// written through shared memory; at d64 and d128 the dK/dV kernel launched as D's programmatic dependent
// (docs/perf-notes.md, "The backward's candidates on an H200", "The backward graphs on the
// calibrated TMA costs", "The d128 backward's warpgroups apart", "d64's dQ by turns", "A dK/dV
// CTA's start and end", "The kernels around the dK/dV kernel"). BwdConfig names each kX after its
// knob x (step_bufs: kStepBufs).
struct BwdKnobs {
  // Buffers of the step ring (Q, dO and the step's LSE and D rows), loaded ahead (shipped: d64 4,
  // d128 3, d192 and d256 2).
  int step_bufs = 3;
  // Q and dO loaded as one TMA box a tile, the 64-column blocks folded into a box dimension
  // (ptx::map_bshd_16bit_sw128_folded), instead of a box a column block.
  bool folded_boxes = true;
  // d64/d128: each warpgroup's dQ share is its own 64 keys' over every column (in head_dim / 64
  // pieces), so no CTA barrier waits for the other's dS^T; false: its 64 columns over all 128 keys
  // (d128 shipped), or at d64 all of it every other step (dq_alternate, d64 shipped).
  bool dq_by_keys = false;
  // The rows' log2 LSE and D interleaved in the workspace ({LSE, D} a row from BwdParams::delta,
  // the same bytes as the two arrays), so a step loads them with one bulk copy instead of two.
  bool paired_stats = false;
  // clock64 stamps of each step into BwdParams::trace (StepTrace).
  bool trace = false;
  // d128 by columns or d64 by alternate warpgroups, if not 0: dQ of step s computed at the end of
  // step s + 1, from a ring of this many dS^T buffers behind mbarriers (full: both warpgroups
  // stored it; empty: the warpgroups computing its dQ read it) in place of the CTA barrier before
  // dQ, so that neither warpgroup waits on the other within a step and the two may run apart
  // (d128 shipped: 2, d64: 4); 0: dQ of each step in the step, after a CTA barrier.
  int dq_lag_bufs = 0;
  // With dq_lag_bufs: warpgroup 1 starts its first step once warpgroup 0's first step has reached
  // point `skew` (1 S^T landed, 2 dP^T landed (d64, d128 shipped), 3 dK issued), so that the two
  // run apart from the start; 0: together.
  int skew = 0;
  // d64 with dq_lag_bufs: dQ of step s computed whole (all 128 keys, every column) by warpgroup
  // s % 2 alone, a step behind, so that neither warpgroup waits for the other's partial; dS^T's
  // empty mbarrier then counts that warpgroup's four warps (d64 shipped).
  bool dq_alternate = false;
  // d64 (dQ by keys): the two warpgroups' dQ partials summed in shared memory and reduced into the
  // workspace once a step (warpgroup 0 stores its partial, warpgroup 1 adds its own and issues the
  // bulk reduction; mbarriers hand the stage over), instead of a reduction of each warpgroup's
  // partial: half the reductions' bytes (d64 shipped before dq_alternate).
  bool dq_pair_sum = false;
  // P^T's exponentials of every poly_every-th 8-query chunk on the FMA pipe (the software exp2,
  // numerics/exp2.h), the rest on MUFU; 0: all on MUFU (shipped).
  int poly_every = 0;
  // Who issues a step's loads, and when: thread 0 at the top of the step before (0, d256
  // shipped), thread 0 once that step's S^T and dP^T are issued (1, d64 and d128 shipped), or a
  // third warpgroup (2, d64/d128; setmaxnreg gives its registers to the two), whose first thread
  // issues each as soon as the ring frees its buffer.
  int load_issue = 0;
  // d64/d128, load_issue 0 or 1: the warpgroup whose first thread issues them (0 shipped; 1, where
  // d64's trace had warpgroup 1 waiting for its loads, measured 0.98-1.01 at d64, 0.94-1.00 at
  // d128).
  int load_wg = 0;
  // d64/d128/d192 (not dq_pair_sum): dQ's pieces added into the workspace by float4 atomics from
  // the registers, as d256 adds its, instead of staged in shared memory for a bulk reduction (d64
  // shipped: +0.8-2.4 %; d128 measured 0.92-1.00; d192 staged, not yet measured either way).
  bool dq_atomics = false;
  // Each step's query head and first row advanced from the step before's (no division in the
  // loop; shipped); false: found from the step's index (s / count, s % count; d64 shipped that
  // with its partials summed, where ptxas scheduled that form's loop better).
  bool step_cursor = true;
  // A step's LSE and D rows read by ld.shared (d64 and d128 shipped), else by generic loads (d256
  // shipped: the same there).
  bool stats_lds = true;
  // P^T's exponentials in two loops, one with the mask's tests and one without (with_mask;
  // shipped), else one loop that tests each element where the block is not whole (a branch an
  // element, which starved the warps' instruction fetch).
  bool mask_hoist = true;
  // dS^T (d256: P^T and dS^T) stored by stmatrix, four 8 x 8 blocks an instruction (shipped), else
  // a 32-bit st.shared a pair.
  bool stmatrix = true;
  // dK and dV written through shared memory at the CTA's end (stmatrix into a tile free by then,
  // then 16 bytes a thread, consecutive threads along a row; store_rows_staged), and d128's last
  // dQ reductions waited for only until they have read their stage; else 4-byte stores straight
  // from the accumulator layout, whose every warp instruction touches eight rows, after the
  // reductions' completion.
  bool staged_stores = true;
  // The CTA's K and V rows loaded by TMA (one thread, boxes of 64 columns, landing on an mbarrier,
  // issued before the first step's; shipped), else by every thread's cp.async.
  bool kv_tma = true;
  // D's kernel zeroes the fp32 accumulator (each CTA its rows' share; no memset before it), and
  // the dK/dV kernel is launched as D's programmatic dependent (cudaLaunchKernelEx, programmatic
  // stream serialization): its CTAs start on the SMs D's kernel leaves, issue K and V, and wait
  // for D's grid (cudaGridDependencySynchronize) before the first step's loads (d64 and d128
  // shipped; measured at d256 0.98-1.01).
  bool pdl = false;
  // Deterministic: the dQ kernel launched as the dK/dV kernel's programmatic dependent, the dK/dV
  // CTAs triggering once past D's grid, so that its CTAs run on the SMs the dK/dV kernel's last
  // wave leaves idle. It reads only the inputs and D's outputs, complete by then, and writes only
  // dQ, which the dK/dV kernel does not touch, so it does not wait for the dK/dV grid (shipped).
  bool dq_overlap = true;
  // Variable-length batches (detail::BwdParams::cu_seqlens_q): each CTA's rows from its
  // sequence's (seq_span). Not a measurement knob: the launch picks it for varlen calls.
  bool varlen = false;
  // Soft-capped scores (detail::BwdParams::softcap): S^T capped before P^T, and dS^T times the
  // cap's slope (softcap_score). Not a measurement knob: the launch picks it for capped calls.
  bool softcap = false;
  // With 64-column boxes (no folded ones) and K and V by TMA: the tensors may have fewer columns
  // than the head dim (BwdParams::qk_cols, v_cols: a head dim without a kernel, read and written
  // where the caller's tensors are): the maps' extents are theirs, TMA fills the columns past them
  // with zeros, and the dK and dV stores skip them. The launch takes a configuration of its own
  // for such calls at every head dim (bwd_knobs_in_place), so the shipped kernels of calls at a
  // kernel head dim are as they were.
  bool in_place = false;
  // d192 with its dQ staged: stages of 16 KB a warpgroup (1 shipped; 2 where shared memory allows,
  // 192 / 128), so that a warpgroup's next piece is written while the reduction of the one before
  // still reads the other (cp.async.bulk.wait_group.read 1 instead of 0).
  int dq_stages = 1;
  // Diagnostic, d192 (wrong results, for timing only: tools/sm90_bwd_probe): dQ's pieces computed
  // and not added, so that a step's time without its reductions can be read.
  bool dq_unreduced = false;
  // The split kernel's warpgroup index as threadIdx.x / 128, which ptxas takes for divergent: at
  // d192, whose warpgroups branch to different GEMMs, it then serializes every wgmma (C7520), as
  // the kernels did until the index was read through a shuffle (false, shipped). For the probe's
  // A/B only.
  bool divergent_wg = false;
};

// The shipped knobs of head dim d.
constexpr BwdKnobs bwd_knobs(int d) {
  BwdKnobs k;
  // d192: the solver's step ring (scheduler/graphs/sm90_bwd_d192.graph; its one P^T and dS^T
  // buffer assumes a wait the kernel spares itself with two).
  k.step_bufs = d == 192 ? sched::sm90_bwd_d192::kRingStages : d == 256 ? 2 : d == 64 ? 4 : 3;
  k.folded_boxes = d != 64;
  k.dq_alternate = d == 64;
  k.dq_lag_bufs = d == 128 ? 2 : d == 64 ? 4 : 0;
  k.skew = d >= 192 ? 0 : 2;
  k.load_issue = d >= 192 ? 0 : 1;
  k.dq_atomics = d == 64;
  k.stats_lds = d < 192;
  k.pdl = d < 192;
  return k;
}
// The shipped knobs of head dim d for calls whose tensors have fewer columns (BwdParams::qk_cols,
// v_cols): 64-column boxes in place of folded ones at d128, d192 and d256 (folding measured
// +0.1-1.7 % at d128, +1.3-3.2 % at d256: "The backward's candidates on an H200"), so that the
// maps' extents can be the caller's columns (d64's boxes are one column block already).
constexpr BwdKnobs bwd_knobs_in_place(int d) {
  BwdKnobs k = bwd_knobs(d);
  k.folded_boxes = false;
  k.in_place = true;
  return k;
}
// The shipped knobs of head dim d as `edit` changes them (a candidate's):
//   constexpr auto kTraced = bwd_knobs(64, [](BwdKnobs& k) { k.trace = true; });
template <class Edit>
constexpr BwdKnobs bwd_knobs(int d, Edit edit) {
  BwdKnobs k = bwd_knobs(d);
  edit(k);
  return k;
}

// A dK/dV kernel's configuration: head dim, dtype and knobs, as the kernels read them; kDv_ the
// value side's head dim (v, o, dout, dv), kD_'s but at 192 / 128 (DeepSeek's; the split kernel).
template <int kD_, bool kBF16_, BwdKnobs K = bwd_knobs(kD_), int kDv_ = kD_>
struct BwdConfig {
  static constexpr int kD = kD_;
  static constexpr int kDv = kDv_;
  static_assert(kDv == kD || (kD == 192 && kDv == 128), "two head dims: 192 / 128 only");
  static constexpr bool kBF16 = kBF16_;
  static constexpr int kStepBufs = K.step_bufs;
  static constexpr bool kFoldedBoxes = K.folded_boxes;
  static constexpr bool kDqByKeys = K.dq_by_keys;
  static constexpr bool kPairedStats = K.paired_stats;
  static constexpr bool kTrace = K.trace;
  static constexpr bool kDqLag = K.dq_lag_bufs > 0;
  static constexpr int kDqLagBufs = K.dq_lag_bufs;
  static constexpr int kSkew = K.skew;
  static constexpr bool kDqPairSum = K.dq_pair_sum;
  static constexpr bool kDqAlternate = K.dq_alternate;
  static constexpr int kPolyEvery = K.poly_every;
  static constexpr int kLoadIssue = K.load_issue;
  static constexpr int kLoadWg = K.load_wg;
  static constexpr bool kDqAtomics = K.dq_atomics;
  static constexpr bool kStepCursor = K.step_cursor;
  static constexpr bool kStatsLds = K.stats_lds;
  static constexpr bool kMaskHoist = K.mask_hoist;
  static constexpr bool kStMatrix = K.stmatrix;
  static constexpr bool kStagedStores = K.staged_stores;
  static constexpr bool kKvTma = K.kv_tma;
  static constexpr bool kPdl = K.pdl;
  static constexpr bool kDqOverlap = K.dq_overlap;
  static constexpr bool kVarlen = K.varlen;
  static constexpr bool kSoftcap = K.softcap;
  static constexpr bool kInPlace = K.in_place;
  static constexpr int kDqStages = K.dq_stages;
  static constexpr bool kDqUnreduced = K.dq_unreduced;
  static constexpr bool kDivergentWg = K.divergent_wg;
  static constexpr int kCtaThreads = kThreads + (kLoadIssue == 2 ? 128 : 0);  // the dK/dV kernel's block
  // kLoadIssue 2: the pool is kCtaThreads x 168 registers (65536 / 384, rounded down to 8); the
  // loading warpgroup keeps 24 a thread, the two computing ones get 240.
  static constexpr int kLoaderRegs = 24, kComputeRegs = 240;
  static_assert(kLoadIssue != 2 || 128 * kLoaderRegs + kThreads * kComputeRegs <= kCtaThreads * (65536 / kCtaThreads / 8 * 8),
                "setmaxnreg would ask for more registers than the CTA's pool");
  static_assert(kD != 64 || kDqByKeys || kDqAlternate, "d64's dQ is by keys or by alternate warpgroups");
  static_assert(kD == 64 || kD == 128 || kD == 192 || kD == 256, "the backward's head dims: 64, 128, 192, 256");
  static_assert(kD <= 128 || !kDqByKeys, "d192 and d256 split dQ by columns");
  static_assert(!kDqLag || ((kD == 128 || kDqAlternate) && !kDqByKeys && kDqLagBufs >= 2),
                "dQ a step behind: d128 with dQ by columns or d64 by alternate warpgroups, two dS^T buffers or more");
  static_assert(!kDqAlternate || (kD == 64 && kDqLag && !kDqPairSum),
                "dQ by alternate warpgroups: d64, a step behind, no partials to sum");
  static_assert(kSkew == 0 || (kDqLag && kSkew <= 3), "warpgroups started apart need dQ a step behind");
  static_assert(!kDqPairSum || kD == 64, "dQ's partials summed in shared memory: d64 (dQ by keys)");
  static_assert(!kDqAtomics || (kD != 256 && !kDqPairSum), "dQ by atomics: d64/d128/d192 without the summed partials");
  static_assert(kLoadWg == 0 || (kLoadWg == 1 && kD <= 128 && kLoadIssue != 2), "the loads' warpgroup: 0, or 1 at d64/d128");
  static_assert(kLoadIssue >= 0 && kLoadIssue <= 2 && (kD <= 128 || kLoadIssue == 0),
                "a step's loads: at the step's top, after its first GEMMs, or by a warpgroup of their own (d64/d128)");
  // The loading warpgroup leaves once it has issued the walk's loads: no CTA barrier may follow them.
  static_assert(kLoadIssue != 2 || kDqByKeys || kDqLag, "a loading warpgroup, and a CTA barrier in the step");
  static_assert(!kInPlace || (!kFoldedBoxes && kKvTma), "tensors of fewer columns: 64-column boxes, K and V by TMA");
  static_assert(kDqStages == 1 || (kDqStages == 2 && kD == 192 && !kDqAtomics), "two dQ stages: d192, staged");
  static_assert(!kDqUnreduced || kD == 192, "dQ left unreduced (a diagnostic): d192");
};

// The columns of q, k, dq, dk (qk_cols_of) and of v, o, dout, dv (v_cols_of) configuration Cfg's
// dK/dV kernel reads and writes: the call's (BwdParams::qk_cols, v_cols) with Cfg::kInPlace, else
// the head dims' (a constant).
template <class Cfg>
__device__ __forceinline__ int qk_cols_of(const detail::BwdParams& p) {
  if constexpr (Cfg::kInPlace) return p.qk_cols;
  else return Cfg::kD;
}
template <class Cfg>
__device__ __forceinline__ int v_cols_of(const detail::BwdParams& p) {
  if constexpr (Cfg::kInPlace) return p.v_cols;
  else return Cfg::kDv;
}

// Development timeline of the dK/dV kernels (a configuration with kTrace; tools/sm90_bwd_probe
// trace): the first kTraceCtas CTAs of the middle batch (gridDim.z / 2: past the first wave where
// the batch is large), KV head 0 record, per warpgroup (its thread 0) and step, the clock64 at
// kTraceEvents points:
//   0 step top, 1 the step's loads landed, 2 S^T in registers, 3 P^T done (dV issued; d256: P^T
//   stored), 4 dP^T in registers, 5 dS^T stored (dK issued), 6 past the barrier before dQ (d256:
//   before dV/dK), 7 dQ in registers (d256: the first piece), 8 the step's end (its reduction
//   issued; d256: the second piece's atomics issued and every GEMM retired).
// and, in the row of step kTraceSteps - 1 (which no step uses), the CTA's entry (event 0) and its
// end, past the dK/dV stores (event 1).
// The stamps are global stores on the step's path: a traced kernel's schedule is a neighbour of the
// untraced one's, and decisions rest on A/Bs of untraced builds.
inline constexpr int kTraceCtas = 2, kTraceSteps = 1024, kTraceEvents = 9;
inline constexpr int64_t kTraceWords = int64_t(kTraceCtas) * 2 * kTraceSteps * kTraceEvents;

struct StepTrace {
  uint64_t* rec = nullptr;
  // Warpgroup wg's records, if this thread is its first and the CTA is traced.
  __device__ __forceinline__ void open(uint64_t* base, int wg) {
    if (base != nullptr && threadIdx.x % 128 == 0 && blockIdx.x < kTraceCtas && blockIdx.y == 0 &&
        blockIdx.z == gridDim.z / 2)
      rec = base + (int64_t(blockIdx.x) * 2 + wg) * kTraceSteps * kTraceEvents;
  }
  __device__ __forceinline__ void stamp(int step, int event) const {
    if (rec != nullptr && step < kTraceSteps - 1) rec[step * kTraceEvents + event] = clock64();
  }
  // The CTA's entry (event 0, the clock64 `t` read there) or end (event 1).
  __device__ __forceinline__ void cta(int event, uint64_t t) const {
    if (rec != nullptr) rec[(kTraceSteps - 1) * kTraceEvents + event] = t;
  }
};

// Tests' hook (tests/lagged_kernels.cu), absent from BwdConfig: a d64/d128 dK/dV configuration with
// kStepWarpLag holds, in step s, warp s % 4 of warpgroup (s / 4) % 2 that many cycles before its
// dS^T stores, and a whole warpgroup at the top of some steps (warpgroup 1 every fifth, warpgroup 0
// every seventh), so that warps and warpgroups run apart by more than a step against every wait of
// the step ring and of dS^T's.
template <class Cfg>
constexpr long long step_warp_lag() {
  if constexpr (requires { Cfg::kStepWarpLag; }) return Cfg::kStepWarpLag;
  else return 0;
}
__device__ __forceinline__ void spin_cycles(long long n) {
  for (const long long t0 = clock64(); clock64() - t0 < n;) {
  }
}

template <bool kBF16>
__device__ __forceinline__ float to_float(uint16_t bits) {
  if constexpr (kBF16) return __uint_as_float(uint32_t(bits) << 16);
  else return __half2float(__ushort_as_half(bits));
}

// Which (query, key) pairs count. Query i sees keys [i + off - left, i + off + right].
struct Visibility {
  int seqlen_q, seqlen_k, left, right;
  __device__ __forceinline__ bool operator()(int q, int key) const {
    const int d = key - q - (seqlen_k - seqlen_q);
    return q < seqlen_q && key < seqlen_k && (right < 0 || d <= right) && (left < 0 || d >= -left);
  }
  // Every pair of query rows [q0, q0 + rows) and keys [k0, k0 + keys) counts (the corners decide:
  // the first row's last key and the last row's first key).
  __device__ __forceinline__ bool whole(int q0, int rows, int k0, int keys) const {
    return (*this)(q0, k0 + keys - 1) && (*this)(q0 + rows - 1, k0);
  }
};

// The query blocks of kBlock rows that see a key of [k0, k0 + keys): [lo, lo + count), for a
// sequence of seqlen_q queries and seqlen_k keys.
struct QueryBlocks {
  int lo, count;
};
__device__ __forceinline__ QueryBlocks query_blocks(const detail::BwdParams& p, int seqlen_q, int seqlen_k, int k0,
                                                    int keys) {
  const int off = seqlen_k - seqlen_q, last_key = min(k0 + keys, seqlen_k) - 1;
  const int q_lo = p.window_right >= 0 ? max(0, k0 - off - p.window_right) : 0;
  const int q_hi = p.window_left >= 0 ? min(seqlen_q, last_key - off + p.window_left + 1) : seqlen_q;
  const int lo = q_lo / kBlock;
  return {lo, q_hi > q_lo ? (q_hi - 1) / kBlock + 1 - lo : 0};
}
// The same for the launch's lengths.
__device__ __forceinline__ QueryBlocks query_blocks(const detail::BwdParams& p, int k0, int keys) {
  const int off = p.seqlen_k - p.seqlen_q, last_key = min(k0 + keys, p.seqlen_k) - 1;
  const int q_lo = p.window_right >= 0 ? max(0, k0 - off - p.window_right) : 0;
  const int q_hi = p.window_left >= 0 ? min(p.seqlen_q, last_key - off + p.window_left + 1) : p.seqlen_q;
  const int lo = q_lo / kBlock;
  return {lo, q_hi > q_lo ? (q_hi - 1) / kBlock + 1 - lo : 0};
}

// The fp32 dQ accumulator of (batch b, query head h): pieces of 64 query rows x 64 columns,
// [head_dim / 64][rows / 64], each one contiguous 16 KB (a bulk reduction's unit,
// bwd_dkdv_wgmma.cuh). Inside a piece the floats lie in the order a warpgroup holds them in a
// 64 x 64 wgmma accumulator (dq_piece_offset), so that a warpgroup stores or adds its
// accumulator with one float4 a thread and instruction, consecutive threads at consecutive 16
// bytes. The piece holding row q0 (a multiple of 64) and column col (of 64 columns from col0):
template <int kD>
__device__ __forceinline__ float* dq_piece_at(const detail::BwdParams& p, int b, int h, int q0, int col0) {
  return p.dq_accum + ((int64_t(b) * p.heads_q + h) * (kD / 64) + col0 / 64) * p.rows * 64 + int64_t(q0) * 64;
}

// A warpgroup's 64 x 64 fp32 accumulator `dq` (thread `tid` of 128) added into the piece at
// `piece` by float4 atomics, in the piece's order (dq_piece_offset); rows past seqlen_q add their
// zeros to the piece's padding.
__device__ __forceinline__ void add_piece(float* piece, const float (&dq)[32], int tid) {
  float4* p4 = reinterpret_cast<float4*>(piece);
#pragma unroll
  for (int j = 0; j < 8; ++j)
    atomicAdd(p4 + 128 * j + tid, make_float4(dq[4 * j], dq[4 * j + 1], dq[4 * j + 2], dq[4 * j + 3]));
}

// Where row r, column c of a piece sits: thread 32 (r / 16) + 4 (r % 8) + (c % 8) / 2 of the
// warpgroup holds it as element 4 (c / 8) + 2 ((r / 8) % 2) + c % 2 of its accumulator
// (ptx/wgmma.h), and float4 j of thread i is float4 128 j + i of the piece.
__device__ __forceinline__ int dq_piece_offset(int r, int c) {
  const int thread = 32 * (r / 16) + 4 * (r % 8) + (c % 8) / 2;
  return (128 * (c / 8) + thread) * 4 + 2 * ((r / 8) % 2) + c % 2;
}

// The forward's LSE in log2 units; a row that saw no key (LSE = -inf) gives +inf, so exp2 of
// (score - it) is 0 rather than inf.
__device__ __forceinline__ float lse_log2(float lse) {
  return lse == -INFINITY ? INFINITY : lse * 1.4426950408889634f;
}

// Row 0 of (batch b, head h) of a [batch, seq, head, dim] tensor of 16-bit elements.
__device__ __forceinline__ const uint16_t* row0(const void* base, const int64_t (&stride)[3], int b, int h) {
  return static_cast<const uint16_t*>(base) + b * stride[0] + h * stride[2];
}

// f(masked) for a step's element loop: with kHoist, f(std::true_type) where `masked` and
// f(std::false_type) elsewhere, the loop compiled twice so that the common unmasked one tests no
// element; without, f(masked) (one loop, a test an element).
template <bool kHoist, class F>
__device__ __forceinline__ void with_mask(bool masked, F&& f) {
  if constexpr (kHoist) {
    if (masked) f(std::true_type{});
    else f(std::false_type{});
  } else {
    f(masked);
  }
}

// ---- D = rowsum(dO * O) and the LSE in log2 units; rows past seqlen_q get 0 and +inf ------------
// A row's head_dim elements are kD / 8 lanes' 16-byte loads, so a warp takes 32 / (kD / 8) rows
// (4 at d64, 2 at d128, 1 at d256): one warp a row left three quarters of the lanes idle at d64.
// At d192 a warp takes one row, its last 8 lanes idle (kDeltaLanes).
template <int kD>
inline constexpr int kDeltaRowsPerCta = (kThreads / 32) * (256 / kD);
template <int kD>
inline constexpr int kDeltaLanes = kD == 192 ? 32 : kD / 8;  // lanes a row
static_assert(128 % kDeltaRowsPerCta<64> == 0, "a CTA's rows divide the workspace's row padding (128)");

// The row statistics of one buffer of kRows rows in shared memory, as the steps read them:
// separate (the log2 LSE's rows at `lse`, D's at `d`) or paired ({LSE, D} a row, all at `lse`);
// kLds: the pairs read by ld.shared (else through the generic pointers).
template <bool kPaired, bool kLds = false>
struct RowStats {
  const float* lse;
  const float* d;
  // Buffer buf of kRows rows, the LSE's buffers at lse_rows and D's at d_rows.
  template <int kRows>
  __device__ __forceinline__ static RowStats at(const float* lse_rows, const float* d_rows, int buf) {
    if constexpr (kPaired) return {lse_rows + 2 * buf * kRows, nullptr};
    else return {lse_rows + buf * kRows, d_rows + buf * kRows};
  }
  // The same buffer from row `rows` on.
  __device__ __forceinline__ RowStats from(int rows) const {
    if constexpr (kPaired) return {lse + 2 * rows, nullptr};
    else return {lse + rows, d + rows};
  }
  // Two or four floats from x.
  __device__ __forceinline__ static float2 two(const float* x) {
    if constexpr (kLds) return ptx::ld_shared_v2_f32(x);
    else return *reinterpret_cast<const float2*>(x);
  }
  __device__ __forceinline__ static float4 four(const float* x) {
    if constexpr (kLds) return ptx::ld_shared_v4_f32(x);
    else return *reinterpret_cast<const float4*>(x);
  }
  // Rows r and r + 1 (r even).
  __device__ __forceinline__ float2 lse2(int r) const {
    if constexpr (kPaired) {
      const float4 v = four(lse + 2 * r);
      return make_float2(v.x, v.z);
    } else {
      return two(lse + r);
    }
  }
  __device__ __forceinline__ float2 d2(int r) const {
    if constexpr (kPaired) {
      const float4 v = four(lse + 2 * r);
      return make_float2(v.y, v.w);
    } else {
      return two(d + r);
    }
  }
  __device__ __forceinline__ float lse1(int r) const { return kPaired ? lse[2 * r] : lse[r]; }
  __device__ __forceinline__ float d1(int r) const { return kPaired ? lse[2 * r + 1] : d[r]; }
};

// The rows [row, row + kRows) of (batch, head) row block `row` (workspace rows) into `dst`, as
// RowStats reads them (one buffer); completes on bar.
template <bool kPaired, int kRows>
__device__ __forceinline__ void load_row_stats(const detail::BwdParams& p, int64_t row, float* lse_dst,
                                               float* d_dst, uint64_t* bar) {
  if constexpr (kPaired) {
    cuda::ptx::cp_async_bulk(cuda::ptx::space_shared, cuda::ptx::space_global, lse_dst, p.delta + 2 * row,
                             uint32_t(kRows * 8), bar);
  } else {
    cuda::ptx::cp_async_bulk(cuda::ptx::space_shared, cuda::ptx::space_global, lse_dst, p.lse_log2 + row,
                             uint32_t(kRows * 4), bar);
    cuda::ptx::cp_async_bulk(cuda::ptx::space_shared, cuda::ptx::space_global, d_dst, p.delta + row,
                             uint32_t(kRows * 4), bar);
  }
}

// kPdl (BwdConfig::kPdl): the dK/dV kernel is this one's programmatic dependent, and may start
// once every CTA here has; and unless deterministic each CTA also zeroes its share of the (batch,
// query head)'s accumulator (a CTA's rows x head_dim floats: 2048, eight a thread).
// kVarlen: sequence b's rows (seq_span; the launch's batch strides are 0), its LSE [heads_q,
// total_q]; the workspace keeps rows [batch, heads_q, rows] as without. Only the sequence's rows
// rounded up to kDqAccumRowAlign are read by the kernels after this one, so a CTA past them does
// nothing; the others zero their share of the accumulator with or without kPdl (the launch clears
// none of it: on short sequences most of the longest one's rows lie past every other's end).
// kDv: o's and dout's head dim (kD's but at 192 / 128), whose rows the CTAs take; the accumulator's
// are kD wide.
template <int kD, bool kBF16, bool kPaired = false, bool kPdl = false, bool kVarlen = false, int kDv = kD>
__global__ void __launch_bounds__(kThreads) bwd_delta_kernel(const detail::BwdParams p) {
  constexpr int kLanes = kDeltaLanes<kDv>;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int i = blockIdx.x * kDeltaRowsPerCta<kDv> + warp * (32 / kLanes) + lane / kLanes;
  const int h = blockIdx.y, b = blockIdx.z, c = (lane % kLanes) * 8;
  if constexpr (kPdl) cudaTriggerProgrammaticLaunchCompletion();
  [[maybe_unused]] const SeqSpan seq = seq_span<kVarlen>(p, b);
  if constexpr (kVarlen) {
    constexpr int kAlign = int(detail::kDqAccumRowAlign);
    if (int(blockIdx.x) * kDeltaRowsPerCta<kDv> >= (seq.q_len + kAlign - 1) / kAlign * kAlign) return;
  }
  if constexpr (kPdl || kVarlen) {
    if (!p.deterministic) {
      // The CTA's rows in each 64-column block of (b, h)'s accumulator (dq_piece_at: the column
      // blocks outermost, rows x 64 floats each): kRows x 64 floats a block, contiguous; the rows
      // of a piece are in fragment order, but the CTAs of a 64-row piece clear the whole of it.
      constexpr int kRows = kDeltaRowsPerCta<kDv>, kBlockVecs = kRows * 64 / 4;
      constexpr int kVecs = kRows * kD / 4;  // float4s a CTA: two a thread, 1.5 at d192, 3 at 192 / 128
      static_assert(kVecs == 2 * kThreads || kD == 192, "a CTA's share of the accumulator: two float4 a thread");
      float* bh = p.dq_accum + (int64_t(b) * p.heads_q + h) * p.rows * kD + int64_t(blockIdx.x) * kRows * 64;
#pragma unroll
      for (int j = threadIdx.x; j < kVecs; j += kThreads)
        reinterpret_cast<float4*>(bh + int64_t(j / kBlockVecs) * p.rows * 64)[j % kBlockVecs] =
            make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
  }
  float sum = 0.0f;
  // (p.v_cols: o's and dout's columns, kDv's or, at a head dim without a kernel, the caller's.)
  if (i < (kVarlen ? seq.q_len : p.seqlen_q) && c < p.v_cols) {
    const uint16_t* o = row0(p.o, p.o_stride, b, h) + ((kVarlen ? seq.q_off : 0) + i) * p.o_stride[1];
    const uint16_t* d = row0(p.dout, p.do_stride, b, h) + ((kVarlen ? seq.q_off : 0) + i) * p.do_stride[1];
    const uint4 ov = *reinterpret_cast<const uint4*>(o + c), dv = *reinterpret_cast<const uint4*>(d + c);
    const uint16_t* oe = reinterpret_cast<const uint16_t*>(&ov);
    const uint16_t* de = reinterpret_cast<const uint16_t*>(&dv);
#pragma unroll
    for (int e = 0; e < 8; ++e) sum += to_float<kBF16>(oe[e]) * to_float<kBF16>(de[e]);
  }
#pragma unroll
  for (int s = kLanes / 2; s > 0; s >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, s);
  if (lane % kLanes == 0 && i < p.rows) {
    const int64_t at = (int64_t(b) * p.heads_q + h) * p.rows + i;
    auto row_lse = [&] {
      if constexpr (kVarlen)
        return i < seq.q_len ? lse_log2(p.lse[int64_t(h) * p.total_q + seq.q_off + i]) : INFINITY;
      else
        return i < p.seqlen_q ? lse_log2(p.lse[(int64_t(b) * p.heads_q + h) * p.seqlen_q + i]) : INFINITY;
    };
    if constexpr (kPaired) {
      reinterpret_cast<float2*>(p.delta)[at] = make_float2(row_lse(), sum);
    } else {
      p.delta[at] = sum;  // (stored before the LSE is read, as the unpaired kernel always has)
      p.lse_log2[at] = row_lse();
    }
  }
}

// ---- The sinks' gradient (BwdParams::dsink) ---------------------------------------------------------
// A CTA a query head h, over its rows of every sequence: dsink[h] = -sum of 2^(sink[h] log2(e) -
// LSE_log2) * D, read from D's kernel's workspace (kPaired: {LSE_log2, D} pairs). Each thread sums
// its rows in a fixed order, the warps and then the CTA in a fixed tree: the same bits every run.
inline constexpr int kSinkThreads = 1024;
template <bool kPaired, bool kVarlen>
__global__ void __launch_bounds__(kSinkThreads) bwd_sink_kernel(const detail::BwdParams p) {
  __shared__ float red[kSinkThreads / 32];
  const int h = blockIdx.x;
  const float sink = __ldg(p.sink + h) * numerics::kLog2e;
  float acc = 0.0f;
  for (int b = 0; b < p.batch; ++b) {
    [[maybe_unused]] const SeqSpan seq = seq_span<kVarlen>(p, b);
    const int len = kVarlen ? seq.q_len : p.seqlen_q;  // (the workspace's rows: [batch, heads_q, rows])
    const int64_t at = (int64_t(b) * p.heads_q + h) * p.rows;
    for (int i = threadIdx.x; i < len; i += kSinkThreads) {
      float lse, d;
      if constexpr (kPaired) {
        const float2 x = reinterpret_cast<const float2*>(p.delta)[at + i];
        lse = x.x, d = x.y;
      } else {
        lse = p.lse_log2[at + i], d = p.delta[at + i];
      }
      acc -= exp2f(sink - lse) * d;  // (a row without keys or sink: LSE_log2 +inf, a term of 0)
    }
  }
#pragma unroll
  for (int x = 16; x > 0; x /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, x);
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = acc;
  __syncthreads();
  if (threadIdx.x >= 32) return;
  acc = red[threadIdx.x];
#pragma unroll
  for (int x = 16; x > 0; x /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, x);
  if (threadIdx.x == 0) p.dsink[h] = acc;
}

// ---- dQ from the fp32 accumulator ------------------------------------------------------------------
// One CTA a piece (blockIdx.x: 64-row block x column block); each thread writes two chunks of 8
// columns of a row, eight threads a row's 64 columns, from four float2 of the piece.
template <int kD, bool kBF16, bool kVarlen = false>
__global__ void __launch_bounds__(kThreads) bwd_dq_convert_kernel(const detail::BwdParams p) {
  constexpr int kColBlocks = kD / 64;
  const int q0 = int(blockIdx.x / kColBlocks) * 64, col0 = int(blockIdx.x % kColBlocks) * 64;
  const int h = blockIdx.y, b = blockIdx.z;
  const SeqSpan seq = seq_span<kVarlen>(p, b);
  const float* piece = dq_piece_at<kD>(p, b, h, q0, col0);
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int chunk = i * kThreads + threadIdx.x, r = chunk / 8, c = (chunk % 8) * 8;
    if (q0 + r >= seq.q_len || col0 + c >= p.qk_cols) continue;  // (dq's columns: BwdParams::qk_cols)
    uint32_t v[4];
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      const float2 a = *reinterpret_cast<const float2*>(piece + dq_piece_offset(r, c + 2 * t));
      v[t] = pack2<kBF16>(a.x, a.y);
    }
    uint16_t* dq = static_cast<uint16_t*>(p.dq) + b * p.dq_stride[0] + (seq.q_off + q0 + r) * p.dq_stride[1] +
                   h * p.dq_stride[2] + col0 + c;
    *reinterpret_cast<uint4*>(dq) = make_uint4(v[0], v[1], v[2], v[3]);
  }
}

}  // namespace fa4::sm90::bwd
