#!/usr/bin/env bash
# The backward's open questions on the GPU machine, in one call (docs/perf-notes.md, "The
# backward's pipeline from the solver"):
#   calibrate  calibrate_sm90 bwd: what a TMA box (8 to 64 KB, folded or not), a bulk copy and a
#              bulk reduction cost, and each head dim's step mix alone on the TMA
#   check      sm90_bwd_probe check: every dK/dV configuration against the float64 backward
#   time       sm90_bwd_probe time ROUNDS: candidates against the shipped configuration, FA3 shapes
#   trace      sm90_bwd_probe trace: the shipped kernels' clock64 timeline at 4k (in-place latencies
#              for scheduler/graphs/sm90_bwd_d*.graph)
#
#   bash bench/bwd_candidates.sh [ROUNDS]     (outputs in $OUT, else build-probe/logs; the timings
#                                             and the calibration also as one bwd-candidates.json
#                                             with the GPU, driver, commit and date, for bench/results)
# FA4_PROBE_ONLY="128,256" limits the probe to those head dims; FA4_COMMIT names the commit in the
# record where the tree has no git metadata.
set -uo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
LOG=${OUT:-$PWD/build-probe/logs}
mkdir -p "$LOG"
failed=0
run() {  # run NAME CMD...: output in $LOG/NAME.log, one line of verdict here
  local name=$1 t0=$SECONDS
  shift
  if "$@" >"$LOG/$name.log" 2>&1; then echo "[$name] ok ($((SECONDS - t0)) s)"
  else echo "[$name] FAILED ($((SECONDS - t0)) s):"; tail -n 8 "$LOG/$name.log" | sed 's/^/    /'; failed=1; fi
}
run build sh -c "cmake -S . -B build-probe -G Ninja -DCMAKE_BUILD_TYPE=Release -DFA4_BUILD_PROBE=ON \
  -DFA4_BUILD_TESTS=OFF -DFA4_BUILD_SCHEDULER=OFF -DCMAKE_CUDA20_STANDARD_COMPILE_OPTION=-std=c++20 \
  -DCMAKE_CUDA20_EXTENSION_COMPILE_OPTION=-std=c++20 && cmake --build build-probe -j $(nproc) --target sm90_bwd_probe && \
  nvcc -O3 -std=c++20 -gencode=arch=compute_90a,code=sm_90a -Iinclude -Isrc bench/calibrate/calibrate_sm90.cu \
  -o build-probe/calibrate_sm90"
run calibrate sh -c "build-probe/calibrate_sm90 bwd > '$LOG/calibrate-bwd.json'"
run check build-probe/sm90_bwd_probe check
run time build-probe/sm90_bwd_probe time "$ROUNDS"
run trace build-probe/sm90_bwd_probe trace "$LOG" 4096
# One record for bench/results (bench/candidates_record.py).
python3 bench/candidates_record.py bwd "$LOG" "bash bench/bwd_candidates.sh $ROUNDS" || failed=1
exit $failed
