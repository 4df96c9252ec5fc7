#!/usr/bin/env bash
# Q6_K's integer step on the GPU box, one device call (session 5, branch q6k8): the timing first
# (float path vs integer tiles at the head, a projection and an expert-down shape, then the MoE
# with Q4_K gate/up and a Q6_K down), then the Q6_K GPU tests. From the checkout root, PYTHONPATH set:
#   bash bench/gpu_box/q6k_checks.sh
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
PYTHONPATH=$PYTHONPATH:bench timeout "${BENCH_S:-40}" python3 bench/gemv_tiles_bench.py --types Q6_K \
  --shapes 151936x2048,4096x2048,2048x768 --no-act-quant --moe-q6k --json "$OUT/q6k_h200_s5.json" 2>&1 \
  | tee "$OUT/q6k_h200_s5.log"
timeout "${TESTS_S:-28}" python3 -m pytest -q -p no:cacheprovider -m gpu tests/engine/test_q6_k_int.py \
  tests/engine/test_int_kernels.py tests/engine/test_kernels.py -k "Q6_K or q6_k" \
  2>&1 | tee "$OUT/q6k_h200_s5_tests.log" | tail -25
