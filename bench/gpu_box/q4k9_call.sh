#!/bin/bash
# Session 5 (branch q4k9): the tiled Q4_K GEMV's integer steps with fewer loads per group
# (q4_k_tiled.FAMILIES: scalar = the default, vector, vector64) at the head and the small shapes,
# and the GPU tests, started first and alongside (their time is compiling on the CPU: one call of
# at most 120 device-seconds). Run from the repo root (or .xfer/q4k9) on the device box; $OUT collects the logs.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$OUT/smi.txt" 2>&1
PYTHONPATH=$PYTHONPATH:$PWD/tests/engine timeout "${TESTS_S:-80}" python3 -m pytest -q -m gpu -p no:cacheprovider \
    tests/engine/test_q4_k_tiled.py > "$OUT/gemv_tiles_h200_s5_q4k9_tests.log" 2>&1 &
SHAPES=151936x2048,14336x4096,4096x2048,5120x2048
PYTHONPATH=$PYTHONPATH:$PWD/bench timeout "${BENCH_S:-80}" python3 bench/gemv_tiles_bench.py --types Q4T \
    --shapes $SHAPES --no-act-quant --json "$OUT/gemv_tiles_h200_s5_q4k9.json" 2>&1 | tee "$OUT/gemv_tiles_h200_s5_q4k9.log"
wait
tail -25 "$OUT/gemv_tiles_h200_s5_q4k9_tests.log"
