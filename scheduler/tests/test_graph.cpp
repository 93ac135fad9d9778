// The graph format: what each declaration means, and that every error names its line.
#include <gtest/gtest.h>

#include <string>

#include "graph.h"

namespace fa4::sched {
namespace {

constexpr const char* kExample = R"(# a comment line
graph demo
time cycles
slot 100
max_ii 1000

unit tma          # trailing comment
unit tc
capacity smem 4096 bytes
capacity tmem 512
buffer ring smem 1024 slots 1..3
buffer fixed smem 512 slots 2
buffer open tmem 128
op Load tma lat 600 occ 200
op Mma tc lat 900
edge Load -> Mma
edge Mma -> Mma carried 2 lat 30
edge Mma -> Load anti ring lat 950
edge Load -> Mma flow lat 7
)";

TEST(GraphFormat, ParsesEveryDeclaration) {
  const Graph g = parse_graph(kExample, "demo.graph");
  EXPECT_EQ(g.name, "demo");
  EXPECT_EQ(g.time_unit, "cycles");
  EXPECT_EQ(g.slot, 100);
  ASSERT_TRUE(g.max_ii.has_value());
  EXPECT_EQ(*g.max_ii, 1000);
  ASSERT_EQ(g.units.size(), 2u);
  ASSERT_EQ(g.capacities.size(), 2u);
  EXPECT_EQ(g.capacities[0].label, "bytes");
  EXPECT_EQ(g.capacities[1].label, "");
  ASSERT_EQ(g.buffers.size(), 3u);
  EXPECT_EQ(g.buffers[0].min_slots, 1);
  EXPECT_EQ(g.buffers[0].max_slots, 3);
  EXPECT_EQ(g.buffers[1].min_slots, 2);
  EXPECT_EQ(g.buffers[1].max_slots, 2);
  EXPECT_EQ(g.buffers[2].min_slots, 1);  // no "slots": 1 and up, bounded by the capacity
  EXPECT_FALSE(g.buffers[2].max_slots.has_value());
  ASSERT_EQ(g.ops.size(), 2u);
  EXPECT_EQ(g.ops[0].occ, 200);
  EXPECT_EQ(g.ops[1].occ, 1);  // default occupancy
  EXPECT_EQ(g.ops[1].line, 15);
  ASSERT_EQ(g.edges.size(), 4u);
  EXPECT_EQ(g.edges[0].kind, EdgeKind::kFlow);
  EXPECT_EQ(g.edges[0].lat, 600);  // the producer's latency by default
  EXPECT_EQ(g.edges[1].kind, EdgeKind::kCarried);
  EXPECT_EQ(g.edges[1].distance, 2);
  EXPECT_EQ(g.edges[1].lat, 30);
  EXPECT_EQ(g.edges[2].kind, EdgeKind::kAnti);
  EXPECT_EQ(g.edges[2].buffer, 0);
  EXPECT_EQ(g.edges[3].lat, 7);
  EXPECT_EQ(g.edges[3].line, 19);
}

TEST(GraphFormat, SlotBoundComesFromCapacityOrRange) {
  const Graph g = parse_graph(kExample, "demo.graph");
  EXPECT_EQ(g.slot_bound(0), 3);  // its own range (capacity would allow (4096 - 1024) / 1024 = 3)
  EXPECT_EQ(g.slot_bound(1), 2);
  EXPECT_EQ(g.slot_bound(2), 4);  // 512 columns / 128
}

TEST(GraphFormat, DescribesEdges) {
  const Graph g = parse_graph(kExample, "demo.graph");
  EXPECT_EQ(g.describe(g.edges[2]), "edge Mma -> Load (anti ring, line 18)");
  EXPECT_EQ(g.describe(g.edges[1]), "edge Mma -> Mma (carried 2, line 17)");
}

// Parses `text` expecting an error at `line` whose message contains `what`.
void expect_error(const std::string& text, int line, const std::string& what) {
  try {
    parse_graph(text, "bad.graph");
    ADD_FAILURE() << "no error for:\n" << text;
  } catch (const GraphError& e) {
    EXPECT_EQ(e.line(), line) << e.what();
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).rfind("bad.graph:" + std::to_string(line) + ": ", 0), 0u)
        << e.what();
  }
}

const std::string kUnits = "unit u\nunit v\n";  // lines 1-2

TEST(GraphErrors, UnknownKeyword) { expect_error("unit u\nopp A u lat 1\n", 2, "unknown keyword 'opp'"); }
TEST(GraphErrors, UnknownUnitListsDeclared) {
  expect_error(kUnits + "op A w lat 1\n", 3, "unknown unit 'w' (declared: u, v)");
}
TEST(GraphErrors, MissingLatency) { expect_error(kUnits + "op A u occ 2\n", 3, "has no latency"); }
TEST(GraphErrors, BadNumber) { expect_error(kUnits + "op A u lat 1x\n", 3, "bad latency '1x'"); }
TEST(GraphErrors, NegativeNumber) {
  expect_error(kUnits + "op A u lat -3\n", 3, "latency must be at least 0");
}
TEST(GraphErrors, ZeroOccupancy) {
  expect_error(kUnits + "op A u lat 1 occ 0\n", 3, "occupancy must be at least 1");
}
TEST(GraphErrors, HugeNumber) { expect_error(kUnits + "op A u lat 99999999999\n", 3, "too large"); }
TEST(GraphErrors, UnknownOpAttribute) {
  expect_error(kUnits + "op A u lat 1 size 4\n", 3, "unknown op attribute 'size'");
}
TEST(GraphErrors, DuplicateOp) {
  expect_error(kUnits + "op A u lat 1\n\nop A v lat 2\n", 5, "op 'A' declared twice");
}
TEST(GraphErrors, DuplicateUnit) { expect_error("unit u\n# x\nunit u\n", 3, "unit 'u' declared twice"); }
TEST(GraphErrors, DuplicateBuffer) {
  expect_error("capacity c 10\nbuffer b c 1\nbuffer b c 1\n", 3, "buffer 'b' declared twice");
}
TEST(GraphErrors, DuplicateCapacity) {
  expect_error("capacity c 10\ncapacity c 5\n", 2, "capacity 'c' declared twice");
}
TEST(GraphErrors, BadIdentifier) { expect_error("unit 3d\n", 1, "bad unit name '3d'"); }
TEST(GraphErrors, TrailingWords) { expect_error("unit u extra\n", 1, "unexpected 'extra'"); }
TEST(GraphErrors, GraphNamedTwice) { expect_error("graph a\ngraph b\n", 2, "graph name given twice"); }
TEST(GraphErrors, EdgeToUnknownOp) {
  expect_error(kUnits + "op A u lat 1\nedge A -> B\n", 4, "unknown op 'B'");
}
TEST(GraphErrors, EdgeBeforeOp) {
  expect_error(kUnits + "edge A -> B\nop A u lat 1\n", 3, "unknown op 'A'");
}
TEST(GraphErrors, EdgeWithoutArrow) {
  expect_error(kUnits + "op A u lat 1\nop B u lat 1\nedge A B\n", 5, "expected '->', got 'B'");
}
TEST(GraphErrors, CarriedDistanceZero) {
  expect_error(kUnits + "op A u lat 1\nedge A -> A carried 0\n", 4, "distance must not be 0");
}
TEST(GraphFormat, NegativeDistanceOrdersAgainstALaterIteration) {
  const Graph g = parse_graph(kUnits + "op A u lat 1\nop B u lat 1\nedge A -> B carried -1\n");
  EXPECT_EQ(g.edges[0].distance, -1);
  expect_error(kUnits + "op A u lat 1\nedge A -> A carried -x\n", 4, "bad distance 'x'");
}
TEST(GraphErrors, AntiUnknownBuffer) {
  expect_error(kUnits + "op A u lat 1\nedge A -> A anti ring\n", 4, "unknown buffer 'ring'");
}
TEST(GraphFormat, AntiAfter) {
  const Graph g = parse_graph(kUnits + "capacity smem 64\nbuffer ring smem 16 slots 2..\nop A u lat 1\nedge A -> A anti ring after 1 lat 5\n");
  EXPECT_EQ(g.edges[0].after, 1);
  EXPECT_EQ(g.edges[0].lat, 5);
  EXPECT_EQ(g.describe(g.edges[0]), "edge A -> A (anti ring after 1, line 6)");
}
TEST(GraphErrors, AfterOutsideAnAntiEdge) {
  expect_error(kUnits + "op A u lat 1\nedge A -> A carried 1 after 1\n", 4, "'after K' belongs to an anti edge");
}
TEST(GraphErrors, AfterBeyondTheBuffersDepth) {
  expect_error(kUnits + "capacity smem 64\nbuffer ring smem 16 slots 1..2\nop A u lat 1\nedge A -> A anti ring after 3\n", 6,
               "buffer 'ring' holds at most 2 slots; a reader 3 iterations after the fill needs 3");
}
TEST(GraphErrors, EdgeKindTwice) {
  expect_error(kUnits + "op A u lat 1\nedge A -> A carried 1 flow\n", 4, "edge kind given twice");
}
TEST(GraphErrors, UnknownEdgeAttribute) {
  expect_error(kUnits + "op A u lat 1\nedge A -> A late 3\n", 4, "unknown edge attribute 'late'");
}
TEST(GraphErrors, BufferUnknownCapacity) {
  expect_error("capacity smem 10\nbuffer b tmem 1\n", 2, "unknown capacity 'tmem' (declared: smem)");
}
TEST(GraphErrors, BuffersOverCapacity) {
  expect_error("capacity smem 100\nbuffer a smem 60\nbuffer b smem 30 slots 2\n", 3,
               "buffers on 'smem' need 120 at their minimum depth, more than its 100");
}
TEST(GraphErrors, EmptySlotRange) {
  expect_error("capacity c 100\nbuffer b c 1 slots 4..2\n", 2, "slot range 4..2 is empty");
}
TEST(GraphErrors, MissingSlotsKeyword) {
  expect_error("capacity c 100\nbuffer b c 1 depth 2\n", 2, "expected 'slots', got 'depth'");
}
TEST(GraphErrors, OccupancyOverMaxII) {
  expect_error("max_ii 4\nunit u\nop A u lat 1 occ 5\n", 3, "occupancy 5 exceeds max_ii 4");
}
TEST(GraphErrors, NoOps) { expect_error("unit u\n\n", 2, "graph has no ops"); }
TEST(GraphErrors, MissingFile) {
  EXPECT_THROW(load_graph("/nonexistent/x.graph"), GraphError);
}

}  // namespace
}  // namespace fa4::sched
