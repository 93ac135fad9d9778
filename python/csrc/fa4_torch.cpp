// PyTorch operators over fa4, registered with TORCH_LIBRARY so torch.compile sees them as ops:
//
//   fa4::fwd(q, k, v, softmax_scale, causal, window_left, window_right, with_lse=True, softcap=0.0,
//            seqused_k=None, sink=None) -> (out, lse)      (with_lse false: no LSE written, lse empty
//       [0]; softcap > 0: scores soft-capped; seqused_k int32 [batch]: entry b's keys are the first
//       seqused_k[b] of k and v, a KV cache's filled part; sink fp32 [heads_q]: attention sinks,
//       fa4::ForwardArgs::sink)
//   fa4::fwd_paged(q, k_cache, v_cache, block_table, softmax_scale, causal, window_left, window_right,
//                  with_lse=True, softcap=0.0, seqused_k=None) -> (out, lse)
//       a paged KV cache: k_cache, v_cache [num_pages, page_size, heads_kv, head_dim], block_table
//       int32 [batch, max_pages]; entry b's key j on page block_table[b, j / page_size].
//   fa4::fwd_paged_varlen(q, k_cache, v_cache, block_table, cu_seqlens_q, max_seqlen_q, softmax_scale,
//                         causal, window_left, window_right, with_lse=True, softcap=0.0,
//                         seqused_k=None, cu_seqlens_k=None, sink=None) -> (out, lse)
//       the same with packed queries: q [total_q, heads_q, head_dim], cu_seqlens_q int32
//       [batch + 1]; sequence b's keys the first of its table row's max_pages * page_size, at most
//       cu_seqlens_k[b + 1] - cu_seqlens_k[b] and seqused_k[b] where given; lse [heads_q, total_q].
//   fa4::bwd(dout, q, k, v, out, lse, softmax_scale, causal, window_left, window_right,
//            deterministic, softcap=0.0, sink=None, dsink!=None) -> (dq, dk, dv)     (softcap and
//       sink: the forward's; dsink fp32 [heads_q], written where given: the sinks' gradient)
//   fa4::fwd_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
//                   softmax_scale, causal, window_left, window_right, with_lse=True, softcap=0.0,
//                   seqused_k=None, sink=None) -> (out, lse)
//       packed sequences: q [total_q, heads_q, head_dim], k and v [total_k, heads_kv, head_dim],
//       cu_seqlens int32 [batch + 1] on q's device; out like q, lse fp32 [heads_q, total_q];
//       seqused_k int32 [batch]: sequence b's keys are the first seqused_k[b] of its span.
//   fa4::bwd_varlen(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
//                   softmax_scale, causal, window_left, window_right, deterministic, softcap=0.0,
//                   sink=None, dsink!=None) -> (dq, dk, dv)
//   fa4::append_kv(q, k_cache!, v_cache!, k, v, cache_seqlens, cache_seqlen, block_table, rotary_cos,
//                  rotary_sin, rotary_interleaved, causal, window_left, window_right)
//       -> (q_rotated, seqused_k)
//       new keys and values into a KV cache in place (contiguous or paged), rotary embedding on k
//       and into q_rotated (empty [0] without it); seqused_k int32 [batch]: the keys after it.
//   fa4::fwd_kvcache(q, k_cache!, v_cache!, k?, v?, cache_seqlens, cache_seqlen, block_table, rotary_cos,
//                    rotary_sin, rotary_interleaved, softmax_scale, causal, window_left, window_right,
//                    with_lse=True, softcap=0.0, cache_batch_idx=None, cache_leftpad=None, sink=None)
//                    -> (out, lse)
//       append_kv where k and v are given, then the forward over each entry's keys, in one
//       operator; cache_batch_idx reads (and appends to) cache entry idx[b] for batch entry b;
//       cache_leftpad starts entry b's keys at its cache row cache_leftpad[b].
//
// Tensors are [batch, seqlen, heads, head_dim] views (BSHD, or BHSD transposed back) whose last
// dim is contiguous; their element strides go to fa4 as they are. Outputs are new contiguous
// tensors: out and dq like q's shape, dk and dv like k's, lse fp32 [batch, heads_q, seqlen_q].
// Runs on the current CUDA stream of q's device. fa4's Status becomes a Python exception:
// kInvalidArgument -> ValueError, kNotSupported -> NotImplementedError, others -> RuntimeError.
// The fake (meta) kernels and autograd live in python/fa4/__init__.py.
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/ops/add.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "fa4/attention.h"

namespace {

constexpr int64_t kDims = 4;  // [batch, seqlen, heads, head_dim]

// Error messages are concatenated here into one std::string before they reach TORCH_CHECK: an
// extension built by GCC 13 crashed in torch 2.11 while c10::str streamed integers (sizes,
// strides) into its ostringstream; a single string argument is passed through untouched.
void append(std::string& s, const char* x) { s += x; }
void append(std::string& s, const std::string& x) { s += x; }
void append(std::string& s, int64_t x) { s += std::to_string(x); }
void append(std::string& s, const c10::Device& x) { s += x.str(); }
void append(std::string& s, c10::ScalarType x) { s += c10::toString(x); }
template <class... Args>
std::string cat(const Args&... args) {
  std::string s;
  (append(s, args), ...);
  return s;
}

#define FA4_CHECK_VALUE(cond, ...)                              \
  do {                                                          \
    if (!(cond)) TORCH_CHECK_VALUE(false, cat(__VA_ARGS__));    \
  } while (0)

// Raises the exception that matches fa4's status code.
void raise_if_error(const fa4::Status& s, const char* op) {
  if (s.ok()) return;
  FA4_CHECK_VALUE(s.code != fa4::StatusCode::kInvalidArgument, op, ": ", s.message);
  if (s.code == fa4::StatusCode::kNotSupported)
    TORCH_CHECK_NOT_IMPLEMENTED(false, cat(op, ": not supported: ", s.message));
  TORCH_CHECK(false, cat(op, ": ", fa4::to_string(s.code), ": ", s.message));
}

fa4::DType dtype_of(const at::Tensor& t, const char* op, const char* name) {
  if (t.scalar_type() == at::kBFloat16) return fa4::DType::kBF16;
  if (t.scalar_type() == at::kHalf) return fa4::DType::kFP16;
  if (t.scalar_type() == at::kFloat8_e4m3fn) return fa4::DType::kE4M3;  // (forward only: fa4 says so elsewhere)
  TORCH_CHECK_VALUE(false, cat(op, ": ", name, " has dtype ", t.scalar_type(),
                              ": must be torch.bfloat16, torch.float16 or torch.float8_e4m3fn"));
}

// "[2, 128, 8, 64]". Shapes and strides are formatted here rather than by streaming IntArrayRef
// into the error message: that crashed in torch 2.11 with an extension built by GCC 13.
std::string list_str(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}
std::vector<int64_t> shape_of(const at::Tensor& t) {
  std::vector<int64_t> v;
  for (int64_t i = 0; i < t.dim(); ++i) v.push_back(t.size(i));
  return v;
}
std::string shape_str(const at::Tensor& t) { return list_str(shape_of(t)); }
std::string strides_str(const at::Tensor& t) {
  std::vector<int64_t> v;
  for (int64_t i = 0; i < t.dim(); ++i) v.push_back(t.stride(i));
  return list_str(v);
}

// A 4-d CUDA tensor on `device` with a contiguous last dim.
void check_tensor(const at::Tensor& t, const char* op, const char* name, const at::Device& device) {
  FA4_CHECK_VALUE(t.defined(), op, ": ", name, " is undefined");
  FA4_CHECK_VALUE(t.is_cuda(), op, ": ", name, " is on ", t.device(), ": must be a CUDA tensor");
  FA4_CHECK_VALUE(t.device() == device, op, ": ", name, " is on ", t.device(),
                    ", q on ", device, ": all tensors must be on one device");
  FA4_CHECK_VALUE(t.dim() == kDims, op, ": ", name, " has shape ", shape_str(t),
                    ": must be 4-d [batch, seqlen, heads, head_dim]");
  FA4_CHECK_VALUE(t.stride(3) == 1 || t.size(3) <= 1, op, ": ", name, " has stride ",
                    t.stride(3), " in its last dim (shape ", shape_str(t), ", strides ", strides_str(t),
                    "): head_dim must be contiguous (stride 1)");
}

void check_same_dtype(const at::Tensor& t, const at::Tensor& q, const char* op, const char* name) {
  FA4_CHECK_VALUE(t.scalar_type() == q.scalar_type(), op, ": ", name, " has dtype ",
                    t.scalar_type(), ", q has ", q.scalar_type(), ": they must match");
}

// `t` must have exactly `shape`, described by the names of its dims.
void check_shape(const at::Tensor& t, const std::vector<int64_t>& shape, const char* op,
                 const char* name, const char* expected) {
  FA4_CHECK_VALUE(shape_of(t) == shape, op, ": ", name, " has shape ", shape_str(t),
                    ": must be ", list_str(shape), " (", expected, ")");
}

// v (or v_cache, named v_name) as k but for its last dim, its head dim, which may differ from q's
// and k's (fa4::Problem::head_dim_v); returns the head_dim_v that describes it (0: the same).
int64_t check_v_like_k(const at::Tensor& v, const at::Tensor& k, const char* op, const char* v_name,
                       const char* expected) {
  std::vector<int64_t> want = shape_of(k);
  want.back() = v.size(v.dim() - 1);
  check_shape(v, want, op, v_name, expected);
  return v.size(v.dim() - 1) == k.size(k.dim() - 1) ? 0 : v.size(v.dim() - 1);
}

// Element strides as fa4 takes them. A dim of size 1 is never stepped over, so its stride is
// free: give it the contiguous one, so views like q[:, :, 0:1] pass the alignment rules.
fa4::TensorRef tensor_ref(const at::Tensor& t) {
  int64_t st[3];
  int64_t inner = t.size(3);  // elements spanned by one step of the next-inner dim
  for (int i = 2; i >= 0; --i) {
    st[i] = t.size(i) == 1 ? inner : t.stride(i);
    inner = st[i] * t.size(i);
  }
  return {t.data_ptr(), st[0], st[1], st[2]};
}

// The options every operator takes into p: scale, causal, window.
void set_options(fa4::Problem& p, std::optional<double> scale, bool causal, int64_t window_left,
                 int64_t window_right, const char* op) {
  if (scale.has_value()) {
    // fa4 reads 0 as "use the default": a literal 0 cannot be passed through.
    FA4_CHECK_VALUE(*scale != 0.0, op, ": softmax_scale = 0: must be nonzero (None gives ",
                      "1/sqrt(head_dim))");
    p.softmax_scale = static_cast<float>(*scale);
  }
  p.causal = causal;
  p.window_left = window_left;
  p.window_right = window_right;
}

fa4::Problem make_problem(const at::Tensor& q, const at::Tensor& k, std::optional<double> scale,
                          bool causal, int64_t window_left, int64_t window_right, const char* op) {
  fa4::Problem p;
  p.dtype = dtype_of(q, op, "q");
  p.batch = q.size(0);
  p.seqlen_q = q.size(1);
  p.heads_q = q.size(2);
  p.head_dim = q.size(3);
  p.seqlen_k = k.size(1);
  p.heads_kv = k.size(2);
  set_options(p, scale, causal, window_left, window_right, op);
  return p;
}

// q, and k and v (named k_name and v_name), as check_tensor takes them, of q's dtype.
void check_three(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const char* op,
                 const char* k_name, const char* v_name) {
  check_tensor(q, op, "q", q.device());
  check_tensor(k, op, k_name, q.device());
  check_tensor(v, op, v_name, q.device());
  dtype_of(q, op, "q");
  check_same_dtype(k, q, op, k_name);
  check_same_dtype(v, q, op, v_name);
}

// q, k, v agree with each other: returns the problem they describe.
fa4::Problem check_qkv(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                       std::optional<double> scale, bool causal, int64_t window_left,
                       int64_t window_right, const char* op) {
  check_three(q, k, v, op, "k", "v");
  FA4_CHECK_VALUE(k.size(0) == q.size(0) && k.size(3) == q.size(3), op, ": k has shape ",
                    shape_str(k), ", q has ", shape_str(q),
                    ": batch (dim 0) and head_dim (dim 3) must match");
  const int64_t head_dim_v =
      check_v_like_k(v, k, op, "v", "k's shape but for its last dim: [batch, seqlen_k, heads_kv, head_dim_v]");
  fa4::Problem p = make_problem(q, k, scale, causal, window_left, window_right, op);
  p.head_dim_v = head_dim_v;
  return p;
}

// `bytes` of workspace on like's device set into args; the tensor returned owns it (empty when
// bytes is 0, args then untouched).
template <class Args>
at::Tensor attach_workspace(Args& args, size_t bytes, const at::Tensor& like) {
  if (bytes == 0) return {};
  at::Tensor ws = at::empty({static_cast<int64_t>(bytes)}, like.options().dtype(at::kByte));
  args.workspace = ws.data_ptr();
  args.workspace_bytes = bytes;
  return ws;
}

// The forward's LSE as a backward takes it: fp32, contiguous, on q's device, of `shape`.
void check_lse(const at::Tensor& lse, const at::Tensor& q, const std::vector<int64_t>& shape,
               const char* expected, const char* op) {
  FA4_CHECK_VALUE(lse.defined() && lse.is_cuda() && lse.device() == q.device(), op,
                    ": lse must be a CUDA tensor on q's device");
  FA4_CHECK_VALUE(lse.scalar_type() == at::kFloat, op, ": lse has dtype ", lse.scalar_type(),
                    ": must be torch.float32 (the forward's lse)");
  check_shape(lse, shape, op, "lse", expected);
  FA4_CHECK_VALUE(lse.is_contiguous(), op, ": lse has strides ", strides_str(lse),
                    ": must be contiguous");
}

// The fields fa4::ForwardArgs and fa4::BackwardArgs share: p, and q, k, v, out given to fa4 by
// `ref` (tensor_ref for [batch, seqlen, heads, head_dim], packed_ref for varlen's [total, heads,
// head_dim]), lse (empty: none), varlen.
template <class Args, class Ref>
Args common_args(const fa4::Problem& p, Ref ref, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                 const at::Tensor& out, const at::Tensor& lse, const fa4::Varlen& varlen) {
  Args args;
  args.problem = p;
  args.q = ref(q);
  args.k = ref(k);
  args.v = ref(v);
  args.o = ref(out);
  args.lse = lse.numel() ? lse.data_ptr<float>() : nullptr;
  args.varlen = varlen;
  return args;
}

// fa4::forward of p on q, k, v into out and lse (empty: not written), with the workspace it asks
// for, on q's current stream (fa4::forward validates the arguments).
template <class Ref>
std::tuple<at::Tensor, at::Tensor> run_forward(const fa4::Problem& p, Ref ref, const at::Tensor& q,
                                               const at::Tensor& k, const at::Tensor& v, at::Tensor out,
                                               at::Tensor lse, const fa4::Varlen& varlen, const char* op,
                                               const fa4::PagedKV& paged = {}, const float* sink = nullptr,
                                               const float* const* descales = nullptr) {
  auto args = common_args<fa4::ForwardArgs>(p, ref, q, k, v, out, lse, varlen);
  args.paged = paged;
  args.sink = sink;
  if (descales != nullptr) args.q_descale = descales[0], args.k_descale = descales[1], args.v_descale = descales[2];
  size_t bytes = 0;
  raise_if_error(fa4::forward_workspace_size(args, &bytes), op);
  const at::Tensor ws = attach_workspace(args, bytes, q);
  raise_if_error(fa4::forward(args, c10::cuda::getCurrentCUDAStream(q.device().index()).stream()), op);
  return {out, lse};
}

// fa4::backward of p: dq, dk, dv of q's, k's and v's shapes (fa4 writes every row, those outside
// every sequence of a varlen call as zeros), with the workspace it asks for, on q's current stream
// (fa4::backward validates the arguments).
template <class Ref>
std::tuple<at::Tensor, at::Tensor, at::Tensor> run_backward(const fa4::Problem& p, Ref ref, const at::Tensor& dout,
                                                            const at::Tensor& q, const at::Tensor& k,
                                                            const at::Tensor& v, const at::Tensor& out,
                                                            const at::Tensor& lse, bool deterministic,
                                                            const fa4::Varlen& varlen, const char* op,
                                                            const float* sink = nullptr, float* dsink = nullptr) {
  at::Tensor dq = at::empty(q.sizes(), q.options());
  at::Tensor dk = at::empty(k.sizes(), k.options());
  at::Tensor dv = at::empty(v.sizes(), v.options());
  auto args = common_args<fa4::BackwardArgs>(p, ref, q, k, v, out, lse, varlen);
  args.dout = ref(dout);
  args.dq = ref(dq);
  args.dk = ref(dk);
  args.dv = ref(dv);
  args.deterministic = deterministic;
  args.sink = sink;
  args.dsink = dsink;
  size_t bytes = 0;
  raise_if_error(fa4::backward_workspace_size(args, &bytes), op);
  const at::Tensor ws = attach_workspace(args, bytes, q);
  raise_if_error(fa4::backward(args, c10::cuda::getCurrentCUDAStream(q.device().index()).stream()), op);
  return {dq, dk, dv};
}

// An int32 tensor on q's device (cu_seqlens, seqused_k).
void check_int32_on(const at::Tensor& t, const char* op, const char* name, const at::Device& device) {
  FA4_CHECK_VALUE(t.defined() && t.is_cuda() && t.device() == device, op, ": ", name,
                  " must be a CUDA tensor on q's device");
  FA4_CHECK_VALUE(t.scalar_type() == at::kInt, op, ": ", name, " has dtype ", t.scalar_type(),
                  ": must be torch.int32");
}

// seqused_k, where given: int32, contiguous [batch] on q's device (`from`: where batch comes from).
const int32_t* seqused_of(const std::optional<at::Tensor>& seqused_k, int64_t batch, const at::Device& device,
                          const char* op, const char* from, const char* name = "seqused_k") {
  if (!seqused_k.has_value()) return nullptr;
  const at::Tensor& used = *seqused_k;
  check_int32_on(used, op, name, device);
  FA4_CHECK_VALUE(used.dim() == 1 && used.size(0) == batch && used.is_contiguous(), op, ": ", name, " has shape ",
                  shape_str(used), " and strides ", strides_str(used), ": must be contiguous [batch] (batch = ",
                  batch, ", from ", from, ")");
  return used.data_ptr<int32_t>();
}

// "[batch, heads_kv] (batch = 2, heads_kv = 4)": dims named `names`, of sizes `shape`.
std::string dims_str(std::initializer_list<const char*> names, std::initializer_list<int64_t> shape) {
  std::string list = "[", sizes = " (";
  for (size_t i = 0; i < names.size(); ++i) {
    list += cat(i ? ", " : "", names.begin()[i]);
    sizes += cat(i ? ", " : "", names.begin()[i], " = ", shape.begin()[i]);
  }
  return list + "]" + sizes + ")";
}

// An fp32 tensor, where given: contiguous, of `shape` (its dims named `names`), on q's device.
float* fp32_of(const std::optional<at::Tensor>& given, std::initializer_list<int64_t> shape,
               std::initializer_list<const char*> names, const at::Device& device, const char* op, const char* name) {
  if (!given.has_value()) return nullptr;
  const at::Tensor& t = *given;
  FA4_CHECK_VALUE(t.defined() && t.is_cuda() && t.device() == device, op, ": ", name,
                  " must be a CUDA tensor on q's device");
  FA4_CHECK_VALUE(t.scalar_type() == at::kFloat, op, ": ", name, " has dtype ", t.scalar_type(),
                  ": must be torch.float32");
  FA4_CHECK_VALUE(t.sizes().equals(shape) && t.is_contiguous(), op, ": ", name, " has shape ", shape_str(t),
                  " and strides ", strides_str(t), ": must be contiguous ", dims_str(names, shape));
  return t.data_ptr<float>();
}

// sink or dsink, where given: fp32, contiguous [heads_q] on q's device (the attention sinks,
// fa4::ForwardArgs::sink, and their gradient).
float* sink_of(const std::optional<at::Tensor>& sink, int64_t heads_q, const at::Device& device, const char* op,
               const char* name) {
  return fp32_of(sink, {heads_q}, {"heads_q"}, device, op, name);
}

// run_forward on batched q (out like q, lse [batch, heads_q, seqlen_q]) on q's device.
std::tuple<at::Tensor, at::Tensor> batched_forward(const fa4::Problem& p, const at::Tensor& q, const at::Tensor& k,
                                                   const at::Tensor& v, bool with_lse, const fa4::Varlen& entries,
                                                   const char* op, const fa4::PagedKV& paged = {},
                                                   const float* sink = nullptr,
                                                   const float* const* descales = nullptr) {
  const c10::cuda::CUDAGuard guard(q.device());
  // (fp8's out is bf16)
  const auto out_options = q.scalar_type() == at::kFloat8_e4m3fn ? q.options().dtype(at::kBFloat16) : q.options();
  at::Tensor out = at::empty({p.batch, p.seqlen_q, p.heads_q, p.value_dim()}, out_options);
  // Without with_lse (an inference call) the kernels write no LSE: lse comes back empty, [0].
  const auto f32 = q.options().dtype(at::kFloat);
  at::Tensor lse = with_lse ? at::empty({p.batch, p.heads_q, p.seqlen_q}, f32) : at::empty({0}, f32);
  return run_forward(p, tensor_ref, q, k, v, out, lse, entries, op, paged, sink, descales);
}

std::tuple<at::Tensor, at::Tensor> fwd_op(const at::Tensor& q, const at::Tensor& k,
                                            const at::Tensor& v,
                                            std::optional<double> softmax_scale, bool causal,
                                            int64_t window_left, int64_t window_right,
                                            bool with_lse, double softcap,
                                            const std::optional<at::Tensor>& seqused_k,
                                            const std::optional<at::Tensor>& sink) {
  const char* op = "fa4::fwd";
  fa4::Problem p = check_qkv(q, k, v, softmax_scale, causal, window_left, window_right, op);
  p.softcap = static_cast<float>(softcap);  // (validate() names a bad one)
  fa4::Varlen entries;  // batch entries' own key lengths, where given (no cu_seqlens)
  entries.seqused_k = seqused_of(seqused_k, p.batch, q.device(), op, "q");
  return batched_forward(p, q, k, v, with_lse, entries, op, {}, sink_of(sink, p.heads_q, q.device(), op, "sink"));
}

// A descale of the fp8 forward, where given: fp32, contiguous [batch, heads_kv] on q's device.
const float* descale_of(const std::optional<at::Tensor>& d, const fa4::Problem& p, const at::Device& device,
                        const char* op, const char* name) {
  return fp32_of(d, {p.batch, p.heads_kv}, {"batch", "heads_kv"}, device, op, name);
}

// The fp8 forward (q, k, v torch.float8_e4m3fn; out bf16) with FlashAttention-3's descales.
std::tuple<at::Tensor, at::Tensor> fwd_fp8_op(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                              std::optional<double> softmax_scale, bool causal, int64_t window_left,
                                              int64_t window_right, bool with_lse,
                                              const std::optional<at::Tensor>& q_descale,
                                              const std::optional<at::Tensor>& k_descale,
                                              const std::optional<at::Tensor>& v_descale) {
  const char* op = "fa4::fwd_fp8";
  fa4::Problem p = check_qkv(q, k, v, softmax_scale, causal, window_left, window_right, op);
  FA4_CHECK_VALUE(p.dtype == fa4::DType::kE4M3, op, ": q has dtype ", q.scalar_type(),
                  ": must be torch.float8_e4m3fn (16-bit inputs go to fa4::fwd)");
  const float* descales[3] = {descale_of(q_descale, p, q.device(), op, "q_descale"),
                              descale_of(k_descale, p, q.device(), op, "k_descale"),
                              descale_of(v_descale, p, q.device(), op, "v_descale")};
  return batched_forward(p, q, k, v, with_lse, {}, op, {}, nullptr, descales);
}

// block_table checked (int32 [batch, max_pages] on `device`, its rows contiguous; batch as taken
// from `from`) and, with k_pages' page size and count, the PagedKV fa4 takes.
fa4::PagedKV paged_of(const at::Tensor& block_table, const at::Tensor& k_pages, int64_t batch,
                      const at::Device& device, const char* op, const char* from) {
  check_int32_on(block_table, op, "block_table", device);
  FA4_CHECK_VALUE(block_table.dim() == 2 && block_table.size(0) == batch &&
                      (block_table.stride(1) == 1 || block_table.size(1) <= 1),
                  op, ": block_table has shape ", shape_str(block_table), " and strides ", strides_str(block_table),
                  ": must be [batch, max_pages] (batch = ", batch, ", from ", from, ") with contiguous rows");
  // (One entry's row is never stepped over: its stride is free.)
  return {block_table.data_ptr<int32_t>(), block_table.size(0) <= 1 ? block_table.size(1) : block_table.stride(0),
          k_pages.size(1), k_pages.size(0)};
}

// A paged cache: k_pages and v_pages [num_pages, page_size, heads_kv, head_dim], block_table
// int32 [batch, max_pages] (its rows contiguous) on q's device; each entry's keys are its first
// max_pages * page_size, or seqused_k[b] of them.
std::tuple<at::Tensor, at::Tensor> fwd_paged_op(const at::Tensor& q, const at::Tensor& k_pages,
                                                  const at::Tensor& v_pages, const at::Tensor& block_table,
                                                  std::optional<double> softmax_scale, bool causal,
                                                  int64_t window_left, int64_t window_right, bool with_lse,
                                                  double softcap, const std::optional<at::Tensor>& seqused_k) {
  const char* op = "fa4::fwd_paged";
  check_three(q, k_pages, v_pages, op, "k_cache", "v_cache");
  FA4_CHECK_VALUE(k_pages.size(3) == q.size(3), op, ": k_cache has shape ", shape_str(k_pages), ", q has ",
                  shape_str(q), ": head_dim (dim 3) must match");
  const int64_t head_dim_v = check_v_like_k(v_pages, k_pages, op, "v_cache",
                                            "k_cache's shape but for its last dim: [num_pages, page_size, heads_kv, "
                                            "head_dim_v]");
  const fa4::PagedKV paged = paged_of(block_table, k_pages, q.size(0), q.device(), op, "q");
  fa4::Problem p = make_problem(q, k_pages, softmax_scale, causal, window_left, window_right, op);
  p.head_dim_v = head_dim_v;
  p.seqlen_k = block_table.size(1) * k_pages.size(1);  // each entry's table row's keys
  p.softcap = static_cast<float>(softcap);  // (validate() names a bad one)
  fa4::Varlen entries;
  entries.seqused_k = seqused_of(seqused_k, p.batch, q.device(), op, "q");
  return batched_forward(p, q, k_pages, v_pages, with_lse, entries, op, paged);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> bwd_op(
    const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& lse, std::optional<double> softmax_scale, bool causal,
    int64_t window_left, int64_t window_right, bool deterministic, double softcap,
    const std::optional<at::Tensor>& sink, const std::optional<at::Tensor>& dsink) {
  const char* op = "fa4::bwd";
  fa4::Problem p = check_qkv(q, k, v, softmax_scale, causal, window_left, window_right, op);
  p.softcap = static_cast<float>(softcap);  // (validate() names a bad one)
  check_tensor(out, op, "out", q.device());
  check_tensor(dout, op, "dout", q.device());
  check_same_dtype(out, q, op, "out");
  check_same_dtype(dout, q, op, "dout");
  const std::vector<int64_t> o_shape = {p.batch, p.seqlen_q, p.heads_q, p.value_dim()};
  check_shape(out, o_shape, op, "out", "[batch, seqlen_q, heads_q, v's head_dim]");
  check_shape(dout, o_shape, op, "dout", "[batch, seqlen_q, heads_q, v's head_dim]");
  check_lse(lse, q, {p.batch, p.heads_q, p.seqlen_q}, "[batch, heads_q, seqlen_q]", op);

  const c10::cuda::CUDAGuard guard(q.device());
  return run_backward(p, tensor_ref, dout, q, k, v, out, lse, deterministic, {}, op,
                      sink_of(sink, p.heads_q, q.device(), op, "sink"),
                      sink_of(dsink, p.heads_q, q.device(), op, "dsink"));
}

// A 3-d packed tensor [total, heads, head_dim] on `device`, its last dim contiguous.
void check_packed(const at::Tensor& t, const char* op, const char* name, const at::Device& device) {
  FA4_CHECK_VALUE(t.defined(), op, ": ", name, " is undefined");
  FA4_CHECK_VALUE(t.is_cuda(), op, ": ", name, " is on ", t.device(), ": must be a CUDA tensor");
  FA4_CHECK_VALUE(t.device() == device, op, ": ", name, " is on ", t.device(),
                    ", q on ", device, ": all tensors must be on one device");
  FA4_CHECK_VALUE(t.dim() == 3, op, ": ", name, " has shape ", shape_str(t),
                    ": must be 3-d [total, heads, head_dim] (packed sequences)");
  FA4_CHECK_VALUE(t.stride(2) == 1 || t.size(2) <= 1, op, ": ", name, " has stride ", t.stride(2),
                    " in its last dim (shape ", shape_str(t), ", strides ", strides_str(t),
                    "): head_dim must be contiguous (stride 1)");
}

// A packed tensor as fa4 takes it: rows and heads strides (a dim of size 1 gets the contiguous
// one, as in tensor_ref); batch_stride is not read.
fa4::TensorRef packed_ref(const at::Tensor& t) {
  const int64_t hs = t.size(1) == 1 ? t.size(2) : t.stride(1);
  const int64_t ss = t.size(0) == 1 ? hs * t.size(1) : t.stride(0);
  return {t.data_ptr(), 0, ss, hs};
}

// The varlen description of packed q and k with their cu_seqlens (checked by check_varlen_qkv).
fa4::Varlen varlen_of(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cu_seqlens_q,
                      const at::Tensor& cu_seqlens_k) {
  return {cu_seqlens_q.data_ptr<int32_t>(), cu_seqlens_k.data_ptr<int32_t>(), q.size(0), k.size(0)};
}

void check_cu_seqlens(const at::Tensor& cu, const char* op, const char* name, const at::Device& device) {
  check_int32_on(cu, op, name, device);
  FA4_CHECK_VALUE(cu.dim() == 1 && cu.size(0) >= 1, op, ": ", name, " has shape ", shape_str(cu),
                    ": must be 1-d [batch + 1]");
  FA4_CHECK_VALUE(cu.is_contiguous(), op, ": ", name, " has strides ", strides_str(cu), ": must be contiguous");
}

// The checks the varlen operators share: q, k, v packed and agreeing, the cu_seqlens; returns
// the problem (batch from cu_seqlens, the longest lengths as given).
fa4::Problem check_varlen_qkv(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                              const at::Tensor& cu_seqlens_q, const at::Tensor& cu_seqlens_k, int64_t max_seqlen_q,
                              int64_t max_seqlen_k, std::optional<double> softmax_scale, bool causal,
                              int64_t window_left, int64_t window_right, const char* op) {
  check_packed(q, op, "q", q.device());
  check_packed(k, op, "k", q.device());
  check_packed(v, op, "v", q.device());
  const fa4::DType dtype = dtype_of(q, op, "q");
  check_same_dtype(k, q, op, "k");
  check_same_dtype(v, q, op, "v");
  FA4_CHECK_VALUE(k.size(2) == q.size(2), op, ": k has shape ", shape_str(k), ", q has ", shape_str(q),
                    ": head_dim (dim 2) must match");
  const int64_t head_dim_v =
      check_v_like_k(v, k, op, "v", "k's shape but for its last dim: [total_k, heads_kv, head_dim_v]");
  check_cu_seqlens(cu_seqlens_q, op, "cu_seqlens_q", q.device());
  check_cu_seqlens(cu_seqlens_k, op, "cu_seqlens_k", q.device());
  FA4_CHECK_VALUE(cu_seqlens_k.size(0) == cu_seqlens_q.size(0), op, ": cu_seqlens_k has ",
                    cu_seqlens_k.size(0), " entries, cu_seqlens_q ", cu_seqlens_q.size(0),
                    ": both must be [batch + 1]");
  FA4_CHECK_VALUE(max_seqlen_q >= 0 && max_seqlen_k >= 0, op, ": max_seqlen_q = ", max_seqlen_q,
                    ", max_seqlen_k = ", max_seqlen_k, ": must be >= 0");
  fa4::Problem p;
  p.dtype = dtype;
  p.batch = cu_seqlens_q.size(0) - 1;
  p.seqlen_q = max_seqlen_q;
  p.seqlen_k = max_seqlen_k;
  p.heads_q = q.size(1);
  p.heads_kv = k.size(1);
  p.head_dim = q.size(2);
  p.head_dim_v = head_dim_v;
  set_options(p, softmax_scale, causal, window_left, window_right, op);
  return p;
}

std::tuple<at::Tensor, at::Tensor> fwd_varlen_op(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                 const at::Tensor& cu_seqlens_q, const at::Tensor& cu_seqlens_k,
                                                 int64_t max_seqlen_q, int64_t max_seqlen_k,
                                                 std::optional<double> softmax_scale, bool causal,
                                                 int64_t window_left, int64_t window_right, bool with_lse,
                                                 double softcap, const std::optional<at::Tensor>& seqused_k,
                                                 const std::optional<at::Tensor>& sink) {
  const char* op = "fa4::fwd_varlen";
  fa4::Problem p = check_varlen_qkv(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                    softmax_scale, causal, window_left, window_right, op);
  p.softcap = static_cast<float>(softcap);  // (validate() names a bad one)
  fa4::Varlen varlen = varlen_of(q, k, cu_seqlens_q, cu_seqlens_k);
  varlen.seqused_k = seqused_of(seqused_k, p.batch, q.device(), op, "cu_seqlens_q");
  const c10::cuda::CUDAGuard guard(q.device());
  at::Tensor out = at::empty({q.size(0), q.size(1), p.value_dim()}, q.options());
  const auto f32 = q.options().dtype(at::kFloat);
  at::Tensor lse = with_lse ? at::empty({p.heads_q, q.size(0)}, f32) : at::empty({0}, f32);
  return run_forward(p, packed_ref, q, k, v, out, lse, varlen, op, {}, sink_of(sink, p.heads_q, q.device(), op, "sink"));
}

// A paged cache with packed queries (vLLM's prefill and mixed batches): q [total_q, heads_q,
// head_dim] and cu_seqlens_q [batch + 1]; k_cache, v_cache and block_table as fwd_paged's, the
// table's rows the sequences'; cu_seqlens_k (optional) each sequence's key count, its offsets not
// read; out like q, lse [heads_q, total_q].
std::tuple<at::Tensor, at::Tensor> fwd_paged_varlen_op(
    const at::Tensor& q, const at::Tensor& k_pages, const at::Tensor& v_pages, const at::Tensor& block_table,
    const at::Tensor& cu_seqlens_q, int64_t max_seqlen_q, std::optional<double> softmax_scale, bool causal,
    int64_t window_left, int64_t window_right, bool with_lse, double softcap,
    const std::optional<at::Tensor>& seqused_k, const std::optional<at::Tensor>& cu_seqlens_k,
    const std::optional<at::Tensor>& sink) {
  const char* op = "fa4::fwd_paged_varlen";
  check_packed(q, op, "q", q.device());
  const fa4::DType dtype = dtype_of(q, op, "q");
  for (const auto& [t, name] : {std::pair{&k_pages, "k_cache"}, std::pair{&v_pages, "v_cache"}}) {
    check_tensor(*t, op, name, q.device());
    check_same_dtype(*t, q, op, name);
    FA4_CHECK_VALUE(t->dim() == 4, op, ": ", name, " has shape ", shape_str(*t),
                    ": must be 4-d [num_pages, page_size, heads_kv, head_dim]");
  }
  FA4_CHECK_VALUE(k_pages.size(3) == q.size(2), op, ": k_cache has shape ", shape_str(k_pages), ", q has ",
                  shape_str(q), ": head_dim must match");
  const int64_t head_dim_v = check_v_like_k(v_pages, k_pages, op, "v_cache",
                                            "k_cache's shape but for its last dim: [num_pages, page_size, heads_kv, "
                                            "head_dim_v]");
  check_cu_seqlens(cu_seqlens_q, op, "cu_seqlens_q", q.device());
  const int64_t batch = cu_seqlens_q.size(0) - 1;
  const fa4::PagedKV paged = paged_of(block_table, k_pages, batch, q.device(), op, "cu_seqlens_q");
  if (cu_seqlens_k.has_value()) {
    check_cu_seqlens(*cu_seqlens_k, op, "cu_seqlens_k", q.device());
    FA4_CHECK_VALUE(cu_seqlens_k->size(0) == batch + 1, op, ": cu_seqlens_k has ", cu_seqlens_k->size(0),
                    " entries, cu_seqlens_q ", batch + 1, ": both must be [batch + 1]");
  }
  FA4_CHECK_VALUE(max_seqlen_q >= 0, op, ": max_seqlen_q = ", max_seqlen_q, ": must be >= 0");
  fa4::Problem p;
  p.dtype = dtype;
  p.batch = batch;
  p.seqlen_q = max_seqlen_q;
  p.seqlen_k = block_table.size(1) * k_pages.size(1);  // each sequence's table row's keys
  p.heads_q = q.size(1);
  p.heads_kv = k_pages.size(2);
  p.head_dim = q.size(2);
  p.head_dim_v = head_dim_v;
  set_options(p, softmax_scale, causal, window_left, window_right, op);
  p.softcap = static_cast<float>(softcap);  // (validate() names a bad one)
  fa4::Varlen varlen{cu_seqlens_q.data_ptr<int32_t>(),
                     cu_seqlens_k.has_value() ? cu_seqlens_k->data_ptr<int32_t>() : nullptr, q.size(0), 0};
  varlen.seqused_k = seqused_of(seqused_k, p.batch, q.device(), op, "cu_seqlens_q");
  const c10::cuda::CUDAGuard guard(q.device());
  at::Tensor out = at::empty({q.size(0), q.size(1), p.value_dim()}, q.options());
  const auto f32 = q.options().dtype(at::kFloat);
  at::Tensor lse = with_lse ? at::empty({p.heads_q, q.size(0)}, f32) : at::empty({0}, f32);
  // q and out packed, the pools 4-d.
  auto ref = [](const at::Tensor& t) { return t.dim() == 3 ? packed_ref(t) : tensor_ref(t); };
  return run_forward(p, ref, q, k_pages, v_pages, out, lse, varlen, op, paged,
                     sink_of(sink, p.heads_q, q.device(), op, "sink"));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> bwd_varlen_op(
    const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
    const at::Tensor& lse, const at::Tensor& cu_seqlens_q, const at::Tensor& cu_seqlens_k, int64_t max_seqlen_q,
    int64_t max_seqlen_k, std::optional<double> softmax_scale, bool causal, int64_t window_left,
    int64_t window_right, bool deterministic, double softcap, const std::optional<at::Tensor>& sink,
    const std::optional<at::Tensor>& dsink) {
  const char* op = "fa4::bwd_varlen";
  fa4::Problem p = check_varlen_qkv(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                    softmax_scale, causal, window_left, window_right, op);
  p.softcap = static_cast<float>(softcap);
  check_packed(out, op, "out", q.device());
  check_packed(dout, op, "dout", q.device());
  check_same_dtype(out, q, op, "out");
  check_same_dtype(dout, q, op, "dout");
  const std::vector<int64_t> o_shape = {q.size(0), q.size(1), p.value_dim()};
  check_shape(out, o_shape, op, "out", "[total_q, heads_q, v's head_dim]");
  check_shape(dout, o_shape, op, "dout", "[total_q, heads_q, v's head_dim]");
  check_lse(lse, q, {p.heads_q, q.size(0)}, "[heads_q, total_q]", op);

  const c10::cuda::CUDAGuard guard(q.device());
  return run_backward(p, packed_ref, dout, q, k, v, out, lse, deterministic,
                      varlen_of(q, k, cu_seqlens_q, cu_seqlens_k), op, sink_of(sink, p.heads_q, q.device(), op, "sink"),
                      sink_of(dsink, p.heads_q, q.device(), op, "dsink"));
}

// New keys and values into a KV cache in place (fa4::append_kv): k_cache, v_cache [batch,
// seqlen_cache, heads_kv, head_dim], or pools with block_table; k, v [batch, seqlen_new, heads_kv,
// head_dim]; entry b's rows from cache_seqlens[b] (int32 [batch]) or cache_seqlen. With rotary_cos
// and rotary_sin ([seqlen_ro, rotary_dim / 2], q's dtype) k is rotated on the way in and q into
// q_rotated (a new tensor; empty [0] without rotary). Returns it and seqused_k, int32 [batch]: each
// entry's keys after the append.
// What append_kv and fwd_kvcache share: the checks, the append (fa4::append_kv) on q's current
// stream, and what the attention after it needs: q_rotated (empty [0] without rotary), seqused_k
// (int32 [batch], the keys after the append), the problem (seqlen_k the cache's rows an entry) and
// the pages.
struct Appended {
  at::Tensor q_rotated, used;
  fa4::Problem p;
  fa4::PagedKV paged;
};
Appended append_into(const char* op, const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                     const at::Tensor& k, const at::Tensor& v, const std::optional<at::Tensor>& cache_seqlens,
                     int64_t cache_seqlen, const std::optional<at::Tensor>& block_table,
                     const std::optional<at::Tensor>& rotary_cos, const std::optional<at::Tensor>& rotary_sin,
                     bool rotary_interleaved, bool causal, int64_t window_left, int64_t window_right) {
  check_three(q, k_cache, v_cache, op, "k_cache", "v_cache");
  check_tensor(k, op, "k", q.device());
  check_tensor(v, op, "v", q.device());
  check_same_dtype(k, q, op, "k");
  check_same_dtype(v, q, op, "v");
  check_shape(v, shape_of(k), op, "v", "k's shape: [batch, seqlen_new, heads_kv, head_dim]");
  check_shape(v_cache, shape_of(k_cache), op, "v_cache", "k_cache's shape");
  const int64_t batch = q.size(0);
  FA4_CHECK_VALUE(k.size(0) == batch && k.size(3) == q.size(3) && k_cache.size(2) == k.size(2) &&
                      k_cache.size(3) == k.size(3),
                  op, ": k has shape ", shape_str(k), ", q ", shape_str(q), ", k_cache ", shape_str(k_cache),
                  ": k's batch must be q's, its heads_kv and head_dim the cache's");
  Appended r;
  fa4::AppendArgs a;
  fa4::Problem& p = a.problem;
  p.dtype = dtype_of(q, op, "q");
  p.batch = batch;
  p.seqlen_q = q.size(1);
  p.heads_q = q.size(2);
  p.heads_kv = k.size(2);
  p.head_dim = q.size(3);
  set_options(p, std::nullopt, causal, window_left, window_right, op);
  if (block_table.has_value()) {
    a.paged = paged_of(*block_table, k_cache, batch, q.device(), op, "q");
    p.seqlen_k = block_table->size(1) * k_cache.size(1);
  } else {
    FA4_CHECK_VALUE(k_cache.size(0) == batch, op, ": k_cache has shape ", shape_str(k_cache), ", q ", shape_str(q),
                    ": batch (dim 0) must match");
    p.seqlen_k = k_cache.size(1);
  }
  a.seqlen_new = k.size(1);
  a.k_new = tensor_ref(k);
  a.v_new = tensor_ref(v);
  a.k_cache = tensor_ref(k_cache);
  a.v_cache = tensor_ref(v_cache);
  if (cache_seqlens.has_value()) {
    const at::Tensor& lens = *cache_seqlens;
    check_int32_on(lens, op, "cache_seqlens", q.device());
    FA4_CHECK_VALUE(lens.dim() == 1 && lens.size(0) == batch && lens.is_contiguous(), op,
                    ": cache_seqlens has shape ", shape_str(lens), " and strides ", strides_str(lens),
                    ": must be contiguous [batch] (batch = ", batch, ", from q)");
    a.cache_seqlens = lens.data_ptr<int32_t>();
  }
  a.cache_seqlen = cache_seqlen;
  const c10::cuda::CUDAGuard guard(q.device());
  r.used = at::empty({batch}, q.options().dtype(at::kInt));
  a.seqused_k = r.used.data_ptr<int32_t>();
  r.q_rotated = at::empty({0}, q.options());
  if (rotary_cos.has_value() || rotary_sin.has_value()) {
    FA4_CHECK_VALUE(rotary_cos.has_value() && rotary_sin.has_value(), op,
                    ": rotary_cos and rotary_sin: give both or neither");
    const at::Tensor& cos = *rotary_cos;
    const at::Tensor& sin = *rotary_sin;
    for (const auto& [t, name] : {std::pair{&cos, "rotary_cos"}, std::pair{&sin, "rotary_sin"}}) {
      FA4_CHECK_VALUE(t->is_cuda() && t->device() == q.device(), op, ": ", name, " must be a CUDA tensor on q's device");
      check_same_dtype(*t, q, op, name);
      FA4_CHECK_VALUE(t->dim() == 2 && t->is_contiguous(), op, ": ", name, " has shape ", shape_str(*t),
                      " and strides ", strides_str(*t), ": must be contiguous [seqlen_ro, rotary_dim / 2]");
    }
    check_shape(sin, shape_of(cos), op, "rotary_sin", "rotary_cos's shape: [seqlen_ro, rotary_dim / 2]");
    r.q_rotated = at::empty(q.sizes(), q.options());
    a.rotary = {cos.data_ptr(), sin.data_ptr(), cos.size(0), 2 * cos.size(1), rotary_interleaved};
    a.q = tensor_ref(q);
    a.q_rotated = tensor_ref(r.q_rotated);
  }
  raise_if_error(fa4::append_kv(a, c10::cuda::getCurrentCUDAStream(q.device().index()).stream()), op);
  r.p = p;
  r.paged = a.paged;
  return r;
}

// New keys and values into a KV cache in place (fa4::append_kv): k_cache, v_cache [batch,
// seqlen_cache, heads_kv, head_dim], or pools with block_table; k, v [batch, seqlen_new, heads_kv,
// head_dim]; entry b's rows from cache_seqlens[b] (int32 [batch]) or cache_seqlen. With rotary_cos
// and rotary_sin ([seqlen_ro, rotary_dim / 2], q's dtype) k is rotated on the way in and q into
// q_rotated (a new tensor; empty [0] without rotary). Returns it and seqused_k, int32 [batch]: each
// entry's keys after the append.
std::tuple<at::Tensor, at::Tensor> append_kv_op(const at::Tensor& q, at::Tensor k_cache, at::Tensor v_cache,
                                                const at::Tensor& k, const at::Tensor& v,
                                                const std::optional<at::Tensor>& cache_seqlens, int64_t cache_seqlen,
                                                const std::optional<at::Tensor>& block_table,
                                                const std::optional<at::Tensor>& rotary_cos,
                                                const std::optional<at::Tensor>& rotary_sin, bool rotary_interleaved,
                                                bool causal, int64_t window_left, int64_t window_right) {
  const Appended r = append_into("fa4::append_kv", q, k_cache, v_cache, k, v, cache_seqlens, cache_seqlen, block_table,
                                 rotary_cos, rotary_sin, rotary_interleaved, causal, window_left, window_right);
  return {r.q_rotated, r.used};
}

// Rows of a page a cache entry is read as under cache_batch_idx: the largest power of two dividing
// seqlen_cache, at most kBatchIdxPageMax (the paged decoding's measured pages), at least 16.
constexpr int64_t kBatchIdxPageMax = 256;

// cache_batch_idx (int32 [batch] on q's device): the caches [batch_cache, seqlen_cache, heads_kv,
// head_dim] as pools of pages over their own memory, and the block table that gives batch entry b
// the pages of cache entry idx[b] (one launch: a kept row of page numbers plus per x idx).
struct Pools {
  at::Tensor k, v, table;
};
Pools pages_of_batch_idx(const char* op, const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                         const at::Tensor& idx) {
  check_int32_on(idx, op, "cache_batch_idx", q.device());
  FA4_CHECK_VALUE(idx.dim() == 1 && idx.size(0) == q.size(0) && idx.is_contiguous(), op, ": cache_batch_idx has shape ",
                  shape_str(idx), " and strides ", strides_str(idx), ": must be contiguous [batch] (batch = ",
                  q.size(0), ", from q)");
  check_tensor(k_cache, op, "k_cache", q.device());
  check_tensor(v_cache, op, "v_cache", q.device());
  check_shape(v_cache, shape_of(k_cache), op, "v_cache", "k_cache's shape");
  const int64_t s = k_cache.size(1);
  const int64_t page = std::min(s & -s, kBatchIdxPageMax);
  TORCH_CHECK_NOT_IMPLEMENTED(page >= 16, cat(op, ": cache_batch_idx with seqlen_cache = ", s,
                                              ": needs seqlen_cache a multiple of 16 (the cache is read as pages of 16 "
                                              "rows or more)"));
  Pools r;
  for (const auto& [t, out, name] :
       {std::tuple{&k_cache, &r.k, "k_cache"}, std::tuple{&v_cache, &r.v, "v_cache"}}) {
    TORCH_CHECK_NOT_IMPLEMENTED(t->size(0) <= 1 || t->stride(0) == s * t->stride(1),
                                cat(op, ": cache_batch_idx with ", name, " strides ", strides_str(*t),
                                    ": needs each entry's rows one after another (batch stride = seqlen_cache x row "
                                    "stride, as in a BSHD cache)"));
    *out = t->as_strided({t->size(0) * (s / page), page, t->size(2), t->size(3)},
                         {page * t->stride(1), t->stride(1), t->stride(2), 1});
  }
  const int64_t per = s / page;
  // The row of page numbers is kept a device and length; under CUDA graph capture it is made in the
  // graph instead (a row made there is filled only when the graph replays, so it cannot be kept).
  static thread_local std::vector<std::pair<std::pair<c10::Device, int64_t>, at::Tensor>> rows;
  const bool capturing = c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None;
  at::Tensor first;
  for (const auto& [key, row] : rows)
    if (!capturing && key.first == q.device() && key.second == per) first = row;
  if (!first.defined()) {
    first = at::arange(per, q.options().dtype(at::kInt));
    if (!capturing) rows.push_back({{q.device(), per}, first});
  }
  r.table = at::add(first, idx.view({-1, 1}), per);
  return r;
}

// flash_attn_with_kvcache's call with k and v, cache_batch_idx or cache_leftpad, in one operator:
// append_kv where k and v are given, then the forward over each entry's keys (the batched or paged
// kernels with seqused_k; with one length for every entry, the first cache_seqlen keys, -1: all)
// with q rotated where rotary is given. No Python runs between the launches. cache_leftpad (int32
// [batch], contiguous caches only): entry b's keys start at its cache row cache_leftpad[b]
// (fa4::Varlen::leftpad_k); the append and the rotary positions are the cache rows as without it.
std::tuple<at::Tensor, at::Tensor> fwd_kvcache_op(
    const at::Tensor& q, at::Tensor k_cache, at::Tensor v_cache, const std::optional<at::Tensor>& k,
    const std::optional<at::Tensor>& v, const std::optional<at::Tensor>& cache_seqlens, int64_t cache_seqlen,
    const std::optional<at::Tensor>& block_table, const std::optional<at::Tensor>& rotary_cos,
    const std::optional<at::Tensor>& rotary_sin, bool rotary_interleaved, std::optional<double> softmax_scale,
    bool causal, int64_t window_left, int64_t window_right, bool with_lse, double softcap,
    const std::optional<at::Tensor>& cache_batch_idx, const std::optional<at::Tensor>& cache_leftpad,
    const std::optional<at::Tensor>& sink) {
  const char* op = "fa4::fwd_kvcache";
  const float* sinks = sink_of(sink, q.size(2), q.device(), op, "sink");
  std::optional<at::Tensor> table = block_table;
  if (cache_leftpad.has_value()) {
    TORCH_CHECK_NOT_IMPLEMENTED(!block_table.has_value() && !cache_batch_idx.has_value(),
                                cat(op, ": cache_leftpad with ", block_table.has_value() ? "block_table" : "cache_batch_idx",
                                    ": not implemented (a left pad needs contiguous caches, each entry its own)"));
  }
  const int32_t* leftpad = seqused_of(cache_leftpad, q.size(0), q.device(), op, "q", "cache_leftpad");
  if (cache_batch_idx.has_value()) {
    FA4_CHECK_VALUE(!block_table.has_value(), op, ": cache_batch_idx with block_table: give one of them");
    Pools pools = pages_of_batch_idx(op, q, k_cache, v_cache, *cache_batch_idx);
    k_cache = pools.k, v_cache = pools.v, table = pools.table;
  }
  FA4_CHECK_VALUE(k.has_value() == v.has_value(), op, ": k and v: give both or neither");
  if (!k.has_value()) {  // no append: the caches as they are
    FA4_CHECK_VALUE(!rotary_cos.has_value() && !rotary_sin.has_value(), op,
                    ": rotary_cos and rotary_sin apply with k and v only");
    check_three(q, k_cache, v_cache, op, "k_cache", "v_cache");
    check_shape(v_cache, shape_of(k_cache), op, "v_cache", "k_cache's shape");
    fa4::Problem p = make_problem(q, k_cache, softmax_scale, causal, window_left, window_right, op);
    p.softcap = static_cast<float>(softcap);
    fa4::PagedKV paged;
    if (table.has_value()) {
      paged = paged_of(*table, k_cache, q.size(0), q.device(), op, "q");
      p.seqlen_k = table->size(1) * k_cache.size(1);
    } else {
      FA4_CHECK_VALUE(k_cache.size(0) == q.size(0), op, ": k_cache has shape ", shape_str(k_cache), ", q ",
                      shape_str(q), ": batch (dim 0) must match");
    }
    fa4::Varlen entries;
    entries.seqused_k = seqused_of(cache_seqlens, p.batch, q.device(), op, "q");
    entries.leftpad_k = leftpad;
    if (!cache_seqlens.has_value() && cache_seqlen >= 0) {
      FA4_CHECK_VALUE(cache_seqlen <= p.seqlen_k, op, ": cache_seqlens = ", cache_seqlen, ": must be in [0, ",
                      p.seqlen_k, "] (the cache's rows an entry)");
      p.seqlen_k = cache_seqlen;  // the first keys (the table's first pages)
    }
    return batched_forward(p, q, k_cache, v_cache, with_lse, entries, op, paged, sinks);
  }
  Appended r = append_into(op, q, k_cache, v_cache, *k, *v, cache_seqlens, cache_seqlen, table, rotary_cos,
                           rotary_sin, rotary_interleaved, causal, window_left, window_right);
  fa4::Problem& p = r.p;
  set_options(p, softmax_scale, causal, window_left, window_right, op);
  p.softcap = static_cast<float>(softcap);  // (validate() names a bad one)
  fa4::Varlen entries;
  entries.leftpad_k = leftpad;
  if (r.paged.enabled() || cache_seqlens.has_value())
    entries.seqused_k = r.used.data_ptr<int32_t>();
  else
    p.seqlen_k = cache_seqlen + k->size(1);  // (append_kv checked that it fits)
  return batched_forward(p, r.q_rotated.numel() ? r.q_rotated : q, k_cache, v_cache, with_lse, entries, op, r.paged,
                         sinks);
}

}  // namespace

TORCH_LIBRARY(fa4, m) {
  // The fake kernels are registered by the Python package `fa4` (python/fa4/__init__.py).
  m.set_python_module("fa4");
  m.def(
      "fwd(Tensor q, Tensor k, Tensor v, float? softmax_scale, bool causal, int window_left, "
      "int window_right, bool with_lse=True, float softcap=0.0, Tensor? seqused_k=None, Tensor? sink=None) -> "
      "(Tensor out, Tensor lse)");
  m.def(
      "fwd_fp8(Tensor q, Tensor k, Tensor v, float? softmax_scale, bool causal, int window_left, "
      "int window_right, bool with_lse=True, Tensor? q_descale=None, Tensor? k_descale=None, "
      "Tensor? v_descale=None) -> (Tensor out, Tensor lse)");
  m.def(
      "fwd_paged(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_table, float? softmax_scale, bool causal, "
      "int window_left, int window_right, bool with_lse=True, float softcap=0.0, Tensor? seqused_k=None) -> "
      "(Tensor out, Tensor lse)");
  m.def(
      "bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, "
      "float? softmax_scale, bool causal, int window_left, int window_right, bool deterministic, "
      "float softcap=0.0, Tensor? sink=None, Tensor(a!)? dsink=None) -> (Tensor dq, Tensor dk, Tensor dv)");
  m.def(
      "fwd_varlen(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, int max_seqlen_q, "
      "int max_seqlen_k, float? softmax_scale, bool causal, int window_left, int window_right, "
      "bool with_lse=True, float softcap=0.0, Tensor? seqused_k=None, Tensor? sink=None) -> (Tensor out, "
      "Tensor lse)");
  m.def(
      "fwd_paged_varlen(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_table, Tensor cu_seqlens_q, "
      "int max_seqlen_q, float? softmax_scale, bool causal, int window_left, int window_right, "
      "bool with_lse=True, float softcap=0.0, Tensor? seqused_k=None, Tensor? cu_seqlens_k=None, "
      "Tensor? sink=None) -> (Tensor out, Tensor lse)");
  m.def(
      "bwd_varlen(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor cu_seqlens_q, "
      "Tensor cu_seqlens_k, int max_seqlen_q, int max_seqlen_k, float? softmax_scale, bool causal, "
      "int window_left, int window_right, bool deterministic, float softcap=0.0, Tensor? sink=None, "
      "Tensor(a!)? dsink=None) -> (Tensor dq, Tensor dk, Tensor dv)");
  m.def(
      "append_kv(Tensor q, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor k, Tensor v, Tensor? cache_seqlens, "
      "int cache_seqlen, Tensor? block_table, Tensor? rotary_cos, Tensor? rotary_sin, bool rotary_interleaved, "
      "bool causal, int window_left, int window_right) -> (Tensor q_rotated, Tensor seqused_k)");
  m.def(
      "fwd_kvcache(Tensor q, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor? k, Tensor? v, Tensor? cache_seqlens, "
      "int cache_seqlen, Tensor? block_table, Tensor? rotary_cos, Tensor? rotary_sin, bool rotary_interleaved, "
      "float? softmax_scale, bool causal, int window_left, int window_right, bool with_lse=True, "
      "float softcap=0.0, Tensor? cache_batch_idx=None, Tensor? cache_leftpad=None, Tensor? sink=None) -> "
      "(Tensor out, Tensor lse)");
}

TORCH_LIBRARY_IMPL(fa4, CUDA, m) {
  m.impl("fwd", &fwd_op);
  m.impl("fwd_fp8", &fwd_fp8_op);
  m.impl("fwd_paged", &fwd_paged_op);
  m.impl("bwd", &bwd_op);
  m.impl("fwd_varlen", &fwd_varlen_op);
  m.impl("fwd_paged_varlen", &fwd_paged_varlen_op);
  m.impl("bwd_varlen", &bwd_varlen_op);
  m.impl("append_kv", &append_kv_op);
  m.impl("fwd_kvcache", &fwd_kvcache_op);
}

// CPU tensors reach the same checks, which answer with a ValueError naming the tensor (instead of
// the dispatcher's "no kernel for CPU").
TORCH_LIBRARY_IMPL(fa4, CPU, m) {
  m.impl("fwd", &fwd_op);
  m.impl("fwd_fp8", &fwd_fp8_op);
  m.impl("fwd_paged", &fwd_paged_op);
  m.impl("bwd", &bwd_op);
  m.impl("fwd_varlen", &fwd_varlen_op);
  m.impl("fwd_paged_varlen", &fwd_paged_varlen_op);
  m.impl("bwd_varlen", &bwd_varlen_op);
  m.impl("append_kv", &append_kv_op);
  m.impl("fwd_kvcache", &fwd_kvcache_op);
}
