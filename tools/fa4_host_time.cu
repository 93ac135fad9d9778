// fa4_host_time: the host's time a call of fa4::forward on a decoding step, and of the CUDA runtime
// and driver calls such a call is made of, each timed alone on this machine.
//
//   fa4_host_time [--b 8] [--hq 32] [--hkv 8] [--sk 8192] [--d 128] [--sq 1] [--calls 50] [--rounds 7]
//
// Each row is `calls` calls with no synchronisation between them (launches queue up), timed on the
// host's steady clock, in `rounds` rounds with the GPU drained before each; it prints each row's
// median and minimum over the rounds, in microseconds a call. Rows:
//   forward        fa4::forward with each entry's key count (Varlen::seqused_k: the kvcache call's)
//   forward_full   fa4::forward over every key (flash_attn_func's call)
//   validate       fa4::validate alone
//   device_checks  cudaGetDevice and two cudaDeviceGetAttribute (the per-call device check)
//   context_id     the current context's id (cuCtxGetCurrent, cuCtxGetId: what the per-device
//                  values are keyed on), two a call as in a decoding launch
//   launch         an empty kernel with a 256-byte parameter block, <<<>>> and cudaGetLastError
//   launch_pdl     the same by cudaLaunchKernelEx as a programmatic dependent
//   malloc_free    cudaMallocAsync of 4 MB and cudaFreeAsync on the stream (the splits' scratch)
// What forward's row holds beyond the sum of its parts' is the rest of the library's host code.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "common/per_device.h"
#include "fa4/attention.h"

namespace {

struct Block256 {
  unsigned char bytes[256];
};
__global__ void empty_kernel(Block256 p) {
  if (p.bytes[0] == 1 && threadIdx.x == 1000) printf("never\n");
}

#define CUDA_OK(x)                                                                   \
  do {                                                                               \
    const cudaError_t e_ = (x);                                                      \
    if (e_ != cudaSuccess) {                                                         \
      std::fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_));                 \
      std::exit(1);                                                                  \
    }                                                                                \
  } while (0)

double us_per_call(const std::function<void()>& fn, int calls) {
  CUDA_OK(cudaDeviceSynchronize());
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < calls; ++i) fn();
  const auto t1 = std::chrono::steady_clock::now();
  CUDA_OK(cudaDeviceSynchronize());
  return std::chrono::duration<double, std::micro>(t1 - t0).count() / calls;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t b = 8, hq = 32, hkv = 8, sk = 8192, d = 128, sq = 1;
  int calls = 50, rounds = 7;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string f = argv[i];
    const long long v = std::atoll(argv[i + 1]);
    if (f == "--b") b = v;
    else if (f == "--hq") hq = v;
    else if (f == "--hkv") hkv = v;
    else if (f == "--sk") sk = v;
    else if (f == "--d") d = v;
    else if (f == "--sq") sq = v;
    else if (f == "--calls") calls = int(v);
    else if (f == "--rounds") rounds = int(v);
    else {
      std::fprintf(stderr, "fa4_host_time: unknown flag %s\n", f.c_str());
      return 2;
    }
  }
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::fprintf(stderr, "fa4_host_time: no CUDA device here; run it on the GPU machine\n");
    return 2;
  }
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  void *q, *k, *v, *o;
  int32_t* used;
  CUDA_OK(cudaMalloc(&q, size_t(b * sq * hq * d) * 2));
  CUDA_OK(cudaMalloc(&o, size_t(b * sq * hq * d) * 2));
  CUDA_OK(cudaMalloc(&k, size_t(b * sk * hkv * d) * 2));
  CUDA_OK(cudaMalloc(&v, size_t(b * sk * hkv * d) * 2));
  CUDA_OK(cudaMemset(q, 0x3c, size_t(b * sq * hq * d) * 2));  // small finite values
  CUDA_OK(cudaMemset(k, 0x3c, size_t(b * sk * hkv * d) * 2));
  CUDA_OK(cudaMemset(v, 0x3c, size_t(b * sk * hkv * d) * 2));
  CUDA_OK(cudaMalloc(&used, size_t(b) * 4));
  const std::vector<int32_t> lens(static_cast<size_t>(b), static_cast<int32_t>(sk));
  CUDA_OK(cudaMemcpy(used, lens.data(), lens.size() * 4, cudaMemcpyHostToDevice));

  fa4::ForwardArgs a;
  a.problem.dtype = fa4::DType::kBF16;
  a.problem.batch = b, a.problem.seqlen_q = sq, a.problem.seqlen_k = sk;
  a.problem.heads_q = hq, a.problem.heads_kv = hkv, a.problem.head_dim = d;
  a.q = fa4::bshd(q, sq, hq, d), a.o = fa4::bshd(o, sq, hq, d);
  a.k = fa4::bshd(k, sk, hkv, d), a.v = fa4::bshd(v, sk, hkv, d);
  fa4::ForwardArgs full = a;
  a.varlen.seqused_k = used;
  for (const fa4::ForwardArgs* x : {&a, &full}) {
    const fa4::Status s = fa4::forward(*x, stream);
    if (!s.ok()) {
      std::fprintf(stderr, "fa4::forward: %s\n", s.message.c_str());
      return 1;
    }
  }
  Block256 params{};
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(unsigned(b * hkv), 8);
  cfg.blockDim = dim3(128);
  cfg.stream = stream;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  volatile unsigned long long sink = 0;
  const std::vector<std::pair<const char*, std::function<void()>>> rows = {
      {"forward", [&] { (void)fa4::forward(a, stream); }},
      {"forward_full", [&] { (void)fa4::forward(full, stream); }},
      {"validate", [&] { sink = sink + fa4::validate(a).ok(); }},
      {"device_checks",
       [&] {
         int dev = 0, major = 0, minor = 0;
         (void)cudaGetDevice(&dev);
         (void)cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
         (void)cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
         sink = sink + unsigned(major + minor);
       }},
      {"context_id", [&] { sink = sink + fa4::detail::current_context_id() + fa4::detail::current_context_id(); }},
      {"launch",
       [&] {
         empty_kernel<<<cfg.gridDim, cfg.blockDim, 0, stream>>>(params);
         (void)cudaGetLastError();
       }},
      {"launch_pdl", [&] { (void)cudaLaunchKernelEx(&cfg, empty_kernel, params); }},
      {"malloc_free",
       [&] {
         void* p = nullptr;
         if (cudaMallocAsync(&p, size_t(4) << 20, stream) == cudaSuccess) (void)cudaFreeAsync(p, stream);
       }},
  };
  for (const auto& row : rows)
    for (int i = 0; i < 5; ++i) row.second();
  std::vector<std::vector<double>> t(rows.size());
  for (int r = 0; r < rounds; ++r)
    for (size_t j = 0; j < rows.size(); ++j) {
      const size_t x = (j + size_t(r)) % rows.size();  // the rows' order rotating by round
      t[x].push_back(us_per_call(rows[x].second, calls));
    }
  cudaDeviceProp prop{};
  CUDA_OK(cudaGetDeviceProperties(&prop, 0));
  std::printf("# %s; fa4::forward on %lld x %lld/%lld x %lld, d%lld, %lld query row(s); %d calls x %d rounds\n",
              prop.name, (long long)b, (long long)hq, (long long)hkv, (long long)sk, (long long)d, (long long)sq, calls,
              rounds);
  std::printf("%-14s %9s %9s  (host us a call)\n", "row", "median", "min");
  for (size_t j = 0; j < rows.size(); ++j) {
    std::vector<double> x = t[j];
    std::sort(x.begin(), x.end());
    std::printf("%-14s %9.2f %9.2f\n", rows[j].first, x[x.size() / 2], x.front());
  }
  return sink == 12345 ? 3 : 0;
}
