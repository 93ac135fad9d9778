"""Timing providers in rounds, for bench/side_by_side.py: each provider once a round, the order
rotating by round (round r starts at the r-th provider), so that each meets the GPU's clock and
power states in turn; a provider whose timing raises is left out of the later rounds. The median
of a provider's rounds is what a record keeps.

    python3 bench/rounds.py   # self-test on stand-ins (no GPU): prints "rounds self-test: ok"
"""

from __future__ import annotations

import statistics


def turn(names, r):
    """The providers' order in round r (0-based): `names` rotated left by r."""
    names = list(names)
    if not names:
        return []
    k = r % len(names)
    return names[k:] + names[:k]


def time_in_rounds(fns, rounds, time_one):
    """fns: {name: callable}. time_one(name, fn) -> (ms, clock, power), clock and power None when
    unknown. Returns ({name: [(ms, clock, power), ...]}, {name: exception}); a provider that raised
    has no timings and is not called again."""
    live = dict(fns)
    timed = {p: [] for p in fns}
    errors = {}
    for r in range(rounds):
        for p in turn(live, r):
            try:
                timed[p].append(tuple(time_one(p, live[p])))
            except Exception as e:  # recorded by the caller
                errors[p] = e
                timed[p] = []
                del live[p]
    return timed, errors


def short(e: BaseException) -> str:
    """An exception in one line, for a record's "error"."""
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0][:300] if lines else ''}"


def fill_records(recs, fns, rounds, time_one, errors0=None, flops=None):
    """Times fns in rounds (time_in_rounds) and fills each provider's record recs[p]: its error (from
    errors0, raised before timing, or raised while timed) or its summary, and "tflops" where flops
    (the problem's FLOPs) is given. Returns the records in recs' order."""
    timed, errors = time_in_rounds(fns, rounds, time_one)
    errors.update(errors0 or {})
    out = []
    for p, rec in recs.items():
        if p in errors:
            rec["error"] = short(errors[p])
        elif timed.get(p):
            rec.update(summary(timed[p], rounds > 1))
            if flops is not None:
                rec["tflops"] = flops / (rec["ms"] * 1e-3) / 1e12
        out.append(rec)
    return out


def summary(timings, keep_rounds):
    """A provider's rounds as a record's fields: the median time, SM clock and power (None where
    unknown), and with keep_rounds the time, SM clock and power of each round in the order they ran."""
    if not timings:
        return {}
    clocks = [c for _, c, _ in timings if c is not None]
    powers = [w for _, _, w in timings if w is not None]
    out = {"ms": statistics.median(t for t, _, _ in timings),
           "sm_clock_mhz": statistics.median(clocks) if clocks else None,
           "power_w": statistics.median(powers) if powers else None}
    if keep_rounds:
        out["ms_rounds"] = [t for t, _, _ in timings]
        out["sm_clock_rounds"] = [c for _, c, _ in timings]
        out["power_rounds"] = [w for _, _, w in timings]
    return out


def _self_test():
    assert turn(["a", "b", "c"], 0) == ["a", "b", "c"]
    assert turn(["a", "b", "c"], 1) == ["b", "c", "a"]
    assert turn(["a", "b", "c"], 5) == ["c", "a", "b"]
    assert turn([], 3) == []

    calls = []
    times = {"fa4": [1.0, 3.0, 2.0], "cudnn": [5.0, 4.0, 6.0], "fa2": [9.0], "flex": []}

    def time_one(name, fn):
        calls.append(name)
        fn()
        if name == "fa2" and len(times["fa2"]) == 0:
            raise RuntimeError("fa2 failed in round 2")
        t = times[name].pop(0) if times[name] else 7.0
        return t, (1980.0 if name != "cudnn" else None), 500.0

    fns = {p: (lambda: None) for p in ("fa4", "cudnn", "fa2")}
    timed, errors = time_in_rounds(fns, 3, time_one)
    # Round 0: fa4 cudnn fa2; round 1: cudnn fa2 (raises) fa4; round 2 over the two left, rotated.
    assert calls == ["fa4", "cudnn", "fa2", "cudnn", "fa2", "fa4", "fa4", "cudnn"], calls
    assert set(errors) == {"fa2"} and "round 2" in str(errors["fa2"])
    assert timed["fa2"] == []
    assert [t for t, _, _ in timed["fa4"]] == [1.0, 3.0, 2.0]
    s = summary(timed["fa4"], True)
    assert s == {"ms": 2.0, "sm_clock_mhz": 1980.0, "power_w": 500.0, "ms_rounds": [1.0, 3.0, 2.0],
                 "sm_clock_rounds": [1980.0] * 3, "power_rounds": [500.0] * 3}, s
    s = summary(timed["cudnn"], False)
    assert s == {"ms": 5.0, "sm_clock_mhz": None, "power_w": 500.0}, s
    assert summary([], True) == {}
    # One round: what the harness did before rounds.
    timed, errors = time_in_rounds({"x": lambda: None}, 1, lambda n, f: (0.5, None, None))
    assert timed == {"x": [(0.5, None, None)]} and not errors
    print("rounds self-test: ok")


if __name__ == "__main__":
    _self_test()
