// sm90 backward: the shipped configuration of each head dim and dtype (the launch sequence:
// bwd_launch.cuh).
#include <string>

#include "sm90/bwd_launch.cuh"

namespace fa4::detail {

namespace {

// The shipped knobs of head dim d, for a variable-length batch or not.
template <int kD, bool kVarlen>
inline constexpr sm90::bwd::BwdKnobs kShippedKnobs = sm90::bwd::bwd_knobs(kD, [](sm90::bwd::BwdKnobs& k) {
  k.varlen = kVarlen;
});

template <bool kBF16, bool kVarlen>
Status dispatch_head_dim(const BwdParams& p, cudaStream_t stream) {
  using sm90::bwd::BwdConfig;
  switch (p.head_dim) {
    case 64: return launch_backward<BwdConfig<64, kBF16, kShippedKnobs<64, kVarlen>>>(p, stream);
    case 128: return launch_backward<BwdConfig<128, kBF16, kShippedKnobs<128, kVarlen>>>(p, stream);
    case 256: return launch_backward<BwdConfig<256, kBF16, kShippedKnobs<256, kVarlen>>>(p, stream);
    default:
      return {StatusCode::kNotSupported, "head_dim = " + std::to_string(p.head_dim) + " has no sm90 backward kernel"};
  }
}

}  // namespace

// Grid dimensions y and z hold heads and batch.
inline constexpr int kMaxGridYZ = 65535;

Status sm90_backward(const BwdParams& p, cudaStream_t stream) {
  if (p.batch > kMaxGridYZ || p.heads_q > kMaxGridYZ)
    return {StatusCode::kNotSupported, "batch = " + std::to_string(p.batch) + ", heads_q = " +
                                           std::to_string(p.heads_q) + ": the sm90 backward takes at most " +
                                           std::to_string(kMaxGridYZ) + " of each"};
  if (p.varlen())
    return p.dtype == DType::kBF16 ? dispatch_head_dim<true, true>(p, stream) : dispatch_head_dim<false, true>(p, stream);
  return p.dtype == DType::kBF16 ? dispatch_head_dim<true, false>(p, stream) : dispatch_head_dim<false, false>(p, stream);
}

}  // namespace fa4::detail
