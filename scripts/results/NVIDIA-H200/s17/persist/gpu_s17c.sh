#!/usr/bin/env bash
# (ran against the experiment knobs of scripts/results/NVIDIA-H200/s17/experiments.diff, not kept)
# s17: persistent look-back programs (PERSIST programs per SM take tickets in a loop: fewer
# resident chunks, a smaller L2 working set between a chunk's summary and its replay) at
# (8, 8192, 1024): DRAM bytes and kernel duration (Nsight Compute) per config and persist.
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
  grep -E "Error|error" "$OUT/ncu_$name.txt" | head -3
}
for spec in ${RUNS:-64x512x4lr2p4:0 64x512x4lr2p4:2 64x512x4lr2p4:3 64x512x4lr2p4:4 \
    64x256x2lp6:3 64x256x2lp6:4 64x256x2lp6:6 64x256x2lr2:4 64x256x2lr2:6 32x256x2l:4 32x256x2l:8}; do
  cfg=${spec%%:*}; p=${spec##*:}
  prof "fwd_${cfg}_p$p" 2 "$cfg" --persist "$p" --hints all
done
for spec in ${BWD_RUNS:-64x256x2lp6:4 64x256x2lp6:6}; do
  cfg=${spec%%:*}; p=${spec##*:}
  prof "bwd_${cfg}_p$p" 3 "$cfg" --persist "$p" --hints all --train
done
