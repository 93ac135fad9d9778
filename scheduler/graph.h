// The pipeline graph: what a kernel's loop body does per iteration, on which hardware unit, and
// what each step waits for. The text format is documented in docs/scheduler.md; parse errors name
// the line and the problem.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace fa4::sched {

// A hardware pipe that runs one operation at a time (TMA, tensor core, MUFU, ...).
struct Unit {
  std::string name;
  int line = 0;
};

// A pool that buffers draw from: shared-memory bytes, tensor-memory columns, registers.
struct Capacity {
  std::string name;
  int64_t amount = 0;
  std::string label;  // what amount counts ("bytes", "columns"); only for printing
  int line = 0;
};

// A multi-slot buffer (a ring). Its depth (slots) is a solver variable in [min_slots, max_slots];
// anti-dependences on it have distance = slots.
struct Buffer {
  std::string name;
  int capacity = -1;  // index into Graph::capacities
  int64_t slot_size = 0;
  int min_slots = 1;
  std::optional<int> max_slots;  // none: bounded only by the capacity
  int line = 0;
};

// One operation of the loop body. It takes `occ` cycles of its unit (no other op of the unit may
// start during them) and its result is ready `lat` cycles after it starts.
struct Op {
  std::string name;
  int unit = -1;
  int64_t lat = 0;
  int64_t occ = 1;
  int line = 0;
};

enum class EdgeKind { kFlow, kCarried, kAnti };

// `dst` of iteration i + distance waits for `src` of iteration i:
//   start(dst) - start(src) >= lat - II * distance
// kFlow: distance 0. kCarried: distance given in the file, >= 1 for a loop-carried dependence,
// <= -1 for an ordering against a later iteration (dst of block j-1 after src of block j).
// kAnti: distance = slots of `buffer` less `after` (src is the slot's last reader, dst the op that
// refills it; the reader runs `after` iterations after the one that filled the slot, 0 unless the
// graph says `after K`, and the buffer then needs at least `after` slots).
struct Edge {
  int src = -1;
  int dst = -1;
  EdgeKind kind = EdgeKind::kFlow;
  int distance = 0;  // kCarried only
  int buffer = -1;   // kAnti only
  int after = 0;     // kAnti only: iterations between the slot's fill and its last read
  int64_t lat = 0;   // the producer's latency unless the line overrides it
  int line = 0;
};

struct Graph {
  std::string name = "graph";
  std::string file;                // as given to the parser, for messages
  std::string time_unit = "cycles";
  int64_t slot = 0;                // cycles per normalised slot (0: none); for reporting only
  std::optional<int64_t> max_ii;   // largest acceptable II
  std::vector<Unit> units;
  std::vector<Capacity> capacities;
  std::vector<Buffer> buffers;
  std::vector<Op> ops;
  std::vector<Edge> edges;

  int find_unit(const std::string& n) const;
  int find_capacity(const std::string& n) const;
  int find_buffer(const std::string& n) const;
  int find_op(const std::string& n) const;

  // Largest depth a buffer can take: its own max, or what its capacity leaves after every other
  // buffer on it takes its minimum. None when unbounded.
  std::optional<int> slot_bound(int buffer) const;
  // "edge A -> B (anti KV)" style text for messages.
  std::string describe(const Edge& e) const;
};

// A parse or validation error; what() is "file:line: problem".
class GraphError : public std::runtime_error {
 public:
  GraphError(const std::string& file, int line, const std::string& what);
  int line() const { return line_; }

 private:
  int line_;
};

Graph parse_graph(const std::string& text, const std::string& file = "<graph>");
Graph load_graph(const std::string& path);

const char* kind_name(EdgeKind k);

}  // namespace fa4::sched
