// fa4-bench: run, check and time fa4 attention from the command line.
//
//   fa4-bench --b 2 --h 16 --sq 4096 --d 128 --causal --check       one problem: check, then time
//   fa4-bench --sweep fa3 [--bwd] [--check]                          DESIGN.md §6 shapes, one table
//   fa4-bench --help
//
// On a GPU: random inputs (normal, fixed seed, generated on the host), outputs poisoned with NaN
// bytes before every run, fa4::forward / fa4::backward, then
//   --check  compares with the float64 CPU reference (fa4::ref) by DESIGN.md §3's criterion:
//            max|out - ref64| <= 2 * max|lowprec - ref64| + 1e-3 and ||out - ref64|| / ||ref64||
//            <= 1e-2, where `lowprec` is a plain attention in the same 16-bit precision. Small
//            problems are checked whole; large ones on sampled query rows (float64 on the CPU),
//            then every element against the GPU fp32 oracle within the bound those rows set.
//            Every output element must have been written (no NaN poison left).
//   timing   CUDA events around each call, median over --iters after --warmup calls.
// Without a usable GPU it says so and runs the CPU reference on a small problem instead, to show
// what a check looks like.
//
// Exit status: 0 ok, 1 a check failed, 2 bad flags (the parser's or fa4::validate's verdict),
// 3 fa4 could not run the problem (not supported, CUDA error) outside a sweep.
#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include "fa4/attention.h"
#include "fa4/numerics/online_softmax.h"
#include "convert.h"
#include "reference.h"
#include "reference_gpu.h"

namespace {

using fa4::DType;
using fa4::Problem;
using fa4::Status;
using fa4::StatusCode;
using fa4::TensorRef;

constexpr int kExitOk = 0, kExitCheckFailed = 1, kExitBadFlags = 2, kExitCannotRun = 3;

// DESIGN.md §3.
constexpr double kCheckAtol = 1e-3;
constexpr double kCheckRelFrobenius = 1e-2;
// Problems with at most this many multiply-adds per GEMM (b * h * sq * sk * d) are checked whole
// on the CPU; larger ones on sampled query rows (forward) or not at all (backward).
constexpr double kFullCheckMacs = double(1 << 28);
// The FA3 sweep (DESIGN.md §6).
constexpr int64_t kSweepTokens = 16384, kSweepHidden = 2048;
constexpr int kSweepHeadDims[] = {64, 128, 256};
constexpr int64_t kSweepSeqlens[] = {512, 1024, 2048, 4096, 8192, 16384};

[[noreturn]] void die(int code, const char* fmt, ...) {
  std::fflush(stdout);
  std::va_list ap;
  va_start(ap, fmt);
  std::fprintf(stderr, "fa4-bench: ");
  std::vfprintf(stderr, fmt, ap);
  std::fprintf(stderr, "\n");
  va_end(ap);
  std::exit(code);
}

#define CUDA_OK(call)                                                                      \
  do {                                                                                     \
    cudaError_t e_ = (call);                                                               \
    if (e_ != cudaSuccess)                                                                 \
      die(kExitCannotRun, "%s failed: %s (%s:%d)", #call, cudaGetErrorString(e_), __FILE__, \
          __LINE__);                                                                       \
  } while (0)

// ------------------------------------------------------------------------------------------
// Flags

enum class Layout { kBSHD, kBHSD };

struct Options {
  int64_t b = 2, h = 16, hkv = -1, sq = 2048, sk = -1, d = 128;
  bool causal = false;
  int64_t window_left = -1, window_right = -1;
  float scale = 0.0f;
  float softcap = 0.0f;
  bool sink = false;       // --sink M: each query head's sink from N(M, 1)
  float sink_mean = 0.0f;
  DType dtype = DType::kBF16;
  Layout layout = Layout::kBSHD;
  bool bwd = false, deterministic = false, check = false;
  int iters = 20, warmup = 5;
  bool flush_l2 = false;
  bool lse = true;  // timed forward calls write the LSE
  bool sweep = false;
  uint64_t seed = 1234;
  int rows = 128;  // query rows sampled by --check on large problems
  std::string json;
  bool shape_given = false;  // any of --b --h --hkv --s --sq --sk --d
};

const char kUsage[] =
    "usage: fa4-bench [flags]\n"
    "  --b N            batch (default 2)\n"
    "  --h N            query heads (default 16)\n"
    "  --hkv N          key/value heads (default = --h; --h must be a multiple)\n"
    "  --s N            sets --sq and --sk\n"
    "  --sq N, --sk N   query / key sequence lengths (default 2048; --sk defaults to --sq)\n"
    "  --d N            head dim (default 128)\n"
    "  --causal         bottom-right aligned causal mask\n"
    "  --window L,R     sliding window, -1 = unbounded on that side\n"
    "  --scale F        softmax scale (default 1/sqrt(d))\n"
    "  --softcap F      soft-capped scores, F * tanh(score / F) (default 0: off)\n"
    "  --sink M         attention sinks (learnable_sink): each query head's drawn from N(M, 1),\n"
    "                   fp32; the backward writes their gradient too (checked with --check)\n"
    "  --dtype T        bf16 | fp16 (default bf16)\n"
    "  --layout L       bshd | bhsd (default bshd)\n"
    "  --bwd            backward instead of forward\n"
    "  --deterministic  deterministic backward\n"
    "  --check          compare with the float64 CPU reference (DESIGN.md 3)\n"
    "  --iters N        timed calls (default 20; 0 = no timing)\n"
    "  --warmup N       untimed calls first (default 5)\n"
    "  --flush-l2       write 256 MB before each timed call, as triton's do_bench does\n"
    "  --lse[=B]        timed forward calls write the LSE (default on; --lse=0: inference calls\n"
    "                   without it, as fa4.flash_attn_func makes; the check's call writes it)\n"
    "  --sweep fa3      FA3 shapes: 16k tokens, hidden 2048, d 64/128/256, seqlen 512..16k,\n"
    "                   causal and not (shape flags are ignored)\n"
    "  --rows N         query rows --check samples on large problems (default 128)\n"
    "  --seed N         input seed (default 1234)\n"
    "  --json PATH      also write the timings as JSON records\n"
    "exit status: 0 ok, 1 check failed, 2 bad flags, 3 fa4 could not run the problem\n";

[[noreturn]] void bad_flag(const std::string& flag, const std::string& value, const char* want) {
  die(kExitBadFlags, "bad value '%s' for %s: expected %s (see --help)", value.c_str(), flag.c_str(),
      want);
}

int64_t parse_int(const std::string& flag, const std::string& s, int64_t min, const char* want) {
  if (s.empty()) bad_flag(flag, s, want);
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(s.c_str(), &end, 10);
  if (errno != 0 || *end != '\0' || v < min) bad_flag(flag, s, want);
  return v;
}

bool parse_bool(const std::string& flag, const std::string& s) {
  if (s == "1" || s == "true" || s == "yes" || s == "on") return true;
  if (s == "0" || s == "false" || s == "no" || s == "off") return false;
  bad_flag(flag, s, "a boolean (1/0, true/false)");
}

Options parse_flags(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i], value;
    bool has_value = false;
    if (arg.rfind("--", 0) != 0)
      die(kExitBadFlags, "unexpected argument '%s' (flags start with --; see --help)", arg.c_str());
    if (size_t eq = arg.find('='); eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
      has_value = true;
    }
    auto bool_flag = [&](bool* dst) {
      *dst = has_value ? parse_bool(arg, value) : true;
    };
    auto next = [&]() -> std::string {
      if (has_value) return value;
      if (i + 1 >= argc) die(kExitBadFlags, "flag %s needs a value (see --help)", arg.c_str());
      return argv[++i];
    };
    const char* kPos = "a positive integer";
    const char* kNonNeg = "a non-negative integer";
    if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(kExitOk);
    } else if (arg == "--b") {
      o.b = parse_int(arg, next(), 1, kPos), o.shape_given = true;
    } else if (arg == "--h") {
      o.h = parse_int(arg, next(), 1, kPos), o.shape_given = true;
    } else if (arg == "--hkv") {
      o.hkv = parse_int(arg, next(), 1, kPos), o.shape_given = true;
    } else if (arg == "--s") {
      o.sq = o.sk = parse_int(arg, next(), 0, kNonNeg), o.shape_given = true;
    } else if (arg == "--sq") {
      o.sq = parse_int(arg, next(), 0, kNonNeg), o.shape_given = true;
    } else if (arg == "--sk") {
      o.sk = parse_int(arg, next(), 0, kNonNeg), o.shape_given = true;
    } else if (arg == "--d") {
      o.d = parse_int(arg, next(), 1, kPos), o.shape_given = true;
    } else if (arg == "--causal") {
      bool_flag(&o.causal);
    } else if (arg == "--window") {
      std::string v = next();
      size_t comma = v.find(',');
      if (comma == std::string::npos) bad_flag(arg, v, "L,R with integers >= -1");
      o.window_left = parse_int(arg, v.substr(0, comma), -1, "L,R with integers >= -1");
      o.window_right = parse_int(arg, v.substr(comma + 1), -1, "L,R with integers >= -1");
    } else if (arg == "--scale") {
      std::string v = next();
      char* end = nullptr;
      float f = std::strtof(v.c_str(), &end);
      if (v.empty() || *end != '\0' || !std::isfinite(f) || f <= 0.0f)
        bad_flag(arg, v, "a positive finite number");
      o.scale = f;
    } else if (arg == "--softcap") {
      std::string v = next();
      char* end = nullptr;
      float f = std::strtof(v.c_str(), &end);
      if (v.empty() || *end != '\0' || !std::isfinite(f) || f < 0.0f)
        bad_flag(arg, v, "a finite number >= 0 (0 turns it off)");
      o.softcap = f;
    } else if (arg == "--sink") {
      std::string v = next();
      char* end = nullptr;
      float f = std::strtof(v.c_str(), &end);
      if (v.empty() || *end != '\0' || !std::isfinite(f)) bad_flag(arg, v, "a finite number (the sinks' mean)");
      o.sink = true, o.sink_mean = f;
    } else if (arg == "--dtype") {
      std::string v = next();
      if (v == "bf16") o.dtype = DType::kBF16;
      else if (v == "fp16") o.dtype = DType::kFP16;
      else bad_flag(arg, v, "bf16 or fp16");
    } else if (arg == "--layout") {
      std::string v = next();
      if (v == "bshd") o.layout = Layout::kBSHD;
      else if (v == "bhsd") o.layout = Layout::kBHSD;
      else bad_flag(arg, v, "bshd or bhsd");
    } else if (arg == "--bwd") {
      bool_flag(&o.bwd);
    } else if (arg == "--deterministic") {
      bool_flag(&o.deterministic);
    } else if (arg == "--check") {
      bool_flag(&o.check);
    } else if (arg == "--flush-l2") {
      bool_flag(&o.flush_l2);
    } else if (arg == "--lse") {
      bool_flag(&o.lse);
    } else if (arg == "--iters") {
      o.iters = int(parse_int(arg, next(), 0, kNonNeg));
    } else if (arg == "--warmup") {
      o.warmup = int(parse_int(arg, next(), 0, kNonNeg));
    } else if (arg == "--sweep") {
      std::string v = next();
      if (v != "fa3") bad_flag(arg, v, "fa3");
      o.sweep = true;
    } else if (arg == "--rows") {
      o.rows = int(parse_int(arg, next(), 1, kPos));
    } else if (arg == "--seed") {
      o.seed = uint64_t(parse_int(arg, next(), 0, kNonNeg));
    } else if (arg == "--json") {
      o.json = next();
      if (o.json.empty()) bad_flag(arg, o.json, "a file path");
    } else {
      die(kExitBadFlags, "unknown flag '%s' (see --help)", arg.c_str());
    }
  }
  if (o.hkv < 0) o.hkv = o.h;
  if (o.sk < 0) o.sk = o.sq;
  return o;
}

// ------------------------------------------------------------------------------------------
// 16-bit values on the host (round to nearest even, reference/convert.h).

uint16_t to_bits(DType t, float f) { return fa4::ref::float_to_bits(t, f); }
float from_bits(DType t, uint16_t h) { return fa4::ref::bits_to_float(t, h); }
using fa4::ref::round_to;

const char* dtype_name(DType t) { return t == DType::kBF16 ? "bf16" : "fp16"; }
const char* layout_name(Layout l) { return l == Layout::kBSHD ? "bshd" : "bhsd"; }

// ------------------------------------------------------------------------------------------
// Random inputs: normal(0, 1) from a counter-based generator, as 16-bit values.

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

std::vector<uint16_t> random_normal(DType t, size_t n, uint64_t seed) {
  std::vector<uint16_t> out(n);
  const float kTwoPi = 6.28318530717958647f, kInv24 = 1.0f / 16777216.0f;
  for (size_t i = 0; i < n; i += 2) {
    uint64_t r = splitmix64(seed * 0x632BE59BD9B4E019ull + i);
    float u1 = (float(r >> 40) + 0.5f) * kInv24;          // (0, 1)
    float u2 = float((r >> 8) & 0xFFFFFFu) * kInv24;      // [0, 1)
    float rad = std::sqrt(-2.0f * std::log(u1));
    out[i] = to_bits(t, rad * std::cos(kTwoPi * u2));
    if (i + 1 < n) out[i + 1] = to_bits(t, rad * std::sin(kTwoPi * u2));
  }
  return out;
}

// Each query head's sink from N(mean, 1), rounded to fp32 (what the kernels read), or none.
std::vector<double> draw_sinks(const Options& o, int64_t heads) {
  std::vector<double> out;
  if (!o.sink) return out;
  const std::vector<uint16_t> z = random_normal(DType::kBF16, size_t(heads), o.seed * 4 + 5);  // (bf16: exact in fp32)
  for (uint16_t x : z) out.push_back(double(o.sink_mean + from_bits(DType::kBF16, x)));
  return out;
}

// ------------------------------------------------------------------------------------------
// Problem geometry.

struct Strides {
  int64_t b, s, h;  // elements; head_dim contiguous
};

Strides strides_of(Layout l, int64_t seqlen, int64_t heads, int64_t dim) {
  if (l == Layout::kBSHD) return {seqlen * heads * dim, heads * dim, dim};
  return {heads * seqlen * dim, dim, seqlen * dim};
}

TensorRef tensor_ref(void* data, Strides st) { return TensorRef{data, st.b, st.s, st.h}; }

// A 16-bit tensor in host memory seen through strides, read as float.
struct HostView {
  const uint16_t* bits;
  Strides st;
  DType dtype;
  float at(int64_t b, int64_t s, int64_t h, int64_t d) const {
    return from_bits(dtype, bits[b * st.b + s * st.s + h * st.h + d]);
  }
};

// Contiguous BSHD doubles, the layout fa4::ref takes.
std::vector<double> to_bshd_f64(const HostView& v, int64_t batch, int64_t seq, int64_t heads,
                                int64_t dim) {
  std::vector<double> out(static_cast<size_t>(batch * seq * heads * dim));
  size_t n = 0;
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t s = 0; s < seq; ++s)
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t d = 0; d < dim; ++d) out[n++] = v.at(b, s, h, d);
  return out;
}

// Visible (query, key) pairs of one head, from the bottom-right aligned window rule.
double visible_pairs(const Problem& p) {
  int64_t left = p.window_left, right = p.window_right;
  if (p.causal) right = right < 0 ? 0 : std::min<int64_t>(right, 0);
  // FA3's convention: causal square attention counts half the square.
  if (p.causal && p.seqlen_q == p.seqlen_k && left < 0)
    return 0.5 * double(p.seqlen_q) * double(p.seqlen_k);
  const int64_t off = p.seqlen_k - p.seqlen_q;
  double pairs = 0;
  for (int64_t i = 0; i < p.seqlen_q; ++i) {
    int64_t c = i + off;
    int64_t lo = left < 0 ? 0 : std::max<int64_t>(0, c - left);
    int64_t hi = right < 0 ? p.seqlen_k - 1 : std::min<int64_t>(p.seqlen_k - 1, c + right);
    if (hi >= lo) pairs += double(hi - lo + 1);
  }
  return pairs;
}

double flops(const Problem& p, bool bwd) {
  double f = 4.0 * double(p.batch) * double(p.heads_q) * double(p.head_dim) * visible_pairs(p);
  return bwd ? 2.5 * f : f;
}

double gemm_macs(const Problem& p) {
  return double(p.batch) * double(p.heads_q) * double(p.seqlen_q) * double(p.seqlen_k) *
         double(p.head_dim);
}

float scale_of(const Problem& p) { return static_cast<float>(fa4::ref::softmax_scale(p)); }

std::string describe(const Problem& p, bool bwd, Layout l, const Options& o) {
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "%s %s b=%" PRId64 " h=%" PRId64 " hkv=%" PRId64 " sq=%" PRId64 " sk=%" PRId64
                " d=%" PRId64 " causal=%d window=(%" PRId64 ",%" PRId64 ") layout=%s scale=%.6g",
                bwd ? "bwd" : "fwd", dtype_name(p.dtype), p.batch, p.heads_q, p.heads_kv,
                p.seqlen_q, p.seqlen_k, p.head_dim, int(p.causal), p.window_left, p.window_right,
                layout_name(l), double(scale_of(p)));
  std::string out = buf;
  if (p.softcap > 0.0f) out += " softcap=" + std::to_string(p.softcap);
  if (o.sink) out += " sink~N(" + std::to_string(o.sink_mean) + ",1)";
  return out;
}

// ------------------------------------------------------------------------------------------
// CPU attention of one query row, in three flavours, all on the same 16-bit inputs:
//   row_f64      float64 (the sampled-row check of large problems): fa4::ref::forward_row
//   row_lowprec  the plain 16-bit attention of fa4::ref::forward_lowp (fp32 S and softmax, P and
//                O rounded to the input type): the bound of DESIGN.md §3's criterion
//   row_emulated the kernel's algorithm: 128-key blocks, online softmax with conditional
//                rescaling, exp2 partly by the FMA polynomial, P rounded to 16 bits
// Each writes head_dim outputs and returns the row's natural-log LSE (-inf: no visible key).

struct RowInputs {
  const Problem* p;
  HostView q, k, v;
  float scale;
  const std::vector<double>* sink = nullptr;  // [heads_q] (null or empty: none)
  // Head h's sink, -inf without.
  double sink_of(int64_t h) const { return sink && !sink->empty() ? (*sink)[size_t(h)] : -INFINITY; }
};

double row_f64(const RowInputs& in, int64_t b, int64_t h, int64_t i, double* o) {
  auto reader = [](const HostView& x) { return [&x](int64_t b, int64_t s, int64_t h, int64_t d) { return x.at(b, s, h, d); }; };
  const double lse = fa4::ref::forward_row(*in.p, reader(in.q), reader(in.k), reader(in.v), b, h, i, o);
  const double sk = in.sink_of(h);
  if (sk == -INFINITY) return lse;
  // The sink as one more score of no value: the LSE takes it in, O scales by the keys' share.
  const double m = std::max(lse, sk), with = m + std::log(std::exp(lse - m) + std::exp(sk - m));
  const double share = std::exp(lse - with);
  for (int64_t d = 0; d < in.p->head_dim; ++d) o[d] *= share;
  return with;
}

float row_lowprec(const RowInputs& in, int64_t b, int64_t h, int64_t i, float* o) {
  const Problem& p = *in.p;
  const DType t = p.dtype;
  const int64_t hk = h / (p.heads_q / p.heads_kv), D = p.head_dim;
  std::vector<float> s(size_t(p.seqlen_k), -INFINITY);
  float m = -INFINITY;
  for (int64_t j = 0; j < p.seqlen_k; ++j) {
    if (!fa4::ref::visible(p, i, j)) continue;
    float acc = 0;
    for (int64_t d = 0; d < D; ++d) acc += in.q.at(b, i, h, d) * in.k.at(b, j, hk, d);
    s[size_t(j)] = fa4::ref::capped_score(p, acc * in.scale);
    m = std::max(m, s[size_t(j)]);
  }
  std::vector<float> acc(size_t(D), 0.0f);
  // (The sink as fa4::ref::forward_lowp takes it: into the max, the sum's first term.)
  const bool sinks = in.sink && !in.sink->empty();
  const float sk = static_cast<float>(in.sink_of(h));
  m = std::max(m, sk);
  if (m == -INFINITY) {
    std::fill(o, o + D, 0.0f);
    return -INFINITY;
  }
  float sum = sinks ? std::exp(sk - m) : 0.0f;
  for (int64_t j = 0; j < p.seqlen_k; ++j)
    if (s[size_t(j)] != -INFINITY) sum += std::exp(s[size_t(j)] - m);
  for (int64_t j = 0; j < p.seqlen_k; ++j) {
    if (s[size_t(j)] == -INFINITY) continue;
    float pj = round_to(t, std::exp(s[size_t(j)] - m) / sum);
    for (int64_t d = 0; d < D; ++d) acc[size_t(d)] += pj * in.v.at(b, j, hk, d);
  }
  for (int64_t d = 0; d < D; ++d) o[d] = round_to(t, acc[size_t(d)]);
  return m + std::log(sum);
}

float row_emulated(const RowInputs& in, int64_t b, int64_t h, int64_t i, float* o) {
  namespace nm = fa4::numerics;
  constexpr int64_t kBlockN = 128;
  constexpr float kLog2e = 1.4426950408889634f;
  const Problem& p = *in.p;
  const int64_t hk = h / (p.heads_q / p.heads_kv), D = p.head_dim;
  const float scale_log2 = in.scale * kLog2e;
  nm::RowState st = nm::row_state_init();
  // A sink starts the row as the kernels start it: {sink log2(e), 1} (sm90/epilogue.cuh, start_rows).
  if (const double sk = in.sink_of(h); sk != -INFINITY) st = {static_cast<float>(sk) * kLog2e, 1.0f};
  std::vector<float> acc(size_t(D), 0.0f), x(static_cast<size_t>(kBlockN));
  for (int64_t j0 = 0; j0 < p.seqlen_k; j0 += kBlockN) {
    const int64_t n = std::min(kBlockN, p.seqlen_k - j0);
    float block_max = -INFINITY;
    for (int64_t jj = 0; jj < n; ++jj) {
      const int64_t j = j0 + jj;
      float s = -INFINITY;
      if (fa4::ref::visible(p, i, j)) {
        float a = 0;
        for (int64_t d = 0; d < D; ++d) a += in.q.at(b, i, h, d) * in.k.at(b, j, hk, d);
        s = p.softcap > 0.0f ? fa4::ref::capped_score(p, a * in.scale) * kLog2e : a * scale_log2;
      }
      x[size_t(jj)] = s;
      block_max = std::max(block_max, s);
    }
    const nm::RescaleStep step = nm::rescale_step(st.max, block_max, nm::kRescaleThresholdLog2);
    if (step.rescaled) {
      for (float& a : acc) a *= step.correction;
      st.sum *= step.correction;
      st.max = step.max;
    }
    const float offset = nm::exp_offset(st.max);
    for (int64_t jj = 0; jj < n; ++jj) {
      // One exponential in four on the FMA polynomial, the rest on the "MUFU" path.
      const float e = (jj % 4 == 3) ? nm::exp2_poly(x[size_t(jj)] - offset)
                                    : nm::exp2_mufu(x[size_t(jj)] - offset);
      const float pj = x[size_t(jj)] == -INFINITY ? 0.0f : e;
      st.sum += pj;
      const float p16 = round_to(p.dtype, pj);
      for (int64_t d = 0; d < D; ++d) acc[size_t(d)] += p16 * in.v.at(b, j0 + jj, hk, d);
    }
  }
  for (int64_t d = 0; d < D; ++d)
    o[d] = st.sum == 0.0f ? 0.0f : round_to(p.dtype, acc[size_t(d)] / st.sum);
  return nm::row_lse(st);
}

std::string status_line(const Status& s) {
  return std::string(fa4::to_string(s.code)) + ": " + s.message;
}

// ------------------------------------------------------------------------------------------
// DESIGN.md §3's criterion, accumulated element by element.

struct ErrStats {
  double max_err = 0, lowprec_err = 0, sq_err = 0, sq_ref = 0;
  int64_t count = 0, nonfinite = 0;
  void add(double out, double lowprec, double ref) {
    ++count;
    if (!std::isfinite(out)) {
      ++nonfinite;
      return;
    }
    const double e = std::fabs(out - ref);
    max_err = std::max(max_err, e);
    lowprec_err = std::max(lowprec_err, std::fabs(lowprec - ref));
    sq_err += e * e;
    sq_ref += ref * ref;
  }
  double bound() const { return 2.0 * lowprec_err + kCheckAtol; }
  // A result that is 0 in exact arithmetic (seqlen_k = 1: a softmax over one key is constant, so
  // dQ = dK = 0) has no relative error; the absolute bound holds it, as in the GPU tests
  // (tests/test_backward_gpu.cu, check_gradient).
  bool exact_zero() const { return sq_ref == 0; }
  double rel_fro() const {
    if (sq_ref == 0) return sq_err == 0 ? 0.0 : INFINITY;
    return std::sqrt(sq_err / sq_ref);
  }
  bool pass() const {
    return nonfinite == 0 && max_err <= bound() && (exact_zero() || rel_fro() <= kCheckRelFrobenius);
  }
  void print(const char* name) const {
    char rel[64];
    if (exact_zero())
      std::snprintf(rel, sizeof rel, "rel Frobenius n/a (exactly 0)");
    else
      std::snprintf(rel, sizeof rel, "rel Frobenius %.3e <= %.0e", rel_fro(), kCheckRelFrobenius);
    std::printf("  %-4s max|err| %.3e <= %.3e (2 x lowprec %.3e + %.0e), %s, non-finite %" PRId64 " of %" PRId64
                ": %s\n",
                name, max_err, bound(), lowprec_err, kCheckAtol, rel, nonfinite, count, pass() ? "ok" : "FAIL");
  }
};

// LSE: -inf where the reference has no visible key, else the same bound form as the outputs.
struct LseStats {
  double max_err = 0, lowprec_err = 0;
  int64_t count = 0, bad = 0;  // NaN, or -inf disagreeing with the reference
  void add(double out, double lowprec, double ref) {
    ++count;
    if (std::isnan(out) || (std::isinf(ref) != std::isinf(out))) {
      ++bad;
      return;
    }
    if (std::isinf(ref)) return;
    max_err = std::max(max_err, std::fabs(out - ref));
    lowprec_err = std::max(lowprec_err, std::fabs(lowprec - ref));
  }
  double bound() const { return 2.0 * lowprec_err + kCheckAtol; }
  bool pass() const { return bad == 0 && max_err <= bound(); }
  void print() const {
    std::printf("  lse  max|err| %.3e <= %.3e (2 x lowprec %.3e + %.0e), NaN or wrong -inf %" PRId64
                " of %" PRId64 ": %s\n",
                max_err, bound(), lowprec_err, kCheckAtol, bad, count, pass() ? "ok" : "FAIL");
  }
};

// The query rows a check looks at: all of them for small problems, else a fixed-seed sample that
// always includes the first and last row of the first and last (batch, head).
struct RowId {
  int64_t b, h, i;
};

std::vector<RowId> rows_to_check(const Problem& p, bool all, int sample, uint64_t seed) {
  std::vector<RowId> rows;
  if (p.seqlen_q == 0) return rows;
  if (all) {
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t h = 0; h < p.heads_q; ++h)
        for (int64_t i = 0; i < p.seqlen_q; ++i) rows.push_back({b, h, i});
    return rows;
  }
  rows.push_back({0, 0, 0});
  rows.push_back({0, 0, p.seqlen_q - 1});
  rows.push_back({p.batch - 1, p.heads_q - 1, 0});
  rows.push_back({p.batch - 1, p.heads_q - 1, p.seqlen_q - 1});
  for (int n = 4; n < sample; ++n) {
    uint64_t r = splitmix64(seed ^ (0xA5A5ull + uint64_t(n) * 0x9E37ull));
    rows.push_back({int64_t(r % uint64_t(p.batch)), int64_t((r >> 20) % uint64_t(p.heads_q)),
                    int64_t((r >> 40) % uint64_t(p.seqlen_q))});
  }
  return rows;
}

// ------------------------------------------------------------------------------------------
// The device side: buffers, poison, runs, timing.

struct DeviceBuffer {
  void* ptr = nullptr;
  size_t bytes = 0;
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t n) : bytes(n) { CUDA_OK(cudaMalloc(&ptr, std::max<size_t>(n, 256))); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr(o.ptr), bytes(o.bytes) { o.ptr = nullptr; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(ptr, o.ptr);
    std::swap(bytes, o.bytes);
    return *this;
  }
  ~DeviceBuffer() {
    if (ptr) cudaFree(ptr);
  }
  void reserve(size_t n) {
    if (n > bytes) *this = DeviceBuffer(n);
  }
};

// Host inputs (random pools, sized to the largest problem asked) and their device copies.
struct Inputs {
  DType dtype = DType::kBF16;
  uint64_t seed = 0;
  std::vector<uint16_t> q, k, v, dout;
  DeviceBuffer dq_in, dk_in, dv_in, ddout_in;  // device copies of q, k, v, dout
  DeviceBuffer sink_in;                        // fp32 [heads_q] with --sink

  void ensure(DType t, uint64_t s, size_t nq, size_t nkv, bool need_dout) {
    auto fill = [&](std::vector<uint16_t>& host, DeviceBuffer& dev, size_t n, uint64_t stream) {
      if (host.size() >= n && dtype == t && seed == s) return;
      host = random_normal(t, n, s * 4 + stream);
      dev = DeviceBuffer(n * 2);
      CUDA_OK(cudaMemcpy(dev.ptr, host.data(), n * 2, cudaMemcpyHostToDevice));
    };
    if (dtype != t || seed != s) q.clear(), k.clear(), v.clear(), dout.clear();
    fill(q, dq_in, nq, 0);
    fill(k, dk_in, nkv, 1);
    fill(v, dv_in, nkv, 2);
    if (need_dout) fill(dout, ddout_in, nq, 3);
    dtype = t;
    seed = s;
  }
};

struct Outputs {
  DeviceBuffer o, lse, dq, dk, dv, dsink, workspace;
};

struct Gpu {
  std::string name;
  std::string driver;  // the kernel driver's version, as nvidia-smi prints it
  int sms = 0, cc = 0, driver_api = 0, runtime = 0;
};

// The NVIDIA kernel driver's version ("580.159.04"), as nvidia-smi prints it, from NVML loaded at
// run time (it ships with the driver, so a machine without one still runs the CPU reference); where
// NVML does not answer, the CUDA driver API's version (cudaDriverGetVersion), named as such.
std::string driver_version(int driver_api) {
  if (void* nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL)) {
    using Init = int (*)();
    using Version = int (*)(char*, unsigned);
    const auto init = reinterpret_cast<Init>(dlsym(nvml, "nvmlInit_v2"));
    const auto version = reinterpret_cast<Version>(dlsym(nvml, "nvmlSystemGetDriverVersion"));
    const auto shutdown = reinterpret_cast<Init>(dlsym(nvml, "nvmlShutdown"));
    char v[96] = {};
    bool got = false;
    if (init && version && shutdown && init() == 0) {  // NVML_SUCCESS
      got = version(v, sizeof v) == 0 && v[0] != '\0';
      shutdown();
    }
    dlclose(nvml);
    if (got) return v;
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, "cuda-driver-api %d.%d", driver_api / 1000, (driver_api % 1000) / 10);
  return buf;
}

// Whether a usable GPU is there; `why` says why not.
bool find_gpu(Gpu* gpu, std::string* why) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    cudaGetLastError();
    *why = std::string("no CUDA GPU found (") +
           (e != cudaSuccess ? cudaGetErrorString(e) : "device count 0") + ")";
    return false;
  }
  cudaDeviceProp prop{};
  CUDA_OK(cudaGetDeviceProperties(&prop, 0));
  gpu->name = prop.name;
  gpu->sms = prop.multiProcessorCount;
  gpu->cc = prop.major * 10 + prop.minor;
  cudaDriverGetVersion(&gpu->driver_api);
  cudaRuntimeGetVersion(&gpu->runtime);
  gpu->driver = driver_version(gpu->driver_api);
  if (gpu->cc < fa4::kMinComputeCapability) {
    char buf[512];
    std::snprintf(buf, sizeof buf, "GPU 0 (%s) has compute capability %d.%d; fa4 needs %d.%d",
                  prop.name, prop.major, prop.minor, fa4::kMinComputeCapability / 10,
                  fa4::kMinComputeCapability % 10);
    *why = buf;
    return false;
  }
  return true;
}

// One problem laid out on the device.
struct Case {
  Problem p;
  Layout layout;
  bool bwd, deterministic;
  fa4::ForwardArgs fwd;
  fa4::BackwardArgs bwd_args;
  size_t nq, nkv, nlse;  // elements
  std::vector<double> sink;  // [heads_q] with --sink (fp32 values), else empty
};

Case make_case(const Options& o, const Problem& p, Inputs& in, Outputs& out) {
  Case c{};
  c.p = p;
  c.layout = o.layout;
  c.bwd = o.bwd;
  c.deterministic = o.deterministic;
  c.nq = size_t(p.batch * p.seqlen_q * p.heads_q * p.head_dim);
  c.nkv = size_t(p.batch * p.seqlen_k * p.heads_kv * p.head_dim);
  c.nlse = size_t(p.batch * p.heads_q * p.seqlen_q);
  in.ensure(p.dtype, o.seed, c.nq, c.nkv, o.bwd);
  out.o.reserve(c.nq * 2);
  out.lse.reserve(c.nlse * 4);
  const Strides sq = strides_of(o.layout, p.seqlen_q, p.heads_q, p.head_dim);
  const Strides skv = strides_of(o.layout, p.seqlen_k, p.heads_kv, p.head_dim);
  c.fwd.problem = p;
  c.fwd.q = tensor_ref(in.dq_in.ptr, sq);
  c.fwd.k = tensor_ref(in.dk_in.ptr, skv);
  c.fwd.v = tensor_ref(in.dv_in.ptr, skv);
  c.fwd.o = tensor_ref(out.o.ptr, sq);
  c.fwd.lse = static_cast<float*>(out.lse.ptr);
  c.sink = draw_sinks(o, p.heads_q);
  if (!c.sink.empty()) {
    const std::vector<float> s32(c.sink.begin(), c.sink.end());
    in.sink_in.reserve(s32.size() * 4);
    CUDA_OK(cudaMemcpy(in.sink_in.ptr, s32.data(), s32.size() * 4, cudaMemcpyHostToDevice));
    c.fwd.sink = static_cast<const float*>(in.sink_in.ptr);
  }
  if (o.bwd) {
    out.dq.reserve(c.nq * 2);
    out.dk.reserve(c.nkv * 2);
    out.dv.reserve(c.nkv * 2);
    auto& a = c.bwd_args;
    a.problem = p;
    a.q = c.fwd.q, a.k = c.fwd.k, a.v = c.fwd.v, a.o = c.fwd.o;
    a.dout = tensor_ref(in.ddout_in.ptr, sq);
    a.dq = tensor_ref(out.dq.ptr, sq);
    a.dk = tensor_ref(out.dk.ptr, skv);
    a.dv = tensor_ref(out.dv.ptr, skv);
    a.lse = c.fwd.lse;
    a.deterministic = o.deterministic;
    if (!c.sink.empty()) {
      out.dsink.reserve(c.sink.size() * 4);
      a.sink = c.fwd.sink;
      a.dsink = static_cast<float*>(out.dsink.ptr);
    }
  }
  return c;
}

// Sizes the workspace; a non-ok status means the problem cannot run.
Status prepare_workspace(Case& c, Outputs& out) {
  size_t bytes = 0;
  Status s = c.bwd ? fa4::backward_workspace_size(c.bwd_args, &bytes)
                   : fa4::forward_workspace_size(c.fwd, &bytes);
  if (!s.ok()) return s;
  if (bytes) out.workspace.reserve(bytes);
  void* ws = bytes ? out.workspace.ptr : nullptr;
  c.fwd.workspace = ws, c.fwd.workspace_bytes = bytes;
  c.bwd_args.workspace = ws, c.bwd_args.workspace_bytes = bytes;
  return s;
}

// NaN bytes over everything the measured call writes.
void poison(const Case& c, const Outputs& out, cudaStream_t st) {
  if (!c.bwd) {
    CUDA_OK(cudaMemsetAsync(out.o.ptr, 0xFF, c.nq * 2, st));
    CUDA_OK(cudaMemsetAsync(out.lse.ptr, 0xFF, c.nlse * 4, st));
  } else {
    CUDA_OK(cudaMemsetAsync(out.dq.ptr, 0xFF, c.nq * 2, st));
    CUDA_OK(cudaMemsetAsync(out.dk.ptr, 0xFF, c.nkv * 2, st));
    CUDA_OK(cudaMemsetAsync(out.dv.ptr, 0xFF, c.nkv * 2, st));
    if (c.bwd_args.dsink) CUDA_OK(cudaMemsetAsync(out.dsink.ptr, 0xFF, c.sink.size() * 4, st));
  }
}

Status run_once(const Case& c, cudaStream_t st) {
  return c.bwd ? fa4::backward(c.bwd_args, st) : fa4::forward(c.fwd, st);
}

// Median milliseconds of `iters` calls after `warmup`; NaN (and *status set) if a call fails.
// L2 flush of triton.testing.do_bench (what bench/side_by_side.py and the peer baselines use):
// 256 MB written before each timed call, so the call starts with none of its inputs in L2.
constexpr size_t kFlushBytes = size_t(256) << 20;

double time_ms(const Case& c, const Outputs& out, int warmup, int iters, bool flush_l2,
               cudaStream_t st, Status* status) {
  DeviceBuffer flush(flush_l2 ? kFlushBytes : 0);
  for (int i = 0; i < warmup; ++i) {
    poison(c, out, st);
    if (Status s = run_once(c, st); !s.ok()) return *status = s, NAN;
  }
  if (iters == 0) return NAN;
  std::vector<cudaEvent_t> ev(size_t(2 * iters));
  for (auto& e : ev) CUDA_OK(cudaEventCreate(&e));
  for (int i = 0; i < iters; ++i) {
    poison(c, out, st);
    if (flush_l2) CUDA_OK(cudaMemsetAsync(flush.ptr, 0, kFlushBytes, st));
    CUDA_OK(cudaEventRecord(ev[size_t(2 * i)], st));
    if (Status s = run_once(c, st); !s.ok()) {
      CUDA_OK(cudaStreamSynchronize(st));
      for (auto& e : ev) cudaEventDestroy(e);
      return *status = s, NAN;
    }
    CUDA_OK(cudaEventRecord(ev[size_t(2 * i + 1)], st));
  }
  CUDA_OK(cudaStreamSynchronize(st));
  CUDA_OK(cudaGetLastError());
  std::vector<float> ms(static_cast<size_t>(iters));
  for (int i = 0; i < iters; ++i)
    CUDA_OK(cudaEventElapsedTime(&ms[size_t(i)], ev[size_t(2 * i)], ev[size_t(2 * i + 1)]));
  for (auto& e : ev) cudaEventDestroy(e);
  std::sort(ms.begin(), ms.end());
  return iters % 2 ? ms[size_t(iters / 2)] : 0.5 * (ms[size_t(iters / 2 - 1)] + ms[size_t(iters / 2)]);
}

std::vector<uint16_t> download16(const void* dev, size_t n) {
  std::vector<uint16_t> h(n);
  CUDA_OK(cudaMemcpy(h.data(), dev, n * 2, cudaMemcpyDeviceToHost));
  return h;
}

int64_t count_nan16(const std::vector<uint16_t>& h, DType t) {
  int64_t n = 0;
  for (uint16_t x : h) n += std::isnan(from_bits(t, x));
  return n;
}

// ------------------------------------------------------------------------------------------
// Checks on the device results.

struct CheckResult {
  bool ran = false, pass = true;
  std::string summary;  // one line for tables
};

// The whole output against fa4::ref::gpu_forward (fp32): max |out - oracle| within DESIGN.md
// §3's bound, 2 x (plain 16-bit error) + 1e-3, where the plain 16-bit error over every element is
// taken as the larger of the checked rows' and the oracle's own rounding to the 16-bit type
// (which plain16 also pays, at every element); relative Frobenius error within §3's; LSE likewise.
// The checked rows are the sample and the rows where the output is farthest from the oracle
// (worst_rows): those get the float64 row and the plain 16-bit row too, so the bound at the
// worst elements is §3's own, not the oracle's rounding alone.
struct OracleStats {
  bool ran = false, pass = false;
  std::string error;
  double max_err = 0, rel_fro = 0, lse_err = 0, round_err = 0;
  double bound = 0;  // the output bound used
  int64_t lse_bad = 0;
  bool finite = true;
  std::vector<RowId> worst_rows;  // the rows holding the largest |out - oracle|, largest first
  void judge(double row_bound, double lse_bound) {
    bound = std::max(row_bound, 2.0 * round_err + kCheckAtol);
    pass = ran && finite && max_err <= bound && rel_fro <= kCheckRelFrobenius && lse_bad == 0 &&
           lse_err <= lse_bound;
  }
  void print(double lse_bound) const {
    if (!ran) {
      std::printf("  oracle: could not run (%s): FAIL\n", error.c_str());
      return;
    }
    std::printf("  every element vs the GPU fp32 oracle: out max|err| %.3e <= %.3e, rel Frobenius"
                " %.3e <= %.0e; lse max|err| %.3e <= %.3e, wrong -inf %" PRId64 ": %s\n",
                max_err, this->bound, rel_fro, kCheckRelFrobenius, lse_err, lse_bound, lse_bad,
                pass ? "ok" : "FAIL");
  }
};

constexpr int kOracleWorstRows = 16;

OracleStats compare_with_oracle(const Case& c, const HostView& ov, const std::vector<float>& lse,
                                cudaStream_t st) {
  const Problem& p = c.p;
  OracleStats r;
  DeviceBuffer o32(c.nq * 4), lse32(c.nlse * 4);
  const Status s = fa4::ref::gpu_forward(c.fwd, static_cast<float*>(o32.ptr),
                                         static_cast<float*>(lse32.ptr), st);
  CUDA_OK(cudaStreamSynchronize(st));
  CUDA_OK(cudaGetLastError());
  if (!s.ok()) {
    r.error = status_line(s);
    return r;
  }
  std::vector<float> ho(c.nq), hl(c.nlse);
  CUDA_OK(cudaMemcpy(ho.data(), o32.ptr, c.nq * 4, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(hl.data(), lse32.ptr, c.nlse * 4, cudaMemcpyDeviceToHost));
  double sq_err = 0, sq_ref = 0;
  std::vector<std::pair<double, RowId>> row_err;
  row_err.reserve(size_t(p.batch * p.seqlen_q * p.heads_q));
  size_t n = 0;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t i = 0; i < p.seqlen_q; ++i)
      for (int64_t h = 0; h < p.heads_q; ++h) {
        double worst = 0;
        for (int64_t d = 0; d < p.head_dim; ++d, ++n) {
          const double o = ov.at(b, i, h, d), ref = ho[n];
          if (!std::isfinite(o)) {
            r.finite = false;
            continue;
          }
          worst = std::max(worst, std::fabs(o - ref));
          r.round_err = std::max(r.round_err, std::fabs(double(round_to(p.dtype, float(ref))) - ref));
          sq_err += (o - ref) * (o - ref);
          sq_ref += ref * ref;
        }
        r.max_err = std::max(r.max_err, worst);
        row_err.push_back({worst, RowId{b, h, i}});
      }
  const size_t k = std::min<size_t>(kOracleWorstRows, row_err.size());
  std::partial_sort(row_err.begin(), row_err.begin() + std::ptrdiff_t(k), row_err.end(),
                    [](const auto& x, const auto& y) { return x.first > y.first; });
  for (size_t j = 0; j < k; ++j) r.worst_rows.push_back(row_err[j].second);
  r.rel_fro = sq_ref > 0 ? std::sqrt(sq_err / sq_ref) : (sq_err > 0 ? INFINITY : 0.0);
  for (size_t i = 0; i < c.nlse; ++i) {
    if (std::isnan(lse[i]) || std::isinf(lse[i]) != std::isinf(hl[i])) {
      ++r.lse_bad;
      continue;
    }
    if (!std::isinf(hl[i])) r.lse_err = std::max(r.lse_err, double(std::fabs(lse[i] - hl[i])));
  }
  r.ran = true;
  return r;
}

// Forward: every query row against fa4::ref::forward, bounded by fa4::ref::forward_lowp (small
// problems), or sampled rows against row_f64 / row_lowprec and then every element against the
// GPU oracle (large ones); plus a NaN scan of every output element.
CheckResult check_forward(const Case& c, const Inputs& in, const Outputs& out, int sample_rows,
                          uint64_t seed, cudaStream_t st, bool verbose) {
  const Problem& p = c.p;
  const Strides sq = strides_of(c.layout, p.seqlen_q, p.heads_q, p.head_dim);
  const Strides skv = strides_of(c.layout, p.seqlen_k, p.heads_kv, p.head_dim);
  RowInputs ri{&p, {in.q.data(), sq, p.dtype}, {in.k.data(), skv, p.dtype},
               {in.v.data(), skv, p.dtype}, scale_of(p), &c.sink};
  const std::vector<uint16_t> o16 = download16(out.o.ptr, c.nq);
  std::vector<float> lse(c.nlse);
  CUDA_OK(cudaMemcpy(lse.data(), out.lse.ptr, c.nlse * 4, cudaMemcpyDeviceToHost));
  const HostView ov{o16.data(), sq, p.dtype};
  const int64_t unwritten_o = count_nan16(o16, p.dtype);
  int64_t unwritten_lse = 0;
  for (float x : lse) unwritten_lse += std::isnan(x);

  const bool whole = gemm_macs(p) <= kFullCheckMacs;
  const std::vector<RowId> rows = rows_to_check(p, whole, sample_rows, seed);
  fa4::ref::Forward64 full, full_lp;
  if (whole) {
    const auto q64 = to_bshd_f64(ri.q, p.batch, p.seqlen_q, p.heads_q, p.head_dim);
    const auto k64 = to_bshd_f64(ri.k, p.batch, p.seqlen_k, p.heads_kv, p.head_dim);
    const auto v64 = to_bshd_f64(ri.v, p.batch, p.seqlen_k, p.heads_kv, p.head_dim);
    full = fa4::ref::forward(p, q64, k64, v64, c.sink);
    full_lp = fa4::ref::forward_lowp(p, q64, k64, v64, c.sink);
  }
  const int64_t D = p.head_dim;
  ErrStats eo;
  LseStats el;
  std::vector<double> r64(static_cast<size_t>(D));
  std::vector<float> rlp(static_cast<size_t>(D));
  auto check_row = [&](const RowId& r) {
    const size_t li = size_t((r.b * p.heads_q + r.h) * p.seqlen_q + r.i);
    double lse64, lselp;
    if (whole) {
      const size_t base = size_t(((r.b * p.seqlen_q + r.i) * p.heads_q + r.h) * D);
      for (int64_t d = 0; d < D; ++d) {
        r64[size_t(d)] = full.o[base + size_t(d)];
        rlp[size_t(d)] = float(full_lp.o[base + size_t(d)]);
      }
      lse64 = full.lse[li];
      lselp = full_lp.lse[li];
    } else {
      lse64 = row_f64(ri, r.b, r.h, r.i, r64.data());
      lselp = row_lowprec(ri, r.b, r.h, r.i, rlp.data());
    }
    for (int64_t d = 0; d < D; ++d) eo.add(ov.at(r.b, r.i, r.h, d), rlp[size_t(d)], r64[size_t(d)]);
    el.add(lse[li], lselp, lse64);
  };
  for (const RowId& r : rows) check_row(r);
  // Large problems: every element against the GPU fp32 oracle too, within the bounds the checked
  // rows set, or the oracle's own rounding where that is larger (the oracle's own error is ~1e-6,
  // far below either). The rows where the output is farthest from the oracle are checked against
  // float64 and the plain 16-bit row as the sample is, so a large error there meets §3's bound
  // itself: a plain 16-bit implementation errs more on some rows than on others.
  OracleStats os;
  if (!whole) {
    os = compare_with_oracle(c, ov, lse, st);
    for (const RowId& w : os.worst_rows)
      if (std::none_of(rows.begin(), rows.end(),
                       [&](const RowId& r) { return r.b == w.b && r.h == w.h && r.i == w.i; }))
        check_row(w);
    os.judge(eo.bound(), el.bound());
  }
  CheckResult res;
  res.ran = true;
  res.pass = eo.pass() && el.pass() && unwritten_o == 0 && unwritten_lse == 0 && (whole || os.pass);
  char buf[256];
  std::snprintf(buf, sizeof buf, "%s err %.2e/%.2e fro %.1e%s", res.pass ? "PASS" : "FAIL",
                eo.max_err, eo.bound(), eo.rel_fro(),
                whole ? "" : (os.pass ? " oracle ok" : " oracle FAIL"));
  res.summary = buf;
  if (verbose) {
    if (whole)
      std::printf("check: float64 CPU reference (fa4::ref::forward, bound from forward_lowp), all"
                  " %zu query rows\n",
                  rows.size());
    else
      std::printf("check: float64 CPU rows, %zu sampled query rows and the oracle's %zu farthest"
                  " (problem above %.0e MACs)\n",
                  rows.size(), os.worst_rows.size(), kFullCheckMacs);
    eo.print("out");
    el.print();
    if (!whole) os.print(el.bound());
    std::printf("  written: NaN poison left in out %" PRId64 " of %zu, in lse %" PRId64
                " of %zu\n",
                unwritten_o, c.nq, unwritten_lse, c.nlse);
    std::printf("check: %s\n", res.pass ? "PASS" : "FAIL");
  }
  return res;
}

// Backward (small problems only): fa4::ref::backward vs the device dq, dk, dv, bounded by
// fa4::ref::backward_lowp.
CheckResult check_backward(const Case& c, const Inputs& in, const Outputs& out, bool verbose) {
  const Problem& p = c.p;
  CheckResult res;
  const std::vector<uint16_t> dq = download16(out.dq.ptr, c.nq), dk = download16(out.dk.ptr, c.nkv),
                              dv = download16(out.dv.ptr, c.nkv);
  int64_t unwritten = count_nan16(dq, p.dtype) + count_nan16(dk, p.dtype) + count_nan16(dv, p.dtype);
  std::vector<float> ds(c.sink.size());  // the sinks' gradient (--sink)
  if (!ds.empty()) CUDA_OK(cudaMemcpy(ds.data(), out.dsink.ptr, ds.size() * 4, cudaMemcpyDeviceToHost));
  for (float x : ds) unwritten += std::isnan(x);
  if (gemm_macs(p) > kFullCheckMacs) {
    res.ran = true;
    res.pass = unwritten == 0;
    res.summary = res.pass ? "written (too large for the CPU reference)" : "FAIL: NaN left";
    if (verbose)
      std::printf("check: backward too large for the CPU reference (above %.0e MACs): only the NaN"
                  " scan ran, %" PRId64 " of %zu gradient elements unwritten: %s\n",
                  kFullCheckMacs, unwritten, 2 * c.nkv + c.nq + ds.size(), res.pass ? "PASS" : "FAIL");
    return res;
  }
  const Strides sq = strides_of(c.layout, p.seqlen_q, p.heads_q, p.head_dim);
  const Strides skv = strides_of(c.layout, p.seqlen_k, p.heads_kv, p.head_dim);
  const HostView q{in.q.data(), sq, p.dtype}, k{in.k.data(), skv, p.dtype},
      v{in.v.data(), skv, p.dtype}, dout{in.dout.data(), sq, p.dtype};
  const auto q64 = to_bshd_f64(q, p.batch, p.seqlen_q, p.heads_q, p.head_dim);
  const auto k64 = to_bshd_f64(k, p.batch, p.seqlen_k, p.heads_kv, p.head_dim);
  const auto v64 = to_bshd_f64(v, p.batch, p.seqlen_k, p.heads_kv, p.head_dim);
  const auto do64 = to_bshd_f64(dout, p.batch, p.seqlen_q, p.heads_q, p.head_dim);
  const fa4::ref::Backward64 ref = fa4::ref::backward(p, q64, k64, v64, do64, c.sink);
  const fa4::ref::Backward64 lp = fa4::ref::backward_lowp(p, q64, k64, v64, do64, c.sink);
  auto stats = [&](const std::vector<uint16_t>& dev, Strides st, int64_t seq, int64_t heads,
                   const std::vector<double>& low, const std::vector<double>& r64) {
    ErrStats e;
    const HostView hv{dev.data(), st, p.dtype};
    size_t n = 0;
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t s = 0; s < seq; ++s)
        for (int64_t h = 0; h < heads; ++h)
          for (int64_t d = 0; d < p.head_dim; ++d, ++n) e.add(hv.at(b, s, h, d), low[n], r64[n]);
    return e;
  };
  const ErrStats eq = stats(dq, sq, p.seqlen_q, p.heads_q, lp.dq, ref.dq);
  const ErrStats ek = stats(dk, skv, p.seqlen_k, p.heads_kv, lp.dk, ref.dk);
  const ErrStats ev = stats(dv, skv, p.seqlen_k, p.heads_kv, lp.dv, ref.dv);
  ErrStats es;
  for (size_t h = 0; h < ds.size(); ++h) es.add(ds[h], lp.dsink[h], ref.dsink[h]);
  res.ran = true;
  res.pass = eq.pass() && ek.pass() && ev.pass() && es.pass() && unwritten == 0;
  char buf[256];
  std::snprintf(buf, sizeof buf, "%s dq %.1e dk %.1e dv %.1e", res.pass ? "PASS" : "FAIL",
                eq.max_err, ek.max_err, ev.max_err);
  res.summary = buf;
  if (verbose) {
    std::printf("check: float64 CPU reference (fa4::ref::backward), whole problem\n");
    eq.print("dq");
    ek.print("dk");
    ev.print("dv");
    if (!c.sink.empty()) es.print("dsnk");
    std::printf("  written: NaN poison left %" PRId64 " of %zu gradient elements\n", unwritten,
                2 * c.nkv + c.nq + c.sink.size());
    std::printf("check: %s\n", res.pass ? "PASS" : "FAIL");
  }
  return res;
}

// The backward reads O and LSE. Small problems take them from the float64 reference (so the
// backward is checked on its own); large ones from fa4::forward, or the GPU oracle without it.
Status prepare_backward_inputs(const Case& c, const Inputs& in, const Outputs& out,
                               cudaStream_t st) {
  const Problem& p = c.p;
  if (gemm_macs(p) <= kFullCheckMacs) {
    const Strides sq = strides_of(c.layout, p.seqlen_q, p.heads_q, p.head_dim);
    const Strides skv = strides_of(c.layout, p.seqlen_k, p.heads_kv, p.head_dim);
    const fa4::ref::Forward64 f = fa4::ref::forward(
        p, to_bshd_f64({in.q.data(), sq, p.dtype}, p.batch, p.seqlen_q, p.heads_q, p.head_dim),
        to_bshd_f64({in.k.data(), skv, p.dtype}, p.batch, p.seqlen_k, p.heads_kv, p.head_dim),
        to_bshd_f64({in.v.data(), skv, p.dtype}, p.batch, p.seqlen_k, p.heads_kv, p.head_dim), c.sink);
    std::vector<uint16_t> o(c.nq);
    size_t n = 0;
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t s = 0; s < p.seqlen_q; ++s)
        for (int64_t h = 0; h < p.heads_q; ++h)
          for (int64_t d = 0; d < p.head_dim; ++d)
            o[size_t(b * sq.b + s * sq.s + h * sq.h + d)] = to_bits(p.dtype, float(f.o[n++]));
    std::vector<float> lse(f.lse.begin(), f.lse.end());
    CUDA_OK(cudaMemcpy(out.o.ptr, o.data(), c.nq * 2, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(out.lse.ptr, lse.data(), c.nlse * 4, cudaMemcpyHostToDevice));
    return Status::Ok();
  }
  Status s = fa4::forward(c.fwd, st);
  CUDA_OK(cudaStreamSynchronize(st));
  if (s.ok()) return s;
  // No fa4 forward for this problem: O and LSE from the GPU oracle, O rounded to the dtype.
  DeviceBuffer o32(c.nq * 4);
  const Status so = fa4::ref::gpu_forward(c.fwd, static_cast<float*>(o32.ptr),
                                          static_cast<float*>(out.lse.ptr), st);
  CUDA_OK(cudaStreamSynchronize(st));
  if (!so.ok()) {
    s.message = "the backward needs O and LSE: fa4::forward answered " + status_line(s) +
                ", the GPU oracle " + status_line(so);
    return s;
  }
  std::vector<float> o32h(c.nq);
  CUDA_OK(cudaMemcpy(o32h.data(), o32.ptr, c.nq * 4, cudaMemcpyDeviceToHost));
  const Strides sq = strides_of(c.layout, p.seqlen_q, p.heads_q, p.head_dim);
  std::vector<uint16_t> o(c.nq);
  size_t n = 0;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t i = 0; i < p.seqlen_q; ++i)
      for (int64_t h = 0; h < p.heads_q; ++h)
        for (int64_t d = 0; d < p.head_dim; ++d)
          o[size_t(b * sq.b + i * sq.s + h * sq.h + d)] = to_bits(p.dtype, o32h[n++]);
  CUDA_OK(cudaMemcpy(out.o.ptr, o.data(), c.nq * 2, cudaMemcpyHostToDevice));
  return Status::Ok();
}

// ------------------------------------------------------------------------------------------
// JSON records (the side-by-side schema), for --json.

std::string json_escape(const std::string& s) {
  std::string r;
  for (char ch : s) {
    if (ch == '"' || ch == '\\') r += '\\', r += ch;
    else if (ch == '\n') r += "\\n";
    else if (static_cast<unsigned char>(ch) < 0x20) r += ' ';
    else r += ch;
  }
  return r;
}

struct Record {
  Problem p;
  bool bwd;
  std::optional<float> sink_mean;  // --sink
  double ms, tflops;
  std::string error, check;
};

void write_json(const std::string& path, const std::vector<Record>& recs, const Gpu& gpu,
                const std::string& command) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (!f) die(kExitCannotRun, "cannot write --json file '%s'", path.c_str());
  const char* commit = std::getenv("FA4_COMMIT");
  char date[32];
  std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  std::fprintf(f, "[\n");
  for (size_t i = 0; i < recs.size(); ++i) {
    const Record& r = recs[i];
    std::fprintf(f,
                 " {\"op\": \"%s\", \"provider\": \"fa4\", \"tool\": \"fa4-bench\", \"dtype\": "
                 "\"%s\", \"batch\": %" PRId64 ", \"heads_q\": %" PRId64 ", \"heads_kv\": %" PRId64
                 ", \"seqlen_q\": %" PRId64 ", \"seqlen_k\": %" PRId64 ", \"head_dim\": %" PRId64
                 ", \"causal\": %s, \"window\": [%" PRId64 ", %" PRId64 "], ",
                 r.bwd ? "bwd" : "fwd", dtype_name(r.p.dtype), r.p.batch, r.p.heads_q,
                 r.p.heads_kv, r.p.seqlen_q, r.p.seqlen_k, r.p.head_dim,
                 r.p.causal ? "true" : "false", r.p.window_left, r.p.window_right);
    if (r.p.softcap > 0.0f) std::fprintf(f, "\"softcap\": %.6g, ", double(r.p.softcap));
    if (r.sink_mean) std::fprintf(f, "\"sink\": \"N(%.6g, 1)\", ", double(*r.sink_mean));
    if (std::isfinite(r.ms))
      std::fprintf(f, "\"ms\": %.6f, \"tflops\": %.2f, ", r.ms, r.tflops);
    else
      std::fprintf(f, "\"ms\": null, \"tflops\": null, ");
    if (!r.error.empty()) std::fprintf(f, "\"error\": \"%s\", ", json_escape(r.error).c_str());
    if (!r.check.empty()) std::fprintf(f, "\"check\": \"%s\", ", json_escape(r.check).c_str());
    std::fprintf(f,
                 "\"gpu\": \"%s\", \"driver\": \"%s\", \"commit\": \"%s\", \"date\": \"%s\", "
                 "\"command\": \"%s\"}%s\n",
                 json_escape(gpu.name).c_str(), json_escape(gpu.driver).c_str(),
                 json_escape(commit ? commit : "unknown").c_str(), date,
                 json_escape(command).c_str(), i + 1 < recs.size() ? "," : "");
  }
  std::fprintf(f, "]\n");
  std::fclose(f);
  std::printf("wrote %s\n", path.c_str());
}

// ------------------------------------------------------------------------------------------
// Modes.

Problem problem_from(const Options& o) {
  Problem p;
  p.dtype = o.dtype;
  p.batch = o.b;
  p.seqlen_q = o.sq;
  p.seqlen_k = o.sk;
  p.heads_q = o.h;
  p.heads_kv = o.hkv;
  p.head_dim = o.d;
  p.softmax_scale = o.scale;
  p.softcap = o.softcap;
  p.causal = o.causal;
  p.window_left = o.window_left;
  p.window_right = o.window_right;
  return p;
}

// Runs one case: validate, (backward inputs), check run, timing. Fills `rec`; returns the exit
// status this case alone would give.
int run_case(const Options& o, Case& c, Inputs& in, Outputs& out, cudaStream_t st, bool verbose,
             Record* rec) {
  rec->p = c.p;
  rec->bwd = c.bwd;
  if (o.sink) rec->sink_mean = o.sink_mean;
  rec->ms = rec->tflops = NAN;
  Status s = prepare_workspace(c, out);  // sizes it from the problem alone; validate() checks it
  if (s.ok()) s = c.bwd ? fa4::validate(c.bwd_args) : fa4::validate(c.fwd);
  if (s.ok() && c.bwd) s = prepare_backward_inputs(c, in, out, st);
  if (s.ok()) {
    poison(c, out, st);
    s = run_once(c, st);
    if (s.ok()) CUDA_OK(cudaStreamSynchronize(st));
    if (s.ok()) {
      cudaError_t e = cudaGetLastError();
      if (e != cudaSuccess) s = {StatusCode::kCudaError, cudaGetErrorString(e)};
    }
  }
  if (!s.ok()) {
    rec->error = status_line(s);
    if (verbose) {
      const char* what = s.code == StatusCode::kNotSupported    ? "fa4 does not support this problem"
                         : s.code == StatusCode::kInvalidArgument ? "fa4 rejected the arguments"
                                                                  : "fa4 failed";
      std::printf("%s: %s\n", what, rec->error.c_str());
    }
    return s.code == StatusCode::kInvalidArgument ? kExitBadFlags : kExitCannotRun;
  }
  int rc = kExitOk;
  if (o.check) {
    CheckResult r = c.bwd ? check_backward(c, in, out, verbose)
                          : check_forward(c, in, out, o.rows, o.seed, st, verbose);
    rec->check = r.summary;
    if (!r.pass) rc = kExitCheckFailed;
  } else {
    // Even without --check, every element must have been written.
    int64_t left = c.bwd ? count_nan16(download16(out.dq.ptr, c.nq), c.p.dtype)
                         : count_nan16(download16(out.o.ptr, c.nq), c.p.dtype);
    if (left != 0) {
      rec->check = "FAIL: NaN poison left";
      if (verbose)
        std::printf("FAIL: %" PRId64 " output elements still hold the NaN poison (or are NaN)\n",
                    left);
      rc = kExitCheckFailed;
    }
  }
  Status ts = Status::Ok();
  Case timed = c;
  if (!o.lse) timed.fwd.lse = nullptr;
  rec->ms = time_ms(timed, out, o.warmup, o.iters, o.flush_l2, st, &ts);
  if (!ts.ok()) {
    rec->error = status_line(ts);
    if (verbose) std::printf("timing stopped: %s\n", rec->error.c_str());
    return rc == kExitOk ? kExitCannotRun : rc;
  }
  if (std::isfinite(rec->ms)) rec->tflops = flops(c.p, c.bwd) / (rec->ms * 1e-3) / 1e12;
  if (verbose && std::isfinite(rec->ms))
    std::printf("time: %.4f ms (median of %d after %d warm-up%s), %.1f TFLOP/s\n", rec->ms,
                o.iters, o.warmup, o.flush_l2 ? ", L2 flushed" : "", rec->tflops);
  return rc;
}

void print_gpu(const Gpu& g) {
  std::printf("fa4-bench: %s (sm_%d, %d SMs), driver %s (CUDA API %d.%d), runtime %d.%d\n", g.name.c_str(),
              g.cc, g.sms, g.driver.c_str(), g.driver_api / 1000, (g.driver_api % 1000) / 10,
              g.runtime / 1000, (g.runtime % 1000) / 10);
}

int run_single(const Options& o, const Gpu& gpu, const std::string& command) {
  print_gpu(gpu);
  const Problem p = problem_from(o);
  std::printf("problem: %s\n", describe(p, o.bwd, o.layout, o).c_str());
  cudaStream_t st;
  CUDA_OK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  Inputs in;
  Outputs out;
  Case c = make_case(o, p, in, out);
  Record rec;
  int rc = run_case(o, c, in, out, st, true, &rec);
  if (!o.json.empty()) write_json(o.json, {rec}, gpu, command);
  CUDA_OK(cudaStreamDestroy(st));
  return rc;
}

int run_sweep(const Options& o, const Gpu& gpu, const std::string& command) {
  print_gpu(gpu);
  std::printf("sweep: FA3 shapes, %s %s, %" PRId64 " tokens, hidden %" PRId64 ", layout %s%s%s\n",
              o.bwd ? "bwd" : "fwd", dtype_name(o.dtype), kSweepTokens, kSweepHidden,
              layout_name(o.layout), o.check ? ", checked" : "",
              o.flush_l2 ? ", L2 flushed before each call" : "");
  cudaStream_t st;
  CUDA_OK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  Inputs in;
  Outputs out;
  std::vector<Record> recs;
  int rc = kExitOk;
  const int total = int(std::size(kSweepHeadDims) * 2 * std::size(kSweepSeqlens));
  int n = 0;
  for (int d : kSweepHeadDims)
    for (bool causal : {false, true})
      for (int64_t s : kSweepSeqlens) {
        Problem p;
        p.dtype = o.dtype;
        p.batch = std::max<int64_t>(1, kSweepTokens / s);
        p.heads_q = p.heads_kv = kSweepHidden / d;
        p.seqlen_q = p.seqlen_k = s;
        p.head_dim = d;
        p.causal = causal;
        std::fprintf(stderr, "[%2d/%d] %s\n", ++n, total, describe(p, o.bwd, o.layout, o).c_str());
        Case c = make_case(o, p, in, out);
        Record rec;
        int r = run_case(o, c, in, out, st, false, &rec);
        if (r == kExitCheckFailed) rc = kExitCheckFailed;
        recs.push_back(rec);
      }
  std::printf("%4s %6s %6s %5s %5s %10s %9s  %s\n", "d", "causal", "seqlen", "batch", "heads",
              "ms", "TFLOP/s", o.check ? "check" : "");
  for (const Record& r : recs) {
    std::printf("%4" PRId64 " %6s %6" PRId64 " %5" PRId64 " %5" PRId64 " ", r.p.head_dim,
                r.p.causal ? "yes" : "no", r.p.seqlen_q, r.p.batch, r.p.heads_q);
    if (!r.error.empty())
      std::printf("%10s %9s  %s\n", "-", "-", r.error.c_str());
    else if (std::isfinite(r.ms))
      std::printf("%10.4f %9.1f  %s\n", r.ms, r.tflops, r.check.c_str());
    else
      std::printf("%10s %9s  %s\n", "-", "-", r.check.c_str());
  }
  if (!o.json.empty()) write_json(o.json, recs, gpu, command);
  CUDA_OK(cudaStreamDestroy(st));
  return rc;
}

// No usable GPU: the float64 reference against the plain 16-bit attention and the CPU emulation
// of the kernel's algorithm, with the same criterion the GPU check uses.
int run_cpu_only(Options o, const std::string& why) {
  std::printf("%s: running the CPU reference on a small default problem\n", why.c_str());
  if (o.shape_given && gemm_macs(problem_from(o)) > kFullCheckMacs) {
    std::printf("the problem of the flags has %.3g MACs (b*h*sq*sk*d), more than the CPU-only run"
                " takes (%.0e): using the small default problem instead\n",
                gemm_macs(problem_from(o)), kFullCheckMacs);
    o.shape_given = false;
  }
  if (!o.shape_given) o.b = 1, o.h = 2, o.hkv = 2, o.sq = 64, o.sk = 64, o.d = 64;
  const Problem p = problem_from(o);
  std::printf("problem: %s\n", describe(p, o.bwd, o.layout, o).c_str());
  {
    // Arguments as fa4 would see them (placeholder aligned pointers; validate reads none).
    alignas(16) static char dummy[16];
    const Strides sq = strides_of(o.layout, p.seqlen_q, p.heads_q, p.head_dim);
    const Strides skv = strides_of(o.layout, p.seqlen_k, p.heads_kv, p.head_dim);
    fa4::ForwardArgs a;
    a.problem = p;
    a.q = tensor_ref(dummy, sq), a.o = tensor_ref(dummy, sq);
    a.k = tensor_ref(dummy, skv), a.v = tensor_ref(dummy, skv);
    a.lse = reinterpret_cast<float*>(dummy);
    const Status s = fa4::validate(a);
    std::printf("fa4::validate: %s\n", s.ok() ? "ok" : status_line(s).c_str());
    if (s.code == StatusCode::kInvalidArgument) return kExitBadFlags;
  }
  const size_t nq = size_t(p.batch * p.seqlen_q * p.heads_q * p.head_dim);
  const size_t nkv = size_t(p.batch * p.seqlen_k * p.heads_kv * p.head_dim);
  const std::vector<uint16_t> q = random_normal(p.dtype, nq, o.seed * 4 + 0),
                              k = random_normal(p.dtype, nkv, o.seed * 4 + 1),
                              v = random_normal(p.dtype, nkv, o.seed * 4 + 2);
  const Strides sq = strides_of(o.layout, p.seqlen_q, p.heads_q, p.head_dim);
  const Strides skv = strides_of(o.layout, p.seqlen_k, p.heads_kv, p.head_dim);
  const HostView hq{q.data(), sq, p.dtype}, hk{k.data(), skv, p.dtype}, hv{v.data(), skv, p.dtype};
  const auto q64 = to_bshd_f64(hq, p.batch, p.seqlen_q, p.heads_q, p.head_dim);
  const auto k64 = to_bshd_f64(hk, p.batch, p.seqlen_k, p.heads_kv, p.head_dim);
  const auto v64 = to_bshd_f64(hv, p.batch, p.seqlen_k, p.heads_kv, p.head_dim);
  const std::vector<double> sink = draw_sinks(o, p.heads_q);

  if (o.bwd) {
    const std::vector<uint16_t> dout = random_normal(p.dtype, nq, o.seed * 4 + 3);
    const HostView hd{dout.data(), sq, p.dtype};
    const auto do64 = to_bshd_f64(hd, p.batch, p.seqlen_q, p.heads_q, p.head_dim);
    const fa4::ref::Backward64 ref = fa4::ref::backward(p, q64, k64, v64, do64, sink);
    const fa4::ref::Backward64 lp = fa4::ref::backward_lowp(p, q64, k64, v64, do64, sink);
    std::printf("check: plain %s backward (fa4::ref::backward_lowp) vs float64"
                " (fa4::ref::backward); on a GPU the kernel's gradients take its place\n",
                dtype_name(p.dtype));
    bool pass = true;
    for (auto [name, low, r64] : {std::tuple{"dq", &lp.dq, &ref.dq}, std::tuple{"dk", &lp.dk, &ref.dk},
                                  std::tuple{"dv", &lp.dv, &ref.dv}, std::tuple{"dsnk", &lp.dsink, &ref.dsink}}) {
      if (low->empty() && r64->empty()) continue;  // (dsink without --sink)
      ErrStats e;
      for (size_t i = 0; i < low->size(); ++i) e.add((*low)[i], (*low)[i], (*r64)[i]);
      e.print(name);
      pass = pass && e.pass();
    }
    std::printf("check: %s\n", pass ? "PASS" : "FAIL");
    return pass ? kExitOk : kExitCheckFailed;
  }

  const fa4::ref::Forward64 ref = fa4::ref::forward(p, q64, k64, v64, sink);
  const fa4::ref::Forward64 low = fa4::ref::forward_lowp(p, q64, k64, v64, sink);
  RowInputs ri{&p, hq, hk, hv, scale_of(p), &sink};
  ErrStats eo;
  LseStats el;
  // The sampled-row references of large GPU checks must agree with fa4::ref; checked here too.
  double f64_diff = 0, lowp_diff = 0;
  const size_t D = size_t(p.head_dim);
  std::vector<float> em(D), lp(D);
  std::vector<double> r64(D);
  for (const RowId& r : rows_to_check(p, true, 0, o.seed)) {
    const size_t base = size_t(((r.b * p.seqlen_q + r.i) * p.heads_q + r.h) * p.head_dim);
    const size_t li = size_t((r.b * p.heads_q + r.h) * p.seqlen_q + r.i);
    const float lse_em = row_emulated(ri, r.b, r.h, r.i, em.data());
    for (size_t d = 0; d < D; ++d) eo.add(em[d], low.o[base + d], ref.o[base + d]);
    el.add(lse_em, low.lse[li], ref.lse[li]);
    const double lse64 = row_f64(ri, r.b, r.h, r.i, r64.data());
    const float lselp = row_lowprec(ri, r.b, r.h, r.i, lp.data());
    for (size_t d = 0; d < D; ++d) {
      f64_diff = std::max(f64_diff, std::fabs(r64[d] - ref.o[base + d]));
      lowp_diff = std::max(lowp_diff, std::fabs(double(lp[d]) - low.o[base + d]));
    }
    if (std::isfinite(lse64) || std::isfinite(ref.lse[li]))
      f64_diff = std::max(f64_diff, std::fabs(lse64 - ref.lse[li]));
    if (std::isfinite(lselp) || std::isfinite(low.lse[li]))
      lowp_diff = std::max(lowp_diff, std::fabs(double(lselp) - low.lse[li]));
  }
  const bool rows_agree = f64_diff <= 1e-12 && lowp_diff == 0.0;
  std::printf("sampled-row references vs fa4::ref: float64 max diff %.1e (<= 1e-12), %s max diff"
              " %.1e (== 0): %s\n",
              f64_diff, dtype_name(p.dtype), lowp_diff, rows_agree ? "ok" : "FAIL");
  std::printf("check: CPU emulation of FA4's algorithm (128-key blocks, conditional rescale,"
              " software exp2 on 1 in 4 -- the sm90 kernel ships with none, see docs/perf-notes.md --,"
              " %s P) vs float64 (fa4::ref::forward), bounded by the plain"
              " %s attention (fa4::ref::forward_lowp); on a GPU the kernel's output takes the"
              " emulation's place\n",
              dtype_name(p.dtype), dtype_name(p.dtype));
  eo.print("out");
  el.print();
  const bool pass = eo.pass() && el.pass() && rows_agree;
  std::printf("check: %s\n", pass ? "PASS" : "FAIL");
  return pass ? kExitOk : kExitCheckFailed;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse_flags(argc, argv);
  std::string command = "fa4-bench";
  for (int i = 1; i < argc; ++i) command += std::string(" ") + argv[i];
  Gpu gpu;
  std::string why;
  if (!find_gpu(&gpu, &why)) return run_cpu_only(o, why);
  CUDA_OK(cudaSetDevice(0));
  return o.sweep ? run_sweep(o, gpu, command) : run_single(o, gpu, command);
}
