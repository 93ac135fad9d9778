// A kernel the guard passes (tests/CMakeLists.txt, build.kernel_guard_*): registers only.
__global__ void clean_kernel(float* out, float x) { out[threadIdx.x] = x * float(threadIdx.x); }
