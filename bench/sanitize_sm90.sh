#!/usr/bin/env bash
# compute-sanitizer (memcheck, racecheck, synccheck) over the shipped sm90 forward, one fa4-bench
# --check call a shape, and the SASS counts of its kernels. On the GPU machine:
#   bash bench/sanitize_sm90.sh [path/to/fa4-bench] [out dir]
# FA4_SANITIZE_TOOLS="memcheck synccheck" runs only the tools named (default: all three).
# Shapes: causal d128; GQA d64 with tails; causal d256, short queries; more tiles than SMs
# (static rounds, clusters of two sharing K/V); the same causal (the dynamic tile counter);
# clusters with an odd query-block count (d64, 17 blocks) and at d256; d64 on 128-row tiles
# (two consumers: causal 256, 1.5 times the scores on 192-row tiles; causal 512, the shape before
# it, now runs three); stream-K pieces merged (fewer tiles than SMs: every tile's keys
# cut across the grid) at d128, d64 and d256 in clusters of two; one round of whole tiles and a
# cut tail (two launches, clusters: 70 pairs on 66). That last shape replaced a larger one (208
# tiles x 16 blocks) whose racecheck ran past 100 s; bench/results/2026-11-22-final-check-e87568b.txt.
# Last, d256 on one CTA a unit (three query blocks: no clusters), its O staged in the last K/V
# slots (FwdConfig::kStageOInKV) and the Q loaders waiting on FwdBarriers::q_free. Causal tiles start
# before row 0 where seqlen_q leaves a partial tile (Window::shift): d128 causal 300 and 700 (64
# rows), d64 causal 1000 on 192-row tiles (128 rows), d256 causal 300 (64 rows: consumer 0 idle).
# The bounded kernels' mask paths: a window with both bounds (d64, three consumers) and one open on
# the left (d128: the one-compare mask, first blocks cut to a consumer's rows). Tiles of one length
# from the tile counter, partial last query blocks: d64 on 192-row tiles (1000 rows) and d256 (333
# rows, no clusters). d256 tiles without keys among tiles with keys (causal with seqlen_q >
# seqlen_k, a window open on the left): zeros stored from registers where a tile has no key.
# d256 causal tiles in pairs (tile_order.cuh, "Paired causal tiles"): a partial last query block
# (1000 rows, 8 blocks) and bottom-right with GQA (512 x 700).
# d256's serial step on 128-key blocks (the short causal rows in pairs): causal 512, both tiles'
# first blocks passed over (256 x 300, GQA), consumer 0 idle over two blocks (129 x 230), and idle
# in the first tile then passing over the second's first block (192; it hung memcheck before the
# passed-over V was waited on once, ahead of the turn).
# Soft-capped decoding over long keys in few folded tiles: the capped stream-K pieces and their
# merge (d128, d64, d256).
# FA4_SANITIZE_SHAPES="ARGS; ARGS; ..." runs only the shapes given.
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/lib:$LD_LIBRARY_PATH
B=${1:-build/fa4-bench}
OUTDIR=${2:-${OUT:-.}}
mkdir -p "$OUTDIR"
R=$OUTDIR/sanitizer.txt
SHAPES=(
  "--b 1 --h 2 --sq 300 --sk 300 --d 128 --causal" "--b 2 --h 4 --hkv 1 --sq 129 --sk 257 --d 64"
  "--b 1 --h 2 --sq 70 --sk 333 --d 256 --causal" "--b 2 --h 16 --hkv 4 --sq 700 --sk 650 --d 128"
  "--b 2 --h 16 --hkv 4 --sq 700 --sk 650 --d 128 --causal" "--b 1 --h 2 --sq 3259 --sk 400 --d 64"
  "--b 1 --h 4 --hkv 2 --sq 500 --sk 333 --d 256" "--b 4 --h 16 --hkv 4 --sq 256 --sk 256 --d 64 --causal"
  "--b 1 --h 4 --sq 100 --sk 5000 --d 128" "--b 1 --h 2 --hkv 1 --sq 700 --sk 3001 --d 64"
  "--b 1 --h 4 --sq 500 --sk 2000 --d 256" "--b 1 --h 10 --sq 1792 --sk 1024 --d 128"
  "--b 1 --h 3 --sq 300 --sk 500 --d 256" "--b 1 --h 2 --sq 1000 --sk 1000 --d 64 --causal"
  "--b 1 --h 2 --sq 300 --sk 300 --d 256 --causal" "--b 1 --h 2 --sq 600 --sk 600 --d 64 --window 100,20"
  "--b 1 --h 2 --sq 300 --sk 500 --d 128 --window -1,30" "--b 4 --h 16 --sq 1000 --sk 300 --d 64"
  "--b 4 --h 16 --hkv 8 --sq 333 --sk 256 --d 256" "--b 1 --h 2 --sq 700 --sk 100 --d 256 --causal"
  "--b 1 --h 2 --sq 900 --sk 333 --d 256 --window 40,0"
  "--b 2 --h 3 --sq 1000 --sk 1000 --d 256 --causal" "--b 1 --h 2 --hkv 1 --sq 512 --sk 700 --d 256 --causal"
  "--b 2 --h 4 --sq 512 --sk 512 --d 256 --causal" "--b 1 --h 4 --hkv 2 --sq 256 --sk 300 --d 256 --causal"
  "--b 2 --h 2 --sq 129 --sk 230 --d 256 --causal" "--b 1 --h 2 --sq 192 --sk 192 --d 256 --causal"
  "--b 1 --h 32 --hkv 8 --sq 1 --sk 8192 --d 128 --softcap 30" "--b 1 --h 16 --hkv 4 --sq 1 --sk 8192 --d 64 --softcap 30"
  "--b 1 --h 16 --hkv 4 --sq 1 --sk 8192 --d 256 --softcap 30"
)
if [ -n "${FA4_SANITIZE_SHAPES:-}" ]; then
  IFS=';' read -ra SHAPES <<< "$FA4_SANITIZE_SHAPES"
fi
for tool in ${FA4_SANITIZE_TOOLS:-memcheck racecheck synccheck}; do
  for args in "${SHAPES[@]}"; do
    out=$(timeout 120 compute-sanitizer --tool $tool $B $args --check --iters 0 --warmup 0 2>&1)
    rc=$?
    echo "sanitizer $tool [$args] rc=$rc $(echo "$out" | grep -E 'SUMMARY' | tail -1) $(echo "$out" | grep -E '^check' | tail -1)" | tee -a $R
  done
done
cuobjdump --dump-sass $B > /tmp/sass.txt 2>/dev/null
echo "SASS of fa4-bench: HGMMA $(grep -c HGMMA /tmp/sass.txt), LDL $(grep -c 'LDL' /tmp/sass.txt), STL $(grep -c 'STL' /tmp/sass.txt)" | tee -a $R
