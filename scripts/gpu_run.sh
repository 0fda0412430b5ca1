#!/usr/bin/env bash
# The whole GPU check-and-benchmark, run on the device machine from the repo root:
#   install the carried wheels (.whl: pydantic, platformdirs, accelerated-scan), run the
#   gpu-marked tests (SKIP_TESTS=1 skips, TEST_ARGS picks files), the dispatch overhead,
#   scripts/bench_scan.py with the given arguments (BENCH_TIMEOUT seconds), then the layer and
#   decode benchmark (LAYER=0 skips; after bench_scan so the seed's binaries are cached).
#   Output under $OUT.
set -uo pipefail
OUT="${OUT:-$PWD/.device_out}"
mkdir -p "$OUT"
source scripts/_device_env.sh
if [ "${SKIP_TESTS:-0}" != 1 ]; then
    timeout "${TEST_TIMEOUT:-240}" python3 -m pytest -q -m gpu -x ${TEST_ARGS:-tests} \
        -p no:cacheprovider 2>&1 | tee "$OUT/gpu_tests.log" | tail -25
fi
python3 scripts/dispatch_overhead.py 2>&1 | tee "$OUT/dispatch_overhead.log" | tail -5
timeout "${BENCH_TIMEOUT:-3000}" python3 scripts/bench_scan.py --out "$OUT" "$@" 2>&1 \
    | tee "$OUT/bench.log" | tail -60
if [ "${LAYER:-1}" = 1 ]; then
    timeout "${LAYER_TIMEOUT:-300}" python3 scripts/bench_layer.py --out "$OUT" 2>&1 \
        | tee "$OUT/layer.log" | tail -20
fi
