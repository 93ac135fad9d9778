// Shared-memory loads of 8x8 16-bit matrices into registers (ldmatrix, PTX ISA 9.7.14.5.15): the
// backward holds d64's K and V in registers as a wgmma A operand, loaded once a CTA this way; the
// decoding kernel reads its K and V tiles as mma.sync B fragments.
#pragma once

#include <cstdint>

namespace fa4::ptx {

// Four 8x8 b16 matrices; lane l gives the row address of matrix l / 8, row l % 8. Each thread
// receives (row lane / 4, columns 2 (lane % 4) + {0, 1}) of each matrix: for a 16x16 tile read as
// (rows 0-7, 8-15) x (columns 0-7, 8-15), the register A fragment of wgmma and mma.sync.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// The same, each matrix transposed: the thread receives (rows 2 (lane % 4) + {0, 1}, column
// lane / 4) of each, the B fragment of mma.sync (k along the matrix's rows) from a row-major tile.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

}  // namespace fa4::ptx
