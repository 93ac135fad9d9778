"""A step model of one head's paired causal walk (d256, four query blocks of 128 rows, 128-key blocks).

    python3 bench/pair_walk_model.py [--window 2] [--top 8]

The head's two CTAs each run five block steps in lockstep: the even CTA query blocks 3 and 0 (4 + 1
key blocks), the odd CTA 2 and 1 (3 + 2). A walk is each CTA's tile order and, per tile, its key
blocks' order. Step s reads one K/V block on each CTA. A block read for the first time is a DRAM
miss; read again within `window` steps of its previous read it is an L2 hit (the L2 holds a block
for about two block-steps at this row, docs/perf-notes.md, "The head's last tile walking its low
blocks first"), later a miss again (extra DRAM bytes). For each walk the model reports the extra
misses and the tail: the most steps either CTA still has to run after the head's last miss, the
compute that no DRAM traffic hides when every CTA is at the same phase (the launch's last round;
docs/perf-notes.md, "The d256 causal 512 launch's DRAM over time").

The model has no time in it but steps: a miss costs as much as a hit, and the two CTAs never drift
apart. In the launch they do. The even CTA runs ahead on hits in the shipped walk, and every walk
that took that lead away measured slower in the steady state. So the model ranks walks for the
last round, and a GPU decides.
"""

from __future__ import annotations

import argparse
import itertools
import sys

# (even CTA's tiles, odd CTA's tiles): query block q sees key blocks 0..q (causal, sq = sk).
EVEN, ODD = (3, 0), (2, 1)

# Walks of docs/perf-notes.md, as (even CTA's steps, odd CTA's steps), a step (query block, key block).
SHIPPED_ODD = ((2, 2), (2, 1), (2, 0), (1, 1), (1, 0))
NAMED = {
    "shipped": (((3, 3), (3, 2), (3, 1), (3, 0), (0, 0)), SHIPPED_ODD),
    # measured in every round 1.010-1.013 on an H200, the last round alone 1.002-1.003 (shipped as
    # the device picks: fwd_launch.cuh)
    "diagonal last": (((3, 2), (3, 1), (3, 0), (3, 3), (0, 0)), SHIPPED_ODD),
    # measured on an H200 0.983 in the last round, 0.940-0.948 in every round: the model's best
    # tail, and slower
    "short first, diagonal last": (((0, 0), (3, 2), (3, 1), (3, 0), (3, 3)), SHIPPED_ODD),
    "rotated": (((3, 3), (3, 0), (3, 1), (3, 2), (0, 0)), SHIPPED_ODD),  # measured 0.912: block 2 reread late
}


def walks():
    """Every walk: for each CTA a tile order and each tile's key-block order."""
    def cta_walks(tiles):
        for order in itertools.permutations(tiles):
            per_tile = [list(itertools.permutations(range(q + 1))) for q in order]
            for blocks in itertools.product(*per_tile):
                yield tuple((q, b) for q, bs in zip(order, blocks) for b in bs)
    even = list(cta_walks(EVEN))
    odd = list(cta_walks(ODD))
    for e in even:
        for o in odd:
            yield e, o


def score(even, odd, window):
    """(extra misses, tail, last-miss step, misses by step) of a walk under the step model."""
    last_read = {}
    misses, extra, last_miss = [], 0, -1
    for s in range(max(len(even), len(odd))):
        reads = [w[s][1] for w in (even, odd) if s < len(w)]
        step_misses = 0
        seen_this_step = set()
        for b in reads:
            if b in seen_this_step:  # both CTAs ask at once: one fetch
                continue
            seen_this_step.add(b)
            prev = last_read.get(b)
            if prev is None or s - prev > window:
                step_misses += 1
                last_miss = s
                if prev is not None:
                    extra += 1
        for b in reads:
            last_read[b] = s
        misses.append(step_misses)
    tail = max(len(even), len(odd)) - 1 - last_miss
    return extra, tail, last_miss, misses


def describe(w):
    tiles = []
    for q, b in w:
        if not tiles or tiles[-1][0] != q:
            tiles.append((q, []))
        tiles[-1][1].append(b)
    return " ".join(f"{q}:[{','.join(map(str, bs))}]" for q, bs in tiles)


def self_test():
    for name, want in (("shipped", (0, 2)), ("diagonal last", (0, 1)), ("short first, diagonal last", (0, 0))):
        assert score(*NAMED[name], 2)[:2] == want, (name, score(*NAMED[name], 2))
    assert score(*NAMED["rotated"], 2)[0] > 0, score(*NAMED["rotated"], 2)
    assert sum(1 for _ in walks()) == 2 * 24 * 1 * 2 * 6 * 2
    print("pair_walk_model self-test: ok")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--window", type=int, default=2, help="steps an L2 line survives (default 2)")
    ap.add_argument("--top", type=int, default=8)
    ap.add_argument("--self-test", action="store_true")
    a = ap.parse_args()
    if a.self_test:
        self_test()
        return 0
    print(f"window {a.window} steps; extra misses, tail (steps after the last miss), misses by step")
    for name, (e, o) in NAMED.items():
        extra, tail, _, m = score(e, o, a.window)
        print(f"  {name:28s} extra {extra}  tail {tail}  misses {m}   even {describe(e)}  odd {describe(o)}")
    ranked = sorted(((score(e, o, a.window), e, o) for e, o in walks()), key=lambda x: (x[0][0], x[0][1]))
    print(f"best {a.top} of {len(ranked)} walks by (extra misses, tail):")
    for (extra, tail, _, m), e, o in ranked[: a.top]:
        print(f"  extra {extra}  tail {tail}  misses {m}   even {describe(e)}  odd {describe(o)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
