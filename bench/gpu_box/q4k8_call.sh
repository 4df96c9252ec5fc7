#!/bin/bash
# Session 5 (branch q4k8): the tiled Q4_K layout against kern6's tile on the GGUF blocks, then the
# GPU tests. Run from the repo root (or .xfer/q4k8) on the device box; $OUT collects the logs.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$OUT/smi.txt" 2>&1
SHAPES=151936x2048,14336x4096,4096x14336,4096x2048,2048x4096,5120x2048
PYTHONPATH=$PYTHONPATH:$PWD/bench timeout "${BENCH_S:-60}" python3 bench/gemv_tiles_bench.py --types Q4T \
    --shapes $SHAPES --no-act-quant --json "$OUT/gemv_tiles_h200_s5_q4k.json" 2>&1 | tee "$OUT/gemv_tiles_h200_s5_q4k.log"
PYTHONPATH=$PYTHONPATH:$PWD/tests/engine timeout "${TESTS_S:-40}" python3 -m pytest -q -m gpu -p no:cacheprovider \
    tests/engine/test_q4_k_tiled.py tests/engine/test_int_kernels.py -k "tiled or (Q4_K and (dp4a or graph))" 2>&1 \
    | tail -25 | tee "$OUT/gemv_tiles_h200_s5_q4k_tests.log"
