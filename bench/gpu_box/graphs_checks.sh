#!/usr/bin/env bash
# CUDA graphs of the decode step on the GPU box, one device call: the gpu-marked graph tests,
# then decode_profile.py (per-stage profile, tok/s eager vs graphs) on qwen3-30b-a3b-shaped models:
# 2 layers Q8_0 and Q4_K, and DEEP_LAYERS (default 11, 7.4 GiB) Q8_0 at the real widths and vocabulary.
# Run from the checkout root with PYTHONPATH set (wheels the box lacks installed first):
#   bash bench/gpu_box/graphs_checks.sh
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv | tee "$OUT/machine.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/machine.txt"
timeout 120 python3 -m pytest -q -p no:cacheprovider -m gpu tests/engine/test_cuda_graphs.py 2>&1 \
  | tee "$OUT/graphs-tests.log" | tail -15
for run in "2 Q8_0" "2 Q4_K" "${DEEP_LAYERS:-11} Q8_0"; do
  set -- $run
  timeout 200 python3 bench/gpu_box/decode_profile.py --layers "$1" --quant "$2" --tokens "${TOKENS:-64}" \
    --dir /tmp --json "$OUT/decode_profile_$1l_$2.json" 2>&1 | tee "$OUT/decode_profile_$1l_$2.log"
  rm -f "/tmp/q30-$1l-$2.gguf"
done
