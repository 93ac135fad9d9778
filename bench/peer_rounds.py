#!/usr/bin/env python3
"""fa4 against cuDNN (and FA2) on chosen FA3 shapes, several rounds alternating providers, three
ways of timing each call: the harness's (triton do_bench, L2 flushed before every call, CUDA
events around it), a CUDA graph of back-to-back calls (no host work between kernels, L2 warm), and
the kernels' own durations from the profiler (CUPTI; what the GPU spent in the provider's kernels).

  python3 bench/peer_rounds.py [--hdims 64,128] [--seqlens 4096,8192] [--causal no|yes|both]
      [--providers fa4,cudnn] [--rounds 4] [--out FILE.json]

Medians over the rounds, and each provider's ratio to cuDNN per timing. If do_bench's ratio and
the kernels' ratio differ, something outside the kernels (host path, launch gaps) is in the
harness's number; if the graph's ratio differs from the kernels', the L2 state is.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import torch  # noqa: E402
import triton  # noqa: E402

import side_by_side as sbs  # noqa: E402


TIMINGS = ("do_bench_ms", "graph_ms", "kernel_ms")  # a record's three times of one call


def kernel_ms(fn, calls=20):
    """Mean over `calls` calls of the summed CUDA kernel time one call launches (profiler)."""
    times = sbs.kernel_times(fn, calls)
    return sum(times.values()) / 1e3, sorted({name[:60] for name in times})


def graph_ms(fn):
    return float(triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median"))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hdims", type=sbs.int_list, default=[64, 128])
    ap.add_argument("--seqlens", type=sbs.int_list, default=[4096, 8192])
    ap.add_argument("--causal", choices=["no", "yes", "both"], default="no")
    ap.add_argument("--providers", default="fa4,cudnn")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    providers = a.providers.split(",")
    props = torch.cuda.get_device_properties(0)
    causals = {"no": (False,), "yes": (True,), "both": (False, True)}[a.causal]
    records = []
    for d in a.hdims:
        for c in causals:
            for s in a.seqlens:
                b, h = sbs.shape(s, d)
                t = sbs.make_tensors(b, h, s, d, torch.bfloat16, "fwd", seed=1)
                fns = {p: sbs.make_fn(p, "fwd", t, c) for p in providers}
                for r in range(a.rounds):
                    order = providers[r % len(providers):] + providers[:r % len(providers)]
                    for p in order:
                        fn = fns[p]
                        bench = sbs.bench_ms(fn, 25, 100)  # the harness's timing, its defaults
                        graph = graph_ms(fn)
                        kern, names = kernel_ms(fn)
                        records.append({"provider": p, "head_dim": d, "causal": c, "seqlen": s, "batch": b,
                                        "heads": h, "round": r, "do_bench_ms": bench, "graph_ms": graph,
                                        "kernel_ms": kern, "kernels": names})
                        print(f"d{d} {'causal' if c else 'nc'} {s} r{r} {p:6s} do_bench {bench:.4f}  graph "
                              f"{graph:.4f}  kernels {kern:.4f} ms  {names}", flush=True)
                del t, fns
                torch.cuda.empty_cache()
    print("\nmedians (ms) and fa4 / cuDNN speed per timing")
    summary = []
    for d in a.hdims:
        for c in causals:
            for s in a.seqlens:
                row = {"head_dim": d, "causal": c, "seqlen": s}
                for p in providers:
                    rs = [x for x in records if x["provider"] == p and x["head_dim"] == d and x["causal"] == c and x["seqlen"] == s]
                    for k in TIMINGS:
                        row[f"{p}_{k}"] = statistics.median(x[k] for x in rs)
                if "cudnn" in providers:
                    for p in providers:
                        if p != "cudnn":
                            for k in TIMINGS:
                                row[f"{p}_vs_cudnn_{k}"] = row[f"cudnn_{k}"] / row[f"{p}_{k}"]
                summary.append(row)
                print(json.dumps(row))
    if a.out:
        meta = {"gpu": props.name, "driver": sbs.gpu_driver(), "commit": os.environ.get("FA4_COMMIT", sbs.commit_hash()),
                "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                "command": "python3 bench/peer_rounds.py " + " ".join(sys.argv[1:] if argv is None else argv)}
        json.dump({**meta, "summary": summary, "records": records}, open(a.out, "w"), indent=0)


if __name__ == "__main__":
    main()
