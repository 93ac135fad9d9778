// sm90 backward with soft-capped scores (Problem::softcap): its own translation unit, the shipped
// knobs of each head dim with BwdKnobs::softcap, batched or variable-length.
#include "sm90/bwd_launch.cuh"

namespace fa4::detail {

Status sm90_backward_softcap(const BwdParams& p, cudaStream_t stream) {
  if (p.varlen())
    return p.dtype == DType::kBF16 ? launch_shipped_backward<true, true, true>(p, stream)
                                   : launch_shipped_backward<false, true, true>(p, stream);
  return p.dtype == DType::kBF16 ? launch_shipped_backward<true, false, true>(p, stream)
                                 : launch_shipped_backward<false, false, true>(p, stream);
}

}  // namespace fa4::detail
