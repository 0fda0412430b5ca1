# s16 run 3: look-back bench of the launch-count change (vector atomics), GPU tests, grid, tuner
export T_TESTS=130 TEST_WORKERS=12 TEST_ARGS="tests/test_lookback.py tests/test_layer.py tests/test_chunk_family.py"
export T_LOOKBACK=110 LOOKBACK_ARGS="--warm 15 --no-serial --kernels --shapes 1x2048x1024,1x16384x256,8x8192x1024 --configs 64x128x2lr2p6,64x128x2lw8p6,64x256x2lp6,64x512x4lr2p4,32x128x2lr2,64x32x2w8"
export T_GRID=210 T_DISPATCH=0 T_TUNER=85 TUNER_ARGS="--budget 25" TUNER_CASES="16,2048,512:train" T_DECODE=0
bash scripts/gpu_final.sh
