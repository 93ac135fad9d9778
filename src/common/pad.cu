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

// One unit of a copy. In: zero past the caller's columns (rows outside [seq_begin[b],
// seq_end[b]) where those are set: left as they were); out: the live units back.
template <bool kIn, class Index, class Load>
__device__ __forceinline__ void copy_unit(const PadUnits<Index>& map, uint4* padded, char* user, Index i, Load load) {
  const auto x = map.at(i, load);
  if (!kIn && !x.live) return;
  uint4* at = reinterpret_cast<uint4*>(user + x.user);
  if constexpr (kIn) {
    if (!map.row_copied(x, load)) return;
    padded[i] = x.live ? *at : make_uint4(0, 0, 0, 0);
  } else {
    *at = padded[i];
  }
}

// Every copy of a set in one grid-stride walk over their units (copy_of finds each unit's copy;
// the set, a __grid_constant__ parameter, is read where it lies), and with the copies in, a
// gathered pool's table.
template <bool kIn, class Index>
__global__ void copy_set(const __grid_constant__ CopySet<Index> set) {
  const auto load = [](const int32_t* e) { return __ldg(e); };
  const Index total = set.end[set.count - 1], stride = Index(gridDim.x) * kThreads;
  for (Index i = Index(blockIdx.x) * kThreads + threadIdx.x; i < total; i += stride) {
    Index local = 0;
    const int j = copy_of(set, i, &local);
    copy_unit<kIn>(set.map[j], static_cast<uint4*>(set.padded[j]), static_cast<char*>(set.user[j]), local, load);
  }
  if constexpr (kIn)
    for (Index n = Index(blockIdx.x) * kThreads + threadIdx.x; n < set.table_entries; n += stride)
      set.table[n] = int32_t(n);
}

// The copies of `call` in one direction, one launch, with 32-bit indices where the set's units
// (and a last grid stride past them) fit.
template <bool kIn, class Args>
cudaError_t copy_all(const PaddedCall<Args>& call, int64_t padded_dim, cudaStream_t stream) {
  int64_t work = 0;
  const auto narrow = copy_set_of<uint32_t>(call, kIn, padded_dim, &work);
  if (work == 0) return cudaSuccess;
  const unsigned blocks = unsigned(std::min((work + kThreads - 1) / kThreads, kMaxBlocks));
  if (work + int64_t{kMaxBlocks} * kThreads <= int64_t{UINT32_MAX})
    copy_set<kIn, uint32_t><<<blocks, kThreads, 0, stream>>>(narrow);
  else
    copy_set<kIn, int64_t><<<blocks, kThreads, 0, stream>>>(copy_set_of<int64_t>(call, kIn, padded_dim, &work));
  return cudaGetLastError();
}

template <class Args, class Run>
Status run_padded(const Args& args, int64_t offset, cudaStream_t stream,
                  PaddedCall<Args> (*plan)(const Args&, void*), Run run) {
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
  if (const cudaError_t e = copy_all<true>(call, padded_dim, stream); e != cudaSuccess)
    return cuda_failure(at + "copying q, k, v in", e);
  if (Status s = run(call, stream); !s.ok()) return s;
  if (const cudaError_t e = copy_all<false>(call, padded_dim, stream); e != cudaSuccess)
    return cuda_failure(at + "copying the outputs back", e);
  return Status::Ok();
}

}  // namespace

Status forward_padded(const ForwardArgs& args, cudaStream_t stream,
                      Status (*run)(const ForwardArgs&, int qk_cols, int v_cols, cudaStream_t)) {
  return run_padded(args, 0, stream, &pad_forward, [&](const PaddedCall<ForwardArgs>& call, cudaStream_t s) {
    return run(call.args, int(call.qk_cols), int(call.v_cols), s);
  });
}

Status backward_padded(const BackwardArgs& args, cudaStream_t stream,
                       Status (*run)(const BackwardArgs&, int qk_cols, int v_cols, cudaStream_t)) {
  // (The backward copies nothing: pad_backward, its kernels' arguments and the caller's columns.)
  const PaddedCall<BackwardArgs> call = pad_backward(args, nullptr);
  return run(call.args, int(call.qk_cols), int(call.v_cols), stream);
}

}  // namespace fa4::detail
