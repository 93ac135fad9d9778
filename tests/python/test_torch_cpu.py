"""fa4's PyTorch layer where no GPU is needed (CI runs this; so does the GPU machine):

- the extension loads and registers torch.ops.fa4.fwd / bwd;
- CPU tensors are refused with a ValueError naming the tensor;
- the fake kernels give the outputs' shapes and dtypes (GQA included) and refuse bad shapes;
- flash_attn_func's own argument checks (softcap's type, window_size);
- autograd and torch.compile(fullgraph=True) reach the operators: traced and run on meta tensors,
  which take the fake kernels;
- flash-attn's other keywords (dropout_p, alibi_slopes refused; return_attn_probs) and its packed
  forms (qkv, kv) as views, gradients into the packed tensor;
- fa4.scaled_dot_product_attention: BHSD in and out, PyTorch's top-left causal mapped to fa4's
  masks, and its refusals (attn_mask, dropout, heads without enable_gqa, causal with fewer queries
  than keys).

Needs the built extension: `bash python/build.sh`, or FA4_TORCH_LIB naming a fa4_C.so (the ctest
`python.torch_layer_without_gpu` builds one from the tree's libfa4.a).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))
import fa4  # noqa: E402


def meta(*shape, dtype=torch.bfloat16, grad=False):
    return torch.empty(*shape, device="meta", dtype=dtype, requires_grad=grad)


def fa4_calls(fn):
    """fn's result, and the fa4 operators it reached with their arguments, in order."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Record(TorchDispatchMode):
        calls = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.calls.append((str(func), args))
            return func(*args, **(kwargs or {}))

    Record.calls = []
    with Record():
        out = fn()
    return out, [(n, a) for n, a in Record.calls if n.startswith("fa4.")]


def test_operators_are_registered():
    assert hasattr(torch.ops.fa4, "fwd") and hasattr(torch.ops.fa4, "bwd")
    fwd = str(torch.ops.fa4.fwd.default._schema)
    bwd = str(torch.ops.fa4.bwd.default._schema)
    assert "float? softmax_scale" in fwd and "int window_left" in fwd
    assert "bool deterministic" in bwd


def test_cpu_tensors_are_refused_naming_the_tensor():
    q = torch.randn(1, 8, 2, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"fa4::fwd: q is on cpu: must be a CUDA tensor"):
        fa4.flash_attn_func(q, q, q)
    with pytest.raises(ValueError, match=r"fa4::bwd: q is on cpu: must be a CUDA tensor"):
        lse = torch.zeros(1, 2, 8)
        torch.ops.fa4.bwd(q, q, q, q, q, lse, None, False, -1, -1, False)


def test_fake_kernels_give_shapes_and_dtypes():
    q, k = meta(2, 100, 8, 128), meta(2, 300, 2, 128)
    out, lse = torch.ops.fa4.fwd(q, k, k, None, True, -1, -1)
    assert out.shape == (2, 100, 8, 128) and out.dtype == torch.bfloat16
    assert lse.shape == (2, 8, 100) and lse.dtype == torch.float32
    dq, dk, dv = torch.ops.fa4.bwd(out, q, k, k, out, lse, None, True, -1, -1, False)
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == k.shape
    assert dq.dtype == dk.dtype == dv.dtype == torch.bfloat16
    h = meta(1, 17, 4, 64, dtype=torch.float16)
    out16, _ = torch.ops.fa4.fwd(h, h, h, 0.5, False, 3, 0)
    assert out16.dtype == torch.float16 and out16.shape == h.shape


def test_fake_kernels_take_v_with_a_head_dim_of_its_own():
    # DeepSeek's 192 / 128 (fa4::Problem::head_dim_v): out and dout are v's width, dq and dk q's.
    q, k, v = meta(2, 100, 8, 192, grad=True), meta(2, 300, 2, 192, grad=True), meta(2, 300, 2, 128, grad=True)
    out, lse = torch.ops.fa4.fwd(q, k, v, None, True, -1, -1)
    assert out.shape == (2, 100, 8, 128) and lse.shape == (2, 8, 100)
    dq, dk, dv = torch.ops.fa4.bwd(out, q, k, v, out, lse, None, True, -1, -1, False)
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
    o = fa4.flash_attn_func(q, k, v, causal=True)
    assert o.shape == (2, 100, 8, 128)
    gq, gk, gv = torch.autograd.grad(o.sum(), (q, k, v))
    assert gq.shape == q.shape and gk.shape == k.shape and gv.shape == v.shape
    pq, pk, pv = meta(300, 8, 64), meta(500, 2, 64), meta(500, 2, 96)
    cu = torch.empty(3, device="meta", dtype=torch.int32)
    outp, _ = torch.ops.fa4.fwd_varlen(pq, pk, pv, cu, cu, 200, 400, None, False, -1, -1)
    assert outp.shape == (300, 8, 96)
    # torch's SDPA takes a value head dim of its own (Ev) too.
    sdpa = fa4.scaled_dot_product_attention(meta(2, 8, 100, 192), meta(2, 8, 300, 192), meta(2, 8, 300, 128))
    assert sdpa.shape == (2, 8, 100, 128)
    # v must still be k's shape in its other dims.
    with pytest.raises(ValueError, match=r"v has shape \(2, 299, 2, 128\)"):
        torch.ops.fa4.fwd(q, k, meta(2, 299, 2, 128), None, True, -1, -1)


def test_fake_kernel_without_lse_gives_an_empty_lse():
    assert "bool with_lse=True" in str(torch.ops.fa4.fwd.default._schema)
    q, k = meta(2, 100, 8, 128), meta(2, 300, 2, 128)
    out, lse = torch.ops.fa4.fwd(q, k, k, None, True, -1, -1, False)
    assert out.shape == q.shape and lse.shape == (0,) and lse.dtype == torch.float32


def fwd_calls_traced(f, *args):
    """The argument tuples of every fa4::fwd call torch.compile traces in f(*args)."""
    calls = []

    def backend(gm, example_inputs):
        for node in gm.graph.nodes:
            if node.op == "call_function" and "fa4" in str(node.target) and "fwd" in str(node.target):
                calls.append(node.args)
        return gm

    torch._dynamo.reset()
    torch.compile(f, fullgraph=True, backend=backend)(*args)
    return calls


def test_inference_calls_ask_for_no_lse():
    # Without grad and without return_lse the operator is told to skip the LSE; with either, not.
    q, k = meta(2, 64, 8, 128), meta(2, 64, 2, 128)
    with torch.no_grad():
        calls = fwd_calls_traced(lambda q, k: fa4.flash_attn_func(q, k, k, causal=True), q, k)
        assert len(calls) == 1 and calls[0][7] is False, calls  # with_lse
        calls = fwd_calls_traced(lambda q, k: fa4.flash_attn_func(q, k, k, return_lse=True)[1], q, k)
        assert len(calls) == 1 and calls[0][7] is True, calls
    out = fa4.flash_attn_func(meta(2, 64, 8, 128, grad=True), k, k)
    assert out.grad_fn is not None  # training: the autograd node keeps its LSE for the backward


@pytest.mark.parametrize(
    "shapes, pattern",
    [
        (((1, 8, 64), (1, 8, 2, 64), (1, 8, 2, 64)), r"\bq\b.*4-d"),
        (((1, 8, 2, 64), (1, 8, 2, 128), (1, 8, 2, 128)), r"head_dim"),
        (((2, 8, 2, 64), (1, 8, 2, 64), (1, 8, 2, 64)), r"batch"),
        (((1, 8, 2, 64), (1, 8, 2, 64), (1, 9, 2, 64)), r"\bv\b.*shape"),
    ],
    ids=["q-3d", "head_dim-mismatch", "batch-mismatch", "v-shape"],
)
def test_fake_kernels_refuse_bad_shapes(shapes, pattern):
    q, k, v = (meta(*s) for s in shapes)
    with pytest.raises(ValueError, match=pattern):
        torch.ops.fa4.fwd(q, k, v, None, False, -1, -1)


def test_flash_attn_func_checks_its_own_arguments():
    q = meta(1, 8, 2, 64)
    with pytest.raises(ValueError, match="softcap"):
        fa4.flash_attn_func(q, q, q, softcap="large")
    assert fa4.flash_attn_func(q, q, q, softcap=30.0).shape == q.shape  # the fake kernel
    with pytest.raises(ValueError, match="window_size"):
        fa4.flash_attn_func(q, q, q, window_size=5)
    with pytest.raises(ValueError, match="window_size"):
        fa4.flash_attn_func(q, q, q, window_size=(1, 2, 3))


def test_autograd_reaches_the_backward_operator():
    q = meta(2, 100, 8, 64, grad=True)
    k = meta(2, 120, 4, 64, grad=True)
    v = meta(2, 120, 4, 64, grad=True)
    out, lse = fa4.flash_attn_func(q, k, v, causal=True, window_size=(32, 0), return_lse=True,
                                   deterministic=True)
    assert out.requires_grad and not lse.requires_grad
    out.sum().backward()
    assert q.grad.shape == q.shape and k.grad.shape == k.shape and v.grad.shape == v.shape
    with torch.no_grad():  # no autograd node without grad
        assert fa4.flash_attn_func(q, k, v).grad_fn is None


def test_compile_fullgraph_traces_the_operators():
    def f(q, k, v):
        out, lse = fa4.flash_attn_func(q, k, v, causal=True, return_lse=True)
        return out * 2, lse + 1

    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, backend="eager")
    q, k = meta(2, 64, 8, 128), meta(2, 64, 2, 128)
    out, lse = compiled(q, k, k)
    assert out.shape == q.shape and lse.shape == (2, 8, 64)


@pytest.mark.parametrize(
    "sq, sk, is_causal, expect",
    [
        (64, 64, False, (False, (-1, -1))),
        (64, 64, True, (True, (-1, -1))),
        (100, 64, True, (False, (-1, 36))),  # top-left: query i sees keys <= i
        (7, 300, False, (False, (-1, -1))),
    ],
)
def test_sdpa_causal_is_aligned_top_left(sq, sk, is_causal, expect):
    assert fa4._sdpa_window(sq, sk, is_causal) == expect
    # The window it gives is the top-left mask: key j visible to query i iff j <= i.
    causal, (left, right) = expect
    if is_causal:
        off = sk - sq
        right = 0 if causal else right
        for i in range(sq):
            for j in range(sk):
                assert (j - i - off <= right) == (j <= i), (i, j)


def test_sdpa_takes_and_gives_bhsd():
    q = meta(2, 8, 100, 128, grad=True)
    k = meta(2, 2, 64, 128, grad=True)
    out = fa4.scaled_dot_product_attention(q, k, k, is_causal=True, enable_gqa=True)
    assert out.shape == (2, 8, 100, 128)
    out.sum().backward()
    assert q.grad.shape == q.shape and k.grad.shape == k.shape


def test_sdpa_refusals():
    q, k = meta(1, 4, 16, 64), meta(1, 2, 32, 64)
    with pytest.raises(NotImplementedError, match="attn_mask"):
        fa4.scaled_dot_product_attention(q, q, q, attn_mask=meta(16, 16, dtype=torch.bool))
    with pytest.raises(NotImplementedError, match="dropout_p"):
        fa4.scaled_dot_product_attention(q, q, q, dropout_p=0.1)
    with pytest.raises(ValueError, match="enable_gqa"):
        fa4.scaled_dot_product_attention(q, k, k)
    with pytest.raises(NotImplementedError, match="top-left"):
        fa4.scaled_dot_product_attention(q, k, k, is_causal=True, enable_gqa=True)
    with pytest.raises(ValueError, match="4-d"):
        fa4.scaled_dot_product_attention(meta(4, 16, 64), q, q)


def test_flash_attn_keywords_of_other_versions():
    q = meta(1, 16, 4, 64)
    with pytest.raises(NotImplementedError, match="dropout_p"):
        fa4.flash_attn_func(q, q, q, dropout_p=0.1)
    with pytest.raises(NotImplementedError, match="alibi_slopes"):
        fa4.flash_attn_func(q, q, q, alibi_slopes=meta(4, dtype=torch.float32))
    out, lse = fa4.flash_attn_func(q, q, q, dropout_p=0.0, return_attn_probs=True)
    assert out.shape == q.shape and lse.shape == (1, 4, 16)


def test_packed_forms_are_views_with_gradients():
    qkv = meta(2, 50, 3, 8, 128, grad=True)
    out = fa4.flash_attn_qkvpacked_func(qkv, causal=True)
    assert out.shape == (2, 50, 8, 128)
    out.sum().backward()
    assert qkv.grad.shape == qkv.shape
    q = meta(2, 30, 8, 64, grad=True)
    kv = meta(2, 70, 2, 2, 64, grad=True)
    out, lse = fa4.flash_attn_kvpacked_func(q, kv, return_lse=True)
    assert out.shape == q.shape and lse.shape == (2, 8, 30)
    out.sum().backward()
    assert kv.grad.shape == kv.shape and q.grad.shape == q.shape
    with pytest.raises(ValueError, match="qkv"):
        fa4.flash_attn_qkvpacked_func(meta(2, 50, 2, 8, 128))
    with pytest.raises(ValueError, match=r"\bkv\b"):
        fa4.flash_attn_kvpacked_func(q, meta(2, 70, 3, 2, 64))


def test_varlen_packed_forms_are_views_with_gradients():
    cu = torch.empty(4, device="meta", dtype=torch.int32)
    qkv = meta(300, 3, 8, 128, grad=True)
    out = fa4.flash_attn_varlen_qkvpacked_func(qkv, cu, 200, causal=True)
    assert out.shape == (300, 8, 128)
    out.sum().backward()
    assert qkv.grad.shape == qkv.shape
    q = meta(120, 8, 64, grad=True)
    kv = meta(500, 2, 2, 64, grad=True)
    out, lse = fa4.flash_attn_varlen_kvpacked_func(q, kv, cu, cu, 50, 300, return_lse=True)
    assert out.shape == q.shape and lse.shape == (8, 120)
    out.sum().backward()
    assert kv.grad.shape == kv.shape and q.grad.shape == q.shape
    with pytest.raises(ValueError, match="qkv"):
        fa4.flash_attn_varlen_qkvpacked_func(meta(300, 2, 8, 128), cu, 200)
    with pytest.raises(ValueError, match=r"\bkv\b"):
        fa4.flash_attn_varlen_kvpacked_func(q, meta(500, 3, 2, 64), cu, cu, 50, 300)



def test_varlen_operator_checks_and_fake_kernel():
    assert hasattr(torch.ops.fa4, "fwd_varlen")
    schema = str(torch.ops.fa4.fwd_varlen.default._schema)
    assert "Tensor cu_seqlens_q" in schema and "int max_seqlen_k" in schema
    q = torch.randn(10, 2, 64, dtype=torch.bfloat16)
    cu = torch.tensor([0, 4, 10], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"fa4::fwd_varlen: q is on cpu: must be a CUDA tensor"):
        fa4.flash_attn_varlen_func(q, q, q, cu, cu, 6, 6)
    qm, km = meta(100, 8, 128), meta(150, 2, 128)
    cum = torch.empty(4, device="meta", dtype=torch.int32)
    out, lse = torch.ops.fa4.fwd_varlen(qm, km, km, cum, cum, 50, 60, None, True, -1, -1)
    assert out.shape == (100, 8, 128) and out.dtype == torch.bfloat16
    assert lse.shape == (8, 100) and lse.dtype == torch.float32
    with pytest.raises(ValueError, match=r"must be 3-d \[total, heads, head_dim\]"):
        torch.ops.fa4.fwd_varlen(meta(1, 100, 8, 128), km, km, cum, cum, 50, 60, None, True, -1, -1)


def test_varlen_autograd_reaches_the_backward_operator():
    q = meta(10, 2, 64, grad=True)
    k = meta(12, 1, 64, grad=True)
    cu = torch.empty(3, device="meta", dtype=torch.int32)
    with pytest.raises(ValueError, match=r"softcap = 'x'"):
        fa4.flash_attn_varlen_func(q.detach(), q.detach(), q.detach(), cu, cu, 6, 6, softcap="x")
    for softcap in (0.0, 5.0):
        q.grad = k.grad = None
        out = fa4.flash_attn_varlen_func(q, k, k, cu, cu, 6, 7, causal=True, softcap=softcap)
        assert out.shape == (10, 2, 64) and out.requires_grad
        out.sum().backward()  # meta tensors: the fake kernels of fwd_varlen and bwd_varlen
        assert q.grad.shape == q.shape and k.grad.shape == k.shape
    schema = str(torch.ops.fa4.bwd_varlen.default._schema)
    assert "Tensor cu_seqlens_k" in schema and "bool deterministic" in schema and "float softcap=0." in schema
    assert "float softcap=0." in str(torch.ops.fa4.fwd_varlen.default._schema)


def test_kvcache_traces_on_meta_and_refuses_what_it_does_not_implement():
    assert "Tensor? seqused_k=None" in str(torch.ops.fa4.fwd_varlen.default._schema)
    assert "Tensor? seqused_k=None" in str(torch.ops.fa4.fwd.default._schema)
    q = meta(3, 4, 8, 128)
    for cache in (meta(3, 500, 2, 128), meta(3, 2, 500, 128).transpose(1, 2), meta(3, 600, 2, 128)[:, :500]):
        used = torch.empty(3, device="meta", dtype=torch.int32)
        out, lse = fa4.flash_attn_with_kvcache(q, cache, cache, cache_seqlens=used, causal=True,
                                               return_softmax_lse=True)
        assert out.shape == (3, 4, 8, 128) and out.dtype == torch.bfloat16
        assert lse.shape == (3, 8, 4) and lse.dtype == torch.float32
    assert fa4.flash_attn_with_kvcache(q, cache, cache, cache_seqlens=7).shape == (3, 4, 8, 128)
    with pytest.raises(ValueError, match=r"rotary_cos and rotary_sin apply with k and v only"):
        fa4.flash_attn_with_kvcache(q, cache, cache, rotary_cos=meta(500, 64))
    with pytest.raises(NotImplementedError, match=r"cache_batch_idx with seqlen_cache = 500: needs seqlen_cache a "
                                                  r"multiple of 16"):
        fa4.flash_attn_with_kvcache(q, cache, cache, cache_batch_idx=torch.empty(3, device="meta", dtype=torch.int32))
    with pytest.raises(NotImplementedError, match=r"cache_batch_idx with k_cache strides"):
        bhsd = meta(5, 2, 512, 128).transpose(1, 2)
        fa4.flash_attn_with_kvcache(q, bhsd, bhsd, cache_batch_idx=torch.empty(3, device="meta", dtype=torch.int32))
    pad = torch.empty(3, device="meta", dtype=torch.int32)
    with pytest.raises(NotImplementedError, match=r"cache_leftpad with block_table: not implemented"):
        fa4.flash_attn_with_kvcache(q, cache, cache, cache_leftpad=pad,
                                    block_table=torch.empty(3, 2, device="meta", dtype=torch.int32))
    with pytest.raises(NotImplementedError, match=r"cache_leftpad with cache_batch_idx: not implemented"):
        fa4.flash_attn_with_kvcache(q, cache, cache, cache_leftpad=pad, cache_batch_idx=pad)
    with pytest.raises(ValueError, match=r"cache_leftpad has shape \(2,\) and dtype torch.int32: must be int32 "
                                         r"\[batch\] \(batch = 3\)"):
        fa4.flash_attn_with_kvcache(q, cache, cache, cache_leftpad=pad[:2])
    with pytest.raises(ValueError, match=r"cache_leftpad has float: must be int32"):
        fa4.flash_attn_with_kvcache(q, cache, cache, cache_leftpad=1.0)
    with pytest.raises(NotImplementedError, match=r"alibi_slopes"):
        fa4.flash_attn_with_kvcache(q, cache, cache, alibi_slopes=meta(8, dtype=torch.float32))
    with pytest.raises(ValueError, match=r"cache_seqlens = 501: must be in \[0, 500\]"):
        fa4.flash_attn_with_kvcache(q, cache, cache, cache_seqlens=501)
    with pytest.raises(ValueError, match=r"k_cache has shape \(2, 500, 2, 128\)"):
        fa4.flash_attn_with_kvcache(q, meta(2, 500, 2, 128), meta(2, 500, 2, 128))
    with pytest.raises(ValueError, match=r"q has shape \(3, 8, 128\): must be 4-d"):
        fa4.flash_attn_with_kvcache(meta(3, 8, 128), cache, cache)
    qc = torch.randn(2, 1, 4, 64, dtype=torch.bfloat16)
    kc = torch.randn(2, 50, 4, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"fa4::fwd: q is on cpu: must be a CUDA tensor"):
        fa4.flash_attn_with_kvcache(qc, kc, kc, cache_seqlens=torch.tensor([3, 50], dtype=torch.int32))


def test_kvcache_paged_traces_on_meta_and_checks_its_table():
    assert "Tensor block_table" in str(torch.ops.fa4.fwd_paged.default._schema)
    q = meta(3, 4, 8, 128)
    pages = meta(10, 256, 2, 128)
    for used in (None, 7, torch.empty(3, device="meta", dtype=torch.int32)):
        out, lse = fa4.flash_attn_with_kvcache(q, pages, pages, cache_seqlens=used,
                                               block_table=torch.empty(3, 4, device="meta", dtype=torch.int32),
                                               return_softmax_lse=True)
        assert out.shape == (3, 4, 8, 128) and lse.shape == (3, 8, 4)
    with pytest.raises(ValueError, match=r"block_table must be an int32 tensor"):
        fa4.flash_attn_with_kvcache(q, pages, pages, block_table=torch.empty(3, 4, device="meta", dtype=torch.int64))
    qc = torch.randn(2, 1, 4, 128, dtype=torch.bfloat16)
    pc = torch.randn(4, 128, 4, 128, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"fa4::fwd_paged: q is on cpu: must be a CUDA tensor"):
        fa4.flash_attn_with_kvcache(qc, pc, pc, block_table=torch.zeros(2, 2, dtype=torch.int32))


def test_kvcache_is_the_batched_call_with_one_length_or_many():
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(str(func))
            if str(func) == "fa4.fwd.default":
                self.seqused = dict(zip([a.name for a in func._schema.arguments], args)).get(
                    "seqused_k", (kwargs or {}).get("seqused_k"))
            return func(*args, **(kwargs or {}))

    q, cache = meta(3, 1, 8, 128), meta(3, 500, 2, 128)
    for lens, op in ((7, "fa4.fwd.default"), (None, "fa4.fwd.default"),
                     (torch.empty(3, device="meta", dtype=torch.int32), "fa4.fwd.default")):
        with Ops() as seen:
            out = fa4.flash_attn_with_kvcache(q, cache, cache, cache_seqlens=lens, causal=True)
        assert out.shape == (3, 1, 8, 128)
        fa4_ops = [n for n in seen.names if n.startswith("fa4.")]
        assert fa4_ops == [op], (lens, seen.names)
        # A tensor of lengths reaches the op as its seqused_k; one length as a view of the cache.
        assert (seen.seqused is lens) if isinstance(lens, torch.Tensor) else seen.seqused is None


def test_kvcache_append_and_rotary_trace_on_meta_and_check_their_arguments():
    schema = str(torch.ops.fa4.append_kv.default._schema)
    assert "Tensor(a!) k_cache" in schema and "Tensor(b!) v_cache" in schema and "Tensor? rotary_cos" in schema
    assert "Tensor(a!) k_cache" in str(torch.ops.fa4.fwd_kvcache.default._schema)
    q, cache, new = meta(3, 2, 8, 128), meta(3, 500, 2, 128), meta(3, 2, 2, 128)
    cos = meta(500, 32)
    lens = torch.empty(3, device="meta", dtype=torch.int32)
    for seqlens, rotary in ((lens, True), (7, True), (lens, False), (7, False)):
        kw = dict(rotary_cos=cos, rotary_sin=cos) if rotary else {}
        (out, lse), calls = fa4_calls(lambda: fa4.flash_attn_with_kvcache(
            q, cache, cache, k=new, v=new, cache_seqlens=seqlens, causal=True, return_softmax_lse=True, **kw))
        assert out.shape == (3, 2, 8, 128) and lse.shape == (3, 8, 2)
        # One operator: the append and the attention with no Python between their kernels.
        assert [n for n, _ in calls] == ["fa4.fwd_kvcache.default"], calls
        args = calls[0][1]
        assert (args[5] is lens) == (seqlens is lens) and args[6] == (0 if seqlens is lens else 7)
        assert (args[8] is cos) == rotary
        q_rotated, used = torch.ops.fa4.append_kv(*args[:11], True, -1, -1)
        assert q_rotated.shape == ((3, 2, 8, 128) if rotary else (0,)) and used.shape == (3,)
        assert used.dtype == torch.int32
    pages = meta(10, 256, 2, 128)
    table = torch.empty(3, 4, device="meta", dtype=torch.int32)
    out = fa4.flash_attn_with_kvcache(q, pages, pages, k=new, v=new, cache_seqlens=7, block_table=table,
                                      rotary_cos=cos, rotary_sin=cos, rotary_interleaved=False)
    assert out.shape == (3, 2, 8, 128)
    with pytest.raises(ValueError, match=r"k is given, v is None"):
        fa4.flash_attn_with_kvcache(q, cache, cache, k=new)
    with pytest.raises(ValueError, match=r"cache_seqlens = None with k and v"):
        fa4.flash_attn_with_kvcache(q, cache, cache, k=new, v=new)
    with pytest.raises(ValueError, match=r"block_table must be an int32 tensor"):
        fa4.flash_attn_with_kvcache(q, pages, pages, k=new, v=new, cache_seqlens=7, block_table=table.long())
    qc = torch.randn(2, 1, 4, 64, dtype=torch.bfloat16)
    kc = torch.randn(2, 50, 4, 64, dtype=torch.bfloat16)
    nc = torch.randn(2, 1, 4, 64, dtype=torch.bfloat16)
    for op in (torch.ops.fa4.append_kv, torch.ops.fa4.fwd_kvcache):
        name = str(op).split(".")[-1]
        with pytest.raises(ValueError, match=rf"fa4::{name}: q is on cpu: must be a CUDA tensor"):
            extra = (None, False, -1, -1) if name == "fwd_kvcache" else (False, -1, -1)
            op(qc, kc, kc, nc, nc, None, 3, None, None, None, False, *extra)


def test_kvcache_calls_record_no_autograd_even_on_inputs_that_require_grad():
    """The KV-cache calls are inference: with grad mode on and q requiring grad, each still runs
    (its operator has no backward) and returns an output that does not require grad."""
    q, cache = meta(2, 1, 8, 64).requires_grad_(), meta(2, 100, 2, 64)
    lens = torch.empty(2, device="meta", dtype=torch.int32)
    pad = torch.empty(2, device="meta", dtype=torch.int32)
    for kw in (dict(cache_seqlens=lens), dict(cache_seqlens=7), dict(cache_seqlens=lens, cache_leftpad=pad),
               dict(cache_seqlens=lens, block_table=torch.empty(2, 1, device="meta", dtype=torch.int32))):
        kc = meta(4, 128, 2, 64) if "block_table" in kw else cache
        out = fa4.flash_attn_with_kvcache(q, kc, kc, **kw)
        assert out.shape == (2, 1, 8, 64) and not out.requires_grad, kw


def test_kvcache_leftpad_goes_to_the_kvcache_operator():
    assert "Tensor? cache_leftpad=None" in str(torch.ops.fa4.fwd_kvcache.default._schema)
    q, cache, new = meta(3, 1, 8, 128), meta(3, 500, 2, 128), meta(3, 1, 2, 128)
    pad = torch.empty(3, device="meta", dtype=torch.int32)
    lens = torch.empty(3, device="meta", dtype=torch.int32)
    for kw in ({}, dict(cache_seqlens=9), dict(cache_seqlens=lens), dict(k=new, v=new, cache_seqlens=lens),
               dict(k=new, v=new, cache_seqlens=9, causal=True)):
        (out, lse), calls = fa4_calls(lambda: fa4.flash_attn_with_kvcache(
            q, cache, cache, cache_leftpad=pad, return_softmax_lse=True, **kw))
        assert out.shape == (3, 1, 8, 128) and lse.shape == (3, 8, 1)
        # One operator, the pads its last argument; the caches as given (no pages).
        assert [n for n, _ in calls] == ["fa4.fwd_kvcache.default"], calls
        args = calls[0][1]
        assert args[-1] is pad and args[-2] is None and args[1] is cache and args[7] is None
        assert (args[3] is new) == ("k" in kw) and (args[5] is lens) == (kw.get("cache_seqlens") is lens)
    # int64 pads become int32 (on q's device) before the operator.
    _, calls = fa4_calls(lambda: fa4.flash_attn_with_kvcache(q, cache, cache, cache_leftpad=pad.long()))
    assert calls[0][1][-1].dtype == torch.int32


def test_kvcache_batch_idx_reads_the_cache_as_pages_of_its_own_memory():
    q, cache = meta(3, 1, 8, 128), meta(5, 1536, 2, 128)  # 1536 = 3 x 512: pages of 256 (the cap)
    idx = torch.empty(3, device="meta", dtype=torch.int32)
    new = meta(3, 1, 2, 128)
    lens = torch.empty(3, device="meta", dtype=torch.int32)
    for kw in ({}, dict(cache_seqlens=9), dict(cache_seqlens=lens), dict(k=new, v=new, cache_seqlens=9)):
        out, calls = fa4_calls(lambda: fa4.flash_attn_with_kvcache(q, cache, cache, cache_batch_idx=idx, **kw))
        assert out.shape == (3, 1, 8, 128)
        # One operator, the indices its last argument (the pools and the table are made in it).
        assert [n for n, _ in calls] == ["fa4.fwd_kvcache.default"], calls
        args = calls[0][1]
        # (the dispatcher drops trailing arguments left at their defaults: cache_leftpad's None)
        assert args[-1] is idx and args[1] is cache and (args[3] is new) == ("k" in kw)
        assert args[6] == (9 if isinstance(kw.get("cache_seqlens"), int) else -1)
    with pytest.raises(ValueError, match=r"cache_batch_idx with block_table"):
        fa4.flash_attn_with_kvcache(q, cache, cache, cache_batch_idx=idx,
                                    block_table=torch.empty(3, 4, device="meta", dtype=torch.int32))
    with pytest.raises(ValueError, match=r"cache_batch_idx has shape \(2,\)"):
        fa4.flash_attn_with_kvcache(q, cache, cache, cache_batch_idx=idx[:2])



def test_sinks_reach_the_operators_and_their_gradient_the_callers_tensor():
    for op, arg in (("fwd", "Tensor? sink=None"), ("fwd_varlen", "Tensor? sink=None"),
                    ("fwd_kvcache", "Tensor? sink=None"), ("bwd", "Tensor(a!)? dsink=None"),
                    ("bwd_varlen", "Tensor(a!)? dsink=None")):
        assert arg in str(getattr(torch.ops.fa4, op).default._schema), op
    q, k = meta(2, 100, 8, 64, grad=True), meta(2, 120, 4, 64, grad=True)
    # A bf16 parameter: the operators take it as fp32, its gradient comes back in bf16.
    sink = meta(8, grad=True)
    (out, lse), calls = fa4_calls(lambda: fa4.flash_attn_func(q, k, k, causal=True, return_lse=True,
                                                              learnable_sink=sink))
    assert [n for n, _ in calls] == ["fa4.fwd.default"]
    fwd_sink = calls[0][1][-1]
    assert fwd_sink.dtype == torch.float32 and fwd_sink.shape == (8,)
    _, calls = fa4_calls(lambda: out.sum().backward())
    assert [n for n, _ in calls] == ["fa4.bwd.default"]
    bwd_sink, dsink = calls[0][1][-2:]
    assert bwd_sink.shape == dsink.shape == (8,) and bwd_sink.dtype == dsink.dtype == torch.float32
    assert sink.grad is not None and sink.grad.dtype == torch.bfloat16 and sink.grad.shape == (8,)
    assert q.grad.shape == q.shape
    # Without a gradient for the sinks none is asked for (no dsink).
    q.grad = None
    out = fa4.flash_attn_func(q, k, k, learnable_sink=sink.detach())
    _, calls = fa4_calls(lambda: out.sum().backward())
    assert len(calls[0][1]) < 14 or calls[0][1][13] is None
    # Inference: the forward operator alone, with the sinks.
    with torch.no_grad():
        _, calls = fa4_calls(lambda: fa4.flash_attn_func(q, k, k, learnable_sink=sink))
    assert [n for n, _ in calls] == ["fa4.fwd.default"] and calls[0][1][-1].shape == (8,)
    for bad, what in ((meta(4), r"shape \(4,\)"), (torch.empty(8, device="meta", dtype=torch.int32), "int32"),
                      (1.5, "float")):
        with pytest.raises(ValueError, match=rf"learnable_sink has .*{what}.*heads_q = 8"):
            fa4.flash_attn_func(q, k, k, learnable_sink=bad)


def test_sinks_on_the_varlen_and_kvcache_calls():
    q, k = meta(10, 4, 64, grad=True), meta(12, 2, 64, grad=True)
    cu = torch.empty(3, device="meta", dtype=torch.int32)
    sink = meta(4, dtype=torch.float32, grad=True)
    out = fa4.flash_attn_varlen_func(q, k, k, cu, cu, 6, 7, causal=True, learnable_sink=sink)
    _, calls = fa4_calls(lambda: out.sum().backward())
    assert [n for n, _ in calls] == ["fa4.bwd_varlen.default"]
    assert sink.grad.shape == (4,) and q.grad.shape == q.shape
    # Packed queries on a paged cache (forward only): the sinks the paged operator's last argument.
    table = torch.empty(2, 3, device="meta", dtype=torch.int32)
    pages = meta(6, 16, 2, 64)
    with torch.no_grad():
        out, calls = fa4_calls(lambda: fa4.flash_attn_varlen_func(q, pages, pages, cu, None, 6, 0, block_table=table,
                                                                  learnable_sink=sink))
    assert out.shape == (10, 4, 64) and [n for n, _ in calls] == ["fa4.fwd_paged_varlen.default"]
    assert calls[0][1][-1].shape == (4,) and calls[0][1][-1].dtype == torch.float32
    # flash_attn_with_kvcache: one operator, the sinks its last argument, with every kind of cache.
    qd, cache, new = meta(3, 1, 8, 128), meta(3, 512, 2, 128), meta(3, 1, 2, 128)
    pages, tab = meta(6, 256, 2, 128), torch.empty(3, 2, device="meta", dtype=torch.int32)
    lens = torch.empty(3, device="meta", dtype=torch.int32)
    s8 = meta(8)
    for caches, kw in (((cache, cache), {}), ((cache, cache), dict(cache_seqlens=lens)),
                       ((cache, cache), dict(k=new, v=new, cache_seqlens=lens)),
                       ((pages, pages), dict(block_table=tab, cache_seqlens=lens))):
        (o, lse), calls = fa4_calls(lambda: fa4.flash_attn_with_kvcache(
            qd, *caches, learnable_sink=s8, return_softmax_lse=True, **kw))
        assert o.shape == (3, 1, 8, 128) and lse.shape == (3, 8, 1)
        assert [n for n, _ in calls] == ["fa4.fwd_kvcache.default"], (kw, calls)
        assert calls[0][1][-1].dtype == torch.float32 and calls[0][1][-1].shape == (8,)
        assert (calls[0][1][7] is tab) == ("block_table" in kw)


def test_compile_fullgraph_with_sinks_traces_forward_and_backward():
    # aot_eager functionalizes the backward operator's dsink (a mutable optional argument).
    def f(q, k, v, sink):
        return fa4.flash_attn_func(q, k, v, causal=True, learnable_sink=sink) * 2

    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    q, k = meta(2, 64, 8, 128, grad=True), meta(2, 64, 2, 128, grad=True)
    sink = meta(8, dtype=torch.float32, grad=True)
    out = compiled(q, k, k, sink)
    out.sum().backward()
    assert out.shape == q.shape and sink.grad.shape == (8,) and q.grad.shape == q.shape


def test_fp8_fake_kernels_give_bf16_out():
    q8 = meta(2, 100, 8, 128, dtype=torch.float8_e4m3fn)
    k8 = meta(2, 300, 2, 128, dtype=torch.float8_e4m3fn)
    d = torch.empty(2, 2, device="meta")
    out, lse = torch.ops.fa4.fwd_fp8(q8, k8, k8, None, True, -1, -1, True, d, d, d)
    assert out.shape == (2, 100, 8, 128) and out.dtype == torch.bfloat16
    assert lse.shape == (2, 8, 100) and lse.dtype == torch.float32
    out2 = fa4.flash_attn_func(q8, k8, k8, causal=True, q_descale=d)
    assert out2.dtype == torch.bfloat16 and out2.shape == (2, 100, 8, 128)
    out3, _ = torch.ops.fa4.fwd(q8, k8, k8, None, False, -1, -1)  # fa4::fwd takes fp8 too (no descales)
    assert out3.dtype == torch.bfloat16
    with pytest.raises(ValueError, match="must be torch.float8_e4m3fn"):
        torch.ops.fa4.fwd_fp8(meta(1, 8, 2, 64), meta(1, 8, 2, 64), meta(1, 8, 2, 64), None, False, -1, -1)
    with pytest.raises(NotImplementedError, match="softcap"):
        fa4.flash_attn_func(q8, k8, k8, softcap=5.0)
    with pytest.raises(NotImplementedError, match="forward only"):
        fa4.flash_attn_func(q8.clone().requires_grad_(True), k8, k8)
    with torch.no_grad():
        assert fa4.flash_attn_func(q8.clone().requires_grad_(True), k8, k8).dtype == torch.bfloat16
