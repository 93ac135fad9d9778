// sm90 decoding: the launch of the decoding kernel and, where a pair's keys are cut into splits,
// their merge (sm90/decode_kernel.cuh; which calls, sm90/decode_plan.h).
#include <string>

#include "common/launch.cuh"
#include "common/per_device.h"
#include "sm90/decode_kernel.cuh"
#include "sm90/decode_plan.h"

namespace fa4::detail {
namespace {

Status decode_failure(const char* what, cudaError_t e) {
  return {StatusCode::kCudaError, std::string("sm90 decoding: ") + what + ": " + cudaGetErrorString(e)};
}

template <int kD, bool kBF16>
Status launch_decode(const FwdParams& a, cudaStream_t stream) {
  using namespace sm90::decode;
  int device = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e != cudaSuccess) return decode_failure("device query", e);
  const int sms = multiprocessors(device);  // (kept once a device, as sm90_forward's rule reads it)
  if (sms == 0) return {StatusCode::kCudaError, "sm90 decoding: the device's multiprocessor count could not be read"};
  DecodeParams p{};
  p.q = a.q, p.k = a.k, p.v = a.v, p.o = a.o, p.lse = a.lse;
  for (int i = 0; i < 3; ++i) {
    p.q_stride[i] = a.q_stride[i], p.k_stride[i] = a.k_stride[i];
    p.v_stride[i] = a.v_stride[i], p.o_stride[i] = a.o_stride[i];
  }
  p.qk_pieces = (a.qk_cols > 0 ? a.qk_cols : kD) / 8, p.v_pieces = (a.v_cols > 0 ? a.v_cols : kD) / 8;
  p.seqused_k = a.seqused_k;
  p.leftpad_k = a.leftpad_k;  // (never with block_table: validate)
  p.sink = a.sink, p.sink_group = a.sink_group, p.sink_mask = a.sink_mask;
  p.block_table = a.block_table, p.table_stride = a.table_stride;
  while (a.block_table != nullptr && (1 << p.page_shift) < a.page_size) ++p.page_shift;
  p.seqlen_q = a.seqlen_q, p.seqlen_k = a.seqlen_k, p.heads_q = a.heads_q, p.heads_kv = a.heads_kv;
  p.group = a.heads_q / a.heads_kv;
  p.window_left = a.window_left, p.window_right = a.window_right;
  p.scale_log2 = a.scale_log2;
  const int64_t pairs = int64_t(a.batch) * a.heads_kv;
  if (pairs > INT32_MAX)
    return {StatusCode::kNotSupported, "batch * heads_kv = " + std::to_string(pairs) + ": at most 2^31 - 1"};
  const sm90::DecodePlan plan = sm90::decode_plan(pairs, a.seqlen_k, int64_t(sms) * kCtasPerSm<kD>);
  p.splits = plan.splits, p.chunk = plan.chunk;
  // The splits' O and LSE (stream-ordered scratch); where none can be had, one split a pair.
  LaunchScratch scratch;
  if (p.splits > 1) {
    const size_t rows = size_t(pairs) * p.splits * kRows;
    e = scratch.make(stream, rows * (kD + 1) * sizeof(float), 0);
    if (LaunchScratch::unavailable(e)) {
      p.splits = 1, p.chunk = (a.seqlen_k + kBlockN - 1) / kBlockN * kBlockN;
    } else if (e != cudaSuccess) {
      return decode_failure("scratch for the splits", e);
    } else {
      p.part_o = reinterpret_cast<float*>(scratch.ptr);
      p.part_lse = p.part_o + rows * kD;
    }
  }
  if ((e = allow_dynamic_smem<decode_kernel<kD, kBF16>>(device, kSmemBytes<kD>)) != cudaSuccess)
    return decode_failure("setting the kernel's shared memory", e);
  // As the kernel before it's programmatic dependent: its CTAs start while that one ends (the
  // append's, fa4::append_kv, triggers at its start) and wait for it before their first read.
  e = launch_kernel<true>(decode_kernel<kD, kBF16>, dim3(unsigned(pairs), unsigned(p.splits)), dim3(kThreads),
                           kSmemBytes<kD>, stream, p);
  if (e == cudaSuccess && p.splits > 1)
    e = launch_kernel<true>(decode_combine_kernel<kD, kBF16>, dim3(unsigned(pairs), unsigned(a.seqlen_q * p.group)),
                            dim3(kCombineThreads), 0, stream, p);
  if (e != cudaSuccess) return decode_failure("launch", e);
  return Status::Ok();
}

}  // namespace

Status sm90_forward_decode(const FwdParams& a, cudaStream_t stream) {
  if (!sm90::decode_runs(a)) return {StatusCode::kNotSupported, "the decoding kernel does not run this call"};
  if (a.qk_cols > a.head_dim || a.v_cols > a.head_dim)
    return {StatusCode::kNotSupported, "qk_cols = " + std::to_string(a.qk_cols) + ", v_cols = " +
                                           std::to_string(a.v_cols) + ": the decoding kernel reads at most head_dim = " +
                                           std::to_string(a.head_dim) + " columns"};
  const bool bf16 = a.dtype == DType::kBF16;
  if (a.head_dim == 64) return bf16 ? launch_decode<64, true>(a, stream) : launch_decode<64, false>(a, stream);
  return bf16 ? launch_decode<128, true>(a, stream) : launch_decode<128, false>(a, stream);
}

}  // namespace fa4::detail
