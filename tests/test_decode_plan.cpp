// The decoding kernel's host rules (sm90/decode_plan.h): which calls it takes, and how a launch's
// keys are cut into splits.
#include <gtest/gtest.h>

#include "sm90/decode_plan.h"

namespace {

using fa4::detail::FwdParams;
using fa4::sm90::decode_plan;
using fa4::sm90::decode_runs;
using fa4::sm90::decode_taken;
using fa4::sm90::DecodePlan;

FwdParams decoding(int seqlen_q, int heads_q, int heads_kv, int seqlen_k, int head_dim) {
  FwdParams a{};
  a.batch = 4, a.seqlen_q = seqlen_q, a.heads_q = heads_q, a.heads_kv = heads_kv;
  a.seqlen_k = seqlen_k, a.head_dim = head_dim;
  a.window_left = a.window_right = -1;
  return a;
}

TEST(DecodePlan, WhichCallsTheDecodingKernelTakes) {
  EXPECT_TRUE(decode_runs(decoding(1, 32, 8, 4096, 128)));   // a group of 4
  EXPECT_TRUE(decode_runs(decoding(1, 16, 1, 4096, 64)));    // MQA: 16 rows
  EXPECT_TRUE(decode_runs(decoding(2, 16, 2, 4096, 64)));    // 2 queries x 8
  EXPECT_FALSE(decode_runs(decoding(3, 16, 2, 4096, 64)));   // 24 rows
  EXPECT_FALSE(decode_runs(decoding(1, 32, 8, 4096, 256)));  // head_dim 256
  EXPECT_FALSE(decode_runs(decoding(1, 32, 8, 255, 128)));   // few keys: the tile kernels, by the rule
  FwdParams a = decoding(1, 32, 8, 255, 128);
  a.decode = 2;
  EXPECT_TRUE(decode_runs(a));  // wherever it can run
  a = decoding(1, 32, 8, 4096, 128);
  a.decode = 1;
  EXPECT_FALSE(decode_runs(a));  // never
  a = decoding(4, 8, 2, 4096, 128);
  a.fold = 2;  // rows folded: the caller unfolds them first
  EXPECT_FALSE(decode_runs(a));
  a = decoding(1, 32, 8, 4096, 128);
  a.softcap = 30.0f;
  EXPECT_FALSE(decode_runs(a));
  int cu[2] = {0, 1};
  a = decoding(1, 32, 8, 4096, 128);
  a.cu_seqlens_q = cu;
  EXPECT_FALSE(decode_runs(a));  // varlen
  a = decoding(1, 32, 8, 4096, 128);
  a.block_table = cu;
  a.page_size = 16;
  EXPECT_TRUE(decode_runs(a));  // a paged cache, pages of a power of two
  a.page_size = 24;
  EXPECT_FALSE(decode_runs(a));
  a.cu_seqlens_q = cu;
  a.page_size = 16;
  EXPECT_FALSE(decode_runs(a));  // packed queries on a paged cache
}

// Entries with key counts of their own (seqused_k, leftpad_k) stay on the tile kernels where the KV heads fill
// the device with one CTA each; with fewer KV heads, or forced, the decoding kernel takes them.
TEST(DecodePlan, EntriesKeysFillingTheDeviceStayOnTheTileKernels) {
  int used[1] = {0};
  FwdParams a = decoding(1, 32, 8, 4096, 128);
  a.batch = 32;  // 256 KV heads on 132 x 2 slots: one split
  EXPECT_TRUE(decode_taken(a, 132));
  a.seqused_k = used;
  EXPECT_FALSE(decode_taken(a, 132));
  a.seqused_k = nullptr;  // a left pad alone: counts of their own too
  a.leftpad_k = used;
  EXPECT_FALSE(decode_taken(a, 132));
  a.leftpad_k = nullptr;
  EXPECT_TRUE(decode_taken(a, 132));
  a.seqused_k = used;
  a.decode = 2;
  EXPECT_TRUE(decode_taken(a, 132));
  a.decode = 0;
  a.batch = 8;  // 64 KV heads: split
  EXPECT_TRUE(decode_taken(a, 132));
  a.seqlen_k = 100;  // below kDecodeMinKeys
  EXPECT_FALSE(decode_taken(a, 132));
}

// Every key in exactly one split; the splits' chunks whole blocks; no split empty; one split a
// pair where the pairs fill whole waves of the device's CTA slots; more where there are few pairs.
TEST(DecodePlan, SplitsCoverTheKeysOnce) {
  for (int64_t slots : {1, 2, 156, 264, 396})
    for (int64_t pairs : {1, 3, 32, 64, 264, 1000})
      for (int seqlen_k : {1, 63, 64, 65, 1000, 8192, 32768, 1 << 20}) {
        const DecodePlan pl = decode_plan(pairs, seqlen_k, slots);
        SCOPED_TRACE(std::to_string(slots) + " slots, " + std::to_string(pairs) + " pairs, " + std::to_string(seqlen_k) + " keys");
        ASSERT_GE(pl.splits, 1);
        EXPECT_LE(pl.splits, fa4::sm90::kDecodeMaxSplits);
        EXPECT_EQ(pl.chunk % fa4::sm90::kDecodeBlockKeys, 0);
        EXPECT_GE(int64_t(pl.splits) * pl.chunk, seqlen_k);
        EXPECT_LT(int64_t(pl.splits - 1) * pl.chunk, std::max(seqlen_k, 1));
        if (pairs % slots == 0) EXPECT_EQ(pl.splits, 1);
      }
  EXPECT_GE(decode_plan(32, 8192, 264).splits, 4);  // 32 pairs on 132 multiprocessors x 2
  EXPECT_GE(decode_plan(8, 32768, 264).splits, 16);
}

}  // namespace
