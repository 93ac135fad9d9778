// Host-side values found once a device, and the shared-memory attribute set that way.
#pragma once

#include <mutex>

#include <cuda_runtime_api.h>

namespace fa4::detail {

// The unique id (cuCtxGetId) of the calling thread's current CUDA context; 0 where none is current
// or the driver cannot say. A device reset (cudaDeviceReset) or a context the caller made itself
// has a new id: what PerDevice keeps and the stream counters (stream_counters.h) belong to the
// context they were made in.
unsigned long long current_context_id();

// A value found once a device and context: kept for devices 0..63 once `make` has given a nonzero
// one in the current context (zero, a failure, is asked again next time; devices past 63 always
// ask). A context's function attributes and memory are its own, so another context (a device
// reset's, or the caller's own) asks again.
// A value and the context it was made in change together, under one lock: two atomics read apart
// could pair one context's value with another's id when threads in two contexts share a device.
struct PerDevice {
  std::mutex mutex;
  int value[64]{};
  unsigned long long context[64]{};
  template <class Make>
  int get(int device, Make make) {
    if (device < 0 || device >= 64) return make();
    const unsigned long long ctx = current_context_id();
    const std::lock_guard<std::mutex> lock(mutex);
    if (value[device] == 0 || context[device] != ctx) {
      value[device] = make();
      context[device] = ctx;
    }
    return value[device];
  }
};

// The device's multiprocessor count, asked once a device; 0 where the query fails.
inline int multiprocessors(int device) {
  static PerDevice count;
  return count.get(device, [device] {
    int n = 0;
    if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
      cudaGetLastError();
      return 0;
    }
    return n;
  });
}

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
