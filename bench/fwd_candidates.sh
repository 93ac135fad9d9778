#!/usr/bin/env bash
# The forward's folded K/V candidate on the GPU machine, in one call (docs/perf-notes.md, "The
# backward's pipeline from the solver": the forward too): builds sm90_fwd_probe, then runs its
# `variants` on d128_folded_kv and d256_folded_kv (each variant's output compared with the shipped
# kernel's, then the two timed in pairs, twice, at 512 / 1k / 4k / 16k, causal and not).
#
#   bash bench/fwd_candidates.sh     (outputs in $OUT, else build-probe/logs, and fwd-candidates.json
#                                     with the GPU, driver, commit and date, for bench/results)
# FA4_VARIANTS overrides the variants run; FA4_COMMIT names the commit where the tree has no git
# metadata.
set -uo pipefail
cd "$(dirname "$0")/.."
LOG=${OUT:-$PWD/build-probe/logs}
mkdir -p "$LOG"
export FA4_VARIANTS=${FA4_VARIANTS:-d128_folded_kv,d256_folded_kv}
failed=0
echo "[build] sm90_fwd_probe"
if ! { cmake -S . -B build-probe -G Ninja -DCMAKE_BUILD_TYPE=Release -DFA4_BUILD_PROBE=ON -DFA4_BUILD_TESTS=OFF \
         -DFA4_BUILD_SCHEDULER=OFF -DCMAKE_CUDA20_STANDARD_COMPILE_OPTION=-std=c++20 \
         -DCMAKE_CUDA20_EXTENSION_COMPILE_OPTION=-std=c++20 &&
       cmake --build build-probe -j "$(nproc)" --target sm90_fwd_probe; } >"$LOG/fwd-build.log" 2>&1; then
  echo "[build] FAILED:"; tail -n 8 "$LOG/fwd-build.log"; exit 1
fi
echo "[variants] $FA4_VARIANTS"
build-probe/sm90_fwd_probe variants >"$LOG/fwd-variants.log" 2>&1 || failed=1
grep -E "^(SAME|TIME)" "$LOG/fwd-variants.log" | tail -n 40
python3 - "$LOG" <<'PY' || failed=1
import datetime, json, os, pathlib, re, subprocess, sys
log = pathlib.Path(sys.argv[1])
def run(*cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True).stdout.strip()
    except OSError:
        return ""
smi = run("nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader").splitlines()
gpu, driver = (smi[0].split(", ") + ["unknown"])[:2] if smi else ("unknown", "unknown")
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
record = {"what": "sm90 forward candidates against the shipped kernels (tools/sm90_fwd_probe variants; "
                  "'default' is the shipped kernel, timed in pairs with each variant)",
          "gpu": gpu, "driver": driver,
          "commit": os.environ.get("FA4_COMMIT") or run("git", "rev-parse", "--short", "HEAD") or "unknown",
          "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
          "command": f"FA4_VARIANTS={os.environ.get('FA4_VARIANTS')} bash bench/fwd_candidates.sh",
          "outputs_compared": same, "timings": times}
(log / "fwd-candidates.json").write_text(json.dumps(record, indent=1) + "\n")
print(f"[record] {len(same)} comparisons, {len(times)} timings -> {log / 'fwd-candidates.json'}")
if any(s["verdict"] != "ok" for s in same):
    print("[record] a variant's output differs from the shipped kernel's")
    sys.exit(1)
PY
exit $failed
