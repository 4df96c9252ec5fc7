#!/usr/bin/env bash
# Session 9, moe20 (H200, one call): the MoE top-8 gate/up on experts repacked into the tiled Q4_K GEMV's pairx
# bytes (moe.tiled_gate_up; bench type Q4_KX) against the GGUF Q4_K gate/up, each beside its load-only twin
# (bench/moe_twin.py: the pair tile's loads vs the GGUF rows' words) at 7168x2048, 4096x1536, 2048x768; Q8_0's
# default beside two gate/up tiles with fewer h-quantizing programs. GPU tests first. Run from .xfer/moe20,
# carry [".whl", ".xfer/moe20"]; everything lands in $OUT/moe20_h200_s9.tar.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../../.whl/*.whl
export PYTHONPATH=/tmp/site:$PWD:$PWD/bench PATH=$PATH:/usr/local/cuda/bin
D=/tmp/moe20; mkdir -p $D
T0=$(date +%s); log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $D/call.txt; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,driver_version --format=csv > $D/gpu.txt 2>&1
python3 -c "import triton, torch; print('triton', triton.__version__, 'torch', torch.__version__)" >> $D/gpu.txt 2>&1
PYTHONPATH=$PYTHONPATH:$PWD/tests/engine:$PWD/tests timeout 30 python3 -m pytest -q -m gpu -p no:cacheprovider \
  tests/engine/test_moe_tiled.py tests/engine/test_moe_twin.py > $D/moe20_h200_s9_tests.log 2>&1
log "tests rc $?"
timeout 90 python3 bench/moe_tiles_bench.py --compile-workers 14 --types Q4_K,Q4_KX,Q8_0 --sets new \
  --shapes 7168x2048x8,4096x1536x8,2048x768x8 --gate-up "Q4_KX@4/1/2/e,Q8_0@4/1/2/e,Q8_0@4/1/1/e" --down "" \
  --json $D/moe20_h200_s9.json > $D/moe20_h200_s9.log 2>&1
log "bench rc $?"
tar -C $D -cf $OUT/moe20_h200_s9.tar .
