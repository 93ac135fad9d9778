// A kernel the guard refuses (tests/CMakeLists.txt, build.kernel_guard_*): a local array indexed
// at run time lives in a stack frame.
__global__ void stack_frame_kernel(float* out, int i) {
  float a[256];
  for (int j = 0; j < 256; ++j) a[j] = out[j * i];
  out[0] = a[i] + a[out[1] > 0.f ? 3 : i + 1];
}
