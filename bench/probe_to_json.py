#!/usr/bin/env python3
"""Turns sm90_fwd_probe output (TIME lines) into bench/results records.
usage: probe_to_json.py LOG OUT.json --gpu NAME --driver VER --commit SHA --command CMD [--variant V]"""
import argparse, datetime, json, re

ap = argparse.ArgumentParser()
ap.add_argument("log"); ap.add_argument("out")
ap.add_argument("--gpu", required=True); ap.add_argument("--driver", required=True)
ap.add_argument("--commit", required=True); ap.add_argument("--command", required=True)
ap.add_argument("--date", default=datetime.date.today().isoformat())
a = ap.parse_args()
pat = re.compile(r"TIME (?:(?P<var>\S+) )?d=(\d+) seqlen=(\d+) causal=(\d): ([\d.]+) ms\s+([\d.]+) TFLOP/s")
recs = []
for line in open(a.log):
    m = pat.search(line)
    if not m:
        continue
    var, d, s, c, ms, tf = m.groups()
    d, s = int(d), int(s)
    recs.append({"op": "fwd", "provider": "fa4", "variant": var or "default", "dtype": "bf16",
                 "batch": 16384 // s, "heads_q": 2048 // d, "heads_kv": 2048 // d, "seqlen_q": s,
                 "seqlen_k": s, "head_dim": d, "causal": c == "1", "ms": float(ms), "tflops": float(tf),
                 "gpu": a.gpu, "driver": a.driver, "commit": a.commit, "date": a.date, "command": a.command})
json.dump(recs, open(a.out, "w"), indent=1)
print(len(recs), "records")
