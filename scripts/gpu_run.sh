#!/usr/bin/env bash
# The whole GPU check-and-benchmark, run on the device machine from the repo root:
#   install the carried wheels (.whl: pydantic, platformdirs, accelerated-scan), run the
#   gpu-marked tests, the dispatch overhead, the layer/decode bench (LAYER=0 skips),
#   then scripts/bench_scan.py with the given arguments.  Output under $OUT.
set -uo pipefail
OUT="${OUT:-$PWD/.device_out}"
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1 SAMU_TUNE_CACHE_DIR=/tmp/samu_tune_cache
nvidia-smi -L
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
if [ "${SKIP_TESTS:-0}" != 1 ]; then
    timeout "${TEST_TIMEOUT:-240}" python3 -m pytest -q -m gpu -x tests -p no:cacheprovider \
        2>&1 | tee "$OUT/gpu_tests.log" | tail -25
fi
python3 scripts/dispatch_overhead.py 2>&1 | tail -5
if [ "${LAYER:-1}" = 1 ]; then
    python3 scripts/bench_layer.py --out "$OUT" 2>&1 | tee "$OUT/layer.log" | tail -30
fi
python3 scripts/bench_scan.py --out "$OUT" "$@" 2>&1 | tee "$OUT/bench.log" | tail -80
