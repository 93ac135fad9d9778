#include "emit.h"

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <sstream>

namespace fa4::sched {

namespace {

std::string pad(const std::string& s, size_t width) {
  return s.size() >= width ? s : s + std::string(width - s.size(), ' ');
}

size_t widest_unit(const Graph& g) {
  size_t w = 4;
  for (const Unit& u : g.units) w = std::max(w, u.name.size());
  return w;
}

// "S0[j-1]" for an op of stage `stage` seen from the window where iteration `j` enters.
std::string at_iteration(const std::string& op, const std::string& base, int64_t back) {
  if (back == 0) return op + "[" + base + "]";
  return op + "[" + base + "-" + std::to_string(back) + "]";
}

char label_of(int i) {
  static const char* kLabels = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  return i < 62 ? kLabels[i] : '?';
}

// "1 stage", "2 stages".
std::string count(size_t n, const char* what) {
  return std::to_string(n) + " " + what + (n == 1 ? "" : "s");
}

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

std::string json_string(const std::string& s) {
  std::string o = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    o += c;
  }
  return o + "\"";
}

}  // namespace

std::vector<int> steady_order(const Graph& g, const Schedule& s) {
  std::vector<int> order(g.ops.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return s.offset(a) < s.offset(b); });
  return order;
}

std::string reservation_table(const Graph& g, const Schedule& s) {
  std::ostringstream o;
  const int64_t cols = std::min<int64_t>(s.ii, 64);
  const int64_t width = (s.ii + cols - 1) / cols;  // time per column
  o << "modulo reservation table: II = " << s.ii << " " << g.time_unit;
  if (width > 1) o << ", one column = " << width << " " << g.time_unit;
  o << "\n";
  const size_t uw = widest_unit(g);
  for (size_t u = 0; u < g.units.size(); ++u) {
    std::string row(cols, '.');
    std::string spans;
    for (int op : steady_order(g, s)) {
      if (g.ops[op].unit != static_cast<int>(u)) continue;
      const int64_t r = s.offset(op);
      // [r, r + occ) modulo II is at most two segments: up to the window's end, then wrapped.
      const int64_t end = std::min(r + g.ops[op].occ, s.ii), wrapped = r + g.ops[op].occ - s.ii;
      auto mark = [&](int64_t a, int64_t b) {
        for (int64_t c = a / width; b > a && c <= (b - 1) / width; ++c)
          row[c] = (row[c] == '.' || row[c] == label_of(op)) ? label_of(op) : '+';
      };
      mark(r, end);
      mark(0, std::min(wrapped, r));
      spans += "  " + g.ops[op].name + " [" + std::to_string(r) + ", " +
               std::to_string(r + g.ops[op].occ) + ")";
    }
    o << "  " << pad(g.units[u].name, uw) << " |" << row << "|" << spans << "\n";
  }
  o << "  (";
  for (size_t i = 0; i < g.ops.size(); ++i)
    o << (i ? " " : "") << label_of(static_cast<int>(i)) << "=" << g.ops[i].name;
  o << "; + = several ops in one column)\n";
  return o.str();
}

std::string loop_by_unit(const Graph& g, const Schedule& s) {
  std::ostringstream o;
  const int stages = s.stages();
  const size_t uw = widest_unit(g);
  const std::vector<int> order = steady_order(g, s);
  // One window of the loop: the ops of stages [lo, hi], with iteration labels.
  auto window = [&](int lo, int hi, auto label) {
    for (size_t u = 0; u < g.units.size(); ++u) {
      std::string line;
      for (int op : order) {
        const int64_t st = s.stage(op);
        if (g.ops[op].unit != static_cast<int>(u) || st < lo || st > hi) continue;
        line += " " + label(op, st) + "@" + std::to_string(s.offset(op));
      }
      if (!line.empty()) o << "    " << pad(g.units[u].name, uw) << line << "\n";
    }
  };
  o << "loop by unit (" << count(stages, "stage") << "; X[i]@t = op X of iteration i at offset t of the window):\n";
  if (stages > 1) {
    o << "  prologue\n";
    for (int w = 0; w + 1 < stages; ++w) {
      o << "   window " << w << "\n";
      window(0, w, [&](int op, int64_t st) {
        return g.ops[op].name + "[" + std::to_string(w - st) + "]";
      });
    }
  }
  o << "  steady state (iteration j enters)\n";
  window(0, stages - 1, [&](int op, int64_t st) { return at_iteration(g.ops[op].name, "j", st); });
  if (stages > 1) {
    o << "  epilogue (N iterations)\n";
    for (int e = 1; e < stages; ++e) {
      o << "   window " << e << " after the last\n";
      window(e, stages - 1, [&](int op, int64_t st) {
        return at_iteration(g.ops[op].name, "N", st - e + 1);
      });
    }
  }
  return o.str();
}

std::string report(const Graph& g, const Solution& sol) {
  std::ostringstream o;
  const Schedule& s = sol.schedule;
  const Bounds& b = sol.bounds;
  int kinds[3] = {0, 0, 0};
  for (const Edge& e : g.edges) ++kinds[static_cast<int>(e.kind)];
  o << "graph " << g.name << ": " << count(g.ops.size(), "op") << " on "
    << count(g.units.size(), "unit") << ", " << count(g.edges.size(), "edge") << " (" << kinds[0]
    << " flow, " << kinds[1] << " carried, " << kinds[2] << " anti), "
    << count(g.buffers.size(), "buffer") << "\n";
  o << "ResMII " << b.res_mii << " (unit " << (b.res_unit >= 0 ? g.units[b.res_unit].name : "-")
    << ")\nRecMII " << b.rec_mii;
  if (!b.rec_cycle.edges.empty()) o << " (cycle " << describe(g, b.rec_cycle) << ")";
  if (b.unit_rec_mii > b.rec_mii)
    o << "\nRecMII counting unit occupancy " << b.unit_rec_mii << " (cycle "
      << describe(g, b.unit_rec_cycle) << ")";
  o << "\nII " << s.ii << " " << g.time_unit;
  if (g.slot > 0)
    o << " = " << fixed(static_cast<double>(s.ii) / g.slot, 2) << " slots of " << g.slot;
  o << ", " << count(s.stages(), "stage");
  for (size_t i = 0; i < g.buffers.size(); ++i)
    o << (i ? ", " : "; buffers ") << g.buffers[i].name << " " << s.slots[i];
  o << "\nsolved in " << fixed(sol.stats.seconds * 1e3, 1) << " ms (minimal II after "
    << fixed(sol.stats.seconds_ii * 1e3, 1) << " ms; " << sol.stats.iis_tried << " II tried, "
    << sol.stats.checks << " Z3 checks)\n\n";

  o << "ops (order = steady-state issue order):\n";
  o << "  " << pad("op", 10) << pad("unit", widest_unit(g) + 2) << pad("start", 8)
    << pad("stage", 7) << pad("offset", 8) << "order\n";
  const std::vector<int> order = steady_order(g, s);
  for (size_t i = 0; i < g.ops.size(); ++i) {
    const int rank = static_cast<int>(std::find(order.begin(), order.end(), i) - order.begin());
    o << "  " << pad(g.ops[i].name, 10) << pad(g.units[g.ops[i].unit].name, widest_unit(g) + 2)
      << pad(std::to_string(s.start[i]), 8) << pad(std::to_string(s.stage(i)), 7)
      << pad(std::to_string(s.offset(i)), 8) << rank << "\n";
  }
  o << "\n" << reservation_table(g, s) << "\n" << loop_by_unit(g, s);
  return o.str();
}

std::string to_json(const Graph& g, const Solution& sol) {
  const Schedule& s = sol.schedule;
  const Bounds& b = sol.bounds;
  std::ostringstream o;
  int kinds[3] = {0, 0, 0};
  for (const Edge& e : g.edges) ++kinds[static_cast<int>(e.kind)];
  o << "{\n  \"graph\": " << json_string(g.name) << ",\n  \"time_unit\": "
    << json_string(g.time_unit) << ",\n  \"ops\": " << g.ops.size() << ",\n  \"units\": "
    << g.units.size() << ",\n  \"edges\": {\"flow\": " << kinds[0] << ", \"carried\": " << kinds[1]
    << ", \"anti\": " << kinds[2] << "},\n";
  o << "  \"res_mii\": " << b.res_mii << ",\n  \"res_unit\": "
    << json_string(b.res_unit >= 0 ? g.units[b.res_unit].name : "") << ",\n  \"rec_mii\": "
    << b.rec_mii << ",\n  \"rec_cycle\": [";
  for (size_t i = 0; i < b.rec_cycle.edges.size(); ++i)
    o << (i ? ", " : "") << json_string(g.ops[g.edges[b.rec_cycle.edges[i]].src].name);
  o << "],\n  \"unit_rec_mii\": " << b.unit_rec_mii << ",\n  \"unit_rec_cycle\": [";
  for (size_t i = 0; i < b.unit_rec_cycle.edges.size(); ++i)
    o << (i ? ", " : "") << json_string(g.ops[g.edges[b.unit_rec_cycle.edges[i]].src].name);
  o << "],\n  \"ii\": " << s.ii << ",\n";
  if (g.slot > 0) o << "  \"ii_slots\": " << fixed(static_cast<double>(s.ii) / g.slot, 4) << ",\n";
  o << "  \"stages\": " << s.stages() << ",\n  \"buffers\": {";
  for (size_t i = 0; i < g.buffers.size(); ++i)
    o << (i ? ", " : "") << json_string(g.buffers[i].name) << ": " << s.slots[i];
  o << "},\n  \"schedule\": [\n";
  const std::vector<int> order = steady_order(g, s);
  for (size_t k = 0; k < order.size(); ++k) {
    const int i = order[k];
    o << "    {\"op\": " << json_string(g.ops[i].name) << ", \"unit\": "
      << json_string(g.units[g.ops[i].unit].name) << ", \"start\": " << s.start[i]
      << ", \"stage\": " << s.stage(i) << ", \"offset\": " << s.offset(i) << ", \"order\": " << k
      << "}" << (k + 1 < order.size() ? "," : "") << "\n";
  }
  o << "  ],\n  \"solve\": {\"seconds\": " << fixed(sol.stats.seconds, 6) << ", \"seconds_ii\": "
    << fixed(sol.stats.seconds_ii, 6) << ", \"iis_tried\": " << sol.stats.iis_tried
    << ", \"checks\": " << sol.stats.checks << "}\n}\n";
  return o.str();
}

std::string emit_header(const Graph& g, const Schedule& s) {
  std::ostringstream o;
  std::string file = g.file;
  if (auto slash = file.find_last_of('/'); slash != std::string::npos) file = file.substr(slash + 1);
  o << "// Generated by fa4-schedule from " << file << "; do not edit (a ctest regenerates it and\n"
    << "// fails on any difference). Modulo schedule: a new iteration starts every kII "
    << g.time_unit << ";\n"
    << "// in the steady state, op X of stage s works on iteration j - s while iteration j "
       "enters.\n"
    << "#pragma once\n\nnamespace fa4::sched::" << g.name << " {\n\n";
  o << "enum class Unit : int {";
  for (size_t u = 0; u < g.units.size(); ++u) o << (u ? ", " : " ") << g.units[u].name;
  o << " };\nenum class Op : int {";
  for (size_t i = 0; i < g.ops.size(); ++i) o << (i ? ", " : " ") << g.ops[i].name;
  o << " };\n\n";
  o << "inline constexpr int kII = " << s.ii << ";  // " << g.time_unit << "\n";
  o << "inline constexpr int kStages = " << s.stages() << ";\n";
  for (size_t b = 0; b < g.buffers.size(); ++b)
    o << "inline constexpr int k" << g.buffers[b].name << "Stages = " << s.slots[b]
      << ";  // buffer " << g.buffers[b].name << ": slots in the ring\n";
  o << "inline constexpr int kNumOps = " << g.ops.size() << ";\n\n";
  o << "struct Step {\n  Op op;\n  Unit unit;\n  int stage;   // iteration j - stage\n"
    << "  int offset;  // " << g.time_unit << " into the II window\n};\n\n";
  o << "// The steady state in issue order.\ninline constexpr Step kSteadyState[kNumOps] = {\n";
  for (int i : steady_order(g, s))
    o << "    {Op::" << g.ops[i].name << ", Unit::" << g.units[g.ops[i].unit].name << ", "
      << s.stage(i) << ", " << s.offset(i) << "},\n";
  o << "};\n\n// Stage of each op, indexed by Op.\ninline constexpr int kStageOf[kNumOps] = {";
  for (size_t i = 0; i < g.ops.size(); ++i) o << (i ? ", " : "") << s.stage(static_cast<int>(i));
  o << "};\n\n// Start of each op in iteration 0, indexed by Op; iteration i adds i * kII. (Op a of\n"
    << "// iteration i starts before op b of iteration k when kStart[a] + i * kII < kStart[b] + k * kII.)\n"
    << "inline constexpr int kStart[kNumOps] = {";
  for (size_t i = 0; i < g.ops.size(); ++i) o << (i ? ", " : "") << s.start[i];
  o << "};\n\n}  // namespace fa4::sched::" << g.name << "\n";
  return o.str();
}

}  // namespace fa4::sched
