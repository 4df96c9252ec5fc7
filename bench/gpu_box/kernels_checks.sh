#!/usr/bin/env bash
# The Triton kernels and the CUDA engine path on the GPU box, one device call: GPU tests
# (kernels, engine on cuda vs the CPU reference), then the kernel bench sweep. Run from the
# checkout root with PYTHONPATH set (wheels the box lacks installed first, see docs/gpu-box.md).
#   bash bench/gpu_box/kernels_checks.sh [bench args...]
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
python3 -m pytest -q -p no:cacheprovider -m gpu tests/engine/test_kernels.py $(ls tests/engine/test_gpu_engine.py 2>/dev/null) \
  2>&1 | tee "$OUT/kernels-tests.log" | tail -40
python3 bench/kernels_bench.py --json "$OUT/kernels_h200.json" "$@" 2>&1 | tee "$OUT/kernels-bench.log"
