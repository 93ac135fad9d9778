#!/usr/bin/env bash
# The head dim 192 kernels behind switches, on the GPU machine in one call: the backward's d192
# kernels (docs/perf-notes.md, "A backward kernel of its own at d192"; detail::set_backward_d192,
# FA4_BACKWARD_D192=1 turns them on for a process) and the forward's 192 / 128 kernels ("The forward
# at 192 / 128 without copies"; detail::set_forward_v128, FA4_FORWARD_V128=1). Off the API's path
# until this passes:
#   build     the library, fa4_tests (GoogleTest from .deps/googletest where the machine has none),
#             sm90_bwd_probe and the PyTorch extension, in build-d192
#   gtest     BackwardGpu.D192Kernels*, VarlenGpu.BackwardD192Kernels, ForwardGpu.D192V128Kernels*,
#             VarlenGpu.ForwardD192V128Kernels (the switch on inside them)
#   gtest-on  every backward test with FA4_BACKWARD_D192=1: the padded cases of 136-192 on the
#             new kernels too
#   memcheck, racecheck, synccheck
#             compute-sanitizer on BackwardGpu.D192KernelsSmall and ForwardGpu.D192V128KernelsSmall
#   probe     sm90_bwd_probe check, then time ROUNDS, at d192 (the staged dQ, dq-atomics,
#             st-shared; outputs compared with the staged form's)
#   bench     bench/side_by_side.py --ops bwd on --hdims 160,192 and on --hdims 192 --dv 128,
#             once as shipped (d256's kernels over copies) and once with FA4_BACKWARD_D192=1,
#             cuDNN in both processes; and --ops fwd --hdims 192 --dv 128 as shipped and with
#             FA4_FORWARD_V128=1; results in $OUT/bench-*.json
#
#   bash bench/d192.sh [ROUNDS]     (outputs in $OUT, else build-d192/logs)
# FA4_COMMIT names the commit in the records where the tree has no git metadata.
set -uo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
BUILD=build-d192
LOG=${OUT:-$PWD/$BUILD/logs}
mkdir -p "$LOG"
export FA4_COMMIT=${FA4_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
export PYTHONDONTWRITEBYTECODE=1
failed=0
run() {  # run NAME CMD...: output in $LOG/NAME.log, one line of verdict here
  local name=$1 t0=$SECONDS
  shift
  if "$@" >"$LOG/$name.log" 2>&1; then echo "[$name] ok ($((SECONDS - t0)) s)"
  else echo "[$name] FAILED ($((SECONDS - t0)) s):"; tail -n 12 "$LOG/$name.log" | sed 's/^/    /'; failed=1; fi
}
gtest=()
[ -d .deps/googletest ] && gtest=(-DFA4_GTEST_SOURCE_DIR="$PWD/.deps/googletest")
run build sh -c "cmake -S . -B $BUILD -G Ninja -DCMAKE_BUILD_TYPE=Release -DFA4_BUILD_PROBE=ON \
  -DFA4_BUILD_TESTS=ON -DFA4_BUILD_SCHEDULER=OFF -DCMAKE_CUDA20_STANDARD_COMPILE_OPTION=-std=c++20 \
  -DCMAKE_CUDA20_EXTENSION_COMPILE_OPTION=-std=c++20 ${gtest[*]} && \
  cmake --build $BUILD -j $(nproc) --target fa4_tests sm90_bwd_probe && \
  python3 python/build_ext.py --lib $BUILD/libfa4.a --out $BUILD/ext"
T=$BUILD/tests/fa4_tests
run gtest "$T" --gtest_filter='BackwardGpu.D192Kernels*:VarlenGpu.BackwardD192Kernels:ForwardGpu.D192V128Kernels*:VarlenGpu.ForwardD192V128Kernels'
run gtest-on env FA4_BACKWARD_D192=1 "$T" \
  --gtest_filter='BackwardGpu.*:VarlenGpu.Backward*:VarlenGpu.SoftcapForwardAndBackward:VarlenGpu.PaddedHeadDims'
for tool in memcheck racecheck synccheck; do
  run "$tool" compute-sanitizer --tool "$tool" --error-exitcode 1 "$T" \
    --gtest_filter='BackwardGpu.D192KernelsSmall:ForwardGpu.D192V128KernelsSmall'
done
run probe-check env FA4_PROBE_ONLY=192 "$BUILD/sm90_bwd_probe" check
run probe-time env FA4_PROBE_ONLY=192 "$BUILD/sm90_bwd_probe" time "$ROUNDS"
lib=$(ls "$BUILD"/ext/*.so 2>/dev/null | head -n1)
for form in padded d192; do
  on=()
  [ "$form" = d192 ] && on=(FA4_BACKWARD_D192=1)
  run "bench-$form" env FA4_TORCH_LIB="$lib" "${on[@]}" python3 bench/side_by_side.py --ops bwd --hdims 160,192 \
    --rounds "$ROUNDS" --providers fa4,cudnn --name "bwd-d192-$form" --out "$LOG"
  run "bench-$form-dv128" env FA4_TORCH_LIB="$lib" "${on[@]}" python3 bench/side_by_side.py --ops bwd --hdims 192 \
    --dv 128 --rounds "$ROUNDS" --providers fa4,cudnn --name "bwd-d192-dv128-$form" --out "$LOG"
done
for form in padded v128; do
  on=()
  [ "$form" = v128 ] && on=(FA4_FORWARD_V128=1)
  run "bench-fwd-$form-dv128" env FA4_TORCH_LIB="$lib" "${on[@]}" python3 bench/side_by_side.py --ops fwd --hdims 192 \
    --dv 128 --rounds "$ROUNDS" --providers fa4,cudnn --name "fwd-d192-dv128-$form" --out "$LOG"
done
exit $failed
