"""Random forward (or backward) shapes checked against float64 with fa4-bench --check, outputs poisoned first.

    python3 bench/random_checks.py --bench build/fa4-bench [--count 60] [--seed 20261128] [--bwd]
    python3 bench/random_checks.py --list [--count 60] [--seed 20261128] [--bwd]   # the shapes only (no GPU)
    python3 bench/random_checks.py --self-test   # the drawing checked (no GPU)

The shapes are drawn from a seed, so a run can be repeated: every head dim, GQA groups of 1 to 8
over 1 to 8 KV heads, batch 1 to 5, query and key lengths from 1 to 4097 (equal, or either way
apart), causal (45 %), a sliding window (15 %), fp16 (30 %), BHSD memory (30 %), and a fresh input
seed each. With --bwd the backward's gradients are checked instead (fa4-bench --bwd --check): its
float64 reference runs on the whole problem, so the shapes are drawn smaller (below fa4-bench's
2^28 multiply-adds, lengths to 1000), with the deterministic dQ kernel in a quarter of them.
Prints one line a shape (its error against its bound) and a count; exits 1 if any shape fails its
check or fa4 cannot run it.
"""

from __future__ import annotations

import argparse
import random
import subprocess
import sys

LENGTHS = (1, 17, 64, 127, 128, 239, 300, 511, 513, 700, 1000, 1500, 2049, 4097)
KEYS = (1, 33, 129, 256, 333, 900, 1024, 2000, 3000, 4097)
BWD_LENGTHS = (1, 17, 64, 127, 128, 129, 239, 300, 511, 513, 700, 1000)
BWD_MACS = 1 << 28  # fa4-bench's whole-problem check of the backward (kFullCheckMacs)


def _draw(count, seed, *, bwd):
    """The shapes of one seed: forward ones (lengths to 4097), or backward ones (`bwd`) small enough
    for fa4-bench's whole-problem check, with the deterministic mode in a quarter of them."""
    rng = random.Random(seed)
    # A quarter of the shapes take a head dim without a kernel of its own (run on d's kernels over
    # zero-padded copies: 8-56 for 64, 72-120 for 128, 136-248 for 256), drawn apart so that the
    # rest of each seed's shapes are what they were before such head dims existed.
    other = random.Random(seed ^ 0x5EED)
    out = []
    for _ in range(count):
        d = rng.choice((64, 128, 256))
        if other.random() < 0.25:
            d = other.randrange(d // 2 + 8 if d > 64 else 8, d, 8)
        hkv = rng.choice((1, 2, 4) if bwd else (1, 2, 4, 8))
        h = hkv * rng.choice((1, 2, 4) if bwd else (1, 2, 4, 8))
        b = rng.choice((1, 2, 3) if bwd else (1, 2, 3, 5))
        while True:
            sq = rng.choice(BWD_LENGTHS if bwd else LENGTHS)
            sk = rng.choice((sq, sq) + (BWD_LENGTHS if bwd else KEYS))
            if not bwd or b * h * sq * sk * d <= BWD_MACS:
                break
        flags = ("--bwd " if bwd else "") + f"--b {b} --h {h} --hkv {hkv} --sq {sq} --sk {sk} --d {d}"
        r = rng.random()
        if r < 0.45:
            flags += " --causal"
        elif r < 0.6:
            lefts = (-1, 0, 64, 200) if bwd else (-1, 0, 64, 200, 1000)
            flags += f" --window {rng.choice(lefts)},{rng.choice((-1, 0, 31, 300))}"
        if bwd and rng.random() < 0.25:
            flags += " --deterministic"
        if rng.random() < 0.3:
            flags += " --dtype fp16"
        if rng.random() < 0.3:
            flags += " --layout bhsd"
        flags += f" --seed {rng.randrange(1, 10**6)}"
        out.append(flags)
    return out


def shapes(count, seed):
    return _draw(count, seed, bwd=False)


def bwd_shapes(count, seed):
    return _draw(count, seed, bwd=True)


def _check_drawing(draw, seed, features, bwd):
    """60 shapes of `draw`: reproducible from the seed, valid, and covering every feature."""
    a = draw(60, seed)
    assert a == draw(60, seed) and draw(60, 1) != a, "the same seed must draw the same shapes"
    seen = set()
    for s in a:
        f = s.split()
        v = {f[i]: f[i + 1] for i in range(len(f) - 1) if f[i].startswith("--") and not f[i + 1].startswith("--")}
        assert (f[0] == "--bwd") == bwd, s
        assert int(v["--h"]) % int(v["--hkv"]) == 0, s
        d = int(v["--d"])
        assert 8 <= d <= 256 and d % 8 == 0, s
        if d not in (64, 128, 256):
            seen.add("padded head dim")
        assert int(v["--sq"]) >= 1 and int(v["--sk"]) >= 1 and int(v["--b"]) >= 1, s
        if bwd:
            macs = int(v["--b"]) * int(v["--h"]) * int(v["--sq"]) * int(v["--sk"]) * int(v["--d"])
            assert macs <= BWD_MACS, f"{s}: {macs} multiply-adds, above the whole-problem check's {BWD_MACS}"
        seen.update(x for x in features if x in f)
        if int(v["--hkv"]) < int(v["--h"]):
            seen.add("gqa")
        if v["--sq"] != v["--sk"]:
            seen.add("sq != sk")
    missing = (set(features) | {"gqa", "sq != sk", "padded head dim"}) - seen
    assert not missing, f"60 shapes draw none with {sorted(missing)}"


def _self_test():
    _check_drawing(shapes, 20261128, ("--causal", "--window", "--dtype", "--layout"), bwd=False)
    _check_drawing(bwd_shapes, 20261201, ("--causal", "--window", "--deterministic", "--dtype", "--layout"), bwd=True)
    print("random_checks self-test: ok")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bench", help="the fa4-bench to run")
    ap.add_argument("--count", type=int, default=60)
    ap.add_argument("--seed", type=int, default=20261128)
    ap.add_argument("--bwd", action="store_true", help="backward shapes (the gradients checked)")
    ap.add_argument("--list", action="store_true", help="print the shapes and stop")
    ap.add_argument("--self-test", action="store_true", help="check the shapes' drawing (no GPU)")
    a = ap.parse_args(argv)
    if a.self_test:
        _self_test()
        return 0
    if a.count < 1:
        ap.error(f"--count {a.count}: must be at least 1")
    todo = (bwd_shapes if a.bwd else shapes)(a.count, a.seed)
    if a.list:
        print("\n".join(todo))
        return 0
    if not a.bench:
        ap.error("--bench PATH is needed to run the checks (or --list)")
    failed = 0
    for s in todo:
        p = subprocess.run([a.bench, *s.split(), "--check", "--iters", "0", "--warmup", "0"],
                           capture_output=True, text=True)
        lines = [x.strip() for x in p.stdout.splitlines()
                 if x.strip().startswith(("out ", "every element", "dq ", "dk ", "dv ", "written"))]
        if p.returncode != 0:
            failed += 1
            print(f"FAIL (exit {p.returncode}) {s}\n  " + "\n  ".join((p.stdout + p.stderr).splitlines()[-8:]))
        else:
            print(f"ok {s} | " + " | ".join(lines))
    print(f"random checks: {len(todo)} shapes, {failed} failed (seed {a.seed})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
