// The plan of a call at a head dim without a kernel (pad.h): which tensors are copied, their
// copies' shapes and places, and the arguments the kernels take instead.
#include "common/pad.h"

#include <algorithm>
#include <limits>

#include "common/validate.h"

namespace fa4::detail {
namespace {

struct Rows {
  int64_t n0, n1, n2;
};

template <class Args>
class Planner {
 public:
  Planner(PaddedCall<Args>* call, void* base, int64_t padded_dim)
      : call_(call), base_(static_cast<uint8_t*>(base)), padded_dim_(padded_dim) {}

  // Adds tensor *t (shaped [rows, cols]) and points *t at its copy; one already of the kernel head
  // dim (a side of a call with two head dims) the kernels take as it is, unless `always`.
  void add(const char* name, TensorRef* t, Rows r, int64_t cols, int elem_size, bool in, bool out,
           bool always = false) {
    if (cols == padded_dim_ && !always) return;
    PadCopy& c = call_->copies[call_->count++];
    c = PadCopy{name, *t, cols, nullptr, {r.n0, r.n1, r.n2}, elem_size, in, out};
    int64_t rows = 0;
    if (__builtin_mul_overflow(std::max<int64_t>(r.n0, 0), std::max<int64_t>(r.n1, 0), &rows) ||
        __builtin_mul_overflow(rows, std::max<int64_t>(r.n2, 0), &rows))
      call_->bytes = -1;
    c.padded = reserve(rows, padded_dim_ * elem_size);
    *t = call_->bytes < 0 ? TensorRef{}
                          : TensorRef{c.padded, r.n1 * r.n2 * padded_dim_, r.n2 * padded_dim_, padded_dim_};
  }

  // Places an int32 table of n entries after the copies.
  int32_t* table(int64_t n) { return reinterpret_cast<int32_t*>(reserve(n, 4)); }

 private:
  // n items of `size` bytes after what is placed, rounded up to kPadAlign: their place (null when
  // sizing, and once the total is past int64, when call_->bytes becomes -1).
  uint8_t* reserve(int64_t n, int64_t size) {
    int64_t bytes = 0;
    if (call_->bytes < 0 || __builtin_mul_overflow(n, size, &bytes) ||
        __builtin_add_overflow(bytes, kPadAlign - 1, &bytes) ||
        __builtin_add_overflow(call_->bytes, bytes / kPadAlign * kPadAlign, &bytes)) {
      call_->bytes = -1;
      return nullptr;
    }
    uint8_t* at = base_ == nullptr ? nullptr : base_ + call_->bytes;
    call_->bytes = bytes;
    return at;
  }

  PaddedCall<Args>* call_;
  uint8_t* base_;
  int64_t padded_dim_;
};

// The kernels' problem: one kernel head dim (the pass's), and the caller's head dim's scale made
// explicit.
Problem padded_problem(const Problem& p, Pass pass) {
  Problem k = p;
  k.head_dim = kernel_head_dim(p, pass);
  k.head_dim_v = 0;
  k.softmax_scale = effective_scale(p);
  return k;
}

}  // namespace

PaddedCall<ForwardArgs> pad_forward(const ForwardArgs& args, void* base) {
  PaddedCall<ForwardArgs> call;
  call.args = args;
  call.args.problem = padded_problem(args.problem, Pass::kForward);
  call.args.workspace = nullptr, call.args.workspace_bytes = 0;  // (the kernels take none)
  const Problem& p = args.problem;
  const bool packed = args.varlen.enabled();
  const PagedKV& pg = args.paged;
  // A paged cache: each entry's table row's pages (those seqlen_k covers), gathered.
  const int64_t entry_pages = pg.enabled() ? (p.seqlen_k + pg.page_size - 1) / pg.page_size : 0;
  const Rows q = packed ? Rows{1, args.varlen.total_q, p.heads_q} : Rows{p.batch, p.seqlen_q, p.heads_q};
  const Rows kv = pg.enabled() ? Rows{p.batch * entry_pages, pg.page_size, p.heads_kv}
                  : packed     ? Rows{1, args.varlen.total_k, p.heads_kv}
                               : Rows{p.batch, p.seqlen_k, p.heads_kv};
  const int in = element_size(p.dtype), out = element_size(output_dtype(p.dtype));
  Planner<ForwardArgs> plan(&call, base, call.args.problem.head_dim);
  ForwardArgs& a = call.args;
  const int64_t d = p.head_dim, dv = p.value_dim();
  // The kernels of 64 and 128 take q, k, v and o where they are, their maps' extents the caller's
  // columns, their stores from registers bounded by them (those of 192 and 256 load Q and store O,
  // and d256's serial step loads K and V, in folded boxes of every 64-column chunk, which would
  // read and write the next head's columns past a partial one; e4m3's kernel reads V through a
  // transposed copy of kernel-head-dim rows): nothing is copied.
  if (p.dtype != DType::kE4M3 && call.args.problem.head_dim <= 128) {
    call.qk_cols = d, call.v_cols = dv;
    return call;
  }
  plan.add("q", &a.q, q, d, in, true, false);
  const int first_kv = call.count;
  plan.add("k", &a.k, kv, d, in, true, false, pg.enabled());  // (gathered pools: both, one table)
  plan.add("v", &a.v, kv, dv, in, true, false, pg.enabled());
  for (int i = first_kv; i < call.count; ++i) {
    PadCopy& c = call.copies[i];
    if (pg.enabled()) {  // the entries' pages, and their keys (seqused_k) where given
      c.pages = pg.block_table, c.table_stride = pg.table_stride, c.entry_pages = entry_pages;
      c.pool_pages = pg.num_pages, c.seq_end = args.varlen.seqused_k;
    } else if (!packed) {  // batch entries' own keys: only those rows are read
      c.seq_begin = args.varlen.leftpad_k, c.seq_end = args.varlen.seqused_k;
    }
  }
  if (pg.enabled()) {  // the gathered pools' table: entry b's page j is page b * entry_pages + j
    call.table_entries = p.batch * entry_pages;
    call.table = plan.table(call.table_entries);
    a.paged = {call.table, entry_pages, pg.page_size, call.table_entries};
  }
  // (Packed: the forward writes no row outside every sequence; copied in, such rows go back as
  // they came.)
  plan.add("o", &a.o, q, dv, out, packed, true);
  return call;
}

PaddedCall<BackwardArgs> pad_backward(const BackwardArgs& args, void*) {
  // The backward's kernels take every tensor where it is (BwdParams::qk_cols, v_cols: their maps'
  // extents the caller's columns, in 64-column boxes at every kernel head dim, the reads of o and
  // dout and every store bounded by them): nothing is copied.
  PaddedCall<BackwardArgs> call;
  call.args = args;
  call.args.problem = padded_problem(args.problem, Pass::kBackward);
  call.qk_cols = args.problem.head_dim, call.v_cols = args.problem.value_dim();
  return call;
}

int64_t backward_pad_offset(const Problem& p) {
  int64_t need = 0;
  if (!dq_accum_bytes(p, &need) || need > std::numeric_limits<int64_t>::max() - kPadAlign) return -1;
  return (need + kPadAlign - 1) / kPadAlign * kPadAlign;
}

}  // namespace fa4::detail
