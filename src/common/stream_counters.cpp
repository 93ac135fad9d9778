#include "common/stream_counters.h"

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>

#include "common/per_device.h"

namespace fa4::detail {

int* stream_counters(int device, cudaStream_t s) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(s, &capture) != cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  if (capture != cudaStreamCaptureStatusNone) return nullptr;
  unsigned long long id = 0;  // unique for the life of the program, the default streams' too
  if (cudaStreamGetId(s, &id) != cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  // The per-thread default stream is told apart by thread too (its handle is every thread's).
  const size_t thread = s == cudaStreamPerThread ? std::hash<std::thread::id>{}(std::this_thread::get_id()) : 0;
  // And by context: a device reset frees the memory the context before it held, whatever the
  // stream's id says.
  const unsigned long long context = current_context_id();
  static std::mutex mutex;
  static std::map<std::tuple<int, unsigned long long, unsigned long long, size_t>, int*> counters;  // for the process
  const std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_tuple(device, context, id, thread);
  if (const auto it = counters.find(key); it != counters.end()) return it->second;
  if (counters.size() >= size_t(kMaxStreamCounters)) return nullptr;
  int* p = nullptr;
  if (cudaMalloc(reinterpret_cast<void**>(&p), kStreamCounterInts * sizeof(int)) != cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  if (cudaMemsetAsync(p, 0, kStreamCounterInts * sizeof(int), s) != cudaSuccess) {
    cudaGetLastError();
    cudaFree(p);
    return nullptr;
  }
  counters.emplace(key, p);
  return p;
}

}  // namespace fa4::detail
