"""Builds fa4's PyTorch extension: python/csrc/fa4_torch.cpp linked with a CMake-built libfa4.a.

    python3 python/build_ext.py [--build-dir build-gpu] [--out python/build/ext] [--jobs N] [-v]

1. libfa4.a: `cmake --build <build-dir> --target fa4` (configured first, Release, Ninja, without
   tests and the scheduler, when <build-dir> has no CMakeCache.txt). The kernels are compiled by
   the project's own CMake flags (sm_90a); the library is position independent.
2. fa4_C.so: torch.utils.cpp_extension.load compiles the one C++ file against torch's headers and
   links libfa4.a and the CUDA runtime. No network, no pip: only torch, ninja and the toolchain.
Then it loads the result and checks that torch.ops.fa4.fwd / bwd exist. Prints the time of each
step. fa4 (python/fa4) finds the result at python/build/ext/fa4_C.so, or at $FA4_TORCH_LIB.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def build_library(build_dir: Path, jobs: int, verbose: bool) -> Path:
    out = None if verbose else subprocess.DEVNULL
    if not (build_dir / "CMakeCache.txt").exists():
        gen = ["-G", "Ninja"] if shutil.which("ninja") else []
        subprocess.run(
            ["cmake", "-S", str(ROOT), "-B", str(build_dir), *gen, "-DCMAKE_BUILD_TYPE=Release",
             "-DFA4_BUILD_TESTS=OFF", "-DFA4_BUILD_SCHEDULER=OFF",
             # CMake < 3.26 has no flag for nvcc's C++20 dialect; harmless where it has one.
             "-DCMAKE_CUDA20_STANDARD_COMPILE_OPTION=-std=c++20",
             "-DCMAKE_CUDA20_EXTENSION_COMPILE_OPTION=-std=c++20"],
            check=True, stdout=out,
        )
    subprocess.run(
        ["cmake", "--build", str(build_dir), "--target", "fa4", "-j", str(jobs)],
        check=True, stdout=out,
    )
    lib = build_dir / "libfa4.a"
    if not lib.is_file():
        sys.exit(f"build_ext: {lib} was not produced by `cmake --build {build_dir} --target fa4`")
    return lib


def build_extension(lib: Path, out_dir: Path, jobs: int, verbose: bool) -> Path:
    import torch
    from torch.utils import cpp_extension

    # fa4's C++ API passes std::string (in fa4::Status): both sides need the same string ABI.
    if not getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True):
        sys.exit("build_ext: this torch uses the pre-C++11 std::string ABI; libfa4.a is built with "
                 "the C++11 one (rebuild it with -D_GLIBCXX_USE_CXX11_ABI=0)")
    out_dir.mkdir(parents=True, exist_ok=True)
    so = out_dir / "fa4_C.so"
    # ninja does not track libfa4.a (it is a linker flag): drop the old .so so the link reruns.
    if so.exists():
        so.unlink()
    os.environ.setdefault("MAX_JOBS", str(jobs))
    # The extension holds no device code; keep torch from adding architecture flags anyway.
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0a")
    cpp_extension.load(
        name="fa4_C",
        sources=[str(ROOT / "python" / "csrc" / "fa4_torch.cpp")],
        extra_include_paths=[str(ROOT / "include")],
        extra_cflags=["-O2"],  # torch's own -std=c++17: its headers under another dialect broke at run time (GCC 13)
        extra_ldflags=[str(lib)],
        build_directory=str(out_dir),
        with_cuda=True,
        is_python_module=False,
        verbose=verbose,
    )
    if not so.is_file():
        sys.exit(f"build_ext: {so} missing after the build")
    if not (hasattr(torch.ops.fa4, "fwd") and hasattr(torch.ops.fa4, "bwd")):
        sys.exit("build_ext: the extension loaded but torch.ops.fa4.fwd / bwd are not registered")
    return so


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build-dir", default=str(ROOT / "build-gpu"),
                    help="CMake build folder holding libfa4.a (default build-gpu)")
    ap.add_argument("--lib", default=None,
                    help="use this libfa4.a as it is instead of building it with CMake")
    ap.add_argument("--out", default=str(ROOT / "python" / "build" / "ext"),
                    help="folder for the extension (default python/build/ext)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args()

    t0 = time.time()
    if args.lib:
        lib = Path(args.lib).resolve()
        if not lib.is_file():
            sys.exit(f"build_ext: --lib {lib}: no such file")
    else:
        lib = build_library(Path(args.build_dir).resolve(), args.jobs, args.verbose)
    t1 = time.time()
    print(f"build_ext: {lib} ready in {t1 - t0:.1f} s", flush=True)
    so = build_extension(lib, Path(args.out).resolve(), args.jobs, args.verbose)
    t2 = time.time()
    print(f"build_ext: {so} built and loaded in {t2 - t1:.1f} s (total {t2 - t0:.1f} s)",
          flush=True)


if __name__ == "__main__":
    main()
