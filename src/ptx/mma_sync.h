// Warp-level matrix multiply (mma.sync m16n8k16, fp32 accumulate) and its shared-memory loads
// (ldmatrix), PTX ISA 9.7.14. The backward's GEMMs use these: every operand comes from shared
// memory, in any of the four orientations, which wgmma's register operand does not allow.
#pragma once

#include <cstdint>

namespace fa4::ptx {

// Four 8x8 b16 matrices; lane l gives the row address of matrix l / 8, row l % 8. Each thread
// receives (row lane / 4, columns 2 (lane % 4) + {0, 1}) of each matrix, or with .trans the
// transposed pair (rows 2 (lane % 4) + {0, 1}, column lane / 4).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// D = A B + D for one 16x8x16 tile. A: 4 registers (rows g, g + 8; columns 2t.., 2t + 8..), B: 2
// (rows 2t.., 2t + 8..; column g), D: rows g (d[0], d[1]) and g + 8 (d[2], d[3]), columns 2t, 2t + 1;
// g = lane / 4, t = lane % 4.
template <bool kBF16>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (kBF16)
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

}  // namespace fa4::ptx
