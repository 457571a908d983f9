#!/usr/bin/env bash
# The next device call of benchmarks/NOTES.md's order 00, for whichever card comes (send with carry: ["build"]).
#   H100: 00a's all-native kernels at two points and the verify's one loss again, then 00b, reduce-overhead's grid
#         with sdpa_flash; sent again, the grid carries on (--resume).
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

resumable_sweep() {  # CSV ARGS: a sweep that carries on (--resume) until `end`, starting no point it cannot finish
  SWEEP_CSV=$1 SWEEP_DEADLINE=$((end - 45 - SECONDS)) SWEEP_ARGS="$2 --resume" \
    timeout $((end - SECONDS)) bash benchmarks/h200.sh sweep 2>&1 | tail -30
}

if [ "$tag" = h100 ]; then
  # the all-native puzzle (NOTES, order 00a): kernel by kernel at two points where all native lost, GPU-bound
  # (1152x16 b1 n4096, plain 2.26 ms) and host-bound (1280x16 b8 n256), with both Triton codes at the first
  if [ ! -e build/native_kernels_h100.done ]; then
    for s in 1152x16:1:4096 1280x16:8:256; do
      echo "--- $s $(date -u +%H:%M:%S)" | tee -a "$OUT/native_kernels_h100.txt"
      code=()
      [ "$s" = 1152x16:1:4096 ] && code=(--code "$OUT/native_code_1152")
      timeout 100 python3 benchmarks/probes/dit_host_probe.py --shape "$s" --variants plain,native --profile none \
        "${code[@]}" 2>&1 | grep -v Warn | tee -a "$OUT/native_kernels_h100.txt" | grep -v "^ " | tail -5
      timeout 80 python3 benchmarks/dit_kernels.py --shape "$s" --mode default --by diff \
        --variants native,native-lowp,plain --top 12 2>&1 | grep -v Warn | tee -a "$OUT/native_kernels_h100.txt" | tail -16
    done
    touch build/native_kernels_h100.done
  fi
  # the verify's one loss, on a host whose rounds spread 1.19-2.50 ms: again
  if [ ! -e build/verify_1536x24_h100.csv ]; then
    SWEEP_CSV=build/verify_1536x24_h100.csv SWEEP_DEADLINE=100 \
      SWEEP_ARGS="--modes default --only 'dit 1536x24 b8 n256 default' --verify" \
      timeout 110 bash benchmarks/h200.sh sweep 2>&1 | tail -7
  fi
  # order 00b: reduce-overhead with sdpa_flash's one-kernel variant only (19 points, resumable)
  resumable_sweep build/sweep_dit_ro_paired_h100.csv "--modes reduce-overhead --only dit --ops sdpa_flash"
else
  resumable_sweep build/sweep_dit_default_paired_h200.csv "--modes default --only dit"
fi
cp build/*.csv "$OUT/" 2>/dev/null
true
