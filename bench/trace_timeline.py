#!/usr/bin/env python3
"""Lays out a window of the sm90 forward's in-kernel timeline (sm90_fwd_probe trace CSV) in time.

    python3 bench/trace_timeline.py trace-d128-d128-s16384-c0.csv [--cta 0] [--steps 100:103]

Consumer events per step (src/sm90/fwd_kernel.cuh): 0 start, 1 K and V landed, 2 turn taken,
3 GEMMs issued, 4 S ready, 5 softmax done, 6 P V done, 7 end. Producer records (slot 0): 0/1
before/after K's empty wait, 2/3 the same for V. Times are SM cycles from the first event shown.
"""
import argparse
import csv
import statistics

CONSUMER = {2: "turn", 3: "issued", 4: "S ready", 5: "softmax done", 6: "PV done"}
NAMES = ["kv-wait", "turn", "issue", "S-wait", "softmax", "PV-wait", "rescale"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("--cta", default="0")
    ap.add_argument("--steps", default="100:103", help="first:last step (steady-state steps of the CTA)")
    a = ap.parse_args()
    lo, hi = (int(x) for x in a.steps.split(":"))
    recs = {}
    for r in csv.DictReader(open(a.csv)):
        if r["cta"] == a.cta:
            recs.setdefault(int(r["slot"]), {})[int(r["step"])] = [int(r[f"e{i}"]) for i in range(8)]
    if not recs:
        raise SystemExit(f"no records for CTA {a.cta} in {a.csv}")
    events = []
    for slot, steps in recs.items():
        for st in range(lo, hi + 1):
            e = steps.get(st)
            if e is None:
                continue
            if slot == 0:
                events += [(e[1], f"producer load {st}: K slot free"), (e[3], f"producer load {st}: V slot free")]
            else:
                events += [(e[i], f"consumer {slot - 1} step {st}: {name}") for i, name in CONSUMER.items()]
    events = sorted((t, what) for t, what in events if t > 0)
    t0 = events[0][0]
    for t, what in events:
        print(f"{t - t0:8d}  {what}")
    print("\nmedians over all steps (cycles):")
    for slot in sorted(s for s in recs if s > 0):
        steps = recs[slot]
        ks = sorted(steps)
        cols = [[steps[k][i + 1] - steps[k][i] for k in ks] for i in range(7)]
        period = [steps[b][0] - steps[a_][0] for a_, b in zip(ks, ks[1:])]
        parts = "  ".join(f"{n} {statistics.median(c):.0f}" for n, c in zip(NAMES, cols))
        print(f"  consumer {slot - 1}: {parts}  | period {statistics.median(period):.0f}")


if __name__ == "__main__":
    main()
