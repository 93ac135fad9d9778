// Argument validation (DESIGN.md §4) and the resolution of defaults into kernel parameters.
//
// Every message has the form "<argument> = <value>: <what is allowed>" and is built from the same
// constant or variable the check reads, so the text cannot drift from the rule.
#include "common/validate.h"

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <type_traits>
#include <utility>

#include "common/append_kv.h"

namespace fa4 {
namespace {

constexpr DType kDTypes[] = {DType::kBF16, DType::kFP16, DType::kE4M3};
constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
// Rotary dims come in 16s (flash-attn's rule): each half of a GPT-NeoX row is whole 16-byte units.
constexpr int64_t kRotaryDimStep = 16;

Status invalid(std::string message) {
  return {StatusCode::kInvalidArgument, std::move(message)};
}

std::string str(int64_t v) { return std::to_string(v); }

std::string str(float v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(v));
  return buf;
}

// "64, 128, 256 run kernels of their own (the 16-bit forward also 192)"
std::string kernel_head_dims() {
  std::string s, more;
  for (int d : kKernelHeadDims) s += (s.empty() ? "" : ", ") + std::to_string(d);
  for (int d : kForwardKernelHeadDims)
    if (std::find(std::begin(kKernelHeadDims), std::end(kKernelHeadDims), d) == std::end(kKernelHeadDims))
      more += (more.empty() ? "" : ", ") + std::to_string(d);
  return s + " run kernels of their own" + (more.empty() ? "" : " (the 16-bit forward also " + more + ")");
}

// "0 (bf16), 1 (fp16)"
std::string supported_dtypes() {
  std::string s;
  for (DType t : kDTypes) {
    if (!s.empty()) s += ", ";
    s += std::to_string(static_cast<int>(t)) + " (" + to_string(t) + ")";
  }
  return s;
}

bool is_known_dtype(DType t) {
  for (DType k : kDTypes)
    if (t == k) return true;
  return false;
}

// A size: at least `min`, and representable as the kernel's int coordinate.
Status check_size(const char* name, int64_t v, int64_t min) {
  if (v < min) return invalid(std::string(name) + " = " + str(v) + ": must be >= " + str(min));
  if (v > kInt32Max)
    return invalid(std::string(name) + " = " + str(v) + ": must fit in int32 (at most " +
                   str(kInt32Max) + ")");
  return Status::Ok();
}

Status check_window(const char* name, int64_t v) {
  if (v < -1)
    return invalid(std::string(name) + " = " + str(v) + ": must be >= 0, or -1 for unbounded");
  return Status::Ok();
}

// How a tensor is shaped: [batch, seq, heads, head_dim] (or head_dim_v: values()), with the names
// the messages use.
struct Shape {
  const char* seq_name;
  int64_t seq;
  const char* heads_name;
  int64_t heads;
  bool value = false;  // v, o, dout, dv: Problem::value_dim() columns
};

// The same rows on the value side (v, o, dout, dv).
Shape values(Shape s) {
  s.value = true;
  return s;
}

// Rules for one 4-d tensor. An empty tensor is never read or written: anything goes, null too
// (frameworks hand out null data pointers for empty tensors).
Status check_tensor(const char* name, const TensorRef& t, const Shape& s, const Problem& p) {
  if (p.batch == 0 || s.seq == 0) return Status::Ok();
  const std::string n(name);
  const char* dim_name = s.value && p.head_dim_v > 0 ? "head_dim_v" : "head_dim";
  const int64_t dim = s.value ? p.value_dim() : p.head_dim;
  if (t.data == nullptr)
    return invalid(n + ".data = null: a non-empty tensor [batch, " + s.seq_name + ", " +
                   s.heads_name + ", " + dim_name + "] needs a device pointer");
  if (reinterpret_cast<uintptr_t>(t.data) % kAlignmentBytes != 0)
    return invalid(n + ".data = " + detail::format_pointer(t.data) + ": must be a multiple of " +
                   str(int64_t{kAlignmentBytes}) + " bytes");

  const int elem = detail::element_size(p.dtype);
  const int64_t align_elems = kAlignmentBytes / elem;  // kAlignmentBytes is a multiple of elem
  const struct {
    const char* field;
    int64_t value;
  } strides[] = {{"batch_stride", t.batch_stride},
                 {"seq_stride", t.seq_stride},
                 {"head_stride", t.head_stride}};
  for (const auto& st : strides) {
    const std::string what = n + "." + st.field + " = " + str(st.value);
    if (st.value < 0) return invalid(what + ": must be >= 0");
    if (st.value % align_elems != 0)
      return invalid(what + ": must be a multiple of " + str(align_elems) + " elements (" +
                     str(int64_t{kAlignmentBytes}) + " bytes of " + to_string(p.dtype) + ")");
  }

  // Largest element offset, and the byte count it spans, in checked 64-bit arithmetic.
  int64_t off = dim - 1, term = 0, bytes = 0;
  bool overflow = __builtin_mul_overflow(p.batch - 1, t.batch_stride, &term) ||
                  __builtin_add_overflow(off, term, &off) ||
                  __builtin_mul_overflow(s.seq - 1, t.seq_stride, &term) ||
                  __builtin_add_overflow(off, term, &off) ||
                  __builtin_mul_overflow(s.heads - 1, t.head_stride, &term) ||
                  __builtin_add_overflow(off, term, &off) ||
                  __builtin_add_overflow(off, int64_t{1}, &bytes) ||
                  __builtin_mul_overflow(bytes, int64_t{elem}, &bytes);
  if (overflow)
    return invalid(n + ".batch_stride = " + str(t.batch_stride) + ", " + n +
                   ".seq_stride = " + str(t.seq_stride) + ", " + n + ".head_stride = " +
                   str(t.head_stride) + ": the largest offset (batch-1)*batch_stride + (" +
                   s.seq_name + "-1)*seq_stride + (" + s.heads_name +
                   "-1)*head_stride + " + dim_name + "-1, in bytes, must fit in int64");
  return Status::Ok();
}

// The LSE tensor [batch, heads_q, seqlen_q] of fp32, contiguous.
Status check_lse(const void* lse, const Problem& p, bool required) {
  int64_t count = 0;
  if (p.batch == 0 || p.seqlen_q == 0) return Status::Ok();  // empty
  if (lse == nullptr) {
    if (!required) return Status::Ok();
    return invalid("lse = null: backward needs the forward pass's log-sum-exp [batch, heads_q, "
                   "seqlen_q]");
  }
  if (reinterpret_cast<uintptr_t>(lse) % alignof(float) != 0)
    return invalid("lse = " + detail::format_pointer(lse) + ": must be a multiple of " +
                   str(int64_t{alignof(float)}) + " bytes (float)");
  if (__builtin_mul_overflow(p.batch, p.heads_q, &count) ||
      __builtin_mul_overflow(count, p.seqlen_q, &count) ||
      __builtin_mul_overflow(count, int64_t{sizeof(float)}, &count))
    return invalid("batch = " + str(p.batch) + ", heads_q = " + str(p.heads_q) +
                   ", seqlen_q = " + str(p.seqlen_q) +
                   ": the lse byte count batch * heads_q * seqlen_q * 4 must fit in int64");
  return Status::Ok();
}

Status check_shared(const Problem& p, const TensorRef& q, const TensorRef& k, const TensorRef& v,
                    const TensorRef& o) {
  const Shape qs{"seqlen_q", p.seqlen_q, "heads_q", p.heads_q};
  const Shape ks{"seqlen_k", p.seqlen_k, "heads_kv", p.heads_kv};
  Status s;
  if (!(s = check_tensor("q", q, qs, p)).ok()) return s;
  if (!(s = check_tensor("k", k, ks, p)).ok()) return s;
  if (!(s = check_tensor("v", v, values(ks), p)).ok()) return s;
  Problem po = p;
  po.dtype = detail::output_dtype(p.dtype);
  return check_tensor("o", o, values(qs), po);
}

// A device array of fp32 (the sinks, their gradient, fp8's descales): aligned to its element.
Status check_fp32_aligned(const char* name, const void* ptr) {
  if (reinterpret_cast<uintptr_t>(ptr) % alignof(float) == 0) return Status::Ok();
  return invalid(std::string(name) + " = " + detail::format_pointer(ptr) + ": must be a multiple of " +
                 str(int64_t{alignof(float)}) + " bytes (fp32)");
}

// fp8 (DType::kE4M3): what its kernel runs, and the descales (ForwardArgs) with it only.
Status check_fp8(const ForwardArgs& args) {
  const Problem& p = args.problem;
  const struct {
    const char* name;
    const float* ptr;
  } descales[] = {{"q_descale", args.q_descale}, {"k_descale", args.k_descale}, {"v_descale", args.v_descale}};
  const std::string e4m3 = str(int64_t{static_cast<int>(DType::kE4M3)}) + " (e4m3)";
  if (p.dtype != DType::kE4M3) {
    for (const auto& d : descales)
      if (d.ptr != nullptr)
        return invalid(std::string(d.name) + " = " + detail::format_pointer(d.ptr) + ": descales go with dtype = " +
                       e4m3 + "; dtype = " + str(int64_t{static_cast<int>(p.dtype)}) + " (" + to_string(p.dtype) +
                       ") takes none (null)");
    return Status::Ok();
  }
  Status s;
  for (const auto& d : descales)
    if (!(s = check_fp32_aligned(d.name, d.ptr)).ok()) return s;
  const auto unsupported = [&](const std::string& what) {
    return Status{StatusCode::kNotSupported, what + ": the fp8 forward (dtype = " + e4m3 +
                                                 ") runs batched tensors without varlen, a "
                                                 "paged cache, a soft cap or sinks"};
  };
  if (args.varlen.enabled()) return unsupported("varlen.cu_seqlens_q = " + detail::format_pointer(args.varlen.cu_seqlens_q));
  if (args.varlen.seqused_k != nullptr) return unsupported("varlen.seqused_k = " + detail::format_pointer(args.varlen.seqused_k));
  if (args.varlen.leftpad_k != nullptr) return unsupported("varlen.leftpad_k = " + detail::format_pointer(args.varlen.leftpad_k));
  if (args.paged.enabled()) return unsupported("paged.block_table = " + detail::format_pointer(args.paged.block_table));
  if (p.softcap > 0.0f) return unsupported("softcap = " + str(p.softcap));
  if (args.sink != nullptr) return unsupported("sink = " + detail::format_pointer(args.sink));
  return Status::Ok();
}

// The 16-bit types' paths (backward, append): fp8 is forward only.
Status check_not_fp8(const Problem& p, const char* path) {
  if (p.dtype != DType::kE4M3) return Status::Ok();
  return {StatusCode::kNotSupported, "dtype = " + str(int64_t{static_cast<int>(p.dtype)}) + " (e4m3): " + path +
                                         " takes bf16 or fp16 (fp8 runs the forward only)"};
}

// A device array of int32 (Varlen's): aligned to its element.
Status check_int32_aligned(const char* name, const int32_t* ptr) {
  if (reinterpret_cast<uintptr_t>(ptr) % alignof(int32_t) == 0) return Status::Ok();
  return invalid(std::string(name) + " = " + detail::format_pointer(ptr) + ": must be a multiple of " +
                 str(int64_t{alignof(int32_t)}) + " bytes (int32)");
}

// Varlen::seqused_k without cu_seqlens: the forward's batch entries with keys of their own
// (int32-aligned); the backward has none.
Status check_seqused_alone(const Varlen& v, bool backward) {
  if (v.seqused_k == nullptr) return Status::Ok();
  if (backward)
    return {StatusCode::kNotSupported, "varlen.seqused_k = " + detail::format_pointer(v.seqused_k) +
                                           ": the backward takes every key of seqlen_k (null is allowed)"};
  return check_int32_aligned("varlen.seqused_k", v.seqused_k);
}

// ForwardArgs::sink, BackwardArgs::sink and dsink: fp32 arrays, 4-byte aligned; dsink needs the
// sinks it is the gradient of.
Status check_sink(const float* sink, float* dsink = nullptr) {
  Status s;
  for (auto [name, ptr] : {std::pair<const char*, const void*>{"sink", sink}, {"dsink", dsink}})
    if (!(s = check_fp32_aligned(name, ptr)).ok()) return s;
  if (dsink != nullptr && sink == nullptr)
    return invalid("dsink = " + detail::format_pointer(dsink) +
                   ": the sinks' gradient needs the sinks (sink is null; null dsink is allowed)");
  return Status::Ok();
}

// Varlen::leftpad_k: the forward's, int32-aligned, not with a paged cache (a key block would
// straddle pages); the backward has none.
Status check_leftpad(const Varlen& v, bool paged, bool backward) {
  if (v.leftpad_k == nullptr) return Status::Ok();
  const std::string at = "varlen.leftpad_k = " + detail::format_pointer(v.leftpad_k);
  if (backward)
    return {StatusCode::kNotSupported, at + ": the backward takes each sequence's keys from row 0 of its span "
                                            "(null is allowed)"};
  if (paged)
    return {StatusCode::kNotSupported, at + ": not with a paged cache (paged.block_table): an entry's keys start "
                                            "at row 0 of its first page (null is allowed)"};
  return check_int32_aligned("varlen.leftpad_k", v.leftpad_k);
}

// Pages of fewer than 16 rows are not implemented: a key block (128 rows at most) loads as a TMA
// box a page and 64-column chunk, 8 a chunk at 16 rows.
constexpr int64_t kMinPageSize = 16;

// A paged cache's table and pools (PagedKV) for p: a power-of-two page size of 16 rows or more;
// pages and table sizes that the kernels' int coordinates hold; each entry's table row covering
// seqlen_k; k and v (named k_name, v_name) as pools [num_pages, page_size, heads_kv, head_dim].
Status check_pools(const PagedKV& pg, const Problem& p, const TensorRef& k, const TensorRef& v, const char* k_name,
                   const char* v_name) {
  Status s;
  if (pg.page_size < 1 || pg.page_size > (int64_t{1} << 30) || (pg.page_size & (pg.page_size - 1)) != 0)
    return invalid("paged.page_size = " + str(pg.page_size) + ": must be a power of two in [16, 2^30]");
  if (pg.page_size < kMinPageSize)
    return {StatusCode::kNotSupported, "paged.page_size = " + str(pg.page_size) + ": pages of fewer than " +
                                           str(kMinPageSize) +
                                           " rows are not implemented (a power of two in [16, 2^30])"};
  if (!(s = check_size("paged.num_pages", pg.num_pages, 1)).ok()) return s;
  const int64_t pages = (p.seqlen_k + pg.page_size - 1) / pg.page_size;
  if (pg.table_stride < pages || pg.table_stride > kInt32Max)
    return invalid("paged.table_stride = " + str(pg.table_stride) + ": must be >= ceil(seqlen_k / page_size) = " +
                   str(pages) + " (an entry's pages) and fit in int32");
  if (p.batch > kInt32Max / pg.table_stride)
    return invalid("paged.table_stride = " + str(pg.table_stride) + " with batch = " + str(p.batch) +
                   ": the table's batch * table_stride entries must fit in int32");
  Problem pool = p;  // the pools as [num_pages, page_size] tensors
  pool.batch = pg.num_pages;
  const Shape ks{"paged.page_size", pg.page_size, "heads_kv", p.heads_kv};
  if (p.batch > 0 && p.seqlen_k > 0) {
    if (!(s = check_tensor(k_name, k, ks, pool)).ok()) return s;
    if (!(s = check_tensor(v_name, v, values(ks), pool)).ok()) return s;
  }
  return Status::Ok();
}

// A paged KV cache (PagedKV): a power-of-two page size of 16 rows or more; pages and table sizes
// that the kernels' int coordinates hold; each entry's table row covering seqlen_k; k and v as pools
// [num_pages, page_size, heads_kv, head_dim]; q and o batched, or packed over varlen.total_q rows
// (cu_seqlens_q; cu_seqlens_k, optional, gives each sequence's key count, its offsets not read).
Status check_paged(const ForwardArgs& args) {
  const PagedKV& pg = args.paged;
  const Problem& p = args.problem;
  const Varlen& v = args.varlen;
  if (Status s = check_int32_aligned("paged.block_table", pg.block_table); !s.ok()) return s;
  if (v.enabled()) {
    if (v.cu_seqlens_q == nullptr)
      return invalid("varlen.cu_seqlens_q = null: a paged cache with cu_seqlens_k needs cu_seqlens_q (the packed "
                     "queries' offsets; cu_seqlens_k gives each sequence's key count and may be null)");
    if (Status s = check_int32_aligned("varlen.cu_seqlens_q", v.cu_seqlens_q); !s.ok()) return s;
    if (v.cu_seqlens_k != nullptr)
      if (Status s = check_int32_aligned("varlen.cu_seqlens_k", v.cu_seqlens_k); !s.ok()) return s;
    if (Status s = check_size("varlen.total_q", v.total_q, 0); !s.ok()) return s;
  }
  if (Status s = check_pools(pg, p, args.k, args.v, "k", "v"); !s.ok()) return s;
  Status s;
  if (v.enabled()) {  // the packed rows as one batch (batch_stride is not read)
    if (p.batch == 0) return Status::Ok();
    Problem one = p;
    one.batch = 1;
    const Shape qs{"varlen.total_q", v.total_q, "heads_q", p.heads_q};
    TensorRef q = args.q, o = args.o;
    q.batch_stride = o.batch_stride = 0;
    if (!(s = check_tensor("q", q, qs, one)).ok()) return s;
    return check_tensor("o", o, values(qs), one);
  }
  const Shape qs{"seqlen_q", p.seqlen_q, "heads_q", p.heads_q};
  if (!(s = check_tensor("q", args.q, qs, p)).ok()) return s;
  return check_tensor("o", args.o, values(qs), p);
}

// A variable-length batch (Varlen): both cu_seqlens, aligned; totals that the kernel's int rows
// hold; q, o (and dout, dq) over total_q rows and k, v (dk, dv) over total_k rows (one batch:
// batch_stride is not read); the LSE [heads_q, total_q].
template <class Args>
Status check_varlen(const Args& args) {
  constexpr bool kBackward = std::is_same_v<Args, BackwardArgs>;
  const Problem& p = args.problem;
  const Varlen& v = args.varlen;
  const struct {
    const char* name;
    const int32_t* ptr;
  } cus[] = {{"varlen.cu_seqlens_q", v.cu_seqlens_q}, {"varlen.cu_seqlens_k", v.cu_seqlens_k}};
  for (const auto& c : cus) {
    if (c.ptr == nullptr)
      return invalid(std::string(c.name) + " = null: a variable-length batch needs both cu_seqlens_q and "
                     "cu_seqlens_k (int32, batch + 1 entries each, on the device)");
    if (Status s = check_int32_aligned(c.name, c.ptr); !s.ok()) return s;
  }
  if (v.seqused_k != nullptr) {
    if constexpr (kBackward)
      return {StatusCode::kNotSupported, "varlen.seqused_k = " + detail::format_pointer(v.seqused_k) +
                                             ": the backward takes each sequence's keys from cu_seqlens_k alone "
                                             "(null is allowed)"};
    if (Status s = check_int32_aligned("varlen.seqused_k", v.seqused_k); !s.ok()) return s;
  }
  Status s;
  if (!(s = check_size("varlen.total_q", v.total_q, 0)).ok()) return s;
  if (!(s = check_size("varlen.total_k", v.total_k, 0)).ok()) return s;
  if (p.batch == 0) return Status::Ok();
  Problem one = p;  // the packed rows as one batch
  one.batch = 1;
  const Shape qs{"varlen.total_q", v.total_q, "heads_q", p.heads_q};
  const Shape ks{"varlen.total_k", v.total_k, "heads_kv", p.heads_kv};
  auto rows_only = [](TensorRef t) {  // (batch_stride is not read)
    t.batch_stride = 0;
    return t;
  };
  if (!(s = check_tensor("q", rows_only(args.q), qs, one)).ok()) return s;
  if (!(s = check_tensor("k", rows_only(args.k), ks, one)).ok()) return s;
  if (!(s = check_tensor("v", rows_only(args.v), values(ks), one)).ok()) return s;
  if (!(s = check_tensor("o", rows_only(args.o), values(qs), one)).ok()) return s;
  if constexpr (kBackward) {
    if (!(s = check_tensor("dout", rows_only(args.dout), values(qs), one)).ok()) return s;
    if (!(s = check_tensor("dq", rows_only(args.dq), qs, one)).ok()) return s;
    if (!(s = check_tensor("dk", rows_only(args.dk), ks, one)).ok()) return s;
    if (!(s = check_tensor("dv", rows_only(args.dv), values(ks), one)).ok()) return s;
    if (args.lse == nullptr && v.total_q > 0)
      return invalid("lse = null: backward needs the forward pass's log-sum-exp [heads_q, total_q]");
  }
  if (args.lse != nullptr && reinterpret_cast<uintptr_t>(args.lse) % alignof(float) != 0)
    return invalid("lse = " + detail::format_pointer(args.lse) + ": must be a multiple of " +
                   str(int64_t{alignof(float)}) + " bytes (float)");
  return Status::Ok();
}

// The backward's workspace against what it needs (detail::dq_accum_bytes).
Status check_workspace(const BackwardArgs& args) {
  const Problem& p = args.problem;
  int64_t need = 0;
  if (!detail::dq_accum_bytes(p, &need))
    return invalid("batch = " + str(p.batch) + ", seqlen_q = " + str(p.seqlen_q) +
                   ", heads_q = " + str(p.heads_q) + ", head_dim = " + str(p.head_dim) +
                   ": the fp32 dQ accumulator's byte count must fit in int64");
  if (need == 0) return Status::Ok();
  if (args.workspace == nullptr)
    return invalid("workspace = null: backward needs " + str(need) +
                   " bytes here (see backward_workspace_size)");
  if (reinterpret_cast<uintptr_t>(args.workspace) % kAlignmentBytes != 0)
    return invalid("workspace = " + detail::format_pointer(args.workspace) +
                   ": must be a multiple of " + str(int64_t{kAlignmentBytes}) + " bytes");
  if (args.workspace_bytes < static_cast<uint64_t>(need))
    return invalid("workspace_bytes = " + std::to_string(args.workspace_bytes) +
                   ": backward needs at least " + str(need) +
                   " bytes here (see backward_workspace_size)");
  return Status::Ok();
}

}  // namespace

float effective_scale(const Problem& p) {
  if (p.softmax_scale != 0.0f || p.head_dim <= 0) return p.softmax_scale;
  return static_cast<float>(1.0 / std::sqrt(static_cast<double>(p.head_dim)));
}

Status validate(const ForwardArgs& args) {
  const Problem& p = args.problem;
  Status s;
  if (!(s = detail::validate_problem(p)).ok()) return s;
  if (!(s = check_fp8(args)).ok()) return s;
  if (!(s = check_leftpad(args.varlen, args.paged.enabled(), /*backward=*/false)).ok()) return s;
  if (!(s = check_sink(args.sink)).ok()) return s;
  if (args.varlen.enabled() && !args.paged.enabled()) return check_varlen(args);
  if (!(s = check_seqused_alone(args.varlen, /*backward=*/false)).ok()) return s;
  if (!(s = check_lse(args.lse, p, /*required=*/false)).ok()) return s;
  // A paged cache's k and v are pools of pages (with cu_seqlens too).
  return args.paged.enabled() ? check_paged(args) : check_shared(p, args.q, args.k, args.v, args.o);
}

Status validate(const BackwardArgs& args) {
  const Problem& p = args.problem;
  Status s;
  if (!(s = detail::validate_problem(p)).ok()) return s;
  if (!(s = check_not_fp8(p, "the backward")).ok()) return s;
  if (!(s = check_leftpad(args.varlen, /*paged=*/false, /*backward=*/true)).ok()) return s;
  if (!(s = check_sink(args.sink, args.dsink)).ok()) return s;
  if (args.varlen.enabled()) {
    if (!(s = check_varlen(args)).ok()) return s;
    return check_workspace(args);
  }
  if (!(s = check_seqused_alone(args.varlen, /*backward=*/true)).ok()) return s;
  if (!(s = check_lse(args.lse, p, /*required=*/true)).ok()) return s;
  if (!(s = check_shared(p, args.q, args.k, args.v, args.o)).ok()) return s;
  const Shape qs{"seqlen_q", p.seqlen_q, "heads_q", p.heads_q};
  const Shape ks{"seqlen_k", p.seqlen_k, "heads_kv", p.heads_kv};
  if (!(s = check_tensor("dout", args.dout, values(qs), p)).ok()) return s;
  if (!(s = check_tensor("dq", args.dq, qs, p)).ok()) return s;
  if (!(s = check_tensor("dk", args.dk, ks, p)).ok()) return s;
  if (!(s = check_tensor("dv", args.dv, values(ks), p)).ok()) return s;
  return check_workspace(args);
}

Status validate(const AppendArgs& args) {
  const Problem& p = args.problem;
  Status s;
  if (!(s = detail::validate_problem(p)).ok()) return s;
  if (!(s = check_not_fp8(p, "append_kv")).ok()) return s;
  if (p.value_dim() != p.head_dim)
    return {StatusCode::kNotSupported, "head_dim_v = " + str(p.head_dim_v) +
                                           ": append_kv takes keys and values of one head dim (head_dim = " +
                                           str(p.head_dim) + "; 0 is allowed)"};
  if (!(s = check_size("seqlen_new", args.seqlen_new, 0)).ok()) return s;
  if (args.cache_seqlens != nullptr) {
    if (!(s = check_int32_aligned("cache_seqlens", args.cache_seqlens)).ok()) return s;
  } else if (args.cache_seqlen < 0 || args.cache_seqlen > p.seqlen_k - args.seqlen_new) {
    return invalid("cache_seqlen = " + str(args.cache_seqlen) + ": the new rows [cache_seqlen, cache_seqlen + " +
                   "seqlen_new) must lie in the cache's seqlen_k = " + str(p.seqlen_k) + " rows (seqlen_new = " +
                   str(args.seqlen_new) + ")");
  }
  if (args.seqused_k != nullptr) {
    if (!(s = check_int32_aligned("seqused_k", args.seqused_k)).ok()) return s;
    if (args.seqused_k == args.cache_seqlens)
      return invalid("seqused_k = " + detail::format_pointer(args.seqused_k) +
                     ": must not be cache_seqlens (the kernel reads every entry's first new row while it writes "
                     "the counts): give it an array of its own");
  }
  const Shape ns{"seqlen_new", args.seqlen_new, "heads_kv", p.heads_kv};
  if (!(s = check_tensor("k_new", args.k_new, ns, p)).ok()) return s;
  if (!(s = check_tensor("v_new", args.v_new, ns, p)).ok()) return s;
  if (args.paged.enabled()) {
    if (!(s = check_int32_aligned("paged.block_table", args.paged.block_table)).ok()) return s;
    if (!(s = check_pools(args.paged, p, args.k_cache, args.v_cache, "k_cache", "v_cache")).ok()) return s;
  } else {
    const Shape cs{"seqlen_k", p.seqlen_k, "heads_kv", p.heads_kv};
    if (!(s = check_tensor("k_cache", args.k_cache, cs, p)).ok()) return s;
    if (!(s = check_tensor("v_cache", args.v_cache, cs, p)).ok()) return s;
  }
  const Rotary& ro = args.rotary;
  if (!ro.enabled()) return Status::Ok();
  if (ro.cos == nullptr || ro.sin == nullptr)
    return invalid("rotary.cos = " + detail::format_pointer(ro.cos) + ", rotary.sin = " +
                   detail::format_pointer(ro.sin) + ": rotary embedding needs both (or neither)");
  for (const auto& [name, ptr] : {std::pair{"rotary.cos", ro.cos}, std::pair{"rotary.sin", ro.sin}})
    if (reinterpret_cast<uintptr_t>(ptr) % kAlignmentBytes != 0)
      return invalid(std::string(name) + " = " + detail::format_pointer(ptr) + ": must be a multiple of " +
                     str(int64_t{kAlignmentBytes}) + " bytes");
  if (ro.rotary_dim < kRotaryDimStep || ro.rotary_dim > p.head_dim || ro.rotary_dim % kRotaryDimStep != 0)
    return invalid("rotary.rotary_dim = " + str(ro.rotary_dim) + ": must be a multiple of " + str(kRotaryDimStep) +
                   " in [" + str(kRotaryDimStep) + ", head_dim = " + str(p.head_dim) + "]");
  if (ro.seqlen_ro < p.seqlen_k || ro.seqlen_ro > kInt32Max)
    return invalid("rotary.seqlen_ro = " + str(ro.seqlen_ro) + ": cos and sin need a row for every cache position (" +
                   "at least seqlen_k = " + str(p.seqlen_k) + ", and fit in int32)");
  const Shape qs{"seqlen_q", p.seqlen_q, "heads_q", p.heads_q};
  if (!(s = check_tensor("q", args.q, qs, p)).ok()) return s;
  return check_tensor("q_rotated", args.q_rotated, qs, p);
}

namespace detail {

int element_size(DType dtype) {
  switch (dtype) {
    case DType::kBF16:
    case DType::kFP16:
      return 2;
    case DType::kE4M3:
      return 1;
  }
  return 0;
}

Status check_compute_capability(int major, int minor) {
  const int need_major = kMinComputeCapability / 10, need_minor = kMinComputeCapability % 10;
  const std::string found =
      "compute capability " + std::to_string(major) + "." + std::to_string(minor) + " found, ";
  const std::string need = std::to_string(need_major) + "." + std::to_string(need_minor);
  if (major * 10 + minor < kMinComputeCapability)
    return {StatusCode::kNoDevice, found + "fa4 needs " + need + " (Hopper, sm_90a)"};
  if (major > need_major)
    return {StatusCode::kNoDevice, found + "fa4's kernels are built for " + need +
                                       " only (sm_90a code runs on Hopper alone)"};
  return Status::Ok();
}

Status cuda_failure(const std::string& what, cudaError_t e) {
  return {StatusCode::kCudaError, what + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")"};
}

Status check_current_device() {
  int device = 0, major = 0, minor = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  if (e != cudaSuccess) {
    cudaGetLastError();  // do not leave the error behind for the caller's next check
    return {StatusCode::kNoDevice, std::string("no usable CUDA device: ") + cudaGetErrorName(e) +
                                       " (" + cudaGetErrorString(e) + ")"};
  }
  Status s = check_compute_capability(major, minor);
  if (!s.ok()) s.message = "device " + std::to_string(device) + ": " + s.message;
  return s;
}

Status validate_problem(const Problem& p) {
  Status s;
  if (!is_known_dtype(p.dtype))
    return invalid("dtype = " + str(int64_t{static_cast<int>(p.dtype)}) +
                   ": supported dtypes are " + supported_dtypes());
  if (!(s = check_size("batch", p.batch, 0)).ok()) return s;
  if (!(s = check_size("seqlen_q", p.seqlen_q, 0)).ok()) return s;
  if (!(s = check_size("seqlen_k", p.seqlen_k, 0)).ok()) return s;
  if (!(s = check_size("heads_q", p.heads_q, 1)).ok()) return s;
  if (!(s = check_size("heads_kv", p.heads_kv, 1)).ok()) return s;
  if (p.heads_q % p.heads_kv != 0)
    return invalid("heads_q = " + str(p.heads_q) + ": must be a multiple of heads_kv = " +
                   str(p.heads_kv));
  const int64_t step = kAlignmentBytes / detail::element_size(p.dtype);  // a row of whole 16-byte units
  const struct {
    const char* name;
    int64_t dim;
    bool zero_allowed;  // head_dim_v = 0: head_dim's
  } dims[] = {{"head_dim", p.head_dim, false}, {"head_dim_v", p.head_dim_v, true}};
  for (const auto& d : dims) {
    if (d.dim == 0 && d.zero_allowed) continue;
    if (d.dim < step || d.dim > kMaxHeadDim || d.dim % step != 0)
      return invalid(std::string(d.name) + " = " + str(d.dim) + ": must be a multiple of " + str(step) + " in [" +
                     str(step) + ", " + str(int64_t{kMaxHeadDim}) + "] for " + to_string(p.dtype) +
                     (d.zero_allowed ? ", or 0 for head_dim's" : "") + " (a row of whole " +
                     str(int64_t{kAlignmentBytes}) + "-byte units; " + kernel_head_dims() +
                     ", the others the next one's on zero-padded copies)");
  }
  if (!std::isfinite(p.softmax_scale) || p.softmax_scale < 0.0f)
    return invalid("softmax_scale = " + str(p.softmax_scale) +
                   ": must be finite and >= 0 (0 selects 1/sqrt(head_dim))");
  if (!std::isfinite(p.softcap) || p.softcap < 0.0f)
    return invalid("softcap = " + str(p.softcap) + ": must be finite and >= 0 (0 turns soft-capping off)");
  if (!(s = check_window("window_left", p.window_left)).ok()) return s;
  return check_window("window_right", p.window_right);
}

bool kernel_switch_from_env(const char* value, bool by_default) {
  if (value != nullptr && std::strcmp(value, "1") == 0) return true;
  if (value != nullptr && std::strcmp(value, "0") == 0) return false;
  return by_default;
}

namespace {
// The switches' defaults (validate.h: set_backward_d192, set_forward_v128), and their settings,
// FA4_BACKWARD_D192's and FA4_FORWARD_V128's values over those the first time each is asked.
std::atomic<bool>& backward_d192_switch() {
  static std::atomic<bool> on{kernel_switch_from_env(std::getenv("FA4_BACKWARD_D192"), kBackwardD192ByDefault)};
  return on;
}
std::atomic<bool>& forward_v128_switch() {
  static std::atomic<bool> on{kernel_switch_from_env(std::getenv("FA4_FORWARD_V128"), kForwardV128ByDefault)};
  return on;
}
std::atomic<bool>& backward_v128_switch() {
  static std::atomic<bool> on{kernel_switch_from_env(std::getenv("FA4_BACKWARD_V128"), kBackwardV128ByDefault)};
  return on;
}
// DeepSeek's pair of head dims.
bool deepseek_dims(const Problem& p) { return p.head_dim == 192 && p.value_dim() == 128; }
}  // namespace

void set_backward_d192(bool on) { backward_d192_switch().store(on); }
bool backward_d192() { return backward_d192_switch().load(); }
void set_forward_v128(bool on) { forward_v128_switch().store(on); }
bool forward_v128() { return forward_v128_switch().load(); }
void set_backward_v128(bool on) { backward_v128_switch().store(on); }
bool backward_v128() { return backward_v128_switch().load(); }

int64_t kernel_head_dim(const Problem& p, Pass pass) {
  const int64_t need = std::max(p.head_dim, p.value_dim());
  const bool with192 =
      pass == Pass::kForward ? p.dtype != DType::kE4M3 : backward_d192() || (deepseek_dims(p) && backward_v128());
  for (int d : with192 ? std::span<const int>(kForwardKernelHeadDims) : std::span<const int>(kKernelHeadDims))
    if (need <= d) return d;
  return 0;
}

bool native_value_dim(const Problem& p, Pass pass, bool paged) {
  if (p.value_dim() == p.head_dim) return true;
  if (!deepseek_dims(p)) return false;
  if (pass == Pass::kBackward) return backward_v128();
  return forward_v128() && p.dtype != DType::kE4M3 && p.softcap == 0.0f && !paged;
}

bool padded(const Problem& p, Pass pass, bool paged) {
  return kernel_head_dim(p, pass) != p.head_dim || !native_value_dim(p, pass, paged);
}

bool dq_accum_bytes(const Problem& p, int64_t* bytes) {
  const int64_t rows = (p.seqlen_q + kDqAccumRowAlign - 1) / kDqAccumRowAlign * kDqAccumRowAlign;
  int64_t n = 0;
  return !(__builtin_mul_overflow(p.batch, rows, &n) ||
           __builtin_mul_overflow(n, p.heads_q, &n) ||
           __builtin_mul_overflow(n, kernel_head_dim(p, Pass::kBackward) + 2, &n) ||
           __builtin_mul_overflow(n, int64_t{sizeof(float)}, bytes));
}

void resolve_window(const Problem& p, int64_t* left, int64_t* right) {
  int64_t l = p.window_left, r = p.window_right;
  if (p.causal) r = r >= 0 ? std::min<int64_t>(r, 0) : 0;
  // Query i sees keys j in [i + off - l, i + off + r], off = seqlen_k - seqlen_q. The left bound
  // excludes nothing once l >= seqlen_k - 1 and the right one once r >= seqlen_q - 1; mapping the
  // (stronger) l >= seqlen_k and r >= seqlen_q to -1 keeps the result exact and in int range.
  if (l >= p.seqlen_k) l = -1;
  if (r >= p.seqlen_q) r = -1;
  *left = l;
  *right = r;
}

namespace {

// What forward and backward parameters share: sizes, dtype, scale, window.
template <class Params>
void set_problem(const Problem& p, Params* k) {
  k->dtype = p.dtype;
  k->batch = static_cast<int>(p.batch);
  k->seqlen_q = static_cast<int>(p.seqlen_q);
  k->seqlen_k = static_cast<int>(p.seqlen_k);
  k->heads_q = static_cast<int>(p.heads_q);
  k->heads_kv = static_cast<int>(p.heads_kv);
  k->head_dim = static_cast<int>(p.head_dim);
  k->scale = effective_scale(p);
  k->scale_log2 = static_cast<float>(static_cast<double>(k->scale) * 1.4426950408889634);  // log2(e)
  if constexpr (requires { k->softcap; }) {
    // Soft-capped: the kernel turns S into softcap * tanh(S * softcap_in), already scaled, so the
    // softmax's own factor is log2(e) alone.
    k->softcap = p.softcap;
    k->softcap_in = p.softcap > 0.0f ? static_cast<float>(double(k->scale) / double(p.softcap)) : 0.0f;
    if (p.softcap > 0.0f) k->scale_log2 = 1.4426950408889634f;
  }
  int64_t left = 0, right = 0;
  resolve_window(p, &left, &right);
  k->window_left = static_cast<int>(left);
  k->window_right = static_cast<int>(right);
}

// A tensor's element strides as the kernels take them: [batch, seq, head].
void set_strides(const TensorRef& t, int64_t (&stride)[3]) {
  stride[0] = t.batch_stride;
  stride[1] = t.seq_stride;
  stride[2] = t.head_stride;
}

}  // namespace

bool fold_query_groups(FwdParams* f) {
  const int group = f->heads_kv > 0 ? f->heads_q / f->heads_kv : 1;
  // One query (at key seqlen_k - 1, bottom-right) is past every right bound; a left bound below
  // seqlen_k - 1 would give the folded rows, now at different positions, different keys.
  if (f->seqlen_q != 1 || group < 2 || (f->window_left >= 0 && f->window_left < f->seqlen_k - 1)) return false;
  for (int64_t* st : {f->q_stride, f->o_stride}) {
    st[1] = st[2];          // row g of KV head hk's group: query head hk * group + g
    st[2] = st[2] * group;  // KV head hk's first query head
  }
  f->seqlen_q = group;
  f->heads_q = f->heads_kv;
  f->window_left = f->window_right = -1;
  f->sink_group = group, f->sink_mask = ~0u;  // (row g: query head hk * group + g)
  return true;
}

bool fold_query_rows(FwdParams* f) {
  const int group = f->heads_kv > 0 ? f->heads_q / f->heads_kv : 1;
  if (f->seqlen_q < 2 || group < 2 || group > 64 || (group & (group - 1)) != 0 ||
      int64_t(f->seqlen_q) * group > kFoldRowsMax)
    return false;
  int fold = 0;
  while ((1 << fold) < group) ++fold;
  f->seqlen_q *= group;
  f->heads_q = f->heads_kv;
  f->fold = fold;
  f->sink_group = group, f->sink_mask = uint32_t(group - 1);
  return true;
}

FwdParams make_fwd_params(const ForwardArgs& args) {
  FwdParams f{};
  set_problem(args.problem, &f);
  f.q = args.q.data, f.k = args.k.data, f.v = args.v.data, f.o = args.o.data;
  f.lse = args.lse;
  f.sink = args.sink;
  f.q_descale = args.q_descale, f.k_descale = args.k_descale, f.v_descale = args.v_descale;
  set_strides(args.q, f.q_stride);
  set_strides(args.k, f.k_stride);
  set_strides(args.v, f.v_stride);
  set_strides(args.o, f.o_stride);
  // Two head dims (192 / 128 on kernels of their own: native_value_dim): v and o of the value
  // side's columns. (A padded call's problem has one head dim.)
  if (args.problem.value_dim() != args.problem.head_dim) f.v_cols = static_cast<int>(args.problem.value_dim());
  if (args.paged.enabled()) {
    f.block_table = args.paged.block_table;
    f.table_stride = static_cast<int>(args.paged.table_stride);
    f.page_size = static_cast<int>(args.paged.page_size);
    f.num_pages = static_cast<int>(args.paged.num_pages);
  }
  if (args.varlen.enabled()) {  // (the fold's rows would not start at a sequence's first)
    f.cu_seqlens_q = args.varlen.cu_seqlens_q;
    f.cu_seqlens_k = args.varlen.cu_seqlens_k;
    f.total_q = static_cast<int>(args.varlen.total_q);
    f.total_k = static_cast<int>(args.varlen.total_k);
    f.seqused_k = args.varlen.seqused_k;
    f.leftpad_k = args.varlen.leftpad_k;
    return f;
  }
  if (f.dtype == DType::kE4M3) return f;  // (the fp8 kernel takes rows as they are)
  f.seqused_k = args.varlen.seqused_k;  // batch entries' own keys (a query group folds as before)
  f.leftpad_k = args.varlen.leftpad_k;
  // (Soft-capped d256 calls with sinks stay unfolded: those kernels take a tile's sink from its
  // head, sm90/epilogue.cuh's per_row_sinks.)
  if (f.sink != nullptr && f.head_dim > 128 && f.softcap > 0.0f) return f;
  if (!fold_query_groups(&f)) fold_query_rows(&f);
  return f;
}

BwdParams make_bwd_params(const BackwardArgs& args) {
  const Problem& p = args.problem;
  BwdParams b{};
  set_problem(p, &b);
  b.q = args.q.data, b.k = args.k.data, b.v = args.v.data, b.o = args.o.data, b.dout = args.dout.data;
  b.dq = args.dq.data, b.dk = args.dk.data, b.dv = args.dv.data;
  b.lse = args.lse;
  set_strides(args.q, b.q_stride);
  set_strides(args.k, b.k_stride);
  set_strides(args.v, b.v_stride);
  set_strides(args.o, b.o_stride);
  set_strides(args.dout, b.do_stride);
  set_strides(args.dq, b.dq_stride);
  set_strides(args.dk, b.dk_stride);
  set_strides(args.dv, b.dv_stride);
  b.deterministic = args.deterministic;
  b.head_dim_v = static_cast<int>(p.value_dim());
  if (args.dsink != nullptr) b.sink = args.sink, b.dsink = args.dsink;
  b.rows = (p.seqlen_q + kDqAccumRowAlign - 1) / kDqAccumRowAlign * kDqAccumRowAlign;
  b.dq_accum = static_cast<float*>(args.workspace);
  b.delta = b.dq_accum + p.batch * p.heads_q * b.rows * p.head_dim;
  b.lse_log2 = b.delta + p.batch * p.heads_q * b.rows;
  if (args.varlen.enabled()) {
    b.cu_seqlens_q = args.varlen.cu_seqlens_q;
    b.cu_seqlens_k = args.varlen.cu_seqlens_k;
    b.total_q = static_cast<int>(args.varlen.total_q);
    b.total_k = static_cast<int>(args.varlen.total_k);
  }
  return b;
}

AppendParams make_append_params(const AppendArgs& args) {
  const Problem& p = args.problem;
  AppendParams a{};
  a.dtype = p.dtype;
  a.batch = static_cast<int>(p.batch);
  a.seqlen_new = static_cast<int>(args.seqlen_new);
  a.heads_kv = static_cast<int>(p.heads_kv);
  a.head_dim = static_cast<int>(p.head_dim);
  a.capacity = static_cast<int>(p.seqlen_k);
  a.k_new = args.k_new.data, a.v_new = args.v_new.data, a.k_cache = args.k_cache.data, a.v_cache = args.v_cache.data;
  set_strides(args.k_new, a.kn_stride);
  set_strides(args.v_new, a.vn_stride);
  set_strides(args.k_cache, a.kc_stride);
  set_strides(args.v_cache, a.vc_stride);
  if (args.paged.enabled()) {
    a.block_table = args.paged.block_table;
    a.table_stride = static_cast<int>(args.paged.table_stride);
    a.page_size = static_cast<int>(args.paged.page_size);
    a.num_pages = static_cast<int>(args.paged.num_pages);
  }
  a.cache_seqlens = args.cache_seqlens;
  a.cache_seqlen = static_cast<int>(args.cache_seqlen);
  a.seqused_k = args.seqused_k;
  if (args.rotary.enabled()) {
    a.cos = args.rotary.cos, a.sin = args.rotary.sin;
    a.seqlen_ro = static_cast<int>(args.rotary.seqlen_ro);
    a.rotary_dim = static_cast<int>(args.rotary.rotary_dim);
    a.interleaved = args.rotary.interleaved;
    a.q_per_row = p.causal || p.window_left >= 0 || p.window_right >= 0;
    a.seqlen_q = static_cast<int>(p.seqlen_q);
    a.heads_q = static_cast<int>(p.heads_q);
    a.q = args.q.data, a.q_rotated = args.q_rotated.data;
    set_strides(args.q, a.q_stride);
    set_strides(args.q_rotated, a.qr_stride);
  }
  return a;
}

std::string format_pointer(const void* p) {
  if (p == nullptr) return "null";
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%" PRIxPTR, reinterpret_cast<uintptr_t>(p));
  return buf;
}

}  // namespace detail
}  // namespace fa4
