#!/usr/bin/env bash
# (ran against scripts/results/NVIDIA-H200/s17/from_end/from_end.diff, not kept)
# s17: the forward summary walked from the chunk's end (FROM_END): Nsight Compute DRAM bytes
# and duration of the forward at (8, 8192, 1024), then bench_lookback (correctness vs serial,
# forward and forward+backward) at the long-L shapes.
set -uo pipefail
OUT="${OUT:-$PWD/.device_out}"
mkdir -p "$OUT/lookback"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl >/dev/null 2>&1 || exit 1
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1 SAMU_TUNE_CACHE_DIR=/tmp/samu_tune_cache
METRICS="gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct"
for cfg in ${NCU_CONFIGS:-64x512x4lr2p4 64x256x2lp6}; do
  timeout 100 ncu --clock-control none -k regex:lookback_scan --launch-skip 2 --launch-count 1 \
      --metrics "$METRICS" python3 scripts/ncu_lookback.py "$cfg" > "$OUT/ncu_fwd_$cfg.txt" 2>&1
  echo "fwd_$cfg $(grep -E "gpu__time|dram__bytes|hit_rate" "$OUT/ncu_fwd_$cfg.txt" \
      | awk '{printf "%s=%s%s ", $1, $3, $2}')"
done
timeout "${T_BENCH:-200}" python3 scripts/bench_lookback.py --out "$OUT/lookback" --warm 6 \
    --no-serial --shapes "${SHAPES:-8x8192x1024,1x16384x256,2x65536x128}" \
    --configs "${CONFIGS:-64x512x4lr2p4,64x256x2lp6,64x256x2lr2p6,64x128x2lw8p6,64x128x2lr2p6}" \
    > "$OUT/lookback/bench_lookback.log" 2>&1
grep -E "^==|^lookback|Error|error" "$OUT/lookback/bench_lookback.log" | cut -c1-240
