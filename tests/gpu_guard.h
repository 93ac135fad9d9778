// Tests that need a GPU call FA4_REQUIRE_GPU() first: without a Hopper GPU they skip and say why.
#pragma once

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

namespace fa4_test {

// Empty when a GPU of compute capability >= 9.0 is present, else the reason to skip.
inline std::string gpu_missing_reason() {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    cudaGetLastError();
    return std::string("no CUDA GPU on this machine (") + cudaGetErrorString(e) + ")";
  }
  int major = 0, minor = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0);
  if (major * 10 + minor < 90)
    return "GPU 0 has compute capability " + std::to_string(major) + "." + std::to_string(minor) +
           ", these tests need 9.0 (Hopper)";
  return {};
}

// Waits for the device; a launch still running after 60 s is reported and the test binary exits,
// since a hung kernel leaves nothing after it able to run.
inline void finish_or_exit(const std::string& what) {
  const auto start = std::chrono::steady_clock::now();
  while (cudaStreamQuery(nullptr) == cudaErrorNotReady) {
    if (std::chrono::steady_clock::now() - start > std::chrono::seconds(60)) {
      std::fprintf(stderr, "FAILED: the launch for %s has not finished in 60 s (a hang); exiting\n", what.c_str());
      std::fflush(stderr);
      std::_Exit(1);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

}  // namespace fa4_test

#define FA4_REQUIRE_GPU()                                                   \
  do {                                                                      \
    static const std::string fa4_reason = fa4_test::gpu_missing_reason();   \
    if (!fa4_reason.empty()) GTEST_SKIP() << "GPU test skipped: " << fa4_reason; \
  } while (0)
