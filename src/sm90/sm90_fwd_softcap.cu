// sm90 forward with soft-capped scores (Problem::softcap): its own translation unit, with_softcap_config's
// configurations (sm90/fwd_configs.cuh) on single CTAs, batched (with a stream-K tail where it pays)
// or variable-length (whole tiles: the same configurations, launched with kVarlen).
#include "sm90/fwd_configs.cuh"
#include "sm90/fwd_launch.cuh"

namespace fa4::detail {

Status sm90_forward_softcap(const FwdParams& a, cudaStream_t stream) {
  if (a.varlen()) {
    auto launch = [&]<class Cfg>() { return sm90::launch_forward<Cfg, true>(a, stream); };
    return a.dtype == DType::kBF16 ? sm90::with_softcap_config<true>(a, launch)
                                   : sm90::with_softcap_config<false>(a, launch);
  }
  auto launch = [&]<class Cfg>() { return sm90::launch_forward<Cfg>(a, stream); };
  return a.dtype == DType::kBF16 ? sm90::with_softcap_config<true>(a, launch)
                                 : sm90::with_softcap_config<false>(a, launch);
}

}  // namespace fa4::detail
