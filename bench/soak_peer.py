#!/usr/bin/env python3
"""A peer (cuDNN or FlashAttention-2 through PyTorch SDPA) on one FA3-sized shape, back to back for
a while, so that clock and power can be read beside it (nvidia-smi); prints the TFLOP/s over the soak.

  python3 bench/soak_peer.py --backend cudnn --head-dim 128 --seqlen 16384 [--causal] --seconds 5
"""
import argparse
import time

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

ap = argparse.ArgumentParser()
ap.add_argument("--backend", choices=["cudnn", "flash"], default="cudnn")
ap.add_argument("--head-dim", type=int, default=128)
ap.add_argument("--seqlen", type=int, default=16384)
ap.add_argument("--causal", action="store_true")
ap.add_argument("--seconds", type=float, default=5.0)
a = ap.parse_args()
d, s = a.head_dim, a.seqlen
b, h = 16384 // s, 2048 // d
q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
backend = SDPBackend.CUDNN_ATTENTION if a.backend == "cudnn" else SDPBackend.FLASH_ATTENTION
flops = 4.0 * b * h * s * s * d * (0.5 if a.causal else 1.0)
with sdpa_kernel(backend):
    for _ in range(3):
        torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=a.causal)
    torch.cuda.synchronize()
    runs, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < a.seconds:
        for _ in range(20):
            torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=a.causal)
        torch.cuda.synchronize()
        runs += 20
    dt = time.perf_counter() - t0
print(f"SOAK {a.backend} d={d} seqlen={s} causal={int(a.causal)}: {runs} runs, {dt / runs * 1e3:.3f} ms each, "
      f"{flops * runs / dt / 1e12:.1f} TFLOP/s")
