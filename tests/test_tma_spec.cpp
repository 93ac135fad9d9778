// The TMA maps' geometry on the CPU (src/ptx/tma.h): a folded box (bshd_folded_spec: 64 columns x
// rows x column blocks, one TMA operation) covers exactly the bytes of the 64-column boxes it
// replaces (bshd_spec), element for element and in the order they land in shared memory, for BSHD,
// BHSD and padded strides; and a box never reaches past the tensor's dims.
#include <cstdint>
#include <vector>

#include <gtest/gtest.h>

#include "ptx/tma.h"

namespace {

using fa4::ptx::TensorMapSpec;

struct Layout {
  const char* name;
  int batch, seqlen, heads, head_dim;
  int64_t stride[3];  // elements: batch, seq, head
};

TEST(TmaSpec, FoldedBoxesCoverTheBytesOfTheirColumnBoxes) {
  const Layout layouts[] = {
      {"bshd d256", 2, 300, 4, 256, {300 * 4 * 256, 4 * 256, 256}},
      {"bhsd d128", 3, 77, 2, 128, {2 * 77 * 128, 128, 77 * 128}},
      {"padded d256", 1, 129, 3, 256, {129 * 3 * 264, 3 * 264, 264}},
      {"d64", 2, 50, 2, 64, {50 * 2 * 64, 2 * 64, 64}},
  };
  for (const Layout& l : layouts) {
    const int blocks = l.head_dim / 64;
    for (const int rows : {64, 80}) {
      const TensorMapSpec flat = fa4::ptx::bshd_spec(l.stride, l.batch, l.seqlen, l.heads, l.head_dim, rows);
      // All column blocks (0), and half of them (a CTA's share in a cluster of two) where there
      // are two or more.
      std::vector<int> shares = {0};
      if (blocks >= 2) shares.push_back(blocks / 2);
      for (const int box_blocks : shares) {
        const int nb = box_blocks > 0 ? box_blocks : blocks;
        const TensorMapSpec folded =
            fa4::ptx::bshd_folded_spec(l.stride, l.batch, l.seqlen, l.heads, l.head_dim, rows, box_blocks);
        ASSERT_EQ(folded.rank, 5);
        EXPECT_EQ(folded.box[0] * 2, 128u) << l.name;  // one 128-byte swizzle row
        EXPECT_EQ(folded.box[1], uint32_t(rows)) << l.name;
        EXPECT_EQ(folded.box[2], uint32_t(nb)) << l.name;
        EXPECT_EQ(folded.dims[2], uint64_t(blocks)) << l.name;
        const int b = l.batch - 1, h = l.heads - 1, q0 = 0, first_block = blocks - nb;
        // Element (e, r, k) of the folded box at (0, q0, first_block, h, b) lands at shared-memory
        // position ((k * rows + r) * 64 + e); so does element (e, r) of the 64-column box of block
        // first_block + k at (64 (first_block + k), q0, h, b), placed k * rows * 128 bytes on.
        for (int k = 0; k < nb; ++k)
          for (int r = 0; r < rows; ++r)
            for (int e = 0; e < 64; e += 7) {
              const uint64_t a = folded.offset({uint64_t(e), uint64_t(q0 + r), uint64_t(first_block + k), uint64_t(h),
                                                 uint64_t(b)});
              const uint64_t c = flat.offset({uint64_t(64 * (first_block + k) + e), uint64_t(q0 + r), uint64_t(h),
                                               uint64_t(b)});
              ASSERT_EQ(a, c) << l.name << " rows " << rows << " block " << k << " row " << r << " col " << e;
            }
      }
    }
  }
}

TEST(TmaSpec, BoxesStayInsideTheirDims) {
  const int64_t stride[3] = {300 * 4 * 256, 4 * 256, 256};
  for (const TensorMapSpec& m : {fa4::ptx::bshd_spec(stride, 2, 300, 4, 256, 64),
                                 fa4::ptx::bshd_folded_spec(stride, 2, 300, 4, 256, 64),
                                 fa4::ptx::bshd_folded_spec(stride, 2, 300, 4, 256, 80, 2)})
    for (int i = 0; i < m.rank; ++i) {
      EXPECT_LE(uint64_t(m.box[i]), m.dims[i]) << "dim " << i;
      EXPECT_LE(m.box[i], 256u) << "dim " << i;  // TMA's largest box dimension
    }
  // Every byte stride is a multiple of 16, as the encoder requires.
  const TensorMapSpec f = fa4::ptx::bshd_folded_spec(stride, 2, 300, 4, 256, 64);
  for (int i = 0; i < f.rank - 1; ++i) EXPECT_EQ(f.strides_bytes[i] % 16, 0u) << "stride " << i;
}

}  // namespace
