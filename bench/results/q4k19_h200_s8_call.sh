#!/usr/bin/env bash
# Session 8, q4k19 (H200, one call): bench/q4t_pair.py's pair tile (2 rows a thread, 16 lanes along K: q4k18's
# per-row work halved, x loaded twice) as a load-only twin, a step ("pair") and a step where the 2 threads of a
# sub-block trade one row's integer sum (one shuffle) and make one row's float values each ("pairx"), against the
# bytes step, its load-only twin and q4k16's ptr/s0 twin at 14336x4096, 4096x14336, 6144x4096, 151936x2048,
# 4096x2048; the pair tests' gpu cases first. Run from .xfer/q4k19, carry [".whl", ".xfer/q4k19"]; everything
# lands in $OUT/q4k19_h200_s8.tar.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../../.whl/*.whl
export PYTHONPATH=/tmp/site:$PWD:$PWD/bench
D=/tmp/q4k19; mkdir -p $D
T0=$(date +%s); log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $D/call.txt; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,driver_version --format=csv > $D/gpu.txt 2>&1
python3 -c "import triton, torch; print('triton', triton.__version__, 'torch', torch.__version__)" >> $D/gpu.txt 2>&1
timeout 30 python3 -m pytest -q -m gpu -p no:cacheprovider tests/engine/test_q4t_pair.py > $D/q4k19_h200_s8_tests.log 2>&1
log "tests rc $?"
timeout 95 python3 bench/q4t_tma_bench.py --q4k19 --compile-workers 14 --json $D/q4k19_h200_s8.json > $D/q4k19_h200_s8.log 2>&1
log "bench rc $?"
tar -C $D -cf $OUT/q4k19_h200_s8.tar .
