#!/bin/bash
# Session 6 (branch q6k9), one device call: the MoE 2048x768 top-8 with Q4_K gate/up and a Q6_K down
# at the down's candidate tiles (moe.py DECODE_TILES had no Q6_K entry: DOWN_CONFIG ran), then the
# Q6_K GEMV on the GGUF blocks (old default) vs the tiled layout (kernels/q6_k_tiled.py) at the head
# and attn_v's shape, then the tiled layout's GPU tests. Run from the repo root (or .xfer/q6k9) on
# the device box, PYTHONPATH set; $OUT collects the logs.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
PYTHONPATH=$PYTHONPATH:$PWD/bench timeout "${BENCH_S:-36}" python3 bench/gemv_tiles_bench.py --types Q6T \
    --shapes 151936x2048,512x2048 --no-act-quant --moe-q6k --no-float-down \
    --json "$OUT/gemv_tiles_h200_s6_q6k.json" 2>&1 | tee "$OUT/gemv_tiles_h200_s6_q6k.log"
PYTHONPATH=$PYTHONPATH:$PWD/tests/engine timeout "${TESTS_S:-20}" python3 -m pytest -q -p no:cacheprovider \
    tests/engine/test_q6_k_tiled.py > "$OUT/gemv_tiles_h200_s6_q6k_tests.log" 2>&1
tail -15 "$OUT/gemv_tiles_h200_s6_q6k_tests.log"
