// The shipped graphs: FA4's SM100 forward next to Modular's published result, and fa4's own sm90
// forward and backward (a graph for each head dim's dK/dV kernel). Values asserted here are what
// the graphs give; docs/perf-notes.md ("## Scheduler") explains them. Solve times are printed by fa4-schedule-bench, not tested.
#include <gtest/gtest.h>

#include <algorithm>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "emit.h"
#include "graph.h"
#include "solver.h"

namespace fa4::sched {
namespace {

Graph shipped(const std::string& name) {
  return load_graph(std::string(FA4_SCHED_DIR) + "/graphs/" + name + ".graph");
}

// The summed occupancy of the ops on the unit named `unit`: its busy cycles an iteration.
int64_t busy_on(const Graph& g, const std::string& unit) {
  int64_t busy = 0;
  for (const Op& op : g.ops)
    if (g.units[op.unit].name == unit) busy += op.occ;
  return busy;
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

// FA4's SM100 backward (one CTA, d = 128): tensor memory holds S/P, dV, dP/dS/dQ and dK in its
// 512 columns, so dQ shares dP's columns and the next block's dP waits for the reduction warps to
// load dQ. With whole-tile latencies that recurrence binds above the tensor core's five MMAs; the
// solver's ring depths are FA4's published ones (Q two stages, dO one).
TEST(Sm100Backward, SharedTensorMemoryColumnsBind) {
  const Graph g = shipped("sm100_bwd");
  const Solution sol = solve(g);
  const Schedule& s = sol.schedule;
  EXPECT_EQ(sol.bounds.res_mii, 5 * 512);
  EXPECT_EQ(g.units[sol.bounds.res_unit].name, "tc");
  EXPECT_EQ(sol.bounds.unit_rec_mii, 4240);  // dK -> dQ -> LddQ -> dP -> LddP -> dS -> StdS -> dK
  EXPECT_EQ(s.ii, sol.bounds.unit_rec_mii);
  EXPECT_TRUE(check_schedule(g, s).empty());
  EXPECT_EQ(s.slots[g.find_buffer("Q")], 2);
  EXPECT_EQ(s.slots[g.find_buffer("dO")], 1);
  const std::string cycle = describe(g, sol.bounds.unit_rec_cycle);
  EXPECT_NE(cycle.find("LddQ"), std::string::npos) << cycle;
  EXPECT_NE(cycle.find("dP"), std::string::npos) << cycle;
  int64_t tmem = 0;
  for (const Buffer& b : g.buffers)
    if (g.capacities[b.capacity].name == "tmem") tmem += b.slot_size * s.slots[&b - g.buffers.data()];
  EXPECT_EQ(tmem, 512);
}

TEST(Sm100Backward, WithoutDqOverDpThePOverSRecurrenceBinds) {
  // dQ in columns of its own (which d = 128 does not leave): the next binding cycle is P over S,
  // as in the forward: S -> tensor-memory load -> exponentials -> P stored -> dV -> next S.
  Graph g = shipped("sm100_bwd");
  std::erase_if(g.edges, [&](const Edge& e) { return g.ops[e.src].name == "LddQ" && g.ops[e.dst].name == "dP"; });
  const Solution sol = solve(g);
  EXPECT_EQ(sol.schedule.ii, 3364);
  const std::string cycle = describe(g, sol.bounds.unit_rec_cycle);
  EXPECT_NE(cycle.find("StP"), std::string::npos) << cycle;
  EXPECT_NE(cycle.find("dV"), std::string::npos) << cycle;
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
  EXPECT_EQ(busy_on(g, "tc"), s.ii);
}

// The fp8 forward at d128 (sm90_fwd_fp8.graph, e4m3 GEMMs as calibrated): the four GEMMs take half
// of bf16's cycles (1024). As ptxas builds the kernel, a step's exponentials wait for the P V issued
// beside its S, and the chain exponentials -> the rest -> next S -> that P V -> exponentials, with
// the tensor core held between S and P V, recurs at 1255: above the tensor core, the II the solver
// finds on a ring of two K/V slots. With the wait deferred to the next step (Fp8Config::kDeferPv:
// the two edges gone) the bound falls to the tensor core's 1024, the softmax chain at 954 below it.
// The kernel's block takes ~2500-2700 cycles (docs/perf-notes.md, "The fp8 forward's graph" and
// "The fp8 step's P V wait, hoisted by ptxas").
TEST(Sm90ForwardFp8, HoistedPvWaitBindsAboveTheTensorCore) {
  const Graph g = shipped("sm90_fwd_fp8");
  const Solution sol = solve(g);
  EXPECT_EQ(sol.bounds.res_mii, 4 * 256);
  EXPECT_EQ(g.units[sol.bounds.res_unit].name, "tc");
  EXPECT_EQ(sol.bounds.unit_rec_mii, 1255);
  EXPECT_EQ(sol.schedule.ii, 1255);
  EXPECT_EQ(sol.schedule.slots[g.find_buffer("KV")], 2);
  EXPECT_TRUE(check_schedule(g, sol.schedule).empty());
  // kDeferPv: without the exponentials' wait for P V.
  Graph deferred = g;
  std::erase_if(deferred.edges, [&](const Edge& e) {
    return g.ops[e.dst].name.rfind("Exp", 0) == 0 && g.ops[e.src].name.rfind("O", 0) == 0;
  });
  ASSERT_EQ(deferred.edges.size(), g.edges.size() - 2);
  const Bounds b = lower_bounds(deferred);
  EXPECT_EQ(b.rec_mii, 310 + 100 + 384 + 160);
  EXPECT_EQ(b.mii(), 4 * 256);
  // And without the quarter of exponentials on the FMA pipe (every one on MUFU, the pack alone on
  // the FMA pipe) the softmax chain recurs above the tensor core's bound.
  Graph mufu = deferred;
  for (const char* e : {"Exp0", "Exp1"}) {
    const int op = mufu.find_op(e);
    mufu.ops[op].lat = mufu.ops[op].occ = 512;
    for (Edge& edge : mufu.edges)
      if (edge.src == op) edge.lat = 512;  // (edges carry their producer's latency from the file)
  }
  EXPECT_GT(lower_bounds(mufu).rec_mii, b.res_mii);
}

// The d256 forward (80-key blocks): K and V in 64-column boxes, eight a block, hold the TMA engine
// 2744 cycles at the calibrated 343 a box, above the four GEMMs' 2560; the ring the solver needs
// is the kernel's two stages, which is all that 227 KB holds beside Q. With each tensor one folded
// box a block (the probe's d256_folded_kv), the tensor core binds.
TEST(Sm90ForwardD256, TmaBoundWithTheKernelsTwoStages) {
  const Graph g = shipped("sm90_fwd_d256");
  const Solution sol = solve(g);
  EXPECT_EQ(sol.bounds.res_mii, 8 * 343);
  EXPECT_EQ(g.units[sol.bounds.res_unit].name, "tma");
  EXPECT_EQ(sol.schedule.ii, sol.bounds.res_mii);
  EXPECT_EQ(sol.schedule.slots[g.find_buffer("KV")], 2);
  EXPECT_TRUE(check_schedule(g, sol.schedule).empty());
  Graph folded = g;
  for (const char* load : {"LoadK", "LoadV"}) folded.ops[folded.find_op(load)].occ = 343;
  const Bounds b = lower_bounds(folded);
  EXPECT_EQ(b.res_mii, 4 * 640);
  EXPECT_EQ(folded.units[b.res_unit].name, "tc");
}

// The d192 forward (112-key blocks): three 64-column boxes a tensor a block hold the TMA engine
// 6 x 343 = 2058 cycles, under the four GEMMs' 4 x 672 = 2688, so the tensor core binds (unlike d256's
// eight boxes of 80 keys); the solver's ring is two K/V stages, and a third would not fit beside Q
// in 227 KB (48 + 6 x 42 KB).
TEST(Sm90ForwardD192, TensorCoreBoundWithTwoStages) {
  const Graph g = shipped("sm90_fwd_d192");
  const Solution sol = solve(g);
  EXPECT_EQ(sol.bounds.res_mii, 4 * 672);
  EXPECT_EQ(g.units[sol.bounds.res_unit].name, "tc");
  EXPECT_EQ(sol.schedule.ii, sol.bounds.res_mii);
  EXPECT_EQ(sol.schedule.slots[g.find_buffer("KV")], 2);
  EXPECT_EQ(g.slot_bound(g.find_buffer("KV")), 2);
  EXPECT_TRUE(check_schedule(g, sol.schedule).empty());
}

// 192 / 128 (sm90_fwd_d192_v128.graph: P V over 128 columns, 448 cycles where d192's take 672): the
// tensor core still binds, at 2240, five sixths of d192's step, on the same two K/V stages.
TEST(Sm90ForwardD192V128, TensorCoreBoundAtFiveSixthsOfD192sStep) {
  const Graph g = shipped("sm90_fwd_d192_v128");
  const Solution sol = solve(g);
  EXPECT_EQ(sol.bounds.res_mii, 2 * 672 + 2 * 448);
  EXPECT_EQ(g.units[sol.bounds.res_unit].name, "tc");
  EXPECT_EQ(sol.schedule.ii, sol.bounds.res_mii);
  EXPECT_EQ(sol.schedule.slots[g.find_buffer("KV")], 2);
  EXPECT_TRUE(check_schedule(g, sol.schedule).empty());
}

// The d256 serial step (sm90_fwd_d256_serial.graph: 128-key blocks, K and V in rings of their own,
// S_{j+1} after P_j V_j): the tensor core binds at its four GEMMs, the consumer's chain S -> softmax
// -> P V -> next S under it; one K slot and one V slot are the fewest that keep that II (the
// kernel's D256SerialConfig takes them from the header), with 227 KB or with room for more; and
// the tensor core's order is the kernel's turn ring: S of both consumers, then their P V.
TEST(Sm90ForwardD256Serial, TensorCoreBoundOnOneKAndOneVSlot) {
  const Graph g = shipped("sm90_fwd_d256_serial");
  const Solution sol = solve(g);
  const Schedule& s = sol.schedule;
  EXPECT_EQ(sol.bounds.res_mii, 4 * 1024);
  EXPECT_EQ(g.units[sol.bounds.res_unit].name, "tc");
  EXPECT_EQ(sol.bounds.rec_mii, 1084 + 613 + 54 + 1092);
  EXPECT_EQ(s.ii, 4 * 1024);
  EXPECT_TRUE(check_schedule(g, s).empty());
  for (const char* ring : {"K", "V"}) {
    EXPECT_EQ(s.slots[g.find_buffer(ring)], 1) << ring;
    EXPECT_EQ(g.slot_bound(g.find_buffer(ring)), 1) << ring;  // Q, O and the other ring's slot leave 67 KB
  }
  std::vector<std::pair<int64_t, std::string>> tc;
  for (const char* op : {"S0", "S1", "O0", "O1"}) tc.emplace_back(s.offset(g.find_op(op)), op);
  std::sort(tc.begin(), tc.end());
  std::string order;
  for (size_t k = 0; k < tc.size(); ++k) order += tc[k].second;
  order += order;  // cyclic
  EXPECT_NE(order.find("S0S1O0O1"), std::string::npos) << order;

  Graph roomy = g;
  roomy.capacities[roomy.find_capacity("smem")].amount = 1 << 20;
  const Solution r = solve(roomy);
  EXPECT_EQ(r.schedule.ii, 4 * 1024);
  EXPECT_EQ(r.schedule.slots[g.find_buffer("K")], 1);
  EXPECT_EQ(r.schedule.slots[g.find_buffer("V")], 1);
}

// `g` with the latencies the traced d128 kernel showed in place (sm90_fwd_measured.graph: a GEMM's
// 826 against 568 isolated, the softmax's 1690 against 667) in place of the isolated ones: each
// GEMM's and softmax op's latency scaled by that ratio, and each edge out of the op that waits for
// its result moved by the same amount (issue-order edges, latency 0, stay).
Graph with_d128_in_place_latencies(Graph g) {
  for (Op& op : g.ops) {
    const std::string& unit = g.units[op.unit].name;
    const double ratio = unit == "tc" ? 826.0 / 568.0 : unit == "mufu" || unit == "fma" ? 1690.0 / 667.0 : 1.0;
    const int64_t old_lat = op.lat;
    op.lat = static_cast<int64_t>(old_lat * ratio + 0.5);
    for (Edge& e : g.edges)
      if (&g.ops[e.src] == &op && e.lat >= old_lat) e.lat += op.lat - old_lat;
  }
  return g;
}

// Which d256 design the steady state favours turns on those latencies. Isolated, the serial step's
// II is the tensor core's 4096 a 128-key block (32.0 cycles a key) against the 80-key ring's TMA
// 2744 (34.3). In place, as d128's trace measured them, the serial chain binds: 4854 cycles, and
// the two consumers' chains cannot then share the tensor core without overlapping until the II is
// 5310 (41.5 cycles a key), while the ring stays at its TMA bound: the order the GPU shows at the longer
// causal rows, where the serial step measured 1.1-4.5 % slower (docs/perf-notes.md, "The serial
// step on 128-key blocks at d256"). At 512 the tile boundary decides, and there it is 3.5 % faster.
TEST(Sm90ForwardD256Serial, InPlaceLatenciesMakeTheChainBindAboveTheRing) {
  const Graph serial = shipped("sm90_fwd_d256_serial"), ring = shipped("sm90_fwd_d256");
  const int64_t serial_ii = solve(serial).schedule.ii, ring_ii = solve(ring).schedule.ii;
  EXPECT_LT(serial_ii * 80, ring_ii * 128);  // per key, isolated: the serial step ahead
  const Graph serial_in_place = with_d128_in_place_latencies(serial);
  const Graph ring_in_place = with_d128_in_place_latencies(ring);
  const Solution s = solve(serial_in_place), r = solve(ring_in_place);
  EXPECT_EQ(s.bounds.rec_mii, 1576 + 1553 + 137 + 1588);  // the chain, above the tensor core's 4096
  EXPECT_EQ(s.schedule.ii, 5310);
  const std::string cycle = describe(serial_in_place, s.bounds.rec_cycle);
  EXPECT_NE(cycle.find("O0 -> S0"), std::string::npos) << cycle;
  EXPECT_EQ(r.schedule.ii, ring_ii);  // still the TMA's
  EXPECT_GT(s.schedule.ii * 80, r.schedule.ii * 128);  // per key, in place: the ring ahead
  EXPECT_TRUE(check_schedule(serial_in_place, s.schedule).empty());
}

// The serial step's row, causal 512, as a launch sees it: every SM's share of DRAM is one more
// unit. A head's Q, K, V and O (four 512 x 256 bf16 tensors) cross DRAM once over its ten
// block-steps (pairs of tiles of 4 + 1 and 3 + 2 blocks, the partner's rereads hitting in L2), at
// the rate of a kernel that only reads and writes the attention's bytes (268.4 MB in 86.4 us after
// a clean flush), shared by 132 CTAs at 1980 MHz: 8822 cycles a block-step, twice the tensor core's
// four GEMMs. The steady state measured 9425 (four more rounds of 132 CTAs, 20 block-steps each,
// took 95.2 us; docs/perf-notes.md, "Whole rounds of pairs"), 94 % of it at this rate; without
// tensor work the kernel ran the row 4 % faster, not twice as fast ("The serial step on 128-key
// blocks at d256"). The model puts the bound where those measurements do: on the bytes.
TEST(Sm90ForwardD256Serial, DramBindsTheCausal512Row) {
  Graph g = shipped("sm90_fwd_d256_serial");
  constexpr double kBytesPerStep = 4.0 * 512 * 256 * 2 / 10;
  constexpr double kBytesPerCycle = 268.4e6 / 86.4e-6 / 1.98e9 / 132;
  const int64_t dram = static_cast<int64_t>(kBytesPerStep / kBytesPerCycle + 0.5);
  EXPECT_EQ(dram, 8822);
  g.units.push_back(Unit{"dram", 0});
  Op op;
  op.name = "Dram";
  op.unit = static_cast<int>(g.units.size()) - 1;
  op.lat = dram;
  op.occ = dram;
  g.ops.push_back(op);
  for (const char* load : {"LoadK", "LoadV"}) {  // a block's bytes come through before its loads land
    Edge e;
    e.src = g.find_op("Dram");
    e.dst = g.find_op(load);
    e.lat = 0;
    g.edges.push_back(e);
  }
  const Solution sol = solve(g);
  EXPECT_EQ(g.units[sol.bounds.res_unit].name, "dram");
  EXPECT_EQ(sol.schedule.ii, dram);
  EXPECT_TRUE(check_schedule(g, sol.schedule).empty());
  constexpr int64_t kMeasured = 9425;  // 95.2 us / 20 block-steps at 1980 MHz
  EXPECT_LE(sol.schedule.ii, kMeasured);
  EXPECT_GE(sol.schedule.ii, kMeasured * 9 / 10);
  EXPECT_LT(2 * busy_on(g, "tc"), sol.schedule.ii);  // the tensor core idle more than half the time
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

// The backward's dK/dV kernels, one graph a head dim (sm90_bwd_d64, _d128, _d256), on the TMA
// costs an H200 measured (the calibration part of
// bench/results/2026-11-26-sm90-bwd-candidates-6ac8858-h200.json). At d128 a step's TMA ops hold
// the engine for the measured step mix (2397), carried by the two dQ reductions (the loads hide
// under them: Ld 1); d64, whose dQ a warpgroup computes whole in turn and adds by atomics, holds it
// for its loads' parts (1759); d256, which has no
// reductions, holds it for its parts' sum (two folded boxes, two bulk copies: 1761). The tensor
// core bounds d128 and d256, the TMA's loads d64. d128 needs three step buffers, as the kernel has. d128's dQ runs a
// step behind (it reads the dS^T buffer filled a step earlier: `anti DsT after 1`), so no step
// waits on its own dS^T for dQ: the solver places every op at the tensor core's bound, with two
// dS^T buffers (the kernel's) and warpgroup 1's step half a dozen GEMMs behind warpgroup 0's. With
// dQ in its own step after a CTA barrier (the kernel before 2026-11-28) the same costs gave II
// 2754 with one dS^T buffer. How a mix divides between Ld and the reductions is not measured
// (docs/perf-notes.md, "The backward's pipeline from the solver", "The backward's candidates on an
// H200", "The backward graphs on the calibrated TMA costs", "The d128 backward's warpgroups
// apart").
struct BwdCase {
  const char* graph;
  int64_t tma, tc;  // the two units' summed occupancy a step
  int64_t rec;      // the recurrence bound
  int64_t ii;       // the solver's II
  int stages;
  int ring, dst;    // the solver's buffer depths
  const char* dst_buffer;
  const char* busiest;  // the unit that sets the resource bound
};

void PrintTo(const BwdCase& c, std::ostream* os) { *os << c.graph; }

class Sm90Backward : public ::testing::TestWithParam<BwdCase> {};

TEST_P(Sm90Backward, ScheduleOnTheCalibratedTma) {
  const BwdCase c = GetParam();
  const Graph g = shipped(c.graph);
  const Solution sol = solve(g);
  const Schedule& s = sol.schedule;
  EXPECT_EQ(busy_on(g, "tma"), c.tma);
  EXPECT_EQ(busy_on(g, "tc"), c.tc);
  EXPECT_EQ(sol.bounds.res_mii, std::max(c.tma, c.tc));
  EXPECT_EQ(g.units[sol.bounds.res_unit].name, c.busiest);
  EXPECT_EQ(sol.bounds.rec_mii, c.rec);
  EXPECT_EQ(s.ii, c.ii);
  EXPECT_EQ(s.stages(), c.stages);
  EXPECT_EQ(s.slots[g.find_buffer("Ring")], c.ring);
  EXPECT_EQ(s.slots[g.find_buffer(c.dst_buffer)], c.dst);
  EXPECT_TRUE(check_schedule(g, s).empty());
  // The two warpgroups' steps overlap: warpgroup 1's S^T starts while warpgroup 0's step runs.
  const int s0 = g.find_op("S0"), s1 = g.find_op("S1");
  EXPECT_GT(s.start[s1], s.start[s0]);
  EXPECT_LT(s.start[s1] - s.start[s0], s.ii);
}

// d64's dQ is one warpgroup's a step, in turn, a step behind, added by atomics (no reduction): the
// loads' parts hold the TMA for 1759, above the tensor core's 1280, and the loads issued after S_0
// / dP_0 for the next step bind above both (Ld -> S0 -> Ld, 1861; with dP_0's occupancy 1989): the
// solver answers II 1989 with two step buffers and one dS^T buffer, where the kernel has four of
// each. The graph leaves out which warpgroup's step the dQ chain ends (it alternates), so its II is
// a lower bound for the kernel's. (With the partials summed in lockstep and the loads at the step's
// top, the graph before answered II 1486; with a reduction of each partial the TMA's 2297 bound
// it.) d128: the tensor core's 2560, at the bound.
INSTANTIATE_TEST_SUITE_P(
    HeadDims, Sm90Backward,
    ::testing::Values(BwdCase{"sm90_bwd_d64", 1759, 10 * 128, 1861, 1989, 2, 2, 1, "DsT", "tma"},
                      BwdCase{"sm90_bwd_d128", 2397, 10 * 256, 1863, 10 * 256, 3, 3, 2, "DsT", "tc"}),
    [](const ::testing::TestParamInfo<BwdCase>& i) { return std::string(i.param.graph); });

// d256 loads Q and dO as one folded box each (two boxes and two bulk copies a step, no
// reductions): the tensor core's ten GEMMs set the resource bound, and no recurrence reaches it.
// The full solve is left out here: proving each II below the answer infeasible takes Z3 about
// seven minutes on this graph, with the rotation pin (docs/perf-notes.md).
TEST(Sm90Backward, D256FoldedLoadsLeaveTheTensorCoreTheResourceBound) {
  const Graph g = shipped("sm90_bwd_d256");
  EXPECT_EQ(busy_on(g, "tma"), 1761);  // 2 x 350 + 2 x 530.5
  const Bounds b = lower_bounds(g);
  EXPECT_EQ(b.res_mii, 10 * 256);
  EXPECT_EQ(g.units[b.res_unit].name, "tc");
  EXPECT_EQ(b.mii(), b.res_mii);
}

// The d192 graphs below: the TMA engine's busy cycles (the dQ reductions') set the resource bound,
// above the tensor core's `tc_busy`, and the recurrences stay below it.
void expect_reductions_bound(const char* graph, int64_t tma_busy, int64_t tc_busy, int64_t rec_mii) {
  const Graph g = shipped(graph);
  EXPECT_EQ(busy_on(g, "tma"), tma_busy) << graph;
  EXPECT_EQ(busy_on(g, "tc"), tc_busy) << graph;
  const Bounds b = lower_bounds(g);
  EXPECT_EQ(b.res_mii, tma_busy) << graph;
  EXPECT_EQ(g.units[b.res_unit].name, "tma") << graph;
  EXPECT_EQ(b.rec_mii, rec_mii) << describe(g, b.rec_cycle);
  EXPECT_EQ(b.mii(), b.res_mii) << graph;
}

// d192 (the split kernel by operand: warpgroup 0 dV, warpgroup 1 dK, dQ's three pieces staged and
// bulk-reduced): three 16 KB reductions a step hold the TMA engine for 3 x 1198, above the tensor
// core's ten GEMMs at 192 columns (1920), so the reductions set the resource bound; the longest
// recurrence (a warpgroup's step through its two pieces, the second waiting for the first's read
// of the stage) is 2408. The full solve (44 s here, fa4-schedule) answers II 3891 in two stages
// with two step buffers (docs/perf-notes.md, "A backward kernel of its own at d192").
TEST(Sm90Backward, D192ReductionsSetTheResourceBound) {
  expect_reductions_bound("sm90_bwd_d192", 3 * 1198 + 1, 10 * 192, 2408);
}

// 192 / 128 (the same kernel with the value side at 128 columns): the tensor core's work falls to
// 1664 a step, the reductions' 3595 stay, so the value side's narrower GEMMs leave the bound where
// it was (fa4-schedule: II 3739, against d192's 3891); what 192 / 128 gains on its own kernels is
// the copies that padding v, o and dO to 192 would cost.
TEST(Sm90Backward, D192V128ReductionsStillSetTheResourceBound) {
  expect_reductions_bound("sm90_bwd_d192_v128", 3 * 1198 + 1, 2 * 192 + 2 * 128 + 256 + 384 + 3 * 128, 2279);
}

// sm90_bwd_d192_n96.graph, a candidate not built: 96 keys a CTA (48 a warpgroup, the dK/dV GEMMs
// transposed), the same 48 KB of dQ reductions a step for 1.5 times the keys. The tensor core's
// ten GEMMs (2880) come closer to the reductions (3596) but stay below them.
TEST(Sm90Backward, D192NinetySixKeysNarrowTheReductionsLead) {
  expect_reductions_bound("sm90_bwd_d192_n96", 2 * 1797 + 2, 10 * 288, 1427);
  const Graph g = shipped("sm90_bwd_d192_n96");
  const Bounds b = lower_bounds(g);
  EXPECT_EQ(b.unit_rec_mii, 2550) << describe(g, b.unit_rec_cycle);
}

// sm90_bwd_d256_measured.graph: the same kernel with the latencies its clock64 stamps show in
// place on an H200 (a91c2b4, 4k non-causal). Each warpgroup's step, through its two pieces of dQ
// atomics, is a recurrence of 6409 cycles, the traced period, 2.5 times the tensor core's 2560.
// Taking the atomics' time out of the edges that leave them predicts what the probe measured with
// them left out (results aside): the second piece's 1.21 against 1.18-1.30, both pieces' 1.52
// against 1.40-1.65 (docs/perf-notes.md, "What bounds d256's backward step"). Bounds only: the full
// solve takes minutes on this graph, as on the isolated one.
TEST(Sm90Backward, D256InPlaceLatenciesMakeTheDqAtomicsBind) {
  const Graph g = shipped("sm90_bwd_d256_measured");
  const Bounds b = lower_bounds(g);
  EXPECT_EQ(b.res_mii, 10 * 256);
  EXPECT_EQ(g.units[b.res_unit].name, "tc");
  EXPECT_EQ(b.mii(), 6409);
  EXPECT_EQ(b.unit_rec_mii, 6409);
  const std::string cycle = describe(g, b.unit_rec_cycle);
  EXPECT_NE(cycle.find("Ata0"), std::string::npos) << cycle;
  EXPECT_NE(cycle.find("Atb0"), std::string::npos) << cycle;
  // The atomics of `ops` take no time: every edge leaving them loses their latency.
  auto without = [&](std::vector<std::string> ops) {
    Graph h = g;
    for (const std::string& name : ops) {
      const int op = h.find_op(name);
      for (Edge& e : h.edges)
        if (e.src == op) e.lat -= h.ops[op].lat;
      h.ops[op].lat = 0;
    }
    return double(b.mii()) / double(lower_bounds(h).mii());
  };
  const double second = without({"Atb0", "Atb1"}), both = without({"Ata0", "Ata1", "Atb0", "Atb1"});
  EXPECT_GE(second, 1.18);
  EXPECT_LE(second, 1.30);
  EXPECT_GE(both, 1.40);
  EXPECT_LE(both, 1.65);
}

// What the bound says of one bulk copy a step for the LSE and D rows (kPairedStats), on the step
// mixes the H200 measured for it with the shipped boxes: "d128_folded_one_bulk" 2397, the mix the
// d128 graph holds already; "d256_folded_one_bulk" 828 for d256's loads. d64, which adds dQ by
// atomics, has no mix measured without reductions: its loads' parts with one copy (2 x 349 +
// 530.5) leave the tensor core the resource bound, and the recurrence through the load issue
// (1989 with dP_0's occupancy) binds above it either way. Every head dim is then bound by the tensor core's resources.
TEST(Sm90BackwardLoads, OneBulkCopyLeavesTheTensorCoreTheResourceBound) {
  struct Case {
    const char* graph;
    int64_t ld_occ, red_occ;  // red_occ 0: the graph has no reductions
    std::vector<const char*> reds;
    int64_t expect_res;
    const char* unit;
  };
  for (const Case& c : {Case{"sm90_bwd_d64", 1229, 0, {}, 10 * 128, "tc"},
                        Case{"sm90_bwd_d128", 1, 1198, {"Red0", "Red1"}, 10 * 256, "tc"},
                        Case{"sm90_bwd_d256", 828, 0, {}, 10 * 256, "tc"}}) {
    Graph g = shipped(c.graph);
    g.ops[g.find_op("Ld")].occ = c.ld_occ;
    for (const char* red : c.reds) g.ops[g.find_op(red)].occ = c.red_occ;
    EXPECT_EQ(busy_on(g, "tma"), c.ld_occ + int64_t(c.reds.size()) * c.red_occ) << c.graph;
    const Bounds b = lower_bounds(g);
    EXPECT_EQ(b.res_mii, c.expect_res) << c.graph;
    EXPECT_EQ(g.units[b.res_unit].name, c.unit) << c.graph;
    if (std::string(c.graph) == "sm90_bwd_d64") EXPECT_EQ(b.mii(), 1989) << c.graph;
  }
}

}  // namespace
}  // namespace fa4::sched
