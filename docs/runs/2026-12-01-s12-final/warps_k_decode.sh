#!/usr/bin/env bash
# Session 12, after the final calls (H200, carry [".whl"]): does q4k20/q4k21's warps_k GEMV (the default) pay
# in the resident decode of the 12-layer qwen3-30b-a3b-shaped Q4_K model (its fused qkv, 5120x2048, is the
# one launch it changes)? pdl_decode.py (PDL on, prefetch small: the defaults) in processes with
# SPARKD_GEMV_WARPS_K=1 / 0 interleaved, twice each. Results: $OUT/log.txt + $OUT/*.json.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD:$PWD/bench/gpu_box PATH=$PATH:/usr/local/cuda/bin
T0=$(date +%s); log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
timeout 150 python3 -m sparkd.engine.cli make-model /tmp/q30-12l-Q4_K.gguf --preset qwen3-30b-a3b --quant Q4_K --quiet --layers 12
log "model rc $?"
for round in 1 2; do
  for w in 1 0; do
    SPARKD_GEMV_WARPS_K=$w timeout 60 python3 bench/gpu_box/pdl_decode.py --quant Q4_K --layers 12 --tokens 256 \
      --forced 8 --prefetch small --repeats 2 --json $OUT/warps_k_${w}_$round.json > /tmp/d.log 2>&1
    log "warps_k=$w round $round rc $?: $(grep '^pdl' /tmp/d.log | awk '{print $3}' | tr '\n' ' ')"
  done
done
