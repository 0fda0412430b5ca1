#!/usr/bin/env bash
# s17: every gpu-marked test on the final code.
export T_TESTS=230 T_LOOKBACK=0 T_GRID=0 T_DISPATCH=0 T_TUNER=0 T_LAYER=0 T_DECODE=0
export TEST_ARGS="tests"
bash scripts/gpu_final.sh
