#!/usr/bin/env bash
# Session 8, q4k16 (H200, one call): the tiled Q4_K GEMV's TMA load-only twins (bench/q4t_tma.py) next to the bytes
# step, its pointer twin, q4k15's pipelined rows and a same-bytes copy at the three mid shapes and the head, with
# every kernel's registers / spills / shared memory / resident programs per SM. Run from .xfer/q4k16, carry
# [".whl", ".xfer/q4k16"]; everything lands in $OUT/q4k16_h200_s8.tar.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../../.whl/*.whl
export PYTHONPATH=/tmp/site:$PWD:$PWD/bench
D=/tmp/q4k16; mkdir -p $D
T0=$(date +%s); log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $D/call.txt; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,driver_version --format=csv > $D/gpu.txt 2>&1
python3 -c "import triton, torch; print('triton', triton.__version__, 'torch', torch.__version__)" >> $D/gpu.txt 2>&1
timeout 170 python3 bench/q4t_tma_bench.py --compile-workers 14 --json $D/q4k16_h200_s8.json > $D/q4k16_h200_s8.log 2>&1
log "bench rc $?"
tar -C $D -cf $OUT/q4k16_h200_s8.tar .
