"""A/B of fa4-bench builds in one session: each build's `--sweep fa3` in turn, ROUNDS times
(A, B, A, B, ...), the L2 flushed before every call; medians a row and their ratios against the
first build. The way every kernel change in docs/perf-notes.md was judged: the GPU's clock and
power state drift between runs, so builds are compared only inside one alternating session.

  python3 bench/ab_sweep.py --out bench/results/DATE-what.json [--rounds 3] [--dtype fp16] NAME=PATH NAME=PATH ...
  python3 bench/ab_sweep.py --out ... --shapes "--b 4 --h 16 --s 4096 --d 128; --b 1 --h 16 --s 16384 --d 128" ...

With --shapes, each round times the listed fa4-bench shapes one by one instead of the sweep, every
build back to back on a shape (the builds' order rotating by round), so the builds of one shape
meet the same clock and power state: the finer A/B (per-round ranges within about a per cent).

Before any timing, every build runs `--check` (float64 reference) on CHECK_SHAPES, shapes that
reach every kernel the dispatch has (d64 on three and on two consumers, d128 in clusters and
alone, stream-K tails, d256, causal and not, fp16, GQA, odd lengths, BHSD), and on each --shapes
entry. A build that fails a check, crashes or hangs there is reported and not timed: a variant's
timing counts only if the variant is right on every kernel it changes (`--checks` replaces the
list, `--checks none` skips them).

The first NAME is the base. Writes one JSON (every record with its build and round, the checks,
the medians, GPU, driver, commit, date and this command) and prints a table. A build whose sweep
fails or times out is reported and left out of its round (a hang shows as a timeout, not a stall).
`python3 bench/ab_sweep.py --self-test` checks the bookkeeping with stand-in builds (no GPU).
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile


# One shape for each kernel family: which kernel a shape reaches follows src/sm90/sm90_fwd.cu and
# fwd_launch.cuh (d64's tile height, clusters for non-causal d128/d256, the stream-K rule).
CHECK_SHAPES = [
    "--b 4 --h 32 --s 4096 --d 64",                               # d64, three consumers
    "--b 16 --h 32 --s 512 --d 64",                               # d64, four consumers
    "--b 64 --h 32 --s 256 --d 64 --causal",                      # d64, four under a bound, tile counter
    "--b 8 --h 16 --sq 2048 --sk 128 --d 64 --causal",            # d64, two consumers
    "--b 2 --h 8 --s 1000 --d 64 --window 256,0",                 # d64, a window's both edges cut
    "--b 2 --h 7 --sq 1000 --sk 4097 --d 64 --causal",            # tails, causal bottom-right
    "--b 3 --h 8 --hkv 2 --sq 4097 --sk 239 --d 64",              # GQA, seqlen_q > seqlen_k
    "--b 4 --h 16 --s 4096 --d 128",                              # d128 in clusters of two
    "--b 2 --h 16 --s 8192 --d 128",                              # d128 with a stream-K tail
    "--b 32 --h 16 --s 512 --d 128",                              # short tiles
    "--b 3 --h 5 --sq 239 --sk 1000 --d 128 --layout bhsd",       # one CTA a unit, BHSD
    "--b 2 --h 4 --s 2048 --d 128 --causal --dtype fp16",         # fp16
    "--b 2 --h 8 --s 4096 --d 256",                               # d256 in clusters
    "--b 2 --h 8 --sq 333 --sk 2048 --d 256 --causal",            # d256 causal, short queries
    "--b 4 --h 8 --s 1000 --d 256 --causal",                      # d256 causal in pairs, partial last block
]


def shape_list(text):
    """The fa4-bench shapes of a ';'-separated option, each as its flag string."""
    return [s.strip() for s in (text or "").split(";") if s.strip()]


def run_checks(builds, shapes, args, failures):
    """Each build against the float64 reference on every shape; returns {build: [results]} and
    the builds that passed all."""
    results, passed = {}, []
    for name, path in builds:
        ok, rows = True, []
        for shape in shapes:
            flags = shape.split()
            if args.dtype and "--dtype" not in flags:  # checked in the dtype that is timed
                flags += ["--dtype", args.dtype]
            cmd = [path] + flags + ["--check", "--iters", "0"]
            try:
                done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                      timeout=args.timeout)
                good = done.returncode == 0
                tail = " | ".join(done.stdout.strip().splitlines()[-2:])
            except subprocess.TimeoutExpired:
                good, tail = False, f"no result in {args.timeout} s (a hang?)"
            except OSError as e:
                good, tail = False, str(e)
            rows.append({"shape": shape, "pass": good})
            if not good:
                ok = False
                failures.append(f"{name} check {shape}: {tail}")
        results[name] = rows
        if ok:
            passed.append((name, path))
    return results, passed


def run_round(builds, rnd, args, records, failures):
    if args.shapes:
        shift = (rnd - 1) % len(builds)
        turn = builds[shift:] + builds[:shift]
        for shape in [s.split() for s in shape_list(args.shapes)]:
            run_builds(turn, rnd, args, records, failures, shape)
    else:
        run_builds(builds, rnd, args, records, failures, ["--sweep", "fa3"])


def run_builds(builds, rnd, args, records, failures, what):
    for name, path in builds:
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
            out = f.name
        cmd = [path] + what + ["--iters", str(args.iters), "--warmup", str(args.warmup), "--flush-l2",
               "--json", out] + (["--dtype", args.dtype] if args.dtype else [])
        try:
            done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                  timeout=args.timeout)
            if done.returncode != 0:
                failures.append(f"{name} round {rnd}: exit {done.returncode}: {done.stderr.strip()[-200:]}")
                continue
            for r in json.load(open(out)):
                r["build"], r["round"] = name, rnd
                if what[0] != "--sweep":
                    r["shape"] = " ".join(what)
                records.append(r)
        except subprocess.TimeoutExpired:
            failures.append(f"{name} round {rnd}: no result in {args.timeout} s (a hang?)")
        except (OSError, ValueError) as e:
            failures.append(f"{name} round {rnd}: {e}")
        finally:
            if os.path.exists(out):
                os.unlink(out)


def key(r):
    return (r["head_dim"], r["causal"], r["seqlen_q"], r.get("shape", ""))


def medians(records):
    """{(head_dim, causal, seqlen_q, shape): {build: median TFLOP/s}}"""
    runs = collections.defaultdict(lambda: collections.defaultdict(list))
    for r in records:
        if r.get("tflops") is not None:
            runs[key(r)][r["build"]].append(r["tflops"])
    return {k: {b: statistics.median(v) for b, v in per.items()} for k, per in runs.items()}


def ranges(records):
    """{(key, build): (least, most) TFLOP/s over the rounds}"""
    runs = collections.defaultdict(list)
    for r in records:
        if r.get("tflops") is not None:
            runs[(key(r), r["build"])].append(r["tflops"])
    return {k: (min(v), max(v)) for k, v in runs.items()}


def table(med, names, rng=None):
    base = names[0]
    lines = ["d    causal  seqlen  " + "  ".join(f"{n:>14}" for n in names)]
    for k in sorted(med):
        d, causal, s, shape = k
        row = med[k]
        cells = []
        for n in names:
            if n not in row:
                cells.append(f"{'-':>14}")
                continue
            cell = f"{row[n]:14.1f}" if n == base or base not in row else f"{row[n]:7.1f} ({row[n] / row[base]:.3f})"
            if rng and (k, n) in rng:
                cell += f" [{rng[(k, n)][0]:.0f}-{rng[(k, n)][1]:.0f}]"
            cells.append(cell)
        lines.append(f"{d:<4} {'yes' if causal else 'no':<7} {s:6d}  " + "  ".join(cells) + (f"  ({shape})" if shape else ""))
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("builds", nargs="*", help="NAME=PATH of an fa4-bench binary; the first is the base")
    p.add_argument("--out", help="JSON to write")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--iters", type=int, default=60)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--dtype", choices=["bf16", "fp16"], help="the sweep's dtype (fa4-bench's default: bf16)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds a sweep may take")
    p.add_argument("--shapes", help="fa4-bench shape flags separated by ';' (instead of --sweep fa3)")
    p.add_argument("--checks", help="shapes each build is checked on before timing, ';'-separated "
                   "(default: CHECK_SHAPES and the --shapes; 'none': no checks)")
    p.add_argument("--self-test", action="store_true")
    args = p.parse_args(argv)
    if args.self_test:
        return self_test()
    if len(args.builds) < 2 or not args.out:
        p.error("two builds at least (NAME=PATH) and --out")
    builds = []
    for b in args.builds:
        name, sep, path = b.partition("=")
        if not sep or not name or not path:
            p.error(f"build '{b}': expected NAME=PATH")
        builds.append((name, path))
    names = [n for n, _ in builds]
    if len(set(names)) != len(names):
        p.error(f"build names must differ: {names}")
    records, failures = [], []
    if args.checks == "none":
        check_shapes = []
    elif args.checks:
        check_shapes = shape_list(args.checks)
    else:
        check_shapes = CHECK_SHAPES + [c for c in shape_list(args.shapes) if c not in CHECK_SHAPES]
    checks, timed_builds = run_checks(builds, check_shapes, args, failures)
    for rnd in range(1, args.rounds + 1):
        if timed_builds:
            run_round(timed_builds, rnd, args, records, failures)
    med = medians(records)
    first = records[0] if records else {}
    result = {
        "what": ("fa4-bench shapes " + args.shapes if args.shapes else "fa4-bench --sweep fa3") + " of each build in turn, "
                + str(args.rounds) + " rounds; medians a row",
        "builds": dict(builds), "gpu": first.get("gpu"), "driver": first.get("driver"),
        "commit": os.environ.get("FA4_COMMIT", first.get("commit")),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": "python3 " + " ".join(sys.argv), "checks": checks, "failures": failures,
        "medians": [{"head_dim": k[0], "causal": k[1], "seqlen_q": k[2], "shape": k[3], **v} for k, v in sorted(med.items())],
        "records": records,
    }
    with open(args.out, "w") as f:
        json.dump(result, f, indent=0)
    print(table(med, names, ranges(records)))
    for line in failures:
        print("failed:", line)
    return 1 if failures else 0


def self_test():
    """Stand-in builds (shell scripts writing sweep JSON): medians, ratios, a failing build."""
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        def stand_in(name, tflops, rc=0, check_rc=0, fail_shape="none"):
            # Exits check_rc on a --check run whose flags contain fail_shape's, 0 on other checks,
            # rc on a timed run (after writing its record).
            path = os.path.join(tmp, name)
            recs = [{"head_dim": 128, "causal": False, "seqlen_q": 4096, "tflops": tflops, "gpu": "stand-in",
                     "driver": "0.0", "commit": "x"}]
            with open(path, "w") as f:
                f.write(f"#!/bin/sh\nall=\"$*\"\ncase \"$all\" in *--check*) case \"$all\" in *\"{fail_shape}\"*) exit {check_rc};; esac; exit 0;; esac\n"
                        "while [ $# -gt 0 ]; do [ \"$1\" = --json ] && out=$2; shift; done\n"
                        f"echo '{json.dumps(recs)}' > \"$out\"\nexit {rc}\n")
            os.chmod(path, 0o755)
            return path
        out = os.path.join(tmp, "ab.json")
        rc = main(["--out", out, "--rounds", "3", "base=" + stand_in("a", 500.0), "new=" + stand_in("b", 550.0),
                   "broken=" + stand_in("c", 1.0, rc=3)])
        res = json.load(open(out))
        m = res["medians"][0]
        ok &= rc == 1                                   # the broken build is reported
        ok &= m["base"] == 500.0 and m["new"] == 550.0 and "broken" not in m
        ok &= len(res["records"]) == 6 and len(res["failures"]) == 3
        ok &= [r["round"] for r in res["records"] if r["build"] == "new"] == [1, 2, 3]
        ok &= all(c["pass"] for b in ("base", "new", "broken") for c in res["checks"][b])
        ok &= len(res["checks"]["base"]) == len(CHECK_SHAPES)
        # A build that fails one check (here the d64 two-consumer shape) is never timed.
        rc = main(["--out", out, "--rounds", "2", "base=" + stand_in("a", 500.0),
                   "wrong=" + stand_in("w", 900.0, check_rc=1, fail_shape="--s 256 --d 64 --causal")])
        res = json.load(open(out))
        ok &= rc == 1 and all(r["build"] == "base" for r in res["records"]) and len(res["records"]) == 2
        ok &= [c["pass"] for c in res["checks"]["wrong"]].count(False) == 1
        ok &= len(res["failures"]) == 1 and res["failures"][0].startswith("wrong check --b 64 --h 32 --s 256 --d 64")
        rc = main(["--out", out, "--rounds", "2", "--shapes", "--s 512; --s 1024", "base=" + stand_in("a", 500.0),
                   "new=" + stand_in("b", 450.0)])
        res = json.load(open(out))
        ok &= rc == 0 and len(res["records"]) == 8
        ok &= [c["shape"] for c in res["checks"]["new"]][-2:] == ["--s 512", "--s 1024"]  # the timed shapes too
        ok &= sorted({m["shape"] for m in res["medians"]}) == ["--s 1024", "--s 512"]
        ok &= all(m["new"] == 450.0 for m in res["medians"])
        # round 2 runs "new" before "base" on each shape
        ok &= [r["build"] for r in res["records"] if r["round"] == 2][:2] == ["new", "base"]
    print("ab_sweep self-test:", "ok" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
