// The forward kernels with a test's hook (sm90/fwd_kernel.cuh, test_lags):
// - kIdleWarpLag: warps 1-3 of an idle consumer start their walk that many cycles after warp 0, so
//   they reach their wait for the tile's first K after thread 0 has freed that slot and the loader
//   has refilled it (ForwardGpu.IdleConsumersWarpsLate*);
// - kTileWarpLag: one warp of every consumer, another each tile, is held that many cycles once its
//   Q has landed, and each loader thread as it takes every third tile (ForwardGpu.WarpsSkewedEveryTile);
// - kStepWarpLag: warp 1 or 2 of each consumer held that many cycles between its turn and its GEMM
//   issue in every steady step (ForwardGpu.WarpLateToTheStepsIssue).
// And the backward's (sm90/bwd_kernel.cuh, step_warp_lag): kStepWarpLag holds warps and warpgroups
// of the d64/d128 dK/dV kernel apart by more than a step (BackwardGpu.WarpsSkewed).
// What they test is the protocol (waits, turns, frees), not the schedule: the spin loops move
// ptxas's choices (the d128 ones have some wgmma serialized, C7519; the d64 ones spill 4-8 bytes).
#include "lagged_kernels.h"

#include "sm90/bwd_launch.cuh"
#include "sm90/fwd_configs.cuh"
#include "sm90/fwd_launch.cuh"

namespace fa4::test {

namespace {
// As shipped (sm90/fwd_configs.cuh), bf16.
using D64 = sm90::D64Config<true, 3>;
using D64Four = sm90::D64Config<true, 4>;
using D128 = sm90::D128Config<true>;
using D256Serial = sm90::D256SerialConfig<true>;
template <class Base>
struct IdleWarpsLate : Base {
  static constexpr long long kIdleWarpLag = 40000;  // ~20 us at 2 GHz; a K block lands in ~1-2 us
};
template <class Base>
struct TileWarpLate : Base {
  static constexpr long long kTileWarpLag = 6000;  // ~3 us: a few K/V blocks' time
};
template <class Base>
struct StepWarpLate : Base {
  static constexpr long long kStepWarpLag = 20000;  // ~10 us: a K slot refilled meanwhile
};
template <class Base>
struct BwdStepWarpLate : Base {
  static constexpr long long kStepWarpLag = 6000;  // ~3 us: more than a d128 step
};
}  // namespace

Status backward_warps_skewed(const detail::BwdParams& p, cudaStream_t stream) {
  if (p.dtype != DType::kBF16 || (p.head_dim != 64 && p.head_dim != 128))
    return {StatusCode::kNotSupported, "backward_warps_skewed: bf16 at head_dim 64 or 128"};
  return p.head_dim == 64 ? detail::launch_backward<BwdStepWarpLate<sm90::bwd::BwdConfig<64, true>>>(p, stream)
                          : detail::launch_backward<BwdStepWarpLate<sm90::bwd::BwdConfig<128, true>>>(p, stream);
}

Status forward_step_warp_late(const detail::FwdParams& p, cudaStream_t stream) {
  return sm90::launch_forward<StepWarpLate<D128>>(p, stream);
}

Status forward_idle_warps_late(const detail::FwdParams& p, cudaStream_t stream) {
  return sm90::launch_forward<IdleWarpsLate<D64>>(p, stream);
}

Status forward_idle_warps_late_four(const detail::FwdParams& p, cudaStream_t stream) {
  return sm90::launch_forward<IdleWarpsLate<D64Four>>(p, stream);
}

Status forward_idle_warps_late_d128(const detail::FwdParams& p, cudaStream_t stream) {
  return sm90::launch_forward<IdleWarpsLate<D128>>(p, stream);
}

Status forward_idle_warps_late_d256_serial(const detail::FwdParams& p, cudaStream_t stream) {
  return sm90::launch_forward<IdleWarpsLate<D256Serial>>(p, stream);
}

Status forward_tile_warp_late(const detail::FwdParams& p, cudaStream_t stream) {
  return sm90::with_shipped_config<true>(
      p, [&]<class Cfg>() { return sm90::launch_forward<TileWarpLate<Cfg>>(p, stream); });
}

}  // namespace fa4::test
