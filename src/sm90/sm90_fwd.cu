// Placeholder until the sm90 forward kernel lands: every configuration answers not supported.
#include "common/fwd_params.h"

namespace fa4::detail {

Status sm90_forward(const FwdParams&, cudaStream_t) {
  return {StatusCode::kNotSupported, "sm90 forward kernel not built yet"};
}

}  // namespace fa4::detail
