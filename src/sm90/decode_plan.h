// Which calls the decoding kernel (sm90/decode_kernel.cuh) takes, and how it cuts their keys:
// host-only, so the CPU tests check it.
#pragma once

#include <algorithm>
#include <cstdint>

#include "common/fwd_params.h"

namespace fa4::sm90 {

// The kernel's shape: rows a KV head (one m16 tile), keys a stage, CTAs a multiprocessor (two at
// each head dim: decode_kernel.cuh's kCtasPerSm and kStages).
inline constexpr int kDecodeRows = 16;
inline constexpr int kDecodeBlockKeys = 64;
inline constexpr int decode_ctas_per_sm(int) { return 2; }
inline constexpr int kDecodeMaxSplits = 256;  // (a multiple of the merge kernel's 256 threads)
// Below this many keys the call stays on the tile kernels (the rule's; FwdParams::decode 2 takes
// any).
inline constexpr int kDecodeMinKeys = 256;

// Whether the decoding kernel can run call `a` (rows unfolded: FwdParams::fold 0): batched
// queries (no varlen) against contiguous or paged K and V (pages of a power of two), no soft cap,
// head_dim 64 or 128, at most kDecodeRows rows a KV head (seqlen_q x heads_q / heads_kv).
// `a.decode` 1 never; 0 also needs kDecodeMinKeys keys.
inline bool decode_runs(const detail::FwdParams& a) {
  if (a.decode == 1 || a.fold != 0 || a.varlen() || a.softcap > 0.0f) return false;
  if (a.block_table != nullptr && (a.page_size < 1 || (a.page_size & (a.page_size - 1)) != 0)) return false;
  if ((a.head_dim != 64 && a.head_dim != 128) || a.heads_kv < 1 || a.heads_q % a.heads_kv != 0) return false;
  if (int64_t(a.seqlen_q) * (a.heads_q / a.heads_kv) > kDecodeRows) return false;
  return a.decode == 2 || a.seqlen_k >= kDecodeMinKeys;
}

// How a launch of `pairs` (batch x heads_kv) KV heads of `seqlen_k` keys each, on `slots` CTAs at
// once (multiprocessors x decode_ctas_per_sm), is cut: `splits` CTAs a pair, `chunk` keys each (a
// multiple of kDecodeBlockKeys; the last split may hold fewer).
struct DecodePlan {
  int splits, chunk;
};
// The split count whose waves of CTAs take the least time, a CTA's time counted as its key blocks
// plus two (its ring's fill, its rows' merge), and a second kernel (the splits' merge) as three
// blocks more.
inline DecodePlan decode_plan(int64_t pairs, int seqlen_k, int64_t slots) {
  const int blocks = std::max(1, (seqlen_k + kDecodeBlockKeys - 1) / kDecodeBlockKeys);
  slots = std::max<int64_t>(1, slots);
  int best = 1;
  int64_t best_cost = INT64_MAX;
  for (int s = 1; s <= std::min(blocks, kDecodeMaxSplits); ++s) {
    const int per = (blocks + s - 1) / s;
    const int64_t waves = (pairs * s + slots - 1) / slots;
    const int64_t cost = waves * (per + 2) + (s > 1 ? 3 : 0);
    if (cost < best_cost) best_cost = cost, best = s;
  }
  const int per = (blocks + best - 1) / best;
  return {(blocks + per - 1) / per, per * kDecodeBlockKeys};
}

// Whether the launch's rule takes call `a` (decode_runs) to the decoding kernel on a device of `sms`
// multiprocessors. Not where entries have key counts of their own (seqused_k, leftpad_k) and the KV heads fill
// the device with one CTA each (one split): there the tile kernels' dynamic order measured 5-6 %
// faster with a cache filled to half, and within 1-3 % of it filled whole (docs/perf-notes.md, "A
// decoding kernel on mma.sync tiles of 16 rows").
inline bool decode_taken(const detail::FwdParams& a, int sms) {
  if (!decode_runs(a)) return false;
  if (a.decode == 2 || (a.seqused_k == nullptr && a.leftpad_k == nullptr)) return true;
  return decode_plan(int64_t(a.batch) * a.heads_kv, a.seqlen_k, int64_t(sms) * decode_ctas_per_sm(a.head_dim)).splits > 1;
}

}  // namespace fa4::sm90
