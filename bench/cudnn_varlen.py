"""cuDNN's fused attention on packed variable-length batches, through bench/cudnn_peer (ctypes).

The library path comes from $FA4_CUDNN_PEER, else build/libfa4_cudnn_peer.so (cmake
-DFA4_BUILD_CUDNN_PEER=ON -DFA4_CUDNN_FRONTEND_INCLUDE=<cudnn_frontend's include>). Import torch
first: the library takes libcudnn.so.9 and libcudart from the process.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
_lib = None


def library():
    global _lib
    if _lib is None:
        path = os.environ.get("FA4_CUDNN_PEER", str(ROOT / "build" / "libfa4_cudnn_peer.so"))
        if not Path(path).is_file():
            raise FileNotFoundError(f"cuDNN peer library not found at {path} (set FA4_CUDNN_PEER)")
        _preload("libnvrtc.so.*")  # the frontend's runtime-compiled kernels: torch's copy where the loader has none
        lib = ctypes.CDLL(path)
        i64, vp, ci = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
        lib.fa4_cudnn_peer_error.restype = ctypes.c_char_p
        lib.fa4_cudnn_peer_create.argtypes = [ctypes.POINTER(vp), ci, i64, i64, i64, i64, ci, i64, i64, ci,
                                              ctypes.c_float, ctypes.POINTER(i64)]
        lib.fa4_cudnn_peer_destroy.argtypes = [vp]
        lib.fa4_cudnn_peer_forward.argtypes = [vp] * 13
        lib.fa4_cudnn_peer_backward.argtypes = [vp] * 17
        _lib = lib
    return _lib


def _preload(pattern: str) -> None:
    """Loads the first library matching `pattern` under a site-packages nvidia/ tree (the CUDA wheels
    torch depends on), so that the peer's own dependency on it resolves; silent where none is."""
    import glob
    import sys

    for base in sys.path:
        for hit in sorted(glob.glob(os.path.join(base, "nvidia", "**", pattern), recursive=True)):
            try:
                ctypes.CDLL(hit, mode=ctypes.RTLD_GLOBAL)
                return
            except OSError:
                continue


def _check(rc: int, what: str) -> None:
    if rc != 0:
        raise RuntimeError(f"cuDNN peer {what}: {library().fa4_cudnn_peer_error().decode()}")


class CudnnVarlen:
    """One configuration: packed q [total_q, heads_q, d], k and v [total_k, heads_k, d], cu_seqlens
    int32 on the device. causal is bottom-right (fa4's): cuDNN's set_causal_mask_bottom_right, or its
    top-left mask where every sequence has as many keys as queries (the same mask then; self.mask
    says which ran)."""

    def __init__(self, cu_q, cu_k, max_q, max_k, heads_q, heads_k, d, dtype, causal, scale, backward=False):
        lib = library()
        self.batch = cu_q.numel() - 1
        self.heads_q, self.heads_k, self.d = heads_q, heads_k, d
        self.seq_q = (cu_q[1:] - cu_q[:-1]).to(torch.int32).contiguous()
        self.seq_k = (cu_k[1:] - cu_k[:-1]).to(torch.int32).contiguous()
        self.off_q = (cu_q.to(torch.int64) * heads_q * d).contiguous()
        self.off_k = (cu_k.to(torch.int64) * heads_k * d).contiguous()
        self.off_stats = (cu_q.to(torch.int64) * heads_q).contiguous()
        same = torch.equal(self.seq_q, self.seq_k)
        self.mask = "none" if not causal else "top-left" if same else "bottom-right"
        handle, ws = ctypes.c_void_p(), ctypes.c_int64()
        _check(lib.fa4_cudnn_peer_create(ctypes.byref(handle), int(backward), self.batch, heads_q, heads_k, d,
                                         int(dtype == torch.float16), max_q, max_k,
                                         {"none": 0, "top-left": 1, "bottom-right": 2}[self.mask], scale,
                                         ctypes.byref(ws)), "create")
        self.handle = handle
        self.workspace = torch.empty(max(ws.value, 1), dtype=torch.uint8, device=cu_q.device)

    def __del__(self):
        if getattr(self, "handle", None) and _lib is not None:
            _lib.fa4_cudnn_peer_destroy(self.handle)

    def _index(self):
        return [t.data_ptr() for t in (self.seq_q, self.seq_k, self.off_q, self.off_k, self.off_stats)]

    def forward(self, q, k, v, out=None, stats=None):
        """Returns (O [total_q, heads_q, d], stats [total_q, heads_q] fp32, natural-log LSE)."""
        out = torch.empty_like(q) if out is None else out
        stats = torch.empty(q.shape[0], self.heads_q, dtype=torch.float32, device=q.device) if stats is None else stats
        for t in (q, k, v, out):
            assert t.is_contiguous()
        _check(library().fa4_cudnn_peer_forward(
            self.handle, q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), stats.data_ptr(), *self._index(),
            self.workspace.data_ptr(), torch.cuda.current_stream().cuda_stream), "forward")
        return out, stats

    def backward(self, dout, q, k, v, out, stats, dq=None, dk=None, dv=None):
        dq = torch.empty_like(q) if dq is None else dq
        dk = torch.empty_like(k) if dk is None else dk
        dv = torch.empty_like(v) if dv is None else dv
        for t in (dout, q, k, v, out):
            assert t.is_contiguous()
        _check(library().fa4_cudnn_peer_backward(
            self.handle, q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), dout.data_ptr(), stats.data_ptr(),
            dq.data_ptr(), dk.data_ptr(), dv.data_ptr(), *self._index(), self.workspace.data_ptr(),
            torch.cuda.current_stream().cuda_stream), "backward")
        return dq, dk, dv
