#!/usr/bin/env bash
# The fused decode kernels on the GPU box, one device call (under 10 minutes): the gpu-marked
# tests of the fused kernels, the CUDA graph step and the kernel engine; every arch's tiny model
# on CUDA; then decode_profile.py with the fused kernels on and off on one qwen3-30b-a3b-shaped
# model (LAYERS, default 12, at the real widths and vocabulary; QUANT, default Q8_0): tok/s eager
# and graphs, and kernels per graph replay.
# Run from the checkout root with PYTHONPATH set (wheels the box lacks installed first):
#   OUT=$OUT bash bench/gpu_box/fused_checks.sh
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
LAYERS=${LAYERS:-12}; QUANT=${QUANT:-Q8_0}
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv | tee "$OUT/machine.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/machine.txt"
timeout 180 python3 -m pytest -q -p no:cacheprovider -m gpu tests/engine/test_fused_kernels.py \
  tests/engine/test_cuda_graphs.py tests/engine/test_kernel_engine.py 2>&1 | tee "$OUT/fused-tests.log" | tail -25
# every architecture's tiny model on CUDA (eager: fused norms, residual add, router) vs the CPU reference
timeout 60 python3 bench/gpu_box/archs_on_cuda.py 2>&1 | tee "$OUT/archs_on_cuda.log" | tail -12
# kernels of one static step of the tiny qwen3moe, fused none vs all (CUDA profiler)
timeout 60 python3 bench/gpu_box/launch_count.py --arch qwen3moe --json "$OUT/launch_count_tiny.json" 2>&1 | tail -2
for fused in all none; do
  timeout 170 python3 bench/gpu_box/decode_profile.py --layers "$LAYERS" --quant "$QUANT" --tokens "${TOKENS:-64}" \
    --fused "$fused" --dir /tmp --json "$OUT/decode_profile_${LAYERS}l_${QUANT}_fused-$fused.json" 2>&1 \
    | grep -v -e "UserWarning" -e "_warn_once" | tee "$OUT/decode_profile_${LAYERS}l_${QUANT}_fused-$fused.log"
done
rm -f "/tmp/q30-${LAYERS}l-${QUANT}.gguf"
