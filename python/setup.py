"""Builds the installable package `fa4` (pyproject.toml): libfa4.a with CMake, as build_ext.py does
(in $FA4_BUILD_DIR, default build-pip at the repository root; or the library $FA4_LIB names, used
as it is), then python/csrc/fa4_torch.cpp linked with it and the CUDA runtime, as fa4/fa4_C*.so,
which `import fa4` loads.

    pip install --no-build-isolation ./python      # torch, setuptools and wheel already installed
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from setuptools import setup
from torch.utils import cpp_extension

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from build_ext import build_library  # noqa: E402  (the CMake step, shared with python/build.sh)


class BuildWithLibrary(cpp_extension.BuildExtension):
    """Builds (or finds) libfa4.a first and links every extension with it."""

    def run(self):
        lib = os.environ.get("FA4_LIB")
        if lib:
            lib_path = Path(lib).resolve()
            if not lib_path.is_file():
                sys.exit(f"fa4 setup: FA4_LIB = {lib}: no such file")
        else:
            build_dir = Path(os.environ.get("FA4_BUILD_DIR", ROOT / "build-pip")).resolve()
            lib_path = build_library(build_dir, os.cpu_count() or 2, verbose=False)
        for ext in self.extensions:
            ext.extra_objects = [str(lib_path)]
        super().run()


setup(
    packages=["fa4"],
    ext_modules=[
        cpp_extension.CUDAExtension(
            name="fa4.fa4_C",
            sources=["csrc/fa4_torch.cpp"],  # relative to this file, as setuptools requires
            include_dirs=[str(ROOT / "include")],
            extra_compile_args={"cxx": ["-O2"]},
        )
    ],
    cmdclass={"build_ext": BuildWithLibrary},
)
