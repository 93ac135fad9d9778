// sm90 forward on a paged KV cache (FwdParams::block_table): its own translation unit and kernels
// (sm90/fwd_configs.cuh, with_paged_config), soft-capped or not, so that the page look-up in the
// loaders costs the other kernels nothing.
#include "sm90/fwd_configs.cuh"
#include "sm90/fwd_launch.cuh"

namespace fa4::detail {

Status sm90_forward_paged(const FwdParams& a, cudaStream_t stream) {
  auto launch = [&]<class Cfg>() { return sm90::launch_forward<Cfg>(a, stream); };
  return a.dtype == DType::kBF16 ? sm90::with_paged_config<true>(a, launch) : sm90::with_paged_config<false>(a, launch);
}

}  // namespace fa4::detail
