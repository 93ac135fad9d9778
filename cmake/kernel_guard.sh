#!/usr/bin/env bash
# Compiler launcher for fa4's kernel sources (CMakeLists.txt, FA4_KERNEL_GUARD): runs the compile
# as given, whose ptxas reports every kernel's resources (-Xptxas -v on those sources), and fails it
# when a kernel has a stack frame, spills registers, or had its wgmma serialized by ptxas (C7511
# for want of registers, C7520 for a branch it takes for divergent, any "wgmma.mma_async
# instructions are serialized": each wgmma then waits for the one before, a loss of 10 % and
# more). The report's "info" lines are shown only with --verbose (FA4_PTXAS_VERBOSE).
verbose=0
if [ "${1:-}" = "--verbose" ]; then verbose=1; shift; fi
out=$("$@" 2>&1)
rc=$?
bad=$(printf '%s\n' "$out" | grep -E 'C7511|C7520|instructions are serialized|[1-9][0-9]* bytes (stack frame|spill stores|spill loads)')
if [ $verbose -eq 1 ]; then
  printf '%s\n' "$out"
else
  printf '%s\n' "$out" | grep -vE '^ptxas info|^    [0-9]+ bytes stack frame|^$'
fi
if [ $rc -eq 0 ] && [ -n "$bad" ]; then
  printf '%s\n' "$out" | grep -E 'Compiling entry|Function properties|C7511|C7520|instructions are serialized|bytes (stack|spill)' |
    grep -B1 -E 'C7511|C7520|instructions are serialized|[1-9][0-9]* bytes' >&2
  echo "kernel guard: a kernel above spills, has a stack frame or serialized wgmma (FA4_KERNEL_GUARD=OFF to build anyway)" >&2
  exit 1
fi
exit $rc
