#!/usr/bin/env bash
# Everything a session checks on the GPU, in one device call (<= 600 s; each phase has its own
# time limit, 0 skips it, and writes under $OUT as it goes):
#   1. gpu-marked tests (TEST_ARGS: files, TEST_K: -k)            T_TESTS    -> gpu_tests.log
#   2. look-back config bench (LOOKBACK_ARGS; LOOKBACK_BASELINE=DIR: also DIR's tree)  T_LOOKBACK -> lookback/
#   3. host-path probe: scan vs direct call, profiles      T_PROBE    -> probe/
#   4. grid benchmark: every strategy, seed default (+ chunk32 at two shapes), accelerated-scan,
#      the fastest timed candidate cached and samu_tune.scan timed on it   T_GRID -> grid/
#   5. dispatch overhead of a cached call                  T_DISPATCH -> dispatch_overhead.log
#   6. tuner vs exhaustive, tune wall time (TUNER_CASES)   T_TUNER    -> tuner/
#   7. layer forward / train: SAMU default vs fused vs controller + seed scan  T_LAYER -> layer/
#   8. fused layer by look-back config (FUSED_ARGS; off by default)  T_FUSED -> fused/
#   9. decode tokens/s (SAMU.step vs the seed), host profile  T_DECODE -> layer/
#  10. host path: GPU time, host time per call, eager wall (HOST_ARGS; HOST_BASELINE=DIR:
#      also DIR's samu_tune; off by default)                  T_HOST -> host/
# Carry .whl (pydantic, platformdirs, accelerated-scan, pytest-xdist + execnet wheels) and
# seed_copy (scripts/gpu_wheels.sh downloads the wheels; seed_copy: the seed's readable file).
set -uo pipefail
OUT="${OUT:-$PWD/.device_out}"
mkdir -p "$OUT/grid" "$OUT/tuner" "$OUT/layer" "$OUT/probe" "$OUT/lookback" "$OUT/fused" "$OUT/host"
source scripts/_device_env.sh
phase() { echo "== $1 at $(date +%T)"; }
on() { [ "${1:-0}" -gt 0 ]; }
if on "${T_TESTS:-110}"; then
  phase tests
  # compile-bound: with pytest-xdist carried (.whl), TEST_WORKERS processes compile in parallel
  workers=""
  python3 -c "import xdist" 2>/dev/null && workers="-n ${TEST_WORKERS:-8}"
  timeout "${T_TESTS:-110}" python3 -m pytest -v -m gpu -p no:cacheprovider $workers \
      ${TEST_ARGS:-tests/test_lookback.py tests/test_decode.py tests/test_decode_cache.py} \
      ${TEST_K:+-k "$TEST_K"} 2>&1 \
      | grep -E "PASSED|FAILED|ERROR|Error|assert|passed|failed" > "$OUT/gpu_tests.log"
  grep -c PASSED "$OUT/gpu_tests.log"; grep -E "FAILED|ERROR|passed|failed" "$OUT/gpu_tests.log" | tail -8
fi
if on "${T_LOOKBACK:-0}"; then
  phase lookback
  timeout "$T_LOOKBACK" python3 scripts/bench_lookback.py --out "$OUT/lookback" ${LOOKBACK_ARGS:-} \
      > "$OUT/lookback/bench_lookback.log" 2>&1; tail -40 "$OUT/lookback/bench_lookback.log"
  if [ -n "${LOOKBACK_BASELINE:-}" ]; then
    # the same bench from an older tree (e.g. .baseline: git archive REV samu_tune scripts),
    # carried along: before / after a kernel change, measured on one machine in one call
    mkdir -p "$OUT/lookback_base"
    PYTHONPATH="/tmp/site:$LOOKBACK_BASELINE" timeout "$T_LOOKBACK" python3 \
        "$LOOKBACK_BASELINE/scripts/bench_lookback.py" --out "$OUT/lookback_base" ${LOOKBACK_ARGS:-} \
        > "$OUT/lookback_base/bench_lookback.log" 2>&1; tail -40 "$OUT/lookback_base/bench_lookback.log"
  fi
fi
if on "${T_PROBE:-0}"; then
  phase probe
  timeout "$T_PROBE" python3 scripts/probe_host.py --parts a --out "$OUT/probe" \
      > "$OUT/probe/probe.log" 2>&1; grep -E "_us:|choice|SYNC" "$OUT/probe/probe.log"
fi
if on "${T_GRID:-200}"; then
  phase grid
  timeout "${T_GRID:-200}" python3 scripts/bench_scan.py --out "$OUT/grid" --configs 1 ${GRID_ARGS:-} \
      --seed default,chunk32 --seed-only-at "1,16384,256;2,65536,128" --accel --rep-ms 60 \
      --ship-bench 2>&1 | grep -v "^  warm" > "$OUT/grid/bench.log"; tail -12 "$OUT/grid/bench.log"
fi
if on "${T_DISPATCH:-25}"; then
  phase dispatch
  timeout "${T_DISPATCH:-25}" python3 scripts/dispatch_overhead.py > "$OUT/dispatch_overhead.log" 2>&1
  tail -3 "$OUT/dispatch_overhead.log"
fi
if on "${T_TUNER:-90}"; then
  phase tuner
  timeout "${T_TUNER:-90}" python3 scripts/bench_tuner.py --out "$OUT/tuner" \
      --time-limit "$(( ${T_TUNER:-90} - 20 ))" ${TUNER_ARGS:-} ${TUNER_CASES:+--cases "$TUNER_CASES"} \
      > "$OUT/tuner/bench_tuner.log" 2>&1; tail -12 "$OUT/tuner/bench_tuner.log"
  cat "$OUT/tuner/bench_tuner.md"
fi
if on "${T_LAYER:-0}"; then
  phase layer
  timeout "$T_LAYER" python3 scripts/bench_layer.py --layer-only --out "$OUT/layer" \
      > "$OUT/layer/layer_only.log" 2>&1; tail -8 "$OUT/layer/layer_only.log"
fi
if on "${T_FUSED:-0}"; then
  phase fused
  timeout "$T_FUSED" python3 scripts/bench_fused_configs.py --out "$OUT/fused" ${FUSED_ARGS:-} \
      > "$OUT/fused/bench_fused_configs.log" 2>&1; tail -16 "$OUT/fused/bench_fused_configs.log"
  cat "$OUT/fused/fused_configs.md"
fi
if on "${T_HOST:-0}"; then
  phase host
  # a user's time in three parts (GPU, host per call, eager wall), scan / layer / decode /
  # four-block model (HOST_ARGS, e.g. --only scan,layer); HOST_BASELINE=DIR: the same
  # benchmark on DIR's samu_tune too (e.g. .baseline: git archive REV samu_tune), same run
  mkdir -p "$OUT/host"
  timeout "$T_HOST" python3 scripts/bench_host.py --out "$OUT/host" ${HOST_ARGS:-} \
      > "$OUT/host/bench_host.log" 2>&1; tail -70 "$OUT/host/bench_host.log"
  if [ -n "${HOST_BASELINE:-}" ]; then
    mkdir -p "$OUT/host_base"
    PYTHONPATH="/tmp/site:$HOST_BASELINE" timeout "${T_HOST_BASE:-$T_HOST}" python3 \
        scripts/bench_host.py --out "$OUT/host_base" ${HOST_BASE_ARGS:-${HOST_ARGS:-}} \
        > "$OUT/host_base/bench_host.log" 2>&1; tail -40 "$OUT/host_base/bench_host.log"
  fi
fi
if on "${T_DECODE:-45}"; then
  phase decode
  timeout "${T_DECODE:-45}" python3 scripts/bench_layer.py --decode-only --out "$OUT/layer" \
      > "$OUT/layer/layer.log" 2>&1; tail -12 "$OUT/layer/layer.log"
  timeout 20 python3 scripts/decode_host_profile.py --device cuda --json "$OUT/layer/decode_host.json" \
      > "$OUT/layer/decode_host.log" 2>&1
fi
phase done
