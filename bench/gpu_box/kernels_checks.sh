#!/usr/bin/env bash
# The Triton kernels and the CUDA engine path on the GPU box, one device call: GPU tests
# (kernels; engine on cuda vs the CPU reference), the kernel bench sweep, then decode tok/s of a
# generated qwen3-30b-a3b-shaped model cut to a few layers (--device cuda --resident). Run from
# the checkout root with PYTHONPATH set (wheels the box lacks installed first, docs/gpu-box.md):
#   bash bench/gpu_box/kernels_checks.sh [bench args...]
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
timeout 150 python3 -m pytest -q -s -p no:cacheprovider -m gpu tests/engine/test_kernels.py tests/engine/test_int_kernels.py \
  tests/engine/test_kernel_engine.py 2>&1 | tee "$OUT/kernels-tests.log" | grep -E "error|passed|failed|FAIL|Error" | tail -30
timeout 120 python3 -m pytest -q -s -p no:cacheprovider -m gpu tests/engine/test_iq_kernels.py 2>&1 \
  | tee "$OUT/iq-kernels-tests.log" | grep -E "error|passed|failed|FAIL|Error" | tail -30
timeout 150 python3 bench/kernels_bench.py --json "$OUT/kernels_h200.json" "$@" 2>&1 | tee "$OUT/kernels-bench.log"
for q in ${ENGINE_QUANTS:-Q8_0 Q4_K}; do
  timeout 60 python3 -m sparkd.engine.cli make-model "/tmp/q30-$q.gguf" --preset qwen3-30b-a3b \
    --layers "${ENGINE_LAYERS:-2}" --quant "$q" --quiet --force &&
  timeout 60 python3 -m sparkd.engine.cli generate "/tmp/q30-$q.gguf" --tokens 1,2,3,4,5,6,7,8 -n 64 \
    --resident --device cuda --json 2>&1 | tail -1 | sed "s/^/engine $q: /" | tee -a "$OUT/engine-cuda.log"
done
# the kimi-k3 file's expert mix (gate/up IQ1_S, down IQ2_XXS) on the same shape, trunk Q8_0
timeout 60 python3 -m sparkd.engine.cli make-model /tmp/q30-iq.gguf --preset qwen3-30b-a3b --layers "${ENGINE_LAYERS:-2}" \
  --quant Q8_0 --tensor-type ffn_down_exps=IQ2_XXS --tensor-type _exps=IQ1_S --quiet --force &&
timeout 60 python3 -m sparkd.engine.cli generate /tmp/q30-iq.gguf --tokens 1,2,3,4,5,6,7,8 -n 64 \
  --resident --device cuda --json 2>&1 | tail -1 | sed "s/^/engine IQ1_S+IQ2_XXS experts: /" | tee -a "$OUT/engine-cuda.log"
# streamed experts read in place from the pinned arena by the kernels (--unified on)
timeout 90 python3 -m sparkd.engine.cli generate /tmp/q30-Q8_0.gguf --tokens 1,2,3,4,5,6,7,8 -n 32 \
  --device cuda --unified on --budget "${STREAM_BUDGET:-4G}" --json 2>&1 | tail -2 | sed "s/^/engine stream Q8_0: /" \
  | tee -a "$OUT/engine-cuda.log"
