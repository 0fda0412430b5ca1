#!/usr/bin/env bash
# s17: Nsight Compute counters of the look-back kernel at (8, 8192, 1024): DRAM bytes (does the
# replay's re-read come from L2?), issue activity, stall reasons, occupancy.
set -uo pipefail
OUT="${OUT:-$PWD/.device_out}"
mkdir -p "$OUT"
source scripts/_device_env.sh
which ncu && ncu --version | tail -1
SECTIONS="--section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats
 --section Occupancy --section LaunchStats --section SchedulerStats --section InstructionStats
 --section ComputeWorkloadAnalysis"
METRICS="dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct,sm__inst_executed.sum,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_tex_op_read_lookup_hit.sum"
prof() {  # name skip args...
  local name=$1 skip=$2; shift 2
  echo "== $name at $(date +%T)"
  timeout 150 ncu --clock-control none -k regex:lookback_scan --launch-skip "$skip" \
      --launch-count 1 $SECTIONS --metrics "$METRICS" python3 scripts/ncu_lookback.py "$@" \
      > "$OUT/ncu_$name.txt" 2>&1
  grep -E "Duration|DRAM Throughput|dram__bytes|sector_hit|lookup_hit|op_read.sum|Issue Slots Busy|Achieved Occupancy|Registers Per|Executed Ipc A|sm__inst_executed|Memory Throughput|Theoretical Occ|Block Limit|Shared Memory Config|Dynamic Shared" "$OUT/ncu_$name.txt" | head -40
}
prof fwd_64x512x4lr2p4 2 64x512x4lr2p4
prof fwd_64x256x2lp6 2 64x256x2lp6
prof fwd32_64x256x2lr2p6 2 64x256x2lr2p6 --dtype float32
prof bwd_64x256x2lp6 3 64x256x2lp6 --train
