// Prints how long the solver takes on each shipped graph (median of several runs). Solve times
// are reported here, never asserted by a test.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "graph.h"
#include "solver.h"

int main(int argc, char** argv) {
  using namespace fa4::sched;
  const int runs = argc > 1 ? std::max(1, std::atoi(argv[1])) : 5;
  const std::string dir = FA4_SCHED_DIR;
  const char* graphs[] = {"graphs/sm100_fwd.graph", "graphs/sm100_fwd_slots.graph", "graphs/sm100_bwd.graph",
                          "graphs/sm90_fwd.graph", "graphs/sm90_fwd_d256.graph", "graphs/sm90_fwd_d256_serial.graph",
                          "graphs/sm90_fwd_fp8.graph",
                          "graphs/sm90_bwd_d64.graph", "graphs/sm90_bwd_d128.graph", "graphs/sm90_bwd_d256.graph"};
  std::printf("%-30s %4s %8s %7s %6s %6s %12s %12s\n", "graph", "ops", "II", "stages", "IIs",
              "checks", "min II ms", "total ms");
  for (const char* name : graphs) {
    const Graph g = load_graph(dir + "/" + name);
    std::vector<double> total, first;
    Solution sol;
    for (int r = 0; r < runs; ++r) {
      sol = solve(g);
      total.push_back(sol.stats.seconds * 1e3);
      first.push_back(sol.stats.seconds_ii * 1e3);
    }
    std::sort(total.begin(), total.end());
    std::sort(first.begin(), first.end());
    std::printf("%-30s %4zu %8lld %7d %6d %6d %12.2f %12.2f\n", name, g.ops.size(),
                static_cast<long long>(sol.schedule.ii), sol.schedule.stages(),
                sol.stats.iis_tried, sol.stats.checks, first[runs / 2], total[runs / 2]);
  }
  std::printf("(median of %d runs; 'min II ms' = until the minimal II was proven feasible, "
              "'total' adds the stage, buffer and canonical-start minimisation)\n", runs);
  return 0;
}
