"""fa4: FlashAttention-4-style attention for Hopper (sm_90a), as PyTorch operators.

    import fa4
    out = fa4.flash_attn_func(q, k, v, causal=True)          # q, k, v: [batch, seqlen, heads, dim]

The operators torch.ops.fa4.fwd and torch.ops.fa4.bwd come from the C++ extension that
python/build.sh builds, or `pip install --no-build-isolation ./python` installs beside this file
(python/csrc/fa4_torch.cpp over the fa4 library); this module loads it,
gives the operators fake (meta) kernels so torch.compile traces them without graph breaks, and
wires the backward through autograd.

Errors from fa4 keep their message: an invalid argument raises ValueError, a configuration with no
kernel NotImplementedError, anything else RuntimeError.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional, Tuple

import torch

__all__ = ["flash_attn_func", "flash_attn_varlen_func", "flash_attn_with_kvcache", "flash_attn_qkvpacked_func",
           "flash_attn_kvpacked_func", "flash_attn_varlen_qkvpacked_func", "flash_attn_varlen_kvpacked_func",
           "scaled_dot_product_attention", "library_path", "LIBRARY_NAME", "__version__"]
__version__ = "0.1.0"

LIBRARY_NAME = "fa4_C.so"
# Where python/build.sh puts the extension, relative to this package.
_DEFAULT_BUILD_DIR = Path(__file__).resolve().parent.parent / "build" / "ext"


def library_path() -> Path:
    """The extension to load: $FA4_TORCH_LIB if set; else the one installed beside this file (pip
    install ./python); else python/build/ext/fa4_C.so (python/build.sh)."""
    env = os.environ.get("FA4_TORCH_LIB")
    if env:
        return Path(env)
    installed = sorted(Path(__file__).resolve().parent.glob("fa4_C*.so"))
    return installed[0] if installed else _DEFAULT_BUILD_DIR / LIBRARY_NAME


def _load_library() -> None:
    if hasattr(torch.ops, "fa4") and hasattr(torch.ops.fa4, "fwd"):
        return  # already registered in this process (e.g. by the build helper)
    path = library_path()
    if not path.is_file():
        raise ImportError(
            f"fa4: the PyTorch extension {path} is not built; run `bash python/build.sh` or "
            "`pip install --no-build-isolation ./python` (or set FA4_TORCH_LIB to a built fa4_C.so)"
        )
    torch.ops.load_library(str(path))


_load_library()


# ---------------------------------------------------------------------------------------------
# Fake kernels: shapes, dtypes and strides of what the CUDA kernels return (all contiguous).


def _check_fake_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, op: str) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise ValueError(
                f"{op}: {name} has shape {tuple(t.shape)}: must be 4-d [batch, seqlen, heads, head_dim]"
            )
    if k.shape[0] != q.shape[0] or k.shape[3] != q.shape[3]:
        raise ValueError(
            f"{op}: k has shape {tuple(k.shape)}, q has {tuple(q.shape)}: "
            "batch (dim 0) and head_dim (dim 3) must match"
        )
    if v.shape[:3] != k.shape[:3]:
        raise ValueError(f"{op}: v has shape {tuple(v.shape)}: must be k's shape {tuple(k.shape)} but for its "
                         "last dim (its own head dim)")


@torch.library.register_fake("fa4::fwd")
def _fwd_fake(q, k, v, softmax_scale, causal, window_left, window_right, with_lse=True, softcap=0.0,
              seqused_k=None, sink=None):
    _check_fake_qkv(q, k, v, "fa4::fwd")
    b, sq, hq, _ = q.shape
    out = q.new_empty((b, sq, hq, v.shape[3]), dtype=_out_dtype(q))
    lse = q.new_empty((b, hq, sq) if with_lse else (0,), dtype=torch.float32)
    return out, lse


def _out_dtype(q: torch.Tensor) -> torch.dtype:
    """The output's dtype for inputs like q: q's, but bf16 for fp8 (e4m3) inputs."""
    return torch.bfloat16 if q.dtype == torch.float8_e4m3fn else q.dtype


@torch.library.register_fake("fa4::fwd_fp8")
def _fwd_fp8_fake(q, k, v, softmax_scale, causal, window_left, window_right, with_lse=True, q_descale=None,
                  k_descale=None, v_descale=None):
    _check_fake_qkv(q, k, v, "fa4::fwd_fp8")
    if q.dtype != torch.float8_e4m3fn:
        raise ValueError(f"fa4::fwd_fp8: q has dtype {q.dtype}: must be torch.float8_e4m3fn")
    b, sq, hq, _ = q.shape
    lse = q.new_empty((b, hq, sq) if with_lse else (0,), dtype=torch.float32)
    return q.new_empty((b, sq, hq, v.shape[3]), dtype=torch.bfloat16), lse


@torch.library.register_fake("fa4::fwd_paged")
def _fwd_paged_fake(q, k_cache, v_cache, block_table, softmax_scale, causal, window_left, window_right,
                    with_lse=True, softcap=0.0, seqused_k=None):
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if t.dim() != 4:
            raise ValueError(f"fa4::fwd_paged: {name} has shape {tuple(t.shape)}: must be 4-d")
    b, sq, hq, _ = q.shape
    lse = q.new_empty((b, hq, sq) if with_lse else (0,), dtype=torch.float32)
    return q.new_empty((b, sq, hq, v_cache.shape[3])), lse


@torch.library.register_fake("fa4::bwd")
def _bwd_fake(dout, q, k, v, out, lse, softmax_scale, causal, window_left, window_right,
              deterministic, softcap=0.0, sink=None, dsink=None):
    _check_fake_qkv(q, k, v, "fa4::bwd")
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


@torch.library.register_fake("fa4::fwd_varlen")
def _fwd_varlen_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
                     causal, window_left, window_right, with_lse=True, softcap=0.0, seqused_k=None, sink=None):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 3:
            raise ValueError(f"fa4::fwd_varlen: {name} has shape {tuple(t.shape)}: must be 3-d "
                             "[total, heads, head_dim] (packed sequences)")
    total_q, hq, _ = q.shape
    lse = q.new_empty((hq, total_q) if with_lse else (0,), dtype=torch.float32)
    return q.new_empty((total_q, hq, v.shape[2])), lse


@torch.library.register_fake("fa4::fwd_paged_varlen")
def _fwd_paged_varlen_fake(q, k_cache, v_cache, block_table, cu_seqlens_q, max_seqlen_q, softmax_scale, causal,
                           window_left, window_right, with_lse=True, softcap=0.0, seqused_k=None,
                           cu_seqlens_k=None, sink=None):
    if q.dim() != 3:
        raise ValueError(f"fa4::fwd_paged_varlen: q has shape {tuple(q.shape)}: must be 3-d "
                         "[total_q, heads_q, head_dim] (packed sequences)")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if t.dim() != 4:
            raise ValueError(f"fa4::fwd_paged_varlen: {name} has shape {tuple(t.shape)}: must be 4-d")
    total_q, hq, _ = q.shape
    lse = q.new_empty((hq, total_q) if with_lse else (0,), dtype=torch.float32)
    return q.new_empty((total_q, hq, v_cache.shape[3])), lse


@torch.library.register_fake("fa4::bwd_varlen")
def _bwd_varlen_fake(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                     softmax_scale, causal, window_left, window_right, deterministic, softcap=0.0, sink=None,
                     dsink=None):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


@torch.library.register_fake("fa4::fwd_kvcache")
def _fwd_kvcache_fake(q, k_cache, v_cache, k, v, cache_seqlens, cache_seqlen, block_table, rotary_cos, rotary_sin,
                      rotary_interleaved, softmax_scale, causal, window_left, window_right, with_lse=True,
                      softcap=0.0, cache_batch_idx=None, cache_leftpad=None, sink=None):
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("k", k), ("v", v)):
        if t is not None and t.dim() != 4:
            raise ValueError(f"fa4::fwd_kvcache: {name} has shape {tuple(t.shape)}: must be 4-d")
    b, sq, hq, d = q.shape
    lse = q.new_empty((b, hq, sq) if with_lse else (0,), dtype=torch.float32)
    return q.new_empty((b, sq, hq, d)), lse


@torch.library.register_fake("fa4::append_kv")
def _append_kv_fake(q, k_cache, v_cache, k, v, cache_seqlens, cache_seqlen, block_table, rotary_cos, rotary_sin,
                    rotary_interleaved, causal, window_left, window_right):
    q_rotated = q.new_empty(q.shape) if rotary_cos is not None else q.new_empty((0,))
    return q_rotated, q.new_empty((q.shape[0],), dtype=torch.int32)


# ---------------------------------------------------------------------------------------------
# Autograd: forward saves what the backward operator reads.


def _sink_grad(ctx, sink, index):
    """The fp32 buffer the backward operator writes the sinks' gradient into, where sink (input
    `index` of the autograd Function) needs one; else None."""
    return torch.empty_like(sink) if sink is not None and ctx.needs_input_grad[index] else None


class _FlashAttnFunc(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, softmax_scale, causal, window_left, window_right, deterministic, softcap, sink=None):
        out, lse = torch.ops.fa4.fwd(q, k, v, softmax_scale, causal, window_left, window_right, True, softcap,
                                     None, sink)
        ctx.save_for_backward(q, k, v, out, lse, sink)
        ctx.softcap = softcap
        ctx.softmax_scale = softmax_scale
        ctx.causal = causal
        ctx.window_left = window_left
        ctx.window_right = window_right
        ctx.deterministic = deterministic
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse, sink = ctx.saved_tensors
        # Autograd may hand a broadcast or strided gradient (e.g. of out.sum()); fa4 needs a
        # contiguous head_dim and aligned strides.
        dout = dout.contiguous()
        dsink = _sink_grad(ctx, sink, 9)
        dq, dk, dv = torch.ops.fa4.bwd(
            dout, q, k, v, out, lse, ctx.softmax_scale, ctx.causal, ctx.window_left,
            ctx.window_right, ctx.deterministic, ctx.softcap, sink, dsink,
        )
        return dq, dk, dv, None, None, None, None, None, None, dsink


class _FlashAttnVarlenFunc(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
                window_left, window_right, deterministic, softcap, sink=None):
        out, lse = torch.ops.fa4.fwd_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                            softmax_scale, causal, window_left, window_right, True, softcap, None,
                                            sink)
        ctx.save_for_backward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, sink)
        ctx.args = (max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left, window_right, deterministic,
                    softcap)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, sink = ctx.saved_tensors
        max_q, max_k, scale, causal, left, right, deterministic, softcap = ctx.args
        dsink = _sink_grad(ctx, sink, 13)
        dq, dk, dv = torch.ops.fa4.bwd_varlen(
            dout.contiguous(), q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_q, max_k, scale, causal,
            left, right, deterministic, softcap, sink, dsink,
        )
        return dq, dk, dv, None, None, None, None, None, None, None, None, None, None, dsink


def _options(name: str, softmax_scale, window_size, softcap, dropout_p, alibi_slopes):
    """The options flash_attn_func and flash_attn_varlen_func share, checked and normalised for the
    operators: (softmax_scale as a float or None, window_left, window_right, softcap as a float)."""
    _refuse_unimplemented(name, dropout_p, alibi_slopes)
    try:
        softcap = float(softcap)
    except (TypeError, ValueError):
        raise ValueError(f"{name}: softcap = {softcap!r}: must be a float >= 0 (0.0 turns it off)") from None
    try:
        left, right = window_size
        left, right = int(left), int(right)
    except (TypeError, ValueError):
        raise ValueError(
            f"{name}: window_size = {window_size!r}: must be a pair (left, right) of ints, -1 for "
            "unbounded"
        ) from None
    return (None if softmax_scale is None else float(softmax_scale)), left, right, softcap


def _sink(name: str, learnable_sink, heads_q: int, device):
    """learnable_sink as the operators take it: fp32, contiguous [heads_q] on q's device (the tensor
    itself where it is one already; else a differentiable conversion, so that the gradient reaches the
    caller's tensor in its own dtype); None stays None."""
    if learnable_sink is None:
        return None
    if not isinstance(learnable_sink, torch.Tensor) or tuple(learnable_sink.shape) != (heads_q,) or \
            not learnable_sink.is_floating_point():
        what = (f"shape {tuple(learnable_sink.shape)} and dtype {learnable_sink.dtype}"
                if isinstance(learnable_sink, torch.Tensor) else type(learnable_sink).__name__)
        raise ValueError(f"{name}: learnable_sink has {what}: must be a floating-point tensor [heads_q] "
                         f"(heads_q = {heads_q})")
    return learnable_sink.to(device=device, dtype=torch.float32).contiguous()


def flash_attn_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    deterministic: bool = False,
    return_lse: bool = False,
    *,
    dropout_p: float = 0.0,
    alibi_slopes: Optional[torch.Tensor] = None,
    return_attn_probs: bool = False,
    learnable_sink: Optional[torch.Tensor] = None,
    q_descale: Optional[torch.Tensor] = None,
    k_descale: Optional[torch.Tensor] = None,
    v_descale: Optional[torch.Tensor] = None,
):
    """Attention over BSHD tensors, flash-attn style.

    q: [batch, seqlen_q, heads_q, head_dim]; k, v: [batch, seqlen_k, heads_kv, head_dim], bf16 or
    fp16 on one CUDA device, head_dim contiguous (other strides free: BHSD storage viewed as BSHD
    works). heads_q must be a multiple of heads_kv (GQA/MQA). head_dim: any multiple of 8 up to 256
    (64, 128 and 256 on kernels of their own, and 192 in the forward; others on the next one's over
    zero-padded copies);
    v may have a head dim of its own (DeepSeek's 192 / 128), out then v's.
    softmax_scale: default 1/sqrt(head_dim). causal: bottom-right aligned (query i sees keys
    j <= i + seqlen_k - seqlen_q). window_size: (left, right), -1 = unbounded.
    softcap: > 0 soft-caps each score, softcap * tanh(score / softcap) (Gemma 2), forward and
    backward. deterministic: deterministic backward.
    Returns out [batch, seqlen_q, heads_q, v's head_dim], and with return_lse also the fp32
    log-sum-exp [batch, heads_q, seqlen_q] (natural log; -inf for a row that sees no key). An
    inference call (no gradient needed, return_lse False) has the kernels write no LSE.
    Keyword arguments of flash-attn's other versions, for code written against them:
    dropout_p must be 0.0 and alibi_slopes None (neither is implemented); return_attn_probs is
    return_lse, as in FlashAttention-3 (out, lse).
    learnable_sink (attention sinks, gpt-oss; FlashAttention-4's argument): a floating-point tensor
    [heads_q], each query head's sink logit: every row of head h takes learnable_sink[h] as one more
    score beside its keys' (in the units of the scaled, soft-capped scores), with no value, so its
    weight exp(sink - lse) leaves the row's output. The LSE then includes it. Differentiable: its
    gradient is -sum over the head's rows of exp(sink - lse) * rowsum(dout * out).
    fp8 (FlashAttention-3's fp8 forward): q, k, v torch.float8_e4m3fn, head_dim a multiple of 16 up to 256, forward
    only (no gradient), out bf16; q_descale, k_descale, v_descale (optional, fp32 [batch, heads_kv],
    contiguous, positive) are what each (batch entry, KV head)'s e4m3 values are multiplied by. No
    softcap or learnable_sink with fp8.
    """
    softmax_scale, window_left, window_right, softcap = _options(
        "fa4.flash_attn_func", softmax_scale, window_size, softcap, dropout_p, alibi_slopes)
    return_lse = bool(return_lse or return_attn_probs)
    causal = bool(causal)
    if q.dtype == torch.float8_e4m3fn or any(d is not None for d in (q_descale, k_descale, v_descale)):
        if softcap != 0.0 or learnable_sink is not None:
            raise NotImplementedError("fa4.flash_attn_func: softcap and learnable_sink are not supported with fp8 "
                                      "inputs (the fp8 forward runs plain, causal and windowed attention)")
        if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
            raise NotImplementedError("fa4.flash_attn_func: fp8 inputs that require grad: the fp8 path is forward "
                                      "only (no backward); detach them, or run under torch.no_grad()")
        out, lse = torch.ops.fa4.fwd_fp8(q, k, v, softmax_scale, causal, window_left, window_right, return_lse,
                                         q_descale, k_descale, v_descale)
        return (out, lse) if return_lse else out
    sink = _sink("fa4.flash_attn_func", learnable_sink, q.shape[2], q.device)
    needs_grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad or
                                              (sink is not None and sink.requires_grad))
    if needs_grad:
        out, lse = _FlashAttnFunc.apply(
            q, k, v, softmax_scale, causal, window_left, window_right, bool(deterministic), softcap, sink
        )
    else:
        # Inference: the kernels write an LSE only when the caller asks for it.
        out, lse = torch.ops.fa4.fwd(q, k, v, softmax_scale, causal, window_left, window_right,
                                     return_lse, softcap, None, sink)
    return (out, lse) if return_lse else out


def flash_attn_varlen_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    deterministic: bool = False,
    return_lse: bool = False,
    *,
    seqused_k: Optional[torch.Tensor] = None,
    block_table: Optional[torch.Tensor] = None,
    dropout_p: float = 0.0,
    alibi_slopes: Optional[torch.Tensor] = None,
    return_attn_probs: bool = False,
    learnable_sink: Optional[torch.Tensor] = None,
):
    """Attention over packed sequences of different lengths, flash-attn's varlen API.

    q: [total_q, heads_q, head_dim]; k, v: [total_k, heads_kv, head_dim] (bf16 or fp16, one CUDA
    device, head_dim contiguous). cu_seqlens_q, cu_seqlens_k: int32 [batch + 1] on that device,
    from 0 and non-decreasing: sequence b is q rows cu_seqlens_q[b] .. cu_seqlens_q[b + 1] - 1
    against k, v rows cu_seqlens_k[b] .. cu_seqlens_k[b + 1] - 1. max_seqlen_q, max_seqlen_k: the
    longest sequences' lengths (longer ones are cut to them). causal and window_size align each
    sequence's own queries and keys bottom-right, as flash_attn_func does. Rows of q outside every
    sequence are not written in out (and get zero gradients); no sequence's out or gradients read
    another sequence's rows (a NaN in one stays in its own). softcap > 0 soft-caps each score as
    flash_attn_func does. Returns out like q, and with
    return_lse the fp32 LSE [heads_q, total_q]. Differentiable (torch.ops.fa4.bwd_varlen);
    deterministic: the backward's deterministic mode. seqused_k: int32 [batch] on q's device,
    sequence b's keys being only the first seqused_k[b] rows of its k, v span (a KV cache's filled
    part; causal and windows align to them; the span's rows after them may hold anything, NaN too);
    forward only. block_table (a paged KV cache, vLLM's layout; forward only): int32 [batch,
    max_pages] on q's device, k and v then pools [num_pages, page_size, heads_kv, head_dim] (page_size
    a power of two of 16 rows or more) as in flash_attn_with_kvcache, sequence b's key j on page
    block_table[b, j // page_size]; its keys are the first of max_pages * page_size, at most
    cu_seqlens_k[b + 1] - cu_seqlens_k[b] where cu_seqlens_k is given (it may be None; its offsets
    are not read) and seqused_k[b] where that is; max_seqlen_k is not read
    (torch.ops.fa4.fwd_paged_varlen). learnable_sink: as flash_attn_func's (with block_table too,
    forward only there).
    """
    name = "fa4.flash_attn_varlen_func"
    softmax_scale, window_left, window_right, softcap = _options(
        name, softmax_scale, window_size, softcap, dropout_p, alibi_slopes)
    return_lse = bool(return_lse or return_attn_probs)
    sink = _sink(name, learnable_sink, q.shape[1], q.device)
    grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad or
                                        (sink is not None and sink.requires_grad))
    if block_table is not None:
        if grad:
            raise NotImplementedError("fa4.flash_attn_varlen_func: block_table is forward only; call it under "
                                      "torch.no_grad() or on tensors that do not require grad")
        out, lse = torch.ops.fa4.fwd_paged_varlen(
            q, k, v, block_table, cu_seqlens_q, int(max_seqlen_q), softmax_scale, bool(causal), window_left,
            window_right, return_lse, softcap, seqused_k, cu_seqlens_k, sink,
        )
    elif seqused_k is not None:
        if grad:
            raise NotImplementedError("fa4.flash_attn_varlen_func: seqused_k is forward only (the backward "
                                      "takes each sequence's keys from cu_seqlens_k alone); call it under "
                                      "torch.no_grad() or on tensors that do not require grad")
        out, lse = torch.ops.fa4.fwd_varlen(
            q, k, v, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k), softmax_scale,
            bool(causal), window_left, window_right, return_lse, softcap, seqused_k, sink,
        )
    elif grad:
        out, lse = _FlashAttnVarlenFunc.apply(
            q, k, v, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k), softmax_scale,
            bool(causal), window_left, window_right, bool(deterministic), softcap, sink,
        )
    else:
        out, lse = torch.ops.fa4.fwd_varlen(
            q, k, v, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k), softmax_scale,
            bool(causal), window_left, window_right, return_lse, softcap, None, sink,
        )
    return (out, lse) if return_lse else out


def _kvcache_lengths(name: str, cache_seqlens: torch.Tensor, b: int, device) -> torch.Tensor:
    """cache_seqlens as the operators take it: int32 [batch] on q's device (the tensor itself where
    it is one already: no conversion's dispatch on a decoding step's path)."""
    dtype = cache_seqlens.dtype
    if cache_seqlens.shape != (b,) or (dtype is not torch.int32 and dtype is not torch.int64):
        raise ValueError(f"{name}: cache_seqlens has shape {tuple(cache_seqlens.shape)} and dtype "
                         f"{cache_seqlens.dtype}: must be int32 [batch] (batch = {b})")
    if dtype is torch.int32 and cache_seqlens.device == device and cache_seqlens.is_contiguous():
        return cache_seqlens
    return cache_seqlens.to(device=device, dtype=torch.int32).contiguous()


def _forward_only(op, tensors, *args):
    """op(*args) for the KV-cache calls, whose operators have no backward: under torch.no_grad()
    only where autograd would record it (grad mode on and an input that requires grad), so that a
    decoding step pays no grad-mode switch."""
    if torch.is_grad_enabled():
        for t in tensors:
            if t is not None and t.requires_grad:
                with torch.no_grad():
                    return op(*args)
    return op(*args)


# Pages a cache entry's rows are read as under cache_batch_idx (the operator's kBatchIdxPageMax): the
# largest power of two dividing seqlen_cache, at most 256, at least 16.
_BATCH_IDX_PAGE_MAX = 256


def _check_batch_idx(name: str, k_cache: torch.Tensor, v_cache: torch.Tensor, cache_batch_idx, b: int):
    """cache_batch_idx's rules, checked here too so that meta tensors (torch.compile) meet them:
    int32 [batch]; caches whose entries' rows lie one after another, seqlen_cache a multiple of 16.
    Returns the indices as int32."""
    if not isinstance(cache_batch_idx, torch.Tensor) or cache_batch_idx.shape != (b,) or \
            cache_batch_idx.dtype not in (torch.int32, torch.int64):
        what = (f"shape {tuple(cache_batch_idx.shape)} and dtype {cache_batch_idx.dtype}"
                if isinstance(cache_batch_idx, torch.Tensor) else type(cache_batch_idx).__name__)
        raise ValueError(f"{name}: cache_batch_idx has {what}: must be int32 [batch] (batch = {b})")
    for arg, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        s = t.shape[1]
        if s <= 0 or min(s & -s, _BATCH_IDX_PAGE_MAX) < 16:
            raise NotImplementedError(f"{name}: cache_batch_idx with seqlen_cache = {s}: needs seqlen_cache a "
                                      "multiple of 16 (the cache is read as pages of 16 rows or more)")
        if t.shape[0] > 1 and t.stride(0) != s * t.stride(1):
            raise NotImplementedError(f"{name}: cache_batch_idx with {arg} strides {tuple(t.stride())}: needs each "
                                      "entry's rows one after another (batch stride = seqlen_cache x row stride, as "
                                      "in a BSHD cache)")
    return cache_batch_idx if cache_batch_idx.dtype == torch.int32 else cache_batch_idx.to(torch.int32)


def flash_attn_with_kvcache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: Optional[torch.Tensor] = None,
    v: Optional[torch.Tensor] = None,
    rotary_cos: Optional[torch.Tensor] = None,
    rotary_sin: Optional[torch.Tensor] = None,
    cache_seqlens=None,
    cache_batch_idx: Optional[torch.Tensor] = None,
    cache_leftpad: Optional[torch.Tensor] = None,
    block_table: Optional[torch.Tensor] = None,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    rotary_interleaved: bool = True,
    alibi_slopes: Optional[torch.Tensor] = None,
    num_splits: int = 0,
    return_softmax_lse: bool = False,
    learnable_sink: Optional[torch.Tensor] = None,
):
    """Attention of new queries against a KV cache, flash-attn's flash_attn_with_kvcache (inference).

    q: [batch, seqlen_q, heads_q, head_dim]; k_cache, v_cache: [batch, seqlen_cache, heads_kv,
    head_dim] (bf16 or fp16, head_dim contiguous; BSHD, BHSD or a slice along the sequence are read
    in place). cache_seqlens: an int or int32 [batch] on q's device, batch entry b attending to the
    first cache_seqlens[b] keys of its cache (at most seqlen_cache; None: all of them; the rows
    after them may hold anything, NaN from memory never written too); causal and
    window_size align its queries to the last of those keys (query i sees keys up to
    cache_seqlens[b] - seqlen_q + i). softcap as flash_attn_func. Returns out [batch, seqlen_q,
    heads_q, head_dim], and with return_softmax_lse the fp32 LSE [batch, heads_q, seqlen_q].
    block_table (a paged cache, vLLM's layout): int32 [batch, max_pages] on q's device, the caches
    then pools [num_pages, page_size, heads_kv, head_dim] with page_size a power of two of 16 rows
    or more; entry b's key j is row j % page_size of page block_table[b, j // page_size], its keys
    the first cache_seqlens[b] (None: max_pages * page_size). Page ids are clamped to the pool.
    num_splits is accepted and not read (the launch picks its own split of the keys). A head dim
    other than 64, 128, 192 and 256 runs on the next one's kernels: up to 128 they read the caches
    in place (only out is copied); above, the caches' filled rows (to cache_seqlens), from the pages
    block_table names where paged, are copied at every call.
    k, v: [batch, seqlen_new, heads_kv, head_dim], written into the caches in place at rows
    cache_seqlens[b] ... cache_seqlens[b] + seqlen_new - 1 (flash-attn's append; cache_seqlens is
    required then, and is not updated: the attention takes cache_seqlens + seqlen_new keys); rows
    that would fall past the cache are not written and the entry's keys end at the cache's end.
    rotary_cos, rotary_sin ([seqlen_ro, rotary_dim / 2], q's dtype, seqlen_ro covering the cache,
    rotary_dim a multiple of 16; only with k and v) rotate the new keys at their positions and the
    queries at cache_seqlens[b] + i under causal or a window, else all at cache_seqlens[b];
    rotary_interleaved pairs dims (2j, 2j + 1), else (j, j + rotary_dim / 2) (GPT-NeoX). One
    small kernel (fa4::append_kv) does both before the attention, in one operator with it
    (torch.ops.fa4.fwd_kvcache). cache_batch_idx (int32 [batch] on q's device; contiguous caches
    only): batch entry b reads and appends to cache entry cache_batch_idx[b] of k_cache [batch_cache,
    seqlen_cache, ...], with every option above; the caches are then read as pages of a power of
    two of 16 to 256 rows over their own memory (each entry's rows one after another: batch stride
    = seqlen_cache x row stride, seqlen_cache a multiple of 16), an index outside [0, batch_cache)
    reads a wrong entry but never outside the caches, and duplicate indices with k and v leave
    either's rows. cache_leftpad (int32 [batch] on q's device; contiguous caches, not with
    block_table or cache_batch_idx): entry b's keys start at its cache row cache_leftpad[b] and end
    where they would without it (cache_seqlens[b], + seqlen_new with k and v), causal and windows
    aligning to them; the rows before them may hold anything; k and v are still appended at
    cache_seqlens[b] and rotated at those rows (flash-attn's rule). Not implemented: alibi_slopes.
    learnable_sink: as flash_attn_func's (forward only here), with every option above.
    With one length for every entry (an int, or None)
    it is flash_attn_func over the cache's first rows; with a tensor, the batched call with each
    entry's keys its own (torch.ops.fa4.fwd's seqused_k), which folds query groups and cuts the
    keys across the GPU as the batched decoding does.
    """
    name = "fa4.flash_attn_with_kvcache"
    softmax_scale, window_left, window_right, softcap = _options(name, softmax_scale, window_size, softcap, 0.0,
                                                                 alibi_slopes)
    for arg, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            shape = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{name}: {arg} has shape {shape}: must be 4-d [batch, seqlen, heads, head_dim]")
    b, sq, hq, d = q.shape
    sink = _sink(name, learnable_sink, hq, q.device)
    if cache_leftpad is not None:
        if block_table is not None or cache_batch_idx is not None:
            other = "block_table" if block_table is not None else "cache_batch_idx"
            raise NotImplementedError(f"{name}: cache_leftpad with {other}: not implemented (a left pad needs "
                                      "contiguous caches, each entry its own)")
        if not isinstance(cache_leftpad, torch.Tensor) or cache_leftpad.shape != (b,) or \
                cache_leftpad.dtype not in (torch.int32, torch.int64):
            what = (f"shape {tuple(cache_leftpad.shape)} and dtype {cache_leftpad.dtype}"
                    if isinstance(cache_leftpad, torch.Tensor) else type(cache_leftpad).__name__)
            raise ValueError(f"{name}: cache_leftpad has {what}: must be int32 [batch] (batch = {b})")
        cache_leftpad = cache_leftpad.to(device=q.device, dtype=torch.int32).contiguous()
    if cache_batch_idx is not None:
        if block_table is not None:
            raise ValueError(f"{name}: cache_batch_idx with block_table: a paged cache's table already picks each "
                             "entry's pages (give one of them)")
        cache_batch_idx = _check_batch_idx(name, k_cache, v_cache, cache_batch_idx, b)
    if (k is None) != (v is None):
        raise ValueError(f"{name}: k is {'None' if k is None else 'given'}, v is {'None' if v is None else 'given'}: "
                         "appending to the cache needs both")
    if k is None and (rotary_cos is not None or rotary_sin is not None):
        raise ValueError(f"{name}: rotary_cos and rotary_sin apply with k and v only (the new keys and q are "
                         "rotated as they are appended)")
    if k is None and (cache_batch_idx is not None or cache_leftpad is not None or sink is not None):
        # One operator: the caches read as pages of their own memory, the table made from the indices;
        # or each entry's keys from its left pad; or with sinks, the caches as they are.
        if isinstance(cache_seqlens, torch.Tensor):
            lens, n = _kvcache_lengths(name, cache_seqlens, b, q.device), -1
        elif cache_seqlens is None or isinstance(cache_seqlens, int):
            lens, n = None, -1 if cache_seqlens is None else cache_seqlens
            if n < -1:
                raise ValueError(f"{name}: cache_seqlens = {n}: must be >= 0")
        else:
            raise ValueError(f"{name}: cache_seqlens = {cache_seqlens!r}: must be None, an int or an int32 tensor")
        if block_table is not None and (not isinstance(block_table, torch.Tensor) or block_table.dtype != torch.int32):
            raise ValueError(f"{name}: block_table must be an int32 tensor [batch, max_pages]")
        out, lse = _forward_only(torch.ops.fa4.fwd_kvcache.default, (q, k_cache, v_cache, sink), q, k_cache,
                                 v_cache, None, None, lens, n, block_table, None, None, False, softmax_scale,
                                 bool(causal), window_left, window_right, bool(return_softmax_lse), softcap,
                                 cache_batch_idx, cache_leftpad, sink)
        return (out, lse) if return_softmax_lse else out
    if k is not None:
        # The new rows into the caches (rotating them and q), then attention over the longer caches.
        if cache_seqlens is None:
            raise ValueError(f"{name}: cache_seqlens = None with k and v: appending needs each entry's cache "
                             "length (an int or int32 [batch])")
        if isinstance(cache_seqlens, torch.Tensor):
            lens, n = _kvcache_lengths(name, cache_seqlens, b, q.device), 0
        elif isinstance(cache_seqlens, int):
            lens, n = None, cache_seqlens
        else:
            raise ValueError(f"{name}: cache_seqlens = {cache_seqlens!r}: must be None, an int or an int32 tensor")
        if block_table is not None and (not isinstance(block_table, torch.Tensor) or block_table.dtype != torch.int32):
            raise ValueError(f"{name}: block_table must be an int32 tensor [batch, max_pages]")
        # One operator: the append's kernel, then the attention's, with no Python between them.
        out, lse = _forward_only(torch.ops.fa4.fwd_kvcache.default, (q, k_cache, v_cache, k, v, sink), q, k_cache,
                                 v_cache, k, v, lens, n, block_table, rotary_cos, rotary_sin,
                                 bool(rotary_interleaved), softmax_scale, bool(causal), window_left, window_right,
                                 bool(return_softmax_lse), softcap, cache_batch_idx, cache_leftpad, sink)
        return (out, lse) if return_softmax_lse else out

    def lengths_tensor():  # cache_seqlens as the operators take it: int32 [batch] on q's device
        return _kvcache_lengths(name, cache_seqlens, b, q.device)

    def bad_lengths():
        return ValueError(f"{name}: cache_seqlens = {cache_seqlens!r}: must be None, an int or an int32 tensor")

    if block_table is not None:
        used = None
        if isinstance(cache_seqlens, int):
            used = torch.full((b,), cache_seqlens, dtype=torch.int32, device=q.device)
        elif isinstance(cache_seqlens, torch.Tensor):
            used = lengths_tensor()
        elif cache_seqlens is not None:
            raise bad_lengths()
        if not isinstance(block_table, torch.Tensor) or block_table.dtype != torch.int32:
            raise ValueError(f"{name}: block_table must be an int32 tensor [batch, max_pages]")
        out, lse = _forward_only(torch.ops.fa4.fwd_paged.default, (q, k_cache, v_cache), q, k_cache, v_cache,
                                 block_table, softmax_scale, bool(causal), window_left, window_right,
                                 bool(return_softmax_lse), softcap, used)
        return (out, lse) if return_softmax_lse else out
    if k_cache.shape[0] != b or v_cache.shape != k_cache.shape:
        raise ValueError(f"{name}: k_cache has shape {tuple(k_cache.shape)}, v_cache {tuple(v_cache.shape)}, q "
                         f"{tuple(q.shape)}: the caches must agree, with q's batch ({b})")
    s_cache = k_cache.shape[1]
    if cache_seqlens is None or isinstance(cache_seqlens, int):
        # One length for every entry: the batched call over the cache's first n rows (a view),
        # whose decoding folds query groups and cuts the keys across the GPU.
        n = s_cache if cache_seqlens is None else cache_seqlens
        if not 0 <= n <= s_cache:
            raise ValueError(f"{name}: cache_seqlens = {n}: must be in [0, {s_cache}] (seqlen_cache)")
        return _forward_only(flash_attn_func, (q, k_cache, v_cache), q, k_cache[:, :n], v_cache[:, :n],
                             softmax_scale, bool(causal), (window_left, window_right), softcap, False,
                             bool(return_softmax_lse))
    if not isinstance(cache_seqlens, torch.Tensor):
        raise bad_lengths()
    used = lengths_tensor()
    out, lse = _forward_only(torch.ops.fa4.fwd.default, (q, k_cache, v_cache), q, k_cache, v_cache, softmax_scale,
                             bool(causal), window_left, window_right, bool(return_softmax_lse), softcap, used)
    return (out, lse) if return_softmax_lse else out


def _refuse_unimplemented(name: str, dropout_p: float, alibi_slopes) -> None:
    if dropout_p != 0.0:
        raise NotImplementedError(f"{name}: dropout_p = {dropout_p}: dropout is not implemented "
                                  "(dropout_p must be 0.0)")
    if alibi_slopes is not None:
        raise NotImplementedError(f"{name}: alibi_slopes: ALiBi is not implemented (alibi_slopes "
                                  "must be None)")


def flash_attn_qkvpacked_func(qkv: torch.Tensor, *args, **kwargs):
    """flash_attn_func over qkv [batch, seqlen, 3, heads, head_dim] (q, k, v as views of it, no
    copy; gradients flow back into qkv). The other arguments are flash_attn_func's."""
    if qkv.dim() != 5 or qkv.shape[2] != 3:
        raise ValueError(f"fa4.flash_attn_qkvpacked_func: qkv has shape {tuple(qkv.shape)}: must be "
                         "[batch, seqlen, 3, heads, head_dim]")
    return flash_attn_func(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], *args, **kwargs)


def flash_attn_kvpacked_func(q: torch.Tensor, kv: torch.Tensor, *args, **kwargs):
    """flash_attn_func with k and v packed as kv [batch, seqlen_k, 2, heads_kv, head_dim] (views,
    no copy; gradients flow back into kv). The other arguments are flash_attn_func's."""
    if kv.dim() != 5 or kv.shape[2] != 2:
        raise ValueError(f"fa4.flash_attn_kvpacked_func: kv has shape {tuple(kv.shape)}: must be "
                         "[batch, seqlen_k, 2, heads_kv, head_dim]")
    return flash_attn_func(q, kv[:, :, 0], kv[:, :, 1], *args, **kwargs)


def flash_attn_varlen_qkvpacked_func(qkv: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int, *args,
                                     **kwargs):
    """flash_attn_varlen_func over packed sequences qkv [total, 3, heads, head_dim] (q, k and v as
    views, no copy; gradients flow back into qkv), one cu_seqlens and max_seqlen for queries and
    keys. The other arguments are flash_attn_varlen_func's."""
    if qkv.dim() != 4 or qkv.shape[1] != 3:
        raise ValueError(f"fa4.flash_attn_varlen_qkvpacked_func: qkv has shape {tuple(qkv.shape)}: must be "
                         "[total, 3, heads, head_dim]")
    return flash_attn_varlen_func(qkv[:, 0], qkv[:, 1], qkv[:, 2], cu_seqlens, cu_seqlens, max_seqlen, max_seqlen,
                                  *args, **kwargs)


def flash_attn_varlen_kvpacked_func(q: torch.Tensor, kv: torch.Tensor, cu_seqlens_q: torch.Tensor,
                                    cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, *args,
                                    **kwargs):
    """flash_attn_varlen_func with k and v packed as kv [total_k, 2, heads_kv, head_dim] (views, no
    copy; gradients flow back into kv). The other arguments are flash_attn_varlen_func's."""
    if kv.dim() != 4 or kv.shape[1] != 2:
        raise ValueError(f"fa4.flash_attn_varlen_kvpacked_func: kv has shape {tuple(kv.shape)}: must be "
                         "[total_k, 2, heads_kv, head_dim]")
    return flash_attn_varlen_func(q, kv[:, 0], kv[:, 1], cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                  *args, **kwargs)


def _sdpa_window(seqlen_q: int, seqlen_k: int, is_causal: bool) -> Tuple[bool, Tuple[int, int]]:
    """(causal, window_size) of fa4 for PyTorch's is_causal, whose mask is aligned top-left: query i
    sees keys j <= i. fa4 aligns bottom-right (query i sees j <= i + seqlen_k - seqlen_q), so the two
    agree when seqlen_q == seqlen_k; with more queries than keys the top-left mask is fa4's window
    (-1, seqlen_q - seqlen_k); with fewer it has no fa4 form."""
    if not is_causal:
        return False, (-1, -1)
    if seqlen_q == seqlen_k:
        return True, (-1, -1)
    if seqlen_q > seqlen_k:
        return False, (-1, seqlen_q - seqlen_k)
    raise NotImplementedError(
        f"fa4.scaled_dot_product_attention: is_causal with seqlen_q = {seqlen_q} < seqlen_k = "
        f"{seqlen_k}: PyTorch aligns that mask top-left, which fa4 does not implement for fewer "
        "queries than keys (fa4.flash_attn_func(causal=True) aligns it bottom-right)"
    )


def scaled_dot_product_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: Optional[torch.Tensor] = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: Optional[float] = None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    """torch.nn.functional.scaled_dot_product_attention's signature and meaning, on fa4's kernels.

    query: [batch, heads_q, seqlen_q, head_dim]; key, value: [batch, heads_kv, seqlen_k, head_dim]
    (value's last dim may differ: Ev; bf16 or fp16, CUDA, head_dim contiguous); returns [batch,
    heads_q, seqlen_q, value's head dim], a view
    of a BSHD tensor, differentiable. is_causal is aligned top-left as in PyTorch (seqlen_q <
    seqlen_k raises NotImplementedError); heads_q != heads_kv needs enable_gqa=True, as in
    PyTorch. attn_mask must be None and dropout_p 0 (not implemented). scale: None is
    1/sqrt(head_dim).
    """
    name = "fa4.scaled_dot_product_attention"
    if attn_mask is not None:
        raise NotImplementedError(f"{name}: attn_mask: arbitrary masks are not implemented "
                                  "(is_causal is)")
    _refuse_unimplemented(name, dropout_p, None)
    for arg, t in (("query", query), ("key", key), ("value", value)):
        if t.dim() != 4:
            raise ValueError(f"{name}: {arg} has shape {tuple(t.shape)}: must be 4-d "
                             "[batch, heads, seqlen, head_dim]")
    if query.shape[1] != key.shape[1] and not enable_gqa:
        raise ValueError(f"{name}: query has {query.shape[1]} heads, key {key.shape[1]}: "
                         "different head counts need enable_gqa=True")
    causal, window = _sdpa_window(query.shape[2], key.shape[2], bool(is_causal))
    out = flash_attn_func(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2),
                          softmax_scale=scale, causal=causal, window_size=window)
    return out.transpose(1, 2)

