#!/usr/bin/env python3
"""One provider's forward on one FA3 shape, called a few times: a target for profilers.

  python3 bench/peer_call.py PROVIDER HEAD_DIM SEQLEN [--causal] [--calls N]

e.g. `ncu --target-processes all -k regex:cudnn --launch-skip 3 --launch-count 1 --section
SourceCounters --page source --print-source sass --csv python3 bench/peer_call.py cudnn 64 4096`
lists cuDNN's SASS with its stall samples. Inputs as the harness makes them (bench/side_by_side.py).
"""
import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import side_by_side as sbs  # noqa: E402

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("provider")
ap.add_argument("head_dim", type=int)
ap.add_argument("seqlen", type=int)
ap.add_argument("--causal", action="store_true")
ap.add_argument("--calls", type=int, default=5)
a = ap.parse_args()
b, h = sbs.shape(a.seqlen, a.head_dim)
t = sbs.make_tensors(b, h, a.seqlen, a.head_dim, torch.bfloat16, "fwd", seed=1)
fn = sbs.make_fn(a.provider, "fwd", t, a.causal)
for _ in range(a.calls):
    fn()
torch.cuda.synchronize()
