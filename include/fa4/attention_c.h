/* fa4's C ABI: the entry points of fa4/attention.h for C and for other languages' foreign-function
 * interfaces. Each returns an fa4 StatusCode (0 ok, 1 invalid argument, 2 not supported, 3 CUDA
 * error, 4 no suitable device); when `message` is non-null, the status's message is copied there,
 * NUL-terminated and truncated to message_len. Tensors are a base pointer and element strides for
 * batch, sequence and head, the head dimension contiguous, as in fa4/attention.h. Link against
 * fa4 (libfa4, which needs the C++ runtime and the CUDA runtime). Head dims as in fa4/attention.h
 * (kMaxHeadDim): any multiple of 8 up to 256 (e4m3: of 16); those without a kernel of their own,
 * and head_dim_v, run over zero-padded copies, which come from the workspace where one is passed
 * and holds them, else from cudaMallocAsync on the call's stream: "needs no workspace" below stays
 * true. */
#ifndef FA4_ATTENTION_C_H_
#define FA4_ATTENTION_C_H_

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fa4_tensor {
  void* data;
  int64_t batch_stride, seq_stride, head_stride;
} fa4_tensor;

// Zero it before setting fields (memset, or `= {0}`): fields added at its end (head_dim_v) then
// read as their defaults.
typedef struct fa4_problem {
  int dtype;  // 0 = bf16, 1 = fp16, 2 = e4m3 (fp8, forward only: fa4_forward_fp8)
  int64_t batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim;
  float softmax_scale;
  int causal;
  int64_t window_left, window_right;
  float softcap;  // 0 = off (fa4::Problem::softcap)
  int64_t head_dim_v;  // v's and o's head dim where it differs (fa4::Problem::head_dim_v); 0 = head_dim
} fa4_problem;

// Rotary embedding (fa4::Rotary): cos, sin [seqlen_ro, rotary_dim / 2] of the problem's dtype.
typedef struct fa4_rotary {
  const void* cos;
  const void* sin;
  int64_t seqlen_ro, rotary_dim;
  int interleaved;  // pairs (2j, 2j + 1); 0: (j, j + rotary_dim / 2)
} fa4_rotary;

// Returns a StatusCode; when `message` is non-null, the message (NUL-terminated, truncated to
// message_len) is copied there.
int fa4_forward(const fa4_problem* problem, fa4_tensor q, fa4_tensor k, fa4_tensor v, fa4_tensor o,
                float* lse, void* workspace, size_t workspace_bytes, cudaStream_t stream,
                char* message, size_t message_len);
// Batched tensors whose entries have keys of their own (fa4::Varlen::seqused_k without cu_seqlens;
// a KV cache's filled part): entry b's keys are the first seqused_k[b] rows of k and v (int32,
// device, problem->batch entries, clamped to [0, seqlen_k]). Forward only; needs no workspace.
int fa4_forward_seqused(const fa4_problem* problem, fa4_tensor q, fa4_tensor k, fa4_tensor v, fa4_tensor o,
                        const int32_t* seqused_k, float* lse, cudaStream_t stream, char* message,
                        size_t message_len);
// The same with each entry's keys starting past a left pad (fa4::Varlen::leftpad_k; flash-attn's
// cache_leftpad): entry b's keys are rows [leftpad_k[b], end) of k and v, end = seqused_k[b] (may
// be null: seqlen_k); both int32, device, problem->batch entries, clamped. Forward only.
int fa4_forward_leftpad(const fa4_problem* problem, fa4_tensor q, fa4_tensor k, fa4_tensor v, fa4_tensor o,
                        const int32_t* leftpad_k, const int32_t* seqused_k, float* lse, cudaStream_t stream,
                        char* message, size_t message_len);
// Attention sinks (fa4::ForwardArgs::sink): sink, fp32 [heads_q] on the device, each query head's
// sink logit. Batched tensors; needs no workspace.
int fa4_forward_sink(const fa4_problem* problem, fa4_tensor q, fa4_tensor k, fa4_tensor v, fa4_tensor o,
                     const float* sink, float* lse, cudaStream_t stream, char* message, size_t message_len);
// fp8 (problem->dtype = 2, e4m3 q, k, v; o bf16, its strides in bf16 elements) with
// FlashAttention-3's descales (fa4::ForwardArgs::q_descale etc.): each fp32 [batch, heads_kv] on the
// device, contiguous, or null (1). head_dim a multiple of 16 up to 256 (64, 128 and 256 on kernels
// of their own, the others over zero-padded copies from cudaMallocAsync on the stream), batched.
int fa4_forward_fp8(const fa4_problem* problem, fa4_tensor q, fa4_tensor k, fa4_tensor v, fa4_tensor o,
                    const float* q_descale, const float* k_descale, const float* v_descale, float* lse,
                    cudaStream_t stream, char* message, size_t message_len);
// A paged KV cache (fa4::PagedKV): k_pages and v_pages are pools [num_pages, page_size, heads_kv,
// head_dim] (batch_stride steps pages), entry b's key j on page block_table[b * table_stride +
// j / page_size] (int32, device); page_size a power of two >= 16; seqused_k (optional, may be
// null) each entry's keys as in fa4_forward_seqused. Forward only; needs no workspace.
int fa4_forward_paged(const fa4_problem* problem, fa4_tensor q, fa4_tensor k_pages, fa4_tensor v_pages, fa4_tensor o,
                      const int32_t* block_table, int64_t table_stride, int64_t page_size, int64_t num_pages,
                      const int32_t* seqused_k, float* lse, cudaStream_t stream, char* message, size_t message_len);
// The same with packed queries (fa4::Varlen with a paged cache: vLLM's prefill and mixed batches):
// q and o of total_q rows, sequence b's from cu_seqlens_q[b] (problem->batch + 1 entries);
// cu_seqlens_k (optional, may be null) gives each sequence's key count (its offsets not read),
// seqused_k (optional) clamps it, else problem->seqlen_k keys; lse (optional) [heads_q, total_q].
int fa4_forward_paged_varlen(const fa4_problem* problem, fa4_tensor q, fa4_tensor k_pages, fa4_tensor v_pages,
                             fa4_tensor o, const int32_t* cu_seqlens_q, int64_t total_q, const int32_t* cu_seqlens_k,
                             const int32_t* block_table, int64_t table_stride, int64_t page_size, int64_t num_pages,
                             const int32_t* seqused_k, float* lse, cudaStream_t stream, char* message,
                             size_t message_len);
// Variable-length batches (fa4::Varlen): q and o of total_q rows, k and v of total_k rows, sequence
// b's rows from cu_seqlens_q[b] / cu_seqlens_k[b] (int32, device, problem->batch + 1 entries);
// problem->seqlen_q / seqlen_k the longest sequence's lengths; lse (optional) [heads_q, total_q].
int fa4_forward_varlen(const fa4_problem* problem, fa4_tensor q, fa4_tensor k, fa4_tensor v, fa4_tensor o,
                       const int32_t* cu_seqlens_q, const int32_t* cu_seqlens_k, int64_t total_q,
                       int64_t total_k, float* lse, cudaStream_t stream, char* message, size_t message_len);
// The same with fa4::Varlen::seqused_k: sequence b's keys are the first seqused_k[b] rows of its
// span (int32, device, problem->batch entries; a KV cache's filled part). Forward only.
int fa4_forward_varlen_seqused(const fa4_problem* problem, fa4_tensor q, fa4_tensor k, fa4_tensor v, fa4_tensor o,
                               const int32_t* cu_seqlens_q, const int32_t* cu_seqlens_k, const int32_t* seqused_k,
                               int64_t total_q, int64_t total_k, float* lse, cudaStream_t stream, char* message,
                               size_t message_len);
// Its backward (fa4::BackwardArgs::varlen): dout and dq packed as q, dk and dv as k; the workspace
// as fa4_backward_workspace_size gives it for problem (seqlen_q the longest sequence's).
int fa4_backward_varlen(const fa4_problem* problem, fa4_tensor q, fa4_tensor k, fa4_tensor v, fa4_tensor o,
                        fa4_tensor dout, fa4_tensor dq, fa4_tensor dk, fa4_tensor dv, const int32_t* cu_seqlens_q,
                        const int32_t* cu_seqlens_k, int64_t total_q, int64_t total_k, const float* lse,
                        int deterministic, void* workspace, size_t workspace_bytes, cudaStream_t stream,
                        char* message, size_t message_len);
// New keys and values appended to a KV cache (fa4::append_kv, fa4::AppendArgs): entry b's new rows
// go to cache rows cache_seqlens[b] + i (int32 device array), or cache_seqlen + i when it is null;
// block_table (may be null: contiguous caches [batch, problem->seqlen_k]) as in fa4_forward_paged;
// seqused_k (optional) receives each entry's keys after the append; rotary (may be null) turns the
// new keys and q's rows into q_rotated (q and q_rotated are read only with rotary).
int fa4_append_kv(const fa4_problem* problem, int64_t seqlen_new, fa4_tensor k_new, fa4_tensor v_new,
                  fa4_tensor k_cache, fa4_tensor v_cache, const int32_t* block_table, int64_t table_stride,
                  int64_t page_size, int64_t num_pages, const int32_t* cache_seqlens, int64_t cache_seqlen,
                  int32_t* seqused_k, const fa4_rotary* rotary, fa4_tensor q, fa4_tensor q_rotated,
                  cudaStream_t stream, char* message, size_t message_len);
// The workspace fa4_forward can take for `problem` (batched tensors), in bytes, into *bytes
// (fa4::forward_workspace_size): 0 at head dims with a kernel of their own, else the zero-padded
// copies', which without it come from cudaMallocAsync on the call's stream.
int fa4_forward_workspace_size(const fa4_problem* problem, size_t* bytes, char* message, size_t message_len);
// The workspace fa4_backward needs for `problem`, in bytes, into *bytes
// (fa4::backward_workspace_size; at a head dim without a kernel of its own it includes the
// zero-padded copies of batched tensors); a StatusCode and message as above.
int fa4_backward_workspace_size(const fa4_problem* problem, size_t* bytes, char* message, size_t message_len);
int fa4_backward(const fa4_problem* problem, fa4_tensor q, fa4_tensor k, fa4_tensor v,
                 fa4_tensor o, fa4_tensor dout, fa4_tensor dq, fa4_tensor dk, fa4_tensor dv,
                 const float* lse, int deterministic, void* workspace, size_t workspace_bytes,
                 cudaStream_t stream, char* message, size_t message_len);
// The same with the forward's sinks (fa4_forward_sink) and their gradient into dsink (fp32
// [heads_q], device, overwritten; fa4::BackwardArgs::dsink); lse is the forward's with the sinks.
int fa4_backward_sink(const fa4_problem* problem, fa4_tensor q, fa4_tensor k, fa4_tensor v,
                      fa4_tensor o, fa4_tensor dout, fa4_tensor dq, fa4_tensor dk, fa4_tensor dv,
                      const float* lse, const float* sink, float* dsink, int deterministic, void* workspace,
                      size_t workspace_bytes, cudaStream_t stream, char* message, size_t message_len);

#ifdef __cplusplus
}
#endif

#endif /* FA4_ATTENTION_C_H_ */
