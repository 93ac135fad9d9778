// What the device attributes that pick the diagonal-last walk say, and what one query of each costs.
#include <chrono>
#include <cstdio>
#include <cuda_runtime.h>
static double us_per_call(cudaDeviceAttr a) {
  int v = 0;
  cudaDeviceGetAttribute(&v, a, 0);
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 200; ++i) cudaDeviceGetAttribute(&v, a, 0);
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / 200;
}
int main() {
  int khz = 0, bits = 0, sms = 0;
  cudaDeviceGetAttribute(&khz, cudaDevAttrMemoryClockRate, 0);
  cudaDeviceGetAttribute(&bits, cudaDevAttrGlobalMemoryBusWidth, 0);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  std::printf("memory clock %d kHz, bus %d bits, %d SMs: %lld GB/s by clock and width\n", khz, bits, sms,
              (long long)khz * bits * 2 / 8 / 1000000);
  std::printf("us a query (mean of 200): memory clock %.2f, bus width %.2f, SM count %.2f\n",
              us_per_call(cudaDevAttrMemoryClockRate), us_per_call(cudaDevAttrGlobalMemoryBusWidth),
              us_per_call(cudaDevAttrMultiProcessorCount));
}
