"""The host's time a call: how long the CPU takes to issue one attention call, layer by layer.

    python3 bench/host_time.py [--shape B,HQ,HKV,SK,D] [--seqlen-q N] [--calls 50] [--rounds 7]
        [--providers kvcache,op,c_abi,func,cudnn,fa2,empty] [--name WHAT] [--out DIR]

A decoding step's GPU work is tens of microseconds; outside a CUDA graph the host must issue each
call at least as fast, or the GPU waits. Each provider is called `calls` times with no
synchronisation between them (the launches queue up), and the host time a call is the wall time
of the loop over `calls`; the GPU is drained before each round, rounds rotate the providers'
order, and the record holds each round's reading, their median and minimum. Providers, from the
outermost layer in:
  kvcache  fa4.flash_attn_with_kvcache(q, k, v, cache_seqlens=lens): the Python wrapper's checks,
           the dispatcher, the operator and the launch
  op       torch.ops.fa4.fwd(q, k, v, ..., seqused_k=lens): the dispatcher, the C++ operator (its
           checks, the output's allocation) and fa4::forward
  c_abi    fa4_forward_seqused through ctypes on the same tensors (out preallocated), from the
           extension's library: fa4::forward alone (validate, the parameters, the launch) plus
           ctypes' own call (about a microsecond; `empty_c` reads it: a C function that returns at
           once, cudaGetLastError)
  func     fa4.flash_attn_func on the full cache (no lengths)
  cudnn    torch SDPA on the cuDNN backend, BHSD tensors (the peer's host time)
  fa2      torch SDPA on the flash backend (FA2), BHSD
  empty    torch.empty_like(q): the dispatcher's floor for an operator that allocates
The record holds the GPU time a call too (do_bench median, L2 not cleared) to set the host time
against. Writes bench/results/<date>-<what>.json (and a copy under $OUT when set).
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(ROOT / "bench"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

from side_by_side import no_gpu, run_meta, short, write_records  # noqa: E402


class Tensor4(ctypes.Structure):  # fa4_tensor
    _fields_ = [("data", ctypes.c_void_p), ("batch_stride", ctypes.c_int64), ("seq_stride", ctypes.c_int64),
                ("head_stride", ctypes.c_int64)]


class Problem(ctypes.Structure):  # fa4_problem
    _fields_ = [("dtype", ctypes.c_int), ("batch", ctypes.c_int64), ("seqlen_q", ctypes.c_int64),
                ("seqlen_k", ctypes.c_int64), ("heads_q", ctypes.c_int64), ("heads_kv", ctypes.c_int64),
                ("head_dim", ctypes.c_int64), ("softmax_scale", ctypes.c_float), ("causal", ctypes.c_int),
                ("window_left", ctypes.c_int64), ("window_right", ctypes.c_int64), ("softcap", ctypes.c_float)]


def tensor4(t: torch.Tensor) -> Tensor4:
    return Tensor4(t.data_ptr(), t.stride(0), t.stride(1), t.stride(2))


def c_abi_call(fa4, q, k, v, out, lens):
    """fa4_forward_seqused on these tensors through ctypes, on the current stream; None where the
    extension's library does not export it."""
    lib = ctypes.CDLL(str(fa4.library_path()))
    try:
        fn = lib.fa4_forward_seqused
    except AttributeError:
        return None
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.POINTER(Problem), Tensor4, Tensor4, Tensor4, Tensor4, ctypes.c_void_p, ctypes.c_void_p,
                   ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
    b, sq, hq, d = q.shape
    p = Problem(0 if q.dtype == torch.bfloat16 else 1, b, sq, k.shape[1], hq, k.shape[2], d, 0.0, 0, -1, -1, 0.0)
    tq, tk, tv, to = tensor4(q), tensor4(k), tensor4(v), tensor4(out)
    used = ctypes.c_void_p(lens.data_ptr())
    msg = ctypes.create_string_buffer(200)

    def call():
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        rc = fn(ctypes.byref(p), tq, tk, tv, to, used, None, stream, msg, 200)
        if rc != 0:
            raise RuntimeError(f"fa4_forward_seqused: {rc} {msg.value.decode()}")
    return call


def host_us(fn, calls: int) -> float:
    """Wall time of `calls` calls of fn, no synchronisation between them, in us a call."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / calls * 1e6


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="8,32,8,8192,128")
    ap.add_argument("--seqlen-q", type=int, default=1)
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--providers", default="kvcache,op,c_abi,empty_c,func,cudnn,fa2,empty")
    ap.add_argument("--name", default="host-time")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    a = ap.parse_args(argv)
    if no_gpu("host_time"):
        return 2
    import fa4
    from triton.testing import do_bench

    b, hq, hkv, sk, d = (int(x) for x in a.shape.split(","))
    sq = a.seqlen_q
    g = torch.Generator(device="cuda").manual_seed(7)
    q = torch.randn(b, sq, hq, d, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(b, sk, hkv, d, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(b, sk, hkv, d, device="cuda", dtype=torch.bfloat16, generator=g)
    lens = torch.full((b,), sk, device="cuda", dtype=torch.int32)
    out = torch.empty_like(q)
    qh, kh, vh = (x.transpose(1, 2).contiguous() for x in (q, k, v))
    fns, errors = {}, {}
    for p in a.providers.split(","):
        try:
            if p == "kvcache":
                fns[p] = lambda: fa4.flash_attn_with_kvcache(q, k, v, cache_seqlens=lens)
            elif p == "op":
                fns[p] = lambda: torch.ops.fa4.fwd(q, k, v, None, False, -1, -1, False, 0.0, lens)
            elif p == "c_abi":
                call = c_abi_call(fa4, q, k, v, out, lens)
                if call is None:
                    raise RuntimeError("the extension's library does not export fa4_forward_seqused")
                fns[p] = call
            elif p == "empty_c":
                lib = ctypes.CDLL(str(fa4.library_path()))
                try:
                    nop = lib.cudaGetLastError
                except AttributeError as e:
                    raise RuntimeError("cudaGetLastError is not exported by the extension's library") from e
                nop.restype = ctypes.c_int
                fns[p] = nop
            elif p == "func":
                fns[p] = lambda: fa4.flash_attn_func(q, k, v)
            elif p in ("cudnn", "fa2"):
                backend = SDPBackend.CUDNN_ATTENTION if p == "cudnn" else SDPBackend.FLASH_ATTENTION
                kx = kh if p == "cudnn" else kh.repeat_interleave(hq // hkv, dim=1)
                vx = vh if p == "cudnn" else vh.repeat_interleave(hq // hkv, dim=1)

                def sdpa(backend=backend, kx=kx, vx=vx, gqa=p == "cudnn"):
                    with sdpa_kernel(backend):
                        return F.scaled_dot_product_attention(qh, kx, vx, enable_gqa=gqa)
                fns[p] = sdpa
            elif p == "empty":
                fns[p] = lambda: torch.empty_like(q)
            else:
                raise ValueError(f"unknown provider {p}")
            with torch.no_grad():
                for _ in range(5):
                    fns[p]()
            torch.cuda.synchronize()
        except Exception as e:  # a provider that cannot run here: record why
            errors[p] = short(e)
            fns.pop(p, None)

    readings = {p: [] for p in fns}
    names = list(fns)
    with torch.no_grad():
        for r in range(a.rounds):
            for p in names[r % len(names):] + names[:r % len(names)]:
                readings[p].append(host_us(fns[p], a.calls))
    meta = run_meta("host_time.py", argv)
    records = []
    for p in a.providers.split(","):
        rec = {"provider": p, "batch": b, "heads_q": hq, "heads_kv": hkv, "seqlen_q": sq, "seqlen_k": sk,
               "head_dim": d, "calls": a.calls, **meta}
        if p in errors:
            rec["error"] = errors[p]
        else:
            rec["host_us_rounds"] = readings[p]
            rec["host_us"] = statistics.median(readings[p])
            rec["host_us_min"] = min(readings[p])
            with torch.no_grad():
                rec["gpu_us"] = do_bench(fns[p], warmup=25, rep=100, return_mode="median") * 1e3
        records.append(rec)
    write_records(records, a.out, a.name)
    print(f"{b} x {hq}/{hkv} x {sk}, d{d}, {sq} query row(s); host us a call over {a.calls} calls, "
          f"{a.rounds} rounds")
    print(f"{'provider':>9} {'median':>8} {'min':>8} {'gpu us':>8}")
    for rec in records:
        if "error" in rec:
            print(f"{rec['provider']:>9} error: {rec['error']}")
        else:
            print(f"{rec['provider']:>9} {rec['host_us']:8.1f} {rec['host_us_min']:8.1f} {rec['gpu_us']:8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
