// The scheduler's graphs of the sm90 forward kernels the kernels take numbers from
// (scheduler/graphs/sm90_fwd.graph at d128, sm90_fwd_d256.graph) describe those kernels' shared
// memory: Q, O and the K/V ring's slots are the bytes FwdConfig gives them, the kernels' ring
// depth is the generated header's, and at that depth everything fits in 227 KB.
#include <string>

#include <gtest/gtest.h>

#include "graph_model.h"
#include "sm90/fwd_configs.cuh"

namespace {

using fa4_test::read_model;
using fa4_test::SmemModel;

// The shipped configurations (src/sm90/fwd_configs.cuh), bf16; d256 on its wider key blocks.
using D128 = fa4::sm90::D128Config<true>;
using D256 = fa4::sm90::D256Config<80, true>;

TEST(ForwardModel, D128GraphHoldsTheKernelsSharedMemory) {
  const SmemModel m = read_model("sm90_fwd");
  EXPECT_EQ(m.capacity, D128::kSmemLimit);
  EXPECT_EQ(m.slot.at("Q"), D128::kQBytes);
  EXPECT_EQ(D128::kQStages, 2);  // the graph's "slots 2"
  EXPECT_TRUE(D128::kStageO);
  EXPECT_EQ(m.slot.at("O"), D128::kQBytes);  // O staged as a tile of Q's size
  EXPECT_EQ(m.slot.at("KV"), 2 * D128::kKVBytes);
  EXPECT_EQ(D128::kStages, fa4::sched::sm90_fwd::kKVStages);
  EXPECT_LE(D128::kSmemBytes, D128::kSmemLimit);
}

TEST(ForwardModel, D256GraphHoldsTheKernelsSharedMemory) {
  const SmemModel m = read_model("sm90_fwd_d256");
  EXPECT_EQ(m.capacity, D256::kSmemLimit);
  EXPECT_EQ(m.slot.at("Q"), D256::kQBytes);
  EXPECT_EQ(D256::kQStages, 1);
  EXPECT_TRUE(D256::kStageOInKV);  // no O buffer of its own: the graph has none
  EXPECT_EQ(m.slot.count("O"), 0u);
  EXPECT_EQ(m.slot.at("KV"), 2 * D256::kKVBytes);
  EXPECT_EQ(D256::kStages, fa4::sched::sm90_fwd_d256::kKVStages);
  EXPECT_LE(D256::kSmemBytes, D256::kSmemLimit);
  // A third stage would not fit beside Q: the solver's depth is also the most there is room for.
  EXPECT_GT(D256::kQBytes + 3 * 2 * D256::kKVBytes, D256::kSmemLimit);
}

// d192 and its 128-column value side (D192V128Config): the same slots (a V block of two chunks in a
// slot of K's size), the ring depth of d192's header, which the v128 graph's solve also takes.
TEST(ForwardModel, D192GraphsHoldTheKernelsSharedMemory) {
  using D192 = fa4::sm90::D192Config<true>;
  using V128 = fa4::sm90::D192V128Config<true>;
  for (const char* graph : {"sm90_fwd_d192", "sm90_fwd_d192_v128"}) {
    SCOPED_TRACE(graph);
    const SmemModel m = read_model(graph);
    EXPECT_EQ(m.capacity, D192::kSmemLimit);
    EXPECT_EQ(m.slot.at("Q"), D192::kQBytes);
    EXPECT_EQ(m.slot.count("O"), 0u);
    EXPECT_EQ(m.slot.at("KV"), 2 * D192::kKVBytes);
  }
  EXPECT_TRUE(D192::kStageOInKV);
  EXPECT_EQ(D192::kStages, fa4::sched::sm90_fwd_d192::kKVStages);
  EXPECT_EQ(V128::kStages, D192::kStages);
  EXPECT_EQ(V128::kSmemBytes, D192::kSmemBytes);
  EXPECT_EQ(V128::kHeadDimV, 128);
  EXPECT_EQ(V128::kVChunks, 2);
  EXPECT_EQ(V128::kVBytes, D192::kBlockN * 128 * 2);
  EXPECT_LE(2 * 64 * V128::kHeadDimV, V128::kKVBytes) << "a consumer's O staged in a K/V slot";
  EXPECT_EQ(D192::kHeadDimV, 192);
  EXPECT_EQ(D192::kVBytes, D192::kKVBytes);
}

}  // namespace
