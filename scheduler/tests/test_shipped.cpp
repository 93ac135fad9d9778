// The shipped graphs: FA4's SM100 forward next to Modular's published result, and fa4's own sm90
// forward and backward. Values asserted here are what the graphs give; docs/perf-notes.md
// ("## Scheduler") explains them. Solve times are printed by fa4-schedule-bench, not tested.
#include <gtest/gtest.h>

#include <string>

#include "emit.h"
#include "graph.h"
#include "solver.h"

namespace fa4::sched {
namespace {

Graph shipped(const std::string& name) {
  return load_graph(std::string(FA4_SCHED_DIR) + "/graphs/" + name + ".graph");
}

std::vector<int> kind_counts(const Graph& g) {
  std::vector<int> k(3, 0);
  for (const Edge& e : g.edges) ++k[static_cast<int>(e.kind)];
  return k;
}

// Modular's FA4 SM100 example: 14 ops, 5 units, 28 edges (18 same-iteration, 6 loop-carried,
// 4 anti for the shared-memory ring); II = 4 normalised slots, 2 stages.
TEST(Sm100Forward, HasThePublishedShape) {
  for (const char* name : {"sm100_fwd", "sm100_fwd_slots"}) {
    const Graph g = shipped(name);
    EXPECT_EQ(g.ops.size(), 14u) << name;
    EXPECT_EQ(g.units.size(), 5u) << name;
    EXPECT_EQ(g.edges.size(), 28u) << name;
    EXPECT_EQ(kind_counts(g), (std::vector<int>{18, 6, 4})) << name;
  }
}

TEST(Sm100Forward, ResourceBoundIsThePublishedFourSlots) {
  // Four 128x128x128 MMAs per K/V block on the tensor core: 4 slots, in cycles 4 x 512.
  const Graph g = shipped("sm100_fwd");
  const Bounds b = lower_bounds(g);
  EXPECT_EQ(b.res_mii, 4 * g.slot);
  EXPECT_EQ(g.units[b.res_unit].name, "tc");
  EXPECT_EQ(lower_bounds(shipped("sm100_fwd_slots")).res_mii, 4);
}

TEST(Sm100Forward, InCyclesTheSoftmaxRecurrenceBinds) {
  const Graph g = shipped("sm100_fwd");
  const Solution sol = solve(g);
  EXPECT_EQ(sol.bounds.rec_mii, 3319);       // S -> LdS -> Exp -> StP -> O -> next S
  EXPECT_EQ(sol.bounds.unit_rec_mii, 3801);  // ... with O holding the tensor core 512
  EXPECT_EQ(sol.schedule.ii, 3801);          // 7.42 slots of 512
  EXPECT_EQ(sol.schedule.stages(), 2);       // the published stage count
  EXPECT_TRUE(check_schedule(g, sol.schedule).empty());
  // The cycle runs through the tensor-memory columns P shares with S.
  const std::string cycle = describe(g, sol.bounds.unit_rec_cycle);
  EXPECT_NE(cycle.find("Exp"), std::string::npos) << cycle;
  EXPECT_NE(cycle.find("StP"), std::string::npos) << cycle;
}

TEST(Sm100Forward, InUnitTimeTheSameRecurrenceGivesSix) {
  const Graph g = shipped("sm100_fwd_slots");
  const Solution sol = solve(g);
  EXPECT_EQ(sol.bounds.res_mii, 4);
  EXPECT_EQ(sol.bounds.rec_mii, 4);
  EXPECT_EQ(sol.bounds.unit_rec_mii, 5);
  EXPECT_EQ(sol.schedule.ii, 6);
  EXPECT_EQ(sol.schedule.stages(), 2);
  EXPECT_TRUE(check_schedule(g, sol.schedule).empty());
}

TEST(Sm100Forward, WithoutPOverSTheUnitTimeIIIsFour) {
  // The difference from the published II = 4 is the P-over-S dependence (O_h(j) -> S_h(j+1)):
  // dropping those two edges leaves the tensor core as the only bound.
  Graph g = shipped("sm100_fwd_slots");
  std::erase_if(g.edges, [&](const Edge& e) {
    return g.ops[e.src].name[0] == 'O' && g.ops[e.dst].name[0] == 'S';
  });
  ASSERT_EQ(g.edges.size(), 26u);
  const Solution sol = solve(g);
  EXPECT_EQ(sol.schedule.ii, 4);
  EXPECT_EQ(sol.schedule.stages(), 3);
}

TEST(Sm90Forward, TensorBoundWithSBeforeOwnPV) {
  const Graph g = shipped("sm90_fwd");
  const Solution sol = solve(g);
  const Schedule& s = sol.schedule;
  EXPECT_EQ(sol.bounds.res_mii, 2048);  // 4 GEMMs of 512 per K/V block
  EXPECT_EQ(s.ii, 2048);
  EXPECT_EQ(s.stages(), 3);
  EXPECT_EQ(s.slots[g.find_buffer("KV")], 2);  // FA3's K/V stage count
  EXPECT_TRUE(check_schedule(g, s).empty());
  // Intra-warpgroup overlap: each warpgroup's S of block j runs before its PV of block j-1, and
  // PV runs in a later stage than S.
  for (const char* h : {"0", "1"}) {
    const int S = g.find_op(std::string("S") + h), O = g.find_op(std::string("O") + h);
    EXPECT_GE(s.start[O] - s.ii, s.start[S] + 512) << h;
    EXPECT_GT(s.stage(O), s.stage(S)) << h;
  }
  // The tensor core is busy all the time: its four GEMMs fill the II window.
  int64_t busy = 0;
  for (size_t i = 0; i < g.ops.size(); ++i)
    if (g.units[g.ops[i].unit].name == "tc") busy += g.ops[i].occ;
  EXPECT_EQ(busy, s.ii);
}

TEST(Sm90Forward, InPlaceLatenciesMakeTheSoftmaxRecurrenceBind) {
  // sm90_fwd_measured.graph: the same kernel with the latencies its clock64 timeline shows on an
  // H200. The recurrence S -> softmax -> next S (2724) now exceeds the tensor core's 2048, as in
  // the kernel, whose measured period is 2777-2780 cycles a K/V block.
  const Graph g = shipped("sm90_fwd_measured");
  const Solution sol = solve(g);
  EXPECT_EQ(sol.bounds.res_mii, 2048);
  EXPECT_EQ(sol.bounds.rec_mii, 826 + 100 + 1536 + 262);
  EXPECT_EQ(sol.schedule.ii, sol.bounds.rec_mii);
  EXPECT_TRUE(check_schedule(g, sol.schedule).empty());
  const std::string cycle = describe(g, sol.bounds.rec_cycle);
  EXPECT_NE(cycle.find("Exp"), std::string::npos) << cycle;
  EXPECT_NE(cycle.find("S"), std::string::npos) << cycle;
}

TEST(Sm90Backward, TensorBound) {
  const Graph g = shipped("sm90_bwd");
  const Solution sol = solve(g);
  EXPECT_EQ(sol.bounds.res_mii, 5 * 512);  // S, dP, dV, dK, dQ
  EXPECT_EQ(sol.schedule.ii, sol.bounds.res_mii);
  EXPECT_EQ(sol.schedule.stages(), 2);
  EXPECT_TRUE(check_schedule(g, sol.schedule).empty());
}

}  // namespace
}  // namespace fa4::sched
