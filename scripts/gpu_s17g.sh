#!/usr/bin/env bash
# s17: the tuner on a warm compile cache at (4, 16384, 256) forward, 25 s budget (issue 8's
# "tuning a new shape under 30 s"), with the current kernels.
export T_TESTS=0 T_LOOKBACK=0 T_GRID=0 T_DISPATCH=0 T_TUNER=170 T_LAYER=0 T_DECODE=0
export TUNER_ARGS="--budget 25" TUNER_CASES="4,16384,256:forward"
bash scripts/gpu_final.sh
