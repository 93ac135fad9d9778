// sm90 forward: the tile configuration of each head dim and dtype (sm90/fwd_configs.cuh).
#include "sm90/fwd_configs.cuh"
#include "sm90/fwd_launch.cuh"

namespace fa4::detail {

namespace {

template <bool kBF16>
Status dispatch_head_dim(const FwdParams& a, cudaStream_t stream) {
  switch (a.head_dim) {
    case 64:
      switch (sm90::d64_consumers(a)) {
        case 2: return sm90::launch_forward<sm90::D64Config<kBF16, 2>>(a, stream);
        case 4: return sm90::launch_forward<sm90::D64Config<kBF16, 4>>(a, stream);
        default: return sm90::launch_forward<sm90::D64Config<kBF16, 3>>(a, stream);
      }
    case 128: return sm90::launch_forward<sm90::D128Config<kBF16>>(a, stream);
    case 256:
      if (sm90::d256_narrow_blocks(a)) return sm90::launch_forward<sm90::D256Config<64, kBF16>>(a, stream);
      return sm90::launch_forward<sm90::D256Config<80, kBF16>>(a, stream);
    default:
      return {StatusCode::kNotSupported, "head_dim = " + std::to_string(a.head_dim) + " has no sm90 kernel"};
  }
}

}  // namespace

Status sm90_forward(const FwdParams& a, cudaStream_t stream) {
  return a.dtype == DType::kBF16 ? dispatch_head_dim<true>(a, stream) : dispatch_head_dim<false>(a, stream);
}

}  // namespace fa4::detail
