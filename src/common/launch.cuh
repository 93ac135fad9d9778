// A kernel launch after the one before it in the stream, or as its programmatic dependent.
#pragma once

#include <utility>

#include <cuda_runtime_api.h>

namespace fa4::detail {

// `kernel` on `grid`, after the kernel before it in the stream, or with kDependent as that
// kernel's programmatic dependent: its CTAs may then start once every CTA of that kernel has
// triggered (cudaTriggerProgrammaticLaunchCompletion) or ended, and must wait for it themselves
// (cudaGridDependencySynchronize) before they read what it wrote.
template <bool kDependent, class... Params, class... Args>
cudaError_t launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, int smem, cudaStream_t stream,
                          Args&&... args) {
  if constexpr (kDependent) {
    cudaLaunchAttribute attr{};
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = size_t(smem);
    cfg.stream = stream;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
  } else {
    kernel<<<grid, block, size_t(smem), stream>>>(std::forward<Args>(args)...);
    return cudaGetLastError();
  }
}

}  // namespace fa4::detail
