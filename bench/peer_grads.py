#!/usr/bin/env python3
"""Each provider's outputs and gradients against float64, on the harness's shapes: is a peer we
time computing what fa4 computes?

    python3 bench/peer_grads.py [--hdims 192] [--dv 128] [--seqlens 1024,4096] [--causal both]
        [--providers fa4,cudnn] [--out results.json]

Inputs as bench/side_by_side.py makes them (FA3's shapes, bf16, random normal, one seed). For
batch 0 and heads 0 and h-1, each provider's O, dQ, dK and dV (over the whole problem, as timed)
are compared with float64 autograd on the same 16-bit values (square causal: bottom-right and
top-left agree): max |err|, relative Frobenius error and the reference's largest |value|. The
verdict is relative: a provider whose error is many times fa4's (or above 5e-2 relative) is
marked SUSPECT. One line a (provider, shape, tensor); a JSON record of all with --out.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import side_by_side as sbs  # noqa: E402


def reference(q, k, v, do, causal):
    """float64 O and gradients of one head: q [s, d], k [s, d], v [s, dv], do [s, dv]."""
    q, k, v = (x.detach().double().requires_grad_() for x in (q, k, v))
    s = (q @ k.T) / math.sqrt(q.shape[-1])
    if causal:
        n, m = s.shape
        rows = torch.arange(n, device=s.device)[:, None]
        cols = torch.arange(m, device=s.device)[None, :]
        s = s.masked_fill(cols > rows + (m - n), float("-inf"))
    o = torch.softmax(s, dim=-1) @ v
    o.backward(do.double())
    return o.detach(), q.grad, k.grad, v.grad


def run_provider(provider, t, causal):
    """O, dQ, dK, dV in BSHD, each computed as the harness times it."""
    fn = sbs.make_fn(provider, "fwd", t, causal)
    names = ("q", "k", "v") if provider == "fa4" else ("qh", "kh", "vh")
    out = fn()
    grads = torch.autograd.grad(out, tuple(t[n] for n in names), t["dout" if provider == "fa4" else "douth"])
    if provider != "fa4":  # BHSD to BSHD
        out = out.transpose(1, 2)
        grads = tuple(g.transpose(1, 2) for g in grads)
    return (out.detach(),) + tuple(grads)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hdims", default="192")
    ap.add_argument("--dv", type=int, default=None)
    ap.add_argument("--seqlens", default="1024,4096")
    ap.add_argument("--causal", choices=("both", "yes", "no"), default="both")
    ap.add_argument("--providers", default="fa4,cudnn")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    providers = a.providers.split(",")
    causals = {"both": (False, True), "yes": (True,), "no": (False,)}[a.causal]
    records = []
    print(f"{'provider':8} {'d':>4} {'dv':>4} {'seqlen':>6} {'causal':>6} {'tensor':>3} {'max|err|':>10} "
          f"{'rel':>9} {'max|ref|':>9}")
    for d in (int(x) for x in a.hdims.split(",")):
        dv = a.dv or d
        for seqlen in (int(x) for x in a.seqlens.split(",")):
            b, h = sbs.shape(seqlen, d)
            for causal in causals:
                t = sbs.make_tensors(b, h, seqlen, d, torch.bfloat16, "bwd", seed=1, dv=dv)
                refs = {hh: reference(t["q"][0, :, hh], t["k"][0, :, hh], t["v"][0, :, hh], t["dout"][0, :, hh], causal)
                        for hh in sorted({0, h - 1})}
                rel_of = {}
                for provider in providers:
                    try:
                        got = run_provider(provider, t, causal)
                    except Exception as e:  # a peer that cannot run the shape
                        print(f"{provider:8} {d:>4} {dv:>4} {seqlen:>6} {str(causal):>6}  cannot run: {str(e)[:80]}")
                        records.append({"provider": provider, "head_dim": d, "head_dim_v": dv, "seqlen": seqlen,
                                        "causal": causal, "error": str(e)[:300]})
                        continue
                    torch.cuda.synchronize()
                    for i, name in enumerate(("o", "dq", "dk", "dv")):
                        err = rel_num = rel_den = ref_max = 0.0
                        for hh, ref in refs.items():
                            g = got[i][0, :, hh].double()
                            r = ref[i]
                            err = max(err, (g - r).abs().max().item())
                            rel_num += (g - r).pow(2).sum().item()
                            rel_den += r.pow(2).sum().item()
                            ref_max = max(ref_max, r.abs().max().item())
                        rel = math.sqrt(rel_num / rel_den) if rel_den > 0 else 0.0
                        base = rel_of.get(("fa4", name))
                        if provider == "fa4":
                            rel_of[("fa4", name)] = rel
                        suspect = rel > 5e-2 or (base is not None and base > 0 and rel > 4 * base)
                        print(f"{provider:8} {d:>4} {dv:>4} {seqlen:>6} {str(causal):>6} {name:>3} {err:10.3e} "
                              f"{rel:9.2e} {ref_max:9.3f}{'  SUSPECT' if suspect else ''}")
                        records.append({"provider": provider, "head_dim": d, "head_dim_v": dv, "seqlen": seqlen,
                                        "causal": causal, "batch": b, "heads": h, "tensor": name, "max_err": err,
                                        "rel_frobenius": rel, "ref_max": ref_max, "suspect": suspect})
                del t, refs
                torch.cuda.empty_cache()
    if a.out:
        Path(a.out).write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "command": " ".join(sys.argv),
                                           "records": records}, indent=1))


if __name__ == "__main__":
    main()
