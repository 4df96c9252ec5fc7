#!/usr/bin/env bash
# Session 7, q4k14 (H200, one call): the GEMV rows side by side (the bytes default, its load-only twin, both on
# the persistent grid: gemv_tiles_bench --q4t-persist) at the mid shapes and the head, x pre-quantized as the
# engine hands it over; then the tiled Q4_K GPU tests and the persistent grid's bit tests.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../../.whl/*.whl
export PYTHONPATH=/tmp/site:$PWD:$PWD/bench
T0=$(date +%s); log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $OUT/gpu.txt 2>&1
timeout 100 python3 bench/gemv_tiles_bench.py --types Q4T --shapes 14336x4096,4096x14336,6144x4096,151936x2048,4096x2048 \
  --q4t-persist --qx --no-act-quant --compile-workers 14 --json $OUT/gemv.json > $OUT/gemv.log 2>&1
log "gemv rc $?"
timeout 50 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE tests/engine/test_q4_k_persist.py \
  tests/engine/test_q4_k_tiled.py > $OUT/gpu_tests.log 2>&1
log "tests rc $? $(tail -1 $OUT/gpu_tests.log)"
