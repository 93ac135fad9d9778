// The copies of a call at a head dim without a kernel (pad.h), and its run.
#include "common/pad.h"

#include <algorithm>
#include <cstdint>
#include <string>

#include "common/launch.cuh"
#include "common/pad_units.h"
#include "common/validate.h"

namespace fa4::detail {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 4096;

// In: every unit of the copy, zero past the caller's columns (rows outside [seq_begin[b],
// seq_end[b]) where those are set: left as they were); out: the live units back.
template <bool kIn, class Index>
__global__ void copy_units(uint4* padded, char* user, PadUnits<Index> map, Index units) {
  const auto load = [](const int32_t* e) { return __ldg(e); };
  for (Index i = Index(blockIdx.x) * kThreads + threadIdx.x; i < units; i += Index(gridDim.x) * kThreads) {
    const auto x = map.at(i, load);
    if (!kIn && !x.live) continue;
    uint4* at = reinterpret_cast<uint4*>(user + x.user);
    if constexpr (kIn) {
      if (!map.row_copied(x, load)) continue;
      padded[i] = x.live ? *at : make_uint4(0, 0, 0, 0);
    } else {
      *at = padded[i];
    }
  }
}

template <bool kIn>
cudaError_t copy(const PadCopy& c, int64_t padded_dim, cudaStream_t stream) {
  const int64_t units = units_in(c, padded_dim);  // (the plan checked the bytes' product)
  if (units <= 0) return cudaSuccess;
  const unsigned blocks = unsigned(std::min((units + kThreads - 1) / kThreads, kMaxBlocks));
  auto* padded = static_cast<uint4*>(c.padded);
  auto* user = static_cast<char*>(c.user.data);
  // (units + the last grid stride must not wrap a uint32_t index)
  if (units + int64_t{kMaxBlocks} * kThreads <= int64_t{UINT32_MAX})
    copy_units<kIn, uint32_t><<<blocks, kThreads, 0, stream>>>(padded, user, units_of<uint32_t>(c, padded_dim),
                                                              uint32_t(units));
  else
    copy_units<kIn, int64_t><<<blocks, kThreads, 0, stream>>>(padded, user, units_of<int64_t>(c, padded_dim), units);
  return cudaGetLastError();
}

// table[n] = n: a gathered paged pool's block table.
__global__ void fill_identity(int32_t* table, int64_t entries) {
  for (int64_t n = blockIdx.x * int64_t{kThreads} + threadIdx.x; n < entries; n += int64_t{gridDim.x} * kThreads)
    table[n] = int32_t(n);
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
  if (call.table_entries > 0) {
    fill_identity<<<unsigned(std::min((call.table_entries + kThreads - 1) / kThreads, kMaxBlocks)), kThreads, 0,
                    stream>>>(call.table, call.table_entries);
    if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess)
      return cuda_failure(at + "writing the gathered pages' table", e);
  }
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
