"""Variable-length batches: fa4's flash_attn_varlen_func next to its peers in one process.

    python3 bench/varlen.py [--op fwd|bwd] [--cases NAME,...] [--providers fa4,padded,fa2,cudnn]
        [--rounds 3] [--dtype bf16|fp16] [--name WHAT] [--out DIR] [--profile]

Each case packs `count` sequences whose lengths are drawn (seeded) from [lo, hi], the same for
queries and keys, [total, heads, d] bf16. Providers:
  fa4     fa4.flash_attn_varlen_func on the packed tensors
  padded  fa4.flash_attn_func on [batch, longest, heads, d] (what a caller without varlen runs:
          every sequence padded to the longest; its time counts the padding's work)
  fa2     FlashAttention-2's varlen kernel, torch.ops.aten._flash_attention_forward with
          cum_seq_q / cum_seq_k on the same packed tensors
  cudnn   cuDNN's fused attention on the same packed tensors: its SDPA graphs with ragged offsets
          and a padding mask from the lengths, built once through cudnn_frontend
          (bench/cudnn_peer, loaded by bench/cudnn_varlen.py; $FA4_CUDNN_PEER names the library)
  cudnn-torch  cuDNN through torch, aten._cudnn_attention_forward with cum_seq_q / cum_seq_k (the
          path of torch's nested-tensor SDPA: it builds cuDNN's graph again on every call)
          A peer's output must agree with fa4's (max |difference| <= 0.05), else it is recorded as
          a mismatch and not timed; a peer that refuses the call is recorded with its error. The
          peers are checked against fa4's run: fa4 comes first among the providers.
--op bwd times each provider's backward alone (its forward run once before, for O and the LSE):
fa4's torch.ops.fa4.bwd_varlen, FA2's aten._flash_attention_backward, cuDNN's backward graph
(cudnn) or aten._cudnn_attention_backward (cudnn-torch) with the same cu_seqlens, fa4's batched
backward on the padded tensors; a peer's dQ must agree with fa4's (max |difference| <= 0.05 + 2 %
of fa4's largest). TFLOP/s count the visible (query, key) pairs of the real sequences alone
(4 * pairs * heads * d FLOPs forward, 2.5 times that backward), so the providers compare on the
same work. fa4's output is checked first against float64 on the first and last sequence by
DESIGN.md §3's criterion. Times are medians of triton's do_bench in rounds, the providers' order
rotating by round; --profile adds each provider's GPU time per kernel (torch.profiler). Writes
bench/results/<date>-<what>.json (and a copy under $OUT when set) and prints a table.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(ROOT / "bench"))

import torch  # noqa: E402

from rounds import summary, time_in_rounds  # noqa: E402
from side_by_side import DTYPES, bench_ms, check_fa4, kernel_times, no_gpu, run_meta, short, write_records  # noqa: E402

# name: (count, lo, hi, heads, head_dim, causal)
CASES = {
    "d128-mixed": (16, 256, 4096, 16, 128, False),
    "d128-mixed-causal": (16, 256, 4096, 16, 128, True),
    "d64-mixed-causal": (16, 256, 4096, 16, 64, True),
    "d256-mixed-causal": (16, 256, 4096, 8, 256, True),
    "d128-short": (64, 64, 1024, 16, 128, False),
    "d128-short-causal": (64, 64, 1024, 16, 128, True),
    "d128-long-causal": (4, 4096, 16384, 16, 128, True),
}


def visible_pairs(lq, lk, causal):
    if not causal:
        return lq * lk
    # bottom-right: query i sees keys j <= i + lk - lq
    off = lk - lq
    return sum(max(0, min(lk, i + off + 1)) for i in range(lq))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--op", choices=("fwd", "bwd"), default="fwd")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--providers", default="fa4,padded,fa2,cudnn")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dtype", choices=tuple(DTYPES), default="bf16")
    ap.add_argument("--name", default="varlen")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    ap.add_argument("--profile", action="store_true",
                    help="also record each provider's GPU time per kernel (torch.profiler, 10 calls)")
    a = ap.parse_args(argv)
    if no_gpu("varlen"):
        return 2
    import fa4

    dtype, providers = DTYPES[a.dtype], a.providers.split(",")
    meta = run_meta("varlen.py", argv)
    records, failed = [], 0
    for n, name in enumerate(a.cases.split(",")):
        count, lo, hi, h, d, causal = CASES[name]
        rng = random.Random(4242 + n)
        lens = [rng.randint(lo, hi) for _ in range(count)]
        total, longest = sum(lens), max(lens)
        g = torch.Generator(device="cuda").manual_seed(2000 + n)
        q, k, v = (torch.randn(total, h, d, device="cuda", dtype=dtype, generator=g) for _ in range(3))
        cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32, device="cuda")
        flops = (10.0 if a.op == "bwd" else 4.0) * h * d * sum(visible_pairs(s, s, causal) for s in lens)
        dout = torch.randn(total, h, d, device="cuda", dtype=dtype, generator=g)
        scale = d ** -0.5
        fns, recs = {}, {}
        for p in providers:
            rec = {"op": a.op, "provider": p, "case": name, "dtype": a.dtype, "lengths": lens, "heads": h,
                   "head_dim": d, "causal": causal, "ms": None, **meta}
            recs[p] = rec
            try:
                if p == "fa4":
                    # O and the LSE once: the check's, the peers', and with --op bwd the backward's.
                    out, lse4 = torch.ops.fa4.fwd_varlen(q, k, v, cu, cu, longest, longest, None, causal, -1, -1)
                    with torch.no_grad():
                        checks = []
                        for b in (0, count - 1):
                            s0, s1 = int(cu[b]), int(cu[b + 1])
                            checks.append(check_fa4(q[None, s0:s1], k[None, s0:s1], v[None, s0:s1],
                                                    out[None, s0:s1], causal))
                        rec["check"] = {"pass": all(c["pass"] for c in checks), "sequences": checks}
                    failed += not rec["check"]["pass"]
                    if a.op == "fwd":
                        fns[p] = lambda: fa4.flash_attn_varlen_func(q, k, v, cu, cu, longest, longest, causal=causal)
                    else:
                        def bwd4():
                            return torch.ops.fa4.bwd_varlen(dout, q, k, v, out, lse4, cu, cu, longest, longest, None,
                                                            causal, -1, -1, False)
                        dq_fa4 = bwd4()[0]
                        fns[p] = bwd4
                elif p == "padded":
                    qp, kp, vp, dp = (torch.randn(count, longest, h, d, device="cuda", dtype=dtype, generator=g)
                                      for _ in range(4))
                    if a.op == "fwd":
                        fns[p] = lambda qp=qp, kp=kp, vp=vp: fa4.flash_attn_func(qp, kp, vp, causal=causal)
                    else:
                        op_, lsep = torch.ops.fa4.fwd(qp, kp, vp, None, causal, -1, -1)
                        fns[p] = lambda qp=qp, kp=kp, vp=vp, dp=dp, op_=op_, lsep=lsep: torch.ops.fa4.bwd(
                            dp, qp, kp, vp, op_, lsep, None, causal, -1, -1, False)
                elif p == "cudnn":
                    from cudnn_varlen import CudnnVarlen
                    peer = CudnnVarlen(cu, cu, longest, longest, h, h, d, dtype, causal, scale, a.op == "bwd")
                    rec["cudnn_mask"] = peer.mask
                    oc, stc = peer.forward(q, k, v)
                    with torch.no_grad():
                        rec["max_diff_vs_fa4"] = (oc.float() - out.float()).abs().max().item()
                        rec["max_lse_diff_vs_fa4"] = (stc.t() - lse4.float()).abs().max().item()
                    if not (rec["max_diff_vs_fa4"] <= 0.05 and rec["max_lse_diff_vs_fa4"] <= 0.01):
                        raise RuntimeError(f"output or LSE differs from fa4's by {rec['max_diff_vs_fa4']}, "
                                           f"{rec['max_lse_diff_vs_fa4']}")
                    if a.op == "fwd":
                        fns[p] = lambda peer=peer, oc=oc, stc=stc: peer.forward(q, k, v, oc, stc)
                    else:
                        grads = [torch.empty_like(t) for t in (q, k, v)]
                        fns[p] = lambda peer=peer, oc=oc, stc=stc, grads=grads: peer.backward(dout, q, k, v, oc, stc,
                                                                                            *grads)
                        with torch.no_grad():
                            diff = (fns[p]()[0].float() - dq_fa4.float()).abs().max().item()
                        rec["max_dq_diff_vs_fa4"] = diff
                        if not diff <= 0.05 + 0.02 * dq_fa4.float().abs().max().item():
                            raise RuntimeError(f"dQ differs from fa4's by {diff}")
                elif a.op == "bwd":
                    if p == "fa2":
                        o2, lse2, rng2, unused2, _ = torch.ops.aten._flash_attention_forward(
                            q, k, v, cu, cu, longest, longest, 0.0, causal, False, scale=scale)

                        def call(o2=o2, lse2=lse2, rng2=rng2, unused2=unused2):
                            return torch.ops.aten._flash_attention_backward(
                                dout, q, k, v, o2, lse2, cu, cu, longest, longest, 0.0, causal, rng2, unused2,
                                scale=scale)
                    else:
                        res = torch.ops.aten._cudnn_attention_forward(
                            q, k, v, None, cu, cu, longest, longest, True, 0.0, causal, False, scale=scale)
                        oc, lsec, seed, offset = res[0], res[1], res[6], res[7]

                        def call(oc=oc, lsec=lsec, seed=seed, offset=offset):
                            return torch.ops.aten._cudnn_attention_backward(
                                dout, q, k, v, oc, lsec, seed, offset, torch.empty(0, device="cuda", dtype=dtype),
                                cu, cu, longest, longest, 0.0, causal, scale=scale)
                    with torch.no_grad():
                        got = call()[0]
                        diff = (got.float() - dq_fa4.float()).abs().max().item()
                    rec["max_dq_diff_vs_fa4"] = diff
                    if not diff <= 0.05 + 0.02 * dq_fa4.float().abs().max().item():
                        raise RuntimeError(f"dQ differs from fa4's by {diff}")
                    fns[p] = call
                else:
                    if p == "fa2":
                        def call():
                            return torch.ops.aten._flash_attention_forward(
                                q, k, v, cu, cu, longest, longest, 0.0, causal, False, scale=scale)[0]
                    else:
                        def call():
                            return torch.ops.aten._cudnn_attention_forward(
                                q, k, v, None, cu, cu, longest, longest, False, 0.0, causal, False, scale=scale)[0]
                    with torch.no_grad():
                        diff = (call().float().reshape(out.shape) - out.float()).abs().max().item()
                    rec["max_diff_vs_fa4"] = diff
                    if not diff <= 0.05:
                        raise RuntimeError(f"output differs from fa4's by {diff}")
                    fns[p] = call
            except Exception as e:  # a provider that cannot run this case: record why
                rec["error"] = short(e)

        def time_one(p, fn):
            with torch.no_grad():
                return bench_ms(fn, 25, 100), None, None

        timed, errors = time_in_rounds(fns, a.rounds, time_one)
        if a.profile:
            for p, fn in fns.items():
                if p not in errors:
                    recs[p]["kernels_us"] = kernel_times(fn)
        for p, e in errors.items():
            recs[p]["error"] = short(e)
        for p, rec in recs.items():
            if "error" not in rec and timed.get(p):
                rec.update(summary(timed[p], a.rounds > 1))
                rec["tflops"] = flops / (rec["ms"] * 1e-3) / 1e12
            records.append(rec)
        del q, k, v, fns
        torch.cuda.empty_cache()

    write_records(records, a.out, a.name)
    print(f"{'case':<20} " + "  ".join(f"{p + ' TF/s':>12}" for p in providers) + "  " +
          "  ".join(f"{'fa4/' + p:>10}" for p in providers if p != "fa4") + "  check")
    by = {}
    for r in records:
        by.setdefault(r["case"], {})[r["provider"]] = r
    for name, row in by.items():
        cells = [f"{row[p]['tflops']:12.1f}" if row.get(p, {}).get("tflops") else f"{'-':>12}" for p in providers]
        f4 = row.get("fa4", {}).get("ms")
        ratios = []
        for p in providers:
            if p == "fa4":
                continue
            pm = row.get(p, {}).get("ms")
            ratios.append(f"{pm / f4:10.2f}" if f4 and pm else f"{'-':>10}")
        chk = row.get("fa4", {}).get("check", {}).get("pass")
        print(f"{name:<20} " + "  ".join(cells) + "  " + "  ".join(ratios) + f"  {'PASS' if chk else 'FAIL'}")
        for p in providers:
            if row.get(p, {}).get("error"):
                print(f"    {p}: {row[p]['error']}")
            for kname, us in list(row.get(p, {}).get("kernels_us", {}).items())[:6]:
                print(f"    {p} {us:9.1f} us  {kname[:110]}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
