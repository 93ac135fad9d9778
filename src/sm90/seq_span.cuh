// A variable-length batch's sequence as the forward and backward kernels read it.
#pragma once

namespace fa4::sm90 {

// A sequence's first query and key rows in the tensors, and its lengths.
struct SeqSpan {
  int q_off, q_len, k_off, k_len;
};

// Without varlen the launch's lengths from row 0 of each batch. With it, sequence `batch`'s entries
// of cu_seqlens, clamped so that a sequence starts where the one before it does at the earliest,
// ends inside [0, total) and is no longer than the launch's bound (p.seqlen_q, p.seqlen_k: the
// grids and the kernels' choice rest on them): entries that break the API's rules never send a
// load or store out of the tensors. Where the forward's Params carry seqused_k (Varlen), the keys
// are at most its entry's. Params: the forward's or the backward's kernel parameters.
// kPaged (the forward on a paged KV cache): the keys are on the sequence's pages from its key 0
// (k_off 0), seqlen_k of them, or cu_seqlens_k's count where it is set (its offsets not read).
template <bool kVarlen, bool kPaged = false, class Params>
__device__ __forceinline__ SeqSpan seq_span(const Params& p, int batch) {
  if constexpr (!kVarlen) {
    return {0, p.seqlen_q, 0, p.seqlen_k};
  } else {
    const int q0 = min(max(__ldg(p.cu_seqlens_q + batch), 0), p.total_q);
    const int q1 = min(max(__ldg(p.cu_seqlens_q + batch + 1), q0), p.total_q);
    int k0 = 0, k_len = p.seqlen_k;
    if constexpr (kPaged) {
      if (p.cu_seqlens_k != nullptr) {
        const int c0 = max(__ldg(p.cu_seqlens_k + batch), 0);
        k_len = min(max(__ldg(p.cu_seqlens_k + batch + 1), c0) - c0, p.seqlen_k);
      }
    } else {
      k0 = min(max(__ldg(p.cu_seqlens_k + batch), 0), p.total_k);
      const int k1 = min(max(__ldg(p.cu_seqlens_k + batch + 1), k0), p.total_k);
      k_len = min(k1 - k0, p.seqlen_k);
    }
    // The forward's Varlen::seqused_k: the first seqused_k[batch] keys of the span.
    if constexpr (requires { p.seqused_k; })
      if (p.seqused_k != nullptr) k_len = min(k_len, max(__ldg(p.seqused_k + batch), 0));
    // Its leftpad_k (never with pages): the keys start that many rows into the span, same end.
    if constexpr (!kPaged && requires { p.leftpad_k; })
      if (p.leftpad_k != nullptr) {
        const int pad = min(max(__ldg(p.leftpad_k + batch), 0), k_len);
        k0 += pad, k_len -= pad;
      }
    return {q0, min(q1 - q0, p.seqlen_q), k0, k_len};
  }
}

// Batched tensors (no varlen): where entry `batch`'s keys end, the launch's seqlen_k or, with the
// forward's per-entry lengths (Varlen::seqused_k without cu_seqlens: a KV cache's filled part),
// seqused_k[batch], clamped to [0, seqlen_k].
template <class Params>
__device__ __forceinline__ int entry_end(const Params& p, int batch) {
  return p.seqused_k == nullptr ? p.seqlen_k : min(max(__ldg(p.seqused_k + batch), 0), p.seqlen_k);
}
// Its first key's row (Varlen::leftpad_k, clamped to [0, end]; 0 without).
template <class Params>
__device__ __forceinline__ int entry_first(const Params& p, int batch, int end) {
  return p.leftpad_k == nullptr ? 0 : min(max(__ldg(p.leftpad_k + batch), 0), end);
}
// Its keys: rows [entry_first, entry_end).
template <class Params>
__device__ __forceinline__ int entry_keys(const Params& p, int batch) {
  const int end = entry_end(p, batch);
  return end - entry_first(p, batch, end);
}

}  // namespace fa4::sm90
