#!/usr/bin/env bash
# The next device call of benchmarks/NOTES.md's order 00, for whichever card comes (send with carry: ["build"]).
#   H100: 00a, the default-mode decisions written 2026-12-07 (f2fb298) verified, after one no-prewarm point and the
#         all-native probe at 1280x16 b8 n256; sent again, the verify carries on (--resume).
#   H200: its default-mode DiT grid, which has not run (the H200's table lacks 150 (point, op) entries); sent again,
#         the grid carries on (--resume). Both CSVs live in build/ and come back under $OUT.
# Each part stops before the call's 600 s: NEXT_END (default 575) is the second by which the last part ends.
set -u
export PYTHONPATH=src
mkdir -p build
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "$gpu"
tag=h100
[[ $gpu == *H200* ]] && tag=h200
end=${NEXT_END:-575}
if [ "$tag" = h100 ]; then
  if [ ! -e build/verify_noprewarm_h100.csv ]; then
    SWEEP_CSV=build/verify_noprewarm_h100.csv SWEEP_PREWARM=0 SWEEP_DEADLINE=140 \
      SWEEP_ARGS="--modes default --only 'dit 1280x16 b8 n256 default' --verify" \
      timeout 150 bash benchmarks/h200.sh sweep 2>&1 | tail -12
    timeout 110 python3 benchmarks/probes/dit_shared_cache.py --shape 1280x16:8:256 --budget 8 2>&1 | grep -v Warn \
      | tee -a "$OUT/dit_shared_cache_2_h100.txt" | tail -9
  fi
  SWEEP_CSV=build/sweep_dit_default_verify_paired_h100.csv SWEEP_DEADLINE=$((end - 45 - SECONDS)) \
    SWEEP_ARGS="--modes default --only dit --verify --resume" \
    timeout $((end - SECONDS)) bash benchmarks/h200.sh sweep 2>&1 | tail -30
else
  SWEEP_CSV=build/sweep_dit_default_paired_h200.csv SWEEP_DEADLINE=$((end - 45 - SECONDS)) \
    SWEEP_ARGS="--modes default --only dit --resume" \
    timeout $((end - SECONDS)) bash benchmarks/h200.sh sweep 2>&1 | tail -30
fi
cp build/*.csv "$OUT/" 2>/dev/null
true
