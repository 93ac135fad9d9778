// cuDNN's fused attention on packed variable-length batches, as a peer for bench/varlen.py.
//
// torch reaches cuDNN's ragged attention only through a path that builds its graph again on every
// call (45-73 ms of host time a call), so varlen had no cuDNN ratio. This library builds cuDNN's
// SDPA graphs once (cudnn_frontend, ragged offsets over [total, heads, d] tensors, a padding mask
// from the sequence lengths) and runs them from Python through ctypes, on torch's stream; the
// caller owns every buffer. Built only when asked (FA4_BUILD_CUDNN_PEER, with the frontend's
// headers): it is a benchmark peer, not part of the library.
#include <cudnn_frontend.h>

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>

namespace fe = cudnn_frontend;

namespace {

thread_local std::string last_error;

enum Uid : int64_t {
  kQ = 1, kK, kV, kO, kStats, kDout, kDq, kDk, kDv,
  kSeqQ, kSeqK, kOffQ, kOffK, kOffStats,
};

struct Peer {
  cudnnHandle_t handle = nullptr;
  std::shared_ptr<fe::graph::Graph> fwd, bwd;
  int64_t workspace = 0;
  ~Peer() {
    if (handle) cudnnDestroy(handle);
  }
};

// The tensors both graphs share: Q, K, V (and O, dO, dQ, dK, dV) as [batch, heads, max_len, d]
// views of packed [total, heads, d] rows, each sequence found by its ragged offset (elements).
struct Shape {
  int64_t batch, heads_q, heads_k, d, max_q, max_k;
  std::vector<int64_t> q_dim() const { return {batch, heads_q, max_q, d}; }
  std::vector<int64_t> k_dim() const { return {batch, heads_k, max_k, d}; }
  std::vector<int64_t> q_stride() const { return {max_q * heads_q * d, d, heads_q * d, 1}; }
  std::vector<int64_t> k_stride() const { return {max_k * heads_k * d, d, heads_k * d, 1}; }
};

using TensorPtr = std::shared_ptr<fe::graph::Tensor_attributes>;

TensorPtr index_tensor(fe::graph::Graph& g, int64_t uid, const char* name, int64_t rows,
                       fe::DataType_t type) {
  return g.tensor(fe::graph::Tensor_attributes().set_uid(uid).set_name(name).set_dim({rows, 1, 1, 1})
                      .set_stride({1, 1, 1, 1}).set_data_type(type));
}

struct Common {
  TensorPtr q, k, v, seq_q, seq_k, off_q, off_k, off_stats;
};

Common declare(fe::graph::Graph& g, const Shape& s) {
  Common c;
  c.seq_q = index_tensor(g, kSeqQ, "seq_q", s.batch, fe::DataType_t::INT32);
  c.seq_k = index_tensor(g, kSeqK, "seq_k", s.batch, fe::DataType_t::INT32);
  c.off_q = index_tensor(g, kOffQ, "off_q", s.batch + 1, fe::DataType_t::INT64);
  c.off_k = index_tensor(g, kOffK, "off_k", s.batch + 1, fe::DataType_t::INT64);
  c.off_stats = index_tensor(g, kOffStats, "off_stats", s.batch + 1, fe::DataType_t::INT64);
  auto data = [&](int64_t uid, const char* name, bool query, const TensorPtr& off) {
    return g.tensor(fe::graph::Tensor_attributes().set_uid(uid).set_name(name)
                        .set_dim(query ? s.q_dim() : s.k_dim())
                        .set_stride(query ? s.q_stride() : s.k_stride())
                        .set_ragged_offset(off));
  };
  c.q = data(kQ, "Q", true, c.off_q);
  c.k = data(kK, "K", false, c.off_k);
  c.v = data(kV, "V", false, c.off_k);
  return c;
}

// LSE rows per token, heads innermost ([total_q, heads_q] floats), as cuDNN's packed path wants.
TensorPtr& as_stats(TensorPtr& t, const Shape& s, const TensorPtr& off) {
  t->set_uid(kStats).set_dim({s.batch, s.heads_q, s.max_q, 1}).set_stride({s.max_q * s.heads_q, 1, s.heads_q, 1})
      .set_data_type(fe::DataType_t::FLOAT).set_ragged_offset(off);
  return t;
}

void set_out(const TensorPtr& t, int64_t uid, const std::vector<int64_t>& dim, const std::vector<int64_t>& stride,
             const TensorPtr& off) {
  t->set_output(true).set_uid(uid).set_dim(dim).set_stride(stride).set_ragged_offset(off);
}

std::string finish(fe::graph::Graph& g, cudnnHandle_t h, int64_t& workspace) {
  for (auto step : {+[](fe::graph::Graph& x, cudnnHandle_t) { return x.validate(); },
                    +[](fe::graph::Graph& x, cudnnHandle_t y) { return x.build_operation_graph(y); },
                    +[](fe::graph::Graph& x, cudnnHandle_t) { return x.create_execution_plans({fe::HeurMode_t::A}); },
                    +[](fe::graph::Graph& x, cudnnHandle_t y) { return x.check_support(y); },
                    +[](fe::graph::Graph& x, cudnnHandle_t y) { return x.build_plans(y); }}) {
    auto e = step(g, h);
    if (e.is_bad()) return e.get_message();
  }
  int64_t bytes = 0;
  if (auto e = g.get_workspace_size(bytes); e.is_bad()) return e.get_message();
  workspace = std::max(workspace, bytes);
  return {};
}

std::shared_ptr<fe::graph::Graph> new_graph(bool fp16) {
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(fp16 ? fe::DataType_t::HALF : fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  return g;
}

int fail(std::string message) {
  last_error = std::move(message);
  return 1;
}

int run(const Peer* p, const std::shared_ptr<fe::graph::Graph>& g, std::unordered_map<int64_t, void*>& pack,
        void* workspace, void* stream) {
  if (!p || !g) return fail("no such graph: create the peer with backward=1 to run its backward");
  if (cudnnSetStream(p->handle, static_cast<cudaStream_t>(stream)) != CUDNN_STATUS_SUCCESS)
    return fail("cudnnSetStream failed");
  if (auto e = g->execute(p->handle, pack, workspace); e.is_bad()) return fail(e.get_message());
  return 0;
}

}  // namespace

extern "C" {

const char* fa4_cudnn_peer_error() { return last_error.c_str(); }

// causal: 0 none, 1 top-left, 2 bottom-right (fa4's). Returns 0, or 1 with the reason in
// fa4_cudnn_peer_error() (cuDNN declines the configuration, say).
int fa4_cudnn_peer_create(void** out, int backward, int64_t batch, int64_t heads_q, int64_t heads_k, int64_t d,
                          int fp16, int64_t max_q, int64_t max_k, int causal, float scale, int64_t* workspace) {
  *out = nullptr;
  auto p = std::make_unique<Peer>();
  if (cudnnCreate(&p->handle) != CUDNN_STATUS_SUCCESS) return fail("cudnnCreate failed");
  const Shape s{batch, heads_q, heads_k, d, max_q, max_k};
  auto mask = [&](auto& attrs) {
    attrs.set_attn_scale(scale).set_padding_mask(true);
    if (causal == 1) attrs.set_causal_mask(true);
    if (causal == 2) attrs.set_causal_mask_bottom_right(true);
  };
  {
    p->fwd = new_graph(fp16);
    auto c = declare(*p->fwd, s);
    auto attrs = fe::graph::SDPA_attributes().set_name("fwd").set_generate_stats(true);
    mask(attrs);
    attrs.set_seq_len_q(c.seq_q).set_seq_len_kv(c.seq_k);
    auto [o, stats] = p->fwd->sdpa(c.q, c.k, c.v, attrs);
    set_out(o, kO, s.q_dim(), s.q_stride(), c.off_q);
    as_stats(stats, s, c.off_stats)->set_output(true);
    if (auto m = finish(*p->fwd, p->handle, p->workspace); !m.empty()) return fail("forward: " + m);
  }
  if (backward) {
    p->bwd = new_graph(fp16);
    auto c = declare(*p->bwd, s);
    auto o = p->bwd->tensor(fe::graph::Tensor_attributes().set_uid(kO).set_name("O").set_dim(s.q_dim())
                                .set_stride(s.q_stride()).set_ragged_offset(c.off_q));
    auto dout = p->bwd->tensor(fe::graph::Tensor_attributes().set_uid(kDout).set_name("dO").set_dim(s.q_dim())
                                   .set_stride(s.q_stride()).set_ragged_offset(c.off_q));
    auto stats = p->bwd->tensor(fe::graph::Tensor_attributes().set_name("stats"));
    as_stats(stats, s, c.off_stats);
    auto attrs = fe::graph::SDPA_backward_attributes().set_name("bwd");
    mask(attrs);
    attrs.set_seq_len_q(c.seq_q).set_seq_len_kv(c.seq_k);
    auto [dq, dk, dv] = p->bwd->sdpa_backward(c.q, c.k, c.v, o, dout, stats, attrs);
    set_out(dq, kDq, s.q_dim(), s.q_stride(), c.off_q);
    set_out(dk, kDk, s.k_dim(), s.k_stride(), c.off_k);
    set_out(dv, kDv, s.k_dim(), s.k_stride(), c.off_k);
    if (auto m = finish(*p->bwd, p->handle, p->workspace); !m.empty()) return fail("backward: " + m);
  }
  *workspace = p->workspace;
  *out = p.release();
  return 0;
}

void fa4_cudnn_peer_destroy(void* peer) { delete static_cast<Peer*>(peer); }

// seq_q/seq_k: int32 [batch] lengths; off_q/off_k/off_stats: int64 [batch + 1] element offsets of
// each sequence in Q (and O, dO, dQ), K (V, dK, dV) and the stats.
int fa4_cudnn_peer_forward(void* peer, const void* q, const void* k, const void* v, void* o, void* stats,
                           const void* seq_q, const void* seq_k, const void* off_q, const void* off_k,
                           const void* off_stats, void* workspace, void* stream) {
  auto* p = static_cast<Peer*>(peer);
  std::unordered_map<int64_t, void*> pack{
      {kQ, const_cast<void*>(q)}, {kK, const_cast<void*>(k)}, {kV, const_cast<void*>(v)}, {kO, o},
      {kStats, stats}, {kSeqQ, const_cast<void*>(seq_q)}, {kSeqK, const_cast<void*>(seq_k)},
      {kOffQ, const_cast<void*>(off_q)}, {kOffK, const_cast<void*>(off_k)},
      {kOffStats, const_cast<void*>(off_stats)}};
  return run(p, p ? p->fwd : nullptr, pack, workspace, stream);
}

int fa4_cudnn_peer_backward(void* peer, const void* q, const void* k, const void* v, const void* o,
                            const void* dout, const void* stats, void* dq, void* dk, void* dv, const void* seq_q,
                            const void* seq_k, const void* off_q, const void* off_k, const void* off_stats,
                            void* workspace, void* stream) {
  auto* p = static_cast<Peer*>(peer);
  std::unordered_map<int64_t, void*> pack{
      {kQ, const_cast<void*>(q)}, {kK, const_cast<void*>(k)}, {kV, const_cast<void*>(v)},
      {kO, const_cast<void*>(o)}, {kDout, const_cast<void*>(dout)}, {kStats, const_cast<void*>(stats)},
      {kDq, dq}, {kDk, dk}, {kDv, dv}, {kSeqQ, const_cast<void*>(seq_q)}, {kSeqK, const_cast<void*>(seq_k)},
      {kOffQ, const_cast<void*>(off_q)}, {kOffK, const_cast<void*>(off_k)},
      {kOffStats, const_cast<void*>(off_stats)}};
  return run(p, p ? p->bwd : nullptr, pack, workspace, stream);
}

}  // extern "C"
