// --check: a given schedule is legal or the problem is named (edge, unit, capacity), and the CLI
// says whether its II is the minimum.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "graph.h"
#include "solver.h"

namespace fa4::sched {
namespace {

Graph test_graph(const std::string& name) {
  return load_graph(std::string(FA4_SCHED_DIR) + "/tests/graphs/" + name + ".graph");
}

bool mentions(const std::vector<std::string>& problems, const std::string& what) {
  for (const auto& p : problems)
    if (p.find(what) != std::string::npos) return true;
  return false;
}

std::string all(const std::vector<std::string>& problems) {
  std::string s;
  for (const auto& p : problems) s += p + "\n";
  return s;
}

TEST(Check, SolverSchedulesAreLegal) {
  for (const char* name : {"chain", "anti", "interplay", "buffers", "occupancy", "resource"}) {
    const Graph g = test_graph(name);
    EXPECT_TRUE(check_schedule(g, solve(g).schedule).empty()) << name;
  }
}

TEST(Check, ViolatedFlowEdgeIsNamed) {
  const Graph g = test_graph("chain");  // A -> B lat 2 (line 10)
  const Schedule s = parse_schedule(g, "ii 4\nstart A 0\nstart B 1\nstart C 4\n", "s");
  const auto p = check_schedule(g, s);
  EXPECT_TRUE(mentions(p, "edge A -> B (flow, line 10) violated: start(B) - start(A) = 1, "
                          "needs >= 2 (lat 2 - II 4 x distance 0)")) << all(p);
}

TEST(Check, ViolatedCarriedEdgeIsNamed) {
  const Graph g = test_graph("chain");  // C -> B carried 1: B + 4 >= C + 1
  const Schedule s = parse_schedule(g, "ii 4\nstart A 0\nstart B 2\nstart C 6\n", "s");
  const auto p = check_schedule(g, s);
  EXPECT_TRUE(mentions(p, "edge C -> B (carried 1, line 12) violated")) << all(p);
  EXPECT_TRUE(mentions(p, "needs >= -3 (lat 1 - II 4 x distance 1)")) << all(p);
}

TEST(Check, ViolatedAntiEdgeNeedsDeeperRing) {
  const Graph g = test_graph("anti");  // legal at II 2 with 4 slots, not with 3
  const auto ok = check_schedule(g, parse_schedule(g, "ii 2\nstart P 0\nstart C 4\nslots ring 4\n", "s"));
  EXPECT_TRUE(ok.empty()) << all(ok);
  const auto p = check_schedule(g, parse_schedule(g, "ii 2\nstart P 0\nstart C 4\nslots ring 3\n", "s"));
  EXPECT_TRUE(mentions(p, "edge C -> P (anti ring, line 12) violated")) << all(p);
  EXPECT_TRUE(mentions(p, "II 2 x distance 3")) << all(p);
}

TEST(Check, ResourceConflictIsNamed) {
  const Graph g = test_graph("resource");  // A occ 2, B 1, C 3, D 1 on unit u
  const auto p = check_schedule(g, parse_schedule(g, "ii 7\nstart A 0\nstart B 1\nstart C 3\nstart D 6\n", "s"));
  EXPECT_TRUE(mentions(p, "resource conflict on unit u: A occupies [0, 2) and B [1, 2) modulo II 7"))
      << all(p);
}

TEST(Check, OccupancyMayWrapRoundTheWindow) {
  const Graph g = test_graph("resource");
  // A holds [6, 8): cycles 6 and 0 of the window. Legal next to B at 1, C at 2, D at 5.
  const auto ok = check_schedule(g, parse_schedule(g, "ii 7\nstart A 6\nstart B 1\nstart C 2\nstart D 5\n", "s"));
  EXPECT_TRUE(ok.empty()) << all(ok);
  // Moving B to 0 collides with A's wrapped cycle.
  const auto p = check_schedule(g, parse_schedule(g, "ii 7\nstart A 6\nstart B 7\nstart C 2\nstart D 5\n", "s"));
  EXPECT_TRUE(mentions(p, "A occupies [6, 8) and B [0, 1) modulo II 7")) << all(p);
}

TEST(Check, OccupancyLongerThanII) {
  const Graph g = test_graph("resource");
  const auto p = check_schedule(g, parse_schedule(g, "ii 2\nstart A 0\nstart B 2\nstart C 4\nstart D 6\n", "s"));
  EXPECT_TRUE(mentions(p, "op C occupies u for 3, longer than II 2")) << all(p);
}

TEST(Check, CapacityAndSlotRange) {
  const Graph g = test_graph("anti_tight");  // 2048 bytes, 1024 per slot
  const auto p = check_schedule(g, parse_schedule(g, "ii 4\nstart P 0\nstart C 4\nslots ring 3\n", "s"));
  EXPECT_TRUE(mentions(p, "capacity smem: buffers take 3072, more than its 2048")) << all(p);
  const Graph b = test_graph("buffers");  // ring slots 1..8
  const auto q = check_schedule(b, parse_schedule(b, "ii 4\nstart W 0\nstart P 4\nstart C 5\nslots ring 9\n", "s"));
  EXPECT_TRUE(mentions(q, "buffer ring: 9 slots is outside its range")) << all(q);
}

void expect_parse_error(const std::string& text, int line, const std::string& what) {
  const Graph g = test_graph("chain");
  try {
    parse_schedule(g, text, "s.txt");
    ADD_FAILURE() << "no error for:\n" << text;
  } catch (const GraphError& e) {
    EXPECT_EQ(e.line(), line) << e.what();
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
  }
}

TEST(ScheduleFile, Errors) {
  expect_parse_error("ii 4\nstart Q 0\n", 2, "unknown op 'Q'");
  expect_parse_error("ii 4\n# c\nbegin A 0\n", 3, "expected 'ii N', 'start OP N' or 'slots BUFFER N'");
  expect_parse_error("ii four\n", 1, "bad number 'four'");
  expect_parse_error("ii 4\nstart A 0\nstart B 2\n", 3, "no start for op C");
  expect_parse_error("start A 0\nstart B 2\nstart C 5\n", 3, "missing or bad 'ii N'");
  expect_parse_error("ii 4\nslots ring 2\n", 2, "unknown buffer 'ring'");
}

TEST(ScheduleFile, RoundTrip) {
  const Graph g = test_graph("anti");
  const Schedule s = solve(g).schedule;
  const Schedule t = parse_schedule(g, format_schedule(g, s), "s");
  EXPECT_EQ(t.ii, s.ii);
  EXPECT_EQ(t.start, s.start);
  EXPECT_EQ(t.slots, s.slots);
}

// Runs the CLI; returns its exit status and (through `out`) stdout and stderr.
int run_cli(const std::string& args, std::string* out) {
  const std::string cmd = std::string(FA4_SCHED_CLI) + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  char buf[4096];
  out->clear();
  for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) out->append(buf, n);
  const int status = pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string write_temp(const std::string& name, const std::string& text) {
  const std::string path = testing::TempDir() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

const std::string kGraphs = std::string(FA4_SCHED_DIR) + "/tests/graphs/";

TEST(CheckCli, LegalAndOptimal) {
  std::string out;
  const std::string s = write_temp("chain_ok.txt", "ii 4\nstart A 0\nstart B 2\nstart C 5\n");
  EXPECT_EQ(run_cli(kGraphs + "chain.graph --check " + s, &out), 0) << out;
  EXPECT_NE(out.find("legal schedule, II 4, 2 stages"), std::string::npos) << out;
  EXPECT_NE(out.find("II 4 is optimal"), std::string::npos) << out;
}

TEST(CheckCli, LegalNotOptimal) {
  std::string out;
  const std::string s = write_temp("chain_slow.txt", "ii 6\nstart A 0\nstart B 2\nstart C 5\n");
  EXPECT_EQ(run_cli(kGraphs + "chain.graph --check " + s, &out), 0) << out;
  EXPECT_NE(out.find("II 6 is not optimal: the minimum is 4"), std::string::npos) << out;
}

TEST(CheckCli, IllegalNamesTheProblem) {
  std::string out;
  const std::string s = write_temp("chain_bad.txt", "ii 4\nstart A 0\nstart B 1\nstart C 5\n");
  EXPECT_EQ(run_cli(kGraphs + "chain.graph --check " + s, &out), 1) << out;
  EXPECT_NE(out.find("illegal schedule"), std::string::npos) << out;
  EXPECT_NE(out.find("edge A -> B (flow, line 10) violated"), std::string::npos) << out;
  EXPECT_NE(out.find("resource conflict on unit alu: B occupies [1, 2) and C [1, 2)"),
            std::string::npos) << out;
}

TEST(CheckCli, ExitStatusOfErrors) {
  std::string out;
  EXPECT_EQ(run_cli(kGraphs + "err_cycle.graph", &out), 3) << out;
  EXPECT_NE(out.find("same-iteration cycle B -> A -> B"), std::string::npos) << out;
  const std::string bad = write_temp("bad.graph", "unit u\nop A w lat 1\n");
  EXPECT_EQ(run_cli(bad, &out), 2) << out;
  EXPECT_NE(out.find("bad.graph:2: unknown unit 'w'"), std::string::npos) << out;
  EXPECT_EQ(run_cli("", &out), 2) << out;
  EXPECT_EQ(run_cli(kGraphs + "chain.graph --frobnicate", &out), 2) << out;
  const std::string s = write_temp("junk.txt", "ii 4\nstart Z 0\n");
  EXPECT_EQ(run_cli(kGraphs + "chain.graph --check " + s, &out), 2) << out;
  EXPECT_NE(out.find("junk.txt:2: unknown op 'Z'"), std::string::npos) << out;
}

}  // namespace
}  // namespace fa4::sched
