// sm90 forward: the tile configuration of each head dim and dtype.
#include "sm90/fwd_launch.cuh"
#include "sm90_fwd_d256_schedule.h"

namespace fa4::detail {

namespace {

using sm90::FwdConfig;

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
    // d256 stages O in each tile's last K/V slots (no other shared memory is left for it); its K/V
    // ring depth is the solver's (scheduler/generated/sm90_fwd_d256_schedule.h).
    // Under a causal or window bound short key ranges take 64-key blocks (d256_narrow_blocks).
    case 256:
      if (sm90::d256_narrow_blocks(a))
        return sm90::launch_forward<
            FwdConfig<256, 64, sched::sm90_fwd_d256::kKVStages, kBF16, 0, 2, true, true, false, false, false, true>>(a, stream);
      return sm90::launch_forward<
          FwdConfig<256, 80, sched::sm90_fwd_d256::kKVStages, kBF16, 0, 2, true, true, false, false, false, true>>(a, stream);
    default:
      return {StatusCode::kNotSupported, "head_dim = " + std::to_string(a.head_dim) + " has no sm90 kernel"};
  }
}

}  // namespace

Status sm90_forward(const FwdParams& a, cudaStream_t stream) {
  return a.dtype == DType::kBF16 ? dispatch_head_dim<true>(a, stream) : dispatch_head_dim<false>(a, stream);
}

}  // namespace fa4::detail
