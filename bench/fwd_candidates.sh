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
python3 bench/candidates_record.py fwd "$LOG" "FA4_VARIANTS=$FA4_VARIANTS bash bench/fwd_candidates.sh" || failed=1
exit $failed
