// The copies of a call at a head dim without a kernel (pad.h), and its run.
#include "common/pad.h"

#include <algorithm>
#include <cstdint>
#include <string>

#include "common/launch.cuh"
#include "common/validate.h"

namespace fa4::detail {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 4096;

// A padded row is 2^vec_shift 16-byte units (the kernel head dim's 64, 128 or 256 elements of 1 or
// 2 bytes), the caller's its first `live` units. Unit i of the copy is unit i & (2^vec_shift - 1)
// of row i >> vec_shift, row r being (r / (n1 * n2), r / n2 % n1, r % n2) of the caller's tensor.
// In: every unit of the copy, zero past `live` (rows outside [seq_begin[b], seq_end[b]) where
// those are set: left as they were); out: the live units back. Index: uint32_t where the copy's
// units fit it (fewer divisions' instructions), else int64_t.
template <bool kIn, class Index>
__global__ void copy_units(uint4* padded, char* user, int64_t batch_stride, int64_t seq_stride, int64_t head_stride,
                           Index n1, Index n2, Index units, int vec_shift, int live, const int32_t* seq_begin,
                           const int32_t* seq_end) {
  const Index mask = (Index{1} << vec_shift) - 1;
  for (Index i = Index(blockIdx.x) * kThreads + threadIdx.x; i < units; i += Index(gridDim.x) * kThreads) {
    const int u = int(i & mask);
    if (!kIn && u >= live) continue;
    const Index r = i >> vec_shift, h = r % n2, t = r / n2, s = t % n1, b = t / n1;
    if (kIn && ((seq_end != nullptr && int64_t(s) >= int64_t(__ldg(seq_end + b))) ||
                (seq_begin != nullptr && int64_t(s) < int64_t(__ldg(seq_begin + b)))))
      continue;
    uint4* at = reinterpret_cast<uint4*>(user + int64_t(b) * batch_stride + int64_t(s) * seq_stride +
                                         int64_t(h) * head_stride) +
                u;
    if constexpr (kIn)
      padded[i] = u < live ? *at : make_uint4(0, 0, 0, 0);
    else
      *at = padded[i];
  }
}

template <bool kIn>
cudaError_t copy(const PadCopy& c, int64_t padded_dim, cudaStream_t stream) {
  const int64_t rows = c.rows[0] * c.rows[1] * c.rows[2];  // (the plan checked the bytes' product)
  if (rows <= 0) return cudaSuccess;
  const int64_t row_units = padded_dim * c.elem_size / 16;
  int vec_shift = 0;
  while ((int64_t{1} << vec_shift) < row_units) ++vec_shift;
  const int live = int(c.cols * c.elem_size / 16);
  const int64_t units = rows << vec_shift;
  const unsigned blocks = unsigned(std::min((units + kThreads - 1) / kThreads, kMaxBlocks));
  const int64_t bs = c.user.batch_stride * c.elem_size, ss = c.user.seq_stride * c.elem_size,
                hs = c.user.head_stride * c.elem_size;
  auto* padded = static_cast<uint4*>(c.padded);
  auto* user = static_cast<char*>(c.user.data);
  // (units + the last grid stride must not wrap a uint32_t index)
  if (units + int64_t{kMaxBlocks} * kThreads <= int64_t{UINT32_MAX})
    copy_units<kIn, uint32_t><<<blocks, kThreads, 0, stream>>>(padded, user, bs, ss, hs, uint32_t(c.rows[1]),
                                                              uint32_t(c.rows[2]), uint32_t(units), vec_shift, live,
                                                              c.seq_begin, c.seq_end);
  else
    copy_units<kIn, int64_t><<<blocks, kThreads, 0, stream>>>(padded, user, bs, ss, hs, c.rows[1], c.rows[2], units,
                                                             vec_shift, live, c.seq_begin, c.seq_end);
  return cudaGetLastError();
}

Status cuda_failure(const std::string& what, cudaError_t e) {
  return {StatusCode::kCudaError, what + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")"};
}

template <class Args>
Status run_padded(const Args& args, int64_t offset, cudaStream_t stream,
                  PaddedCall<Args> (*plan)(const Args&, void*), Status (*run)(const Args&, cudaStream_t)) {
  const PaddedCall<Args> sized = plan(args, nullptr);
  const int64_t padded_dim = sized.args.problem.head_dim, bytes = sized.bytes;
  const std::string at = "head_dim = " + std::to_string(args.problem.head_dim) +
                         (args.problem.head_dim_v > 0 ? ", head_dim_v = " + std::to_string(args.problem.head_dim_v) : "") +
                         " on the kernels of " + std::to_string(padded_dim) + ": ";
  if (bytes < 0 || offset < 0 || bytes > INT64_MAX - offset)
    return {StatusCode::kInvalidArgument, at + "the zero-padded copies' byte count must fit in int64"};
  LaunchScratch scratch;
  uint8_t* base = static_cast<uint8_t*>(args.workspace);
  if (base != nullptr && reinterpret_cast<uintptr_t>(base) % kAlignmentBytes == 0 &&
      args.workspace_bytes >= uint64_t(offset + bytes)) {
    base += offset;
  } else {
    if (const cudaError_t e = scratch.make(stream, size_t(bytes), 0); e != cudaSuccess)
      return cuda_failure(at + "allocating the zero-padded copies (" + std::to_string(bytes) + " bytes)", e);
    base = scratch.ptr;
  }
  const PaddedCall<Args> call = plan(args, base);
  for (int i = 0; i < call.count; ++i)
    if (const PadCopy& c = call.copies[i]; c.in)
      if (const cudaError_t e = copy<true>(c, padded_dim, stream); e != cudaSuccess)
        return cuda_failure(at + "copying " + c.name + " in", e);
  if (Status s = run(call.args, stream); !s.ok()) return s;
  for (int i = 0; i < call.count; ++i)
    if (const PadCopy& c = call.copies[i]; c.out)
      if (const cudaError_t e = copy<false>(c, padded_dim, stream); e != cudaSuccess)
        return cuda_failure(at + "copying " + c.name + " out", e);
  return Status::Ok();
}

}  // namespace

Status forward_padded(const ForwardArgs& args, cudaStream_t stream, Status (*run)(const ForwardArgs&, cudaStream_t)) {
  return run_padded(args, 0, stream, &pad_forward, run);
}

Status backward_padded(const BackwardArgs& args, cudaStream_t stream,
                       Status (*run)(const BackwardArgs&, cudaStream_t)) {
  return run_padded(args, backward_pad_offset(args.problem), stream, &pad_backward, run);
}

}  // namespace fa4::detail
