// What the host dispatch hands the backward kernels: validated, defaults resolved.
#pragma once

#include <cstdint>

#include "fa4/attention.h"

namespace fa4::detail {

// Rows of the fp32 dQ accumulator are rounded up to this many (the backward kernel's row tile).
inline constexpr int64_t kDqAccumRowAlign = 128;

struct BwdParams {
  DType dtype;
  const void *q, *k, *v, *o, *dout;
  void *dq, *dk, *dv;
  const float* lse;  // [batch, heads_q, seqlen_q], natural log; -inf for a row with no key
  // Element strides [batch, seq, head]; head_dim contiguous.
  int64_t q_stride[3], k_stride[3], v_stride[3], o_stride[3], do_stride[3];
  int64_t dq_stride[3], dk_stride[3], dv_stride[3];
  int batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim;
  float scale, scale_log2;  // softmax scale, and times log2(e)
  // Visible keys of query i: [i + off - left, i + off + right], off = seqlen_k - seqlen_q;
  // -1 = unbounded on that side (causal is right = 0).
  int window_left, window_right;
  bool deterministic;
  // The workspace (backward_workspace_size): the fp32 dQ accumulator [batch, heads_q, head_dim / 64,
  // rows / 64, a piece of 64 x 64 in wgmma fragment order (sm90/bwd_kernel.cuh)], then D = rowsum(dO * O)
  // [batch, heads_q, rows] and the LSE in log2 units [batch, heads_q, rows] (+inf where LSE is -inf
  // and past seqlen_q), rows = seqlen_q rounded up to kDqAccumRowAlign.
  float* dq_accum;
  float* delta;
  float* lse_log2;
  int64_t rows;
  // Development timeline (a dK/dV configuration with kTrace, tools/sm90_bwd_probe trace); null
  // otherwise.
  uint64_t* trace;
  // Variable-length batches (fa4::Varlen): int32 [batch + 1] each on the device, null without;
  // seqlen_q and seqlen_k then bound each sequence's lengths (and size the workspace and the
  // grids), the tensors hold total_q / total_k rows, and the LSE is [heads_q, total_q]. The
  // launch hands the kernels batch strides of 0 (sequence b's rows start at its cu_seqlens).
  const int32_t* cu_seqlens_q = nullptr;
  const int32_t* cu_seqlens_k = nullptr;
  int total_q = 0, total_k = 0;
  bool varlen() const { return cu_seqlens_q != nullptr; }
  // Soft-capping (Problem::softcap): S -> softcap * tanh(S * softcap_in), softcap_in = scale /
  // softcap, and scale_log2 then log2(e) alone; softcap 0 = off. Last, as in FwdParams.
  float softcap = 0.0f, softcap_in = 0.0f;
  // BackwardArgs::sink and dsink (fp32 [heads_q]; null: no sink gradient). The kernels before the
  // sinks' own (sm90/bwd_kernel.cuh, bwd_sink_kernel) read neither: the LSE carries the sinks.
  const float* sink = nullptr;
  float* dsink = nullptr;
  // v's, o's, dout's and dv's head dim (Problem::value_dim()): head_dim but where a kernel takes
  // two (192 / 128, with set_backward_v128; validate.h, native_value_dim). Last, for the offsets
  // above.
  int head_dim_v = 0;
  // The caller's columns of q, k, dq and dk (qk_cols) and of v, o, dout and dv (v_cols) where the
  // tensors are the caller's own at a head dim without a kernel (pad.h): the in-place
  // configurations (BwdKnobs::in_place) read them through maps of that extent (TMA fills the
  // columns past it with zeros) and store only those columns; 0: the kernel head dims' (the launch
  // resolves it).
  int qk_cols = 0, v_cols = 0;
};

// Launches the sm90 backward; kNotSupported for configurations it does not cover.
Status sm90_backward(const BwdParams& p, cudaStream_t stream);
// The soft-capped backward (p.softcap > 0), in its own translation unit.
Status sm90_backward_softcap(const BwdParams& p, cudaStream_t stream);

}  // namespace fa4::detail
