// Printing a modulo schedule: the reservation table, the loop by unit (prologue, steady state,
// epilogue), a JSON summary, and the C++ header of constexpr tables that kernels include.
#pragma once

#include <string>
#include <vector>

#include "graph.h"
#include "solver.h"

namespace fa4::sched {

// Ops in steady-state issue order: by offset within the II window, ties in declaration order.
std::vector<int> steady_order(const Graph& g, const Schedule& s);

// One line per unit: which op holds the unit at each point of the II window.
std::string reservation_table(const Graph& g, const Schedule& s);

// The software-pipelined loop by window and unit: stages filling, the steady state, draining.
std::string loop_by_unit(const Graph& g, const Schedule& s);

// Everything a person wants to read: counts, bounds, the schedule, the tables above.
std::string report(const Graph& g, const Solution& sol);

std::string to_json(const Graph& g, const Solution& sol);

// namespace fa4::sched::<graph name> { kII, kStages, k<Buffer>Stages, enum Op/Unit, tables }.
// Deterministic: no time stamps or paths, so CI can regenerate and compare it.
std::string emit_header(const Graph& g, const Schedule& s);

}  // namespace fa4::sched
