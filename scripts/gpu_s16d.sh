# s16 final: grid with the fp32 rows (shipped table, README), dispatch overhead, layer bench
export T_TESTS=0 T_LOOKBACK=0 T_GRID=230 GRID_ARGS=--fp32 T_DISPATCH=20 T_TUNER=0 T_LAYER=80 T_DECODE=0
bash scripts/gpu_final.sh
