// Host-side values found once a device, and the shared-memory attribute set that way.
#pragma once

#include <atomic>

#include <cuda_runtime_api.h>

namespace fa4::detail {

// A value found once a device: kept for devices 0..63 once `make` has given a nonzero one
// (zero, a failure, is asked again next time; devices past 63 always ask).
struct PerDevice {
  std::atomic<int> value[64]{};
  template <class Make>
  int get(int device, Make make) {
    if (device < 0 || device >= 64) return make();
    int v = value[device].load();
    if (v == 0) value[device].store(v = make());
    return v;
  }
};

// Lets kKernel use `bytes` of dynamic shared memory on `device`. The attribute belongs to the
// device's context, so it is set once a device, not once a process (a second GPU would otherwise
// refuse the launch) and not once a call.
template <auto kKernel>
cudaError_t allow_dynamic_smem(int device, int bytes) {
  static PerDevice set;
  cudaError_t e = cudaSuccess;
  set.get(device, [&] {
    e = cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    if (e != cudaSuccess) cudaGetLastError();  // not sticky: the caller reports it
    return e == cudaSuccess ? 1 : 0;
  });
  return e;
}

}  // namespace fa4::detail
