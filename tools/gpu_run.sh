#!/usr/bin/env bash
# Everything a session checks on the GPU, in one device call (<= 600 s), run from the repo root
# on the device machine.  Each phase has its own time limit in seconds (T_*; 0 skips it) and
# writes under $OUT as it goes:
#   1. gpu-marked tests (TEST_ARGS: files, TEST_K: -k)            T_TESTS    -> gpu_tests.log
#   2. look-back config bench (LOOKBACK_ARGS; LOOKBACK_BASELINE=DIR: also DIR's own bench on
#      DIR's samu_tune)                                          T_LOOKBACK -> lookback/
#   3. grid benchmark: every strategy, seed default (+ chunk32 at two shapes), accelerated-scan,
#      the fastest timed candidate cached and samu_tune.scan timed on it (GRID_ARGS: more
#      bench_scan arguments, e.g. --fp32)                        T_GRID     -> grid/
#   4. dispatch overhead of a cached call                        T_DISPATCH -> dispatch_overhead.log
#   5. tuner vs exhaustive, tune wall time (TUNER_ARGS, TUNER_CASES)  T_TUNER -> tuner/
#   6. layer forward / train: SAMU default vs fused vs controller + seed scan  T_LAYER -> layer/
#   7. fused layer by look-back config (FUSED_ARGS)              T_FUSED    -> fused/
#   8. host path: GPU time, host time per call, eager wall (HOST_ARGS; HOST_BASELINE=DIR: the
#      same benchmark on DIR's samu_tune too; HOST_ROUNDS=N: the two in N alternating rounds,
#      paired per round)                     T_HOST     -> host/, host_base/, host_rounds.md
#   9. decode tokens/s (SAMU.step vs the seed)                   T_DECODE   -> layer/
#  10. cold tune with and without the compile pool (COLD_ARGS)   T_COLD     -> cold_tune/
#  11. Nsight Compute counters of the look-back kernel (NCU_CONFIGS: config specs;
#      NCU_STRATEGY: lookback, lookback_once or lookback_staged; NCU_ARGS, e.g. --dtype
#      float32), forward and forward+backward; T_NCU bounds each profile, two per config
#                                                                T_NCU      -> ncu/
#  12. the main job (`samu-tune profile --shapes examples/shapes.yaml -v`, default flags) in a
#      fresh process from empty Triton and samu_tune caches, then again with the Triton cache
#      it left and an empty samu_tune cache (warm; T_MAIN_WARM, default 120)
#                                                                T_MAIN     -> main/
# Defaults: tests, grid, dispatch, tuner and decode on; the others off.  A baseline DIR is an
# older tree carried along (before / after on one machine, in one call): for LOOKBACK_BASELINE
# `mkdir -p .baseline && git archive REV samu_tune benchmarks | tar -x -C .baseline`, for
# HOST_BASELINE samu_tune alone (`git archive REV samu_tune`): this tree's benchmark runs on it.
# Carry .whl (pydantic, platformdirs, accelerated-scan, pytest-xdist + execnet wheels:
# tools/gpu_wheels.sh) and seed_copy (the seed's readable file).
#     T_TESTS=0 T_GRID=230 GRID_ARGS=--fp32 T_LAYER=80 bash tools/gpu_run.sh
set -uo pipefail
OUT="$(realpath -m "${OUT:-$PWD/.device_out}")"
mkdir -p "$OUT"
source tools/_device_env.sh
ROOT="$PWD"
phase() { echo "== $1 at $(date +%T)"; }
on() { [ "${1:-0}" -gt 0 ]; }
# a benchmark module on another tree's samu_tune: run in DIR, so DIR comes first on the path
# (ahead of this tree, which still provides benchmarks/ unless DIR has its own)
in_baseline() { local dir=$1; shift; (cd "$dir" && PYTHONPATH="/tmp/site:$ROOT" "$@"); }

if on "${T_TESTS:-110}"; then
  phase tests
  # compile-bound: with pytest-xdist carried (.whl), TEST_WORKERS processes compile in parallel
  workers=""
  python3 -c "import xdist" 2>/dev/null && workers="-n ${TEST_WORKERS:-8}"
  timeout "${T_TESTS:-110}" python3 -m pytest -v -m gpu -p no:cacheprovider $workers \
      ${TEST_ARGS:-tests/test_lookback.py tests/test_scratch.py tests/test_decode.py tests/test_decode_cache.py} \
      ${TEST_K:+-k "$TEST_K"} 2>&1 \
      | grep -E "PASSED|FAILED|ERROR|Error|assert|passed|failed" > "$OUT/gpu_tests.log"
  grep -c PASSED "$OUT/gpu_tests.log"; grep -E "FAILED|ERROR|passed|failed" "$OUT/gpu_tests.log" | tail -8
  # pytest-xdist's workers outlive a pytest that timeout killed, and would go on compiling and
  # running kernels beside the phases that measure: end them
  pkill -f 'exec\(eval\(sys.stdin.readline' 2>/dev/null && echo "killed leftover test workers"
fi
if on "${T_LOOKBACK:-0}"; then
  phase lookback
  mkdir -p "$OUT/lookback"
  timeout "$T_LOOKBACK" python3 -m benchmarks.bench_lookback --out "$OUT/lookback" ${LOOKBACK_ARGS:-} \
      > "$OUT/lookback/bench_lookback.log" 2>&1; tail -40 "$OUT/lookback/bench_lookback.log"
  if [ -n "${LOOKBACK_BASELINE:-}" ]; then
    # DIR's own bench (its config fields may differ), from DIR's benchmarks/ or, in a tree
    # older than that layout, its scripts/
    mkdir -p "$OUT/lookback_base"
    if [ -d "$LOOKBACK_BASELINE/benchmarks" ]; then
      bench=(python3 -m benchmarks.bench_lookback)
    else
      bench=(python3 scripts/bench_lookback.py)
    fi
    in_baseline "$LOOKBACK_BASELINE" timeout "$T_LOOKBACK" "${bench[@]}" \
        --out "$OUT/lookback_base" ${LOOKBACK_ARGS:-} \
        > "$OUT/lookback_base/bench_lookback.log" 2>&1; tail -40 "$OUT/lookback_base/bench_lookback.log"
  fi
fi
if on "${T_GRID:-200}"; then
  phase grid
  mkdir -p "$OUT/grid"
  timeout "${T_GRID:-200}" python3 -m benchmarks.bench_scan --out "$OUT/grid" --configs 1 ${GRID_ARGS:-} \
      --seed default,chunk32 --seed-only-at "1,16384,256;2,65536,128" --accel --rep-ms 60 \
      --ship-bench 2>&1 | grep -v "^  warm" > "$OUT/grid/bench.log"; tail -12 "$OUT/grid/bench.log"
fi
if on "${T_DISPATCH:-25}"; then
  phase dispatch
  timeout "${T_DISPATCH:-25}" python3 -m benchmarks.dispatch_overhead > "$OUT/dispatch_overhead.log" 2>&1
  tail -3 "$OUT/dispatch_overhead.log"
fi
if on "${T_TUNER:-90}"; then
  phase tuner
  mkdir -p "$OUT/tuner"
  timeout "${T_TUNER:-90}" python3 -m benchmarks.bench_tuner --out "$OUT/tuner" \
      --time-limit "$(( ${T_TUNER:-90} - 20 ))" ${TUNER_ARGS:-} ${TUNER_CASES:+--cases "$TUNER_CASES"} \
      > "$OUT/tuner/bench_tuner.log" 2>&1; tail -12 "$OUT/tuner/bench_tuner.log"
  cat "$OUT/tuner/bench_tuner.md"
fi
if on "${T_LAYER:-0}"; then
  phase layer
  mkdir -p "$OUT/layer"
  timeout "$T_LAYER" python3 -m benchmarks.bench_layer --layer-only --out "$OUT/layer" \
      > "$OUT/layer/layer_only.log" 2>&1; tail -8 "$OUT/layer/layer_only.log"
fi
if on "${T_FUSED:-0}"; then
  phase fused
  mkdir -p "$OUT/fused"
  timeout "$T_FUSED" python3 -m benchmarks.bench_fused_configs --out "$OUT/fused" ${FUSED_ARGS:-} \
      > "$OUT/fused/bench_fused_configs.log" 2>&1; tail -16 "$OUT/fused/bench_fused_configs.log"
  cat "$OUT/fused/fused_configs.md"
fi
if on "${T_HOST:-0}"; then
  phase host
  # a user's time in three parts (GPU, host per call, eager wall), scan / layer / decode /
  # four-block model (HOST_ARGS, e.g. --only scan,layer)
  # HOST_ROUNDS > 1 with HOST_BASELINE: this tree and DIR's in turns, each round into r<n>/,
  # then the per-round paired table (benchmarks/host_rounds.py: the host's drift within a call
  # is larger than the changes measured); T_HOST and T_HOST_BASE bound each run
  rounds=${HOST_ROUNDS:-1}
  if ! [[ $rounds =~ ^[1-9][0-9]*$ ]]; then
    echo "HOST_ROUNDS must be a whole number >= 1, got '$rounds': one round"; rounds=1
  fi
  # a round's log tails: all of them for one round, a few lines each for several
  lines=70; [ "$rounds" -gt 1 ] && lines=6
  host_head() {
    mkdir -p "$OUT/host$1"
    timeout "$T_HOST" python3 -m benchmarks.bench_host --out "$OUT/host$1" ${HOST_ARGS:-} \
        > "$OUT/host$1/bench_host.log" 2>&1; tail -"$lines" "$OUT/host$1/bench_host.log"
  }
  host_base() {
    # this tree's benchmark on DIR's samu_tune
    [ -n "${HOST_BASELINE:-}" ] || return 0
    mkdir -p "$OUT/host_base$1"
    in_baseline "$HOST_BASELINE" timeout "${T_HOST_BASE:-$T_HOST}" python3 -m benchmarks.bench_host \
        --out "$OUT/host_base$1" ${HOST_BASE_ARGS:-${HOST_ARGS:-}} \
        > "$OUT/host_base$1/bench_host.log" 2>&1; tail -"$lines" "$OUT/host_base$1/bench_host.log"
  }
  for r in $(seq 1 "$rounds"); do
    sub=""; [ "$rounds" -gt 1 ] && sub="/r$r"
    # odd rounds this tree first, even rounds the baseline first: a steady drift cancels
    if (( r % 2 )); then host_head "$sub"; host_base "$sub"; else host_base "$sub"; host_head "$sub"; fi
  done
  if [ "$rounds" -gt 1 ] && [ -n "${HOST_BASELINE:-}" ]; then
    python3 -m benchmarks.host_rounds "$OUT/host" "$OUT/host_base" --out "$OUT/host_rounds.md"
  fi
fi
if on "${T_DECODE:-45}"; then
  phase decode
  mkdir -p "$OUT/layer"
  timeout "${T_DECODE:-45}" python3 -m benchmarks.bench_layer --decode-only --out "$OUT/layer" \
      > "$OUT/layer/layer.log" 2>&1; tail -12 "$OUT/layer/layer.log"
fi
if on "${T_COLD:-0}"; then
  phase cold-tune
  mkdir -p "$OUT/cold_tune"
  timeout "$T_COLD" python3 -m benchmarks.bench_cold_tune --out "$OUT/cold_tune" ${COLD_ARGS:-} \
      > "$OUT/cold_tune/cold_tune.log" 2>&1; tail -8 "$OUT/cold_tune/cold_tune.log"
fi
if on "${T_NCU:-0}"; then
  phase ncu
  # DRAM bytes (does the replay's re-read come from L2?), issue activity, stall reasons
  # (cycles per issued instruction), occupancy of one launch: the third forward (skip 2), or
  # with --train the second backward (skip 3).  NCU_STRATEGY=lookback_once: its forward is
  # the Gluon kernel (lookback_once_forward) and every lookback_scan launch of its training
  # step is the backward (skip 1); NCU_STRATEGY=lookback_staged: its backward is the Gluon
  # kernel lookback_once_backward (skip 1)
  mkdir -p "$OUT/ncu"
  strategy=${NCU_STRATEGY:-lookback}
  which ncu && ncu --version | tail -1
  sections="--section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats
   --section Occupancy --section LaunchStats --section SchedulerStats --section InstructionStats
   --section ComputeWorkloadAnalysis"
  metrics="dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct,sm__inst_executed.sum,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_tex_op_read_lookup_hit.sum,regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio"
  for cfg in ${NCU_CONFIGS:-64x256x2lp6}; do
    for mode in fwd bwd; do
      kernel=lookback_scan; skip=2; extra=""
      [ "$mode" = bwd ] && { skip=3; extra="--train"; }
      if [ "$strategy" = lookback_once ]; then
        if [ "$mode" = fwd ]; then kernel=lookback_once_forward; else skip=1; fi
      elif [ "$strategy" = lookback_staged ]; then
        kernel=lookback_once_forward
        [ "$mode" = bwd ] && { kernel=lookback_once_backward; skip=1; }
      fi
      echo "== ncu $mode $cfg ($strategy) at $(date +%T)"
      timeout "$T_NCU" ncu --clock-control none -k "regex:$kernel" --launch-skip "$skip" \
          --launch-count 1 $sections --metrics "$metrics" \
          python3 -m tools.ncu_lookback "$cfg" $extra --strategy "$strategy" ${NCU_ARGS:-} \
          > "$OUT/ncu/${mode}_${strategy}_$cfg.txt" 2>&1
      grep -E "Duration|DRAM Throughput|dram__bytes|sector_hit|lookup_hit|op_read.sum|Issue Slots Busy|Achieved Occupancy|Registers Per|Executed Ipc A|sm__inst_executed|Memory Throughput|Theoretical Occ|Block Limit|Shared Memory Config|Dynamic Shared" \
          "$OUT/ncu/${mode}_${strategy}_$cfg.txt" | head -40
      # the stall reasons of at least 0.1 cycles per issued instruction, largest first
      grep -E "issue_stalled_.*ratio" "$OUT/ncu/${mode}_${strategy}_$cfg.txt" | sort -u \
          | awk '$NF + 0 >= 0.1' | sort -k3 -g -r
    done
  done
fi
if on "${T_MAIN:-0}"; then
  phase main-job
  mkdir -p "$OUT/main"
  triton_cache=$(mktemp -d)
  for run in cold warm; do
    limit=$T_MAIN; [ "$run" = warm ] && limit=${T_MAIN_WARM:-120}
    t0=$(date +%s.%N)
    TRITON_CACHE_DIR=$triton_cache SAMU_TUNE_CACHE_DIR=$(mktemp -d) timeout "$limit" \
        python3 -m samu_tune.cli profile --shapes examples/shapes.yaml -v \
        > "$OUT/main/main_$run.log" 2>&1
    echo "main job $run: rc=$? wall=$(python3 -c "import time; print(round(time.time() - $t0, 1))") s"
    grep -E "^\[[0-9]+/[0-9]+\].*candidate" "$OUT/main/main_$run.log" | tail -14
  done
fi
phase done
