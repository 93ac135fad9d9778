"""Soft-capped attention (Problem::softcap): what the cap costs fa4's forward, in one process.

    python3 bench/softcap.py [--hdims 64,128,256] [--seqlens 1024,4096] [--softcap 30] [--rounds 3]
        [--name WHAT] [--out DIR]

FA3's shapes (16k tokens a batch, hidden 2048), causal and not, bf16. Providers: fa4 without the
cap, fa4 with it (fa4-softcap), and cuDNN through torch SDPA without it (the plain problem's
reference point: torch exposes no soft cap for cuDNN or FA2). fa4-softcap's output is checked first
against float64 (side_by_side.check_fa4 with the cap: batch 0, first and last head) by DESIGN.md
§3's criterion. TFLOP/s count the plain problem's FLOPs. Times are medians of triton's do_bench in
rounds, the providers' order rotating by round. Writes bench/results/<date>-<what>.json (and a copy
under $OUT when set) and prints a table.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(ROOT / "bench"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

from rounds import summary, time_in_rounds  # noqa: E402
from side_by_side import bench_ms, check_fa4, no_gpu, run_meta, short, write_records  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hdims", default="64,128,256")
    ap.add_argument("--seqlens", default="1024,4096")
    ap.add_argument("--softcap", type=float, default=30.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--name", default="softcap")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    a = ap.parse_args(argv)
    if no_gpu("softcap"):
        return 2
    import fa4

    meta = run_meta("softcap.py", argv)
    records, failed = [], 0
    for d in (int(x) for x in a.hdims.split(",")):
        for s in (int(x) for x in a.seqlens.split(",")):
            for causal in (False, True):
                b, h = max(1, 16384 // s), 2048 // d
                g = torch.Generator(device="cuda").manual_seed(d * 100003 + s * 2 + causal)
                q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
                flops = 4.0 * b * h * s * s * d / (2 if causal else 1)
                qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))

                def cudnn():
                    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                        return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)

                fns = {"fa4": lambda: fa4.flash_attn_func(q, k, v, causal=causal),
                       "fa4-softcap": lambda: fa4.flash_attn_func(q, k, v, causal=causal, softcap=a.softcap),
                       "cudnn": cudnn}
                recs = {p: {"op": "fwd", "provider": p, "head_dim": d, "seqlen": s, "batch": b, "heads": h,
                            "causal": causal, "softcap": a.softcap if p == "fa4-softcap" else 0.0, "ms": None, **meta}
                        for p in fns}
                with torch.no_grad():
                    chk = check_fa4(q, k, v, fns["fa4-softcap"](), causal, softcap=a.softcap)
                recs["fa4-softcap"]["check"] = chk
                failed += not chk["pass"]

                def time_one(p, fn):
                    with torch.no_grad():
                        return bench_ms(fn, 25, 100), None, None

                timed, errors = time_in_rounds(fns, a.rounds, time_one)
                for p, rec in recs.items():
                    if p in errors:
                        rec["error"] = short(errors[p])
                    elif timed.get(p):
                        rec.update(summary(timed[p], a.rounds > 1))
                        rec["tflops"] = flops / (rec["ms"] * 1e-3) / 1e12
                    records.append(rec)
                del q, k, v, qt, kt, vt
                torch.cuda.empty_cache()

    write_records(records, a.out, a.name)
    print(f"{'d':>4} {'seqlen':>6} {'causal':>6} {'fa4':>8} {'softcap':>8} {'cudnn':>8} {'cap/plain':>9} "
          f"{'cap/cudnn':>9}  check")
    by = {}
    for r in records:
        by.setdefault((r["head_dim"], r["seqlen"], r["causal"]), {})[r["provider"]] = r
    for (d, s, causal), row in by.items():
        t = {p: row[p].get("tflops") for p in row}
        cells = " ".join(f"{t[p]:8.1f}" if t.get(p) else f"{'-':>8}" for p in ("fa4", "fa4-softcap", "cudnn"))
        r1 = f"{t['fa4-softcap'] / t['fa4']:9.2f}" if t.get("fa4") and t.get("fa4-softcap") else f"{'-':>9}"
        r2 = f"{t['fa4-softcap'] / t['cudnn']:9.2f}" if t.get("cudnn") and t.get("fa4-softcap") else f"{'-':>9}"
        chk = row["fa4-softcap"].get("check", {}).get("pass")
        print(f"{d:>4} {s:>6} {str(causal):>6} {cells} {r1} {r2}  {'PASS' if chk else 'FAIL'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
