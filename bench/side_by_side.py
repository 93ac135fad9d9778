"""fa4 next to its peers on the same GPU, in one process: check fa4, then time everyone.

    python3 bench/side_by_side.py [--quick] [--hdims 64,128,256] [--seqlens 512,...,16384]
        [--causal both|yes|no] [--ops fwd,bwd] [--providers fa4,cudnn,fa2,flex]
        [--flex-seqlens 16384] [--dtype bf16|fp16] [--no-check] [--name WHAT] [--out DIR]

Shapes follow FA3's convention (DESIGN.md §6): 16k tokens per batch (batch = 16384 / seqlen),
hidden 2048 (heads = 2048 / head_dim). Providers:
  fa4    torch.ops.fa4 through fa4.flash_attn_func, BSHD tensors (python/build.sh builds it)
  cudnn  torch SDPA, cuDNN backend        } BHSD contiguous tensors holding the same values
  fa2    torch SDPA, flash backend (FA2)  }
  flex   torch.compile'd FlexAttention (Triton); compiling costs seconds per shape, so by default
         it runs at --flex-seqlens only
make_fn also takes NAME@bshd or NAME@bhsd: that provider on views of the other layout's tensors,
so two providers can read the same memory (bench/peer_rounds.py --providers fa4@bhsd,fa2,...).
Times are medians of triton.testing.do_bench(return_mode="median") after its warm-up, on random
normal inputs; with --rounds R each provider is timed R times a shape, the providers' order
rotating by round, and the median of its R medians is recorded (each in "ms_rounds").
Forward calls are inference calls (inputs without requires_grad): fa4 then writes no LSE, and
cuDNN computes no statistics; FA2's kernel writes its LSE in every call.
TFLOP/s = 4·b·h·s²·d, halved for causal, ×2.5 for bwd. Before timing, fa4's output for batch 0
and two heads is checked against a float64 reference by DESIGN.md §3's criterion (bounded by a
plain 16-bit attention).

Writes bench/results/<date>-<what>.json (and a copy under $OUT when set): one record per
(op, provider, shape) with ms and tflops (null plus "error" when a provider cannot run it), and
the median SM clock (MHz) and board power (W) nvidia-smi read while it was timed (null without
nvidia-smi).
The last thing printed is the table of TFLOP/s and the ratios fa4/cudnn, fa4/fa2, fa4/flex.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import shlex
import subprocess
import sys
import time
import traceback
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(ROOT / "bench"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

from gpu_sampler import GpuSampler  # noqa: E402
from memory import memory_of  # noqa: E402
from rounds import fill_records, short, summary, time_in_rounds  # noqa: E402

TOKENS, HIDDEN = 16384, 2048
ALL_HDIMS = (64, 128, 256)
ALL_SEQLENS = (512, 1024, 2048, 4096, 8192, 16384)
PROVIDERS = ("fa4", "cudnn", "fa2", "flex")
ATOL, REL_FROBENIUS = 1e-3, 1e-2  # DESIGN.md §3
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def smi_device_id(index: int) -> str:
    """nvidia-smi's id of CUDA device `index`: CUDA_VISIBLE_DEVICES renumbers devices, nvidia-smi
    does not (it takes the listed index or UUID)."""
    visible = [x.strip() for x in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if x.strip()]
    return visible[index] if index < len(visible) else str(index)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def int_list(s: str):
    try:
        vals = [int(x) for x in s.split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{s}': expected comma-separated integers") from None
    if not vals or any(v <= 0 for v in vals):
        raise argparse.ArgumentTypeError(f"'{s}': expected positive integers")
    return vals


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description="fa4 vs cuDNN SDPA, FA2 and FlexAttention")
    ap.add_argument("--quick", action="store_true",
                    help="d=128, seqlens 1024,4096,16384, flex at 16384 only")
    ap.add_argument("--hdims", type=int_list, default=None, help="head dims (default 64,128,256)")
    ap.add_argument("--seqlens", type=int_list, default=None,
                    help="sequence lengths (default 512,1024,2048,4096,8192,16384)")
    ap.add_argument("--causal", choices=("both", "yes", "no"), default="both")
    ap.add_argument("--ops", default="fwd", help="fwd, bwd or fwd,bwd (default fwd)")
    ap.add_argument("--providers", default=",".join(PROVIDERS))
    ap.add_argument("--flex-seqlens", type=int_list, default=None,
                    help="seqlens at which flex runs (default 16384; 'all' via --flex-all)")
    ap.add_argument("--flex-all", action="store_true", help="run flex at every seqlen")
    ap.add_argument("--seqlen-q", type=int, default=None,
                    help="queries a sequence (keys: --seqlens, batch = 16384 / seqlen_k); "
                         "non-causal only: short queries against long keys")
    ap.add_argument("--dv", type=int, default=None,
                    help="v's (and out's) head dim where it differs from q's and k's (DeepSeek's "
                         "--hdims 192 --dv 128); TFLOP/s then count 2 (d + dv) a query-key pair")
    ap.add_argument("--dtype", choices=tuple(DTYPES), default="bf16")
    ap.add_argument("--no-check", action="store_true", help="skip fa4's correctness check")
    ap.add_argument("--warmup", type=int, default=25, help="do_bench warm-up, ms (default 25)")
    ap.add_argument("--rep", type=int, default=100, help="do_bench repetition, ms (default 100)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="timings a provider a shape, the providers' order rotating by round; the "
                         "median is recorded (default 1)")
    ap.add_argument("--name", default=None, help="<what> in the results file name")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"),
                    help="results folder (default bench/results)")
    a = ap.parse_args(argv)
    a.ops = [o for o in a.ops.split(",") if o]
    if not a.ops or any(o not in ("fwd", "bwd") for o in a.ops):
        ap.error(f"--ops {','.join(a.ops)}: expected fwd, bwd or fwd,bwd")
    a.providers = [p for p in a.providers.split(",") if p]
    bad = [p for p in a.providers if p not in PROVIDERS]
    if bad or not a.providers:
        ap.error(f"--providers: unknown {bad}; choose from {','.join(PROVIDERS)}")
    if a.hdims is None:
        a.hdims = [128] if a.quick else list(ALL_HDIMS)
    if a.seqlens is None:
        a.seqlens = [1024, 4096, 16384] if a.quick else list(ALL_SEQLENS)
    if a.flex_all:
        a.flex_seqlens = list(a.seqlens)
    elif a.flex_seqlens is None:
        a.flex_seqlens = [max(a.seqlens)]
    if a.seqlen_q is not None:
        if a.seqlen_q < 1:
            ap.error(f"--seqlen-q {a.seqlen_q}: expected >= 1")
        if a.causal != "no" or a.ops != ["fwd"]:
            ap.error("--seqlen-q: forward, non-causal only (use --causal no)")
    if a.rounds < 1:
        ap.error(f"--rounds {a.rounds}: expected >= 1")
    for d in a.hdims + ([a.dv] if a.dv is not None else []):
        if d < 8 or d > 256 or d % 8:
            ap.error(f"--hdims / --dv: {d}: expected a multiple of 8 in [8, 256]")
    return a


# ---------------------------------------------------------------------------------------------
# Environment facts for the records


def gpu_driver() -> str:
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=20)
        if r.returncode == 0 and r.stdout.strip():
            return r.stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        import ctypes

        v = ctypes.c_int()
        ctypes.CDLL("libcuda.so.1").cuDriverGetVersion(ctypes.byref(v))
        return f"cuda-driver-api {v.value // 1000}.{v.value % 1000 // 10}"
    except OSError:
        return "unknown"


def commit_hash() -> str:
    if os.environ.get("FA4_COMMIT"):
        return os.environ["FA4_COMMIT"]
    try:
        r = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                           timeout=20)
        if r.returncode == 0 and r.stdout.strip():
            return r.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return "unknown"


def run_meta(script: str, argv) -> dict:
    """What every record of a benchmark run carries: GPU, driver, commit, date, the command."""
    return {"gpu": torch.cuda.get_device_properties(0).name, "driver": gpu_driver(), "commit": commit_hash(),
            "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "command": f"python3 bench/{script} " + " ".join(
                shlex.quote(x) for x in (sys.argv[1:] if argv is None else argv))}


def no_gpu(script: str) -> bool:
    """True, with the message, where there is no CUDA GPU to run `script` on."""
    if torch.cuda.is_available():
        return False
    print(f"{script}: no CUDA GPU here; run it on the GPU machine", file=sys.stderr)
    return True


def kernel_times(fn, calls=10):
    """GPU time per call of each kernel (and memset/memcpy) fn launches, in microseconds, largest
    first, from torch.profiler's CUDA activity."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    with torch.no_grad():
        fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                fn()
            torch.cuda.synchronize()
    times = {}
    for e in prof.events():
        if e.device_type == DeviceType.CUDA:  # the kernels (and memsets) themselves, not the ops above them
            times[e.name] = times.get(e.name, 0.0) + e.time_range.elapsed_us() / calls
    return dict(sorted(times.items(), key=lambda kv: -kv[1]))


def call_spans(fn, calls=20, flush_mb=256):
    """fn's kernels with L2 cleared before every call (as do_bench does): per kernel its mean GPU
    time a call, the median span of a call from its first kernel's start to its last kernel's end
    (launch gaps and waits between the kernels included), in microseconds, and each kernel's launch
    (grid, block, registers a thread, shared memory) as the profiler's trace gives it."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    cache = torch.empty(flush_mb << 20, dtype=torch.int8, device="cuda")

    def cuda_events(prof):
        return sorted((e for e in prof.events() if e.device_type == DeviceType.CUDA),
                      key=lambda e: e.time_range.start)

    with torch.no_grad():
        fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            cache.zero_()
            torch.cuda.synchronize()
        flush_names = {e.name for e in cuda_events(prof)}
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                cache.zero_()
                fn()
            torch.cuda.synchronize()
    groups, times = [], {}
    for e in cuda_events(prof):
        if e.name in flush_names:
            groups.append([])
        elif groups:
            groups[-1].append(e)
            times[e.name] = times.get(e.name, 0.0) + e.time_range.elapsed_us() / calls
    spans = sorted(max(e.time_range.end for e in g) - min(e.time_range.start for e in g) for g in groups if g)
    launches = {}
    try:
        import tempfile
        with tempfile.NamedTemporaryFile(suffix=".json") as f:
            prof.export_chrome_trace(f.name)
            for ev in json.load(open(f.name)).get("traceEvents", []):
                args = ev.get("args", {})
                if ev.get("cat") == "kernel" and ev.get("name") in times and ev["name"] not in launches:
                    launches[ev["name"]] = {k: args.get(k) for k in ("grid", "block", "registers per thread",
                                                                      "shared memory", "est. achieved occupancy %")}
    except Exception as e:  # the trace is extra: keep the times without it
        launches = {"error": short(e)}
    return (dict(sorted(times.items(), key=lambda kv: -kv[1])), (spans[len(spans) // 2] if spans else None),
            launches)


def write_records(records, out_dir: str, name: str) -> None:
    """records as <out_dir>/<date>-<name>.json, and a copy under $OUT when it is set."""
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d-%H%M")
    paths = [Path(out_dir) / f"{stamp}-{name}.json"]
    if os.environ.get("OUT"):
        paths.append(Path(os.environ["OUT"]) / f"{stamp}-{name}.json")
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(records, indent=1) + "\n")
        print(f"wrote {path}")


# ---------------------------------------------------------------------------------------------
# Shapes, FLOPs, timing


def shape(seqlen: int, hdim: int):
    """(batch, heads) of FA3's shapes; a head dim that does not divide the hidden size (96, 80,
    192: those without a kernel of their own) takes the nearest head count."""
    return max(1, TOKENS // seqlen), max(1, round(HIDDEN / hdim))


def tflops(b, h, s, d, causal, op, ms, sq=None):
    f = 4.0 * b * h * (s if sq is None else sq) * s * d
    if causal:
        f *= 0.5
    if op == "bwd":
        f *= 2.5
    return f / (ms * 1e-3) / 1e12


def bench_ms(fn, warmup, rep) -> float:
    return float(triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))


def provider_calls(fwds, bwd, grad_args):
    """What to time for each provider of fwds ({name: forward call}): the call itself, or with bwd
    autograd.grad of its output (kept) over grad_args(name) = (inputs, dout). Each is run once first
    (a compile, a warm-up); one that raises is left out, its exception in the second dict."""
    fns, errors = {}, {}
    for p, fwd in fwds.items():
        try:
            if bwd:
                out = fwd()
                ins, do = grad_args(p)
                fns[p] = (lambda out, ins, do: lambda: torch.autograd.grad(out, ins, do, retain_graph=True))(
                    out, ins, do)
                fns[p]()
            else:
                with torch.no_grad():
                    fwd()
                fns[p] = fwd
        except Exception as e:  # recorded by the caller
            errors[p] = e
    return fns, errors


def fa3_cases(hdims, seqlens, bwd):
    """FA3's shapes (shape(): 16k tokens a batch, hidden 2048) at each head dim and seqlen, causal and
    not, bf16 on the GPU, for the side-by-side scripts of one feature (sink.py, softcap.py): a
    namespace a case with d, s, causal, b, h, its generator g (seeded by the shape; a script draws
    more from it after q, k, v and dout), q, k, v, dout [b, s, h, d] (q, k and v requiring grad with
    bwd), their contiguous [b, h, s, d] copies qt, kt, vt, cudnn (SDPA's cuDNN backend on those) and
    flops (the problem's, x 2.5 for the backward)."""
    for d in hdims:
        for s in seqlens:
            for causal in (False, True):
                b, h = shape(s, d)
                g = torch.Generator(device="cuda").manual_seed(d * 100003 + s * 2 + causal)
                q, k, v, dout = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, generator=g)
                                 for _ in range(4))
                if bwd:
                    q, k, v = (x.requires_grad_() for x in (q, k, v))
                qt, kt, vt = (x.detach().transpose(1, 2).contiguous().requires_grad_(bwd) for x in (q, k, v))

                def cudnn(qt=qt, kt=kt, vt=vt, causal=causal):
                    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                        return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)

                flops = 4.0 * b * h * s * s * d / (2 if causal else 1) * (2.5 if bwd else 1.0)
                yield SimpleNamespace(d=d, s=s, causal=causal, b=b, h=h, g=g, q=q, k=k, v=v, dout=dout, qt=qt,
                                      kt=kt, vt=vt, cudnn=cudnn, flops=flops)
                del q, k, v, dout, qt, kt, vt, cudnn
                torch.cuda.empty_cache()


def print_ratio_table(op, records, subject, cols, names, peers, ratio_names, ratio_fmt):
    """The TFLOP/s of each (head dim, seqlen, causal) of records, a column a provider of cols (headed
    names), then subject's over each of peers (headed ratio_names, ratio_fmt such as "10.3f") and
    subject's check."""
    width = int(ratio_fmt.split(".")[0])
    print(f"{op}: TFLOP/s")
    print(f"{'d':>4} {'seqlen':>6} {'causal':>6} " + " ".join(f"{n:>8}" for n in names)
          + "".join(f" {n:>{width}}" for n in ratio_names) + "  check")
    by = {}
    for r in records:
        by.setdefault((r["head_dim"], r["seqlen"], r["causal"]), {})[r["provider"]] = r
    for (d, s, causal), row in by.items():
        t = {p: row[p].get("tflops") for p in row}
        cells = " ".join(f"{t[p]:8.1f}" if t.get(p) else f"{'-':>8}" for p in cols)
        ratios = ""
        for peer in peers:
            ratios += f" {t[subject] / t[peer]:{ratio_fmt}}" if t.get(peer) and t.get(subject) else f" {'-':>{width}}"
        chk = row[subject].get("check", {}).get("pass")
        print(f"{d:>4} {s:>6} {str(causal):>6} {cells}{ratios}  {'PASS' if chk else 'FAIL'}")


def time_records(recs, fns, rounds, bwd, errors0, flops):
    """fns timed in rounds (do_bench medians; forwards under no_grad) into their records (fill_records)."""
    def time_one(p, fn):
        if bwd:
            return bench_ms(fn, 25, 100), None, None
        with torch.no_grad():
            return bench_ms(fn, 25, 100), None, None

    return fill_records(recs, fns, rounds, time_one, errors0, flops)


def bench_ms_clean_l2(fn, warmup=10, reps=100, flush_mb=256) -> float:
    """Median ms of fn with L2 cleared before every call by reading a buffer twice L2's size, so
    that L2 holds clean lines when fn starts. (do_bench clears it by writing zeros: fn then starts
    with L2 full of dirty lines, whose write-back shares DRAM with fn's reads.)"""
    cache = torch.ones(flush_mb << 18, dtype=torch.int32, device="cuda")
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for _ in range(warmup):
        fn()
    for i in range(reps):
        cache.sum(dtype=torch.int64)
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    times = sorted(s.elapsed_time(e) for s, e in zip(starts, ends))
    return float(times[len(times) // 2])


# ---------------------------------------------------------------------------------------------
# fa4's check: batch 0, heads 0 and h-1, against float64 (rows in chunks to bound memory)


def criterion(got, ref, lowp):
    """DESIGN.md §3's criterion for one tensor (got, and the plain 16-bit lowp, against float64 ref):
    a dict of the numbers and 'pass'."""
    g, lp = got.double(), lowp.double()
    err, err_lp = (g - ref).abs().max().item(), (lp - ref).abs().max().item()
    rel = ((g - ref).norm() / ref.norm()).item() if ref.norm() > 0 else 0.0
    ok = bool(torch.isfinite(g).all()) and err <= 2 * err_lp + ATOL and rel <= REL_FROBENIUS
    return {"max_err": err, "bound": 2 * err_lp + ATOL, "lowprec_err": err_lp, "rel_frobenius": rel, "pass": ok}


def check_fa4(q, k, v, out, causal, softcap=0.0, sink=None):
    """q, k, v, out: [b, s, h, d]; softcap > 0: scores soft-capped, softcap * tanh(score / softcap)
    (in each precision's own arithmetic); sink ([h], fp32): each head's sink score, a column of S
    with no value (learnable_sink). Returns a dict with the criterion's numbers and 'pass'."""
    s, h, d = q.shape[1], q.shape[2], q.shape[3]
    sk = k.shape[1]
    scale = 1.0 / math.sqrt(d)
    heads = sorted({0, h - 1})
    err = err_lp = sq_err = sq_ref = 0.0
    finite = True
    chunk = max(1, min(s, (256 << 20) // (8 * sk)))
    for hh in heads:
        k64, v64 = k[0, :, hh].double(), v[0, :, hh].double()
        k32, v32 = k[0, :, hh].float(), v[0, :, hh].float()
        for i0 in range(0, s, chunk):
            i1 = min(s, i0 + chunk)
            rows = torch.arange(i0, i1, device=q.device)[:, None]
            cols = torch.arange(sk, device=q.device)[None, :]
            masked = (cols > rows + (sk - s)) if causal else None  # bottom-right, as fa4's
            # float64
            s64 = (q[0, i0:i1, hh].double() @ k64.T) * scale
            if softcap > 0:
                s64 = softcap * torch.tanh(s64 / softcap)
            if masked is not None:
                s64 = s64.masked_fill(masked, float("-inf"))
            if sink is not None:
                s64 = torch.cat([s64, sink[hh].double().expand(i1 - i0, 1)], dim=-1)
            ref = torch.softmax(s64, dim=-1)[:, :sk] @ v64
            # plain 16-bit: fp32 S and softmax, P and O rounded to the dtype
            s32 = (q[0, i0:i1, hh].float() @ k32.T) * scale
            if softcap > 0:
                s32 = softcap * torch.tanh(s32 / softcap)
            if masked is not None:
                s32 = s32.masked_fill(masked, float("-inf"))
            if sink is not None:
                s32 = torch.cat([s32, sink[hh].float().expand(i1 - i0, 1)], dim=-1)
            p = torch.softmax(s32, dim=-1)[:, :sk].to(q.dtype).float()
            lp = (p @ v32).to(q.dtype).double()
            o = out[0, i0:i1, hh].double()
            finite = finite and bool(torch.isfinite(o).all())
            err = max(err, (o - ref).abs().max().item())
            err_lp = max(err_lp, (lp - ref).abs().max().item())
            sq_err += (o - ref).pow(2).sum().item()
            sq_ref += ref.pow(2).sum().item()
    rel = math.sqrt(sq_err / sq_ref) if sq_ref > 0 else 0.0
    bound = 2 * err_lp + ATOL
    ok = finite and err <= bound and rel <= REL_FROBENIUS
    return {"pass": ok, "max_err": err, "bound": bound, "lowprec_err": err_lp,
            "rel_frobenius": rel, "heads": heads, "batch": 0}


# ---------------------------------------------------------------------------------------------
# Providers: each returns a callable to time (forward, or backward of a kept graph)

_flex_compiled = None


def flex_attention():
    global _flex_compiled
    if _flex_compiled is None:
        import torch._dynamo as dyn
        from torch.nn.attention.flex_attention import flex_attention as fa

        for name in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit",
                     "accumulated_cache_size_limit"):
            if hasattr(dyn.config, name):
                setattr(dyn.config, name, 4096)
        _flex_compiled = torch.compile(fa, dynamic=False)
    return _flex_compiled


def causal_mod(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def make_fn(provider, op, tensors, causal):
    """tensors: dict with q, k, v in BSHD ('q'...) and BHSD ('qh'...), and dout for bwd.
    provider may name the memory its inputs live in, 'NAME@bshd' or 'NAME@bhsd' (bench/memory.py);
    without it fa4 reads the BSHD tensors and the peers the BHSD ones."""
    provider, mem = memory_of(provider)
    if provider == "fa4":
        import fa4

        q, k, v = (tensors[n] if mem == "bshd" else tensors[n + "h"].transpose(1, 2) for n in "qkv")
        if op == "fwd":
            return lambda: fa4.flash_attn_func(q, k, v, causal=causal)
        out = fa4.flash_attn_func(q, k, v, causal=causal)
        dout = tensors["dout"]
        return lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)

    q, k, v = (tensors[n + "h"] if mem == "bhsd" else tensors[n].transpose(1, 2) for n in "qkv")
    if provider in ("cudnn", "fa2"):
        backend = SDPBackend.CUDNN_ATTENTION if provider == "cudnn" else SDPBackend.FLASH_ATTENTION

        def fwd():
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    else:
        from torch.nn.attention.flex_attention import create_block_mask

        s = q.shape[2]
        bm = create_block_mask(causal_mod, 1, 1, s, s, device=q.device) if causal else None
        flex = flex_attention()

        def fwd():
            return flex(q, k, v, block_mask=bm)

    if op == "fwd":
        return fwd
    out = fwd()
    dout = tensors["douth"]
    return lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)


def make_tensors(b, h, s, d, dtype, op, seed, sq=None, dv=None):
    """q, k [b, s, h, d]; v and dout of dv columns (None: d)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    grad = op == "bwd"
    t = {}
    for name in ("q", "k", "v") + (("dout",) if grad else ()):
        rows = sq if sq is not None and name in ("q", "dout") else s
        cols = dv if dv is not None and name in ("v", "dout") else d
        x = torch.randn(b, rows, h, cols, device="cuda", dtype=dtype, generator=g)
        t[name] = x.requires_grad_(grad and name != "dout")
        xh = x.detach().transpose(1, 2).contiguous()  # BHSD for the SDPA/flex peers
        t[name + "h"] = xh.requires_grad_(grad and name != "dout")
    return t


# ---------------------------------------------------------------------------------------------
# The table


def fmt(x, width, prec=1):
    return f"{x:{width}.{prec}f}" if isinstance(x, (int, float)) and x is not None else f"{'-':>{width}}"


def print_table(records, providers, ops):
    rows = {}
    for r in records:
        key = (r["op"], r["head_dim"], r["causal"], r["seqlen_k"])
        rows.setdefault(key, {})[r["provider"]] = r
    peers = [p for p in providers if p != "fa4"]
    head = f"{'op':<4}{'d':>5}{'causal':>8}{'seqlen':>8}" + "".join(f"{p:>9}" for p in providers)
    if "fa4" in providers:
        head += "".join(f"{'fa4/' + p:>11}" for p in peers) + "  fa4 check"
    lines = ["", "TFLOP/s (median) and ratios; '-' = not run or not supported", head,
             "-" * len(head)]
    for key in sorted(rows, key=lambda k: (ops.index(k[0]), k[1], k[2], k[3])):
        op, d, causal, s = key
        cells = rows[key]
        tf = {p: cells[p]["tflops"] if p in cells else None for p in providers}
        line = f"{op:<4}{d:>5}{'yes' if causal else 'no':>8}{s:>8}"
        line += "".join(fmt(tf[p], 9) for p in providers)
        if "fa4" in providers:
            for p in peers:
                ratio = tf["fa4"] / tf[p] if tf["fa4"] and tf[p] else None
                line += fmt(ratio, 11, 2)
            r4 = cells.get("fa4", {})
            chk = r4.get("check")
            if r4.get("error"):
                line += "  n/a (" + ("not supported" if "NotImplementedError" in r4["error"]
                                     else "error") + ")"
            elif chk:
                line += "  " + ("PASS" if chk["pass"] else "FAIL") + \
                        f" {chk['max_err']:.1e}<={chk['bound']:.1e}"
        lines.append(line)
    print("\n".join(lines), flush=True)


# ---------------------------------------------------------------------------------------------


def main(argv=None) -> int:
    a = parse_args(argv)
    if no_gpu("side_by_side"):
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False
    dtype = DTYPES[a.dtype]
    props = torch.cuda.get_device_properties(0)
    meta = {"gpu": props.name, "driver": gpu_driver(), "commit": commit_hash(),
            "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            # The library's kernel switches this process runs with (read by libfa4 from the
            # environment: FA4_BACKWARD_D192, FA4_BACKWARD_V128, FA4_FORWARD_V128), so padded and native runs differ.
            "switches": {k: os.environ[k] for k in ("FA4_BACKWARD_D192", "FA4_BACKWARD_V128", "FA4_FORWARD_V128")
                         if k in os.environ},
            "command": "python3 bench/side_by_side.py " + " ".join(
                shlex.quote(x) for x in (sys.argv[1:] if argv is None else argv))}
    log(f"side_by_side: {props.name}, {props.multi_processor_count} SMs, driver {meta['driver']}, "
        f"torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, triton "
        f"{triton.__version__}, commit {meta['commit'][:12]}")

    providers = list(a.providers)
    if "fa4" in providers:
        try:
            import fa4  # noqa: F401
        except Exception as e:  # the extension is not built: time the peers anyway
            log(f"side_by_side: fa4 unavailable ({short(e)}); its rows say so")
            fa4_import_error = short(e)
        else:
            fa4_import_error = None

    causals = {"both": (False, True), "yes": (True,), "no": (False,)}[a.causal]
    shapes = [(op, d, c, s) for op in a.ops for d in a.hdims for c in causals for s in a.seqlens]
    records, failed_checks = [], 0
    # SM clock and power beside every timing (the GPU runs attention at its power cap).
    sampler = GpuSampler(device=smi_device_id(torch.cuda.current_device()))
    t_start = time.time()
    for n, (op, d, causal, s) in enumerate(shapes, 1):
        b, h = shape(s, d)
        log(f"[{n}/{len(shapes)}] {op} d={d} causal={int(causal)} seqlen={s} batch={b} heads={h} "
            f"({time.time() - t_start:.0f} s)")
        sq = a.seqlen_q if a.seqlen_q is not None else s
        dv = a.dv if a.dv is not None else d
        tensors = make_tensors(b, h, s, d, dtype, op, seed=n, sq=sq, dv=dv)
        # Each provider's check and callable first; then the timings in rounds, the providers'
        # order rotating by round, so that each meets the GPU's clock and power states in turn.
        recs, fns = {}, {}
        for p in providers:
            if p == "flex" and s not in a.flex_seqlens:
                continue
            rec = {"op": op, "provider": p, "dtype": a.dtype, "batch": b, "heads_q": h,
                   "heads_kv": h, "seqlen_q": sq, "seqlen_k": s, "head_dim": d, "head_dim_v": dv,
                   "causal": causal,
                   "ms": None, "tflops": None, **meta}
            recs[p] = rec
            try:
                if p == "fa4" and fa4_import_error:
                    raise ImportError(fa4_import_error)
                if p == "fa4" and op == "fwd" and not a.no_check:
                    import fa4

                    with torch.no_grad():
                        out = fa4.flash_attn_func(tensors["q"], tensors["k"], tensors["v"],
                                                  causal=causal)
                        rec["check"] = check_fa4(tensors["q"], tensors["k"], tensors["v"], out,
                                                 causal)
                    del out
                    failed_checks += not rec["check"]["pass"]
                fns[p] = make_fn(p, op, tensors, causal)
            except Exception as e:  # a provider that cannot run this shape: record why
                rec["error"] = short(e)
                if os.environ.get("FA4_BENCH_TRACE"):
                    traceback.print_exc(file=sys.stderr)
        ctx = torch.no_grad if op == "fwd" else torch.enable_grad

        def time_one(p, fn):
            with ctx():
                t0 = time.time()
                ms = bench_ms(fn, a.warmup, a.rep)
                return (ms, *sampler.window(t0, time.time()))

        timed, errors = time_in_rounds(fns, a.rounds, time_one)
        for p, e in errors.items():
            recs[p]["error"] = short(e)
            if os.environ.get("FA4_BENCH_TRACE"):
                traceback.print_exception(e, file=sys.stderr)
        for p, rec in recs.items():
            if "error" not in rec and timed.get(p):
                rec.update(summary(timed[p], a.rounds > 1))
                rec["tflops"] = tflops(b, h, s, (d + dv) / 2, causal, op, rec["ms"], sq)
            records.append(rec)
            status = (f"{rec['tflops']:.1f} TFLOP/s" if rec["tflops"] else rec.get("error", "?"))
            if rec.get("sm_clock_mhz") is not None and rec.get("power_w") is not None:
                status += f" @ {rec['sm_clock_mhz']:.0f} MHz, {rec['power_w']:.0f} W"
            if a.rounds > 1 and rec.get("ms_rounds"):
                status += f", rounds {min(rec['ms_rounds']):.4f}-{max(rec['ms_rounds']):.4f} ms"
            chk = rec.get("check")
            if chk:
                status += (f", check {'PASS' if chk['pass'] else 'FAIL'} max|err| "
                           f"{chk['max_err']:.2e} <= {chk['bound']:.2e}, rel {chk['rel_frobenius']:.1e}")
            log(f"    {p:<6}{status}")
        del tensors
        torch.cuda.empty_cache()
    sampler.stop()

    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d-%H%M")
    what = a.name or ("side-by-side-" + "-".join(a.ops) + ("-quick" if a.quick else ""))
    fname = f"{stamp}-{what}.json"
    paths = [Path(a.out) / fname]
    if os.environ.get("OUT"):
        paths.append(Path(os.environ["OUT"]) / fname)
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(records, indent=1) + "\n")
        print(f"wrote {path}", flush=True)
    errors = sorted({r["error"] for r in records if r["provider"] == "fa4" and r.get("error")})
    for e in errors[:5]:
        print(f"fa4 could not run some shapes: {e}", flush=True)
    if failed_checks:
        print(f"fa4 FAILED its check on {failed_checks} shape(s): see 'fa4 check' below", flush=True)
    print_table(records, providers, a.ops)
    return 1 if failed_checks else 0


if __name__ == "__main__":
    sys.exit(main())
