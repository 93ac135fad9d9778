"""Attention sinks (ForwardArgs::sink, learnable_sink): what they cost fa4, forward or backward, in
one process.

    python3 bench/sink.py [--op fwd|bwd] [--hdims 64,128,256] [--seqlens 1024,4096] [--rounds 3]
        [--name WHAT] [--out DIR]

FA3's shapes (16k tokens a batch, hidden 2048), causal and not, bf16. Providers: fa4 without sinks,
fa4 with them (fa4-sink: each head's sink from N(0, 1)), and cuDNN through torch SDPA without them
(the plain problem's reference point: no peer in torch takes sinks). fa4-sink is checked first
against float64 by DESIGN.md §3's criterion: the forward's output on batch 0, first and last head
(side_by_side.check_fa4 with the sinks); the backward's dQ, dK and dV of batch 0, head 0 and head
0's dsink over every batch entry, both references taking D from fa4's own output (flash_grads). TFLOP/s count the plain problem's FLOPs (x 2.5 for the backward).
Times are medians of triton's do_bench in rounds, the providers' order rotating by round; the
backward's are of the gradient call alone (autograd.grad of a kept graph), fa4-sink's with the
sinks' gradient. Writes bench/results/<date>-<what>.json (and a copy under $OUT when set) and prints
a table.
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

from side_by_side import (ATOL, REL_FROBENIUS, check_fa4, criterion, fa3_cases, no_gpu,  # noqa: E402
                          print_ratio_table, provider_calls, run_meta, time_records, write_records)


def flash_grads(q, k, v, sink, do, o, causal, lowp):
    """dq, dk, dv, dsink of one head's [s, d] q, k, v with sink [1], as a flash backward computes them
    (fa4::ref::backward, backward_lowp): P from the scores with the sink's column, D = rowsum(dO o O)
    from o (fa4's output: the backward is checked on what it is handed; the output's own rounding
    moves D, and with it dsink, by more than the plain form's one draw of roundings tells, and the
    forward's check bounds it), dS = P (dP - D), dsink = -sum of P_sink D. lowp False: float64; True:
    the plain low-precision form (fp32 scores and P, dS and the gradients rounded to q's dtype)."""
    work = torch.float32 if lowp else torch.float64
    scale = 1.0 / math.sqrt(q.shape[-1])
    qf, kf, vf, dof, of = (t.detach().to(work) for t in (q, k, v, do, o))
    s = (qf @ kf.T) * scale
    if causal:
        n, m = q.shape[0], k.shape[0]
        s = s.masked_fill(torch.ones(n, m, dtype=torch.bool, device=q.device).triu(m - n + 1), float("-inf"))
    p = torch.softmax(torch.cat([s, sink.detach().to(work).expand(s.shape[0], 1)], dim=-1), dim=-1)
    p_sink, p = p[:, -1], p[:, :-1]
    D = (dof * of).sum(-1)
    ds = p * (dof @ vf.T - D[:, None])
    if lowp:
        ds = ds.to(q.dtype).to(work)
    grads = (ds @ kf * scale, ds.T @ qf * scale, p.T @ dof)
    if lowp:
        grads = tuple(x.to(q.dtype) for x in grads)
    return (*grads, -(p_sink * D).sum())


def check_grads(q, k, v, dout, sink, out, grads, causal):
    """fa4's dq, dk, dv (batch 0, head 0) and dsink[0] (head 0 over every batch entry) against float64,
    bounded by the plain low-precision backward's error (DESIGN.md §3), both from fa4's output `out`
    (flash_grads)."""
    res = {"pass": True, "batch": 0, "head": 0}
    ref_ds = lp_ds = 0.0
    for b in range(q.shape[0]):
        x = [t[b, :, 0] for t in (q, k, v)] + [sink[0:1], dout[b, :, 0], out[b, :, 0]]
        ref = flash_grads(*x, causal, lowp=False)
        lp = flash_grads(*x, causal, lowp=True)
        ref_ds += ref[3].item()
        lp_ds += lp[3].item()
        if b:
            continue
        for i, name in enumerate(("dq", "dk", "dv")):
            res[name] = criterion(grads[i][0, :, 0], ref[i], lp[i])
            res["pass"] = res["pass"] and res[name]["pass"]
    got = grads[3][0].item()
    err, err_lp = abs(got - ref_ds), abs(lp_ds - ref_ds)
    ok = math.isfinite(got) and err <= 2 * err_lp + ATOL and err <= REL_FROBENIUS * abs(ref_ds) + ATOL
    res["dsink"] = {"got": got, "ref": ref_ds, "max_err": err, "bound": 2 * err_lp + ATOL, "lowprec_err": err_lp,
                    "pass": ok}
    res["pass"] = res["pass"] and ok
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--op", choices=("fwd", "bwd"), default="fwd")
    ap.add_argument("--hdims", default="64,128,256")
    ap.add_argument("--seqlens", default="1024,4096")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--name", default=None, help="default: sink (fwd), sink-bwd (bwd)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    a = ap.parse_args(argv)
    if no_gpu("sink"):
        return 2
    import fa4

    bwd = a.op == "bwd"
    meta = run_meta("sink.py", argv)
    records, failed = [], 0
    for c in fa3_cases((int(x) for x in a.hdims.split(",")), [int(x) for x in a.seqlens.split(",")], bwd):
        q, k, v, dout, causal = c.q, c.k, c.v, c.dout, c.causal
        sink = torch.randn(c.h, device="cuda", dtype=torch.float32, generator=c.g).requires_grad_(bwd)
        fwds = {"fa4": lambda: fa4.flash_attn_func(q, k, v, causal=causal),
                "fa4-sink": lambda: fa4.flash_attn_func(q, k, v, causal=causal, learnable_sink=sink),
                "cudnn": c.cudnn}
        recs = {p: {"op": a.op, "provider": p, "head_dim": c.d, "seqlen": c.s, "batch": c.b, "heads": c.h,
                    "causal": causal, "ms": None, **meta} for p in fwds}
        fns, errors0 = provider_calls(fwds, bwd, lambda p: (
            ((q, k, v, sink) if p == "fa4-sink" else (q, k, v), dout) if p.startswith("fa4")
            else ((c.qt, c.kt, c.vt), dout.transpose(1, 2).contiguous())))
        if bwd:
            with torch.no_grad():  # (the same bits as the training call's output)
                out = fa4.flash_attn_func(q, k, v, causal=causal, learnable_sink=sink)
            chk = check_grads(q, k, v, dout, sink, out, fns["fa4-sink"](), causal)
            del out
        else:
            with torch.no_grad():
                chk = check_fa4(q, k, v, fns["fa4-sink"](), causal, sink=sink)
        recs["fa4-sink"]["check"] = chk
        failed += not chk["pass"]
        records += time_records(recs, fns, a.rounds, bwd, errors0, c.flops)
        del q, k, v, dout, sink, fns, fwds, c

    write_records(records, a.out, a.name or ("sink-bwd" if bwd else "sink"))
    print_ratio_table(a.op, records, "fa4-sink", ("fa4", "fa4-sink", "cudnn"), ("fa4", "sink", "cudnn"),
                      ("fa4", "cudnn"), ("sink/plain", "sink/cudnn"), "10.3f")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
