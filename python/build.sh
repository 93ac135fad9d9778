#!/usr/bin/env bash
# Builds fa4's PyTorch extension on the GPU machine: libfa4.a with CMake (in build-gpu), then
# python/build/ext/fa4_C.so with torch.utils.cpp_extension. Works offline. Prints how long it took.
#
#   bash python/build.sh [extra flags of python/build_ext.py, e.g. -v or --build-dir DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
python3 python/build_ext.py "$@"
echo "python/build.sh: done in $(( $(date +%s) - start )) s"
