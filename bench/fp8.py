"""The fp8 forward (torch.float8_e4m3fn q, k, v; bf16 out): what it gains over fa4's bf16 forward and
cuDNN's, in one process.

    python3 bench/fp8.py [--hdims 64,128,256] [--seqlens 512,1024,2048,4096,8192,16384] [--rounds 3]
        [--name WHAT] [--out DIR]

FA3's shapes (16k tokens a batch, hidden 2048), causal and not. Providers: fa4-fp8 (q, k, v rounded
to e4m3 once, outside the timing, with FlashAttention-3's descales [batch, heads_kv]; the call
includes its V transpose), fa4 on the bf16 tensors, cuDNN through torch SDPA on bf16 (torch exposes
no fp8 attention to time against). fa4-fp8 is checked first against float64 over the e4m3 values
times their descales: batch 0, head 0, its first 1024 query rows, by DESIGN.md §3's criterion with a
plain fp8 attention as the low-precision form (P rounded to e4m3 as 2^(x - m + 8), the fp32 row sum,
O rounded to bf16): max error at most twice the plain form's + 2e-3, relative Frobenius error at most
3e-2. TFLOP/s count the problem's FLOPs. Times are medians of triton's do_bench in rounds, the
providers' order rotating by round (the software exp2's shares: tools/sm90_fp8_probe).
Writes bench/results/<date>-<what>.json (and a copy under $OUT when set) and prints a table.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(ROOT / "bench"))

import torch  # noqa: E402

from side_by_side import fa3_cases, no_gpu, print_ratio_table, provider_calls, run_meta, time_records, write_records  # noqa: E402


def check_fp8(q8, k8, v8, qd, kd, vd, out, causal, rows=1024):
    """fa4-fp8's out of batch 0, head 0 (first `rows` query rows) against float64 (module docstring)."""
    s = q8.shape[1]
    n = min(rows, s)
    g = q8.shape[2] // k8.shape[2]
    q = q8[0, :n, 0].double() * qd[0, 0].double()
    k = k8[0, :, 0].double() * kd[0, 0].double()
    v = v8[0, :, 0].double() * vd[0, 0].double()
    scale = 1.0 / math.sqrt(q.shape[-1])
    mask = torch.ones(n, s, dtype=torch.bool, device=q.device).triu(1) if causal else None
    x = (q @ k.T) * scale
    if mask is not None:
        x = x.masked_fill(mask, float("-inf"))
    ref = torch.softmax(x, dim=-1) @ v
    # The plain fp8 form.
    x32 = (q8[0, :n, 0].float() @ k8[0, :, 0].float().T) * float(scale * math.log2(math.e) * qd[0, 0] * kd[0, 0])
    if mask is not None:
        x32 = x32.masked_fill(mask, float("-inf"))
    e = torch.exp2(x32 - x32.amax(dim=-1, keepdim=True) + 8.0)
    pe = e.to(torch.float8_e4m3fn).float()
    lp = ((pe @ v8[0, :, 0].float()) / e.sum(dim=-1, keepdim=True) * vd[0, 0]).to(torch.bfloat16)
    got = out[0, :n, 0].double()
    err = (got - ref).abs().max().item()
    err_lp = (lp.double() - ref).abs().max().item()
    rel = ((got - ref).norm() / ref.norm()).item()
    ok = bool(torch.isfinite(got).all()) and err <= 2 * err_lp + 2e-3 and rel <= 3e-2
    return {"pass": ok, "max_abs": err, "max_abs_plain_fp8": err_lp, "rel_frobenius": rel, "rows": n,
            "batch": 0, "head": 0, "group": g}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hdims", default="64,128,256")
    ap.add_argument("--seqlens", default="512,1024,2048,4096,8192,16384")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--name", default="fp8")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    a = ap.parse_args(argv)
    if no_gpu("fp8"):
        return 2
    import fa4

    meta = run_meta("fp8.py", argv)
    records, failed = [], 0
    for c in fa3_cases((int(x) for x in a.hdims.split(",")), [int(x) for x in a.seqlens.split(",")], False):
        q, k, v, causal, s = c.q, c.k, c.v, c.causal, c.s
        f8 = torch.float8_e4m3fn
        q8, k8, v8 = (x.detach().to(f8) for x in (q, k, v))
        qd, kd, vd = (torch.rand(c.b, k.shape[2], device="cuda", generator=c.g) + 0.5 for _ in range(3))
        fwds = {"fa4-fp8": lambda: fa4.flash_attn_func(q8, k8, v8, causal=causal, q_descale=qd, k_descale=kd,
                                                       v_descale=vd),
                "fa4": lambda: fa4.flash_attn_func(q, k, v, causal=causal),
                "cudnn": c.cudnn}
        recs = {p: {"op": "fwd", "provider": p, "head_dim": c.d, "seqlen": s, "batch": c.b, "heads": c.h,
                    "causal": causal, "dtype": "e4m3" if p == "fa4-fp8" else "bf16", "ms": None, **meta}
                for p in fwds}
        fns, errors0 = provider_calls(fwds, False, None)
        with torch.no_grad():
            chk = check_fp8(q8, k8, v8, qd, kd, vd, fns["fa4-fp8"](), causal)
        recs["fa4-fp8"]["check"] = chk
        failed += not chk["pass"]
        records += time_records(recs, fns, a.rounds, False, errors0, c.flops)
        del q, k, v, q8, k8, v8, fns, fwds, c

    write_records(records, a.out, a.name)
    print_ratio_table("fwd", records, "fa4-fp8", ("fa4-fp8", "fa4", "cudnn"), ("fa4-fp8", "fa4", "cudnn"),
                      ("fa4", "cudnn"), ("fp8/bf16", "fp8/cudnn"), "9.2f")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
