// sm90 backward: the shipped configuration of each head dim and dtype (the launch sequence:
// bwd_launch.cuh).
#include <string>

#include "sm90/bwd_launch.cuh"

namespace fa4::detail {

namespace {

template <bool kBF16>
Status dispatch_head_dim(const BwdParams& p, cudaStream_t stream) {
  switch (p.head_dim) {
    case 64: return launch_backward<sm90::bwd::BwdConfig<64, kBF16>>(p, stream);
    case 128: return launch_backward<sm90::bwd::BwdConfig<128, kBF16>>(p, stream);
    case 256: return launch_backward<sm90::bwd::BwdConfig<256, kBF16>>(p, stream);
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
  return p.dtype == DType::kBF16 ? dispatch_head_dim<true>(p, stream) : dispatch_head_dim<false>(p, stream);
}

}  // namespace fa4::detail
