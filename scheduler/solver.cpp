// The modulo-scheduling formulation, in one place:
//   lower bounds  ResMII (unit occupancy) and RecMII (dependence cycles, Bellman-Ford);
//   the Z3 model  integer start tau = II * k + r per op (0 <= r < II) for a fixed II, edges as
//                 difference constraints, pairwise non-overlap of the r-intervals on each unit,
//                 buffer depths as integer variables under their capacities;
//   the search    the smallest satisfiable II at or above max(ResMII, RecMII) (galloping, then
//                 bisection: feasibility is monotone in II, see solve()), each II's check with
//                 one op's offset pinned (rotation symmetry, Model::pin_rotation); then, on the
//                 unpinned model, the fewest stages, the fewest slots and a canonical (earliest)
//                 start per op.
#include "solver.h"

#include <z3++.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <sstream>

namespace fa4::sched {

int64_t Schedule::stage(int op) const {
  const int64_t t = start[op];
  return t >= 0 ? t / ii : -((-t + ii - 1) / ii);
}
int64_t Schedule::offset(int op) const { return start[op] - stage(op) * ii; }
int Schedule::stages() const {
  int64_t hi = 0;
  for (size_t i = 0; i < start.size(); ++i) hi = std::max(hi, stage(static_cast<int>(i)));
  return static_cast<int>(hi) + 1;
}

int64_t edge_distance(const Edge& e, const std::vector<int>& slots) {
  switch (e.kind) {
    case EdgeKind::kFlow: return 0;
    case EdgeKind::kCarried: return e.distance;
    case EdgeKind::kAnti: return slots[e.buffer] - e.after;
  }
  return 0;
}

std::string describe(const Graph& g, const Cycle& c) {
  std::string s;
  for (int e : c.edges) s += g.ops[g.edges[e].src].name + " -> ";
  if (!c.edges.empty()) s += g.ops[g.edges[c.edges.front()].src].name;
  s += " (latency " + std::to_string(c.lat) + ", distance " + std::to_string(c.distance);
  for (int e : c.edges)
    if (g.edges[e].kind == EdgeKind::kAnti)
      s += "; buffer " + g.buffers[g.edges[e].buffer].name + " counted at its deepest";
  return s + ")";
}

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// The latency an edge really imposes. Between two ops of one unit it is at least the producer's
// occupancy: the consumer cannot start while the producer still holds the unit. (Implied by the
// resource constraint, so it only tightens the recurrence bound and helps the solver.)
int64_t effective_lat(const Graph& g, const Edge& e) {
  const Op& p = g.ops[e.src];
  return p.unit == g.ops[e.dst].unit ? std::max(e.lat, p.occ) : e.lat;
}

// Distances used for the recurrence bound: anti edges at the deepest their buffer can go. An
// anti edge on a buffer without bound never limits II; it gets kUnbounded (= leave it out).
constexpr int64_t kUnbounded = INT64_MIN;
std::vector<int64_t> deepest_distances(const Graph& g) {
  std::vector<int64_t> d;
  for (const Edge& e : g.edges) {
    if (e.kind != EdgeKind::kAnti) {
      d.push_back(e.kind == EdgeKind::kCarried ? e.distance : 0);
    } else {
      auto bound = g.slot_bound(e.buffer);
      d.push_back(bound ? *bound - e.after : kUnbounded);
    }
  }
  return d;
}

// The smallest distance an edge can have (anti edges at the least depth their buffer may take:
// its minimum, and at least the iterations between a slot's fill and its read).
int64_t least_distance(const Graph& g, const Edge& e) {
  return e.kind == EdgeKind::kAnti ? std::max(g.buffers[e.buffer].min_slots, e.after) - e.after : edge_distance(e, {});
}

// A cycle whose summed (lat - II * distance) is positive, i.e. one that II cannot satisfy, found
// by Bellman-Ford on longest paths from a virtual source joined to every op.
std::optional<Cycle> positive_cycle(const Graph& g, const std::vector<int64_t>& lat,
                                    const std::vector<int64_t>& dist, int64_t ii) {
  const int n = static_cast<int>(g.ops.size());
  std::vector<int64_t> best(n, 0);
  std::vector<int> pred(n, -1);
  int changed = -1;
  for (int pass = 0; pass < n; ++pass) {
    changed = -1;
    for (size_t e = 0; e < g.edges.size(); ++e) {
      if (dist[e] == kUnbounded) continue;
      const Edge& E = g.edges[e];
      const int64_t w = lat[e] - ii * dist[e];
      if (best[E.src] + w > best[E.dst]) {
        best[E.dst] = best[E.src] + w;
        pred[E.dst] = static_cast<int>(e);
        changed = E.dst;
      }
    }
    if (changed < 0) return std::nullopt;
  }
  // Still relaxing after n passes: walking predecessors n times lands on the cycle.
  int v = changed;
  for (int i = 0; i < n; ++i) v = g.edges[pred[v]].src;
  Cycle c;
  int u = v;
  do {
    c.edges.push_back(pred[u]);
    u = g.edges[pred[u]].src;
  } while (u != v);
  std::reverse(c.edges.begin(), c.edges.end());
  for (int e : c.edges) {
    c.lat += lat[e];
    c.distance += dist[e];
  }
  return c;
}

// Upper end of the II search: the fully sequential schedule (each op after the previous one has
// finished, in a topological order of the same-iteration edges) is legal at this II.
int64_t sequential_ii(const Graph& g) {
  int64_t t = 0;
  for (size_t i = 0; i < g.ops.size(); ++i) {
    int64_t span = std::max(g.ops[i].lat, g.ops[i].occ);
    for (const Edge& e : g.edges)
      if (e.src == static_cast<int>(i)) span = std::max(span, e.lat);
    t += span;
  }
  return std::max<int64_t>(t, 1);
}

// The Z3 model of one II.
class Model {
 public:
  Model(const Graph& g, int64_t ii, int& checks) : g_(g), ii_(ii), solver_(ctx_), checks_(checks) {
    const int n = static_cast<int>(g.ops.size());
    auto iv = [&](int64_t v) { return ctx_.int_val(v); };
    z3::expr II = iv(ii);
    for (int i = 0; i < n; ++i) {
      const std::string& name = g.ops[i].name;
      tau_.push_back(ctx_.int_const(("tau_" + name).c_str()));
      k_.push_back(ctx_.int_const(("k_" + name).c_str()));
      r_.push_back(ctx_.int_const(("r_" + name).c_str()));
      solver_.add(tau_[i] == II * k_[i] + r_[i]);
      solver_.add(r_[i] >= 0 && r_[i] < II && k_[i] >= 0);
    }
    for (const Buffer& b : g.buffers) {
      slots_.push_back(ctx_.int_const(("slots_" + b.name).c_str()));
      solver_.add(slots_.back() >= b.min_slots);
      if (b.max_slots) solver_.add(slots_.back() <= *b.max_slots);
    }
    for (size_t c = 0; c < g.capacities.size(); ++c) {
      z3::expr used = iv(0);
      for (size_t b = 0; b < g.buffers.size(); ++b)
        if (g.buffers[b].capacity == static_cast<int>(c)) used = used + iv(g.buffers[b].slot_size) * slots_[b];
      solver_.add(used <= iv(g.capacities[c].amount));
    }
    for (const Edge& e : g.edges) {
      z3::expr dist = e.kind == EdgeKind::kAnti ? slots_[e.buffer] - iv(e.after) : iv(edge_distance(e, {}));
      if (e.kind == EdgeKind::kAnti && e.after > 0) solver_.add(slots_[e.buffer] >= iv(e.after));
      solver_.add(tau_[e.dst] - tau_[e.src] >= iv(effective_lat(g, e)) - II * dist);
    }
    // Two ops of one unit: going round the II circle from either, the other starts only after it
    // has released the unit.
    for (int a = 0; a < n; ++a)
      for (int b = a + 1; b < n; ++b) {
        if (g.ops[a].unit != g.ops[b].unit) continue;
        z3::expr oa = iv(g.ops[a].occ), ob = iv(g.ops[b].occ);
        solver_.add((r_[a] + oa <= r_[b] && r_[b] + ob <= r_[a] + II) ||
                    (r_[b] + ob <= r_[a] && r_[a] + oa <= r_[b] + II));
      }
    stage_max_ = ctx_.int_const("stage_max");
    for (int i = 0; i < n; ++i) solver_.add(k_[i] <= *stage_max_);
    // A bound on stages that loses no schedule; without it Z3 can wander over ever larger k.
    // Fix a schedule's offsets r and slots: the stages then only need k_dst - k_src >= c for each
    // edge, c = ceil((lat - II d - r_dst + r_src) / II) <= ceil(lat / II) + 1 - d, and the least
    // non-negative solution is a longest path of at most n - 1 edges.
    int64_t step = 0;
    for (const Edge& e : g.edges)
      step = std::max(step, (effective_lat(g, e) + ii - 1) / ii + 1 - least_distance(g, e));
    solver_.add(*stage_max_ <= iv(std::max<int64_t>(n - 1, 0) * step));
  }

  // Rotation symmetry: shifting every start by one moves every offset r one step round the II
  // circle and keeps the schedule legal (edges and unit intervals see differences only), so some
  // rotation of any schedule puts op `anchor` at offset 0 (a shift by II - r, which keeps k >= 0;
  // the least stages for the rotated offsets still meet the stage bound above). Pinning it loses
  // no II and spares Z3 the rotated copies of each candidate when it proves an II infeasible. The
  // optimisation runs on a model without the pin (a rotation may need fewer stages).
  void pin_rotation(int anchor) { solver_.add(r_[anchor] == ctx_.int_val(0)); }

  bool check() {
    ++checks_;
    const z3::check_result r = solver_.check();
    if (r == z3::unknown) throw ScheduleError("Z3 returned unknown: " + solver_.reason_unknown());
    if (r == z3::sat) model_ = solver_.get_model();
    return r == z3::sat;
  }

  int64_t value(const z3::expr& e) const { return model_->eval(e, true).get_numeral_int64(); }

  // Smallest v in [lo, value now] with e <= v satisfiable; adds e <= v for good. Needs a model.
  // Tries one below the current value first: often that is already infeasible.
  int64_t minimise(const z3::expr& e, int64_t lo) {
    int64_t hi = value(e);
    z3::model best = *model_;
    bool first = true;
    while (lo < hi) {
      const int64_t mid = first ? hi - 1 : lo + (hi - lo) / 2;
      first = false;
      solver_.push();
      solver_.add(e <= ctx_.int_val(mid));
      if (check()) {
        hi = value(e);  // the model may land below mid
        best = *model_;
      } else {
        lo = mid + 1;
      }
      solver_.pop();
    }
    solver_.add(e <= ctx_.int_val(hi));
    model_ = best;
    return hi;
  }

  Schedule optimise() {
    // Fewest stages: upward from one stage. Tightly bounded checks are quick for Z3; the first
    // satisfiable bound is the minimum (the current model bounds the search).
    for (int64_t bound = 0, now = value(*stage_max_); bound < now; ++bound) {
      solver_.push();
      solver_.add(*stage_max_ <= ctx_.int_val(bound));
      const bool fits = check();
      solver_.pop();
      if (fits) break;
    }
    minimise(*stage_max_, 0);  // the model now sits at the minimum; this pins it
    if (!slots_.empty()) {
      z3::expr total = ctx_.int_val(0);
      int64_t lo = 0;
      for (size_t b = 0; b < slots_.size(); ++b) {
        total = total + slots_[b];
        lo += g_.buffers[b].min_slots;
      }
      minimise(total, lo);
    }
    for (const z3::expr& t : tau_) minimise(t, 0);
    Schedule s;
    s.ii = ii_;
    for (const z3::expr& t : tau_) s.start.push_back(value(t));
    for (const z3::expr& b : slots_) s.slots.push_back(static_cast<int>(value(b)));
    return s;
  }

 private:
  const Graph& g_;
  int64_t ii_;
  z3::context ctx_;
  z3::solver solver_;
  int& checks_;
  std::vector<z3::expr> tau_, k_, r_, slots_;
  std::optional<z3::expr> stage_max_;
  std::optional<z3::model> model_;
};

// The first op on `unit` (the rotation anchor: an op of the busiest unit).
int first_op_of(const Graph& g, int unit) {
  for (size_t i = 0; i < g.ops.size(); ++i)
    if (g.ops[i].unit == unit) return static_cast<int>(i);
  return 0;
}

}  // namespace

Bounds lower_bounds(const Graph& g) {
  Bounds b;
  std::vector<int64_t> per_unit(g.units.size(), 0);
  for (const Op& op : g.ops) per_unit[op.unit] += op.occ;
  for (size_t u = 0; u < per_unit.size(); ++u)
    if (per_unit[u] > b.res_mii) {
      b.res_mii = per_unit[u];
      b.res_unit = static_cast<int>(u);
    }

  const std::vector<int64_t> dist = deepest_distances(g);
  std::vector<int64_t> lat, unit_lat;
  for (const Edge& e : g.edges) {
    lat.push_back(e.lat);
    unit_lat.push_back(effective_lat(g, e));
  }
  // Above the summed latency of all edges, only a cycle of distance <= 0 can stay positive.
  int64_t big = 1;
  for (int64_t l : unit_lat) big += l;
  if (auto c = positive_cycle(g, lat, dist, big))
    throw ScheduleError("same-iteration cycle " + describe(g, *c) +
                        ": an op would have to wait for itself (or a later iteration of itself); "
                        "no II satisfies it");
  // Smallest II without a positive cycle (feasibility only improves as II grows).
  auto smallest_ii = [&](const std::vector<int64_t>& l, Cycle& critical) {
    int64_t lo = 1, hi = big;
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (positive_cycle(g, l, dist, mid)) lo = mid + 1; else hi = mid;
    }
    if (lo > 1)
      if (auto c = positive_cycle(g, l, dist, lo - 1)) critical = *c;
    return lo;
  };
  b.rec_mii = smallest_ii(lat, b.rec_cycle);
  b.unit_rec_mii = smallest_ii(unit_lat, b.unit_rec_cycle);
  return b;
}

Solution solve(const Graph& g) {
  const auto t0 = Clock::now();
  Solution sol;
  sol.bounds = lower_bounds(g);
  const Bounds& b = sol.bounds;
  if (g.max_ii && b.res_mii > *g.max_ii)
    throw ScheduleError("unit " + g.units[b.res_unit].name + " is busy " + std::to_string(b.res_mii) +
                        " per iteration, more than max_ii " + std::to_string(*g.max_ii));
  if (g.max_ii && b.rec_mii > *g.max_ii)
    throw ScheduleError("recurrence " + describe(g, b.rec_cycle) + " needs II >= " +
                        std::to_string(b.rec_mii) + ", more than max_ii " +
                        std::to_string(*g.max_ii) + " allows within the buffers");
  if (g.max_ii && b.unit_rec_mii > *g.max_ii)
    throw ScheduleError("recurrence " + describe(g, b.unit_rec_cycle) +
                        ", counting a unit's occupancy between two of its ops, needs II >= " +
                        std::to_string(b.unit_rec_mii) + ", more than max_ii " +
                        std::to_string(*g.max_ii) + " allows within the buffers");
  // Feasibility is monotone in II: a schedule at II gives one at II + 1 by keeping each op's
  // stage k and offset r (tau' = tau + k). Unit intervals keep their offsets while the wrap-around
  // gap grows by one; an edge's side gains k_dst - k_src, which is >= -d (any sign of d) because
  // lat >= 0 makes tau_dst - tau_src >= -II d. So: gallop up from the lower bound, then bisect.
  // Without max_ii the sequential schedule bounds the search; an edge ordering an op before one
  // of an earlier iteration (negative distance) can need more, so then allow a wide margin.
  bool ordering = false;
  for (const Edge& e : g.edges) ordering |= e.kind == EdgeKind::kCarried && e.distance < 0;
  const int64_t sequential = std::max(sequential_ii(g), b.mii());
  const int64_t hi = g.max_ii ? *g.max_ii : (ordering ? 16 * sequential : sequential);
  // Each II's check with one op of the busiest unit pinned at offset 0 (Model::pin_rotation).
  const int anchor = b.res_unit >= 0 ? first_op_of(g, b.res_unit) : 0;
  auto feasible = [&](int64_t ii) {
    ++sol.stats.iis_tried;
    Model m(g, ii, sol.stats.checks);
    if (!g.ops.empty()) m.pin_rotation(anchor);
    return m.check();
  };
  int64_t bad = b.mii() - 1, good = -1;
  for (int64_t ii = b.mii(), step = 1;; step *= 2) {
    if (feasible(ii)) {
      good = ii;
      break;
    }
    bad = ii;
    if (ii == hi) break;
    ii = std::min(hi, ii + step);
  }
  if (good < 0)
    throw ScheduleError("no modulo schedule with II in [" + std::to_string(b.mii()) + ", " +
                        std::to_string(hi) +
                        "]: the units cannot be shared out around the dependences");
  while (good - bad > 1) {
    const int64_t mid = bad + (good - bad) / 2;
    if (feasible(mid)) good = mid; else bad = mid;
  }
  // The optimisation on the unpinned model of II `good`.
  sol.stats.seconds_ii = seconds_since(t0);
  Model best(g, good, sol.stats.checks);
  if (!best.check()) throw ScheduleError("II " + std::to_string(good) + " has no schedule without the rotation pin");
  sol.schedule = best.optimise();
  sol.stats.seconds = seconds_since(t0);
  return sol;
}

std::vector<std::string> check_schedule(const Graph& g, const Schedule& s) {
  std::vector<std::string> problems;
  auto num = [](int64_t v) { return std::to_string(v); };
  if (s.ii < 1) return {"II must be at least 1"};
  for (size_t b = 0; b < g.buffers.size(); ++b) {
    const Buffer& B = g.buffers[b];
    if (s.slots[b] < B.min_slots || (B.max_slots && s.slots[b] > *B.max_slots))
      problems.push_back("buffer " + B.name + ": " + num(s.slots[b]) + " slots is outside its range");
  }
  for (size_t c = 0; c < g.capacities.size(); ++c) {
    int64_t used = 0;
    for (size_t b = 0; b < g.buffers.size(); ++b)
      if (g.buffers[b].capacity == static_cast<int>(c)) used += g.buffers[b].slot_size * s.slots[b];
    if (used > g.capacities[c].amount)
      problems.push_back("capacity " + g.capacities[c].name + ": buffers take " + num(used) +
                         ", more than its " + num(g.capacities[c].amount));
  }
  for (const Edge& e : g.edges) {
    if (e.kind == EdgeKind::kAnti && s.slots[e.buffer] < e.after)
      problems.push_back(g.describe(e) + ": buffer " + g.buffers[e.buffer].name + " has " + num(s.slots[e.buffer]) +
                         " slots, fewer than the " + num(e.after) + " iterations between a slot's fill and its read");
    const int64_t d = edge_distance(e, s.slots);
    const int64_t have = s.start[e.dst] - s.start[e.src];
    const int64_t need = e.lat - s.ii * d;
    if (have < need)
      problems.push_back(g.describe(e) + " violated: start(" + g.ops[e.dst].name + ") - start(" +
                         g.ops[e.src].name + ") = " + num(have) + ", needs >= " + num(need) +
                         " (lat " + num(e.lat) + " - II " + num(s.ii) + " x distance " + num(d) + ")");
  }
  const int n = static_cast<int>(g.ops.size());
  for (int a = 0; a < n; ++a) {
    if (g.ops[a].occ > s.ii)
      problems.push_back("op " + g.ops[a].name + " occupies " + g.units[g.ops[a].unit].name +
                         " for " + num(g.ops[a].occ) + ", longer than II " + num(s.ii) +
                         ": it overlaps its own next iteration");
    for (int b = a + 1; b < n; ++b) {
      if (g.ops[a].unit != g.ops[b].unit) continue;
      const int64_t ra = s.offset(a), rb = s.offset(b);
      // Distance round the II circle from a's start to b's start, and back.
      const int64_t ab = ((rb - ra) % s.ii + s.ii) % s.ii, ba = (s.ii - ab) % s.ii;
      if (ab < g.ops[a].occ || ba < g.ops[b].occ)
        problems.push_back("resource conflict on unit " + g.units[g.ops[a].unit].name + ": " +
                           g.ops[a].name + " occupies [" + num(ra) + ", " + num(ra + g.ops[a].occ) +
                           ") and " + g.ops[b].name + " [" + num(rb) + ", " +
                           num(rb + g.ops[b].occ) + ") modulo II " + num(s.ii));
    }
  }
  return problems;
}

Schedule parse_schedule(const Graph& g, const std::string& text, const std::string& file) {
  Schedule s;
  s.start.assign(g.ops.size(), 0);
  s.slots.clear();
  for (const Buffer& b : g.buffers) s.slots.push_back(b.min_slots);
  std::vector<bool> seen(g.ops.size(), false);
  std::istringstream in(text);
  std::string raw;
  int line = 0;
  auto fail = [&](const std::string& what) -> void { throw GraphError(file, line, what); };
  auto number = [&](const std::string& w) {
    try {
      size_t used = 0;
      const long long v = std::stoll(w, &used);
      if (used != w.size()) fail("bad number '" + w + "'");
      return static_cast<int64_t>(v);
    } catch (const std::logic_error&) {
      fail("bad number '" + w + "'");
    }
    return int64_t{0};
  };
  while (std::getline(in, raw)) {
    ++line;
    if (auto h = raw.find('#'); h != std::string::npos) raw.resize(h);
    std::istringstream words(raw);
    std::vector<std::string> t;
    for (std::string w; words >> w;) t.push_back(w);
    if (t.empty()) continue;
    if (t[0] == "ii" && t.size() == 2) {
      s.ii = number(t[1]);
    } else if (t[0] == "start" && t.size() == 3) {
      const int op = g.find_op(t[1]);
      if (op < 0) fail("unknown op '" + t[1] + "'");
      s.start[op] = number(t[2]);
      seen[op] = true;
    } else if (t[0] == "slots" && t.size() == 3) {
      const int b = g.find_buffer(t[1]);
      if (b < 0) fail("unknown buffer '" + t[1] + "'");
      s.slots[b] = static_cast<int>(number(t[2]));
    } else {
      fail("expected 'ii N', 'start OP N' or 'slots BUFFER N'");
    }
  }
  if (s.ii < 1) throw GraphError(file, line, "missing or bad 'ii N' (II must be at least 1)");
  for (size_t i = 0; i < g.ops.size(); ++i)
    if (!seen[i]) throw GraphError(file, line, "no start for op " + g.ops[i].name);
  return s;
}

std::string format_schedule(const Graph& g, const Schedule& s) {
  std::ostringstream o;
  o << "# modulo schedule of graph " << g.name << " (" << g.time_unit << ")\n";
  o << "ii " << s.ii << "\n";
  for (size_t i = 0; i < g.ops.size(); ++i)
    o << "start " << g.ops[i].name << " " << s.start[i] << "\n";
  for (size_t b = 0; b < g.buffers.size(); ++b)
    o << "slots " << g.buffers[b].name << " " << s.slots[b] << "\n";
  return o.str();
}

}  // namespace fa4::sched
