// Modulo scheduling of a pipeline graph.
//
// Every op gets a start time tau (in the graph's time unit, iteration 0). Iteration i runs it at
// tau + i * II. A schedule is legal when
//   - every edge holds:         tau(dst) - tau(src) >= lat(edge) - II * distance(edge)
//   - no unit is double-booked: ops of one unit occupy disjoint intervals modulo II
//   - buffers fit:              sum of slots * slot size <= capacity, per capacity
// The solver finds the smallest II, then the fewest stages (stage = tau / II), then the fewest
// buffer slots in total, then (only to make the answer unique) the earliest start of each op in
// declaration order.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "graph.h"

namespace fa4::sched {

struct Schedule {
  int64_t ii = 0;
  std::vector<int64_t> start;  // per op, iteration 0
  std::vector<int> slots;      // per buffer

  int64_t stage(int op) const;   // floor(start / II)
  int64_t offset(int op) const;  // start mod II: where the op sits in the steady-state window
  int stages() const;            // 1 + the largest stage (with every start >= 0)
};

// A dependence cycle: edge indices in order, with their summed latency and distance.
struct Cycle {
  std::vector<int> edges;
  int64_t lat = 0;
  int64_t distance = 0;
};

struct Bounds {
  int64_t res_mii = 0;  // max over units of the summed occupancy
  int res_unit = -1;
  int64_t rec_mii = 0;  // max over cycles of ceil(lat / distance), anti edges at their deepest
  Cycle rec_cycle;      // a cycle attaining rec_mii (empty if the graph has no cycle)
  // The same with each edge between two ops of one unit counted at least at the producer's
  // occupancy (the consumer cannot start while the producer holds the unit): >= rec_mii.
  int64_t unit_rec_mii = 0;
  Cycle unit_rec_cycle;
  int64_t mii() const { return std::max({res_mii, rec_mii, unit_rec_mii}); }
};

struct SolveStats {
  double seconds = 0;       // the whole solve
  double seconds_ii = 0;    // until the minimal II was found
  int iis_tried = 0;
  int checks = 0;           // Z3 satisfiability checks
};

struct Solution {
  Bounds bounds;
  Schedule schedule;
  SolveStats stats;
};

// A graph that no schedule satisfies; what() names the cycle, unit or capacity at fault.
class ScheduleError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Edge distance with anti edges at the given buffer depths.
int64_t edge_distance(const Edge& e, const std::vector<int>& slots);

Bounds lower_bounds(const Graph& g);  // throws ScheduleError for a same-iteration cycle
Solution solve(const Graph& g);       // throws ScheduleError when no II works

// "A -> B -> A (latency 12, distance 1)".
std::string describe(const Graph& g, const Cycle& c);

// Legality of a given schedule: each problem names the edge, unit or capacity at fault.
std::vector<std::string> check_schedule(const Graph& g, const Schedule& s);

// The schedule text format ("ii N", "start OP N", "slots BUFFER N"; '#' comments).
Schedule parse_schedule(const Graph& g, const std::string& text, const std::string& file);
std::string format_schedule(const Graph& g, const Schedule& s);

}  // namespace fa4::sched
