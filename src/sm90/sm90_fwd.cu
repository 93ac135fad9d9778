// sm90 forward: the tile configuration of each head dim and dtype (sm90/fwd_configs.cuh).
#include "sm90/decode_plan.h"
#include "sm90/fwd_configs.cuh"
#include "sm90/fwd_launch.cuh"

namespace fa4::detail {

Status sm90_forward(const FwdParams& given, cudaStream_t stream) {
  FwdParams a = given;
  {  // a decoding call on the decoding kernel, its rows unfolded (sm90/decode_plan.h)
    FwdParams rows = a;
    if (rows.fold > 0) sm90::unfold_query_rows(&rows);
    int device = 0;
    if (sm90::decode_runs(rows) && cudaGetDevice(&device) == cudaSuccess &&
        sm90::decode_taken(rows, multiprocessors(device)))
      return sm90_forward_decode(rows, stream);
  }
  if (a.fold > 0) {  // unfolded where the fold does not pay (sm90::fold_pays)
    int device = 0;
    if (cudaGetDevice(&device) == cudaSuccess && !sm90::fold_pays(a, multiprocessors(device)))
      sm90::unfold_query_rows(&a);
  }
  return sm90_forward_rows(a, stream);
}

Status sm90_forward_rows(const FwdParams& a, cudaStream_t stream) {
  if (a.block_table != nullptr) return sm90_forward_paged(a, stream);
  if (a.softcap > 0.0f) return sm90_forward_softcap(a, stream);
  if (a.varlen()) return sm90_forward_varlen(a, stream);
  auto launch = [&]<class Cfg>() { return sm90::launch_forward<Cfg>(a, stream); };
  return a.dtype == DType::kBF16 ? sm90::with_shipped_config<true>(a, launch)
                                 : sm90::with_shipped_config<false>(a, launch);
}

}  // namespace fa4::detail
