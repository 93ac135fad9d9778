"""What DRAM alone allows one attention shape, timed the way the harness times it.

    python3 bench/dram_floor.py [--hdim 256] [--seqlen 512] [--causal] [--rounds 5] [--reps 40]
        [--providers floor,fa4,cudnn,fa2] [--out FILE]

The shape is FA3's (16k tokens, hidden 2048; bench/side_by_side.py). `floor` is
torch.addcmul(q, k, v, out=o) over tensors of the attention's size: it reads Q, K and V once and
writes O once, the bytes attention cannot avoid, and does nothing else, so its time is what DRAM
allows those bytes. Every provider is timed after each of two L2 flushes:
  dirty  256 MB zeroed, as triton.testing.do_bench (and so bench/side_by_side.py) does: the L2
         is left holding up to its size of written lines, which go back to DRAM during the call
  clean  256 MB read (after the same zeroing, untimed): the L2 holds only clean lines
Rounds alternate the providers; each (provider, flush) reports the median over rounds of the
per-round medians of CUDA-event times. Writes a JSON record (GPU, driver, commit, date, command).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shlex
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

TOKENS, HIDDEN = 16384, 2048
FLUSH_BYTES = 256 << 20


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hdim", type=int, default=256)
    ap.add_argument("--seqlen", type=int, default=512)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--providers", default="floor,fa4,cudnn,fa2")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("dram_floor: no CUDA GPU here; run it on the GPU machine", file=sys.stderr)
        return 2

    b, h, s, d = TOKENS // a.seqlen, HIDDEN // a.hdim, a.seqlen, a.hdim
    g = torch.Generator(device="cuda").manual_seed(1)
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    o = torch.empty_like(q)
    qh, kh, vh = (t.transpose(1, 2).contiguous() for t in (q, k, v))
    tensor_bytes = q.numel() * q.element_size()
    flops = 4.0 * b * h * s * s * d * (0.5 if a.causal else 1.0)

    fns = {"floor": lambda: torch.addcmul(q, k, v, out=o)}
    for name in a.providers.split(","):
        if name == "fa4":
            import fa4
            fns["fa4"] = lambda: fa4.flash_attn_func(q, k, v, causal=a.causal)
        elif name in ("cudnn", "fa2"):
            backend = SDPBackend.CUDNN_ATTENTION if name == "cudnn" else SDPBackend.FLASH_ATTENTION

            def sdpa(backend=backend):
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(qh, kh, vh, is_causal=a.causal)
            fns[name] = sdpa
        elif name != "floor":
            sys.exit(f"dram_floor: --providers has '{name}': allowed are floor, fa4, cudnn, fa2")

    cache = torch.empty(FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
    sink = torch.empty((), dtype=torch.int64, device="cuda")

    def flush(mode: str) -> None:
        cache.zero_()
        if mode == "clean":
            sink.copy_(cache.sum())  # reads 256 MB: the zeroing's lines leave L2 before the call

    def time_once(fn, mode: str) -> float:
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(a.reps)]
        for e0, e1 in ev:
            flush(mode)
            e0.record()
            fn()
            e1.record()
        torch.cuda.synchronize()
        return statistics.median(e0.elapsed_time(e1) for e0, e1 in ev)

    for fn in fns.values():  # warm-up (cuDNN plans, the extension's first call)
        for _ in range(5):
            fn()
    torch.cuda.synchronize()
    times = {(n, m): [] for n in fns for m in ("dirty", "clean")}
    for r in range(a.rounds):
        order = list(fns) if r % 2 == 0 else list(reversed(fns))
        for n in order:
            for m in ("dirty", "clean"):
                times[(n, m)].append(time_once(fns[n], m))

    props = torch.cuda.get_device_properties(0)
    try:
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, check=True).stdout.split()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        driver = "unknown"
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                text=True, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = "unknown"
    commit = os.environ.get("FA4_COMMIT", commit)
    rec = {"gpu": props.name, "driver": driver, "commit": commit,
           "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
           "command": "python3 bench/dram_floor.py " + " ".join(shlex.quote(x) for x in sys.argv[1:]),
           "shape": {"batch": b, "heads": h, "seqlen": s, "head_dim": d, "causal": a.causal, "dtype": "bf16"},
           "bytes_read": 3 * tensor_bytes, "bytes_written": tensor_bytes, "flops": flops,
           "rounds": a.rounds, "reps": a.reps, "results": []}
    print(f"{props.name}, driver {driver}: b={b} h={h} s={s} d={d} causal={a.causal}; "
          f"{4 * tensor_bytes / 1e6:.0f} MB of Q, K, V and O")
    print(f"{'provider':8} {'flush':6} {'us':>8} {'TFLOP/s':>8} {'TB/s of QKVO':>13}  rounds (us)")
    for (n, m), ts in times.items():
        ms = statistics.median(ts)
        r = {"provider": n, "flush": m, "ms": ms, "rounds_ms": ts,
             "tb_per_s": 4 * tensor_bytes / (ms * 1e-3) / 1e12,
             "tflops": None if n == "floor" else flops / (ms * 1e-3) / 1e12}
        rec["results"].append(r)
        tf = "-" if r["tflops"] is None else f"{r['tflops']:.1f}"
        print(f"{n:8} {m:6} {ms * 1e3:8.1f} {tf:>8} {r['tb_per_s']:13.2f}  "
              + " ".join(f"{t * 1e3:.1f}" for t in ts))
    if a.out:
        Path(a.out).write_text(json.dumps(rec, indent=1) + "\n")
        print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
