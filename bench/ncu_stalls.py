"""Where a kernel's warps wait, by SASS line: reads `ncu --page source --print-source sass --csv`
of a report that holds the SourceCounters section, and prints the instructions with the most
stall samples (with the reasons that make up each), their share of all samples, and the totals
a reason over the kernel.

  ncu --section SourceCounters --section WarpStateStats -k regex:NAME -c 1 -o rep BINARY ARGS
  ncu -i rep.ncu-rep --page source --print-source sass --csv > rep.csv
  python3 bench/ncu_stalls.py rep.csv [--top 40]

The column names differ between ncu versions; the sample columns are found by their words
("Warp Stall Sampling", "stall_"), and the instruction text by "Source".
"""

from __future__ import annotations

import argparse
import csv
import sys


def number(text: str) -> float:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=40)
    args = ap.parse_args()

    with open(args.csv, newline="") as f:
        lines = [line for line in f if line.startswith('"')]
    rows = list(csv.reader(lines))
    # The header is the first row naming a "Source" column (ncu writes the kernel's name above it).
    try:
        at = next(k for k, r in enumerate(rows) if any(h.strip() == "Source" for h in r))
    except StopIteration:
        print("no row names a 'Source' column; first row:", rows[:1], file=sys.stderr)
        return 1
    header = rows[at]
    body = [r for r in rows[at + 1 :] if len(r) == len(header)]
    src = next(i for i, h in enumerate(header) if h.strip() == "Source")
    addr = next((i for i, h in enumerate(header) if h.strip() in ("Address", "# Address")), None)
    total_col = next((i for i, h in enumerate(header) if h.startswith("Warp Stall Sampling (All")), None)
    if total_col is None:
        print("no 'Warp Stall Sampling (All Samples)' column; columns:", header, file=sys.stderr)
        return 1
    reasons = [(i, h) for i, h in enumerate(header) if "stall_" in h and "not issued" not in h.lower()]

    total = sum(number(r[total_col]) for r in body) or 1.0
    print(f"{len(body)} SASS lines, {total:.0f} stall samples")
    by_reason = {h: sum(number(r[i]) for r in body) for i, h in reasons}
    print("samples a reason, over the kernel:")
    for h, v in sorted(by_reason.items(), key=lambda kv: -kv[1])[:14]:
        if v > 0:
            print(f"  {100 * v / total:5.1f} %  {h}")
    print(f"top {args.top} lines:")
    order = sorted(range(len(body)), key=lambda k: -number(body[k][total_col]))
    for k in order[: args.top]:
        r = body[k]
        parts = sorted(((number(r[i]), h) for i, h in reasons), reverse=True)
        why = ", ".join(f"{h.split('stall_')[-1].rstrip(')')} {v:.0f}" for v, h in parts[:3] if v > 0)
        where = r[addr] if addr is not None else str(k)
        print(f"  {100 * number(r[total_col]) / total:5.1f} %  {where:>6}  {r[src].strip()[:70]:<70}  {why}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
