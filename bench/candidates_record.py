"""One JSON record for bench/results from a candidates run (bench/bwd_candidates.sh,
bench/fwd_candidates.sh): the GPU, driver and commit as bench/side_by_side.py reads them, the date,
the command, and what the run's logs hold.

    python3 bench/candidates_record.py bwd LOG_DIR COMMAND   # time.log RESULT lines, calibrate-bwd.json
    python3 bench/candidates_record.py fwd LOG_DIR COMMAND   # fwd-variants.log SAME and TIME lines

Writes LOG_DIR/bwd-candidates.json or fwd-candidates.json. Exit status 1 where a forward variant's
output differs from the shipped kernel's.
"""

from __future__ import annotations

import datetime
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import side_by_side as sbs  # noqa: E402


def gpu_name() -> str:
    try:
        return sbs.torch.cuda.get_device_name()
    except (RuntimeError, AssertionError):
        return "unknown"


def bwd_fields(log: Path) -> dict:
    time_log, calib = log / "time.log", log / "calibrate-bwd.json"
    results = [json.loads(line[len("RESULT "):]) for line in time_log.read_text().splitlines()
               if line.startswith("RESULT ")] if time_log.exists() else []
    return {"what": "sm90 backward candidates against the shipped configuration (tools/sm90_bwd_probe time)",
            "results": results,
            "calibration": json.loads(calib.read_text()) if calib.exists() and calib.stat().st_size else None}


def fwd_fields(log: Path) -> dict:
    same, times = [], []
    for line in (log / "fwd-variants.log").read_text().splitlines():
        m = re.match(r"SAME (\S+) d=(\d+) seqlen=(\d+) causal=(\d): max\|O_variant - O_shipped\| = (\S+) "
                     r"\(max\|O\| (\S+)\) (\S+)", line)
        if m:
            same.append({"variant": m[1], "d": int(m[2]), "seqlen": int(m[3]), "causal": m[4] == "1",
                         "max_abs_diff": float(m[5]), "max_abs_o": float(m[6]), "verdict": m[7]})
        m = re.match(r"TIME (\S+) d=(\d+) seqlen=(\d+) causal=(\d): (\S+) ms\s+(\S+) TFLOP/s", line)
        if m:
            times.append({"kernel": m[1], "d": int(m[2]), "seqlen": int(m[3]), "causal": m[4] == "1",
                          "ms": float(m[5]), "tflops": float(m[6])})
    return {"what": "sm90 forward candidates against the shipped kernels (tools/sm90_fwd_probe variants; "
                    "'default' is the shipped kernel, timed in pairs with each variant)",
            "outputs_compared": same, "timings": times}


def main() -> int:
    kind, log, command = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    fields = {"bwd": bwd_fields, "fwd": fwd_fields}[kind](log)
    record = {"what": fields.pop("what"), "gpu": gpu_name(), "driver": sbs.gpu_driver(),
              "commit": sbs.commit_hash(),
              "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
              "command": command, **fields}
    out = log / f"{kind}-candidates.json"
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"[record] {out}")
    if any(s["verdict"] != "ok" for s in record.get("outputs_compared", [])):
        print("[record] a variant's output differs from the shipped kernel's")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
