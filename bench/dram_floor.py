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
import shlex
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import torch  # noqa: E402

import side_by_side as sbs  # noqa: E402

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
    if sbs.no_gpu("dram_floor"):
        return 2

    b, h = sbs.shape(a.seqlen, a.hdim)
    s, d = a.seqlen, a.hdim
    t = sbs.make_tensors(b, h, s, d, torch.bfloat16, "fwd", seed=1)
    q, k, v = t["q"], t["k"], t["v"]
    o = torch.empty_like(q)
    tensor_bytes = q.numel() * q.element_size()

    fns = {"floor": lambda: torch.addcmul(q, k, v, out=o)}
    for name in a.providers.split(","):
        if name in ("fa4", "cudnn", "fa2"):
            fns[name] = sbs.make_fn(name, "fwd", t, a.causal)
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
    driver = sbs.gpu_driver()
    rec = {"gpu": props.name, "driver": driver, "commit": sbs.commit_hash(),
           "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
           "command": "python3 bench/dram_floor.py " + " ".join(shlex.quote(x) for x in sys.argv[1:]),
           "shape": {"batch": b, "heads": h, "seqlen": s, "head_dim": d, "causal": a.causal, "dtype": "bf16"},
           "bytes_read": 3 * tensor_bytes, "bytes_written": tensor_bytes,
           "rounds": a.rounds, "reps": a.reps, "results": []}
    print(f"{props.name}, driver {driver}: b={b} h={h} s={s} d={d} causal={a.causal}; "
          f"{4 * tensor_bytes / 1e6:.0f} MB of Q, K, V and O")
    print(f"{'provider':8} {'flush':6} {'us':>8} {'TFLOP/s':>8} {'TB/s of QKVO':>13}  rounds (us)")
    for (n, m), ts in times.items():
        ms = statistics.median(ts)
        r = {"provider": n, "flush": m, "ms": ms, "rounds_ms": ts,
             "tb_per_s": 4 * tensor_bytes / (ms * 1e-3) / 1e12,
             "tflops": None if n == "floor" else sbs.tflops(b, h, s, d, a.causal, "fwd", ms)}
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
