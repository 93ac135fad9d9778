// The public entry points: validate, handle the cases no kernel is needed for, check the device,
// then hand resolved parameters to the sm90 kernel. Validation itself lives in common/validate.cpp.
#include <algorithm>
#include <cstring>
#include <exception>
#include <limits>
#include <string>

#include "common/append_kv.h"
#include "common/fill.h"
#include "common/fwd_params.h"
#include "common/pad.h"
#include "common/validate.h"
#include "fa4/attention.h"

namespace fa4 {
namespace {

using detail::cuda_failure;

// Zeroes t, [p.batch, seq, heads, dim] (dim: p's head_dim, or its value_dim() on the value side).
Status zero(const char* what, const TensorRef& t, const Problem& p, int64_t seq, int64_t heads, int64_t dim,
            cudaStream_t stream) {
  const int64_t stride[3] = {t.batch_stride, t.seq_stride, t.head_stride};
  const cudaError_t e = detail::zero_tensor(t.data, detail::element_size(p.dtype), stride, p.batch,
                                            seq, heads, dim, stream);
  return e == cudaSuccess ? Status::Ok() : cuda_failure(what, e);
}

// The query and key rows the tensors hold as zero() takes them: [batch, seqlen] each, or with
// varlen one batch of total_q / total_k rows (none where the longest sequence is empty). A paged
// cache's keys are its tables' (seqlen_k a sequence), packed queries or not.
struct Rows {
  Problem shape;
  int64_t q, k;
};
Rows rows_of(const Problem& p, const Varlen& vl, bool paged = false) {
  if (!vl.enabled()) return {p, p.seqlen_q, p.seqlen_k};
  Problem one = p;
  one.batch = 1;
  return {one, p.seqlen_q > 0 ? vl.total_q : 0, p.seqlen_k > 0 ? (paged ? p.seqlen_k : vl.total_k) : 0};
}

// The kernels of a validated forward call at a kernel head dim with rows and keys to attend; q, k
// and v of qk_cols and v_cols columns where the kernels read them as they are (common/pad.h; 0:
// the head dim's).
Status run_forward(const ForwardArgs& args, int qk_cols, int v_cols, cudaStream_t stream) {
  detail::FwdParams f = detail::make_fwd_params(args);
  if (qk_cols > 0) f.qk_cols = qk_cols;
  if (v_cols > 0) f.v_cols = v_cols;
  if (args.problem.dtype == DType::kE4M3) return detail::sm90_forward_fp8(f, stream);
  return detail::sm90_forward(f, stream);
}


Status run_backward(const BackwardArgs& args, int qk_cols, int v_cols, cudaStream_t stream);

}  // namespace

const char* to_string(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "ok";
    case StatusCode::kInvalidArgument: return "invalid argument";
    case StatusCode::kNotSupported: return "not supported";
    case StatusCode::kCudaError: return "CUDA error";
    case StatusCode::kNoDevice: return "no device";
  }
  return "unknown status";
}

const char* to_string(DType dtype) {
  switch (dtype) {
    case DType::kBF16: return "bf16";
    case DType::kFP16: return "fp16";
    case DType::kE4M3: return "e4m3";
  }
  return "unknown dtype";
}

TensorRef bshd(void* data, int64_t seqlen, int64_t heads, int64_t dim) {
  return {data, seqlen * heads * dim, heads * dim, dim};
}

TensorRef bhsd(void* data, int64_t seqlen, int64_t heads, int64_t dim) {
  return {data, heads * seqlen * dim, dim, seqlen * dim};
}

// Forward's kernels need no workspace; at a head dim without a kernel, the zero-padded copies.
Status forward_workspace_size(const ForwardArgs& args, size_t* bytes) {
  if (bytes == nullptr) return {StatusCode::kInvalidArgument, "bytes = null: needs a size_t*"};
  Status s = detail::validate_problem(args.problem);
  if (!s.ok()) return s;
  const int64_t n = detail::padded(args.problem, detail::Pass::kForward, args.paged.enabled()) ? detail::pad_forward(args, nullptr).bytes : 0;
  if (n < 0)
    return {StatusCode::kInvalidArgument, "head_dim = " + std::to_string(args.problem.head_dim) +
                                              ": the zero-padded copies' byte count must fit in int64"};
  *bytes = static_cast<size_t>(n);
  return s;
}

// Backward accumulates dQ in fp32 and keeps D = rowsum(dO * O) and the LSE in log2 units a row:
// batch * round_up(seqlen_q, 128) * heads_q * (kernel head dim + 2) * 4 bytes
// (detail::dq_accum_bytes); at a head dim without a kernel the zero-padded copies follow.
Status backward_workspace_size(const BackwardArgs& args, size_t* bytes) {
  if (bytes == nullptr) return {StatusCode::kInvalidArgument, "bytes = null: needs a size_t*"};
  const Problem& p = args.problem;
  Status s = detail::validate_problem(p);
  if (!s.ok()) return s;
  int64_t n = 0;
  if (!detail::dq_accum_bytes(p, &n))
    return {StatusCode::kInvalidArgument,
            "batch = " + std::to_string(p.batch) + ", seqlen_q = " + std::to_string(p.seqlen_q) +
                ", heads_q = " + std::to_string(p.heads_q) +
                ": the fp32 dQ accumulator's byte count must fit in int64"};
  if (detail::padded(p, detail::Pass::kBackward)) {
    const int64_t offset = detail::backward_pad_offset(p), copies = detail::pad_backward(args, nullptr).bytes;
    if (offset < 0 || copies < 0 || __builtin_add_overflow(offset, copies, &n))
      return {StatusCode::kInvalidArgument, "head_dim = " + std::to_string(p.head_dim) +
                                                ": the workspace with the zero-padded copies must fit in int64"};
  }
  *bytes = static_cast<size_t>(n);
  return s;
}

Status forward(const ForwardArgs& args, cudaStream_t stream) {
  Status s = validate(args);
  if (!s.ok()) return s;
  const Problem& p = args.problem;
  const Rows rows = rows_of(p, args.varlen, args.paged.enabled());
  // Nothing to compute, and nothing the GPU must be asked about.
  if (p.batch == 0 || rows.q == 0) return Status::Ok();
  if (!(s = detail::check_current_device()).ok()) return s;

  if (rows.k == 0) {  // every row sees no key: O = 0, LSE = -inf, or with sinks its head's sink
                      // (with varlen rows outside every sequence too, where with keys they are left
                      // as they are)
    Problem o_shape = rows.shape;
    o_shape.dtype = detail::output_dtype(o_shape.dtype);
    if (!(s = zero("zeroing o (no keys)", args.o, o_shape, rows.q, p.heads_q, p.value_dim(), stream)).ok()) return s;
    if (args.lse != nullptr) {
      const cudaError_t e =
          detail::fill_lse_by_head(args.lse, rows.shape.batch, p.heads_q, rows.q, args.sink, stream);
      if (e != cudaSuccess) return cuda_failure("filling lse (no keys)", e);
    }
    return Status::Ok();
  }
  return detail::padded(p, detail::Pass::kForward, args.paged.enabled())
             ? detail::forward_padded(args, stream, &run_forward)
             : run_forward(args, 0, 0, stream);
}

Status backward(const BackwardArgs& args, cudaStream_t stream) {
  const Status s = validate(args);
  if (!s.ok()) return s;
  const Problem& p = args.problem;
  const Rows rows = rows_of(p, args.varlen);
  if (detail::padded(p, detail::Pass::kBackward) && p.batch > 0 && rows.q > 0 && rows.k > 0) {
    if (Status d = detail::check_current_device(); !d.ok()) return d;
    return detail::backward_padded(args, stream, &run_backward);
  }
  return run_backward(args, 0, 0, stream);
}

namespace {

// A validated backward call at a kernel head dim, or any call with nothing to attend (its
// gradients zeroed at the caller's head dim); qk_cols, v_cols: where not 0, the tensors' columns
// (the caller's own at a head dim without a kernel, pad.h: fewer than the kernel head dim's).
Status run_backward(const BackwardArgs& args, int qk_cols, int v_cols, cudaStream_t stream) {
  Status s;
  const Problem& p = args.problem;
  const Rows rows = rows_of(p, args.varlen);
  // The sinks' gradient where no attention kernel runs: 0 (no rows, or rows without keys: O = 0).
  const bool empty = p.batch == 0 || rows.q == 0 || rows.k == 0;
  if (empty && args.dsink != nullptr) {
    if (!(s = detail::check_current_device()).ok()) return s;
    const cudaError_t e = cudaMemsetAsync(args.dsink, 0, size_t(p.heads_q) * sizeof(float), stream);
    if (e != cudaSuccess) return cuda_failure("zeroing dsink (no attention)", e);
  }
  if (p.batch == 0 || (rows.q == 0 && rows.k == 0)) return Status::Ok();
  if (!(s = detail::check_current_device()).ok()) return s;
  if (rows.q > 0 && rows.k > 0) {
    detail::BwdParams b = detail::make_bwd_params(args);
    b.qk_cols = qk_cols, b.v_cols = v_cols;
    if (!(s = detail::sm90_backward(b, stream)).ok() || !args.varlen.enabled()) return s;
    // Rows outside every sequence: their gradient, 0 (the tensors' columns only).
    const Varlen& vl = args.varlen;
    const int64_t qk = qk_cols > 0 ? qk_cols : p.head_dim, vc = v_cols > 0 ? v_cols : p.value_dim();
    const struct {
      const char* what;
      const TensorRef& t;
      const int* cu;
      int64_t total, heads, dim;
    } sides[] = {{"zeroing dq outside the sequences", args.dq, vl.cu_seqlens_q, vl.total_q, p.heads_q, qk},
                 {"zeroing dk outside the sequences", args.dk, vl.cu_seqlens_k, vl.total_k, p.heads_kv, qk},
                 {"zeroing dv outside the sequences", args.dv, vl.cu_seqlens_k, vl.total_k, p.heads_kv, vc}};
    for (const auto& x : sides) {
      const int64_t stride[3] = {x.t.batch_stride, x.t.seq_stride, x.t.head_stride};
      const cudaError_t e = detail::zero_rows_outside(x.t.data, detail::element_size(p.dtype), stride, x.cu, p.batch,
                                                      x.total, x.heads, x.dim, stream);
      if (e != cudaSuccess) return cuda_failure(x.what, e);
    }
    return Status::Ok();
  }

  // One side is empty: the gradients of the other side are 0 (with varlen over every row).
  if (rows.k == 0) return zero("zeroing dq (no keys)", args.dq, rows.shape, rows.q, p.heads_q, p.head_dim, stream);
  if (!(s = zero("zeroing dk (no queries)", args.dk, rows.shape, rows.k, p.heads_kv, p.head_dim, stream)).ok()) return s;
  return zero("zeroing dv (no queries)", args.dv, rows.shape, rows.k, p.heads_kv, p.value_dim(), stream);
}

}  // namespace

Status append_kv(const AppendArgs& args, cudaStream_t stream) {
  Status s = validate(args);
  if (!s.ok()) return s;
  if (args.problem.batch == 0) return Status::Ok();
  if (!(s = detail::check_current_device()).ok()) return s;
  const cudaError_t e = detail::launch_append_kv(detail::make_append_params(args), stream);
  return e == cudaSuccess ? Status::Ok() : cuda_failure("appending to the KV cache", e);
}

}  // namespace fa4

namespace {

fa4::TensorRef from_c(const fa4_tensor& t) {
  return {t.data, t.batch_stride, t.seq_stride, t.head_stride};
}

fa4::Problem from_c(const fa4_problem& p) {
  fa4::Problem r;
  r.dtype = static_cast<fa4::DType>(p.dtype);
  r.batch = p.batch;
  r.seqlen_q = p.seqlen_q;
  r.seqlen_k = p.seqlen_k;
  r.heads_q = p.heads_q;
  r.heads_kv = p.heads_kv;
  r.head_dim = p.head_dim;
  r.softmax_scale = p.softmax_scale;
  r.softcap = p.softcap;
  r.causal = p.causal != 0;
  r.window_left = p.window_left;
  r.window_right = p.window_right;
  r.head_dim_v = p.head_dim_v;
  return r;
}

// Copies the message (truncated, NUL-terminated) and returns the code.
int to_c(const fa4::Status& s, char* message, size_t message_len) {
  if (message != nullptr && message_len > 0) {
    const size_t n = std::min(s.message.size(), message_len - 1);
    std::memcpy(message, s.message.data(), n);
    message[n] = '\0';
  }
  return static_cast<int>(s.code);
}

// No exception may cross the C ABI; the only one possible here is a failed host allocation.
fa4::Status host_failure(const char* what) {
  fa4::Status s;
  s.code = fa4::StatusCode::kCudaError;
  try {
    s.message = std::string("host failure: ") + what;
  } catch (...) {
  }
  return s;
}

// A C entry point's frame: a null problem refused, then the body's Status for the problem (an
// exception becomes a host failure) handed back as a code, its message copied out.
template <class Body>
int c_entry(const fa4_problem* problem, char* message, size_t message_len, Body body) {
  try {
    if (problem == nullptr)
      return to_c({fa4::StatusCode::kInvalidArgument, "problem = null: needs an fa4_problem*"},
                  message, message_len);
    return to_c(body(from_c(*problem)), message, message_len);
  } catch (const std::exception& e) {
    return to_c(host_failure(e.what()), message, message_len);
  }
}

// The arguments of the C entry points' calls (varlen's added by theirs).
fa4::ForwardArgs forward_args(const fa4::Problem& p, fa4_tensor q, fa4_tensor k, fa4_tensor v, fa4_tensor o,
                              float* lse) {
  fa4::ForwardArgs a;
  a.problem = p;
  a.q = from_c(q);
  a.k = from_c(k);
  a.v = from_c(v);
  a.o = from_c(o);
  a.lse = lse;
  return a;
}
fa4::BackwardArgs backward_args(const fa4::Problem& p, fa4_tensor q, fa4_tensor k, fa4_tensor v, fa4_tensor o,
                                fa4_tensor dout, fa4_tensor dq, fa4_tensor dk, fa4_tensor dv, const float* lse,
                                int deterministic, void* workspace, size_t workspace_bytes) {
  fa4::BackwardArgs a;
  a.problem = p;
  a.q = from_c(q);
  a.k = from_c(k);
  a.v = from_c(v);
  a.o = from_c(o);
  a.dout = from_c(dout);
  a.dq = from_c(dq);
  a.dk = from_c(dk);
  a.dv = from_c(dv);
  a.lse = lse;
  a.deterministic = deterministic != 0;
  a.workspace = workspace;
  a.workspace_bytes = workspace_bytes;
  return a;
}

}  // namespace

extern "C" int fa4_forward(const fa4_problem* problem, fa4_tensor q, fa4_tensor k, fa4_tensor v,
                           fa4_tensor o, float* lse, void* workspace, size_t workspace_bytes,
                           cudaStream_t stream, char* message, size_t message_len) {
  return c_entry(problem, message, message_len, [&](const fa4::Problem& p) {
    fa4::ForwardArgs a = forward_args(p, q, k, v, o, lse);
    a.workspace = workspace;
    a.workspace_bytes = workspace_bytes;
    return fa4::forward(a, stream);
  });
}

extern "C" int fa4_forward_workspace_size(const fa4_problem* problem, size_t* bytes, char* message,
                                          size_t message_len) {
  return c_entry(problem, message, message_len, [&](const fa4::Problem& p) {
    fa4::ForwardArgs a;
    a.problem = p;
    return fa4::forward_workspace_size(a, bytes);
  });
}

extern "C" int fa4_backward_workspace_size(const fa4_problem* problem, size_t* bytes, char* message,
                                           size_t message_len) {
  return c_entry(problem, message, message_len, [&](const fa4::Problem& p) {
    fa4::BackwardArgs a;
    a.problem = p;
    return fa4::backward_workspace_size(a, bytes);
  });
}

extern "C" int fa4_backward(const fa4_problem* problem, fa4_tensor q, fa4_tensor k, fa4_tensor v,
                            fa4_tensor o, fa4_tensor dout, fa4_tensor dq, fa4_tensor dk,
                            fa4_tensor dv, const float* lse, int deterministic, void* workspace,
                            size_t workspace_bytes, cudaStream_t stream, char* message,
                            size_t message_len) {
  return c_entry(problem, message, message_len, [&](const fa4::Problem& p) {
    return fa4::backward(
        backward_args(p, q, k, v, o, dout, dq, dk, dv, lse, deterministic, workspace, workspace_bytes), stream);
  });
}

extern "C" int fa4_backward_sink(const fa4_problem* problem, fa4_tensor q, fa4_tensor k, fa4_tensor v,
                                 fa4_tensor o, fa4_tensor dout, fa4_tensor dq, fa4_tensor dk, fa4_tensor dv,
                                 const float* lse, const float* sink, float* dsink, int deterministic,
                                 void* workspace, size_t workspace_bytes, cudaStream_t stream, char* message,
                                 size_t message_len) {
  return c_entry(problem, message, message_len, [&](const fa4::Problem& p) {
    fa4::BackwardArgs a =
        backward_args(p, q, k, v, o, dout, dq, dk, dv, lse, deterministic, workspace, workspace_bytes);
    a.sink = sink;
    a.dsink = dsink;
    return fa4::backward(a, stream);
  });
}

extern "C" int fa4_forward_sink(const fa4_problem* problem, fa4_tensor q, fa4_tensor k, fa4_tensor v,
                                fa4_tensor o, const float* sink, float* lse, cudaStream_t stream, char* message,
                                size_t message_len) {
  return c_entry(problem, message, message_len, [&](const fa4::Problem& p) {
    fa4::ForwardArgs a = forward_args(p, q, k, v, o, lse);
    a.sink = sink;
    return fa4::forward(a, stream);
  });
}

extern "C" int fa4_forward_fp8(const fa4_problem* problem, fa4_tensor q, fa4_tensor k, fa4_tensor v, fa4_tensor o,
                               const float* q_descale, const float* k_descale, const float* v_descale, float* lse,
                               cudaStream_t stream, char* message, size_t message_len) {
  return c_entry(problem, message, message_len, [&](const fa4::Problem& p) {
    fa4::ForwardArgs a = forward_args(p, q, k, v, o, lse);
    a.q_descale = q_descale, a.k_descale = k_descale, a.v_descale = v_descale;
    return fa4::forward(a, stream);
  });
}

extern "C" int fa4_forward_seqused(const fa4_problem* problem, fa4_tensor q, fa4_tensor k, fa4_tensor v,
                                   fa4_tensor o, const int32_t* seqused_k, float* lse, cudaStream_t stream,
                                   char* message, size_t message_len) {
  return c_entry(problem, message, message_len, [&](const fa4::Problem& p) {
    fa4::ForwardArgs a = forward_args(p, q, k, v, o, lse);
    a.varlen.seqused_k = seqused_k;
    return fa4::forward(a, stream);
  });
}

extern "C" int fa4_forward_leftpad(const fa4_problem* problem, fa4_tensor q, fa4_tensor k, fa4_tensor v,
                                   fa4_tensor o, const int32_t* leftpad_k, const int32_t* seqused_k, float* lse,
                                   cudaStream_t stream, char* message, size_t message_len) {
  return c_entry(problem, message, message_len, [&](const fa4::Problem& p) {
    fa4::ForwardArgs a = forward_args(p, q, k, v, o, lse);
    a.varlen.seqused_k = seqused_k;
    a.varlen.leftpad_k = leftpad_k;
    return fa4::forward(a, stream);
  });
}

extern "C" int fa4_forward_paged(const fa4_problem* problem, fa4_tensor q, fa4_tensor k_pages, fa4_tensor v_pages,
                                 fa4_tensor o, const int32_t* block_table, int64_t table_stride, int64_t page_size,
                                 int64_t num_pages, const int32_t* seqused_k, float* lse, cudaStream_t stream,
                                 char* message, size_t message_len) {
  return c_entry(problem, message, message_len, [&](const fa4::Problem& p) {
    fa4::ForwardArgs a = forward_args(p, q, k_pages, v_pages, o, lse);
    a.varlen.seqused_k = seqused_k;
    a.paged = {block_table, table_stride, page_size, num_pages};
    return fa4::forward(a, stream);
  });
}

extern "C" int fa4_forward_paged_varlen(const fa4_problem* problem, fa4_tensor q, fa4_tensor k_pages,
                                        fa4_tensor v_pages, fa4_tensor o, const int32_t* cu_seqlens_q, int64_t total_q,
                                        const int32_t* cu_seqlens_k, const int32_t* block_table, int64_t table_stride,
                                        int64_t page_size, int64_t num_pages, const int32_t* seqused_k, float* lse,
                                        cudaStream_t stream, char* message, size_t message_len) {
  return c_entry(problem, message, message_len, [&](const fa4::Problem& p) {
    fa4::ForwardArgs a = forward_args(p, q, k_pages, v_pages, o, lse);
    a.varlen = {cu_seqlens_q, cu_seqlens_k, total_q, 0, seqused_k};
    a.paged = {block_table, table_stride, page_size, num_pages};
    return fa4::forward(a, stream);
  });
}

extern "C" int fa4_forward_varlen(const fa4_problem* problem, fa4_tensor q, fa4_tensor k, fa4_tensor v,
                                  fa4_tensor o, const int32_t* cu_seqlens_q, const int32_t* cu_seqlens_k,
                                  int64_t total_q, int64_t total_k, float* lse, cudaStream_t stream,
                                  char* message, size_t message_len) {
  return c_entry(problem, message, message_len, [&](const fa4::Problem& p) {
    fa4::ForwardArgs a = forward_args(p, q, k, v, o, lse);
    a.varlen = {cu_seqlens_q, cu_seqlens_k, total_q, total_k};
    return fa4::forward(a, stream);
  });
}

extern "C" int fa4_forward_varlen_seqused(const fa4_problem* problem, fa4_tensor q, fa4_tensor k, fa4_tensor v,
                                          fa4_tensor o, const int32_t* cu_seqlens_q, const int32_t* cu_seqlens_k,
                                          const int32_t* seqused_k, int64_t total_q, int64_t total_k, float* lse,
                                          cudaStream_t stream, char* message, size_t message_len) {
  return c_entry(problem, message, message_len, [&](const fa4::Problem& p) {
    fa4::ForwardArgs a = forward_args(p, q, k, v, o, lse);
    a.varlen = {cu_seqlens_q, cu_seqlens_k, total_q, total_k, seqused_k};
    return fa4::forward(a, stream);
  });
}

extern "C" int fa4_backward_varlen(const fa4_problem* problem, fa4_tensor q, fa4_tensor k, fa4_tensor v,
                                   fa4_tensor o, fa4_tensor dout, fa4_tensor dq, fa4_tensor dk, fa4_tensor dv,
                                   const int32_t* cu_seqlens_q, const int32_t* cu_seqlens_k, int64_t total_q,
                                   int64_t total_k, const float* lse, int deterministic, void* workspace,
                                   size_t workspace_bytes, cudaStream_t stream, char* message, size_t message_len) {
  return c_entry(problem, message, message_len, [&](const fa4::Problem& p) {
    fa4::BackwardArgs a =
        backward_args(p, q, k, v, o, dout, dq, dk, dv, lse, deterministic, workspace, workspace_bytes);
    a.varlen = {cu_seqlens_q, cu_seqlens_k, total_q, total_k};
    return fa4::backward(a, stream);
  });
}

extern "C" int fa4_append_kv(const fa4_problem* problem, int64_t seqlen_new, fa4_tensor k_new, fa4_tensor v_new,
                             fa4_tensor k_cache, fa4_tensor v_cache, const int32_t* block_table, int64_t table_stride,
                             int64_t page_size, int64_t num_pages, const int32_t* cache_seqlens, int64_t cache_seqlen,
                             int32_t* seqused_k, const fa4_rotary* rotary, fa4_tensor q, fa4_tensor q_rotated,
                             cudaStream_t stream, char* message, size_t message_len) {
  return c_entry(problem, message, message_len, [&](const fa4::Problem& p) {
    fa4::AppendArgs a;
    a.problem = p;
    a.seqlen_new = seqlen_new;
    a.k_new = from_c(k_new);
    a.v_new = from_c(v_new);
    a.k_cache = from_c(k_cache);
    a.v_cache = from_c(v_cache);
    a.paged = {block_table, table_stride, page_size, num_pages};
    a.cache_seqlens = cache_seqlens;
    a.cache_seqlen = cache_seqlen;
    a.seqused_k = seqused_k;
    if (rotary != nullptr)
      a.rotary = {rotary->cos, rotary->sin, rotary->seqlen_ro, rotary->rotary_dim, rotary->interleaved != 0};
    a.q = from_c(q);
    a.q_rotated = from_c(q_rotated);
    return fa4::append_kv(a, stream);
  });
}
