#!/usr/bin/env bash
# Session 6 call 1: every GPU test file touched this session plus the ones their changes reach,
# in 5 parallel pytest groups (Triton compiles are CPU-bound: 16 cores).
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PATH=$PATH:/usr/local/cuda/bin
T0=$(date +%s); log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
G1="tests/engine/test_moe_tiles.py tests/engine/test_moe_decode_fusion.py tests/engine/test_kernel_determinism.py"
G2="tests/engine/test_q6_k_tiled.py tests/engine/test_q6_k_int.py tests/engine/test_int_kernels.py"
G3="tests/engine/test_gemv_split.py tests/engine/test_fused_qkv.py tests/engine/test_q4_k_tiled.py tests/engine/test_split_fold.py tests/engine/test_norm_quant.py"
G4="tests/engine/test_device_sampler.py tests/engine/test_device_argmax.py tests/engine/test_cuda_graphs.py tests/engine/streaming/test_eager_step.py tests/engine/streaming/test_vram_cache.py"
G5="tests/engine/test_kernel_engine.py tests/engine/test_fused_kernels.py"
i=0; P=()
for g in "$G1" "$G2" "$G3" "$G4" "$G5"; do i=$((i+1))
  timeout ${TEST_TIMEOUT:-330} python3 -m pytest -q -p no:cacheprovider -m gpu -rfE $g > $OUT/gpu_tests_$i.log 2>&1 & P+=($!)
done
for j in 0 1 2 3 4; do wait ${P[$j]}; log "group $((j+1)) rc $? $(tail -1 $OUT/gpu_tests_$((j+1)).log)"; done
log done
