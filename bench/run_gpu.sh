#!/usr/bin/env bash
# One command for the GPU machine: build, test, check and compare fa4 with its peers.
#
#   bash bench/run_gpu.sh [--quick] [--skip-build] [--skip-tests] [--skip-bench] [-- ARGS]
#
# Stages, each one line here and its whole output in $OUT/<stage>.log (build-gpu/logs without $OUT):
#   build    CMake + Ninja, Release, in build-gpu (tests and scheduler as far as the machine allows)
#   ctest    the C++ tests, when they were built
#   ext      the PyTorch extension (python/build.sh)
#   pytest   tests/python
#   smoke    fa4-bench --check on two small problems
#   bench    bench/side_by_side.py [--quick] ARGS: fa4 vs cuDNN SDPA, FA2, FlexAttention; writes
#            bench/results/<date>-<what>.json and a copy under $OUT; its table is the last output
# A failing stage does not stop the later ones that can still run. Exit status 1 if any failed.
# The commit recorded in results: $FA4_COMMIT, else `git rev-parse HEAD`, else "unknown".
set -uo pipefail
cd "$(dirname "$0")/.."

quick=() skip_build=0 skip_tests=0 skip_bench=0 bench_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=(--quick) ;;
    --skip-build) skip_build=1 ;;
    --skip-tests) skip_tests=1 ;;
    --skip-bench) skip_bench=1 ;;
    --) shift; bench_args=("$@"); break ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "run_gpu.sh: unknown flag '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done

BUILD=build-gpu
LOG=${OUT:-$PWD/$BUILD/logs}
mkdir -p "$LOG"
JOBS=$(nproc 2>/dev/null || echo 8)
export FA4_COMMIT=${FA4_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
export PYTHONDONTWRITEBYTECODE=1
failed=()

# stage NAME CMD...: runs CMD with its output in $LOG/NAME.log; one line of verdict here.
stage() {
  local name=$1 t0=$SECONDS rc
  shift
  "$@" >"$LOG/$name.log" 2>&1
  rc=$?
  if [ $rc -eq 0 ]; then
    echo "[$name] ok ($((SECONDS - t0)) s)"
  else
    echo "[$name] FAILED (exit $rc, $((SECONDS - t0)) s); end of $LOG/$name.log:"
    tail -n 12 "$LOG/$name.log" | sed 's/^/    /'
    failed+=("$name")
  fi
  return $rc
}

# CMake before 3.26 has no flag for CUDA's C++20 dialect with nvcc (the project asks for it):
# naming the flag is harmless where CMake knows it.
CMAKE_CUDA20=(-DCMAKE_CUDA20_STANDARD_COMPILE_OPTION=-std=c++20
              -DCMAKE_CUDA20_EXTENSION_COMPILE_OPTION=-std=c++20)

configure() {
  local tests=ON
  # GoogleTest may be missing here: build it from carried sources (.deps/googletest, a copy of
  # /usr/src/googletest) when they came along, else build without the C++ tests.
  [ -d .deps/googletest ] && CMAKE_CUDA20+=(-DFA4_GTEST_SOURCE_DIR="$PWD/.deps/googletest")
  if ! cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFA4_BUILD_SCHEDULER=OFF \
      "${CMAKE_CUDA20[@]}" -DFA4_BUILD_TESTS=ON; then
    echo "run_gpu.sh: configuring with the C++ tests failed; trying without them"
    tests=OFF
    cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFA4_BUILD_SCHEDULER=OFF \
      "${CMAKE_CUDA20[@]}" -DFA4_BUILD_TESTS=OFF || return 1
  fi
  echo "run_gpu.sh: C++ tests $tests"
}

build() {
  echo "cmake $(cmake --version | head -n1), nvcc $(nvcc --version | tail -n1)"
  configure || return 1
  # Everything; if some target fails, at least the library and the bench.
  cmake --build "$BUILD" -j "$JOBS" && return 0
  echo "run_gpu.sh: the full build failed; building fa4 and fa4-bench alone"
  cmake --build "$BUILD" -j "$JOBS" --target fa4 fa4-bench
  return 1
}

echo "run_gpu.sh: commit ${FA4_COMMIT:0:12}, $(nvidia-smi --query-gpu=name,driver_version \
  --format=csv,noheader 2>/dev/null | head -n1), logs in $LOG"

if [ $skip_build -eq 0 ]; then
  stage build build
  if [ -x "$BUILD/tests/fa4_tests" ] && [ $skip_tests -eq 0 ]; then
    stage ctest ctest --test-dir "$BUILD" --output-on-failure -j "$JOBS"
    grep -E "tests passed|tests failed" "$LOG/ctest.log" | tail -n1 | sed 's/^/    /'
  fi
  stage ext bash python/build.sh --build-dir "$BUILD" --jobs "$JOBS"
fi

if [ $skip_tests -eq 0 ] && ! python3 -c "import pytest" 2>/dev/null; then
  echo "[pytest] FAILED: pytest is not installed for $(command -v python3)"
  failed+=(pytest)
elif [ $skip_tests -eq 0 ]; then
  stage pytest python3 -m pytest -q -rs -p no:cacheprovider tests/python
  # The summary line, and the distinct reasons for skips (kernels not built yet, ...).
  grep -E "passed|failed|error" "$LOG/pytest.log" | tail -n1 | sed 's/^/    /'
  grep -E "^SKIPPED" "$LOG/pytest.log" | sed -E 's/^SKIPPED \[[0-9]+\] [^ ]+ //' | sort | uniq -c |
    head -n 5 | sed 's/^/    skipped:/'
fi

if [ -x "$BUILD/fa4-bench" ]; then
  smoke() {  # small enough for the whole float64 check; then two checked on rows + the oracle
    local rc=0
    "$BUILD/fa4-bench" --b 1 --h 4 --hkv 1 --sq 300 --sk 300 --d 256 --causal --check || rc=1
    "$BUILD/fa4-bench" --b 2 --h 8 --hkv 2 --sq 1000 --sk 1500 --d 128 --causal --check || rc=1
    "$BUILD/fa4-bench" --b 1 --h 16 --s 4096 --d 64 --layout bhsd --check || rc=1
    return $rc
  }
  stage smoke smoke
  grep -E "^(problem|check|time|fa4 does not|fa4 failed|fa4 rejected)" "$LOG/smoke.log" |
    sed 's/^/    /'
fi

if [ $skip_bench -eq 0 ]; then
  t0=$SECONDS
  python3 bench/side_by_side.py "${quick[@]}" "${bench_args[@]}" 2>"$LOG/bench.log" |
    tee "$LOG/bench.out"
  rc=${PIPESTATUS[0]}
  if [ "$rc" -ne 0 ]; then
    failed+=(bench)
    if ! grep -q "^TFLOP/s" "$LOG/bench.out"; then  # it crashed before its table
      echo "[bench] FAILED (exit $rc, $((SECONDS - t0)) s); end of $LOG/bench.log:"
      tail -n 12 "$LOG/bench.log" | sed 's/^/    /'
    fi
  fi
fi

[ ${#failed[@]} -eq 0 ] || exit 1
exit 0
