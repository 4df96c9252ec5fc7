#!/usr/bin/env bash
# Session 7, q4k15 (H200, one call): the GEMV rows side by side (the bytes default, its load-only twin, both with
# the group loop software-pipelined by Triton: GemvConfig.stages, cp.async into shared memory) at the mid shapes
# and the head, x pre-quantized as the engine hands it over; then the tiled Q4_K GPU tests (incl. the stages' bits).
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../../.whl/*.whl
export PYTHONPATH=/tmp/site:$PWD:$PWD/bench
T0=$(date +%s); log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $OUT/gpu.txt 2>&1
ROWS=loadonly:4/1/4/e,loadonly:4/1/4/e/0/2,loadonly:4/1/4/e/0/3,loadonly:4/1/4/e/0/4,loadonly:4/1/2/e/0/2,loadonly:4/1/2/e/0/3,loadonly:4/1/2/e/0/4,loadonly:8/1/2/e/0/2,loadonly:8/1/4/e/0/2
ROWS=$ROWS,bytes:4/1/4/e/0/2,bytes:4/1/4/e/0/3,bytes:4/1/2/e/0/2,bytes:4/1/2/e/0/3,bytes:4/1/2/e/0/4,bytes:8/1/2/e/0/2
timeout 85 python3 bench/gemv_tiles_bench.py --types Q4T --shapes 14336x4096,4096x14336,6144x4096,4096x2048,151936x2048 \
  --q4t-rows $ROWS --qx --no-act-quant --compile-workers 15 --json $OUT/gemv.json > $OUT/gemv.log 2>&1
log "gemv rc $?"
timeout 40 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE tests/engine/test_q4_k_tiled.py > $OUT/gpu_tests.log 2>&1
log "tests rc $? $(tail -1 $OUT/gpu_tests.log)"
