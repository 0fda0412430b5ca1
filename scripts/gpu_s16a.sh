python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1 SAMU_TUNE_CACHE_DIR=/tmp/stc
BIG=64x256x2lp6,64x512x4lr2p4,64x256x2lr2p4,64x128x2lw8p6,64x128x2lr2p6
SMALL=64x64x2lp6,64x64x2lr2p4,32x64x2l,32x64x2lr2,64x64x2lw8p6,32x64x2lw8,64x128x4lp6,64x128x4lw8p6,32x128x4lr2,64x32x2w8,64x256x4lw8p6
timeout 300 python3 scripts/bench_lookback.py --out $OUT/new --warm 15 --no-serial --kernels --shapes 1x2048x1024,1x16384x256,32x512x256,64x256x64 --configs $BIG,$SMALL > $OUT/new.log 2>&1
tail -5 $OUT/new.log
timeout 100 python3 scripts/bench_lookback.py --out $OUT/newbig --no-serial --shapes 8x8192x1024,2x65536x128 --configs $BIG > $OUT/newbig.log 2>&1
PYTHONPATH=/tmp/site:$PWD/.baseline timeout 150 python3 .baseline/scripts/bench_lookback.py --out $OUT/base --warm 5 --no-serial --shapes 8x8192x1024,2x65536x128,1x2048x1024 --configs $BIG > $OUT/base.log 2>&1
grep -E "lookback|==" $OUT/newbig.log $OUT/base.log | cut -c1-250
