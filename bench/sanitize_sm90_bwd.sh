#!/usr/bin/env bash
# compute-sanitizer memcheck, racecheck and synccheck on the sm90 backward (fa4-bench --bwd --check,
# one launch each, float64 check of the gradients), on the GPU machine:
#   bash bench/sanitize_sm90_bwd.sh [FA4_BENCH] [OUTDIR]     (writes OUTDIR/sanitizer-bwd.txt)
# Shapes: each head dim with odd lengths on both sides, GQA, causal, a window, and the
# deterministic dQ kernel (which loads Q and dO in 64-column boxes where the dK/dV kernel's are
# folded, d128 and d256), and two d192 shapes (d256's kernels over copies, or with
# FA4_BACKWARD_D192=1 in the environment the d192 kernels). Exit status 1 if any run reports an
# error or fails its check.
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/lib:$LD_LIBRARY_PATH
B=${1:-build/fa4-bench}
OUTDIR=${2:-${OUT:-.}}
mkdir -p "$OUTDIR"
R=$OUTDIR/sanitizer-bwd.txt
: >"$R"
bad=0
for tool in ${FA4_SANITIZE_TOOLS:-memcheck racecheck synccheck}; do
  for args in "--b 1 --h 4 --hkv 2 --sq 300 --sk 333 --d 128 --causal" "--b 2 --h 4 --hkv 1 --sq 129 --sk 257 --d 64" \
              "--b 1 --h 2 --sq 500 --sk 400 --d 64 --window 60,10 --deterministic" \
              "--b 1 --h 4 --hkv 2 --sq 200 --sk 200 --d 128 --causal --deterministic" \
              "--b 1 --h 4 --hkv 1 --sq 239 --sk 300 --d 256" "--b 1 --h 2 --sq 300 --sk 239 --d 256 --causal --deterministic" \
              "--b 1 --h 4 --hkv 2 --sq 239 --sk 300 --d 192 --causal" "--b 1 --h 2 --sq 130 --sk 200 --d 192 --deterministic"; do
    out=$(timeout 300 compute-sanitizer --tool "$tool" "$B" --bwd $args --check --iters 0 --warmup 0 2>&1)
    line="== $tool $args: $(echo "$out" | grep -E '^check|SUMMARY' | tr '\n' ' ')"
    echo "$line" | tee -a "$R"
    echo "$out" | grep -qE 'check: PASS' || bad=1
    echo "$out" | grep -qE 'ERROR SUMMARY: 0 errors|0 hazards displayed \(0 errors' || bad=1
  done
done
exit $bad
