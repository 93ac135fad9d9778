// New keys and values written into a KV cache, with rotary embedding on the way (fa4::append_kv):
// what the host hands the kernel, validated, in the kernel's terms.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "fa4/attention.h"

namespace fa4::detail {

struct AppendParams {
  DType dtype;
  int batch, seqlen_new, heads_kv, head_dim;
  int capacity;  // an entry's cache rows (Problem::seqlen_k): rows at or past it are not written
  // Element strides [batch, seq, head], head_dim contiguous; with pages the caches' batch stride
  // steps pages.
  const void* k_new;
  const void* v_new;
  void* k_cache;
  void* v_cache;
  int64_t kn_stride[3], vn_stride[3], kc_stride[3], vc_stride[3];
  const int32_t* block_table;  // null: contiguous caches
  int table_stride, page_size, num_pages;
  const int32_t* cache_seqlens;  // null: cache_seqlen for every entry
  int cache_seqlen;
  int32_t* seqused_k;  // may be null
  // Rotary (rotary_dim 0: off): cos, sin [seqlen_ro, rotary_dim / 2].
  const void* cos;
  const void* sin;
  int seqlen_ro, rotary_dim;
  bool interleaved;
  bool q_per_row;  // query row i at cache_seqlens[b] + i (causal or a window), else every row at cache_seqlens[b]
  int seqlen_q, heads_q;
  const void* q;
  void* q_rotated;
  int64_t q_stride[3], qr_stride[3];
};

// The parameters of arguments that passed validate(const AppendArgs&).
AppendParams make_append_params(const AppendArgs& args);

// One launch over every new row of k and v (and of q with rotary) and seqused_k's entries.
cudaError_t launch_append_kv(const AppendParams& p, cudaStream_t stream);

}  // namespace fa4::detail
