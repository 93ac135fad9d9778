"""Soft-capped attention (Problem::softcap): what the cap costs fa4, forward or backward, in one
process.

    python3 bench/softcap.py [--op fwd|bwd] [--hdims 64,128,256] [--seqlens 1024,4096]
        [--softcap 30] [--flex-seqlens 4096] [--rounds 3] [--name WHAT] [--out DIR]

FA3's shapes (16k tokens a batch, hidden 2048), causal and not, bf16. Providers: fa4 without the
cap, fa4 with it (fa4-softcap), cuDNN through torch SDPA without it (the plain problem's reference
point: torch exposes no soft cap for cuDNN or FA2), and FlexAttention with the cap as its score_mod
(flex-softcap, the one capped peer torch has; torch.compile'd, at --flex-seqlens only). fa4-softcap is checked first
against float64 by DESIGN.md §3's criterion: the forward's output on batch 0, first and last head
(side_by_side.check_fa4 with the cap); the backward's dQ, dK and dV of batch 0, head 0 (check_grads).
TFLOP/s count the plain problem's FLOPs (x 2.5 for the backward). Times are medians of triton's
do_bench in rounds, the providers' order rotating by round; the backward's are of the gradient
call alone (autograd.grad of a kept graph). Writes bench/results/<date>-<what>.json (and a copy
under $OUT when set) and prints a table.
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

from side_by_side import (causal_mod, check_fa4, criterion, fa3_cases, flex_attention, no_gpu,  # noqa: E402
                          print_ratio_table, provider_calls, run_meta, time_records, write_records)


def capped_attention(q, k, v, causal, softcap, lowp):
    """out of one head's [s, d] q, k, v with capped scores: float64 throughout (lowp False), or the
    plain 16-bit form (lowp True: S by a 16-bit matmul, cap and softmax in fp32 rounded back, O by a
    16-bit matmul), whose every intermediate gradient is rounded too."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    s = (q @ k.T) * scale
    s = (softcap * torch.tanh((s.float() if lowp else s) / softcap)).to(s.dtype)
    if causal:
        n = q.shape[0]
        s = s.masked_fill(torch.ones(n, k.shape[0], dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    p = torch.softmax(s.float() if lowp else s, dim=-1).to(s.dtype)
    return p @ v


def check_grads(q, k, v, dout, grads, causal, softcap):
    """fa4's dq, dk, dv (`grads`, [b, s, h, d]) of batch 0, head 0 against float64 autograd, bounded
    by the plain 16-bit backward's error (DESIGN.md §3). Heads are not grouped here, so head 0's dK
    and dV come from query head 0 alone."""
    x = [t[0, :, 0].detach() for t in (q, k, v)]
    do = dout[0, :, 0]
    out = {}
    for name, lowp in (("ref", False), ("lp", True)):
        leaves = [(t.double() if not lowp else t.clone()).requires_grad_(True) for t in x]
        o = capped_attention(*leaves, causal, softcap, lowp)
        out[name] = torch.autograd.grad(o, leaves, do.double() if not lowp else do)
    res = {"pass": True, "batch": 0, "head": 0}
    for i, name in enumerate(("dq", "dk", "dv")):
        res[name] = criterion(grads[i][0, :, 0], out["ref"][i], out["lp"][i])
        res["pass"] = res["pass"] and res[name]["pass"]
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--op", choices=("fwd", "bwd"), default="fwd")
    ap.add_argument("--hdims", default="64,128,256")
    ap.add_argument("--seqlens", default="1024,4096")
    ap.add_argument("--softcap", type=float, default=30.0)
    ap.add_argument("--flex-seqlens", default="4096", help="seqlens at which flex-softcap runs")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--name", default=None, help="default: softcap (fwd), softcap-bwd (bwd)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    a = ap.parse_args(argv)
    if no_gpu("softcap"):
        return 2
    import fa4

    bwd = a.op == "bwd"
    cap = a.softcap
    flex_seqlens = {int(x) for x in a.flex_seqlens.split(",") if x}
    meta = run_meta("softcap.py", argv)
    records, failed = [], 0
    for c in fa3_cases((int(x) for x in a.hdims.split(",")), [int(x) for x in a.seqlens.split(",")], bwd):
        q, k, v, dout, causal, s = c.q, c.k, c.v, c.dout, c.causal, c.s

        def flex_softcap():
            def mod(score, b_, h_, q_idx, kv_idx):
                return cap * torch.tanh(score / cap)

            from torch.nn.attention.flex_attention import create_block_mask
            bm = create_block_mask(causal_mod, 1, 1, s, s, device="cuda") if causal else None
            return flex_attention()(c.qt, c.kt, c.vt, score_mod=mod, block_mask=bm)

        fwds = {"fa4": lambda: fa4.flash_attn_func(q, k, v, causal=causal),
                "fa4-softcap": lambda: fa4.flash_attn_func(q, k, v, causal=causal, softcap=cap),
                "cudnn": c.cudnn}
        if s in flex_seqlens:
            fwds["flex-softcap"] = flex_softcap
        recs = {p: {"op": a.op, "provider": p, "head_dim": c.d, "seqlen": s, "batch": c.b, "heads": c.h,
                    "causal": causal, "softcap": cap if p.endswith("softcap") else 0.0, "ms": None, **meta}
                for p in fwds}
        fns, errors0 = provider_calls(fwds, bwd, lambda p: (
            ((q, k, v), dout) if p.startswith("fa4") else ((c.qt, c.kt, c.vt), dout.transpose(1, 2).contiguous())))
        if bwd:
            chk = check_grads(q, k, v, dout, fns["fa4-softcap"](), causal, cap)
        else:
            with torch.no_grad():
                chk = check_fa4(q, k, v, fns["fa4-softcap"](), causal, softcap=cap)
        recs["fa4-softcap"]["check"] = chk
        failed += not chk["pass"]
        records += time_records(recs, fns, a.rounds, bwd, errors0, c.flops)
        del q, k, v, dout, fns, fwds, flex_softcap, c

    write_records(records, a.out, a.name or ("softcap-bwd" if bwd else "softcap"))
    print_ratio_table(a.op, records, "fa4-softcap", ("fa4", "fa4-softcap", "cudnn", "flex-softcap"),
                      ("fa4", "softcap", "cudnn", "flex-cap"), ("fa4", "cudnn", "flex-softcap"),
                      ("cap/plain", "cap/cudnn", "cap/flex"), "9.2f")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
