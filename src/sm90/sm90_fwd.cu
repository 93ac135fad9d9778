// Host side of the sm90 forward: tensor maps, tile configuration per head dim, launch.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "common/fwd_params.h"
#include "sm90/fwd_kernel.cuh"

namespace fa4::detail {

namespace {

using sm90::FwdConfig;
using sm90::FwdKernelParams;

// A [batch][seq][heads][dim] tensor as a TMA map over (dim, seq, heads, batch).
int map_tensor(CUtensorMap* map, const void* base, const int64_t stride[3], int batch, int seqlen,
               int heads, int head_dim, int box_rows) {
  const uint64_t dims[4] = {uint64_t(head_dim), uint64_t(seqlen), uint64_t(heads), uint64_t(batch)};
  const uint64_t strides[3] = {uint64_t(stride[1]) * 2, uint64_t(stride[2]) * 2, uint64_t(stride[0]) * 2};
  return ptx::make_tensor_map_16bit_sw128(map, base, dims, strides, 64, box_rows);
}

Status cuda_status(cudaError_t e, const char* what) {
  return {StatusCode::kCudaError, std::string(what) + ": " + cudaGetErrorString(e)};
}

template <class Cfg>
Status launch(const FwdParams& a, cudaStream_t stream) {
  FwdKernelParams k{};
  const int rq = map_tensor(&k.tm_q, a.q, a.q_stride, a.batch, a.seqlen_q, a.heads_q, a.head_dim, Cfg::kBlockM);
  const int rk = map_tensor(&k.tm_k, a.k, a.k_stride, a.batch, a.seqlen_k, a.heads_kv, a.head_dim, Cfg::kBlockN);
  const int rv = map_tensor(&k.tm_v, a.v, a.v_stride, a.batch, a.seqlen_k, a.heads_kv, a.head_dim, Cfg::kBlockN);
  if (rq || rk || rv)
    return {StatusCode::kNotSupported, "cuTensorMapEncodeTiled refused a tensor (driver error " +
                                           std::to_string(rq ? rq : rk ? rk : rv) + ")"};
  k.o = a.o;
  k.lse = a.lse;
  for (int i = 0; i < 3; ++i) k.o_stride[i] = a.o_stride[i];
  k.seqlen_q = a.seqlen_q;
  k.seqlen_k = a.seqlen_k;
  k.heads_q = a.heads_q;
  k.head_ratio = a.heads_q / a.heads_kv;
  k.scale_log2 = a.scale_log2;
  k.rescale_threshold = a.rescale_threshold;
  k.window = {a.window_left, a.window_right};

  const int m_blocks = (a.seqlen_q + Cfg::kBlockM - 1) / Cfg::kBlockM;
  if (m_blocks > 65535)
    return {StatusCode::kNotSupported, "seqlen_q = " + std::to_string(a.seqlen_q) +
                                           ": the forward grid takes at most " +
                                           std::to_string(65535 * Cfg::kBlockM) + " query rows"};
  auto kernel = sm90::fwd_kernel<Cfg>;
  static const cudaError_t attr =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes);
  if (attr != cudaSuccess) return cuda_status(attr, "cudaFuncSetAttribute");
  const dim3 grid(a.batch * a.heads_q, m_blocks);
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(k);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return cuda_status(e, "sm90 forward launch");
  return Status::Ok();
}

// Tile shapes per head dim: (kBlockN, stages). d64 is exp-bound: wide N, deep ring;
// d256 keeps O (128 fp32 registers a thread) beside a narrow S.
template <bool kBF16, int kPoly>
Status dispatch_head_dim(const FwdParams& a, cudaStream_t stream) {
  switch (a.head_dim) {
    case 64: return launch<FwdConfig<64, 128, 4, kBF16, kPoly>>(a, stream);
    case 128: return launch<FwdConfig<128, 128, 2, kBF16, kPoly>>(a, stream);
    case 256: return launch<FwdConfig<256, 64, 2, kBF16, kPoly>>(a, stream);
    default:
      return {StatusCode::kNotSupported, "head_dim = " + std::to_string(a.head_dim) + " has no sm90 kernel"};
  }
}

}  // namespace

Status sm90_forward(const FwdParams& a, cudaStream_t stream) {
  return a.dtype == DType::kBF16 ? dispatch_head_dim<true, 0>(a, stream)
                                 : dispatch_head_dim<false, 0>(a, stream);
}

}  // namespace fa4::detail
