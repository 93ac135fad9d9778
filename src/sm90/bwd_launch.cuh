// sm90 backward: the launch sequence of one configuration (the kernels: bwd_kernel.cuh,
// bwd_dkdv_wgmma.cuh, bwd_dq_wgmma.cuh). sm90_bwd.cu launches the shipped configurations;
// tools/sm90_bwd_probe.cu others beside them.
//   1. D = rowsum(dO * O) and the LSE in log2 units into the workspace (and the fp32 dQ
//      accumulator zeroed, unless deterministic);
//   2. dK, dV a key block a CTA (and dQ's shares reduced into the accumulator, unless
//      deterministic);
//   3. dQ: the accumulator converted to the dtype, or, deterministic, 128 query rows a CTA
//      (bwd_dq_wgmma.cuh).
// With BwdConfig::kPdl D's kernel zeroes the accumulator in place of the memset, and 2 is
// launched as the programmatic dependent of 1; with BwdConfig::kDqOverlap the deterministic dQ
// kernel as the dependent of 2, which it does not wait for.
#pragma once

#include <algorithm>
#include <string>
#include <utility>

#include "common/bwd_params.h"
#include "common/launch.cuh"
#include "common/per_device.h"
#include "ptx/tma.h"
#include "sm90/bwd_dkdv_wgmma.cuh"
#include "sm90/bwd_dq_wgmma.cuh"
#include "sm90/bwd_kernel.cuh"

namespace fa4::detail {

inline Status bwd_cuda_failure(const char* what, cudaError_t e) {
  return {StatusCode::kCudaError, std::string("sm90 backward: ") + what + ": " + cudaGetErrorString(e)};
}

// A TMA map of the [batch, seq, heads, head_dim] tensor `name` (`cols` columns where not head_dim:
// the value side's at 192 / 128) in boxes of 64 columns x `rows` rows
// (folded: `rows` rows of every 64-column block, ptx::map_bshd_16bit_sw128_folded); kNotSupported,
// naming it, where the driver refuses it.
// With varlen (p.varlen()) the map runs over the packed rows as one batch: seqlen is then the
// tensor's total rows, and the batch stride, never stepped, one TMA takes (the rows').
inline Status bwd_map_tensor(CUtensorMap* map, const char* name, const void* data, const int64_t (&stride)[3],
                         const BwdParams& p, int seqlen, int heads, int rows, bool folded = false, int cols = 0) {
  const int64_t st[3] = {p.varlen() ? std::max<int64_t>(stride[1], 8) : stride[0], stride[1], stride[2]};
  const int batch = p.varlen() ? 1 : p.batch;
  const int c = cols > 0 ? cols : p.head_dim;
  const int r = folded ? ptx::map_bshd_16bit_sw128_folded(map, data, st, batch, seqlen, heads, c, rows)
                       : ptx::map_bshd_16bit_sw128(map, data, st, batch, seqlen, heads, c, rows);
  if (r == 0) return Status::Ok();
  return {StatusCode::kNotSupported, std::string("sm90 backward: cuTensorMapEncodeTiled refused ") + name +
                                         " (driver error " + std::to_string(r) + ")"};
}

// The sinks' gradient (p.dsink; nothing without), after the kernels that fill D's workspace: a CTA
// a query head (sm90/bwd_kernel.cuh, bwd_sink_kernel).
template <bool kPaired, bool kVarlen>
Status launch_sink_grad(const BwdParams& p, cudaStream_t stream) {
  if (p.dsink == nullptr) return Status::Ok();
  sm90::bwd::bwd_sink_kernel<kPaired, kVarlen><<<dim3(unsigned(p.heads_q)), dim3(sm90::bwd::kSinkThreads), 0, stream>>>(p);
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? Status::Ok() : bwd_cuda_failure("launching the sinks' gradient", e);
}

// The backward of configuration Cfg (sm90::bwd::BwdConfig): the dK/dV kernel is Cfg's; D's kernel,
// the conversion and the deterministic dQ kernel are those of Cfg's head dim and dtype.
// Cfg::kVarlen: a variable-length batch (p.varlen()); the maps run over the packed rows, the
// kernels get batch strides of 0 and each CTA its sequence's rows (seq_span), the grids those of
// the longest sequences (p.seqlen_q, p.seqlen_k).
template <class Cfg>
Status launch_backward(const BwdParams& a, cudaStream_t stream) {
  using namespace sm90::bwd;
  constexpr int kD = Cfg::kD, kDv = Cfg::kDv;
  constexpr bool kBF16 = Cfg::kBF16;
  constexpr bool kVarlen = Cfg::kVarlen;
  if (a.head_dim != kD || (a.head_dim_v > 0 ? a.head_dim_v : a.head_dim) != kDv)
    return {StatusCode::kNotSupported, "head_dim = " + std::to_string(a.head_dim) + ", head_dim_v = " +
                                           std::to_string(a.head_dim_v) + ": not this configuration's (" +
                                           std::to_string(kD) + " / " + std::to_string(kDv) + ")"};
  if (a.varlen() != kVarlen)
    return {StatusCode::kNotSupported, kVarlen ? "the varlen backward needs cu_seqlens" : "varlen goes to its own backward"};
  if ((a.softcap > 0.0f) != Cfg::kSoftcap)
    return {StatusCode::kNotSupported, a.softcap > 0.0f ? "softcap > 0 needs a soft-capped backward configuration"
                                                        : "a soft-capped backward configuration needs softcap > 0"};
  BwdParams p = a;
  // The tensors' columns: the head dims' unless the call's tensors have fewer (a head dim without
  // a kernel, in place), which only Cfg::kInPlace's kernels read and write.
  p.qk_cols = a.qk_cols > 0 ? a.qk_cols : kD;
  p.v_cols = a.v_cols > 0 ? a.v_cols : kDv;
  if (a.qk_cols < 0 || a.v_cols < 0 || p.qk_cols > kD || p.v_cols > kDv || p.qk_cols % 8 != 0 || p.v_cols % 8 != 0 ||
      (!Cfg::kInPlace && (p.qk_cols != kD || p.v_cols != kDv)))
    return {StatusCode::kNotSupported, "qk_cols = " + std::to_string(p.qk_cols) + ", v_cols = " +
                                           std::to_string(p.v_cols) + ": not this configuration's (" +
                                           std::to_string(kD) + " / " + std::to_string(kDv) +
                                           (Cfg::kInPlace ? ", or fewer in multiples of 8)" : ")")};
  const int rows_q = kVarlen ? a.total_q : a.seqlen_q, rows_k = kVarlen ? a.total_k : a.seqlen_k;
  if constexpr (kVarlen)
    for (int64_t* st : {p.q_stride, p.k_stride, p.v_stride, p.o_stride, p.do_stride, p.dq_stride, p.dk_stride, p.dv_stride})
      st[0] = 0;
  const dim3 block(kThreads);
  int device = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e != cudaSuccess) return bwd_cuda_failure("device query", e);
  // The dK/dV kernels load Q and dO by TMA, in boxes of a step's 64 rows.
  CUtensorMap tm_q{}, tm_do{};
  Status s = bwd_map_tensor(&tm_q, "q", a.q, a.q_stride, a, rows_q, a.heads_q, kBlock, Cfg::kFoldedBoxes, p.qk_cols);
  if (s.ok())
    s = bwd_map_tensor(&tm_do, "dout", a.dout, a.do_stride, a, rows_q, a.heads_q, kBlock, Cfg::kFoldedBoxes, p.v_cols);
  if (!s.ok()) return s;
  // With Cfg::kKvTma the dK/dV kernels load K and V by TMA too, in boxes of the CTA's keys.
  CUtensorMap tm_kc{}, tm_vc{};
  if constexpr (Cfg::kKvTma) {
    constexpr int kKeys = kD <= 128 ? kWgKeys : kBlock;
    s = bwd_map_tensor(&tm_kc, "k", a.k, a.k_stride, a, rows_k, a.heads_kv, kKeys, false, p.qk_cols);
    if (s.ok()) s = bwd_map_tensor(&tm_vc, "v", a.v, a.v_stride, a, rows_k, a.heads_kv, kKeys, false, p.v_cols);
    if (!s.ok()) return s;
  }
  if (!p.deterministic && !Cfg::kPdl && !kVarlen) {  // (else D's kernel zeroes it)
    e = cudaMemsetAsync(p.dq_accum, 0, size_t(p.batch) * p.heads_q * p.rows * kD * sizeof(float), stream);
    if (e != cudaSuccess) return bwd_cuda_failure("zeroing the dQ accumulator", e);
  }
  bwd_delta_kernel<kD, kBF16, Cfg::kPairedStats, Cfg::kPdl, kVarlen, kDv>
      <<<dim3(unsigned(p.rows / kDeltaRowsPerCta<kDv>), p.heads_q, p.batch), block, 0, stream>>>(p);
  if ((e = cudaGetLastError()) != cudaSuccess) return bwd_cuda_failure("launching the D kernel", e);

  // dK, dV: 128 keys a CTA at d64/d128; 64 at d192 and d256, whose warpgroups split the work
  // (bwd_dkdv_split_kernel). With Cfg::kPdl as D's programmatic dependent.
  if constexpr (kD <= 128) {
    constexpr int kSmem = WgSmem<Cfg>::kBytes;
    if ((e = allow_dynamic_smem<bwd_dkdv_wgmma_kernel<Cfg>>(device, kSmem)) != cudaSuccess)
      return bwd_cuda_failure("setting the dK/dV kernel's shared memory", e);
    const unsigned key_blocks = unsigned((p.seqlen_k + kWgKeys - 1) / kWgKeys);
    e = launch_kernel<Cfg::kPdl>(bwd_dkdv_wgmma_kernel<Cfg>, dim3(key_blocks, p.heads_kv, p.batch),
                                 dim3(Cfg::kCtaThreads), kSmem, stream, p, tm_q, tm_do, tm_kc, tm_vc);
  } else {
    constexpr int kSmem = WgSmemSplit<Cfg>::kBytes;
    if ((e = allow_dynamic_smem<bwd_dkdv_split_kernel<Cfg>>(device, kSmem)) != cudaSuccess)
      return bwd_cuda_failure("setting the dK/dV kernel's shared memory", e);
    const unsigned key_blocks = unsigned((p.seqlen_k + kBlock - 1) / kBlock);
    e = launch_kernel<Cfg::kPdl>(bwd_dkdv_split_kernel<Cfg>, dim3(key_blocks, p.heads_kv, p.batch), block, kSmem,
                                 stream, p, tm_q, tm_do, tm_kc, tm_vc);
  }
  if (e != cudaSuccess) return bwd_cuda_failure("launching the dK/dV kernel", e);

  if (!p.deterministic) {
    const unsigned pieces = unsigned((p.seqlen_q + 63) / 64) * (kD / 64);
    bwd_dq_convert_kernel<kD, kBF16, kVarlen><<<dim3(pieces, p.heads_q, p.batch), block, 0, stream>>>(p);
    if ((e = cudaGetLastError()) != cudaSuccess) return bwd_cuda_failure("launching the dQ conversion", e);
    return launch_sink_grad<Cfg::kPairedStats, kVarlen>(p, stream);
  }
  // Deterministic dQ: on wgmma, 128 query rows a CTA (bwd_dq_wgmma.cuh).
  constexpr int kSmem = DqWgSmem<kD, kDv>::kBytes;
  if ((e = allow_dynamic_smem<bwd_dq_wgmma_kernel<kD, kBF16, Cfg::kPairedStats, kVarlen, Cfg::kSoftcap, kDv>>(device, kSmem)) != cudaSuccess)
    return bwd_cuda_failure("setting the dQ kernel's shared memory", e);
  // Its Q and dO come in 64-column boxes of 64 rows: where the dK/dV kernel took folded maps, the
  // plain ones are made here (the launch above holds its own copy of the parameters).
  if constexpr (Cfg::kFoldedBoxes) {
    s = bwd_map_tensor(&tm_q, "q", a.q, a.q_stride, a, rows_q, a.heads_q, kBlock, false, p.qk_cols);
    if (s.ok()) s = bwd_map_tensor(&tm_do, "dout", a.dout, a.do_stride, a, rows_q, a.heads_q, kBlock, false, p.v_cols);
    if (!s.ok()) return s;
  }
  CUtensorMap tm_k{}, tm_v{};
  s = bwd_map_tensor(&tm_k, "k", a.k, a.k_stride, a, rows_k, a.heads_kv, kDqKeys<kD>, false, p.qk_cols);
  if (s.ok()) s = bwd_map_tensor(&tm_v, "v", a.v, a.v_stride, a, rows_k, a.heads_kv, kDqKeys<kD>, false, p.v_cols);
  if (!s.ok()) return s;
  const unsigned query_blocks = unsigned((p.seqlen_q + kDqRows - 1) / kDqRows);
  // With Cfg::kDqOverlap as the dK/dV kernel's programmatic dependent (BwdKnobs::dq_overlap).
  e = launch_kernel<Cfg::kDqOverlap>(bwd_dq_wgmma_kernel<kD, kBF16, Cfg::kPairedStats, kVarlen, Cfg::kSoftcap, kDv>,
                                     dim3(query_blocks, p.heads_q, p.batch), block, kSmem, stream, p, tm_q, tm_do, tm_k,
                                     tm_v);
  if (e != cudaSuccess) return bwd_cuda_failure("launching the dQ kernel", e);
  return launch_sink_grad<Cfg::kPairedStats, kVarlen>(p, stream);
}

// The shipped configuration of p's head dim in dtype kBF16, for a variable-length batch or not,
// with soft-capped scores or not.
template <bool kBF16, bool kVarlen, bool kSoftcap>
Status launch_shipped_config(const BwdParams& p, cudaStream_t stream) {
  using sm90::bwd::BwdConfig;
  using sm90::bwd::BwdKnobs;
  constexpr auto edit = [](BwdKnobs& k) {
    k.varlen = kVarlen;
    k.softcap = kSoftcap;
  };
  constexpr auto in_place = [edit](int d) {
    BwdKnobs k = sm90::bwd::bwd_knobs_in_place(d);
    edit(k);
    return k;
  };
  // Tensors of fewer columns than the kernel head dims (a head dim without a kernel, read and
  // written in place): configurations of their own (64-column boxes, bounded stores).
  const int dv = p.head_dim_v > 0 ? p.head_dim_v : p.head_dim;
  const bool fewer = (p.qk_cols > 0 && p.qk_cols < p.head_dim) || (p.v_cols > 0 && p.v_cols < dv);
  switch (p.head_dim) {
    case 64:
      if (fewer) return launch_backward<BwdConfig<64, kBF16, in_place(64)>>(p, stream);
      return launch_backward<BwdConfig<64, kBF16, sm90::bwd::bwd_knobs(64, edit)>>(p, stream);
    case 128:
      if (fewer) return launch_backward<BwdConfig<128, kBF16, in_place(128)>>(p, stream);
      return launch_backward<BwdConfig<128, kBF16, sm90::bwd::bwd_knobs(128, edit)>>(p, stream);
    case 192:  // (192 / 128: DeepSeek's, on the same kernels with a narrower value side)
      if (p.head_dim_v == 128) return launch_backward<BwdConfig<192, kBF16, sm90::bwd::bwd_knobs(192, edit), 128>>(p, stream);
      if (fewer) return launch_backward<BwdConfig<192, kBF16, in_place(192)>>(p, stream);
      return launch_backward<BwdConfig<192, kBF16, sm90::bwd::bwd_knobs(192, edit)>>(p, stream);
    case 256:
      if (fewer) return launch_backward<BwdConfig<256, kBF16, in_place(256)>>(p, stream);
      return launch_backward<BwdConfig<256, kBF16, sm90::bwd::bwd_knobs(256, edit)>>(p, stream);
    default:
      return {StatusCode::kNotSupported, "head_dim = " + std::to_string(p.head_dim) + " has no sm90 backward kernel"};
  }
}

// The shipped backward of p's dtype, batched or variable-length, with soft-capped scores (kSoftcap:
// sm90_bwd_softcap.cu) or without (sm90_bwd.cu).
template <bool kSoftcap>
Status launch_shipped_backward(const BwdParams& p, cudaStream_t stream) {
  const bool bf16 = p.dtype == DType::kBF16;
  if (p.varlen())
    return bf16 ? launch_shipped_config<true, true, kSoftcap>(p, stream)
                : launch_shipped_config<false, true, kSoftcap>(p, stream);
  return bf16 ? launch_shipped_config<true, false, kSoftcap>(p, stream)
              : launch_shipped_config<false, false, kSoftcap>(p, stream);
}

}  // namespace fa4::detail
