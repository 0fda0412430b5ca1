# s16 run 2: GPU tests of the look-back and layer, then the launch-count change (atomic
# gradient sums, the forward kernel writing the control table, one zero fill for both
# directions, no zero-filled final-state gradient) against .baseline (the tree before it)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1 SAMU_TUNE_CACHE_DIR=/tmp/stc
timeout 170 python3 -m pytest -q -m gpu -p no:cacheprovider -n 12 tests/test_lookback.py tests/test_layer.py 2>&1 | tail -6 > $OUT/gpu_tests.log; cat $OUT/gpu_tests.log
C=64x128x2lr2p6,64x128x2lw8p6,64x256x4lw8p6,64x32x2w8,64x256x2lp6,64x512x4lr2p4,32x128x2lr2,64x256x2lr2p6
S=1x2048x1024,1x16384x256,32x512x256,64x256x64,8x8192x1024
timeout 200 python3 scripts/bench_lookback.py --out $OUT/new --warm 15 --no-serial --kernels --shapes $S --configs $C > $OUT/new.log 2>&1
PYTHONPATH=/tmp/site:$PWD/.baseline timeout 170 python3 .baseline/scripts/bench_lookback.py --out $OUT/base --warm 15 --no-serial --shapes $S --configs $C > $OUT/base.log 2>&1
grep -E "^lookback|^==" $OUT/new.log $OUT/base.log | sed -E "s/'lookback': 'decoupled', 'window': 1, 'sub': 1, //; s/'(chunk|block_m|num_warps|inner|rows|lookback_width|stages)': //g" | cut -c1-150
