#!/usr/bin/env bash
# (ran against the experiment knobs of scripts/results/NVIDIA-H200/s17/experiments.diff, not kept)
# s17: L2 eviction hints of the look-back loop walks at (8, 8192, 1024): DRAM bytes and kernel
# duration (Nsight Compute) per config and hint mode (none / all / out / keep).
set -uo pipefail
OUT="${OUT:-$PWD/.device_out}"
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl >/dev/null 2>&1 || exit 1
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1 SAMU_TUNE_CACHE_DIR=/tmp/samu_tune_cache
METRICS="gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct"
prof() {  # name skip args...
  local name=$1 skip=$2; shift 2
  timeout 100 ncu --clock-control none -k regex:lookback_scan --launch-skip "$skip" \
      --launch-count 1 --metrics "$METRICS" python3 scripts/ncu_lookback.py "$@" \
      > "$OUT/ncu_$name.txt" 2>&1
  echo "$name $(grep -E "gpu__time|dram__bytes|hit_rate" "$OUT/ncu_$name.txt" \
      | awk '{printf "%s=%s%s ", $1, $3, $2}')"
}
for cfg in ${CONFIGS:-64x256x2lp6 64x512x4lr2p4 64x256x2lr2 64x256x2l 64x512x4lr2 32x256x2l}; do
  for h in ${HINTS:-none all out keep}; do
    prof "fwd_${cfg}_$h" 2 "$cfg" --hints "$h"
  done
done
for cfg in ${BWD_CONFIGS:-64x256x2lp6 64x256x2l}; do
  for h in none all; do
    prof "bwd_${cfg}_$h" 3 "$cfg" --hints "$h" --train
  done
done
