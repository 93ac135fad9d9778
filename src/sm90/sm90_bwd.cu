// sm90 backward: the shipped configuration of each head dim and dtype (the launch sequence:
// bwd_launch.cuh).
#include "sm90/bwd_launch.cuh"

namespace fa4::detail {

// Grid dimensions y and z hold heads and batch.
inline constexpr int kMaxGridYZ = 65535;

Status sm90_backward(const BwdParams& p, cudaStream_t stream) {
  if (p.batch > kMaxGridYZ || p.heads_q > kMaxGridYZ)
    return {StatusCode::kNotSupported, "batch = " + std::to_string(p.batch) + ", heads_q = " +
                                           std::to_string(p.heads_q) + ": the sm90 backward takes at most " +
                                           std::to_string(kMaxGridYZ) + " of each"};
  if (p.softcap > 0.0f) return sm90_backward_softcap(p, stream);
  return launch_shipped_backward<false>(p, stream);
}

}  // namespace fa4::detail
