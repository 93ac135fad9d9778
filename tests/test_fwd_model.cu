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

}  // namespace
