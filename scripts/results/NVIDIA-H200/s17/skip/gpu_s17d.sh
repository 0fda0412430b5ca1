#!/usr/bin/env bash
# (ran against the experiment knobs of scripts/results/NVIDIA-H200/s17/experiments.diff, not kept)
# s17: where the forward's time goes at (8, 8192, 1024): kernel duration and DRAM bytes with the
# look-back skipped (SKIP 1) and the summary walk skipped too (SKIP 2: one walk, the replay;
# results wrong, timing only), and look-back width 8 at 4 lanes per thread.
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
for spec in ${RUNS:-64x512x4lr2p4:1 64x512x4lr2p4:2 64x256x2lp6:1 64x256x2lp6:2 \
    64x256x2lw8p6:0 64x512x4lr2w8p4:0 128x256x2lp6:0 128x256x2lp6:1}; do
  cfg=${spec%%:*}; k=${spec##*:}
  prof "fwd_${cfg}_s$k" 2 "$cfg" --skip "$k" --hints all
done
