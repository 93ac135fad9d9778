#pragma once
// Kernels built for the tests alone (tests/lagged_kernels.cu).
#include <cuda_runtime.h>

#include "common/bwd_params.h"
#include "common/fwd_params.h"

namespace fa4::test {

// The bf16 d64 forward on three consumers (192-row tiles) whose idle consumers' warps 1-3 start
// their walk ~20 us late.
Status forward_idle_warps_late(const detail::FwdParams& p, cudaStream_t stream);
// The same on four consumers (256-row tiles, 64-key blocks, eight K/V stages).
Status forward_idle_warps_late_four(const detail::FwdParams& p, cudaStream_t stream);
// The same at bf16 d128 on two consumers (128-row tiles, two K/V stages).
Status forward_idle_warps_late_d128(const detail::FwdParams& p, cudaStream_t stream);
// The same at bf16 d256 on 128-key blocks with the serial step (one K and one V slot).
Status forward_idle_warps_late_d256_serial(const detail::FwdParams& p, cudaStream_t stream);
// The bf16 forward at head_dim 64, 128 or 256 (the configuration the shipped dispatch takes) with
// one warp of each consumer held ~3 us every tile, another warp each time.
Status forward_tile_warp_late(const detail::FwdParams& p, cudaStream_t stream);
// bf16 d128 with warp 1 or 2 of each consumer held ~10 us between its turn and its GEMM issue in
// every steady step.
Status forward_step_warp_late(const detail::FwdParams& p, cudaStream_t stream);

// The bf16 backward at head_dim 64 or 128 (the shipped dK/dV configuration) with, in step s of
// each dK/dV CTA, warp s % 4 of warpgroup (s / 4) % 2 held ~3 us before its dS^T stores, warpgroup 1
// held at the top of every fifth step and warpgroup 0 of every seventh.
Status backward_warps_skewed(const detail::BwdParams& p, cudaStream_t stream);

}  // namespace fa4::test
