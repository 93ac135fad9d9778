// sm90 forward of variable-length batches: its own translation unit (its kernels compile beside
// sm90_fwd.cu's), and its own choice of configurations (sm90/fwd_configs.cuh, with_varlen_config).
#include "sm90/fwd_configs.cuh"
#include "sm90/fwd_launch.cuh"

namespace fa4::detail {

Status sm90_forward_varlen(const FwdParams& a, cudaStream_t stream) {
  auto launch = [&]<class Cfg>() { return sm90::launch_forward<Cfg, true>(a, stream); };
  return a.dtype == DType::kBF16 ? sm90::with_varlen_config<true>(a, launch)
                                 : sm90::with_varlen_config<false>(a, launch);
}

}  // namespace fa4::detail
