// sm90 backward with soft-capped scores (Problem::softcap): its own translation unit, the shipped
// knobs of each head dim with BwdKnobs::softcap, batched or variable-length.
#include "sm90/bwd_launch.cuh"

namespace fa4::detail {

Status sm90_backward_softcap(const BwdParams& p, cudaStream_t stream) {
  return launch_shipped_backward<true>(p, stream);
}

}  // namespace fa4::detail
