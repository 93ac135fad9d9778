// Parser of the pipeline graph format (docs/scheduler.md). One declaration per line; '#' starts a
// comment; names are C identifiers; everything must be declared before it is used.
#include "graph.h"

#include <cctype>
#include <charconv>
#include <fstream>
#include <sstream>

namespace fa4::sched {

namespace {

constexpr int64_t kMaxNumber = 1'000'000'000;  // keeps II * distance far from int64 overflow

bool is_identifier(const std::string& s) {
  if (s.empty() || !(std::isalpha(static_cast<unsigned char>(s[0])) || s[0] == '_')) return false;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) return false;
  return true;
}

std::string join(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out.empty() ? "none" : out;
}

template <class T>
std::vector<std::string> names_of(const std::vector<T>& v) {
  std::vector<std::string> out;
  for (const auto& x : v) out.push_back(x.name);
  return out;
}

// Reads the tokens of one line, left to right, raising errors that carry the line number.
class Line {
 public:
  Line(const std::string& file, int number, std::vector<std::string> tokens)
      : file_(file), number_(number), tokens_(std::move(tokens)) {}

  [[noreturn]] void fail(const std::string& what) const { throw GraphError(file_, number_, what); }
  bool done() const { return pos_ == tokens_.size(); }
  const std::string& peek() const { return tokens_[pos_]; }

  std::string word(const char* what) {
    if (done()) fail(std::string("missing ") + what);
    return tokens_[pos_++];
  }
  std::string name(const char* what) {
    std::string s = word(what);
    if (!is_identifier(s)) fail(std::string("bad ") + what + " '" + s + "' (want a C identifier)");
    return s;
  }
  int64_t number(const char* what, int64_t min) {
    std::string s = word(what);
    return to_number(s, what, min);
  }
  // Any integer but 0 is a distance: negative ones order an op before one of an earlier
  // iteration ("S of block j+1 is issued before PV of block j").
  int64_t signed_number(const char* what) {
    std::string s = word(what);
    const bool minus = !s.empty() && s[0] == '-';
    const int64_t v = to_number(minus ? s.substr(1) : s, what, 0);
    return minus ? -v : v;
  }
  int64_t to_number(const std::string& s, const char* what, int64_t min) const {
    int64_t v = 0;
    auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec != std::errc() || end != s.data() + s.size())
      fail(std::string("bad ") + what + " '" + s + "' (want an integer)");
    if (v < min) fail(std::string(what) + " must be at least " + std::to_string(min) + ", got " + s);
    if (v > kMaxNumber) fail(std::string(what) + " " + s + " is too large");
    return v;
  }
  void expect(const char* token) {
    std::string s = word(token);
    if (s != token) fail(std::string("expected '") + token + "', got '" + s + "'");
  }
  void end() {
    if (!done()) fail("unexpected '" + tokens_[pos_] + "'");
  }
  int number_of_line() const { return number_; }

 private:
  const std::string& file_;
  int number_;
  std::vector<std::string> tokens_;
  size_t pos_ = 0;
};

void parse_slots(Line& ln, Buffer& b) {
  // "slots N" (fixed), "slots A..B" or "slots A.." (open above).
  std::string s = ln.word("slot count");
  auto dots = s.find("..");
  if (dots == std::string::npos) {
    b.min_slots = static_cast<int>(ln.to_number(s, "slot count", 1));
    b.max_slots = b.min_slots;
    return;
  }
  b.min_slots = static_cast<int>(ln.to_number(s.substr(0, dots), "slot count", 1));
  std::string hi = s.substr(dots + 2);
  if (hi.empty()) return;
  b.max_slots = static_cast<int>(ln.to_number(hi, "slot count", 1));
  if (*b.max_slots < b.min_slots) ln.fail("slot range " + s + " is empty");
}

void declare_unique(Line& ln, int found, const char* kind, const std::string& name) {
  if (found >= 0) ln.fail(std::string(kind) + " '" + name + "' declared twice");
}

}  // namespace

GraphError::GraphError(const std::string& file, int line, const std::string& what)
    : std::runtime_error(file + ":" + std::to_string(line) + ": " + what), line_(line) {}

const char* kind_name(EdgeKind k) {
  switch (k) {
    case EdgeKind::kFlow: return "flow";
    case EdgeKind::kCarried: return "carried";
    case EdgeKind::kAnti: return "anti";
  }
  return "?";
}

template <class T>
static int find_named(const std::vector<T>& v, const std::string& n) {
  for (size_t i = 0; i < v.size(); ++i)
    if (v[i].name == n) return static_cast<int>(i);
  return -1;
}

int Graph::find_unit(const std::string& n) const { return find_named(units, n); }
int Graph::find_capacity(const std::string& n) const { return find_named(capacities, n); }
int Graph::find_buffer(const std::string& n) const { return find_named(buffers, n); }
int Graph::find_op(const std::string& n) const { return find_named(ops, n); }

std::optional<int> Graph::slot_bound(int b) const {
  const Buffer& buf = buffers[b];
  int64_t others = 0;
  for (size_t i = 0; i < buffers.size(); ++i)
    if (static_cast<int>(i) != b && buffers[i].capacity == buf.capacity)
      others += buffers[i].slot_size * buffers[i].min_slots;
  std::optional<int> bound = buf.max_slots;
  if (buf.slot_size > 0) {
    int by_capacity = static_cast<int>((capacities[buf.capacity].amount - others) / buf.slot_size);
    if (!bound || by_capacity < *bound) bound = by_capacity;
  }
  return bound;
}

std::string Graph::describe(const Edge& e) const {
  std::string s = "edge " + ops[e.src].name + " -> " + ops[e.dst].name + " (";
  s += kind_name(e.kind);
  if (e.kind == EdgeKind::kCarried) s += " " + std::to_string(e.distance);
  if (e.kind == EdgeKind::kAnti) s += " " + buffers[e.buffer].name;
  if (e.kind == EdgeKind::kAnti && e.after > 0) s += " after " + std::to_string(e.after);
  s += ", line " + std::to_string(e.line) + ")";
  return s;
}

Graph parse_graph(const std::string& text, const std::string& file) {
  Graph g;
  g.file = file;
  std::istringstream in(text);
  std::string raw;
  int number = 0;
  bool named = false;
  while (std::getline(in, raw)) {
    ++number;
    if (auto hash = raw.find('#'); hash != std::string::npos) raw.resize(hash);
    std::istringstream words(raw);
    std::vector<std::string> tokens;
    for (std::string t; words >> t;) tokens.push_back(t);
    if (tokens.empty()) continue;
    Line ln(g.file, number, tokens);
    const std::string key = ln.word("keyword");

    if (key == "graph") {
      if (named) ln.fail("graph name given twice");
      g.name = ln.name("graph name");
      named = true;
    } else if (key == "time") {
      g.time_unit = ln.name("time unit");
    } else if (key == "slot") {
      g.slot = ln.number("slot length", 1);
    } else if (key == "max_ii") {
      g.max_ii = ln.number("max_ii", 1);
    } else if (key == "unit") {
      Unit u{ln.name("unit name"), number};
      declare_unique(ln, g.find_unit(u.name), "unit", u.name);
      g.units.push_back(u);
    } else if (key == "capacity") {
      Capacity c;
      c.name = ln.name("capacity name");
      declare_unique(ln, g.find_capacity(c.name), "capacity", c.name);
      c.amount = ln.number("capacity amount", 1);
      if (!ln.done()) c.label = ln.name("capacity label");
      c.line = number;
      g.capacities.push_back(c);
    } else if (key == "buffer") {
      Buffer b;
      b.name = ln.name("buffer name");
      declare_unique(ln, g.find_buffer(b.name), "buffer", b.name);
      const std::string cap = ln.name("capacity name");
      b.capacity = g.find_capacity(cap);
      if (b.capacity < 0)
        ln.fail("unknown capacity '" + cap + "' (declared: " + join(names_of(g.capacities)) + ")");
      b.slot_size = ln.number("slot size", 0);
      if (!ln.done()) {
        ln.expect("slots");
        parse_slots(ln, b);
      }
      b.line = number;
      // The minimum depths of all buffers on this capacity must fit.
      int64_t need = b.slot_size * b.min_slots;
      for (const Buffer& o : g.buffers)
        if (o.capacity == b.capacity) need += o.slot_size * o.min_slots;
      const Capacity& c = g.capacities[b.capacity];
      if (need > c.amount)
        ln.fail("buffers on '" + c.name + "' need " + std::to_string(need) +
                " at their minimum depth, more than its " + std::to_string(c.amount));
      g.buffers.push_back(b);
    } else if (key == "op") {
      Op op;
      op.name = ln.name("op name");
      declare_unique(ln, g.find_op(op.name), "op", op.name);
      const std::string unit = ln.name("unit name");
      op.unit = g.find_unit(unit);
      if (op.unit < 0)
        ln.fail("unknown unit '" + unit + "' (declared: " + join(names_of(g.units)) + ")");
      bool have_lat = false;
      while (!ln.done()) {
        std::string attr = ln.word("attribute");
        if (attr == "lat") {
          op.lat = ln.number("latency", 0);
          have_lat = true;
        } else if (attr == "occ") {
          op.occ = ln.number("occupancy", 1);
        } else {
          ln.fail("unknown op attribute '" + attr + "' (want lat or occ)");
        }
      }
      if (!have_lat) ln.fail("op '" + op.name + "' has no latency (lat N)");
      if (g.max_ii && op.occ > *g.max_ii)
        ln.fail("occupancy " + std::to_string(op.occ) + " exceeds max_ii " + std::to_string(*g.max_ii));
      op.line = number;
      g.ops.push_back(op);
    } else if (key == "edge") {
      Edge e;
      const std::string src = ln.name("source op");
      ln.expect("->");
      const std::string dst = ln.name("destination op");
      e.src = g.find_op(src);
      e.dst = g.find_op(dst);
      if (e.src < 0) ln.fail("unknown op '" + src + "' (ops are declared before edges use them)");
      if (e.dst < 0) ln.fail("unknown op '" + dst + "' (ops are declared before edges use them)");
      e.lat = g.ops[e.src].lat;
      bool have_kind = false;
      while (!ln.done()) {
        std::string w = ln.word("edge attribute");
        if (w == "flow" || w == "carried" || w == "anti") {
          if (have_kind) ln.fail("edge kind given twice");
          have_kind = true;
          if (w == "carried") {
            e.kind = EdgeKind::kCarried;
            e.distance = static_cast<int>(ln.signed_number("distance"));
            if (e.distance == 0) ln.fail("distance must not be 0 (a same-iteration edge is 'flow')");
          } else if (w == "anti") {
            e.kind = EdgeKind::kAnti;
            const std::string buf = ln.name("buffer name");
            e.buffer = g.find_buffer(buf);
            if (e.buffer < 0)
              ln.fail("unknown buffer '" + buf + "' (declared: " + join(names_of(g.buffers)) + ")");
          }
        } else if (w == "after") {
          if (e.kind != EdgeKind::kAnti) ln.fail("'after K' belongs to an anti edge, after its buffer");
          e.after = static_cast<int>(ln.number("iterations after the fill", 1));
          const Buffer& b = g.buffers[e.buffer];
          if (b.max_slots && *b.max_slots < e.after)
            ln.fail("buffer '" + b.name + "' holds at most " + std::to_string(*b.max_slots) +
                    " slots; a reader " + std::to_string(e.after) + " iterations after the fill needs " +
                    std::to_string(e.after));
        } else if (w == "lat") {
          e.lat = ln.number("edge latency", 0);
        } else {
          ln.fail("unknown edge attribute '" + w + "' (want flow, carried D, anti BUFFER [after K] or lat N)");
        }
      }
      e.line = number;
      g.edges.push_back(e);
    } else {
      ln.fail("unknown keyword '" + key +
              "' (want graph, time, slot, max_ii, unit, capacity, buffer, op or edge)");
    }
    ln.end();
  }
  if (g.ops.empty()) throw GraphError(g.file, number, "graph has no ops");
  return g;
}

Graph load_graph(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw GraphError(path, 0, "cannot open file");
  std::stringstream ss;
  ss << f.rdbuf();
  return parse_graph(ss.str(), path);
}

}  // namespace fa4::sched
