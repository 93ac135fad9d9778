// Barriers and register reallocation: mbarrier through CCCL's cuda::ptx, named barriers and
// setmaxnreg by hand (cuda::ptx has neither).
#pragma once

#include <cstdint>

#include <cuda/ptx>

namespace fa4::ptx {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// --- mbarrier (PTX ISA 9.7.13.15) ---
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  cuda::ptx::mbarrier_init(bar, count);
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  cuda::ptx::mbarrier_arrive(cuda::ptx::sem_release, cuda::ptx::scope_cta, cuda::ptx::space_shared,
                             bar);
}
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  cuda::ptx::mbarrier_arrive_expect_tx(cuda::ptx::sem_release, cuda::ptx::scope_cta,
                                       cuda::ptx::space_shared, bar, bytes);
}
// Spins until the phase with parity `phase` has completed.
// Non-blocking probe: whether the phase of this parity has completed. Issued early, its latency
// overlaps other work; mbar_wait at the point of use covers the rare not-yet case.
__device__ __forceinline__ bool mbar_test(uint64_t* bar, uint32_t phase) {
  return cuda::ptx::mbarrier_test_wait_parity(bar, phase);
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t phase) {
  while (!cuda::ptx::mbarrier_try_wait_parity(bar, phase)) {
  }
}
// Waits like mbar_wait with cluster-scope acquire: for barriers that CTAs of the cluster arrive on.
__device__ __forceinline__ void mbar_wait_cluster(uint64_t* bar, uint32_t phase) {
  while (!cuda::ptx::mbarrier_try_wait_parity(cuda::ptx::sem_acquire, cuda::ptx::scope_cluster, bar, phase)) {
  }
}
// Arrives on the barrier at `bar`'s offset in cluster rank `cta` with mbarrier.arrive's default
// semantics (release at CTA scope). cuda::ptx offers the shared::cluster form only with a
// cluster-scope release, which stalls the arriving warp (measured: the forward a third slower).
__device__ __forceinline__ void mbar_arrive_remote(uint64_t* bar, uint32_t cta) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(smem_addr(bar)), "r"(cta));
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(remote) : "memory");
}

// threadIdx.x read afresh where it is used (asm volatile: not merged with earlier reads), so that
// values derived from it are computed there, not hoisted out of a loop and held through it.
__device__ __forceinline__ int fresh_thread_index() {
  int t;
  asm volatile("mov.u32 %0, %%tid.x;" : "=r"(t));
  return t;
}

// --- clusters (PTX ISA 9.7.13.2, barrier.cluster) ---
__device__ __forceinline__ uint32_t cluster_rank() { return cuda::ptx::get_sreg_cluster_ctarank(); }
// Every thread of every CTA of the cluster; what each wrote before is visible to all after.
__device__ __forceinline__ void cluster_sync() {
  cuda::ptx::barrier_cluster_arrive(cuda::ptx::sem_release);
  cuda::ptx::barrier_cluster_wait(cuda::ptx::sem_acquire);
}

// Makes mbarrier.init visible to the async proxy (TMA) and the other threads.
__device__ __forceinline__ void fence_barrier_init() { cuda::ptx::fence_mbarrier_init(cuda::ptx::sem_release, cuda::ptx::scope_cluster); }
// Orders generic-proxy shared-memory writes before async-proxy reads (wgmma, TMA) (9.7.13.4).
__device__ __forceinline__ void fence_proxy_async_smem() {
  cuda::ptx::fence_proxy_async(cuda::ptx::space_shared);
}

// A 32-bit shared-memory load the compiler keeps after the barrier wait before it (asm volatile
// with a memory clobber): data another thread published before an mbarrier arrive.
__device__ __forceinline__ int ld_shared(const int* p) {
  int v;
  asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(v) : "r"(smem_addr(p)) : "memory");
  return v;
}

// The same for four 32-bit words at a 16-byte aligned address (one load).
__device__ __forceinline__ int4 ld_shared_v4(const int4* p) {
  int4 v;
  asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(smem_addr(p))
               : "memory");
  return v;
}

// Two or four floats from shared memory (8- or 16-byte aligned) by ld.shared, where a generic
// pointer would make a generic load: volatile, so that it stays after the barrier wait before it,
// but without a memory clobber, so that the compiler may move other loads and stores around it.
__device__ __forceinline__ float2 ld_shared_v2_f32(const float* p) {
  float2 v;
  asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(v.x), "=f"(v.y) : "r"(smem_addr(p)));
  return v;
}
__device__ __forceinline__ float4 ld_shared_v4_f32(const float* p) {
  float4 v;
  asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(smem_addr(p)));
  return v;
}

// --- named barriers (PTX ISA 9.7.13.1, bar.sync / bar.arrive) ---
// bar.red.or over the `threads` threads of barrier `id`: a barrier that also tells each thread
// whether any of them passed true (PTX ISA 9.7.13.1).
__device__ __forceinline__ bool named_bar_any(uint32_t id, uint32_t threads, bool pred) {
  uint32_t r;
  asm volatile(
      "{\n .reg .pred p, q;\n setp.ne.u32 p, %1, 0;\n barrier.red.or.pred q, %2, %3, p;\n selp.u32 %0, 1, 0, q;\n}\n"
      : "=r"(r)
      : "r"(uint32_t(pred)), "r"(id), "r"(threads)
      : "memory");
  return r != 0;
}
__device__ __forceinline__ void named_bar_sync(uint32_t id, uint32_t threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_bar_arrive(uint32_t id, uint32_t threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// --- stmatrix (PTX ISA 9.7.14.5.16): four 8x8 16-bit matrices from the mma fragment layout ---
// Thread t holds row t/4, columns 2(t%4)..+1 of each matrix; lanes 8i..8i+7 give matrix i's rows.
__device__ __forceinline__ void stmatrix_x4(uint32_t smem_row_addr, uint32_t r0, uint32_t r1,
                                            uint32_t r2, uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(smem_row_addr),
               "r"(r0), "r"(r1), "r"(r2), "r"(r3)
               : "memory");
}

// --- st.shared.b32 (PTX ISA, data movement: st): one 32-bit store at a shared-memory address ---
// A 32-bit address where a generic pointer would take a 64-bit register pair per hoisted address.
__device__ __forceinline__ void st_shared_b32(uint32_t smem_addr, uint32_t v) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(smem_addr), "r"(v) : "memory");
}
// Four 32-bit words (16 bytes, 16-byte aligned) likewise.
__device__ __forceinline__ void st_shared_v4_b32(uint32_t smem_addr, int a, int b, int c, int d) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(smem_addr), "r"(a), "r"(b), "r"(c), "r"(d)
               : "memory");
}
// Four floats (16 bytes, 16-byte aligned) likewise.
__device__ __forceinline__ void st_shared_v4_f32(uint32_t smem_addr, float a, float b, float c, float d) {
  asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(smem_addr), "f"(a), "f"(b), "f"(c), "f"(d)
               : "memory");
}

// --- setmaxnreg (PTX ISA 9.7.18.2): move registers between warpgroup roles ---
template <int N>
__device__ __forceinline__ void regs_decrease() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void regs_increase() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}

}  // namespace fa4::ptx
