// A kernel launch after the one before it in the stream, or as its programmatic dependent.
#pragma once

#include <cstdint>
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

// Launch-private device memory whose first `zeroed` bytes are zero at the kernel's start (the
// forward's stream-K partials, and its counters where the stream has none of its own; the dynamic
// grid's tile counter in graph capture, where no stream has: detail::stream_counters; the decoding
// kernel's splits; the fp8 forward's V^T): stream-ordered allocation, so concurrent launches on
// other streams and graph capture each get their own, freed in stream order after the kernels.
struct LaunchScratch {
  uint8_t* ptr = nullptr;
  cudaStream_t stream{};
  cudaError_t make(cudaStream_t s, size_t bytes, size_t zeroed) {
    stream = s;
    cudaError_t e = cudaMallocAsync(reinterpret_cast<void**>(&ptr), bytes, s);
    if (e != cudaSuccess) {
      ptr = nullptr;
      return e;
    }
    return zeroed > 0 ? cudaMemsetAsync(ptr, 0, zeroed, s) : cudaSuccess;
  }
  // Whether make()'s error means only that no scratch can be had here (memory pools unsupported,
  // or the pool full), so the launch goes on without it; clears the error when it does.
  static bool unavailable(cudaError_t e) {
    if (e != cudaErrorNotSupported && e != cudaErrorMemoryAllocation) return false;
    cudaGetLastError();
    return true;
  }
  ~LaunchScratch() {
    if (ptr != nullptr) cudaFreeAsync(ptr, stream);  // after the kernel, in stream order
  }
};

}  // namespace fa4::detail
