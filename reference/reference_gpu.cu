// The plain CUDA oracle: one thread block per (batch, query head, query row).
//
// Pass 1 scores every visible key (one warp per key, lanes split the head dim, a butterfly sum
// that leaves the same value in every lane) and takes the row max. Pass 2 scores them again,
// turns them into p = exp(s - max) a chunk at a time, and each thread accumulates p·V for the head
// dims it owns. O = acc / sum(p), LSE = max + log(sum(p)). Everything in fp32; no fast math.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "reference_gpu.h"

namespace fa4::ref {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kChunk = 64;             // keys turned into probabilities per step of pass 2
constexpr int64_t kMaxHeadDim = 4096;  // q row and accumulator live in shared memory
constexpr int64_t kMaxBlocks = int64_t{1} << 20;

struct OracleParams {
  const void* q;
  const void* k;
  const void* v;
  int64_t q_stride[3], k_stride[3], v_stride[3];  // batch, seq, head (elements)
  float* o;
  float* lse;
  int64_t batch, seqlen_q, seqlen_k, heads_q, head_dim;
  int64_t group;  // heads_q / heads_kv
  float scale;
  float softcap;  // 0 = off
  int64_t window_left, window_right;  // -1 = unbounded; causal already folded into the right
  const float* sink;                  // ForwardArgs::sink: [heads_q], a score of no value (null: none)
};

__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }

// Scaled score of the q row (in shared memory, fp32) against key row `k`, the same in every lane.
template <class T>
__device__ float score(const float* q_row, const T* k, int64_t dim, float scale, float softcap) {
  const int lane = threadIdx.x % 32;
  float dot = 0.0f;
  for (int64_t d = lane; d < dim; d += 32) dot = __fmaf_rn(q_row[d], to_f32(k[d]), dot);
  for (int off = 16; off > 0; off /= 2)
    dot = __fadd_rn(dot, __shfl_xor_sync(0xFFFFFFFFu, dot, off));
  const float s = __fmul_rn(dot, scale);
  return softcap > 0.0f ? softcap * tanhf(s / softcap) : s;  // (tanhf: the accurate one)
}

template <class T>
__global__ void __launch_bounds__(kThreads) oracle_forward(OracleParams p) {
  extern __shared__ float smem[];
  float* q_row = smem;             // [head_dim]
  float* acc = smem + p.head_dim;  // [head_dim]; entry d is only touched by thread d % kThreads
  __shared__ float prob[kChunk];
  __shared__ float warp_max[kWarps];
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int64_t rows = p.batch * p.heads_q * p.seqlen_q;

  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {  // row = LSE index
    const int64_t i = row % p.seqlen_q;
    const int64_t h = (row / p.seqlen_q) % p.heads_q;
    const int64_t b = row / (p.seqlen_q * p.heads_q);
    const int64_t hk = h / p.group;
    const T* q =
        static_cast<const T*>(p.q) + b * p.q_stride[0] + i * p.q_stride[1] + h * p.q_stride[2];
    const T* k = static_cast<const T*>(p.k) + b * p.k_stride[0] + hk * p.k_stride[2];
    const T* v = static_cast<const T*>(p.v) + b * p.v_stride[0] + hk * p.v_stride[2];
    float* o = p.o + ((b * p.seqlen_q + i) * p.heads_q + h) * p.head_dim;

    // Visible keys [lo, hi]: the same rule as ref::visible, bottom-right aligned.
    const int64_t diag = i + p.seqlen_k - p.seqlen_q;
    const int64_t lo = p.window_left >= 0 ? max(diag - p.window_left, int64_t{0}) : 0;
    const int64_t hi =
        p.window_right >= 0 ? min(diag + p.window_right, p.seqlen_k - 1) : p.seqlen_k - 1;

    for (int64_t d = tid; d < p.head_dim; d += kThreads) {
      q_row[d] = to_f32(q[d]);
      acc[d] = 0.0f;
    }
    __syncthreads();

    // Pass 1: the row max.
    float m = -INFINITY;
    for (int64_t j = lo + warp; j <= hi; j += kWarps)
      m = fmaxf(m, score(q_row, k + j * p.k_stride[1], p.head_dim, p.scale, p.softcap));
    if (lane == 0) warp_max[warp] = m;
    __syncthreads();
    m = warp_max[0];
    for (int w = 1; w < kWarps; ++w) m = fmaxf(m, warp_max[w]);
    // The head's sink: into the max, and the sum's first term (its value is 0).
    const float sk = p.sink != nullptr ? p.sink[h] : -INFINITY;
    m = fmaxf(m, sk);

    // Pass 2: probabilities a chunk at a time, their sum, and P·V.
    float l = sk == -INFINITY ? 0.0f : expf(sk - m);
    for (int64_t c = lo; c <= hi; c += kChunk) {
      const int n = static_cast<int>(min(int64_t{kChunk}, hi + 1 - c));
      for (int jj = warp; jj < n; jj += kWarps) {
        const float s = score(q_row, k + (c + jj) * p.k_stride[1], p.head_dim, p.scale, p.softcap);
        if (lane == 0) prob[jj] = expf(s - m);
      }
      __syncthreads();
      for (int jj = 0; jj < n; ++jj) l += prob[jj];  // every thread, same order: the same l
      for (int64_t d = tid; d < p.head_dim; d += kThreads) {
        float a = acc[d];
        for (int jj = 0; jj < n; ++jj)
          a = __fmaf_rn(prob[jj], to_f32(v[(c + jj) * p.v_stride[1] + d]), a);
        acc[d] = a;
      }
      __syncthreads();  // prob is rewritten by the next chunk
    }

    const bool empty = l == 0.0f;  // no visible key and no sink
    for (int64_t d = tid; d < p.head_dim; d += kThreads) o[d] = empty ? 0.0f : acc[d] / l;
    if (tid == 0 && p.lse != nullptr) p.lse[row] = empty ? -INFINITY : m + logf(l);
    __syncthreads();  // q_row, acc and warp_max are reused by the next row
  }
}

Status invalid(const std::string& what) {
  return {StatusCode::kInvalidArgument, "gpu_forward: " + what};
}

}  // namespace

Status gpu_forward(const ForwardArgs& args, float* o32, float* lse32, cudaStream_t stream) {
  const Problem& pr = args.problem;
  if (pr.batch < 0 || pr.seqlen_q < 0 || pr.seqlen_k < 0) return invalid("negative size");
  if (pr.heads_q <= 0 || pr.heads_kv <= 0 || pr.heads_q % pr.heads_kv != 0)
    return invalid("heads_q must be a positive multiple of heads_kv");
  if (pr.head_dim <= 0 || pr.head_dim > kMaxHeadDim)
    return {StatusCode::kNotSupported,
            "gpu_forward: head_dim must be in [1, " + std::to_string(kMaxHeadDim) + "]"};
  if (pr.dtype != DType::kBF16 && pr.dtype != DType::kFP16) return invalid("unknown dtype");
  const int64_t rows = pr.batch * pr.heads_q * pr.seqlen_q;
  if (rows == 0) return Status::Ok();
  if (args.q.data == nullptr || o32 == nullptr) return invalid("q and o32 must not be null");
  if (pr.seqlen_k > 0 && (args.k.data == nullptr || args.v.data == nullptr))
    return invalid("k and v must not be null");

  OracleParams p{};
  p.q = args.q.data;
  p.k = args.k.data;
  p.v = args.v.data;
  const TensorRef* refs[3] = {&args.q, &args.k, &args.v};
  int64_t* strides[3] = {p.q_stride, p.k_stride, p.v_stride};
  for (int t = 0; t < 3; ++t) {
    strides[t][0] = refs[t]->batch_stride;
    strides[t][1] = refs[t]->seq_stride;
    strides[t][2] = refs[t]->head_stride;
  }
  p.o = o32;
  p.lse = lse32;
  p.sink = args.sink;
  p.batch = pr.batch;
  p.seqlen_q = pr.seqlen_q;
  p.seqlen_k = pr.seqlen_k;
  p.heads_q = pr.heads_q;
  p.head_dim = pr.head_dim;
  p.group = pr.heads_q / pr.heads_kv;
  p.scale = pr.softmax_scale == 0.0f ? 1.0f / std::sqrt(static_cast<float>(pr.head_dim))
                                     : pr.softmax_scale;
  p.softcap = pr.softcap;
  p.window_left = pr.window_left < 0 ? -1 : pr.window_left;
  p.window_right = pr.window_right < 0 ? -1 : pr.window_right;
  if (pr.causal) p.window_right = p.window_right < 0 ? 0 : std::min<int64_t>(p.window_right, 0);

  const unsigned grid = static_cast<unsigned>(std::min(rows, kMaxBlocks));
  const size_t smem = 2 * static_cast<size_t>(pr.head_dim) * sizeof(float);
  if (pr.dtype == DType::kBF16)
    oracle_forward<__nv_bfloat16><<<grid, kThreads, smem, stream>>>(p);
  else
    oracle_forward<__half><<<grid, kThreads, smem, stream>>>(p);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    return {StatusCode::kCudaError,
            std::string("gpu_forward: launch failed: ") + cudaGetErrorString(e)};
  return Status::Ok();
}

}  // namespace fa4::ref
