// sm90 forward with soft-capped scores (Problem::softcap): its own translation unit, with_softcap_config's
// configurations (sm90/fwd_configs.cuh) on single CTAs, batched (with a stream-K tail where it pays)
// or variable-length (whole tiles: the same configurations, launched with kVarlen).
#include "sm90/fwd_configs.cuh"
#include "sm90/fwd_launch.cuh"

namespace fa4::detail {

namespace {

template <bool kVarlen>
Status launch_softcap(const FwdParams& a, cudaStream_t stream) {
  auto launch = [&]<class Cfg>() { return sm90::launch_forward<Cfg, kVarlen>(a, stream); };
  return a.dtype == DType::kBF16 ? sm90::with_softcap_config<true>(a, launch)
                                 : sm90::with_softcap_config<false>(a, launch);
}

}  // namespace

Status sm90_forward_softcap(const FwdParams& a, cudaStream_t stream) {
  return a.varlen() ? launch_softcap<true>(a, stream) : launch_softcap<false>(a, stream);
}

}  // namespace fa4::detail
