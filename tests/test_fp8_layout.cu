// The fp8 kernel's P-from-registers trick, checked on the host (sm90/fp8_fwd_kernel.cuh): V^T's
// 32-key groups are stored in key_perm's order so that the bytes a thread packs from its S
// accumulator registers are, at each position of the A operand's fragment, the key V^T holds
// there. The fragment layouts are PTX's (ISA 9.7.15.5): the f32 accumulator of m64nN gives lane
// 4 * row + c of a warp columns 8 g + 2 c + {0, 1} of each 8-column chunk g; the A operand of an
// m64nNk32 8-bit wgmma takes in register r, byte b, column 4 c + b + 16 (r / 2) (rows r % 2 apart).
#include <set>

#include <gtest/gtest.h>

#include "sm90/fp8_fwd_kernel.cuh"

namespace {

using fa4::sm90::fp8::key_perm;

TEST(Fp8Layout, KeyPermIsAPermutationOfAGroup) {
  std::set<int> seen;
  for (int k = 0; k < 32; ++k) {
    const int p = key_perm(k);
    EXPECT_TRUE(p >= 0 && p < 32) << k;
    seen.insert(p);
  }
  EXPECT_EQ(seen.size(), 32u);
}

TEST(Fp8Layout, PackedAccumulatorBytesMeetVTransposedsKeys) {
  // The kernel (fp8_softmax) packs chunk g of a k32 step (keys 8 g .. 8 g + 7 of the step's 32)
  // into register (g / 2) * 2 (+ 1 for the row 8 below), bytes 2 (g % 2) + e for the thread's
  // columns 8 g + 2 c + e.
  for (int c = 0; c < 4; ++c)
    for (int g = 0; g < 4; ++g)
      for (int e = 0; e < 2; ++e) {
        const int reg = (g / 2) * 2, byte = 2 * (g % 2) + e;
        const int a_column = 4 * c + byte + 16 * (reg / 2);  // the key the wgmma takes it for
        const int s_column = 8 * g + 2 * c + e;               // the key it is the score of
        EXPECT_EQ(key_perm(a_column), s_column) << "c " << c << " g " << g << " e " << e;
      }
}

}  // namespace
