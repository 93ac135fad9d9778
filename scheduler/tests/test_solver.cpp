// The solver on small graphs whose answer is worked out by hand in each file's comment: one graph
// per constraint kind, plus the infeasible ones and the errors they must raise.
#include <gtest/gtest.h>

#include <string>

#include "graph.h"
#include "solver.h"

namespace fa4::sched {
namespace {

Graph test_graph(const std::string& name) {
  return load_graph(std::string(FA4_SCHED_DIR) + "/tests/graphs/" + name + ".graph");
}

struct Expected {
  const char* graph;
  int64_t res_mii, rec_mii, ii;
  int stages;
};

void PrintTo(const Expected& x, std::ostream* os) { *os << x.graph; }

class HandSolved : public testing::TestWithParam<Expected> {};

TEST_P(HandSolved, MatchesTheHandSolution) {
  const Expected& x = GetParam();
  const Graph g = test_graph(x.graph);
  const Solution sol = solve(g);
  EXPECT_EQ(sol.bounds.res_mii, x.res_mii);
  EXPECT_EQ(sol.bounds.rec_mii, x.rec_mii);
  EXPECT_EQ(sol.schedule.ii, x.ii);
  EXPECT_EQ(sol.schedule.stages(), x.stages);
  EXPECT_TRUE(check_schedule(g, sol.schedule).empty());
}

INSTANTIATE_TEST_SUITE_P(
    Graphs, HandSolved,
    testing::Values(Expected{"resource", 7, 1, 7, 1},     // unit occupancy alone
                    Expected{"chain", 2, 4, 4, 2},        // loop-carried recurrence
                    Expected{"distance2", 1, 4, 4, 2},    // recurrence over two iterations
                    Expected{"anti", 1, 2, 2, 3},         // anti-dependence, deep ring
                    Expected{"anti_tight", 1, 4, 4, 2},   // anti-dependence, capacity-bound ring
                    Expected{"anti_after", 1, 4, 4, 1},   // slot read an iteration after its fill
                    Expected{"occupancy", 7, 5, 7, 1},    // same-unit edge shorter than occupancy
                    Expected{"interplay", 3, 3, 4, 1},    // II above both bounds
                    Expected{"buffers", 4, 1, 4, 2},      // slots minimised after stages
                    Expected{"stages", 1, 1, 1, 7},       // flow chain across stages
                    Expected{"order", 2, 1, 2, 2}),       // negative distance: issue order
    [](const testing::TestParamInfo<Expected>& p) { return std::string(p.param.graph); });

TEST(Solver, AntiDependenceDepthFollowsCapacity) {
  EXPECT_EQ(solve(test_graph("anti")).schedule.slots, std::vector<int>{4});
  EXPECT_EQ(solve(test_graph("anti_tight")).schedule.slots, std::vector<int>{2});
  EXPECT_EQ(solve(test_graph("anti_after")).schedule.slots, std::vector<int>{2});
}

TEST(Solver, AntiAfterNeedsTheReadersIterationsOfSlots) {
  // A reader two iterations after the fill needs two slots at least, even where one more would not
  // fit the II's bound: P fills, C reads two iterations on; with one slot the refill would come
  // before the read.
  const Graph g = parse_graph(
      "unit u\nunit v\ncapacity smem 4096 bytes\nbuffer ring smem 1024 slots 1..\nop P u lat 1\nop C v lat 1\n"
      "edge P -> C carried 2\nedge C -> P anti ring after 2\n");
  const Solution sol = solve(g);
  EXPECT_GE(sol.schedule.slots[0], 2);
  EXPECT_TRUE(check_schedule(g, sol.schedule).empty());
  Schedule one = sol.schedule;
  one.slots[0] = 1;
  const auto problems = check_schedule(g, one);
  ASSERT_FALSE(problems.empty());
  EXPECT_NE(problems[0].find("fewer than the 2 iterations between a slot's fill and its read"), std::string::npos)
      << problems[0];
}

TEST(Solver, MinimisesBufferDepthAfterStages) {
  const Graph g = test_graph("buffers");
  const Solution sol = solve(g);
  EXPECT_EQ(sol.schedule.slots, std::vector<int>{1});
  // P starts late enough that its slot lives at most one II.
  EXPECT_LE(sol.schedule.start[g.find_op("C")] + 1 - sol.schedule.start[g.find_op("P")], 4);
}

TEST(Solver, HandSchedulesOfChain) {
  const Graph g = test_graph("chain");
  const Schedule s = solve(g).schedule;
  EXPECT_EQ(s.start, (std::vector<int64_t>{0, 2, 5}));  // the earliest legal starts
  EXPECT_EQ(s.stage(2), 1);
  EXPECT_EQ(s.offset(2), 1);
}

TEST(Solver, NegativeDistanceOrdersIterations) {
  const Graph g = test_graph("order");
  const Schedule s = solve(g).schedule;
  EXPECT_EQ(s.start, (std::vector<int64_t>{0, 3}));
  Schedule early = s;
  early.start = {0, 1};  // B of iteration j-1 would start before A of iteration j
  const auto p = check_schedule(g, early);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_NE(p[0].find("edge A -> B (carried -1, line 8) violated: start(B) - start(A) = 1, needs >= 3 "
                      "(lat 1 - II 2 x distance -1)"),
            std::string::npos)
      << p[0];
}

TEST(Solver, OccupancyCountsOnSameUnitEdges) {
  const Bounds b = lower_bounds(test_graph("occupancy"));
  EXPECT_EQ(b.rec_mii, 5);
  EXPECT_EQ(b.unit_rec_mii, 7);
  EXPECT_EQ(solve(test_graph("occupancy")).schedule.start[1], 5);
}

TEST(Solver, NamesTheCriticalCycle) {
  const Graph g = test_graph("chain");
  const Bounds b = lower_bounds(g);
  EXPECT_EQ(describe(g, b.rec_cycle), "C -> B -> C (latency 4, distance 1)");
}

TEST(Solver, ReportsWork) {
  const Solution sol = solve(test_graph("interplay"));
  EXPECT_EQ(sol.stats.iis_tried, 2);  // II 3 refuted, II 4 found
  EXPECT_GT(sol.stats.checks, 2);
}

// Expects solve() to fail with a message containing each of `parts`.
void expect_infeasible(const std::string& graph, std::initializer_list<const char*> parts) {
  try {
    solve(test_graph(graph));
    ADD_FAILURE() << graph << " was scheduled";
  } catch (const ScheduleError& e) {
    for (const char* p : parts)
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

TEST(SolverErrors, SameIterationCycleIsNamed) {
  expect_infeasible("err_cycle", {"same-iteration cycle", "B -> A -> B", "distance 0"});
}

TEST(SolverErrors, RecurrenceLongerThanMaxIIWithinBuffers) {
  expect_infeasible("err_maxii_rec", {"recurrence P -> C -> P", "latency 20, distance 2",
                                      "buffer ring counted at its deepest", "needs II >= 10",
                                      "max_ii 5"});
}

TEST(SolverErrors, UnitBusierThanMaxII) {
  expect_infeasible("err_maxii_res", {"unit tc is busy 6", "max_ii 5"});
}

TEST(SolverErrors, NoScheduleWithinMaxII) {
  expect_infeasible("err_maxii_interplay", {"no modulo schedule with II in [3, 3]"});
}

TEST(SolverErrors, OccupancyRecurrenceOverMaxII) {
  // ResMII 6 and RecMII 3 + 2 = 5 fit max_ii 6, but S cannot start before L frees the unit:
  // the recurrence is 5 + 2 = 7.
  const Graph g = parse_graph(
      "max_ii 6\nunit u\nop L u lat 3 occ 5\nop S u lat 2\nedge L -> S\nedge S -> L carried 1\n");
  try {
    solve(g);
    ADD_FAILURE();
  } catch (const ScheduleError& e) {
    EXPECT_NE(std::string(e.what()).find("recurrence L -> S -> L (latency 7, distance 1), counting "
                                         "a unit's occupancy between two of its ops, needs II >= 7"),
              std::string::npos)
        << e.what();
  }
}

TEST(Schedule, StageAndOffsetOfNegativeStarts) {
  Schedule s;
  s.ii = 4;
  s.start = {-1, 0, 9};
  EXPECT_EQ(s.stage(0), -1);
  EXPECT_EQ(s.offset(0), 3);
  EXPECT_EQ(s.stage(2), 2);
  EXPECT_EQ(s.offset(2), 1);
  EXPECT_EQ(s.stages(), 3);
}

}  // namespace
}  // namespace fa4::sched
