#!/bin/bash
# Session 6 (branch q4k10): the resident GEMVs below the output head (packed Q8_0, tiled Q4_K) at
# mid and small decode shapes: session 5's tile and split rule ("s5 default") next to the wave rule
# ("default", matmul.split_for) and splits/rows by hand, x quantized before the timed calls as the
# engine's norm hands it over (--qx; "+quant" rows: x quantized in each call, session 5's timing);
# the GPU tests alongside (their time is compiling on the CPU). One call of at most ~110
# device-seconds. Run from the repo root (or .xfer/q4k10) on the device box; $OUT collects the logs.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$OUT/smi.txt" 2>&1
PYTHONPATH=$PYTHONPATH:$PWD/tests/engine timeout "${TESTS_S:-85}" python3 -m pytest -q -m gpu -p no:cacheprovider \
    tests/engine/test_gemv_split.py tests/engine/test_fused_qkv.py tests/engine/test_q4_k_tiled.py \
    tests/engine/test_int_kernels.py -k "split or stack or tiled or packed" > "$OUT/gemv_tiles_h200_s6_tests.log" 2>&1 &
SHAPES=${SHAPES:-14336x4096,4096x14336,6144x4096,2048x4096,4096x2048,5120x2048}
PYTHONPATH=$PYTHONPATH:$PWD/bench timeout "${BENCH_S:-88}" python3 bench/gemv_tiles_bench.py --types Q8_0P,Q4T \
    --shapes "$SHAPES" --vs-s5 --qx --no-act-quant --compile-workers "${WORKERS:-12}" \
    --json "$OUT/gemv_tiles_h200_s6.json" 2>&1 | tee "$OUT/gemv_tiles_h200_s6.log"
wait
tail -25 "$OUT/gemv_tiles_h200_s6_tests.log"
