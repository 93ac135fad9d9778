// sm90 forward: the tile configuration of each head dim and dtype.
#include "sm90/fwd_launch.cuh"
#include "sm90_fwd_d256_schedule.h"

namespace fa4::detail {

namespace {

using sm90::FwdConfig;

// d256's configuration for a key-block width: O staged in each tile's last K/V slots (no other
// shared memory is left for it), the K/V ring depth the solver's
// (scheduler/generated/sm90_fwd_d256_schedule.h).
template <int kBlockN, bool kBF16>
using D256Config =
    FwdConfig<256, kBlockN, sched::sm90_fwd_d256::kKVStages, kBF16, 0, 2, true, true, false, false, false, true>;

// (kBlockN, stages, software-exp2 share, consumers) per head dim. d64 is exp-bound: three
// consumers so that two softmaxes hide under one GEMM, and a deep ring; d256 keeps O (128 fp32
// registers a thread) beside a narrow S.
template <bool kBF16>
Status dispatch_head_dim(const FwdParams& a, cudaStream_t stream) {
  switch (a.head_dim) {
    case 64:
      if (sm90::d64_two_consumers(a)) return sm90::launch_forward<FwdConfig<64, 128, 4, kBF16, 0, 2>>(a, stream);
      return sm90::launch_forward<FwdConfig<64, 128, 4, kBF16, 0, 3>>(a, stream);
    // The K/V ring depth of d128 is the solver's (scheduler/generated/sm90_fwd_schedule.h).
    case 128: return sm90::launch_forward<FwdConfig<128, 128, sched::sm90_fwd::kKVStages, kBF16, 0>>(a, stream);
    // d256 on 80-key blocks; under a causal or window bound, short key ranges on 64-key ones
    // (d256_narrow_blocks).
    case 256:
      if (sm90::d256_narrow_blocks(a)) return sm90::launch_forward<D256Config<64, kBF16>>(a, stream);
      return sm90::launch_forward<D256Config<80, kBF16>>(a, stream);
    default:
      return {StatusCode::kNotSupported, "head_dim = " + std::to_string(a.head_dim) + " has no sm90 kernel"};
  }
}

}  // namespace

Status sm90_forward(const FwdParams& a, cudaStream_t stream) {
  return a.dtype == DType::kBF16 ? dispatch_head_dim<true>(a, stream) : dispatch_head_dim<false>(a, stream);
}

}  // namespace fa4::detail
