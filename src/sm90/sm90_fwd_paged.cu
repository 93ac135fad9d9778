// sm90 forward on a paged KV cache (FwdParams::block_table): its own translation unit and kernels
// (sm90/fwd_configs.cuh, with_paged_config), soft-capped or not, so that the page look-up in the
// loaders costs the other kernels nothing.
#include "sm90/fwd_configs.cuh"
#include "sm90/fwd_launch.cuh"

namespace fa4::detail {

namespace {

template <bool kVarlen, bool kLanes>
Status launch_paged(const FwdParams& a, cudaStream_t stream) {
  auto launch = [&]<class Cfg>() { return sm90::launch_forward<Cfg, kVarlen>(a, stream); };
  return a.dtype == DType::kBF16 ? sm90::with_paged_config<true, kLanes>(a, launch)
                                 : sm90::with_paged_config<false, kLanes>(a, launch);
}

}  // namespace

// Batched queries, or packed ones (cu_seqlens_q: the varlen kernels of the same configurations,
// with page lanes). Batched, pages of 128 rows or more (a key block on one page at every head dim)
// load in the loaders; smaller ones through page lanes (fwd_kernel.cuh, PagedLoads), whose
// hand-over's latency cost d128's decoding on pages of 256 rows 13 % (docs/perf-notes.md, "Pages
// smaller than a key block").
Status sm90_forward_paged(const FwdParams& a, cudaStream_t stream) {
  if (a.varlen()) return launch_paged<true, true>(a, stream);
  return a.page_size >= 128 ? launch_paged<false, false>(a, stream) : launch_paged<false, true>(a, stream);
}

}  // namespace fa4::detail
