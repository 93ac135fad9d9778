// Event-to-event time of an (almost) empty kernel after a 256 MB flush, as do_bench times a call:
// what a launch costs outside its CTAs, with and without 228 KB of shared memory and PDL.
#include <cuda_runtime.h>
#include <algorithm>
#include <cstdio>
#include <vector>
#include <string_view>

__global__ void fill(uint4* p, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    p[i] = make_uint4(0, 0, 0, 0);
}

template <bool kWait>
__global__ void body(int* out, int spin) {
  extern __shared__ int s[];
  if (kWait) cudaGridDependencySynchronize();
  long long t0 = clock64();
  while (clock64() - t0 < spin) {
  }
  if (threadIdx.x == 0 && out) out[blockIdx.x] = spin < 0 ? s[0] : 1;
}

struct Big {
  unsigned char b[768];
};
__global__ void big_body(const __grid_constant__ Big p, int* out) {
  extern __shared__ int s[];
  if (threadIdx.x == 0 && out) out[blockIdx.x] = p.b[blockIdx.x % 768];
}

int main() {
  const size_t bytes = size_t(256) << 20;
  void* flush;
  cudaMalloc(&flush, bytes);
  int* out;
  cudaMalloc(&out, 1024 * 4);
  cudaStream_t st;
  cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
  const int smem_big = 227 * 1024;
  cudaFuncSetAttribute(body<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_big);
  cudaFuncSetAttribute(body<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_big);
  cudaFuncSetAttribute(big_body, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_big);
  struct Case {
    const char* name;
    int smem;
    bool pdl, kernel_flush, event_between;
    int spin;
  };
  std::vector<Case> cases = {
      {"0 smem, memset flush", 0, false, false, true, 0},
      {"227KB smem, memset flush", smem_big, false, false, true, 0},
      {"227KB smem, kernel flush", smem_big, false, true, true, 0},
      {"227KB smem, kernel flush, PDL", smem_big, true, true, true, 0},
      {"227KB smem, memset flush, PDL", smem_big, true, false, true, 0},
      {"227KB, kernel flush, PDL, spin 100us", smem_big, true, true, true, 190000},
      {"227KB, kernel flush, no PDL, spin 100us", smem_big, false, true, true, 190000},
      {"227KB, no flush (back to back)", smem_big, false, false, true, 0},
      {"227KB, 768 B params, memset flush", smem_big, false, false, true, -7},
  };
  for (int rep = 0; rep < 2; ++rep)
    for (const Case& c : cases) {
      const int iters = 60;
      std::vector<cudaEvent_t> ev(2 * iters);
      for (auto& e : ev) cudaEventCreate(&e);
      for (int i = 0; i < iters; ++i) {
        if (std::string_view(c.name).find("no flush") == std::string_view::npos) {
          if (c.kernel_flush)
            fill<<<132 * 4, 512, 0, st>>>(static_cast<uint4*>(flush), bytes / 16);
          else
            cudaMemsetAsync(flush, 0, bytes, st);
        }
        cudaEventRecord(ev[2 * i], st);
        cudaLaunchConfig_t cfg{};
        cudaLaunchAttribute at{};
        at.id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at.val.programmaticStreamSerializationAllowed = 1;
        cfg.gridDim = dim3(128);
        cfg.blockDim = dim3(384);
        cfg.dynamicSmemBytes = size_t(c.smem);
        cfg.stream = st;
        cfg.attrs = &at;
        cfg.numAttrs = c.pdl ? 1 : 0;
        Big big{};
        cudaError_t e = c.spin == -7 ? cudaLaunchKernelEx(&cfg, big_body, big, out) : c.pdl ? cudaLaunchKernelEx(&cfg, body<true>, out, c.spin)
                              : cudaLaunchKernelEx(&cfg, body<false>, out, c.spin);
        if (e != cudaSuccess) std::printf("launch: %s\n", cudaGetErrorString(e));
        cudaEventRecord(ev[2 * i + 1], st);
      }
      cudaStreamSynchronize(st);
      std::vector<float> ms(iters);
      for (int i = 0; i < iters; ++i) cudaEventElapsedTime(&ms[i], ev[2 * i], ev[2 * i + 1]);
      std::sort(ms.begin(), ms.end());
      std::printf("rep %d  %-42s median %7.2f us  p10 %7.2f  p90 %7.2f\n", rep, c.name, 1e3 * ms[iters / 2],
                  1e3 * ms[iters / 10], 1e3 * ms[iters * 9 / 10]);
      for (auto& e : ev) cudaEventDestroy(e);
    }
  std::printf("last error: %s\n", cudaGetErrorString(cudaGetLastError()));
  return 0;
}
