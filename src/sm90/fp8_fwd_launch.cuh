// The sm90 fp8 forward's launch: its configurations, V transposed into stream-ordered scratch, then
// the fp8 kernel on a persistent grid (sm90/fp8_fwd_kernel.cuh). A header so that tools/
// sm90_fp8_probe can launch configurations the library does not build (the traced ones).
#pragma once

#include <string>

#include "common/fwd_params.h"
#include "common/launch.cuh"
#include "common/per_device.h"
#include "common/stream_counters.h"
#include "sm90/fp8_fwd_kernel.cuh"

namespace fa4::detail::fp8 {

using namespace sm90::fp8;

inline Status fp8_failure(const char* what, int code, const char* name) {
  return {StatusCode::kCudaError, std::string("sm90 fp8 forward: ") + what + ": " + name + " (" +
                                      std::to_string(code) + ")"};
}
inline Status fp8_failure(const char* what, cudaError_t e) { return fp8_failure(what, int(e), cudaGetErrorString(e)); }

// The configurations: K/V ring depth in the shared memory left beside Q (d256: 64-key blocks, so S
// fits beside O's 128 registers); the software exp2's share (every kPolyEvery-th 8-key chunk on the
// FMA pipe), FwdParams::exp2_poly_every choosing among the built ones (-1: the shipped).
inline constexpr int kFp8Stages = 4;
template <int kD>
inline constexpr int kFp8BlockN = kD == 256 ? 64 : 128;
// Every 4th chunk (a quarter of the exponentials) on the FMA pipe: +3 to +12 % over MUFU alone at
// FA3's 1k-16k rows, d64 and d128, where half of them (every 2nd) lost at d128 (docs/perf-notes.md,
// "The fp8 forward"); every 8th gained less. At d256 (64-key blocks) MUFU alone measured 1 % ahead
// of a quarter, so none there.
template <int kD>
inline constexpr int kShippedPoly = kD == 256 ? 0 : 4;
// The row max over the raw scores, scaled once (Fp8Config::kRawMax), at d128 only: in one process
// against the max over the scaled scores +0.7 to +5.5 % at d128 (1k-16k), 0 to -1.5 % at d64 and 0
// to -3.4 % at d256 (docs/perf-notes.md, "The fp8 step without the row max").
template <int kD>
inline constexpr bool kShippedRawMax = kD == 128;

// The configuration of head dim kD with exp2 share kPoly (kTrace: with the probe's stamps;
// kConsumers, kOneP and kDeferPv: Fp8Config's, for measurements).
template <int kD, int kPoly, bool kRawMax = kShippedRawMax<kD>, bool kTrace = false, int kConsumers = 2,
          bool kOneP = false, bool kDeferPv = false>
using Fp8Cfg = Fp8Config<kD, kFp8Stages, kPoly, kFp8BlockN<kD>, kConsumers, kRawMax, kTrace, kOneP, kDeferPv>;

// V^T into stream-ordered scratch, then Cfg's kernel. `trace`: Fp8Params::trace (Cfg::kTrace only).
template <class Cfg>
Status launch_fp8_cfg(const FwdParams& a, cudaStream_t stream, unsigned long long* trace = nullptr) {
  constexpr int kD = Cfg::kHeadDim;
  int device = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e != cudaSuccess) return fp8_failure("device query", e);
  const int sms = multiprocessors(device);
  if (sms == 0) return {StatusCode::kCudaError, "sm90 fp8 forward: the device's multiprocessor count could not be read"};

  // V^T: [batch, heads_kv, d, keys rounded up to 128], the transpose's blocks (and so the kernel's:
  // 64 or 128 keys). (Rounded to d256's 64-key blocks, the transpose's last block went unwritten.)
  constexpr int kTransposeKeys = 128;
  static_assert(kTransposeKeys % Cfg::kBlockN == 0, "key blocks inside the transpose's");
  const int keys = (a.seqlen_k + kTransposeKeys - 1) / kTransposeKeys * kTransposeKeys;
  // (and after it, where the stream has no counters of its own, the tile counter, zeroed)
  const size_t vt_bytes = size_t(a.batch) * a.heads_kv * kD * keys;
  LaunchScratch scratch;
  if ((e = scratch.make(stream, vt_bytes + 16, 0)) != cudaSuccess) return fp8_failure("scratch for V transposed", e);
  uint8_t* const vt = scratch.ptr;

  TransposeParams tp{};
  tp.v = static_cast<const uint8_t*>(a.v);
  for (int i = 0; i < 3; ++i) tp.v_stride[i] = a.v_stride[i];
  tp.vt = vt, tp.seqlen_k = a.seqlen_k, tp.keys = keys;
  if ((e = launch_kernel<false>(fp8_transpose_v<kD>, dim3(unsigned(keys / 128), unsigned(a.heads_kv), unsigned(a.batch)),
                                dim3(256), 0, stream, tp)) != cudaSuccess)
    return fp8_failure("V transpose launch", e);

  Fp8Params p{};
  {
    // Q [batch, seqlen_q, heads_q, d] and K as (d, seq, heads, batch) maps read in boxes of one
    // swizzle atom's columns x 128 rows; V^T as (keys, d, heads_kv, batch) in boxes of 128 keys x d.
    const uint64_t qd[4] = {uint64_t(kD), uint64_t(a.seqlen_q), uint64_t(a.heads_q), uint64_t(a.batch)};
    const uint64_t qs[3] = {uint64_t(a.q_stride[1]), uint64_t(a.q_stride[2]), uint64_t(a.q_stride[0])};
    const uint32_t qb[4] = {uint32_t(Cfg::kSwizzle), uint32_t(Cfg::kBlockM), 1, 1};
    int r = ptx::make_tensor_map_8bit(&p.q_map, a.q, 4, qd, qs, qb, Cfg::kSwizzle);
    if (r != 0) return fp8_failure("q's tensor map", r, "cuTensorMapEncodeTiled");
    const uint64_t kdim[4] = {uint64_t(kD), uint64_t(a.seqlen_k), uint64_t(a.heads_kv), uint64_t(a.batch)};
    const uint64_t ks[3] = {uint64_t(a.k_stride[1]), uint64_t(a.k_stride[2]), uint64_t(a.k_stride[0])};
    const uint32_t kb[4] = {uint32_t(Cfg::kSwizzle), uint32_t(Cfg::kBlockN), 1, 1};
    if ((r = ptx::make_tensor_map_8bit(&p.k_map, a.k, 4, kdim, ks, kb, Cfg::kSwizzle)) != 0)
      return fp8_failure("k's tensor map", r, "cuTensorMapEncodeTiled");
    const uint64_t vd[4] = {uint64_t(keys), uint64_t(kD), uint64_t(a.heads_kv), uint64_t(a.batch)};
    const uint64_t vs[3] = {uint64_t(keys), uint64_t(keys) * kD, uint64_t(keys) * kD * a.heads_kv};
    const uint32_t vb[4] = {uint32_t(Cfg::kBlockN), uint32_t(kD), 1, 1};
    if ((r = ptx::make_tensor_map_8bit(&p.vt_map, vt, 4, vd, vs, vb, Cfg::kVSwizzle)) != 0)
      return fp8_failure("V^T's tensor map", r, "cuTensorMapEncodeTiled");
  }
  // The tile counter and its finish count: the stream's own, zero from its last launch and zeroed
  // again by this launch's last CTA (as the 16-bit forward's, with which it is shared); else the
  // scratch's last bytes, zeroed for this launch.
  if (!a.fp8_static_tiles) {
    p.tile_counter = detail::stream_counters(device, stream);
    if (p.tile_counter == nullptr) {
      p.tile_counter = reinterpret_cast<int*>(vt + vt_bytes);
      if ((e = cudaMemsetAsync(p.tile_counter, 0, detail::kStreamTileCounterInts * sizeof(int), stream)) != cudaSuccess)
        return fp8_failure("zeroing the tile counter", e);
    }
  }
  p.trace = trace;
  p.o = static_cast<__nv_bfloat16*>(a.o);
  for (int i = 0; i < 3; ++i) p.o_stride[i] = a.o_stride[i];
  p.lse = a.lse;
  p.q_descale = a.q_descale, p.k_descale = a.k_descale, p.v_descale = a.v_descale;
  p.batch = a.batch, p.seqlen_q = a.seqlen_q, p.seqlen_k = a.seqlen_k;
  p.heads_q = a.heads_q, p.heads_kv = a.heads_kv;
  p.window_left = a.window_left, p.window_right = a.window_right;
  p.scale_log2 = a.scale_log2;
  p.m_blocks = (a.seqlen_q + Cfg::kBlockM - 1) / Cfg::kBlockM;
  const int64_t tiles = int64_t(p.m_blocks) * a.heads_q * a.batch;
  if (tiles > INT32_MAX)
    return {StatusCode::kNotSupported, "sm90 fp8 forward: " + std::to_string(tiles) + " tiles: at most 2^31 - 1"};
  p.tiles = int(tiles);
  const int ctas = int(tiles < sms ? tiles : sms);
  if ((e = allow_dynamic_smem<fp8_fwd_kernel<Cfg>>(device, Cfg::kSmemBytes)) != cudaSuccess)
    return fp8_failure("setting the kernel's shared memory", e);
  if ((e = launch_kernel<false>(fp8_fwd_kernel<Cfg>, dim3(unsigned(ctas)), dim3(Cfg::kThreads), Cfg::kSmemBytes,
                                stream, p)) != cudaSuccess)
    return fp8_failure("launch", e);
  return Status::Ok();
}

}  // namespace fa4::detail::fp8
