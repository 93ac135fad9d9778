// The d64 three-consumer and d128 two-consumer kernels with a test's hook (sm90/fwd_kernel.cuh, idle_warp_lag): warps 1-3
// of an idle consumer start their walk kIdleWarpLag cycles after warp 0, so they reach their wait
// for the tile's first K after thread 0 has freed that slot and the loader has refilled it
// (ForwardGpu.IdleConsumersWarpsLateToTheirFirstBlock).
#include "lagged_kernels.h"

#include "sm90/fwd_launch.cuh"

namespace fa4::test {

namespace {
template <class Base>
struct IdleWarpsLate : Base {
  static constexpr long long kIdleWarpLag = 40000;  // ~20 us at 2 GHz; a K block lands in ~1-2 us
};
}  // namespace

Status forward_idle_warps_late(const detail::FwdParams& p, cudaStream_t stream) {
  return sm90::launch_forward<IdleWarpsLate<sm90::FwdConfig<64, 128, 4, true, 0, 3>>>(p, stream);
}

Status forward_idle_warps_late_d128(const detail::FwdParams& p, cudaStream_t stream) {
  return sm90::launch_forward<IdleWarpsLate<sm90::FwdConfig<128, 128, 2, true, 0>>>(p, stream);
}

}  // namespace fa4::test
