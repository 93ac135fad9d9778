// What the host dispatch hands a forward kernel: validated, defaults resolved.
#pragma once

#include <cstdint>

#include "fa4/attention.h"
#include "fa4/numerics/exp2.h"  // (FA4_HD)

namespace fa4::detail {

struct FwdParams {
  DType dtype;
  const void* q;
  const void* k;
  const void* v;
  void* o;
  float* lse;  // may be null
  // Element strides: [batch, seq, head]; head_dim contiguous.
  int64_t q_stride[3], k_stride[3], v_stride[3], o_stride[3];
  int batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim;
  // The columns that q and k (qk_cols) and v and o (v_cols) hold where a call at a head dim
  // without a kernel of its own runs on the caller's tensors (common/pad.h): the kernels' loads
  // read zeros past them (TMA's fill beyond a map's extent; the decoding kernel's zero-byte
  // copies) and their stores skip them (TMA's clip; bounds on the stores from registers). 0:
  // head_dim. The kernels of head dim 64 and 128 only; and v_cols 128 at head dim 192 where the
  // value side has kernels of its own (192 / 128: fwd_configs.cuh, D192V128Config).
  int qk_cols = 0, v_cols = 0;
  float scale;       // softmax scale
  float scale_log2;  // scale * log2(e); log2(e) alone when soft-capped
  // Soft-capping (Problem::softcap): S -> softcap * tanh(S * softcap_in), softcap_in = scale /
  // softcap; softcap 0 = off.
  float softcap, softcap_in;
  // Visible keys of query i: [i + off - left, i + off + right] with off = seqlen_k - seqlen_q;
  // -1 = unbounded on that side. Causal arrives here as right = 0.
  int window_left, window_right;
  // Conditional rescaling threshold in log2 units (0 = rescale whenever the max grows).
  float rescale_threshold = 8.0f;
  // Grid: 0 or 1 = persistent (one CTA per SM walking tiles), 2 = one CTA per tile (ablation),
  // 3 = persistent in static rounds with one section of every head where lengths vary (ablation:
  // the order before the dynamic grid), 4 = the dynamic grid over that one section (ablation).
  int schedule = 0;
  // Clusters of two CTAs sharing each K/V block by TMA multicast (sm90, tiles of one length only):
  // 0 = where they pay (sm90/fwd_launch.cuh, use_cluster_pairs), 1 = never, 2 = wherever possible.
  int cluster = 0;
  // K and V bytes a section of heads may hold (sm90/fwd_launch.cuh); 0 = the default, < 0 = one
  // section of every head. For measurements.
  int64_t l2_section_bytes = 0;
  // Stream-K tail (sm90, tiles of one length in static rounds): the last partial round's tiles cut
  // along their keys so every CTA ends together (sm90/tile_order.cuh). 0 = where it pays
  // (sm90/fwd_launch.cuh, plan_tail_split), 1 = never, 2 = whenever the last round is partial.
  int split = 0;
  // At most this many CTAs in the persistent grid (0 = one a multiprocessor). For tests and
  // measurements: small problems then take several rounds.
  int max_ctas = 0;
  // A head's longest tile walking its diagonal block last (sm90 paired causal tiles, four or more
  // query blocks; sm90/fwd_launch.cuh): 0 = by the device (every round where DRAM runs 4 TB/s or more,
  // else the last round), 1 = never, 2 = the last round only, 3 = every round.
  int diagonal_last = 0;
  // Variable-length batches (fa4::Varlen): int32 [batch + 1] each on the device, null without;
  // seqlen_q and seqlen_k then bound each sequence's lengths, and q, o (k, v) hold total_q
  // (total_k) rows, their batch strides unread.
  const int32_t* cu_seqlens_q = nullptr;
  const int32_t* cu_seqlens_k = nullptr;
  int total_q = 0, total_k = 0;
  // Varlen::seqused_k: sequence b's keys are the first seqused_k[b] of its span (null: all); without
  // varlen batch entry b's are the first seqused_k[b] of seqlen_k.
  const int32_t* seqused_k = nullptr;
  // Varlen::leftpad_k: sequence (entry) b's keys start leftpad_k[b] rows into its span, ending where
  // they would without it (null: at row 0). Not with block_table.
  const int32_t* leftpad_k = nullptr;
  // ForwardArgs::sink: fp32 [heads_q] (null: none). Row q of head h takes
  // sink[sink_index(h, q, sink_group, sink_mask)]: its head's own where rows are not folded
  // (group 1), the group's query head where they are (fold_query_groups: group heads_q / heads_kv,
  // mask ~0; fold_query_rows: group 2^fold, mask 2^fold - 1).
  const float* sink = nullptr;
  int sink_group = 1;
  uint32_t sink_mask = 0;
  // A paged KV cache (fa4::PagedKV; batched only): k and v are pools of num_pages pages of
  // page_size rows (k_stride[0] and v_stride[0] step pages), entry b's key j on page
  // block_table[b * table_stride + j / page_size]. Null: k and v are [batch, seqlen_k] tensors.
  const int32_t* block_table = nullptr;
  int table_stride = 0, page_size = 0, num_pages = 0;
  // A query group of 2^fold heads folded into rows (fold_query_rows; 0 = not): seqlen_q and heads_q
  // are then the folded rows (queries << fold) and heads (heads_kv), q_stride and o_stride stay the
  // tensors' own, and row r is query r >> fold of query head (head << fold) + (r & (2^fold - 1)).
  int fold = 0;
  // The decoding kernel (sm90/decode_kernel.cuh: a KV head's rows, seqlen_q x the query group, at
  // most 16, on mma.sync tiles): 0 = where the launch's rule takes it (sm90/decode_plan.h), 1 =
  // never, 2 = wherever it can run. For tests and measurements.
  int decode = 0;
  // fp8 (DType::kE4M3): ForwardArgs' descales, fp32 [batch, heads_kv] each (null: 1), and the
  // software exp2's share in the fp8 kernel (every n-th 8-key chunk on the FMA pipe; -1: the
  // shipped share; for measurements).
  const float* q_descale = nullptr;
  const float* k_descale = nullptr;
  const float* v_descale = nullptr;
  int exp2_poly_every = -1;
  // The fp8 kernel's tiles walked statically (CTA c takes c, c + grid, ...) instead of handed out
  // by a counter (for measurements).
  bool fp8_static_tiles = false;
  // The fp8 kernel's row max over the raw scores, scaled once (1), or over the scaled ones (0);
  // -1: the shipped form for the head dim (for measurements; the other form at the shipped exp2
  // share only).
  int fp8_raw_max = -1;
  // The fp8 kernel's consumer warpgroups: 0 = the shipped (two); 3 = three, with one P buffer
  // (Fp8Config::kOneP; d64 and the shipped exp2 share only; for measurements).
  int fp8_consumers = 0;
  // The fp8 kernel's wait for P V at the next step's start (Fp8Config::kDeferPv; the shipped exp2
  // share, row max and consumers only; for measurements).
  bool fp8_defer_pv = false;
  bool varlen() const { return cu_seqlens_q != nullptr; }
};

// The query head whose sink row q of head `head` takes (FwdParams::sink_group, sink_mask): head
// where group is 1; with a folded group, head * group + the row's place in it, q & mask clamped to
// group - 1 (a padding row past the group's, or before row 0 as unsigned, takes the last head's:
// in bounds, and its result is not stored).
FA4_HD int sink_index(int head, int q, int group, uint32_t mask) {
  const uint32_t m = uint32_t(q) & mask, last = uint32_t(group - 1);
  return head * group + int(m < last ? m : last);
}

// Launches the sm90 forward kernel; kNotSupported for configurations it does not cover. A folded
// query group (p.fold) may be unfolded first (sm90::fold_pays).
Status sm90_forward(const FwdParams& p, cudaStream_t stream);
// The same with the rows as given, folded or not (measurements of the fold's rule).
Status sm90_forward_rows(const FwdParams& p, cudaStream_t stream);
// The same for a variable-length batch (p.varlen()), which sm90_forward hands on to it.
Status sm90_forward_varlen(const FwdParams& p, cudaStream_t stream);
Status sm90_forward_softcap(const FwdParams& p, cudaStream_t stream);
// A paged KV cache (p.block_table), soft-capped or not, on kernels of its own (sm90_fwd_paged.cu).
Status sm90_forward_paged(const FwdParams& p, cudaStream_t stream);
// fp8 inputs (DType::kE4M3; batched, no soft cap, sinks or pages: validate) on the fp8 kernel
// (sm90/sm90_fp8_fwd.cu); O is bf16.
Status sm90_forward_fp8(const FwdParams& p, cudaStream_t stream);
// A decoding call (sm90::decode_runs: unfolded rows, at most 16 a KV head) on the decoding kernel.
Status sm90_forward_decode(const FwdParams& p, cudaStream_t stream);

}  // namespace fa4::detail
