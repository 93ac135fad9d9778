"""What fa4's PyTorch operators promise (run on the GPU machine after `bash python/build.sh`):

- forward matches a float64 reference by DESIGN.md §3's criterion (max error at most twice that of
  a plain 16-bit attention, plus 1e-3; relative Frobenius error at most 1e-2), over odd lengths,
  causal (bottom-right), windows, GQA/MQA, BHSD views, bf16 and fp16, one query row (decoding,
  whose query groups fold into tiles); outputs finite, LSE right, -inf for rows that see no key;
- bad arguments raise ValueError naming the argument; softcap's forward against the reference,
  its backward NotImplementedError;
- torch.compile(fullgraph=True) traces the ops (fake kernels) and matches eager;
- torch.library.opcheck passes;
- backward: dq, dk and dv match the reference by the same criterion, in both the default and
  the deterministic mode;
- fa4.scaled_dot_product_attention matches torch's (float64) by the same criterion, its causal
  mask aligned top-left as torch's; the packed forms (qkv, kv) give the unpacked answer exactly;
- flash_attn_varlen_func: each packed sequence matches the reference of that sequence alone (odd
  and zero lengths, causal per sequence, GQA, a window, decoding), forward and backward (both
  modes), and equal lengths match the batched call; torch.compile traces it;
- flash_attn_with_kvcache (and varlen's seqused_k): each batch entry against the reference over its
  cache's filled keys (a full, a one-key, an empty and a partial entry; causal aligned to them, a
  window, GQA/MQA, BSHD, BHSD and sliced caches); with k and v appended into the cache (contiguous
  or paged) and rotary embedding (GPT-NeoX and interleaved, over part of the head or all of it),
  the cache's new rows and the attention against float64; what it does not implement raises.

A test that needs a kernel fa4 does not have (the op raises NotImplementedError) is skipped with
fa4's message; every other failure fails.
"""

from __future__ import annotations

import itertools
import math
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU: fa4's torch ops run on the GPU machine only", allow_module_level=True)
if torch.cuda.get_device_capability() < (9, 0):
    pytest.skip(f"GPU {torch.cuda.get_device_name()} is below compute capability 9.0 (Hopper)",
                allow_module_level=True)

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))
import fa4  # noqa: E402  (needs the built extension: bash python/build.sh)

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False

DEV = "cuda"
ATOL = 1e-3  # DESIGN.md §3
REL_FROBENIUS = 1e-2


# ---------------------------------------------------------------------------------------------
# References


def visible_mask(sq, sk, causal, window, device):
    """[sq, sk] bool: query i sees key j (bottom-right aligned causal and window)."""
    left, right = window
    if causal:
        right = 0 if right < 0 else min(right, 0)
    i = torch.arange(sq, device=device)[:, None]
    j = torch.arange(sk, device=device)[None, :]
    diag = i + sk - sq
    m = torch.ones(sq, sk, dtype=torch.bool, device=device)
    if right >= 0:
        m &= j <= diag + right
    if left >= 0:
        m &= j >= diag - left
    return m


def reference(q, k, v, scale, causal, window, lowp, softcap=0.0, sink=None):
    """(out, lse) of attention over BSHD tensors.

    lowp=False: float64 throughout. lowp=True: the plain implementation in q's dtype, as
    fa4::ref::forward_lowp: S and softmax in fp32, P rounded to the dtype, O = P V accumulated in
    fp32 and rounded to the dtype. sink ([heads_q]): each head's sink score, a column of S with no
    value.
    """
    b, sq, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    g = hq // hkv
    kk = k.repeat_interleave(g, dim=2)
    vv = v.repeat_interleave(g, dim=2)
    work = torch.float32 if lowp else torch.float64
    s = torch.einsum("bihd,bjhd->bhij", q.to(work), kk.to(work)) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    mask = visible_mask(sq, sk, causal, window, q.device)
    s = s.masked_fill(~mask, float("-inf"))
    if sink is not None:
        col = sink.to(work)[None, :, None, None].expand(b, hq, sq, 1)
        s = torch.cat([s, col], dim=-1)
    lse = torch.logsumexp(s, dim=-1)  # -inf for a row with no visible key
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)  # all-masked rows: NaN -> 0
    if sink is not None:
        p = p[..., :-1]
    if lowp:
        p = p.to(q.dtype).to(work)
    out = torch.einsum("bhij,bjhd->bihd", p, vv.to(work))
    if lowp:
        out = out.to(q.dtype)
    return out, lse


def assert_close_by_criterion(out, out_lp, ref, name):
    assert torch.isfinite(out).all(), f"{name}: non-finite values in fa4's output"
    err = (out.double() - ref).abs().max().item() if out.numel() else 0.0
    err_lp = (out_lp.double() - ref).abs().max().item() if out.numel() else 0.0
    bound = 2 * err_lp + ATOL
    ref_norm = ref.norm().item()
    diff_norm = (out.double() - ref).norm().item()
    rel = diff_norm / ref_norm if ref_norm > 0 else (0.0 if diff_norm == 0 else math.inf)
    assert err <= bound, f"{name}: max|err| {err:.3e} > {bound:.3e} (2 x lowprec {err_lp:.3e} + {ATOL})"
    assert rel <= REL_FROBENIUS, f"{name}: relative Frobenius error {rel:.3e} > {REL_FROBENIUS}"


def assert_lse(lse, lse_lp, lse_ref):
    assert lse.dtype == torch.float32
    ref_inf = torch.isinf(lse_ref)
    assert not torch.isnan(lse).any(), "lse has NaN"
    assert torch.equal(torch.isinf(lse), ref_inf), "lse is -inf exactly where no key is visible"
    if (~ref_inf).any():
        fin = ~ref_inf
        err = (lse.double()[fin] - lse_ref[fin]).abs().max().item()
        err_lp = (lse_lp.double()[fin] - lse_ref[fin]).abs().max().item()
        assert err <= 2 * err_lp + ATOL, f"lse: max|err| {err:.3e} > 2 x {err_lp:.3e} + {ATOL}"


def call_or_skip(fn, *args, **kwargs):
    """Runs fn; a NotImplementedError (no kernel yet for this configuration) skips the test."""
    try:
        return fn(*args, **kwargs)
    except NotImplementedError as e:
        pytest.skip(f"fa4 has no kernel for this yet: {e}")


def make_inputs(b, sq, sk, hq, hkv, d, dtype, layout="bshd", seed=0, requires_grad=False):
    """Random normal q, k, v as [b, s, h, d] tensors; layout "bhsd" gives BSHD views of
    contiguous [b, h, s, d] storage."""
    gen = torch.Generator(device=DEV).manual_seed(seed)

    def one(s, h):
        if layout == "bhsd":
            t = torch.randn(b, h, s, d, device=DEV, dtype=dtype, generator=gen).transpose(1, 2)
        else:
            t = torch.randn(b, s, h, d, device=DEV, dtype=dtype, generator=gen)
        return t.requires_grad_(requires_grad)

    return one(sq, hq), one(sk, hkv), one(sk, hkv)


# ---------------------------------------------------------------------------------------------
# Forward against the reference

# (batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, causal, window, layout, dtype)
FWD_CASES = [
    (2, 113, 203, 4, 4, 64, False, (-1, -1), "bshd", torch.bfloat16),
    (1, 257, 257, 8, 2, 128, True, (-1, -1), "bshd", torch.bfloat16),  # GQA, causal, odd length
    (2, 128, 512, 4, 1, 256, True, (-1, -1), "bshd", torch.bfloat16),  # MQA, sq < sk
    (1, 300, 97, 2, 2, 64, True, (-1, -1), "bshd", torch.bfloat16),  # sq > sk: rows with no key
    (2, 1, 1000, 4, 4, 128, False, (-1, -1), "bshd", torch.float16),  # one query row
    (1, 511, 511, 2, 2, 128, False, (64, 0), "bshd", torch.bfloat16),  # sliding window
    (1, 333, 333, 3, 3, 64, False, (32, 16), "bshd", torch.float16),
    (2, 200, 300, 4, 2, 128, True, (-1, -1), "bhsd", torch.bfloat16),  # BHSD views
    (1, 1024, 1024, 4, 4, 64, True, (-1, -1), "bhsd", torch.float16),
    (1, 77, 77, 2, 1, 256, False, (-1, -1), "bhsd", torch.float16),
    # Fewer query tiles than SMs against many keys: the keys are cut across the grid (stream-K)
    (1, 64, 8192, 8, 8, 128, False, (-1, -1), "bshd", torch.bfloat16),
    (2, 100, 6000, 8, 2, 64, False, (-1, -1), "bhsd", torch.float16),  # GQA, key tail
    (1, 200, 4096, 4, 4, 256, False, (-1, -1), "bshd", torch.bfloat16),  # in clusters of two
    # Decoding: one query row, each KV head's query heads folded into one tile's rows
    (4, 1, 3000, 32, 8, 128, True, (-1, -1), "bshd", torch.bfloat16),
    (2, 1, 777, 16, 1, 64, False, (-1, -1), "bhsd", torch.float16),  # MQA, BHSD views
    (3, 1, 500, 8, 2, 256, False, (100, 0), "bshd", torch.bfloat16),  # keys dropped: not folded
    # A few query rows under GQA (speculative decoding): the group's heads folded into rows, each
    # row masked by its own query (more query heads than an H100's or H200's SMs: folded there)
    (8, 4, 3000, 32, 8, 128, True, (-1, -1), "bshd", torch.bfloat16),
    (16, 5, 777, 16, 1, 64, True, (-1, -1), "bhsd", torch.float16),  # MQA, BHSD views
    (24, 3, 500, 8, 2, 256, False, (100, 0), "bshd", torch.bfloat16),  # a window
    (2, 4, 3000, 32, 8, 128, True, (-1, -1), "bshd", torch.bfloat16),  # 64 query heads: unfolded
]


def case_id(c):
    b, sq, sk, hq, hkv, d, causal, window, layout, dtype = c
    w = "" if window == (-1, -1) else f"-w{window[0]}_{window[1]}"
    return (f"b{b}-sq{sq}-sk{sk}-h{hq}_{hkv}-d{d}{'-causal' if causal else ''}{w}-{layout}-"
            f"{str(dtype).replace('torch.', '')}")


@pytest.mark.parametrize("case", FWD_CASES, ids=[case_id(c) for c in FWD_CASES])
def test_forward_matches_reference(case):
    b, sq, sk, hq, hkv, d, causal, window, layout, dtype = case
    q, k, v = make_inputs(b, sq, sk, hq, hkv, d, dtype, layout)
    out, lse = call_or_skip(fa4.flash_attn_func, q, k, v, causal=causal, window_size=window,
                            return_lse=True)
    assert out.shape == (b, sq, hq, d) and out.dtype == dtype and out.device == q.device
    assert lse.shape == (b, hq, sq)
    scale = 1.0 / math.sqrt(d)
    ref, lse_ref = reference(q, k, v, scale, causal, window, lowp=False)
    lp, lse_lp = reference(q, k, v, scale, causal, window, lowp=True)
    assert_close_by_criterion(out, lp, ref, "out")
    assert_lse(lse, lse_lp, lse_ref)


def test_forward_softmax_scale():
    q, k, v = make_inputs(1, 190, 190, 4, 4, 128, torch.bfloat16)
    out = call_or_skip(fa4.flash_attn_func, q, k, v, softmax_scale=0.05, causal=True)
    ref, _ = reference(q, k, v, 0.05, True, (-1, -1), lowp=False)
    lp, _ = reference(q, k, v, 0.05, True, (-1, -1), lowp=True)
    assert_close_by_criterion(out, lp, ref, "out")


def test_forward_empty_keys():
    # seqlen_k = 0: every row sees no key; O = 0 and LSE = -inf without any attention kernel.
    q = torch.randn(2, 5, 4, 64, device=DEV, dtype=torch.bfloat16)
    k = torch.randn(2, 0, 4, 64, device=DEV, dtype=torch.bfloat16)
    out, lse = fa4.flash_attn_func(q, k, k, return_lse=True)
    assert out.shape == q.shape and torch.equal(out, torch.zeros_like(out))
    assert lse.shape == (2, 4, 5) and torch.all(lse == float("-inf"))


def test_forward_runs_on_current_stream():
    q, k, v = make_inputs(1, 256, 256, 2, 2, 64, torch.bfloat16)
    ref = call_or_skip(fa4.flash_attn_func, q, k, v)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        out = fa4.flash_attn_func(q, k, v)
    s.synchronize()
    assert torch.equal(out, ref), "the same call on another stream gives the same bits"


# ---------------------------------------------------------------------------------------------
# Validation: errors name the argument


def bf16(*shape):
    return torch.randn(*shape, device=DEV, dtype=torch.bfloat16)


@pytest.mark.parametrize(
    "make, pattern",
    [
        (lambda: (bf16(1, 8, 2, 64).float(), bf16(1, 8, 2, 64), bf16(1, 8, 2, 64)), r"\bq\b.*dtype"),
        (lambda: (bf16(1, 8, 2, 64), bf16(1, 8, 2, 64).half(), bf16(1, 8, 2, 64)), r"\bk\b.*dtype"),
        (lambda: (bf16(1, 8, 2, 64), bf16(1, 8, 2, 128), bf16(1, 8, 2, 128)), r"\bk\b.*shape"),
        (lambda: (bf16(1, 8, 2, 64), bf16(1, 8, 2, 64), bf16(1, 9, 2, 64)), r"\bv\b.*shape"),
        (lambda: (bf16(8, 2, 64), bf16(1, 8, 2, 64), bf16(1, 8, 2, 64)), r"\bq\b.*4-d"),
        (lambda: (bf16(1, 8, 2, 128)[..., ::2], bf16(1, 8, 2, 64), bf16(1, 8, 2, 64)),
         r"\bq\b.*stride"),
        (lambda: (bf16(1, 8, 2, 64).cpu(), bf16(1, 8, 2, 64).cpu(), bf16(1, 8, 2, 64).cpu()),
         r"\bq\b.*CUDA"),
        (lambda: (bf16(1, 8, 2, 64), bf16(1, 8, 2, 64).cpu(), bf16(1, 8, 2, 64)), r"\bk\b.*cpu"),
        (lambda: (bf16(1, 8, 6, 64), bf16(1, 8, 4, 64), bf16(1, 8, 4, 64)), r"heads_q"),
        (lambda: (bf16(1, 8, 2, 100), bf16(1, 8, 2, 100), bf16(1, 8, 2, 100)), r"head_dim = 100"),
        (lambda: (bf16(1, 8, 2, 68)[..., :64], bf16(1, 8, 2, 64), bf16(1, 8, 2, 64)),  # 136-byte head stride
         r"\bq\b.*(stride|multiple)"),
    ],
    ids=["q-float32", "k-dtype", "k-head_dim", "v-shape", "q-3d", "q-last-stride", "cpu",
         "k-device", "gqa-ratio", "head_dim-100", "q-misaligned-stride"],
)
def test_invalid_tensors_raise_value_error(make, pattern):
    q, k, v = make()
    with pytest.raises(ValueError, match=pattern):
        fa4.flash_attn_func(q, k, v)


@pytest.mark.parametrize(
    "kwargs, pattern",
    [
        (dict(window_size=(-2, 0)), r"window_left"),
        (dict(window_size=(0, -3)), r"window_right"),
        (dict(window_size=5), r"window_size"),
        (dict(softmax_scale=float("nan")), r"softmax_scale"),
        (dict(softmax_scale=-1.0), r"softmax_scale"),
        (dict(softmax_scale=0.0), r"softmax_scale"),
    ],
    ids=["window-left", "window-right", "window-not-pair", "scale-nan", "scale-negative",
         "scale-zero"],
)
def test_invalid_options_raise_value_error(kwargs, pattern):
    q = bf16(1, 8, 2, 64)
    with pytest.raises(ValueError, match=pattern):
        fa4.flash_attn_func(q, q, q, **kwargs)


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_softcap_forward_matches_reference(d, causal):
    # Scores scaled up so that many reach the cap's bend (|score| ~ softcap).
    q, k, v = make_inputs(2, 200, 333, 4, 2, d, torch.bfloat16)
    q = q * 4
    out, lse = call_or_skip(fa4.flash_attn_func, q, k, v, causal=causal, softcap=5.0, return_lse=True)
    scale = 1.0 / math.sqrt(d)
    ref, lse_ref = reference(q, k, v, scale, causal, (-1, -1), lowp=False, softcap=5.0)
    lp, lse_lp = reference(q, k, v, scale, causal, (-1, -1), lowp=True, softcap=5.0)
    assert_close_by_criterion(out, lp, ref, "out")
    assert_lse(lse, lse_lp, lse_ref)
    plain = fa4.flash_attn_func(q, k, v, causal=causal)
    assert (plain.double() - out.double()).abs().max().item() > 1e-2, "softcap changed nothing"


def test_softcap_negative_is_refused():
    q = bf16(1, 8, 2, 64)
    with pytest.raises(ValueError, match="softcap"):
        fa4.flash_attn_func(q, q, q, softcap=-1.0)


# ---------------------------------------------------------------------------------------------
# fa4.scaled_dot_product_attention against torch's own, in float64 (and its 16-bit math backend
# for the criterion's bound)

# (batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, is_causal, dtype)
SDPA_CASES = [
    (2, 8, 8, 128, 128, 64, True, torch.bfloat16),
    (1, 8, 2, 300, 200, 128, True, torch.bfloat16),  # top-left causal, more queries than keys, GQA
    (2, 4, 4, 77, 333, 128, False, torch.float16),
    (1, 4, 1, 257, 257, 256, True, torch.float16),  # MQA
]


@pytest.mark.parametrize("case", SDPA_CASES,
                         ids=[f"b{c[0]}-h{c[1]}_{c[2]}-sq{c[3]}-sk{c[4]}-d{c[5]}{'-causal' if c[6] else ''}-"
                              f"{str(c[7]).replace('torch.', '')}" for c in SDPA_CASES])
def test_sdpa_matches_torch(case):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as torch_sdpa

    b, hq, hkv, sq, sk, d, causal, dtype = case
    gen = torch.Generator(device=DEV).manual_seed(11)
    q = torch.randn(b, hq, sq, d, device=DEV, dtype=dtype, generator=gen)
    k = torch.randn(b, hkv, sk, d, device=DEV, dtype=dtype, generator=gen)
    v = torch.randn(b, hkv, sk, d, device=DEV, dtype=dtype, generator=gen)
    gqa = hq != hkv
    out = call_or_skip(fa4.scaled_dot_product_attention, q, k, v, is_causal=causal, enable_gqa=gqa)
    assert out.shape == (b, hq, sq, d) and out.dtype == dtype
    ref = torch_sdpa(q.double(), k.double(), v.double(), is_causal=causal, enable_gqa=gqa)
    with sdpa_kernel(SDPBackend.MATH):
        plain = torch_sdpa(q, k, v, is_causal=causal, enable_gqa=gqa)
    assert_close_by_criterion(out, plain, ref, "sdpa")


def test_packed_forms_match_unpacked():
    # Views of a packed tensor (other strides, k and v at offsets) give the unpacked answer exactly.
    gen = torch.Generator(device=DEV).manual_seed(5)
    qkv = torch.randn(2, 200, 3, 4, 128, device=DEV, dtype=torch.bfloat16, generator=gen)
    out_p = call_or_skip(fa4.flash_attn_qkvpacked_func, qkv, causal=True)
    q, k, v = (qkv[:, :, i].contiguous() for i in range(3))
    torch.testing.assert_close(out_p, fa4.flash_attn_func(q, k, v, causal=True), atol=0, rtol=0)
    kv = torch.randn(2, 300, 2, 2, 128, device=DEV, dtype=torch.bfloat16, generator=gen)
    out_kv = fa4.flash_attn_kvpacked_func(q, kv)
    ref = fa4.flash_attn_func(q, kv[:, :, 0].contiguous(), kv[:, :, 1].contiguous())
    torch.testing.assert_close(out_kv, ref, atol=0, rtol=0)
    # The varlen packed forms likewise, with gradients into the packed tensors.
    cu = torch.tensor([0, 17, 256, 300], device=DEV, dtype=torch.int32)
    pqkv = torch.randn(300, 3, 4, 64, device=DEV, dtype=torch.bfloat16, generator=gen).requires_grad_()
    # (deterministic: dQ's sum in one order both times)
    out_vp = fa4.flash_attn_varlen_qkvpacked_func(pqkv, cu, 239, causal=True, deterministic=True)
    pq, pk, pv = (pqkv[:, i].detach().clone().requires_grad_() for i in range(3))
    ref_vp = fa4.flash_attn_varlen_func(pq, pk, pv, cu, cu, 239, 239, causal=True, deterministic=True)
    torch.testing.assert_close(out_vp, ref_vp, atol=0, rtol=0)
    dout = torch.randn_like(out_vp)
    (g,) = torch.autograd.grad(out_vp, (pqkv,), dout)
    for i, x in enumerate(torch.autograd.grad(ref_vp, (pq, pk, pv), dout)):
        torch.testing.assert_close(g[:, i], x, atol=0, rtol=0)
    pkv = torch.randn(300, 2, 2, 64, device=DEV, dtype=torch.bfloat16, generator=gen)
    out_vkv = fa4.flash_attn_varlen_kvpacked_func(pq.detach(), pkv, cu, cu, 239, 239)
    ref_vkv = fa4.flash_attn_varlen_func(pq.detach(), pkv[:, 0].contiguous(), pkv[:, 1].contiguous(), cu, cu, 239, 239)
    torch.testing.assert_close(out_vkv, ref_vkv, atol=0, rtol=0)


# ---------------------------------------------------------------------------------------------
# torch.compile and the op contract


def test_fake_kernels_shapes():
    # Tracing alone: no kernel runs, so this holds before the forward kernel exists.
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q = torch.empty(2, 100, 8, 128, device=DEV, dtype=torch.bfloat16)
        k = torch.empty(2, 300, 2, 128, device=DEV, dtype=torch.bfloat16)
        out, lse = fa4.flash_attn_func(q, k, k, causal=True, return_lse=True)
        assert out.shape == (2, 100, 8, 128) and out.dtype == torch.bfloat16
        assert lse.shape == (2, 8, 100) and lse.dtype == torch.float32
        dq, dk, dv = torch.ops.fa4.bwd(out, q, k, k, out, lse, None, True, -1, -1, False)
        assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == k.shape


def test_compile_fullgraph_matches_eager():
    q, k, v = make_inputs(2, 333, 333, 4, 2, 128, torch.bfloat16)

    def f(q, k, v):
        out, lse = fa4.flash_attn_func(q, k, v, causal=True, return_lse=True)
        return out * 2, lse + 1

    eager_out, eager_lse = call_or_skip(f, q, k, v)
    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True)
    out, lse = compiled(q, k, v)
    torch.testing.assert_close(out, eager_out, atol=0, rtol=0)
    torch.testing.assert_close(lse, eager_lse, atol=0, rtol=0)


def test_compile_fullgraph_with_grad_inputs():
    # AOT autograd traces the backward with the fake kernel of fa4::bwd at compile time.
    q, k, v = make_inputs(1, 256, 256, 2, 2, 64, torch.bfloat16, requires_grad=True)

    def f(q, k, v):
        return fa4.flash_attn_func(q, k, v, window_size=(32, 0))

    with torch.no_grad():
        eager = call_or_skip(f, q, k, v)
    torch._dynamo.reset()
    out = torch.compile(f, fullgraph=True)(q, k, v)
    assert out.requires_grad
    torch.testing.assert_close(out.detach(), eager, atol=0, rtol=0)


def test_opcheck_fwd():
    q, k, v = make_inputs(1, 128, 192, 4, 2, 64, torch.bfloat16)
    call_or_skip(torch.ops.fa4.fwd, q, k, v, None, True, -1, -1)
    torch.library.opcheck(torch.ops.fa4.fwd.default, (q, k, v, None, True, -1, -1))
    torch.library.opcheck(torch.ops.fa4.fwd.default, (q, k, v, 0.1, False, 16, 8))


def test_inference_call_writes_no_lse_and_the_same_out():
    # with_lse=False: an empty LSE and O bit for bit the call's that writes one, on d256 causal
    # pairs, the tile counter, stream-K pieces (short queries over many keys) and d64 with MQA.
    for b, sq, sk, hq, hkv, d, causal in ((2, 512, 512, 8, 8, 256, True), (2, 777, 777, 4, 4, 128, True),
                                          (1, 100, 16384, 4, 4, 128, False), (2, 150, 8000, 2, 1, 64, False)):
        q, k, v = make_inputs(b, sq, sk, hq, hkv, d, torch.bfloat16)
        out, lse = call_or_skip(torch.ops.fa4.fwd, q, k, v, None, causal, -1, -1, True)
        out_n, lse_n = torch.ops.fa4.fwd(q, k, v, None, causal, -1, -1, False)
        assert lse.shape == (b, hq, sq) and lse_n.shape == (0,) and lse_n.dtype == torch.float32
        assert torch.equal(out, out_n)
        with torch.no_grad():
            assert torch.equal(fa4.flash_attn_func(q, k, v, causal=causal), out)
    torch.library.opcheck(torch.ops.fa4.fwd.default, (q, k, v, None, True, -1, -1, False))


def test_opcheck_bwd():
    q, k, v = make_inputs(1, 128, 192, 4, 2, 64, torch.bfloat16)
    out, lse = call_or_skip(torch.ops.fa4.fwd, q, k, v, None, True, -1, -1)
    dout = torch.randn_like(out)
    call_or_skip(torch.ops.fa4.bwd, dout, q, k, v, out, lse, None, True, -1, -1, False)
    torch.library.opcheck(torch.ops.fa4.bwd.default,
                          (dout, q, k, v, out, lse, None, True, -1, -1, False))


# ---------------------------------------------------------------------------------------------
# Backward


def reference_grads(q, k, v, dout, scale, causal, window, lowp, softcap=0.0):
    """dq, dk, dv of the reference. lowp=False: float64 autograd of reference(). lowp=True: autograd
    of attention computed in q's dtype (S and O by 16-bit matmuls, softmax in fp32 rounded back),
    so every intermediate gradient is rounded too: the plain 16-bit bound FA3 uses."""
    if not lowp:  # (float64 leaves: the gradients stay float64, not rounded to q's dtype)
        leaves = [t.detach().double().requires_grad_(True) for t in (q, k, v)]
        out, _ = reference(*leaves, scale, causal, window, lowp=False, softcap=softcap)
        return torch.autograd.grad(out, leaves, dout.double())
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    lq, lk, lv = leaves
    g = q.shape[2] // k.shape[2]
    kk, vv = lk.repeat_interleave(g, dim=2), lv.repeat_interleave(g, dim=2)
    s = torch.einsum("bihd,bjhd->bhij", lq, kk) * scale
    if softcap > 0:
        s = (softcap * torch.tanh(s.float() / softcap)).to(q.dtype)
    mask = visible_mask(q.shape[1], k.shape[1], causal, window, q.device)
    s = s.masked_fill(~mask, float("-inf"))
    p = torch.softmax(s.float(), dim=-1).to(q.dtype)
    out = torch.einsum("bhij,bjhd->bihd", p, vv)
    return torch.autograd.grad(out, leaves, dout.to(q.dtype))


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize(
    "case",
    [(2, 129, 257, 4, 2, 128, True, (-1, -1)), (1, 200, 200, 2, 2, 64, False, (48, 0)),
     (2, 1, 300, 8, 2, 128, False, (-1, -1)), (24, 4, 300, 8, 2, 128, True, (-1, -1))],
    ids=["gqa-causal", "window", "one-query-row-gqa", "four-query-rows-gqa-causal"],
)
def test_backward(case, deterministic):
    b, sq, sk, hq, hkv, d, causal, window = case
    q, k, v = make_inputs(b, sq, sk, hq, hkv, d, torch.bfloat16, requires_grad=True)
    out = call_or_skip(fa4.flash_attn_func, q, k, v, causal=causal, window_size=window,
                       deterministic=deterministic)
    dout = torch.randn_like(out)
    try:
        dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
    except NotImplementedError as e:
        assert "fa4::bwd" in str(e), f"the error should name the op: {e}"
        pytest.skip(f"fa4 backward not available yet: {e}")
    scale = 1.0 / math.sqrt(d)
    ref = reference_grads(q, k, v, dout, scale, causal, window, lowp=False)
    lp = reference_grads(q, k, v, dout, scale, causal, window, lowp=True)
    for name, g, r, l in zip(("dq", "dk", "dv"), (dq, dk, dv), ref, lp):
        assert g.shape == r.shape
        assert_close_by_criterion(g, l, r, name)
    if deterministic:
        again = torch.autograd.grad(
            fa4.flash_attn_func(q, k, v, causal=causal, window_size=window, deterministic=True),
            (q, k, v), dout)
        for name, g, h in zip(("dq", "dk", "dv"), (dq, dk, dv), again):
            assert torch.equal(g, h), f"{name}: deterministic backward gave different bits"


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("d", [64, 128, 256])
def test_softcap_backward(d, deterministic):
    # Scores scaled up so that many reach the cap's bend, where its slope 1 - tanh^2 is far from 1:
    # a backward that left the slope out, or capped the wrong scores, fails the float64 bound.
    q, k, v = make_inputs(2, 200, 333, 4, 2, d, torch.bfloat16, requires_grad=True)
    with torch.no_grad():
        q.mul_(4)
    out = call_or_skip(fa4.flash_attn_func, q, k, v, causal=True, softcap=5.0, deterministic=deterministic)
    dout = torch.randn_like(out)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
    scale = 1.0 / math.sqrt(d)
    ref = reference_grads(q, k, v, dout, scale, True, (-1, -1), lowp=False, softcap=5.0)
    lp = reference_grads(q, k, v, dout, scale, True, (-1, -1), lowp=True, softcap=5.0)
    for name, g, r, l in zip(("dq", "dk", "dv"), (dq, dk, dv), ref, lp):
        assert_close_by_criterion(g, l, r, name)
    plain = torch.autograd.grad(fa4.flash_attn_func(q, k, v, causal=True), (q, k, v), dout)
    assert (plain[0].double() - dq.double()).abs().max().item() > 1e-2, "softcap changed nothing in dq"


# ---------------------------------------------------------------------------------------------
# Head dims without a kernel of their own: the next one's kernels over zero-padded copies, the
# scale 1/sqrt(d) of the caller's d (the kernel head dim's would fail the float64 bound)


def check_forward_and_backward(q, k, v, causal, deterministic=False):
    """flash_attn_func's out ([..., v's head dim]), LSE, dq, dk and dv against the references, with
    the caller's scale 1/sqrt(q's head dim)."""
    out, lse = call_or_skip(fa4.flash_attn_func, q, k, v, causal=causal, return_lse=True,
                            deterministic=deterministic)
    assert out.shape == q.shape[:3] + v.shape[3:]
    scale = 1.0 / math.sqrt(q.shape[3])
    ref, lse_ref = reference(q, k, v, scale, causal, (-1, -1), lowp=False)
    lp, lse_lp = reference(q, k, v, scale, causal, (-1, -1), lowp=True)
    assert_close_by_criterion(out, lp, ref, "out")
    assert_lse(lse, lse_lp, lse_ref)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    ref_g = reference_grads(q, k, v, dout, scale, causal, (-1, -1), lowp=False)
    lp_g = reference_grads(q, k, v, dout, scale, causal, (-1, -1), lowp=True)
    for name, g, r, l in zip(("dq", "dk", "dv"), grads, ref_g, lp_g):
        assert g.shape == r.shape, name
        assert_close_by_criterion(g, l, r, name)


def check_varlen_sequences(out, q, k, v, cu_q, cu_k, causal):
    """Packed out against each sequence's references alone, scale 1/sqrt(q's head dim)."""
    scale = 1.0 / math.sqrt(q.shape[2])
    for i in range(cu_q.numel() - 1):
        qs = q[cu_q[i]:cu_q[i + 1]][None]
        ks, vs = k[cu_k[i]:cu_k[i + 1]][None], v[cu_k[i]:cu_k[i + 1]][None]
        ref, _ = reference(qs, ks, vs, scale, causal, (-1, -1), lowp=False)
        lp, _ = reference(qs, ks, vs, scale, causal, (-1, -1), lowp=True)
        assert_close_by_criterion(out[cu_q[i]:cu_q[i + 1]][None], lp, ref, f"varlen sequence {i}")


@pytest.mark.parametrize("d", [8, 40, 80, 96, 160, 192])
@pytest.mark.parametrize("causal", [False, True])
def test_padded_head_dims_forward_and_backward(d, causal):
    q, k, v = make_inputs(2, 239, 300, 4, 2, d, torch.bfloat16, layout="bhsd", requires_grad=True)
    check_forward_and_backward(q, k, v, causal, deterministic=causal)


@pytest.mark.parametrize("dims", [(192, 128), (64, 128), (40, 72)], ids=["192-128", "64-128", "40-72"])
def test_two_head_dims_forward_and_backward(dims):
    # v (and out) of a head dim of its own: DeepSeek's 192 / 128, a wider value side, neither with a
    # kernel of its own; batched and packed.
    d, dv = dims
    gen = torch.Generator(device=DEV).manual_seed(d * 1000 + dv)
    q = torch.randn(2, 239, 4, d, device=DEV, dtype=torch.bfloat16, generator=gen).requires_grad_()
    k = torch.randn(2, 300, 2, d, device=DEV, dtype=torch.bfloat16, generator=gen).requires_grad_()
    v = torch.randn(2, 300, 2, dv, device=DEV, dtype=torch.bfloat16, generator=gen).requires_grad_()
    check_forward_and_backward(q, k, v, True)
    cu_q = torch.tensor([0, 17, 256], device=DEV, dtype=torch.int32)
    cu_k = torch.tensor([0, 40, 340], device=DEV, dtype=torch.int32)
    qp = torch.randn(256, 4, d, device=DEV, dtype=torch.float16, generator=gen)
    kp = torch.randn(340, 2, d, device=DEV, dtype=torch.float16, generator=gen)
    vp = torch.randn(340, 2, dv, device=DEV, dtype=torch.float16, generator=gen)
    outp = fa4.flash_attn_varlen_func(qp, kp, vp, cu_q, cu_k, 239, 300)
    assert outp.shape == (256, 4, dv)
    check_varlen_sequences(outp, qp, kp, vp, cu_q, cu_k, False)


@pytest.mark.parametrize("d", [96, 192])
def test_padded_head_dims_paged_kvcache(d):
    # A paged cache at a head dim without a kernel: the pages each entry's table names are gathered
    # (the pool's other pages hold NaN and must not matter), its keys cut at cache_seqlens.
    b, hq, hkv, page, pages_each = 3, 8, 2, 16, 6
    gen = torch.Generator(device=DEV).manual_seed(d)
    pool = 40
    kp = torch.full((pool, page, hkv, d), float("nan"), device=DEV, dtype=torch.bfloat16)
    vp = torch.full((pool, page, hkv, d), float("nan"), device=DEV, dtype=torch.bfloat16)
    ids = torch.randperm(pool, generator=torch.Generator().manual_seed(d))[: b * pages_each].view(b, pages_each)
    table = ids.to(device=DEV, dtype=torch.int32)
    for i in range(b):
        for j in range(pages_each):
            kp[ids[i, j]] = torch.randn(page, hkv, d, device=DEV, dtype=torch.bfloat16, generator=gen)
            vp[ids[i, j]] = torch.randn(page, hkv, d, device=DEV, dtype=torch.bfloat16, generator=gen)
    q = torch.randn(b, 2, hq, d, device=DEV, dtype=torch.bfloat16, generator=gen)
    lens = torch.tensor([96, 17, 50], device=DEV, dtype=torch.int32)
    out = call_or_skip(fa4.flash_attn_with_kvcache, q, kp, vp, cache_seqlens=lens, block_table=table, causal=True)
    scale = 1.0 / math.sqrt(d)
    for i, n in enumerate(lens.tolist()):
        ks = kp[ids[i]].reshape(1, pages_each * page, hkv, d)[:, :n]
        vs = vp[ids[i]].reshape(1, pages_each * page, hkv, d)[:, :n]
        ref, _ = reference(q[i:i + 1], ks, vs, scale, True, (-1, -1), lowp=False)
        lp, _ = reference(q[i:i + 1], ks, vs, scale, True, (-1, -1), lowp=True)
        assert_close_by_criterion(out[i:i + 1], lp, ref, f"entry {i}")


@pytest.mark.parametrize("d", [48, 96, 160])
def test_padded_head_dims_kvcache_append_and_varlen(d):
    # A decoding step's append into a contiguous cache (rotary over the whole head), then the
    # attention, against the reference over the cache after the append; and packed sequences.
    b, hq, hkv, cap = 3, 8, 2, 300
    gen = torch.Generator(device=DEV).manual_seed(d)
    kc = torch.randn(b, cap, hkv, d, device=DEV, dtype=torch.bfloat16, generator=gen)
    vc = torch.randn(b, cap, hkv, d, device=DEV, dtype=torch.bfloat16, generator=gen)
    q = torch.randn(b, 1, hq, d, device=DEV, dtype=torch.bfloat16, generator=gen)
    kn = torch.randn(b, 1, hkv, d, device=DEV, dtype=torch.bfloat16, generator=gen)
    vn = torch.randn(b, 1, hkv, d, device=DEV, dtype=torch.bfloat16, generator=gen)
    lens = torch.tensor([0, 40, 298], device=DEV, dtype=torch.int32)
    out = call_or_skip(fa4.flash_attn_with_kvcache, q, kc, vc, k=kn, v=vn, cache_seqlens=lens)
    scale = 1.0 / math.sqrt(d)
    for i, n in enumerate(lens.tolist()):
        assert torch.equal(kc[i, n], kn[i, 0]) and torch.equal(vc[i, n], vn[i, 0]), "append"
        ks, vs = kc[i:i + 1, :n + 1], vc[i:i + 1, :n + 1]
        ref, _ = reference(q[i:i + 1], ks, vs, scale, False, (-1, -1), lowp=False)
        lp, _ = reference(q[i:i + 1], ks, vs, scale, False, (-1, -1), lowp=True)
        assert_close_by_criterion(out[i:i + 1], lp, ref, f"out[{i}]")
    lq, lk = [17, 239, 1], [40, 239, 300]
    cu_q = torch.tensor([0, 17, 256, 257], device=DEV, dtype=torch.int32)
    cu_k = torch.tensor([0, 40, 279, 579], device=DEV, dtype=torch.int32)
    qp = torch.randn(257, hq, d, device=DEV, dtype=torch.float16, generator=gen)
    kp = torch.randn(579, hkv, d, device=DEV, dtype=torch.float16, generator=gen)
    vp = torch.randn(579, hkv, d, device=DEV, dtype=torch.float16, generator=gen)
    outp = fa4.flash_attn_varlen_func(qp, kp, vp, cu_q, cu_k, max(lq), max(lk), causal=True)
    check_varlen_sequences(outp, qp, kp, vp, cu_q, cu_k, True)


# ---------------------------------------------------------------------------------------------
# Variable-length batches

# (query lengths, key lengths, heads_q, heads_kv, head_dim, causal, window, dtype)
VARLEN_CASES = [
    ([17, 239, 0, 1000, 128, 1], [17, 239, 0, 1000, 128, 1], 4, 4, 64, False, (-1, -1), torch.bfloat16),
    ([300, 5, 777], [100, 9, 777], 8, 2, 128, True, (-1, -1), torch.bfloat16),  # causal per sequence
    ([64, 513, 2], [1000, 513, 40], 4, 1, 256, False, (-1, -1), torch.float16),  # MQA
    ([200, 450], [200, 450], 2, 2, 128, False, (64, 0), torch.bfloat16),  # sliding window
    ([1, 1, 1, 1], [3000, 17, 0, 512], 8, 2, 128, True, (-1, -1), torch.bfloat16),  # decoding, a keyless row
]


@pytest.mark.parametrize("case", VARLEN_CASES, ids=[f"varlen{i}" for i in range(len(VARLEN_CASES))])
def test_varlen_matches_each_sequence_alone(case):
    lq, lk, hq, hkv, d, causal, window, dtype = case
    gen = torch.Generator(device=DEV).manual_seed(1234)
    spare = 3  # rows after the last sequence: never written
    tq, tk = sum(lq) + spare, sum(lk) + spare
    q = torch.randn(tq, hq, d, device=DEV, dtype=dtype, generator=gen)
    k = torch.randn(tk, hkv, d, device=DEV, dtype=dtype, generator=gen)
    v = torch.randn(tk, hkv, d, device=DEV, dtype=dtype, generator=gen)
    cu_q = torch.tensor([0] + list(torch.tensor(lq).cumsum(0)), dtype=torch.int32, device=DEV)
    cu_k = torch.tensor([0] + list(torch.tensor(lk).cumsum(0)), dtype=torch.int32, device=DEV)
    out, lse = call_or_skip(fa4.flash_attn_varlen_func, q, k, v, cu_q, cu_k, max(lq), max(lk),
                            causal=causal, window_size=window, return_lse=True)
    assert out.shape == q.shape and lse.shape == (hq, tq)
    scale = 1.0 / math.sqrt(d)
    for b in range(len(lq)):
        q0, k0 = int(cu_q[b]), int(cu_k[b])
        if lq[b] == 0:
            continue
        qs = q[q0:q0 + lq[b]].unsqueeze(0)
        ks, vs = k[k0:k0 + lk[b]].unsqueeze(0), v[k0:k0 + lk[b]].unsqueeze(0)
        ref, lse_ref = reference(qs, ks, vs, scale, causal, window, lowp=False)
        ref_lp, lse_lp = reference(qs, ks, vs, scale, causal, window, lowp=True)
        got = out[q0:q0 + lq[b]].unsqueeze(0)
        assert_close_by_criterion(got, ref_lp, ref, f"sequence {b} ({lq[b]} x {lk[b]})")
        assert_lse(lse[:, q0:q0 + lq[b]].unsqueeze(0), lse_lp, lse_ref)
    out2 = fa4.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lq), max(lk), causal=causal,
                                      window_size=window)
    assert torch.equal(out2[: sum(lq)], out[: sum(lq)]), "two runs differ"


def test_varlen_equal_lengths_match_the_batched_call():
    q, k, v = make_inputs(3, 200, 300, 4, 2, 128, torch.bfloat16, seed=5)
    out = fa4.flash_attn_func(q, k, v, causal=True)
    cu_q = torch.arange(0, 601, 200, dtype=torch.int32, device=DEV)
    cu_k = torch.arange(0, 901, 300, dtype=torch.int32, device=DEV)
    out_v = fa4.flash_attn_varlen_func(q.reshape(600, 4, 128), k.reshape(900, 2, 128),
                                       v.reshape(900, 2, 128), cu_q, cu_k, 200, 300, causal=True)
    ref, _ = reference(q, k, v, 1.0 / math.sqrt(128), True, (-1, -1), lowp=False)
    ref_lp, _ = reference(q, k, v, 1.0 / math.sqrt(128), True, (-1, -1), lowp=True)
    assert_close_by_criterion(out_v.reshape(3, 200, 4, 128), ref_lp, ref, "varlen")
    assert (out_v.reshape(3, 200, 4, 128).double() - out.double()).abs().max().item() <= 2e-2


# (batch, seqlen_q, seqlen_cache, heads_q, heads_kv, head_dim, causal, window, cache layout, dtype)
KVCACHE_CASES = [
    (4, 1, 1000, 8, 2, 128, True, (-1, -1), "bshd", torch.bfloat16),  # decoding, GQA
    (3, 4, 777, 8, 8, 64, True, (-1, -1), "bhsd", torch.bfloat16),  # speculative rows, BHSD cache
    (2, 5, 300, 4, 1, 256, False, (-1, -1), "slice", torch.float16),  # MQA, a cache sliced along seq
    (3, 3, 513, 4, 2, 128, False, (100, 0), "bshd", torch.bfloat16),  # a window
]


def cache_of(t, layout, s_cache):
    """[b, s_cache, h, d] in the given layout: BSHD, a BSHD view of BHSD storage, or the first
    s_cache rows of a longer BSHD cache."""
    if layout == "bhsd":
        return t.transpose(1, 2).contiguous().transpose(1, 2)
    if layout == "slice":
        big = torch.randn(t.shape[0], s_cache + 37, t.shape[2], t.shape[3], device=DEV, dtype=t.dtype)
        big[:, :s_cache] = t
        return big[:, :s_cache]
    return t


@pytest.mark.parametrize("case", KVCACHE_CASES, ids=[f"kvcache{i}" for i in range(len(KVCACHE_CASES))])
def test_kvcache_matches_each_batch_entrys_filled_keys(case):
    b, sq, sc, hq, hkv, d, causal, window, layout, dtype = case
    gen = torch.Generator(device=DEV).manual_seed(4321)
    q = torch.randn(b, sq, hq, d, device=DEV, dtype=dtype, generator=gen)
    k = cache_of(torch.randn(b, sc, hkv, d, device=DEV, dtype=dtype, generator=gen), layout, sc)
    v = cache_of(torch.randn(b, sc, hkv, d, device=DEV, dtype=dtype, generator=gen), layout, sc)
    lens = [sc, 1, 0, sc // 2 + 7][:b]  # full, one key, none, part
    used = torch.tensor(lens, dtype=torch.int32, device=DEV)
    out, lse = call_or_skip(fa4.flash_attn_with_kvcache, q, k, v, cache_seqlens=used, causal=causal,
                            window_size=window, return_softmax_lse=True)
    assert out.shape == q.shape and lse.shape == (b, hq, sq)
    scale = 1.0 / math.sqrt(d)
    for i, n in enumerate(lens):
        qs, ks, vs = q[i:i + 1], k[i:i + 1, :n], v[i:i + 1, :n]
        ref, lse_ref = reference(qs, ks, vs, scale, causal, window, lowp=False)
        ref_lp, lse_lp = reference(qs, ks, vs, scale, causal, window, lowp=True)
        assert_close_by_criterion(out[i:i + 1], ref_lp, ref, f"batch entry {i} ({sq} x {n} of {sc} keys)")
        assert_lse(lse[i:i + 1], lse_lp, lse_ref)
    # The same through flash_attn_varlen_func's seqused_k, and a full cache as flash_attn_func.
    flat_k, flat_v = k.reshape(b * sc, hkv, d), v.reshape(b * sc, hkv, d)
    cu_q = torch.arange(0, b + 1, dtype=torch.int32, device=DEV) * sq
    cu_k = torch.arange(0, b + 1, dtype=torch.int32, device=DEV) * sc
    out_v = fa4.flash_attn_varlen_func(q.reshape(b * sq, hq, d), flat_k, flat_v, cu_q, cu_k, sq, sc, causal=causal,
                                       window_size=window, seqused_k=used)
    assert (out_v.reshape(b, sq, hq, d).double() - out.double()).abs().max().item() <= 2e-2, \
        "varlen's seqused_k and the kvcache call differ"
    full = fa4.flash_attn_with_kvcache(q, k, v, cache_seqlens=sc, causal=causal, window_size=window)
    ref, _ = reference(q, k, v, scale, causal, window, lowp=False)
    ref_lp, _ = reference(q, k, v, scale, causal, window, lowp=True)
    assert_close_by_criterion(full, ref_lp, ref, "every key of the cache")


def caches_nan_past(lens, b, sc, hkv, d, gen):
    """k and v caches [b, sc, hkv, d], random, NaN in each entry's rows past lens[i]."""
    k = torch.randn(b, sc, hkv, d, device=DEV, dtype=torch.bfloat16, generator=gen)
    v = torch.randn(b, sc, hkv, d, device=DEV, dtype=torch.bfloat16, generator=gen)
    for i, n in enumerate(lens):
        k[i, n:] = float("nan")
        v[i, n:] = float("nan")
    return k, v


def paged_caches(k, v, page, seed):
    """k and v [b, sc, hkv, d] as a paged cache: entry i's pages at shuffled ids of a pool of
    2 * b * pages + 1 whose other rows are NaN. Returns (k pool, v pool, table [b, pages + 1]), each
    table row's last column naming a NaN page."""
    b, sc, hkv, d = k.shape
    per = -(-sc // page)
    num_pages = 2 * b * per + 1
    ids = torch.randperm(num_pages, generator=torch.Generator().manual_seed(seed)).to(torch.int32)
    table = ids[:b * (per + 1)].reshape(b, per + 1).to(DEV)
    kp = torch.full((num_pages, page, hkv, d), float("nan"), device=DEV, dtype=k.dtype)
    vp = kp.clone()
    for i in range(b):
        for j in range(per):
            n = min(page, sc - j * page)
            kp[table[i, j], :n] = k[i, j * page:j * page + n]
            vp[table[i, j], :n] = v[i, j * page:j * page + n]
    return kp, vp, table


def expect_each_entry(q, k, v, lens, causal, outs, what, lse=None, starts=None):
    """Each output of `outs` (name: [b, sq, hq, d]) against entry i's reference over its first
    lens[i] keys (from row starts[i] with starts: rows [starts[i], lens[i])), and the LSE where
    given."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    for i, n in enumerate(lens):
        s0 = starts[i] if starts is not None else 0
        qs, ks, vs = q[i:i + 1], k[i:i + 1, s0:n], v[i:i + 1, s0:n]
        ref, lse_ref = reference(qs, ks, vs, scale, causal, (-1, -1), lowp=False)
        ref_lp, lse_lp = reference(qs, ks, vs, scale, causal, (-1, -1), lowp=True)
        for name, out in outs.items():
            assert_close_by_criterion(out[i:i + 1], ref_lp, ref, f"{name} {what} entry {i} ({n} keys)")
        if lse is not None:
            assert_lse(lse[i:i + 1], lse_lp, lse_ref)


@pytest.mark.parametrize("d", [64, 128, 256])
def test_kvcache_rows_past_the_lengths_may_hold_nan(d):
    """A cache's never-written rows may read as NaN: their scores are masked, and their V rows
    must not reach O (0 * NaN), decoding and a few causal rows alike, through the kvcache call and
    varlen's seqused_k."""
    b, sc, hq, hkv = 4, 333, 8, 2
    gen = torch.Generator(device=DEV).manual_seed(77)
    lens = [sc, 200, 1, 129]
    used = torch.tensor(lens, dtype=torch.int32, device=DEV)
    for sq, causal in ((1, False), (3, True)):
        q = torch.randn(b, sq, hq, d, device=DEV, dtype=torch.bfloat16, generator=gen)
        k, v = caches_nan_past(lens, b, sc, hkv, d, gen)
        out = call_or_skip(fa4.flash_attn_with_kvcache, q, k, v, cache_seqlens=used, causal=causal)
        cu_q = torch.arange(0, b + 1, dtype=torch.int32, device=DEV) * sq
        cu_k = torch.arange(0, b + 1, dtype=torch.int32, device=DEV) * sc
        out_v = fa4.flash_attn_varlen_func(q.reshape(b * sq, hq, d), k.reshape(b * sc, hkv, d),
                                           v.reshape(b * sc, hkv, d), cu_q, cu_k, sq, sc, causal=causal,
                                           seqused_k=used).reshape(b, sq, hq, d)
        expect_each_entry(q, k, v, lens, causal, {"kvcache": out, "varlen seqused_k": out_v},
                          f"d{d} {sq} rows causal={causal} (of {sc} keys, NaN past them)")


@pytest.mark.parametrize("d", [64, 128, 256])
def test_kvcache_leftpad_starts_each_entrys_keys_past_its_pad(d):
    """cache_leftpad (flash-attn's): entry i's keys are cache rows [pad[i], cache_seqlens[i]), the
    rows before and after them NaN; decoding and a few causal rows, lengths per entry and one for
    all; then an append with rotary: the new rows land at cache_seqlens[i] and are rotated at those
    cache rows, as q is (causal: cache_seqlens[i] + j), and the keys are [pad[i], cache_seqlens[i] +
    seqlen_new)."""
    b, sc, hq, hkv = 4, 640, 8, 2
    gen = torch.Generator(device=DEV).manual_seed(211 + d)
    pads, lens = [0, 100, 639, 37], [640, 300, 640, 37]  # entry 3: no keys (O = 0, LSE = -inf)
    pad = torch.tensor(pads, dtype=torch.int32, device=DEV)
    for sq, causal, one_length in ((1, False, False), (3, True, False), (2, True, True)):
        ends = [sc] * b if one_length else lens
        q = torch.randn(b, sq, hq, d, device=DEV, dtype=torch.bfloat16, generator=gen)
        k, v = caches_nan_past(ends, b, sc, hkv, d, gen)
        for i, p0 in enumerate(pads):
            k[i, :p0] = float("nan")
            v[i, :p0] = float("nan")
        seqlens = None if one_length else torch.tensor(lens, dtype=torch.int32, device=DEV)
        out, lse = call_or_skip(fa4.flash_attn_with_kvcache, q, k, v, cache_seqlens=seqlens, cache_leftpad=pad,
                                causal=causal, return_softmax_lse=True)
        expect_each_entry(q, k, v, ends, causal, {"leftpad": out}, f"d{d} {sq} rows causal={causal}", lse=lse,
                          starts=pads)
    # An append with rotary: keys [pad, len + s_new), NaN before the pad and past the new rows.
    s_new, rd = 2, 64
    lens = [500, 300, 601, 37]
    cos, sin = rotary_tables(sc, rd, torch.bfloat16)
    q = torch.randn(b, s_new, hq, d, device=DEV, dtype=torch.bfloat16, generator=gen)
    kc, vc = caches_nan_past(lens, b, sc, hkv, d, gen)
    for i, p0 in enumerate(pads):
        kc[i, :p0] = float("nan")
        vc[i, :p0] = float("nan")
    kn = torch.randn(b, s_new, hkv, d, device=DEV, dtype=torch.bfloat16, generator=gen)
    vn = torch.randn(b, s_new, hkv, d, device=DEV, dtype=torch.bfloat16, generator=gen)
    out = fa4.flash_attn_with_kvcache(q, kc, vc, k=kn, v=vn, rotary_cos=cos, rotary_sin=sin,
                                      cache_seqlens=torch.tensor(lens, dtype=torch.int32, device=DEV),
                                      cache_leftpad=pad, causal=True, rotary_interleaved=False)
    q_rot = torch.stack([rotate_reference(q[i], cos, sin, torch.arange(n, n + s_new, device=DEV), False)
                         for i, n in enumerate(lens)]).to(torch.bfloat16)
    for i, n in enumerate(lens):
        k_ref = rotate_reference(kn[i], cos, sin, torch.arange(n, n + s_new, device=DEV), False)
        assert ((kc[i, n:n + s_new].double() - k_ref).abs() <= 2.0 ** -8 * k_ref.abs() + 1e-5).all(), \
            f"entry {i}: the new keys rotated at cache rows {n}.."
        assert torch.equal(vc[i, n:n + s_new], vn[i])
    expect_each_entry(q_rot, kc, vc, [n + s_new for n in lens], True, {"leftpad append": out},
                      f"d{d} append with rotary", starts=pads)


@pytest.mark.parametrize("d", [64, 128, 256])
def test_kvcache_paged_matches_the_reference_with_nan_pages_between(d):
    """A paged cache (block_table): each entry's keys on shuffled pages of a pool whose other pages
    are NaN, as are the spare table columns' pages and the rows past each entry's keys; decoding
    and a few causal rows, pages of 16 to 512 rows (vLLM's 16: several pages a key block), lengths
    given and not."""
    b, hq, hkv = 4, 8, 2
    gen = torch.Generator(device=DEV).manual_seed(91)
    # (Without lengths every key of an entry's pages counts: sc a multiple of the page.)
    for page, sq, causal, with_lens, sc in ((128, 1, False, True, 700), (512, 3, True, True, 700),
                                            (128, 5, False, False, 640), (16, 1, False, True, 700),
                                            (32, 4, True, True, 333), (64, 2, False, False, 640)):
        lens = [sc, 200, 1, 129] if with_lens else [sc] * b
        q = torch.randn(b, sq, hq, d, device=DEV, dtype=torch.bfloat16, generator=gen)
        k, v = caches_nan_past(lens, b, sc, hkv, d, gen)
        kp, vp, table = paged_caches(k, v, page, page + sq)  # a spare column a row: a NaN page
        per = table.shape[1] - 1
        used = torch.tensor(lens, dtype=torch.int32, device=DEV) if with_lens else None
        out, lse = call_or_skip(fa4.flash_attn_with_kvcache, q, kp, vp, cache_seqlens=used, causal=causal,
                                block_table=table[:, :per] if not with_lens else table, return_softmax_lse=True)
        assert out.shape == q.shape and lse.shape == (b, hq, sq)
        expect_each_entry(q, k, v, lens, causal, {"paged": out}, f"d{d} pages of {page}, {sq} rows causal={causal}",
                          lse)


@pytest.mark.parametrize("d", [64, 128, 256])
def test_paged_varlen_matches_the_reference_with_nan_pages_between(d):
    """A paged cache with packed queries (flash_attn_varlen_func with block_table; vLLM's prefill and
    mixed batches): sequences of 1 to 70 query rows on shuffled pages of 16 and 128 rows among NaN
    pages, their keys from seqused_k, from cu_seqlens_k's differences, or the table's; causal and
    not; each sequence against float64, its LSE too."""
    hq, hkv = 8, 2
    gen = torch.Generator(device=DEV).manual_seed(93)
    # (Without lengths every key of a sequence's pages counts: sc a multiple of the pages.)
    qlens, sc = [1, 70, 5, 33], 704
    b = len(qlens)
    cu_q = torch.tensor([0] + list(itertools.accumulate(qlens)), dtype=torch.int32, device=DEV)
    for page, causal, lens_from in ((16, True, "seqused_k"), (128, False, "cu_seqlens_k"), (16, False, "table")):
        lens = [sc] * b if lens_from == "table" else [sc, 200, 70, 129]
        k, v = caches_nan_past(lens, b, sc, hkv, d, gen)
        q = torch.randn(cu_q[-1].item(), hq, d, device=DEV, dtype=torch.bfloat16, generator=gen)
        kp, vp, table = paged_caches(k, v, page, page)
        table = table[:, :-1]  # (no spare column: the table's keys are the sequences')
        used = torch.tensor(lens, dtype=torch.int32, device=DEV) if lens_from == "seqused_k" else None
        cu_k = (torch.tensor([0] + list(itertools.accumulate(lens)), dtype=torch.int32, device=DEV)
                if lens_from == "cu_seqlens_k" else None)
        with torch.no_grad():
            out, lse = call_or_skip(fa4.flash_attn_varlen_func, q, kp, vp, cu_q, cu_k, max(qlens), 0,
                                    causal=causal, return_lse=True, seqused_k=used, block_table=table)
        assert out.shape == q.shape and lse.shape == (hq, q.shape[0])
        scale = 1.0 / math.sqrt(d)
        for i, n in enumerate(lens):
            r0, r1 = cu_q[i].item(), cu_q[i + 1].item()
            qs, ks, vs = q[r0:r1].unsqueeze(0), k[i:i + 1, :n], v[i:i + 1, :n]
            ref, lse_ref = reference(qs, ks, vs, scale, causal, (-1, -1), lowp=False)
            ref_lp, lse_lp = reference(qs, ks, vs, scale, causal, (-1, -1), lowp=True)
            assert_close_by_criterion(out[r0:r1].unsqueeze(0), ref_lp, ref,
                                      f"d{d} pages of {page} ({lens_from}) sequence {i} ({n} keys)")
            assert_lse(lse[:, r0:r1].unsqueeze(0), lse_lp, lse_ref)


def test_kvcache_refuses_what_it_does_not_implement():
    q = torch.randn(2, 1, 4, 64, device=DEV, dtype=torch.bfloat16)
    k = torch.randn(2, 100, 4, 64, device=DEV, dtype=torch.bfloat16)
    # A paged cache's pages of fewer than 16 rows, and a page size that is not a power of two.
    pages = torch.randn(4, 8, 4, 64, device=DEV, dtype=torch.bfloat16)
    with pytest.raises(NotImplementedError, match=r"paged.page_size = 8"):
        fa4.flash_attn_with_kvcache(q, pages, pages, block_table=torch.zeros(2, 2, dtype=torch.int32, device=DEV))
    pages = torch.randn(4, 192, 4, 64, device=DEV, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"paged.page_size = 192: must be a power of two"):
        fa4.flash_attn_with_kvcache(q, pages, pages, block_table=torch.zeros(2, 2, dtype=torch.int32, device=DEV))
    with pytest.raises(ValueError, match=r"block_table has shape \[3, 2\]"):
        fa4.flash_attn_with_kvcache(q, pages, pages, block_table=torch.zeros(3, 2, dtype=torch.int32, device=DEV))
    with pytest.raises(NotImplementedError, match="cache_batch_idx with seqlen_cache = 100"):
        fa4.flash_attn_with_kvcache(q, k, k, cache_batch_idx=torch.arange(2, dtype=torch.int32, device=DEV))
    # A left pad: int32 [batch] on q's device; not with a paged cache (the operator says so too).
    pad = torch.zeros(2, dtype=torch.int32, device=DEV)
    with pytest.raises(ValueError, match=r"fa4::fwd_kvcache: cache_leftpad has shape \[3\]"):
        torch.ops.fa4.fwd_kvcache(q, k, k, None, None, None, -1, None, None, None, False, None, False, -1, -1, True,
                                  0.0, None, torch.zeros(3, dtype=torch.int32, device=DEV))
    with pytest.raises(ValueError, match=r"cache_leftpad must be a CUDA tensor on q's device"):
        torch.ops.fa4.fwd_kvcache(q, k, k, None, None, None, -1, None, None, None, False, None, False, -1, -1, True,
                                  0.0, None, pad.cpu())
    with pytest.raises(NotImplementedError, match=r"cache_leftpad with block_table: not implemented"):
        torch.ops.fa4.fwd_kvcache(q, pages, pages, None, None, None, -1, torch.zeros(2, 2, dtype=torch.int32,
                                  device=DEV), None, None, False, None, False, -1, -1, True, 0.0, None, pad)
    # Appending: one length for every entry must leave room for the new rows; rotary_dim in 16s.
    new = k[:, :3].clone()
    with pytest.raises(ValueError, match=r"cache_seqlen = 98: the new rows"):
        fa4.flash_attn_with_kvcache(q, k.clone(), k.clone(), k=new, v=new, cache_seqlens=98)
    cos = torch.randn(100, 12, device=DEV, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"rotary.rotary_dim = 24: must be a multiple of 16"):
        fa4.flash_attn_with_kvcache(q, k.clone(), k.clone(), k=new, v=new, cache_seqlens=5, rotary_cos=cos,
                                    rotary_sin=cos)
    with pytest.raises(ValueError, match=r"rotary.seqlen_ro = 50: cos and sin need a row for every cache position"):
        fa4.flash_attn_with_kvcache(q, k.clone(), k.clone(), k=new, v=new, cache_seqlens=5, rotary_cos=cos[:50, :8].contiguous(),
                                    rotary_sin=cos[:50, :8].contiguous())
    with pytest.raises(ValueError, match="cache_seqlens = 101"):
        fa4.flash_attn_with_kvcache(q, k, k, cache_seqlens=101)
    with pytest.raises(ValueError, match="cache_seqlens has shape"):
        fa4.flash_attn_with_kvcache(q, k, k, cache_seqlens=torch.zeros(3, dtype=torch.int32, device=DEV))
    # The batched operator's per-entry lengths: int32, contiguous [batch] on q's device.
    for used, what in ((torch.zeros(2, dtype=torch.int64, device=DEV), r"fa4::fwd: seqused_k has dtype"),
                       (torch.zeros(3, dtype=torch.int32, device=DEV), r"must be contiguous \[batch\] \(batch = 2"),
                       (torch.zeros(4, dtype=torch.int32, device=DEV)[::2], r"seqused_k has shape \[2\] and strides"),
                       (torch.zeros(2, dtype=torch.int32), r"seqused_k must be a CUDA tensor on q's device")):
        with pytest.raises(ValueError, match=what):
            torch.ops.fa4.fwd(q, k, k, None, False, -1, -1, True, 0.0, used)
    with pytest.raises(ValueError, match="seqused_k has dtype"):
        cu = torch.tensor([0, 1, 2], dtype=torch.int32, device=DEV)
        fa4.flash_attn_varlen_func(q.reshape(2, 4, 64), k.reshape(200, 4, 64), k.reshape(200, 4, 64), cu,
                                   cu * 100, 1, 100, seqused_k=torch.zeros(2, dtype=torch.int64, device=DEV))
    qg = q.reshape(2, 4, 64).clone().requires_grad_()
    with pytest.raises(NotImplementedError, match="forward only"):
        cu = torch.tensor([0, 1, 2], dtype=torch.int32, device=DEV)
        fa4.flash_attn_varlen_func(qg, k.reshape(200, 4, 64), k.reshape(200, 4, 64), cu, cu * 100, 1, 100,
                                   seqused_k=torch.ones(2, dtype=torch.int32, device=DEV))


def rotary_tables(seqlen_ro, rotary_dim, dtype):
    """cos and sin [seqlen_ro, rotary_dim / 2] of pos * 10000^(-2j / rotary_dim), in dtype."""
    pos = torch.arange(seqlen_ro, device=DEV, dtype=torch.float64)[:, None]
    inv = 10000.0 ** (-torch.arange(0, rotary_dim, 2, device=DEV, dtype=torch.float64) / rotary_dim)
    return torch.cos(pos * inv).to(dtype), torch.sin(pos * inv).to(dtype)


def rotate_reference(x, cos, sin, pos, interleaved):
    """x [s, h, d] turned at positions pos [s] in float64 (flash-attn's apply_rotary_emb), the
    dims past the tables' as they are."""
    x = x.double().clone()
    c, s_ = cos.double()[pos][:, None, :], sin.double()[pos][:, None, :]
    rd = 2 * cos.shape[1]
    if interleaved:
        x1, x2 = x[..., 0:rd:2].clone(), x[..., 1:rd:2].clone()
        x[..., 0:rd:2], x[..., 1:rd:2] = x1 * c - x2 * s_, x1 * s_ + x2 * c
    else:
        x1, x2 = x[..., :rd // 2].clone(), x[..., rd // 2:rd].clone()
        x[..., :rd // 2], x[..., rd // 2:rd] = x1 * c - x2 * s_, x1 * s_ + x2 * c
    return x


# (d, rotary_dim (0: none), interleaved, causal, lengths ("int": one for all), seqlen_new, page size (0: contiguous))
APPEND_CASES = [
    (128, 128, False, True, [0, 17, 400, 511], 1, 0),  # a decoding step, GPT-NeoX rotary
    (64, 32, True, False, "int", 4, 0),  # interleaved over part of the head; q rows all at one position
    (256, 0, False, True, [5, 300, 1, 250], 3, 0),  # no rotary
    (128, 64, False, True, [100, 0, 449, 63], 2, 64),  # a paged cache, new rows across pages
    (128, 128, True, False, "int", 1, 16),  # pages of 16, one length
]


@pytest.mark.parametrize("case", APPEND_CASES, ids=[f"append{i}" for i in range(len(APPEND_CASES))])
def test_kvcache_appends_and_rotates_as_flash_attn(case):
    """flash_attn_with_kvcache with k and v (and rotary_cos / rotary_sin): the new rows land in the
    caches at each entry's length, the keys rotated at their positions (within one rounding of the
    float64 rotation of the same inputs), v bit for bit, every other row untouched; and the
    attention matches float64 over the cache's first length + seqlen_new keys, with q rotated at
    cache_seqlens + i under causal (else all at cache_seqlens)."""
    d, rd, interleaved, causal, lens_case, s_new, page = case
    b, hq, hkv, sc, sq, dtype = 4, 8, 2, 512, None, torch.bfloat16
    sq = s_new
    gen = torch.Generator(device=DEV).manual_seed(1000 + d + rd)
    lens = [123] * b if lens_case == "int" else lens_case
    q = torch.randn(b, sq, hq, d, device=DEV, dtype=dtype, generator=gen)
    kc = torch.randn(b, sc, hkv, d, device=DEV, dtype=dtype, generator=gen)
    vc = torch.randn(b, sc, hkv, d, device=DEV, dtype=dtype, generator=gen)
    kn = torch.randn(b, s_new, hkv, d, device=DEV, dtype=dtype, generator=gen)
    vn = torch.randn(b, s_new, hkv, d, device=DEV, dtype=dtype, generator=gen)
    cos, sin = rotary_tables(sc, rd, dtype) if rd else (None, None)
    seqlens = 123 if lens_case == "int" else torch.tensor(lens, dtype=torch.int32, device=DEV)
    if page:
        kp, vp, table = paged_caches(kc, vc, page, 7)
        table = table[:, :-1]
        out = call_or_skip(fa4.flash_attn_with_kvcache, q, kp, vp, k=kn, v=vn, rotary_cos=cos, rotary_sin=sin,
                           cache_seqlens=seqlens, block_table=table, causal=causal, rotary_interleaved=interleaved)
        per = table.shape[1]
        k_after = torch.stack([kp[table[i]].reshape(per * page, hkv, d)[:sc] for i in range(b)])
        v_after = torch.stack([vp[table[i]].reshape(per * page, hkv, d)[:sc] for i in range(b)])
    else:
        k_after, v_after = kc.clone(), vc.clone()
        out = call_or_skip(fa4.flash_attn_with_kvcache, q, k_after, v_after, k=kn, v=vn, rotary_cos=cos,
                           rotary_sin=sin, cache_seqlens=seqlens, causal=causal, rotary_interleaved=interleaved)
    assert out.shape == q.shape
    if isinstance(seqlens, torch.Tensor):
        assert seqlens.tolist() == lens, "cache_seqlens must not change"
    eps = 2.0 ** -8
    scale = 1.0 / math.sqrt(d)
    for i, n in enumerate(lens):
        pos = torch.arange(n, n + s_new, device=DEV)
        k_ref = rotate_reference(kn[i], cos, sin, pos, interleaved) if rd else kn[i].double()
        got = k_after[i, n:n + s_new].double()
        assert ((got - k_ref).abs() <= eps * k_ref.abs() + 1e-5).all(), f"entry {i}: new keys"
        assert torch.equal(v_after[i, n:n + s_new], vn[i]), f"entry {i}: new values"
        assert torch.equal(k_after[i, :n], kc[i, :n]) and torch.equal(k_after[i, n + s_new:], kc[i, n + s_new:]), \
            f"entry {i}: cache rows outside the new ones changed"
        assert torch.equal(v_after[i, :n], vc[i, :n]), f"entry {i}: cache values before the new ones changed"
        qpos = pos if causal else torch.full((sq,), n, device=DEV)
        q_i = rotate_reference(q[i], cos, sin, qpos, interleaved).to(dtype) if rd else q[i]
        keys = n + s_new
        qs, ks, vs = q_i.unsqueeze(0), k_after[i:i + 1, :keys], v_after[i:i + 1, :keys]
        ref, _ = reference(qs, ks, vs, scale, causal, (-1, -1), lowp=False)
        ref_lp, _ = reference(qs, ks, vs, scale, causal, (-1, -1), lowp=True)
        assert_close_by_criterion(out[i:i + 1], ref_lp, ref, f"d{d} rotary {rd} entry {i} ({keys} keys)")
def test_varlen_compiles_fullgraph():
    q = torch.randn(50, 4, 64, device=DEV, dtype=torch.bfloat16)
    cu = torch.tensor([0, 20, 50], dtype=torch.int32, device=DEV)
    f = torch.compile(lambda q, cu: fa4.flash_attn_varlen_func(q, q, q, cu, cu, 30, 30, causal=True),
                      fullgraph=True)
    assert torch.equal(f(q, cu), fa4.flash_attn_varlen_func(q, q, q, cu, cu, 30, 30, causal=True))


VARLEN_BWD_CASES = [
    ([17, 239, 0, 300], [40, 239, 9, 300], 4, 2, 64, False, (-1, -1), torch.bfloat16),
    ([200, 1, 333], [200, 64, 400], 4, 4, 128, True, (-1, -1), torch.float16),
    ([130, 64], [300, 700], 4, 1, 256, False, (50, 10), torch.bfloat16),
]


@pytest.mark.parametrize("softcap", [0.0, 5.0])
@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("case", VARLEN_BWD_CASES, ids=[f"varlen_bwd{i}" for i in range(len(VARLEN_BWD_CASES))])
def test_varlen_backward_matches_each_sequence_alone(case, deterministic, softcap):
    lq, lk, hq, hkv, d, causal, window, dtype = case
    gen = torch.Generator(device=DEV).manual_seed(4321)
    tq, tk = sum(lq) + 2, sum(lk) + 2
    # Capped: queries scaled by 3, so that many scores reach the cap's bend.
    q = (torch.randn(tq, hq, d, device=DEV, dtype=dtype, generator=gen) * (3 if softcap else 1)).requires_grad_(True)
    k = torch.randn(tk, hkv, d, device=DEV, dtype=dtype, generator=gen).requires_grad_(True)
    v = torch.randn(tk, hkv, d, device=DEV, dtype=dtype, generator=gen).requires_grad_(True)
    dout = torch.randn(tq, hq, d, device=DEV, dtype=dtype, generator=gen)
    cu_q = torch.tensor([0] + list(torch.tensor(lq).cumsum(0)), dtype=torch.int32, device=DEV)
    cu_k = torch.tensor([0] + list(torch.tensor(lk).cumsum(0)), dtype=torch.int32, device=DEV)
    out = call_or_skip(fa4.flash_attn_varlen_func, q, k, v, cu_q, cu_k, max(lq), max(lk), causal=causal,
                       window_size=window, deterministic=deterministic, softcap=softcap)
    out.backward(dout)
    scale = 1.0 / math.sqrt(d)
    for name, g in (("dq", q.grad), ("dk", k.grad), ("dv", v.grad)):
        assert torch.isfinite(g).all(), f"{name}: non-finite"
    # rows past the last sequence get zero gradients
    assert not q.grad[sum(lq):].any() and not k.grad[sum(lk):].any() and not v.grad[sum(lk):].any()
    for b in range(len(lq)):
        q0, k0 = int(cu_q[b]), int(cu_k[b])
        if lq[b] == 0 or lk[b] == 0:
            continue
        sl = lambda x, o, n: x.detach()[o:o + n].unsqueeze(0)  # noqa: E731
        args = (sl(q, q0, lq[b]), sl(k, k0, lk[b]), sl(v, k0, lk[b]), sl(dout, q0, lq[b]))
        exact = reference_grads(*args, scale, causal, window, lowp=False, softcap=softcap)
        plain = reference_grads(*args, scale, causal, window, lowp=True, softcap=softcap)
        got = (sl(q.grad, q0, lq[b]), sl(k.grad, k0, lk[b]), sl(v.grad, k0, lk[b]))
        for name, g, e, p in zip(("dq", "dk", "dv"), got, exact, plain):
            assert_close_by_criterion(g, p, e, f"sequence {b} {name}")


@pytest.mark.parametrize("append", [False, True])
def test_kvcache_batch_idx_picks_each_entrys_cache(append):
    """cache_batch_idx: batch entry b reads (and appends to) cache entry idx[b] of a larger cache,
    decoding and a few causal rows, lengths given and one for all; the other cache entries stay as
    they were."""
    bc, b, sc, hq, hkv, d = 5, 3, 768, 8, 2, 128  # 768: pages of 256
    gen = torch.Generator(device=DEV).manual_seed(95)
    idx = torch.tensor([4, 0, 2], dtype=torch.int32, device=DEV)
    for sq, causal, lens in ((1, False, [768, 100, 1]), (3, True, [300, 700, 5]), (2, True, 400)):
        q = torch.randn(b, sq, hq, d, device=DEV, dtype=torch.bfloat16, generator=gen)
        kc = torch.randn(bc, sc, hkv, d, device=DEV, dtype=torch.bfloat16, generator=gen)
        vc = torch.randn(bc, sc, hkv, d, device=DEV, dtype=torch.bfloat16, generator=gen)
        k0, v0 = kc.clone(), vc.clone()
        per = lens if isinstance(lens, list) else [lens] * b
        seqlens = torch.tensor(per, dtype=torch.int32, device=DEV) if isinstance(lens, list) else lens
        kw = {}
        if append:
            s_new = sq
            per = [min(n, sc - s_new) for n in per]
            seqlens = torch.tensor(per, dtype=torch.int32, device=DEV) if isinstance(lens, list) else per[0]
            kn = torch.randn(b, s_new, hkv, d, device=DEV, dtype=torch.bfloat16, generator=gen)
            vn = torch.randn(b, s_new, hkv, d, device=DEV, dtype=torch.bfloat16, generator=gen)
            kw = dict(k=kn, v=vn)
        out = call_or_skip(fa4.flash_attn_with_kvcache, q, kc, vc, cache_seqlens=seqlens, cache_batch_idx=idx,
                           causal=causal, **kw)
        keys = [n + (sq if append else 0) for n in per]
        for i, e in enumerate(idx.tolist()):
            if append:
                assert torch.equal(kc[e, per[i]:keys[i]], kn[i]) and torch.equal(vc[e, per[i]:keys[i]], vn[i])
        untouched = [e for e in range(bc) if e not in idx.tolist()]
        assert torch.equal(kc[untouched], k0[untouched]) and torch.equal(vc[untouched], v0[untouched])
        expect_each_entry(q, kc[idx.long()], vc[idx.long()], keys, causal, {"cache_batch_idx": out},
                          f"{sq} rows append={append}")



def test_kvcache_calls_replay_in_a_cuda_graph():
    """A decoding step captured in a CUDA graph and replayed: the plain kvcache call, the append
    with rotary (k, v, rotary_cos / rotary_sin), and cache_batch_idx (its table made in the graph:
    new indices written in place between replays reach the replay). Each replay against the same
    call run eagerly on the same inputs."""
    b, bc, sc, hq, hkv, d = 4, 6, 1024, 16, 4, 128
    gen = torch.Generator(device=DEV).manual_seed(97)
    q = torch.randn(b, 1, hq, d, device=DEV, dtype=torch.bfloat16, generator=gen)
    kc = torch.randn(bc, sc, hkv, d, device=DEV, dtype=torch.bfloat16, generator=gen)
    vc = torch.randn(bc, sc, hkv, d, device=DEV, dtype=torch.bfloat16, generator=gen)
    kn = torch.randn(b, 1, hkv, d, device=DEV, dtype=torch.bfloat16, generator=gen)
    vn = torch.randn(b, 1, hkv, d, device=DEV, dtype=torch.bfloat16, generator=gen)
    cos, sin = rotary_tables(sc, d, torch.bfloat16)
    lens = torch.tensor([1000, 17, 512, 3], dtype=torch.int32, device=DEV)
    idx = torch.tensor([5, 0, 3, 1], dtype=torch.int32, device=DEV)
    steps = {
        "kvcache": lambda: fa4.flash_attn_with_kvcache(q, kc[:b], vc[:b], cache_seqlens=lens),
        "append with rotary": lambda: fa4.flash_attn_with_kvcache(q, kc[:b], vc[:b], k=kn, v=vn, rotary_cos=cos,
                                                                  rotary_sin=sin, cache_seqlens=lens, causal=True),
        "cache_batch_idx": lambda: fa4.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, cache_batch_idx=idx),
    }
    for name, step in steps.items():
        with torch.no_grad():
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                step()  # warm-up outside the capture
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = step()
            for new_idx in ([5, 0, 3, 1], [2, 4, 0, 5]):
                idx.copy_(torch.tensor(new_idx, dtype=torch.int32))
                out.fill_(float("nan"))
                graph.replay()
                torch.cuda.synchronize()
                eager = step()
                diff = (out.float() - eager.float()).abs().max().item()  # (NaN if the replay left a row unwritten)
                assert diff <= 1e-2, f"{name}: the replay differs from the eager call by {diff} (indices {new_idx})"


# ---------------------------------------------------------------------------------------------
# Attention sinks (learnable_sink)


def sink_of(hq, seed, shift=0.0, none=True):
    """Each query head's sink score from N(shift, 1); with `none`, head 1 -inf (no sink) where there are
    two or more (not beside rows without keys, whose float64 gradient is NaN there: softmax of all -inf)."""
    gen = torch.Generator(device=DEV).manual_seed(seed)
    s = torch.randn(hq, device=DEV, dtype=torch.float32, generator=gen) + shift
    if none and hq > 1:
        s[1] = float("-inf")
    return s


def reference_sink_grads(q, k, v, sink, dout, scale, causal, window, lowp, o=None):
    """dq, dk, dv, dsink of attention with sinks, as a flash backward computes them (fa4::ref::backward
    and backward_lowp): P from the scores with the sink's column, D = rowsum(dO o O), dS = P (dP - D),
    dq = scale dS K, dk = scale dS^T Q, dv = P^T dO, dsink = -sum of P_sink D. lowp=False: in float64;
    lowp=True: the plain low-precision form, scores and P in fp32, dS rounded to q's dtype, the
    gradients rounded to it (dsink in sink's dtype).
    o: the forward output D is taken from. None: float64 O (lowp=False: then this is the exact
    gradient, by autograd) or the plain form's own rounded O (lowp=True). Given fa4's output, both
    forms check fa4's backward on what it is handed: the output's own rounding moves D, and with it
    the gradients of rows that see few keys beside a sink (their P not averaged over many keys), by
    more than the plain form's one draw of roundings tells, and the forward's test bounds that
    output already."""
    if not lowp and o is None:
        leaves = [t.detach().double().requires_grad_(True) for t in (q, k, v, sink)]
        out, _ = reference(*leaves[:3], scale, causal, window, lowp=False, sink=leaves[3])
        return torch.autograd.grad(out, leaves, dout.double())
    work = torch.float32 if lowp else torch.float64
    b, sq, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    g = hq // hkv
    qf, kf, vf, dof = (t.detach().to(work) for t in (q, k, v, dout))
    kk, vv = kf.repeat_interleave(g, dim=2), vf.repeat_interleave(g, dim=2)
    s = torch.einsum("bihd,bjhd->bhij", qf, kk) * scale
    s = s.masked_fill(~visible_mask(sq, sk, causal, window, q.device), float("-inf"))
    s = torch.cat([s, sink.detach().to(work)[None, :, None, None].expand(b, hq, sq, 1)], dim=-1)
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)
    p_sink, p = p[..., -1], p[..., :-1]
    if o is None:
        o, _ = reference(q.detach(), k.detach(), v.detach(), scale, causal, window, lowp=True, sink=sink.detach())
    D = torch.einsum("bihd,bihd->bhi", dof, o.detach().to(work))
    dp = torch.einsum("bihd,bjhd->bhij", dof, vv)
    ds = p * (dp - D[..., None])
    if lowp:
        ds = ds.to(q.dtype).to(work)
    dq = torch.einsum("bhij,bjhd->bihd", ds, kk) * scale
    dk = (torch.einsum("bhij,bihd->bjhd", ds, qf) * scale).reshape(b, sk, hkv, g, d).sum(3)
    dv = torch.einsum("bhij,bihd->bjhd", p, dof).reshape(b, sk, hkv, g, d).sum(3)
    dsink = -(p_sink * D).sum(dim=(0, 2))
    if lowp:
        return dq.to(q.dtype), dk.to(q.dtype), dv.to(q.dtype), dsink.to(sink.dtype)
    return dq, dk, dv, dsink


# (batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, causal, sink shift)
SINK_CASES = [
    (2, 200, 333, 4, 2, 64, False, 0.0),
    (1, 257, 700, 6, 3, 128, True, 2.0),
    (2, 128, 512, 4, 1, 256, True, -1.0),
    (1, 300, 97, 4, 4, 128, True, 0.0),    # seqlen_q > seqlen_k: rows without keys (O 0, LSE the sink)
    (4, 1, 3000, 32, 8, 128, False, 3.0),  # decoding (query groups folded)
    (2, 4, 1000, 16, 4, 64, True, 0.0),    # a few query rows a head
    (2, 100, 150, 4, 2, 128, False, 30.0),  # the sink above every score: O near 0
]


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("case", SINK_CASES, ids=[f"sink{i}" for i in range(len(SINK_CASES))])
def test_sinks_forward_and_backward_match_the_reference(case, deterministic):
    b, sq, sk, hq, hkv, d, causal, shift = case
    q, k, v = make_inputs(b, sq, sk, hq, hkv, d, torch.bfloat16, seed=sq + sk, requires_grad=True)
    sink = sink_of(hq, seed=hq + d, shift=shift, none=sq <= sk).requires_grad_(True)
    scale = 1.0 / math.sqrt(d)
    out, lse = call_or_skip(fa4.flash_attn_func, q, k, v, causal=causal, return_lse=True, learnable_sink=sink,
                            deterministic=deterministic)
    ref, lse_ref = reference(q.detach(), k.detach(), v.detach(), scale, causal, (-1, -1), lowp=False,
                             sink=sink.detach())
    ref_lp, lse_lp = reference(q.detach(), k.detach(), v.detach(), scale, causal, (-1, -1), lowp=True,
                               sink=sink.detach())
    assert_close_by_criterion(out.detach(), ref_lp, ref, "out")
    assert_lse(lse, lse_lp, lse_ref)
    # Inference (no LSE written) gives the same bits.
    with torch.no_grad():
        assert torch.equal(fa4.flash_attn_func(q, k, v, causal=causal, learnable_sink=sink), out.detach())
    gen = torch.Generator(device=DEV).manual_seed(sq * 7 + sk)  # (not the global RNG: the same dout whichever tests ran before)
    dout = torch.randn(out.shape, device=DEV, dtype=out.dtype, generator=gen)
    grads = torch.autograd.grad(out, (q, k, v, sink), dout)
    # (D from fa4's output in both references: reference_sink_grads)
    exact = reference_sink_grads(q, k, v, sink, dout, scale, causal, (-1, -1), lowp=False, o=out)
    plain = reference_sink_grads(q, k, v, sink, dout, scale, causal, (-1, -1), lowp=True, o=out)
    for name, g, r, l in zip(("dq", "dk", "dv", "dsink"), grads, exact, plain):
        assert g.shape == r.shape and g.dtype == l.dtype
        assert_close_by_criterion(g, l, r, name)
    if sq <= sk:
        assert grads[3][1].item() == 0.0, "a head without a sink has no sink gradient"
    if deterministic:
        again = torch.autograd.grad(fa4.flash_attn_func(q, k, v, causal=causal, learnable_sink=sink,
                                                        deterministic=True), (q, k, v, sink), dout)
        for name, g, h in zip(("dq", "dk", "dv", "dsink"), grads, again):
            assert torch.equal(g, h), f"{name}: deterministic backward gave different bits"


def test_sinks_in_bf16_take_their_gradient_in_bf16():
    # A bf16 parameter goes to the operators as fp32 (exactly): the same output as its fp32 copy's,
    # and its gradient is that copy's rounded to bf16. Sinks of N(3, 1) against 200 keys of N(0, 1)
    # scores weigh about a tenth of each row, so the output moves well past bf16's rounding.
    q, k, v = make_inputs(2, 64, 200, 4, 2, 128, torch.bfloat16, seed=5, requires_grad=True)
    sink = sink_of(4, seed=6, shift=3.0).to(torch.bfloat16).requires_grad_(True)
    sink32 = sink.detach().float().requires_grad_(True)
    out = fa4.flash_attn_func(q, k, v, learnable_sink=sink)
    out32 = fa4.flash_attn_func(q, k, v, learnable_sink=sink32)
    assert torch.equal(out, out32)
    dout = torch.randn_like(out)
    (g,) = torch.autograd.grad(out, sink, dout)
    (g32,) = torch.autograd.grad(out32, sink32, dout)
    assert g.dtype == torch.bfloat16 and torch.equal(g, g32.to(torch.bfloat16))
    plain = fa4.flash_attn_func(q, k, v)
    assert (plain - out).abs().max().item() > 2e-2, "the sinks changed nothing"


def test_sinks_on_packed_sequences_match_each_sequence_alone():
    lq, lk, hq, hkv, d = [17, 239, 1, 300], [17, 239, 3000, 5], 4, 2, 128
    gen = torch.Generator(device=DEV).manual_seed(77)
    tq, tk = sum(lq), sum(lk)
    q = torch.randn(tq, hq, d, device=DEV, dtype=torch.bfloat16, generator=gen).requires_grad_(True)
    k = torch.randn(tk, hkv, d, device=DEV, dtype=torch.bfloat16, generator=gen).requires_grad_(True)
    v = torch.randn(tk, hkv, d, device=DEV, dtype=torch.bfloat16, generator=gen).requires_grad_(True)
    sink = sink_of(hq, seed=78, shift=1.0, none=False).requires_grad_(True)  # (rows without keys: every head a sink)
    cu_q = torch.tensor([0] + list(torch.tensor(lq).cumsum(0)), dtype=torch.int32, device=DEV)
    cu_k = torch.tensor([0] + list(torch.tensor(lk).cumsum(0)), dtype=torch.int32, device=DEV)
    out, lse = fa4.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lq), max(lk), causal=True, return_lse=True,
                                          learnable_sink=sink)
    dout = torch.randn(out.shape, device=DEV, dtype=out.dtype, generator=gen)
    dsink = torch.autograd.grad(out, sink, dout)[0]
    scale = 1.0 / math.sqrt(d)
    dsink_ref = torch.zeros(hq, dtype=torch.float64, device=DEV)
    dsink_lp = torch.zeros(hq, dtype=torch.float32, device=DEV)
    for b in range(len(lq)):
        q0, k0 = int(cu_q[b]), int(cu_k[b])
        qs = q.detach()[q0:q0 + lq[b]].unsqueeze(0)
        ks, vs = k.detach()[k0:k0 + lk[b]].unsqueeze(0), v.detach()[k0:k0 + lk[b]].unsqueeze(0)
        ref, lse_ref = reference(qs, ks, vs, scale, True, (-1, -1), lowp=False, sink=sink.detach())
        ref_lp, lse_lp = reference(qs, ks, vs, scale, True, (-1, -1), lowp=True, sink=sink.detach())
        assert_close_by_criterion(out.detach()[q0:q0 + lq[b]].unsqueeze(0), ref_lp, ref, f"sequence {b}")
        assert_lse(lse.detach()[:, q0:q0 + lq[b]].unsqueeze(0), lse_lp, lse_ref)
        ds, o_b = dout[q0:q0 + lq[b]].unsqueeze(0), out.detach()[q0:q0 + lq[b]].unsqueeze(0)
        dsink_ref += reference_sink_grads(qs, ks, vs, sink, ds, scale, True, (-1, -1), lowp=False, o=o_b)[3]
        dsink_lp += reference_sink_grads(qs, ks, vs, sink, ds, scale, True, (-1, -1), lowp=True, o=o_b)[3]
    assert_close_by_criterion(dsink, dsink_lp, dsink_ref, "dsink")


@pytest.mark.parametrize("d", [64, 128])
def test_kvcache_sinks_on_the_decoding_kernel_and_pages(d):
    # (and packed queries on the same pages: flash_attn_varlen_func's block_table)
    b, sc, hq, hkv = 3, 4096, 16, 4
    gen = torch.Generator(device=DEV).manual_seed(99)
    q = torch.randn(b, 1, hq, d, device=DEV, dtype=torch.bfloat16, generator=gen)
    k = torch.randn(b, sc, hkv, d, device=DEV, dtype=torch.bfloat16, generator=gen)
    v = torch.randn(b, sc, hkv, d, device=DEV, dtype=torch.bfloat16, generator=gen)
    lens = [sc, 1000, 0]
    used = torch.tensor(lens, dtype=torch.int32, device=DEV)
    sink = sink_of(hq, seed=d, shift=2.0)
    out, lse = fa4.flash_attn_with_kvcache(q, k, v, cache_seqlens=used, learnable_sink=sink, return_softmax_lse=True)
    whole = fa4.flash_attn_with_kvcache(q, k, v, learnable_sink=sink)  # every key: one length
    page = 256
    k_pages, v_pages, table = paged_caches(k, v, page, seed=d)
    paged = fa4.flash_attn_with_kvcache(q, k_pages, v_pages, cache_seqlens=used, block_table=table,
                                        learnable_sink=sink)
    cu_q = torch.arange(0, b + 1, dtype=torch.int32, device=DEV)  # packed queries, one a sequence
    packed = fa4.flash_attn_varlen_func(q.reshape(b, hq, d), k_pages, v_pages, cu_q, None, 1, 0, seqused_k=used,
                                        block_table=table, learnable_sink=sink).reshape(b, 1, hq, d)
    scale = 1.0 / math.sqrt(d)
    for i, n in enumerate(lens):
        qs, ks, vs = q[i:i + 1], k[i:i + 1, :n], v[i:i + 1, :n]
        ref, lse_ref = reference(qs, ks, vs, scale, False, (-1, -1), lowp=False, sink=sink)
        ref_lp, lse_lp = reference(qs, ks, vs, scale, False, (-1, -1), lowp=True, sink=sink)
        assert_close_by_criterion(out[i:i + 1], ref_lp, ref, f"entry {i} ({n} keys)")
        assert_lse(lse[i:i + 1], lse_lp, lse_ref)
        assert_close_by_criterion(paged[i:i + 1], ref_lp, ref, f"paged entry {i} ({n} keys)")
        assert_close_by_criterion(packed[i:i + 1], ref_lp, ref, f"packed paged entry {i} ({n} keys)")
    ref, _ = reference(q, k, v, scale, False, (-1, -1), lowp=False, sink=sink)
    ref_lp, _ = reference(q, k, v, scale, False, (-1, -1), lowp=True, sink=sink)
    assert_close_by_criterion(whole, ref_lp, ref, "every key")


@pytest.mark.parametrize("deterministic", [False, True])
def test_sinks_with_a_sliding_window_as_gpt_oss_has_them(deterministic):
    # gpt-oss's local layers: head dim 64, 8 query heads a KV head, a sliding window of 128 keys
    # (window_size (127, 0), causal) and a sink a head. A prefill's forward and backward, then
    # decoding steps against the cache (one query row and four a head, each entry its own length),
    # which fold the query groups into rows: each row takes its own head's sink.
    b, s, hq, hkv, d, window = 2, 700, 16, 2, 64, (127, 0)
    q, k, v = make_inputs(b, s, s, hq, hkv, d, torch.bfloat16, seed=2025, requires_grad=True)
    sink = sink_of(hq, seed=2026, shift=1.0, none=False).requires_grad_(True)
    scale = 1.0 / math.sqrt(d)
    out, lse = call_or_skip(fa4.flash_attn_func, q, k, v, causal=True, window_size=window, return_lse=True,
                            learnable_sink=sink, deterministic=deterministic)
    ref, lse_ref = reference(q.detach(), k.detach(), v.detach(), scale, True, window, lowp=False, sink=sink.detach())
    ref_lp, lse_lp = reference(q.detach(), k.detach(), v.detach(), scale, True, window, lowp=True, sink=sink.detach())
    assert_close_by_criterion(out.detach(), ref_lp, ref, "out")
    assert_lse(lse, lse_lp, lse_ref)
    gen = torch.Generator(device=DEV).manual_seed(2027)
    dout = torch.randn(out.shape, device=DEV, dtype=out.dtype, generator=gen)
    grads = torch.autograd.grad(out, (q, k, v, sink), dout)
    exact = reference_sink_grads(q, k, v, sink, dout, scale, True, window, lowp=False, o=out)
    plain = reference_sink_grads(q, k, v, sink, dout, scale, True, window, lowp=True, o=out)
    for name, g, r, l in zip(("dq", "dk", "dv", "dsink"), grads, exact, plain):
        assert_close_by_criterion(g, l, r, name)
    lens = [s, 333]
    used = torch.tensor(lens, dtype=torch.int32, device=DEV)
    kc, vc, sk_ = k.detach(), v.detach(), sink.detach()
    for rows in (1, 4):
        qd = q.detach()[:, -rows:]
        dec = fa4.flash_attn_with_kvcache(qd, kc, vc, cache_seqlens=used, causal=True, window_size=window,
                                          learnable_sink=sk_)
        for i, n in enumerate(lens):
            r64, _ = reference(qd[i:i + 1], kc[i:i + 1, :n], vc[i:i + 1, :n], scale, True, window, lowp=False, sink=sk_)
            rlp, _ = reference(qd[i:i + 1], kc[i:i + 1, :n], vc[i:i + 1, :n], scale, True, window, lowp=True, sink=sk_)
            assert_close_by_criterion(dec[i:i + 1], rlp, r64, f"decoding {rows} rows, entry {i} ({n} keys)")


def test_sinks_with_a_sliding_window_on_packed_sequences():
    # gpt-oss's local layers on a packed batch (flash_attn_varlen_func): d64, 8 query heads a KV head,
    # window (127, 0) causal, a sink a head; sequences shorter than the window, longer, and one row.
    lens, hq, hkv, d, window = [300, 90, 1, 517], 16, 2, 64, (127, 0)
    gen = torch.Generator(device=DEV).manual_seed(2028)
    total = sum(lens)
    q = torch.randn(total, hq, d, device=DEV, dtype=torch.bfloat16, generator=gen).requires_grad_(True)
    k = torch.randn(total, hkv, d, device=DEV, dtype=torch.bfloat16, generator=gen).requires_grad_(True)
    v = torch.randn(total, hkv, d, device=DEV, dtype=torch.bfloat16, generator=gen).requires_grad_(True)
    sink = sink_of(hq, seed=2029, shift=0.5, none=False).requires_grad_(True)
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32, device=DEV)
    out, lse = call_or_skip(fa4.flash_attn_varlen_func, q, k, v, cu, cu, max(lens), max(lens), causal=True,
                            window_size=window, return_lse=True, learnable_sink=sink)
    dout = torch.randn(out.shape, device=DEV, dtype=out.dtype, generator=gen)
    grads = torch.autograd.grad(out, (q, k, v, sink), dout)
    scale = 1.0 / math.sqrt(d)
    dsink_ref = torch.zeros(hq, dtype=torch.float64, device=DEV)
    dsink_lp = torch.zeros(hq, dtype=torch.float32, device=DEV)
    for b, n in enumerate(lens):
        r = slice(int(cu[b]), int(cu[b]) + n)
        qs, ks, vs = (t.detach()[r].unsqueeze(0) for t in (q, k, v))
        os_, ds = out.detach()[r].unsqueeze(0), dout[r].unsqueeze(0)
        ref, lse_ref = reference(qs, ks, vs, scale, True, window, lowp=False, sink=sink.detach())
        ref_lp, lse_lp = reference(qs, ks, vs, scale, True, window, lowp=True, sink=sink.detach())
        assert_close_by_criterion(os_, ref_lp, ref, f"sequence {b} ({n} rows)")
        assert_lse(lse.detach()[:, r].unsqueeze(0), lse_lp, lse_ref)
        exact = reference_sink_grads(qs, ks, vs, sink, ds, scale, True, window, lowp=False, o=os_)
        plain = reference_sink_grads(qs, ks, vs, sink, ds, scale, True, window, lowp=True, o=os_)
        for name, g, e, l in zip(("dq", "dk", "dv"), grads[:3], exact[:3], plain[:3]):
            assert_close_by_criterion(g[r].unsqueeze(0), l, e, f"{name} of sequence {b}")
        dsink_ref += exact[3]
        dsink_lp += plain[3]
    assert_close_by_criterion(grads[3], dsink_lp, dsink_ref, "dsink")


# ---------------------------------------------------------------------------------------------
# fp8 (torch.float8_e4m3fn q, k, v; bf16 out), FlashAttention-3's descales


def fp8_reference_lowp(q8, k8, v8, qd, kd, vd, scale, causal, window):
    """The plain fp8 attention fa4's fp8 forward is judged against: scores in fp32 from the e4m3
    values, P = 2^(x - m + 8) rounded to e4m3 (unnormalised), P V in fp32 divided by the fp32 row
    sum, times v's descale, rounded to bf16."""
    b, sq, hq, d = q8.shape
    sk, hkv = k8.shape[1], k8.shape[2]
    g = hq // hkv
    f32 = torch.float32
    kk = k8.to(f32).repeat_interleave(g, dim=2)
    vv = v8.to(f32).repeat_interleave(g, dim=2)
    qs = (qd * kd).repeat_interleave(g, dim=1)[:, :, None, None]  # [b, hq, 1, 1]
    x = torch.einsum("bihd,bjhd->bhij", q8.to(f32), kk) * (scale * math.log2(math.e)) * qs
    x = x.masked_fill(~visible_mask(sq, sk, causal, window, q8.device), float("-inf"))
    m = x.amax(dim=-1, keepdim=True)
    e = torch.exp2(x - torch.where(torch.isinf(m), torch.zeros_like(m), m) + 8.0)
    l = e.sum(dim=-1, keepdim=True)
    pe = e.to(torch.float8_e4m3fn).to(f32)
    o = torch.einsum("bhij,bjhd->bihd", pe / torch.where(l > 0, l, torch.ones_like(l)), vv)
    o = o * vd.repeat_interleave(g, dim=1)[:, None, :, None]
    return o.to(torch.bfloat16)


FP8_CASES = [
    # b, sq, sk, hq, hkv, d, causal, window, layout
    (2, 239, 1000, 4, 1, 128, False, (-1, -1), "bshd"),
    (1, 1000, 239, 4, 2, 128, True, (-1, -1), "bhsd"),
    (2, 17, 17, 2, 2, 64, True, (-1, -1), "bshd"),
    (1, 1, 4097, 8, 1, 128, False, (-1, -1), "bshd"),
    (1, 777, 777, 2, 1, 64, False, (64, 16), "bhsd"),
    (2, 300, 700, 4, 2, 256, True, (-1, -1), "bshd"),
]


@pytest.mark.parametrize("case", FP8_CASES, ids=lambda c: "-".join(map(str, c)))
def test_fp8_forward_matches_reference(case):
    b, sq, sk, hq, hkv, d, causal, window, layout = case
    g = torch.Generator(device=DEV).manual_seed(sq * 31 + sk)
    f8 = torch.float8_e4m3fn

    def draw(s, h):
        x = torch.randn(b, s, h, d, device=DEV, generator=g).to(f8)
        return x.transpose(1, 2).contiguous().transpose(1, 2) if layout == "bhsd" else x

    q8, k8, v8 = draw(sq, hq), draw(sk, hkv), draw(sk, hkv)
    qd, kd, vd = (torch.rand(b, hkv, device=DEV, generator=g) + 0.5 for _ in range(3))
    out, lse = call_or_skip(fa4.flash_attn_func, q8, k8, v8, causal=causal, window_size=window, return_lse=True,
                            q_descale=qd, k_descale=kd, v_descale=vd)
    assert out.dtype == torch.bfloat16 and out.shape == (b, sq, hq, d)
    scale = 1.0 / math.sqrt(d)
    grp = hq // hkv
    rq = q8.double() * qd.double().repeat_interleave(grp, dim=1)[:, None, :, None]
    rk, rv = (t.double() * s.double()[:, None, :, None] for t, s in ((k8, kd), (v8, vd)))
    ref, lse_ref = reference(rq, rk, rv, scale, causal, window, lowp=False)
    lowp = fp8_reference_lowp(q8, k8, v8, qd, kd, vd, scale, causal, window)
    assert torch.isfinite(out).all()
    err = (out.double() - ref).abs().max().item()
    err_lp = (lowp.double() - ref).abs().max().item()
    assert err <= 2 * err_lp + 2e-3, f"max|err| {err:.3e} > 2 x plain fp8's {err_lp:.3e} + 2e-3"
    rel = ((out.double() - ref).norm() / ref.norm()).item()
    assert rel <= 3e-2, f"relative Frobenius error {rel:.3e}"
    fin = ~torch.isinf(lse_ref)
    assert torch.equal(torch.isinf(lse), ~fin)
    assert (lse.double()[fin] - lse_ref[fin]).abs().max().item() <= 5e-3
    # Without descales: the e4m3 values as they are; and with_lse off gives the same out.
    out1 = fa4.flash_attn_func(q8, k8, v8, causal=causal, window_size=window)
    ref1, _ = reference(q8.double(), k8.double(), v8.double(), scale, causal, window, lowp=False)
    assert ((out1.double() - ref1).norm() / ref1.norm()).item() <= 3e-2


def test_fp8_refusals():
    q8 = torch.randn(1, 64, 2, 128, device=DEV).to(torch.float8_e4m3fn)
    with pytest.raises(NotImplementedError, match="softcap"):
        fa4.flash_attn_func(q8, q8, q8, softcap=30.0)
    with pytest.raises(ValueError, match=r"q_descale has shape \[2\]"):
        fa4.flash_attn_func(q8, q8, q8, q_descale=torch.ones(2, device=DEV))
    with pytest.raises(ValueError, match="must be torch.float8_e4m3fn"):
        qb = torch.randn(1, 64, 2, 128, device=DEV, dtype=torch.bfloat16)
        fa4.flash_attn_func(qb, qb, qb, q_descale=torch.ones(1, 2, device=DEV))
    q64 = torch.randn(1, 64, 2, 64, device=DEV).to(torch.float8_e4m3fn)
    with pytest.raises(NotImplementedError, match="learnable_sink"):
        fa4.flash_attn_func(q64, q64, q64, learnable_sink=torch.zeros(2, device=DEV))
    lse = torch.zeros(1, 2, 64, device=DEV)
    with pytest.raises(NotImplementedError, match="forward only"):
        torch.ops.fa4.bwd(q8, q8, q8, q8, q8, lse, None, False, -1, -1, False)


def test_fp8_compile_matches_eager():
    # (torch.library.opcheck's schema test multiplies its inputs, which torch has no kernel for in
    # fp8: the fake kernel is checked by the compiled graph, which runs on its shapes and dtypes.)
    q8 = torch.randn(1, 200, 4, 64, device=DEV).to(torch.float8_e4m3fn)
    k8 = torch.randn(1, 300, 2, 64, device=DEV).to(torch.float8_e4m3fn)
    d = torch.rand(1, 2, device=DEV) + 0.5
    eager = fa4.flash_attn_func(q8, k8, k8, causal=True, q_descale=d, k_descale=d, v_descale=d)
    f = lambda a, b, c: fa4.flash_attn_func(a, b, b, causal=True, q_descale=c, k_descale=c, v_descale=c)
    torch._dynamo.reset()
    out = torch.compile(f, fullgraph=True)(q8, k8, d)
    torch.testing.assert_close(out, eager, atol=0, rtol=0)
