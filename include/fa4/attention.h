// fa4 public API: attention forward and backward on Hopper (sm_90a).
//
// Tensors are described by a base pointer and element strides for batch, sequence and head; the
// last (head_dim) dimension is contiguous. BSHD is the default layout; BHSD is other strides.
// Every call validates its arguments first and answers with a Status naming the bad argument.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include <cuda_runtime_api.h>

namespace fa4 {

// kE4M3: fp8 (e4m3, OCP's float8_e4m3fn) q, k and v, forward only, with o in bf16
// (FlashAttention-3's fp8 forward); ForwardArgs' descales scale them.
enum class DType : int { kBF16 = 0, kFP16 = 1, kE4M3 = 2 };

enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument = 1,  // the arguments break a rule of the API
  kNotSupported = 2,     // valid, but no kernel exists for this configuration (yet)
  kCudaError = 3,        // a CUDA call failed
  kNoDevice = 4,         // no suitable GPU (none, or compute capability below 9.0)
};

struct Status {
  StatusCode code = StatusCode::kOk;
  std::string message;
  bool ok() const { return code == StatusCode::kOk; }
  static Status Ok() { return {}; }
};

const char* to_string(StatusCode code);
const char* to_string(DType dtype);

// A 4-d tensor [batch, seq, heads, head_dim] with element strides; head_dim is contiguous.
struct TensorRef {
  void* data = nullptr;
  int64_t batch_stride = 0;
  int64_t seq_stride = 0;
  int64_t head_stride = 0;
};

// Packs a contiguous BSHD tensor [batch, seq, heads, dim].
TensorRef bshd(void* data, int64_t seqlen, int64_t heads, int64_t dim);
// Packs a contiguous BHSD tensor [batch, heads, seq, dim].
TensorRef bhsd(void* data, int64_t seqlen, int64_t heads, int64_t dim);

struct Problem {
  DType dtype = DType::kBF16;
  int64_t batch = 0;
  int64_t seqlen_q = 0;
  int64_t seqlen_k = 0;
  int64_t heads_q = 0;
  int64_t heads_kv = 0;  // heads_q must be a multiple (GQA/MQA)
  int64_t head_dim = 0;        // q's and k's (and dq's, dk's)
  // v's, o's (and dout's, dv's) where it differs from head_dim (DeepSeek's 192 / 128); 0 = head_dim.
  // The same rule as head_dim (kMaxHeadDim); a call with two head dims runs on the kernel head dim
  // of the larger over zero-padded copies. Not for append_kv (one head dim for k and v).
  int64_t head_dim_v = 0;
  float softmax_scale = 0.0f;  // 0 means the default 1/sqrt(head_dim)
  // Score soft-capping (Gemma 2, Grok): with softcap > 0 the softmax takes
  // softcap * tanh(softmax_scale * q.k / softcap) for each score; 0 = off. Forward and backward,
  // batched and varlen.
  float softcap = 0.0f;
  bool causal = false;         // bottom-right aligned: query i sees keys j <= i + seqlen_k - seqlen_q
  int64_t window_left = -1;    // -1 = unbounded
  int64_t window_right = -1;   // -1 = unbounded; causal is window_right = 0
  // v's and o's head dim: head_dim_v, or head_dim where that is 0.
  int64_t value_dim() const { return head_dim_v > 0 ? head_dim_v : head_dim; }
};

// Variable-length batches (packed sequences, flash-attn's varlen API). With both cu_seqlens set,
// q and o hold total_q rows and k and v total_k rows (TensorRef's seq_stride and head_stride; its
// batch_stride is not read), sequence b owning query rows [cu_seqlens_q[b], cu_seqlens_q[b + 1])
// and key rows [cu_seqlens_k[b], cu_seqlens_k[b + 1]). Both arrays are int32 in device memory,
// problem.batch + 1 entries from 0, non-decreasing, ending at most at total_q / total_k;
// problem.seqlen_q and seqlen_k are the longest sequence's lengths (or any bound above them; they
// size the grid and pick the kernel). Causal and windows align each sequence's own queries and
// keys bottom-right. Rows outside every sequence: the forward writes none of them (O, LSE), the
// backward sets them to 0 in dq, dk and dv (their gradient). Entries that break the rules are
// clamped on the device (a sequence then reads and writes inside [0, total) only, and none before
// its start), never read past. No sequence's outputs or gradients read another sequence's rows or
// the spare rows after the last: a NaN there stays out of them.
// seqused_k (forward only; optional): int32 [problem.batch] in device memory, sequence b's keys
// being only the first seqused_k[b] rows of its cu_seqlens_k span (a KV cache's filled part;
// flash-attn's seqused_k): causal and windows align to them. Entries are clamped to [0, span].
// Without cu_seqlens (batched tensors) the same for batch entry b: its keys are the first
// seqused_k[b] of problem.seqlen_k (clamped to [0, seqlen_k]; flash-attn's cache_seqlens), each
// entry's queries aligned bottom-right to them under causal and windows. Rows of an entry without
// keys: O = 0, LSE = -inf. The rows past seqused_k (a cache's never-written rows) may hold
// anything, NaN too: they never reach O.
// leftpad_k (forward only; optional; not with a paged cache): int32 [problem.batch] in device
// memory, sequence (batch entry) b's keys starting leftpad_k[b] rows into its span: its keys are
// rows [leftpad_k[b], end) where end is what they would be without it (seqused_k[b], or the span's
// or seqlen_k's end), so that seqused_k stays the cache's filled end (flash-attn's cache_leftpad
// with cache_seqlens). Causal and windows align to those keys; the rows before them may hold
// anything (NaN too). Entries are clamped to [0, end].
struct Varlen {
  const int32_t* cu_seqlens_q = nullptr;
  const int32_t* cu_seqlens_k = nullptr;
  int64_t total_q = 0;
  int64_t total_k = 0;
  const int32_t* seqused_k = nullptr;
  const int32_t* leftpad_k = nullptr;
  bool enabled() const { return cu_seqlens_q != nullptr || cu_seqlens_k != nullptr; }
};

// A paged KV cache (vLLM's block tables; flash-attn's block_table), forward only, with batched q
// and o (no cu_seqlens). k and v are pools of pages: each a TensorRef over [num_pages, page_size,
// heads_kv, head_dim], batch_stride stepping pages. Batch entry b's key j is row j % page_size of
// page block_table[b * table_stride + j / page_size]: block_table is int32 on the device, its row
// for an entry covering problem.seqlen_k keys (ceil(seqlen_k / page_size) <= table_stride), and
// varlen.seqused_k, when set, gives each entry's own count as without pages. page_size is a power
// of two, 16 at least (a key block lies on one page or on whole pages; fewer rows: kNotSupported).
// Page ids are clamped to [0, num_pages) on the device (a bad id reads a wrong page, never outside
// the pools); table entries past seqlen_k's pages are not read, and rows of the last page past an
// entry's keys may hold anything (NaN too).
struct PagedKV {
  const int32_t* block_table = nullptr;
  int64_t table_stride = 0;
  int64_t page_size = 0;
  int64_t num_pages = 0;
  bool enabled() const { return block_table != nullptr; }
};

struct ForwardArgs {
  Problem problem;
  TensorRef q, k, v, o;
  // Optional fp32, natural log, contiguous: [batch, heads_q, seqlen_q], or with varlen
  // [heads_q, total_q] (flash-attn's layout), row r of head h at h * total_q + r.
  float* lse = nullptr;
  // Optional attention sinks (gpt-oss; FlashAttention-4's learnable_sink): fp32 [heads_q] on the
  // device, 4-byte aligned. Query head h's every row takes sink[h] as one more score beside its
  // keys' (in the units of the scaled, soft-capped scores), with no value: it adds exp(sink[h] - m)
  // to the softmax's sum and nothing to O. A row then has LSE = log(sum over its keys of exp(s) +
  // exp(sink[h])), and a row without keys O = 0 and LSE = sink[h]. -inf is no sink.
  const float* sink = nullptr;
  Varlen varlen;  // off unless its pointers are set
  PagedKV paged;  // off unless block_table is set
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  // fp8 (problem.dtype = kE4M3) only: each fp32 [batch, heads_kv] on the device, contiguous, 4-byte
  // aligned (FlashAttention-3's q_descale, k_descale, v_descale): the values q, k and v stand for
  // are their e4m3 numbers times batch entry b's, KV head hk's entry (query head h reads hk =
  // h / (heads_q / heads_kv)). Null: 1. Entries must be finite and > 0. The fp8 forward runs
  // head_dim 64, 128 and 256, batched (no varlen, paged cache, soft cap or sinks), causal and windows
  // included; o is bf16 (its strides in bf16 elements) and the LSE, when asked for, is of the
  // scaled scores as for 16-bit inputs.
  const float* q_descale = nullptr;
  const float* k_descale = nullptr;
  const float* v_descale = nullptr;
};

struct BackwardArgs {
  Problem problem;
  TensorRef q, k, v, o, dout;
  TensorRef dq, dk, dv;
  const float* lse = nullptr;  // from the forward pass, required (with varlen [heads_q, total_q])
  // The forward's sinks (ForwardArgs::sink; optional) and their gradient: dsink (fp32 [heads_q] on
  // the device, overwritten; null: not computed, and then sink is not read) gets, for each query
  // head h, -sum over its rows (every sequence) of exp(sink[h] - LSE) * rowsum(dO ∘ O). The lse
  // given must be the forward's with the same sinks: dq, dk and dv take the sinks through it.
  // Deterministic in either mode.
  const float* sink = nullptr;
  float* dsink = nullptr;
  bool deterministic = false;
  // A variable-length batch, as the forward's (Varlen): dout and dq are packed as q, dk and dv as
  // k; rows outside every sequence get gradients of 0.
  Varlen varlen;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};

// Rotary position embedding (RoPE), as flash-attn's apply_rotary_emb: a row at position pos has
// each pair (x1, x2) of its first rotary_dim dims turned by the angle whose cosine and sine are
// row pos, column j of cos and sin for pair j: x1' = x1 cos - x2 sin, x2' = x1 sin + x2 cos, in
// fp32, rounded once. Pair j is dims (j, j + rotary_dim / 2) (GPT-NeoX), or with interleaved
// (2j, 2j + 1) (GPT-J). cos and sin: [seqlen_ro, rotary_dim / 2] of the problem's dtype,
// contiguous, on the device; positions past seqlen_ro - 1 are clamped to it on the device.
struct Rotary {
  const void* cos = nullptr;
  const void* sin = nullptr;
  int64_t seqlen_ro = 0;   // rows of cos and sin
  int64_t rotary_dim = 0;  // a multiple of 16, at most head_dim
  bool interleaved = false;
  bool enabled() const { return cos != nullptr || sin != nullptr; }
};

// New keys and values appended to a KV cache in place before attending to it (flash-attn's
// flash_attn_with_kvcache with k and v): entry b's new row i goes to cache row
// cache_seqlens[b] + i (or cache_seqlen + i for every entry when cache_seqlens is null). With
// rotary set, the new keys are rotated at those positions on the way in, and the queries into
// q_rotated: query row i at position cache_seqlens[b] + i under causal or a window (the problem's),
// else every row at cache_seqlens[b] (flash-attn's rule). v is copied as it is.
// problem: dtype, batch, heads_q, heads_kv, head_dim as for the attention that follows; seqlen_k
// is the cache's rows an entry (with pages, the table row's: at most table_stride * page_size);
// seqlen_q the query rows (read with rotary only). Rows that would land at or past seqlen_k are
// not written, and seqused_k (optional, int32 [batch] on the device) receives each entry's keys
// after the append, min(max(cache_seqlens[b], 0) + seqlen_new, seqlen_k): the Varlen::seqused_k
// of the forward that follows. k_new and v_new must not overlap the cache rows they go to.
struct AppendArgs {
  Problem problem;
  int64_t seqlen_new = 0;
  TensorRef k_new, v_new;      // [batch, seqlen_new, heads_kv, head_dim]
  TensorRef k_cache, v_cache;  // [batch, seqlen_k, heads_kv, head_dim], or pools with paged
  PagedKV paged;               // off unless block_table is set
  const int32_t* cache_seqlens = nullptr;  // int32 [batch] on the device, or null
  int64_t cache_seqlen = 0;                // every entry's, where cache_seqlens is null
  int32_t* seqused_k = nullptr;            // optional out: int32 [batch] on the device
  Rotary rotary;               // off unless cos or sin is set
  TensorRef q, q_rotated;      // [batch, seqlen_q, heads_q, head_dim]; with rotary only
};

// Strides and base pointers must be multiples of this many bytes (TMA).
inline constexpr int kAlignmentBytes = 16;
// Head dims: any up to kMaxHeadDim whose row is a multiple of kAlignmentBytes (bf16 and fp16: a
// multiple of 8; e4m3: of 16). Those of kKernelHeadDims run kernels of their own in every pass,
// and the 16-bit forward has kernels of its own at kForwardKernelHeadDims too. Any other runs
// on the next one's kernel (that pass's), on copies of the tensors zero-padded to its head dim (zero columns add
// nothing to q.k, and give columns of o, dq, dk and dv that are dropped): exact, at the work of the
// larger head dim plus one pass over each tensor (the forward's q, k, v and o, the backward's also
// dout, dq, dk and dv; of a paged cache the pages the entries' tables name, gathered). The copies come from the call's workspace
// where it holds them (forward_workspace_size, backward_workspace_size), else from the
// stream-ordered allocator (cudaMallocAsync) on the call's stream.
inline constexpr int kMaxHeadDim = 256;
inline constexpr int kKernelHeadDims[] = {64, 128, 256};
// The bf16 and fp16 forward's (d192: FlashAttention-3's size; 136-184 pad to it, not to 256).
inline constexpr int kForwardKernelHeadDims[] = {64, 128, 192, 256};
// Minimal compute capability (major * 10 + minor).
inline constexpr int kMinComputeCapability = 90;

// Checks the arguments without touching the GPU (no pointer dereference).
Status validate(const ForwardArgs& args);
Status validate(const BackwardArgs& args);

// The softmax scale actually used (the default when problem.softmax_scale is 0).
float effective_scale(const Problem& p);

// Workspace bytes that forward / backward need for these arguments (0 if none). At the head dims
// of kKernelHeadDims only args.problem is read, so they may be asked before the tensors exist; at
// the others they add the zero-padded copies' bytes (each rounded up to 256), sized by
// args.problem, args.varlen's totals (with cu_seqlens) and args.paged's pools (with a block
// table); a workspace without them (smaller) is not an error: the copies then come from
// cudaMallocAsync on the call's stream. Forward needs none at kKernelHeadDims: its
// counters (the tile counter of causal tiles, the key-split pieces' counters where a last round
// leaves SMs idle) are the stream's own, 4 KB a stream (and context) allocated at its first call
// and kept, and the pieces' fp32 partials come from the stream-ordered allocator,
// cudaMallocAsync, on the call's stream; under CUDA graph capture the counters come from that
// allocator too;
// backward needs an fp32 dQ accumulator and two fp32 a query row (rowsum(dO * O), and the LSE in
// log2 units): batch * round_up(seqlen_q, 128) * heads_q * (kernel head dim + 2) * 4 bytes, 16-byte
// aligned, passed as args.workspace / args.workspace_bytes (with varlen seqlen_q is the longest
// sequence's; the kernel head dim is the larger of head_dim and head_dim_v where it is one of
// kKernelHeadDims, else the next).
Status forward_workspace_size(const ForwardArgs& args, size_t* bytes);
Status backward_workspace_size(const BackwardArgs& args, size_t* bytes);

// Checks AppendArgs as validate(ForwardArgs) does; append_kv launches one small kernel on `stream`
// (none when there is nothing to write).
Status validate(const AppendArgs& args);
Status append_kv(const AppendArgs& args, cudaStream_t stream);

// Runs attention on `stream`. Returns without launching when validation fails.
Status forward(const ForwardArgs& args, cudaStream_t stream);
Status backward(const BackwardArgs& args, cudaStream_t stream);

}  // namespace fa4

// C ABI over the same entry points, for other languages: fa4/attention_c.h (includable from C).
#include "fa4/attention_c.h"
