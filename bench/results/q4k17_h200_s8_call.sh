#!/usr/bin/env bash
# Session 8, q4k17 (H200, one call): the tiled Q4_K GEMV's bytes step 2 groups a step, the compact-load steps
# (bench/q4t_compact.py: idot_compact per group, "step" per step; at commit a095864, where the call ran, they were q4_k_tiled.idot_compact
# and sparkd/engine/kernels/q4_k_steps.py) against bytes, its load-only twin and q4k16's ptr/s0
# twin at 14336x4096, 4096x14336, 6144x4096, 151936x2048, 4096x2048, with each kernel's registers / shared memory /
# programs per SM and whether each step's y is the bytes step's bits. Run from .xfer/q4k17, carry
# [".whl", ".xfer/q4k17"]; everything lands in $OUT/q4k17_h200_s8.tar. (Since the run, the "bytes" row steps 2 groups at
# split 1, GemvConfig.whole_unroll: SPARKD_GEMV_WHOLE_UNROLL=0 gives the row as it ran.)
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../../.whl/*.whl
export PYTHONPATH=/tmp/site:$PWD:$PWD/bench
D=/tmp/q4k17; mkdir -p $D
T0=$(date +%s); log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $D/call.txt; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,driver_version --format=csv > $D/gpu.txt 2>&1
python3 -c "import triton, torch; print('triton', triton.__version__, 'torch', torch.__version__)" >> $D/gpu.txt 2>&1
timeout 120 python3 bench/q4t_tma_bench.py --q4k17 --compile-workers 14 --json $D/q4k17_h200_s8.json > $D/q4k17_h200_s8.log 2>&1
log "bench rc $?"
tar -C $D -cf $OUT/q4k17_h200_s8.tar .
