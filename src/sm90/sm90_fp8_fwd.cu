// sm90 fp8 forward: the configurations the library builds, by head dim and exp2 share (the launch:
// sm90/fp8_fwd_launch.cuh).
#include <string>

#include "sm90/fp8_fwd_launch.cuh"

namespace fa4::detail {
namespace {

using namespace fp8;

template <int kD>
Status launch_fp8_share(const FwdParams& a, cudaStream_t stream) {
  const int every = a.exp2_poly_every < 0 ? kShippedPoly<kD> : a.exp2_poly_every;
  // Three consumers at d64 (192-row tiles) with one P buffer (with two P buffers they spilled 64
  // bytes under the 128 registers a thread of a 512-thread launch): shipped where no bound cuts the
  // keys, and asked for by FwdParams::fp8_consumers = 3. H200, in one process against two
  // consumers, bit for bit the same output: +1.5 / +5.9 / +8.8 % at 1k / 4k / 16k non-causal;
  // causal 0.72 / 0.91 / 1.00 x, the 192-row diagonal tiles masking more of their scores
  // (docs/perf-notes.md, "Three fp8 consumers at d64").
  const bool unbounded = a.window_left < 0 && a.window_right < 0;
  const bool shipped_three = kD == 64 && unbounded && a.fp8_consumers == 0 && !a.fp8_defer_pv &&
                             every == kShippedPoly<kD> && a.fp8_raw_max < 0;
  if (a.fp8_consumers == 3 || shipped_three) {
    if constexpr (kD == 64)
      if (every == kShippedPoly<kD> && a.fp8_raw_max < 0)
        return launch_fp8_cfg<Fp8Cfg<kD, kShippedPoly<kD>, kShippedRawMax<kD>, false, 3, true>>(a, stream);
    return {StatusCode::kNotSupported, "fp8_consumers = 3: built at d64 with the shipped exp2 share and row max only"};
  }
  // P V's wait deferred to the next step (Fp8Config::kDeferPv), for measurements.
  if (a.fp8_defer_pv) {
    if (every == kShippedPoly<kD> && a.fp8_raw_max < 0 && a.fp8_consumers == 0)
      return launch_fp8_cfg<Fp8Cfg<kD, kShippedPoly<kD>, kShippedRawMax<kD>, false, 2, false, true>>(a, stream);
    return {StatusCode::kNotSupported, "fp8_defer_pv: built with the shipped exp2 share, row max and consumers only"};
  }
  if (a.fp8_consumers != 0 && a.fp8_consumers != 2)
    return {StatusCode::kNotSupported, "fp8_consumers = " + std::to_string(a.fp8_consumers) + ": 0 (the shipped), 2 or 3"};
  if (a.fp8_raw_max >= 0 && bool(a.fp8_raw_max) != kShippedRawMax<kD>) {  // (the shipped share only)
    if (every == kShippedPoly<kD>) return launch_fp8_cfg<Fp8Cfg<kD, kShippedPoly<kD>, !kShippedRawMax<kD>>>(a, stream);
    return {StatusCode::kNotSupported, "fp8_raw_max: the other form is built for the shipped exp2 share only"};
  }
  switch (every) {
    case 0: return launch_fp8_cfg<Fp8Cfg<kD, 0>>(a, stream);
    case 4: return launch_fp8_cfg<Fp8Cfg<kD, 4>>(a, stream);
    case 8:
      if constexpr (kD != 256) return launch_fp8_cfg<Fp8Cfg<kD, 8>>(a, stream);
      [[fallthrough]];
    default:
      return {StatusCode::kNotSupported, "exp2_poly_every = " + std::to_string(every) + ": built for 0, 4 and 8 (d256: 0, 4)"};
  }
}

}  // namespace

Status sm90_forward_fp8(const FwdParams& a, cudaStream_t stream) {
  if ((a.qk_cols > 0 && a.qk_cols != a.head_dim) || (a.v_cols > 0 && a.v_cols != a.head_dim))
    return {StatusCode::kNotSupported, "qk_cols = " + std::to_string(a.qk_cols) + ", v_cols = " + std::to_string(a.v_cols) +
                                           ": the fp8 kernels take tensors of head_dim = " + std::to_string(a.head_dim) +
                                           " columns (their copies)"};
  switch (a.head_dim) {
    case 64: return launch_fp8_share<64>(a, stream);
    case 128: return launch_fp8_share<128>(a, stream);
    case 256: return launch_fp8_share<256>(a, stream);
    default:
      return {StatusCode::kNotSupported, "head_dim = " + std::to_string(a.head_dim) + " has no sm90 fp8 kernel (64, 128 or 256)"};
  }
}

}  // namespace fa4::detail
