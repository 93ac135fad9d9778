"""ctest step: `pip install --no-build-isolation ./python` into a scratch folder, as a user would (no
network: --no-deps, no build isolation; the library FA4_LIB names instead of a CMake build), then a
fresh interpreter that sees only that folder imports fa4 from it, finds the installed extension and
runs the operators' fake kernels on meta tensors.

    FA4_LIB=build/libfa4.a python3 tests/python/check_pip_install.py PYTHON_DIR TARGET_DIR
Prints "pip install: ok" and exits 0, or says what failed and exits 1.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

CHECK = r"""
import sys, torch, fa4
from pathlib import Path
target = Path(sys.argv[1]).resolve()
assert Path(fa4.__file__).resolve().is_relative_to(target), fa4.__file__
assert fa4.library_path().resolve().is_relative_to(target), fa4.library_path()
q = torch.empty(2, 64, 8, 128, device="meta", dtype=torch.bfloat16)
k = torch.empty(2, 64, 2, 128, device="meta", dtype=torch.bfloat16)
out, lse = fa4.flash_attn_func(q, k, k, causal=True, return_lse=True)
assert out.shape == q.shape and lse.shape == (2, 8, 64), (out.shape, lse.shape)
print("installed", fa4.__version__, "from", Path(fa4.__file__).parent, "extension", fa4.library_path().name)
"""


def main() -> int:
    src, target = Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve()
    if not os.environ.get("FA4_LIB"):
        print("check_pip_install: set FA4_LIB to a built libfa4.a")
        return 1
    shutil.rmtree(target, ignore_errors=True)
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-build-isolation", "--no-deps",
           "--no-index", "--target", str(target), str(src)]
    r = subprocess.run(pip, capture_output=True, text=True)
    if r.returncode != 0:
        print("check_pip_install: pip install failed:\n" + r.stdout + r.stderr)
        return 1
    env = {k: v for k, v in os.environ.items() if k not in ("FA4_TORCH_LIB", "PYTHONPATH")}
    env["PYTHONPATH"] = str(target)
    r = subprocess.run([sys.executable, "-c", CHECK, str(target)], capture_output=True, text=True,
                       env=env, cwd=str(target))
    print(r.stdout + r.stderr)
    if r.returncode != 0:
        print("check_pip_install: the installed package failed")
        return 1
    print("pip install: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
