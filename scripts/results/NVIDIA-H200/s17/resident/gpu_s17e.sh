#!/usr/bin/env bash
# (ran against scripts/results/NVIDIA-H200/s17/resident/resident.diff, not kept)
# s17: resident look-back configs (the chunk read once into registers) against the loop walks,
# bench_lookback at the long-L shapes (correctness vs serial, forward and forward+backward
# times); then Nsight Compute DRAM bytes of the resident forward at (8, 8192, 1024).
set -uo pipefail
OUT="${OUT:-$PWD/.device_out}"
mkdir -p "$OUT/lookback"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl >/dev/null 2>&1 || exit 1
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1 SAMU_TUNE_CACHE_DIR=/tmp/samu_tune_cache
CONFIGS=${CONFIGS:-64x512x4lr2p4,64x256x2lp6,16x256x2R,8x512x2R,8x256x2R,16x128x2R,16x512x4R,16x128x2Rw8}
timeout "${T_BENCH:-300}" python3 scripts/bench_lookback.py --out "$OUT/lookback" --warm 8 \
    --no-serial --shapes "${SHAPES:-8x8192x1024,1x16384x256,2x65536x128}" --configs "$CONFIGS" \
    > "$OUT/lookback/bench_lookback.log" 2>&1
grep -E "^==|^lookback|Error|error" "$OUT/lookback/bench_lookback.log" | cut -c1-230
METRICS="gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct"
for cfg in ${NCU_CONFIGS:-16x256x2R 8x512x2R}; do
  timeout 100 ncu --clock-control none -k regex:lookback_scan --launch-skip 2 --launch-count 1 \
      --metrics "$METRICS" python3 scripts/ncu_lookback.py "$cfg" > "$OUT/ncu_fwd_$cfg.txt" 2>&1
  echo "fwd_$cfg $(grep -E "gpu__time|dram__bytes|hit_rate" "$OUT/ncu_fwd_$cfg.txt" \
      | awk '{printf "%s=%s%s ", $1, $3, $2}')"
done
