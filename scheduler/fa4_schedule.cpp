// fa4-schedule: modulo-schedule a pipeline graph, check a given schedule, emit the kernel header.
//
//   fa4-schedule GRAPH [--json] [--emit-header OUT.h] [--write-schedule OUT] [--check SCHEDULE]
//
// Exit status: 0 done (a checked schedule is legal), 1 the checked schedule is illegal,
// 2 bad usage or a bad graph / schedule file, 3 no schedule exists for the graph.
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "emit.h"
#include "graph.h"
#include "solver.h"

namespace {

using namespace fa4::sched;

constexpr const char* kUsage =
    "usage: fa4-schedule GRAPH [options]\n"
    "  --json                 print the result as JSON instead of the report\n"
    "  --emit-header FILE     write the C++ header of constexpr schedule tables\n"
    "  --write-schedule FILE  write the schedule in the --check format\n"
    "  --check FILE           verify that schedule: legal? minimal II? (names what is violated)\n"
    "  --help                 this text\n";

std::string read_file(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw GraphError(path, 0, "cannot open file");
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path);
  f << text;
  if (!f) throw GraphError(path, 0, "cannot write file");
}

int check(const Graph& g, const std::string& path) {
  const Schedule s = parse_schedule(g, read_file(path), path);
  const std::vector<std::string> problems = check_schedule(g, s);
  if (!problems.empty()) {
    std::cout << path << ": illegal schedule (" << problems.size() << " problem"
              << (problems.size() > 1 ? "s" : "") << ")\n";
    for (const std::string& p : problems) std::cout << "  " << p << "\n";
    return 1;
  }
  std::cout << path << ": legal schedule, II " << s.ii << ", " << s.stages() << " stages\n";
  const Solution best = solve(g);
  if (best.schedule.ii == s.ii)
    std::cout << "  II " << s.ii << " is optimal";
  else
    std::cout << "  II " << s.ii << " is not optimal: the minimum is " << best.schedule.ii;
  std::cout << " (bounds: ResMII " << best.bounds.res_mii << ", RecMII " << best.bounds.rec_mii
            << "; fewest stages at the minimum II: " << best.schedule.stages() << ")\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string graph_path, header_path, schedule_out, check_path;
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](std::string& dst) {
      if (i + 1 >= argc) {
        std::cerr << "fa4-schedule: " << a << " needs a file name\n" << kUsage;
        std::exit(2);
      }
      dst = argv[++i];
    };
    if (a == "--help" || a == "-h") {
      std::cout << kUsage;
      return 0;
    } else if (a == "--json") {
      json = true;
    } else if (a == "--emit-header") {
      value(header_path);
    } else if (a == "--write-schedule") {
      value(schedule_out);
    } else if (a == "--check") {
      value(check_path);
    } else if (a.rfind("--", 0) == 0 || !graph_path.empty()) {
      std::cerr << "fa4-schedule: unexpected argument '" << a << "'\n" << kUsage;
      return 2;
    } else {
      graph_path = a;
    }
  }
  if (graph_path.empty()) {
    std::cerr << kUsage;
    return 2;
  }
  try {
    const Graph g = load_graph(graph_path);
    if (!check_path.empty()) return check(g, check_path);
    const Solution sol = solve(g);
    std::cout << (json ? to_json(g, sol) : report(g, sol));
    if (!header_path.empty()) write_file(header_path, emit_header(g, sol.schedule));
    if (!schedule_out.empty()) write_file(schedule_out, format_schedule(g, sol.schedule));
    return 0;
  } catch (const GraphError& e) {
    std::cerr << "fa4-schedule: " << e.what() << "\n";
    return 2;
  } catch (const ScheduleError& e) {
    std::cerr << "fa4-schedule: " << graph_path << ": no schedule: " << e.what() << "\n";
    return 3;
  }
}
