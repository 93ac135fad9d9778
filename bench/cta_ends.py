"""What tools/sm90_cta_ends prints, read: when each CTA of the d256 causal 512 launch ends, and
whether the spread of those ends belongs to the CTAs' work or to the SMs they ran on.

    python3 bench/cta_ends.py CSV     # a table for each mode (0 back to back, 1 after a flush)
    python3 bench/cta_ends.py         # self-test (no GPU): prints "cta_ends self-test: ok"

A CTA's residual is its end minus its launch's mean end, less the mean of its parity (even CTAs
run the (3, 0) pairs, odd ones (2, 1)). Averaged over the launches by CTA index it is the work's
share; by SM, after each CTA's own mean is taken off, the SM's. Each is said to be systematic
where the launches' two halves (even and odd launch numbers) agree: their correlation.
"""

from __future__ import annotations

import csv
import random
import statistics as st
import sys
from collections import defaultdict


def _corr(a, b):
    ma, mb = st.fmean(a), st.fmean(b)
    va = sum((x - ma) ** 2 for x in a)
    vb = sum((y - mb) ** 2 for y in b)
    if va == 0 or vb == 0:
        return 0.0
    return sum((x - ma) * (y - mb) for x, y in zip(a, b)) / (va * vb) ** 0.5


def _split_half(records, key, less=None):
    """Correlation over keys of the mean residual in even launches against odd launches."""
    halves = (defaultdict(list), defaultdict(list))
    for r in records:
        x = r["res"] - (less[r["cta"]] if less else 0.0)
        halves[r["launch"] % 2][r[key]].append(x)
    keys = sorted(set(halves[0]) & set(halves[1]))
    if len(keys) < 3:
        return 0.0, {}
    a = [st.fmean(halves[0][k]) for k in keys]
    b = [st.fmean(halves[1][k]) for k in keys]
    both = defaultdict(list)
    for h in halves:
        for k, v in h.items():
            both[k].extend(v)
    return _corr(a, b), {k: st.fmean(v) for k, v in both.items()}


def analyse(rows):
    """rows: dicts with mode, launch, cta, sm, end_us, launch_us (numbers). Returns a dict a mode."""
    out = {}
    for mode in sorted({r["mode"] for r in rows}):
        recs = [dict(r) for r in rows if r["mode"] == mode]
        by_launch = defaultdict(list)
        for r in recs:
            by_launch[r["launch"]].append(r)
        mean_end = {k: st.fmean(x["end_us"] for x in v) for k, v in by_launch.items()}
        for r in recs:
            r["res"] = r["end_us"] - mean_end[r["launch"]]
        parity = {p: st.fmean(r["res"] for r in recs if r["cta"] % 2 == p) for p in (0, 1)
                  if any(r["cta"] % 2 == p for r in recs)}
        for r in recs:
            r["res"] -= parity[r["cta"] % 2]
        cta_corr, cta_mean = _split_half(recs, "cta")
        moved = defaultdict(set)
        for r in recs:
            moved[r["cta"]].add(r["sm"])
        # Where every CTA keeps its SM, the SM's share cannot be told from the CTA's.
        sm_corr, sm_eff = _split_half(recs, "sm", less=cta_mean) if any(len(v) > 1 for v in moved.values()) \
            else (None, {})
        siblings = total = 0
        for v in by_launch.values():
            sm_of = {x["cta"]: x["sm"] for x in v}
            for c in sm_of:
                if c % 2 == 0 and c + 1 in sm_of:
                    total += 1
                    siblings += sm_of[c] // 2 == sm_of[c + 1] // 2
        out[mode] = {
            "launches": len(by_launch),
            "launch_us": st.median(v[0]["launch_us"] for v in by_launch.values()),
            "max_end_us": st.median(max(x["end_us"] for x in v) for v in by_launch.values()),
            "median_end_us": st.median(st.median(x["end_us"] for x in v) for v in by_launch.values()),
            "parity_us": parity,
            "cta_split_half": cta_corr,
            "cta_sd_us": st.pstdev(cta_mean.values()) if cta_mean else 0.0,
            "ctas_moving": sum(len(s) > 1 for s in moved.values()),
            "sm_split_half": sm_corr,
            "sm_sd_us": st.pstdev(sm_eff.values()) if sm_eff else 0.0,
            "sm_effect": sm_eff,
            "pairs_on_one_tpc": siblings / total if total else 0.0,
        }
    return out


def read_csv(path):
    with open(path) as f:
        return [{"mode": int(r["mode"]), "launch": int(r["launch"]), "cta": int(r["cta"]), "sm": int(r["sm"]),
                 "end_us": float(r["end_us"]), "launch_us": float(r["launch_us"])} for r in csv.DictReader(f)]


def report(res):
    for mode, m in res.items():
        name = "back to back" if mode == 0 else "after a 256 MB write (do_bench's flush)"
        print(f"mode {mode}, {name}: {m['launches']} launches; launch {m['launch_us']:.1f} us (events), "
              f"last CTA end {m['max_end_us']:.1f}, median CTA end {m['median_end_us']:.1f} (medians)")
        print(f"  parity: even CTAs {m['parity_us'].get(0, 0):+.2f} us, odd {m['parity_us'].get(1, 0):+.2f} "
              f"from the launch's mean end")
        print(f"  by CTA index: sd {m['cta_sd_us']:.2f} us, split-half correlation {m['cta_split_half']:.3f}")
        if m["sm_split_half"] is None:
            print("  by SM: every CTA ran on the same SM in every launch, so the SM's share is the CTA's")
        else:
            print(f"  by SM ({m['ctas_moving']} CTAs ran on more than one SM): sd {m['sm_sd_us']:.2f} us, "
                  f"split-half correlation {m['sm_split_half']:.3f}")
        print(f"  a pair's two CTAs on one TPC (SMs 2t, 2t + 1): {100 * m['pairs_on_one_tpc']:.0f} %")
        if m["sm_effect"]:
            worst = sorted(m["sm_effect"].items(), key=lambda kv: -kv[1])[:6]
            best = sorted(m["sm_effect"].items(), key=lambda kv: kv[1])[:6]
            print("  latest SMs: " + ", ".join(f"{s} {x:+.1f}" for s, x in worst))
            print("  earliest SMs: " + ", ".join(f"{s} {x:+.1f}" for s, x in best))


def _synthetic(sm_effect, seed, launches=20, ctas=64, sms=66):
    """Launches whose CTAs land on random SM pairs (mode 1) with the given per-SM lateness, a
    parity offset, a small per-CTA share and noise."""
    rng = random.Random(seed)
    cta_share = [rng.gauss(0, 0.3) for _ in range(ctas)]
    rows = []
    for launch in range(launches):
        tpcs = rng.sample(range(sms // 2), ctas // 2)
        for c in range(ctas):
            sm = 2 * tpcs[c // 2] + c % 2
            end = 95 + (1.5 if c % 2 else -1.5) + cta_share[c] + sm_effect(sm) + rng.gauss(0, 0.5)
            rows.append({"mode": 1, "launch": launch, "cta": c, "sm": sm, "end_us": end, "launch_us": 105.0})
    return rows


def _self_test():
    # An SM effect of 2 us sd is found, systematic; the pairs sit on one TPC.
    eff = {s: random.Random(s // 2).gauss(0, 2.0) for s in range(66)}
    m = analyse(_synthetic(lambda s: eff[s], seed=1))[1]
    assert m["sm_split_half"] > 0.9, m["sm_split_half"]
    assert 1.2 < m["sm_sd_us"] < 3.0, m["sm_sd_us"]
    assert abs(m["parity_us"][1] - m["parity_us"][0] - 3.0) < 0.3, m["parity_us"]
    assert m["pairs_on_one_tpc"] == 1.0 and m["ctas_moving"] == 64
    # Without one, the SMs' split halves do not agree.
    m0 = analyse(_synthetic(lambda s: 0.0, seed=2))[1]
    assert m0["sm_split_half"] < 0.5, m0["sm_split_half"]
    assert m0["sm_sd_us"] < 0.5, m0["sm_sd_us"]
    # CTAs that keep their SMs: no SM share is claimed.
    fixed = [dict(r, sm=r["cta"]) for r in _synthetic(lambda s: eff[s], seed=3)]
    assert analyse(fixed)[1]["sm_split_half"] is None
    print("cta_ends self-test: ok")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        report(analyse(read_csv(sys.argv[1])))
    else:
        _self_test()
