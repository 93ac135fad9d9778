"""Decoding: one query row a head (or a few) against a long K/V, fa4 next to its peers in one process.

    python3 bench/decode.py [--shapes "B,HQ,HKV,SK,D;..."] [--seqlen-q N] [--causal]
        [--providers fa4,fa4kv,fa4paged,fa4idx,fa4pad,fa4sink,fa4append,torchappend,cudnn,fa2] [--fill LO] [--page N] [--rounds 3]
        [--dtype bf16|fp16] [--flush write|read] [--kernels] [--name WHAT] [--out DIR]

Each shape is [batch, seqlen_q, heads_q, d] queries (seqlen_q 1 unless --seqlen-q: speculative
decoding's few rows) against [batch, seqlen_k, heads_kv, d] keys and values (GQA where heads_q >
heads_kv); non-causal unless --causal (bottom-right: query i sees keys up to seqlen_k - seqlen_q + i;
the peers through SDPA's causal_lower_right bias where they take it, else without the mask,
recorded as "peer_causal": false). The work is reading K and V once, so besides the time
each record has the bandwidth it reached over the bytes a call must move (Q, K, V, O), to set
against the GPU's DRAM. Providers:
  fa4    fa4.flash_attn_func on BSHD tensors
  fa4kv  fa4.flash_attn_with_kvcache on the same tensors as a cache, with a tensor of lengths
         (cache_seqlens): every entry's seqlen_k (the others' work), or with --fill LO each entry
         a length drawn from [LO * seqlen_k, seqlen_k] (its GB/s then over the keys it reads)
  fa4paged  fa4kv's call on a paged cache (block_table): the same keys on pages of --page rows
         (default 256) at shuffled ids of a pool twice the pages' size
  fa4idx fa4kv's call through cache_batch_idx (the entries in reverse order; the cache read as
         pages of up to 256 rows over its own memory)
  fa4pad fa4kv's call with a left pad (cache_leftpad): each entry's same keys moved down its cache
         by a pad drawn from [0, 256), the cache that many rows longer; the attention reads
         fa4kv's keys, from an unaligned first row
  fa4sink fa4kv's call with attention sinks (learnable_sink: each query head's from N(0, 1)); its
         check is against the reference with the sinks
  fa4append  fa4kv's call appending this step's keys and values (k=, v=: seqlen_q new rows an entry,
         written at the lengths less seqlen_q, so the attention reads fa4kv's keys) with GPT-NeoX
         rotary over the whole head on them and on q (rotary_cos / rotary_sin): one more kernel
  torchappend  the same step in PyTorch ops (rotary in fp32, index_put into the caches) before
         fa4kv's call: what a caller does without the append; its output checks fa4append's
  cudnn  torch SDPA, cuDNN backend  } BHSD tensors of the same values, enable_gqa=True; where the
  fa2    torch SDPA, flash backend  } backend refuses GQA, K and V expanded to heads_q beforehand
                                      (recorded as "kv_expanded": the bytes it reads grow)
fa4's output is checked first against float64 (batch 0, first and last query head) by DESIGN.md
§3's criterion. Times are medians of triton's do_bench (L2 cleared before every call) in rounds,
the providers' order rotating by round. --flush read clears L2 before each call by reading a buffer
instead of do_bench's writing one (L2 then holds clean lines, not dirty ones whose write-back shares
DRAM with the call's reads: a decoding call moves 0.07-0.5 GB, L2 holds 0.05). With --kernels each
record also holds its kernels' GPU times a call, their launches, and the span of a call from its
first kernel's start to its last's end (profiler, L2 cleared before each call), to tell the
kernels' time from launch gaps. Writes bench/results/<date>-<what>.json (and a copy under
$OUT when set) and prints a table.
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
from side_by_side import DTYPES, bench_ms, bench_ms_clean_l2, call_spans, check_fa4, no_gpu, run_meta, short, write_records  # noqa: E402

# (batch, heads_q, heads_kv, seqlen_k, head_dim): Llama-style GQA 32/8 and 64/8, MQA, and each head dim.
DEFAULT_SHAPES = [
    (1, 32, 8, 32768, 128), (8, 32, 8, 8192, 128), (32, 32, 8, 4096, 128), (64, 64, 8, 2048, 128),
    (16, 16, 1, 8192, 128), (8, 32, 4, 8192, 64), (8, 16, 4, 8192, 256), (8, 32, 32, 8192, 128),
]


def shape_list(text):
    out = []
    for part in text.split(";"):
        if part.strip():
            vals = tuple(int(x) for x in part.split(","))
            if len(vals) != 5 or min(vals) <= 0 or vals[1] % vals[2]:
                raise argparse.ArgumentTypeError(f"'{part}': expected B,HQ,HKV,SK,D with HQ a multiple of HKV")
            out.append(vals)
    return out


def peer_fn(provider, q, k, v, group, causal=False):
    """SDPA on BHSD tensors under one backend; K and V expanded where it refuses GQA; with causal
    the bottom-right bias where the backend takes it. Returns (fn, kv_expanded, causal_taken)."""
    backend = SDPBackend.CUDNN_ATTENTION if provider == "cudnn" else SDPBackend.FLASH_ATTENTION
    masks = [None]
    if causal:
        from torch.nn.attention.bias import causal_lower_right
        masks = [causal_lower_right(q.shape[2], k.shape[2]), None]

    def call(kk, vv, gqa, mask):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, kk, vv, attn_mask=mask, enable_gqa=gqa)

    last = None
    for mask in masks:
        for gqa in ([False] if group == 1 else [True, False]):
            kk, vv = (k, v) if gqa or group == 1 else (k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1))
            try:
                call(kk, vv, gqa, mask)
                return (lambda kk=kk, vv=vv, gqa=gqa, mask=mask: call(kk, vv, gqa, mask)), kk is not k, mask is not None
            except RuntimeError as e:
                last = e
    raise last


def torch_append_step(fa4, q, kc, vc, kn, vn, cos, sin, start, causal):
    """A decoding step's append in PyTorch ops: GPT-NeoX rotary (fp32) on the new keys at rows
    start + i and on q (per row under causal, else at start), index_put into the caches, then
    fa4's attention over start + seqlen_q keys."""
    b, s_new = kn.shape[:2]
    rows = start[:, None].long() + torch.arange(s_new, device=kn.device)

    def turn(x, pos):  # x [b, s, h, d] at positions pos [b, s]
        c, s_ = cos[pos].float()[:, :, None], sin[pos].float()[:, :, None]
        x1, x2 = x.float().chunk(2, dim=-1)
        return torch.cat((x1 * c - x2 * s_, x1 * s_ + x2 * c), dim=-1).to(x.dtype)

    bi = torch.arange(b, device=kn.device)[:, None]
    kc[bi, rows] = turn(kn, rows)
    vc[bi, rows] = vn
    qpos = start[:, None].long() + (torch.arange(q.shape[1], device=q.device) if causal else 0) * 1
    qpos = qpos.expand(b, q.shape[1])
    return fa4.flash_attn_with_kvcache(turn(q, qpos), kc, vc, cache_seqlens=start + s_new, causal=causal)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", type=shape_list, default=DEFAULT_SHAPES)
    ap.add_argument("--seqlen-q", type=int, default=1)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--providers", default="fa4,cudnn,fa2")
    ap.add_argument("--fill", type=float, default=1.0)
    ap.add_argument("--page", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dtype", choices=tuple(DTYPES), default="bf16")
    ap.add_argument("--flush", choices=("write", "read"), default="write")
    ap.add_argument("--kernels", action="store_true")
    ap.add_argument("--name", default="decode")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    a = ap.parse_args(argv)
    if no_gpu("decode"):
        return 2
    import fa4

    dtype, providers = DTYPES[a.dtype], a.providers.split(",")
    meta = run_meta("decode.py", argv)
    records, failed = [], 0
    for n, (b, hq, hkv, sk, d) in enumerate(a.shapes):
        g = torch.Generator(device="cuda").manual_seed(1000 + n)
        sq = a.seqlen_q
        q = torch.randn(b, sq, hq, d, device="cuda", dtype=dtype, generator=g)
        k = torch.randn(b, sk, hkv, d, device="cuda", dtype=dtype, generator=g)
        v = torch.randn(b, sk, hkv, d, device="cuda", dtype=dtype, generator=g)
        group = hq // hkv
        def moved(keys):  # bytes a call must move: Q and O, and `keys` rows of K and V once
            return 2 * (2 * b * sq * hq * d + 2 * keys * hkv * d)

        # fa4kv's cache lengths: all seqlen_k, or drawn from [fill * seqlen_k, seqlen_k]
        lo = max(0, min(sk, int(a.fill * sk)))
        lens = torch.randint(lo, sk + 1, (b,), device="cuda", dtype=torch.int32, generator=g) if lo < sk else \
            torch.full((b,), sk, device="cuda", dtype=torch.int32)
        def check_longest(out, sink=None):  # the longest entry of a kvcache call against its filled keys
            i = int(torch.argmax(lens))
            n = int(lens[i])
            return check_fa4(q[i:i + 1], k[i:i + 1, :n].repeat_interleave(group, dim=2),
                             v[i:i + 1, :n].repeat_interleave(group, dim=2), out[i:i + 1], a.causal, sink=sink)

        fns, recs, appended = {}, {}, {}
        for p in providers:
            rec = {"op": "fwd", "provider": p, "flush": a.flush, "dtype": a.dtype, "batch": b, "heads_q": hq, "heads_kv": hkv,
                   "seqlen_q": sq, "seqlen_k": sk, "head_dim": d, "causal": a.causal, "ms": None, **meta}
            recs[p] = rec
            try:
                if p == "fa4idx":
                    rec["cache_seqlens"] = lens.tolist()
                    rev = torch.arange(b - 1, -1, -1, device="cuda", dtype=torch.int32)
                    kr, vr = k.flip(0).contiguous(), v.flip(0).contiguous()
                    with torch.no_grad():
                        rec["check"] = check_longest(fa4.flash_attn_with_kvcache(
                            q, kr, vr, cache_seqlens=lens, causal=a.causal, cache_batch_idx=rev))
                    failed += not rec["check"]["pass"]
                    fns[p] = lambda q=q, kr=kr, vr=vr, lens=lens, rev=rev: fa4.flash_attn_with_kvcache(
                        q, kr, vr, cache_seqlens=lens, causal=a.causal, cache_batch_idx=rev)
                elif p in ("fa4kv", "fa4paged"):
                    rec["cache_seqlens"] = lens.tolist()
                    kc, vc, table = k, v, None
                    if p == "fa4paged":  # entry b's page j at a shuffled id of a pool of 2 * b * per pages
                        per = -(-sk // a.page)
                        ids = torch.randperm(2 * b * per, device="cuda", generator=g).to(torch.int32)
                        table = ids[:b * per].reshape(b, per).contiguous()
                        pad = per * a.page - sk
                        kc = torch.zeros(2 * b * per, a.page, hkv, d, device="cuda", dtype=dtype)
                        vc = torch.zeros_like(kc)
                        kc[table.flatten().long()] = F.pad(k, (0, 0, 0, 0, 0, pad)).reshape(b * per, a.page, hkv, d)
                        vc[table.flatten().long()] = F.pad(v, (0, 0, 0, 0, 0, pad)).reshape(b * per, a.page, hkv, d)
                        rec["page_size"] = a.page
                    with torch.no_grad():
                        rec["check"] = check_longest(fa4.flash_attn_with_kvcache(
                            q, kc, vc, cache_seqlens=lens, causal=a.causal, block_table=table))
                    failed += not rec["check"]["pass"]
                    fns[p] = lambda q=q, kc=kc, vc=vc, lens=lens, table=table: fa4.flash_attn_with_kvcache(
                        q, kc, vc, cache_seqlens=lens, causal=a.causal, block_table=table)
                elif p == "fa4sink":
                    rec["cache_seqlens"] = lens.tolist()
                    sink = torch.randn(hq, device="cuda", dtype=torch.float32, generator=g)
                    with torch.no_grad():
                        rec["check"] = check_longest(fa4.flash_attn_with_kvcache(
                            q, k, v, cache_seqlens=lens, causal=a.causal, learnable_sink=sink), sink)
                    failed += not rec["check"]["pass"]
                    fns[p] = lambda q=q, k=k, v=v, lens=lens, sink=sink: fa4.flash_attn_with_kvcache(
                        q, k, v, cache_seqlens=lens, causal=a.causal, learnable_sink=sink)
                elif p == "fa4pad":
                    pads = torch.randint(0, 256, (b,), device="cuda", dtype=torch.int32, generator=g)
                    rec["cache_seqlens"], rec["cache_leftpad"] = lens.tolist(), pads.tolist()
                    kc = torch.zeros(b, sk + 256, hkv, d, device="cuda", dtype=dtype)
                    vc = torch.zeros_like(kc)
                    for i, p0 in enumerate(pads.tolist()):
                        kc[i, p0:p0 + sk], vc[i, p0:p0 + sk] = k[i], v[i]
                    ends = lens + pads
                    with torch.no_grad():
                        rec["check"] = check_longest(fa4.flash_attn_with_kvcache(
                            q, kc, vc, cache_seqlens=ends, cache_leftpad=pads, causal=a.causal))
                    failed += not rec["check"]["pass"]
                    fns[p] = lambda q=q, kc=kc, vc=vc, ends=ends, pads=pads: fa4.flash_attn_with_kvcache(
                        q, kc, vc, cache_seqlens=ends, cache_leftpad=pads, causal=a.causal)
                elif p in ("fa4append", "torchappend"):
                    start = (lens - sq).clamp(min=0)
                    rec["cache_seqlens"] = start.tolist()
                    kn = torch.randn(b, sq, hkv, d, device="cuda", dtype=dtype, generator=g)
                    vn = torch.randn(b, sq, hkv, d, device="cuda", dtype=dtype, generator=g)
                    if "rotary" not in appended:
                        pos = torch.arange(sk, device="cuda", dtype=torch.float64)[:, None]
                        ang = pos * 10000.0 ** (-torch.arange(0, d, 2, device="cuda", dtype=torch.float64) / d)
                        appended["rotary"] = (torch.cos(ang).to(dtype), torch.sin(ang).to(dtype))
                    cos, sin = appended["rotary"]
                    kc, vc = k.clone(), v.clone()
                    if p == "fa4append":
                        fns[p] = lambda q=q, kc=kc, vc=vc, kn=kn, vn=vn, start=start: fa4.flash_attn_with_kvcache(
                            q, kc, vc, k=kn, v=vn, rotary_cos=cos, rotary_sin=sin, cache_seqlens=start,
                            causal=a.causal, rotary_interleaved=False)
                    else:
                        fns[p] = lambda q=q, kc=kc, vc=vc, kn=kn, vn=vn, start=start: torch_append_step(
                            fa4, q, kc, vc, kn, vn, cos, sin, start, a.causal)
                    with torch.no_grad():
                        appended[p] = fns[p]()
                    if p == "torchappend" and "fa4append" in appended:
                        err = (appended["fa4append"].double() - appended[p].double()).abs().max().item()
                        rec["check"] = {"pass": err <= 2e-2, "max_diff_from_fa4append": err}
                        failed += not rec["check"]["pass"]
                elif p == "fa4":
                    with torch.no_grad():
                        out = fa4.flash_attn_func(q, k, v, causal=a.causal)
                        # the reference per query head: K and V of batch 0 expanded to heads_q
                        rec["check"] = check_fa4(q[:1], k[:1].repeat_interleave(group, dim=2),
                                                 v[:1].repeat_interleave(group, dim=2), out[:1], a.causal)
                    failed += not rec["check"]["pass"]
                    fns[p] = lambda q=q, k=k, v=v: fa4.flash_attn_func(q, k, v, causal=a.causal)
                else:
                    qh, kh, vh = (x.transpose(1, 2).contiguous() for x in (q, k, v))
                    fns[p], rec["kv_expanded"], taken = peer_fn(p, qh, kh, vh, group, a.causal)
                    if a.causal:
                        rec["peer_causal"] = taken
            except Exception as e:  # a provider that cannot run this shape: record why
                rec["error"] = short(e)

        def time_one(p, fn):
            with torch.no_grad():
                return (bench_ms(fn, 25, 100) if a.flush == "write" else bench_ms_clean_l2(fn)), None, None

        timed, errors = time_in_rounds(fns, a.rounds, time_one)
        for p, e in errors.items():
            recs[p]["error"] = short(e)
        if a.kernels:
            for p, fn in fns.items():
                if "error" not in recs[p]:
                    recs[p]["kernels_us"], recs[p]["span_us"], recs[p]["launches"] = call_spans(fn)
        for p, rec in recs.items():
            if "error" not in rec and timed.get(p):
                rec.update(summary(timed[p], a.rounds > 1))
                rec["us"] = rec["ms"] * 1e3
                keys = int(lens.sum()) if p in ("fa4kv", "fa4paged", "fa4idx", "fa4pad", "fa4sink", "fa4append",
                                                "torchappend") \
                    else b * sk
                rec["gbps"] = moved(keys) / (rec["ms"] * 1e-3) / 1e9
            records.append(rec)
        del q, k, v, fns
        torch.cuda.empty_cache()

    write_records(records, a.out, a.name)
    print(f"seqlen_q {a.seqlen_q}, {'causal (bottom-right)' if a.causal else 'non-causal'}")
    print(f"{'b':>3} {'hq':>3} {'hkv':>3} {'sk':>6} {'d':>3}  " +
          "  ".join(f"{p + ' us':>10} {'GB/s':>6}" for p in providers) + "  " +
          "  ".join(f"{'fa4/' + p:>9}" for p in providers if p != "fa4") + "  check")
    by = {}
    for r in records:
        by.setdefault((r["batch"], r["heads_q"], r["heads_kv"], r["seqlen_k"], r["head_dim"]), {})[r["provider"]] = r
    for key, row in by.items():
        cells = []
        for p in providers:
            r = row.get(p, {})
            mark = "*" if r.get("kv_expanded") else "~" if r.get("peer_causal") is False else " "
            cells.append(f"{r['us']:>9.1f}{mark} {r['gbps']:>6.0f}" if r.get("us") else f"{'-':>10} {'-':>6}")
        ratios = [f"{row[p]['us'] / row['fa4']['us']:>9.2f}" if row.get(p, {}).get("us") and row.get("fa4", {}).get("us")
                  else f"{'-':>9}" for p in providers if p != "fa4"]
        chk = row.get("fa4", {}).get("check")
        print(" ".join(f"{x:>3}" if i != 3 else f"{x:>6}" for i, x in enumerate(key)) + "  " + "  ".join(cells) +
              "  " + "  ".join(ratios) + "  " + ("-" if not chk else ("PASS" if chk["pass"] else "FAIL")))
    if a.kernels:
        for r in records:
            if r.get("kernels_us"):
                ks = ", ".join(f"{name[:48]} {us:.1f}" for name, us in list(r["kernels_us"].items())[:4])
                print(f"{r['provider']:>8} {r['batch']}x{r['heads_q']}/{r['heads_kv']}x{r['seqlen_k']} d{r['head_dim']}: "
                      f"span {r['span_us']:.1f} us; {ks}")
    print("(* K and V expanded to heads_q: the backend refused GQA; ~ the peer ran without the causal mask, "
          "which it refused; ratios are the peer's time over fa4's)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
